// Algorithms 8, 9, 10: the three transformer architectures, forward and hand-written backward.
//
// Algorithm 10: P ← DTransformer(x | θ)       (GPT-2: decoder-only, pre-LN, GELU; Gopher: norm = RMS)
//    1  ℓ ← length(x)
//    2  for t ∈ [ℓ]: e_t ← W_e[:, x[t]] + W_p[:, t]
//    3  X ← [e_1, e_2, …, e_ℓ]
//    4  for l = 1, 2, …, L do
//    5    for t ∈ [ℓ]: X̃[:, t] ← layer_norm(X[:, t] | γ_l¹, β_l¹)
//    6    X ← X + MHAttention(X̃ | W_l, Mask[t, t'] = [[t ≤ t']])
//    7    for t ∈ [ℓ]: X̃[:, t] ← layer_norm(X[:, t] | γ_l², β_l²)
//    8    X ← X + W_mlp2^l GELU(W_mlp1^l X̃ + b_mlp1^l 1ᵀ) + b_mlp2^l 1ᵀ
//    9  end
//   10  for t ∈ [ℓ]: X[:, t] ← layer_norm(X[:, t] | γ, β)
//   11  return P = softmax(W_u X)
//
// Algorithm 9: P ← ETransformer(x | θ)        (BERT: encoder-only, post-LN, GELU)
//    1–3 as above;  4 for l = 1..L do
//    5    X ← X + MHAttention(X | W_l, Mask ≡ 1)
//    6    for t ∈ [ℓ]: X[:, t] ← layer_norm(X[:, t] | γ_l¹, β_l¹)
//    7    X ← X + W_mlp2^l GELU(W_mlp1^l X + b_mlp1^l 1ᵀ) + b_mlp2^l 1ᵀ
//    8    for t ∈ [ℓ]: X[:, t] ← layer_norm(X[:, t] | γ_l², β_l²)
//    9  end
//   10  X ← GELU(W_f X + b_f 1ᵀ)
//   11  for t ∈ [ℓ]: X[:, t] ← layer_norm(X[:, t] | γ, β)
//   12  return P = softmax(W_u X)
//
// Algorithm 8: P ← EDTransformer(z, x | θ)    (the original seq2seq transformer: post-LN, ReLU)
//    1  ℓ_z ← length(z);  2 for t ∈ [ℓ_z]: e_t ← W_e[:, z[t]] + W_p[:, t];  3 Z ← [e_1, …, e_ℓz]
//    4  for l = 1..L_enc do
//    5    Z ← Z + MHAttention(Z | W_l^enc, Mask ≡ 1)
//    6    for t ∈ [ℓ_z]: Z[:, t] ← layer_norm(Z[:, t] | γ_l¹, β_l¹)
//    7    Z ← Z + W_mlp2^l ReLU(W_mlp1^l Z + b_mlp1^l 1ᵀ) + b_mlp2^l 1ᵀ
//    8    for t ∈ [ℓ_z]: Z[:, t] ← layer_norm(Z[:, t] | γ_l², β_l²)
//    9  end
//   10  ℓ_x ← length(x);  11 for t ∈ [ℓ_x]: e_t ← W_e[:, x[t]] + W_p[:, t];  12 X ← [e_1, …, e_ℓx]
//   13  for l = 1..L_dec do
//   14    X ← X + MHAttention(X | W_l^dec, Mask[t, t'] = [[t ≤ t']])
//   15    for t ∈ [ℓ_x]: X[:, t] ← layer_norm(X[:, t] | γ_l³, β_l³)
//   16    X ← X + MHAttention(X, Z | W_l^e/d, Mask ≡ 1)
//   17    for t ∈ [ℓ_x]: X[:, t] ← layer_norm(X[:, t] | γ_l⁴, β_l⁴)
//   18    X ← X + W_mlp4^l ReLU(W_mlp3^l X + b_mlp3^l 1ᵀ) + b_mlp4^l 1ᵀ
//   19    for t ∈ [ℓ_x]: X[:, t] ← layer_norm(X[:, t] | γ_l⁵, β_l⁵)
//   20  end
//   21  return P = softmax(W_u X)
//
// Errata (README.md, "Errata"): Algorithm 8 line 6 prints γ_t for γ_l, and line 13 loops over i while its body
// indexes l — we use γ_l¹ and loop over l. Algorithm 9's W_u ∈ R^{N_V×d_e} only type-checks when
// d_f = d_e: W_u is N_V × d_f here.
//
// Losses (Algorithms 11–13): D and ED (Alg 13/11 line 5): loss = −Σ_{t=1}^{ℓ−1} log P[x[t+1], t];
// E (Alg 12 line 9): loss = −Σ_{t∈T̃} log P[x[t], t] over the masked positions T̃ of x̃. They are computed
// from the logits W_u X of the scored columns only (log-softmax; the unscored columns cost nothing).
//
// Batches: several sequences side by side (Seqs), of any lengths, nothing padded: every gemm runs once
// per weight per batch; attention runs per sequence. Activations of the last forward are kept for the
// backward pass (and for inspection: attention weights). Initialisation (seeded, GPT-2's): weights and
// embeddings ~ N(0, 0.02²), the projections into the residual stream (W_o, W_mlp2/W_mlp4) ~
// N(0, (0.02/√(2·layers))²), biases 0, γ = 1, β = 0.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/embedding.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/norm.hpp"
#include "formal_transformers/params.hpp"
#include "formal_transformers/unembedding.hpp"

namespace ft {

// ---------------------------------------------------------------------------------------------------
// Hyperparameters.
struct ModelConfig {
    index_t n_vocab = 0, l_max = 0;
    index_t L = 0;                  // D, E: layers
    index_t L_enc = 0, L_dec = 0;   // ED
    index_t H = 0, d_e = 0, d_mlp = 0;
    index_t d_f = 0;                // E: the final projection's width
    index_t d_attn = 0, d_mid = 0;  // 0: d_e / H (then d_e must be divisible by H)
    NormKind norm = NormKind::Layer;
    Positional positional = Positional::Learned;
    double pos_base = 0;            // sinusoidal base; 0: ℓ_max as the paper prints it
    bool tied = false;              // W_u = W_eᵀ
    Gelu gelu = Gelu::Exact;
    double eps = 1e-5;
    std::uint64_t seed = 0;
    double init_std = 0.02;

    index_t mask_token() const { return n_vocab - 3; }
    index_t bos_token() const { return n_vocab - 2; }
    index_t eos_token() const { return n_vocab - 1; }
};
// Fill d_attn/d_mid defaults and check every size: ValueError naming the problem.
enum class Arch { D, E, ED };
ModelConfig resolve(ModelConfig c, Arch arch);

// A batch of token sequences: ids concatenated, s the sequences. Checked by `validate` (IndexError for
// ids outside [0, N_V), ValueError for empty sequences or sequences longer than ℓ_max).
struct Tokens {
    const index_t* ids = nullptr;
    Seqs s;
};
void validate(const Tokens& x, index_t n_vocab, index_t l_max, const char* what);

// ---------------------------------------------------------------------------------------------------
// Pieces shared by the listings.

// layer_norm (Algorithm 6) or RMSnorm, by the model's hyperparameter.
template <class T>
class Norm {
public:
    Norm(NormKind kind, index_t d, double eps, ParamStore<T>& store, const std::string& gamma, const std::string& beta);
    void init(ParamStore<T>& store) const;
    void forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const;
    void backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const;

private:
    std::optional<LayerNorm<T>> ln_;
    std::optional<RMSNorm<T>> rms_;
};

// The MLP of the listings' residual update X ← X + W_mlp2 φ(W_mlp1 X̃ + b_mlp1 1ᵀ) + b_mlp2 1ᵀ.
template <class T>
struct MLPCache {
    Matrix<T> Hpre;  // [d_mlp, n]  W_mlp1 X̃ + b_mlp1 1ᵀ
    Matrix<T> Act;   // [d_mlp, n]  φ(Hpre)
};
template <class T>
class MLP {
public:
    MLP(index_t d_e, index_t d_mlp, Activation act, ParamStore<T>& store, const std::string& prefix,
        const std::string& W1, const std::string& b1, const std::string& W2, const std::string& b2);
    void init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const;
    // X̃:[d_e,n] -> Out += W2 φ(W1 X̃ + b1 1ᵀ) + b2 1ᵀ
    void forward(const ParamStore<T>& store, CMatView<T> Xt, MatView<T> Out, MLPCache<T>& c) const;
    // dOut:[d_e,n] -> dX̃ += …, parameter gradients += …  (dH:[d_mlp,n] is scratch)
    void backward(ParamStore<T>& store, CMatView<T> Xt, const MLPCache<T>& c, CMatView<T> dOut, MatView<T> dXt,
                  Matrix<T>& dH) const;

    index_t d_e, d_mlp;
    Activation act;
    MatParam W_1, W_2;
    VecParam b_1, b_2;
};

// Per-layer activations kept for backward.
template <class T>
struct LayerActs {
    Matrix<T> X_in;     // the residual stream entering the layer            [d_e, n]
    Matrix<T> X_a;      // after the first residual update (before its norm)  [d_e, n]
    Matrix<T> X_1;      // after the first norm                               [d_e, n]
    Matrix<T> X_b;      // after the second residual update                   [d_e, n]
    Matrix<T> X_2;      // after the second norm                              [d_e, n]
    Matrix<T> X_c;      // ED decoder: after the third residual update        [d_e, n]
    NormCache<T> n1, n2, n3;  // the layer's norms in order: γ¹ γ² (D, E, ED encoder); γ³ γ⁴ γ⁵ (ED decoder)
    MHAttentionCache<T> attn, cross;
    MLPCache<T> mlp;
};

// Scratch shared by the backward passes of all layers.
template <class T>
struct BackwardWork {
    Matrix<T> P, Q;   // ping-pong gradients of the residual stream (x side)
    Matrix<T> dZ;     // ED: gradient of the encoded context
    Matrix<T> dH;     // MLP hidden gradient
    Matrix<T> dHead;  // gradient of the last listing line's input (before the unembedding)
    MHAttentionWork<T> attn;
    Matrix<T> Xsel, dXsel, logits;
    std::vector<index_t> cols, targets;
};

// ---------------------------------------------------------------------------------------------------
// Which attention of a model: the encoder's self-attention (Algorithm 8 line 5, Algorithm 9 line 5), the
// decoder's causal self-attention (Algorithm 8 line 14, Algorithm 10 line 6) or the decoder's
// cross-attention to the encoded context (Algorithm 8 line 16).
enum class AttentionKind { Encoder, Decoder, Cross };
const char* name(AttentionKind kind);  // "enc", "dec", "cross"

// What the last forward call left behind for backward and for attention_weights: its batch, and whether it
// ran to the end. A forward clears it once its input is checked and records its batch on completion, so a
// forward stopped half-way (Ctrl-C) leaves nothing readable; decoding with caches never touches it.
struct LastForward {
    bool done = false;
    Seqs z, x;  // the batch: z the encoder's input (ED), x the decoder's; for D and E, z = x
};

// ---------------------------------------------------------------------------------------------------
// The common surface of the three models.
template <class T>
class Model {
public:
    explicit Model(const ModelConfig& c) : cfg(c), tok(c.n_vocab, c.d_e, store), pos(c.l_max, c.d_e, c.positional, c.pos_base, store) {}
    virtual ~Model() = default;
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const ModelConfig cfg;
    ParamStore<T> store;  // θ (declared before every component, which registers into it)
    TokenEmbedding<T> tok;
    PositionalEmbedding<T> pos;

    // softmax(S/√d_attn) (Algorithm 4 line 6) of the last forward call: attention `kind`, layer l, sequence
    // b of the batch, head h -> [ℓ_keys, ℓ_queries] of that sequence (the encoder's (ℓ_z, ℓ_z), the decoder's
    // (ℓ_x, ℓ_x), cross-attention's (ℓ_z, ℓ_x)). ValueError before any completed forward call or for a kind the
    // model has not; IndexError naming l, b or h when out of range.
    CMatView<T> attention_weights(AttentionKind kind, index_t l, index_t b, index_t h) const;
    // how many layers hold attention `kind` (0: the model has none)
    virtual index_t layers(AttentionKind kind) const = 0;
    virtual const char* arch_name() const = 0;

protected:
    // the cache of attention `kind` in layer l (l already checked against layers(kind))
    virtual const MHAttentionCache<T>& attention_cache(AttentionKind kind, index_t l) const = 0;
    LastForward last_;

    // lines 1–3 of every listing: X[:, t] = W_e[:, x[t]] + W_p[:, t] per sequence
    void embed(const Tokens& x, Matrix<T>& X) const;
    void embed_backward(const Tokens& x, CMatView<T> dX);
    // −Σ log softmax(W_u X[:, col])[target] over the given columns, and (if dX) its gradient:
    // dW_u (or dW_e when tied) += …, dX[:, col] += W_uᵀ dZ[:, col]
    double head_loss(const Unembedding<T>& u, CMatView<T> X, const std::vector<index_t>& cols,
                     const std::vector<index_t>& targets, MatView<T>* dX, BackwardWork<T>& w,
                     index_t* n_correct = nullptr);
};

// Algorithm 10.
template <class T>
class DTransformer : public Model<T> {
public:
    explicit DTransformer(const ModelConfig& c);
    using Model<T>::cfg;
    using Model<T>::store;

    // lines 1–10 over a batch; the result (X after line 10) is `out()`
    void forward(const Tokens& x);
    CMatView<T> out() const { return view(Xf_); }
    // the residual stream entering layer l (l = L: leaving the last layer), of the last forward
    CMatView<T> stream(index_t l) const { return view(stream_[std::size_t(l)]); }
    // line 11 on the last forward: Z = W_u X (logits) or P = softmax(W_u X); [N_V, n]
    void logits(MatView<T> Z) const { unemb->logits(store, out(), Z); }
    void probabilities(MatView<T> P) const { unemb->forward(store, out(), P); }
    // Algorithm 13 line 5 summed over the batch, and its gradient in store.grad() (zeroed first)
    double loss_and_grad(const Tokens& x);
    // the loss without gradients; n_scored: predicted tokens, n_correct: of them, argmax = target
    double loss(const Tokens& x, index_t* n_scored = nullptr, index_t* n_correct = nullptr);
    // its layers' self-attention (Model::attention_weights)
    static constexpr AttentionKind self_attention = AttentionKind::Decoder;
    index_t layers(AttentionKind kind) const override { return kind == self_attention ? cfg.L : 0; }
    const char* arch_name() const override { return "DTransformer"; }

    // Decoding with a KV cache (Algorithm 14): feed n tokens at positions len, len+1, …; writes the
    // logits of the last one to z:[N_V]. Each token costs one column of work per layer.
    struct Decoder {
        std::vector<KVCache<T>> kv;
        index_t len = 0;
        Matrix<T> X, Xt, tmp;
        MHAttentionCache<T> scratch;
        MLPCache<T> mlp;
        NormCache<T> nc;
        void reset() {  // forget the context, keep the buffers (no allocation when refilled)
            len = 0;
            for (auto& c : kv) c.len = 0;
        }
    };
    void decode(Decoder& d, const index_t* ids, index_t n, T* z) const;

    std::vector<std::unique_ptr<Norm<T>>> norm1, norm2;
    std::vector<std::unique_ptr<MHAttention<T>>> attn;
    std::vector<std::unique_ptr<MLP<T>>> mlp;
    std::unique_ptr<Norm<T>> norm_f;
    std::unique_ptr<Unembedding<T>> unemb;  // declared last: W_u follows the layers in θ

private:
    void backward(const Tokens& x, BackwardWork<T>& w);  // from w.dX = ∂loss/∂(line-10 output)
    const MHAttentionCache<T>& attention_cache(AttentionKind, index_t l) const override { return acts_[std::size_t(l)].attn; }
    std::vector<LayerActs<T>> acts_;
    std::vector<Matrix<T>> stream_;  // [L+1] residual stream between layers
    Matrix<T> Xf_;                   // line 10's output
    NormCache<T> nf_;
    BackwardWork<T> work_;
};

// Algorithm 9.
template <class T>
class ETransformer : public Model<T> {
public:
    explicit ETransformer(const ModelConfig& c);
    using Model<T>::cfg;
    using Model<T>::store;
    void forward(const Tokens& x);  // lines 1–11
    CMatView<T> out() const { return view(Xf_); }
    void logits(MatView<T> Z) const { unemb->logits(store, out(), Z); }
    void probabilities(MatView<T> P) const { unemb->forward(store, out(), P); }
    // Algorithm 12 line 9 for x̃ (with mask tokens) and x (the originals), summed over the batch
    double loss_and_grad(const Tokens& x_tilde, const index_t* x);
    double loss(const Tokens& x_tilde, const index_t* x, index_t* n_scored = nullptr, index_t* n_correct = nullptr);
    static constexpr AttentionKind self_attention = AttentionKind::Encoder;
    index_t layers(AttentionKind kind) const override { return kind == self_attention ? cfg.L : 0; }
    const char* arch_name() const override { return "ETransformer"; }

    std::vector<std::unique_ptr<MHAttention<T>>> attn;
    std::vector<std::unique_ptr<Norm<T>>> norm1, norm2;
    std::vector<std::unique_ptr<MLP<T>>> mlp;
    MatParam W_f;
    VecParam b_f;
    std::unique_ptr<Norm<T>> norm_f;
    std::unique_ptr<Unembedding<T>> unemb;  // declared last: W_u follows the layers in θ

private:
    void backward(const Tokens& x, BackwardWork<T>& w);
    const MHAttentionCache<T>& attention_cache(AttentionKind, index_t l) const override { return acts_[std::size_t(l)].attn; }
    std::vector<LayerActs<T>> acts_;
    std::vector<Matrix<T>> stream_;  // [L+1]
    Matrix<T> F_, G_, Xf_;           // line 10: F = W_f X + b_f, G = GELU(F); line 11: Xf = layer_norm(G)
    NormCache<T> nf_;
    BackwardWork<T> work_;
};

// Algorithm 8.
template <class T>
class EDTransformer : public Model<T> {
public:
    explicit EDTransformer(const ModelConfig& c);
    using Model<T>::cfg;
    using Model<T>::store;

    void forward(const Tokens& z, const Tokens& x);  // lines 1–20
    CMatView<T> out() const { return view(xstream_.back()); }
    CMatView<T> encoded() const { return view(zstream_.back()); }
    void logits(MatView<T> Zl) const { unemb->logits(store, out(), Zl); }
    void probabilities(MatView<T> P) const { unemb->forward(store, out(), P); }
    // Algorithm 11 line 5 summed over the batch (z and x: the same number of sequences)
    double loss_and_grad(const Tokens& z, const Tokens& x);
    double loss(const Tokens& z, const Tokens& x, index_t* n_scored = nullptr, index_t* n_correct = nullptr);
    index_t layers(AttentionKind kind) const override { return kind == AttentionKind::Encoder ? cfg.L_enc : cfg.L_dec; }
    const char* arch_name() const override { return "EDTransformer"; }

    // Decoding with caches (Algorithm 15): `encode` runs lines 1–9 once for one context z and fills the
    // cross-attention caches; `decode` feeds n tokens of x̂ and writes the logits of the last to z:[N_V].
    struct Decoder {
        std::vector<LayerActs<T>> enc_acts;  // the encoder's activations (its own: the last forward's stay)
        std::vector<Matrix<T>> zstream;      // [L_enc+1]
        Matrix<T> Z;  // encoded context [d_e, ℓ_z]
        std::vector<KVCache<T>> self_kv, cross_kv;
        index_t len = 0;
        Matrix<T> X, tmp;
        MHAttentionCache<T> scratch;
        MLPCache<T> mlp;
        NormCache<T> nc;
    };
    void encode(Decoder& d, const index_t* z, index_t l_z) const;
    void decode(Decoder& d, const index_t* ids, index_t n, T* logits_out) const;

    std::vector<std::unique_ptr<MHAttention<T>>> enc_attn;
    std::vector<std::unique_ptr<Norm<T>>> enc_norm1, enc_norm2;
    std::vector<std::unique_ptr<MLP<T>>> enc_mlp;
    std::vector<std::unique_ptr<MHAttention<T>>> dec_attn, dec_cross;
    std::vector<std::unique_ptr<Norm<T>>> dec_norm3, dec_norm4, dec_norm5;
    std::vector<std::unique_ptr<MLP<T>>> dec_mlp;
    std::unique_ptr<Unembedding<T>> unemb;  // declared last: W_u follows the layers in θ

private:
    // lines 1–9 into the given activations (the model's own for forward, a Decoder's for encode)
    void encoder_forward(const Tokens& z, std::vector<LayerActs<T>>& acts, std::vector<Matrix<T>>& stream) const;
    void backward(const Tokens& z, const Tokens& x, BackwardWork<T>& w);
    const MHAttentionCache<T>& attention_cache(AttentionKind kind, index_t l) const override {
        return kind == AttentionKind::Encoder ? enc_acts_[std::size_t(l)].attn
             : kind == AttentionKind::Decoder ? dec_acts_[std::size_t(l)].attn
                                              : dec_acts_[std::size_t(l)].cross;
    }
    std::vector<LayerActs<T>> enc_acts_, dec_acts_;
    std::vector<Matrix<T>> zstream_, xstream_;  // [L_enc+1], [L_dec+1]
    BackwardWork<T> work_;
};

}  // namespace ft
