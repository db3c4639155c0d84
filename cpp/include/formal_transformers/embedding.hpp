// Algorithm 1 (token embedding) and Algorithm 2 (positional embedding).
//
// Algorithm 1: Token embedding.
//   Input: v ∈ V ≅ [N_V], a token ID.   Output: e ∈ R^{d_e}, the vector representation of the token.
//   Parameters: W_e ∈ R^{d_e×N_V}, the token embedding matrix.
//   1  return e = W_e[:, v]
//
// Algorithm 2: Positional embedding.
//   Input: ℓ ∈ [ℓ_max], position of a token in the sequence.   Output: e_p ∈ R^{d_e}.
//   Parameters: W_p ∈ R^{d_e×ℓ_max}, the positional embedding matrix.
//   1  return e_p = W_p[:, ℓ]
//
// W_p is learned, or hard-coded as the paper prints it (§5): with 1-based i and t,
//   W_p[2i−1, t] = sin(t / ℓ_max^{2i/d_e}),   W_p[2i, t] = cos(t / ℓ_max^{2i/d_e}),
// stored 0-based (column j holds t = j+1; row 2i−2 the sine, row 2i−1 the cosine; for odd d_e the last
// row is the sine of i = (d_e+1)/2). `base` may replace ℓ_max (Vaswani et al. use 10000). A hard-coded
// W_p stays visible in θ but is frozen (optimizers skip it; backward writes no gradient for it).
//
// Ids and positions are 0-based and must be in range: the callers (bindings, models) check them and
// raise IndexError before anything is computed; the kernels here assume valid input.
#pragma once

#include <string>

#include "formal_transformers/params.hpp"

namespace ft {

template <class T>
class TokenEmbedding {
public:
    TokenEmbedding(index_t n_vocab, index_t d_e, ParamStore<T>& store, const std::string& name = "W_e");
    void init(ParamStore<T>& store, Rng& rng, double stddev) const;  // W_e ~ N(0, stddev²)

    // ids[0:n) -> E:[d_e,n], E[:, t] (+)= W_e[:, ids[t]]   (line 1 for every t; accumulate adds into E)
    void forward(const ParamStore<T>& store, const index_t* ids, index_t n, MatView<T> E, bool accumulate = false) const;
    // dW_e[:, ids[t]] += dE[:, t] for every t (a scatter-add: a token used twice gets both gradients)
    void backward(ParamStore<T>& store, const index_t* ids, index_t n, CMatView<T> dE) const;

    index_t n_vocab, d_e;
    MatParam W_e;
};

// Algorithm 2's table W_p: learned, or the sinusoids (frozen). None: the position enters attention instead (a
// position part's registry line says which table it implies, parts.hpp position_table: RoPE, ALiBi, T5's relative
// bias, docs/variants.md V1/V2/V11); there is no W_p (the embedding registers nothing and adds nothing).
enum class Positional { Learned, Sinusoidal, None };

template <class T>
class PositionalEmbedding {
public:
    // base <= 0: use ℓ_max as the paper prints it.
    PositionalEmbedding(index_t l_max, index_t d_e, Positional kind, double base, ParamStore<T>& store,
                        const std::string& name = "W_p");
    // learned: W_p ~ N(0, stddev²); sinusoidal: the formula above (and frozen at declaration)
    void init(ParamStore<T>& store, Rng& rng, double stddev) const;

    // positions[0:n) -> E[:, t] (+)= W_p[:, positions[t]]
    void forward(const ParamStore<T>& store, const index_t* positions, index_t n, MatView<T> E,
                 bool accumulate = false) const;
    // For every column t of a batch `s` (sequence b, column j of it): E[:, t] += W_p[:, j + offset]
    void forward_seqs(const ParamStore<T>& store, const Seqs& s, MatView<T> E, index_t offset = 0) const;
    // dW_p[:, positions[t]] += dE[:, t] (learned only; a no-op for the hard-coded W_p)
    void backward(ParamStore<T>& store, const index_t* positions, index_t n, CMatView<T> dE) const;
    void backward_seqs(ParamStore<T>& store, const Seqs& s, CMatView<T> dE) const;

    index_t l_max, d_e;
    Positional kind;
    double base;
    MatParam W_p;
};

}  // namespace ft
