// A model's hyperparameters (ModelConfig), their checks (resolve) and the checks of a model's input tokens
// (validate): the one place every front-end (the C++ API, the Python bindings, ft.load, from_hf) builds and
// checks a model's configuration through. Algorithms 8, 9 and 10 (transformers.hpp) take a resolved config.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "formal_transformers/common.hpp"
#include "formal_transformers/embedding.hpp"
#include "formal_transformers/functions.hpp"
#include "formal_transformers/norm.hpp"
#include "formal_transformers/options.hpp"
#include "formal_transformers/variants.hpp"

namespace ft {

const char* arch_name(Arch a);                 // "DTransformer", "ETransformer", "EDTransformer"
Arch arch_from_name(const std::string& name);  // ValueError for another name

// ---------------------------------------------------------------------------------------------------
// Hyperparameters. Every option is declared once: the sizes and the model-wide options in config.cpp's schema
// (name, type, default, the architectures that accept it, its check), the options a part owns in its registry
// row (parts.hpp PartRow, in the part's file; their values in part_options). from_options, from_json,
// to_json, == and to_string all read both.
struct ModelConfig {
    Arch arch = Arch::D;  // set by resolve
    index_t n_vocab = 0, l_max = 0;
    index_t L = 0;                  // D, E: layers
    index_t L_enc = 0, L_dec = 0;   // ED
    index_t H = 0, d_e = 0, d_mlp = 0;
    index_t d_f = 0;                // E: the final projection's width
    index_t d_attn = 0, d_mid = 0;  // 0: d_e / H (then d_e must be divisible by H)
    // norm (D and ED): a registered norm part's name (parts.hpp PartKind::Norm; "layer": Algorithm 6). resolve checks it.
    std::string norm = "layer";
    // positional: a registered position part's name (parts.hpp PartKind::Position): "learned" and "sinusoidal",
    // Algorithm 2's tables; "rope" (V1), "alibi" (V2), D only, and "relative" (V11), ED only, put the position into
    // attention. What the rest of the code asks of it, its registry line says (position_table, position_has). (The
    // sinusoidal table's base, `base`, is the option of the position "sinusoidal", variants/sinusoidal_position.cpp,
    // in part_options.)
    std::string positional = "learned";
    bool tied = false;              // W_u = W_eᵀ
    Gelu gelu = Gelu::Exact;
    double eps = 1e-5;
    std::uint64_t seed = 0;
    double init_std = 0.02;
    // unembed_bias (ETransformer: BERT; EDTransformer: BART's final_logits_bias, V22): a bias b_u on the
    // unembedding, P = softmax(W_u X + b_u 1ᵀ). (The embedding's options — BERT's n_segments, embed_norm; BART's
    // scale_embedding, separate_positions; V13's fixnorm; Gemma's embed_scale — are its steps' rows', in
    // part_options: stack_embedding.hpp.)
    bool unembed_bias = false;
    // Variants (docs/variants.md). H_kv: key/value heads (V3; 0: H); bias = false: V5. (V1's θ, rope_theta, is the
    // option of the position "rope", variants/rope.cpp, in part_options.)
    index_t H_kv = 0;
    bool bias = true;
    // mlp (D and ED; E: the listing's only): a registered MLP part's name or alias (parts.hpp PartKind::MLP): "gelu",
    // the listing's MLP with the model's GELU (Algorithms 9, 10; in ED V22's, BART); "relu", with Algorithm 8's ReLU
    // (V21, OPT, in D); "swiglu": V4; "geglu" (alias "gated-gelu", T5 v1.1's): V18's gated GELU (tanh form). "": the
    // architecture's listing's (default_part: "gelu" in D and E, "relu" in ED; resolve fills it).
    std::string mlp;
    // V7 (D only): the prefix-LM mask of line 6, Mask[t_z, t_x] = [[t_z < p_b or t_z ≤ t_x]] with the prefix length
    // p_b of each sequence given with the call (Tokens::prefix; none: p_b = 0, the causal mask). Causal: Algorithm 10.
    // mask (D only): a registered mask's name or alias (parts.hpp PartKind::Mask; "causal", alias "unidirectional":
    // Algorithm 10's; "prefix": V7's, per_call_mask); "": the architecture's listing's (default_part; resolve fills it).
    std::string mask;
    // The layers of the stacks: a registered block's name (parts.hpp PartKind::Block; "": the architecture's
    // listing's, default_block: "pre_ln" in D, "post_ln" in E and ED; resolve fills it). ED's "pre_ln" is V18a
    // (T5): both stacks of pre-norm layers, each ending with a norm (γ_enc, γ_dec); files and keywords of earlier
    // versions say pre_norm=True for it. D's "sandwich" is V27 (Gemma 2, 3), which they say sandwich_norm=True for.
    std::string block;
    // V18 (ED only; T5): scale_scores = false: no 1/√d_attn at Algorithm 4's line 4; unembed_rescale:
    // P = softmax(W_u (d_e^−1/2 X)); bos_id, eos_id: the ids Algorithm 15 starts and stops with (−1: None,
    // bos_token = N_V − 2, eos_token = N_V − 1; T5: 0, 1).
    bool scale_scores = true, unembed_rescale = false;
    index_t bos_id = -1, eos_id = -1;
    // V22 (ED only; BART's generation config): forced_bos_id: Algorithm 15's first generated token is this id
    // (x̂ = [bos_token, forced_bos_id, …]; −1: None, sampled); forced_eos: a decoding that reaches max_len
    // without eos_token ends with it (its last token is eos_token).
    index_t forced_bos_id = -1;
    bool forced_eos = false;
    // Dropout (docs/regularisation.md; training only): rates after the embedding sum (line 3; Alg 8 lines 3
    // and 12; after BERT's embedding layer_norm) and on each sublayer's output before the residual add. 0: the
    // listings bit for bit. The rate on the attention weights (Alg 4 line 6, after the softmax) is the option
    // attn_dropout of a part, the attention-dropout kernel wrapper (variants/attention_dropout.cpp), in part_options.
    double embed_dropout = 0, resid_dropout = 0;
    bool has_dropout() const;  // some rate > 0
    // How every attention computes Algorithm 4's lines 4–6 (docs/api.md attention_impl; variants.hpp AttnImpl):
    // the listing as printed, the tiled listing (tiled_attention.hpp), or Auto (tiled from kTiledFromLength on).
    AttnImpl attention_impl = AttnImpl::Auto;
    // attention (D, E): a registered head kernel's name (parts.hpp PartKind::HeadKernel), how every attention
    // computes lines 4–6: "softmax", the listing (literal or tiled: attention_impl); V15's "performer" and "rfa"
    // (random features, random_features.hpp; their rows' options); V17's "bigbird" (E: block layouts; its row's
    // options block_size, …, bigbird_draw, variants/bigbird_mask.cpp). What the rest
    // of the code asks of it, its registry line says (head_kernel_has). resolve checks it.
    std::string attention = "softmax";
    // (V16's multi-token prediction, mtp_depth and mtp_weight, is a part, the prediction heads "mtp" of
    // variants/multi_token.cpp, its options in part_options.)
    // Gemma 2 and 3 (docs/variants.md V25, V27; D only): final_logit_softcapping c_f: the logits c_f·tanh(W_u X / c_f)
    // (0: None). (Gemma's sandwich layers, each sublayer's output normalised before its residual add, are the block
    // "sandwich"; its embedding scale the embedding step "scale", stack_embedding.hpp.)
    double final_logit_softcapping = 0;
    // The options the parts own (their rows declare them: e.g. V8's window w, the sliding-window mask's); the
    // parts read them, unset ones have their declared defaults.
    PartOptionValues part_options;
    // LoRA (docs/variants.md, lora.hpp): adapters W' = W + (α/r)·B·A on the matrices named by `targets` (empty:
    // none). Not an option of the constructors: ft.lora adds them to a model, merge_lora removes them; ft.save
    // writes them beside the config (io.cpp).
    struct Lora {
        std::vector<std::string> targets;
        index_t r = 0;
        double alpha = 0, dropout = 0;
        bool operator==(const Lora& o) const {
            return targets == o.targets && r == o.r && alpha == o.alpha && dropout == o.dropout;
        }
    } lora;

    index_t mask_token() const { return n_vocab - 3; }
    index_t bos_token() const { return bos_id >= 0 ? bos_id : n_vocab - 2; }
    index_t eos_token() const { return eos_id >= 0 ? eos_id : n_vocab - 1; }

    // The resolved config of `arch` from keyword options (the model constructors' arguments: the sizes
    // first, in `positional_names(arch)` order, may also come positionally). TypeError for an option `arch`
    // does not take, a value of the wrong type, a missing size or one given twice; ValueError (resolve) for
    // a value out of range. "dropout" sets the three rates that are not given.
    static ModelConfig from_options(Arch arch, const Options& keywords, const std::vector<OptionValue>& positional = {});
    static std::vector<std::string> positional_names(Arch arch);  // D: n_vocab l_max L H d_e d_mlp; E: + d_f; ED: L_enc L_dec
    // "n_vocab, l_max, L, H, d_e, d_mlp, *, d_attn=None, …": the options of `arch` with their defaults, in
    // Python's notation (the constructors' documented signature).
    static std::string signature(Arch arch);
    // The schema as a front-end reads it (ft.model_options): each option `arch` takes, in the schema's order,
    // with its kind ("size", "auto_size", "count", "real", "auto_real", "bool", "seed", "enum", "rates",
    // "auto_id"), its default as JSON text (what to_json writes for a model not given it; null for an auto
    // kind: filled from the other options, or off) and the architectures that take it.
    struct OptionInfo {
        std::string name, kind, default_json;
        std::vector<std::string> archs;
    };
    static std::vector<OptionInfo> option_infos(Arch arch);
    // {"arch": "DTransformer", "n_vocab": …, …} with every option `arch` takes (resolved values; base: null
    // for ℓ_max); dtype, when given, is written last ("float32" / "float64": the model's, for ft.save's files).
    std::string to_json(const char* dtype = nullptr) const;
    // The resolved config of a JSON object written by to_json (or Python's model.config, any key order);
    // a missing option takes its default (files written before the option existed); a "dtype" key is
    // allowed and not part of the config (json_dtype reads it). ValueError for text that is not such an object.
    static ModelConfig from_json(const std::string& text);
    static std::string json_dtype(const std::string& text);  // the "dtype" of such an object, "" when absent
    // DTransformer(n_vocab=70, l_max=64, …): the options of to_json in Python's notation (the model's repr).
    std::string to_string(const char* dtype = nullptr) const;
};
bool operator==(const ModelConfig& a, const ModelConfig& b);  // arch, and every option of arch (what to_json writes)
inline bool operator!=(const ModelConfig& a, const ModelConfig& b) { return !(a == b); }

// Fill the defaults (d_attn, d_mid, H_kv), set c.arch and check every option (the schema's per-option checks,
// then those between options): ValueError naming the problem.
ModelConfig resolve(ModelConfig c, Arch arch);

// A batch of token sequences: ids concatenated, s the sequences. Checked by `validate` (IndexError for
// ids outside [0, N_V), ValueError for empty sequences or sequences longer than ℓ_max).
struct Tokens {
    const index_t* ids = nullptr;
    Seqs s;
    // V7 (a DTransformer with mask = Prefix): p_b, the prefix length of each sequence (s.count() entries, 0 ≤ p_b ≤
    // ℓ_b); null: no prefix (p_b = 0). Checked by validate(x, c, …): ValueError naming prefix_len.
    const index_t* prefix = nullptr;
};
void validate(const Tokens& x, index_t n_vocab, index_t l_max, const char* what);
// The longest sequence a model's forward pass (and so loss, loss_and_grad, P, logits) accepts: ℓ_max for
// a table of positions (learned, sinusoidal); no bound for RoPE and ALiBi, which put the position into
// attention (docs/variants.md "Scoring and decoding past ℓ_max": train short, test long). Every workspace past ℓ_max
// is sized through sizes.hpp, so a length too large for memory is a ValueError. The one rule the core,
// the xtensor API and the bindings check model inputs by; the trainers keep ℓ_max (the training length).
index_t max_input_length(const ModelConfig& c);
// validate(x, c.n_vocab, max_input_length(c), what), and x.prefix: only for a DTransformer with mask = Prefix, each
// p_b in [0, ℓ_b] (ValueError naming prefix_len)
void validate(const Tokens& x, const ModelConfig& c, const char* what);

// A model's hyperparameters checked before any layer is declared (sizes.hpp's bound on one allocation): a
// lower bound on its parameter count (embeddings, and per layer the attention's W_q, W_k, W_v, W_o and the MLP's
// two matrices, in float32, θ and gradient) plus kLayerOverhead bytes of bookkeeping per layer. So `L = 2**40`
// fails at once instead of declaring layers for minutes. ValueError names the sizes.
constexpr index_t kLayerOverhead = 4096;  // bytes: a layer's named parameter entries, caches, workspaces
void check_model_size(const ModelConfig& c, Arch arch);
// What check_model_size counts of a config (and a model file's reader checks against its tensors): the layers (the
// listing's, L or L_enc + L_dec, and those of the parts it chooses, V16's modules) and a lower bound on the parameters
// of one attention (W_q, W_k, W_v, W_o, or the chosen Q/K/V source's own: V10's). The chosen parts' rows add theirs
// (PartRow::size); extra_layers says what their layers are ("MTP modules"), for the messages. ValueError on overflow.
struct ModelSize {
    index_t layers = 0;
    index_t attention = 0;
    std::string extra_layers;
};
ModelSize model_size(const ModelConfig& c, Arch arch);

}  // namespace ft
