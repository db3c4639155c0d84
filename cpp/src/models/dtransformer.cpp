// Algorithm 10: DTransformer (GPT-2, decoder-only, pre-LN; transformers.hpp quotes the listing).
#include "formal_transformers/transformers.hpp"

#include <cmath>
#include <limits>
#include <optional>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/multi_token.hpp"
#include "shared.hpp"

namespace ft {
using namespace models;

// ======================================== Algorithm 10 ================================================
template <class T>
DTransformer<T>::DTransformer(const ModelConfig& c) : Model<T>(resolve(c, Arch::D)) {
    this->emb = make_stack_embedding<T>("tokens", EmbeddingSpec{&cfg, ""}, store);  // lines 1–3 (its steps': none in θ)
    const Activation act = cfg.gelu == Gelu::Tanh ? Activation::GeluTanh : Activation::Gelu;
    for (index_t l = 0; l < cfg.L; ++l) {  // the config's block; line 6's Mask and RoPE θ each layer's (V26)
        const BlockSpec spec{&cfg, act, layer_mask(cfg, l), layer_variant(cfg, l), AttnVariant()};
        layer.push_back(make_self_block<T>(cfg.block, spec, store, layer_prefix("layers", l)));
    }
    norm_f = std::make_unique<Norm<T>>(cfg.norm, cfg.d_e, cfg.eps, store, "gamma", "beta");
    mtp = make_prediction_heads<T>(cfg, act, store);  // the prediction heads the options choose (V16's modules)
    Rng rng = this->make_head_and_allocate(cfg.d_e);
    const double s = cfg.init_std, s_out = cfg.init_std / std::sqrt(2.0 * double(cfg.L));
    this->emb->init(store, rng, s);
    for (auto& b : layer) b->init(store, rng, s, s_out);
    norm_f->init(store);
    this->unemb->init(store, rng, s);
    for (auto& m : mtp) m->init(store, rng, s, s_out);  // after θ of Algorithm 10: its initial values unchanged
    for (auto& b : layer) acts_.push_back(b->make_acts());
    stream_.resize(std::size_t(cfg.L + 1));
}

// x -> X after line 10 (kept in Xf_), every layer's activations kept
template <class T>
void DTransformer<T>::forward(const Tokens& x) {
    // RoPE and ALiBi have no table of positions: the model runs on any length (ℓ_max is the training
    // length there; Algorithm 14 with context = Full uses this, inference.hpp)
    validate(x, cfg, "x");
    this->last_.done = false;
    const index_t n = x.s.total(), d_e = cfg.d_e;
    this->embed(x, stream_[0]);                                             // lines 1–3
    this->embed_dropout(stream_[0], DropSite::EmbedX, this->drop_embed_);  // (training) X ← Dropout(X)
    // V7: line 6's Mask[t_z, t_x] = [[t_z < p_b or t_z ≤ t_x]] with this batch's prefix lengths (none: causal)
    std::optional<Mask> prefix;
    if (x.prefix) prefix = make_mask(cfg.mask, MaskOptions{std::vector<index_t>(x.prefix, x.prefix + x.s.count()), {}, {}});
    for (index_t l = 0; l < cfg.L; ++l) {  // line 4
        poll();
        const std::size_t i = std::size_t(l);
        layer[i]->forward(store, view(stream_[i]), x.s, ensure(stream_[i + 1], d_e, n), *acts_[i], this->train_,
                          DropPlace{DropGroup::Layers, std::uint64_t(l)}, prefix ? &*prefix : nullptr);  // lines 5–8
    }
    norm_f->forward(store, view(stream_[std::size_t(cfg.L)]), ensure(Xf_, d_e, n), norm_gamma_);  // line 10: X ← layer_norm(X | γ, β)
    this->last_ = LastForward{true, x.s, x.s};
}

// from w.dHead = ∂loss/∂(output of line 10)
template <class T>
void DTransformer<T>::run_backward(const typename Model<T>::Batch& in, BackwardWork<T>& w) {
    MatView<T> dX = zeros(w.dX, cfg.d_e, in.x->s.total());
    norm_f->backward(store, view(w.dHead), norm_gamma_, dX);  // line 10
    if (!mtp.empty()) {  // V16 line 1: H⁰ feeds module 1 (aux_loss left ∂/∂H⁰ in dH0_)
        const T* g = dH0_.data();
        for (index_t i = 0; i < dX.size(); ++i) dX.data[i] += g[i];
    }
    for (index_t l = cfg.L - 1; l >= 0; --l) {
        poll();
        layer[std::size_t(l)]->backward(store, view(stream_[std::size_t(l)]), in.x->s, *acts_[std::size_t(l)], w);  // lines 8–5
    }
    this->embed_dropout_backward(this->drop_embed_, view(w.dX));
    this->embed_backward(*in.x, view(w.dX));  // line 2
}

// Algorithm 13 line 5: loss = −Σ_{t=1}^{ℓ−1} log P[x[t+1], t], for every sequence of the batch; with V7's prefix
// lengths only the predictions of the tokens after the prefix (line 5′: t from max(p_b, 1), 1-based)
template <class T>
void DTransformer<T>::score(const typename Model<T>::Batch& in, std::vector<index_t>& cols, std::vector<index_t>& targets) const {
    next_token_targets(*in.x, cols, targets);
}


template <class T>
std::vector<typename Model<T>::MaskRef> DTransformer<T>::dropout_masks() const {
    std::vector<typename Model<T>::MaskRef> r;
    add_mask<T>(r, "embed", this->drop_embed_);
    self_block_masks<T>(r, "layers", acts_, self_attention);
    return r;
}

template class DTransformer<float>;
template class DTransformer<double>;

}  // namespace ft
