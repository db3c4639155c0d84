// The named parts that Algorithms 4, 5 and the architectures' sublayers are composed of, and the registry
// that maps an option's name to its part (docs/design.md "Parts and variants", "Adding a variant").
//
// The listing path stays the paper's: MHAttention (attention.cpp) is Algorithm 5 lines 1–4 with Algorithm
// 4's lines 1–3 as one product per matrix, and attention_head is Algorithm 4's lines 4–6. A variant changes
// one of these places, each behind a small interface:
//   Mask          Algorithm 4 line 5: which keys a query may see (mask.hpp; bidirectional, unidirectional,
//                 explicit; variants: prefix);
//   QKTransform   between Algorithm 4's lines 2 and 4: queries and keys transformed at their positions (V1 RoPE);
//   ScoreBias     Algorithm 4 line 6: S/√d_attn + B^h before the softmax (V2 ALiBi: B = −m_h D); may own
//                 parameters with gradients (e.g. a learned relative-position table);
//   key/value heads   Algorithm 5 lines 1–2: query head h reads key/value head h / (H/H_kv) (V3, MHAttention::kv_head);
//   DropSite      where dropout acts (dropout.hpp);
//   MLPPart       the MLP of Algorithm 10 line 8 (and 9 line 7, 8 lines 7, 18): GELU/ReLU (the listing), SwiGLU (V4);
//   NormPart      layer_norm (Algorithm 6) or RMSnorm, …
// A part registers its parameters in the model's ParamStore when it is made (in the listing's order) and
// is immutable afterwards (shared between copies of a model); its activations live in the caller's caches.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formal_transformers/functions.hpp"
#include "formal_transformers/mask.hpp"
#include "formal_transformers/norm.hpp"
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
    std::string position = "none";    // a registered position part: "rope" (V1), "alibi" (V2); "none"
    double rope_theta = 10000.0;      // V1's θ
    AttnImpl impl = AttnImpl::Auto;   // lines 4–6 as printed or tiled (variants.hpp AttnImpl)
    // V10 multi-head latent attention (latent_attention.hpp): kv_lora_rank > 0 makes Q, K, V from latents
    // (d_attn = qk_nope_head_dim + qk_rope_head_dim, d_mid = v_head_dim); q_lora_rank 0: no query latent.
    index_t kv_lora_rank = 0, q_lora_rank = 0, qk_rope_head_dim = 0;
    // V11 (position "relative", variants/relative_bias.cpp): T5's bias table b [rel_buckets, H] named rel_table
    // (shared by every attention made with that name; empty: "<prefix>rel_bias"), its buckets bidirectional
    // (encoder) or causal (decoder), offsets log-spaced up to rel_max_distance; b ~ N(0, rel_init_std²)
    std::string rel_table;
    bool rel_bidirectional = true;
    index_t rel_buckets = 32, rel_max_distance = 128;
    double rel_init_std = 0.02;
    bool scale_scores = true;  // false: V18 (T5), line 4's S ← Kᵀ Q without 1/√d_attn
    // lines 4–6 estimated with random features (V15, random_features.hpp): D = n_features rows of Ω, drawn
    // from feature_seed and the attention's name; Softmax: the listing
    AttnKernel kernel = AttnKernel::Softmax;
    index_t n_features = 0;
    std::uint64_t feature_seed = 0;
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
enum class PartKind { Mask, Position, MLP, Norm };
std::vector<std::string> part_names(PartKind kind);
// ValueError "<option> must be one of 'a', 'b', …, got '<name>'" unless `name` is registered for `kind`
void check_part_name(PartKind kind, const std::string& name, const char* option);

// Options of a mask part: per-sequence integers (e.g. the prefix lengths p_b) and named numbers.
struct MaskOptions {
    std::vector<index_t> per_sequence;
    std::map<std::string, double> values;
};
Mask make_mask(const std::string& name, const MaskOptions& options = MaskOptions());
template <class T>
PositionPart<T> make_position(const std::string& name, const AttnSpec& spec, ParamStore<T>& store,
                              const std::string& prefix);
template <class T>
std::shared_ptr<const MLPPart<T>> make_mlp(const std::string& name, const MLPSpec& spec, ParamStore<T>& store,
                                           const std::string& prefix);
template <class T>
std::shared_ptr<const NormPart<T>> make_norm(const std::string& name, index_t d, double eps, ParamStore<T>& store,
                                             const std::string& gamma, const std::string& beta);

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

// An MLP part chosen by name ("standard": the listings' W_mlp2 φ(W_mlp1 X̃ + b_mlp1 1ᵀ) + b_mlp2 1ᵀ; "swiglu": V4).
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
