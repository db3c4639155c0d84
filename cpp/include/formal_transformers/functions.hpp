// The paper's element-wise functions (§5 and notation): softmax over columns, GELU, ReLU, and their
// derivatives. Raw loops over contiguous columns, vectorised with xsimd (exp/erf/tanh in SIMD), OpenMP
// over columns (much faster than xtensor expressions: docs/benchmarks.md). No BLAS is called in here, so
// these parallel regions never nest a BLAS call.
#pragma once

#include "formal_transformers/common.hpp"

namespace ft {

// ---- exp, and exp of a column shifted by its largest entry (softmax's and the tiled attention's inner loop) ----
// y[i] = exp(x[i]) (x and y may alias): xsimd's vectorised exp (std::exp on the tail); exp(−∞) = 0 exactly, NaN
// stays NaN, +∞ from x ≈ 88.376 on (xsimd's bound, below float's 88.72). float32 within 2 ulp of std::exp from
// the smallest normal float up to that bound (test_functions.cpp; below it the core's flush-to-zero gives 0).
// (A float32 exp of our own measured slower: bench/bench_exp.cpp, docs/benchmarks.md.)
template <class T>
void exp_values(const T* x, T* y, index_t n);
// Largest entry of a[0:n) (−∞ for n = 0); NaN if any entry is NaN (NaN propagates, never hidden).
template <class T>
T column_max(const T* a, index_t n);
// a[i] ← exp(a[i] − m) in place (−∞ entries give exactly 0, as exp_values); returns Σ_i a[i].
template <class T>
T exp_shift(T* a, index_t n, T m);

// ---- softmax (the paper: softmax(A)[t1, t2] = exp(A[t1,t2]) / Σ_t exp(A[t, t2]), column by column) ---
// In place on one column of n entries; subtracts the column max; entries equal to -inf get probability
// 0. At least one entry must be finite (checked by callers where a mask could hide a whole column).
template <class T>
void softmax_column(T* a, index_t n);
// The same, returning logsumexp(a) = log Σ_i exp(a[i]) of the input column (for log-softmax losses:
// log softmax(a)[y] = a[y] − logsumexp(a), exact even where the probability underflows).
template <class T>
double softmax_column_lse(T* a, index_t n);
// In place on every column of A:[m, n] (parallel over columns).
template <class T>
void softmax_columns(MatView<T> A);
// Backward of P = softmax(A) per column: dA = P ⊙ (dP − 1 (1ᵀ (P ⊙ dP))). In place on dP.
template <class T>
void softmax_column_backward(const T* p, T* dp, index_t n);
template <class T>
void softmax_columns_backward(CMatView<T> P, MatView<T> dP);

// ---- GELU(x) = x·Φ(x) (exact, erf), or GPT-2's tanh approximation -------------------------------------
enum class Gelu { Exact, Tanh };
// y[i] = GELU(x[i]) (x and y may alias)
template <class T>
void gelu(const T* x, T* y, index_t n, Gelu kind = Gelu::Exact);
// dx[i] = GELU'(x[i]) * dy[i]   (dx and dy may alias)
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, index_t n, Gelu kind = Gelu::Exact);

// ---- ReLU(x) = max(0, x) -------------------------------------------------------------------------------
template <class T>
void relu(const T* x, T* y, index_t n);
// dx[i] = [x[i] > 0] dy[i]  (the subgradient 0 at x = 0)
template <class T>
void relu_backward(const T* x, const T* dy, T* dx, index_t n);

// Element-wise over a whole matrix (parallel over columns); used by the MLP blocks.
enum class Activation { Relu, Gelu, GeluTanh };
template <class T>
void activation_forward(Activation a, CMatView<T> X, MatView<T> Y);
template <class T>
void activation_backward(Activation a, CMatView<T> X, CMatView<T> dY, MatView<T> dX);

}  // namespace ft
