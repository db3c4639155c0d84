// Matrix products. Every product in the core is one call of `gemm` below, which is one BLAS gemm
// (OpenBLAS; by default PyPI's scipy-openblas32, see blas.cpp) on the operands' own buffers: transposes
// are flags, sub-blocks are leading dimensions, accumulation is beta = 1. No copies, no temporaries.
// Under a bf16-mixed ProductScope (precision.hpp) a float32 product takes bf16-rounded operands instead
// (oneDNN), accumulating in float32; a parallel region whose threads call gemm carries the caller's scope in.
#pragma once

#include <string>

#include "formal_transformers/common.hpp"
#include "formal_transformers/precision.hpp"

namespace ft {

// ---------------------------------------------------------------------------------------------------
// The BLAS in use.
// "<OpenBLAS config>; kernel <core name>; threads <n> on ...": what `ft.blas_info()` prints.
std::string blas_info();
// The kernel set OpenBLAS chose for this CPU at load time (openblas_get_corename: "Haswell", "SkylakeX",
// "Zen", ...; "Prescott" or "Core2" are its generic fallbacks).
std::string blas_kernel();
// Threads of the BLAS's parallel jobs (set_num_threads keeps them equal to the OpenMP pool's).
void blas_set_num_threads(int n);
int blas_get_num_threads();
// True when the BLAS runs its parallel jobs on our OpenMP pool (our threads callback, or OpenBLAS's own
// OpenMP build): only then may a gemm be called from inside our parallel regions (small products run on
// the calling thread; a large one gets its own team, never a wait for a busy thread).
bool blas_is_openmp();

enum class Op { N, T };  // use A as stored, or its transpose

// C <- alpha * op(A) * op(B) + beta * C
// op(A):[m,k], op(B):[k,n], C:[m,n]. One column (n = 1) or one row (m = 1) goes to BLAS's gemv.
template <class T>
void gemm(Op opA, Op opB, T alpha, CMatView<T> A, CMatView<T> B, T beta, MatView<T> C);

// The same product as gemm, as ONE BLAS call on the calling thread: never split into slices over threads
// or into row blocks for OpenBLAS's small-matrix kernels (blas.cpp). Tests hold gemm's splits against it.
// m, n, k > 0.
template <class T>
void gemm_unsplit(Op opA, Op opB, T alpha, CMatView<T> A, CMatView<T> B, T beta, MatView<T> C);

// y <- alpha * op(A) * x + beta * y   (a gemm with one column, which gemm hands to BLAS's gemv)
// op(A):[m,k], x:[k], y:[m]
template <class T>
void gemv(Op opA, T alpha, CMatView<T> A, const T* x, T beta, T* y);

// The naive triple loop, kept beside the fast path so tests can hold one against the other.
template <class T>
void gemm_naive(Op opA, Op opB, T alpha, CMatView<T> A, CMatView<T> B, T beta, MatView<T> C);

// ---------------------------------------------------------------------------------------------------
// Affine maps of the listings, Y = W X + b 1^T, and their gradients. Shapes in the comments.

// Y <- W X + b 1^T          W:[m,k], X:[k,n], b:[m] (may be null), Y:[m,n]
template <class T>
void affine(CMatView<T> W, CMatView<T> X, const T* b, MatView<T> Y);

// Y += W X + b 1^T         (a residual update: X ← X + W A + b 1ᵀ in one gemm with beta = 1)
template <class T>
void affine_add(CMatView<T> W, CMatView<T> X, const T* b, MatView<T> Y);

// Given dY for Y = W X + b 1^T:
//   dW += dY X^T,   db += dY 1 (row sums),   dX += W^T dY   (any of dW, db, dX may be null)
template <class T>
void affine_backward(CMatView<T> W, CMatView<T> X, CMatView<T> dY, T* dW, T* db, T* dX, index_t ld_dX = -1);

// db += dY 1   (sum of the columns of dY)          dY:[m,n], db:[m]
template <class T>
void add_column_sum(CMatView<T> dY, T* db);

}  // namespace ft
