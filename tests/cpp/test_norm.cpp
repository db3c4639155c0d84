// Algorithm 6 (layer_norm) and RMSnorm: hand-checked forward, backward vs finite differences.
#include "formal_transformers/norm.hpp"
#include "testing.hpp"

using namespace ft;

TEST(LayerNorm, HandCheckedColumn) {
    // e = (1, 2, 3): m = 2, v = 2/3, ê = (e − m)/√v = (−√1.5, 0, √1.5); then ⊙ γ + β
    ParamStore<double> store;
    LayerNorm<double> ln(3, 0.0, store);
    store.allocate();
    ln.init(store);
    double* g = store.v(ln.gamma);
    double* b = store.v(ln.beta);
    g[0] = 2;
    b[2] = 1;
    Matrix<double> E = {{1}, {2}, {3}}, Y = Matrix<double>::from_shape({3, 1});
    NormCache<double> c;
    ln.forward(store, view(E), view(Y), c);
    EXPECT_NEAR(Y(0, 0), -2 * std::sqrt(1.5), 1e-14);
    EXPECT_NEAR(Y(1, 0), 0.0, 1e-14);
    EXPECT_NEAR(Y(2, 0), std::sqrt(1.5) + 1, 1e-14);
}

TEST(LayerNorm, EpsIsInsideTheSquareRoot) {
    ParamStore<double> store;
    LayerNorm<double> ln(2, 0.5, store);
    store.allocate();
    ln.init(store);
    Matrix<double> E = {{1}, {-1}}, Y = Matrix<double>::from_shape({2, 1});  // m = 0, v = 1
    NormCache<double> c;
    ln.forward(store, view(E), view(Y), c);
    EXPECT_NEAR(Y(0, 0), 1 / std::sqrt(1.5), 1e-15);
}

TEST(LayerNorm, ColumnsAreIndependentAndAliasingWorks) {
    ParamStore<float> store;
    LayerNorm<float> ln(4, 1e-5, store);
    store.allocate();
    ln.init(store);
    Rng rng(4);
    Matrix<float> E = fttest::random_matrix<float>(4, 3, rng), Y = Matrix<float>::from_shape({4, 3});
    Matrix<float> E1 = Matrix<float>::from_shape({4, 1}), Y1 = Matrix<float>::from_shape({4, 1});
    NormCache<float> c;
    ln.forward(store, view(E), view(Y), c);
    for (int i = 0; i < 4; ++i) E1(i, 0) = E(i, 2);
    ln.forward(store, view(E1), view(Y1), c);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(Y(i, 2), Y1(i, 0));
    ln.forward(store, view(E), view(E), c);  // in place
    for (int i = 0; i < 12; ++i) EXPECT_EQ(E.data()[i], Y.data()[i]);
}

template <class Norm>
void check_norm_gradients(Norm& norm, ParamStore<double>& store, index_t d, index_t n, unsigned seed) {
    Rng rng(seed);
    fttest::randomize(store, rng);
    std::vector<double> E = fttest::randn(d * n, rng), W = fttest::randn(d * n, rng);
    NormCache<double> c;
    auto loss = [&] {
        std::vector<double> Y(static_cast<std::size_t>(d * n));
        NormCache<double> cc;
        norm.forward(store, CMatView<double>(E.data(), d, n), MatView<double>(Y.data(), d, n), cc);
        return fttest::dot(Y.data(), W.data(), d * n);
    };
    std::vector<double> Y(static_cast<std::size_t>(d * n)), dE(std::size_t(d * n), 0.0);
    norm.forward(store, CMatView<double>(E.data(), d, n), MatView<double>(Y.data(), d, n), c);
    store.zero_grad();
    norm.backward(store, CMatView<double>(W.data(), d, n), c, MatView<double>(dE.data(), d, n));
    auto numE = fttest::numeric_grad(E.data(), d * n, loss);
    EXPECT_LT(fttest::rel_error(dE, numE, dE.size()), 1e-6);
    auto numTheta = fttest::numeric_grad(store.theta(), store.size(), loss);
    EXPECT_LT(fttest::rel_error(store.grad(), numTheta, numTheta.size()), 1e-6);
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
    for (double eps : {0.0, 1e-5}) {
        ParamStore<double> store;
        LayerNorm<double> ln(9, eps, store, "g", "b");
        store.allocate();
        check_norm_gradients(ln, store, 9, 4, 5);
    }
}

TEST(RMSNorm, HandCheckedAndBackward) {
    ParamStore<double> store;
    RMSNorm<double> rn(2, 0.0, store);
    store.allocate();
    rn.init(store);
    Matrix<double> E = {{3}, {4}}, Y = Matrix<double>::from_shape({2, 1});  // rms = √(25/2)
    NormCache<double> c;
    rn.forward(store, view(E), view(Y), c);
    EXPECT_NEAR(Y(0, 0), 3 / std::sqrt(12.5), 1e-15);
    EXPECT_NEAR(Y(1, 0), 4 / std::sqrt(12.5), 1e-15);

    ParamStore<double> s2;
    RMSNorm<double> rn2(7, 1e-5, s2);
    s2.allocate();
    check_norm_gradients(rn2, s2, 7, 3, 6);
}

TEST(LayerNorm, RejectsBadHyperparameters) {
    ParamStore<float> store;
    EXPECT_THROW(LayerNorm<float>(0, 1e-5, store), ValueError);
    EXPECT_THROW(LayerNorm<float>(3, -1.0, store), ValueError);
}
