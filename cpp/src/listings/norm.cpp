// Algorithm 6 (layer_norm) and RMSnorm: forward and backward side by side.
#include "formal_transformers/norm.hpp"
#include "formal_transformers/parts.hpp"

#include <cmath>

#include "../runtime/cpu_level.hpp"

namespace ft {

// The loops over the columns (the lines of the algorithms), compiled once per CPU level in the portable build
// (cpu_level.hpp); the classes below call the level cpu_level() chose.
namespace FT_CPU_NS {
namespace {
// Accumulate in double: the column sums of lines 1–2 are the only reductions here, and float32 results
// stay within 1e-5 of the float64 reference at any d_e.
template <class T>
using Acc = double;
}  // namespace

// Algorithm 6: E:[d_e,n] -> Ê:[d_e,n] (x̂ and 1/√(v + eps) of each column kept for the backward)
template <class T>
void layer_norm_forward(index_t d_e, double eps, const T* g, const T* b, CMatView<T> E, MatView<T> X, T* rstd,
                        MatView<T> E_hat) {
    const index_t n = E.cols;
#pragma omp parallel for schedule(static) if (d_e * n > 16384)
    for (index_t t = 0; t < n; ++t) {
        const T* e = E.col(t);
        Acc<T> m = 0;  // line 1: m ← Σ_i e[i] / d_e
#pragma omp simd reduction(+ : m)
        for (index_t i = 0; i < d_e; ++i) m += e[i];
        m /= Acc<T>(d_e);
        Acc<T> v = 0;  // line 2: v ← Σ_i (e[i] − m)² / d_e
#pragma omp simd reduction(+ : v)
        for (index_t i = 0; i < d_e; ++i) v += (Acc<T>(e[i]) - m) * (Acc<T>(e[i]) - m);
        v /= Acc<T>(d_e);
        const T r = T(1.0 / std::sqrt(v + eps));
        rstd[t] = r;
        T* xh = X.col(t);
        T* out = E_hat.col(t);
        const T mt = T(m);
#pragma omp simd
        for (index_t i = 0; i < d_e; ++i) {  // line 3: ê = (e − m)/√v ⊙ γ + β
            xh[i] = (e[i] - mt) * r;
            out[i] = xh[i] * g[i] + b[i];
        }
    }
}

// d(line 3), d(line 2), d(line 1): dÊ -> dE, dγ, dβ
template <class T>
void layer_norm_backward(index_t d_e, const T* g, T* dg, T* db, CMatView<T> dE_hat, CMatView<T> X, const T* rstd,
                         MatView<T> dE) {
    const index_t n = dE_hat.cols;
    // dγ += Σ_t dÊ[:,t] ⊙ x̂[:,t], dβ += Σ_t dÊ[:,t]   (serial over t: a reduction into one vector)
    for (index_t t = 0; t < n; ++t) {
        const T* dy = dE_hat.col(t);
        const T* xh = X.col(t);
#pragma omp simd
        for (index_t i = 0; i < d_e; ++i) {
            dg[i] += dy[i] * xh[i];
            db[i] += dy[i];
        }
    }
#pragma omp parallel for schedule(static) if (d_e * n > 16384)
    for (index_t t = 0; t < n; ++t) {
        const T* dy = dE_hat.col(t);
        const T* xh = X.col(t);
        T* de = dE.col(t);
        Acc<T> s1 = 0, s2 = 0;  // mean(dx̂), mean(dx̂ ⊙ x̂), dx̂ = dÊ ⊙ γ
#pragma omp simd reduction(+ : s1, s2)
        for (index_t i = 0; i < d_e; ++i) {
            const Acc<T> dxh = Acc<T>(dy[i]) * g[i];
            s1 += dxh;
            s2 += dxh * xh[i];
        }
        const T m1 = T(s1 / Acc<T>(d_e)), m2 = T(s2 / Acc<T>(d_e)), r = rstd[t];
#pragma omp simd
        for (index_t i = 0; i < d_e; ++i) de[i] += r * (dy[i] * g[i] - m1 - xh[i] * m2);
    }
}

// RMSnorm: E:[d_e,n] -> Ê:[d_e,n]
template <class T>
void rms_norm_forward(index_t d_e, double eps, const T* g, CMatView<T> E, MatView<T> X, T* rstd, MatView<T> E_hat) {
    const index_t n = E.cols;
#pragma omp parallel for schedule(static) if (d_e * n > 16384)
    for (index_t t = 0; t < n; ++t) {
        const T* e = E.col(t);
        Acc<T> ms = 0;  // Σ_i e[i]² / d_e
#pragma omp simd reduction(+ : ms)
        for (index_t i = 0; i < d_e; ++i) ms += Acc<T>(e[i]) * e[i];
        ms /= Acc<T>(d_e);
        const T r = T(1.0 / std::sqrt(ms + eps));
        rstd[t] = r;
        T* xh = X.col(t);
        T* out = E_hat.col(t);
#pragma omp simd
        for (index_t i = 0; i < d_e; ++i) {  // ê = e / rms ⊙ γ
            xh[i] = e[i] * r;
            out[i] = xh[i] * g[i];
        }
    }
}

template <class T>
void rms_norm_backward(index_t d_e, const T* g, T* dg, CMatView<T> dE_hat, CMatView<T> X, const T* rstd, MatView<T> dE) {
    const index_t n = dE_hat.cols;
    for (index_t t = 0; t < n; ++t) {
        const T* dy = dE_hat.col(t);
        const T* xh = X.col(t);
#pragma omp simd
        for (index_t i = 0; i < d_e; ++i) dg[i] += dy[i] * xh[i];
    }
#pragma omp parallel for schedule(static) if (d_e * n > 16384)
    for (index_t t = 0; t < n; ++t) {
        const T* dy = dE_hat.col(t);
        const T* xh = X.col(t);
        T* de = dE.col(t);
        Acc<T> s2 = 0;
#pragma omp simd reduction(+ : s2)
        for (index_t i = 0; i < d_e; ++i) s2 += Acc<T>(dy[i]) * g[i] * xh[i];
        const T m2 = T(s2 / Acc<T>(d_e)), r = rstd[t];
#pragma omp simd
        for (index_t i = 0; i < d_e; ++i) de[i] += r * (dy[i] * g[i] - xh[i] * m2);
    }
}

#define FT_NORM_KERNELS(X)                                                                                           \
    X(void, layer_norm_forward,                                                                                      \
      (index_t d_e, double eps, const T* g, const T* b, CMatView<T> E, MatView<T> X, T* rstd, MatView<T> E_hat),     \
      (d_e, eps, g, b, E, X, rstd, E_hat))                                                                           \
    X(void, layer_norm_backward,                                                                                     \
      (index_t d_e, const T* g, T* dg, T* db, CMatView<T> dE_hat, CMatView<T> X, const T* rstd, MatView<T> dE),      \
      (d_e, g, dg, db, dE_hat, X, rstd, dE))                                                                         \
    X(void, rms_norm_forward, (index_t d_e, double eps, const T* g, CMatView<T> E, MatView<T> X, T* rstd,            \
                               MatView<T> E_hat),                                                                    \
      (d_e, eps, g, E, X, rstd, E_hat))                                                                              \
    X(void, rms_norm_backward,                                                                                       \
      (index_t d_e, const T* g, T* dg, CMatView<T> dE_hat, CMatView<T> X, const T* rstd, MatView<T> dE),             \
      (d_e, g, dg, dE_hat, X, rstd, dE))
#define FT_INSTANTIATE_ONE(RET, NAME, PARAMS, ARGS) template RET NAME<T> PARAMS;
#define T float
FT_NORM_KERNELS(FT_INSTANTIATE_ONE)
#undef T
#define T double
FT_NORM_KERNELS(FT_INSTANTIATE_ONE)
#undef T
#undef FT_INSTANTIATE_ONE
}  // namespace FT_CPU_NS

#ifndef FT_CPU_LEVEL_ONLY
#define FT_DECLARE(RET, NAME, PARAMS, ARGS) \
    template <class T>                      \
    RET NAME PARAMS;
#if defined(FT_CPU_DISPATCH)
namespace cpu_v3 {
FT_NORM_KERNELS(FT_DECLARE)
}
namespace cpu_v4 {
FT_NORM_KERNELS(FT_DECLARE)
}
#endif
#undef FT_DECLARE
namespace {
#define FT_FORWARD(RET, NAME, PARAMS, ARGS) \
    template <class T>                      \
    RET NAME PARAMS {                       \
        FT_CPU_CALL(NAME<T> ARGS)           \
    }
FT_NORM_KERNELS(FT_FORWARD)
#undef FT_FORWARD

// A norm's sizes, checked before its parameters are registered: d_e > 0, eps a finite number ≥ 0.
void check_norm(const char* who, index_t d_e, double eps) {
    const std::string w(who);
    if (d_e <= 0) throw ValueError(w + ": d_e must be positive, got " + std::to_string(d_e));
    if (!(eps >= 0)) throw ValueError(w + ": eps must be >= 0, got " + std::to_string(eps));
    if (!std::isfinite(eps)) throw ValueError(w + ": eps must be a finite number >= 0, got " + std::to_string(eps));
}
}  // namespace

// ======================================= layer_norm ===================================================
template <class T>
LayerNorm<T>::LayerNorm(index_t d_e_, double eps_, ParamStore<T>& store, const std::string& gamma_name,
                        const std::string& beta_name)
    : d_e(d_e_), eps(eps_) {
    check_norm("layer_norm", d_e, eps);
    gamma = store.vector(gamma_name, d_e);
    beta = store.vector(beta_name, d_e);
}

template <class T>
void LayerNorm<T>::init(ParamStore<T>& store) const {
    store.fill(gamma.offset, d_e, T(1));
    store.fill(beta.offset, d_e, T(0));
}

// E:[d_e,n] -> Ê:[d_e,n]
template <class T>
void LayerNorm<T>::forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const {
    const T* g = store.v(gamma);
    const T* b = store.v(beta);
    layer_norm_forward(d_e, eps, g, b, E, ensure(c.e_hat, d_e, E.cols), ensure(c.rstd, E.cols), E_hat);
}

// d(line 3), d(line 2), d(line 1): dÊ -> dE, dγ, dβ
template <class T>
void LayerNorm<T>::backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const {
    layer_norm_backward(d_e, store.v(gamma), store.dv(gamma), store.dv(beta), dE_hat, view(c.e_hat), c.rstd.data(), dE);
}

// ========================================= RMSnorm ====================================================
template <class T>
RMSNorm<T>::RMSNorm(index_t d_e_, double eps_, ParamStore<T>& store, const std::string& gamma_name)
    : d_e(d_e_), eps(eps_) {
    check_norm("RMSnorm", d_e, eps);
    gamma = store.vector(gamma_name, d_e);
}

template <class T>
void RMSNorm<T>::init(ParamStore<T>& store) const {
    store.fill(gamma.offset, d_e, T(1));
}

// E:[d_e,n] -> Ê:[d_e,n]
template <class T>
void RMSNorm<T>::forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const {
    rms_norm_forward(d_e, eps, store.v(gamma), E, ensure(c.e_hat, d_e, E.cols), ensure(c.rstd, E.cols), E_hat);
}

template <class T>
void RMSNorm<T>::backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const {
    rms_norm_backward(d_e, store.v(gamma), store.dv(gamma), dE_hat, view(c.e_hat), c.rstd.data(), dE);
}

template class LayerNorm<float>;
template class LayerNorm<double>;
template class RMSNorm<float>;
template class RMSNorm<double>;
#endif  // FT_CPU_LEVEL_ONLY

}  // namespace ft

#ifndef FT_CPU_LEVEL_ONLY
// ------------------------------------ as a part (registry.cpp: norm "layer") ----------------------------------
namespace ft {
template <class T>
std::shared_ptr<const NormPart<T>> make_layer_norm(index_t d, double eps, ParamStore<T>& store, const std::string& gamma,
                                                   const std::string& beta) {
    return std::make_shared<NormOf<T, LayerNorm<T>>>(LayerNorm<T>(d, eps, store, gamma, beta));
}
template std::shared_ptr<const NormPart<float>> make_layer_norm<float>(index_t, double, ParamStore<float>&, const std::string&,
                                                                       const std::string&);
template std::shared_ptr<const NormPart<double>> make_layer_norm<double>(index_t, double, ParamStore<double>&,
                                                                         const std::string&, const std::string&);
}  // namespace ft
#endif
