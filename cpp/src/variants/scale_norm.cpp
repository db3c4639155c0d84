// V12 ScaleNorm (Nguyen & Salazar 2019, "Transformers without Tears", eq. 4) as a norm part (registered as
// norm "scale"): one learned scalar g per norm in place of layer_norm's γ, β ∈ R^{d_e}.
//
//   Input: e ∈ R^{d_e}.   Output: ê ∈ R^{d_e}.   Parameters: g ∈ R, initialised to √d_e.
//   1  return ê = g · e / √(‖e‖² + eps)          (eps = 0: the paper's g·e/‖e‖)
//
// Applied to every column of a [d_e, n] matrix. g is stored under the γ name of the place (gamma1, gamma2,
// gamma: shape (1,)); there is no β. Backward, with r = 1/√(‖e‖² + eps) and x̂ = r e:
//   dg += Σ_t dÊ[:, t] · x̂_t,     de = g r (dÊ[:, t] − x̂_t (x̂_t · dÊ[:, t])).
#include <cmath>
#include <vector>

#include "formal_transformers/parts.hpp"

namespace ft {

namespace {
template <class T>
class ScaleNorm final : public NormPart<T> {
public:
    ScaleNorm(index_t d_e_, double eps_, ParamStore<T>& store, const std::string& g_name) : d_e(d_e_), eps(eps_) {
        if (d_e <= 0) throw ValueError("ScaleNorm: d_e must be positive, got " + std::to_string(d_e));
        if (!(eps >= 0) || !std::isfinite(eps))
            throw ValueError("ScaleNorm: eps must be a finite number >= 0, got " + std::to_string(eps));
        g = store.vector(g_name, 1);
    }
    void init(ParamStore<T>& store) const override { store.fill(g.offset, 1, T(std::sqrt(double(d_e)))); }

    // E:[d_e,n] -> Ê:[d_e,n] (line 1 per column). Ê may alias E.
    void forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const override {
        const index_t n = E.cols;
        MatView<T> X = ensure(c.e_hat, d_e, n);
        T* rstd = ensure(c.rstd, n);
        const T gv = store.v(g)[0];
#pragma omp parallel for schedule(static) if (d_e * n > 16384)
        for (index_t t = 0; t < n; ++t) {
            const T* e = E.col(t);
            double s = 0;  // ‖e‖²
#pragma omp simd reduction(+ : s)
            for (index_t i = 0; i < d_e; ++i) s += double(e[i]) * e[i];
            const T r = T(1.0 / std::sqrt(s + eps));
            rstd[t] = r;
            T* xh = X.col(t);
            T* out = E_hat.col(t);
#pragma omp simd
            for (index_t i = 0; i < d_e; ++i) {  // line 1: ê = g · e / √(‖e‖² + eps)
                xh[i] = e[i] * r;
                out[i] = gv * xh[i];
            }
        }
    }

    // d(line 1): dÊ -> dE (+=), dg (+=)
    void backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const override {
        const index_t n = dE_hat.cols;
        CMatView<T> X = view(c.e_hat);
        const T* rstd = c.rstd.data();
        const T gv = store.v(g)[0];
        std::vector<double> dots(std::size_t(n), 0.0);  // x̂_t · dÊ[:, t], summed in order below (deterministic)
#pragma omp parallel for schedule(static) if (d_e * n > 16384)
        for (index_t t = 0; t < n; ++t) {
            const T* dy = dE_hat.col(t);
            const T* xh = X.col(t);
            T* de = dE.col(t);
            double s = 0;  // x̂ · dÊ[:, t]
#pragma omp simd reduction(+ : s)
            for (index_t i = 0; i < d_e; ++i) s += double(dy[i]) * xh[i];
            dots[std::size_t(t)] = s;
            const T gr = gv * rstd[t], st = T(s);
#pragma omp simd
            for (index_t i = 0; i < d_e; ++i) de[i] += gr * (dy[i] - xh[i] * st);
        }
        double dg = 0;
        for (const double s : dots) dg += s;
        store.dv(g)[0] += T(dg);
    }

private:
    index_t d_e;
    double eps;
    VecParam g;
};
}  // namespace

template <class T>
std::shared_ptr<const NormPart<T>> make_scale_norm(index_t d, double eps, ParamStore<T>& store, const std::string& gamma,
                                                   const std::string&) {
    return std::make_shared<ScaleNorm<T>>(d, eps, store, gamma);
}
template std::shared_ptr<const NormPart<float>> make_scale_norm<float>(index_t, double, ParamStore<float>&,
                                                                       const std::string&, const std::string&);
template std::shared_ptr<const NormPart<double>> make_scale_norm<double>(index_t, double, ParamStore<double>&,
                                                                         const std::string&, const std::string&);

}  // namespace ft
