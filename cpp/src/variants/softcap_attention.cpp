// Soft-capped attention scores (docs/variants.md V25; Gemma 2: attn_logit_softcapping, query_pre_attn_scalar) as a
// head kernel: Algorithm 4's lines 4–6 for one (sequence, head) block with line 4's scale 1/√s and the scores
// bounded smoothly to (−c, c):
//   4  S ← Kᵀ Q / √s                     [[s = query_pre_attn_scalar; None: d_attn, the listing]]
//   4′ S ← c · tanh(S / c)                [[c = attn_logit_softcapping; None: no cap]]
//   5  ∀t_z, t_x, if ¬Mask[t_z, t_x] then S[t_z, t_x] ← −∞
//   6  return Ṽ = V · softmax(S)
// Backward (A = softmax(S), U = Kᵀ Q / √s recomputed): dV += dṼ Aᵀ; dS = softmax'(A)(Vᵀ dṼ); line 4′: dU = dS ⊙
// (1 − tanh²(U / c)); line 4: dQ += K dU / √s, dK += Q dUᵀ / √s. The weights A are kept (as the listing's kernel);
// it has no tiled form (attention_impl 'auto' runs it as printed), no score bias, and its registry line does not
// offer its weights to a kernel wrapper (no attn_dropout).
// Either option given chooses it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/functions.hpp"

namespace ft {

namespace {
template <class T>
class SoftcapKernel final : public HeadKernel<T> {
public:
    SoftcapKernel(double s, double cap) : s_(s), cap_(cap) {}
    const char* name() const override { return "softcap"; }
    void begin(MHAttentionCache<T>& c, index_t H, index_t n_x) const override {
        (void)H, (void)n_x;
        c.weights_ready = true;
        c.lse.clear();
        c.A.resize(std::size_t(c.A_off.back()));
    }
    void forward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MHAttentionCache<T>& c,
                 MatView<T> Y) const override {
        MatView<T> A(c.A.data() + blk.off, K.cols, Q.cols);
        weights_into(Q, K, blk, A);                  // lines 4, 4′, 5, 6's softmax
        gemm<T>(Op::N, Op::N, T(1), V, A, T(0), Y);  // line 6: Ṽ = V A
    }
    void begin_backward(const MHAttentionCache<T>& c, MHAttentionWork<T>& w) const override { w.dA.resize(c.A.size()); }
    void backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Y, CMatView<T> dY, const HeadBlock<T>& blk,
                  const MHAttentionCache<T>& c, MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK,
                  MatView<T> dV) const override {
        (void)Y;
        CMatView<T> A(c.A.data() + blk.off, K.cols, Q.cols);
        MatView<T> dS(w.dA.data() + blk.off, K.cols, Q.cols);
        gemm<T>(Op::N, Op::T, T(1), dY, A, T(1), dV);  // line 6: dV += dṼ Aᵀ
        gemm<T>(Op::T, Op::N, T(1), V, dY, T(0), dS);  // line 6: dA = Vᵀ dṼ
        softmax_columns_backward<T>(A, dS);            // dS = A ⊙ (dA − 1(1ᵀ(A ⊙ dA)))  (masked: A = 0, dS = 0)
        const T scale = score_scale(Q.rows);
        if (cap_ > 0) {  // line 4′: dU = dS ⊙ (1 − tanh²(U / c)), U recomputed
            std::vector<T> U(std::size_t(K.cols * Q.cols));
            MatView<T> Um(U.data(), K.cols, Q.cols);
            gemm<T>(Op::T, Op::N, scale, K, Q, T(0), Um);
            const T c = T(cap_);
            for (index_t j = 0; j < Q.cols; ++j)
                for (index_t i = 0; i < K.cols; ++i) {
                    const T t = std::tanh(Um(i, j) / c);
                    dS(i, j) *= T(1) - t * t;
                }
        }
        gemm<T>(Op::N, Op::N, scale, K, dS, T(1), dQ);  // line 4: dQ += K dU / √s
        gemm<T>(Op::N, Op::T, scale, Q, dS, T(1), dK);  // line 4: dK += Q dUᵀ / √s
    }
    void weights(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                 MatView<T> A) const override {
        (void)V, (void)c;
        weights_into(Q, K, blk, A);
    }
    T score_scale(index_t d_attn) const override {
        return T(1) / std::sqrt(T(s_ > 0 ? s_ : double(d_attn)));
    }
    void transform_scores(T* S, index_t n) const override {
        if (!(cap_ > 0)) return;
        const T c = T(cap_);
        for (index_t i = 0; i < n; ++i) S[i] = c * std::tanh(S[i] / c);
    }

private:
    // A ← softmax(mask(c·tanh(Kᵀ Q / (√s c)))) column by column: keys outside a column's candidates get 0
    void weights_into(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, MatView<T> A) const {
        gemm<T>(Op::T, Op::N, score_scale(Q.rows), K, Q, T(0), A);  // line 4
        const Mask& mask = *blk.mask;
        for (index_t j = 0; j < A.cols; ++j) {
            T* s = A.col(j);
            const index_t t_x = blk.q0 + j, l_z = A.rows;
            KeyRange r = mask.keys(blk.b, t_x, l_z);
            r.begin = std::max<index_t>(r.begin, 0), r.end = std::min(r.end, l_z);
            transform_scores(s + r.begin, r.end - r.begin);  // line 4′
            if (!r.dense)                                    // line 5
                for (index_t t_z = r.begin; t_z < r.end; ++t_z)
                    if (!mask.allows_head(t_z, t_x, blk.b, blk.h)) s[t_z] = -std::numeric_limits<T>::infinity();
            softmax_column(s + r.begin, r.end - r.begin);  // line 6's softmax
            std::fill(s, s + r.begin, T(0));
            std::fill(s + r.end, s + l_z, T(0));
        }
    }
    double s_, cap_;
};

// attn_logit_softcapping = c, query_pre_attn_scalar = s: numbers > 0 (None: no cap, s = d_attn); no score bias
// (ALiBi, T5's buckets)
void check_softcap(const PartOptionValues& own, const ModelConfig* c) {
    for (const char* o : {"attn_logit_softcapping", "query_pre_attn_scalar"}) {
        const double v = own.real(o);
        if (!(v >= 0) || !std::isfinite(v)) throw ValueError(std::string(o) + " must be a finite number > 0 (or None)");
    }
    if (!c) return;
    if (position_has(c->positional, PositionProperty::ScoreBias))
        throw ValueError("attn_logit_softcapping / query_pre_attn_scalar (the 'softcap' head kernel) take no score bias: "
                         "not with positional='" + c->positional + "'");
    if (c->attention_impl == AttnImpl::Tiled)
        throw ValueError("attention_impl 'tiled': the 'softcap' head kernel (attn_logit_softcapping) has no tiled form");
}
}  // namespace

const PartRow& softcap_kernel_row() {
    static const PartRow row{PartKind::HeadKernel,
                             "softcap",
                             {{"attn_logit_softcapping", archs::D, OptionKind::AutoReal, 0.0, OptionCheck::None,
                               "V25: line 4's scores capped smoothly, S ← c·tanh(S/c) (Gemma 2). None: no cap"},
                              {"query_pre_attn_scalar", archs::D, OptionKind::AutoReal, 0.0, OptionCheck::None,
                               "V25: line 4's scale 1/√s instead of 1/√d_attn (Gemma 2, 3). None: d_attn"}},
                             check_softcap};
    return row;
}

// The registry's factory (registry.cpp)
template <class T>
std::shared_ptr<const HeadKernel<T>> make_softcap_kernel(const AttnPartSpec<T>& spec, const std::string& prefix) {
    (void)prefix;
    check_softcap(spec.v.options, nullptr);
    if (spec.position && spec.position->bias)
        throw ValueError("the 'softcap' head kernel (attn_logit_softcapping, query_pre_attn_scalar) takes no score bias");
    return std::make_shared<const SoftcapKernel<T>>(spec.v.options.real("query_pre_attn_scalar"),
                                                    spec.v.options.real("attn_logit_softcapping"));
}
template std::shared_ptr<const HeadKernel<float>> make_softcap_kernel<float>(const AttnPartSpec<float>&, const std::string&);
template std::shared_ptr<const HeadKernel<double>> make_softcap_kernel<double>(const AttnPartSpec<double>&,
                                                                               const std::string&);

}  // namespace ft
