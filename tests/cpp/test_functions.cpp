// softmax (over columns), GELU, ReLU: hand-checked values and derivatives vs finite differences.
#include <limits>

#include "formal_transformers/functions.hpp"
#include "testing.hpp"

using namespace ft;

TEST(Softmax, HandCheckedColumn) {
    // softmax([0, ln 2, ln 5]) = [1, 2, 5] / 8
    double a[3] = {0.0, std::log(2.0), std::log(5.0)};
    softmax_column(a, 3);
    EXPECT_NEAR(a[0], 1.0 / 8, 1e-15);
    EXPECT_NEAR(a[1], 2.0 / 8, 1e-15);
    EXPECT_NEAR(a[2], 5.0 / 8, 1e-15);
}

TEST(Softmax, IsOverColumnsAndShiftInvariant) {
    Matrix<double> A = {{1, 1000}, {2, 1001}, {3, 1002}};  // column 2 = column 1 + 999: same softmax, no overflow
    softmax_columns<double>(view(A));
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(A(i, 0), A(i, 1), 1e-15);
    EXPECT_NEAR(A(0, 0) + A(1, 0) + A(2, 0), 1.0, 1e-15);
}

TEST(Softmax, MinusInfinityGetsZeroWithoutNaN) {
    const double inf = std::numeric_limits<double>::infinity();
    for (int n : {3, 9, 17}) {  // tails and SIMD bodies
        std::vector<double> a(std::size_t(n), -inf);
        a[1] = 0.3;
        a[std::size_t(n - 1)] = 0.3;
        softmax_column(a.data(), n);
        for (int i = 0; i < n; ++i) {
            EXPECT_FALSE(std::isnan(a[std::size_t(i)]));
            EXPECT_EQ(a[std::size_t(i)], (i == 1 || i == n - 1) ? 0.5 : 0.0);
        }
    }
}

TEST(Softmax, NaNPropagatesToItsColumn) {
    std::vector<float> a = {1, std::numeric_limits<float>::quiet_NaN(), 2, 3, 4, 5, 6, 7, 8, 9};
    softmax_column(a.data(), index_t(a.size()));
    for (float x : a) EXPECT_TRUE(std::isnan(x));
}

TEST(Softmax, BackwardMatchesFiniteDifferences) {
    Rng rng(1);
    const index_t m = 11, n = 3;
    std::vector<double> A = fttest::randn(m * n, rng), W = fttest::randn(m * n, rng);
    auto loss = [&] {
        std::vector<double> P = A;
        softmax_columns<double>(MatView<double>(P.data(), m, n));
        return fttest::dot(P.data(), W.data(), m * n);
    };
    std::vector<double> P = A, dA = W;
    softmax_columns<double>(MatView<double>(P.data(), m, n));
    softmax_columns_backward<double>(CMatView<double>(P.data(), m, n), MatView<double>(dA.data(), m, n));
    auto num = fttest::numeric_grad(A.data(), m * n, loss);
    EXPECT_LT(fttest::rel_error(dA, num, dA.size()), 1e-6);
}

TEST(Gelu, HandCheckedValues) {
    // GELU(x) = x Φ(x): Φ(1) = 0.841344746068543, Φ(-1) = 0.158655253931457, Φ(2) = 0.977249868051821
    double x[5] = {-1, 0, 1, 2, 0.5}, y[5];
    gelu(x, y, 5, Gelu::Exact);
    EXPECT_NEAR(y[0], -0.158655253931457, 1e-14);
    EXPECT_EQ(y[1], 0.0);
    EXPECT_NEAR(y[2], 0.841344746068543, 1e-14);
    EXPECT_NEAR(y[3], 2 * 0.977249868051821, 1e-14);
    EXPECT_NEAR(y[4], 0.5 * 0.691462461274013, 1e-14);
}

TEST(Gelu, TanhApproximationIsCloseButNotExact) {
    double x[3] = {-1, 1, 3}, e[3], t[3];
    gelu(x, e, 3, Gelu::Exact);
    gelu(x, t, 3, Gelu::Tanh);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(e[i], t[i], 1e-3);
    EXPECT_GT(std::abs(e[0] - t[0]), 1e-6);
}

TEST(Activations, DerivativesMatchFiniteDifferences) {
    Rng rng(2);
    const index_t n = 37;  // SIMD body and tail
    std::vector<double> x = fttest::randn(n, rng, 2.0), w = fttest::randn(n, rng);
    for (Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::Relu}) {
        auto loss = [&] {
            std::vector<double> y(static_cast<std::size_t>(n));
            activation_forward<double>(a, CMatView<double>(x.data(), n, 1), MatView<double>(y.data(), n, 1));
            return fttest::dot(y.data(), w.data(), n);
        };
        std::vector<double> dx(static_cast<std::size_t>(n));
        activation_backward<double>(a, CMatView<double>(x.data(), n, 1), CMatView<double>(w.data(), n, 1),
                                    MatView<double>(dx.data(), n, 1));
        auto num = fttest::numeric_grad(x.data(), n, loss);
        EXPECT_LT(fttest::rel_error(dx, num, dx.size()), 1e-6) << int(a);
    }
}

TEST(Relu, ValuesAndSubgradientAtZero) {
    double x[4] = {-2, 0, 3, -0.0}, y[4], dx[4], dy[4] = {1, 1, 1, 1};
    relu(x, y, 4);
    relu_backward(x, dy, dx, 4);
    EXPECT_EQ(y[0], 0);
    EXPECT_EQ(y[1], 0);
    EXPECT_EQ(y[2], 3);
    EXPECT_EQ(dx[1], 0);
    EXPECT_EQ(dx[2], 1);
}
