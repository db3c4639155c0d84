// Dropout on the attention weights (docs/regularisation.md, Algorithms D1 and D2 on Algorithm 4's line 6) as a part
// around a head kernel, the kernel wrapper "dropout":
//   6  return Ṽ = V · Dropout(softmax(S / √d_attn) | p, M)
// forward:  A ← the kernel's lines 4–6 up to the softmax (HeadKernel::weights);  Ã ← A ⊙ M / (1 − p) (D1 lines 1–2);
//           Ṽ ← V Ã (line 6)
// backward: dV += dṼ Ãᵀ, dÃ ← Vᵀ dṼ (line 6);  dA ← dÃ ⊙ M / (1 − p) (D2);  the kernel's softmax, lines 5, 4
//           backward (HeadKernel::weights_backward)
// Only a training forward drops (MHAttentionCache::training, its masks keyed c.drop_key); otherwise the kernel runs
// as it is. A keeps the softmax (attention_weights, the backward); the cache keeps Ã (c.Ad) and M (c.drop.keep).
// Its option: attn_dropout = p (every architecture; `dropout` sets it with the other rates). Its one rule: the kernel
// must form the weights (its registry line; the listing's "softmax"); the tiled form drops the same entries itself.
#include "formal_transformers/attention_dropout.hpp"

#include <algorithm>
#include <sstream>
#include <string>

#include "formal_transformers/config.hpp"
#include "formal_transformers/parts.hpp"

namespace ft {

template <class T>
void drop_weights(const WeightsDropout& d, CMatView<T> A, MatView<T> Ad, std::uint8_t* keep) {
    std::copy(A.data, A.data + A.size(), Ad.data);
    dropout_forward<T>(d.p, d.key, d.i0, Ad.data, Ad.size(), keep);  // D1 lines 1–2: Ã = A ⊙ M / (1 − p)
}

template <class T>
void attention_dropout_head(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, const WeightsDropout& d,
                            MatView<T> A, MatView<T> Ad, std::uint8_t* keep, MatView<T> Vt) {
    attention_head_weights<T>(Q, K, blk, A);  // lines 4, 5, 6: A = softmax(S/√d_attn)
    drop_weights<T>(d, A, Ad, keep);          // D1: Ã = Dropout(A | p, M)
    attention_mix<T>(V, Ad, Vt);              // line 6: Ṽ = V Ã
}

template <class T>
void attention_dropout_head_backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> A, CMatView<T> Ad,
                                     const std::uint8_t* keep, double p, CMatView<T> dVt, MatView<T> dQ, MatView<T> dK,
                                     MatView<T> dV, MatView<T> dA, bool unscaled) {
    attention_mix_backward<T>(V, Ad, dVt, dV, dA);                      // line 6: dV += dṼ Ãᵀ, dÃ = Vᵀ dṼ
    dropout_backward<T>(p, keep, dA.data, dA.size());                   // D2: dA = dÃ ⊙ M / (1 − p)
    attention_head_weights_backward<T>(Q, K, A, dA, dQ, dK, unscaled);  // lines 6, 5, 4: dS, dQ, dK
}

namespace {
// The same on any kernel that forms the weights: its two steps around line 6 (HeadKernel::weights, weights_backward)
template <class T>
class AttentionDropout final : public HeadKernel<T> {
public:
    AttentionDropout(std::shared_ptr<const HeadKernel<T>> kernel, double p) : k_(std::move(kernel)), p_(p) {}
    const char* name() const override { return k_->name(); }
    const char* tiled_form() const override { return k_->tiled_form(); }
    bool one_thread_blocks() const override { return k_->one_thread_blocks(); }
    // the kernel's, and in a training forward the masks and Ã beside its A
    void begin(MHAttentionCache<T>& c, index_t H, index_t n_x) const override {
        k_->begin(c, H, n_x);
        c.drop.p = c.training ? p_ : 0.0;
        if (!c.drop.active()) return c.drop.keep.clear();
        c.drop.keep.resize(std::size_t(check_bytes(c.A_off.back(), 1, "dropout mask")));
        c.Ad.resize(c.A.size());
    }
    void forward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MHAttentionCache<T>& c,
                 MatView<T> Y) const override {
        if (!c.drop.active()) return k_->forward(Q, K, V, blk, c, Y);
        MatView<T> A(c.A.data() + blk.off, K.cols, Q.cols), Ad(c.Ad.data() + blk.off, K.cols, Q.cols);
        k_->weights(Q, K, V, blk, c, A);  // lines 4, 5, 6: A = softmax(S/√d_attn)
        drop_weights<T>({c.drop.p, c.drop_key, std::uint64_t(blk.off)}, A, Ad, c.drop.keep.data() + blk.off);  // D1
        attention_mix<T>(V, Ad, Y);  // line 6: Ṽ = V Ã
    }
    void begin_backward(const MHAttentionCache<T>& c, MHAttentionWork<T>& w) const override { k_->begin_backward(c, w); }
    void backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Y, CMatView<T> dY, const HeadBlock<T>& blk,
                  const MHAttentionCache<T>& c, MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK,
                  MatView<T> dV) const override {
        if (!c.drop.active()) return k_->backward(Q, K, V, Y, dY, blk, c, w, dQ, dK, dV);
        MatView<T> dA(w.dA.data() + blk.off, K.cols, Q.cols);
        attention_mix_backward<T>(V, CMatView<T>(c.Ad.data() + blk.off, K.cols, Q.cols), dY, dV, dA);  // line 6
        dropout_backward<T>(c.drop.p, c.drop.keep.data() + blk.off, dA.data, dA.size());  // D2
        k_->weights_backward(Q, K, blk, c, w, dQ, dK);  // lines 6, 5, 4
    }
    void end_backward(ParamStore<T>& store, const ScoreBias<T>* bias, index_t H, const MHAttentionCache<T>& c,
                      MHAttentionWork<T>& w) const override {
        k_->end_backward(store, bias, H, c, w);
    }
    void weights(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                 MatView<T> A) const override {
        k_->weights(Q, K, V, blk, c, A);
    }
    void weights_backward(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                          MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK) const override {
        k_->weights_backward(Q, K, blk, c, w, dQ, dK);
    }
    T score_scale(index_t d_attn) const override { return k_->score_scale(d_attn); }
    void transform_scores(T* S, index_t n) const override { k_->transform_scores(S, n); }
    void before_append(KVCache<T>& cache, index_t H_kv, index_t d_attn, index_t d_mid) const override {
        k_->before_append(cache, H_kv, d_attn, d_mid);
    }

private:
    std::shared_ptr<const HeadKernel<T>> k_;
    double p_;
};

// The one rule of the part: weights to drop, formed by the kernel it wraps (its registry line)
void check_kernel_forms_weights(double p, const std::string& kernel) {
    if (!(p > 0) || head_kernel_forms_weights(kernel)) return;
    std::ostringstream rate;
    rate << p;
    throw ValueError("attn_dropout = " + rate.str() + " drops attention weights, which the '" + kernel +
                     "' head kernel does not form (kernels that do: " + kernels_forming_weights() +
                     "): attn_dropout must be 0");
}

// attn_dropout = p in [0, 1); given a model, the head kernel its config chooses must form the weights
void check_attention_dropout(const PartOptionValues& own, const ModelConfig* c) {
    const double p = own.real("attn_dropout");
    check_dropout_rate(p, "attn_dropout");
    if (c) check_kernel_forms_weights(p, head_kernel_name(*c));
}
}  // namespace

const PartRow& attention_dropout_row() {
    static const PartRow row{PartKind::KernelWrapper,
                             "dropout",
                             {{"attn_dropout", archs::ALL, OptionKind::Real, 0.0, OptionCheck::Rate,
                               "dropout on the attention weights in training, Algorithm 4's line 6 as "
                               "Ṽ = V · Dropout(softmax(S/√d_attn) | p, M) (docs/regularisation.md). None: dropout's rate"}},
                             check_attention_dropout};
    return row;
}

double attention_dropout_rate(const PartOptionValues& options) { return options.real("attn_dropout"); }

// The registry's factory (registry.cpp): the kernel wrapped when the option is given
template <class T>
std::shared_ptr<const HeadKernel<T>> make_attention_dropout(std::shared_ptr<const HeadKernel<T>> kernel,
                                                            const AttnPartSpec<T>& spec) {
    const double p = attention_dropout_rate(spec.v.options);
    check_attention_dropout(spec.v.options, nullptr);
    check_kernel_forms_weights(p, kernel->name());
    return std::make_shared<const AttentionDropout<T>>(std::move(kernel), p);
}

#define FT_INSTANTIATE(T)                                                                                            \
    template void drop_weights<T>(const WeightsDropout&, CMatView<T>, MatView<T>, std::uint8_t*);                     \
    template void attention_dropout_head<T>(CMatView<T>, CMatView<T>, CMatView<T>, const HeadBlock<T>&,               \
                                            const WeightsDropout&, MatView<T>, MatView<T>, std::uint8_t*, MatView<T>); \
    template void attention_dropout_head_backward<T>(CMatView<T>, CMatView<T>, CMatView<T>, CMatView<T>, CMatView<T>, \
                                                     const std::uint8_t*, double, CMatView<T>, MatView<T>, MatView<T>, \
                                                     MatView<T>, MatView<T>, bool);                                   \
    template std::shared_ptr<const HeadKernel<T>> make_attention_dropout<T>(std::shared_ptr<const HeadKernel<T>>,     \
                                                                            const AttnPartSpec<T>&);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft
