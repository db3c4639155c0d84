// Algorithm 9: ETransformer (BERT, encoder-only, post-LN; transformers.hpp quotes the listing).
#include "formal_transformers/transformers.hpp"

#include <cmath>
#include <limits>

#include "formal_transformers/blas.hpp"
#include "shared.hpp"

namespace ft {
using namespace models;

// ======================================== Algorithm 9 =================================================
template <class T>
ETransformer<T>::ETransformer(const ModelConfig& c) : Model<T>(resolve(c, Arch::E)) {
    this->emb = make_stack_embedding<T>("tokens", EmbeddingSpec{&cfg, ""}, store);  // its steps' parameters after W_e, W_p
    for (index_t l = 0; l < cfg.L; ++l) {  // line 5's Mask ≡ 1 (V17: each layer's BigBird layouts)
        const std::string p = layer_prefix("layers", l);
        const BlockSpec spec{&cfg, gelu(), encoder_mask(cfg, p + "attn."), attn_variant(cfg, false), AttnVariant()};
        layer.push_back(make_self_block<T>(cfg.block, spec, store, p));
    }
    W_f = store.matrix("W_f", cfg.d_f, cfg.d_e);
    b_f = store.vector("b_f", cfg.d_f);
    norm_f = std::make_unique<Norm<T>>("layer", cfg.d_f, cfg.eps, store, "gamma", "beta");
    Rng rng = this->make_head_and_allocate(cfg.d_f);
    const double s = cfg.init_std, s_out = cfg.init_std / std::sqrt(2.0 * double(cfg.L));
    this->emb->init(store, rng, s);  // (BERT's W_s drawn as W_e, W_p)
    for (auto& b : layer) b->init(store, rng, s, s_out);
    store.normal(W_f.offset, cfg.d_f * cfg.d_e, s, rng);
    store.fill(b_f.offset, cfg.d_f, T(0));
    norm_f->init(store);
    this->unemb->init(store, rng, s);
    for (auto& b : layer) acts_.push_back(b->make_acts());
    stream_.resize(std::size_t(cfg.L + 1));
}

template <class T>
void ETransformer<T>::forward(const Tokens& x, const index_t* seg) {
    validate(x, cfg, "x");
    const index_t n = x.s.total(), d_e = cfg.d_e;
    this->emb->check(EmbedInput<T>{this->tok, x.ids, n, seg});  // (BERT's segment ids)
    this->last_.done = false;
    this->embed(x, stream_[0], seg);  // lines 1–3
    this->embed_dropout(stream_[0], DropSite::EmbedX, this->drop_embed_);  // (training) X ← Dropout(X), after BERT's norm
    for (index_t l = 0; l < cfg.L; ++l) {  // line 4
        poll();
        const std::size_t i = std::size_t(l);
        layer[i]->forward(store, view(stream_[i]), x.s, ensure(stream_[i + 1], d_e, n), *acts_[i], this->train_,
                          DropPlace{DropGroup::Layers, std::uint64_t(l)});  // lines 5–8
    }
    MatView<T> F = ensure(F_, cfg.d_f, n), G = ensure(G_, cfg.d_f, n);
    affine<T>(store.W(W_f), view(stream_[std::size_t(cfg.L)]), store.v(b_f), F);  // line 10: X ← GELU(W_f X + b_f 1ᵀ)
    activation_forward<T>(gelu(), F, G);
    norm_f->forward(store, G, ensure(Xf_, cfg.d_f, n), norm_gamma_);  // line 11: X ← layer_norm(X | γ, β)
    this->last_ = LastForward{true, x.s, x.s};
}

template <class T>
void ETransformer<T>::run_backward(const typename Model<T>::Batch& in, BackwardWork<T>& w) {
    const Tokens& x = *in.x;
    const index_t n = x.s.total();
    // line 11, then line 10
    MatView<T> dG = zeros(w.dXt, cfg.d_f, n);
    norm_f->backward(store, view(w.dHead), norm_gamma_, dG);
    activation_backward<T>(gelu(), view(F_), dG, dG);
    MatView<T> dX = zeros(w.dX, cfg.d_e, n);
    affine_backward<T>(store.W(W_f), view(stream_[std::size_t(cfg.L)]), dG, store.dW(W_f).data, store.dv(b_f), dX.data);
    for (index_t l = cfg.L - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        layer[i]->backward(store, view(stream_[i]), x.s, *acts_[i], w);  // lines 8–5
    }
    this->embed_dropout_backward(this->drop_embed_, view(w.dX));
    this->embed_backward(x, view(w.dX), in.segments);  // lines 3–1
}

// Algorithm 12 line 9: loss = −Σ_{t∈T̃} log P[x[t], t],  T̃ = {t : x̃[t] = mask_token}
template <class T>
void ETransformer<T>::score(const typename Model<T>::Batch& in, std::vector<index_t>& cols, std::vector<index_t>& targets) const {
    masked_targets(*in.x, in.x_orig, cfg.mask_token(), cols, targets);
}

template <class T>
std::vector<typename Model<T>::MaskRef> ETransformer<T>::dropout_masks() const {
    std::vector<typename Model<T>::MaskRef> r;
    add_mask<T>(r, "embed", this->drop_embed_);
    self_block_masks<T>(r, "layers", acts_, self_attention);
    return r;
}

template class ETransformer<float>;
template class ETransformer<double>;

}  // namespace ft
