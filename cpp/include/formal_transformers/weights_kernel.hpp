// The shape every head kernel that forms the weights A before line 6's product shares (parts.hpp HeadKernel, its
// registry line's HeadKernelProperty::FormsWeights): Algorithm 4's lines 4–6 for one (sequence, head) block as
//   4   S ← Kᵀ Q · score_scale            [[1/√d_attn, the listing; none with V18's unscaled blocks]]
//       S ← S + B^h                        [[a score bias, as the listing's line 6 (V2's ALiBi)]]
//   4′  S ← transform_scores(S)            [[on each column's candidate keys; V25's c·tanh(S/c); the listing: none]]
//   5   ∀t_z, t_x, if ¬Mask[t_z, t_x] then S[t_z, t_x] ← −∞
//   6   A ← weights_of(S), column by column;  return Ṽ = V · A
// and its backward from dṼ: dV += dṼ Aᵀ, dA = Vᵀ dṼ (line 6); dS ← scores_gradient(A, dA) (the kernel's map, lines
// 6, 5 and 4′); dQ += K dS · score_scale, dK += Q dSᵀ · score_scale (line 4); a score bias's gradients from every
// block's dS (end_backward). WeightsKernel owns all of it; a kernel deriving from it writes only what is new about
// it: its map weights_of and the map's backward scores_gradient (and, if it has them, score_scale, transform_scores,
// tiled_form). Its weights() and weights_backward() are the two steps around line 6's product that a part acting
// on A goes between (variants/attention_dropout.cpp). A keeps the kernel's weights for the backward (c.A).
#pragma once

#include <algorithm>
#include <limits>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/blas.hpp"

namespace ft {

// The candidate keys [begin, end) of column t_x (query of sequence b) in a block of l_z keys: the mask's range,
// clamped to the block. Keys outside it get weight 0 without being computed.
inline KeyRange candidate_keys(const Mask& mask, index_t b, index_t t_x, index_t l_z) {
    KeyRange r = mask.keys(b, t_x, l_z);
    r.begin = std::max<index_t>(r.begin, 0), r.end = std::min(r.end, l_z);
    return r;
}
// Line 5 on column s of S among its candidates r (head h): masked entries ← −∞ (none when the range is dense)
template <class T>
void mask_candidates(const Mask& mask, index_t b, index_t h, index_t t_x, const KeyRange& r, T* s) {
    if (r.dense) return;
    for (index_t t_z = r.begin; t_z < r.end; ++t_z)
        if (!mask.allows_head(t_z, t_x, b, h)) s[t_z] = -std::numeric_limits<T>::infinity();
}

template <class T>
class WeightsKernel : public HeadKernel<T> {
public:
    // ---- what a kernel deriving from it writes
    // line 6's map on one column: A's entries from S's on the column's n candidate keys s[0..n) (masked ones −∞,
    // which must give weight 0) in a block of l_z keys, in place
    virtual void weights_of(T* s, index_t n, index_t l_z) const = 0;
    // its backward on the block, given A: dA ← dS in place (∂loss/∂S of line 4's scaled scores plus B^h). Q, K and
    // blk are there for a map that recomputes the scores (V25's cap)
    virtual void scores_gradient(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, CMatView<T> A,
                                 MatView<T> dA) const = 0;

    // ---- the shared lines
    // A is kept for the backward, at the block's offset in c.A
    void begin(MHAttentionCache<T>& c, index_t H, index_t n_x) const final {
        (void)H, (void)n_x;
        c.weights_ready = true;
        c.lse.clear();
        c.A.resize(std::size_t(c.A_off.back()));
    }
    void forward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MHAttentionCache<T>& c,
                 MatView<T> Y) const final {
        MatView<T> A(c.A.data() + blk.off, K.cols, Q.cols);
        weights(Q, K, V, blk, c, A);  // lines 4, 5, 6's map
        attention_mix<T>(V, A, Y);    // line 6: Ṽ = V A
    }
    void begin_backward(const MHAttentionCache<T>& c, MHAttentionWork<T>& w) const final { w.dA.resize(c.A.size()); }
    void backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Y, CMatView<T> dY, const HeadBlock<T>& blk,
                  const MHAttentionCache<T>& c, MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK,
                  MatView<T> dV) const final {
        (void)Y;
        MatView<T> dA(w.dA.data() + blk.off, K.cols, Q.cols);
        attention_mix_backward<T>(V, CMatView<T>(c.A.data() + blk.off, K.cols, Q.cols), dY, dV, dA);  // line 6
        weights_backward(Q, K, blk, c, w, dQ, dK);  // lines 6, 5, 4
    }
    // d(+ B^h): the bias's parameter gradients from every block's dS, one block at a time
    void end_backward(ParamStore<T>& store, const ScoreBias<T>* bias, index_t H, const MHAttentionCache<T>& c,
                      MHAttentionWork<T>& w) const final {
        if (!bias) return;
        for (index_t b = 0; b < c.sx.count(); ++b)
            for (index_t h = 0; h < H; ++h)
                bias->backward(store, c.mask, b, h, c.q0,
                               CMatView<T>(w.dA.data() + c.A_off[std::size_t(b * H + h)], c.sz.len(b), c.sx.len(b)));
    }
    // lines 4, 4′, 5 and line 6's map: the block's weights A:[l_z, l_x]
    void weights(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                 MatView<T> A) const final {
        (void)V, (void)c;
        gemm<T>(Op::T, Op::N, scale(blk, Q.rows), K, Q, T(0), A);                     // line 4: S ← Kᵀ Q · scale
        if (blk.bias) blk.bias->add(*blk.store, *blk.mask, blk.b, blk.h, blk.q0, A);  // S + B^h
        const Mask& mask = *blk.mask;
        const index_t l_z = A.rows;
#pragma omp parallel for schedule(static) if (A.size() > 16384)
        for (index_t j = 0; j < A.cols; ++j) {
            T* s = A.col(j);
            const index_t t_x = blk.q0 + j;
            const KeyRange r = candidate_keys(mask, blk.b, t_x, l_z);
            this->transform_scores(s + r.begin, r.end - r.begin);  // line 4′
            mask_candidates(mask, blk.b, blk.h, t_x, r, s);         // line 5: masked S ← −∞
            weights_of(s + r.begin, r.end - r.begin, l_z);          // line 6: A = f(S)
            std::fill(s, s + r.begin, T(0));
            std::fill(s + r.end, s + l_z, T(0));
        }
    }
    // from ∂loss/∂A at w.dA + blk.off back to dS in its place (for end_backward) and dQ, dK
    void weights_backward(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                          MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK) const final {
        MatView<T> dS(w.dA.data() + blk.off, K.cols, Q.cols);
        scores_gradient(Q, K, blk, CMatView<T>(c.A.data() + blk.off, K.cols, Q.cols), dS);  // lines 6, 5, 4′
        const T s = scale(blk, Q.rows);
        gemm<T>(Op::N, Op::N, s, K, dS, T(1), dQ);  // line 4: dQ += K dS · scale
        gemm<T>(Op::N, Op::T, s, Q, dS, T(1), dK);  // line 4: dK += Q dSᵀ · scale
    }

private:
    T scale(const HeadBlock<T>& blk, index_t d_attn) const { return blk.unscaled ? T(1) : this->score_scale(d_attn); }
};

}  // namespace ft
