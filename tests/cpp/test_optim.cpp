// The fast kernels of the optimizers against the scalar loop written here, term by term as optim.hpp's header
// comment writes Adam.
#include "formal_transformers/optim.hpp"
#include "testing.hpp"

#include <algorithm>
#include <cmath>
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
