// The embedding scale (docs/variants.md V22, V27): an embedding step on Algorithm 1's e = W_e[:, v] before the
// position is added (stack_embedding.hpp, At::Token),
//
//   e ← s · e                                                (s in the model's dtype)
//   backward: de ← s · de
//
// s = embed_scale (Gemma: √d_e; DTransformer), or √d_e with scale_embedding=True (BART; both stacks of an
// EDTransformer). One idea, two options: each architecture's converter names it as its models do.
#include <cmath>

#include "formal_transformers/stack_embedding.hpp"

namespace ft {

namespace {
template <class T>
class EmbedScale final : public EmbeddingStep<T> {
public:
    explicit EmbedScale(T s) : s_(s) {}
    typename EmbeddingStep<T>::At at() const override { return EmbeddingStep<T>::At::Token; }
    void forward(const ParamStore<T>&, const EmbedInput<T>&, MatView<T> X, PartSlot*) const override {
        for (index_t i = 0; i < X.size(); ++i) X.data[i] *= s_;  // e ← s · e
    }
    void backward(ParamStore<T>&, const EmbedInput<T>&, MatView<T> dX, const PartSlot&) const override {
        for (index_t i = 0; i < dX.size(); ++i) dX.data[i] *= s_;  // de ← s · de
    }

private:
    T s_;
};

// one check for the config (resolve) and the factory
void check_embed_scale(const PartOptionValues& own, const ModelConfig*) {
    if (own.real("embed_scale") > 0 && own.flag("fixnorm"))
        throw ValueError("embed_scale (Gemma's scaled embedding) does not combine with fixnorm (unit-norm embeddings)");
}
}  // namespace

const PartRow& embed_scale_row() {
    static const PartRow row{PartKind::EmbeddingStep,
                             "scale",
                             {{"scale_embedding", archs::ED, OptionKind::Bool, false, OptionCheck::None,
                               "V22 (BART): e_t ← √d_e · W_e[:, x[t]] + W_p[:, t] in both stacks"},
                              {"embed_scale", archs::D, OptionKind::AutoReal, 0.0, OptionCheck::None,
                               "V27 (Gemma): Algorithm 1 returns s · W_e[:, v] (Gemma: √d_e). None: the listing"}},
                             check_embed_scale};
    return row;
}

template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_embed_scale(const EmbeddingSpec& spec, ParamStore<T>&) {
    const double s = spec.c->part_options.real("embed_scale");
    return std::make_shared<const EmbedScale<T>>(T(s > 0 ? s : std::sqrt(double(spec.c->d_e))));
}
template std::shared_ptr<const EmbeddingStep<float>> make_embed_scale<float>(const EmbeddingSpec&, ParamStore<float>&);
template std::shared_ptr<const EmbeddingStep<double>> make_embed_scale<double>(const EmbeddingSpec&, ParamStore<double>&);

}  // namespace ft
