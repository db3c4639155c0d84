// Biases on the query, key and value maps only (docs/variants.md V20; Qwen2's attention_bias on q_proj, k_proj,
// v_proj): with V5 (bias = false) every other bias is gone (b_o, b_mlp1, b_mlp2), but Algorithm 4's lines 1–3
// keep theirs, as printed:
//   1  Q ← W_q X + b_q 1ᵀ        [[b_q ∈ R^{H·d_attn}]]
//   2  K ← W_k Z + b_k 1ᵀ        [[b_k ∈ R^{H_kv·d_attn}]]
//   3  V ← W_v Z + b_v 1ᵀ        [[b_v ∈ R^{H_kv·d_mid}]]
//   Algorithm 5 line 4: Ṽ ← W_o Y  (no b_o: V5)
// Forward and backward are the listing's own (listings/qkv_projections.cpp, Projections with its biases:
// d b_q = dQ 1, d b_k = dK 1, d b_v = dV 1 beside dW_q = dQ Xᵀ, …), so decoding, batched and paged decoding and
// the tiled kernel see the listing's source. Its option: qkv_bias = True (with bias = False; given, it chooses
// this Q/K/V source). Made by make_qkv_source("qkv_bias", …) (registry.cpp).
#include "formal_transformers/attention.hpp"
#include "formal_transformers/config.hpp"
#include "formal_transformers/parts.hpp"

namespace ft {

namespace {
// qkv_bias = True needs bias = False (with bias = True lines 1–3 have their biases already)
void check_qkv_bias(const PartOptionValues& own, const ModelConfig* model) {
    if (own.flag("qkv_bias") && model && model->bias)
        throw ValueError("qkv_bias=True keeps the biases of Algorithm 4's lines 1-3 when bias=False (V5) drops the "
                         "others; with bias=True every bias is there already: give bias=False");
}
}  // namespace

const PartRow& qkv_bias_row() {
    static const PartRow row{PartKind::QKVSource,
                             "qkv_bias",
                             {{"qkv_bias", archs::ALL, OptionKind::Bool, false, OptionCheck::None,
                               "V20: with bias=False, keep the biases b_q, b_k, b_v of Algorithm 4's lines 1-3 "
                               "(Qwen2); no b_o, no MLP biases"}},
                             check_qkv_bias};
    return row;
}

template <class T>
std::shared_ptr<const QKVSource<T>> make_qkv_bias_source(const AttnPartSpec<T>& spec, ParamStore<T>& store,
                                                         const std::string& prefix) {
    AttnPartSpec<T> s = spec;
    s.v.bias = true;  // lines 1–3 with b_q, b_k, b_v (b_o follows the attention's own bias = false)
    return std::make_shared<const Projections<T>>(s, store, prefix);
}
template std::shared_ptr<const QKVSource<float>> make_qkv_bias_source<float>(const AttnPartSpec<float>&,
                                                                             ParamStore<float>&, const std::string&);
template std::shared_ptr<const QKVSource<double>> make_qkv_bias_source<double>(const AttnPartSpec<double>&,
                                                                               ParamStore<double>&, const std::string&);

}  // namespace ft
