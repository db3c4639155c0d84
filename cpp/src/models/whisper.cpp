// Listing V29: Whisper, the encoder-decoder on a log-mel spectrogram (whisper.hpp quotes the listing;
// docs/variants.md V28, V29). Its layers are the registered block "pre_ln" of an EDTransformer's stacks (parts.hpp
// PartKind::Block): the encoder's Algorithm 10's pre-LN layer with Mask ≡ 1, the decoder's V18a's pre-norm cross
// layer; both with layer_norm, biases and the MLP's GELU (the config's mlp = GELU, as BART's V22).
#include "formal_transformers/whisper.hpp"

#include <algorithm>
#include <cmath>

#include "formal_transformers/blas.hpp"
#include "formal_transformers/sizes.hpp"
#include "shared.hpp"

namespace ft {
using namespace models;

void check(const WhisperConfig& c) {
    const std::pair<const char*, index_t> sizes[] = {
        {"n_mels", c.n_mels}, {"n_audio_ctx", c.n_audio_ctx}, {"n_vocab", c.n_vocab}, {"n_text_ctx", c.n_text_ctx},
        {"L_enc", c.L_enc},   {"L_dec", c.L_dec},             {"H", c.H},             {"d_e", c.d_e},
        {"d_mlp", c.d_mlp}};
    for (const auto& [name, v] : sizes)
        if (v <= 0) throw ValueError(std::string(name) + " must be a positive integer, got " + std::to_string(v));
    if (c.d_e % c.H) throw ValueError("d_e = " + std::to_string(c.d_e) + " is not divisible by H = " + std::to_string(c.H));
    if (c.d_e % 2 || c.d_e < 4)
        throw ValueError("d_e must be even and >= 4 (the encoder's sinusoids: half sines, half cosines), got " +
                         std::to_string(c.d_e));
    if (!(c.eps >= 0) || !std::isfinite(c.eps)) throw ValueError("eps must be a finite number >= 0");
    if (!(c.init_std > 0) || !std::isfinite(c.init_std)) throw ValueError("init_std must be a finite number > 0");
    for (const auto& [name, v] : {std::pair<const char*, index_t>{"start_id", c.start_id}, {"eos_id", c.eos_id}})
        if (v < -1 || v >= c.n_vocab)
            throw ValueError(std::string(name) + " must be None or a token id in [0, n_vocab = " + std::to_string(c.n_vocab) +
                             "), got " + std::to_string(v));
    // a lower bound on θ before any layer is declared (as check_model_size): the convolutions, W_e, W_p and per layer
    // the attentions' four d_e × d_e matrices (the decoder's two attentions: eight) and the MLP's two, float32, θ and
    // gradient, with each layer's bookkeeping
    const char* what = "Whisper size";
    const index_t d = c.d_e;
    const index_t mlp = checked_count({2, c.d_mlp, d}, what);
    const index_t enc = checked_add(checked_count({4, d, d}, what), mlp, what);
    const index_t dec = checked_add(checked_count({8, d, d}, what), mlp, what);
    const index_t outer = checked_add(checked_count({3, d, checked_add(c.n_mels, d, what)}, what),
                                      checked_mul(d, checked_add(c.n_vocab, c.n_text_ctx, what), what), what);
    const index_t params =
        checked_add(outer, checked_add(checked_mul(c.L_enc, enc, what), checked_mul(c.L_dec, dec, what), what), what);
    const index_t bytes = checked_add(checked_count({params, 2, index_t(sizeof(float))}, what),
                                      checked_mul(checked_add(c.L_enc, c.L_dec, what), kLayerOverhead, what), what);
    if (std::uint64_t(bytes) > max_alloc_bytes())
        throw_size_error(what, "n_mels=" + std::to_string(c.n_mels) + ", n_vocab=" + std::to_string(c.n_vocab) +
                                   ", L_enc=" + std::to_string(c.L_enc) + ", L_dec=" + std::to_string(c.L_dec) + ", d_e=" +
                                   std::to_string(d) + ", d_mlp=" + std::to_string(c.d_mlp) + " need at least " +
                                   std::to_string(params) + " parameters (" + human_bytes((long double)bytes) +
                                   " with their gradients), which exceeds this machine's memory (" +
                                   human_bytes((long double)max_alloc_bytes()) + ")");
    checked_elements({d, c.n_audio_ctx}, sizeof(double), "the encoder's sinusoids (d_e × n_audio_ctx)");
}

namespace {
ModelConfig layer_config(const WhisperConfig& w) {
    check(w);
    ModelConfig c;  // the layers' options: layer_norm, exact GELU, biases, attention as Algorithm 4 prints it
    c.arch = Arch::ED;
    c.block = "pre_ln";            // V18a's layers (Algorithm 10's with Mask ≡ 1 in the encoder)
    c.mlp = ModelConfig::Mlp::Gelu;  // the MLPs' φ: GELU (Algorithm 8's is ReLU)
    c.n_vocab = w.n_vocab;
    c.l_max = w.n_text_ctx;
    c.L_enc = w.L_enc, c.L_dec = w.L_dec, c.H = w.H, c.d_e = w.d_e, c.d_mlp = w.d_mlp;
    c.d_attn = c.d_mid = w.d_e / w.H;
    c.H_kv = w.H;
    c.eps = w.eps;
    c.seed = w.seed;
    c.init_std = w.init_std;
    return c;
}
}  // namespace

// ------------------------------ V29: the model --------------------------------------------------------------
template <class T>
Whisper<T>::Whisper(const WhisperConfig& c)
    : wc(c), cfg(layer_config(c)), front(c.n_mels, c.d_e, store, "conv."), W_sin(whisper_sinusoids<T>(c.n_audio_ctx, c.d_e)),
      tok(c.n_vocab, c.d_e, store, "W_e") {
    const Activation act = ed_activation(cfg);  // GELU
    const BlockSpec enc_spec{&cfg, act, Mask::bidirectional(), attn_variant(cfg, false), AttnVariant()};
    const BlockSpec dec_spec{&cfg, act, Mask::unidirectional(), attn_variant(cfg, false), attn_variant(cfg, false)};
    for (index_t l = 0; l < c.L_enc; ++l)  // line 2: pre-LN layers with Mask ≡ 1
        enc.push_back(make_self_block<T>(cfg.block, enc_spec, store, layer_prefix("enc", l)));
    norm_enc = std::make_unique<Norm<T>>("layer", c.d_e, c.eps, store, "enc.gamma", "enc.beta");  // line 3
    W_p = store.matrix("W_p", c.d_e, c.n_text_ctx);                                                // line 4
    for (index_t l = 0; l < c.L_dec; ++l)                                                            // line 5
        dec.push_back(make_cross_block<T>(cfg.block, dec_spec, store, layer_prefix("dec", l)));
    norm_dec = std::make_unique<Norm<T>>("layer", c.d_e, c.eps, store, "dec.gamma", "dec.beta");  // line 6
    store.allocate();
    Rng rng(c.seed);  // N(0, init_std²) weights and embeddings, residual projections / √(2 layers), biases 0, γ = 1
    const double s = c.init_std, s_out = c.init_std / std::sqrt(2.0 * double(c.L_enc + c.L_dec));
    front.init(store, rng, s);
    tok.init(store, rng, s);
    store.normal(W_p.offset, c.d_e * c.n_text_ctx, s, rng);
    for (auto& b : enc) b->init(store, rng, s, s_out);
    norm_enc->init(store);
    for (auto& b : dec) b->init(store, rng, s, s_out);
    norm_dec->init(store);
    for (auto& b : enc) enc_acts_.push_back(b->make_acts());
    for (auto& b : dec) dec_acts_.push_back(b->make_acts());
    zstream_.resize(std::size_t(c.L_enc + 1));
    xstream_.resize(std::size_t(c.L_dec + 1));
}

template <class T>
void Whisper<T>::forward(const T* features, index_t B, index_t n_frames, const index_t* x, const Seqs& sx) {
    done_ = false;
    const index_t d_e = wc.d_e, n_mels = wc.n_mels, nf = checked_mul(B, n_frames, "the spectrograms' frames");
    checked_elements({n_mels, nf}, sizeof(T), "the spectrograms");
    MatView<T> F = ensure(F_, n_mels, nf);
    for (index_t b = 0; b < B; ++b)  // (B, n_mels, T) row-major -> column b·T + t of F
        for (index_t c = 0; c < n_mels; ++c) {
            const T* row = features + (b * n_mels + c) * n_frames;
            for (index_t t = 0; t < n_frames; ++t) F(c, b * n_frames + t) = row[t];
        }
    sf_ = Seqs::from_lengths(std::vector<index_t>(std::size_t(B), n_frames));
    front.forward(store, F, sf_, zstream_[0], front_acts_);  // line 1: V28 lines 1–4
    sz_ = front_acts_.s_out;
    const index_t lz = sz_.len(0), nz = sz_.total();
    MatView<T> Z0 = ensure(zstream_[0], d_e, nz);
    for (index_t b = 0; b < B; ++b)  // V28 line 5: Z ← Z + W_sin[:, 1:ℓ_z]
        for (index_t t = 0; t < lz; ++t) {
            T* z = Z0.col(b * lz + t);
            const T* w = W_sin.data() + t * d_e;
            for (index_t k = 0; k < d_e; ++k) z[k] += w[k];
        }
    for (index_t l = 0; l < wc.L_enc; ++l) {  // line 2
        poll();
        const std::size_t i = std::size_t(l);
        enc[i]->forward(store, view(zstream_[i]), sz_, ensure(zstream_[i + 1], d_e, nz), *enc_acts_[i]);
    }
    norm_enc->forward(store, view(zstream_.back()), ensure(Zf_, d_e, nz), norm_enc_c_);  // line 3
    const index_t nx = sx.total();
    MatView<T> X0 = ensure(xstream_[0], d_e, nx);
    tok.forward(store, x, nx, X0);  // line 4: e_t ← W_e[:, x[t]] + W_p[:, t]
    CMatView<T> Wp = store.W(W_p);
    for (index_t b = 0; b < sx.count(); ++b)
        for (index_t t = 0; t < sx.len(b); ++t) {
            T* e = X0.col(sx.begin(b) + t);
            const T* w = Wp.col(t);
            for (index_t k = 0; k < d_e; ++k) e[k] += w[k];
        }
    for (index_t l = 0; l < wc.L_dec; ++l) {  // line 5
        poll();
        const std::size_t i = std::size_t(l);
        dec[i]->forward(store, view(xstream_[i]), sx, view(Zf_), sz_, ensure(xstream_[i + 1], d_e, nx), *dec_acts_[i]);
    }
    MatView<T> Xf = ensure(Xf_, d_e, nx);
    norm_dec->forward(store, view(xstream_.back()), Xf, norm_dec_c_);  // line 6
    checked_elements({wc.n_vocab, nx}, sizeof(T), "the logits");
    gemm<T>(Op::T, Op::N, T(1), store.W(tok.W_e), Xf, T(0), ensure(Zl_, wc.n_vocab, nx));  // line 7: W_eᵀ X
    B_ = B, T_ = n_frames, sx_ = sx;
    x_.assign(x, x + nx);
    done_ = true;
}

template <class T>
double Whisper<T>::loss(const T* features, index_t B, index_t n_frames, const index_t* x, const Seqs& sx, bool grad,
                        index_t* n_scored, index_t* n_correct, Matrix<T>* dF) {
    forward(features, B, n_frames, x, sx);
    std::vector<index_t> cols, targets;  // Algorithm 11 line 5: column t predicts x[t+1]
    for (index_t b = 0; b < sx.count(); ++b)
        for (index_t t = 0; t + 1 < sx.len(b); ++t) {
            cols.push_back(sx.begin(b) + t);
            targets.push_back(x[sx.begin(b) + t + 1]);
        }
    const index_t ns = index_t(cols.size()), V = wc.n_vocab, nx = sx.total();
    if (n_scored) *n_scored = ns;
    Matrix<T> Zs;
    MatView<T> zs = ensure(Zs, V, ns);
    CMatView<T> Zl = view(Zl_);
    for (index_t j = 0; j < ns; ++j) std::copy(Zl.col(cols[std::size_t(j)]), Zl.col(cols[std::size_t(j)]) + V, zs.col(j));
    const double loss = ns ? nll_and_grad<T>(zs, targets.data(), T(1), n_correct) : 0.0;
    if (!ns && n_correct) *n_correct = 0;
    if (grad) {
        store.zero_grad();
        Matrix<T> dL;
        MatView<T> dl = zeros(dL, V, nx);
        for (index_t j = 0; j < ns; ++j) std::copy(zs.col(j), zs.col(j) + V, dl.col(cols[std::size_t(j)]));
        backward(dl, dF);
    }
    return loss;
}

// d(line 7) … d(line 1)
template <class T>
void Whisper<T>::backward(MatView<T> dLogits, Matrix<T>* dF) {
    const index_t d_e = wc.d_e, nx = sx_.total(), nz = sz_.total();
    MatView<T> dXf = ensure(dXf_, d_e, nx);
    CMatView<T> We = store.W(tok.W_e);
    gemm<T>(Op::N, Op::N, T(1), We, dLogits, T(0), dXf);                          // d(line 7): ∂/∂X = W_e dZ
    gemm<T>(Op::N, Op::T, T(1), view(Xf_), dLogits, T(1), store.dW(tok.W_e));      // dW_e += X dZᵀ
    MatView<T> dX = zeros(work_.dX, d_e, nx);
    norm_dec->backward(store, dXf, norm_dec_c_, dX);                               // d(line 6)
    MatView<T> dZ = zeros(work_.dZ, d_e, nz);
    for (index_t l = wc.L_dec - 1; l >= 0; --l) {                                  // d(line 5)
        poll();
        const std::size_t i = std::size_t(l);
        dec[i]->backward(store, view(xstream_[i]), sx_, view(Zf_), sz_, *dec_acts_[i], dZ, work_);
    }
    CMatView<T> dX0 = view(work_.dX);                                              // d(line 4)
    MatView<T> dWp = store.dW(W_p);
    for (index_t b = 0; b < sx_.count(); ++b)
        for (index_t t = 0; t < sx_.len(b); ++t) {
            const T* g = dX0.col(sx_.begin(b) + t);
            T* w = dWp.col(t);
            for (index_t k = 0; k < d_e; ++k) w[k] += g[k];
        }
    tok.backward(store, x_.data(), nx, dX0);
    MatView<T> dZ0 = zeros(work_.dX, d_e, nz);
    norm_enc->backward(store, view(work_.dZ), norm_enc_c_, dZ0);                   // d(line 3)
    for (index_t l = wc.L_enc - 1; l >= 0; --l) {                                  // d(line 2)
        poll();
        const std::size_t i = std::size_t(l);
        enc[i]->backward(store, view(zstream_[i]), sz_, *enc_acts_[i], work_);
    }
    // d(line 1): W_sin is fixed; back through V28's lines 4–1
    if (dF) {
        MatView<T> df = zeros(*dF, wc.n_mels, sf_.total());
        front.backward(store, view(work_.dX), front_acts_, &df);
    } else {
        front.backward(store, view(work_.dX), front_acts_);
    }
}

template <class T>
CMatView<T> Whisper<T>::attention_weights(AttentionKind kind, index_t l, index_t b, index_t h) const {
    FT_CHECK(done_, "Whisper::attention_weights before a forward");
    const MHAttentionCache<T>& c = kind == AttentionKind::Encoder ? enc_acts_[std::size_t(l)]->attn
                                 : kind == AttentionKind::Decoder ? dec_acts_[std::size_t(l)]->self_attn
                                                                  : dec_acts_[std::size_t(l)]->cross_attn;
    c.ensure_weights();
    const index_t rows = kind == AttentionKind::Decoder ? sx_.len(b) : sz_.len(b);
    const index_t cols = kind == AttentionKind::Encoder ? sz_.len(b) : sx_.len(b);
    return {c.A.data() + c.A_off[std::size_t(b * wc.H + h)], rows, cols};
}

template class Whisper<float>;
template class Whisper<double>;

}  // namespace ft
