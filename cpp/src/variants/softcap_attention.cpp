// Soft-capped attention scores (docs/variants.md V25; Gemma 2: attn_logit_softcapping, query_pre_attn_scalar) as a
// head kernel: Algorithm 4's lines 4–6 for one (sequence, head) block with line 4's scale 1/√s and the scores
// bounded smoothly to (−c, c):
//   4  S ← Kᵀ Q / √s                     [[s = query_pre_attn_scalar; None: d_attn, the listing]]
//   4′ S ← c · tanh(S / c)                [[c = attn_logit_softcapping; None: no cap]]
//   5  ∀t_z, t_x, if ¬Mask[t_z, t_x] then S[t_z, t_x] ← −∞
//   6  return Ṽ = V · softmax(S)
// Backward (A = softmax(S), U = Kᵀ Q / √s recomputed): dV += dṼ Aᵀ; dS = softmax'(A)(Vᵀ dṼ); line 4′: dU = dS ⊙
// (1 − tanh²(U / c)); line 4: dQ += K dU / √s, dK += Q dUᵀ / √s. The weights A are kept (as the listing's kernel);
// it has no tiled form (attention_impl 'auto' runs it as printed) and no score bias. It forms A before line 6's
// product (its registry line says so), so attention dropout can wrap it: the backward's line 4′ recomputes U from Q
// and K, not from A, so the dropped Ã never reaches it. All but lines 4's scale, 4′ and 6's softmax with their
// backward is the shape it shares with the listing's kernel (weights_kernel.hpp).
// Either option given chooses it.
#include <cmath>
#include <vector>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/weights_kernel.hpp"

namespace ft {

namespace {
template <class T>
class SoftcapKernel final : public WeightsKernel<T> {
public:
    SoftcapKernel(double s, double cap) : s_(s), cap_(cap) {}
    const char* name() const override { return "softcap"; }
    // line 4: the scale 1/√s
    T score_scale(index_t d_attn) const override { return T(1) / std::sqrt(T(s_ > 0 ? s_ : double(d_attn))); }
    // line 4′: S ← c · tanh(S / c) on a column's candidate keys
    void transform_scores(T* S, index_t n) const override {
        if (!(cap_ > 0)) return;
        const T c = T(cap_);
        for (index_t i = 0; i < n; ++i) S[i] = c * std::tanh(S[i] / c);
    }
    // line 6: A = softmax(S) (masked: −∞, so weight 0)
    void weights_of(T* s, index_t n, index_t l_z) const override {
        (void)l_z;
        softmax_column(s, n);
    }
    // line 6 backward: dS = A ⊙ (dA − 1(1ᵀ(A ⊙ dA))); line 4′: dU = dS ⊙ (1 − tanh²(U / c)), U = Kᵀ Q / √s recomputed
    void scores_gradient(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, CMatView<T> A,
                         MatView<T> dA) const override {
        (void)blk;
        softmax_columns_backward<T>(A, dA);
        if (!(cap_ > 0)) return;
        std::vector<T> U(std::size_t(K.cols * Q.cols));
        MatView<T> Um(U.data(), K.cols, Q.cols);
        gemm<T>(Op::T, Op::N, score_scale(Q.rows), K, Q, T(0), Um);
        const T c = T(cap_);
        for (index_t j = 0; j < Q.cols; ++j)
            for (index_t i = 0; i < K.cols; ++i) {
                const T t = std::tanh(Um(i, j) / c);
                dA(i, j) *= T(1) - t * t;
            }
    }

private:
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
