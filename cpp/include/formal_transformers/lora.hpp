// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): a low-rank adapter on a weight
// matrix of the listings, docs/variants.md "LoRA". The listing, for a matrix W ∈ R^{d_out×d_in} of θ:
//
//   Parameters: A ∈ R^{r×d_in}, B ∈ R^{d_out×r} (added to θ as <name>.lora_A, <name>.lora_B)
//   Hyperparameters: r ∈ ℕ (1 ≤ r ≤ min(d_out, d_in)), α ∈ (0, ∞); s = α / r
//   1  W' ← W + s · B A
//   2  the listing's line that uses W runs with W' (e.g. Algorithm 4 line 1: Q ← W'_q X + b_q 1ᵀ)
//   Backward, from ∂loss/∂W' (line 2's own backward):
//   d1 ∂loss/∂A ← s · Bᵀ ∂loss/∂W',  ∂loss/∂B ← s · ∂loss/∂W' Aᵀ,  ∂loss/∂W ← ∂loss/∂W'
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
// The LoRA options checked (ValueError naming the bad one): r >= 1, α finite > 0, dropout 0 (see docs/variants.md),
// at least one target, no empty name.
void check_lora(const ModelConfig::Lora& c);

}  // namespace ft
