// bf16-mixed products (precision.hpp): gemm under a bf16 ProductScope equals the float64 product of the operands
// rounded to bfloat16, with α, β, transposes and sub-blocks, on the native (oneDNN) and the emulated path, and
// with θ's bf16 copy (Bf16Weights) standing in for an operand inside θ.
#include "formal_transformers/bf16_products.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/precision.hpp"
#include "testing.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

using namespace ft;
using fttest::random_matrix;

namespace {
// max |C − α op(Ar) op(Br) − β C0| / (|α| |op(Ar)| |op(Br)| + |β C0|), the operands rounded, in float64
double bf16_error(Op a, Op b, float alpha, CMatView<float> A, CMatView<float> B, float beta, CMatView<float> C0,
                  CMatView<float> C) {
    const index_t m = C.rows, n = C.cols, k = a == Op::N ? A.cols : A.rows;
    double worst = 0;
    for (index_t j = 0; j < n; ++j)
        for (index_t i = 0; i < m; ++i) {
            double s = 0, size = 0;
            for (index_t p = 0; p < k; ++p) {
                const double x = round_bf16(a == Op::N ? A(i, p) : A(p, i)), y = round_bf16(b == Op::N ? B(p, j) : B(j, p));
                s += x * y;
                size += std::abs(x * y);
            }
            const double want = alpha * s + (beta == 0 ? 0.0 : double(beta) * C0(i, j));
            worst = std::max(worst, std::abs(C(i, j) - want) / (std::abs(alpha) * size + std::abs(beta * C0(i, j)) + 1e-30));
        }
    return worst;
}

void check(Op a, Op b, index_t m, index_t n, index_t k, float alpha, float beta, bool native) {
    bf16_allow_native(native);
    Rng rng(m * 7 + n * 3 + k);
    // operands and result inside larger buffers (leading dimensions above the rows)
    Matrix<float> Abig = a == Op::N ? random_matrix<float>(m + 3, k + 1, rng) : random_matrix<float>(k + 3, m + 1, rng);
    Matrix<float> Bbig = b == Op::N ? random_matrix<float>(k + 2, n, rng) : random_matrix<float>(n + 2, k, rng);
    Matrix<float> Cbig = random_matrix<float>(m + 5, n, rng);
    CMatView<float> A = a == Op::N ? CMatView<float>(Abig.data() + 1, m, k, Abig.shape(0)) : CMatView<float>(Abig.data() + 1, k, m, Abig.shape(0));
    CMatView<float> B = b == Op::N ? CMatView<float>(Bbig.data() + 2, k, n, Bbig.shape(0)) : CMatView<float>(Bbig.data() + 2, n, k, Bbig.shape(0));
    MatView<float> C(Cbig.data() + 4, m, n, Cbig.shape(0));
    std::vector<float> C0(std::size_t(m * n));
    for (index_t j = 0; j < n; ++j)
        for (index_t i = 0; i < m; ++i) C0[std::size_t(i + j * m)] = C(i, j);
    {
        ProductScope bf16(ProductContext{true});
        gemm<float>(a, b, alpha, A, B, beta, C);
    }
    const double err = bf16_error(a, b, alpha, A, B, beta, CMatView<float>(C0.data(), m, n), C);
    EXPECT_LT(err, 4.0 * double(k + 2) * std::ldexp(1.0, -24)) << "m " << m << " n " << n << " k " << k << " native " << native;
    bf16_allow_native(true);
}
}  // namespace

TEST(Bf16, GemmIsTheProductOfRoundedOperands) {
    for (bool native : {true, false})
        for (Op a : {Op::N, Op::T})
            for (Op b : {Op::N, Op::T})
                for (float beta : {0.0f, 1.0f, -0.5f}) {
                    check(a, b, 33, 17, 65, 0.5f, beta, native);
                    check(a, b, 70, 1, 40, 1.0f, beta, native);    // one column: a decoding step
                    check(a, b, 1, 9, 130, -2.0f, beta, native);   // one row
                    check(a, b, 130, 140, 150, 1.0f, beta, native);
                }
}

TEST(Bf16, ScopesNestAndRestore) {
    EXPECT_FALSE(product_context().bf16);
    {
        ProductScope on(ProductContext{true});
        EXPECT_TRUE(product_context().bf16);
        {
            ProductScope off(ProductContext{});
            EXPECT_FALSE(product_context().bf16);
        }
        EXPECT_TRUE(product_context().bf16);
    }
    EXPECT_FALSE(product_context().bf16);
    EXPECT_THROW(parse_precision("bf16"), ValueError);
    EXPECT_EQ(parse_precision("bf16-mixed"), Precision::BF16Mixed);
}

namespace {
// op(W) X with W inside θ (at offset 7, leading dimension ld ≥ its rows) read from θ's bf16 copy, against the float64
// product of the rounded operands; X transposed when b = T, C inside a larger buffer
void check_copy(Op a, Op b, index_t m, index_t n, index_t k, index_t pad, float alpha, float beta, bool native, Rng& rng) {
    bf16_allow_native(native);
    const index_t rows = a == Op::N ? m : k, cols = a == Op::N ? k : m, ld = rows + pad;
    Matrix<float> theta = random_matrix<float>(ld * cols + 7, 1, rng);
    CMatView<float> W(theta.data() + 7, rows, cols, ld);
    Matrix<float> Xs = b == Op::N ? random_matrix<float>(k + 1, n, rng) : random_matrix<float>(n + 2, k, rng);
    CMatView<float> X = b == Op::N ? CMatView<float>(Xs.data(), k, n, k + 1) : CMatView<float>(Xs.data() + 1, n, k, n + 2);
    Matrix<float> Cs = random_matrix<float>(m + 3, n, rng), C0 = Cs;
    MatView<float> C(Cs.data() + 2, m, n, m + 3);
    Bf16Weights copy;
    copy.refresh(theta.data(), theta.size());
    ASSERT_EQ(copy.find(W.data), copy.bits.data() + 7);
    EXPECT_EQ(copy.find(X.data), nullptr);
    {
        ProductScope bf16(ProductContext{true, &copy});
        gemm<float>(a, b, alpha, W, X, beta, C);
    }
    const double err = bf16_error(a, b, alpha, W, X, beta, CMatView<float>(C0.data() + 2, m, n, m + 3), C);
    EXPECT_LT(err, 4.0 * double(k + 2) * std::ldexp(1.0, -24))
        << "m " << m << " n " << n << " k " << k << " ld " << ld << " native " << native;
    for (index_t j = 0; j < n; ++j) {  // the rows around C untouched
        EXPECT_EQ(Cs(0, j), C0(0, j));
        EXPECT_EQ(Cs(m + 2, j), C0(m + 2, j));
    }
    bf16_allow_native(true);
}
}  // namespace

TEST(Bf16, ThetasCopyStandsInForTheWeights) {
    // a weight inside θ times a few columns (decoding) reads θ's bf16 copy (few_columns, bf16.cpp): the same
    // arithmetic — rounded operands, float32 accumulation — on the AVX512_BF16 kernel (where the CPU has it) and
    // the portable loop, for either layout, α and β, odd sizes (rows not a multiple of 32, k odd, one row, k
    // below a vector), strides, every n up to 8 and one above, small and above the threads' threshold
    Rng rng(5);
    for (bool native : {true, false})
        for (Op a : {Op::N, Op::T})
            for (Op b : {Op::N, Op::T}) {
                for (index_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9}) check_copy(a, b, 45, n, 37, 3, 0.5f, -1.0f, native, rng);
                for (index_t k : {1, 2, 3, 5, 31, 32, 33, 64, 67}) check_copy(a, b, 33, 2, k, 1, 1.0f, 0.0f, native, rng);
                for (index_t m : {1, 2, 31, 32, 63, 65, 97}) check_copy(a, b, m, 1, 70, 0, -2.0f, 0.5f, native, rng);
                check_copy(a, b, 1500, 3, 200, 5, 1.0f, 1.0f, native, rng);  // m k > 2^18: in parallel
                check_copy(a, b, 5000, 1, 60, 0, 1.0f, 0.0f, native, rng);   // several row tiles
                check_copy(a, b, 700, 8, 129, 2, 1.0f, 0.0f, native, rng);
            }
    // and it is the copy that the products read (its owner refreshes it when θ changes)
    Matrix<float> W = random_matrix<float>(48, 40, rng), X = random_matrix<float>(40, 3, rng);
    Matrix<float> Y1 = random_matrix<float>(48, 3, rng), Y2 = Y1;
    Bf16Weights copy;
    copy.refresh(W.data(), W.size());
    {
        ProductScope bf16(ProductContext{true, &copy});
        gemm<float>(Op::N, Op::N, 1.0f, view(W), view(X), 0.0f, view(Y1));
    }
    copy.bits[0] = to_bf16(1000.0f);
    {
        ProductScope bf16(ProductContext{true, &copy});
        gemm<float>(Op::N, Op::N, 1.0f, view(W), view(X), 0.0f, view(Y2));
    }
    EXPECT_GT(std::abs(Y2.data()[0] - Y1.data()[0]), 100.0f);
}

namespace {
bool same_bits(const Matrix<float>& a, const Matrix<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace

// affine_backward reads dY in two products (dW += dY Xᵀ, dX += Wᵀ dY): under bf16-mixed it is rounded once, and the
// results are those of rounding at every product (bit for bit), on both paths.
TEST(Bf16, AffineBackwardRoundsItsGradientOnce) {
    for (bool native : {true, false}) {
        bf16_allow_native(native);
        Rng rng(11);
        const index_t m = 96, k = 80, n = 70;
        Matrix<float> W = random_matrix<float>(m, k, rng), X = random_matrix<float>(k, n, rng),
                      dY = random_matrix<float>(m, n, rng);
        Matrix<float> dW0 = random_matrix<float>(m, k, rng), dX0 = random_matrix<float>(k, n, rng);
        Matrix<float> dW = dW0, dX = dX0, dWs = dW0, dXs = dX0;
        ProductScope bf16(ProductContext{true, nullptr, true});
        const std::uint64_t before = bf16_operands_rounded();
        affine_backward<float>(view(W), view(X), view(dY), dW.data(), nullptr, dX.data());
        const std::uint64_t rounded = bf16_operands_rounded() - before;
        // the same two products one at a time: each rounds both its operands
        gemm<float>(Op::N, Op::T, 1.0f, view(dY), view(X), 1.0f, MatView<float>(dWs.data(), m, k, m));
        gemm<float>(Op::T, Op::N, 1.0f, view(W), view(dY), 1.0f, MatView<float>(dXs.data(), k, n, k));
        EXPECT_TRUE(same_bits(dW, dWs)) << "native " << native;
        EXPECT_TRUE(same_bits(dX, dXs)) << "native " << native;
        if (bf16_native()) EXPECT_EQ(rounded, 3u) << "dY, X, W: dY once";  // (W is not in a θ copy here)
        else EXPECT_EQ(rounded, 0u);                                        // emulated: float32 buffers
    }
    bf16_allow_native(true);
}

// Inside a Bf16OperandReuse scope a product that writes over a kept operand drops it: the next product reading that
// buffer rounds its new values.
TEST(Bf16, OperandReuseDropsWhatAProductOverwrites) {
    for (bool native : {true, false}) {
        bf16_allow_native(native);
        Rng rng(12);
        const index_t n = 64;
        Matrix<float> A = random_matrix<float>(n, n, rng), B = random_matrix<float>(n, n, rng);
        Matrix<float> C1 = Matrix<float>::from_shape({std::size_t(n), std::size_t(n)}), C3 = C1, want = C1;
        ProductScope bf16(ProductContext{true, nullptr, true});
        {
            Bf16OperandReuse once;
            gemm<float>(Op::N, Op::N, 1.0f, view(A), view(B), 0.0f, view(C1));      // B kept
            gemm<float>(Op::N, Op::N, 1.0f, view(A), view(C1), 0.0f, view(B));      // B overwritten by a product
            gemm<float>(Op::N, Op::T, 0.5f, view(A), view(B), 0.0f, view(C3));      // reads the new B
        }
        gemm<float>(Op::N, Op::T, 0.5f, view(A), view(B), 0.0f, view(want));        // no scope
        EXPECT_TRUE(same_bits(C3, want)) << "native " << native;
    }
    bf16_allow_native(true);
}

// affine under bf16-mixed adds b in the product (oneDNN's bias where the product runs on bf16 instructions): bit for
// bit the value of b broadcast into Y and the product added with β = 1.
TEST(Bf16, AffineBiasEqualsBroadcastAndAccumulate) {
    const std::vector<std::array<index_t, 3>> shapes{{384, 128, 768}, {512, 128, 768}, {37, 29, 53}, {8, 5, 3}};
    for (bool training : {true, false})
        for (auto [m, k, n] : shapes) {
            Rng rng(m + k + n);
            Matrix<float> W = random_matrix<float>(m, k, rng), X = random_matrix<float>(k, n, rng);
            Matrix<float> b = random_matrix<float>(m, 1, rng);
            Matrix<float> Y = Matrix<float>::from_shape({std::size_t(m), std::size_t(n)}), want = Y;
            ProductScope bf16(ProductContext{true, nullptr, training});
            affine<float>(view(W), view(X), b.data(), view(Y));
            for (index_t j = 0; j < n; ++j)
                for (index_t i = 0; i < m; ++i) want(i, j) = b(i, 0);
            gemm<float>(Op::N, Op::N, 1.0f, view(W), view(X), 1.0f, view(want));
            EXPECT_TRUE(same_bits(Y, want)) << m << " x " << k << " x " << n << " training " << training;
        }
}

// Bf16RoundOnce: the matrices it names are rounded once, whole, when it opens (in a training call on bf16
// instructions), and products on slices of them (a head's rows, a sequence's columns, either transpose) read that
// rounding: bit for bit the results of rounding each slice at every product. A product that writes into one of them
// makes it stale (later products round the new values themselves). Elsewhere (emulated path) it does nothing.
TEST(Bf16, RoundOnceServesSlicesOfItsMatrices) {
    for (bool native : {true, false}) {
        bf16_allow_native(native);
        Rng rng(13);
        const index_t d = 32, n = 40, seq = 20;
        Matrix<float> QKV = random_matrix<float>(3 * d, n, rng), dY = random_matrix<float>(2 * d, n, rng);
        CMatView<float> Q = view(QKV).rows_range(0, d), K = view(QKV).rows_range(d, d), V = view(QKV).rows_range(2 * d, d);
        auto products = [&](std::vector<Matrix<float>>& out) {  // a head's products on slices of Q, K, V and dY
            out.assign(4, Matrix<float>::from_shape({std::size_t(seq), std::size_t(seq)}));
            for (index_t b = 0; b < 2; ++b) {
                CMatView<float> q = Q.cols_range(b * seq, seq), k = K.cols_range(b * seq, seq), v = V.cols_range(b * seq, seq);
                CMatView<float> dy = CMatView<float>(view(dY)).rows_range(d, d).cols_range(b * seq, seq);
                gemm<float>(Op::T, Op::N, 0.5f, k, q, b == 0 ? 0.0f : 1.0f, view(out[0]));   // S = Kᵀ Q
                gemm<float>(Op::T, Op::N, 1.0f, v, dy, b == 0 ? 0.0f : 1.0f, view(out[1]));  // dA = Vᵀ dY
                gemm<float>(Op::T, Op::N, 1.0f, dy, q, b == 0 ? 0.0f : 1.0f, view(out[2]));
                gemm<float>(Op::N, Op::T, 1.0f, view(out[0]), view(out[1]), b == 0 ? 0.0f : 1.0f, view(out[3]));
            }
        };
        std::vector<Matrix<float>> want, got, got_after_write, want_after_write;
        ProductScope bf16(ProductContext{true, nullptr, true});
        products(want);
        std::uint64_t rounded = 0;
        {
            Bf16RoundOnce once({Q, K, V, CMatView<float>(view(dY))}, {d, d, d, d});
            const std::uint64_t before = bf16_operands_rounded();
            products(got);
            rounded = bf16_operands_rounded() - before;
            // a product writes into dY (the scope's promise broken): its rounding is stale
            gemm<float>(Op::N, Op::N, 1.0f, view(got[0]), view(got[1]), 0.0f,
                        view(dY).rows_range(d, seq).cols_range(0, seq));
            products(got_after_write);
        }
        products(want_after_write);
        for (std::size_t i = 0; i < 4; ++i) {
            EXPECT_TRUE(same_bits(got[i], want[i])) << "product " << i << " native " << native;
            EXPECT_TRUE(same_bits(got_after_write[i], want_after_write[i])) << "product " << i << " native " << native;
        }
        // per sequence: only out[0], out[1] of the last product are rounded (2 × 2); Q, K, V, dY never
        if (bf16_native()) EXPECT_EQ(rounded, 4u);
        else EXPECT_EQ(rounded, 0u);
    }
    bf16_allow_native(true);
}

// Bf16AffineInput: affine's forward keeps its input X's rounding and the backward's dW = dY Xᵀ reads it (X rounded
// once per forward and backward), bit for bit the results of rounding X again. The kept rounding is dropped when a
// product writes over X, once it has been read, and when the training call ends: in each case the next backward
// rounds X's values of that time. (Each case fails if the rounding were read after X changed.)
TEST(Bf16, AffineInputKeptFromTheForwardUntilWritten) {
    const index_t m = 96, k = 80, n = 70;
    Rng rng(14);
    Matrix<float> W = random_matrix<float>(m, k, rng), W2 = random_matrix<float>(m, k, rng), b = random_matrix<float>(m, 1, rng);
    Matrix<float> X = random_matrix<float>(k, n, rng), dY = random_matrix<float>(m, n, rng), G = random_matrix<float>(k, k, rng);
    Matrix<float> Y = Matrix<float>::from_shape({std::size_t(m), std::size_t(n)});
    auto dW_of = [&](const Matrix<float>& x) {  // dW = dY xᵀ, rounding x at the product (no kept input can serve it)
        Matrix<float> dW = Matrix<float>::from_shape({std::size_t(m), std::size_t(k)});
        dW.fill(0.0f);
        Matrix<float> copy = x;
        ProductScope bf16(ProductContext{true, nullptr, true});
        affine_backward<float>(view(W), view(copy), view(dY), dW.data(), nullptr, nullptr);
        return dW;
    };
    auto backward = [&](const Matrix<float>& w) {
        Matrix<float> dW = Matrix<float>::from_shape({std::size_t(m), std::size_t(k)});
        dW.fill(0.0f);
        const std::uint64_t r0 = bf16_kept_inputs_read();
        affine_backward<float>(view(w), view(X), view(dY), dW.data(), nullptr, nullptr);
        return std::make_pair(dW, bf16_kept_inputs_read() - r0);
    };
    const std::uint64_t kept = bf16_native() ? 1u : 0u;  // (the emulated path keeps nothing)
    {
        ProductScope bf16(ProductContext{true, nullptr, true});
        affine<float>(view(W), view(X), b.data(), view(Y));  // X kept
        auto [dW, read] = backward(W);
        EXPECT_EQ(read, kept);
        EXPECT_TRUE(same_bits(dW, dW_of(X))) << "read from the forward";
        // read once: X changed by other code after the read, the next backward rounds its new values
        X(3, 4) += 1.0f;
        std::tie(dW, read) = backward(W);
        EXPECT_EQ(read, 0u);
        EXPECT_TRUE(same_bits(dW, dW_of(X))) << "after a read";
        // another weight's backward does not read W's input
        affine<float>(view(W), view(X), b.data(), view(Y));
        std::tie(dW, read) = backward(W2);
        EXPECT_EQ(read, 0u);
        // a product writes over X (its last columns): dropped
        gemm<float>(Op::N, Op::N, 0.5f, view(G), view(X).cols_range(0, 30), 0.0f, view(X).cols_range(n - 30, 30));
        std::tie(dW, read) = backward(W);
        EXPECT_EQ(read, 0u);
        EXPECT_TRUE(same_bits(dW, dW_of(X))) << "after a product wrote X";
        // a later forward on the same X keeps its own rounding
        affine<float>(view(W), view(X), b.data(), view(Y));
        X(5, 6) *= -3.0f;
        affine_add<float>(view(W), view(X), b.data(), view(Y));
        std::tie(dW, read) = backward(W);
        EXPECT_EQ(read, kept);
        EXPECT_TRUE(same_bits(dW, dW_of(X))) << "the latest forward's";
        affine<float>(view(W), view(X), b.data(), view(Y));  // kept until the call ends
    }
    X(7, 8) -= 2.0f;  // between two training calls
    {
        ProductScope bf16(ProductContext{true, nullptr, true});
        auto [dW, read] = backward(W);
        EXPECT_EQ(read, 0u);
        EXPECT_TRUE(same_bits(dW, dW_of(X))) << "a new call";
    }
    // switched off: nothing kept, the same bits
    bf16_allow_kept_inputs(false);
    {
        ProductScope bf16(ProductContext{true, nullptr, true});
        affine<float>(view(W), view(X), b.data(), view(Y));
        auto [dW, read] = backward(W);
        EXPECT_EQ(read, 0u);
        EXPECT_TRUE(same_bits(dW, dW_of(X)));
    }
    bf16_allow_kept_inputs(true);
}

// A training call's small products run our AVX512_BF16 kernel where the CPU has it: bit for bit oneDNN's product
// (its AVX512_BF16 kernel: one float32 sum per entry over the pairs of k in order, α, then β = 1's C added) with
// either transpose, β 0 and 1, α ≠ 1, rows not a multiple of 16, columns not a multiple of the column block,
// results inside a larger matrix; elsewhere (AMX, no AVX512_BF16) the product of the rounded operands.
TEST(Bf16, SmallProductsKernelIsOneDnnsProduct) {
    const std::vector<std::array<index_t, 3>> shapes{{64, 64, 32}, {32, 64, 64}, {64, 64, 64}, {37, 29, 54}, {8, 5, 2}, {50, 70, 40}};
    for (auto [m, n, k] : shapes)
        for (int ta = 0; ta < 2; ++ta)
            for (int tb = 0; tb < 2; ++tb)
                for (float beta : {0.0f, 1.0f}) {
                    const Op a = ta ? Op::T : Op::N, b = tb ? Op::T : Op::N;
                    const float alpha = beta == 0.0f ? 1.0f : 0.17677669f;
                    Rng rng(m + 3 * n + 7 * k + ta + 2 * tb);
                    Matrix<float> A = ta ? random_matrix<float>(k + 3, m, rng) : random_matrix<float>(m + 3, k, rng);
                    Matrix<float> B = tb ? random_matrix<float>(n + 2, k, rng) : random_matrix<float>(k + 2, n, rng);
                    CMatView<float> Av(A.data() + 1, ta ? k : m, ta ? m : k, A.shape(0));
                    CMatView<float> Bv(B.data() + 2, tb ? n : k, tb ? k : n, B.shape(0));
                    Matrix<float> C0 = random_matrix<float>(m + 5, n, rng), ours = C0, theirs = C0;
                    auto run = [&](Matrix<float>& C, bool kernel) {
                        bf16_allow_small_kernel(kernel);
                        ProductScope bf16(ProductContext{true, nullptr, true});
                        gemm<float>(a, b, alpha, Av, Bv, beta, MatView<float>(C.data() + 4, m, n, C.shape(0)));
                        bf16_allow_small_kernel(true);
                    };
                    run(ours, true);
                    run(theirs, false);
                    const std::string what = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                                             " ta " + std::to_string(ta) + " tb " + std::to_string(tb) + " beta " +
                                             std::to_string(beta);
                    if (bf16_small_kernel_runs() && !cpu_has_amx_bf16())
                        EXPECT_TRUE(same_bits(ours, theirs)) << what;
                    const double err = bf16_error(a, b, alpha, Av, Bv, beta,
                                                  CMatView<float>(C0.data() + 4, m, n, C0.shape(0)),
                                                  CMatView<float>(ours.data() + 4, m, n, ours.shape(0)));
                    EXPECT_LT(err, 4.0 * double(k + 2) * std::ldexp(1.0, -24)) << what;
                }
}
