// Algorithm T (tiled exact attention): Algorithm 4's lines 4–6 computed block by block, never holding the
// ℓ_z×ℓ_x score or weight matrices (Dao et al. 2022, "FlashAttention"; Dao 2023, "FlashAttention-2":
// online softmax over key blocks, recomputation from the log-sum-exp in the backward pass). The same numbers
// as `attention_head` (attention.hpp) up to float rounding; docs/tiled_attention.md has the listing in the
// paper's style.
//
// Algorithm T1: Ṽ, λ ← TiledAttention(Q, K, V | Mask, B_q, B_k)
//   Input: Q ∈ R^{d_attn×ℓ_x}, K ∈ R^{d_attn×ℓ_z}, V ∈ R^{d_v×ℓ_z} (Algorithm 4's lines 1–3).
//   Output: Ṽ ∈ R^{d_v×ℓ_x} (= V softmax(S/√d_attn), line 6), λ ∈ R^{ℓ_x} the log-sum-exp of each column.
//   Hyperparameters: Mask ∈ {0,1}^{ℓ_z×ℓ_x}; block sizes B_q (queries), B_k (keys).
//   1  for each query block J (B_q columns):
//   2    m_J ← −∞, l_J ← 0, Ṽ_J ← 0
//   3    for each key block I (B_k rows) with some Mask[I, J] = 1:
//   4      S ← K_Iᵀ Q_J / √d_attn;  ∀ masked (t_z, t_x): S[t_z, t_x] ← −∞     [[Algorithm 4 lines 4–5 on a block]]
//   5      m′ ← max(m_J, max_rows S);  P ← exp(S − 1 m′ᵀ)
//   6      l_J ← e^{m_J − m′} ⊙ l_J + 1ᵀ P;  Ṽ_J ← Ṽ_J diag(e^{m_J − m′}) + V_I P;  m_J ← m′
//   7    Ṽ_J ← Ṽ_J diag(l_J)^{-1};  λ_J ← m_J + log l_J
//   8  return Ṽ, λ
//
// Algorithm T2: dQ, dK, dV ← TiledAttentionBackward(dṼ | Q, K, V, Ṽ, λ, Mask, B_q, B_k)
//   1  D ← 1ᵀ (dṼ ⊙ Ṽ)                                               [[D_t = Σ_i A[i,t] dA[i,t]]]
//   2  for each key block I:  for each query block J with some Mask[I, J] = 1  (I cut to the rows J may see):
//   3    S ← K_Iᵀ Q_J / √d_attn (masked: −∞);  P ← exp(S − 1 λ_Jᵀ)       [[= A[I, J], recomputed]]
//   4    dV_I += dṼ_J Pᵀ;  dP ← V_Iᵀ dṼ_J
//   5    dS ← P ⊙ (dP − 1 D_Jᵀ)
//   6    dQ_J += K_I dS / √d_attn;  dK_I += Q_J dSᵀ / √d_attn
//   7  return dQ, dK, dV
//
// Parts, as in attention_head: the mask part gives line 4's masked set (and the tiles to skip); a score bias
// part (ALiBi, V2: −m_h |q0 + t_x − t_z|) is added to S in line 4 of both, tile by tile; RoPE
// (V1, a QKTransform) is applied to Q and K before; GQA (V3) is the caller passing a shared K, V (and summing dK, dV);
// dropout on the weights multiplies P by M/(1 − p) in the product with V (T1 line 6, T2 line 4: Pd) and dP by
// the same (T2 line 4), with M drawn entry by entry from the same counter-based stream as the literal path
// (entry (t_z, t_x) of the head's weights is i0 + t_z + t_x ℓ_z): the same masks, so the same numbers.
// (T2 line 1 holds with dropout too: Σ_i A dA = Σ_i A (M/(1−p)) (Vᵀ dṼ) = dṼᵀ V (A ⊙ M/(1−p)) = dṼᵀ Ṽ.)
//
// Memory: the saved state is Ṽ (the caller keeps it: Algorithm 5's Y) and λ, O(ℓ·d) per head; the scratch is
// a few B_k×B_q blocks per thread.
#pragma once

#include <cstdint>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/dropout.hpp"

namespace ft {

// How the products on tiles are computed: one single-thread BLAS call each (gemm_unsplit); our own
// register-blocked kernels (Blocked: K and V packed once per head, nothing packed per tile, T2's pointwise lines
// done in the score kernel where no mask, bias or dropout intervenes); or our own loops (vectorised axpy/dot
// loops, no blocking; the naive side the tests hold the other two to). The model's kernel ("tiled") takes Blocked,
// and Blas when the calling thread's products are bf16 (precision.hpp): then every tile product is rounded to bf16.
enum class TileKernel { Blas, Loops, Blocked };
// Block sizes of the tiles: B_q query columns × B_k key rows (a B_k×B_q block of S, P, dP in the cache), and
// the kernel of their products (bench/bench_tiles.cpp and bench/ab_step.py measured them: docs/benchmarks.md
// "Tiled attention").
struct TileSizes {
    index_t B_q = 64, B_k = 128;
    TileKernel kernel = TileKernel::Blocked;
};

// T1 for one head of one sequence: Q:[d_attn,l_x], K:[d_attn,l_z], V:[d_v,l_z] -> Vt:[d_v,l_x], lse:[l_x].
// blk: the same block as attention_head takes (attention.hpp HeadBlock): the mask part (its candidate ranges
// skip whole tiles, allows() the entries of a non-dense range), the sequence b, the head h, q0 the absolute
// position of Q's first column (cached decoding), the score bias part (added tile by tile: it must have a
// tiled form, ScoreBias::tiles()). drop (null: none): dropout on the weights (dropout.hpp WeightsDropout: the
// rate, key and first entry i0 of attention_dropout.hpp's part; the tiles draw the same mask entry by entry). Runs
// on the calling thread (its products: one-thread BLAS calls, gemm_unsplit), so callers run heads in parallel.
// Every column must keep a context token.
template <class T>
void tiled_attention_head(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MatView<T> Vt, T* lse,
                          TileSizes tiles = {}, const WeightsDropout* drop = nullptr);

// T2: given the forward's Vt (Ṽ) and lse and dṼ:[d_v,l_x], accumulates dQ += …, dK += …, dV += … (the same
// gradients as attention_head_backward, with dropout attention_dropout_head_backward's). Same block, dropout and
// threading as the forward.
template <class T>
void tiled_attention_head_backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Vt, const T* lse,
                                   CMatView<T> dVt, const HeadBlock<T>& blk, MatView<T> dQ, MatView<T> dK,
                                   MatView<T> dV, TileSizes tiles = {}, const WeightsDropout* drop = nullptr);

}  // namespace ft
