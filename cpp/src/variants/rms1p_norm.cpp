// The (1 + γ) RMS norm (Gemma, Gemma 2, Gemma 3; registered as norm "rms1p"): RMSnorm whose stored gain is the
// offset from 1, so θ holds γ − 1 of the plain RMSnorm (a fresh model's gain is 1 with the offset 0):
//   1  r ← √(Σ_{i=1}^{d_e} e[i]² / d_e + eps)
//   2  return ê = e / r ⊙ (1 + γ)
// Backward (x̂ = e / r, dx̂ = dÊ ⊙ (1 + γ)):  dγ += Σ_t dÊ ⊙ x̂;  de += (dx̂ − x̂ mean(dx̂ ⊙ x̂)) / r.
// Stored this way a Hugging Face Gemma checkpoint's weight is θ's γ bit for bit, both ways.
#include <cmath>

#include "formal_transformers/parts.hpp"

namespace ft {

namespace {
template <class T>
class RMS1pNorm {
public:
    RMS1pNorm(index_t d, double eps, ParamStore<T>& store, const std::string& gamma_name) : d_e(d), eps(eps) {
        if (d <= 0) throw ValueError("rms1p norm: d_e must be positive, got " + std::to_string(d));
        if (!(eps >= 0) || !std::isfinite(eps)) throw ValueError("rms1p norm: eps must be a finite number >= 0");
        gamma = store.vector(gamma_name, d);
    }
    void init(ParamStore<T>& store) const { store.fill(gamma.offset, d_e, T(0)); }  // gain 1 + 0
    // E:[d_e,n] -> Ê:[d_e,n] (Ê may alias E)
    void forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const {
        const index_t n = E.cols;
        MatView<T> X = ensure(c.e_hat, d_e, n);
        T* rstd = ensure(c.rstd, n);
        const T* g = store.v(gamma);
#pragma omp parallel for schedule(static) if (d_e * n > 16384)
        for (index_t t = 0; t < n; ++t) {
            const T* e = E.col(t);
            double ms = 0;  // line 1 (accumulated in double, as RMSnorm)
            for (index_t i = 0; i < d_e; ++i) ms += double(e[i]) * e[i];
            const T r = T(1.0 / std::sqrt(ms / double(d_e) + eps));
            rstd[t] = r;
            T* xh = X.col(t);
            T* out = E_hat.col(t);
            for (index_t i = 0; i < d_e; ++i) {  // line 2: ê = e / r ⊙ (1 + γ)
                xh[i] = e[i] * r;
                out[i] = xh[i] * (T(1) + g[i]);
            }
        }
    }
    // dÊ -> dE += …, dγ += …
    void backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const {
        const index_t n = dE_hat.cols;
        CMatView<T> X = view(c.e_hat);
        const T* rstd = c.rstd.data();
        const T* g = store.v(gamma);
        T* dg = store.dv(gamma);
        for (index_t t = 0; t < n; ++t) {  // d(line 2) for γ: dγ += Σ_t dÊ ⊙ x̂
            const T* dy = dE_hat.col(t);
            const T* xh = X.col(t);
            for (index_t i = 0; i < d_e; ++i) dg[i] += dy[i] * xh[i];
        }
#pragma omp parallel for schedule(static) if (d_e * n > 16384)
        for (index_t t = 0; t < n; ++t) {  // d(line 2), d(line 1) for e
            const T* dy = dE_hat.col(t);
            const T* xh = X.col(t);
            T* de = dE.col(t);
            double s2 = 0;  // mean(dx̂ ⊙ x̂), dx̂ = dÊ ⊙ (1 + γ)
            for (index_t i = 0; i < d_e; ++i) s2 += double(dy[i]) * (T(1) + g[i]) * xh[i];
            const T m2 = T(s2 / double(d_e)), r = rstd[t];
            for (index_t i = 0; i < d_e; ++i) de[i] += r * (dy[i] * (T(1) + g[i]) - xh[i] * m2);
        }
    }

    index_t d_e;
    double eps;
    VecParam gamma;
};
}  // namespace

// The registry's factory (registry.cpp): γ only, no β.
template <class T>
std::shared_ptr<const NormPart<T>> make_rms1p_norm(index_t d, double eps, ParamStore<T>& store, const std::string& gamma,
                                                   const std::string&) {
    return std::make_shared<NormOf<T, RMS1pNorm<T>>>(RMS1pNorm<T>(d, eps, store, gamma));
}
template std::shared_ptr<const NormPart<float>> make_rms1p_norm<float>(index_t, double, ParamStore<float>&,
                                                                       const std::string&, const std::string&);
template std::shared_ptr<const NormPart<double>> make_rms1p_norm<double>(index_t, double, ParamStore<double>&,
                                                                         const std::string&, const std::string&);

}  // namespace ft
