// Algorithm 7 and the log-softmax NLL: hand-checked forward, backward vs finite differences, the tied
// unembedding (W_u = W_eᵀ), and extreme logits where a probability underflows.
#include <cmath>
#include <limits>
#include <memory>

#include "formal_transformers/embedding.hpp"
#include "formal_transformers/unembedding.hpp"
#include "testing.hpp"

using namespace ft;

TEST(Unembedding, HandCheckedForward) {
    // W_u = [[1, 0], [0, 1], [1, 1]], e = (ln 2, ln 3): W_u e = (ln 2, ln 3, ln 6), exp = (2, 3, 6),
    // p = (2, 3, 6) / 11.
    ParamStore<double> store;
    Unembedding<double> un(3, 2, store);
    store.allocate();
    ASSERT_EQ(store.entry("W_u").shape, (std::vector<index_t>{3, 2}));
    MatView<double> W = store.W(un.W);
    W(0, 0) = 1, W(0, 1) = 0;
    W(1, 0) = 0, W(1, 1) = 1;
    W(2, 0) = 1, W(2, 1) = 1;
    // two columns: e and (0, 0) (uniform p)
    Matrix<double> X = {{std::log(2.0), 0.0}, {std::log(3.0), 0.0}}, P = Matrix<double>::from_shape({3, 2}),
                   Z = Matrix<double>::from_shape({3, 2});
    un.forward(store, view(X), view(P));
    EXPECT_NEAR(P(0, 0), 2.0 / 11, 1e-15);
    EXPECT_NEAR(P(1, 0), 3.0 / 11, 1e-15);
    EXPECT_NEAR(P(2, 0), 6.0 / 11, 1e-15);
    for (index_t i = 0; i < 3; ++i) EXPECT_NEAR(P(i, 1), 1.0 / 3, 1e-15);
    un.logits(store, view(X), view(Z));
    EXPECT_NEAR(Z(2, 0), std::log(6.0), 1e-15);
    EXPECT_EQ(Z(1, 1), 0.0);
}

TEST(Unembedding, ExtremeLogitsGiveZeroNotNaN) {
    ParamStore<float> store;
    Unembedding<float> un(2, 1, store);
    store.allocate();
    store.W(un.W)(0, 0) = 1000.0f;
    store.W(un.W)(1, 0) = -1000.0f;
    Matrix<float> X = {{1.0f}}, P = Matrix<float>::from_shape({2, 1});
    un.forward(store, view(X), view(P));  // max-subtracted: exp(0) and exp(-2000) = 0
    EXPECT_EQ(P(0, 0), 1.0f);
    EXPECT_EQ(P(1, 0), 0.0f);
}

namespace {
// Backward of Σ G ⊙ softmax(W_u X) vs central differences for X and θ (untied or tied).
void check_backward(Unembedding<double>& un, ParamStore<double>& store, index_t n, Rng& rng) {
    const index_t N_V = un.n_vocab, d_e = un.d_e;
    std::vector<double> X = fttest::randn(d_e * n, rng), G = fttest::randn(N_V * n, rng);
    auto loss = [&] {
        std::vector<double> P(static_cast<std::size_t>(N_V * n));
        un.forward(store, CMatView<double>(X.data(), d_e, n), MatView<double>(P.data(), N_V, n));
        return fttest::dot(P.data(), G.data(), N_V * n);
    };
    std::vector<double> P(static_cast<std::size_t>(N_V * n)), dP = G, dX(static_cast<std::size_t>(d_e * n), 0.0);
    un.forward(store, CMatView<double>(X.data(), d_e, n), MatView<double>(P.data(), N_V, n));
    store.zero_grad();
    un.backward(store, CMatView<double>(X.data(), d_e, n), CMatView<double>(P.data(), N_V, n),
                MatView<double>(dP.data(), N_V, n), MatView<double>(dX.data(), d_e, n));
    auto numX = fttest::numeric_grad(X.data(), d_e * n, loss);
    EXPECT_LT(fttest::rel_error(dX, numX, dX.size()), 1e-6);
    auto numT = fttest::numeric_grad(store.theta(), store.size(), loss);
    EXPECT_LT(fttest::rel_error(store.grad(), numT, numT.size()), 1e-6);
}
}  // namespace

TEST(Unembedding, BackwardMatchesFiniteDifferences) {
    Rng rng(31);
    for (index_t n : {1, 4}) {
        ParamStore<double> store;
        Unembedding<double> un(7, 5, store);
        store.allocate();
        un.init(store, rng, 1.0);
        check_backward(un, store, n, rng);
    }
}

TEST(Unembedding, TiedUsesWeTransposedAndItsGradient) {
    Rng rng(32);
    const index_t N_V = 6, d_e = 4, n = 3;
    ParamStore<double> store;
    TokenEmbedding<double> emb(N_V, d_e, store);
    Unembedding<double> un(N_V, d_e, emb.W_e);  // W_u = W_eᵀ: no parameter of its own
    store.allocate();
    EXPECT_TRUE(un.tied);
    EXPECT_EQ(store.entries().size(), 1u);
    emb.init(store, rng, 1.0);
    // logits = W_eᵀ X, by hand
    std::vector<double> X = fttest::randn(d_e * n, rng), Z(static_cast<std::size_t>(N_V * n));
    un.logits(store, CMatView<double>(X.data(), d_e, n), MatView<double>(Z.data(), N_V, n));
    CMatView<double> We = store.W(emb.W_e);
    for (index_t t = 0; t < n; ++t)
        for (index_t v = 0; v < N_V; ++v) {
            double s = 0;
            for (index_t i = 0; i < d_e; ++i) s += We(i, v) * X[std::size_t(i + t * d_e)];
            EXPECT_NEAR(Z[std::size_t(v + t * N_V)], s, 1e-14);
        }
    // gradients land in dW_e and match finite differences
    check_backward(un, store, n, rng);
    // backward_logits with both embedding and unembedding gradients in the same W_e
    store.zero_grad();
    std::vector<double> dZ = fttest::randn(N_V * n, rng);
    un.backward_logits(store, CMatView<double>(X.data(), d_e, n), CMatView<double>(dZ.data(), N_V, n), MatView<double>());
    for (index_t v = 0; v < N_V; ++v)
        for (index_t i = 0; i < d_e; ++i) {
            double s = 0;  // dW_e[i, v] = Σ_t X[i, t] dZ[v, t]
            for (index_t t = 0; t < n; ++t) s += X[std::size_t(i + t * d_e)] * dZ[std::size_t(v + t * N_V)];
            EXPECT_NEAR(store.dW(emb.W_e)(i, v), s, 1e-14);
        }
}

// A long vocabulary (N_V d_e n ≥ 2^24 multiply-adds, 2 threads): dX += W_uᵀ dZ is split over the vocabulary
// (unembedding.cpp add_WuT_dZ), each thread summing its blocks; the result must be the plain sum, untied and tied,
// added to what dX held.
TEST(Unembedding, VocabularySplitBackwardMatchesTheSum) {
    const int threads = get_num_threads();
    set_num_threads(2);
    Rng rng(33);
    const index_t N_V = 2048, d_e = 64, n = 128;
    for (bool tied : {false, true}) {
        ParamStore<double> store;
        TokenEmbedding<double> emb(N_V, d_e, store);
        std::unique_ptr<Unembedding<double>> un =
            tied ? std::make_unique<Unembedding<double>>(N_V, d_e, emb.W_e) : std::make_unique<Unembedding<double>>(N_V, d_e, store);
        store.allocate();
        emb.init(store, rng, 1.0);
        un->init(store, rng, 1.0);
        std::vector<double> X = fttest::randn(d_e * n, rng), dZ = fttest::randn(N_V * n, rng),
                            dX0 = fttest::randn(d_e * n, rng), dX = dX0;
        store.zero_grad();
        un->backward_logits(store, CMatView<double>(X.data(), d_e, n), CMatView<double>(dZ.data(), N_V, n),
                            MatView<double>(dX.data(), d_e, n));
        CMatView<double> W = store.W(un->W);
        double worst = 0;
        for (index_t t = 0; t < n; ++t)
            for (index_t i = 0; i < d_e; ++i) {
                double s = dX0[std::size_t(i + t * d_e)], mag = std::abs(s);  // dX[i, t] + Σ_v W_u[v, i] dZ[v, t]
                for (index_t v = 0; v < N_V; ++v) {
                    const double p = (tied ? W(i, v) : W(v, i)) * dZ[std::size_t(v + t * N_V)];
                    s += p, mag += std::abs(p);
                }
                worst = std::max(worst, std::abs(dX[std::size_t(i + t * d_e)] - s) / mag);
            }
        EXPECT_LT(worst, 1e-13) << (tied ? "tied" : "untied");
        for (int again = 0; again < 5; ++again) {  // the blocks go to the threads in a fixed order: the same bits
            std::vector<double> dX2 = dX0;
            un->backward_logits(store, CMatView<double>(X.data(), d_e, n), CMatView<double>(dZ.data(), N_V, n),
                                MatView<double>(dX2.data(), d_e, n));
            EXPECT_EQ(dX2, dX) << (tied ? "tied" : "untied") << ", run " << again + 2;
        }
    }
    set_num_threads(threads);
}

// ===================================== nll_and_grad ===================================================
TEST(NllAndGrad, HandChecked) {
    // column 0: z = (ln 2, ln 3, ln 6), y = 2: p = (2, 3, 6)/11, −log p_y = ln(11/6), dZ = p − e_y
    // column 1: z = (0, 0, 0), y = 0: −log(1/3) = ln 3, dZ = (1/3 − 1, 1/3, 1/3)
    Matrix<double> Z = {{std::log(2.0), 0.0}, {std::log(3.0), 0.0}, {std::log(6.0), 0.0}};
    const std::vector<index_t> y = {2, 0};
    const double loss = nll_and_grad<double>(view(Z), y.data());
    EXPECT_NEAR(loss, std::log(11.0 / 6.0) + std::log(3.0), 1e-15);
    EXPECT_NEAR(Z(0, 0), 2.0 / 11, 1e-15);
    EXPECT_NEAR(Z(1, 0), 3.0 / 11, 1e-15);
    EXPECT_NEAR(Z(2, 0), 6.0 / 11 - 1, 1e-15);
    EXPECT_NEAR(Z(0, 1), 1.0 / 3 - 1, 1e-15);
    EXPECT_NEAR(Z(1, 1), 1.0 / 3, 1e-15);
    // scale multiplies the gradient (e.g. 1/ℓ for a mean), not the loss
    Matrix<double> Z2 = {{std::log(2.0)}, {std::log(3.0)}, {std::log(6.0)}};
    const double l2 = nll_and_grad<double>(view(Z2), y.data(), 0.5);
    EXPECT_NEAR(l2, std::log(11.0 / 6.0), 1e-15);
    EXPECT_NEAR(Z2(2, 0), 0.5 * (6.0 / 11 - 1), 1e-15);
}

TEST(NllAndGrad, GradientMatchesFiniteDifferences) {
    Rng rng(33);
    const index_t N_V = 9, n = 5;
    std::vector<double> Z = fttest::randn(N_V * n, rng, 3.0);
    const std::vector<index_t> y = {0, 8, 3, 3, 5};
    auto loss = [&] {
        std::vector<double> Zc = Z;
        return nll_and_grad<double>(MatView<double>(Zc.data(), N_V, n), y.data());
    };
    std::vector<double> G = Z;
    const double l = nll_and_grad<double>(MatView<double>(G.data(), N_V, n), y.data());
    // the loss itself against −Σ log softmax computed naively
    double want = 0;
    for (index_t t = 0; t < n; ++t) {
        double s = 0;
        for (index_t v = 0; v < N_V; ++v) s += std::exp(Z[std::size_t(v + t * N_V)]);
        want -= std::log(std::exp(Z[std::size_t(y[std::size_t(t)] + t * N_V)]) / s);
    }
    EXPECT_NEAR(l, want, 1e-13 * std::abs(want));
    auto num = fttest::numeric_grad(Z.data(), N_V * n, loss);
    EXPECT_LT(fttest::rel_error(G, num, G.size()), 1e-6);
}

TEST(NllAndGrad, ExtremeLogitsAreExactAndFinite) {
    // The target's probability underflows to 0 (e^-2000, and e^-200 in float32): log p would be −∞;
    // the log-softmax gives the exact −log p = lse − z_y.
    {
        Matrix<double> Z = {{0.0}, {1000.0}, {-1000.0}};
        const std::vector<index_t> y = {2};
        const double loss = nll_and_grad<double>(view(Z), y.data());
        // lse = 1000 + log(1 + e^-1000 + e^-2000) = 1000 in double; −log p_y = 1000 − (−1000)
        EXPECT_TRUE(std::isfinite(loss));
        EXPECT_DOUBLE_EQ(loss, 2000.0);
        EXPECT_EQ(Z(1, 0), 1.0);   // p = (0, 1, 0): dZ = p − e_y
        EXPECT_EQ(Z(2, 0), -1.0);
        EXPECT_EQ(Z(0, 0), 0.0);
    }
    {
        Matrix<float> Z = {{0.0f}, {100.0f}, {-100.0f}};
        const std::vector<index_t> y = {2};
        const double loss = nll_and_grad<float>(view(Z), y.data());
        EXPECT_TRUE(std::isfinite(loss));
        EXPECT_NEAR(loss, 200.0, 200.0 * 1e-6);
        EXPECT_TRUE(std::isfinite(Z(0, 0)) && std::isfinite(Z(1, 0)) && std::isfinite(Z(2, 0)));
        EXPECT_EQ(Z(2, 0), -1.0f);
    }
    {
        // the target is the big one: loss = log(1 + e^-1000 + e^-2000) ≈ 0, not negative
        Matrix<double> Z = {{0.0}, {1000.0}, {-1000.0}};
        const std::vector<index_t> y = {1};
        const double loss = nll_and_grad<double>(view(Z), y.data());
        EXPECT_GE(loss, 0.0);
        EXPECT_LT(loss, 1e-300 + 1e-12);
    }
}
