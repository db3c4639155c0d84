// The embedding of one stack, a part (docs/design.md "Parts and variants"): lines 1–3 of Algorithms 9 and 10, and
// Algorithm 8's lines 1–3 (the encoder's stack) and 10–12 (the decoder's):
//
//   1  ℓ ← length(x)
//   2  for t ∈ [ℓ]: e_t ← W_e[:, x[t]] + W_p[:, t]          (Algorithm 1, then Algorithm 2)
//   3  X ← [e_1, e_2, …, e_ℓ]
//
// A model chooses one embedding part per stack (registry kind Embedding): "tokens", the lines above as printed
// (listings/stack_embedding.cpp), composed with the embedding steps its config chooses. Each step is a registered
// part of kind EmbeddingStep in its own file, chosen by its own options (several at once), acting at one place of
// the lines above:
//   Token   on Algorithm 1's e = W_e[:, v] of each column, before the position is added
//           (V13 FixNorm: e/√(‖e‖² + eps), variants/fixnorm.cpp; the embedding scale s·e, Gemma's embed_scale and
//           BART's scale_embedding, variants/embed_scale.cpp)
//   Table   the stack's own table of positions instead of the model's W_p (BART's separate_positions: the
//           decoder's dec.W_p, variants/separate_positions.cpp)
//   Sum     added at line 2 with W_p[:, t] (BERT's segment embedding W_s[:, s_t], variants/segment_embedding.cpp)
//   Output  on X after line 3 (BERT's and BART's layer_norm(· | γ_e, β_e), variants/embed_norm.cpp)
// The model owns W_e and W_p (Algorithms 1 and 2: W_e is shared by the stacks and by a tied W_u); a stack's part
// owns the parameters of its steps (named with the stack's prefix: W_s, gamma_e; enc.gamma_e, dec.W_p, …).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formal_transformers/config.hpp"
#include "formal_transformers/embedding.hpp"
#include "formal_transformers/parts.hpp"

namespace ft {

// The features an encoder's stack may take instead of token ids (its part says so: StackInput; the embedding "audio",
// V28, takes log-mel spectrograms): B matrices side by side, F:[rows, Σ T_b] (column Σ_{b'<b} T_b' + t: column t of
// matrix b), s: their columns T_b.
template <class T>
struct Features {
    CMatView<T> F;
    Seqs s;
    MatView<T>* dF = nullptr;  // the backward's ∂loss/∂F, F's shape, written by the part (null: not asked)
};

// The columns one call embeds: n token ids, Algorithm 1's W_e, and (BERT) their segment ids (null: segment 0).
// An audio stack embeds `features` instead (ids null; n: its ⌈T_b/2⌉ columns in all).
template <class T>
struct EmbedInput {
    const TokenEmbedding<T>& tok;
    const index_t* ids = nullptr;
    index_t n = 0;
    const index_t* segments = nullptr;
    const Features<T>* features = nullptr;
};

// What a stack's embedding part and its steps are made from: the resolved config (sizes, eps, the steps' options
// in part_options) and the stack's prefix of its parameters' names ("" for D and E, "enc." or "dec." for ED).
struct EmbeddingSpec {
    const ModelConfig* c = nullptr;
    std::string prefix;
};

// The input a stack's embedding part takes, as the part reports it: token ids (rows = 0), or feature matrices of
// `rows` rows (the audio part: log-mel spectrograms). `what` names it for messages.
struct StackInput {
    index_t rows = 0;
    std::string what = "token ids";
    bool features() const { return rows > 0; }
};

// One step of the embedding (above): forward transforms X:[d_e, n] in place at its place, keeping in `state` what
// its backward needs (null: no backward follows, e.g. decoding); backward turns dX (∂loss/∂ its output) into
// ∂loss/∂ its input in place and adds its parameters' gradients. A Table step gives its table instead.
template <class T>
class EmbeddingStep {
public:
    enum class At { Token, Table, Sum, Output };
    virtual ~EmbeddingStep() = default;
    virtual At at() const = 0;
    virtual void init(ParamStore<T>& store, Rng& rng, double stddev) const { (void)store, (void)rng, (void)stddev; }
    // a call's input checked before anything is computed (IndexError for a segment id out of range)
    virtual void check(const EmbedInput<T>& in) const { (void)in; }
    virtual bool takes_segments() const { return false; }
    virtual const PositionalEmbedding<T>* table() const { return nullptr; }  // At::Table
    virtual void forward(const ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> X, PartSlot* state) const {
        (void)store, (void)in, (void)X, (void)state;
    }
    virtual void backward(ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> dX, const PartSlot& state) const {
        (void)store, (void)in, (void)dX, (void)state;
    }
};

// A stack's embedding part (registry kind Embedding). tok, pos: the model's Algorithms 1 and 2.
template <class T>
class StackEmbedding {
public:
    struct Cache {
        std::vector<PartSlot> steps;  // one per step
        PartSlot own;                 // the part's own (the audio front-end's activations)
    };
    // the input it takes (token ids, unless the part says otherwise) and the columns it makes of features of T_b columns
    virtual StackInput input() const { return {}; }
    virtual Seqs columns(const Seqs& frames) const { return frames; }
    virtual ~StackEmbedding() = default;
    // its own parameters (the steps'), after the model's W_e and W_p
    virtual void init(ParamStore<T>& store, Rng& rng, double stddev) const = 0;
    // segment ids given to a stack without segment embeddings (ValueError), or out of range (IndexError)
    virtual void check(const EmbedInput<T>& in) const = 0;
    // X:[d_e, n] ← lines 1–3 for the ids of the batch s (column j of a sequence at position j + offset);
    // c: what backward needs (null: none follows)
    virtual void forward(const ParamStore<T>& store, const EmbedInput<T>& in, const PositionalEmbedding<T>& pos,
                         const Seqs& s, index_t offset, MatView<T> X, Cache* c) const = 0;
    // the same for columns at the given positions, one per column (a batch of decoders, paged decoding)
    virtual void forward_at(const ParamStore<T>& store, const EmbedInput<T>& in, const PositionalEmbedding<T>& pos,
                            const index_t* positions, MatView<T> X) const = 0;
    // from dX = ∂loss/∂X of a forward at offset 0 (training; overwritten: scratch): the gradients of W_e, the table
    // and the steps' parameters
    virtual void backward(ParamStore<T>& store, const EmbedInput<T>& in, const PositionalEmbedding<T>& pos,
                          const Seqs& s, MatView<T> dX, const Cache& c) const = 0;
    // Algorithm 1 with the Token steps, no position (V16's W_e[:, x[t+k]]): E:[d_e, n]; its backward (dE overwritten)
    virtual void tokens(const ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> E) const = 0;
    virtual void tokens_backward(ParamStore<T>& store, const EmbedInput<T>& in, MatView<T> dE) const = 0;
};

// The registry (variants/registry.cpp): a stack's embedding part by name ("tokens"), made with the steps the
// config chooses; a step by name (each row's check runs first: the config's own, the same that resolve ran).
template <class T>
std::unique_ptr<const StackEmbedding<T>> make_stack_embedding(const std::string& name, const EmbeddingSpec& spec,
                                                              ParamStore<T>& store);
template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_embedding_step(const std::string& name, const EmbeddingSpec& spec,
                                                             ParamStore<T>& store);
// The embedding steps a config chooses (each by one of its options not at its default), in the registry's order
std::vector<const PartRow*> chosen_embedding_steps(const PartOptionValues& options);

}  // namespace ft
