// Decoder variants (docs/variants.md): cached decoding with RoPE and ALiBi past ℓ_max equals the full forward
// of the same θ (a model with a larger ℓ_max: without W_p, ℓ_max does not change θ); the kernels' backward
// passes are their forward's transposes.
#include <cmath>
#include <limits>

#include "formal_transformers/transformers.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
using fttest::perturb;
ModelConfig variant(const std::string& pos, index_t l_max) { return fttest::llama_like(pos, l_max); }
}  // namespace

TEST(Variants, CachedDecodingPastLmaxEqualsTheFullForward) {
    for (const char* pos : {"rope", "alibi"}) {
        DTransformer<double> small(variant(pos, 4)), big(variant(pos, 12));
        ASSERT_EQ(small.store.size(), big.store.size());
        perturb(small.store);
        perturb(big.store);
        for (index_t i = 0; i < big.store.size(); ++i) ASSERT_EQ(small.store.theta()[i], big.store.theta()[i]);
        std::vector<index_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 3};
        const Matrix<double> Z = fttest::full_logits(big, ids);
        DTransformer<double>::Decoder d;
        std::vector<double> z(11);
        small.decode(d, ids.data(), 3, z.data());  // a prompt of 3, then one token at a time up to 3 ℓ_max
        for (index_t v = 0; v < 11; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, 2), 1e-12);
        for (index_t t = 3; t < 12; ++t) {
            small.decode(d, ids.data() + t, 1, z.data());
            for (index_t v = 0; v < 11; ++v) EXPECT_NEAR(z[std::size_t(v)], Z(v, t), 1e-12) << "position " << t;
        }
    }
}

TEST(Variants, LearnedPositionsStillStopAtLmax) {
    ModelConfig c = variant("learned", 4);
    DTransformer<double> m(c);
    DTransformer<double>::Decoder d;
    std::vector<index_t> ids = {1, 2, 3, 4, 5};
    std::vector<double> z(11);
    m.decode(d, ids.data(), 4, z.data());
    EXPECT_THROW(m.decode(d, ids.data() + 4, 1, z.data()), ValueError);
}

// The xtensor API checks inputs by the model's rule (max_input_length): RoPE and ALiBi score 3 ℓ_max tokens,
// equal to a model of the same θ whose ℓ_max covers them; learned positions refuse them
TEST(Variants, ScoringPastLmaxEqualsTheModelWithALargerLmax) {
    const TokenIds x{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 3};
    for (const char* pos : {"rope", "alibi"}) {
        DTransformer<double> small(variant(pos, 4)), big(variant(pos, 12));
        perturb(small.store);
        perturb(big.store);
        EXPECT_EQ(max_input_length(small.cfg), std::numeric_limits<index_t>::max());
        xt::xtensor<double, 2> P = small(x), Pb = big(x);
        ASSERT_EQ(P.shape(1), 12u);
        for (std::size_t i = 0; i < P.size(); ++i) ASSERT_EQ(P.data()[i], Pb.data()[i]);
        EXPECT_EQ(small.loss_and_grad(x), big.loss_and_grad(x));
        for (index_t i = 0; i < small.store.size(); ++i) ASSERT_EQ(small.store.grad()[i], big.store.grad()[i]);
    }
    for (const char* pos : {"learned", "sinusoidal"}) {
        DTransformer<double> m(variant(pos, 4));
        EXPECT_EQ(max_input_length(m.cfg), 4);
        EXPECT_THROW(m(x), ValueError);
        EXPECT_THROW(m.loss(x), ValueError);
    }
}

TEST(Variants, RopeBackwardIsTheTransposeAndPreservesNorms) {
    const index_t d = 6, heads = 2, n = 5;
    std::vector<double> x(std::size_t(d * heads * n)), y(x.size()), g(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(double(i)), g[i] = std::sin(1.3 * double(i));
    std::vector<index_t> pos = {0, 7, 2, 40, 1000};
    y = x;
    rope<double>(MatView<double>(y.data(), d * heads, n), heads, d, pos.data(), 10000.0);
    double nx = 0, ny = 0;
    for (std::size_t i = 0; i < x.size(); ++i) nx += x[i] * x[i], ny += y[i] * y[i];
    EXPECT_NEAR(nx, ny, 1e-12 * nx);  // a rotation
    // ⟨R y', g⟩ = ⟨y', Rᵀ g⟩ : backward (inverse = true) is the adjoint
    std::vector<double> gt = g;
    rope<double>(MatView<double>(gt.data(), d * heads, n), heads, d, pos.data(), 10000.0, true);
    double a = 0, b = 0;
    for (std::size_t i = 0; i < x.size(); ++i) a += y[i] * g[i], b += x[i] * gt[i];
    EXPECT_NEAR(a, b, 1e-12 * std::abs(a) + 1e-14);
    rope<double>(MatView<double>(y.data(), d * heads, n), heads, d, pos.data(), 10000.0, true);  // R(p)ᵀ R(p) = 1
    for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-14);
}

TEST(Variants, AlibiSlopes) {
    std::vector<double> m8 = alibi_slopes(8), m6 = alibi_slopes(6);
    for (index_t h = 0; h < 8; ++h) EXPECT_EQ(m8[std::size_t(h)], std::exp2(-double(h + 1)));
    // H = 6: n = 4 -> 2^-2, 2^-4, 2^-6, 2^-8, then the odd terms of the 8-head sequence: 2^-1, 2^-3
    const double want[] = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
    for (index_t h = 0; h < 6; ++h) EXPECT_EQ(m6[std::size_t(h)], want[h]);
}
