"""GPT-2 (GPT2LMHeadModel / GPT2Model) <-> DTransformer: Algorithm 10, pre-LN, gelu="tanh" for gelu_new /
gelu_pytorch_tanh, "exact" for gelu; tied W_u. HF stores y = x Wᵀ + b in rows and GPT-2's Conv1D stores W itself
(the paper's columns are tokens):

    wte.weight = W_eᵀ, wpe.weight = W_pᵀ; h.l.ln_1 = γ_l¹, β_l¹; h.l.attn.c_attn = [W_q; W_k; W_v]ᵀ (heads in blocks
    of d_e/H rows) with [b_q; b_k; b_v]; h.l.attn.c_proj = W_oᵀ, b_o; h.l.ln_2 = γ_l², β_l²; h.l.mlp.c_fc = W_mlp1ᵀ,
    b_mlp1; h.l.mlp.c_proj = W_mlp2ᵀ, b_mlp2; ln_f = γ, β; lm_head = W_u (tied: W_eᵀ).
Dropout at GPT-2's places, which are ours (docs/regularisation.md): embd_pdrop, attn_pdrop, resid_pdrop."""
from __future__ import annotations

import numpy as np

from ._common import (_HF_OF_GELU, _MAX_SIZE, _cfg_bool, _cfg_float, _cfg_get, _cfg_int, _cfg_rate,
                      _export_all_kv_heads, _export_heads_split_d_e, _flat, _gelu_of, _require, _split_heads,
                      _split_rates, _width_and_heads)
from ._registry import Converter, register

# (HF name in h.l., ft name in layers.l., "T": HF holds the transpose) — c_attn is the three of W_q, W_k, W_v
_LAYER = (("attn.c_proj.weight", "attn.W_o", "T"), ("attn.c_proj.bias", "attn.b_o", ""),
          ("ln_1.weight", "gamma1", ""), ("ln_1.bias", "beta1", ""), ("ln_2.weight", "gamma2", ""),
          ("ln_2.bias", "beta2", ""), ("mlp.c_fc.weight", "W_mlp1", "T"), ("mlp.c_fc.bias", "b_mlp1", ""),
          ("mlp.c_proj.weight", "W_mlp2", "T"), ("mlp.c_proj.bias", "b_mlp2", ""))
_BODY = (("wte.weight", "W_e", "T"), ("wpe.weight", "W_p", "T"), ("ln_f.weight", "gamma", ""), ("ln_f.bias", "beta", ""))


@register
class GPT2(Converter):
    name = "GPT-2"
    classes = {"GPT2LMHeadModel": (True, "transformer."), "GPT2Model": (False, "")}
    model_type = "gpt2"
    layers = ("h.", "n_layer")
    embedding = "wte.weight"
    maps = frozenset({"n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_attn", "d_mid", "H_kv", "positional", "norm",
                      "gelu", "eps", "tied", "seed", "init_std", "attention_impl", "embed_dropout", "attn_dropout",
                      "resid_dropout"})

    def class_of(self, config, T, class_names):
        if config.get("model_type") != "gpt2":
            return None
        return "GPT2LMHeadModel" if "lm_head.weight" in T or any(k.startswith("transformer.") for k in T) else "GPT2Model"

    def hyper(self, c):
        m = self.name
        _require(c, m, "scale_attn_weights", True, "Algorithm 4 divides the scores by √d_attn")
        _require(c, m, "scale_attn_by_inverse_layer_idx", False, "the listing scales every layer alike")
        _require(c, m, "add_cross_attention", False, "DTransformer has no cross-attention")
        d, H = _width_and_heads(c, m, "n_embd", "n_head")
        return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "n_positions"),
                    L=_cfg_int(c, m, "n_layer"), H=H, d_e=d,
                    d_mlp=_cfg_int(c, m, "n_inner", min(4 * d, _MAX_SIZE)),  # null: 4·n_embd, as GPT2MLP
                    gelu=_gelu_of(m, "activation_function", _cfg_get(c, m, "activation_function", "gelu_new")),
                    eps=_cfg_float(c, m, "layer_norm_epsilon", 1e-5), tied=_cfg_bool(c, m, "tie_word_embeddings", True),
                    # HF's defaults are 0.1
                    embed_dropout=_cfg_rate(c, m, "embd_pdrop", 0.1), attn_dropout=_cfg_rate(c, m, "attn_pdrop", 0.1),
                    resid_dropout=_cfg_rate(c, m, "resid_pdrop", 0.1))

    def expected(self, hp, head):
        d, V, P, m = hp["d_e"], hp["n_vocab"], hp["l_max"], hp["d_mlp"]
        e = {"wte.weight": (V, d), "wpe.weight": (P, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
        for l in range(hp["L"]):
            h = f"h.{l}."
            e.update({h + "ln_1.weight": (d,), h + "ln_1.bias": (d,), h + "attn.c_attn.weight": (d, 3 * d),
                      h + "attn.c_attn.bias": (3 * d,), h + "attn.c_proj.weight": (d, d), h + "attn.c_proj.bias": (d,),
                      h + "ln_2.weight": (d,), h + "ln_2.bias": (d,), h + "mlp.c_fc.weight": (d, m),
                      h + "mlp.c_fc.bias": (m,), h + "mlp.c_proj.weight": (m, d), h + "mlp.c_proj.bias": (d,)})
        if head and not hp["tied"]:
            e["lm_head.weight"] = (V, d)
        return e

    def to_ft(self, hp, T, head):
        d, H = hp["d_e"], hp["H"]
        p = {ft: (T[a].T if how else T[a]) for a, ft, how in _BODY}
        for l in range(hp["L"]):
            h, q = f"h.{l}.", f"layers.{l}."
            W, b = T[h + "attn.c_attn.weight"], T[h + "attn.c_attn.bias"]
            for i, n in enumerate("qkv"):
                p[q + f"attn.W_{n}"] = _split_heads(W[:, i * d:(i + 1) * d].T, H)
                p[q + f"attn.b_{n}"] = _split_heads(b[i * d:(i + 1) * d], H)
            p.update({q + ft: (T[h + a].T if how else T[h + a]) for a, ft, how in _LAYER})
        if head and not hp["tied"]:
            p["W_u"] = T["lm_head.weight"]
        return p

    def takes(self, model, cfg):
        return (cfg.get("arch") == "DTransformer" and cfg.get("positional") != "rope" and not cfg.get("kv_lora_rank")
                and cfg.get("mlp") != "relu")

    def export(self, cfg, P):
        cfg, rates = _split_rates(cfg)
        if cfg.get("positional") != "learned":
            raise ValueError(f"GPT-2 has no equivalent of positional={cfg.get('positional')!r} (learned positions only)")
        _export_heads_split_d_e("GPT-2", cfg)
        _export_all_kv_heads("GPT-2", cfg)
        if cfg["norm"] != "layer":
            raise ValueError(f"GPT-2 has no equivalent of norm={cfg['norm']!r} (layer_norm only)")
        hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": cfg["n_vocab"],
              "n_positions": cfg["l_max"], "n_embd": cfg["d_e"], "n_layer": cfg["L"], "n_head": cfg["H"],
              "n_inner": cfg["d_mlp"], "activation_function": _HF_OF_GELU[cfg["gelu"]],
              "layer_norm_epsilon": cfg["eps"], "resid_pdrop": rates["resid_dropout"],
              "embd_pdrop": rates["embed_dropout"], "attn_pdrop": rates["attn_dropout"],
              "summary_first_dropout": 0.0, "scale_attn_weights": True, "tie_word_embeddings": cfg["tied"],
              "initializer_range": cfg["init_std"], "bos_token_id": cfg["n_vocab"] - 2,
              "eos_token_id": cfg["n_vocab"] - 1, "use_cache": True, "dtype": cfg["dtype"]}
        t = {"transformer." + a: (P[ft].T if how else P[ft]) for a, ft, how in _BODY}
        for l in range(cfg["L"]):
            h, q = f"transformer.h.{l}.", f"layers.{l}."
            t[h + "attn.c_attn.weight"] = np.concatenate([_flat(P[q + f"attn.W_{n}"]).T for n in "qkv"], axis=1)
            t[h + "attn.c_attn.bias"] = np.concatenate([_flat(P[q + f"attn.b_{n}"]) for n in "qkv"])
            t.update({h + a: (P[q + ft].T if how else P[q + ft]) for a, ft, how in _LAYER})
        if not cfg["tied"]:
            t["lm_head.weight"] = P["W_u"]
        return "GPT2LMHeadModel", hf, t
