// softmax (over columns), GELU, ReLU: hand-checked values and derivatives vs finite differences.
#include <cstdint>
#include <cstring>
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

// exp_values (the exp under softmax and the tiled attention): float32 within 2 ulp of std::exp over the whole
// range (every 499th float from −104 to 88.37, xsimd's overflow bound being 88.376, then the specials); float64
// within 1e-15 relative. Denormal results are compared in absolute terms (the core runs with flush-to-zero: 0 is
// then the right answer too).
namespace {
double ulps_from(float got, double want) {
    if (want == 0.0 || std::fabs(want) < double(std::numeric_limits<float>::min()))  // zero or denormal: absolute, in units of the least denormal
        return std::fabs(double(got) - want) / double(std::numeric_limits<float>::denorm_min()) > 2.0 &&
                       !(got == 0.0f || std::fabs(got) < std::numeric_limits<float>::min())
                   ? 1e9
                   : 0.0;
    const float w = float(want);
    const double ulp = double(std::nextafter(w, std::numeric_limits<float>::infinity()) - w);
    return std::fabs(double(got) - want) / ulp;
}
}  // namespace

TEST(Exp, Float32WithinTwoUlpOfStdExpOverTheWholeRange) {
    std::vector<float> x;
    auto bits_of = [](float f) { std::uint32_t u; std::memcpy(&u, &f, 4); return u; };
    auto from_bits = [](std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; };
    for (std::uint32_t u = 0; u <= bits_of(88.37f); u += 499) x.push_back(from_bits(u));  // every 499th float of [0, 88.37]
    for (std::uint32_t u = bits_of(-0.0f); u <= bits_of(-104.0f); u += 499) x.push_back(from_bits(u));  // and of [−104, −0]
    for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.37f, -87.33654f, -87.3366f, -103.97f, -103.98f})
        x.push_back(v);
    ASSERT_GT(x.size(), std::size_t(1000000));
    for (std::size_t off : {std::size_t(0), std::size_t(3)}) {  // SIMD bodies and scalar tails
        std::vector<float> y(x.size() - off);
        exp_values<float>(x.data() + off, y.data(), index_t(y.size()));
        double worst = 0;
        float at = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
            const double u = ulps_from(y[i], std::exp(double(x[i + off])));
            if (u > worst) worst = u, at = x[i + off];
        }
        EXPECT_LE(worst, 2.0) << "at x = " << at;
    }
}

TEST(Exp, Float32Specials) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const float x[11] = {-inf, inf, nan, 89.0f, 1e30f, -1e30f, -200.0f, 0.0f, 1.0f, -1.0f, -105.0f};
    float y[11];
    for (index_t n : {index_t(11), index_t(1)}) {  // 8 in a SIMD body + tail, and the tail alone
        exp_values<float>(x, y, n);
        EXPECT_EQ(y[0], 0.0f);  // exp(−∞) = 0 exactly (masked entries)
        if (n == 1) continue;
        EXPECT_EQ(y[1], inf);
        EXPECT_TRUE(std::isnan(y[2]));
        EXPECT_EQ(y[3], inf);  // overflow
        EXPECT_EQ(y[4], inf);
        EXPECT_EQ(y[5], 0.0f);
        EXPECT_EQ(y[6], 0.0f);
        EXPECT_EQ(y[7], 1.0f);  // exact at 0
        EXPECT_NEAR(y[8], 2.718281828f, 2e-7f);
        EXPECT_NEAR(y[9], 0.367879441f, 5e-8f);
        EXPECT_EQ(y[10], 0.0f);
    }
    float z[3] = {nan, 0.0f, -inf};  // tails alone (n < the SIMD width)
    exp_values<float>(z, z, 3);
    EXPECT_TRUE(std::isnan(z[0]));
    EXPECT_EQ(z[1], 1.0f);
    EXPECT_EQ(z[2], 0.0f);
}

TEST(Exp, Float64WithinOneEMinus15AndShiftSum) {
    std::vector<double> x;
    for (double v = -700; v < 700; v += 0.37) x.push_back(v);
    std::vector<double> y(x.size());
    exp_values<double>(x.data(), y.data(), index_t(x.size()));
    for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i] / std::exp(x[i]), 1.0, 1e-15) << x[i];
    // exp_shift: a ← exp(a − m), Σ returned; −∞ → 0 exactly
    const double inf = std::numeric_limits<double>::infinity();
    double a[9] = {1.0, -inf, 2.0, 0.5, -inf, 3.0, 2.5, 1.5, 0.0};
    const double m = column_max(a, 9);
    EXPECT_EQ(m, 3.0);
    const double s = exp_shift(a, 9, m);
    double want = 0;
    for (double v : {1.0, 2.0, 0.5, 3.0, 2.5, 1.5, 0.0}) want += std::exp(v - 3.0);
    EXPECT_NEAR(s, want, 1e-15 * want);
    EXPECT_EQ(a[1], 0.0);
    EXPECT_EQ(a[4], 0.0);
    EXPECT_NEAR(a[0], std::exp(-2.0), 1e-16);
    double b[3] = {1.0, std::numeric_limits<double>::quiet_NaN(), 2.0};
    EXPECT_TRUE(std::isnan(column_max(b, 3)));
}
