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

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "formal_transformers/attention.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/embedding.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/norm.hpp"
#include "formal_transformers/params.hpp"
#include "formal_transformers/precision.hpp"
#include "formal_transformers/stack_embedding.hpp"
#include "formal_transformers/unembedding.hpp"

namespace ft {

template <class T>
class MTPModule;  // V16: one multi-token-prediction module (multi_token.hpp)

// ---------------------------------------------------------------------------------------------------
// Pieces shared by the listings.

// Norm and MLP (parts.hpp) are the parts chosen by the model's hyperparameters (norm, mlp) through the
// registry; attention's variants are MHAttention's parts (attention.hpp).

// Scratch shared by the backward passes of all layers.
template <class T>
struct BackwardWork {
    Matrix<T> dX, dXt;  // dX: ∂loss/∂X (the residual stream) between layers; dXt: ∂loss/∂ a sublayer's input X̃ (scratch)
    Matrix<T> dZ;     // ED: gradient of the encoded context
    Matrix<T> dH;     // MLP hidden gradient
    Matrix<T> dHead;  // gradient of the last listing line's input (before the unembedding)
    Matrix<T> dR;     // dropout: ∂loss/∂(a sublayer's output) through the mask (D2)
    MHAttentionWork<T> attn;
    Matrix<T> Xsel, dXsel, logits;
    Matrix<T> capped;  // the soft-capped logits (final_logit_softcapping) for their backward
    Matrix<T> dY;      // the block "sandwich" (V27): ∂loss/∂ a sublayer's output before its second norm
    std::vector<index_t> cols, targets;
};

// Scratch of decoding with caches (Algorithms 14, 15), shared by the layers: one token's columns.
template <class T>
struct DecodeScratch {
    Matrix<T> X, Xt, tmp;  // [d_e, n]: the residual stream, a normalised copy, a spare
    MHAttentionCache<T> attn;
    MLPCache<T> mlp;
    NormCache<T> norm;
};

// ---------------------------------------------------------------------------------------------------
// The layers of the listings as parts ("blocks"; parts.hpp's registry, PartKind::Block). A stack chooses its
// block once by name (the config's `block`: Algorithm 10's "pre_ln" in D, Algorithm 9's "post_ln" in E,
// Algorithm 8's "post_ln" layers or T5's "pre_ln" ones in ED; docs/design.md "Adding a block"). A block
// registers its parameters (in its listing's order), runs its lines forward (keeping its activations, named
// after the lines that make them) and backward, and a decoder's block also forward over cached keys and values.
// The model's listing calls it inside its layer loop; the stack decides the block's attention (its Mask and
// options: BlockSpec), the block how its sublayers are arranged.

// What every block with one self-attention keeps of a forward (its model reads these: attention weights,
// dropout masks); each block adds its own activations in a struct derived from it (make_acts).
template <class T>
struct BlockActs {
    virtual ~BlockActs() = default;
    MHAttentionCache<T> attn;         // the self-attention sublayer
    DropoutMask drop_attn, drop_mlp;  // dropout (training): the outputs of the attention and MLP sublayers
    Matrix<T> R;                      // scratch: a sublayer's output before its dropout
};
// The same for a block with a cross-attention to an encoded context Z (Algorithm 8's decoder layers).
template <class T>
struct CrossBlockActs {
    virtual ~CrossBlockActs() = default;
    MHAttentionCache<T> self_attn, cross_attn;
    DropoutMask drop_self, drop_cross, drop_mlp;
    Matrix<T> R;
};

// What a block is made from: the model's resolved config (sizes, norm and MLP parts, V5's bias), the MLP's φ
// (GELU in Algorithms 9–10, ReLU in Algorithm 8), the stack's self-attention (its Mask: [[t ≤ t']] or ≡ 1 or
// the config's mask part; its options: position part, T5's bias table, …) and a cross block's cross-attention.
struct BlockSpec {
    const ModelConfig* c = nullptr;
    Activation act = Activation::Gelu;
    Mask mask;
    AttnVariant self, cross;
};

// A layer with one self-attention (D's layers, E's, ED's encoder's). attn is the block's self-attention (its
// mask is the stack's: bigbird layouts and decoding read it).
template <class T>
class SelfBlock {
public:
    // Decoding: out += MHAttention(X̃) for the new columns X̃ of the block's attention `a` over the caller's cache
    // of keys and values (a KVCache, a paged one): the cache's own lines, the block's other lines unchanged.
    using Attend = std::function<void(const MHAttention<T>& a, CMatView<T> Xt, MatView<T> out)>;
    virtual ~SelfBlock() = default;
    SelfBlock(const SelfBlock&) = delete;
    SelfBlock& operator=(const SelfBlock&) = delete;
    virtual std::unique_ptr<BlockActs<T>> make_acts() const = 0;
    virtual void init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const = 0;
    // X:[d_e,n] (sequences s) -> X_out:[d_e,n] (the next layer's X), activations into a (made by make_acts).
    // drop (training): dropout on the attention weights and on the sublayers' outputs before their residual adds,
    // keyed by place.at(site). mask: the attention's Mask for this call (V7's prefix mask of the batch); null: its own
    virtual void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, MatView<T> X_out, BlockActs<T>& a,
                         const Dropout* drop = nullptr, DropPlace place = DropPlace(), const Mask* mask = nullptr) const = 0;
    // X: the block's input of that forward; from w.dX = ∂loss/∂X_out, leaves w.dX = ∂loss/∂X; parameter gradients +=
    virtual void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& s, const BlockActs<T>& a,
                          BackwardWork<T>& w) const = 0;
    // the block's lines for the columns of X (in place), its attention through `attend` (ValueError: a block of
    // an encoder only, which never decodes)
    virtual void forward_cached(const ParamStore<T>& store, MatView<T> X, const Attend& attend, DecodeScratch<T>& d) const;
    // the same over a KVCache, the columns at positions q0, q0+1, …: the new keys and values appended, then attended
    void forward_cached(const ParamStore<T>& store, MatView<T> X, index_t q0, KVCache<T>& kv, DecodeScratch<T>& d,
                        const Mask* mask = nullptr) const;

    MHAttention<T>& attn;

protected:
    explicit SelfBlock(MHAttention<T>& a) : attn(a) {}
};

// A layer with a self-attention and a cross-attention to the encoded context Z (ED's decoder).
template <class T>
class CrossBlock {
public:
    virtual ~CrossBlock() = default;
    CrossBlock(const CrossBlock&) = delete;
    CrossBlock& operator=(const CrossBlock&) = delete;
    virtual std::unique_ptr<CrossBlockActs<T>> make_acts() const = 0;
    virtual void init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const = 0;
    // X:[d_e,n_x] (sequences sx), the encoded context Z:[d_e,n_z] (sequences sz) -> X_out
    virtual void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                         MatView<T> X_out, CrossBlockActs<T>& a, const Dropout* drop = nullptr,
                         DropPlace place = DropPlace()) const = 0;
    // from w.dX = ∂loss/∂X_out, leaves w.dX = ∂loss/∂X and adds ∂loss/∂Z into dZ
    virtual void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                          const CrossBlockActs<T>& a, MatView<T> dZ, BackwardWork<T>& w) const = 0;
    // the block's lines for the columns of d.X (in place) at positions q0, …, over the cached keys and values
    virtual void forward_cached(const ParamStore<T>& store, index_t q0, KVCache<T>& self_kv, const KVCache<T>& cross_kv,
                                DecodeScratch<T>& d) const = 0;

    MHAttention<T>& self_attn;   // causal
    MHAttention<T>& cross_attn;  // Mask ≡ 1, keys and values from Z

protected:
    CrossBlock(MHAttention<T>& s, MHAttention<T>& x) : self_attn(s), cross_attn(x) {}
};

// Algorithm 10 lines 5–8: the pre-LN decoder layer of GPT-2 (Gopher with norm = RMSnorm), layer l; the block
// "pre_ln" (listings/pre_ln_block.cpp). Also V18a's encoder layer (T5, Mask ≡ 1), ViT's layer and V16's modules.
template <class T>
class PreLNDecoderBlock final : public SelfBlock<T> {
public:
    struct Acts : BlockActs<T> {   // of one forward, for backward; n = columns of the batch
        NormCache<T> norm_gamma1;  // line 5's layer_norm(· | γ¹, β¹)
        Matrix<T> Xt_attn;         // [d_e, n] line 5: X̃ ← layer_norm(X | γ¹, β¹), the attention's input
        Matrix<T> X_attn;          // [d_e, n] line 6: X ← X + MHAttention(X̃ | W_l, Mask[t, t'] = [[t ≤ t']])
        NormCache<T> norm_gamma2;  // line 7's layer_norm(· | γ², β²)
        Matrix<T> Xt_mlp;          // [d_e, n] line 7: X̃ ← layer_norm(X | γ², β²), the MLP's input
        MLPCache<T> mlp;           // line 8
    };
    PreLNDecoderBlock(const BlockSpec& spec, ParamStore<T>& store, const std::string& prefix);
    // Algorithm 10's: GELU (φ = act), line 6's Mask from the config's mask part, the position part in attention
    PreLNDecoderBlock(const ModelConfig& c, Activation act, ParamStore<T>& store, const std::string& prefix);
    std::unique_ptr<BlockActs<T>> make_acts() const override { return std::make_unique<Acts>(); }
    void init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const override;
    void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& s, MatView<T> X_out, BlockActs<T>& a,
                 const Dropout* drop = nullptr, DropPlace place = DropPlace(), const Mask* mask = nullptr) const override;
    void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& s, const BlockActs<T>& a,
                  BackwardWork<T>& w) const override;
    void backward(ParamStore<T>& store, const Seqs& s, const BlockActs<T>& a, BackwardWork<T>& w) const {
        backward(store, CMatView<T>(), s, a, w);  // (lines 5–8 need only their activations)
    }
    using SelfBlock<T>::forward_cached;
    void forward_cached(const ParamStore<T>& store, MatView<T> X, const typename SelfBlock<T>::Attend& attend,
                        DecodeScratch<T>& d) const override;

    Norm<T> norm1;          // γ_l¹, β_l¹
    MHAttention<T> attn_l;  // W_l, line 6's Mask (the block's attn)
    Norm<T> norm2;          // γ_l², β_l²
    MLP<T> mlp;             // W_mlp1^l, b_mlp1^l, W_mlp2^l, b_mlp2^l
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
    explicit Model(const ModelConfig& c)
        : cfg(c), tok(c.n_vocab, c.d_e, store, "W_e"), pos(c.l_max, c.d_e, position_table(c.positional), c.part_options.real("base"), store) {
        dropout_seed = c.seed;
    }
    virtual ~Model() = default;
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const ModelConfig cfg;
    ParamStore<T> store;  // θ (declared before every component, which registers into it)
    TokenEmbedding<T> tok;       // Algorithm 1's W_e (shared by the stacks and a tied W_u)
    PositionalEmbedding<T> pos;  // Algorithm 2's W_p
    // lines 1–3 (D, E): the stack's embedding part with the steps the config chooses (stack_embedding.hpp; ED: its
    // two stacks' emb_enc, emb_dec)
    std::unique_ptr<const StackEmbedding<T>> emb;
    std::unique_ptr<Unembedding<T>> unemb;  // made last by each model: W_u follows the layers in θ
    // How its matrix products run (precision.hpp): float32, or bf16-mixed — bf16 operands, float32
    // accumulation, θ and everything else float32 — for a float32 model only (set_precision checks).
    Precision precision = Precision::Float32;
    void set_precision(Precision p) {
        if (p == Precision::BF16Mixed && !std::is_same_v<T, float>)
            throw ValueError("precision 'bf16-mixed' is for float32 models: this one is float64 (its products stay float64)");
        precision = p;
    }

    // the input of the listing's last line (softmax(W_u X)) in the last forward: [d, n]
    virtual CMatView<T> out() const = 0;
    // the last line on the last forward: Z = W_u X (logits) or P = softmax(W_u X); [N_V, n]
    void logits(MatView<T> Z) const { unemb->logits(store, out(), Z); }
    void probabilities(MatView<T> P) const { unemb->forward(store, out(), P); }

    // softmax(S/√d_attn) (Algorithm 4 line 6) of the last forward call: attention `kind`, layer l, sequence
    // b of the batch, head h -> [ℓ_keys, ℓ_queries] of that sequence (the encoder's (ℓ_z, ℓ_z), the decoder's
    // (ℓ_x, ℓ_x), cross-attention's (ℓ_z, ℓ_x)). ValueError before any completed forward call or for a kind the
    // model has not; IndexError naming l, b or h when out of range.
    CMatView<T> attention_weights(AttentionKind kind, index_t l, index_t b, index_t h) const;
    // how many layers hold attention `kind` (0: the model has none)
    virtual index_t layers(AttentionKind kind) const = 0;
    virtual const char* arch_name() const = 0;

    // θ and its gradient by name: writable xtensor adaptors over the flat buffers (no copy; params.hpp)
    ParamViews<T> params() { return ParamViews<T>(store, false); }
    ParamViews<T> grads() { return ParamViews<T>(store, true); }
    void zero_grad() { store.zero_grad(); }

    // Dropout (docs/regularisation.md). Only the training forward of loss_and_grad (and so the trainers) drops;
    // its masks are keyed by (dropout_seed, dropout_step, place, entry), and each completed loss_and_grad
    // advances dropout_step by one: setting it back replays the same masks. dropout_seed starts as cfg.seed (the
    // initialisation's seed); setting it gives other masks without another θ₀ (data-parallel workers: one each).
    std::uint64_t dropout_step = 0;
    std::uint64_t dropout_seed = 0;
    // The masks of the last forward (those with a rate > 0; none after an evaluating forward): name, mask,
    // and for attention weights the attention (kind, layer) whose A they cover (attention_weights' layout).
    struct MaskRef {
        std::string name;
        const DropoutMask* mask;
        bool weights;
        AttentionKind kind;
        index_t layer;
        const T* A0;  // weights: the start of the attention's A (attention_weights(...).data − A0: the offset)
    };
    const LastForward& last_forward() const { return last_; }
    virtual std::vector<MaskRef> dropout_masks() const = 0;

protected:
    // A model's input: z the context (ED), x the tokens (x̃ for E), x_orig the originals of x̃ (E).
    struct Batch {
        const Tokens* z = nullptr;
        const Tokens* x = nullptr;
        const index_t* x_orig = nullptr;
        const index_t* segments = nullptr;  // E with segment embeddings (n_segments > 0): the segment id of every token of x (null: 0)
        const Features<T>* f = nullptr;     // ED with the audio encoder (V28): the spectrograms (z: their columns, no ids)
    };
    // The losses of Algorithms 11–13, defined once: forward, −Σ log P[target, col] over the scored columns,
    // and with `grad` its gradient in store.grad() (zeroed first). n_scored: how many columns were scored;
    // n_correct: of them, how many have argmax = target.
    double run_loss(const Batch& in, bool grad, index_t* n_scored, index_t* n_correct);
    virtual void run_forward(const Batch& in) = 0;
    virtual void run_backward(const Batch& in, BackwardWork<T>& w) = 0;  // from w.dHead = ∂loss/∂out()
    // the scored columns and their targets
    virtual void score(const Batch& in, std::vector<index_t>& cols, std::vector<index_t>& targets) const = 0;
    // the cache of attention `kind` in layer l (l already checked against layers(kind))
    virtual const MHAttentionCache<T>& attention_cache(AttentionKind kind, index_t l) const = 0;
    // Terms of the loss beyond the listing's (V16's multi-token prediction), after the scored columns' head loss
    // (whose gradient is in w.dHead); with `grad` their parameter gradients are added (store.grad()) and
    // run_backward adds their gradient of the trunk. head: the head loss just computed. 0: the listing's loss.
    virtual double aux_loss(const Batch&, bool /*grad*/, double /*head*/, BackwardWork<T>&) { return 0.0; }

    // W_u (N_V × d), or W_eᵀ when tied; then θ is complete: allocate it, initialise the embeddings and
    // return the random stream that initialises the rest (in θ's order)
    Rng make_head_and_allocate(index_t d);
    // lines 1–3 (D, E) through emb: X[:, t] = W_e[:, x[t]] + W_p[:, t] per sequence, with the chosen steps (segments:
    // BERT's segment ids, null: 0); the backward from dX (overwritten)
    void embed(const Tokens& x, Matrix<T>& X, const index_t* segments = nullptr);
    void embed_backward(const Tokens& x, MatView<T> dX, const index_t* segments = nullptr);
    // dropout after line 3 (training; else the mask is cleared) and its backward (D2 on dX in place)
    void embed_dropout(Matrix<T>& X, DropSite site, DropoutMask& m) const;
    void embed_dropout_backward(const DropoutMask& m, MatView<T> dX) const;
    // −Σ log softmax(W_u X[:, col])[target] over the given columns, and (if dX) its gradient:
    // dW_u (or dW_e when tied) += …, dX[:, col] += W_uᵀ dZ[:, col]
    // scale: the gradient's factor (the returned loss is unscaled)
    double head_loss(CMatView<T> X, const std::vector<index_t>& cols, const std::vector<index_t>& targets,
                     MatView<T>* dX, BackwardWork<T>& w, index_t* n_correct = nullptr, T scale = T(1));

    LastForward last_;
    BackwardWork<T> work_;
    const Dropout* train_ = nullptr;  // set during loss_and_grad's forward when the model has a dropout rate
    typename StackEmbedding<T>::Cache embed_c_;  // what emb's steps keep for the backward (D, E)
    DropoutMask drop_embed_;          // line 3's X (ED: the decoder's X of line 12)
};

// Algorithm 10.
template <class T>
class DTransformer : public Model<T> {
public:
    explicit DTransformer(const ModelConfig& c);
    // Built, then restore(*this) (ft::load: θ and dropout's counter from a file; the model returned by value).
    template <class Restore, class = std::enable_if_t<std::is_invocable_v<Restore&, DTransformer&>>>
    DTransformer(const ModelConfig& c, Restore&& restore) : DTransformer(c) { restore(*this); }
    using Model<T>::cfg;
    using Model<T>::store;

    // lines 1–10 over a batch; the result (X after line 10) is `out()`. x.prefix (mask = Prefix): V7's p_b
    void forward(const Tokens& x);
    CMatView<T> out() const override { return view(Xf_); }
    // the residual stream entering layer l (l = L: leaving the last layer), of the last forward
    CMatView<T> stream(index_t l) const { return view(stream_[std::size_t(l)]); }
    // Algorithm 13 line 5 summed over the batch, and its gradient in store.grad() (zeroed first)
    double loss_and_grad(const Tokens& x) { return this->run_loss({nullptr, &x, nullptr}, true, nullptr, nullptr); }
    // the loss without gradients; n_scored: predicted tokens, n_correct: of them, argmax = target
    double loss(const Tokens& x, index_t* n_scored = nullptr, index_t* n_correct = nullptr) {
        return this->run_loss({nullptr, &x, nullptr}, false, n_scored, n_correct);
    }
    // The xtensor API (xtensor_api.cpp, docs/api.md "C++ API"): ids checked (IndexError, ValueError), P or the
    // logits (N_V, ℓ) per sequence, the loss summed over the batch (mean: per predicted token) with its
    // gradient in grads().
    Matrix<T> operator()(const TokenIds& x);
    std::vector<Matrix<T>> operator()(const std::vector<TokenIds>& batch);
    using Model<T>::logits;
    Matrix<T> logits(const TokenIds& x);
    double loss_and_grad(const TokenIds& x);
    double loss_and_grad(const std::vector<TokenIds>& batch);
    double loss(const TokenIds& x, bool mean = false);
    double loss(const std::vector<TokenIds>& batch, bool mean = false);
    // its layers' self-attention (Model::attention_weights)
    static constexpr AttentionKind self_attention = AttentionKind::Decoder;
    index_t layers(AttentionKind kind) const override { return kind == self_attention ? cfg.L : 0; }
    const char* arch_name() const override { return "DTransformer"; }

    // Decoding with a KV cache (Algorithm 14): feed n tokens at positions len, len+1, …; writes the
    // logits of the last one to z:[N_V]. Each token costs one column of work per layer.
    struct Decoder {
        std::vector<KVCache<T>> kv;
        index_t len = 0;
        DecodeScratch<T> w;
        // V7 (mask = Prefix): the prefix length p of the sequence being decoded; the call that feeds position 0
        // must feed at least p tokens (the prefix attends over itself bidirectionally), later tokens are causal
        index_t prefix = 0;
        void reset() {  // forget the context, keep the buffers (no allocation when refilled)
            len = 0;
            for (auto& c : kv) c.len = c.start = 0;
        }
        void rollback(index_t n) {  // keep the first n tokens (n ≤ len), forget the later ones (speculative decoding)
            FT_CHECK(n >= 0 && n <= len, "Decoder::rollback past the cached length");
            for (auto& c : kv) FT_CHECK(n >= c.start, "Decoder::rollback before the sliding window's cache");
            len = n;
            for (auto& c : kv) c.len = n - c.start;
        }
    };
    void decode(Decoder& d, const index_t* ids, index_t n, T* z) const;
    // What decoding asks of the parts: a step reads only the last window() keys (line 6's mask, V8's sliding
    // window; 0: all), so the caches keep O(window()) columns (V9) and take back at most window() − 1 tokens;
    // context='auto' decodes past ℓ_max for ALiBi (made to extrapolate) and a window with positions in attention
    // (Mistral: each step stays O(w) past any length).
    // (V26's local and global layers: a global layer reads every key, so 0 unless every layer has a window)
    index_t window() const {
        index_t w = 0;
        for (const auto& b : layer) {
            const index_t v = b->attn.mask.window();
            if (v == 0) return 0;
            w = std::max(w, v);
        }
        return w;
    }
    bool decodes_past_l_max() const {
        return position_has(cfg.positional, PositionProperty::Extrapolates) ||
               (window() > 0 && position_table(cfg.positional) == Positional::None);
    }
    // The same, writing the logits of ALL n fed tokens to Z:[N_V, n] (speculative decoding verifies the
    // drafted tokens in one call; defined in speculative.cpp).
    void decode_all(Decoder& d, const index_t* ids, index_t n, MatView<T> Z) const;

    std::vector<std::unique_ptr<SelfBlock<T>>> layer;  // lines 5–8 of layer l (the config's block)
    std::unique_ptr<Norm<T>> norm_f;                           // line 10: γ, β
    // V16 (multi_token.hpp; mtp_depth = D > 0): the sequential MTP modules k = 1..D (mtp[k−1]), trained with the
    // loss L_main + (λ/D) Σ_k L_k and used as the draft of self-speculative decoding. Empty: Algorithm 10.
    std::vector<std::shared_ptr<MTPModule<T>>> mtp;
    // the terms of the last loss call: [L_main, L_1, …, L_D] (sums over the batch; empty before any)
    const std::vector<double>& loss_terms() const { return loss_terms_; }

private:
    void run_forward(const typename Model<T>::Batch& in) override;
    double aux_loss(const typename Model<T>::Batch& in, bool grad, double head, BackwardWork<T>& w) override;  // V16
    void mtp_forward(const Tokens& x);                                                             // V16 lines 1–6
    Matrix<T> dH0_;                   // V16: ∂(λ/D Σ_k L_k)/∂h⁰ (the trunk's stream after line 9)
    std::vector<double> loss_terms_;
    void run_backward(const typename Model<T>::Batch& in, BackwardWork<T>& w) override;
    void score(const typename Model<T>::Batch& in, std::vector<index_t>& cols, std::vector<index_t>& targets) const override;
    const MHAttentionCache<T>& attention_cache(AttentionKind, index_t l) const override { return acts_[std::size_t(l)]->attn; }
    std::vector<typename Model<T>::MaskRef> dropout_masks() const override;
    std::vector<std::unique_ptr<BlockActs<T>>> acts_;
    std::vector<Matrix<T>> stream_;  // [L+1] residual stream between layers
    Matrix<T> Xf_;                   // line 10's output
    NormCache<T> norm_gamma_;        // line 10's layer_norm(· | γ, β)
};

// Algorithm 9.
template <class T>
class ETransformer : public Model<T> {
public:
    explicit ETransformer(const ModelConfig& c);
    // Built, then restore(*this) (ft::load: θ and dropout's counter from a file; the model returned by value).
    template <class Restore, class = std::enable_if_t<std::is_invocable_v<Restore&, ETransformer&>>>
    ETransformer(const ModelConfig& c, Restore&& restore) : ETransformer(c) { restore(*this); }
    using Model<T>::cfg;
    using Model<T>::store;
    // lines 1–11; segments: with segment embeddings (n_segments > 0), one segment id per token of x (null: all 0; BERT)
    void forward(const Tokens& x, const index_t* segments = nullptr);
    CMatView<T> out() const override { return view(Xf_); }
    // X after line 9 of the last forward (BERT's "last hidden state"): [d_e, n]
    CMatView<T> hidden() const { return view(stream_[std::size_t(cfg.L)]); }
    // Algorithm 12 line 9 for x̃ (with mask tokens) and x (the originals), summed over the batch
    double loss_and_grad(const Tokens& x_tilde, const index_t* x, const index_t* segments = nullptr) {
        return this->run_loss({nullptr, &x_tilde, x, segments}, true, nullptr, nullptr);
    }
    double loss(const Tokens& x_tilde, const index_t* x, index_t* n_scored = nullptr, index_t* n_correct = nullptr,
                const index_t* segments = nullptr) {
        return this->run_loss({nullptr, &x_tilde, x, segments}, false, n_scored, n_correct);
    }
    // The xtensor API (xtensor_api.cpp): P (N_V, ℓ) of x̃; the loss of x̃ against the originals x
    Matrix<T> operator()(const TokenIds& x_tilde);
    std::vector<Matrix<T>> operator()(const std::vector<TokenIds>& batch);
    double loss_and_grad(const TokenIds& x_tilde, const TokenIds& x);
    double loss(const TokenIds& x_tilde, const TokenIds& x, bool mean = false);
    static constexpr AttentionKind self_attention = AttentionKind::Encoder;
    index_t layers(AttentionKind kind) const override { return kind == self_attention ? cfg.L : 0; }
    const char* arch_name() const override { return "ETransformer"; }

    std::vector<std::unique_ptr<SelfBlock<T>>> layer;           // lines 5–8 of layer l (the config's block)
    MatParam W_f;                                               // line 10
    VecParam b_f;
    std::unique_ptr<Norm<T>> norm_f;                            // line 11: γ, β

private:
    void run_forward(const typename Model<T>::Batch& in) override { forward(*in.x, in.segments); }
    void run_backward(const typename Model<T>::Batch& in, BackwardWork<T>& w) override;
    void score(const typename Model<T>::Batch& in, std::vector<index_t>& cols, std::vector<index_t>& targets) const override;
    const MHAttentionCache<T>& attention_cache(AttentionKind, index_t l) const override { return acts_[std::size_t(l)]->attn; }
    std::vector<typename Model<T>::MaskRef> dropout_masks() const override;
    Activation gelu() const { return cfg.gelu == Gelu::Tanh ? Activation::GeluTanh : Activation::Gelu; }
    std::vector<std::unique_ptr<BlockActs<T>>> acts_;
    std::vector<Matrix<T>> stream_;  // [L+1]
    Matrix<T> F_, G_, Xf_;           // line 10: F = W_f X + b_f 1ᵀ, G = GELU(F); line 11: Xf = layer_norm(G)
    NormCache<T> norm_gamma_;        // line 11's layer_norm(· | γ, β)
};

// Algorithm 8.
template <class T>
class EDTransformer : public Model<T> {
public:
    explicit EDTransformer(const ModelConfig& c);
    // Built, then restore(*this) (ft::load: θ and dropout's counter from a file; the model returned by value).
    template <class Restore, class = std::enable_if_t<std::is_invocable_v<Restore&, EDTransformer&>>>
    EDTransformer(const ModelConfig& c, Restore&& restore) : EDTransformer(c) { restore(*this); }
    using Model<T>::cfg;
    using Model<T>::store;

    void forward(const Tokens& z, const Tokens& x);  // lines 1–20
    // An encoder whose embedding part takes features (the embedding "audio", V28: spectrograms): lines 1–3 are the
    // part's on the features f, one matrix per sequence of x. A model of one kind refuses the other's input (TypeError
    // naming it).
    void forward(const Features<T>& f, const Tokens& x);
    StackInput encoder_input() const { return emb_enc->input(); }  // what the encoder's embedding part takes
    bool audio() const { return encoder_input().features(); }      // it takes features, not token ids
    // dF (not null): also ∂loss/∂F of the features, F's shape [rows, Σ T_b] (sized here)
    double loss_and_grad(const Features<T>& f, const Tokens& x, Matrix<T>* dF = nullptr) {
        const Tokens z = audio_columns(f);
        Features<T> g = f;
        MatView<T> v;
        if (dF) {
            v = ensure(*dF, f.F.rows, f.F.cols);
            g.dF = &v;
        }
        return this->run_loss({&z, &x, nullptr, nullptr, &g}, true, nullptr, nullptr);
    }
    double loss(const Features<T>& f, const Tokens& x, index_t* n_scored = nullptr, index_t* n_correct = nullptr) {
        const Tokens z = audio_columns(f);
        return this->run_loss({&z, &x, nullptr, nullptr, &f}, false, n_scored, n_correct);
    }
    // (V18: the decoder's final norm and d_e^−1/2 applied, Xf_)
    CMatView<T> out() const override { return head_input() ? view(Xf_) : view(xstream_.back()); }
    CMatView<T> encoded() const { return norm_enc ? view(Zf_) : view(zstream_.back()); }
    // Algorithm 11 line 5 summed over the batch (z and x: the same number of sequences)
    double loss_and_grad(const Tokens& z, const Tokens& x) { return this->run_loss({&z, &x, nullptr}, true, nullptr, nullptr); }
    double loss(const Tokens& z, const Tokens& x, index_t* n_scored = nullptr, index_t* n_correct = nullptr) {
        return this->run_loss({&z, &x, nullptr}, false, n_scored, n_correct);
    }
    // The xtensor API (xtensor_api.cpp): P (N_V, ℓ_x) for the context z and the tokens x
    Matrix<T> operator()(const TokenIds& z, const TokenIds& x);
    std::vector<Matrix<T>> operator()(const std::vector<TokenIds>& z, const std::vector<TokenIds>& x);
    double loss_and_grad(const TokenIds& z, const TokenIds& x);
    double loss_and_grad(const std::vector<TokenIds>& z, const std::vector<TokenIds>& x);
    double loss(const TokenIds& z, const TokenIds& x, bool mean = false);
    index_t layers(AttentionKind kind) const override { return kind == AttentionKind::Encoder ? cfg.L_enc : cfg.L_dec; }
    const char* arch_name() const override { return "EDTransformer"; }

    // Decoding with caches (Algorithm 15): `encode` runs lines 1–9 once for one context z and fills the
    // cross-attention caches; `decode` feeds n tokens of x̂ and writes the logits of the last to z:[N_V].
    struct Decoder {
        std::vector<std::unique_ptr<BlockActs<T>>> enc_acts;  // the encoder's (the last forward's stay)
        std::vector<Matrix<T>> zstream;                       // [L_enc+1]
        Matrix<T> Zf;                                                // V18: norm(Z | γ_enc)
        std::vector<KVCache<T>> self_kv, cross_kv;
        index_t len = 0;
        DecodeScratch<T> w;
        typename StackEmbedding<T>::Cache emb;  // V22: the decoder's embedding of the new tokens
    };
    void encode(Decoder& d, const index_t* z, index_t l_z) const;
    void encode(Decoder& d, const Features<T>& f) const;  // the audio encoder: one spectrogram (f.s: one sequence)
    void decode(Decoder& d, const index_t* ids, index_t n, T* logits_out) const;

    std::vector<std::unique_ptr<SelfBlock<T>>> enc_layer;   // lines 5–8 of encoder layer l (the config's block)
    std::vector<std::unique_ptr<CrossBlock<T>>> dec_layer;  // lines 14–19 of decoder layer l (the config's block)
    // each stack's final norm γ_enc, γ_dec when its block leaves the stream unnormalised (pre-LN: V18a's lines 7, 17)
    std::unique_ptr<Norm<T>> norm_enc, norm_dec;
    std::unique_ptr<const StackEmbedding<T>> emb_enc, emb_dec;  // lines 1–3 and 10–12 (stack_embedding.hpp)

private:
    // lines 1–9 into the given activations (the model's own for forward, a Decoder's for encode)
    // drop (training): dropout after line 3 into embed_mask and in every layer
    // (with γ_enc: Zf ← norm(Z | γ_enc)); returns Z
    CMatView<T> encoder_forward(const Tokens& z, const Features<T>* f, std::vector<std::unique_ptr<BlockActs<T>>>& acts,
                                std::vector<Matrix<T>>& stream, Matrix<T>& Zf, NormCache<T>& nc,
                                typename StackEmbedding<T>::Cache& ec,
                                const Dropout* drop = nullptr, DropoutMask* embed_mask = nullptr) const;
    // V18: X_L → Xf = s · norm(X_L | γ_dec) (with γ_dec; else X_L), s = d_e^−1/2 with unembed_rescale (else 1)
    bool head_input() const { return norm_dec || cfg.unembed_rescale; }
    void head_forward(CMatView<T> X, MatView<T> Xf, NormCache<T>& nc) const;
    std::vector<typename Model<T>::MaskRef> dropout_masks() const override;
    DropoutMask drop_embed_z_;  // line 3's Z
    // the encoder's input checked against its kind (TypeError: token ids to an audio encoder, features to a token one)
    void check_encoder_input(const Features<T>* f) const;
    // the spectrograms' columns after V28 (⌈T_b/2⌉ each), as the encoder's sequences (no ids)
    Tokens audio_columns(const Features<T>& f) const {
        check_encoder_input(&f);
        return Tokens{nullptr, emb_enc->columns(f.s)};
    }
    void forward_impl(const Tokens& z, const Features<T>* f, const Tokens& x);
    void start_decoding(Decoder& d, CMatView<T> Z) const;  // encode's end: the cross-attention caches of Z
    void run_forward(const typename Model<T>::Batch& in) override { forward_impl(*in.z, in.f, *in.x); }
    void run_backward(const typename Model<T>::Batch& in, BackwardWork<T>& w) override;
    void score(const typename Model<T>::Batch& in, std::vector<index_t>& cols, std::vector<index_t>& targets) const override;
    const MHAttentionCache<T>& attention_cache(AttentionKind kind, index_t l) const override {
        const std::size_t i = std::size_t(l);
        return kind == AttentionKind::Encoder ? enc_acts_[i]->attn
             : kind == AttentionKind::Decoder ? dec_acts_[i]->self_attn
                                              : dec_acts_[i]->cross_attn;
    }
    Matrix<T> Zf_, Xf_;                  // V18: norm(Z | γ_enc); the head's input
    NormCache<T> norm_enc_c_, norm_dec_c_;
    typename StackEmbedding<T>::Cache emb_z_c_, emb_x_c_;  // V22
    std::vector<std::unique_ptr<BlockActs<T>>> enc_acts_;
    std::vector<std::unique_ptr<CrossBlockActs<T>>> dec_acts_;
    std::vector<Matrix<T>> zstream_, xstream_;  // [L_enc+1], [L_dec+1]
};

}  // namespace ft
