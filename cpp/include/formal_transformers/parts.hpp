// The named parts that Algorithms 4, 5 and the architectures' sublayers are composed of, and the registry
// that maps an option's name to its part (docs/design.md "Parts and variants", "Adding a variant").
//
// The listing path stays the paper's: MHAttention (attention.cpp) is Algorithm 5 lines 1–4, Algorithm 4's
// lines 1–3 are its Q/K/V source and lines 4–6 its head kernel. A variant changes one of these places, each
// behind a small interface:
//   QKVSource     Algorithm 4 lines 1–3 for all heads: "projections" (the listing, one product per matrix),
//                 "latent" (V10);
//   HeadKernel    Algorithm 4 lines 4–6 for one (sequence, head) block: "softmax" (attention_head, the listing),
//                 "tiled" (Algorithm T, its tiled form), "performer" and "rfa" (V15);
//   KernelWrapper a part around a head kernel that forms the weights A, acting on them between the softmax and
//                 line 6's product: "dropout" (line 6 as Ṽ = V · Dropout(A), variants/attention_dropout.cpp);
//   Mask          Algorithm 4 line 5: which keys a query may see (mask.hpp; bidirectional, unidirectional,
//                 explicit; variants: prefix);
//   QKTransform   between Algorithm 4's lines 2 and 4: queries and keys transformed at their positions (V1 RoPE);
//   ScoreBias     Algorithm 4 line 6: S/√d_attn + B^h before the softmax (V2 ALiBi: B = −m_h D); may own
//                 parameters with gradients (e.g. a learned relative-position table);
//   key/value heads   Algorithm 5 lines 1–2: query head h reads key/value head h / (H/H_kv) (V3, MHAttention::kv_head);
//   DropSite      where dropout acts (dropout.hpp);
//   MLPPart       the MLP of Algorithm 10 line 8 (and 9 line 7, 8 lines 7, 18): GELU/ReLU (the listing), SwiGLU (V4);
//   NormPart      layer_norm (Algorithm 6) or RMSnorm, …
//   StackEmbedding    a stack's lines 1–3 (Algorithms 1 and 2) with its EmbeddingSteps (stack_embedding.hpp)
// A part registers its parameters in the model's ParamStore when it is made (in the listing's order) and
// is immutable afterwards (shared between copies of a model); its activations live in the caller's caches.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "formal_transformers/embedding.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/mask.hpp"
#include "formal_transformers/norm.hpp"
#include "formal_transformers/options.hpp"
#include "formal_transformers/params.hpp"
#include "formal_transformers/variants.hpp"

namespace ft {

// ------------------------------------ attention parts -------------------------------------------------
// Queries (role Query, Algorithm 4 line 1's Q) or keys (role Key, line 2's K) transformed in place before the
// scores of line 4. M holds n_heads heads of d_attn rows; column j of sequence b sits at absolute position
// q0 + (j − s.begin(b)). backward: dM ← (∂M′/∂M)ᵀ dM, in place.
template <class T>
class QKTransform {
public:
    enum class Role { Query, Key };
    virtual ~QKTransform() = default;
    virtual void forward(MatView<T> M, Role role, index_t n_heads, const Seqs& s, index_t q0) const = 0;
    virtual void backward(MatView<T> dM, Role role, index_t n_heads, const Seqs& s, index_t q0) const = 0;
};

// A bias on head h's scaled scores, Algorithm 4 line 6 as softmax(S/√d_attn + B^h): add() does
// S[t_z, j] += B^h[t_z, q0 + j] on the candidate keys of each column (mask.keys: the rest is masked anyway).
// backward() adds ∂loss/∂(the bias's parameters) from dS = ∂loss/∂S of one (sequence b, head h) block; it
// is called once per block, one block at a time (never concurrently), so it may accumulate into shared
// gradients. init() initialises the parameters (a constant bias has none).
template <class T>
class ScoreBias {
public:
    virtual ~ScoreBias() = default;
    virtual void add(const ParamStore<T>& store, const Mask& mask, index_t b, index_t h, index_t q0,
                     MatView<T> S) const = 0;
    virtual void backward(ParamStore<T>& store, const Mask& mask, index_t b, index_t h, index_t q0,
                          CMatView<T> dS) const {
        (void)store, (void)mask, (void)b, (void)h, (void)q0, (void)dS;
    }
    virtual void init(ParamStore<T>& store, Rng& rng) const { (void)store, (void)rng; }
    // The tiled listing (tiled_attention.hpp) adds the bias tile by tile: add_tile() does S[i, j] +=
    // B^h[t0 + i, q0 + j0 + j] on every entry of a tile of S (masked entries are set to −∞ afterwards). A part
    // that can (tiles() true) has no parameters (its backward would need the whole dS); the others run the
    // literal listing (attention_impl "auto" falls back to it; "tiled" is a ValueError).
    virtual bool tiles() const { return false; }
    virtual void add_tile(const ParamStore<T>& store, index_t b, index_t h, index_t q0, index_t t0, index_t j0,
                          MatView<T> S) const {
        (void)store, (void)b, (void)h, (void)q0, (void)t0, (void)j0, (void)S;
        throw ValueError("this score bias has no tiled form");
    }
};

// The options of one MHAttention (docs/variants.md). Defaults: Algorithm 5 exactly.
struct AttnVariant {
    index_t H_kv = 0;                 // key/value heads (V3); 0: H
    bool bias = true;                 // false: V5 (no b_q, b_k, b_v, b_o)
    std::string position = "none";    // a registered position part: "rope" (V1, its θ rope_theta in `options`), "alibi" (V2); "none"
    AttnImpl impl = AttnImpl::Auto;   // lines 4–6 as printed or tiled (variants.hpp AttnImpl)
    // The options the attention's parts own (their registry rows): e.g. V10's kv_lora_rank > 0 chooses the latent
    // Q/K/V source (latent_attention.hpp), which reads its q_lora_rank and qk_rope_head_dim from here.
    PartOptionValues options;
    // V11 (position "relative", variants/relative_bias.cpp): T5's bias table b [N_b, H] named rel_table
    // (shared by every attention made with that name; empty: "<prefix>rel_bias"), its buckets bidirectional
    // (encoder) or causal (decoder), offsets log-spaced up to d_max (N_b, d_max: its row's options relative_buckets,
    // relative_max_distance in `options`); b ~ N(0, rel_init_std²)
    std::string rel_table;
    bool rel_bidirectional = true;
    double rel_init_std = 0.02;
    bool scale_scores = true;  // false: V18 (T5), line 4's S ← Kᵀ Q without 1/√d_attn
    // the registered head kernel the model's `attention` names ("softmax": the listing; V15's "performer", "rfa",
    // their options n_features, feature_seed in `options`); head_kernel_name combines it with impl
    std::string kernel = "softmax";
    // the model's norm part and its eps (V24's QK-norm, variants/qk_norm.cpp, normalises each head with it)
    std::string norm = "rms";
    double eps = 1e-5;
};
// What a position part is made from: the attention's sizes and options.
struct AttnSpec {
    index_t H = 0, d_attn = 0;
    AttnVariant v;
};
// A position part is a query/key transform, a score bias, or (none) neither.
template <class T>
struct PositionPart {
    std::shared_ptr<const QKTransform<T>> qk;
    std::shared_ptr<const ScoreBias<T>> bias;
};

// ------------------------------------ state a part keeps in its caller's caches ----------------------------------
// Parts are immutable; what one keeps between calls (a forward's activations for its backward, a decoder's running
// state) lives in the caller's cache, in a PartSlot typed by the part: slot.get<S>() finds the part's S there (or
// makes it), slot.find<S>() finds it or returns null. Copying a cache copies the states.
struct PartState {
    virtual ~PartState() = default;
    virtual std::unique_ptr<PartState> clone() const = 0;
};
template <class S>
struct PartStateOf : PartState {
    std::unique_ptr<PartState> clone() const override { return std::make_unique<S>(static_cast<const S&>(*this)); }
};
class PartSlot {
public:
    PartSlot() = default;
    PartSlot(const PartSlot& o) : p_(o.p_ ? o.p_->clone() : nullptr) {}
    PartSlot& operator=(const PartSlot& o) {
        if (this != &o) p_ = o.p_ ? o.p_->clone() : nullptr;
        return *this;
    }
    PartSlot(PartSlot&&) noexcept = default;
    PartSlot& operator=(PartSlot&&) noexcept = default;
    template <class S>
    S& get() {
        if (S* s = dynamic_cast<S*>(p_.get())) return *s;
        auto n = std::make_unique<S>();
        S& s = *n;
        p_ = std::move(n);
        return s;
    }
    template <class S>
    const S* find() const {
        return dynamic_cast<const S*>(p_.get());
    }
    void reset() { p_.reset(); }

private:
    std::unique_ptr<PartState> p_;
};

// ------------------------------------ the two kinds of Algorithm 4's lines ----------------------------------------
template <class T>
struct HeadBlock;  // attention.hpp
template <class T>
struct MHAttentionCache;
template <class T>
struct MHAttentionWork;
template <class T>
struct KVCache;

// What a Q/K/V source or a head kernel is made from: MHAttention's sizes, options, mask and (kernels) position part.
template <class T>
struct AttnPartSpec {
    index_t H = 0, H_kv = 0, d_x = 0, d_z = 0, d_attn = 0, d_mid = 0;
    AttnVariant v;
    const Mask* mask = nullptr;
    const PositionPart<T>* position = nullptr;  // null for a source (made before the position part)
};

// Where Q, K, V come from: Algorithm 4's lines 1–3 for all H heads at once (head h: a block of rows; V3: K and V
// have H_kv heads). The listing's own is "projections" (Q ← W_q X + b_q 1ᵀ, …; listings/qkv_projections.cpp);
// V10's "latent" makes them from low-rank latents (variants/latent_attention.cpp). Its activations live in
// c.source (MHAttentionCache) and w.source (MHAttentionWork).
template <class T>
class QKVSource {
public:
    virtual ~QKVSource() = default;
    virtual const char* name() const = 0;
    virtual void init(ParamStore<T>& store, Rng& rng, double stddev) const = 0;
    // true: the source places queries and keys at their positions itself (V10's RoPE on its shared key part);
    // the attention then makes no position part
    virtual bool places_positions() const { return false; }
    // lines 1–3: X:[d_x,n_x] (sequences sx), Z:[d_z,n_z] (sz) -> Q:[H·d_attn,n_x], K:[H_kv·d_attn,n_z],
    // V:[H_kv·d_mid,n_z], views of buffers in c
    virtual void forward(const ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                         MHAttentionCache<T>& c, MatView<T>& Q, MatView<T>& K, MatView<T>& V) const = 0;
    // the zeroed buffers dQ, dK, dV the backward pass accumulates into (dx_is_dz: dX and dZ are one matrix)
    virtual void gradients(const MHAttentionCache<T>& c, bool dx_is_dz, index_t n_x, index_t n_z,
                           MHAttentionWork<T>& w, MatView<T>& dQ, MatView<T>& dK, MatView<T>& dV) const = 0;
    // lines 3, 2, 1 backward from dQ, dK, dV (which it may overwrite): parameter gradients += …, dX += …, dZ += …
    virtual void backward(ParamStore<T>& store, CMatView<T> X, const Seqs& sx, CMatView<T> Z, const Seqs& sz,
                          const MHAttentionCache<T>& c, MatView<T> dQ, MatView<T> dK, MatView<T> dV, MatView<T> dX,
                          MatView<T> dZ, MHAttentionWork<T>& w) const = 0;
    // Decoding with a KV cache: the numbers a token keeps (rows of KVCache's K and V) ...
    virtual index_t key_rows() const = 0;
    virtual index_t value_rows() const = 0;
    // ... computed for new context columns Z:[d_z,n] at positions p0, p0+1, …: Kc:[key_rows,n], Vc:[value_rows,n]
    virtual void append(const ParamStore<T>& store, CMatView<T> Z, index_t p0, MatView<T> Kc, MatView<T> Vc) const = 0;
    // queries X:[d_x,n] at positions q0, q0+1, … -> Q:[H·d_attn,n] (line 1; s: scratch)
    virtual void queries(const ParamStore<T>& store, CMatView<T> X, index_t q0, MatView<T> Q,
                         MHAttentionCache<T>& s) const = 0;
    // the keys and values of the cached columns Kc, Vc (views of them, or made in s)
    virtual void keys_values(const ParamStore<T>& store, CMatView<T> Kc, CMatView<T> Vc, MHAttentionCache<T>& s,
                             CMatView<T>& K, CMatView<T>& V) const = 0;
};

// How Algorithm 4's lines 4–6 are computed for one (sequence b, head h) block of Algorithm 5's line 2, given that
// block's Q^h, K^g, V^g (g = kv_head(h)): "softmax", the listing as printed (listings/attention.cpp); "tiled",
// Algorithm T (listings/tiled_attention.cpp); "performer"/"rfa", V15's random features
// (variants/random_features.cpp). What a call keeps for the backward (the weights A, or a statistic per query
// column in c.lse) is sized by begin() and written per block at the block's offsets (HeadBlock off, j0).
template <class T>
class HeadKernel {
public:
    virtual ~HeadKernel() = default;
    virtual const char* name() const = 0;
    // the registered kernel computing the same numbers tile by tile ("": none); attention_impl chooses between
    // the two per call (MHAttention::kernel_for)
    virtual const char* tiled_form() const { return ""; }
    // true: every block's products are one-thread BLAS calls, so the blocks always run in parallel
    virtual bool one_thread_blocks() const { return false; }
    // Before a call's blocks (c.A_off, c.sx, c.sz, c.q0, c.training, c.drop_key set; H heads, n_x query columns):
    // size what the call keeps in c
    virtual void begin(MHAttentionCache<T>& c, index_t H, index_t n_x) const = 0;
    // lines 4–6 for one block -> Y^h:[d_mid, l_x]
    virtual void forward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk, MHAttentionCache<T>& c,
                         MatView<T> Y) const = 0;
    // before the blocks' backward passes (scratch sized in w)
    virtual void begin_backward(const MHAttentionCache<T>& c, MHAttentionWork<T>& w) const { (void)c, (void)w; }
    // backward of one block given Y^h and dY^h: dQ += …, dK += …, dV += … (the query heads of one key/value head
    // run in turn on one thread)
    virtual void backward(CMatView<T> Q, CMatView<T> K, CMatView<T> V, CMatView<T> Y, CMatView<T> dY,
                          const HeadBlock<T>& blk, const MHAttentionCache<T>& c, MHAttentionWork<T>& w, MatView<T> dQ,
                          MatView<T> dK, MatView<T> dV) const = 0;
    // after every block's backward, on one thread: a score bias's parameter gradients (ScoreBias::backward)
    virtual void end_backward(ParamStore<T>& store, const ScoreBias<T>* bias, index_t H, const MHAttentionCache<T>& c,
                              MHAttentionWork<T>& w) const {
        (void)store, (void)bias, (void)H, (void)c, (void)w;
    }
    // The weights A:[l_z,l_x] the block's queries put on its keys, as the printed listing leaves them (and with
    // dropout the block's entries of c.drop.keep): attention_weights on demand after a kernel that forms no A
    virtual void weights(CMatView<T> Q, CMatView<T> K, CMatView<T> V, const HeadBlock<T>& blk,
                         const MHAttentionCache<T>& c, MatView<T> A) const = 0;
    // A kernel that forms the weights A before line 6's product (its registry line says so: head_kernel_forms_weights)
    // is split there for a part acting on A (KernelWrapper): weights() writes the block's A at c.A + blk.off (begin()
    // sized it), the part does line 6; in the backward the part leaves ∂loss/∂A at w.dA + blk.off (begin_backward
    // sized it) and weights_backward() takes it back through the softmax (w.dA ← dS, for end_backward) to
    // dQ += …, dK += ….
    virtual void weights_backward(CMatView<T> Q, CMatView<T> K, const HeadBlock<T>& blk, const MHAttentionCache<T>& c,
                                  MHAttentionWork<T>& w, MatView<T> dQ, MatView<T> dK) const {
        (void)Q, (void)K, (void)blk, (void)c, (void)w, (void)dQ, (void)dK;
        throw std::logic_error(std::string("the head kernel '") + name() + "' forms no weights to act on");
    }
    // Line 4's scores as the kernel forms them, for a decoder that forms one query's scores itself (paged decoding):
    // S ← score_scale · Kᵀ q, then transform_scores on the candidates (the listing: 1/√d_attn, none; V25: 1/√s, c·tanh(·/c))
    virtual T score_scale(index_t d_attn) const { return T(1) / std::sqrt(T(d_attn)); }
    virtual void transform_scores(T* S, index_t n) const { (void)S, (void)n; }
    // Decoding: before new columns are appended to the cache (V15: the cached ones folded into its running
    // state, cache.state)
    virtual void before_append(KVCache<T>& cache, index_t H_kv, index_t d_attn, index_t d_mid) const {
        (void)cache, (void)H_kv, (void)d_attn, (void)d_mid;
    }
};

// ------------------------------------ MLP parts --------------------------------------------------------
// Activations an MLP part keeps for its backward pass (each part names its own slots).
template <class T>
struct MLPCache {
    std::vector<Matrix<T>> saved;
    Matrix<T>& at(std::size_t i) {
        if (saved.size() <= i) saved.resize(i + 1);
        return saved[i];
    }
    const Matrix<T>& at(std::size_t i) const { return saved.at(i); }
};
// What an MLP part is made from: sizes, the listing's φ (the standard MLP), V5's bias flag, the names of its
// parameters (Algorithm 8's decoder calls them W_mlp3, b_mlp3, W_mlp4, b_mlp4).
struct MLPSpec {
    index_t d_e = 0, d_mlp = 0;
    Activation act = Activation::Gelu;
    bool bias = true;
    std::string W1 = "W_mlp1", b1 = "b_mlp1", W2 = "W_mlp2", b2 = "b_mlp2";
};
// The residual update X ← X + MLP(X̃): forward adds MLP(X̃) into Out; backward adds ∂loss/∂X̃ into dX̃ and the
// parameter gradients, given dOut = ∂loss/∂(MLP's output); dH is scratch.
template <class T>
class MLPPart {
public:
    virtual ~MLPPart() = default;
    virtual void init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const = 0;
    virtual void forward(const ParamStore<T>& store, CMatView<T> Xt, MatView<T> Out, MLPCache<T>& c) const = 0;
    virtual void backward(ParamStore<T>& store, CMatView<T> Xt, const MLPCache<T>& c, CMatView<T> dOut,
                          MatView<T> dXt, Matrix<T>& dH) const = 0;
};

// ------------------------------------ norm parts -------------------------------------------------------
// A per-column normalisation Ê = norm(E) with its parameters (γ, and β when it has one); as LayerNorm.
template <class T>
class NormPart {
public:
    virtual ~NormPart() = default;
    virtual void init(ParamStore<T>& store) const = 0;
    virtual void forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const = 0;
    virtual void backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const = 0;
};
// The adapter every norm class with LayerNorm's methods registers through.
template <class T, class N>
class NormOf final : public NormPart<T> {
public:
    explicit NormOf(N n) : n_(std::move(n)) {}
    void init(ParamStore<T>& store) const override { n_.init(store); }
    void forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const override {
        n_.forward(store, E, E_hat, c);
    }
    void backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const override {
        n_.backward(store, dE_hat, c, dE);
    }

private:
    N n_;
};

// ------------------------------------ the registry -----------------------------------------------------
// One table per kind of part (cpp/src/variants/registry.cpp): name → factory. The model builder makes its
// parts through these functions and an options parser checks names with check_part_name; adding a variant
// is one file defining its factory plus one line in the table.
// Block: a stack's layers (transformers.hpp SelfBlock, CrossBlock). Embedding: a stack's embedding
// (stack_embedding.hpp), one per stack; EmbeddingStep: its steps, each chosen by its own options, several at once.
// KernelWrapper: a part around the head kernel, chosen by its own options (several would wrap in the registry's order).
// PredictionHeads: a decoder's extra prediction heads beside Algorithm 10's P (V16's multi-token modules), chosen by
// their own options.
enum class PartKind { Mask, Position, MLP, Norm, QKVSource, HeadKernel, Block, Embedding, EmbeddingStep, KernelWrapper,
                      PredictionHeads };
const char* kind_name(PartKind kind);  // "mask", "position", …
std::vector<std::string> part_names(PartKind kind);
// ValueError "<option> must be one of 'a', 'b', …, got '<name>'" unless `name` is registered for `kind`
void check_part_name(PartKind kind, const std::string& name, const char* option);

// A model option that chooses a part of `kind` by name (norm='rms', mlp='swiglu'; config.cpp's schema, kind Part)
// takes the kind's registered names and their aliases (a registry line may give its part a second name, as
// mlp='gated-gelu' for "geglu"). selected_part: the registered name `given` stands for; ValueError "<option> must
// be one of 'a', 'b', …, got '<given>'" (the architecture's listing's part first, then the registry's order).
struct SelectorName {
    std::string name;
    const char* alias;
};
std::vector<SelectorName> selector_names(PartKind kind, Arch arch);  // (a part its own options choose: not named)
std::string selected_part(PartKind kind, const std::string& given, Arch arch, const char* option);
// The part of `kind` an architecture's listing has, chosen when its option is not given: norm "layer"
// (Algorithm 6); MLP "gelu" (Algorithms 9, 10) or, in EDTransformer, "relu" (Algorithm 8); mask "causal" in
// DTransformer (Algorithm 10), "bidirectional" in ETransformer; position "learned" (Algorithm 2's table); head kernel
// "softmax" (Algorithm 4's lines 4–6); the block default_block(arch); "" for the others.
const char* default_part(PartKind kind, Arch arch);
// Whether the mask `name` is made per call from the batch's per-sequence values (V7's "prefix", from the prefix
// lengths p_b: Tokens::prefix, prefix_len): its registry line says so. A model with such a mask takes prefix_len.
bool per_call_mask(const std::string& name);
// What the rest of the code asks of a head kernel, as its registry line declares it (head_kernel_has(name, p)): a
// new kernel is its file and its line, with no compare of its name anywhere else.
enum class HeadKernelProperty : unsigned {
    // it forms the weights A before line 6's product: a KernelWrapper (attention dropout) can wrap it
    FormsWeights = 1,
    // decoding keeps every past key and value in the KV cache, none folded into a running state, and a call over n
    // new tokens gives what n calls of one give: the caches can take drafted tokens back and check several at once
    // (speculative decoding, V16's self-speculation). V15's random features fold the keys into a state.
    KeepsKeys = 2,
    // its weights are the softmax of its scores as score_scale and transform_scores form them, which paged decoding
    // (PagePool, DInferenceBatch) forms itself from the pages
    ScoreSoftmax = 4,
    // its mask is the config's block layout (V17: block_size, window_blocks, …, layout_seed; the layouts a file keeps)
    BlockLayouts = 8,
};
bool head_kernel_has(const std::string& name, HeadKernelProperty p);
// What the rest of the code asks of a position part, as its registry line declares it (position_has(name, p)), and
// the table W_p of Algorithm 2 it implies (position_table: Learned, Sinusoidal, or None, the position in attention):
// a new position is its file and its line(s), with no compare of its name anywhere else. (The line "none", no
// position part, is an attention's own and named by no model option.)
enum class PositionProperty : unsigned {
    // each self-attention of DTransformer's layers makes it (V1's RoPE, V2's ALiBi): a DTransformer option
    Layers = 1,
    // EDTransformer's self-attentions: one table per stack, shared by its layers (V11's T5 bias): an ED option
    StackTables = 2,
    // it adds a score bias B^h to line 6's S (ALiBi, T5's): a kernel without scores cannot take it
    ScoreBias = 4,
    // inputs longer than l_max are taken (no table of positions bounds them: RoPE, ALiBi; max_input_length)
    PastLMax = 8,
    // decoding runs past l_max without a window's bound (ALiBi's bias extrapolates; DTransformer::decodes_past_l_max)
    Extrapolates = 16,
    // it rotates each query and key by its position after lines 1–2 (V1's RoPE, its θ rope_theta): the parts that
    // rotate with it ask for it (V10's shared key part, V26's θ of the local layers)
    RotatesQK = 32,
};
bool position_has(const std::string& name, PositionProperty p);
Positional position_table(const std::string& name);
// The names of the position parts whose lines have p ("'rope' and 'alibi'"), for the messages
std::string positions_with(PositionProperty p);

// What a part declares of itself (defined in the part's own file, listed with its factory in registry.cpp):
// the options it owns (the model config's schema takes them as its own: keywords, JSON, repr) and its one
// check. A part is chosen by its kind's selector option (mask='prefix') or by one of its own options given
// (V8's window w chooses the sliding-window mask); an option of a part not chosen must be at its default.
struct ModelConfig;
struct ModelSize;  // config.hpp: the layers and the parameters of one attention that check_model_size counts
struct PartRow {
    PartKind kind;
    const char* name;
    std::vector<PartOption> options;
    // The check of its options (own) and, given a model's resolved config, of what it needs of the rest:
    // ValueError naming the option. resolve calls it for the chosen part; the factory (model = null) too.
    void (*check)(const PartOptionValues& own, const ModelConfig* model) = nullptr;
    // resolve's defaults of its options that depend on the rest (V15's n_features from d_attn), before the check
    void (*complete)(PartOptionValues& own, const ModelConfig& model) = nullptr;
    // false: only its kind's selector chooses it (attention='performer'); its options given alone are refused
    bool chosen_by_options = true;
    // what the chosen part adds to the model's size (config.hpp model_size: layers of its own, V16's modules; its
    // attention's parameters in place of W_q, W_k, W_v, W_o, V10's latent source), overflow-checked (sizes.hpp)
    void (*size)(const PartOptionValues& own, const ModelConfig& model, ModelSize& size) = nullptr;
};
const std::vector<const PartRow*>& part_rows();  // every registered part that declares a row
const PartRow* find_part_row(PartKind kind, const std::string& name);
// The row declaring option `name` (the first, when several share it), or null
const PartRow* part_row_of_option(const std::string& name);
// The part of `kind` one of whose options is not at its default in v (the first such row), or null
const PartRow* row_chosen_by(PartKind kind, const PartOptionValues& v);
// The row of the part of `kind` a config chooses, by its kind's selector (positional='relative', attention='rfa')
// or by its own options given (sliding_window=w); null: the listing's own part, or a chosen part without a row
// (V7's mask='prefix'). ValueError for an option of a part not chosen (resolve has checked it).
const PartRow* chosen_part(const ModelConfig& c, PartKind kind);

// The parts of the kinds a config chooses one of (each kind's chosen_part with a row, in resolve's order: the rows
// whose checks resolve runs and whose size hooks model_size adds)
std::vector<const PartRow*> chosen_parts(const ModelConfig& c);

// Options of a mask part: per-sequence integers (e.g. the prefix lengths p_b), named numbers, and the values
// of the options mask parts own (e.g. V8's window; unset: their defaults).
struct MaskOptions {
    std::vector<index_t> per_sequence;
    std::map<std::string, double> values;
    PartOptionValues options;
};
Mask make_mask(const std::string& name, const MaskOptions& options = MaskOptions());
template <class T>
PositionPart<T> make_position(const std::string& name, const AttnSpec& spec, ParamStore<T>& store,
                              const std::string& prefix);
// The registered names an attention's options choose (registry.cpp): the Q/K/V source whose options are given
// (V10's kv_lora_rank → "latent"), else "projections"; the head kernel v.kernel names, combined with v.impl (a kernel
// whose line gives a dense form, V17's "bigbird", runs it under attention_impl 'literal' and 'tiled') and, for the
// listing's "softmax", replaced by a kernel its own options choose (V25's "softcap")
std::string qkv_source_name(const AttnVariant& v);
std::string head_kernel_name(const AttnVariant& v);
template <class T>
std::shared_ptr<const QKVSource<T>> make_qkv_source(const std::string& name, const AttnPartSpec<T>& spec,
                                                    ParamStore<T>& store, const std::string& prefix);
template <class T>
std::shared_ptr<const HeadKernel<T>> make_head_kernel(const std::string& name, const AttnPartSpec<T>& spec,
                                                      const std::string& prefix);
// The head kernel a model's config chooses (its attention options as attn_variant copies them)
std::string head_kernel_name(const ModelConfig& c);
// Whether the registered head kernel `name` forms the weights A before line 6's product (HeadKernel::weights_backward;
// a KernelWrapper can wrap it: HeadKernelProperty::FormsWeights), and the names of those that do ("'softmax'"), for
// the messages
bool head_kernel_forms_weights(const std::string& name);
std::string kernels_forming_weights();
// The kernel wrapped in every KernelWrapper part spec.v.options choose (each the one before), or `kernel` itself
template <class T>
std::shared_ptr<const HeadKernel<T>> wrap_head_kernel(std::shared_ptr<const HeadKernel<T>> kernel, const AttnPartSpec<T>& spec);
template <class T>
std::shared_ptr<const MLPPart<T>> make_mlp(const std::string& name, const MLPSpec& spec, ParamStore<T>& store,
                                           const std::string& prefix);
template <class T>
std::shared_ptr<const NormPart<T>> make_norm(const std::string& name, index_t d, double eps, ParamStore<T>& store,
                                             const std::string& gamma, const std::string& beta);

// A decoder's extra prediction heads (PartKind::PredictionHeads): the modules of the part c's options choose (V16's
// mtp_depth > 0: its D multi-token modules, multi_token.hpp), made after Algorithm 10's θ; none when no part is chosen.
template <class T>
class MTPModule;
template <class T>
std::vector<std::shared_ptr<MTPModule<T>>> make_prediction_heads(const ModelConfig& c, Activation act, ParamStore<T>& store);

// Blocks (transformers.hpp SelfBlock, CrossBlock): the layers a stack is made of, chosen by the config's `block`.
// A block's row checks the architectures that take it (check_block_archs). make_self_block: a layer with one
// self-attention (D, E, ED's encoder); make_cross_block: ED's decoder layer (ValueError: the block has none).
struct BlockSpec;
template <class T>
class SelfBlock;
template <class T>
class CrossBlock;
template <class T>
std::unique_ptr<SelfBlock<T>> make_self_block(const std::string& name, const BlockSpec& spec, ParamStore<T>& store,
                                              const std::string& prefix);
template <class T>
std::unique_ptr<CrossBlock<T>> make_cross_block(const std::string& name, const BlockSpec& spec, ParamStore<T>& store,
                                                const std::string& prefix);
// whether a stack of block `name` ends with a norm of its own (ED's γ_enc, γ_dec: a pre-LN layer leaves the stream
// unnormalised; Algorithm 10's line 10 is D's own)
bool block_stack_norm(const std::string& name);
// the block of `arch`'s listing: "pre_ln" (Algorithm 10), "post_ln" (Algorithms 8, 9)
const char* default_block(Arch arch);
// A block row's check: ValueError "block='<name>' is a … option" unless model (null: the factory) is of `archs`
void check_block_archs(const char* name, unsigned archs, const ModelConfig* model);

// ------------------------------------ handles the blocks hold ---------------------------------------------
// A norm part chosen by name ("layer": Algorithm 6; "rms": RMSnorm), as the listings' layer_norm(· | γ, β).
template <class T>
class Norm {
public:
    Norm(const std::string& name, index_t d, double eps, ParamStore<T>& store, const std::string& gamma,
         const std::string& beta)
        : part_(make_norm<T>(name, d, eps, store, gamma, beta)) {}
    void init(ParamStore<T>& store) const { part_->init(store); }
    void forward(const ParamStore<T>& store, CMatView<T> E, MatView<T> E_hat, NormCache<T>& c) const {
        part_->forward(store, E, E_hat, c);
    }
    void backward(ParamStore<T>& store, CMatView<T> dE_hat, const NormCache<T>& c, MatView<T> dE) const {
        part_->backward(store, dE_hat, c, dE);
    }

private:
    std::shared_ptr<const NormPart<T>> part_;
};

// An MLP part chosen by name ("gelu": the listings' W_mlp2 φ(W_mlp1 X̃ + b_mlp1 1ᵀ) + b_mlp2 1ᵀ, "relu" it with ReLU; "swiglu": V4).
template <class T>
class MLP {
public:
    MLP(const std::string& name, const MLPSpec& spec, ParamStore<T>& store, const std::string& prefix)
        : part_(make_mlp<T>(name, spec, store, prefix)) {}
    void init(ParamStore<T>& store, Rng& rng, double stddev, double out_stddev) const {
        part_->init(store, rng, stddev, out_stddev);
    }
    // X̃:[d_e,n] -> Out += MLP(X̃)
    void forward(const ParamStore<T>& store, CMatView<T> Xt, MatView<T> Out, MLPCache<T>& c) const {
        part_->forward(store, Xt, Out, c);
    }
    // dOut:[d_e,n] -> dX̃ += …, parameter gradients += …  (dH is scratch)
    void backward(ParamStore<T>& store, CMatView<T> Xt, const MLPCache<T>& c, CMatView<T> dOut, MatView<T> dXt,
                  Matrix<T>& dH) const {
        part_->backward(store, Xt, c, dOut, dXt, dH);
    }

private:
    std::shared_ptr<const MLPPart<T>> part_;
};

}  // namespace ft
