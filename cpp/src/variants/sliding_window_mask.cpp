// Sliding-window attention (docs/variants.md V8; Beltagy et al. 2020, "Longformer", §3.1; Jiang et al. 2023,
// "Mistral 7B", §2): each query sees the w keys ending at its own position.
//
// Mask[t_z, t_x] = [[t_x − w < t_z ≤ t_x]]   (Hugging Face's `sliding_window` convention for Mistral)
//
// One dense key range per query column, [max(0, t_x − w + 1), t_x + 1): the softmax runs over it and the rest
// of the column is 0, as with the causal mask. w ≥ ℓ is the unidirectional mask. window() = w tells the KV
// cache that older keys are never read again (V9, MHAttention::append_kv). The rule depends on t_x − t_z
// only, so it holds for a cache whose first column is not position 0. Its option: sliding_window = w (D only;
// given, it chooses this mask for line 6 of Algorithm 10). Made by make_mask("sliding_window", o) with
// o.options.set("sliding_window", w) (registry.cpp).
//
// V26, local and global layers (Gemma 2, Gemma 3): with sliding_window_pattern = p, layer l (0-based) is global when
// (l + 1) is a multiple of p (Algorithm 10's causal mask) and local otherwise (this window); rope_local_base_freq
// is the RoPE θ of the local layers (None: the RoPE position's rope_theta, as the global ones). models/shared.hpp layer_mask and
// layer_variant read them.
#include <algorithm>

#include "formal_transformers/config.hpp"
#include "formal_transformers/parts.hpp"

namespace ft {

namespace {
class SlidingWindowMask final : public MaskRule {
public:
    explicit SlidingWindowMask(index_t w) : w_(w) {}
    std::string name() const override { return "sliding_window"; }
    bool allows(index_t, index_t t_z, index_t t_x) const override { return t_x - w_ < t_z && t_z <= t_x; }
    KeyRange keys(index_t, index_t t_x, index_t l_z) const override {
        const index_t end = std::min(l_z, t_x + 1);
        return {std::min(end, std::max<index_t>(0, t_x - w_ + 1)), end, true};
    }
    index_t window() const override { return w_; }

private:
    index_t w_;
};

// sliding_window = w: an integer >= 1 (the factory's check and resolve's)
void check_sliding_window(const PartOptionValues& own, const ModelConfig* c) {
    const index_t w = own.integer("sliding_window");
    if (w < 1 && (own.integer("sliding_window_pattern") > 0 || own.real("rope_local_base_freq") > 0))
        throw ValueError("sliding_window_pattern and rope_local_base_freq choose local layers (V26): they need "
                         "sliding_window = w, the local layers' window");
    if (w < 1)
        throw ValueError("sliding_window must be an integer >= 1 (each query sees the last w keys), got " +
                         std::to_string(w));
    if (c && own.real("rope_local_base_freq") > 0 && !position_has(c->positional, PositionProperty::RotatesQK))
        throw ValueError("rope_local_base_freq is the RoPE θ of the local layers: it needs positional=" +
                         positions_with(PositionProperty::RotatesQK));
}
}  // namespace

const PartRow& sliding_window_mask_row() {
    static const PartRow row{PartKind::Mask,
                             "sliding_window",
                             {{"sliding_window", archs::D, OptionKind::AutoSize, std::int64_t(0), OptionCheck::None,
                               "V8: each query sees the last w keys (Mistral); decoding keeps a rolling cache of w "
                               "columns per layer (V9). None: Algorithm 10's causal mask"},
                              {"sliding_window_pattern", archs::D, OptionKind::AutoSize, std::int64_t(0), OptionCheck::None,
                               "V26: every p-th layer (l + 1 a multiple of p) global, the others local with the window "
                               "(Gemma 2: 2, Gemma 3: 6). None: every layer local"},
                              {"rope_local_base_freq", archs::D, OptionKind::AutoReal, 0.0, OptionCheck::None,
                               "V26: the RoPE θ of the local layers (Gemma 3). None: rope_theta (the RoPE position's)"}},
                             check_sliding_window};
    return row;
}

Mask make_sliding_window_mask(const MaskOptions& o) {
    check_sliding_window(o.options, nullptr);
    // a window of 2^62 keys or more sees every key of any sequence memory holds: kept at 2^62 (so 2w cannot wrap)
    return Mask(std::make_shared<SlidingWindowMask>(std::min<index_t>(o.options.integer("sliding_window"), index_t(1) << 62)));
}

}  // namespace ft
