// Algorithm T (tiled exact attention, tiled_attention.hpp quotes the listings T1, T2): forward and backward
// side by side. Every product on a block runs on the calling thread (its callers run heads in parallel,
// MHAttention): one single-thread BLAS call (gemm_unsplit, so no BLAS call is split inside one of our parallel
// regions: docs/design.md "Threads"), our register-blocked kernels (tile_kernels.hpp), or our plain loops.
#include "formal_transformers/tiled_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/precision.hpp"
#include "tile_kernels.hpp"
#include "../runtime/cpu_level.hpp"

namespace ft {
// The kernels (compiled once per CPU level in the portable build: cpu_level.hpp), with functions.cpp's copy of
// the same level
namespace FT_CPU_NS {
template <class T>
T column_max(const T* a, index_t n);
template <class T>
T exp_shift(T* a, index_t n, T m);

namespace {
template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// C ← α op(A) op(B) + β C on a tile, on the calling thread: one BLAS call, our register-blocked kernels, or our
// loops. Blocked: Aᵀ B with β = 0 from A's strips (As: A's whole matrix packed by tile::pack_strips, A its
// columns a0 …), A op(B) with β = 1 by tile::mix. The loops: with A as stored, columns of C as sums of columns
// of A (axpy over C's contiguous column); with Aᵀ, each entry a dot product of two contiguous columns (A's and
// B's: op(B) = B only).
template <class T>
void tile_gemm(TileKernel kern, Op opA, Op opB, T alpha, CMatView<T> A, CMatView<T> B, T beta, MatView<T> C,
               const T* As = nullptr, index_t a0 = 0) {
    if (kern == TileKernel::Blas) {
        gemm_unsplit<T>(opA, opB, alpha, A, B, beta, C);
        return;
    }
    if (kern == TileKernel::Blocked) {
        if (opA == Op::T) {
            FT_CHECK(opB == Op::N && beta == T(0) && As, "tile_gemm: Aᵀ B from strips only");
            tile::strips_tn<T>(As, A.rows, a0, A.cols, alpha, B, C);
        } else {
            FT_CHECK(beta == T(1), "tile_gemm: A op(B) accumulates");
            tile::mix<T>(A, B, opB == Op::T, alpha, C);
        }
        return;
    }
    const index_t m = C.rows, n = C.cols, k = opA == Op::N ? A.cols : A.rows;
    for (index_t j = 0; j < n; ++j) {
        T* c = C.col(j);
        if (beta == T(0))
            std::fill(c, c + m, T(0));
        else if (beta != T(1))
            for (index_t i = 0; i < m; ++i) c[i] *= beta;
        if (opA == Op::N) {
            for (index_t p = 0; p < k; ++p) {  // C[:, j] += α A[:, p] op(B)[p, j]
                const T b = alpha * (opB == Op::N ? B(p, j) : B(j, p));
                const T* a = A.col(p);
#pragma omp simd
                for (index_t i = 0; i < m; ++i) c[i] += a[i] * b;
            }
        } else {  // C[i, j] += α A[:, i] · B[:, j]
            FT_CHECK(opB == Op::N, "tile_gemm: Aᵀ Bᵀ is not a tile product");
            const T* b = B.col(j);
            for (index_t i = 0; i < m; ++i) {
                const T* a = A.col(i);
                T s = 0;
#pragma omp simd reduction(+ : s)
                for (index_t p = 0; p < k; ++p) s += a[p] * b[p];
                c[i] += alpha * s;
            }
        }
    }
}

// T1 line 4 / T2 line 3 on the block of keys t0 … t0+nk−1 and queries j0 … j0+nq−1 (absolute q0 + j0 …):
// S ← K_Iᵀ Q_J / √d_attn, plus the score bias part's tile (e.g. V2's −m_h |t_x − t_z|), then Algorithm 4
// line 5 by the mask part: keys outside the column's candidate range [begin, end) and (unless the range is
// dense) the entries the rule does not allow ← −∞.
template <class T>
void block_scores(TileKernel kern, CMatView<T> Q, CMatView<T> K, const T* Ks, const HeadBlock<T>& blk, index_t t0,
                  index_t nk, index_t j0, index_t nq, MatView<T> S) {
    const T scale = blk.unscaled ? T(1) : T(1) / std::sqrt(T(Q.rows));  // (V18: unscaled)
    tile_gemm<T>(kern, Op::T, Op::N, scale, K.cols_range(t0, nk), Q.cols_range(j0, nq), T(0), S, Ks, t0);
    if (blk.bias) blk.bias->add_tile(*blk.store, blk.b, blk.h, blk.q0, t0, j0, S);  // line 6: + B^h
    const Mask& mask = *blk.mask;
    const index_t l_z = K.cols;
    for (index_t j = 0; j < nq; ++j) {
        const index_t tx = blk.q0 + j0 + j;
        const KeyRange r = mask.keys(blk.b, tx, l_z);
        const index_t lo = std::clamp<index_t>(r.begin - t0, 0, nk), hi = std::clamp<index_t>(r.end - t0, lo, nk);
        T* s = S.col(j);
        std::fill(s, s + lo, kNegInf<T>);
        std::fill(s + hi, s + nk, kNegInf<T>);
        if (!r.dense)
            for (index_t i = lo; i < hi; ++i)
                if (!mask.allows_head(t0 + i, tx, blk.b, blk.h)) s[i] = kNegInf<T>;
    }
}

// Dropout's keep bits of the block (entry (t_z, t_x) of the head's weights is i0 + t_z + t_x·ℓ_z, local t_x)
void block_keep(const DropoutStream& ds, std::uint64_t i0, index_t l_z, index_t t0, index_t nk, index_t j0,
                index_t nq, std::uint8_t* keep) {
    for (index_t j = 0; j < nq; ++j) {
        const std::uint64_t c = i0 + std::uint64_t(t0) + std::uint64_t(j0 + j) * std::uint64_t(l_z);
        for (index_t i = 0; i < nk; ++i) keep[i + j * nk] = ds.keep(c + std::uint64_t(i));
    }
}

// The key rows [begin, end) any query of columns j0 … j0+nq−1 may see: the union of the mask's candidate
// ranges (causal: [0, q0 + j0 + nq); a sliding window of w: from q0 + j0 − w + 1 on). Blocks outside are skipped.
template <class T>
KeyRange key_span(const HeadBlock<T>& blk, index_t j0, index_t nq, index_t l_z) {
    KeyRange u{l_z, 0, true};
    for (index_t j = 0; j < nq; ++j) {
        const KeyRange r = blk.mask->keys(blk.b, blk.q0 + j0 + j, l_z);
        u.begin = std::min(u.begin, std::max<index_t>(r.begin, 0));
        u.end = std::max(u.end, std::min(r.end, l_z));
    }
    if (u.end < u.begin) u.end = u.begin;
    return u;
}

// Whether every entry of the block (keys t0 … t0+nk−1, queries j0 … j0+nq−1) is allowed by the mask part (each
// column's candidate range covers the keys and is dense): nothing to mask (causal: every block off the diagonal)
template <class T>
bool all_allowed(const HeadBlock<T>& blk, index_t t0, index_t nk, index_t j0, index_t nq, index_t l_z) {
    for (index_t j = 0; j < nq; ++j) {
        const KeyRange r = blk.mask->keys(blk.b, blk.q0 + j0 + j, l_z);
        if (!r.dense || r.begin > t0 || r.end < t0 + nk) return false;
    }
    return true;
}

// per-thread scratch (the kernel runs on the calling thread; heads run in parallel)
template <class T>
struct Scratch {
    std::vector<T> S, dP, Pd, m, l, D, Ks, Vs;  // Ks, Vs: K and V packed in strips (TileKernel::Blocked)
    std::vector<T> Qc, Kc, Vc, Yc, dYc, dQc, dKc, dVc;  // dense copies of strided operands (dense_in)
    std::vector<std::uint8_t> keep;
};
template <class T>
Scratch<T>& scratch() {
    thread_local Scratch<T> s;
    return s;
}
template <class T>
T* sized(std::vector<T>& v, index_t n) {
    if (v.size() < std::size_t(n)) v.resize(std::size_t(n));
    return v.data();
}

// cols columns of rows entries from src (columns lds apart) to dst (ldd apart), in vector registers (a column
// is d entries, 32 at the baby GPT: a library memcpy per column costs more than the copy)
template <class T>
void copy_columns(const T* src, index_t lds, T* dst, index_t ldd, index_t rows, index_t cols) {
    for (index_t j = 0; j < cols; ++j) {
        const T* s = src + j * lds;
        T* d = dst + j * ldd;
        index_t i = 0;
        for (; i + tile::W<T> <= rows; i += tile::W<T>) tile::B<T>::load_unaligned(s + i).store_unaligned(d + i);
        for (; i < rows; ++i) d[i] = s[i];
    }
}
// A head's Q, K, V (and Ṽ, dṼ, dQ, dK, dV) are row blocks of the layer's [H·d, ℓ] matrices: columns of d entries
// H·d apart. Tiles of such columns fall into few L1 sets (a stride of 512 bytes at d 32, H 4), so the kernels
// run on dense copies, O(ℓ·d) per head: dense_in copies a strided view (with its entries when `values`, else
// only the shape, for an output), dense_out writes a copy back into its view. Only where tiles are re-read: with
// one query block (decoding a token, a short prompt) K and V are read once, and the views are used as they are.
template <class T>
MatView<T> dense_in(CMatView<T> X, std::vector<T>& buf, bool values = true) {
    if (X.contiguous()) return MatView<T>(const_cast<T*>(X.data), X.rows, X.cols, X.ld);
    T* p = sized(buf, X.rows * X.cols);
    if (values) copy_columns<T>(X.data, X.ld, p, X.rows, X.rows, X.cols);
    return MatView<T>(p, X.rows, X.cols);
}
template <class T>
void dense_out(CMatView<T> copy, MatView<T> X) {
    if (copy.data == X.data) return;
    copy_columns<T>(copy.data, copy.ld, X.data, X.ld, X.rows, X.cols);
}
}  // namespace

// ===================================== Algorithm T1 ====================================================
// Q:[d_attn,l_x], K:[d_attn,l_z], V:[d_v,l_z] -> Vt:[d_v,l_x], lse:[l_x]
// (on the views as given: tiled_attention_head below copies strided ones first where tiles are re-read)
template <class T>
static void tiled_head_dense(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MatView<T> Vt, T* lse,
                             TileSizes tiles, const WeightsDropout* drop) {
    const index_t l_x = Q.cols, l_z = K.cols, d_v = V.rows, Bq = tiles.B_q, Bk = tiles.B_k;
    FT_CHECK(Bq > 0 && Bk > 0 && K.rows == Q.rows && V.cols == l_z && Vt.rows == d_v && Vt.cols == l_x && l_z > 0,
             "tiled_attention_head: shapes do not conform");
    Scratch<T>& w = scratch<T>();
    T* Sb = sized(w.S, Bk * Bq);
    T* m = sized(w.m, Bq);
    T* l = sized(w.l, Bq);
    const bool blocked = tiles.kernel == TileKernel::Blocked;
    const index_t padded = (l_z + tile::R<T> - 1) / tile::R<T> * tile::R<T>;
    T* Ks = blocked ? sized(w.Ks, padded * K.rows) : nullptr;
    if (blocked) tile::pack_strips<T>(K, Ks);  // K's columns in strips, once per head (line 4's K_Iᵀ for every J)
    FT_CHECK(blk.mask && (!blk.bias || (blk.bias->tiles() && blk.store)), "tiled attention: no mask, or a score bias with no tiled form");
    const bool dropping = drop && drop->p > 0;
    const DropoutStream ds(dropping ? drop->p : 0.0, dropping ? drop->key : DropoutKey{});
    const T inv_keep = dropping ? T(1.0 / (1.0 - drop->p)) : T(1);
    for (index_t j0 = 0; j0 < l_x; j0 += Bq) {  // line 1: each query block J
        const index_t nq = std::min(Bq, l_x - j0);
        const KeyRange span = key_span(blk, j0, nq, l_z);
        MatView<T> VtJ = Vt.cols_range(j0, nq);
        std::fill(m, m + nq, kNegInf<T>);  // line 2
        std::fill(l, l + nq, T(0));
        for (index_t j = 0; j < nq; ++j) std::fill(VtJ.col(j), VtJ.col(j) + d_v, T(0));
        // line 3: the key blocks some query of J may see (causal: none past the diagonal; a window: none before it)
        for (index_t t0 = span.begin; t0 < span.end; t0 += Bk) {
            const index_t nk = std::min(Bk, span.end - t0);
            MatView<T> S(Sb, nk, nq);
            block_scores<T>(tiles.kernel, Q, K, Ks, blk, t0, nk, j0, nq, S);  // line 4
            for (index_t j = 0; j < nq; ++j) {
                T* s = S.col(j);
                const T m_new = std::max(m[j], column_max(s, nk));  // line 5: m′
                if (m_new == kNegInf<T>) {                       // the whole column masked so far: P = 0
                    std::fill(s, s + nk, T(0));
                    continue;
                }
                const T corr = std::exp(m[j] - m_new);  // e^{m − m′} (0 while m = −∞)
                l[j] = corr * l[j] + exp_shift(s, nk, m_new);  // line 5: P; line 6: l ← e^{m−m′} l + 1ᵀP
                m[j] = m_new;
                if (corr != T(1)) {  // line 6: Ṽ_J diag(e^{m − m′})
                    T* o = VtJ.col(j);
#pragma omp simd
                    for (index_t i = 0; i < d_v; ++i) o[i] *= corr;
                }
                if (dropping) {  // dropout: V_I (P ⊙ M / (1 − p)), the literal path's mask entries
                    const std::uint64_t c = drop->i0 + std::uint64_t(t0) + std::uint64_t(j0 + j) * std::uint64_t(l_z);
                    for (index_t i = 0; i < nk; ++i) s[i] = ds.keep(c + std::uint64_t(i)) ? s[i] * inv_keep : T(0);
                }
            }
            tile_gemm<T>(tiles.kernel, Op::N, Op::N, T(1), V.cols_range(t0, nk), S, T(1), VtJ);  // line 6: Ṽ_J += V_I P
        }
        for (index_t j = 0; j < nq; ++j) {  // line 7
            const T inv = T(1) / l[j];
            T* o = VtJ.col(j);
#pragma omp simd
            for (index_t i = 0; i < d_v; ++i) o[i] *= inv;
            lse[j0 + j] = m[j] + std::log(l[j]);
        }
    }
}

// Algorithm T1 on the head's views: strided ones (a layer's heads, dense_in) copied into dense scratch first
template <class T>
void tiled_attention_head(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MatView<T> Vt, T* lse,
                          TileSizes tiles, const WeightsDropout* drop) {
    if (Q.cols <= tiles.B_q) return tiled_head_dense<T>(Q, K, V, blk, Vt, lse, tiles, drop);  // one query block: no copies
    Scratch<T>& w = scratch<T>();
    const MatView<T> Yc = dense_in<T>(Vt, w.Yc, false);
    tiled_head_dense<T>(dense_in<T>(Q, w.Qc), dense_in<T>(K, w.Kc), dense_in<T>(V, w.Vc), blk, Yc, lse, tiles, drop);
    dense_out<T>(Yc, Vt);
}

// ===================================== Algorithm T2 ====================================================
// (on the views as given: tiled_attention_head_backward below copies strided ones first where tiles are re-read)
template <class T>
static void tiled_head_backward_dense(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Vt, const T* lse,
                                      CMatView<T> dVt, const HeadBlock<T>& blk, MatView<T> dQ, MatView<T> dK,
                                      MatView<T> dV, TileSizes tiles, const WeightsDropout* drop) {
    const index_t l_x = Q.cols, l_z = K.cols, d_v = V.rows, Bq = tiles.B_q, Bk = tiles.B_k;
    FT_CHECK(Bq > 0 && Bk > 0 && K.rows == Q.rows && V.cols == l_z && Vt.rows == d_v && Vt.cols == l_x &&
                 dVt.rows == d_v && dVt.cols == l_x && l_z > 0,
             "tiled_attention_head_backward: shapes do not conform");
    FT_CHECK(blk.mask && (!blk.bias || (blk.bias->tiles() && blk.store)), "tiled attention: no mask, or a score bias with no tiled form");
    const T scale = blk.unscaled ? T(1) : T(1) / std::sqrt(T(Q.rows));  // (V18: unscaled)
    Scratch<T>& w = scratch<T>();
    T* Sb = sized(w.S, Bk * Bq);
    T* dPb = sized(w.dP, Bk * Bq);
    T* D = sized(w.D, l_x);
    const bool dropping = drop && drop->p > 0;
    const DropoutStream ds(dropping ? drop->p : 0.0, dropping ? drop->key : DropoutKey{});
    const T inv_keep = dropping ? T(1.0 / (1.0 - drop->p)) : T(1);
    T* Pdb = dropping ? sized(w.Pd, Bk * Bq) : nullptr;
    std::uint8_t* keep = dropping ? sized(w.keep, Bk * Bq) : nullptr;
    const bool blocked = tiles.kernel == TileKernel::Blocked;
    const index_t padded = (l_z + tile::R<T> - 1) / tile::R<T> * tile::R<T>;
    T* Ks = blocked ? sized(w.Ks, padded * K.rows) : nullptr;
    T* Vs = blocked ? sized(w.Vs, padded * d_v) : nullptr;
    if (blocked) tile::pack_strips<T>(K, Ks), tile::pack_strips<T>(V, Vs);  // lines 3, 4: K_Iᵀ, V_Iᵀ, once per head
    // Blocked, with no score bias and no dropout: line 3's exp on the tiles nothing masks, and line 5, are done
    // by the product's kernel while its block is in registers (tile::Epi)
    const bool fuse = blocked && !blk.bias && !dropping;
    for (index_t j = 0; j < l_x; ++j) {  // line 1: D ← 1ᵀ(dṼ ⊙ Ṽ)
        const T *o = Vt.col(j), *g = dVt.col(j);
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (index_t i = 0; i < d_v; ++i) s += o[i] * g[i];
        D[j] = s;
    }
    std::vector<KeyRange> spans;  // the key rows each query block may see (key_span)
    for (index_t j0 = 0; j0 < l_x; j0 += Bq) spans.push_back(key_span(blk, j0, std::min(Bq, l_x - j0), l_z));
    for (index_t tI = 0; tI < l_z; tI += Bk) {  // line 2: each key block I …
        const index_t nI = std::min(Bk, l_z - tI);
        for (index_t j0 = 0; j0 < l_x; j0 += Bq) {  // … and each query block J that sees it
            const KeyRange& span = spans[std::size_t(j0 / Bq)];
            // the keys t0 … t0+nk−1 of I some query of J may see (causal: I cut at J's last query); the rows
            // of I outside them are masked for all of J (P = 0 there: they add nothing), so they are skipped
            const index_t t0 = std::max(tI, span.begin), nk = std::min(tI + nI, span.end) - t0;
            if (nk <= 0) continue;
            const index_t nq = std::min(Bq, l_x - j0);
            MatView<T> P(Sb, nk, nq), dS(dPb, nk, nq);
            if (fuse && all_allowed(blk, t0, nk, j0, nq, l_z)) {  // line 3: P = exp(K_Iᵀ Q_J / √d_attn − λ), fused
                tile::strips_tn<T, tile::Epi::Exp>(Ks, K.rows, t0, nk, scale, Q.cols_range(j0, nq), P, lse + j0);
            } else {
                block_scores<T>(tiles.kernel, Q, K, Ks, blk, t0, nk, j0, nq, P);  // line 3: S
                for (index_t j = 0; j < nq; ++j) exp_shift(P.col(j), nk, lse[j0 + j]);  // line 3: P = exp(S − λ)
            }
            CMatView<T> Pd = P;
            if (dropping) {  // the forward's V_I (P ⊙ M/(1 − p))
                block_keep(ds, drop->i0, l_z, t0, nk, j0, nq, keep);
                for (index_t e = 0; e < nk * nq; ++e) Pdb[e] = keep[e] ? Sb[e] * inv_keep : T(0);
                Pd = CMatView<T>(Pdb, nk, nq);
            }
            CMatView<T> dVtJ = dVt.cols_range(j0, nq);
            tile_gemm<T>(tiles.kernel, Op::N, Op::T, T(1), dVtJ, Pd, T(1), dV.cols_range(t0, nk));  // line 4: dV_I += dṼ_J Pᵀ
            if (fuse) {  // line 4: dP = V_Iᵀ dṼ_J and line 5: dS = P ⊙ (dP − 1 Dᵀ), fused
                tile::strips_tn<T, tile::Epi::DS>(Vs, d_v, t0, nk, T(1), dVtJ, dS, D + j0, P.data);
            } else {
                tile_gemm<T>(tiles.kernel, Op::T, Op::N, T(1), V.cols_range(t0, nk), dVtJ, T(0), dS, Vs, t0);  // line 4
                if (dropping)  // D2: back through Dropout(P | p, M)
                    for (index_t e = 0; e < nk * nq; ++e) dPb[e] = keep[e] ? dPb[e] * inv_keep : T(0);
                for (index_t j = 0; j < nq; ++j) {  // line 5: dS = P ⊙ (dP − 1 Dᵀ)
                    const T* p = P.col(j);
                    T* g = dS.col(j);
                    const T Dj = D[j0 + j];
#pragma omp simd
                    for (index_t i = 0; i < nk; ++i) g[i] = p[i] * (g[i] - Dj);
                }
            }
            tile_gemm<T>(tiles.kernel, Op::N, Op::N, scale, K.cols_range(t0, nk), dS, T(1), dQ.cols_range(j0, nq));  // line 6
            tile_gemm<T>(tiles.kernel, Op::N, Op::T, scale, Q.cols_range(j0, nq), dS, T(1), dK.cols_range(t0, nk));  // line 6
        }
    }
}

// Algorithm T2 on the head's views, as T1: dense copies of the strided ones (dQ, dK, dV with their entries: T2
// adds into them)
template <class T>
void tiled_attention_head_backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Vt, const T* lse,
                                   CMatView<T> dVt, const HeadBlock<T>& blk, MatView<T> dQ, MatView<T> dK,
                                   MatView<T> dV, TileSizes tiles, const WeightsDropout* drop) {
    if (Q.cols <= tiles.B_q)  // one query block: no copies
        return tiled_head_backward_dense<T>(Q, K, V, Vt, lse, dVt, blk, dQ, dK, dV, tiles, drop);
    Scratch<T>& w = scratch<T>();
    const MatView<T> dQc = dense_in<T>(dQ, w.dQc), dKc = dense_in<T>(dK, w.dKc), dVc = dense_in<T>(dV, w.dVc);
    tiled_head_backward_dense<T>(dense_in<T>(Q, w.Qc), dense_in<T>(K, w.Kc), dense_in<T>(V, w.Vc), Vt, lse,
                                 dense_in<T>(dVt, w.dYc), blk, dQc, dKc, dVc, tiles, drop);
    dense_out<T>(dQc, dQ), dense_out<T>(dKc, dK), dense_out<T>(dVc, dV);
}

#define FT_INSTANTIATE(T)                                                                                      \
    template void tiled_attention_head<T>(CMatView<T>, CMatView<T>, CMatView<T>, const HeadBlock<T>&, MatView<T>, \
                                          T*, TileSizes, const WeightsDropout*);                                \
    template void tiled_attention_head_backward<T>(CMatView<T>, CMatView<T>, CMatView<T>, CMatView<T>, const T*,   \
                                                   CMatView<T>, const HeadBlock<T>&, MatView<T>, MatView<T>,       \
                                                   MatView<T>, TileSizes, const WeightsDropout*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE
}  // namespace FT_CPU_NS

#ifndef FT_CPU_LEVEL_ONLY
// The public entry points (tiled_attention.hpp): the copy of the level cpu_level() chose
#define FT_DECLARE                                                                                               \
    template <class T>                                                                                           \
    void tiled_attention_head(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MatView<T> Vt, \
                              T* lse, TileSizes tiles, const WeightsDropout* drop);                              \
    template <class T>                                                                                           \
    void tiled_attention_head_backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Vt, const T* lse,  \
                                       CMatView<T> dVt, const HeadBlock<T>& blk, MatView<T> dQ, MatView<T> dK,     \
                                       MatView<T> dV, TileSizes tiles, const WeightsDropout* drop);
#if defined(FT_CPU_DISPATCH)
namespace cpu_v3 {
FT_DECLARE
}
namespace cpu_v4 {
FT_DECLARE
}
#endif
#undef FT_DECLARE
template <class T>
void tiled_attention_head(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MatView<T> Vt, T* lse,
                          TileSizes tiles, const WeightsDropout* drop) {
    FT_CPU_CALL(tiled_attention_head<T>(Q, K, V, blk, Vt, lse, tiles, drop))
}
template <class T>
void tiled_attention_head_backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Vt, const T* lse,
                                   CMatView<T> dVt, const HeadBlock<T>& blk, MatView<T> dQ, MatView<T> dK,
                                   MatView<T> dV, TileSizes tiles, const WeightsDropout* drop) {
    FT_CPU_CALL(tiled_attention_head_backward<T>(Q, K, V, Vt, lse, dVt, blk, dQ, dK, dV, tiles, drop))
}

// ------------------------------------ the head kernel "tiled" ---------------------------------------------------
namespace {
// Algorithm T on every block (the tiled form of "softmax", chosen per call by attention_impl): Y^h and λ (in
// c.lse), no ℓ_z×ℓ_x matrix; the same parts (mask, score bias) tile by tile. Dropout on the weights is part of
// Algorithm T (T1 line 6, T2 line 4): at the rate of the attention-dropout part's option (attn_dropout), the tiles
// draw the entries of the same masks as that part (keyed by the entry's index in A), redrawn in the backward.
template <class T>
class TiledKernel final : public HeadKernel<T> {
public:
    explicit TiledKernel(double p) : p_(p) {}
    const char* name() const override { return "tiled"; }
    bool one_thread_blocks() const override { return true; }  // one-thread BLAS calls on tiles
    void begin(MHAttentionCache<T>& c, index_t H, index_t n_x) const override {
        c.keep_lse_only(H, n_x, "attention log-sum-exp");  // no A: λ only (dropout masks redrawn from their keys)
        c.drop.p = c.training ? p_ : 0.0;
    }
    void forward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MHAttentionCache<T>& c,
                 MatView<T> Y) const override {
        const WeightsDropout d{c.drop.p, c.drop_key, std::uint64_t(blk.off)};
        tiled_attention_head<T>(Q, K, V, blk, Y, c.lse.data() + blk.h * blk.n_x + blk.j0, tile_sizes(),
                                c.drop.active() ? &d : nullptr);
    }
    // Algorithm T2: the weights recomputed tile by tile from λ (a tiled score bias has no parameters: nothing for
    // its backward)
    void backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Y, CMatView<T> dY, const HeadBlock<T>& blk,
                  const MHAttentionCache<T>& c, MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK,
                  MatView<T> dV) const override {
        (void)w;
        const WeightsDropout d{c.drop.p, c.drop_key, std::uint64_t(blk.off)};
        tiled_attention_head_backward<T>(Q, K, V, Y, c.lse.data() + blk.h * blk.n_x + blk.j0, dY, blk, dQ, dK, dV,
                                         tile_sizes(), c.drop.active() ? &d : nullptr);
    }
    // lines 4–6 as printed on the saved Q, K, V (up to the softmax), and the masks the tiles drew: entry i of A keyed
    // by c.drop_key (DropoutStream)
    void weights(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                 MatView<T> A) const override {
        (void)V;
        attention_head_weights<T>(Q, K, blk, A);
        if (!c.drop.active()) return;
        if (c.drop.keep.size() != c.A.size()) c.drop.keep.resize(c.A.size());  // (materialize_weights: one block at a time)
        const DropoutStream ds(c.drop.p, c.drop_key);
        for (index_t i = blk.off; i < blk.off + A.size(); ++i) c.drop.keep[std::size_t(i)] = ds.keep(std::uint64_t(i));
    }

private:
    // Under bf16-mixed products (precision.hpp) the tiles are products like any other: one call each (gemm_unsplit),
    // on operands rounded to bf16 — P and dS rounded tile by tile — through the library's bf16 kernel; float32: our
    // register-blocked kernels. Larger tiles there (128 queries × 256 keys): fewer library calls, each with its own
    // dispatch and packing (docs/benchmarks.md "The tiled attention's tiles in bf16")
    static TileSizes tile_sizes() {
        TileSizes t;
        if (std::is_same_v<T, float> && product_context().bf16) t.kernel = TileKernel::Blas, t.B_q = 128, t.B_k = 256;
        return t;
    }
    double p_;  // the rate on the weights in a training forward
};
}  // namespace

// The registry's factory (registry.cpp): attention_impl 'tiled' needs every part tiled (a score bias with a tiled
// form); 'auto' falls back to the literal listing per call instead (MHAttention::use_tiled).
template <class T>
std::shared_ptr<const HeadKernel<T>> make_tiled_kernel(const AttnPartSpec<T>& spec, const std::string& prefix) {
    (void)prefix;
    if (spec.v.impl == AttnImpl::Tiled && spec.position && spec.position->bias && !spec.position->bias->tiles())
        throw ValueError("attention_impl 'tiled': the position part '" + spec.v.position +
                         "' has no tiled form (its score bias must be added tile by tile); use 'literal' or 'auto'");
    return std::make_shared<const TiledKernel<T>>(attention_dropout_rate(spec.v.options));
}
template std::shared_ptr<const HeadKernel<float>> make_tiled_kernel<float>(const AttnPartSpec<float>&, const std::string&);
template std::shared_ptr<const HeadKernel<double>> make_tiled_kernel<double>(const AttnPartSpec<double>&, const std::string&);

#define FT_INSTANTIATE(T)                                                                                      \
    template void tiled_attention_head<T>(CMatView<T>, CMatView<T>, CMatView<T>, const HeadBlock<T>&, MatView<T>, \
                                          T*, TileSizes, const WeightsDropout*);                                \
    template void tiled_attention_head_backward<T>(CMatView<T>, CMatView<T>, CMatView<T>, CMatView<T>, const T*,   \
                                                   CMatView<T>, const HeadBlock<T>&, MatView<T>, MatView<T>,       \
                                                   MatView<T>, TileSizes, const WeightsDropout*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE
#endif  // FT_CPU_LEVEL_ONLY

}  // namespace ft
