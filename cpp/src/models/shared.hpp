// Internal to cpp/src/models/: the pieces the blocks and the three models share (not installed).
//  * small matrix helpers; the names of the parts a config chooses (parts.hpp's registry);
//  * dropout on a sublayer's output and its backward; the backward of a post-LN sublayer;
//  * the scored columns of the losses; the dropout masks a model lists for inspection.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/block_sparse.hpp"
#include "formal_transformers/transformers.hpp"

namespace ft {
namespace models {

template <class T>
void zero(MatView<T> m) {
    std::fill(m.data, m.data + m.size(), T(0));
}
template <class T>
MatView<T> zeros(Matrix<T>& m, index_t rows, index_t cols) {
    MatView<T> v = ensure(m, rows, cols);
    zero(v);
    return v;
}
template <class T>
MatView<T> copy_into(Matrix<T>& dst, CMatView<T> src) {
    MatView<T> v = ensure(dst, src.rows, src.cols);
    std::copy(src.data, src.data + src.size(), v.data);
    return v;
}
inline std::string layer_prefix(const char* group, index_t l) { return std::string(group) + "." + std::to_string(l) + "."; }
// Algorithm 10 line 6's Mask: [[t ≤ t']], or the mask part the config's options choose (e.g. V8's sliding
// window), made from them. (V7's prefix mask is made per call, with the batch's p_b.)
inline Mask decoder_mask(const ModelConfig& c) {
    const PartRow* m = chosen_part(c, PartKind::Mask);
    if (!m) return Mask::unidirectional();
    MaskOptions o;
    o.options = c.part_options;
    return make_mask(m->name, o);
}
// V26 (Gemma 2, 3; variants/sliding_window_mask.cpp): with sliding_window_pattern p, layer l (0-based) is global when
// (l + 1) is a multiple of p — Algorithm 10's causal mask, RoPE θ = rope_theta — and local otherwise: the window,
// RoPE θ = rope_local_base_freq when given. Without a pattern every layer has decoder_mask(c) and rope_theta.
inline bool global_layer(const ModelConfig& c, index_t l) {
    const index_t p = c.part_options.integer("sliding_window_pattern");
    return p > 0 && (l + 1) % p == 0;
}
inline Mask layer_mask(const ModelConfig& c, index_t l) {
    return global_layer(c, l) ? Mask::unidirectional() : decoder_mask(c);
}
// The Mask of an encoder's self-attention named p: Mask ≡ 1 (Algorithm 9), or with attention='bigbird' (V17)
// BigBird's block layouts, drawn from layout_seed and the attention's name (each layer and head its own; bigbird_draw
// "per_layer": each layer's one, head 0's)
inline Mask encoder_mask(const ModelConfig& c, const std::string& p) {
    if (!head_kernel_has(c.attention, HeadKernelProperty::BlockLayouts)) return Mask::bidirectional();
    return make_bigbird_mask(bigbird_spec_of(c.part_options, p, c.H));  // (the 'bigbird' head kernel's options)
}
// The attention options of a model (docs/variants.md); `positional`: the position part applies (D's self-attention:
// a part its line puts in the layers, V1's RoPE, V2's ALiBi; otherwise "none", the position is the embedding's)
inline AttnVariant attn_variant(const ModelConfig& c, bool positional) {
    AttnVariant v;
    v.H_kv = c.H_kv;
    v.bias = c.bias;
    if (positional && position_has(c.positional, PositionProperty::Layers)) v.position = c.positional;
    v.impl = c.attention_impl;
    v.options = c.part_options;  // the parts' own options (V1's θ, V10's latent source, V15's random features)
    v.scale_scores = c.scale_scores;  // V18
    v.kernel = c.attention;  // V15
    v.norm = c.norm, v.eps = c.eps;  // V24's QK-norm normalises with the model's norm
    return v;
}
// Layer l's self-attention options: attn_variant(c, true) with V26's θ of a local layer
inline AttnVariant layer_variant(const ModelConfig& c, index_t l) {
    AttnVariant v = attn_variant(c, true);
    const double local = c.part_options.real("rope_local_base_freq");
    if (!global_layer(c, l) && local > 0) {  // (a local layer with its own θ: unscaled positions)
        v.options.set("rope_theta", local);
        v.options.set("rope_scaling_factor", 0.0);
    }
    return v;
}
// ED's self-attentions with a position of one table per stack (V11, positional='relative'): T5's bias from the stack's one table (`table`: "enc.rel_bias",
// bidirectional buckets; "dec.rel_bias", causal); otherwise attn_variant(c, false)
inline AttnVariant relative_variant(const ModelConfig& c, const char* table, bool bidirectional) {
    AttnVariant v = attn_variant(c, false);
    if (!position_has(c.positional, PositionProperty::StackTables)) return v;
    v.position = c.positional;
    v.rel_table = table;
    v.rel_bidirectional = bidirectional;
    v.rel_init_std = c.init_std;
    return v;
}
// The MLP of a block: φ = act, V5's bias, the parameters' names
inline MLPSpec mlp_spec(const ModelConfig& c, Activation act, const char* W1, const char* b1, const char* W2, const char* b2) {
    MLPSpec s;
    s.d_e = c.d_e, s.d_mlp = c.d_mlp, s.act = act, s.bias = c.bias;
    s.W1 = W1, s.b1 = b1, s.W2 = W2, s.b2 = b2;
    return s;
}

// The parts of a block (variants/registry.cpp's blocks), made from its BlockSpec under the layer's prefix p, in the
// order the block's constructor lists them (the order its parameters are registered in):
// norm k: γ_l^k (β_l^k) named gamma<k>, beta<k>
template <class T>
Norm<T> block_norm(const BlockSpec& b, ParamStore<T>& store, const std::string& p, const char* k) {
    return Norm<T>(b.c->norm, b.c->d_e, b.c->eps, store, p + "gamma" + k, p + "beta" + k);
}
// the self-attention W_l ("attn."): the stack's Mask and options
template <class T>
MHAttention<T> self_attention(const BlockSpec& b, ParamStore<T>& store, const std::string& p) {
    const ModelConfig& c = *b.c;
    return MHAttention<T>(c.H, c.d_e, c.d_e, c.d_attn, c.d_mid, c.d_e, b.mask, store, p + "attn.", b.self);
}
// a decoder layer's cross-attention W_l^e/d ("cross_attn."): Mask ≡ 1, keys and values from Z
template <class T>
MHAttention<T> cross_attention(const BlockSpec& b, ParamStore<T>& store, const std::string& p) {
    const ModelConfig& c = *b.c;
    return MHAttention<T>(c.H, c.d_e, c.d_e, c.d_attn, c.d_mid, c.d_e, Mask::bidirectional(), store, p + "cross_attn.",
                          b.cross);
}
// the MLP: φ = b.act, its parameters named W1, b1, W2, b2 (W_mlp1^l, … in Algorithms 9, 10; W_mlp3^l, … in 8)
template <class T>
MLP<T> block_mlp(const BlockSpec& b, ParamStore<T>& store, const std::string& p, const char* W1, const char* b1,
                 const char* W2, const char* b2) {
    return MLP<T>(b.c->mlp, mlp_spec(*b.c, b.act, W1, b1, W2, b2), store, p);
}
// A block's init: each of its parts in the order given (norms γ = 1, β = 0; attentions and MLPs drawn from rng)
template <class T>
void init_part(const Norm<T>& n, ParamStore<T>& store, Rng&, double, double) {
    n.init(store);
}
template <class T, class Part>
void init_part(const Part& part, ParamStore<T>& store, Rng& rng, double s, double s_out) {
    part.init(store, rng, s, s_out);
}
template <class T, class... Parts>
void init_parts(ParamStore<T>& store, Rng& rng, double s, double s_out, const Parts&... parts) {
    (init_part(parts, store, rng, s, s_out), ...);
}
// A block file's factory for registry.cpp's table (BASE: SelfBlock or CrossBlock), for float and double
#define FT_BLOCK_FACTORY(NAME, BLOCK, BASE)                                                                   \
    template <class T>                                                                                        \
    std::unique_ptr<BASE<T>> NAME(const BlockSpec& spec, ParamStore<T>& store, const std::string& prefix) {   \
        return std::make_unique<BLOCK<T>>(spec, store, prefix);                                               \
    }                                                                                                         \
    template std::unique_ptr<BASE<float>> NAME(const BlockSpec&, ParamStore<float>&, const std::string&);     \
    template std::unique_ptr<BASE<double>> NAME(const BlockSpec&, ParamStore<double>&, const std::string&);
// A block's registry row: its name and the architectures that take it (check_block_archs)
#define FT_BLOCK_ROW(FUNCTION, NAME, ARCHS)                                                                   \
    const PartRow& FUNCTION() {                                                                               \
        static const PartRow row{PartKind::Block, NAME, {}, [](const PartOptionValues&, const ModelConfig* m) { \
                                     check_block_archs(NAME, ARCHS, m);                                       \
                                 }};                                                                          \
        return row;                                                                                           \
    }

// Dropout on a sublayer's output before the residual add (docs/regularisation.md): X ← X + Dropout(f(X̃) | p, M)
// with p = drop->resid, where f accumulates into its argument (f(X) is the listing's X ← X + f(X̃), in place).
// Without dropout (evaluation, or p = 0) exactly that; with it, f runs into the scratch R, which is dropped
// (D1) and added.
template <class T, class F>
void add_dropped(const Dropout* drop, std::uint64_t place, MatView<T> X, Matrix<T>& R, DropoutMask& m, F&& f) {
    m.p = drop ? drop->resid : 0.0;
    if (!m.active()) {
        m.keep.clear();
        f(X);
        return;
    }
    MatView<T> r = zeros(R, X.rows, X.cols);
    f(r);
    drop->apply(m.p, place, r, m);
    for (index_t j = 0; j < X.cols; ++j) {
        T* x = X.col(j);
        const T* y = r.col(j);
        for (index_t i = 0; i < X.rows; ++i) x[i] += y[i];
    }
}
// ∂loss/∂f's output from ∂loss/∂X of add_dropped: dX itself, or dX ⊙ M / (1 − p) (D2) in the scratch dR.
template <class T>
CMatView<T> dropped_grad(const DropoutMask& m, CMatView<T> dX, Matrix<T>& dR) {
    if (!m.active()) return dX;
    MatView<T> d = copy_into(dR, dX);
    dropout_backward<T>(m.p, m.keep.data(), d.data, d.size());
    return d;
}

// A post-LN sublayer of Algorithms 8 and 9: X_r = X + f(X, …); out = norm(X_r).
// Given dX = ∂loss/∂out, leaves dX = ∂loss/∂X: dXt ← norm'(dX) (= ∂/∂X_r); dX ← dXt (the residual path);
// f_back(dXt, dX) adds f's input gradient into dX.
template <class T, class FBack>
void post_ln_backward(const Norm<T>& norm, ParamStore<T>& store, const NormCache<T>& nc, Matrix<T>& dX, Matrix<T>& dXt,
                      FBack&& f_back) {
    MatView<T> dxr = zeros(dXt, index_t(dX.shape(0)), index_t(dX.shape(1)));
    norm.backward(store, view(dX), nc, dxr);
    std::copy(dxr.data, dxr.data + dxr.size(), dX.data());
    f_back(CMatView<T>(dxr), view(dX));
}

// The scored columns of the listings' losses and their targets:
// Algorithms 11 and 13 line 5: every position t < ℓ−1 of each sequence, target x[t+1]; with V7's prefix lengths
// (x.prefix) only the targets after the prefix, x[t+1] with t+1 ≥ p_b (0-based; line 5′ of docs/variants.md V7);
inline void next_token_targets(const Tokens& x, std::vector<index_t>& cols, std::vector<index_t>& targets) {
    cols.clear();
    targets.clear();
    for (index_t b = 0; b < x.s.count(); ++b)
        for (index_t t = x.prefix ? std::max<index_t>(x.prefix[b] - 1, 0) : 0; t + 1 < x.s.len(b); ++t) {
            cols.push_back(x.s.begin(b) + t);
            targets.push_back(x.ids[x.s.begin(b) + t + 1]);
        }
}
// Algorithm 12 line 9: T̃ = {t : x̃[t] = mask_token}, target x[t].
inline void masked_targets(const Tokens& x_tilde, const index_t* x, index_t mask_token, std::vector<index_t>& cols,
                    std::vector<index_t>& targets) {
    cols.clear();
    targets.clear();
    for (index_t t = 0; t < x_tilde.s.total(); ++t)
        if (x_tilde.ids[t] == mask_token) {
            cols.push_back(t);
            targets.push_back(x[t]);
        }
}

template <class T>
void add_mask(std::vector<typename Model<T>::MaskRef>& out, const std::string& name, const DropoutMask& m,
              bool weights = false, AttentionKind kind = AttentionKind::Decoder, index_t l = 0, const T* A0 = nullptr) {
    if (m.active()) out.push_back({name, &m, weights, kind, l, A0});
}
// an attention's weights' mask (after a tiled forward: redrawn now, with its A, so A0 is where it lies)
template <class T>
void add_weights_mask(std::vector<typename Model<T>::MaskRef>& out, const std::string& name, const MHAttentionCache<T>& c,
                      AttentionKind kind, index_t l) {
    if (!c.drop.active()) return;
    c.ensure_weights();
    add_mask<T>(out, name, c.drop, true, kind, l, c.A.data());
}

// a block's activations, held by value (ViT) or through the block's make_acts
template <class A>
const A& deref(const A& a) { return a; }
template <class A>
const A& deref(const std::unique_ptr<A>& a) { return *a; }
// the masks of blocks with one self-attention (D, E, ED's encoder), their layers named prefix.l.
template <class T, class Acts>
void self_block_masks(std::vector<typename Model<T>::MaskRef>& r, const char* prefix, const std::vector<Acts>& acts,
                      AttentionKind kind) {
    for (index_t l = 0; l < index_t(acts.size()); ++l) {
        const auto& a = deref(acts[std::size_t(l)]);
        const std::string p = layer_prefix(prefix, l);
        add_weights_mask<T>(r, p + "attn.weights", a.attn, kind, l);
        add_mask<T>(r, p + "attn.out", a.drop_attn);
        add_mask<T>(r, p + "mlp.out", a.drop_mlp);
    }
}

}  // namespace models
}  // namespace ft
