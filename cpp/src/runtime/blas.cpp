// Matrix products: every product of the core is one CBLAS call on the operands' own buffers.
//
// The BLAS (docs/design.md "BLAS"): by default OpenBLAS from PyPI's scipy-openblas32 — a current OpenBLAS
// (0.3.28 or later) built with DYNAMIC_ARCH, whose run-time kernel choice knows today's CPUs and falls back
// on the CPU's features (AVX2, AVX-512) for models newer than the library. Its symbols carry a prefix
// (FT_BLAS_PREFIX = scipy_), so it never collides with numpy's copy. Any other CBLAS can be chosen at
// configure time (-DFT_BLAS=system: no prefix), e.g. Debian's OpenMP build of OpenBLAS.
//
// Threads: scipy-openblas32 is a pthreads build with a pool of its own, which would fight our OpenMP
// pool. OpenBLAS (0.3.27+) lets the application run its parallel work instead: we install
// `run_blas_jobs` below, so every multi-threaded BLAS call runs its jobs on our OpenMP threads — one pool
// for the element-wise kernels and the BLAS, as with OpenBLAS's own OpenMP build.
#include "formal_transformers/affine_set.hpp"
#include "formal_transformers/bf16_products.hpp"
#include "formal_transformers/blas.hpp"

#include "formal_transformers/precision.hpp"
#include "cpu_level.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef FT_BLAS_PREFIX
#define FT_BLAS_PREFIX
#endif
#define FT_BLAS_CAT2(a, b) a##b
#define FT_BLAS_CAT(a, b) FT_BLAS_CAT2(a, b)
#define FT_BLAS(name) FT_BLAS_CAT(FT_BLAS_PREFIX, name)
#define FT_STR2(x) #x
#define FT_STR(x) FT_STR2(x)

// The CBLAS and OpenBLAS entry points we use, declared here (xtensor-blas's bundled declarations name
// the unprefixed symbols; <cblas.h> conflicts with them, DESIGN notes). Enums are passed as their int
// values: CblasColMajor = 102, CblasNoTrans = 111, CblasTrans = 112.
extern "C" {
void FT_BLAS(cblas_sgemm)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                          int);
void FT_BLAS(cblas_dgemm)(int, int, int, int, int, int, double, const double*, int, const double*, int, double,
                          double*, int);
void FT_BLAS(cblas_sgemv)(int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
void FT_BLAS(cblas_dgemv)(int, int, int, int, double, const double*, int, const double*, int, double, double*, int);
void FT_BLAS(openblas_set_num_threads)(int);
int FT_BLAS(openblas_get_num_threads)(void);
char* FT_BLAS(openblas_get_config)(void);
char* FT_BLAS(openblas_get_corename)(void);
int FT_BLAS(openblas_get_parallel)(void);
// OpenBLAS 0.3.27+: hand the library's parallel jobs to the application's threads. Weak: older builds
// (Debian 12's 0.3.21) lack it, and then their own threading is used.
typedef void (*ft_blas_dojob_t)(int thread_num, void* jobdata, int dojob_data);
typedef void (*ft_blas_threads_t)(int sync, ft_blas_dojob_t dojob, int numjobs, std::size_t jobdata_elsize,
                                  void* jobdata, int dojob_data);
void FT_BLAS(openblas_set_threads_callback_function)(ft_blas_threads_t) __attribute__((weak));
}

namespace ft {

namespace {
constexpr int kColMajor = 102, kNoTrans = 111, kTrans = 112;
int tr(Op o) { return o == Op::N ? kNoTrans : kTrans; }
index_t rows_of(Op o, index_t r, index_t c) { return o == Op::N ? r : c; }
index_t cols_of(Op o, index_t r, index_t c) { return o == Op::N ? c : r; }

inline void xgemm(int ta, int tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
                  float beta, float* C, int ldc) {
    FT_BLAS(cblas_sgemm)(kColMajor, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void xgemm(int ta, int tb, int m, int n, int k, double alpha, const double* A, int lda, const double* B,
                  int ldb, double beta, double* C, int ldc) {
    FT_BLAS(cblas_dgemm)(kColMajor, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void xgemv(int ta, int m, int n, float alpha, const float* A, int lda, const float* x, int incx, float beta,
                  float* y, int incy) {
    FT_BLAS(cblas_sgemv)(kColMajor, ta, m, n, alpha, A, lda, x, incx, beta, y, incy);
}
inline void xgemv(int ta, int m, int n, double alpha, const double* A, int lda, const double* x, int incx,
                  double beta, double* y, int incy) {
    FT_BLAS(cblas_dgemv)(kColMajor, ta, m, n, alpha, A, lda, x, incx, beta, y, incy);
}

// OpenBLAS's parallel jobs on our OpenMP pool. The jobs of one call synchronise with each other (level-3
// threads share packed panels and wait for each other's flags), so they must all run at the same time: one
// job per thread of a team of `numjobs`. Where OpenMP gives a smaller team (a call from inside one of our
// parallel regions, where nesting is off, or a thread limit), the missing jobs get threads of their own
// rather than waiting for a thread that would never come.
void run_blas_jobs(int /*sync*/, ft_blas_dojob_t dojob, int numjobs, std::size_t size, void* jobs, int arg) {
    char* base = static_cast<char*>(jobs);
    auto job = [&](int i) { dojob(i, base + std::size_t(i) * size, arg); };
    if (numjobs <= 1) {
        if (numjobs == 1) job(0);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(numjobs)
    {
        const int t = omp_get_thread_num(), team = omp_get_num_threads();
        std::vector<std::thread> extra;
        if (t == 0)
            for (int i = team; i < numjobs; ++i) extra.emplace_back(job, i);
        job(t);
        for (auto& th : extra) th.join();
    }
#else
    std::vector<std::thread> extra;
    for (int i = 1; i < numjobs; ++i) extra.emplace_back(job, i);
    job(0);
    for (auto& th : extra) th.join();
#endif
}

bool install_blas_threads() {
    if (FT_BLAS(openblas_set_threads_callback_function) == nullptr) return false;
    FT_BLAS(openblas_set_threads_callback_function)(&run_blas_jobs);
    // Our gemm splits each large product into slices on our own threads (gemm below), each slice one BLAS
    // call on one thread: the library itself stays at one thread. (Its jobs would run on our pool anyway,
    // through the callback above, should anything raise its count.)
    FT_BLAS(openblas_set_num_threads)(1);
    return true;
}

// The thread count of our products (set_num_threads): only used while our gemm splits products itself.
int& split_threads() {
#ifdef _OPENMP
    static int n = omp_get_max_threads();
#else
    static int n = 1;
#endif
    return n;
}

// Installed once, before the first product (and by blas_set_num_threads / blas_info).
bool blas_threads_are_ours() {
    static const bool ours = install_blas_threads();
    return ours;
}
}  // namespace

bool blas_is_openmp() {
    static const bool shared = blas_threads_are_ours() || FT_BLAS(openblas_get_parallel)() == 2;
    return shared;
}

void blas_set_num_threads(int n) {
    if (blas_threads_are_ours())
        split_threads() = n;
    else
        FT_BLAS(openblas_set_num_threads)(n);
}

int blas_get_num_threads() {
    if (blas_threads_are_ours()) return split_threads();
    return FT_BLAS(openblas_get_num_threads)();
}

std::string blas_kernel() { return FT_BLAS(openblas_get_corename)(); }

std::string blas_info() {
    const bool ours = blas_threads_are_ours();
    std::string s = FT_BLAS(openblas_get_config)();
    while (!s.empty() && s.front() == ' ') s.erase(s.begin());
    while (!s.empty() && s.back() == ' ') s.pop_back();
    s += "; kernel " + blas_kernel();
    s += "; threads " + std::to_string(blas_get_num_threads());
    if (ours)
        s += " on formal_transformers' OpenMP pool (products split into one-thread BLAS calls)";
    else if (FT_BLAS(openblas_get_parallel)() == 2)
        s += " on the OpenMP pool (OpenBLAS's OpenMP build)";
    else
        s += " (the library's own pool)";
    s += "; symbols '" FT_STR(FT_BLAS_PREFIX) "'";
    s += "; " + bf16_info();
    s += std::string("; our kernels ") + cpu_level_info();
    return s;
}

namespace {
// One product on the calling thread's BLAS (one thread when the library's threads are ours): gemv for one
// column or one row, else gemm. Shapes already checked, m, n, k > 0.
template <class T>
void gemm_call(Op opA, Op opB, index_t m, index_t n, index_t k, T alpha, CMatView<T> A, CMatView<T> B, T beta,
               MatView<T> C) {
    using I = int;
    // One column (n = 1: every product of one new token in cached decoding) or one row (m = 1): a matrix-
    // vector product. OpenBLAS 0.3.21 sends such gemms through its packing gemm path; its gemv is direct.
    if (n == 1) {  // C[:, 0] = α op(A) b + β C[:, 0], b = op(B)'s single column (stride: B.ld when opB = T)
        xgemv(tr(opA), I(A.rows), I(A.cols), alpha, A.data, I(std::max<index_t>(A.ld, 1)), B.data,
              I(opB == Op::N ? 1 : std::max<index_t>(B.ld, 1)), beta, C.data, I(1));
        return;
    }
    if (m == 1) {  // C[0, :]ᵀ = α op(B)ᵀ a + β C[0, :]ᵀ, a = op(A)'s single row
        const int tb = opB == Op::N ? kTrans : kNoTrans;
        xgemv(tb, I(B.rows), I(B.cols), alpha, B.data, I(std::max<index_t>(B.ld, 1)), A.data,
              I(opA == Op::N ? std::max<index_t>(A.ld, 1) : 1), beta, C.data, I(std::max<index_t>(C.ld, 1)));
        return;
    }
    xgemm(tr(opA), tr(opB), I(m), I(n), I(k), alpha, A.data, I(std::max<index_t>(A.ld, 1)), B.data,
          I(std::max<index_t>(B.ld, 1)), beta, C.data, I(std::max<index_t>(C.ld, 1)));
}

// A weight times a few columns (decoding a few tokens with the KV cache, speculative decoding's verify pass):
// C = op(A) op(B) with n ≤ kSkinny columns. OpenBLAS (0.3.34, SkylakeX kernels, SMALL_MATRIX_OPT) runs a
// product of at most 10^6 multiply-adds through its direct "small matrix" kernels, which read the operands
// in place; above that it packs the whole of op(A) into a buffer first, and for 2–8 columns that copy costs
// more than the product (docs/design.md "BLAS"; the timings in docs/benchmarks.md). So a skinny product above the
// threshold becomes a few calls on blocks of C's rows (and A's, A not transposed), each ≤ kSmallWork
// multiply-adds, one after the other on the calling thread. Every entry of C is still one BLAS dot product
// over the whole of k; only the kernel that computes it changes. Up to 8 columns in float32; in float64 up to
// 4 (with the weights streamed from memory, float64 row blocks were slower than one gemm at 7–8 columns).
constexpr double kSmallWork = 1e6;  // OpenBLAS's sgemm_small_kernel_permit (SkylakeX): M·N·K ≤ 100³
constexpr index_t kRowAlign = 16;
template <class T>
constexpr index_t kSkinny = std::is_same_v<T, float> ? 8 : 4;

template <class T>
void gemm_rows(Op opA, Op opB, index_t m, index_t n, index_t k, T alpha, CMatView<T> A, CMatView<T> B, T beta,
               MatView<T> C) {
    const double work = double(m) * double(n) * double(k);
    if (opA != Op::N || n < 2 || n > kSkinny<T> || work <= kSmallWork || double(kRowAlign) * n * k > kSmallWork) {
        gemm_call<T>(opA, opB, m, n, k, alpha, A, B, beta, C);
        return;
    }
    // equal blocks of a multiple of kRowAlign rows (the last one shorter), each within kSmallWork
    const index_t blocks = index_t(std::ceil(work / kSmallWork));
    index_t step = ((m + blocks - 1) / blocks + kRowAlign - 1) / kRowAlign * kRowAlign;
    while (step > kRowAlign && double(step) * n * k > kSmallWork) step -= kRowAlign;
    for (index_t o = 0; o < m; o += step) {  // C[o:o+w, :] = α A[o:o+w, :] op(B) + β C[o:o+w, :]
        const index_t w = std::min(step, m - o);
        gemm_call<T>(opA, opB, w, n, k, alpha, CMatView<T>(A.data + o, w, A.cols, A.ld), B, beta, C.rows_range(o, w));
    }
}

// How a product is split over threads (gemm below): into slices of C's columns (or rows, when C is tall),
// each one single-threaded BLAS call. Below kSplitWork multiply-adds a product stays on one thread (a
// parallel region costs more); a slice is at least kMinSlice columns (rows) wide, slice edges on multiples
// of kAlign; up to kSlicesPerThread slices per thread, taken dynamically, so that a thread the system
// preempts (a busy machine) leaves its remaining slices to the others instead of stalling the product.
constexpr double kSplitWork = double(1 << 20);
constexpr index_t kMinSlice = 64, kAlign = 16, kSlicesPerThread = 2;
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
    if constexpr (std::is_same_v<T, float>) {
        if (product_context().bf16) {  // mixed precision (precision.hpp): bf16 operands, float32 accumulation
            gemm_bf16(opA == Op::N ? 0 : 1, opB == Op::N ? 0 : 1, m, n, k, alpha, A.data, std::max<index_t>(A.ld, 1),
                      B.data, std::max<index_t>(B.ld, 1), beta, C.data, std::max<index_t>(C.ld, 1));
            return;
        }
    }
    int team = 1;
#ifdef _OPENMP
    // Our split needs the library at one thread (ours) and is pointless inside one of our parallel regions.
    if (blas_threads_are_ours() && !omp_in_parallel()) team = std::min(split_threads(), omp_get_max_threads());
#else
    blas_threads_are_ours();
#endif
    const bool by_cols = n >= m;  // slice the longer side of C
    const index_t len = by_cols ? n : m;
    index_t slices = std::min<index_t>(index_t(team) * kSlicesPerThread, len / kMinSlice);
    if (team <= 1 || double(m) * double(n) * double(k) < kSplitWork || slices < 2) {
        gemm_rows<T>(opA, opB, m, n, k, alpha, A, B, beta, C);
        return;
    }
    if (slices < 2 * index_t(team)) slices = std::min<index_t>(slices, team);  // few slices: one per thread
    const index_t step = (len / slices + kAlign - 1) / kAlign * kAlign;
    slices = (len + step - 1) / step;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
    for (index_t s = 0; s < slices; ++s) {
        const index_t o = s * step, w = std::min(step, len - o);
        if (by_cols) {  // C[:, o:o+w] = α op(A) op(B)[:, o:o+w] + β C[:, o:o+w]
            CMatView<T> Bs = opB == Op::N ? CMatView<T>(B.data + o * B.ld, B.rows, w, B.ld)
                                          : CMatView<T>(B.data + o, w, B.cols, B.ld);
            gemm_call<T>(opA, opB, m, w, k, alpha, A, Bs, beta, C.cols_range(o, w));
        } else {  // C[o:o+w, :] = α op(A)[o:o+w, :] op(B) + β C[o:o+w, :]
            CMatView<T> As = opA == Op::N ? CMatView<T>(A.data + o, w, A.cols, A.ld)
                                          : CMatView<T>(A.data + o * A.ld, A.rows, w, A.ld);
            gemm_rows<T>(opA, opB, w, n, k, alpha, As, B, beta, C.rows_range(o, w));
        }
    }
}

template <class T>
void gemm_unsplit(Op opA, Op opB, T alpha, CMatView<T> A, CMatView<T> B, T beta, MatView<T> C) {
    const index_t m = rows_of(opA, A.rows, A.cols), k = cols_of(opA, A.rows, A.cols);
    FT_CHECK(k == rows_of(opB, B.rows, B.cols) && C.rows == m && C.cols == cols_of(opB, B.rows, B.cols) && m > 0 &&
                 C.cols > 0 && k > 0,
             "gemm_unsplit shapes do not conform");
    if constexpr (std::is_same_v<T, float>) {
        if (product_context().bf16) {
            gemm_bf16(opA == Op::N ? 0 : 1, opB == Op::N ? 0 : 1, m, C.cols, k, alpha, A.data, std::max<index_t>(A.ld, 1),
                      B.data, std::max<index_t>(B.ld, 1), beta, C.data, std::max<index_t>(C.ld, 1));
            return;
        }
    }
    blas_threads_are_ours();
    gemm_call<T>(opA, opB, m, C.cols, k, alpha, A, B, beta, C);
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
    Bf16AffineInput input(W.data, Bf16Input::Keep);  // bf16-mixed: X's rounding kept for the backward's dW
    if constexpr (std::is_same_v<T, float>) {  // bf16-mixed on bf16 instructions: b added as the sums are stored
        if (b && W.rows > 0 && X.cols > 0 && W.cols > 0 && W.cols == X.rows && Y.rows == W.rows && Y.cols == X.cols &&
            affine_bf16(W.rows, X.cols, W.cols, W.data, std::max<index_t>(W.ld, 1), X.data, std::max<index_t>(X.ld, 1),
                        b, Y.data, std::max<index_t>(Y.ld, 1)))
            return;
    }
    if (b) {  // Y <- b 1^T, then Y += W X
        for (index_t j = 0; j < Y.cols; ++j) std::copy(b, b + Y.rows, Y.col(j));
        gemm<T>(Op::N, Op::N, T(1), W, X, T(1), Y);
    } else {
        gemm<T>(Op::N, Op::N, T(1), W, X, T(0), Y);
    }
}

template <class T>
void affine_add(CMatView<T> W, CMatView<T> X, const T* b, MatView<T> Y) {
    Bf16AffineInput input(W.data, Bf16Input::Keep);  // bf16-mixed: X's rounding kept for the backward's dW
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

namespace {
// dX_beta 1: dX += Wᵀ dY (affine_backward); 0: dX = Wᵀ dY (affine_backward_set)
template <class T>
void affine_backward_into(CMatView<T> W, CMatView<T> X, CMatView<T> dY, T* dW, T* db, T* dX, index_t ld_dX,
                          T dX_beta) {
    Bf16OperandReuse once;  // bf16-mixed: dY rounded once for both products
    if (dW) {
        Bf16AffineInput input(W.data, Bf16Input::Read);  // bf16-mixed: X rounded by the forward's product
        gemm<T>(Op::N, Op::T, T(1), dY, X, T(1), MatView<T>(dW, W.rows, W.cols, W.ld));
    }
    if (db) add_column_sum<T>(dY, db);
    if (dX)
        gemm<T>(Op::T, Op::N, T(1), W, dY, dX_beta,
                MatView<T>(dX, X.rows, X.cols, ld_dX < 0 ? std::max<index_t>(X.rows, 1) : ld_dX));
}
}  // namespace

template <class T>
void affine_backward(CMatView<T> W, CMatView<T> X, CMatView<T> dY, T* dW, T* db, T* dX, index_t ld_dX) {
    affine_backward_into<T>(W, X, dY, dW, db, dX, ld_dX, T(1));
}
// dX = Wᵀ dY: on bf16 instructions (oneDNN) a product with beta 0, which neither zero-fills nor reads dX; through
// the BLAS zeros then beta 1 (OpenBLAS's beta-0 pass over C measured slower than the fill: docs/benchmarks.md)
template <class T>
void affine_backward_set(CMatView<T> W, CMatView<T> X, CMatView<T> dY, T* dW, T* db, T* dX, index_t ld_dX) {
    if (std::is_same_v<T, float> && dX && product_context().bf16 && bf16_native())
        return affine_backward_into<T>(W, X, dY, dW, db, dX, ld_dX, T(0));
    if (dX) {
        MatView<T> d(dX, X.rows, X.cols, ld_dX < 0 ? std::max<index_t>(X.rows, 1) : ld_dX);
        for (index_t j = 0; j < d.cols; ++j) std::fill(d.col(j), d.col(j) + d.rows, T(0));
    }
    affine_backward_into<T>(W, X, dY, dW, db, dX, ld_dX, T(1));
}

#define FT_INSTANTIATE(T)                                                                      \
    template void gemm<T>(Op, Op, T, CMatView<T>, CMatView<T>, T, MatView<T>);                 \
    template void gemm_unsplit<T>(Op, Op, T, CMatView<T>, CMatView<T>, T, MatView<T>);         \
    template void gemv<T>(Op, T, CMatView<T>, const T*, T, T*);                                \
    template void gemm_naive<T>(Op, Op, T, CMatView<T>, CMatView<T>, T, MatView<T>);           \
    template void affine<T>(CMatView<T>, CMatView<T>, const T*, MatView<T>);                   \
    template void affine_add<T>(CMatView<T>, CMatView<T>, const T*, MatView<T>);               \
    template void affine_backward<T>(CMatView<T>, CMatView<T>, CMatView<T>, T*, T*, T*, index_t); \
    template void affine_backward_set<T>(CMatView<T>, CMatView<T>, CMatView<T>, T*, T*, T*, index_t); \
    template void add_column_sum<T>(CMatView<T>, T*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft
