// Shared helpers for the GoogleTest suites: random data, relative errors, central finite differences, the small
// decoder configurations the variant suites start from, and MHAttention's backward against central differences.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/common.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/params.hpp"

namespace fttest {

using ft::index_t;

inline std::vector<double> randn(index_t n, ft::Rng& rng, double scale = 1.0) {
    std::vector<double> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = scale * rng.normal();
    return v;
}

template <class T>
ft::Matrix<T> random_matrix(index_t rows, index_t cols, ft::Rng& rng, double scale = 1.0) {
    ft::Matrix<T> m = ft::Matrix<T>::from_shape({std::size_t(rows), std::size_t(cols)});
    for (auto& x : m) x = T(scale * rng.normal());
    return m;
}

// max |a − b| / max(max |b|, tiny): a norm-wise relative error that does not blow up at zeros of b
template <class A, class B>
double rel_error(const A& a, const B& b, std::size_t n) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < n; ++i) {
        num = std::max(num, std::abs(double(a[i]) - double(b[i])));
        den = std::max(den, std::abs(double(b[i])));
    }
    return num / std::max(den, 1e-300);
}

// Central differences of a scalar function of the n doubles at x (x is restored afterwards).
inline std::vector<double> numeric_grad(double* x, index_t n, const std::function<double()>& loss, double h = 1e-6) {
    std::vector<double> g(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
        const double old = x[i];
        x[i] = old + h;
        const double lp = loss();
        x[i] = old - h;
        const double lm = loss();
        x[i] = old;
        g[std::size_t(i)] = (lp - lm) / (2 * h);
    }
    return g;
}

// Σ_ij W[i,j] Y[i,j]: the scalar whose gradient with respect to Y is W (used to test backward(dY = W)).
inline double dot(const double* a, const double* b, index_t n) {
    double s = 0;
    for (index_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

// Randomise every parameter of a store (so tests do not depend on γ = 1, β = 0 and the like).
inline void randomize(ft::ParamStore<double>& store, ft::Rng& rng, double scale = 0.5) {
    for (index_t i = 0; i < store.size(); ++i) store.theta()[i] = scale * rng.normal();
}

// Every parameter moved away from its initial value, deterministically (θ_i += 0.3 sin(0.7 i)).
template <class T>
void perturb(ft::ParamStore<T>& s) {
    for (index_t i = 0; i < s.size(); ++i) s.theta()[i] += T(0.3 * std::sin(double(i) * 0.7));
}

// n token ids cycling through a vocabulary of n_vocab: (a·t + b) mod n_vocab
inline std::vector<index_t> cycling_ids(index_t n, index_t a = 7, index_t b = 3, index_t n_vocab = 11) {
    std::vector<index_t> ids(static_cast<std::size_t>(n));
    for (index_t t = 0; t < n; ++t) ids[std::size_t(t)] = (a * t + b) % n_vocab;
    return ids;
}

// The logits W_u X of one whole sequence (n_vocab × ℓ, ℓ = ids.size()) after the model's full forward: what
// cached decoding must reproduce column by column.
template <template <class> class Model, class T>
ft::Matrix<T> full_logits(Model<T>& m, const std::vector<index_t>& ids, index_t n_vocab = 11) {
    const index_t n = index_t(ids.size());
    m.forward(ft::Tokens{ids.data(), ft::Seqs::single(n)});
    ft::Matrix<T> Z = ft::Matrix<T>::from_shape({std::size_t(n_vocab), std::size_t(n)});
    m.logits(ft::view(Z));
    return Z;
}

// The small decoder the variant suites start from: N_V 11, ℓ_max l_max, L 2, H 4 with H_kv 2, d_e 8, d_mlp 6, seed 3.
inline ft::ModelConfig small_decoder(index_t l_max) {
    ft::ModelConfig c;
    c.n_vocab = 11;
    c.l_max = l_max;
    c.L = 2;
    c.H = 4;
    c.H_kv = 2;
    c.d_e = 8;
    c.d_mlp = 6;
    c.seed = 3;
    return c;
}
// ... with LLaMA's parts: the position part pos, SwiGLU, no biases, RMSnorm.
inline ft::ModelConfig llama_like(const std::string& pos, index_t l_max) {
    ft::ModelConfig c = small_decoder(l_max);
    c.positional = pos;
    c.mlp = "swiglu";
    c.bias = false;
    c.norm = "rms";
    return c;
}

// Self-attention's backward against central differences (float64): a ragged batch s of d-dimensional columns,
// loss Σ W ⊙ MHAttention(X), dX and every parameter's gradient to relative error tol.
inline void expect_self_attention_backward_matches_finite_differences(const ft::MHAttention<double>& att,
                                                                      ft::ParamStore<double>& store, ft::Rng& rng,
                                                                      const ft::Seqs& s, double tol = 1e-6) {
    using ft::CMatView;
    using ft::MatView;
    const index_t d = att.d_x, d_out = att.d_out, n = s.total();
    std::vector<double> X = randn(d * n, rng), W = randn(d_out * n, rng), Y(std::size_t(d_out * n));
    auto loss = [&] {
        ft::MHAttentionCache<double> c;
        att.forward(store, CMatView<double>(X.data(), d, n), s, CMatView<double>(X.data(), d, n), s,
                    MatView<double>(Y.data(), d_out, n), c);
        return dot(Y.data(), W.data(), d_out * n);
    };
    ft::MHAttentionCache<double> c;
    ft::MHAttentionWork<double> w;
    std::vector<double> dX(std::size_t(d * n), 0.0);
    att.forward(store, CMatView<double>(X.data(), d, n), s, CMatView<double>(X.data(), d, n), s,
                MatView<double>(Y.data(), d_out, n), c);
    store.zero_grad();
    att.backward(store, CMatView<double>(X.data(), d, n), s, CMatView<double>(X.data(), d, n), s, c,
                 CMatView<double>(W.data(), d_out, n), MatView<double>(dX.data(), d, n), MatView<double>(dX.data(), d, n), w);
    EXPECT_LT(rel_error(dX, numeric_grad(X.data(), d * n, loss), dX.size()), tol);
    auto numT = numeric_grad(store.theta(), store.size(), loss);
    EXPECT_LT(rel_error(store.grad(), numT, numT.size()), tol);
}

}  // namespace fttest
