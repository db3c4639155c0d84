// Speculative decoding (Leviathan, Kalman & Matias 2023; Chen et al. 2023) beside Algorithm 14:
// docs/speculative_decoding.md gives the listing, the cached path and the proof; quoted here.
//
// Algorithm S: y ← SpeculativeInference(x, θ̂_target, θ̂_draft)
//   Hyperparameters: k ≥ 1 (tokens drafted per round), τ ∈ [0, ∞), ℓ_gen ∈ ℕ
//   (q: the target's sampling distribution, p: the draft's)
//    1  ℓ ← length(x)
//    2  while length(x) < ℓ + ℓ_gen do
//    3    m ← length(x);  k' ← min(k, ℓ + ℓ_gen − m − 1)
//    4    for j = 1, 2, …, k' do
//    5      P̃ ← DTransformer([x, x̂_1, …, x̂_{j−1}] | θ̂_draft)
//    6      p_j ∝ P̃[:, m + j − 1]^{1/τ}
//    7      sample a token x̂_j from p_j
//    8    end
//    9    P ← DTransformer([x, x̂_1, …, x̂_{k'}] | θ̂_target)
//   10    q_j ∝ P[:, m + j − 1]^{1/τ}  for j = 1, 2, …, k' + 1
//   11    for j = 1, 2, …, k' do
//   12      sample r uniformly from [0, 1)
//   13      if r ≥ min(1, q_j[x̂_j] / p_j[x̂_j]) then
//   14        sample a token y from norm(max(0, q_j − p_j))
//   15        x ← [x, x̂_1, …, x̂_{j−1}, y];  continue at line 2
//   16      end
//   17    end
//   18    sample a token y from q_{k'+1}
//   19    x ← [x, x̂_1, …, x̂_{k'}, y]
//   20  end
//   21  return y = x[ℓ + 1 : ℓ + ℓ_gen]
//
// Cached path (the only one here): each model keeps a KV cache (DTransformer::Decoder). Line 5 feeds the
// draft the tokens its cache has not seen; line 9 feeds the target the unseen tokens of x and x̂_1..x̂_{k'}
// in ONE call that keeps the logits of every column (DTransformer::decode_all); after line 15 or 19 both
// caches are rolled back to the kept tokens. τ = 0: p_j, q_j are one-hot at the argmax (first of ties), so
// the output is the target's greedy output. Requires ℓ + ℓ_gen − 1 ≤ ℓ_max of both models (no sliding
// window). Random numbers: one uniform per sampled token (τ > 0) and one per line 12.
#pragma once

#include <vector>

#include "formal_transformers/transformers.hpp"

namespace ft {

struct SpeculativeStats {
    index_t target_passes = 0;     // line 9 calls
    index_t draft_passes = 0;      // line 5 calls
    std::vector<index_t> drafted;  // k' of each round (one entry per target pass)
    std::vector<index_t> accepted; // drafts kept in each round (0 … k'); the round adds accepted + 1 tokens
};

// k of Algorithm S (ValueError unless k >= 1): the check SpeculativeInference runs, callable before a model
// exists (the Python constructor; ℓ_gen's is inference.hpp's check_l_gen).
void check_draft_k(index_t k);

// Algorithm S: ℓ_gen new tokens after the prompt x[0:l]. ValueError: k < 1, τ < 0, ℓ_gen < 0, different
// vocabularies, ℓ + ℓ_gen − 1 > ℓ_max of either model; IndexError: a prompt id outside [0, N_V).
template <class T>
std::vector<index_t> SpeculativeInference(const DTransformer<T>& target, const DTransformer<T>& draft, const index_t* x,
                                          index_t l, index_t l_gen, index_t k, double tau, Rng& rng,
                                          SpeculativeStats* stats = nullptr);

// Algorithm S with the model's own V16 modules as the draft (self-speculation, multi_token.hpp; no second model):
// module j drafts x̂_j from the trunk's last kept hidden state, the trunk verifies in one cached pass. The first
// pass drafts nothing. ValueError: mtp_depth = 0, k > mtp_depth, a mask with a window (a rolling cache), and the checks above.
template <class T>
std::vector<index_t> SelfSpeculativeInference(const DTransformer<T>& model, const index_t* x, index_t l, index_t l_gen,
                                              index_t k, double tau, Rng& rng, SpeculativeStats* stats = nullptr);

}  // namespace ft
