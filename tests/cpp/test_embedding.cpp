// Algorithms 1 and 2: hand-checked gathers, scatter-add of repeated ids, the paper's sinusoidal W_p typed in
// by hand, the frozen W_p, batches of sequences, and backward vs central finite differences.
#include <cmath>

#include "formal_transformers/embedding.hpp"
#include "testing.hpp"

using namespace ft;

namespace {
// W[i, j] = 10·(i+1) + j: every entry tells where it came from.
template <class T>
void fill_tagged(MatView<T> W) {
    for (index_t j = 0; j < W.cols; ++j)
        for (index_t i = 0; i < W.rows; ++i) W(i, j) = T(10 * (i + 1) + j);
}
}  // namespace

// ===================================== Algorithm 1 ====================================================
TEST(TokenEmbedding, GathersColumnsOfWe) {
    ParamStore<double> store;
    TokenEmbedding<double> emb(4, 3, store);  // N_V = 4, d_e = 3
    store.allocate();
    ASSERT_EQ(store.entry("W_e").shape, (std::vector<index_t>{3, 4}));
    fill_tagged(store.W(emb.W_e));
    const std::vector<index_t> ids = {2, 0, 3, 2};
    Matrix<double> E = Matrix<double>::from_shape({3, 4});
    emb.forward(store, ids.data(), 4, view(E));
    // line 1: e = W_e[:, v] for every token: column t holds 10(i+1) + ids[t]
    for (index_t t = 0; t < 4; ++t)
        for (index_t i = 0; i < 3; ++i) EXPECT_EQ(E(i, t), 10.0 * double(i + 1) + double(ids[std::size_t(t)]));
    // accumulate: E += W_e[:, v]
    emb.forward(store, ids.data(), 4, view(E), true);
    EXPECT_EQ(E(0, 0), 2 * 12.0);
    EXPECT_EQ(E(2, 2), 2 * 33.0);
}

TEST(TokenEmbedding, BackwardScatterAddsRepeatedIds) {
    ParamStore<double> store;
    TokenEmbedding<double> emb(5, 2, store);
    store.allocate();
    const std::vector<index_t> ids = {3, 1, 3, 3};
    // dE columns (1, 2), (3, 4), (5, 6), (7, 8)
    Matrix<double> dE = {{1.0, 3.0, 5.0, 7.0}, {2.0, 4.0, 6.0, 8.0}};
    emb.backward(store, ids.data(), 4, view(dE));
    MatView<double> dW = store.dW(emb.W_e);
    EXPECT_EQ(dW(0, 3), 1.0 + 5.0 + 7.0);  // token 3 used three times: all three columns
    EXPECT_EQ(dW(1, 3), 2.0 + 6.0 + 8.0);
    EXPECT_EQ(dW(0, 1), 3.0);
    EXPECT_EQ(dW(1, 1), 4.0);
    for (index_t v : {0, 2, 4}) {
        EXPECT_EQ(dW(0, v), 0.0);
        EXPECT_EQ(dW(1, v), 0.0);
    }
    // gradients accumulate across calls until zero_grad
    emb.backward(store, ids.data(), 1, view(dE));
    EXPECT_EQ(dW(0, 3), 14.0);
    store.zero_grad();
    EXPECT_EQ(dW(0, 3), 0.0);
}

TEST(TokenEmbedding, BackwardMatchesFiniteDifferences) {
    Rng rng(21);
    const index_t n_vocab = 6, d_e = 4, n = 7;
    ParamStore<double> store;
    TokenEmbedding<double> emb(n_vocab, d_e, store);
    store.allocate();
    emb.init(store, rng, 1.0);
    const std::vector<index_t> ids = {5, 0, 5, 2, 2, 5, 1};
    const std::vector<double> G = fttest::randn(d_e * n, rng);
    auto loss = [&] {
        std::vector<double> E(static_cast<std::size_t>(d_e * n));
        emb.forward(store, ids.data(), n, MatView<double>(E.data(), d_e, n));
        return fttest::dot(E.data(), G.data(), d_e * n);
    };
    store.zero_grad();
    emb.backward(store, ids.data(), n, CMatView<double>(G.data(), d_e, n));
    auto num = fttest::numeric_grad(store.theta(), store.size(), loss);
    EXPECT_LT(fttest::rel_error(store.grad(), num, num.size()), 1e-6);
}

TEST(TokenEmbedding, InitIsSeededNormal) {
    ParamStore<double> a, b;
    TokenEmbedding<double> ea(50, 40, a), eb(50, 40, b);
    a.allocate();
    b.allocate();
    Rng r1(3), r2(3);
    ea.init(a, r1, 1.0);
    eb.init(b, r2, 1.0);
    double s = 0, s2 = 0;
    for (index_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a.theta()[i], b.theta()[i]);  // same seed, same weights
        s += a.theta()[i];
        s2 += a.theta()[i] * a.theta()[i];
    }
    const double mean = s / double(a.size()), var = s2 / double(a.size()) - mean * mean;
    EXPECT_LT(std::abs(mean), 0.1);  // 2000 draws of N(0, 1): mean ± 0.022 (1σ), var ± 0.032
    EXPECT_NEAR(var, 1.0, 0.15);
}

TEST(TokenEmbedding, RejectsBadHyperparameters) {
    ParamStore<double> store;
    EXPECT_THROW(TokenEmbedding<double>(0, 3, store), ValueError);
    EXPECT_THROW(TokenEmbedding<double>(3, 0, store), ValueError);
}

// ===================================== Algorithm 2 ====================================================
TEST(PositionalEmbedding, SinusoidalIsThePapersFormulaByHand) {
    // ℓ_max = 4, d_e = 5, 1-based i and t as printed; stored 0-based (column j holds t = j+1):
    //   row 0 = sin(t / 4^(2/5)), row 1 = cos(t / 4^(2/5)),  (i = 1)
    //   row 2 = sin(t / 4^(4/5)), row 3 = cos(t / 4^(4/5)),  (i = 2)
    //   row 4 = sin(t / 4^(6/5))                             (i = 3, odd d_e: the sine only)
    ParamStore<double> store;
    PositionalEmbedding<double> pe(4, 5, Positional::Sinusoidal, 0.0, store);
    store.allocate();
    Rng rng(0);
    pe.init(store, rng, 1.0);
    CMatView<double> W = store.W(pe.W_p);
    for (int t = 1; t <= 4; ++t) {
        const double want[5] = {std::sin(t / std::pow(4.0, 0.4)), std::cos(t / std::pow(4.0, 0.4)),
                                std::sin(t / std::pow(4.0, 0.8)), std::cos(t / std::pow(4.0, 0.8)),
                                std::sin(t / std::pow(4.0, 1.2))};
        for (int r = 0; r < 5; ++r) EXPECT_NEAR(W(r, t - 1), want[r], 1e-15) << "row " << r << " t " << t;
    }
    // a few entries typed in as numbers (computed separately with Python's math module)
    EXPECT_NEAR(W(0, 0), 0.5432885103126853, 1e-15);
    EXPECT_NEAR(W(1, 2), -0.1516636790101324, 1e-15);
    EXPECT_NEAR(W(3, 3), 0.24865211584997066, 1e-15);
    EXPECT_NEAR(W(4, 3), 0.6873674728521854, 1e-15);
    // not the 0-based misreading sin(0) = 0 in the first column
    EXPECT_GT(std::abs(W(0, 0)), 0.5);
}

TEST(PositionalEmbedding, SinusoidalBaseReplacesLmax) {
    ParamStore<double> store;
    PositionalEmbedding<double> pe(3, 4, Positional::Sinusoidal, 10000.0, store);
    store.allocate();
    Rng rng(0);
    pe.init(store, rng, 1.0);
    CMatView<double> W = store.W(pe.W_p);
    for (int t = 1; t <= 3; ++t) {
        EXPECT_NEAR(W(0, t - 1), std::sin(t / std::pow(10000.0, 0.5)), 1e-15);
        EXPECT_NEAR(W(1, t - 1), std::cos(t / std::pow(10000.0, 0.5)), 1e-15);
        EXPECT_NEAR(W(2, t - 1), std::sin(t / 10000.0), 1e-15);
        EXPECT_NEAR(W(3, t - 1), std::cos(t / 10000.0), 1e-15);
    }
}

TEST(PositionalEmbedding, SinusoidalIsFrozen) {
    ParamStore<double> store;
    TokenEmbedding<double> emb(3, 2, store);
    PositionalEmbedding<double> pe(4, 2, Positional::Sinusoidal, 0.0, store);
    store.allocate();
    EXPECT_FALSE(store.entry("W_p").trainable);
    EXPECT_TRUE(store.entry("W_e").trainable);
    // optimizers see only W_e
    auto r = store.trainable_ranges();
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].first, emb.W_e.offset);
    EXPECT_EQ(r[0].second, emb.W_e.offset + 6);
    // backward writes no gradient for it
    const std::vector<index_t> pos = {0, 3};
    Matrix<double> dE = {{1.0, 2.0}, {3.0, 4.0}};
    pe.backward(store, pos.data(), 2, view(dE));
    pe.backward_seqs(store, Seqs::single(2), view(dE));
    for (index_t i = 0; i < store.size(); ++i) EXPECT_EQ(store.grad()[i], 0.0);
}

TEST(PositionalEmbedding, LearnedGathersAndScatterAdds) {
    ParamStore<double> store;
    PositionalEmbedding<double> pe(5, 2, Positional::Learned, 0.0, store);
    store.allocate();
    EXPECT_TRUE(store.entry("W_p").trainable);
    ASSERT_EQ(store.entry("W_p").shape, (std::vector<index_t>{2, 5}));
    fill_tagged(store.W(pe.W_p));
    const std::vector<index_t> pos = {4, 0, 4};
    Matrix<double> E = Matrix<double>::from_shape({2, 3});
    pe.forward(store, pos.data(), 3, view(E));
    EXPECT_EQ(E(0, 0), 14.0);
    EXPECT_EQ(E(1, 0), 24.0);
    EXPECT_EQ(E(0, 1), 10.0);
    EXPECT_EQ(E(1, 2), 24.0);
    Matrix<double> dE = {{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}};
    pe.backward(store, pos.data(), 3, view(dE));
    MatView<double> dW = store.dW(pe.W_p);
    EXPECT_EQ(dW(0, 4), 4.0);
    EXPECT_EQ(dW(1, 4), 10.0);
    EXPECT_EQ(dW(0, 0), 2.0);
    EXPECT_EQ(dW(0, 2), 0.0);
}

TEST(PositionalEmbedding, SeqsAreCountedFromEachSequencesStart) {
    // a batch of sequences of lengths 3, 1, 2: positions 0 1 2 | 0 | 0 1, added to E; offset shifts them
    Rng rng(22);
    ParamStore<double> store;
    PositionalEmbedding<double> pe(6, 3, Positional::Learned, 0.0, store);
    store.allocate();
    pe.init(store, rng, 1.0);
    const Seqs s = Seqs::from_lengths({3, 1, 2});
    const std::vector<index_t> pos = {0, 1, 2, 0, 0, 1};
    Matrix<double> E0 = fttest::random_matrix<double>(3, 6, rng), E = E0, want = Matrix<double>::from_shape({3, 6});
    pe.forward_seqs(store, s, view(E));
    pe.forward(store, pos.data(), 6, view(want));
    for (index_t j = 0; j < 6; ++j)
        for (index_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(E(i, j), E0(i, j) + want(i, j));
    Matrix<double> E2 = E0;
    pe.forward_seqs(store, s, view(E2), 2);  // offset 2: positions 2 3 4 | 2 | 2 3
    EXPECT_DOUBLE_EQ(E2(0, 3), E0(0, 3) + store.W(pe.W_p)(0, 2));
    EXPECT_DOUBLE_EQ(E2(2, 5), E0(2, 5) + store.W(pe.W_p)(2, 3));
    // backward_seqs == backward with the explicit positions
    Matrix<double> dE = fttest::random_matrix<double>(3, 6, rng);
    pe.backward_seqs(store, s, view(dE));
    std::vector<double> g1(store.grad(), store.grad() + store.size());
    store.zero_grad();
    pe.backward(store, pos.data(), 6, view(dE));
    EXPECT_LT(fttest::rel_error(g1, store.grad(), g1.size()), 1e-15);
}

TEST(PositionalEmbedding, BackwardMatchesFiniteDifferences) {
    Rng rng(23);
    const index_t l_max = 5, d_e = 3, n = 6;
    ParamStore<double> store;
    PositionalEmbedding<double> pe(l_max, d_e, Positional::Learned, 0.0, store);
    store.allocate();
    pe.init(store, rng, 1.0);
    const std::vector<index_t> pos = {1, 4, 1, 0, 3, 1};
    const std::vector<double> G = fttest::randn(d_e * n, rng);
    auto loss = [&] {
        std::vector<double> E(static_cast<std::size_t>(d_e * n));
        pe.forward(store, pos.data(), n, MatView<double>(E.data(), d_e, n));
        return fttest::dot(E.data(), G.data(), d_e * n);
    };
    store.zero_grad();
    pe.backward(store, pos.data(), n, CMatView<double>(G.data(), d_e, n));
    auto num = fttest::numeric_grad(store.theta(), store.size(), loss);
    EXPECT_LT(fttest::rel_error(store.grad(), num, num.size()), 1e-6);
    // and through the batch path (3 + 2 + 1 columns)
    const Seqs s = Seqs::from_lengths({3, 2, 1});
    auto loss_seqs = [&] {
        std::vector<double> E(static_cast<std::size_t>(d_e * n), 0.0);
        pe.forward_seqs(store, s, MatView<double>(E.data(), d_e, n));
        return fttest::dot(E.data(), G.data(), d_e * n);
    };
    store.zero_grad();
    pe.backward_seqs(store, s, CMatView<double>(G.data(), d_e, n));
    auto num2 = fttest::numeric_grad(store.theta(), store.size(), loss_seqs);
    EXPECT_LT(fttest::rel_error(store.grad(), num2, num2.size()), 1e-6);
}

TEST(PositionalEmbedding, RejectsBadHyperparameters) {
    ParamStore<double> store;
    EXPECT_THROW(PositionalEmbedding<double>(0, 3, Positional::Learned, 0.0, store), ValueError);
    EXPECT_THROW(PositionalEmbedding<double>(3, 0, Positional::Sinusoidal, 0.0, store), ValueError);
}
