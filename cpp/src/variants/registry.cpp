// The registry: one table per kind of part, name → factory (parts.hpp). The model builder (models/) and the
// options parsers make parts only through it.
//
// Adding a variant: write its part, its factory and (when it has options or a check) its PartRow in one new file
// under cpp/src/variants/ (docs/design.md "Adding a variant"), declare them below, and add one line to its table.
#include <algorithm>
#include <stdexcept>

#include "formal_transformers/parts.hpp"
#include "formal_transformers/stack_embedding.hpp"
#include "formal_transformers/transformers.hpp"

namespace ft {

// ------------------------------------ factories (each defined in its part's file) ---------------------------
Mask make_bidirectional_mask(const MaskOptions&);  // listings/masks.cpp
Mask make_unidirectional_mask(const MaskOptions&);  // listings/masks.cpp
Mask make_prefix_mask(const MaskOptions&);          // variants/prefix_mask.cpp
Mask make_sliding_window_mask(const MaskOptions&);  // variants/sliding_window_mask.cpp
const PartRow& sliding_window_mask_row();           // variants/sliding_window_mask.cpp
Mask make_chunked_mask(const MaskOptions&);         // variants/chunked_mask.cpp
const PartRow& chunked_mask_row();                  // variants/chunked_mask.cpp
const PartRow& latent_source_row();                 // variants/latent_attention.cpp
const PartRow& qk_norm_row();                       // variants/qk_norm.cpp
const PartRow& performer_kernel_row();              // variants/random_features.cpp
const PartRow& rfa_kernel_row();                    // variants/random_features.cpp
const PartRow& relative_bias_row();                 // variants/relative_bias.cpp
const PartRow& softcap_kernel_row();                // variants/softcap_attention.cpp
Mask make_bigbird_mask_from_options(const MaskOptions&);  // variants/bigbird_mask.cpp
const PartRow& bigbird_kernel_row();                      // variants/bigbird_mask.cpp
template <class T>
PositionPart<T> make_rope(const AttnSpec&, ParamStore<T>&, const std::string&);  // variants/rope.cpp
const PartRow& rope_position_row();                                                // variants/rope.cpp
const PartRow& sinusoidal_position_row();                                          // variants/sinusoidal_position.cpp
template <class T>
PositionPart<T> make_alibi(const AttnSpec&, ParamStore<T>&, const std::string&);  // variants/alibi.cpp
template <class T>
PositionPart<T> make_relative_bias(const AttnSpec&, ParamStore<T>&, const std::string&);  // variants/relative_bias.cpp
template <class T>
std::shared_ptr<const QKVSource<T>> make_projections(const AttnPartSpec<T>&, ParamStore<T>&,
                                                     const std::string&);  // listings/qkv_projections.cpp
template <class T>
std::shared_ptr<const QKVSource<T>> make_latent_source(const AttnPartSpec<T>&, ParamStore<T>&,
                                                       const std::string&);  // variants/latent_attention.cpp
template <class T>
std::shared_ptr<const QKVSource<T>> make_qkv_bias_source(const AttnPartSpec<T>&, ParamStore<T>&,
                                                         const std::string&);  // variants/qkv_bias.cpp
const PartRow& qkv_bias_row();                      // variants/qkv_bias.cpp
template <class T>
std::shared_ptr<const QKVSource<T>> make_qk_norm_source(const AttnPartSpec<T>&, ParamStore<T>&,
                                                        const std::string&);  // variants/qk_norm.cpp
template <class T>
std::shared_ptr<const HeadKernel<T>> make_softmax_kernel(const AttnPartSpec<T>&, const std::string&);  // listings/attention.cpp
template <class T>
std::shared_ptr<const HeadKernel<T>> make_tiled_kernel(const AttnPartSpec<T>&, const std::string&);  // listings/tiled_attention.cpp
template <class T>
std::shared_ptr<const HeadKernel<T>> make_performer_kernel(const AttnPartSpec<T>&, const std::string&);  // variants/random_features.cpp
template <class T>
std::shared_ptr<const HeadKernel<T>> make_rfa_kernel(const AttnPartSpec<T>&, const std::string&);  // variants/random_features.cpp
template <class T>
std::shared_ptr<const HeadKernel<T>> make_softcap_kernel(const AttnPartSpec<T>&, const std::string&);  // variants/softcap_attention.cpp
template <class T>
std::shared_ptr<const HeadKernel<T>> make_block_sparse_kernel(const AttnPartSpec<T>&,
                                                              const std::string&);  // variants/block_sparse.cpp
template <class T>
std::shared_ptr<const HeadKernel<T>> make_sigmoid_kernel(const AttnPartSpec<T>&, const std::string&);  // variants/sigmoid_attention.cpp
const PartRow& sigmoid_kernel_row();                                                                    // variants/sigmoid_attention.cpp
template <class T>
std::shared_ptr<const HeadKernel<T>> make_attention_dropout(std::shared_ptr<const HeadKernel<T>>,
                                                            const AttnPartSpec<T>&);  // variants/attention_dropout.cpp
const PartRow& attention_dropout_row();                                              // variants/attention_dropout.cpp
template <class T>
std::shared_ptr<const MLPPart<T>> make_standard_mlp(const MLPSpec&, ParamStore<T>&, const std::string&);  // listings/mlp.cpp
template <class T>
std::shared_ptr<const MLPPart<T>> make_swiglu_mlp(const MLPSpec&, ParamStore<T>&, const std::string&);  // variants/gated_mlp.cpp (φ = SiLU)
template <class T>
std::shared_ptr<const MLPPart<T>> make_geglu_mlp(const MLPSpec&, ParamStore<T>&, const std::string&);  // variants/gated_mlp.cpp (φ = GELU_tanh)
template <class T>
std::shared_ptr<const MLPPart<T>> make_relu_mlp(const MLPSpec&, ParamStore<T>&, const std::string&);  // variants/relu_mlp.cpp
template <class T>
std::shared_ptr<const NormPart<T>> make_layer_norm(index_t, double, ParamStore<T>&, const std::string&,
                                                   const std::string&);  // listings/norm.cpp
template <class T>
std::shared_ptr<const NormPart<T>> make_rms_norm(index_t, double, ParamStore<T>&, const std::string&,
                                                 const std::string&);  // variants/rms_norm.cpp
template <class T>
std::shared_ptr<const NormPart<T>> make_scale_norm(index_t, double, ParamStore<T>&, const std::string&,
                                                   const std::string&);  // variants/scale_norm.cpp
template <class T>
std::unique_ptr<SelfBlock<T>> make_pre_ln_block(const BlockSpec&, ParamStore<T>&, const std::string&);  // listings/pre_ln_block.cpp
const PartRow& pre_ln_block_row();                                                                    // listings/pre_ln_block.cpp
template <class T>
std::unique_ptr<SelfBlock<T>> make_post_ln_block(const BlockSpec&, ParamStore<T>&, const std::string&);  // listings/post_ln_block.cpp
const PartRow& post_ln_block_row();                                                                     // listings/post_ln_block.cpp
template <class T>
std::unique_ptr<CrossBlock<T>> make_post_ln_cross_block(const BlockSpec&, ParamStore<T>&,
                                                        const std::string&);  // listings/post_ln_cross_block.cpp
template <class T>
std::unique_ptr<CrossBlock<T>> make_pre_ln_cross_block(const BlockSpec&, ParamStore<T>&,
                                                       const std::string&);  // variants/pre_ln_cross_block.cpp
template <class T>
std::unique_ptr<SelfBlock<T>> make_parallel_block(const BlockSpec&, ParamStore<T>&, const std::string&);  // variants/parallel_block.cpp
const PartRow& parallel_block_row();                                                                     // variants/parallel_block.cpp
template <class T>
std::unique_ptr<SelfBlock<T>> make_sandwich_block(const BlockSpec&, ParamStore<T>&, const std::string&);  // variants/sandwich_block.cpp
const PartRow& sandwich_block_row();                                                                     // variants/sandwich_block.cpp
template <class T>
std::shared_ptr<const NormPart<T>> make_rms1p_norm(index_t, double, ParamStore<T>&, const std::string&,
                                                   const std::string&);  // variants/rms1p_norm.cpp
template <class T>
std::unique_ptr<const StackEmbedding<T>> make_token_stack_embedding(const EmbeddingSpec&, ParamStore<T>&);  // listings/stack_embedding.cpp
template <class T>
std::unique_ptr<const StackEmbedding<T>> make_audio_stack_embedding(const EmbeddingSpec&, ParamStore<T>&);  // variants/audio_embedding.cpp
const PartRow& audio_embedding_row();                                                                       // variants/audio_embedding.cpp
template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_fixnorm(const EmbeddingSpec&, ParamStore<T>&);  // variants/fixnorm.cpp
const PartRow& fixnorm_row();                                                               // variants/fixnorm.cpp
template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_embed_scale(const EmbeddingSpec&, ParamStore<T>&);  // variants/embed_scale.cpp
const PartRow& embed_scale_row();                                                               // variants/embed_scale.cpp
template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_separate_positions(const EmbeddingSpec&,
                                                                ParamStore<T>&);  // variants/separate_positions.cpp
const PartRow& separate_positions_row();                                          // variants/separate_positions.cpp
template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_segment_embedding(const EmbeddingSpec&,
                                                               ParamStore<T>&);  // variants/segment_embedding.cpp
const PartRow& segment_embedding_row();                                          // variants/segment_embedding.cpp
template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_embed_norm(const EmbeddingSpec&, ParamStore<T>&);  // variants/embed_norm.cpp
const PartRow& embed_norm_row();                                                               // variants/embed_norm.cpp
template <class T>
std::vector<std::shared_ptr<MTPModule<T>>> make_mtp_modules(const ModelConfig&, Activation, ParamStore<T>&);  // variants/multi_token.cpp
const PartRow& mtp_heads_row();                                                                             // variants/multi_token.cpp

namespace {
template <class T>
PositionPart<T> make_no_position(const AttnSpec&, ParamStore<T>&, const std::string&) {
    return {};  // Algorithm 5: the position enters through the embedding only
}

// ------------------------------------ the tables ---------------------------------------------------------------
template <class F>
struct Entry {
    const char* name;
    F make;
    const PartRow& (*row)() = nullptr;  // the part's options and check (none: it has neither)
    const char* alias = nullptr;        // another name its kind's selector takes for it (mlp='gated-gelu')
    unsigned archs = archs::ALL;        // the architectures whose selector option may name it
    bool per_call = false;              // a mask made per call from the batch's per-sequence values (V7's p_b)
};
using MaskFactory = Mask (*)(const MaskOptions&);
// a position part, the table W_p of Algorithm 2 it implies, and what its line declares of it (parts.hpp
// PositionProperty: the bits below)
template <class T>
struct PositionFactory {
    PositionPart<T> (*make)(const AttnSpec&, ParamStore<T>&, const std::string&);
    Positional table = Positional::None;
    unsigned properties = 0;
};
constexpr unsigned Layers = unsigned(PositionProperty::Layers);
constexpr unsigned StackTables = unsigned(PositionProperty::StackTables);
constexpr unsigned ScoreBias = unsigned(PositionProperty::ScoreBias);
constexpr unsigned PastLMax = unsigned(PositionProperty::PastLMax);
constexpr unsigned Extrapolates = unsigned(PositionProperty::Extrapolates);
constexpr unsigned RotatesQK = unsigned(PositionProperty::RotatesQK);
template <class T>
using QKVSourceFactory = std::shared_ptr<const QKVSource<T>> (*)(const AttnPartSpec<T>&, ParamStore<T>&,
                                                                 const std::string&);
// a head kernel, what its line declares of it (parts.hpp HeadKernelProperty: the bits below), and the kernel that
// attention_impl 'literal' and 'tiled' run in its place (null: itself; V17's "bigbird": the dense listing, "softmax",
// with the same mask, the definition)
template <class T>
struct HeadKernelFactory {
    std::shared_ptr<const HeadKernel<T>> (*make)(const AttnPartSpec<T>&, const std::string&);
    unsigned properties = 0;
    const char* dense = nullptr;
};
constexpr unsigned FormsWeights = unsigned(HeadKernelProperty::FormsWeights);
constexpr unsigned KeepsKeys = unsigned(HeadKernelProperty::KeepsKeys);
constexpr unsigned ScoreSoftmax = unsigned(HeadKernelProperty::ScoreSoftmax);
constexpr unsigned BlockLayouts = unsigned(HeadKernelProperty::BlockLayouts);
template <class T>
using KernelWrapperFactory = std::shared_ptr<const HeadKernel<T>> (*)(std::shared_ptr<const HeadKernel<T>>,
                                                                      const AttnPartSpec<T>&);
template <class T>
using MLPFactory = std::shared_ptr<const MLPPart<T>> (*)(const MLPSpec&, ParamStore<T>&, const std::string&);
template <class T>
using NormFactory = std::shared_ptr<const NormPart<T>> (*)(index_t, double, ParamStore<T>&, const std::string&,
                                                           const std::string&);
template <class T>
using EmbeddingFactory = std::unique_ptr<const StackEmbedding<T>> (*)(const EmbeddingSpec&, ParamStore<T>&);
template <class T>
using EmbeddingStepFactory = std::shared_ptr<const EmbeddingStep<T>> (*)(const EmbeddingSpec&, ParamStore<T>&);
// a block: its layer with one self-attention and (ED's decoder) with a cross-attention (null: none), and whether its
// stacks end with a norm of their own (pre-LN)
template <class T>
struct BlockFactory {
    std::unique_ptr<SelfBlock<T>> (*self)(const BlockSpec&, ParamStore<T>&, const std::string&);
    std::unique_ptr<CrossBlock<T>> (*cross)(const BlockSpec&, ParamStore<T>&, const std::string&) = nullptr;
    bool stack_norm = false;
};

const std::vector<Entry<MaskFactory>>& masks() {
    static const std::vector<Entry<MaskFactory>> t = {
        {"bidirectional", make_bidirectional_mask, nullptr, nullptr, archs::E},  // Algorithm 9's (mask ≡ 1)
        {"causal", make_unidirectional_mask, nullptr, "unidirectional", archs::D},  // Algorithm 10's [[t_z ≤ t_x]]
        {"prefix", make_prefix_mask, nullptr, nullptr, archs::D, true},
        {"sliding_window", make_sliding_window_mask, sliding_window_mask_row},
        {"chunked", make_chunked_mask, chunked_mask_row},
        {"bigbird", make_bigbird_mask_from_options, nullptr, nullptr, archs::E},  // chosen by attention='bigbird'
    };
    return t;
}
template <class T>
const std::vector<Entry<PositionFactory<T>>>& positions() {
    static const std::vector<Entry<PositionFactory<T>>> t = {
        {"none", {make_no_position<T>}, nullptr, nullptr, 0},  // an attention without one (no model option names it)
        {"learned", {make_no_position<T>, Positional::Learned}},        // Algorithm 2's W_p, learned
        {"sinusoidal", {make_no_position<T>, Positional::Sinusoidal}, sinusoidal_position_row},  // Algorithm 2's W_p, the sinusoids
        {"rope", {make_rope<T>, Positional::None, Layers | PastLMax | RotatesQK}, rope_position_row},
        {"alibi", {make_alibi<T>, Positional::None, Layers | ScoreBias | PastLMax | Extrapolates}},
        {"relative", {make_relative_bias<T>, Positional::None, StackTables | ScoreBias}, relative_bias_row},
    };
    return t;
}
template <class T>
const std::vector<Entry<QKVSourceFactory<T>>>& qkv_sources() {
    static const std::vector<Entry<QKVSourceFactory<T>>> t = {
        {"projections", make_projections<T>},
        {"latent", make_latent_source<T>, latent_source_row},
        {"qkv_bias", make_qkv_bias_source<T>, qkv_bias_row},
        {"qk_norm", make_qk_norm_source<T>, qk_norm_row},
    };
    return t;
}
template <class T>
const std::vector<Entry<HeadKernelFactory<T>>>& head_kernels() {
    static const std::vector<Entry<HeadKernelFactory<T>>> t = {
        {"softmax", {make_softmax_kernel<T>, FormsWeights | KeepsKeys | ScoreSoftmax}},
        // softmax's tiled form, chosen by attention_impl (no `attention` names it); it drops the weights itself,
        // tile by tile (Algorithm T)
        {"tiled", {make_tiled_kernel<T>, KeepsKeys | ScoreSoftmax}, nullptr, nullptr, 0},
        {"performer", {make_performer_kernel<T>}, performer_kernel_row},  // (V15: folds the keys into a state)
        {"rfa", {make_rfa_kernel<T>}, rfa_kernel_row},
        {"bigbird", {make_block_sparse_kernel<T>, BlockLayouts, "softmax"}, bigbird_kernel_row},  // (V17: its mask too)
        {"softcap", {make_softcap_kernel<T>, FormsWeights | KeepsKeys | ScoreSoftmax}, softcap_kernel_row},
        {"sigmoid", {make_sigmoid_kernel<T>, FormsWeights}, sigmoid_kernel_row},
    };
    return t;
}
// parts around the head kernel, each chosen by its own options
template <class T>
const std::vector<Entry<KernelWrapperFactory<T>>>& kernel_wrappers() {
    static const std::vector<Entry<KernelWrapperFactory<T>>> t = {
        {"dropout", make_attention_dropout<T>, attention_dropout_row},
    };
    return t;
}
template <class T>
const std::vector<Entry<MLPFactory<T>>>& mlps() {
    static const std::vector<Entry<MLPFactory<T>>> t = {
        {"gelu", make_standard_mlp<T>},  // the listing's MLP with the model's GELU (Algorithms 9, 10; V22 in 8)
        {"swiglu", make_swiglu_mlp<T>},
        {"geglu", make_geglu_mlp<T>, nullptr, "gated-gelu"},
        {"relu", make_relu_mlp<T>},
    };
    return t;
}
template <class T>
const std::vector<Entry<NormFactory<T>>>& norms() {
    static const std::vector<Entry<NormFactory<T>>> t = {
        {"layer", make_layer_norm<T>},
        {"rms", make_rms_norm<T>},
        {"scale", make_scale_norm<T>},
        {"rms1p", make_rms1p_norm<T>},
    };
    return t;
}
// a stack's embedding (stack_embedding.hpp): one chosen per stack
template <class T>
const std::vector<Entry<EmbeddingFactory<T>>>& embeddings() {
    static const std::vector<Entry<EmbeddingFactory<T>>> t = {
        {"tokens", make_token_stack_embedding<T>},
        {"audio", make_audio_stack_embedding<T>, audio_embedding_row},
    };
    return t;
}
// its steps, each chosen by its own options (several at once; they act in this order at each place)
template <class T>
const std::vector<Entry<EmbeddingStepFactory<T>>>& embedding_steps() {
    static const std::vector<Entry<EmbeddingStepFactory<T>>> t = {
        {"fixnorm", make_fixnorm<T>, fixnorm_row},
        {"scale", make_embed_scale<T>, embed_scale_row},
        {"separate_positions", make_separate_positions<T>, separate_positions_row},
        {"segments", make_segment_embedding<T>, segment_embedding_row},
        {"embed_norm", make_embed_norm<T>, embed_norm_row},
    };
    return t;
}
// a decoder's extra prediction heads, chosen by their own options
template <class T>
using PredictionHeadsFactory = std::vector<std::shared_ptr<MTPModule<T>>> (*)(const ModelConfig&, Activation, ParamStore<T>&);
template <class T>
const std::vector<Entry<PredictionHeadsFactory<T>>>& prediction_heads() {
    static const std::vector<Entry<PredictionHeadsFactory<T>>> t = {
        {"mtp", make_mtp_modules<T>, mtp_heads_row},
    };
    return t;
}
template <class T>
const std::vector<Entry<BlockFactory<T>>>& blocks() {
    static const std::vector<Entry<BlockFactory<T>>> t = {
        {"pre_ln", {make_pre_ln_block<T>, make_pre_ln_cross_block<T>, true}, pre_ln_block_row},
        {"post_ln", {make_post_ln_block<T>, make_post_ln_cross_block<T>, false}, post_ln_block_row},
        {"parallel", {make_parallel_block<T>, nullptr, false}, parallel_block_row},
        {"sandwich", {make_sandwich_block<T>, nullptr, false}, sandwich_block_row},
    };
    return t;
}
// ---------------------------------------------------------------------------------------------------------------

template <class E>
std::vector<std::string> names_of(const std::vector<E>& t) {
    std::vector<std::string> n;
    for (const E& e : t) n.push_back(e.name);
    return n;
}
// the names a selector option of `arch` takes: not a part its own options choose (V8's sliding window: the option
// sliding_window=w names it)
template <class E>
std::vector<SelectorName> selector_names_of(const std::vector<E>& t, Arch arch) {
    std::vector<SelectorName> n;
    for (const E& e : t)
        if ((e.archs & archs::bit(arch)) && !(e.row && e.row().chosen_by_options && !e.row().options.empty()))
            n.push_back({e.name, e.alias});
    return n;
}
template <class E>
void add_rows(std::vector<const PartRow*>& rows, const std::vector<E>& t) {
    for (const E& e : t)
        if (e.row) rows.push_back(&e.row());
}
template <class E>
const E& find(const std::vector<E>& t, const std::string& name, PartKind kind) {
    for (const E& e : t)
        if (name == e.name || (e.alias && name == e.alias)) return e;
    check_part_name(kind, name, kind_name(kind));  // throws the ValueError listing the names
    throw ValueError(std::string("unknown ") + kind_name(kind) + " '" + name + "'");
}
}  // namespace

const char* kind_name(PartKind k) {
    switch (k) {
        case PartKind::Mask: return "mask";
        case PartKind::Position: return "position";
        case PartKind::MLP: return "mlp";
        case PartKind::QKVSource: return "qkv source";
        case PartKind::HeadKernel: return "head kernel";
        case PartKind::Embedding: return "embedding";
        case PartKind::EmbeddingStep: return "embedding step";
        case PartKind::Block: return "block";
        case PartKind::KernelWrapper: return "kernel wrapper";
        case PartKind::PredictionHeads: return "prediction heads";
        default: return "norm";
    }
}

const std::vector<const PartRow*>& part_rows() {
    static const std::vector<const PartRow*> rows = [] {
        std::vector<const PartRow*> r;
        add_rows(r, masks());
        add_rows(r, positions<float>());
        add_rows(r, qkv_sources<float>());
        add_rows(r, head_kernels<float>());
        add_rows(r, mlps<float>());
        add_rows(r, norms<float>());
        add_rows(r, embeddings<float>());
        add_rows(r, embedding_steps<float>());
        add_rows(r, blocks<float>());
        add_rows(r, kernel_wrappers<float>());
        add_rows(r, prediction_heads<float>());
        return r;
    }();
    return rows;
}
const PartRow* find_part_row(PartKind kind, const std::string& name) {
    for (const PartRow* r : part_rows())
        if (r->kind == kind && name == r->name) return r;
    return nullptr;
}
const PartRow* part_row_of_option(const std::string& name) {
    for (const PartRow* r : part_rows())
        for (const PartOption& o : r->options)
            if (name == o.name) return r;
    return nullptr;
}

const PartRow* row_chosen_by(PartKind kind, const PartOptionValues& v) {
    for (const PartRow* r : part_rows())
        if (r->kind == kind)
            for (const PartOption& o : r->options)
                if (!v.at_default(o.name)) return r;
    return nullptr;
}

// ------------------------------------ the values of the parts' options ---------------------------------------
const OptionValue& PartOptionValues::get(const std::string& name) const {
    const auto it = v_.find(name);
    if (it != v_.end()) return it->second;
    if (const PartRow* r = part_row_of_option(name))
        for (const PartOption& o : r->options)
            if (name == o.name) return o.default_value;
    throw std::logic_error("no part declares the option '" + name + "'");
}
bool PartOptionValues::at_default(const std::string& name) const {
    const PartRow* r = part_row_of_option(name);
    if (!r) throw std::logic_error("no part declares the option '" + name + "'");
    for (const PartOption& o : r->options)
        if (name == o.name) return get(name) == o.default_value;
    return true;
}
void PartOptionValues::set(const std::string& name, OptionValue v) {
    get(name);  // declared
    v_[name] = std::move(v);
}
namespace {
template <class V>
V typed(const OptionValue& v, const std::string& name, const char* what) {
    if (const V* x = std::get_if<V>(&v)) return *x;
    throw TypeError(name + " must be " + what);
}
}  // namespace
index_t PartOptionValues::integer(const std::string& name) const { return index_t(typed<std::int64_t>(get(name), name, "an int")); }
double PartOptionValues::real(const std::string& name) const { return typed<double>(get(name), name, "a real number"); }
bool PartOptionValues::flag(const std::string& name) const { return typed<bool>(get(name), name, "True or False"); }
std::uint64_t PartOptionValues::seed(const std::string& name) const { return typed<std::uint64_t>(get(name), name, "an int"); }
const std::string& PartOptionValues::choice(const std::string& name) const {
    if (const auto* x = std::get_if<std::string>(&get(name))) return *x;
    throw TypeError(name + " must be a str");
}

std::vector<std::string> part_names(PartKind kind) {
    switch (kind) {
        case PartKind::Mask: return names_of(masks());
        case PartKind::Position: {  // an attention's position parts (Algorithm 2's tables are the embedding's)
            std::vector<std::string> n;
            for (const auto& e : positions<float>())
                if (e.make.table == Positional::None) n.push_back(e.name);
            return n;
        }
        case PartKind::MLP: return names_of(mlps<float>());
        case PartKind::QKVSource: return names_of(qkv_sources<float>());
        case PartKind::HeadKernel: return names_of(head_kernels<float>());
        case PartKind::Embedding: return names_of(embeddings<float>());
        case PartKind::EmbeddingStep: return names_of(embedding_steps<float>());
        case PartKind::Block: return names_of(blocks<float>());
        case PartKind::KernelWrapper: return names_of(kernel_wrappers<float>());
        case PartKind::PredictionHeads: return names_of(prediction_heads<float>());
        default: return names_of(norms<float>());
    }
}

std::vector<SelectorName> selector_names(PartKind kind, Arch arch) {
    switch (kind) {
        case PartKind::Mask: return selector_names_of(masks(), arch);
        case PartKind::Position: return selector_names_of(positions<float>(), arch);
        case PartKind::MLP: return selector_names_of(mlps<float>(), arch);
        case PartKind::QKVSource: return selector_names_of(qkv_sources<float>(), arch);
        case PartKind::HeadKernel: return selector_names_of(head_kernels<float>(), arch);
        case PartKind::Embedding: return selector_names_of(embeddings<float>(), arch);
        case PartKind::EmbeddingStep: return selector_names_of(embedding_steps<float>(), arch);
        case PartKind::Block: return selector_names_of(blocks<float>(), arch);
        case PartKind::PredictionHeads: return selector_names_of(prediction_heads<float>(), arch);
        default: return selector_names_of(norms<float>(), arch);
    }
}
bool per_call_mask(const std::string& name) {
    for (const auto& e : masks())
        if (name == e.name) return e.per_call;
    return false;
}

const char* default_part(PartKind kind, Arch arch) {
    switch (kind) {
        case PartKind::Norm: return "layer";                         // Algorithm 6
        case PartKind::MLP: return arch == Arch::ED ? "relu" : "gelu";  // Algorithm 8's φ = ReLU; 9, 10: GELU
        case PartKind::Mask: return arch == Arch::D ? "causal" : arch == Arch::E ? "bidirectional" : "";  // (ED: both)
        case PartKind::Position: return "learned";                   // Algorithm 2's W_p
        case PartKind::HeadKernel: return "softmax";                 // Algorithm 4's lines 4–6
        case PartKind::Block: return default_block(arch);
        default: return "";
    }
}

std::string selected_part(PartKind kind, const std::string& given, Arch arch, const char* option) {
    const std::vector<SelectorName> names = selector_names(kind, arch);
    for (const SelectorName& n : names)
        if (given == n.name || (n.alias && given == n.alias)) return n.name;
    // the names it takes: the architecture's listing's part first, then the registry's order
    const std::string first = default_part(kind, arch);
    std::string list = first.empty() ? "" : "'" + first + "'";
    for (const SelectorName& n : names)
        if (n.name != first) list += (list.empty() ? "'" : ", '") + n.name + "'";
    throw ValueError(std::string(option) + " must be one of " + list + ", got '" + given + "'");
}

void check_part_name(PartKind kind, const std::string& name, const char* option) {
    const std::vector<std::string> n = part_names(kind);
    if (std::find(n.begin(), n.end(), name) != n.end()) return;
    std::string list;
    for (std::size_t i = 0; i < n.size(); ++i) list += (i ? (i + 1 == n.size() ? " or '" : ", '") : "'") + n[i] + "'";
    throw ValueError(std::string(option) + " must be " + list + ", got '" + name + "'");
}

Mask make_mask(const std::string& name, const MaskOptions& options) {
    return find(masks(), name, PartKind::Mask).make(options);
}
template <class T>
PositionPart<T> make_position(const std::string& name, const AttnSpec& spec, ParamStore<T>& store,
                              const std::string& prefix) {
    return find(positions<T>(), name, PartKind::Position).make.make(spec, store, prefix);
}
bool position_has(const std::string& name, PositionProperty p) {
    return (find(positions<float>(), name, PartKind::Position).make.properties & unsigned(p)) != 0;
}
Positional position_table(const std::string& name) { return find(positions<float>(), name, PartKind::Position).make.table; }
std::string positions_with(PositionProperty p) {
    std::vector<std::string> n;
    for (const auto& e : positions<float>())
        if (e.make.properties & unsigned(p)) n.push_back(std::string("'") + e.name + "'");
    std::string r;
    for (std::size_t i = 0; i < n.size(); ++i) r += (i ? (i + 1 == n.size() ? " and " : ", ") : "") + n[i];
    return r;
}
// The options that name an attention's two kinds of Algorithm 4's lines: a Q/K/V source's own options given choose
// it (V10's latent source); `attention` names the head kernel.
std::string qkv_source_name(const AttnVariant& v) {
    const PartRow* r = row_chosen_by(PartKind::QKVSource, v.options);
    return r ? r->name : "projections";
}
std::string head_kernel_name(const AttnVariant& v) {
    const auto& e = find(head_kernels<float>(), v.kernel, PartKind::HeadKernel);
    // V17: 'literal' and 'tiled' run the dense listings with the layout's mask (the definition)
    if (e.make.dense && v.impl != AttnImpl::Auto) return e.make.dense;
    if (v.kernel == default_part(PartKind::HeadKernel, Arch::D)) {  // the listing's: a kernel its own options choose
        const PartRow* r = row_chosen_by(PartKind::HeadKernel, v.options);  // (V25's softcap) replaces it
        if (r && r->chosen_by_options) return r->name;
    }
    return e.name;
}
template <class T>
std::shared_ptr<const QKVSource<T>> make_qkv_source(const std::string& name, const AttnPartSpec<T>& spec,
                                                    ParamStore<T>& store, const std::string& prefix) {
    return find(qkv_sources<T>(), name, PartKind::QKVSource).make(spec, store, prefix);
}
template <class T>
std::shared_ptr<const HeadKernel<T>> make_head_kernel(const std::string& name, const AttnPartSpec<T>& spec,
                                                      const std::string& prefix) {
    return find(head_kernels<T>(), name, PartKind::HeadKernel).make.make(spec, prefix);
}
std::string head_kernel_name(const ModelConfig& c) {
    AttnVariant v;  // (the fields models/shared.hpp attn_variant copies that name the kernel)
    v.kernel = c.attention, v.impl = c.attention_impl, v.options = c.part_options;
    return head_kernel_name(v);
}
bool head_kernel_has(const std::string& name, HeadKernelProperty p) {
    return (find(head_kernels<float>(), name, PartKind::HeadKernel).make.properties & unsigned(p)) != 0;
}
bool head_kernel_forms_weights(const std::string& name) { return head_kernel_has(name, HeadKernelProperty::FormsWeights); }
std::string kernels_forming_weights() {
    std::string r;
    for (const auto& e : head_kernels<float>())
        if (e.make.properties & FormsWeights) r += std::string(r.empty() ? "'" : ", '") + e.name + "'";
    return r;
}
template <class T>
std::shared_ptr<const HeadKernel<T>> wrap_head_kernel(std::shared_ptr<const HeadKernel<T>> kernel, const AttnPartSpec<T>& spec) {
    for (const auto& e : kernel_wrappers<T>()) {
        const PartRow& row = e.row();
        if (std::any_of(row.options.begin(), row.options.end(), [&](const PartOption& o) { return !spec.v.options.at_default(o.name); }))
            kernel = e.make(std::move(kernel), spec);
    }
    return kernel;
}
template <class T>
std::shared_ptr<const MLPPart<T>> make_mlp(const std::string& name, const MLPSpec& spec, ParamStore<T>& store,
                                           const std::string& prefix) {
    return find(mlps<T>(), name, PartKind::MLP).make(spec, store, prefix);
}
template <class T>
std::shared_ptr<const NormPart<T>> make_norm(const std::string& name, index_t d, double eps, ParamStore<T>& store,
                                             const std::string& gamma, const std::string& beta) {
    return find(norms<T>(), name, PartKind::Norm).make(d, eps, store, gamma, beta);
}

template <class T>
std::unique_ptr<SelfBlock<T>> make_self_block(const std::string& name, const BlockSpec& spec, ParamStore<T>& store,
                                              const std::string& prefix) {
    const auto& e = find(blocks<T>(), name, PartKind::Block);
    if (e.row && e.row().check) e.row().check(spec.c->part_options, spec.c);
    return e.make.self(spec, store, prefix);
}
template <class T>
std::unique_ptr<CrossBlock<T>> make_cross_block(const std::string& name, const BlockSpec& spec, ParamStore<T>& store,
                                                const std::string& prefix) {
    const auto& e = find(blocks<T>(), name, PartKind::Block);
    if (!e.make.cross) throw ValueError("block='" + name + "' has no layer with cross-attention (an EDTransformer's decoder)");
    if (e.row && e.row().check) e.row().check(spec.c->part_options, spec.c);
    return e.make.cross(spec, store, prefix);
}
template <class T>
std::vector<std::shared_ptr<MTPModule<T>>> make_prediction_heads(const ModelConfig& c, Activation act, ParamStore<T>& store) {
    const PartRow* row = chosen_part(c, PartKind::PredictionHeads);
    if (!row) return {};
    const auto& e = find(prediction_heads<T>(), row->name, PartKind::PredictionHeads);
    if (row->check) row->check(c.part_options, &c);
    return e.make(c, act, store);
}
bool block_stack_norm(const std::string& name) { return find(blocks<float>(), name, PartKind::Block).make.stack_norm; }
const char* default_block(Arch arch) { return arch == Arch::D ? "pre_ln" : "post_ln"; }
void check_block_archs(const char* name, unsigned archs, const ModelConfig* model) {
    if (!model || (archs & archs::bit(model->arch))) return;
    std::string r;
    for (Arch x : {Arch::D, Arch::E, Arch::ED})
        if (archs & archs::bit(x)) r += std::string(r.empty() ? "" : " and ") + arch_name(x);
    throw ValueError(std::string("block='") + name + "' is a layer of the " + r + ", not of the " + arch_name(model->arch));
}
template <class T>
std::unique_ptr<const StackEmbedding<T>> make_stack_embedding(const std::string& name, const EmbeddingSpec& spec,
                                                              ParamStore<T>& store) {
    const auto& e = find(embeddings<T>(), name, PartKind::Embedding);
    if (e.row && e.row().check) e.row().check(spec.c->part_options, spec.c);
    return e.make(spec, store);
}
template <class T>
std::shared_ptr<const EmbeddingStep<T>> make_embedding_step(const std::string& name, const EmbeddingSpec& spec,
                                                             ParamStore<T>& store) {
    const auto& e = find(embedding_steps<T>(), name, PartKind::EmbeddingStep);
    if (e.row && e.row().check) e.row().check(spec.c->part_options, spec.c);
    return e.make(spec, store);
}
std::vector<const PartRow*> chosen_embedding_steps(const PartOptionValues& v) {
    std::vector<const PartRow*> r;
    for (const auto& e : embedding_steps<float>()) {
        const PartRow& row = e.row();
        if (std::any_of(row.options.begin(), row.options.end(), [&](const PartOption& o) { return !v.at_default(o.name); }))
            r.push_back(&row);
    }
    return r;
}

#define FT_INSTANTIATE(T)                                                                                        \
    template std::shared_ptr<const QKVSource<T>> make_qkv_source<T>(const std::string&, const AttnPartSpec<T>&,   \
                                                                    ParamStore<T>&, const std::string&);        \
    template std::shared_ptr<const HeadKernel<T>> make_head_kernel<T>(const std::string&, const AttnPartSpec<T>&, \
                                                                      const std::string&);                      \
    template std::shared_ptr<const HeadKernel<T>> wrap_head_kernel<T>(std::shared_ptr<const HeadKernel<T>>,      \
                                                                      const AttnPartSpec<T>&);                  \
    template PositionPart<T> make_position<T>(const std::string&, const AttnSpec&, ParamStore<T>&,              \
                                              const std::string&);                                              \
    template std::shared_ptr<const MLPPart<T>> make_mlp<T>(const std::string&, const MLPSpec&, ParamStore<T>&,  \
                                                           const std::string&);                                 \
    template std::shared_ptr<const NormPart<T>> make_norm<T>(const std::string&, index_t, double, ParamStore<T>&, \
                                                             const std::string&, const std::string&);     \
    template std::unique_ptr<const StackEmbedding<T>> make_stack_embedding<T>(const std::string&, const EmbeddingSpec&, \
                                                                              ParamStore<T>&);            \
    template std::shared_ptr<const EmbeddingStep<T>> make_embedding_step<T>(const std::string&, const EmbeddingSpec&, \
                                                                             ParamStore<T>&);     \
    template std::unique_ptr<SelfBlock<T>> make_self_block<T>(const std::string&, const BlockSpec&, ParamStore<T>&, \
                                                              const std::string&);                        \
    template std::unique_ptr<CrossBlock<T>> make_cross_block<T>(const std::string&, const BlockSpec&, ParamStore<T>&, \
                                                                const std::string&);                      \
    template std::vector<std::shared_ptr<MTPModule<T>>> make_prediction_heads<T>(const ModelConfig&, Activation, \
                                                                                 ParamStore<T>&);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace ft
