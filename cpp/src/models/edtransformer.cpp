// Algorithm 8: EDTransformer (encoder-decoder; transformers.hpp quotes the listing).
#include "formal_transformers/transformers.hpp"

#include <cmath>
#include <limits>

#include "formal_transformers/blas.hpp"
#include "shared.hpp"

namespace ft {
using namespace models;

// ======================================== Algorithm 8 =================================================
// The layers are the config's block (parts.hpp PartKind::Block): Algorithm 8's post-LN ones, or V18a's pre-norm ones
// (T5), whose stacks end with a norm of their own (γ_enc, γ_dec; block_stack_norm).
template <class T>
EDTransformer<T>::EDTransformer(const ModelConfig& c) : Model<T>(resolve(c, Arch::ED)) {
    // the encoder's: "tokens", or the part its options choose (V28's "audio")
    const PartRow* enc_input = row_chosen_by(PartKind::Embedding, cfg.part_options);
    emb_enc = make_stack_embedding<T>(enc_input ? enc_input->name : "tokens", EmbeddingSpec{&cfg, "enc."}, store);  // its steps' parameters after W_e, W_p
    emb_dec = make_stack_embedding<T>("tokens", EmbeddingSpec{&cfg, "dec."}, store);
    // the φ of the "gelu" MLP (V22, BART); Algorithm 8's own, the "relu" MLP, has its ReLU
    const Activation act = Activation::Gelu;
    // the encoder's Mask ≡ 1 and its stack's bias table (V11); the decoder's causal self-attention, its cross-attention
    const BlockSpec enc{&cfg, act, Mask::bidirectional(), relative_variant(cfg, "enc.rel_bias", true), AttnVariant()};
    const BlockSpec dec{&cfg, act, Mask::unidirectional(), relative_variant(cfg, "dec.rel_bias", false),
                        attn_variant(cfg, false)};
    const bool stack_norm = block_stack_norm(cfg.block);
    for (index_t l = 0; l < cfg.L_enc; ++l) enc_layer.push_back(make_self_block<T>(cfg.block, enc, store, layer_prefix("enc", l)));
    if (stack_norm) norm_enc = std::make_unique<Norm<T>>(cfg.norm, cfg.d_e, cfg.eps, store, "enc.gamma", "enc.beta");
    for (index_t l = 0; l < cfg.L_dec; ++l) dec_layer.push_back(make_cross_block<T>(cfg.block, dec, store, layer_prefix("dec", l)));
    if (stack_norm) norm_dec = std::make_unique<Norm<T>>(cfg.norm, cfg.d_e, cfg.eps, store, "dec.gamma", "dec.beta");
    Rng rng = this->make_head_and_allocate(cfg.d_e);
    const double s = cfg.init_std, s_out = cfg.init_std / std::sqrt(2.0 * double(cfg.L_enc + cfg.L_dec));
    for (auto& b : enc_layer) b->init(store, rng, s, s_out);
    if (norm_enc) norm_enc->init(store);
    for (auto& b : dec_layer) b->init(store, rng, s, s_out);
    if (norm_dec) norm_dec->init(store);
    this->unemb->init(store, rng, s);
    emb_enc->init(store, rng, s);  // the steps' last: their draws leave Algorithm 8's parameters as without them
    emb_dec->init(store, rng, s);
    for (auto& b : enc_layer) enc_acts_.push_back(b->make_acts());
    for (auto& b : dec_layer) dec_acts_.push_back(b->make_acts());
    zstream_.resize(std::size_t(cfg.L_enc + 1));
    xstream_.resize(std::size_t(cfg.L_dec + 1));
}

// lines 1–9: z -> Z (stream[L_enc]; with γ_enc: Zf = norm(stream[L_enc] | γ_enc), V18a line 7)
template <class T>
void EDTransformer<T>::check_encoder_input(const Features<T>* f) const {
    if (audio() && !f) throw TypeError("this EDTransformer's encoder takes " + encoder_input().what + ", not token ids z");
    if (!audio() && f)
        throw TypeError("this EDTransformer's encoder takes token ids z, not features (its embedding is 'tokens': no "
                        "audio encoder)");
    if (f) emb_enc->check(EmbedInput<T>{this->tok, nullptr, 0, nullptr, f});
}

template <class T>
CMatView<T> EDTransformer<T>::encoder_forward(const Tokens& z, const Features<T>* f, std::vector<std::unique_ptr<BlockActs<T>>>& acts,
                                              std::vector<Matrix<T>>& stream, Matrix<T>& Zf, NormCache<T>& nc,
                                              typename StackEmbedding<T>::Cache& ec, const Dropout* drop,
                                              DropoutMask* embed_mask) const {
    const index_t n = z.s.total(), d_e = cfg.d_e;
    if (acts.size() != enc_layer.size()) {
        acts.clear();
        for (auto& b : enc_layer) acts.push_back(b->make_acts());
    }
    stream.resize(std::size_t(cfg.L_enc + 1));
    emb_enc->forward(store, EmbedInput<T>{this->tok, z.ids, n, nullptr, f}, this->pos, z.s, 0, ensure(stream[0], d_e, n),
                     &ec);  // lines 1–3 (V28 on the spectrograms f)
    if (embed_mask) this->embed_dropout(stream[0], DropSite::EmbedZ, *embed_mask);  // (training) Z ← Dropout(Z)
    for (index_t l = 0; l < cfg.L_enc; ++l) {  // line 4
        poll();
        const std::size_t i = std::size_t(l);
        enc_layer[i]->forward(store, view(stream[i]), z.s, ensure(stream[i + 1], d_e, n), *acts[i], drop,
                              DropPlace{DropGroup::Layers, std::uint64_t(l)});  // lines 5–8
    }
    if (!norm_enc) return view(stream[std::size_t(cfg.L_enc)]);
    MatView<T> Zn = ensure(Zf, d_e, n);
    norm_enc->forward(store, view(stream[std::size_t(cfg.L_enc)]), Zn, nc);  // V18a line 7: Z ← norm(Z | γ_enc)
    return Zn;
}

// V18: Xf ← s · norm(X | γ_dec) (with γ_dec; else X), s = d_e^−1/2 with unembed_rescale (else 1)
template <class T>
void EDTransformer<T>::head_forward(CMatView<T> X, MatView<T> Xf, NormCache<T>& nc) const {
    if (norm_dec) norm_dec->forward(store, X, Xf, nc);
    else std::copy(X.data, X.data + X.size(), Xf.data);
    if (cfg.unembed_rescale) {
        const T s = T(1) / std::sqrt(T(cfg.d_e));
        for (index_t i = 0; i < Xf.size(); ++i) Xf.data[i] *= s;
    }
}

template <class T>
void EDTransformer<T>::forward(const Tokens& z, const Tokens& x) {
    forward_impl(z, nullptr, x);
}
template <class T>
void EDTransformer<T>::forward(const Features<T>& f, const Tokens& x) {
    const Tokens z = audio_columns(f);
    forward_impl(z, &f, x);
}

template <class T>
void EDTransformer<T>::forward_impl(const Tokens& z, const Features<T>* f, const Tokens& x) {
    check_encoder_input(f);
    if (!f) validate(z, cfg.n_vocab, cfg.l_max, "z");
    validate(x, cfg, "x");
    if (z.s.count() != x.s.count())
        throw ValueError("z and x must hold the same number of sequences, got " + std::to_string(z.s.count()) + " and " +
                         std::to_string(x.s.count()));
    this->last_.done = false;
    CMatView<T> Z = encoder_forward(z, f, enc_acts_, zstream_, Zf_, norm_enc_c_, emb_z_c_, this->train_,
                                    &drop_embed_z_);  // lines 1–9
    const index_t n = x.s.total(), d_e = cfg.d_e;
    emb_dec->forward(store, EmbedInput<T>{this->tok, x.ids, n}, this->pos, x.s, 0, ensure(xstream_[0], d_e, n), &emb_x_c_);  // lines 10–12
    this->embed_dropout(xstream_[0], DropSite::EmbedX, this->drop_embed_);  // (training) X ← Dropout(X)
    for (index_t l = 0; l < cfg.L_dec; ++l) {  // line 13 (erratum: the listing loops i, its body indexes l)
        poll();
        const std::size_t i = std::size_t(l);
        dec_layer[i]->forward(store, view(xstream_[i]), x.s, Z, z.s, ensure(xstream_[i + 1], d_e, n), *dec_acts_[i],
                              this->train_, DropPlace{DropGroup::DecoderLayers, std::uint64_t(l)});  // lines 14–19
    }
    if (head_input()) head_forward(view(xstream_.back()), ensure(Xf_, d_e, n), norm_dec_c_);  // V18
    this->last_ = LastForward{true, z.s, x.s};
}

template <class T>
void EDTransformer<T>::run_backward(const typename Model<T>::Batch& in, BackwardWork<T>& w) {
    const Tokens &z = *in.z, &x = *in.x;
    CMatView<T> Z = encoded();
    MatView<T> dZ = zeros(w.dZ, cfg.d_e, z.s.total());
    copy_into(w.dX, CMatView<T>(view(w.dHead)));  // ∂/∂X of line 21's input
    if (head_input()) {  // V18: back through Xf = s · norm(X_L | γ_dec)
        MatView<T> dX = view(w.dX);
        if (cfg.unembed_rescale) {
            const T s = T(1) / std::sqrt(T(cfg.d_e));
            for (index_t i = 0; i < dX.size(); ++i) dX.data[i] *= s;
        }
        if (norm_dec) {
            MatView<T> dXn = zeros(w.dXt, dX.rows, dX.cols);
            norm_dec->backward(store, dX, norm_dec_c_, dXn);
            std::copy(dXn.data, dXn.data + dXn.size(), dX.data);
        }
    }
    for (index_t l = cfg.L_dec - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        dec_layer[i]->backward(store, view(xstream_[i]), x.s, Z, z.s, *dec_acts_[i], dZ, w);  // lines 19–14
    }
    this->embed_dropout_backward(this->drop_embed_, view(w.dX));
    emb_dec->backward(store, EmbedInput<T>{this->tok, x.ids, x.s.total()}, this->pos, x.s, view(w.dX), emb_x_c_);  // line 11
    // the encoder, from ∂/∂Z accumulated over every decoder layer's cross-attention (with γ_enc: back through it)
    if (norm_enc) norm_enc->backward(store, dZ, norm_enc_c_, zeros(w.dX, cfg.d_e, z.s.total()));
    else copy_into(w.dX, CMatView<T>(dZ));
    for (index_t l = cfg.L_enc - 1; l >= 0; --l) {
        poll();
        const std::size_t i = std::size_t(l);
        enc_layer[i]->backward(store, view(zstream_[i]), z.s, *enc_acts_[i], w);  // lines 8–5
    }
    this->embed_dropout_backward(drop_embed_z_, view(w.dX));
    emb_enc->backward(store, EmbedInput<T>{this->tok, z.ids, z.s.total(), nullptr, in.f}, this->pos, z.s, view(w.dX),
                      emb_z_c_);  // line 2 (V28's backward)
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
        const CrossBlockActs<T>& a = *dec_acts_[std::size_t(l)];
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
