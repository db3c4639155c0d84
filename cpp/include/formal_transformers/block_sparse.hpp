// Algorithm V17 (block-sparse attention, BigBird's form; docs/variants.md): Zaheer et al. 2020, "Big Bird:
// Transformers for Longer Sequences", §2 and Appendix D ("BIGBIRD-ITC": the blocked layout). The layout is a
// mask part (cpp/src/variants/bigbird_mask.cpp: Algorithm 4 with it is the dense definition); the kernel that
// computes only its live blocks is cpp/src/variants/block_sparse.cpp, forward and backward side by side.
//
// Algorithm V17a: 𝓛 ← BigBirdLayout(n | w, g, r, seed)   n = ℓ/b blocks of b tokens; 𝓛[i] ⊆ [n] the key
//                                                         blocks of query block i
//   1  for i ∈ [n]:
//   2    if i < g or i ≥ n − g:  𝓛[i] ← [n]                    [[global query blocks attend everywhere]]
//   3    else:
//   4      𝓦 ← {j : |i − j| ≤ (w − 1)/2}                       [[w sliding key blocks around the diagonal]]
//   5      𝓖 ← {j : j < g or j ≥ n − g}                         [[the global key blocks, first and last g]]
//   6      𝓡 ← r distinct blocks drawn uniformly from [n] ∖ (𝓦 ∪ 𝓖), from the seed (and i, n, the head h)
//   7      𝓛[i] ← 𝓦 ∪ 𝓖 ∪ 𝓡
//   8  return 𝓛
//   Mask[t_z, t_x] = [[⌊t_z/b⌋ ∈ 𝓛[⌊t_x/b⌋]]] (bidirectional; positions from 0). Needs b | ℓ and
//   n ≥ 2g + w + r (the blocks line 6 draws from). One layout per head h of each layer (a model's heads each
//   draw their own 𝓡, as Hugging Face's BigBird does; or layouts given, set_bigbird_layouts). Hugging Face's
//   BigBird ("block_sparse"): w = 3, g = 1, its own random draw per head and layer (docs/variants.md V17).
//
// Algorithm V17b: Ṽ ← BlockSparseAttention(Q, K, V | 𝓛, b)   replaces Algorithm 4's lines 4–6 (one head)
//   1  for each query block i:  J ← 𝓛[i] (m blocks), Q_i ← Q[:, block i] ∈ R^{d×b}
//   2    K_J ← [K[:, block j]]_{j∈J}, V_J ← [V[:, block j]]_{j∈J}   [[gathered: R^{d×mb}, R^{d_v×mb}]]
//   3    S ← K_Jᵀ Q_i / √d_attn                                     [[∈ R^{mb×b}]]
//   4    A ← softmax(S) (per column);  λ ← the log-sum-exp of each column
//   5    Ṽ[:, block i] ← V_J A
//   Work and memory O(ℓ·(w + 2g + r)·b·d) for the non-global blocks (+ O(g·b·ℓ·d) for the global ones)
//   instead of O(ℓ²·d): every other entry of Algorithm 4's S is masked, exp(−∞) = 0.
//   Backward (given dṼ; A recomputed from λ): dV_J = dṼ_i Aᵀ; dA = V_Jᵀ dṼ_i;
//   dS = A ⊙ (dA − 1 (1ᵀ(A ⊙ dA)));  dQ_i = K_J dS/√d_attn;  dK_J = Q_i dSᵀ/√d_attn (scattered back into the
//   key blocks J, summed over every query block that gathered them).
//   𝓛[i] may be a multiset (Hugging Face's plans at ℓ = 1024, 3072, 4096 and its eval mode repeat a key block;
//   explicit_layout, set_bigbird_layouts): J lists block j m_ij times, so line 2 gathers it m_ij times and line 4
//   gives it m_ij·exp(s) in the sum, A[t_z, t_x] = m·exp(s)/Σ m'·exp(s') = softmax(S + log M) with M[t_z, t_x] =
//   m_{⌊t_z/b⌋⌊t_x/b⌋} (log 0 = −∞: the mask); the backward's scatter sums the occurrences' gradients. Algorithm
//   4 with a 0/1 mask cannot express m ≥ 2: such a layout runs on this kernel only (attention_impl 'auto').
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formal_transformers/common.hpp"
#include "formal_transformers/mask.hpp"
#include "formal_transformers/options.hpp"

namespace ft {

struct ModelConfig;
template <class T>
class ETransformer;

// BigBird's layout hyperparameters: block size b, w sliding blocks (odd), g global blocks at each end, r
// random blocks per query block, drawn from seed and the attention's name (each layer its own draw), for each of
// `heads` query heads (head h draws its own 𝓡; heads = 1: one layout every head shares).
// per_head = false: every head uses head 0's draw (one layout per layer; the option bigbird_draw='per_layer').
struct BigBirdSpec {
    index_t block = 0, window = 3, global = 1, random = 0, heads = 1;
    std::uint64_t seed = 0;
    std::string name;
    bool per_head = true;
};

// A block layout: n query blocks of b tokens, query block i attending key blocks keys[start[i] … start[i+1])
// (ascending; V17a's are distinct, a given one may repeat a block: its multiplicity m_ij, V17b's note).
struct BlockLayout {
    index_t block = 0, n = 0;
    std::vector<index_t> start, keys;
    index_t count(index_t i) const { return start[std::size_t(i + 1)] - start[std::size_t(i)]; }
    const index_t* of(index_t i) const { return keys.data() + start[std::size_t(i)]; }
    // some query block lists a key block more than once (a multiset: no 0/1 mask describes it)
    bool repeats() const {
        for (index_t i = 0; i < n; ++i)
            for (index_t a = 1; a < count(i); ++a)
                if (of(i)[a] == of(i)[a - 1]) return true;
        return false;
    }
};

// ValueError naming the problem: b < 1, w < 1 or even, g < 0, r < 0.
void check_bigbird_spec(const BigBirdSpec& s);
// The spec of the options of the 'bigbird' head kernel's row (variants/bigbird_mask.cpp: block_size, window_blocks,
// n_global_blocks, n_random_blocks, layout_seed, bigbird_draw; a model's in ModelConfig::part_options) for an
// attention named `name` with `heads` query heads (unchecked: the row's check, or make_bigbird_mask, checks it).
BigBirdSpec bigbird_spec_of(const PartOptionValues& options, const std::string& name = "", index_t heads = 1);
// ValueError naming the problem unless a sequence of ℓ tokens fits: b | ℓ, n = ℓ/b ≥ 2g + w + r.
void check_bigbird_length(const BigBirdSpec& s, index_t l);
// V17a for n blocks, head h: line 6 of query block i draws from the stream
// splitmix64(named_seed(seed, name) ⊕ splitmix64(n·(2³²+1) + i) ⊕ h·0x9E3779B97F4A7C15) (head 0: the per-layer draw
// of before the heads had their own), r distinct candidates by a partial Fisher–Yates shuffle of the ascending ones.
BlockLayout bigbird_layout(const BigBirdSpec& s, index_t n, index_t h = 0);
// A layout given block by block (e.g. Hugging Face's): keys[i] the key blocks of query block i (sorted here; a
// block listed m times keeps its multiplicity m, V17b's note). ValueError: a block out of [0, n), an empty list.
BlockLayout explicit_layout(index_t block, const std::vector<std::vector<index_t>>& keys);

// The mask part "bigbird" (registry.cpp; made by make_mask("bigbird", o) from o.options, the 'bigbird' head
// kernel's options, with o.values["heads"] query heads; or directly from a spec with a name: a model's layers).
Mask make_bigbird_mask(const BigBirdSpec& s);
// The spec of a bigbird mask; null for every other mask.
const BigBirdSpec* bigbird_spec(const Mask& m);
// The layout of query head h of a bigbird mask for sequences of n blocks (given, or drawn once per n, then shared).
std::shared_ptr<const BlockLayout> bigbird_mask_layout(const Mask& m, index_t n, index_t h = 0);
// ValueError naming the problem unless L is a well-formed layout: n ≥ 1 query blocks of block ≥ 1 tokens, start
// of n + 1 nondecreasing offsets from 0 to keys.size(), every query block with a key block, the keys of each in
// [0, n) and ascending (a repeat is a multiplicity).
void check_block_layout(const BlockLayout& L);
// Give a bigbird mask its layouts for sequences of layouts[0].n blocks (e.g. Hugging Face's, tests/python/
// test_bigbird_hf.py): one per head (spec.heads of them) or one for every head; they replace the drawn ones for
// that n (other lengths keep drawing). multiset: the attention runs V17b (attention_impl 'auto'), so a layout
// may repeat a key block; otherwise a repeat is refused (Algorithm 4's 0/1 mask cannot weigh it). ValueError
// naming the problem (not a bigbird mask, a count other than 1 or heads, a block size other than the spec's,
// layouts of different n, a malformed layout, a repeat without multiset) before anything changes. A model's
// layouts: the checked set_bigbird_layouts(model, …) below.
void set_bigbird_layouts(const Mask& m, std::vector<BlockLayout> layouts, bool multiset = false);
// The layouts given to a bigbird mask (set_bigbird_layouts), for each n: one for every head, or one per head.
std::map<index_t, std::vector<BlockLayout>> given_bigbird_layouts(const Mask& m);

// A model's layouts (ETransformer with attention = BigBird: ModelConfig::attention, attention_impl, L, H,
// block_size, l_max), layer by layer: layouts[l] the layouts of layer l for sequences of n blocks, one for
// every head or H (one per head). check_bigbird_layouts: ValueError naming the layer and head and the
// problem — the attention is not 'bigbird', L layers (the shape (L, H, n, n) or (L, n, n)), 1 or H per layer, a
// block size other than block_size, layouts of different n, n·block_size > l_max, a malformed layout
// (check_block_layout: a query block with no key block, …), a repeated key block unless attention_impl is 'auto'.
// set_bigbird_layouts(model, …) checks every layer, then installs them (nothing changes on a failed check); the
// other lengths keep drawing. given_bigbird_layouts(model): for each n given, every layer's layouts (as given; a
// layer given none at that n — one mask's set_bigbird_layouts — its drawn ones, H of them).
void check_bigbird_layouts(const ModelConfig& c, const std::vector<std::vector<BlockLayout>>& layouts);
template <class T>
void set_bigbird_layouts(ETransformer<T>& model, std::vector<std::vector<BlockLayout>> layouts);
template <class T>
std::map<index_t, std::vector<std::vector<BlockLayout>>> given_bigbird_layouts(const ETransformer<T>& model);

// V17b for one head of one sequence: Q:[d, ℓ], K:[d, ℓ], V:[d_v, ℓ] (ℓ = L.n·L.block) -> Vt:[d_v, ℓ] and
// lse:[ℓ] (λ, kept for the backward). Runs on the calling thread (one-thread BLAS calls).
template <class T>
void block_sparse_head(const BlockLayout& L, CMatView<T> Q, CMatView<T> K, CMatView<T> V, MatView<T> Vt, T* lse);
// The weights of V17b as a dense A:[ℓ, ℓ] (A[t_z, t_x]: query t_x's weight on key t_z, summed over the occurrences
// of t_z's block; 0 outside the layout): attention_weights of a layout that repeats a block.
template <class T>
void block_sparse_weights(const BlockLayout& L, CMatView<T> Q, CMatView<T> K, MatView<T> A);
// Backward: accumulates dQ += …, dK += …, dV += …, given the forward's lse and dṼ.
template <class T>
void block_sparse_head_backward(const BlockLayout& L, CMatView<T> Q, CMatView<T> K, CMatView<T> V, const T* lse,
                                CMatView<T> dVt, MatView<T> dQ, MatView<T> dK, MatView<T> dV);

}  // namespace ft
