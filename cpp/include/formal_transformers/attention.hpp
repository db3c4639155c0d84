// Algorithms 3, 4 and 5: basic single-query attention, attention with a mask, multi-head attention.
//
// Algorithm 4: Ṽ ← Attention(X, Z | W_qkv, Mask)
//   Input: X ∈ R^{d_x×ℓ_x}, Z ∈ R^{d_z×ℓ_z}, vector representations of primary and context sequence.
//   Output: Ṽ ∈ R^{d_out×ℓ_x}, updated representations of tokens in X, folding in information from Z.
//   Parameters: W_qkv consisting of: W_q ∈ R^{d_attn×d_x}, b_q ∈ R^{d_attn}, W_k ∈ R^{d_attn×d_z},
//               b_k ∈ R^{d_attn}, W_v ∈ R^{d_out×d_z}, b_v ∈ R^{d_out}.
//   Hyperparameters: Mask ∈ {0,1}^{ℓ_z×ℓ_x}
//   1  Q ← W_q X + b_q 1ᵀ                       [[Query ∈ R^{d_attn×ℓ_x}]]
//   2  K ← W_k Z + b_k 1ᵀ                       [[Key ∈ R^{d_attn×ℓ_z}]]
//   3  V ← W_v Z + b_v 1ᵀ                       [[Value ∈ R^{d_out×ℓ_z}]]
//   4  S ← Kᵀ Q                                 [[Score ∈ R^{ℓ_z×ℓ_x}]]
//   5  ∀t_z, t_x, if ¬Mask[t_z, t_x] then S[t_z, t_x] ← −∞
//   6  return Ṽ = V · softmax(S / √d_attn)
//
// Algorithm 5: Ṽ ← MHAttention(X, Z | W, Mask)
//   Parameters: W consisting of, for h ∈ [H], W^h_qkv (as above, with W^h_v ∈ R^{d_mid×d_z}), and
//               W_o ∈ R^{d_out×H·d_mid}, b_o ∈ R^{d_out}.
//   1  for h ∈ [H]:
//   2    Y^h ← Attention(X, Z | W^h_qkv, Mask)
//   3  Y ← [Y¹; Y²; …; Y^H]
//   4  return Ṽ = W_o Y + b_o 1ᵀ
//
// Algorithm 3: ṽ ← Attention(e, e_t | W_q, b_q, W_k, b_k, W_v, b_v)   (basic single-query attention)
//   1  q ← W_q e + b_q            2  ∀t: k_t ← W_k e_t + b_k         3  ∀t: v_t ← W_v e_t + b_v
//   4  ∀t: α_t = exp(qᵀk_t/√d_attn) / Σ_u exp(qᵀk_u/√d_attn)          5  return ṽ = Σ_{t=1}^T α_t v_t
//
// How the code maps to the listings:
//  * `attention_head` is Algorithm 4's lines 4–6 (given Q, K, V) for one head of one sequence; Attention and
//    BasicAttention compute lines 1–3 and call it (Algorithm 3 is Algorithm 4 with one query and no mask).
//  * MHAttention is Algorithm 5 over two parts (parts.hpp): its Q/K/V source computes Algorithm 4's lines 1–3
//    for all heads (Projections: W_q stored as one [H·d_attn, d_x] matrix, docs/api.md: W_q is (H, d_attn, d_x),
//    head h a block of rows, so each line is ONE gemm); line 2 of Algorithm 5 then runs its head kernel
//    (attention_head for "softmax") per (sequence, head) block on row blocks of Q, K, V, writing Y^h straight
//    into its rows of Y (line 3 costs nothing).
//  * The other variants are parts too, each at the place of the listing it changes: the Mask of line 5
//    (mask.hpp), a query/key transform after line 2 (V1 RoPE), a score bias in line 6 (V2 ALiBi), fewer
//    key/value heads in Algorithm 5 line 2 (V3, kv_head), dropout on line 6's weights (a part wrapping the head
//    kernel, variants/attention_dropout.cpp).
//  * Batches: X holds several sequences side by side (Seqs); attention never crosses sequences. The
//    1/√d_attn of line 6 is folded into the gemm of line 4. Masked scores are −∞ (probability exactly 0);
//    keys outside a column's candidate range (Mask::keys; the causal mask's future) are skipped, not computed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formal_transformers/dropout.hpp"
#include "formal_transformers/mask.hpp"
#include "formal_transformers/params.hpp"
#include "formal_transformers/parts.hpp"

namespace ft {

// Where one head's block of Algorithm 4's lines 4–6 sits and what acts on it: the mask, sequence b of the batch
// (per-sequence masks), head h (per-head biases) and its key/value head g (V3), the absolute position q0 of its
// first query (0, or the cache's length when decoding), the score bias (null: none) with the store holding its
// parameters. A head kernel (parts.hpp HeadKernel; attention_head, the tiled listing) takes it whole; off is the
// block's first entry in the layer's weights A (c.A_off[b·H + h]), j0 the column of its first query in the batch
// of n_x, cache the KV cache decoded from (null: none).
template <class T>
struct HeadBlock {
    const Mask* mask = nullptr;
    index_t b = 0, h = 0, q0 = 0;
    const ScoreBias<T>* bias = nullptr;
    const ParamStore<T>* store = nullptr;
    index_t g = 0, off = 0, j0 = 0, n_x = 0;
    const KVCache<T>* cache = nullptr;
    bool unscaled = false;  // V18 (T5): line 4 without 1/√d_attn
};

// Algorithm 4, lines 4–6, for one head of one sequence:
//   S ← Kᵀ Q / √d_attn (line 4, scaled); + B^h (a score bias, line 6); masked S ← −∞ (line 5);
//   A ← softmax(S) and Ṽ ← V A (line 6).
// Q:[d_attn,l_x], K:[d_attn,l_z], V:[d_v,l_z] -> A:[l_z,l_x] (kept for backward), Vt:[d_v,l_x].
template <class T>
void attention_head(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MatView<T> A, MatView<T> Vt);
// Backward of attention_head, given dṼ:[d_v,l_x]. Accumulates dQ += K dS/√d, dK += Q dSᵀ/√d,
// dV += dṼ Aᵀ, with dS = softmax'(A)(Vᵀ dṼ) per column. dA:[l_z,l_x] receives dS (∂loss/∂ of line 6's
// S/√d_attn + B: a score bias's gradient).
template <class T>
void attention_head_backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> A, CMatView<T> dVt,
                             MatView<T> dQ, MatView<T> dK, MatView<T> dV, MatView<T> dA, bool unscaled = false);
// The same lines in the two steps a part acting on the weights A goes between (attention dropout,
// variants/attention_dropout.cpp: line 6 as Ṽ = V · Dropout(A)):
//   attention_head_weights: lines 4, 5 and line 6's softmax, A = softmax(S/√d_attn + B^h);
//   attention_mix: line 6's product Ṽ = V A;
//   attention_mix_backward: its backward, dV += dṼ Aᵀ and dA = Vᵀ dṼ (dA:[l_z,l_x] overwritten);
//   attention_head_weights_backward: from dA back through the softmax (dA ← dS in place), dQ += K dS/√d,
//   dK += Q dSᵀ/√d.
template <class T>
void attention_head_weights(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, MatView<T> A);
template <class T>
void attention_mix(CMatView<T> V, CMatView<T> A, MatView<T> Vt);
template <class T>
void attention_mix_backward(CMatView<T> V, CMatView<T> A, CMatView<T> dVt, MatView<T> dV, MatView<T> dA);
template <class T>
void attention_head_weights_backward(CMatView<T> Q, CMatView<T> K, CMatView<T> A, MatView<T> dA, MatView<T> dQ,
                                     MatView<T> dK, bool unscaled = false);

// ---------------------------------------------------------------------------------------------------
// Algorithm 3.
template <class T>
struct BasicAttentionCache {
    Vector<T> q;     // [d_attn]      line 1
    Matrix<T> K;     // [d_attn, T]   line 2 (column t is k_t)
    Matrix<T> V;     // [d_out, T]    line 3 (column t is v_t)
    Matrix<T> alpha; // [T, 1]        line 4
    Matrix<T> e, E;  // the inputs, copied (backward needs them)
};

template <class T>
class BasicAttention {
public:
    BasicAttention(index_t d_in, index_t d_attn, index_t d_out, ParamStore<T>& store, const std::string& prefix = "");
    void init(ParamStore<T>& store, Rng& rng, double stddev) const;  // weights ~ N(0, stddev²), biases 0
    // e:[d_in], E:[d_in,T] -> ṽ:[d_out]
    void forward(const ParamStore<T>& store, const T* e, CMatView<T> E, T* v_tilde, BasicAttentionCache<T>& c) const;
    // dṽ:[d_out] -> de += ..., dE += ..., parameter gradients += ...
    void backward(ParamStore<T>& store, const BasicAttentionCache<T>& c, const T* dv_tilde, T* de, MatView<T> dE) const;

    index_t d_in, d_attn, d_out;
    MatParam W_q, W_k, W_v;
    VecParam b_q, b_k, b_v;
};

// ---------------------------------------------------------------------------------------------------
// Algorithm 4 (one head), over a batch of sequences.
template <class T>
struct AttentionCache {
    Matrix<T> Q, K, V;       // [d_attn,n_x], [d_attn,n_z], [d_out,n_z]   lines 1–3
    std::vector<T> A;        // softmax(S/√d_attn) of each sequence b: a [l_z_b, l_x_b] block at A_off[b]
    std::vector<index_t> A_off;
    Matrix<T> dQ, dK, dV;    // backward scratch
    std::vector<T> dA;
};

template <class T>
class Attention {
public:
    Attention(index_t d_x, index_t d_z, index_t d_attn, index_t d_out, Mask mask, ParamStore<T>& store,
              const std::string& prefix = "");
    void init(ParamStore<T>& store, Rng& rng, double stddev) const;
    // X:[d_x,n_x] (sequences sx), Z:[d_z,n_z] (sequences sz, same count) -> Vt:[d_out,n_x]
    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                 MatView<T> Vt, AttentionCache<T>& c) const;
    // dṼ:[d_out,n_x] -> dX += ..., dZ += ... (dX may alias dZ when X is Z), parameter gradients += ...
    void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                  AttentionCache<T>& c, CMatView<T> dVt, MatView<T> dX, MatView<T> dZ) const;

    index_t d_x, d_z, d_attn, d_out;
    Mask mask;
    MatParam W_q, W_k, W_v;
    VecParam b_q, b_k, b_v;
};

// ---------------------------------------------------------------------------------------------------
// Algorithm 5, over a batch of sequences.
template <class T>
class MHAttention;
template <class T>
struct MHAttentionCache {
    Matrix<T> Q;  // [H·d_attn, n_x]  Algorithm 4 line 1 for all heads (head h: rows h·d_attn …)
    Matrix<T> K;  // [H·d_attn, n_z]  line 2
    Matrix<T> V;  // [H·d_mid,  n_z]  line 3
    Matrix<T> Y;  // [H·d_mid,  n_x]  Algorithm 5 line 3: Y = [Y¹; …; Y^H]
    CMatView<T> Qv, Kv, Vv;  // Q, K, V as the kernel used them: views of Q/K/V or of the source's own buffers
    PartSlot source;         // what the Q/K/V source keeps (the fused product's buffers; V10's latents)
    // softmax(S/√d_attn) per (sequence b, head h): [l_z_b, l_x_b] at A_off[b·H + h] (mutable: filled on demand
    // after a kernel that forms no A)
    mutable std::vector<T> A;
    std::vector<index_t> A_off;
    // Dropout on the weights (training only; docs/regularisation.md; the attention-dropout part and the tiled
    // kernel keep them): the mask of every entry of A and Ad = A ⊙ M / (1 − p), the weights line 6 multiplied V
    // with. A stays softmax(S/√d_attn). training: this forward trains, its masks keyed drop_key (entry i of A:
    // DropoutStream(p, drop_key).keep(i)).
    mutable DropoutMask drop;
    std::vector<T> Ad;
    bool training = false;
    DropoutKey drop_key;
    // A kernel that forms no A (tiled: Algorithm T; V15's random features) keeps a number per head and query
    // column instead: lse[h·n_x + j] (tiled: λ, the log-sum-exp; random features: the normaliser n), and Y^h is
    // its saved Ṽ
    std::vector<T> lse;
    const HeadKernel<T>* kernel = nullptr;  // the kernel of the last forward (MHAttention::kernel_for)
    Seqs sx, sz;         // the batch of the forward (materialize_weights)
    index_t q0 = 0;      // the queries' first position (heads())
    const ParamStore<T>* store = nullptr;  // the parameters of the forward (a score bias in materialize_weights)
    mutable bool weights_ready = true;  // A (and drop.keep) hold the last forward's weights
    Mask mask;  // the Mask of the last forward (the attention's own, or the call's: V7's per-call prefix lengths)
    const MHAttention<T>* unit = nullptr;  // the attention that ran it (materialize_weights)
    // A (and with dropout drop.keep) as a literal forward leaves them: rebuilt after a kernel that forms none
    void ensure_weights() const {
        if (!weights_ready) unit->materialize_weights(*this);
    }
    // A kernel that forms no A (HeadKernel::begin of "tiled", "bigbird", "performer", "rfa") on H heads of n_x
    // query columns: A, Ad and drop.keep released (ensure_weights rebuilds them), lse sized H·n_x (`what` names
    // it in a size error).
    void keep_lse_only(index_t H, index_t n_x, const char* what);
};
// Backward scratch; one can serve every layer of a model (used one layer at a time).
template <class T>
struct MHAttentionWork {
    Matrix<T> dY, dQ, dK, dV;
    std::vector<T> dA;  // the literal kernel's dS per block (at c.A_off)
    PartSlot source;    // the Q/K/V source's scratch
};
// Keys and values of the context tokens seen so far, for decoding one sequence with a cache (Alg 14/15).
template <class T>
struct KVCache {
    Matrix<T> K;  // [key_rows, capacity]  the source's (QKVSource::append): H_kv·d_attn rows of keys (with RoPE:
                  // rotated at their absolute positions); V10: the latent [Ĉ_KV; K_R] of each token
    Matrix<T> V;  // [value_rows, capacity]  H_kv·d_mid rows of values; V10: none (up-projected when attended)
    index_t len = 0;    // cached columns
    index_t start = 0;  // absolute position of column 0: > 0 once a sliding window (V9) dropped older keys (or
                        // a kernel folded them into its state)
    // The head kernel's running state (HeadKernel::before_append). V15: the keys before column 0 folded into
    // S = Σ v φ(k)ᵀ, z = Σ φ(k) per key/value head; K, V then hold only the last appended columns.
    PartSlot state;
};

// Algorithm 4's lines 1–3 for all heads (the listing's Q/K/V source, "projections"; listings/qkv_projections.cpp):
//   Q ← W_q X + b_q 1ᵀ,  K ← W_k Z + b_k 1ᵀ,  V ← W_v Z + b_v 1ᵀ   (W_q = [W_q¹; …; W_q^H], …; V3: K, V have H_kv
// heads; V5: no b's), one product per matrix. Self-attention (Z is X, same sequences): the three as ONE product,
// [Q; K; V] ← [W_q; W_k; W_v] X + [b_q; b_k; b_v] 1ᵀ (the same numbers; X is read and packed once).
template <class T>
struct ProjectionState : PartStateOf<ProjectionState<T>> {
    bool fused = false;
    Matrix<T> QKV;    // [2·H·d_attn + H·d_mid, n_x]  (fused only)
    Matrix<T> W_qkv;  // [2·H·d_attn + H·d_mid, d_x]  a copy of θ's W_q, W_k, W_v stacked (fused only)
    Vector<T> b_qkv;  // [2·H·d_attn + H·d_mid]
};
template <class T>
struct ProjectionWork : PartStateOf<ProjectionWork<T>> {
    Matrix<T> dQKV, dW_qkv;  // fused self-attention: [dQ; dK; dV] and [dW_q; dW_k; dW_v] of this call
};
template <class T>
class Projections final : public QKVSource<T> {
public:
    Projections(const AttnPartSpec<T>& spec, ParamStore<T>& store, const std::string& prefix);
    const char* name() const override { return "projections"; }
    void init(ParamStore<T>& store, Rng& rng, double stddev) const override;
    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                 MHAttentionCache<T>& c, MatView<T>& Q, MatView<T>& K, MatView<T>& V) const override;
    void gradients(const MHAttentionCache<T>& c, bool dx_is_dz, index_t n_x, index_t n_z, MHAttentionWork<T>& w,
                   MatView<T>& dQ, MatView<T>& dK, MatView<T>& dV) const override;
    void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                  const MHAttentionCache<T>& c, MatView<T> dQ, MatView<T> dK, MatView<T> dV, MatView<T> dX,
                  MatView<T> dZ, MHAttentionWork<T>& w) const override;
    index_t key_rows() const override { return Dk; }
    index_t value_rows() const override { return Dv; }
    void append(const ParamStore<T>& store, CMatView<T> Z, index_t p0, MatView<T> Kc, MatView<T> Vc) const override;
    void queries(const ParamStore<T>& store, CMatView<T> X, index_t q0, MatView<T> Q,
                 MHAttentionCache<T>& s) const override;
    void keys_values(const ParamStore<T>& store, CMatView<T> Kc, CMatView<T> Vc, MHAttentionCache<T>& s,
                     CMatView<T>& K, CMatView<T>& V) const override;

    MatParam W_q, W_k, W_v;
    VecParam b_q, b_k, b_v;  // empty with bias = false (V5)

private:
    const T* bias(const ParamStore<T>& s, const VecParam& b) const { return has_bias ? s.v(b) : nullptr; }
    T* dbias(ParamStore<T>& s, const VecParam& b) const { return has_bias ? s.grad_if_trained(b) : nullptr; }
    index_t d_x = 0, Dq = 0, Dk = 0, Dv = 0;  // H·d_attn, H_kv·d_attn, H_kv·d_mid
    bool has_bias = true;
};

template <class T>
class MHAttention {
public:
    // v: the variants of docs/variants.md (V3 H_kv key/value heads, V5 no biases, a position part: V1 "rope",
    // V2 "alibi"); the default is Algorithm 5. ValueError: H_kv not dividing H, an unknown position, the
    // position part's own checks (RoPE: odd d_attn, θ ≤ 0).
    MHAttention(index_t H, index_t d_x, index_t d_z, index_t d_attn, index_t d_mid, index_t d_out, Mask mask,
                ParamStore<T>& store, const std::string& prefix = "", const AttnVariant& v = AttnVariant());
    // W_q, W_k, W_v ~ N(0, stddev²); W_o ~ N(0, out_stddev²); biases 0
    void init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const;

    // X:[d_x,n_x] (sequences sx), Z:[d_z,n_z] (sequences sz, same count) -> Vt:[d_out,n_x]
    // accumulate: Vt += Ṽ (the residual update X ← X + MHAttention(…) of the architectures, in place)
    // drop (training): the forward trains, and a dropout part of the kernel keys its masks drop->key(place)
    // call_mask: this call's Mask instead of the attention's own (V7: a prefix mask with this batch's p_b); kept
    // in c for the backward pass
    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                 MatView<T> Vt, MHAttentionCache<T>& c, bool accumulate = false, const Dropout* drop = nullptr,
                 std::uint64_t place = 0, const Mask* call_mask = nullptr) const;
    // dṼ:[d_out,n_x] -> dX += ..., dZ += ... (dX may alias dZ when X is Z), parameter gradients += ...
    void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                  const MHAttentionCache<T>& c, CMatView<T> dVt, MatView<T> dX, MatView<T> dZ,
                  MHAttentionWork<T>& w) const;

    // Decoding with a cache. append_kv: keys and values of new context columns Z:[d_z,n] appended at
    // cache.len (capacity grows as needed). attend_cached: queries X:[d_x,n] at absolute positions q0,
    // q0+1, … attend over the cache's tokens -> Vt:[d_out,n]. Self-attention decoding is append_kv(x_new)
    // then attend_cached(x_new, q0 = old length); cross-attention fills the cache from Z once.
    void append_kv(const ParamStore<T>& store, CMatView<T> Z, KVCache<T>& cache) const;
    void attend_cached(const ParamStore<T>& store, CMatView<T> X, index_t q0, const KVCache<T>& cache,
                       MatView<T> Vt, MHAttentionCache<T>& scratch, bool accumulate = false,
                       const Mask* call_mask = nullptr) const;

    // After a forward whose kernel forms no A (tiled; random features): fill c.A with the weights of every
    // (sequence, head) as the printed listing leaves them (HeadKernel::weights) and, with dropout, c.drop.keep
    // with the masks the tiles drew. Nothing to do after a literal forward. O(ℓ²) memory, only when asked for.
    void materialize_weights(const MHAttentionCache<T>& c) const;
    // Can the tiled listing honour this attention's parts? The mask part always (its candidate ranges and
    // allows()); a score bias only with a tiled form (ScoreBias::tiles(): no parameters); a query/key transform
    // and V3's key/value heads act outside lines 4–6.
    bool tiled_parts() const { return !position.bias || position.bias->tiles(); }
    // Whether a call whose longest key sequence is l_z runs the kernel's tiled form (var.impl; Auto: l_z ≥
    // kTiledFromLength and tiled_parts(), else the kernel as printed)
    bool use_tiled(index_t l_z) const {
        return tiled && tiled_parts() && (var.impl == AttnImpl::Tiled || (var.impl == AttnImpl::Auto && l_z >= kTiledFromLength));
    }
    // The head kernel of a call whose longest key sequence is l_z
    const HeadKernel<T>& kernel_for(index_t l_z) const { return use_tiled(l_z) ? *tiled : *kernel; }

    index_t H, d_x, d_z, d_attn, d_mid, d_out;
    Mask mask;
    MatParam W_o;  // [d_out, H·d_mid]
    VecParam b_o;  // [d_out]
    // The parameters of Algorithm 4's lines 1–3 when the source is the listing's projections (empty otherwise):
    // stacked [H·d_attn, d_x], [H_kv·d_attn, d_z], [H_kv·d_mid, d_z]; b's [H·d_attn], [H_kv·d_attn], [H_kv·d_mid]
    MatParam W_q, W_k, W_v;
    VecParam b_q, b_k, b_v;
    // Variants (docs/variants.md). Query head h uses key/value head kv_head(h) = h / (H/H_kv) (V3). With bias =
    // false the b's are not in θ (V5). position: the part named by var.position (a query/key transform or a
    // score bias).
    AttnVariant var;
    index_t H_kv = 0;
    PositionPart<T> position;
    index_t kv_head(index_t h) const { return h / (H / H_kv); }
    // The two kinds of Algorithm 4's lines (parts.hpp): where Q, K, V come from (lines 1–3: "projections", or
    // V10's "latent" when var.options choose it), and the head kernel of lines 4–6 (var.kernel: "softmax", V15's
    // "performer" or "rfa") with its tiled form (null: none; "tiled" for "softmax"), chosen per call by var.impl.
    std::shared_ptr<const QKVSource<T>> source;
    std::shared_ptr<const HeadKernel<T>> kernel, tiled;
    // The numbers the KV cache keeps per token: H_kv·(d_attn + d_mid), or with V10 d_c + d_R
    index_t cache_rows() const { return source->key_rows() + source->value_rows(); }

private:
    const T* bias(const ParamStore<T>& s, const VecParam& b) const { return var.bias ? s.v(b) : nullptr; }
    T* dbias(ParamStore<T>& s, const VecParam& b) const { return var.bias ? s.grad_if_trained(b) : nullptr; }
    // Algorithm 5 lines 1–3: every (sequence, head) block through the call's kernel: Q, K, V (all heads) ->
    // Y = [Y¹; …; Y^H] (and what the kernel keeps in c); queries at q0 + …; cache: decoding's KV cache.
    void heads(const ParamStore<T>& store, CMatView<T> Q, const Seqs& sx, CMatView<T> K, CMatView<T> V,
               const Seqs& sz, index_t q0, MHAttentionCache<T>& c, MatView<T> Y, const Dropout* drop,
               std::uint64_t place, const KVCache<T>* cache = nullptr) const;
    // the block (b, h) of the call recorded in c
    HeadBlock<T> block(const MHAttentionCache<T>& c, index_t b, index_t h, const ParamStore<T>* store,
                       const KVCache<T>* cache = nullptr) const;
};

}  // namespace ft
