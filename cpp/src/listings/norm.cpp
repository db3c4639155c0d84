// Algorithm 6 (layer_norm) and RMSnorm: forward and backward side by side.
#include "formal_transformers/norm.hpp"
#include "formal_transformers/parts.hpp"

#include <cmath>

namespace ft {

namespace {
// Accumulate in double: the column sums of lines 1–2 are the only reductions here, and float32 results
// stay within 1e-5 of the float64 reference at any d_e.
template <class T>
using Acc = double;

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
    const index_t n = E.cols;
    MatView<T> X = ensure(c.e_hat, d_e, n);
    T* rstd = ensure(c.rstd, n);
    const T* g = store.v(gamma);
    const T* b = store.v(beta);
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
void LayerNorm<T>::backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const {
    const index_t n = dE_hat.cols;
    CMatView<T> X = view(c.e_hat);
    const T* rstd = c.rstd.data();
    const T* g = store.v(gamma);
    T* dg = store.dv(gamma);
    T* db = store.dv(beta);
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
    const index_t n = E.cols;
    MatView<T> X = ensure(c.e_hat, d_e, n);
    T* rstd = ensure(c.rstd, n);
    const T* g = store.v(gamma);
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
void RMSNorm<T>::backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const {
    const index_t n = dE_hat.cols;
    CMatView<T> X = view(c.e_hat);
    const T* rstd = c.rstd.data();
    const T* g = store.v(gamma);
    T* dg = store.dv(gamma);
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

template class LayerNorm<float>;
template class LayerNorm<double>;
template class RMSNorm<float>;
template class RMSNorm<double>;

}  // namespace ft

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
