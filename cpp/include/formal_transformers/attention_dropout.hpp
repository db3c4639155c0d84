// Dropout on the attention weights (docs/regularisation.md; Srivastava et al. 2014, its place in the transformer:
// Vaswani et al. 2017 §5.4) as a part around a head kernel: Algorithm 4's line 6 becomes
//
//   6  return Ṽ = V · Dropout(softmax(S / √d_attn) | p, M)
//
// with Algorithms D1 and D2 (dropout.hpp) on the weights A between the kernel's softmax and line 6's product:
//   forward:  A ← the kernel's lines 4–6 up to the softmax;  Ã ← A ⊙ M / (1 − p) (D1);  Ṽ ← V Ã
//   backward: dV += dṼ Ãᵀ;  dÃ ← Vᵀ dṼ;  dA ← dÃ ⊙ M / (1 − p) (D2);  then the kernel's softmax, lines 5, 4 backward
// The kernel wrapper "dropout" (variants/attention_dropout.cpp, its registry row declares the option attn_dropout)
// wraps any head kernel whose registry line says it forms the weights (head_kernel_forms_weights: the listing's
// "softmax", V25's "softcap", V31's "sigmoid"); the tiled kernel (Algorithm T) drops the same entries tile by tile itself. A mask entry is keyed by
// its index in the layer's weights (WeightsDropout::i0 + t_z + t_x ℓ_z), so every path draws the same masks.
// The functions below are the part on the listing's kernel (attention_head's two steps), for one head.
#pragma once

#include <cstdint>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/dropout.hpp"

namespace ft {

// D1 on one head's weights: Ad ← A ⊙ M / (1 − p), keep[i] = M at entries d.i0 + i (A, Ad: [l_z,l_x], contiguous)
template <class T>
void drop_weights(const WeightsDropout& d, CMatView<T> A, MatView<T> Ad, std::uint8_t* keep);

// Algorithm 4's lines 4–6 with line 6 as Ṽ = V · Dropout(A | p, M) on the listing's kernel: A:[l_z,l_x] (kept: the
// softmax), Ad:[l_z,l_x] (the dropped weights V was multiplied with) and keep (M) kept for the backward.
template <class T>
void attention_dropout_head(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, const WeightsDropout& d,
                            MatView<T> A, MatView<T> Ad, std::uint8_t* keep, MatView<T> Vt);
// Its backward, as attention_head_backward's (dA receives dS) with Ad in line 6 and D2 before the softmax's
template <class T>
void attention_dropout_head_backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> A, CMatView<T> Ad,
                                     const std::uint8_t* keep, double p, CMatView<T> dVt, MatView<T> dQ, MatView<T> dK,
                                     MatView<T> dV, MatView<T> dA, bool unscaled = false);

}  // namespace ft
