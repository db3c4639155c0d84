// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): a low-rank adapter on a weight
// matrix of the listings, docs/variants.md "LoRA". The listing, for a matrix W ∈ R^{d_out×d_in} of θ:
//
//   Parameters: A ∈ R^{r×d_in}, B ∈ R^{d_out×r} (added to θ as <name>.lora_A, <name>.lora_B)
//   Hyperparameters: r ∈ ℕ (1 ≤ r ≤ min(d_out, d_in)), α ∈ (0, ∞); s = α / r; p ∈ [0, 1), the dropout rate of
//                    the adapter's input
//   1  W' ← W + s · B A
//   2  the listing's line that uses W runs with W' (e.g. Algorithm 4 line 1: Q ← W'_q X + b_q 1ᵀ)
//   In a training forward (loss_and_grad, the trainers) with p > 0, line 2 is instead, for that line's input X:
//   2′ X̃ ← Dropout(X | p, M)                   [[Algorithm D1, M keyed by (seed, step, the adapter)]]
//   3′ the line runs with W, plus s · B (A X̃)  (e.g. Q ← W_q X + b_q 1ᵀ + s · B (A X̃))
//   Backward, from ∂loss/∂W' (line 2's own backward):
//   d1 ∂loss/∂A ← s · Bᵀ ∂loss/∂W',  ∂loss/∂B ← s · ∂loss/∂W' Aᵀ,  ∂loss/∂W ← ∂loss/∂W'
//   or from ∂loss/∂Y, Y the output of line 3′ (the line's own backward with W gives ∂loss/∂W, ∂loss/∂b, Wᵀ ∂loss/∂Y):
//   d3′ ∂loss/∂A += s · Bᵀ ∂loss/∂Y X̃ᵀ,  ∂loss/∂B += s · ∂loss/∂Y (A X̃)ᵀ,
//       ∂loss/∂X += DropoutBackward(s · Aᵀ Bᵀ ∂loss/∂Y | p, M)   [[Algorithm D2]]
//
// Line 2′ is inverted dropout (Ỹ = Y ⊙ M / (1 − p)), so evaluation (model(x), loss, inference) runs line 2, the
// expectation of line 3′ over M; p = 0 is line 2 always. The masks are the model's dropout masks (dropout.hpp:
// counter-based, keyed by dropout_seed and dropout_step), named <W's name>.lora_dropout in dropout_masks().
//
// Initialisation (as peft's): A ~ U(−1/√d_in, 1/√d_in) (PyTorch's kaiming_uniform_(a=√5)), B = 0, so an adapted
// model starts with the outputs of the model it adapts. merge_lora: W ← W' (line 1, the same arithmetic: the
// merged model's outputs equal the adapted model's bit for bit) and the adapters leave θ.
// Which matrices: W_q, W_k, W_v, W_o of every attention and the MLPs' W_mlp1 … W_mlp4 (and a gated MLP's
// W_gate), named by their last component (every layer's) or by full name or glob pattern.
#pragma once

#include <string>
#include <vector>

#include "formal_transformers/config.hpp"
#include "formal_transformers/params.hpp"

namespace ft {

// The matrices of `store` (declared, not yet allocated) that c.lora's targets name, each with its adapter's A
// and B declared after θ's other entries (in θ's order). ValueError naming a target that matches nothing, or
// names a parameter that is not an adaptable matrix, and r outside [1, min(d_out, d_in)].
template <class T>
void declare_lora(const ModelConfig::Lora& c, ParamStore<T>& store);
// The LoRA options checked (ValueError naming the bad one): r >= 1, α finite > 0, dropout in [0, 1), at least one
// target, no empty name.
void check_lora(const ModelConfig::Lora& c);

// The listings' line Y ← W X + b 1ᵀ (blas.hpp's affine, affine_add, affine_backward) on a matrix W of θ: with W'
// of an adapted W (line 2), or lines 2′–3′ and d3′ when W's adapter drops its input in this training forward
// (ParamStore::lora_drops). The listings that hold adaptable matrices (lora.cpp's kAdaptable) call these.
template <class T>
void affine(const ParamStore<T>& store, const MatParam& W, CMatView<T> X, const T* b, MatView<T> Y);
template <class T>
void affine_add(const ParamStore<T>& store, const MatParam& W, CMatView<T> X, const T* b, MatView<T> Y);
template <class T>
void affine_backward(ParamStore<T>& store, const MatParam& W, CMatView<T> X, CMatView<T> dY, T* dW, T* db, T* dX,
                     index_t ld_dX = -1);

}  // namespace ft
