// Separate positions (docs/variants.md V22, BART): the decoder's stack of an EDTransformer adds its own learned table
// at Algorithm 8's line 11 (stack_embedding.hpp, At::Table):
//
//   11′  e_t ← W_e[:, x[t]] + W_p^dec[:, t]                  (W_p^dec = dec.W_p ∈ ℝ^{d_e×ℓ_max}, learned)
//   backward: dW_p^dec[:, t] += de_t
//
// The encoder keeps the model's W_p. Its option: separate_positions=True (EDTransformer, positional='learned').
#include "formal_transformers/stack_embedding.hpp"

namespace ft {

namespace {
template <class T>
class SeparatePositions final : public EmbeddingStep<T> {
public:
    SeparatePositions(const ModelConfig& c, const std::string& prefix, ParamStore<T>& store)
        : W_p_(c.l_max, c.d_e, position_table(c.positional), c.part_options.real("base"), store, prefix + "W_p") {}
    typename EmbeddingStep<T>::At at() const override { return EmbeddingStep<T>::At::Table; }
    void init(ParamStore<T>& store, Rng& rng, double stddev) const override { W_p_.init(store, rng, stddev); }
    const PositionalEmbedding<T>* table() const override { return &W_p_; }

private:
    PositionalEmbedding<T> W_p_;
};

void check_separate_positions(const PartOptionValues&, const ModelConfig* c) {
    if (c && position_table(c->positional) != Positional::Learned)
        throw ValueError("separate_positions=True gives the decoder its own learned W_p: it needs positional='learned'");
}
}  // namespace

const PartRow& separate_positions_row() {
    static const PartRow row{PartKind::EmbeddingStep,
                             "separate_positions",
                             {{"separate_positions", archs::ED, OptionKind::Bool, false, OptionCheck::None,
                               "V22 (BART): the decoder's own learned table dec.W_p at lines 11–12 (the encoder keeps W_p)"}},
                             check_separate_positions};
    return row;
}

// null for the encoder's stack (it keeps W_p)
template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_separate_positions(const EmbeddingSpec& spec, ParamStore<T>& store) {
    if (spec.prefix != "dec.") return nullptr;
    return std::make_shared<const SeparatePositions<T>>(*spec.c, spec.prefix, store);
}
template std::shared_ptr<const EmbeddingStep<float>> make_separate_positions<float>(const EmbeddingSpec&, ParamStore<float>&);
template std::shared_ptr<const EmbeddingStep<double>> make_separate_positions<double>(const EmbeddingSpec&, ParamStore<double>&);

}  // namespace ft
