// Shared helpers for the GoogleTest suites: random data, relative errors, central finite differences.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "formal_transformers/common.hpp"
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

}  // namespace fttest
