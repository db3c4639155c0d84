// Decoder variants (docs/variants.md, variants.hpp quotes the listings): the kernels of V1 RoPE, V2 ALiBi
// and V4 SwiGLU/SiLU, forward and backward side by side. V3 (grouped-query attention) and V5 (bias-free maps)
// are index bookkeeping inside MHAttention (attention.cpp) and MLP (transformers.cpp).
#include "formal_transformers/variants.hpp"

#include <algorithm>
#include <cmath>

#include <xsimd/xsimd.hpp>

namespace ft {
namespace {
template <class T>
using Batch = xsimd::batch<T>;
template <class T>
constexpr index_t Lanes = index_t(Batch<T>::size);
}  // namespace

// ===================================== Algorithm V1: RoPE =============================================
template <class T>
void rope(MatView<T> X, index_t n_heads, index_t d, const index_t* pos, double theta, bool inverse) {
    const index_t half = d / 2;
    std::vector<double> omega(static_cast<std::size_t>(half));
    for (index_t i = 0; i < half; ++i) omega[std::size_t(i)] = std::pow(theta, -2.0 * double(i) / double(d));  // line 1
    // line 3's cos and sin, once per distinct position (a batch repeats positions 0, 1, … per sequence)
    index_t pmin = 0, pmax = -1;
    if (X.cols > 0) {
        pmin = *std::min_element(pos, pos + X.cols);
        pmax = *std::max_element(pos, pos + X.cols);
    }
    const index_t span = std::min<index_t>(pmax - pmin + 1, X.cols);  // distinct positions ≤ columns
    const bool table = pmax - pmin + 1 <= X.cols;
    std::vector<T> cs(static_cast<std::size_t>(table ? 2 * span * half : 0));
    for (index_t r = 0; table && r < span; ++r)
        for (index_t i = 0; i < half; ++i) {
            const double a = double(pmin + r) * omega[std::size_t(i)];
            cs[std::size_t(2 * (r * half + i))] = T(std::cos(a));
            cs[std::size_t(2 * (r * half + i) + 1)] = T(std::sin(a));
        }
#pragma omp parallel for schedule(static) if (X.size() > 16384)
    for (index_t j = 0; j < X.cols; ++j) {  // line 2: every column t …
        T* x = X.col(j);
        for (index_t i = 0; i < half; ++i) {  // … and every pair i
            T c, s;  // line 3 (R(p)ᵀ = R(−p): the backward negates s)
            if (table) {
                const std::size_t k = std::size_t(2 * ((pos[j] - pmin) * half + i));
                c = cs[k], s = cs[k + 1];
            } else {
                const double a = double(pos[j]) * omega[std::size_t(i)];
                c = T(std::cos(a)), s = T(std::sin(a));
            }
            if (inverse) s = -s;
            for (index_t h = 0; h < n_heads; ++h) {
                T* u = x + h * d + i;
                T* v = u + half;
                const T x1 = *u, x2 = *v;
                *u = c * x1 - s * x2;  // line 4: X′[i, t] ← c X[i, t] − s X[i + d/2, t]
                *v = s * x1 + c * x2;  // line 5: X′[i + d/2, t] ← s X[i, t] + c X[i + d/2, t]
            }
        }
    }
}

// ===================================== Algorithm V2: ALiBi ============================================
std::vector<double> alibi_slopes(index_t H) {
    index_t n = 1;
    while (2 * n <= H) n *= 2;  // line 1: n ← 2^{⌊log₂ H⌋}
    std::vector<double> m(static_cast<std::size_t>(H));
    for (index_t h = 1; h <= n; ++h) m[std::size_t(h - 1)] = std::exp2(-8.0 * double(h) / double(n));  // line 2
    for (index_t h = 1; h <= H - n; ++h)
        m[std::size_t(n + h - 1)] = std::exp2(-4.0 * double(2 * h - 1) / double(n));  // line 3
    return m;
}

// line 6′: S/√d_attn − m D on the scaled scores (before the mask and the softmax)
template <class T>
void alibi_add(MatView<T> S, double m, index_t q0, bool causal) {
#pragma omp parallel for schedule(static) if (S.size() > 16384)
    for (index_t j = 0; j < S.cols; ++j) {
        const index_t tx = q0 + j, live = causal ? std::min(S.rows, tx + 1) : S.rows;
        T* s = S.col(j);
        for (index_t tz = 0; tz < live; ++tz) s[tz] -= T(m) * T(tx >= tz ? tx - tz : tz - tx);
    }
}

// ===================================== SiLU and Algorithm V4 line 3 ===================================
template <class T>
void silu(const T* x, T* y, index_t n) {
    for (index_t i = 0; i < n; ++i) y[i] = x[i] / (T(1) + std::exp(-x[i]));  // x σ(x)
}
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, index_t n) {
    for (index_t i = 0; i < n; ++i) {
        const T sg = T(1) / (T(1) + std::exp(-x[i]));
        dx[i] = dy[i] * sg * (T(1) + x[i] * (T(1) - sg));  // SiLU′(x) = σ(x)(1 + x(1 − σ(x)))
    }
}

// (xsimd: exp in SIMD, as functions.cpp's GELU; scalar tails)
template <class T>
void swiglu_gate(CMatView<T> G, CMatView<T> U, MatView<T> A) {
#pragma omp parallel for schedule(static) if (A.size() > 16384)
    for (index_t j = 0; j < A.cols; ++j) {
        const T *g = G.col(j), *u = U.col(j);
        T* a = A.col(j);
        index_t i = 0;
        for (; i + Lanes<T> <= A.rows; i += Lanes<T>) {  // A ← SiLU(G) ⊙ U, SiLU(g) = g σ(g)
            const Batch<T> gv = Batch<T>::load_unaligned(g + i);
            (gv / (T(1) + xsimd::exp(-gv)) * Batch<T>::load_unaligned(u + i)).store_unaligned(a + i);
        }
        for (; i < A.rows; ++i) a[i] = g[i] / (T(1) + std::exp(-g[i])) * u[i];
    }
}

template <class T>
void swiglu_gate_backward(CMatView<T> G, CMatView<T> U, CMatView<T> dA, MatView<T> dG, MatView<T> dU) {
#pragma omp parallel for schedule(static) if (dA.size() > 16384)
    for (index_t j = 0; j < dA.cols; ++j) {
        const T *g = G.col(j), *u = U.col(j), *da = dA.col(j);
        T *dg = dG.col(j), *du = dU.col(j);
        index_t i = 0;
        for (; i + Lanes<T> <= dA.rows; i += Lanes<T>) {
            const Batch<T> gv = Batch<T>::load_unaligned(g + i), a = Batch<T>::load_unaligned(da + i);
            const Batch<T> sg = T(1) / (T(1) + xsimd::exp(-gv));
            const Batch<T> uv = Batch<T>::load_unaligned(u + i);
            (a * (gv * sg)).store_unaligned(du + i);                         // dU = dA ⊙ SiLU(G)
            (a * uv * (sg * (T(1) + gv * (T(1) - sg)))).store_unaligned(dg + i);  // dG = dA ⊙ U ⊙ SiLU′(G)
        }
        for (; i < dA.rows; ++i) {
            const T sg = T(1) / (T(1) + std::exp(-g[i]));
            const T a = da[i];
            du[i] = a * (g[i] * sg);                                 // dU = dA ⊙ SiLU(G)
            dg[i] = a * u[i] * (sg * (T(1) + g[i] * (T(1) - sg)));  // dG = dA ⊙ U ⊙ SiLU′(G)
        }
    }
}

#define FT_INSTANTIATE(T)                                                                           \
    template void rope<T>(MatView<T>, index_t, index_t, const index_t*, double, bool);             \
    template void alibi_add<T>(MatView<T>, double, index_t, bool);                                  \
    template void silu<T>(const T*, T*, index_t);                                                   \
    template void silu_backward<T>(const T*, const T*, T*, index_t);                                \
    template void swiglu_gate<T>(CMatView<T>, CMatView<T>, MatView<T>);                             \
    template void swiglu_gate_backward<T>(CMatView<T>, CMatView<T>, CMatView<T>, MatView<T>, MatView<T>);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft
