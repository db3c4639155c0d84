// Algorithm 14 for many prompts at once: a paged KV cache (PagedAttention, Kwon et al. 2023) and continuous
// batching; and prompt caches (a prompt's keys and values computed once, kept, continued). The listing in the
// paper's style is docs/paged_decoding.md; the code is cpp/src/listings/paged_decoding.cpp.
//
// Algorithm P: Y ← PagedDInference(x_1, …, x_S | θ̂)
//   Hyperparameters: ℓ_gen, τ (as Algorithm 14); B_max (the batch), P (tokens per page)
//   Pages: per layer l a pool of pages K_l[p] ∈ R^{H_kv·d_attn × P}, V_l[p] ∈ R^{H_kv·d_mid × P}; sequence s owns
//   the pages of its block table β_s: token t of s sits in column t mod P of page β_s[⌊t/P⌋].
//   1  waiting ← (1, …, S);  active ← ∅
//   2  while waiting ≠ ∅ or active ≠ ∅ do
//   3    while |active| < B_max and waiting ≠ ∅ do                            [[a sequence joins]]
//   4      s ← pop(waiting);  run Algorithm 14's line 3 on x_s with the cache (one column per prompt token),
//          keeping its keys and values in fresh pages β_s;  sample y from q ∝ p^{1/τ};  x_s ← [x_s, y]
//   5      active ← active ∪ {s}
//   6    X[:, b] ← W_e[:, x_{s_b}[last]] + W_p[:, ℓ_{s_b} − 1]  for each active s_b  [[one column per sequence]]
//   7    for l = 1, …, L do                                                    [[Algorithm 10 lines 5–8, batched]]
//   8      X̃ ← layer_norm(X | γ¹_l, β¹_l)
//   9      Q ← W_q X̃ + b_q1ᵀ;  K ← W_k X̃ + b_k1ᵀ;  V ← W_v X̃ + b_v1ᵀ          [[one gemm each over the batch]]
//  10      for each b: write K[:, b], V[:, b] into page β_{s_b}[⌊t_b/P⌋], column t_b mod P   (t_b = ℓ_{s_b} − 1)
//  11      for each b, head h: Ỹ^h[:, b] ← Σ_pages V^h_page softmax(K^hᵀ_pages Q^h[:, b]/√d_attn + mask)  [[Alg. 4, paged]]
//  12      X ← X + W_o Ỹ + b_o1ᵀ;  X ← X + MLP(layer_norm(X | γ²_l, β²_l))    [[one gemm each over the batch]]
//  13    for each b: p ← softmax(W_u layer_norm(X[:, b] | γ, β));  sample y from q ∝ p^{1/τ};  x_{s_b} ← [x_{s_b}, y]
//  14    every s with ℓ_gen new tokens leaves active; its pages return to the pool
//  15  return y_s = x_s[ℓ_s + 1 : ℓ_s + ℓ_gen] for each s
//
// Each sequence samples from its own random stream (Rng), seeded as a call on that prompt alone would seed
// it, and draws one uniform number per token: its tokens do not depend on which sequences share its steps.
// The variant parts act as in the one-sequence cache: RoPE rotates K at t_b before line 10 and Q at t_b;
// ALiBi's bias and the mask act in line 11 at the token's position relative to the cached keys; GQA reads
// key/value head h/(H/H_kv); a sliding window (V9) reads the last w keys and returns the pages that fell
// out of it to the pool. Beyond ℓ_max with context "window" a sequence is refilled from its last ℓ_max tokens
// each step, as Algorithm 14's cached path does (alone, outside the batch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formal_transformers/inference.hpp"

namespace ft {

constexpr index_t kPageTokens = 16;  // P: tokens per page

// A prompt's keys and values as the one-sequence cache holds them after Algorithm 14's first pass over the
// prompt (every layer: K [H_kv·d_attn, ℓ], V [H_kv·d_mid, ℓ], at positions 0 … ℓ−1), and the logits of its
// last token (the next token's distribution). Made by prefill(); continued by DInference (both paths).
template <class T>
struct PromptKV {
    std::vector<index_t> ids;     // the prompt x
    std::vector<Matrix<T>> K, V;  // per layer
    std::vector<T> z;             // [N_V] logits of x's last token
    // ValueError unless the shapes are those `model` makes (called before anything runs)
    void check(const DTransformer<T>& model) const;
};

// Algorithm 14's first pass over x[0:l] (1 ≤ l ≤ ℓ_max) with the cache: the keys and values of every layer and
// the last token's logits.
template <class T>
PromptKV<T> prefill(const DTransformer<T>& model, const index_t* x, index_t l);

// One request of a batched call: a prompt (ids[0:len]) or a prompt cache (cache non-null; ids are its own).
template <class T>
struct PromptRef {
    const index_t* ids = nullptr;
    index_t len = 0;
    const PromptKV<T>* cache = nullptr;
};

// Algorithm P: ℓ_gen tokens after each prompt, sequence s drawing from rngs[s]. Sequence s's tokens are those
// of DInference(model, prompt_s, ℓ_gen, o, rngs[s]) (up to float rounding of the batched products: the
// tokens agree unless two candidates are closer than the rounding). max_batch ≥ 1. With o.cache false each
// prompt runs Algorithm 14's literal path alone. Every prompt is checked before anything runs.
template <class T>
std::vector<std::vector<index_t>> DInferenceBatch(DTransformer<T>& model, const std::vector<PromptRef<T>>& prompts,
                                                  index_t l_gen, const SamplingOptions& o, std::vector<Rng>& rngs,
                                                  index_t max_batch);

// Algorithm 14 continued from a prompt cache: the same tokens as DInference(model, cache.ids, …) (the same
// code path after the first pass, whose result the cache holds).
template <class T>
std::vector<index_t> DInference(DTransformer<T>& model, const PromptKV<T>& cache, index_t l_gen,
                                const SamplingOptions& o, Rng& rng);

// A 64-bit digest of θ's bytes (a prompt cache names the parameters it was computed with).
template <class T>
std::uint64_t theta_digest(const ParamStore<T>& store);
// The same 64-bit digest of any n bytes (theta_digest is that of θ's bytes).
std::uint64_t bytes_digest(const void* data, std::size_t n);

}  // namespace ft

// ---------------------------------------------------------------------------------------------------
// Prompt cache files (safetensors, written and read by io.hpp's writer and reader, so with its checks;
// cpp/src/api/prompt_cache_io.cpp): tensors "K.l" [ℓ, H_kv·d_attn] and "V.l" [ℓ, H_kv·d_mid] (row t: token t's key /
// value in layer l, RoPE applied), "z" [N_V]; metadata "formal_transformers.format", "formal_transformers.config"
// (ModelConfig::to_json with the dtype, as a model file), "formal_transformers.prompt_cache" ("2"),
// "formal_transformers.prompt_ids" (the ids, comma separated), "formal_transformers.prompt_digest" (16 hex digits:
// the digest of the ids and of K, V and z, checked on reading; version "1", written before the digest existed,
// has none), and the caller's `meta` (the bindings: the config's hash and θ's digest).
namespace ft {
struct SavedModel;
template <class T>
void save_prompt_kv(const PromptKV<T>& cache, const ModelConfig& c, const std::vector<std::pair<std::string, std::string>>& meta,
                    const std::string& path);
// The cache in a read file (SavedModel::read), checked against its own metadata (ValueError when damaged or
// not a prompt cache); the caller checks it belongs to its model (PromptKV::check, the hashes).
template <class T>
PromptKV<T> read_prompt_kv(const SavedModel& file);
// Is the file (its metadata) a prompt cache?
bool is_prompt_cache(const SavedModel& file);
}  // namespace ft
