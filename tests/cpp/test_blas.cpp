// gemm through OpenBLAS vs the naive triple loop kept beside it, on transposes and sub-blocks.
#include "formal_transformers/affine_set.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/precision.hpp"
#include "testing.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>

using namespace ft;
using fttest::random_matrix;
using fttest::rel_error;

template <class T>
void check_gemm(Op a, Op b, index_t m, index_t n, index_t k, T beta) {
    Rng rng(m * 100 + n * 10 + k);
    Matrix<T> A = a == Op::N ? random_matrix<T>(m, k, rng) : random_matrix<T>(k, m, rng);
    Matrix<T> B = b == Op::N ? random_matrix<T>(k, n, rng) : random_matrix<T>(n, k, rng);
    Matrix<T> C1 = random_matrix<T>(m, n, rng), C2 = C1;
    gemm<T>(a, b, T(0.5), view(A), view(B), beta, view(C1));
    gemm_naive<T>(a, b, T(0.5), view(A), view(B), beta, view(C2));
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
    EXPECT_LT(rel_error(C1.data(), C2.data(), C1.size()), tol);
}

TEST(Blas, GemmMatchesNaiveLoop) {
    for (Op a : {Op::N, Op::T})
        for (Op b : {Op::N, Op::T})
            for (double beta : {0.0, 1.0, -0.5}) {
                check_gemm<double>(a, b, 7, 5, 3, beta);
                check_gemm<float>(a, b, 33, 17, 65, float(beta));
                check_gemm<double>(a, b, 1, 1, 1, beta);
            }
}

TEST(Blas, GemmOnSubBlocksUsesLeadingDimension) {
    // C[2:5, :] = A[1:4, :] * B[:, 3:7], all inside bigger matrices
    Rng rng(3);
    Matrix<double> A = random_matrix<double>(6, 4, rng), B = random_matrix<double>(4, 9, rng);
    Matrix<double> C = random_matrix<double>(8, 4, rng), C0 = C;
    MatView<double> Cb = view(C).rows_range(2, 3);
    gemm<double>(Op::N, Op::N, 1.0, view(A).rows_range(1, 3), view(B).cols_range(3, 4), 0.0, Cb);
    for (index_t i = 0; i < 8; ++i)
        for (index_t j = 0; j < 4; ++j) {
            if (i >= 2 && i < 5) {
                double s = 0;
                for (index_t p = 0; p < 4; ++p) s += A(i - 1, p) * B(p, j + 3);
                EXPECT_NEAR(C(i, j), s, 1e-13);
            } else {
                EXPECT_EQ(C(i, j), C0(i, j));  // rows outside the block untouched
            }
        }
}

TEST(Blas, ZeroInnerDimensionAppliesBeta) {
    Matrix<double> A = Matrix<double>::from_shape({3, 0}), B = Matrix<double>::from_shape({0, 2});
    Matrix<double> C = Matrix<double>::from_shape({3, 2});
    C.fill(4.0);
    gemm<double>(Op::N, Op::N, 1.0, view(A), view(B), 0.5, view(C));
    for (double c : C) EXPECT_EQ(c, 2.0);
}

TEST(Blas, AffineAndItsBackward) {
    // Y = W X + b 1ᵀ: hand-checked values, then the backward identities
    Matrix<double> W = {{1, 2}, {3, 4}, {5, 6}};  // [3, 2]
    Matrix<double> X = {{1, 0, 2}, {-1, 1, 0}};   // [2, 3]
    double b[3] = {0.5, -1, 2};
    Matrix<double> Y = Matrix<double>::from_shape({3, 3});
    affine<double>(view(W), view(X), b, view(Y));
    const double expect[3][3] = {{-0.5, 2.5, 2.5}, {-2, 3, 5}, {1, 8, 12}};
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) EXPECT_DOUBLE_EQ(Y(i, j), expect[i][j]);
    Matrix<double> dY = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
    Matrix<double> dW = Matrix<double>::from_shape({3, 2}), dX = Matrix<double>::from_shape({2, 3});
    dW.fill(0);
    dX.fill(0);
    double db[3] = {0, 0, 0};
    affine_backward<double>(view(W), view(X), view(dY), dW.data(), db, dX.data());
    for (int i = 0; i < 3; ++i) {
        EXPECT_DOUBLE_EQ(db[i], 1.0);
        for (int j = 0; j < 2; ++j) EXPECT_DOUBLE_EQ(dW(i, j), X(j, i));  // dW = dY Xᵀ = Xᵀ
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) EXPECT_DOUBLE_EQ(dX(i, j), W(j, i));  // dX = Wᵀ dY = Wᵀ
}

TEST(Blas, AffineBackwardSetWritesDXWithoutReadingIt) {
    // dX = Wᵀ dY written over whatever dX held (NaN here), the same bits as dX += Wᵀ dY on zeros; dW, db added to
    Matrix<float> W = Matrix<float>::from_shape({5, 3}), X = Matrix<float>::from_shape({3, 4});
    Matrix<float> dY = Matrix<float>::from_shape({5, 4});
    for (std::size_t i = 0; i < W.size(); ++i) W.data()[i] = float(std::sin(0.7 * double(i) + 0.3));
    for (std::size_t i = 0; i < X.size(); ++i) X.data()[i] = float(std::cos(1.3 * double(i)));
    for (std::size_t i = 0; i < dY.size(); ++i) dY.data()[i] = float(std::sin(2.1 * double(i) - 1.0));
    Matrix<float> dW1 = Matrix<float>::from_shape({5, 3}), dW2 = Matrix<float>::from_shape({5, 3});
    Matrix<float> dX1 = Matrix<float>::from_shape({3, 4}), dX2 = Matrix<float>::from_shape({3, 4});
    dW1.fill(0.5f), dW2.fill(0.5f), dX1.fill(0.0f), dX2.fill(std::numeric_limits<float>::quiet_NaN());
    float db1[5] = {1, 2, 3, 4, 5}, db2[5] = {1, 2, 3, 4, 5};
    affine_backward<float>(view(W), view(X), view(dY), dW1.data(), db1, dX1.data());
    affine_backward_set<float>(view(W), view(X), view(dY), dW2.data(), db2, dX2.data());
    for (std::size_t i = 0; i < dX1.size(); ++i) EXPECT_EQ(dX2.data()[i], dX1.data()[i]) << i;
    for (std::size_t i = 0; i < dW1.size(); ++i) EXPECT_EQ(dW2.data()[i], dW1.data()[i]) << i;  // dW += dY Xᵀ
    for (int i = 0; i < 5; ++i) EXPECT_EQ(db2[i], db1[i]) << i;
    // a leading dimension: the rows past X.rows untouched
    Matrix<float> dX3 = Matrix<float>::from_shape({6, 4});
    dX3.fill(7.0f);
    affine_backward_set<float>(view(W), view(X), view(dY), nullptr, nullptr, dX3.data(), 6);
    for (index_t j = 0; j < 4; ++j)
        for (index_t i = 0; i < 6; ++i) EXPECT_EQ(dX3(i, j), i < 3 ? dX1(i, j) : 7.0f) << i << "," << j;
    // bf16 products in training (on bf16 instructions: one product with beta 0): the same as adding to zeros
    ProductScope bf16(ProductContext{true, nullptr, true});
    dX1.fill(0.0f), dX2.fill(std::numeric_limits<float>::quiet_NaN());
    affine_backward<float>(view(W), view(X), view(dY), nullptr, nullptr, dX1.data());
    affine_backward_set<float>(view(W), view(X), view(dY), nullptr, nullptr, dX2.data());
    for (std::size_t i = 0; i < dX1.size(); ++i) EXPECT_EQ(dX2.data()[i], dX1.data()[i]) << i;
}

// The BLAS's parallel jobs run on our OpenMP pool (blas.cpp): a product large enough for several threads
// gives the naive loop's result from the calling thread, and also from inside one of our parallel regions
// (where the jobs' team is short and the missing jobs get threads of their own instead of a deadlock).
TEST(Blas, ThreadedProductsOnOurPoolMatchNaiveLoop) {
    const index_t m = 97, n = 131, k = 83;  // m·n·k > OpenBLAS's single-thread threshold (2^18)
    Rng rng(5);
    Matrix<double> A = Matrix<double>::from_shape({std::size_t(k), std::size_t(m)});
    Matrix<double> B = Matrix<double>::from_shape({std::size_t(k), std::size_t(n)});
    for (auto& a : A) a = rng.normal();
    for (auto& b : B) b = rng.normal();
    Matrix<double> ref = Matrix<double>::from_shape({std::size_t(m), std::size_t(n)});
    gemm_naive<double>(Op::T, Op::N, 1.0, view(A), view(B), 0.0, view(ref));
    const int saved = get_num_threads();
    set_num_threads(2);
    EXPECT_EQ(blas_get_num_threads(), 2) << blas_info();
    std::vector<Matrix<double>> C(3, Matrix<double>::from_shape({std::size_t(m), std::size_t(n)}));
    gemm<double>(Op::T, Op::N, 1.0, view(A), view(B), 0.0, view(C[2]));
#pragma omp parallel for num_threads(2)
    for (int i = 0; i < 2; ++i) gemm<double>(Op::T, Op::N, 1.0, view(A), view(B), 0.0, view(C[std::size_t(i)]));
    set_num_threads(saved);
    for (const auto& c : C)
        for (std::size_t i = 0; i < c.size(); ++i) ASSERT_NEAR(c.data()[i], ref.data()[i], 1e-12);
    // whichever BLAS this is, it says which kernel it runs and where its threads come from
    EXPECT_FALSE(blas_kernel().empty());
    EXPECT_NE(blas_info().find("kernel " + blas_kernel()), std::string::npos) << blas_info();
}

namespace {
// gemm vs the naive loop for op(A):[m,k], op(B):[k,n] on sub-blocks of larger matrices (leading dimension ≠
// rows, so strides matter), C a sub-block too: the relative error over the whole of C (the rest untouched).
double sub_block_error(Op a, Op b, index_t m, index_t n, index_t k, double beta, Rng& rng) {
    const index_t ar = a == Op::N ? m : k, ac = a == Op::N ? k : m;
    const index_t br = b == Op::N ? k : n, bc = b == Op::N ? n : k;
    Matrix<double> A = random_matrix<double>(ar + 3, ac + 2, rng), B = random_matrix<double>(br + 4, bc + 1, rng);
    Matrix<double> C1 = random_matrix<double>(m + 5, n + 2, rng), C2 = C1;
    auto Av = CMatView<double>(view(A).rows_range(1, ar).cols_range(2, ac));
    auto Bv = CMatView<double>(view(B).rows_range(2, br).cols_range(1, bc));
    gemm<double>(a, b, 0.75, Av, Bv, beta, view(C1).rows_range(3, m).cols_range(1, n));
    gemm_naive<double>(a, b, 0.75, Av, Bv, beta, view(C2).rows_range(3, m).cols_range(1, n));
    return rel_error(C1.data(), C2.data(), C1.size());
}
}  // namespace

// Products large enough for gemm to split them over threads (slices of C's columns, or rows when C is
// tall; blas.cpp), every transpose and beta, on sub-blocks, with slice counts that do not divide the sizes:
// the same result as the naive loop, from 1, 2 and 3 threads.
TEST(Blas, SplitProductsMatchNaiveLoopOnSubBlocks) {
    Rng rng(17);
    const int saved = get_num_threads();
    for (int threads : {1, 2, 3})
        for (Op a : {Op::N, Op::T})
            for (Op b : {Op::N, Op::T})
                for (double beta : {0.0, 1.0})
                    for (auto [m, n, k] : {std::tuple<index_t, index_t, index_t>{61, 301, 97},  // wide C: columns
                                           {333, 70, 71},                                      // tall C: rows
                                           {130, 129, 128}}) {
                        set_num_threads(threads);
                        const double err = sub_block_error(a, b, m, n, k, beta, rng);
                        set_num_threads(saved);
                        ASSERT_LT(err, 1e-13) << "threads " << threads << " op(A) " << int(a) << " op(B) " << int(b)
                                              << " m " << m << " n " << n << " k " << k << " beta " << beta;
                    }
}

// One column (n = 1) and one row (m = 1) go to gemv: every transpose, beta, and operands that are
// sub-blocks of larger matrices (leading dimension ≠ rows, so the vector strides matter).
TEST(Blas, VectorShapedProductsMatchNaiveLoopOnSubBlocks) {
    Rng rng(11);
    for (Op a : {Op::N, Op::T})
        for (Op b : {Op::N, Op::T})
            for (double beta : {0.0, 1.0, -0.5})
                for (auto [m, n] : {std::pair<index_t, index_t>{1, 6}, {6, 1}, {1, 1}})
                    EXPECT_LT(sub_block_error(a, b, m, n, 9, beta, rng), 1e-13)
                        << "op(A) " << int(a) << " op(B) " << int(b) << " m " << m << " n " << n << " beta " << beta;
}

// A few columns (2 ≤ n ≤ 8: the verify pass of speculative decoding, short prompts): every n, row counts
// that split unevenly, sub-blocks (leading dimensions ≠ rows), every beta, NaN in C ignored when beta = 0,
// float and double, one thread and the pool (gemm splits a large product into slices of rows).
template <class T>
void check_few_columns(index_t m, index_t n, index_t k, T beta, Rng& rng) {
    Matrix<T> A = random_matrix<T>(m + 3, k + 2, rng), B = random_matrix<T>(k + 4, n + 1, rng);
    Matrix<T> C1 = random_matrix<T>(m + 5, n + 2, rng);
    if (beta == T(0)) C1(3, 1) = std::numeric_limits<T>::quiet_NaN();  // BLAS semantics: C not read
    Matrix<T> C2 = C1;
    auto Av = CMatView<T>(view(A).rows_range(1, m).cols_range(2, k));
    auto Bv = CMatView<T>(view(B).rows_range(2, k).cols_range(1, n));
    gemm<T>(Op::N, Op::N, T(0.75), Av, Bv, beta, view(C1).rows_range(3, m).cols_range(1, n));
    gemm_naive<T>(Op::N, Op::N, T(0.75), Av, Bv, beta, view(C2).rows_range(3, m).cols_range(1, n));
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
    EXPECT_LT(rel_error(C1.data(), C2.data(), C1.size()), tol) << "m " << m << " n " << n << " k " << k << " beta " << beta;
}

TEST(Blas, FewColumnProductsMatchNaiveLoop) {
    Rng rng(5);
    for (index_t n = 2; n <= 8; ++n)
        for (index_t m : {16, 17, 47, 64, 65, 130})
            for (double beta : {0.0, 1.0, -0.5}) {
                check_few_columns<double>(m, n, 9, beta, rng);
                check_few_columns<float>(m, n, 33, float(beta), rng);
            }
    // large enough for gemm to split the rows over the pool, and on one thread
    for (index_t n : {2, 5, 8}) {
        check_few_columns<double>(1030, n, 300, 0.0, rng);
        SingleThreadScope one;
        check_few_columns<float>(1030, n, 300, 1.0f, rng);
    }
}

// A weight times a few columns above OpenBLAS's small-matrix threshold (M·N·K > 10^6): gemm computes it in
// blocks of C's rows (blas.cpp, gemm_rows: up to 8 columns in float32, 4 in float64); the result equals one
// BLAS call on the whole product (gemm_unsplit) and the naive loop. The target's shapes in speculative
// decoding (d_e 384: 1536×384 and 384×1536 weights), rows that do not split evenly, sub-blocks (leading
// dimensions ≠ rows), op(B) = Bᵀ, every beta, on one thread and on the pool.
template <class T>
void check_skinny_split(int threads, index_t m, index_t n, index_t k, Op b, T beta, Rng& rng) {
    const index_t br = b == Op::N ? k : n, bc = b == Op::N ? n : k;
    Matrix<T> A = random_matrix<T>(m + 3, k + 2, rng), B = random_matrix<T>(br + 4, bc + 1, rng);
    Matrix<T> C1 = random_matrix<T>(m + 5, n + 2, rng), C2 = C1, C3 = C1;
    if (beta == T(0)) C1(7, 2) = C2(7, 2) = C3(7, 2) = std::numeric_limits<T>::quiet_NaN();
    auto Av = CMatView<T>(view(A).rows_range(1, m).cols_range(2, k));
    auto Bv = CMatView<T>(view(B).rows_range(2, br).cols_range(1, bc));
    const int saved = get_num_threads();
    set_num_threads(threads);
    gemm<T>(Op::N, b, T(0.75), Av, Bv, beta, view(C1).rows_range(3, m).cols_range(1, n));
    set_num_threads(saved);
    gemm_unsplit<T>(Op::N, b, T(0.75), Av, Bv, beta, view(C2).rows_range(3, m).cols_range(1, n));
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
    ASSERT_TRUE(std::isfinite(C1(7, 2)) && std::isfinite(C2(7, 2)));  // beta = 0: C not read
    ASSERT_LT(rel_error(C1.data(), C2.data(), C1.size()), tol)
        << "split vs one call: threads " << threads << " m " << m << " n " << n << " k " << k << " op(B) " << int(b)
        << " beta " << beta;
    if (n == 3) {  // and the naive loop, for one column count
        gemm_naive<T>(Op::N, b, T(0.75), Av, Bv, beta, view(C3).rows_range(3, m).cols_range(1, n));
        ASSERT_LT(rel_error(C1.data(), C3.data(), C1.size()), tol) << "m " << m << " k " << k;
    }
}

TEST(Blas, SkinnyProductsSplitIntoRowBlocksMatchOneCall) {
    Rng rng(23);
    for (int threads : {1, 2})
        for (auto [m, k] : {std::pair<index_t, index_t>{1536, 384}, {384, 1536}, {1037, 301}})
            for (index_t n = 2; n <= 8; ++n)
                for (Op b : {Op::N, Op::T})
                    for (double beta : {0.0, 1.0, -0.5}) {
                        if (n <= 4) check_skinny_split<double>(threads, m, n, k, b, beta, rng);
                        check_skinny_split<float>(threads, m, n, k, b, float(beta), rng);
                    }
}

// zero_grad of a store large enough for its parallel path (> 2^21 entries, several 64 KB chunks and a
// partial last one) clears every gradient entry, first and last included.
TEST(ParamStore, ZeroGradClearsLargeStoresInParallel) {
    ParamStore<float> store;
    store.vector("a", (index_t(1) << 21) + 12345);
    store.vector("b", 7);
    store.allocate();
    const int saved = get_num_threads();
    set_num_threads(2);
    std::fill(store.grad(), store.grad() + store.size(), 1.5f);
    store.zero_grad();
    set_num_threads(saved);
    for (index_t i = 0; i < store.size(); ++i) ASSERT_EQ(store.grad()[i], 0.0f) << "entry " << i;
}
