// Dropout (Srivastava et al. 2014, "Dropout: a simple way to prevent neural networks from overfitting";
// its places in the transformer: Vaswani et al. 2017 §5.4), inverted, with its backward pass. Beyond the
// paper's listings (its §8 names regularisation); docs/regularisation.md "Dropout" has the listing and the
// table of places against Algorithms 8, 9, 10.
//
// Algorithm D1: Ỹ ← Dropout(Y | p, M)
//   Input: Y ∈ R^{d×ℓ}, a matrix of activations.
//   Output: Ỹ ∈ R^{d×ℓ}, Y with a random part of its entries zeroed and the rest scaled up.
//   Hyperparameters: p ∈ [0, 1), the dropout rate; the random mask M ∈ {0, 1}^{d×ℓ}.
//   1  for i ∈ [d], t ∈ [ℓ]: M[i, t] ← [[u_{i,t} ≥ p]],  u_{i,t} ~ Uniform[0, 1) independently
//   2  return Ỹ = Y ⊙ M / (1 − p)
//
// Algorithm D2: dY ← DropoutBackward(dỸ | p, M)
//   1  return dY = dỸ ⊙ M / (1 − p)
//
// In training (loss_and_grad, the trainers) only; everything else (model(x), loss, inference) runs the
// listings unchanged, which equals the expectation of line 2 over M (E[M/(1−p)] = 1). p = 0: no mask is
// drawn and nothing is computed (the listings bit for bit).
//
// The random numbers u are counter-based: u = splitmix64 of (seed, step, place, element index) (Steele,
// Lea & Flood 2014's finaliser), so a mask depends only on the model's seed, its dropout step (a counter
// of training forwards, readable and settable: a run replays exactly), the place (which matrix of which
// layer) and the entry's index in that matrix, never on threads or on the order of evaluation.
#pragma once

#include <cstdint>
#include <vector>

#include "formal_transformers/common.hpp"
#include "formal_transformers/options.hpp"

namespace ft {

// The stream of one matrix of one training forward.
struct DropoutKey {
    std::uint64_t seed = 0, step = 0, place = 0;
};
// Places: which matrix of which layer a mask belongs to. A place is (group, layer, site): the group of
// layers, the layer's index in it, and the site inside the layer (the embeddings are group Embeddings, layer 0).
// Layers: D's and E's, ED's encoder; Lora: LoRA's adapter inputs (lora.hpp), "layer" the adapter's index, site 0
enum class DropGroup : std::uint64_t { Embeddings = 0, Layers = 1, DecoderLayers = 2, Lora = 3 };
enum class DropSite : std::uint64_t { EmbedX = 0, EmbedZ = 1, SelfWeights = 2, SelfOut = 3, CrossWeights = 4, CrossOut = 5, MlpOut = 6 };
// A layer's places (the blocks key their masks by place.at(site)).
struct DropPlace {
    DropGroup group = DropGroup::Layers;
    std::uint64_t layer = 0;
    std::uint64_t at(DropSite site) const {
        return (std::uint64_t(group) << 48) | (layer << 8) | std::uint64_t(site);
    }
};
// u_{i} ∈ [0, 1) (53 bits) of entry i of the keyed matrix (line 1)
double dropout_uniform(const DropoutKey& k, std::uint64_t i);

namespace detail {
// splitmix64's finaliser (a bijection of 64-bit words with full avalanche)
inline std::uint64_t mix64(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
constexpr std::uint64_t golden = 0x9e3779b97f4a7c15ULL;
}  // namespace detail

// Line 1's mask M of one keyed matrix at any entry, in any order: keep(i) = M[i] = [[u_i ≥ p]], the same bit
// dropout_forward draws at entry i (it uses this). The tiled attention draws the weights' mask block by block.
class DropoutStream {
public:
    DropoutStream(double p, const DropoutKey& k);
    // u ≥ p with u = m·2^-53 (m: the top 53 bits) ⇔ m ≥ ⌈p·2^53⌉ (p·2^53 is exact)
    bool keep(std::uint64_t i) const { return (detail::mix64(s_ + (i + 1) * detail::golden) >> 11) >= threshold_; }

private:
    std::uint64_t s_, threshold_;
};

// A mask of one training forward, kept for the backward pass: rate p (0: no dropout here) and keep[i] = M[i].
struct DropoutMask {
    double p = 0;
    std::vector<std::uint8_t> keep;
    bool active() const { return p > 0; }
};

// Lines 1–2 on n contiguous entries y (entries i0, i0+1, … of the keyed matrix): draws keep[0..n) and
// scales in place. p must be in (0, 1).
template <class T>
void dropout_forward(double p, const DropoutKey& k, std::uint64_t i0, T* y, index_t n, std::uint8_t* keep);
// D2 in place: dy ← dy ⊙ keep / (1 − p)
template <class T>
void dropout_backward(double p, const std::uint8_t* keep, T* dy, index_t n);

// Dropout on one head's attention weights A:[ℓ_z, ℓ_x] (the attention-dropout part, attention_dropout.hpp, and the
// tiled kernel): rate p, the layer's key, and the index i0 of the head's first entry in the layer's weights (entry
// (t_z, t_x) of the head's A is entry i0 + t_z + t_x ℓ_z of the keyed matrix).
struct WeightsDropout {
    double p = 0;
    DropoutKey key;
    std::uint64_t i0 = 0;
};
// The rate on the attention weights a model's options choose: the option attn_dropout of the attention-dropout
// part's row (variants/attention_dropout.cpp); 0: none
double attention_dropout_rate(const PartOptionValues& options);

// The rates of one training forward and the key of its masks; null (no Dropout) in evaluation. (The attention
// weights' rate is the attention-dropout part's own: attention_dropout_rate.)
struct Dropout {
    double embed = 0, resid = 0;  // after the embedding sum; on sublayer outputs
    std::uint64_t seed = 0, step = 0;
    DropoutKey key(std::uint64_t place) const { return {seed, step, place}; }
    // Line 1–2 on a whole matrix m (contiguous), keeping the mask in `mask`; p = 0 leaves m and clears mask.
    template <class T>
    void apply(double p, std::uint64_t place, MatView<T> m, DropoutMask& mask) const;
};

// The rates the model was built with (ModelConfig) checked: each in [0, 1), ValueError naming the option.
void check_dropout_rate(double p, const char* name);

}  // namespace ft
