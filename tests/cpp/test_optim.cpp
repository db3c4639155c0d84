// The fast kernels of the optimizers against the scalar loops kept beside them (optim.hpp).
#include "formal_transformers/optim.hpp"
#include "testing.hpp"

#include <cmath>
#include <vector>

using namespace ft;

namespace {
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
