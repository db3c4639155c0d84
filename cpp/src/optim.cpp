// SGD and Adam over the flat parameter buffer.
#include "formal_transformers/optim.hpp"

#include <cmath>

namespace ft {

namespace {
void check_rate(double lr, const char* what) {
    if (!(lr >= 0) || !std::isfinite(lr)) throw ValueError(std::string(what) + ": learning rate must be finite and >= 0");
}
}  // namespace

template <class T>
SGD<T>::SGD(double lr_) : lr(lr_) {
    check_rate(lr, "SGD");
}

template <class T>
void SGD<T>::step(ParamStore<T>& store, const T* g, double lr_now) const {
    const T eta = T(lr_now >= 0 ? lr_now : lr);
    T* theta = store.theta();
    for (const auto& r : store.trainable_ranges()) {
#pragma omp parallel for simd schedule(static) if (r.second - r.first > 32768)
        for (index_t i = r.first; i < r.second; ++i) theta[i] -= eta * g[i];  // θ ← θ − η ∇loss(θ)
    }
}

template <class T>
Adam<T>::Adam(double lr_, double b1, double b2, double eps_, double wd, bool dec)
    : lr(lr_), beta1(b1), beta2(b2), eps(eps_), weight_decay(wd), decoupled(dec) {
    check_rate(lr, "Adam");
    if (!(beta1 >= 0 && beta1 < 1)) throw ValueError("Adam: beta1 must be in [0, 1)");
    if (!(beta2 >= 0 && beta2 < 1)) throw ValueError("Adam: beta2 must be in [0, 1)");
    if (!(eps >= 0)) throw ValueError("Adam: eps must be >= 0");
    if (!(weight_decay >= 0)) throw ValueError("Adam: weight_decay must be >= 0");
}

template <class T>
void Adam<T>::reset() {
    t = 0;
    m = Vector<T>();
    v = Vector<T>();
}

template <class T>
void Adam<T>::step(ParamStore<T>& store, const T* g, double lr_now) {
    const index_t n = store.size();
    if (t == 0) {
        m = Vector<T>::from_shape({std::size_t(n)});
        v = Vector<T>::from_shape({std::size_t(n)});
        m.fill(T(0));
        v.fill(T(0));
    } else if (index_t(m.size()) != n) {
        throw ValueError("Adam: this optimizer holds moments for a model with " + std::to_string(m.size()) +
                         " parameters; it cannot step a model with " + std::to_string(n) +
                         " (use one optimizer per model)");
    }
    ++t;
    const double eta = lr_now >= 0 ? lr_now : lr;
    const T b1 = T(beta1), b2 = T(beta2), e = T(eps), wd = T(weight_decay);
    const T bc1 = T(1) - T(std::pow(beta1, double(t)));
    const T bc2_sqrt = T(std::sqrt(1.0 - std::pow(beta2, double(t))));
    const T step_size = T(eta) / bc1;
    const T shrink = T(1) - T(eta) * wd;
    const bool coupled = !decoupled && weight_decay != 0;
    T* theta = store.theta();
    T* M = m.data();
    T* V = v.data();
    for (const auto& r : store.trainable_ranges()) {
#pragma omp parallel for simd schedule(static) if (r.second - r.first > 32768)
        for (index_t i = r.first; i < r.second; ++i) {
            T gi = g[i];
            if (coupled) gi += wd * theta[i];                 // L2: g ← g + λθ
            else theta[i] *= shrink;                          // AdamW: θ ← θ(1 − ηλ)  (λ = 0: ×1)
            M[i] = M[i] * b1 + (T(1) - b1) * gi;              // m ← β₁m + (1−β₁)g
            V[i] = V[i] * b2 + (T(1) - b2) * gi * gi;         // v ← β₂v + (1−β₂)g²
            const T denom = std::sqrt(V[i]) / bc2_sqrt + e;   // √v̂ + ε
            theta[i] -= step_size * (M[i] / denom);           // θ ← θ − η m̂/(√v̂ + ε)
        }
    }
}

template <class T>
double grad_norm(const ParamStore<T>& store, const T* g) {
    double s = 0;
    for (const auto& r : store.trainable_ranges()) {
#pragma omp parallel for simd reduction(+ : s) schedule(static) if (r.second - r.first > 32768)
        for (index_t i = r.first; i < r.second; ++i) s += double(g[i]) * double(g[i]);
    }
    return std::sqrt(s);
}

template <class T>
void scale(T* g, index_t n, T c) {
#pragma omp parallel for simd schedule(static) if (n > 32768)
    for (index_t i = 0; i < n; ++i) g[i] *= c;
}

template class SGD<float>;
template class SGD<double>;
template class Adam<float>;
template class Adam<double>;
template double grad_norm<float>(const ParamStore<float>&, const float*);
template double grad_norm<double>(const ParamStore<double>&, const double*);
template void scale<float>(float*, index_t, float);
template void scale<double>(double*, index_t, double);

}  // namespace ft
