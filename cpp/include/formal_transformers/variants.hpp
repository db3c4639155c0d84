// Decoder variants (docs/variants.md): V1 RoPE, V2 ALiBi, V3 grouped-query attention, V4 SwiGLU/SiLU,
// V5 bias-free linear maps: the listings and their kernels. Each variant is a part (parts.hpp) in its own
// file under cpp/src/variants/ (rope.cpp, alibi.cpp, gated_mlp.cpp), made through the registry (registry.cpp);
// V3 is MHAttention's kv_head (attention.hpp), V5 the parts' `bias` option.
//
// Algorithm V1: X′ ← RoPE(X, p | θ)    X ∈ R^{d×ℓ} (one head's queries or keys, d even), p ∈ N^ℓ
//   1  for i ∈ [d/2]: ω_i ← θ^{−2(i−1)/d}
//   2  for t ∈ [ℓ], i ∈ [d/2]:
//   3    c ← cos(p[t] ω_i),  s ← sin(p[t] ω_i)
//   4    X′[i, t]       ← c X[i, t] − s X[i + d/2, t]
//   5    X′[i + d/2, t] ← s X[i, t] + c X[i + d/2, t]
//   6  return X′
//   Inserted into Algorithm 4 after line 2: 2a Q ← RoPE(Q, (q₀, …, q₀+ℓ_x−1)), 2b K ← RoPE(K, (0, …, ℓ_z−1)).
//   Backward: dX = R(p)ᵀ dX′ (the same rotation by −p).
//
// Algorithm V2: m ← ALiBiSlopes(H)
//   1  n ← 2^{⌊log₂ H⌋}
//   2  for h ∈ [n]: m_h ← 2^{−8h/n}
//   3  for h ∈ [H − n]: m_{n+h} ← 2^{−4(2h−1)/n}
//   4  return m
//   Replaces Algorithm 4 line 6 for head h: Ṽ = V · softmax(S/√d_attn − m_h D), D[t_z, t_x] = |q₀ + t_x − t_z|.
//   Backward: Algorithm 4's, unchanged (the bias is a constant).
//
// Algorithm V3 (grouped-query attention) replaces Algorithm 5 lines 1–2:
//   1  for h ∈ [H]:  2  g ← ⌈h·H_kv/H⌉;  3  Y^h ← Attention(X, Z | W_q^h, b_q^h, W_k^g, b_k^g, W_v^g, b_v^g, Mask)
//   (MHAttention: `AttnVariant::H_kv`, `kv_head(h)`; dK^g, dV^g are sums over the group's query heads.)
//
// Algorithm V4: Y ← SwiGLU(X̃ | W_gate, b_gate, W_mlp1, b_mlp1, W_mlp2, b_mlp2)   replaces Algorithm 10 line 8
//   1  G ← W_gate X̃ + b_gate 1ᵀ    2  U ← W_mlp1 X̃ + b_mlp1 1ᵀ    3  A ← SiLU(G) ⊙ U    4  return Y = W_mlp2 A + b_mlp2 1ᵀ
//   SiLU(x) = x σ(x) = x / (1 + e^{−x});  SiLU′(x) = σ(x) (1 + x (1 − σ(x))).
//   Backward: dA = W_mlp2ᵀ dY; dU = dA ⊙ SiLU(G); dG = dA ⊙ U ⊙ SiLU′(G); dX̃ = W_gateᵀ dG + W_mlp1ᵀ dU.
//
// V5: bias=False removes b_q, b_k, b_v, b_o (Algorithms 4, 5) and b_mlp1, b_mlp2, b_gate (Algorithm 10
// line 8) from θ: each W X + b 1ᵀ of those lines becomes W X.
#pragma once

#include <vector>

#include "formal_transformers/common.hpp"

namespace ft {

// How Algorithm 4's lines 4–6 are computed (docs/api.md `attention_impl`; AttnVariant::impl, parts.hpp): Literal,
// the listing as printed (the weights A held, ℓ_z×ℓ_x per head); Tiled, Algorithm T (tiled_attention.hpp: the
// same numbers up to rounding, O(ℓ·d) memory per head); Auto, Tiled from kTiledFromLength context tokens on
// (docs/design.md "Tiled attention") for the parts the tiled listing honours, Literal otherwise.
enum class AttnImpl { Auto, Literal, Tiled };
// Auto's threshold: the longest key sequence of a call at which the tiled listing becomes the faster one
// (measured on the baby GPT shape's training step, docs/benchmarks.md "Tiled attention").
constexpr index_t kTiledFromLength = 256;

// Algorithm V1 on every head of X:[n_heads·d, n] in place, column j at absolute position pos[j];
// inverse = true applies R(p)ᵀ (the backward). d even.
template <class T>
void rope(MatView<T> X, index_t n_heads, index_t d, const index_t* pos, double theta, bool inverse = false);

// Algorithm V2, lines 1–4 (0-based: slopes[h] is m_{h+1}).
std::vector<double> alibi_slopes(index_t H);

// Algorithm V11 (T5's relative position buckets, variants/relative_bias.cpp): the bucket of the offset r = t_z − t_x
// among num_buckets (halved per direction when bidirectional), log-spaced up to max_distance.
index_t relative_bucket(index_t r, bool bidirectional, index_t num_buckets, index_t max_distance);
// V11's one rule for its options, called by the config's resolve (once per direction of the model's stacks) and by
// the part's factory: line 3's m = N/2 must be >= 1 (N = num_buckets/2 bidirectional, num_buckets causal: so
// num_buckets >= 4, resp. >= 2) and max_distance > m (line 5 divides by ln(d_max/m): at d_max = m by 0, below m the
// log-spaced buckets run backwards, below 0). ValueError naming relative_buckets or relative_max_distance.
void check_relative_buckets(index_t num_buckets, index_t max_distance, bool bidirectional);

// SiLU, element-wise (V4's φ, variants/gated_mlp.cpp): y = x σ(x) (x, y may alias); dx = SiLU′(x) ⊙ dy (dx, dy may alias).
template <class T>
void silu(const T* x, T* y, index_t n);
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, index_t n);

}  // namespace ft
