// The fast kernels of the optimizers against the scalar loop written here, term by term as optim.hpp's header
// comment writes Adam.
#include "formal_transformers/optim.hpp"
#include "testing.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace ft;

namespace {
// Adam's update of n entries, one element at a time (the reference the vectorised kernel is checked against).
template <class T>
void adam_update_naive(const AdamCoefficients<T>& c, T* theta, T* M, T* V, const T* g, index_t n) {
    for (index_t i = 0; i < n; ++i) {
        T gi = g[i], th = theta[i];
        if (c.coupled) gi += c.wd * th;                      // L2: g ← g + λθ
        else th *= c.shrink;                                 // AdamW: θ ← θ(1 − ηλ)
        M[i] = M[i] * c.b1 + (T(1) - c.b1) * gi;             // m ← β₁m + (1−β₁)g
        V[i] = V[i] * c.b2 + (T(1) - c.b2) * gi * gi;        // v ← β₂v + (1−β₂)g²
        theta[i] = th - c.step_size * (M[i] / (std::sqrt(V[i]) / c.bc2_sqrt + c.eps));  // θ ← θ − η m̂/(√v̂ + ε)
    }
}

// Adam's vectorised update vs the naive loop: several steps on random θ, g (lengths that leave a scalar
// tail), coupled and decoupled decay, within a few units in the last place.
template <class T>
void check_adam_update(bool coupled, double wd) {
    Rng rng(coupled ? 7 : 8);
    for (index_t n : {1, 7, 16, 33, 1000}) {
        const std::size_t len = static_cast<std::size_t>(n);
        std::vector<T> th1(len), m1(len, T(0)), v1(len, T(0)), g(len);
        for (auto& x : th1) x = T(rng.normal());
        std::vector<T> th2 = th1, m2 = m1, v2 = v1;
        for (int t = 1; t <= 3; ++t) {
            for (auto& x : g) x = T(rng.normal());
            AdamCoefficients<T> c;
            c.b1 = T(0.9), c.b2 = T(0.99), c.eps = T(1e-8), c.wd = T(wd);
            c.bc2_sqrt = T(std::sqrt(1.0 - std::pow(0.99, t)));
            c.step_size = T(1e-2) / (T(1) - T(std::pow(0.9, t)));
            c.shrink = T(1) - T(1e-2) * c.wd;
            c.coupled = coupled;
            adam_update<T>(c, th1.data(), m1.data(), v1.data(), g.data(), n);
            adam_update_naive<T>(c, th2.data(), m2.data(), v2.data(), g.data(), n);
        }
        const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
        EXPECT_LT(fttest::rel_error(th1.data(), th2.data(), th1.size()), tol) << "n " << n;
        EXPECT_LT(fttest::rel_error(m1.data(), m2.data(), m1.size()), tol) << "n " << n;
        EXPECT_LT(fttest::rel_error(v1.data(), v2.data(), v1.size()), tol) << "n " << n;
    }
}
}  // namespace

TEST(Optim, AdamUpdateMatchesNaiveLoop) {
    for (bool coupled : {false, true})
        for (double wd : {0.0, 0.1}) {
            check_adam_update<float>(coupled, wd);
            check_adam_update<double>(coupled, wd);
        }
}

// Adam::step over a store whose trainable ranges exceed one 16 K chunk and the threads' threshold (32768
// entries; optim.cpp: chunks split over the pool), with a frozen range between them: on 1 and 2 threads the
// same θ, m and v as the scalar loop over each whole range, three steps with decay; the frozen range is
// untouched. (SGD, grad_norm and scale run one loop with OpenMP's `if` clause: both sizes, one body.)
TEST(Optim, AdamStepOverLargeStoresMatchesNaiveLoop) {
    for (int threads : {1, 2}) {
        ParamStore<double> store;
        store.vector("a", 3 * 16384 + 37);
        const VecParam f = store.vector("f", 100);
        store.vector("b", 40000);
        store.freeze(f.offset);
        store.allocate();
        Rng rng(41);
        for (index_t i = 0; i < store.size(); ++i) store.theta()[i] = rng.normal();
        const std::size_t n = std::size_t(store.size());
        std::vector<double> th(store.theta(), store.theta() + n), m(n, 0.0), v(n, 0.0), g(n);
        Adam<double> adam(1e-2, 0.9, 0.99, 1e-8, 0.1, true);
        const int saved = get_num_threads();
        for (int t = 1; t <= 3; ++t) {
            for (auto& x : g) x = rng.normal();
            set_num_threads(threads);
            adam.step(store, g.data());
            set_num_threads(saved);
            AdamCoefficients<double> c;
            c.b1 = 0.9, c.b2 = 0.99, c.eps = 1e-8, c.wd = 0.1;
            c.bc2_sqrt = std::sqrt(1.0 - std::pow(0.99, t));
            c.step_size = 1e-2 / (1.0 - std::pow(0.9, t));
            c.shrink = 1.0 - 1e-2 * 0.1;
            c.coupled = false;
            for (const auto& r : store.trainable_ranges())
                adam_update_naive<double>(c, th.data() + r.first, m.data() + r.first, v.data() + r.first,
                                          g.data() + r.first, r.second - r.first);
        }
        ASSERT_EQ(store.trainable_ranges().size(), 2u);
        EXPECT_LT(fttest::rel_error(store.theta(), th.data(), n), 1e-14) << "threads " << threads;
        // the moments exist for the trainable ranges only, one after the other (the frozen f has none)
        std::vector<double> mc, vc;
        for (const auto& r : store.trainable_ranges()) {
            mc.insert(mc.end(), m.begin() + r.first, m.begin() + r.second);
            vc.insert(vc.end(), v.begin() + r.first, v.begin() + r.second);
        }
        ASSERT_EQ(std::size_t(adam.m.size()), mc.size());
        ASSERT_EQ(adam.ranges, store.trainable_ranges());
        EXPECT_LT(fttest::rel_error(adam.m.data(), mc.data(), mc.size()), 1e-14) << "threads " << threads;
        EXPECT_LT(fttest::rel_error(adam.v.data(), vc.data(), vc.size()), 1e-14) << "threads " << threads;
        for (index_t i = 0; i < f.size; ++i) ASSERT_EQ(store.theta()[f.offset + i], th[std::size_t(f.offset + i)]);
    }
}
// Issue 27: the hyperparameters are finite and in range (ε = 0 made 0/0 where a gradient entry is zero).
TEST(Optim, HyperparametersAreFiniteAndEpsPositive) {
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    EXPECT_THROW((Adam<double>(1e-3, 0.9, 0.999, 0.0)), ValueError);
    EXPECT_THROW((Adam<double>(1e-3, 0.9, 0.999, inf)), ValueError);
    EXPECT_THROW((Adam<double>(1e-3, 0.9, 0.999, nan)), ValueError);
    EXPECT_THROW((Adam<double>(1e-3, 0.9, 0.999, 1e-8, inf)), ValueError);
    EXPECT_THROW((Adam<double>(inf)), ValueError);
    EXPECT_THROW((Adam<float>(1e-3, 0.9, 0.999, 1e-60)), ValueError);  // 0 in float32
    EXPECT_NO_THROW((Adam<double>(1e-3, 0.9, 0.999, 1e-60)));
    EXPECT_THROW((SGD<double>(inf)), ValueError);
}

namespace {
// A store of n trainable entries, θ_i = 0.5 (i even) or 0 (i odd)
template <class T>
void fill_store(ParamStore<T>& s, index_t n) {
    s.vector("w", n);
    s.allocate();
    for (index_t i = 0; i < n; ++i) s.theta()[i] = i % 2 ? T(0) : T(0.5);
}
}  // namespace

// A step whose result would hold a NaN or an inf writes nothing (θ, m, v, t), and says so; the same
// optimizer then takes a good step as its first. Lengths cross the parallel threshold (32768) and the
// vector width; the bad entry sits in the scalar tail or in a middle chunk.
TEST(Optim, AStepThatWouldMakeThetaNonFiniteChangesNothing) {
    for (index_t n : {index_t(7), index_t(70001)}) {
        ParamStore<double> s;
        fill_store(s, n);
        const std::vector<double> theta0(s.theta(), s.theta() + n);
        std::vector<double> g(static_cast<std::size_t>(n), 1.0);
        // Adam: 1 − ηλ = −inf (η, λ finite): θ·(−inf)
        Adam<double> adam(1e300, 0.9, 0.999, 1e-8, 1e300);
        EXPECT_THROW(adam.step(s, g.data()), NonFiniteUpdate);
        EXPECT_EQ(adam.t, 0);
        EXPECT_TRUE(std::equal(theta0.begin(), theta0.end(), s.theta()));
        // one entry's gradient overflows θ − η g in SGD
        g[static_cast<std::size_t>(n - 1) / 2] = 1e300;
        EXPECT_THROW(SGD<double>(1e10).step(s, g.data()), NonFiniteUpdate);
        EXPECT_TRUE(std::equal(theta0.begin(), theta0.end(), s.theta()));
        // a good step applies, and equals the kernel's own result
        Adam<double> good(1e-2);
        g[static_cast<std::size_t>(n - 1) / 2] = 1.0;
        good.step(s, g.data());
        EXPECT_EQ(good.t, 1);
        for (index_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(s.theta()[i]));
        EXPECT_NEAR(s.theta()[0], 0.5 - 1e-2 / (1 + 1e-8), 1e-15);  // m̂/(√v̂ + ε) = 1/(1 + ε) at the first step
    }
}

// ε > 0 keeps rows with zero gradient finite (with ε = 0 they were 0/0 = NaN).
TEST(Optim, ZeroGradientRowsStayFinite) {
    ParamStore<float> s;
    fill_store(s, 100);
    std::vector<float> g(100, 0.0f);
    Adam<float> adam(1e-3);
    adam.step(s, g.data());
    for (index_t i = 0; i < 100; ++i) EXPECT_TRUE(std::isfinite(s.theta()[i]));
    std::vector<float> th(100), m(100, 0.f), v(100, 0.f);
    AdamCoefficients<float> c{0.9f, 0.999f, 0.0f, 0.0f, 1.0f, 1e-3f, 1.0f, false};  // ε = 0 as the kernel sees it
    EXPECT_FALSE(adam_update_finite<float>(c, th.data(), m.data(), v.data(), g.data(), 100));
    c.eps = 1e-8f;
    EXPECT_TRUE(adam_update_finite<float>(c, th.data(), m.data(), v.data(), g.data(), 100));
}

// ---------------------------------------------------------------------------------------------------------------
// The all-or-nothing check from θ and g against the bounds of the last writing pass (optim.cpp): the bounds are
// what the moments hold, a chunk the bounds cannot clear falls back to the update computed and not written, and
// the bound test never passes a non-finite update.
namespace {
// Adam(lr, β 0.9/0.999, ε 1e-8, λ wd, decoupled) on a store of n trainable entries θ_i = 0.5 / 0 (fill_store),
// stepped once with g = 0.01 so that m and v are not zero and the bounds are the writing pass's
template <class T>
struct Stepped {
    ParamStore<T> s;
    Adam<T> adam;
    std::vector<T> g;
    Stepped(index_t n, double lr, double wd = 0.1, bool decoupled = true)
        : adam(lr, 0.9, 0.999, 1e-8, wd, decoupled), g(std::size_t(n), T(0.01)) {
        fill_store(s, n);
        adam.step(s, g.data());
    }
    // θ, m, v, t as they are now
    struct State {
        std::vector<T> theta, m, v;
        index_t t;
        bool operator==(const State& o) const { return bits(theta, o.theta) && bits(m, o.m) && bits(v, o.v) && t == o.t; }
        static bool bits(const std::vector<T>& a, const std::vector<T>& b) {
            return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
        }
    };
    State state() const {
        return {std::vector<T>(s.theta(), s.theta() + s.size()), std::vector<T>(adam.m.begin(), adam.m.end()),
                std::vector<T>(adam.v.begin(), adam.v.end()), adam.t};
    }
    // the state one step with g would give: adam_update (the same kernel) on copies
    State expected(double lr_now = -1) const {
        State e = state();
        const double eta = lr_now >= 0 ? lr_now : adam.lr;
        const index_t t1 = adam.t + 1;
        AdamCoefficients<T> c;
        c.b1 = T(adam.beta1), c.b2 = T(adam.beta2), c.eps = T(adam.eps), c.wd = T(adam.weight_decay);
        c.bc2_sqrt = T(std::sqrt(1.0 - std::pow(adam.beta2, double(t1))));
        c.step_size = T(eta) / (T(1) - T(std::pow(adam.beta1, double(t1))));
        c.shrink = T(1) - T(eta) * c.wd;
        c.coupled = !adam.decoupled && adam.weight_decay != 0;
        adam_update<T>(c, e.theta.data(), e.m.data(), e.v.data(), g.data(), s.size());
        e.t = t1;
        return e;
    }
};

template <class T>
T max_abs(const Vector<T>& x) {
    T r = T(0);
    for (T a : x) r = std::max(r, std::abs(a));
    return r;
}
}  // namespace

// The writing pass's bounds are max |m_i| exactly and "every m_i, v_i finite, v_i >= 0", over the vector body
// and the scalar tail, one chunk or several (above 32768 entries: over the threads; 1 and 2 threads); reset() and
// moments_changed() drop them.
template <class T>
void check_bounds_gathered(int threads) {
    const int saved = get_num_threads();
    set_num_threads(threads);
    struct Restore {
        int n;
        ~Restore() { set_num_threads(n); }
    } restore{saved};
    for (index_t n : {index_t(7), index_t(33), index_t(70001)}) {
        Stepped<T> a(n, 1e-2);
        Rng rng(5);
        for (auto& x : a.g) x = T(rng.normal());
        a.g[std::size_t(n - 1)] = T(40);  // the largest |m| in the scalar tail
        a.adam.step(a.s, a.g.data());
        ASSERT_TRUE(a.adam.bounds.valid) << n;
        EXPECT_EQ(a.adam.bounds.m_max, max_abs(a.adam.m)) << n;
        EXPECT_EQ(a.adam.bounds.m_max, std::abs(a.adam.m[std::size_t(n - 1)])) << n;
        EXPECT_EQ(a.adam.bounds.m_at, a.adam.m.data());
        a.g[std::size_t(n / 2)] = T(-80);  // now in the middle (a vector, or a middle chunk)
        a.adam.step(a.s, a.g.data());
        EXPECT_EQ(a.adam.bounds.m_max, max_abs(a.adam.m)) << n;
        EXPECT_EQ(a.adam.bounds.m_max, std::abs(a.adam.m[std::size_t(n / 2)])) << n;
        a.adam.moments_changed();
        EXPECT_FALSE(a.adam.bounds.valid);
        a.adam.step(a.s, a.g.data());
        EXPECT_TRUE(a.adam.bounds.valid);
        a.adam.reset();
        EXPECT_FALSE(a.adam.bounds.valid);
        a.adam.step(a.s, a.g.data());  // a first step again: zero moments, bounded, then the pass's
        EXPECT_TRUE(a.adam.bounds.valid);
        EXPECT_EQ(a.adam.bounds.m_max, max_abs(a.adam.m)) << n;
    }
    // a v_i of +inf (g² overflows; θ_i still finite: m/∞ = 0) leaves the moments unbounded
    Stepped<T> a(40, 1e-2);
    a.g[39] = std::sqrt(std::numeric_limits<T>::max()) * T(1e3);
    a.adam.step(a.s, a.g.data());
    EXPECT_TRUE(std::isinf(a.adam.v[39]));
    EXPECT_FALSE(a.adam.bounds.valid);
    a.g[39] = T(0.01);
    const auto e = a.expected();
    a.adam.step(a.s, a.g.data());  // the exact check: θ_39 stays finite
    EXPECT_TRUE(a.state() == e);
}
TEST(Optim, AdamBoundsAreWhatTheMomentsHold) {
    for (int threads : {1, 2}) {
        check_bounds_gathered<float>(threads);
        check_bounds_gathered<double>(threads);
    }
}

// A chunk whose bound test fails while its update is finite: the exact check clears it and the step applies,
// the same bits as the kernel on copies. θ near the largest finite value (|θ| > max/4), in the scalar tail, a
// vector, and the last entry of 70001; L2 and decoupled decay.
template <class T>
void check_fallback_updates() {
    const T big = std::numeric_limits<T>::max() * T(0.99);
    for (bool decoupled : {true, false})
        for (index_t n : {index_t(7), index_t(64), index_t(70001)}) {
            Stepped<T> a(n, 1e-2, decoupled ? 0.1 : 1e-30, decoupled);
            ASSERT_TRUE(a.adam.bounds.valid);
            a.s.theta()[n - 1] = big;
            a.s.theta()[0] = -big;
            EXPECT_FALSE(adam_update_bounded<T>(AdamCoefficients<T>{T(0.9), T(0.999), T(1e-8), T(0.1), T(1), T(0.1), T(1), false},
                                                a.adam.bounds.m_max, a.s.theta(), a.g.data(), n));
            const auto e = a.expected();
            ASSERT_TRUE(std::isfinite(e.theta[std::size_t(n - 1)]));
            a.adam.step(a.s, a.g.data());
            EXPECT_TRUE(a.state() == e) << n << " decoupled " << decoupled;
        }
}
TEST(Optim, AdamFallsBackToTheExactCheckWhereTheBoundFails) {
    check_fallback_updates<float>();
    check_fallback_updates<double>();
}

// Non-finite updates are refused with the bounds in use: a NaN or inf in the last gradient entry (the scalar tail,
// the last chunk), θ near the largest finite value pushed over it by the step, and moments written from outside
// (moments_changed(), or a new buffer) that the old bounds would have cleared. θ, m, v, t and θ's bf16 copy
// stay as they were; a good step then applies.
template <class T>
void check_refusals() {
    const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN(),
            top = std::numeric_limits<T>::max();
    for (index_t n : {index_t(7), index_t(33), index_t(70001)}) {
        for (T bad : {nan, inf, -inf}) {
            Stepped<T> a(n, 1e-2);
            Bf16Weights copy;
            if constexpr (std::is_same_v<T, float>) {
                copy.refresh(a.s.theta(), a.s.size());
                a.adam.bf16_copy = &copy;
            }
            const auto bits = copy.bits;
            ASSERT_TRUE(a.adam.bounds.valid);
            const auto before = a.state();
            a.g[std::size_t(n - 1)] = bad;
            EXPECT_THROW(a.adam.step(a.s, a.g.data()), NonFiniteUpdate) << n;
            EXPECT_TRUE(a.state() == before) << n;
            EXPECT_EQ(copy.bits, bits);
            a.g[std::size_t(n - 1)] = T(0.01);
            const auto e = a.expected();
            a.adam.step(a.s, a.g.data());
            EXPECT_TRUE(a.state() == e) << n;
        }
        // θ_i near the largest value and the step pushes it over (η̂ m̂/(√v̂ + ε) ≈ −1 at the first step): refused;
        // the other way the step applies (the fallback)
        for (T sign : {T(1), T(-1)}) {
            ParamStore<T> s;
            fill_store(s, n);
            s.theta()[n - 1] = top * T(0.99);
            std::vector<T> g(std::size_t(n), T(0));
            g[std::size_t(n - 1)] = sign;
            Adam<T> adam(double(top) * 0.05);
            const std::vector<T> theta0(s.theta(), s.theta() + n);
            if (sign < 0) {
                EXPECT_THROW(adam.step(s, g.data()), NonFiniteUpdate) << n;
                EXPECT_TRUE(std::equal(theta0.begin(), theta0.end(), s.theta()));
                EXPECT_EQ(adam.t, 0);
            } else {
                adam.step(s, g.data());
                EXPECT_EQ(adam.t, 1);
                EXPECT_TRUE(std::isfinite(s.theta()[n - 1]));
                EXPECT_LT(s.theta()[n - 1], theta0[std::size_t(n - 1)]);
            }
        }
        // moments written from outside: m_k = max/10, v_k = 0 with g = 0 make η̂ m/ε overflow; the bounds of the
        // writing pass (a small max |m|) would clear it
        for (bool replace : {false, true}) {
            Stepped<T> a(n, 1e-2);
            std::fill(a.g.begin(), a.g.end(), T(0));
            ASSERT_TRUE(a.adam.bounds.valid);
            ASSERT_LT(a.adam.bounds.m_max, T(1));
            const index_t k = n / 2;
            if (replace) {
                Vector<T> m2 = Vector<T>::from_shape({std::size_t(n)});
                std::copy(a.adam.m.begin(), a.adam.m.end(), m2.begin());
                m2[std::size_t(k)] = top / 10;
                a.adam.m = std::move(m2);  // another buffer: the old bounds are not its
            } else {
                a.adam.m[std::size_t(k)] = top / 10;
                a.adam.moments_changed();
            }
            a.adam.v[std::size_t(k)] = T(0);
            const auto before = a.state();
            EXPECT_THROW(a.adam.step(a.s, a.g.data()), NonFiniteUpdate) << n << " replace " << replace;
            EXPECT_TRUE(a.state() == before);
            a.adam.m[std::size_t(k)] = T(0);
            const auto e = a.expected();
            a.adam.step(a.s, a.g.data());
            EXPECT_TRUE(a.state() == e);
            EXPECT_TRUE(a.adam.bounds.valid);
        }
    }
}
TEST(Optim, AdamRefusesNonFiniteUpdatesWithBounds) {
    check_refusals<float>();
    check_refusals<double>();
}

// The bound test is sound: wherever it passes, the exact kernel finds every updated θ_i finite for moments at the
// bound (m_i = ±m_max, v_i from 0 to the largest finite value). Random θ, g, m_max and coefficients around the
// test's limits (max/4, ε·max/4), both decays, η̂ from 0 to huge.
template <class T>
void check_bound_is_sound() {
    const T top = std::numeric_limits<T>::max();
    Rng rng(11);
    auto around = [&](T x) { return x * T(std::exp2(6 * rng.uniform() - 3)); };  // x · [1/8, 8)
    int passed = 0;
    for (int trial = 0; trial < 4000; ++trial) {
        AdamCoefficients<T> c;
        c.b1 = T(rng.uniform() < 0.2 ? 0.0 : 0.9 + 0.0999 * rng.uniform());
        c.b2 = T(rng.uniform() < 0.2 ? 0.0 : 0.999);
        c.eps = T(std::exp2(44 * rng.uniform() - 40));
        c.wd = T(rng.uniform() < 0.5 ? 0.0 : std::exp2(20 * rng.uniform() - 10));
        c.coupled = rng.uniform() < 0.5;
        c.step_size = T(rng.uniform() < 0.1 ? 0.0 : around(T(std::exp2(60 * rng.uniform() - 30))));
        c.shrink = T(1) - c.step_size * c.wd;
        c.bc2_sqrt = T(std::sqrt(1 - std::pow(double(c.b2), 1 + rng.below(5))));
        // m_max and |g| around the test's limit ε·max/(4 max(η̂, ε, 1))
        const T scale = c.eps * (top / 4) / std::max(std::max(c.step_size, c.eps), T(1));
        const T m_max = rng.uniform() < 0.2 ? T(0) : around(scale);
        const index_t n = 37;
        std::vector<T> th(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n));
        for (index_t i = 0; i < n; ++i) th[std::size_t(i)] = T(rng.normal()), g[std::size_t(i)] = T(rng.normal());
        const std::size_t p = std::size_t(rng.below(std::uint64_t(n)));  // one entry near the limits (a vector or the tail)
        th[p] = (rng.uniform() < 0.5 ? T(-1) : T(1)) * (rng.uniform() < 0.5 ? around(top / 4) : T(1));
        g[p] = (rng.uniform() < 0.5 ? T(-1) : T(1)) * (rng.uniform() < 0.7 ? around(scale) : T(1));
        if (!adam_update_bounded<T>(c, m_max, th.data(), g.data(), n)) continue;
        ++passed;
        for (T ms : {m_max, -m_max})
            for (T vv : {T(0), T(1e-30), top}) {
                std::vector<T> m(static_cast<std::size_t>(n), ms), v(static_cast<std::size_t>(n), vv);
                ASSERT_TRUE(adam_update_finite<T>(c, th.data(), m.data(), v.data(), g.data(), n))
                    << "trial " << trial << " m " << ms << " v " << vv;
            }
    }
    EXPECT_GT(passed, 400);  // the trials reach the limits from both sides
}
TEST(Optim, AdamBoundTestNeverPassesANonFiniteUpdate) {
    check_bound_is_sound<float>();
    check_bound_is_sound<double>();
}
