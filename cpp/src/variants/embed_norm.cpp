// The embedding's layer_norm (BERT, Devlin et al. 2019; BART, docs/variants.md V22): an embedding step after line 3
// (stack_embedding.hpp, At::Output),
//
//   3′  X[:, t] ← layer_norm(X[:, t] | γ_e, β_e)             (Algorithm 6 with the model's eps)
//   backward: Algorithm 6's
//
// Its option: embed_norm=True (ETransformer; both stacks of an EDTransformer, each with its own γ_e, β_e).
#include <algorithm>

#include "formal_transformers/stack_embedding.hpp"

namespace ft {

namespace {
template <class T>
class EmbedNorm final : public EmbeddingStep<T> {
public:
    EmbedNorm(const ModelConfig& c, const std::string& prefix, ParamStore<T>& store)
        : norm_("layer", c.d_e, c.eps, store, prefix + "gamma_e", prefix + "beta_e") {}
    typename EmbeddingStep<T>::At at() const override { return EmbeddingStep<T>::At::Output; }
    void init(ParamStore<T>& store, Rng&, double) const override { norm_.init(store); }
    void forward(const ParamStore<T>& store, const EmbedInput<T>&, MatView<T> X, PartSlot* state) const override {
        State local;
        State& st = state ? state->get<State>() : local;
        norm_.forward(store, X, X, st.norm);  // (in place: each column is read before it is written)
    }
    void backward(ParamStore<T>& store, const EmbedInput<T>&, MatView<T> dX, const PartSlot& state) const override {
        const State* st = state.find<State>();
        FT_CHECK(st, "embed_norm: backward without a forward");
        MatView<T> dE = ensure(st->dE, dX.rows, dX.cols);  // the state's scratch: sized once, kept between calls
        std::fill(dE.data, dE.data + dE.size(), T(0));
        norm_.backward(store, dX, st->norm, dE);
        std::copy(dE.data, dE.data + dE.size(), dX.data);
    }

private:
    struct State : PartStateOf<State> {
        NormCache<T> norm;
        mutable Matrix<T> dE;  // backward's scratch
    };
    Norm<T> norm_;
};
}  // namespace

const PartRow& embed_norm_row() {
    static const PartRow row{PartKind::EmbeddingStep,
                             "embed_norm",
                             {{"embed_norm", archs::E | archs::ED, OptionKind::Bool, false, OptionCheck::None,
                               "BERT, BART (V22): layer_norm(· | γ_e, β_e) on X after line 3 (each stack its own)"}}};
    return row;
}

template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_embed_norm(const EmbeddingSpec& spec, ParamStore<T>& store) {
    return std::make_shared<const EmbedNorm<T>>(*spec.c, spec.prefix, store);
}
template std::shared_ptr<const EmbeddingStep<float>> make_embed_norm<float>(const EmbeddingSpec&, ParamStore<float>&);
template std::shared_ptr<const EmbeddingStep<double>> make_embed_norm<double>(const EmbeddingSpec&, ParamStore<double>&);

}  // namespace ft
