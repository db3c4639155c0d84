// Chunked attention (docs/variants.md V19; Llama 4's `attention_chunk_size`): the sequence is cut into chunks of
// C tokens and each query sees the keys of its own chunk up to itself.
//
// Mask[t_z, t_x] = [[⌊t_z / C⌋ = ⌊t_x / C⌋ and t_z ≤ t_x]]   (Hugging Face's chunked_causal_mask_function)
//
// One dense key range per query column, [C⌊t_x/C⌋, t_x + 1): the softmax runs over it and the rest of the column
// is 0, as with the causal mask. C ≥ ℓ is the unidirectional mask. The rule depends on where the chunks start
// (absolute positions), not on t_x − t_z alone, so window() is 0: a KV cache keeps every column (V9's rolling
// cache is for rules that depend on the offset only). Its option: attention_chunk_size = C (D only; given, it
// chooses this mask for line 6 of Algorithm 10). Made by make_mask("chunked", o) with
// o.options.set("attention_chunk_size", C) (registry.cpp).
#include <algorithm>

#include "formal_transformers/parts.hpp"

namespace ft {

namespace {
class ChunkedMask final : public MaskRule {
public:
    explicit ChunkedMask(index_t C) : C_(C) {}
    std::string name() const override { return "chunked"; }
    bool allows(index_t, index_t t_z, index_t t_x) const override { return t_z / C_ == t_x / C_ && t_z <= t_x; }
    KeyRange keys(index_t, index_t t_x, index_t l_z) const override {
        const index_t end = std::min(l_z, t_x + 1);
        return {std::min(end, t_x / C_ * C_), end, true};  // the chunk's first key to the query itself
    }

private:
    index_t C_;
};

// attention_chunk_size = C: an integer >= 1 (the factory's check and resolve's)
void check_chunk_size(const PartOptionValues& own, const ModelConfig*) {
    const index_t C = own.integer("attention_chunk_size");
    if (C < 1)
        throw ValueError("attention_chunk_size must be an integer >= 1 (the tokens of a chunk), got " + std::to_string(C));
}
}  // namespace

const PartRow& chunked_mask_row() {
    static const PartRow row{PartKind::Mask,
                             "chunked",
                             {{"attention_chunk_size", archs::D, OptionKind::AutoSize, std::int64_t(0), OptionCheck::None,
                               "V19: each query sees the keys of its own chunk of C tokens up to itself (Llama 4's "
                               "chunked attention). None: Algorithm 10's causal mask"}},
                             check_chunk_size};
    return row;
}

Mask make_chunked_mask(const MaskOptions& o) {
    check_chunk_size(o.options, nullptr);
    return Mask(std::make_shared<ChunkedMask>(o.options.integer("attention_chunk_size")));
}

}  // namespace ft
