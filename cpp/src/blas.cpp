// Matrix products through xtensor-blas's cxxblas layer (declarations bundled with xtensor-blas; we do not
// include <cblas.h>, which conflicts with them, DESIGN.md "xtensor traps").
#include "formal_transformers/blas.hpp"

#ifndef HAVE_CBLAS
#define HAVE_CBLAS 1
#endif
#include <xflens/cxxblas/cxxblas.cxx>

namespace ft {

namespace {
cxxblas::Transpose tr(Op o) { return o == Op::N ? cxxblas::NoTrans : cxxblas::Trans; }
index_t rows_of(Op o, index_t r, index_t c) { return o == Op::N ? r : c; }
index_t cols_of(Op o, index_t r, index_t c) { return o == Op::N ? c : r; }
}  // namespace

template <class T>
void gemm(Op opA, Op opB, T alpha, CMatView<T> A, CMatView<T> B, T beta, MatView<T> C) {
    const index_t m = rows_of(opA, A.rows, A.cols), k = cols_of(opA, A.rows, A.cols);
    const index_t kb = rows_of(opB, B.rows, B.cols), n = cols_of(opB, B.rows, B.cols);
    FT_CHECK(k == kb && C.rows == m && C.cols == n, "gemm shapes do not conform");
    if (m == 0 || n == 0) return;
    if (k == 0) {  // BLAS may not touch C when k == 0: apply beta ourselves
        for (index_t j = 0; j < n; ++j)
            for (index_t i = 0; i < m; ++i) C(i, j) = beta == T(0) ? T(0) : beta * C(i, j);
        return;
    }
    using I = int;
    // One column (n = 1: every product of one new token in cached decoding) or one row (m = 1): a matrix-
    // vector product. OpenBLAS 0.3.21 sends such gemms through its packing gemm path; its gemv is direct.
    if (n == 1) {  // C[:, 0] = α op(A) b + β C[:, 0], b = op(B)'s single column (stride: B.ld when opB = T)
        cxxblas::gemv<I>(cxxblas::ColMajor, tr(opA), I(A.rows), I(A.cols), alpha, A.data, I(std::max<index_t>(A.ld, 1)),
                         B.data, I(opB == Op::N ? 1 : std::max<index_t>(B.ld, 1)), beta, C.data, I(1));
        return;
    }
    if (m == 1) {  // C[0, :]ᵀ = α op(B)ᵀ a + β C[0, :]ᵀ, a = op(A)'s single row
        const cxxblas::Transpose tb = opB == Op::N ? cxxblas::Trans : cxxblas::NoTrans;
        cxxblas::gemv<I>(cxxblas::ColMajor, tb, I(B.rows), I(B.cols), alpha, B.data, I(std::max<index_t>(B.ld, 1)),
                         A.data, I(opA == Op::N ? std::max<index_t>(A.ld, 1) : 1), beta, C.data,
                         I(std::max<index_t>(C.ld, 1)));
        return;
    }
    cxxblas::gemm<I>(cxxblas::ColMajor, tr(opA), tr(opB), I(m), I(n), I(k), alpha, A.data,
                     I(std::max<index_t>(A.ld, 1)), B.data, I(std::max<index_t>(B.ld, 1)), beta, C.data,
                     I(std::max<index_t>(C.ld, 1)));
}

template <class T>
void gemv(Op opA, T alpha, CMatView<T> A, const T* x, T beta, T* y) {
    const index_t m = rows_of(opA, A.rows, A.cols), k = cols_of(opA, A.rows, A.cols);
    gemm<T>(opA, Op::N, alpha, A, CMatView<T>(x, k, 1), beta, MatView<T>(y, m, 1));
}

template <class T>
void gemm_naive(Op opA, Op opB, T alpha, CMatView<T> A, CMatView<T> B, T beta, MatView<T> C) {
    const index_t m = C.rows, n = C.cols, k = cols_of(opA, A.rows, A.cols);
    for (index_t j = 0; j < n; ++j)
        for (index_t i = 0; i < m; ++i) {
            T s = 0;
            for (index_t p = 0; p < k; ++p) {
                const T a = opA == Op::N ? A(i, p) : A(p, i);
                const T b = opB == Op::N ? B(p, j) : B(j, p);
                s += a * b;
            }
            C(i, j) = alpha * s + (beta == T(0) ? T(0) : beta * C(i, j));
        }
}

template <class T>
void affine(CMatView<T> W, CMatView<T> X, const T* b, MatView<T> Y) {
    if (b) {  // Y <- b 1^T, then Y += W X
        for (index_t j = 0; j < Y.cols; ++j) std::copy(b, b + Y.rows, Y.col(j));
        gemm<T>(Op::N, Op::N, T(1), W, X, T(1), Y);
    } else {
        gemm<T>(Op::N, Op::N, T(1), W, X, T(0), Y);
    }
}

template <class T>
void affine_add(CMatView<T> W, CMatView<T> X, const T* b, MatView<T> Y) {
    gemm<T>(Op::N, Op::N, T(1), W, X, T(1), Y);
    if (b)
        for (index_t j = 0; j < Y.cols; ++j) {
            T* y = Y.col(j);
#pragma omp simd
            for (index_t i = 0; i < Y.rows; ++i) y[i] += b[i];
        }
}

template <class T>
void add_column_sum(CMatView<T> dY, T* db) {
    for (index_t j = 0; j < dY.cols; ++j) {
        const T* c = dY.col(j);
#pragma omp simd
        for (index_t i = 0; i < dY.rows; ++i) db[i] += c[i];
    }
}

template <class T>
void affine_backward(CMatView<T> W, CMatView<T> X, CMatView<T> dY, T* dW, T* db, T* dX, index_t ld_dX) {
    if (dW) gemm<T>(Op::N, Op::T, T(1), dY, X, T(1), MatView<T>(dW, W.rows, W.cols, W.ld));
    if (db) add_column_sum<T>(dY, db);
    if (dX)
        gemm<T>(Op::T, Op::N, T(1), W, dY, T(1),
                MatView<T>(dX, X.rows, X.cols, ld_dX < 0 ? std::max<index_t>(X.rows, 1) : ld_dX));
}

#define FT_INSTANTIATE(T)                                                                      \
    template void gemm<T>(Op, Op, T, CMatView<T>, CMatView<T>, T, MatView<T>);                 \
    template void gemv<T>(Op, T, CMatView<T>, const T*, T, T*);                                \
    template void gemm_naive<T>(Op, Op, T, CMatView<T>, CMatView<T>, T, MatView<T>);           \
    template void affine<T>(CMatView<T>, CMatView<T>, const T*, MatView<T>);                   \
    template void affine_add<T>(CMatView<T>, CMatView<T>, const T*, MatView<T>);               \
    template void affine_backward<T>(CMatView<T>, CMatView<T>, CMatView<T>, T*, T*, T*, index_t); \
    template void add_column_sum<T>(CMatView<T>, T*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft
