// Algorithm 8: EDTransformer (encoder-decoder, post-LN; transformers.hpp quotes the listing).
#include "formal_transformers/transformers.hpp"

#include <cmath>
#include <limits>

#include "formal_transformers/blas.hpp"
#include "shared.hpp"

namespace ft {
using namespace models;

// ======================================== Algorithm 8 =================================================
template <class T>
EDTransformer<T>::EDTransformer(const ModelConfig& c) : Model<T>(resolve(c, Arch::ED)) {
    for (index_t l = 0; l < cfg.L_enc; ++l)
        enc_layer.push_back(std::make_unique<PostLNEncoderBlock<T>>(cfg, Activation::Relu, store, layer_prefix("enc", l)));
    for (index_t l = 0; l < cfg.L_dec; ++l)
        dec_layer.push_back(std::make_unique<PostLNDecoderBlock<T>>(cfg, store, layer_prefix("dec", l)));
    Rng rng = this->make_head_and_allocate(cfg.d_e);
    const double s = cfg.init_std, s_out = cfg.init_std / std::sqrt(2.0 * double(cfg.L_enc + cfg.L_dec));
    for (auto& b : enc_layer) b->init(store, rng, s, s_out);
    for (auto& b : dec_layer) b->init(store, rng, s, s_out);
    this->unemb->init(store, rng, s);
    enc_acts_.resize(std::size_t(cfg.L_enc));
    dec_acts_.resize(std::size_t(cfg.L_dec));
    zstream_.resize(std::size_t(cfg.L_enc + 1));
    xstream_.resize(std::size_t(cfg.L_dec + 1));
}

// lines 1–9: z -> Z (stream[L_enc])
template <class T>
void EDTransformer<T>::encoder_forward(const Tokens& z, std::vector<typename PostLNEncoderBlock<T>::Acts>& acts,
                                       std::vector<Matrix<T>>& stream, const Dropout* drop, DropoutMask* embed_mask) const {
    const index_t n = z.s.total(), d_e = cfg.d_e;
    acts.resize(std::size_t(cfg.L_enc));
    stream.resize(std::size_t(cfg.L_enc + 1));
    this->embed(z, stream[0]);  // lines 1–3
    if (embed_mask) this->embed_dropout(stream[0], DropSite::EmbedZ, *embed_mask);  // (training) Z ← Dropout(Z)
    for (index_t l = 0; l < cfg.L_enc; ++l) {  // line 4
        poll();
        const std::size_t i = std::size_t(l);
        enc_layer[i]->forward(store, view(stream[i]), z.s, ensure(stream[i + 1], d_e, n), acts[i], drop,
                              DropPlace{DropGroup::Layers, std::uint64_t(l)});  // lines 5–8
    }
}

template <class T>
void EDTransformer<T>::forward(const Tokens& z, const Tokens& x) {
    validate(z, cfg.n_vocab, cfg.l_max, "z");
    validate(x, cfg, "x");
    if (z.s.count() != x.s.count())
        throw ValueError("z and x must hold the same number of sequences, got " + std::to_string(z.s.count()) + " and " +
                         std::to_string(x.s.count()));
    this->last_.done = false;
    encoder_forward(z, enc_acts_, zstream_, this->train_, &drop_embed_z_);  // lines 1–9
    CMatView<T> Z = view(zstream_[std::size_t(cfg.L_enc)]);
    const index_t n = x.s.total(), d_e = cfg.d_e;
    this->embed(x, xstream_[0]);                                              // lines 10–12
    this->embed_dropout(xstream_[0], DropSite::EmbedX, this->drop_embed_);  // (training) X ← Dropout(X)
    for (index_t l = 0; l < cfg.L_dec; ++l) {  // line 13 (erratum: the listing loops i, its body indexes l)
        poll();
        const std::size_t i = std::size_t(l);
        dec_layer[i]->forward(store, view(xstream_[i]), x.s, Z, z.s, ensure(xstream_[i + 1], d_e, n), dec_acts_[i],
                              this->train_, DropPlace{DropGroup::DecoderLayers, std::uint64_t(l)});  // lines 14–19
    }
    this->last_ = LastForward{true, z.s, x.s};
}

template <class T>
void EDTransformer<T>::run_backward(const typename Model<T>::Batch& in, BackwardWork<T>& w) {
    const Tokens &z = *in.z, &x = *in.x;
    CMatView<T> Z = view(zstream_[std::size_t(cfg.L_enc)]);
    MatView<T> dZ = zeros(w.dZ, cfg.d_e, z.s.total());
    copy_into(w.dX, CMatView<T>(view(w.dHead)));  // ∂/∂X of line 21's input
    for (index_t l = cfg.L_dec - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        dec_layer[i]->backward(store, view(xstream_[i]), x.s, Z, z.s, dec_acts_[i], dZ, w);  // lines 19–14
    }
    this->embed_dropout_backward(this->drop_embed_, view(w.dX));
    this->embed_backward(x, view(w.dX));  // line 11
    // the encoder, from ∂/∂Z accumulated over every decoder layer's cross-attention
    copy_into(w.dX, CMatView<T>(dZ));
    for (index_t l = cfg.L_enc - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        enc_layer[i]->backward(store, view(zstream_[i]), z.s, enc_acts_[i], w);  // lines 8–5
    }
    this->embed_dropout_backward(drop_embed_z_, view(w.dX));
    this->embed_backward(z, view(w.dX));  // line 2
}

// Algorithm 11 line 5: loss = −Σ_{t=1}^{ℓ−1} log P[x[t+1], t]
template <class T>
void EDTransformer<T>::score(const typename Model<T>::Batch& in, std::vector<index_t>& cols, std::vector<index_t>& targets) const {
    next_token_targets(*in.x, cols, targets);
}


template <class T>
std::vector<typename Model<T>::MaskRef> EDTransformer<T>::dropout_masks() const {
    std::vector<typename Model<T>::MaskRef> r;
    add_mask<T>(r, "embed.z", drop_embed_z_);
    self_block_masks<T>(r, "enc", enc_acts_, AttentionKind::Encoder);
    add_mask<T>(r, "embed.x", this->drop_embed_);
    for (index_t l = 0; l < index_t(dec_acts_.size()); ++l) {
        const auto& a = dec_acts_[std::size_t(l)];
        const std::string p = layer_prefix("dec", l);
        add_weights_mask<T>(r, p + "attn.weights", a.self_attn, AttentionKind::Decoder, l);
        add_mask<T>(r, p + "attn.out", a.drop_self);
        add_weights_mask<T>(r, p + "cross_attn.weights", a.cross_attn, AttentionKind::Cross, l);
        add_mask<T>(r, p + "cross_attn.out", a.drop_cross);
        add_mask<T>(r, p + "mlp.out", a.drop_mlp);
    }
    return r;
}

template class EDTransformer<float>;
template class EDTransformer<double>;

}  // namespace ft
