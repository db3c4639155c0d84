#include "formal_transformers/functions.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <xsimd/xsimd.hpp>

#include "../runtime/cpu_level.hpp"

// Every function of this file, once, as X(return type, name, (parameters), (arguments)) over the element type T:
// each level's copy is instantiated from it for float and double, and (below) the public functions are declared,
// defined and instantiated from it too. A new function is one row here.
#define FT_FUNCTIONS(X, T)                                                                                     \
    X(void, exp_values, (const T* x, T* y, index_t n), (x, y, n))                                              \
    X(T, column_max, (const T* a, index_t n), (a, n))                                                          \
    X(T, exp_shift, (T* a, index_t n, T m), (a, n, m))                                                         \
    X(void, softmax_column, (T* a, index_t n), (a, n))                                                         \
    X(double, softmax_column_lse, (T* a, index_t n), (a, n))                                                   \
    X(void, softmax_columns, (MatView<T> A), (A))                                                              \
    X(void, softmax_column_backward, (const T* p, T* dp, index_t n), (p, dp, n))                               \
    X(void, softmax_columns_backward, (CMatView<T> P, MatView<T> dP), (P, dP))                                 \
    X(void, gelu, (const T* x, T* y, index_t n, Gelu kind), (x, y, n, kind))                                   \
    X(void, gelu_backward, (const T* x, const T* dy, T* dx, index_t n, Gelu kind), (x, dy, dx, n, kind))       \
    X(void, relu, (const T* x, T* y, index_t n), (x, y, n))                                                    \
    X(void, relu_backward, (const T* x, const T* dy, T* dx, index_t n), (x, dy, dx, n))                        \
    X(void, activation_forward, (Activation a, CMatView<T> X, MatView<T> Y), (a, X, Y))                        \
    X(void, activation_backward, (Activation a, CMatView<T> X, CMatView<T> dY, MatView<T> dX), (a, X, dY, dX))
// the explicit instantiation of a row (its template argument deduced from the parameters' T = float, double)
#define FT_INSTANTIATE(RET, NAME, PARAMS, ARGS) template RET NAME PARAMS;

namespace ft {
// (compiled once per CPU level in the portable build: cpu_level.hpp)
namespace FT_CPU_NS {

namespace {
template <class T>
using B = xsimd::batch<T>;
template <class T>
constexpr index_t W = index_t(B<T>::size);
}  // namespace

// exp: xsimd's vectorised exp on whole batches, std::exp on the tail (a float32 exp of our own, Cody–Waite
// reduction with Cephes's polynomial, was slower in bench/bench_exp.cpp: not kept; docs/benchmarks.md)
template <class T>
void exp_values(const T* x, T* y, index_t n) {
    index_t i = 0;
    for (; i + W<T> <= n; i += W<T>) xsimd::exp(B<T>::load_unaligned(x + i)).store_unaligned(y + i);
    for (; i < n; ++i) y[i] = std::exp(x[i]);
}

template <class T>
T column_max(const T* a, index_t n) {
    T m = -std::numeric_limits<T>::infinity();
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (index_t i = 0; i < n; ++i) {
        m = a[i] > m ? a[i] : m;
        nan |= int(a[i] != a[i]);
    }
    return nan ? std::numeric_limits<T>::quiet_NaN() : m;
}

template <class T>
T exp_shift(T* a, index_t n, T m) {
    index_t i = 0;
    const B<T> vm(m);
    B<T> vs(T(0));
    for (; i + W<T> <= n; i += W<T>) {
        const B<T> e = xsimd::exp(B<T>::load_unaligned(a + i) - vm);
        e.store_unaligned(a + i);
        vs += e;
    }
    T s = xsimd::hadd(vs);
    for (; i < n; ++i) {
        a[i] = std::exp(a[i] - m);
        s += a[i];
    }
    return s;
}

template <class T>
double softmax_column_lse(T* a, index_t n);

template <class T>
void softmax_column(T* a, index_t n) {
    softmax_column_lse(a, n);
}

template <class T>
double softmax_column_lse(T* a, index_t n) {
    const T m = column_max(a, n);
    // exp(a - max): -inf entries give exactly 0. (Non-finite max: NaN results, as in the numpy reference.)
    const T s = exp_shift(a, n, m);
    index_t i = 0;
    const T inv = T(1) / s;
    const B<T> vinv(inv);
    for (; i + W<T> <= n; i += W<T>) (B<T>::load_unaligned(a + i) * vinv).store_unaligned(a + i);
    for (; i < n; ++i) a[i] *= inv;
    return double(m) + std::log(double(s));
}

template <class T>
void softmax_columns(MatView<T> A) {
#pragma omp parallel for schedule(static) if (A.size() > 16384)
    for (index_t j = 0; j < A.cols; ++j) softmax_column(A.col(j), A.rows);
}

template <class T>
void softmax_column_backward(const T* p, T* dp, index_t n) {
    T s = 0;  // 1ᵀ (P ⊙ dP)
    index_t i = 0;
    B<T> vs(T(0));
    for (; i + W<T> <= n; i += W<T>) vs += B<T>::load_unaligned(p + i) * B<T>::load_unaligned(dp + i);
    s = xsimd::hadd(vs);
    for (; i < n; ++i) s += p[i] * dp[i];
    const B<T> vsum(s);
    for (i = 0; i + W<T> <= n; i += W<T>) {
        const B<T> pv = B<T>::load_unaligned(p + i);
        (pv * (B<T>::load_unaligned(dp + i) - vsum)).store_unaligned(dp + i);
    }
    for (; i < n; ++i) dp[i] = p[i] * (dp[i] - s);
}

template <class T>
void softmax_columns_backward(CMatView<T> P, MatView<T> dP) {
#pragma omp parallel for schedule(static) if (P.size() > 16384)
    for (index_t j = 0; j < P.cols; ++j) softmax_column_backward(P.col(j), dP.col(j), P.rows);
}

// ------------------------------------------------------------------------------------------------------
namespace {
template <class T>
constexpr T kInvSqrt2 = T(0.70710678118654752440084436210484903928483593768847);
template <class T>
constexpr T kInvSqrt2Pi = T(0.39894228040143267793994605993438186847585863116493);
template <class T>
constexpr T kSqrt2OverPi = T(0.79788456080286535587989211986876373695171726232986);
template <class T>
constexpr T kGeluC = T(0.044715);

template <class T, class V>
V gelu_exact(V x) {
    return T(0.5) * x * (T(1) + xsimd::erf(x * kInvSqrt2<T>));
}
template <class T, class V>
V gelu_exact_grad(V x) {  // Φ(x) + x φ(x)
    return T(0.5) * (T(1) + xsimd::erf(x * kInvSqrt2<T>)) + x * kInvSqrt2Pi<T> * xsimd::exp(T(-0.5) * x * x);
}
template <class T, class V>
V gelu_tanh(V x) {
    return T(0.5) * x * (T(1) + xsimd::tanh(kSqrt2OverPi<T> * (x + kGeluC<T> * x * x * x)));
}
template <class T, class V>
V gelu_tanh_grad(V x) {
    const V t = xsimd::tanh(kSqrt2OverPi<T> * (x + kGeluC<T> * x * x * x));
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * kSqrt2OverPi<T> * (T(1) + T(3) * kGeluC<T> * x * x);
}
// scalar versions for the tails
template <class T>
T gelu_exact_s(T x) { return T(0.5) * x * (T(1) + std::erf(x * kInvSqrt2<T>)); }
template <class T>
T gelu_exact_grad_s(T x) {
    return T(0.5) * (T(1) + std::erf(x * kInvSqrt2<T>)) + x * kInvSqrt2Pi<T> * std::exp(T(-0.5) * x * x);
}
template <class T>
T gelu_tanh_s(T x) { return T(0.5) * x * (T(1) + std::tanh(kSqrt2OverPi<T> * (x + kGeluC<T> * x * x * x))); }
template <class T>
T gelu_tanh_grad_s(T x) {
    const T t = std::tanh(kSqrt2OverPi<T> * (x + kGeluC<T> * x * x * x));
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * kSqrt2OverPi<T> * (T(1) + T(3) * kGeluC<T> * x * x);
}
}  // namespace

template <class T>
void gelu(const T* x, T* y, index_t n, Gelu kind) {
    index_t i = 0;
    if (kind == Gelu::Exact) {
        for (; i + W<T> <= n; i += W<T>) gelu_exact<T>(B<T>::load_unaligned(x + i)).store_unaligned(y + i);
        for (; i < n; ++i) y[i] = gelu_exact_s(x[i]);
    } else {
        for (; i + W<T> <= n; i += W<T>) gelu_tanh<T>(B<T>::load_unaligned(x + i)).store_unaligned(y + i);
        for (; i < n; ++i) y[i] = gelu_tanh_s(x[i]);
    }
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, index_t n, Gelu kind) {
    index_t i = 0;
    if (kind == Gelu::Exact) {
        for (; i + W<T> <= n; i += W<T>)
            (gelu_exact_grad<T>(B<T>::load_unaligned(x + i)) * B<T>::load_unaligned(dy + i)).store_unaligned(dx + i);
        for (; i < n; ++i) dx[i] = gelu_exact_grad_s(x[i]) * dy[i];
    } else {
        for (; i + W<T> <= n; i += W<T>)
            (gelu_tanh_grad<T>(B<T>::load_unaligned(x + i)) * B<T>::load_unaligned(dy + i)).store_unaligned(dx + i);
        for (; i < n; ++i) dx[i] = gelu_tanh_grad_s(x[i]) * dy[i];
    }
}

template <class T>
void relu(const T* x, T* y, index_t n) {
#pragma omp simd
    for (index_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : (x[i] != x[i] ? x[i] : T(0));
}

template <class T>
void relu_backward(const T* x, const T* dy, T* dx, index_t n) {
#pragma omp simd
    for (index_t i = 0; i < n; ++i) dx[i] = x[i] > T(0) ? dy[i] : T(0);
}

template <class T>
void activation_forward(Activation a, CMatView<T> X, MatView<T> Y) {
#pragma omp parallel for schedule(static) if (X.size() > 16384)
    for (index_t j = 0; j < X.cols; ++j) {
        switch (a) {
            case Activation::Relu: relu(X.col(j), Y.col(j), X.rows); break;
            case Activation::Gelu: FT_CPU_NS::gelu(X.col(j), Y.col(j), X.rows, Gelu::Exact); break;
            case Activation::GeluTanh: FT_CPU_NS::gelu(X.col(j), Y.col(j), X.rows, Gelu::Tanh); break;
        }
    }
}

template <class T>
void activation_backward(Activation a, CMatView<T> X, CMatView<T> dY, MatView<T> dX) {
#pragma omp parallel for schedule(static) if (X.size() > 16384)
    for (index_t j = 0; j < X.cols; ++j) {
        switch (a) {
            case Activation::Relu: relu_backward(X.col(j), dY.col(j), dX.col(j), X.rows); break;
            case Activation::Gelu: FT_CPU_NS::gelu_backward(X.col(j), dY.col(j), dX.col(j), X.rows, Gelu::Exact); break;
            case Activation::GeluTanh: FT_CPU_NS::gelu_backward(X.col(j), dY.col(j), dX.col(j), X.rows, Gelu::Tanh); break;
        }
    }
}

FT_FUNCTIONS(FT_INSTANTIATE, float)
FT_FUNCTIONS(FT_INSTANTIATE, double)
}  // namespace FT_CPU_NS

#ifndef FT_CPU_LEVEL_ONLY
// The public functions (functions.hpp): the copy of the level cpu_level() chose
#define FT_DECLARE(RET, NAME, PARAMS, ARGS) \
    template <class T>                      \
    RET NAME PARAMS;
#define FT_FORWARD(RET, NAME, PARAMS, ARGS) \
    template <class T>                      \
    RET NAME PARAMS {                       \
        FT_CPU_CALL(NAME<T> ARGS)           \
    }
#if defined(FT_CPU_DISPATCH)
namespace cpu_v3 {
FT_FUNCTIONS(FT_DECLARE, T)
}
namespace cpu_v4 {
FT_FUNCTIONS(FT_DECLARE, T)
}
#endif
FT_FUNCTIONS(FT_FORWARD, T)
#undef FT_DECLARE
#undef FT_FORWARD

FT_FUNCTIONS(FT_INSTANTIATE, float)
FT_FUNCTIONS(FT_INSTANTIATE, double)
#endif
#undef FT_INSTANTIATE
#undef FT_FUNCTIONS

}  // namespace ft
