// Our register-blocked tile products for Algorithm T (TileKernel::Blocked; tiled_attention.cpp, internal to it).
//
// The tiles' products have one short dimension (d_attn or d_v: 32 for the baby GPT, 64 for GPT-2), so a BLAS
// call on a tile spends much of its time packing its two operands into its own layout, again for every tile
// (and at ℓ 8192 K and V do not fit the L2 cache, so they are packed from memory once per query block). These
// kernels read the operands where they are, except the Xᵀ of T1 line 4 / T2 lines 3–4 (S = K_Iᵀ Q_J,
// dP = V_Iᵀ dṼ_J), whose columns are packed ONCE PER HEAD into strips of R = 2W keys (pack_strips), and keep a
// block of the product in vector registers over the whole short dimension:
//   strips_tn  C[nk, nq] = Xᵀ Y      a block of R keys × 6 queries: per entry p of the short dimension, two
//                                    vector loads of the strip and six broadcasts of Y(p, j), twelve FMAs
//   mix        C[m, n] += α A op(M)  vectorised over A's contiguous columns (m = d): a block of 2W rows × 6
//                                    columns of C in registers; per entry t of the long dimension, two vector
//                                    loads of A's column t and six broadcasts of M's entries (P or dS)
// strips_tn's block can also finish T2's pointwise lines while it is in registers (Epilogue): line 3's
// P = exp(S − λ_j) (on an all-allowed tile with no score bias) and line 5's dS = P ⊙ (dP − D_j).
#pragma once

#include <algorithm>

#include <xsimd/xsimd.hpp>

#include "formal_transformers/common.hpp"

namespace ft::tile {

template <class T>
using B = xsimd::batch<T>;
template <class T>
constexpr index_t W = index_t(B<T>::size);
template <class T>
constexpr index_t R = 2 * W<T>;  // keys per strip (two vectors)

// X:[d, n] (column t contiguous) -> strips of Xᵀ: strip s holds X(p, sR + r) at [(s·d + p)·R + r], zeros past n.
// out holds ⌈n/R⌉·R·d entries.
template <class T>
void pack_strips(CMatView<T> X, T* out) {
    const index_t d = X.rows, n = X.cols;
    for (index_t s = 0; s * R<T> < n; ++s) {
        T* o = out + s * d * R<T>;
        for (index_t r = 0; r < R<T>; ++r) {
            const index_t t = s * R<T> + r;
            if (t < n) {
                const T* x = X.col(t);
                for (index_t p = 0; p < d; ++p) o[p * R<T> + r] = x[p];
            } else {
                for (index_t p = 0; p < d; ++p) o[p * R<T> + r] = T(0);
            }
        }
    }
}

// What strips_tn writes for the entry (key r, query c) of its block, from the accumulator a = (Xᵀ Y)(r, c):
enum class Epi {
    Scale,  // α a                               (S of T1 line 4 / T2 line 3, before masking; dP of T2 line 4)
    Exp,    // exp(α a − v[c])                   (T2 line 3: P = exp(S − λ_j) where nothing is masked or biased)
    DS,     // P(r, c) (a − v[c]), P read from C2 (T2 line 5: dS = P ⊙ (dP − D_j), with no dropout)
};

// C[r_lo:r_hi, 0:NC] (C points at row r_lo) from one strip of R keys against NC columns of Y (Y(p, c) at
// Y[p + c·ldy]); v: the column's λ or D (Exp, DS); C2: P beside C (DS), same leading dimension
template <class T, int NC, Epi E>
inline void strip_block(const T* strip, index_t d, const T* Y, index_t ldy, T alpha, const T* v, const T* C2, T* C,
                        index_t ldc, index_t r_lo, index_t r_hi) {
    B<T> a0[NC], a1[NC];
    for (int c = 0; c < NC; ++c) a0[c] = a1[c] = B<T>(T(0));
    for (index_t p = 0; p < d; ++p) {
        const B<T> x0 = B<T>::load_unaligned(strip + p * R<T>), x1 = B<T>::load_unaligned(strip + p * R<T> + W<T>);
        for (int c = 0; c < NC; ++c) {
            const B<T> y(Y[p + c * ldy]);
            a0[c] = xsimd::fma(x0, y, a0[c]);
            a1[c] = xsimd::fma(x1, y, a1[c]);
        }
    }
    const B<T> va(alpha);
    const bool whole = r_lo == 0 && r_hi == R<T>;
    alignas(64) T tmp[R<T>];
    for (int c = 0; c < NC; ++c) {
        B<T> o0, o1;
        if constexpr (E == Epi::Scale) {
            o0 = va * a0[c], o1 = va * a1[c];
        } else if constexpr (E == Epi::Exp) {
            const B<T> vl(v[c]);
            o0 = xsimd::exp(va * a0[c] - vl), o1 = xsimd::exp(va * a1[c] - vl);
        } else {
            const B<T> vD(v[c]);
            const T* p = C2 + c * ldc - r_lo;  // P's strip (rows before r_lo / past r_hi are never read)
            if (whole) {
                o0 = B<T>::load_unaligned(p) * (a0[c] - vD), o1 = B<T>::load_unaligned(p + W<T>) * (a1[c] - vD);
            } else {
                (a0[c] - vD).store_aligned(tmp), (a1[c] - vD).store_aligned(tmp + W<T>);
                for (index_t r = r_lo; r < r_hi; ++r) C[c * ldc + r - r_lo] = p[r] * tmp[r];
                continue;
            }
        }
        if (whole) {
            o0.store_unaligned(C + c * ldc);
            o1.store_unaligned(C + c * ldc + W<T>);
        } else {
            o0.store_aligned(tmp), o1.store_aligned(tmp + W<T>);
            std::copy(tmp + r_lo, tmp + r_hi, C + c * ldc);
        }
    }
}

// C:[nk, nq] ← epilogue(X_Iᵀ Y), X_I the columns a0 … a0+nk−1 of X packed by pack_strips (d rows), Y:[d, nq];
// v[0:nq] (Exp: λ_J, DS: D_J), P:[nk, nq] with C's leading dimension (DS)
template <class T, Epi E = Epi::Scale>
void strips_tn(const T* Xs, index_t d, index_t a0, index_t nk, T alpha, CMatView<T> Y, MatView<T> C,
               const T* v = nullptr, const T* P = nullptr) {
    constexpr int NC = 6;
    const index_t nq = Y.cols;
    for (index_t s = a0 / R<T>; s * R<T> < a0 + nk; ++s) {
        const index_t lo = std::max(a0, s * R<T>) - s * R<T>, hi = std::min(a0 + nk, (s + 1) * R<T>) - s * R<T>;
        const T* strip = Xs + s * d * R<T>;
        const index_t row = s * R<T> + lo - a0;  // C's row of the strip's row lo
        T* Cr = C.data + row;
        const T* Pr = P ? P + row : nullptr;
        index_t j = 0;
        auto at = [&](index_t j) { return std::make_tuple(Y.col(j), v ? v + j : nullptr, Pr ? Pr + j * C.ld : nullptr, Cr + j * C.ld); };
        for (; j + NC <= nq; j += NC) {
            auto [y, vv, pp, cc] = at(j);
            strip_block<T, NC, E>(strip, d, y, Y.ld, alpha, vv, pp, cc, C.ld, lo, hi);
        }
        if (j == nq) continue;
        auto [y, vv, pp, cc] = at(j);
        switch (nq - j) {
            case 5: strip_block<T, 5, E>(strip, d, y, Y.ld, alpha, vv, pp, cc, C.ld, lo, hi); break;
            case 4: strip_block<T, 4, E>(strip, d, y, Y.ld, alpha, vv, pp, cc, C.ld, lo, hi); break;
            case 3: strip_block<T, 3, E>(strip, d, y, Y.ld, alpha, vv, pp, cc, C.ld, lo, hi); break;
            case 2: strip_block<T, 2, E>(strip, d, y, Y.ld, alpha, vv, pp, cc, C.ld, lo, hi); break;
            default: strip_block<T, 1, E>(strip, d, y, Y.ld, alpha, vv, pp, cc, C.ld, lo, hi); break;
        }
    }
}

// C[0:NV·W, 0:NC] += α Σ_t A[:, t] op(M)[t, 0:NC]: NV vectors of A's rows; M's entry (t, c) at M[t·st + c·sc]
template <class T, int NV, int NC>
inline void mix_block(const T* A, index_t lda, index_t k, const T* M, index_t st, index_t sc, T alpha, T* C,
                      index_t ldc) {
    B<T> acc[NV][NC];
    for (int v = 0; v < NV; ++v)
        for (int c = 0; c < NC; ++c) acc[v][c] = B<T>(T(0));
    for (index_t t = 0; t < k; ++t) {  // (the NV loads first, then each broadcast used at once: 2·6 + 2 + 1
        B<T> x[NV];                       // vector registers, no spill)
        for (int v = 0; v < NV; ++v) x[v] = B<T>::load_unaligned(A + t * lda + v * W<T>);
        const T* m = M + t * st;
        for (int c = 0; c < NC; ++c) {
            const B<T> y(m[c * sc]);
            for (int v = 0; v < NV; ++v) acc[v][c] = xsimd::fma(x[v], y, acc[v][c]);
        }
    }
    const B<T> va(alpha);
    for (int c = 0; c < NC; ++c)
        for (int v = 0; v < NV; ++v) {
            T* o = C + c * ldc + v * W<T>;
            xsimd::fma(va, acc[v][c], B<T>::load_unaligned(o)).store_unaligned(o);
        }
}

template <class T, int NV>
void mix_rows(const T* A, index_t lda, index_t k, const T* M, index_t st, index_t sc, index_t n, T alpha, T* C,
              index_t ldc) {
    constexpr int NC = 6;
    index_t j = 0;
    for (; j + NC <= n; j += NC) mix_block<T, NV, NC>(A, lda, k, M + j * sc, st, sc, alpha, C + j * ldc, ldc);
    if (j == n) return;
    const T* Mj = M + j * sc;
    T* Cj = C + j * ldc;
    switch (n - j) {
        case 5: mix_block<T, NV, 5>(A, lda, k, Mj, st, sc, alpha, Cj, ldc); break;
        case 4: mix_block<T, NV, 4>(A, lda, k, Mj, st, sc, alpha, Cj, ldc); break;
        case 3: mix_block<T, NV, 3>(A, lda, k, Mj, st, sc, alpha, Cj, ldc); break;
        case 2: mix_block<T, NV, 2>(A, lda, k, Mj, st, sc, alpha, Cj, ldc); break;
        default: mix_block<T, NV, 1>(A, lda, k, Mj, st, sc, alpha, Cj, ldc); break;
    }
}

// C:[m, n] += α A op(M), A:[m, k] (columns contiguous), op(M):[k, n] = M or (trans) Mᵀ: Ṽ_J += V_I P and
// dQ_J += K_I dS (M = P, dS), dV_I += dṼ_J Pᵀ and dK_I += Q_J dSᵀ (trans)
template <class T>
void mix(CMatView<T> A, CMatView<T> M, bool trans, T alpha, MatView<T> C) {
    const index_t m = C.rows, n = C.cols, k = A.cols;
    const index_t st = trans ? M.ld : 1, sc = trans ? 1 : M.ld;  // op(M)(t, c) at M.data[t·st + c·sc]
    index_t i = 0;
    for (; i + 2 * W<T> <= m; i += 2 * W<T>) mix_rows<T, 2>(A.data + i, A.ld, k, M.data, st, sc, n, alpha, C.data + i, C.ld);
    if (i + W<T> <= m) mix_rows<T, 1>(A.data + i, A.ld, k, M.data, st, sc, n, alpha, C.data + i, C.ld), i += W<T>;
    for (; i < m; ++i)  // the last rows (m not a multiple of W)
        for (index_t j = 0; j < n; ++j) {
            T sum = 0;
            for (index_t t = 0; t < k; ++t) sum += A(i, t) * M.data[t * st + j * sc];
            C(i, j) += alpha * sum;
        }
}

}  // namespace ft::tile
