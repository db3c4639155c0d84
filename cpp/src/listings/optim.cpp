// SGD and Adam over the flat parameter buffer.
#include "formal_transformers/optim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "../runtime/cpu_level.hpp"
#include "../runtime/huge_pages.hpp"

namespace ft {

#ifndef FT_CPU_LEVEL_ONLY
namespace {
void check_rate(double lr, const char* what) {
    if (!(lr >= 0) || !std::isfinite(lr)) throw ValueError(std::string(what) + ": learning rate must be finite and >= 0");
}
[[noreturn]] void throw_nonfinite_update(const char* who, double eta) {
    throw NonFiniteUpdate(std::string(who) + ": this step (η = " + std::to_string(eta) +
                          ") would make some parameters NaN or infinite; nothing was changed");
}
}  // namespace

void check_adam(double lr, double beta1, double beta2, double eps, double weight_decay, bool float32) {
    check_rate(lr, "Adam");
    if (!(beta1 >= 0 && beta1 < 1)) throw ValueError("Adam: beta1 must be in [0, 1)");
    if (!(beta2 >= 0 && beta2 < 1)) throw ValueError("Adam: beta2 must be in [0, 1)");
    if (!(eps > 0) || !std::isfinite(eps) || (float32 && !(float(eps) > 0)))
        throw ValueError("Adam: eps must be a finite number > 0 (and not 0 in " + std::string(float32 ? "float32" : "float64") +
                         "), got " + std::to_string(eps) + " (eps = 0 makes 0/0 where a gradient entry is zero)");
    if (!(weight_decay >= 0) || !std::isfinite(weight_decay))
        throw ValueError("Adam: weight_decay must be a finite number >= 0, got " + std::to_string(weight_decay));
}

template <class T>
SGD<T>::SGD(double lr_) : lr(lr_) {
    check_rate(lr, "SGD");
}

template <class T>
void SGD<T>::step(ParamStore<T>& store, const T* g, double lr_now) const {
    const T eta = T(lr_now >= 0 ? lr_now : lr);
    T* theta = store.theta();
    const auto ranges = store.trainable_ranges();
    // all or nothing: every θ − η∇ finite before the first is written
    int ok = 1;
    for (const auto& r : ranges) {
#pragma omp parallel for simd reduction(& : ok) schedule(static) if (r.second - r.first > 32768)
        for (index_t i = r.first; i < r.second; ++i) ok &= int(std::isfinite(theta[i] - eta * g[i]));
    }
    if (!ok) throw_nonfinite_update("SGD", double(eta));
    for (const auto& r : ranges) {
#pragma omp parallel for simd schedule(static) if (r.second - r.first > 32768)
        for (index_t i = r.first; i < r.second; ++i) theta[i] -= eta * g[i];  // θ ← θ − η ∇loss(θ)
    }
}

template <class T>
Adam<T>::Adam(double lr_, double b1, double b2, double eps_, double wd, bool dec)
    : lr(lr_), beta1(b1), beta2(b2), eps(eps_), weight_decay(wd), decoupled(dec) {
    check_adam(lr, beta1, beta2, eps, weight_decay, sizeof(T) == 4);
}

template <class T>
void Adam<T>::reset() {
    t = 0;
    ranges.clear();
    m = Vector<T>();
    v = Vector<T>();
    bounds = MomentBounds{};
}

// The update of n entries (below). Apply false: nothing written, the result says whether every new θ_i is finite.
// Apply true: written, *m_max = max |m_i| written and the result says whether every m_i and v_i written is finite
// with v_i >= 0 (the bounds of the next step's check).
template <bool Apply, class T>
bool adam_kernel(const AdamCoefficients<T>& c, T* theta, T* M, T* V, const T* g, index_t n, T* m_max);
// The check's bound test on n entries (adam_update_bounded)
template <class T>
bool adam_bound_kernel(const AdamCoefficients<T>& c, T m_max, const T* theta, const T* g, index_t n);

template <class T>
void Adam<T>::step(ParamStore<T>& store, const T* g, double lr_now) {
    auto now = store.trainable_ranges();
    index_t n = 0;
    for (const auto& r : now) n += r.second - r.first;
    if (t == 0) {
        ranges = std::move(now);
        m = huge_zeros<T>(std::size_t(n));  // streamed whole by every step: 2 MB pages (huge_pages.hpp)
        v = huge_zeros<T>(std::size_t(n));
        bounds = MomentBounds{true, T(0), m.data(), v.data()};
    } else if (now != ranges || index_t(m.size()) != n) {
        index_t held = 0;
        for (const auto& r : ranges) held += r.second - r.first;
        throw ValueError("Adam: this optimizer holds moments for " + std::to_string(held) +
                         " trainable parameters; it cannot step a model whose trainable parameters are " +
                         std::to_string(n) + (held == n ? " others" : "") +
                         " (use one optimizer per model and per choice of trainable parameters)");
    }
    const double eta = lr_now >= 0 ? lr_now : lr;
    const index_t t_next = t + 1;
    AdamCoefficients<T> c;
    c.b1 = T(beta1), c.b2 = T(beta2), c.eps = T(eps), c.wd = T(weight_decay);
    c.bc2_sqrt = T(std::sqrt(1.0 - std::pow(beta2, double(t_next))));
    c.step_size = T(eta) / (T(1) - T(std::pow(beta1, double(t_next))));
    c.shrink = T(1) - T(eta) * c.wd;
    c.coupled = !decoupled && weight_decay != 0;
    T* theta = store.theta();
    // chunks of 16 K entries (64 KB of float32 per stream), split over the threads when the range is large;
    // range r's moments start at `at` (the sizes of the ranges before it)
    constexpr index_t chunk = 16384;
    // all or nothing, nothing written until every updated θ_i is known finite: from θ and g against the bounds the
    // last writing pass left on m and v (half the memory traffic), else (no bounds, or a chunk they cannot clear)
    // from the update itself computed and not written
    const bool bounded = bounds.valid && bounds.m_at == m.data() && bounds.v_at == v.data();
    const T m_max = bounds.m_max;
    int ok = 1;
    for (index_t at = 0, k0 = 0; k0 < index_t(ranges.size()); at += ranges[std::size_t(k0)].second - ranges[std::size_t(k0)].first, ++k0) {
        const auto r = ranges[std::size_t(k0)];
        const index_t n = r.second - r.first, n_chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for reduction(& : ok) schedule(static) if (n > 32768)
        for (index_t k = 0; k < n_chunks; ++k) {
            const index_t i = k * chunk, w = std::min(chunk, n - i);
            ok &= int((bounded && adam_bound_kernel(c, m_max, theta + r.first + i, g + r.first + i, w)) ||
                      adam_kernel<false>(c, theta + r.first + i, m.data() + at + i, v.data() + at + i, g + r.first + i, w, static_cast<T*>(nullptr)));
        }
    }
    if (!ok) throw_nonfinite_update("Adam", eta);
    t = t_next;
    // θ's bf16 copy written with θ (float32): each chunk's rounding while the chunk is in cache
    Bf16Weights* copy = nullptr;
    if constexpr (std::is_same_v<T, float>)
        if (bf16_copy && bf16_copy->begin == theta && bf16_copy->n == store.size()) copy = bf16_copy;
    // the writing pass, gathering the next check's bounds: max |m_i| and whether every m_i, v_i is finite, v_i >= 0
    T m_new = T(0);
    int m_v_finite = 1;
    for (index_t at = 0, k0 = 0; k0 < index_t(ranges.size()); at += ranges[std::size_t(k0)].second - ranges[std::size_t(k0)].first, ++k0) {
        const auto r = ranges[std::size_t(k0)];
        const index_t n = r.second - r.first, n_chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for reduction(max : m_new) reduction(& : m_v_finite) schedule(static) if (n > 32768)
        for (index_t k = 0; k < n_chunks; ++k) {
            const index_t i = k * chunk, w = std::min(chunk, n - i);
            T chunk_max = T(0);
            m_v_finite &= int(adam_kernel<true>(c, theta + r.first + i, m.data() + at + i, v.data() + at + i, g + r.first + i, w, &chunk_max));
            m_new = std::max(m_new, chunk_max);
            if constexpr (std::is_same_v<T, float>)
                if (copy) copy->write(theta, store.size(), r.first + i, r.first + i + w);
        }
    }
    bounds = MomentBounds{m_v_finite != 0, m_new, m.data(), v.data()};
}

#endif  // FT_CPU_LEVEL_ONLY

// Adam's kernel, compiled once per CPU level in the portable build (cpu_level.hpp)
namespace FT_CPU_NS {
// One element of Adam's update (the loop body of Adam::step), term by term as the header comment says. With
// Apply false nothing is written (the all-or-nothing check); returns whether the new θ_i is finite.
template <bool Apply, class T>
inline bool adam_element(const AdamCoefficients<T>& c, T* theta, T* M, T* V, const T* g, index_t i) {
    T gi = g[i], th = theta[i];
    if (c.coupled) gi += c.wd * th;                             // L2: g ← g + λθ
    else th *= c.shrink;                                        // AdamW: θ ← θ(1 − ηλ)  (λ = 0: ×1)
    const T m = M[i] * c.b1 + (T(1) - c.b1) * gi;               // m ← β₁m + (1−β₁)g
    const T v = V[i] * c.b2 + (T(1) - c.b2) * gi * gi;          // v ← β₂v + (1−β₂)g²
    const T denom = std::sqrt(v) / c.bc2_sqrt + c.eps;          // √v̂ + ε
    th -= c.step_size * (m / denom);                            // θ ← θ − η m̂/(√v̂ + ε)
    if (Apply) M[i] = m, V[i] = v, theta[i] = th;
    return std::isfinite(th);
}

// The same terms on xsimd batches (the scalar loop did not vectorise: std::sqrt's errno path). Apply false:
// nothing written, the result is whether every new θ_i is finite. Apply true: *m_max = max |m_i| written, the
// result is whether every m_i and v_i written is finite with v_i >= 0 (comparisons false on NaN).
template <bool Apply, class T>
bool adam_kernel(const AdamCoefficients<T>& c, T* theta, T* M, T* V, const T* g, index_t n, T* m_max) {
    using B = xsimd::batch<T>;
    constexpr index_t W = index_t(B::size);
    constexpr T top = std::numeric_limits<T>::max();
    const B b1(c.b1), b2(c.b2), a1(T(1) - c.b1), a2(T(1) - c.b2), e(c.eps), wd(c.wd), shrink(c.shrink),
        step(c.step_size), bc2(c.bc2_sqrt), zero(T(0)), limit(top);
    auto finite = xsimd::batch_bool<T>(true), bounded = xsimd::batch_bool<T>(true);
    B mm(T(0));
    index_t i = 0;
    for (; i + W <= n; i += W) {
        B th = B::load_unaligned(theta + i), gi = B::load_unaligned(g + i);
        if (c.coupled) gi = gi + wd * th;
        else th = th * shrink;
        const B m = B::load_unaligned(M + i) * b1 + a1 * gi;
        const B v = B::load_unaligned(V + i) * b2 + a2 * gi * gi;
        const B denom = xsimd::sqrt(v) / bc2 + e;
        th = th - step * (m / denom);
        if (Apply) {
            m.store_unaligned(M + i);
            v.store_unaligned(V + i);
            th.store_unaligned(theta + i);
            const B am = xsimd::abs(m);
            mm = xsimd::max(mm, am);
            bounded = bounded && (am <= limit) && (v >= zero) && (v <= limit);
        } else {
            finite = finite && xsimd::isfinite(th);
        }
    }
    bool ok = xsimd::all(Apply ? bounded : finite);
    T top_m = T(0);
    if (Apply) {
        alignas(64) T lanes[W];
        mm.store_aligned(lanes);
        for (index_t k = 0; k < W; ++k) top_m = std::max(top_m, lanes[k]);
    }
    for (; i < n; ++i) {
        const bool fin = adam_element<Apply>(c, theta, M, V, g, i);
        if (Apply) {
            const T am = std::abs(M[i]);
            top_m = std::max(top_m, am);
            ok = ok && am <= top && V[i] >= T(0) && V[i] <= top;
        } else {
            ok = fin && ok;
        }
    }
    if (Apply) *m_max = top_m;
    return ok;
}

// The bound test of the all-or-nothing check: reads θ and g only, and is true only when every updated θ_i of
// adam_element is finite for any m_i with |m_i| <= m_max and any finite v_i >= 0. With v_i >= 0 and g_i finite,
// √v̂ + ε >= ε (v + (1−β₂)g² may be +inf: then m/(√v̂ + ε) is 0), so with |m_new| <= C = β₁ m_max + (1 − β₁)|g|
// (L2: g + λθ, bounded by |g| + λ|θ|) up to a few roundings, m_new, m_new/(√v̂ + ε) and η̂ m_new/(√v̂ + ε) are
// finite when C, C/ε and η̂ C/ε are below max/4, and |θ_new| <= |θ(1 − ηλ)| + η̂ C/ε. The test asks
// |θ(1 − ηλ)| < max/4, |g| < max/4 and max(η̂, ε, 1)·C < ε·max/4: then |θ_new| < max/2 (1 + a few ulps)
// whatever the roundings (or a fused multiply-add) of the update. Every comparison is false on NaN, so a NaN or
// ±inf anywhere in θ, g or the coefficients fails it (then the exact test decides). A denormal ε (0 when
// denormals are flushed) or a negative η̂ fails it too.
template <class T>
bool adam_bound_kernel(const AdamCoefficients<T>& c, T m_max, const T* theta, const T* g, index_t n) {
    using B = xsimd::batch<T>;
    constexpr index_t W = index_t(B::size);
    constexpr T quarter = std::numeric_limits<T>::max() / 4;
    if (!(c.eps >= std::numeric_limits<T>::min()) || !(c.step_size >= T(0))) return false;
    const T k = std::max(std::max(c.step_size, c.eps), T(1)), a1 = T(1) - c.b1, mb = c.b1 * m_max, r = c.eps * quarter;
    const B K(k), A1(a1), MB(mb), R(r), Q(quarter), wd(c.wd), shrink(c.shrink);
    auto ok = xsimd::batch_bool<T>(true);
    index_t i = 0;
    for (; i + W <= n; i += W) {
        const B th = B::load_unaligned(theta + i), ga = xsimd::abs(B::load_unaligned(g + i));
        B p, G;
        if (c.coupled) p = xsimd::abs(th), G = ga + wd * p;  // |g + λθ| <= |g| + λ|θ|
        else p = xsimd::abs(th * shrink), G = ga;
        ok = ok && (p < Q) && (G < Q) && (K * (MB + A1 * G) < R);
    }
    bool all = xsimd::all(ok);
    for (; i < n; ++i) {
        const T ga = std::abs(g[i]);
        T p, G;
        if (c.coupled) p = std::abs(theta[i]), G = ga + c.wd * p;
        else p = std::abs(theta[i] * c.shrink), G = ga;
        all = all && p < quarter && G < quarter && k * (mb + a1 * G) < r;
    }
    return all;
}

template bool adam_kernel<false, float>(const AdamCoefficients<float>&, float*, float*, float*, const float*, index_t, float*);
template bool adam_kernel<true, float>(const AdamCoefficients<float>&, float*, float*, float*, const float*, index_t, float*);
template bool adam_kernel<false, double>(const AdamCoefficients<double>&, double*, double*, double*, const double*, index_t, double*);
template bool adam_kernel<true, double>(const AdamCoefficients<double>&, double*, double*, double*, const double*, index_t, double*);
template bool adam_bound_kernel<float>(const AdamCoefficients<float>&, float, const float*, const float*, index_t);
template bool adam_bound_kernel<double>(const AdamCoefficients<double>&, double, const double*, const double*, index_t);
}  // namespace FT_CPU_NS

#ifndef FT_CPU_LEVEL_ONLY
#if defined(FT_CPU_DISPATCH)
namespace cpu_v3 {
template <bool Apply, class T>
bool adam_kernel(const AdamCoefficients<T>& c, T* theta, T* M, T* V, const T* g, index_t n, T* m_max);
template <class T>
bool adam_bound_kernel(const AdamCoefficients<T>& c, T m_max, const T* theta, const T* g, index_t n);
}
namespace cpu_v4 {
template <bool Apply, class T>
bool adam_kernel(const AdamCoefficients<T>& c, T* theta, T* M, T* V, const T* g, index_t n, T* m_max);
template <class T>
bool adam_bound_kernel(const AdamCoefficients<T>& c, T m_max, const T* theta, const T* g, index_t n);
}
#endif
// the copies of the level cpu_level() chose
template <bool Apply, class T>
bool adam_kernel(const AdamCoefficients<T>& c, T* theta, T* M, T* V, const T* g, index_t n, T* m_max) {
    FT_CPU_CALL(adam_kernel<Apply, T>(c, theta, M, V, g, n, m_max))
}
template <class T>
bool adam_bound_kernel(const AdamCoefficients<T>& c, T m_max, const T* theta, const T* g, index_t n) {
    FT_CPU_CALL(adam_bound_kernel<T>(c, m_max, theta, g, n))
}

template <class T>
void adam_update(const AdamCoefficients<T>& c, T* theta, T* M, T* V, const T* g, index_t n) {
    T m_max;
    adam_kernel<true>(c, theta, M, V, g, n, &m_max);
}

template <class T>
bool adam_update_finite(const AdamCoefficients<T>& c, const T* theta, const T* M, const T* V, const T* g, index_t n) {
    // Apply = false never writes through these pointers
    return adam_kernel<false>(c, const_cast<T*>(theta), const_cast<T*>(M), const_cast<T*>(V), g, n, static_cast<T*>(nullptr));
}

template <class T>
bool adam_update_bounded(const AdamCoefficients<T>& c, T m_max, const T* theta, const T* g, index_t n) {
    return adam_bound_kernel(c, m_max, theta, g, n);
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
template void adam_update<float>(const AdamCoefficients<float>&, float*, float*, float*, const float*, index_t);
template void adam_update<double>(const AdamCoefficients<double>&, double*, double*, double*, const double*, index_t);
template bool adam_update_finite<float>(const AdamCoefficients<float>&, const float*, const float*, const float*, const float*, index_t);
template bool adam_update_finite<double>(const AdamCoefficients<double>&, const double*, const double*, const double*, const double*, index_t);
template bool adam_update_bounded<float>(const AdamCoefficients<float>&, float, const float*, const float*, index_t);
template bool adam_update_bounded<double>(const AdamCoefficients<double>&, double, const double*, const double*, index_t);
template double grad_norm<float>(const ParamStore<float>&, const float*);
template double grad_norm<double>(const ParamStore<double>&, const double*);
template void scale<float>(float*, index_t, float);
template void scale<double>(double*, index_t, double);

#endif  // FT_CPU_LEVEL_ONLY

}  // namespace ft
