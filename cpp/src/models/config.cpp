// The model configuration: resolve (defaults and checks), the size bound, input validation (config.hpp).
#include "formal_transformers/config.hpp"

#include <cmath>
#include <limits>

#include "formal_transformers/dropout.hpp"
#include "formal_transformers/sizes.hpp"

namespace ft {

// ===================================== hyperparameters, input checks ==================================
ModelConfig resolve(ModelConfig c, Arch arch) {
    auto positive = [](index_t v, const char* name) {
        if (v <= 0) throw ValueError(std::string(name) + " must be a positive integer, got " + std::to_string(v));
    };
    positive(c.n_vocab, "n_vocab");
    positive(c.l_max, "l_max");
    if (arch == Arch::ED) {
        positive(c.L_enc, "L_enc");
        positive(c.L_dec, "L_dec");
    } else {
        positive(c.L, "L");
    }
    positive(c.H, "H");
    positive(c.d_e, "d_e");
    positive(c.d_mlp, "d_mlp");
    if (arch == Arch::E) positive(c.d_f, "d_f");
    if (arch == Arch::E && c.n_vocab < 4)
        throw ValueError("n_vocab must be >= 4: the vocabulary ends with mask_token, bos_token, eos_token (paper §4)");
    if (arch == Arch::ED && c.n_vocab < 3)
        throw ValueError("n_vocab must be >= 3: decoding needs bos_token = n_vocab-2 and eos_token = n_vocab-1");
    if ((c.d_attn <= 0 || c.d_mid <= 0) && c.d_e % c.H != 0)
        throw ValueError("d_e = " + std::to_string(c.d_e) + " is not divisible by H = " + std::to_string(c.H) +
                         ": pass d_attn and d_mid explicitly, or choose H dividing d_e");
    if (c.d_attn <= 0) c.d_attn = c.d_e / c.H;
    if (c.d_mid <= 0) c.d_mid = c.d_e / c.H;
    if (!(c.eps >= 0) || !std::isfinite(c.eps)) throw ValueError("eps must be a finite number >= 0, got " + std::to_string(c.eps));
    if (!(c.init_std > 0) || !std::isfinite(c.init_std))
        throw ValueError("init_std must be a finite number > 0, got " + std::to_string(c.init_std));
    if (arch == Arch::E && c.tied && c.d_f != c.d_e)
        throw ValueError("tied=True needs d_f == d_e: W_u = W_eᵀ is N_V × d_e, but ETransformer's W_u is N_V × d_f");
    if (arch != Arch::D && c.norm != NormKind::Layer) throw ValueError("norm='rms' is a DTransformer option (Gopher)");
    if (c.n_segments < 0) throw ValueError("n_segments must be >= 0, got " + std::to_string(c.n_segments));
    if (arch != Arch::E && (c.n_segments > 0 || c.embed_norm || c.unembed_bias))
        throw ValueError("n_segments, embed_norm and unembed_bias are ETransformer options (BERT)");
    // the variants (docs/variants.md)
    if (c.H_kv == 0) c.H_kv = c.H;
    if (c.H_kv < 0 || c.H_kv > c.H || c.H % c.H_kv != 0)
        throw ValueError("H_kv = " + std::to_string(c.H_kv) + " must divide H = " + std::to_string(c.H) +
                         " (grouped-query attention: groups of H/H_kv query heads share a key/value head)");
    const bool rel_pos = in_attention(c.positional);
    if (arch != Arch::D && rel_pos) throw ValueError("positional='rope' and 'alibi' are DTransformer options");
    if (arch != Arch::D && c.mlp != ModelConfig::Mlp::Standard) throw ValueError("mlp='swiglu' is a DTransformer option");
    if (c.positional == Positional::Rope && c.d_attn % 2 != 0)
        throw ValueError("positional='rope' rotates pairs of rows: d_attn (the head size) must be even, got " +
                         std::to_string(c.d_attn));
    if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) throw ValueError("rope_theta must be a finite number > 0");
    if (c.sliding_window < 0)
        throw ValueError("sliding_window must be >= 1 (each query sees the last w keys), got " + std::to_string(c.sliding_window));
    if (arch != Arch::D && c.sliding_window > 0) throw ValueError("sliding_window is a DTransformer option (Mistral)");
    check_dropout_rate(c.embed_dropout, "embed_dropout");
    check_dropout_rate(c.attn_dropout, "attn_dropout");
    check_dropout_rate(c.resid_dropout, "resid_dropout");
    check_model_size(c, arch);  // sizes.hpp: overflow-safe, before any layer is declared
    return c;
}

void validate(const Tokens& x, index_t n_vocab, index_t l_max, const char* what) {
    if (x.s.count() <= 0) throw ValueError(std::string(what) + " is an empty batch");
    for (index_t b = 0; b < x.s.count(); ++b) {
        const std::string name = x.s.count() == 1 ? std::string(what) : std::string(what) + "[" + std::to_string(b) + "]";
        const index_t l = x.s.len(b);
        if (l <= 0) throw ValueError(name + " is an empty sequence");
        if (l > l_max)
            throw ValueError(name + " has length " + std::to_string(l) + " > l_max = " + std::to_string(l_max));
        for (index_t t = 0; t < l; ++t) {
            const index_t v = x.ids[x.s.begin(b) + t];
            if (v < 0 || v >= n_vocab)
                throw IndexError(name + ": token id " + std::to_string(v) + " at position " + std::to_string(t) +
                                 " is out of range [0, " + std::to_string(n_vocab) + ")");
        }
    }
}

index_t max_input_length(const ModelConfig& c) {
    return in_attention(c.positional) ? std::numeric_limits<index_t>::max() : c.l_max;
}

void validate(const Tokens& x, const ModelConfig& c, const char* what) { validate(x, c.n_vocab, max_input_length(c), what); }

void check_model_size(const ModelConfig& c, Arch arch) {
    const char* what = "model size";
    const index_t d = c.d_e, L = arch == Arch::ED ? checked_add(c.L_enc, c.L_dec, what) : c.L;
    // one attention: W_q, W_k, W_v (H × d_attn × d_e each) and W_o (d_e × H·d_mid)
    const index_t attn = checked_add(checked_count({3, c.H, c.d_attn, d}, what), checked_count({c.H, c.d_mid, d}, what), what);
    const index_t mlp = checked_count({2, c.d_mlp, d}, what);  // W_mlp1, W_mlp2
    index_t layer = checked_add(attn, mlp, what);
    if (arch == Arch::ED) layer = checked_add(layer, attn, what);  // (the decoder's cross-attention: at least)
    const index_t emb = checked_add(checked_mul(c.n_vocab, d, what), checked_mul(c.l_max, d, what), what);
    const index_t params = checked_add(emb, checked_mul(L, layer, what), what);
    // θ and gradient in float32, and each layer's bookkeeping
    const index_t bytes = checked_add(checked_count({params, 2, index_t(sizeof(float))}, what),
                                      checked_mul(L, kLayerOverhead, what), what);
    if (std::uint64_t(bytes) > max_alloc_bytes())
        throw_size_error(what, "n_vocab=" + std::to_string(c.n_vocab) + ", l_max=" + std::to_string(c.l_max) +
                                   ", layers=" + std::to_string(L) + ", H=" + std::to_string(c.H) +
                                   ", d_e=" + std::to_string(d) + ", d_attn=" + std::to_string(c.d_attn) +
                                   ", d_mid=" + std::to_string(c.d_mid) + ", d_mlp=" + std::to_string(c.d_mlp) +
                                   " need at least " + std::to_string(params) + " parameters (" + human_bytes(bytes) +
                                   " with their gradients), which exceeds this machine's memory (" +
                                   human_bytes((long double)max_alloc_bytes()) + ")");
}

}  // namespace ft
