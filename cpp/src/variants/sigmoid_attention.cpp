// Sigmoid attention (Ramapuram et al. 2024, "Theory, Analysis, and Best Practices for Sigmoid Self-Attention",
// arXiv 2409.04431) as a head kernel, attention='sigmoid': Algorithm 4's lines 4–6 for one (sequence, head) block
// with line 6's softmax replaced by an elementwise sigmoid plus the paper's bias b = −log ℓ_z (ℓ_z: the block's keys),
// no normalisation over the keys:
//   4  S ← Kᵀ Q / √d_attn                         [[+ B^h, a score bias (V2's ALiBi), as in the listing's line 6]]
//   5  ∀t_z, t_x, if ¬Mask[t_z, t_x] then A[t_z, t_x] ← 0
//   6  otherwise A[t_z, t_x] ← σ(S[t_z, t_x] + b),  b = −log ℓ_z;   return Ṽ = V · A
// Backward (A kept): dV += dṼ Aᵀ; dA = Vᵀ dṼ; dS = dA ⊙ A ⊙ (1 − A) (masked entries: A = 0, so dS = 0);
// dQ += K dS / √d_attn, dK += Q dSᵀ / √d_attn; the score bias's gradients from dS (end_backward).
// It forms A before line 6's product (its registry line says so), so attention dropout can wrap it. It has no tiled
// form (attention_impl 'auto' runs it as printed). b counts the keys of the call, so the weights of a query depend on
// how many keys come with it: decoding one token at a time matches the literal generation (each step's forward over
// the prefix), not a call over several new tokens, and a rolling cache (a mask with a window) would change ℓ_z.
#include <algorithm>
#include <cmath>
#include <string>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/blas.hpp"
#include "formal_transformers/config.hpp"

namespace ft {

namespace {
// σ(x) = 1/(1 + e^{−x}) without overflow for either sign
template <class T>
T sigmoid(T x) {
    if (x >= 0) return T(1) / (T(1) + std::exp(-x));
    const T e = std::exp(x);
    return e / (T(1) + e);
}

template <class T>
class SigmoidKernel final : public HeadKernel<T> {
public:
    const char* name() const override { return "sigmoid"; }
    void begin(MHAttentionCache<T>& c, index_t H, index_t n_x) const override {
        (void)H, (void)n_x;
        c.weights_ready = true;
        c.lse.clear();
        c.A.resize(std::size_t(c.A_off.back()));
    }
    void forward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MHAttentionCache<T>& c,
                 MatView<T> Y) const override {
        MatView<T> A(c.A.data() + blk.off, K.cols, Q.cols);
        weights_into(Q, K, blk, A);                  // lines 4, 5, 6's σ
        gemm<T>(Op::N, Op::N, T(1), V, A, T(0), Y);  // line 6: Ṽ = V A
    }
    void begin_backward(const MHAttentionCache<T>& c, MHAttentionWork<T>& w) const override { w.dA.resize(c.A.size()); }
    void backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Y, CMatView<T> dY, const HeadBlock<T>& blk,
                  const MHAttentionCache<T>& c, MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK,
                  MatView<T> dV) const override {
        (void)Y;
        CMatView<T> A(c.A.data() + blk.off, K.cols, Q.cols);
        MatView<T> dA(w.dA.data() + blk.off, K.cols, Q.cols);
        gemm<T>(Op::N, Op::T, T(1), dY, A, T(1), dV);  // line 6: dV += dṼ Aᵀ
        gemm<T>(Op::T, Op::N, T(1), V, dY, T(0), dA);  // line 6: dA = Vᵀ dṼ
        weights_backward(Q, K, blk, c, w, dQ, dK);     // lines 6, 5, 4
    }
    // d(+ B^h): the bias's parameter gradients from every block's dS, one block at a time
    void end_backward(ParamStore<T>& store, const ScoreBias<T>* bias, index_t H, const MHAttentionCache<T>& c,
                      MHAttentionWork<T>& w) const override {
        if (!bias) return;
        for (index_t b = 0; b < c.sx.count(); ++b)
            for (index_t h = 0; h < H; ++h)
                bias->backward(store, c.mask, b, h, c.q0,
                               CMatView<T>(w.dA.data() + c.A_off[std::size_t(b * H + h)], c.sz.len(b), c.sx.len(b)));
    }
    void weights(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                 MatView<T> A) const override {
        (void)V, (void)c;
        weights_into(Q, K, blk, A);
    }
    // from dA (at w.dA + blk.off) to dS in its place: dS = dA ⊙ A ⊙ (1 − A); line 4: dQ += K dS/√d, dK += Q dSᵀ/√d
    void weights_backward(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                          MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK) const override {
        CMatView<T> A(c.A.data() + blk.off, K.cols, Q.cols);
        MatView<T> dS(w.dA.data() + blk.off, K.cols, Q.cols);
        for (index_t j = 0; j < Q.cols; ++j)
            for (index_t i = 0; i < K.cols; ++i) dS(i, j) *= A(i, j) * (T(1) - A(i, j));  // σ' = σ(1 − σ)
        const T scale = blk.unscaled ? T(1) : T(1) / std::sqrt(T(Q.rows));
        gemm<T>(Op::N, Op::N, scale, K, dS, T(1), dQ);  // line 4: dQ += K dS / √d_attn
        gemm<T>(Op::N, Op::T, scale, Q, dS, T(1), dK);  // line 4: dK += Q dSᵀ / √d_attn
    }

private:
    // A ← σ(Kᵀ Q / √d_attn + B^h − log ℓ_z) on the allowed entries, 0 elsewhere, column by column
    void weights_into(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, MatView<T> A) const {
        gemm<T>(Op::T, Op::N, blk.unscaled ? T(1) : T(1) / std::sqrt(T(Q.rows)), K, Q, T(0), A);  // line 4
        if (blk.bias) blk.bias->add(*blk.store, *blk.mask, blk.b, blk.h, blk.q0, A);            // + B^h
        const T b = -std::log(T(A.rows));  // the paper's b = −log ℓ_z
        const Mask& mask = *blk.mask;
        for (index_t j = 0; j < A.cols; ++j) {
            T* s = A.col(j);
            const index_t t_x = blk.q0 + j, l_z = A.rows;
            KeyRange r = mask.keys(blk.b, t_x, l_z);
            r.begin = std::max<index_t>(r.begin, 0), r.end = std::min(r.end, l_z);
            for (index_t t_z = r.begin; t_z < r.end; ++t_z)  // lines 5, 6
                s[t_z] = r.dense || mask.allows_head(t_z, t_x, blk.b, blk.h) ? sigmoid(s[t_z] + b) : T(0);
            std::fill(s, s + r.begin, T(0));
            std::fill(s + r.end, s + l_z, T(0));
        }
    }
};

// What it needs of a model, one rule for the config (check_sigmoid) and the factory: its own kernel under every
// attention_impl but 'tiled' (it has no tiled form), and a KV cache that keeps every key (no mask with a window: a
// rolling cache would change ℓ_z)
void check_sigmoid_fits(AttnImpl impl, index_t window, const std::string& mask_name) {
    if (impl == AttnImpl::Tiled) throw ValueError("attention_impl 'tiled': attention='sigmoid' has no tiled form");
    if (window > 0)
        throw ValueError("attention='sigmoid' counts the keys in its bias b = −log ℓ_z: not with the " + mask_name +
                         " mask (its rolling cache drops keys)");
}

void check_sigmoid(const PartOptionValues& own, const ModelConfig* c) {
    (void)own;
    if (!c) return;
    index_t window = 0;
    std::string mask_name;
    if (const PartRow* m = chosen_part(*c, PartKind::Mask)) {
        MaskOptions o;
        o.options = c->part_options;
        window = make_mask(m->name, o).window(), mask_name = m->name;
    }
    check_sigmoid_fits(c->attention_impl, window, mask_name);
}
}  // namespace

const PartRow& sigmoid_kernel_row() {
    static const PartRow row{PartKind::HeadKernel, "sigmoid", {}, check_sigmoid, nullptr, false};
    return row;
}

// The registry's factory (registry.cpp)
template <class T>
std::shared_ptr<const HeadKernel<T>> make_sigmoid_kernel(const AttnPartSpec<T>& spec, const std::string& prefix) {
    (void)prefix;
    check_sigmoid_fits(spec.v.impl, spec.mask ? spec.mask->window() : 0, spec.mask ? spec.mask->name() : std::string());
    return std::make_shared<const SigmoidKernel<T>>();
}
template std::shared_ptr<const HeadKernel<float>> make_sigmoid_kernel<float>(const AttnPartSpec<float>&, const std::string&);
template std::shared_ptr<const HeadKernel<double>> make_sigmoid_kernel<double>(const AttnPartSpec<double>&,
                                                                               const std::string&);

}  // namespace ft
