// Algorithms 14 and 15: prompting a trained decoder, and sequence-to-sequence decoding.
//
// Algorithm 14: y ← DInference(x, θ̂)
//   Hyperparameters: ℓ_gen ∈ ℕ, τ ∈ (0, ∞)
//   1  ℓ ← length(x)
//   2  for i = 1, 2, …, ℓ_gen do
//   3    P ← DTransformer(x | θ̂)
//   4    p ← P[:, ℓ + i − 1]
//   5    sample a token y from q ∝ p^{1/τ}
//   6    x ← [x, y]
//   7  end
//   8  return y = x[ℓ + 1 : ℓ + ℓ_gen]
//
// Algorithm 15: x̂ ← EDInference(z, θ̂)
//   Hyperparameters: τ ∈ (0, ∞)
//   1  x̂ ← [bos_token]
//   2  y ← 0
//   3  while y ≠ eos_token do
//   4    P ← EDTransformer(z, x̂ | θ̂)
//   5    p ← P[:, length(x̂)]
//   6    sample a token y from q ∝ p^{1/τ}
//   7    x̂ ← [x̂, y]
//   8  end
//   9  return x̂
//
// Two paths give the same tokens for the same seed:
//  * literal (cache = false): line 3 / line 4 recompute the whole model on the whole sequence each step;
//  * cached (the default): the keys and values of the tokens seen so far are kept per layer (and, for
//    Algorithm 15, the encoder runs once per z and the cross-attention keys and values of Z are kept),
//    so each new token costs one column of work per layer.
// Sampling: q ∝ p^{1/τ} = softmax(W_u x / τ) computed from the logits (τ = 0: argmax, first of ties);
// top_k keeps the k most probable tokens, then top_p the smallest set of those whose mass, renormalised
// over them, reaches p (nucleus); the draw is from q restricted to what is kept (the order of HF's warpers). One uniform number per token from the seeded Rng.
// Beyond ℓ_max (Algorithm 14), by SamplingOptions::context:
//  * Window: the model sees the last ℓ_max tokens (a sliding window). While the context fits, the cached
//    path adds one column per token; once it is full, both paths recompute the window each step.
//  * Full: the model sees the whole sequence, past ℓ_max (only where positions have no table: RoPE and
//    ALiBi, docs/variants.md; ALiBi was made to extrapolate so). The cached path keeps adding one column
//    per token; the literal path runs the model on the whole sequence.
//  * Auto (the default): Full for ALiBi, Window otherwise.
// Algorithm 15 stops at eos_token or when x̂ reaches max_len tokens (default ℓ_max), so it always terminates.
#pragma once

#include <limits>
#include <vector>

#include "formal_transformers/transformers.hpp"

namespace ft {

struct SamplingOptions {
    double tau = 1.0;    // τ ≥ 0; 0 = argmax
    index_t top_k = 0;   // 0: all tokens
    double top_p = 1.0;  // in (0, 1]
    bool cache = true;   // KV cache (false: the listing literally)
    enum class Context { Auto, Window, Full } context = Context::Auto;  // beyond ℓ_max (Algorithm 14), above
    void check() const;  // ValueError for τ < 0, top_k < 0, top_p outside (0, 1]
};

// Line 5 of Algorithm 14 / line 6 of Algorithm 15: draw a token from q ∝ softmax(z/τ) (with top-k/top-p).
// `scratch` avoids allocations across calls.
template <class T>
index_t sample_token(const T* logits, index_t n_vocab, const SamplingOptions& o, Rng& rng, std::vector<double>& scratch,
                     std::vector<index_t>& order);

// Algorithm 14's context past ℓ_max for a model: the whole sequence (context 'full', or 'auto' where the model's
// parts decode past it: ALiBi, a mask with a window and positions in attention; DTransformer::decodes_past_l_max)
// or a window of ℓ_max tokens. The one rule cached, batched and paged decoding follow.
template <class T>
bool decodes_full_context(const SamplingOptions& o, const DTransformer<T>& model) {
    return o.context == SamplingOptions::Context::Full ||
           (o.context == SamplingOptions::Context::Auto && model.decodes_past_l_max());
}

// ℓ_gen of Algorithm 14: ValueError unless 0 <= l_gen and ℓ + ℓ_gen ids fit the allocation bound (sizes.hpp)
// — the check DInference runs, callable before a model or prompt exists (the Python constructor).
void check_l_gen(index_t l_gen, index_t l_prompt = 0);

// prefix_len's default in the calls below: the whole prompt for a prefix LM, none otherwise (any value a caller
// passes, negative ones included, is checked as a call's prefix_len)
inline constexpr index_t kDefaultPrefix = std::numeric_limits<index_t>::min();
// Algorithm 14: ℓ_gen new tokens after the prompt x[0:l] (ℓ ≥ 1). prefix_len (V7, a model with mask = Prefix):
// the prompt's first p tokens are the prefix (bidirectional over them, causal after; 0 ≤ p ≤ ℓ); kDefaultPrefix: the whole
// prompt for such a model (the prompt is the prefix), 0 otherwise. Past ℓ_max with a window, the window's prefix
// is what remains of it, max(0, p − w0).
template <class T>
std::vector<index_t> DInference(DTransformer<T>& model, const index_t* x, index_t l, index_t l_gen,
                                const SamplingOptions& o, Rng& rng, index_t prefix_len = kDefaultPrefix);

// Algorithm 15: x̂ for the context z[0:l_z], starting with bos_token, ending with eos_token unless
// max_len (≤ ℓ_max; 0: ℓ_max) tokens were reached first.
template <class T>
std::vector<index_t> EDInference(EDTransformer<T>& model, const index_t* z, index_t l_z, const SamplingOptions& o,
                                 Rng& rng, index_t max_len = 0);
// the same from one feature matrix f (an EDTransformer whose encoder's part takes features: the audio encoder, V28,
// a spectrogram); TypeError for the other kind
template <class T>
std::vector<index_t> EDInference(EDTransformer<T>& model, const Features<T>& f, const SamplingOptions& o, Rng& rng,
                                 index_t max_len = 0);

// The same from C++ with xtensor sequences (formal_transformers.hpp).
template <class T>
TokenIds DInference(DTransformer<T>& model, const TokenIds& x, index_t l_gen, const SamplingOptions& o, Rng& rng,
                    index_t prefix_len = kDefaultPrefix) {
    const std::vector<index_t> y = DInference(model, x.data(), index_t(x.size()), l_gen, o, rng, prefix_len);
    TokenIds r = TokenIds::from_shape({y.size()});
    std::copy(y.begin(), y.end(), r.begin());
    return r;
}
template <class T>
TokenIds EDInference(EDTransformer<T>& model, const TokenIds& z, const SamplingOptions& o, Rng& rng, index_t max_len = 0) {
    const std::vector<index_t> x = EDInference(model, z.data(), index_t(z.size()), o, rng, max_len);
    TokenIds r = TokenIds::from_shape({x.size()});
    std::copy(x.begin(), x.end(), r.begin());
    return r;
}

}  // namespace ft
