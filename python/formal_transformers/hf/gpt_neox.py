"""GPT-NeoX (GPTNeoXForCausalLM / GPTNeoXModel; Black et al. 2022, Pythia) <-> DTransformer with the parallel
residual block (block="parallel", docs/variants.md V30), V1 RoPE on the first ⌊head_size · rotary_pct⌋ rows of each
head (rotary_pct; half-split pairs within them), layer_norm with biases, the GELU MLP, biases everywhere, untied W_u:

    embed_in = W_eᵀ; layers.l.input_layernorm = γ_l¹, β_l¹; post_attention_layernorm = γ_l², β_l²;
    layers.l.attention.query_key_value = [W_q; W_k; W_v] fused per head (rows h·3d_h … : q of head h, then its k,
    then its v) with its bias; attention.dense = W_o, b_o; mlp.dense_h_to_4h = W_mlp1, b_mlp1; mlp.dense_4h_to_h =
    W_mlp2, b_mlp2; final_layer_norm = γ, β; lm_head (files of transformers 4: embed_out) = W_u (tied: W_eᵀ).
Config: hidden_act "gelu" = gelu="exact", "gelu_new" / "gelu_pytorch_tanh" = gelu="tanh"; rope_parameters (or
rope_scaling) of type "default" with rope_theta and partial_rotary_factor (older files: rotary_emb_base, rotary_pct;
defaults 10000 and 0.25, as GPTNeoXConfig); hidden_dropout = embed_dropout = resid_dropout (after the embedding and
on each sublayer's output, ft's places), attention_dropout = attn_dropout. Refused (ValueError naming the option):
use_parallel_residual=False, attention_bias=False (its MLP keeps biases), scaled RoPE, any other activation."""
from __future__ import annotations

import numpy as np

from ._common import (_HF_OF_GELU, _cfg_bool, _cfg_float, _cfg_get, _cfg_int, _cfg_rate, _export_all_kv_heads,
                      _export_heads_split_d_e, _export_requires, _gelu_of, _require, _rope_float, _rope_parameters,
                      _split_rates, _width_and_heads)
from ._registry import Converter, register

# (HF name in layers.l., ft name in layers.l.) — query_key_value holds W_q, W_k, W_v (and their biases) fused
_LAYER = (("input_layernorm.weight", "gamma1"), ("input_layernorm.bias", "beta1"),
          ("post_attention_layernorm.weight", "gamma2"), ("post_attention_layernorm.bias", "beta2"),
          ("attention.dense.weight", "attn.W_o"), ("attention.dense.bias", "attn.b_o"),
          ("mlp.dense_h_to_4h.weight", "W_mlp1"), ("mlp.dense_h_to_4h.bias", "b_mlp1"),
          ("mlp.dense_4h_to_h.weight", "W_mlp2"), ("mlp.dense_4h_to_h.bias", "b_mlp2"))
_BODY = (("final_layer_norm.weight", "gamma"), ("final_layer_norm.bias", "beta"))


def rope_of(c: dict, m: str) -> tuple:
    """(θ, rotary_pct) as transformers 5 reads a GPT-NeoX config: "rope_scaling" when set, else "rope_parameters",
    of rope_type "default" (scaled variants are refused); θ its rope_theta, else rotary_emb_base, else 10,000; the
    share its partial_rotary_factor, else rotary_pct, else 0.25."""
    key, rp = _rope_parameters(c, m)
    theta = _rope_float(c, m, key, rp, "rope_theta", "rotary_emb_base", 10000.0, lo=0.0, lo_open=True)
    pct = _rope_float(c, m, key, rp, "partial_rotary_factor", "rotary_pct", 0.25, lo=0.0, hi=1.0, lo_open=True)
    return theta, pct


@register
class GPTNeoX(Converter):
    name = "GPT-NeoX"
    classes = {"GPTNeoXForCausalLM": (True, "gpt_neox."), "GPTNeoXModel": (False, "")}
    model_type = "gpt_neox"
    embedding = "embed_in.weight"
    maps = frozenset({"n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_attn", "d_mid", "H_kv", "positional",
                      "rope_theta", "rotary_pct", "block", "norm", "gelu", "eps", "tied", "seed", "init_std",
                      "attention_impl", "embed_dropout", "attn_dropout", "resid_dropout"})

    def class_of(self, config, T, class_names):
        if config.get("model_type") != self.model_type:
            return None
        head = any(k in T for k in ("lm_head.weight", "embed_out.weight")) or any(k.startswith("gpt_neox.") for k in T)
        return "GPTNeoXForCausalLM" if head else "GPTNeoXModel"

    def hyper(self, c):
        m = self.name
        _require(c, m, "use_parallel_residual", True, "ft's GPT-NeoX layer is the parallel residual (block='parallel')")
        _require(c, m, "attention_bias", True, "GPT-NeoX's MLP keeps its biases; ft's bias option covers both")
        d, H = _width_and_heads(c, m, "hidden_size", "num_attention_heads")
        theta, pct = rope_of(c, m)
        hidden = _cfg_rate(c, m, "hidden_dropout", 0.0)
        return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings", 2048),
                    L=_cfg_int(c, m, "num_hidden_layers"), H=H, d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"),
                    positional="rope", rope_theta=theta, rotary_pct=pct, block="parallel",
                    gelu=_gelu_of(m, "hidden_act", _cfg_get(c, m, "hidden_act", "gelu")),
                    eps=_cfg_float(c, m, "layer_norm_eps", 1e-5), tied=_cfg_bool(c, m, "tie_word_embeddings", False),
                    embed_dropout=hidden, resid_dropout=hidden, attn_dropout=_cfg_rate(c, m, "attention_dropout", 0.0))

    def prepare(self, hp, T, head):
        if "embed_out.weight" in T:  # the head's name before transformers 5
            if "lm_head.weight" in T:
                raise ValueError("GPT-NeoX: the file holds both embed_out.weight and lm_head.weight (one head)")
            T["lm_head.weight"] = T.pop("embed_out.weight")
        return super().prepare(hp, T, head)

    def expected(self, hp, head):
        d, V, n = hp["d_e"], hp["n_vocab"], hp["d_mlp"]
        e = {"embed_in.weight": (V, d), "final_layer_norm.weight": (d,), "final_layer_norm.bias": (d,)}
        shapes = {"gamma1": (d,), "beta1": (d,), "gamma2": (d,), "beta2": (d,), "attn.W_o": (d, d), "attn.b_o": (d,),
                  "W_mlp1": (n, d), "b_mlp1": (n,), "W_mlp2": (d, n), "b_mlp2": (d,)}
        for l in range(hp["L"]):
            h = f"layers.{l}."
            e[h + "attention.query_key_value.weight"] = (3 * d, d)
            e[h + "attention.query_key_value.bias"] = (3 * d,)
            e.update({h + a: shapes[b] for a, b in _LAYER})
        if head and not hp["tied"]:
            e["lm_head.weight"] = (V, d)
        return e

    def to_ft(self, hp, T, head):
        d, H = hp["d_e"], hp["H"]
        d_h = d // H
        p = {"W_e": T["embed_in.weight"].T}
        for l in range(hp["L"]):
            h, q = f"layers.{l}.", f"layers.{l}."
            W = T[h + "attention.query_key_value.weight"].reshape(H, 3, d_h, d)  # per head: its q, k, v rows
            b = T[h + "attention.query_key_value.bias"].reshape(H, 3, d_h)
            for i, n in enumerate("qkv"):
                p[q + f"attn.W_{n}"], p[q + f"attn.b_{n}"] = W[:, i], b[:, i]
            p.update({q + ft: T[h + a] for a, ft in _LAYER})
        p.update({ft: T[a] for a, ft in _BODY})
        if head and not hp["tied"]:
            p["W_u"] = T["lm_head.weight"]
        return p

    def takes(self, model, cfg):
        return cfg.get("arch") == "DTransformer" and cfg.get("block") == "parallel"

    def export(self, cfg, P):
        """A DTransformer with block='parallel' and GPT-NeoX's options -> GPTNeoXForCausalLM."""
        cfg, rates = _split_rates(cfg)
        _export_requires("GPT-NeoX", cfg, dict(positional="rope", norm="layer", mlp="gelu", bias=True),
                         "GPTNeoXForCausalLM", note=" with block='parallel'")
        _export_all_kv_heads("GPT-NeoX", cfg)
        _export_heads_split_d_e("GPT-NeoX", cfg)
        if rates["embed_dropout"] != rates["resid_dropout"]:
            raise ValueError(f"GPT-NeoX has one hidden_dropout for embed_dropout={rates['embed_dropout']!r} and "
                             f"resid_dropout={rates['resid_dropout']!r}: set them equal to export")
        d, H = cfg["d_e"], cfg["H"]
        hf = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": cfg["n_vocab"],
              "hidden_size": d, "num_hidden_layers": cfg["L"], "num_attention_heads": H,
              "intermediate_size": cfg["d_mlp"], "hidden_act": _HF_OF_GELU[cfg["gelu"]],
              "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_theta"],
                                  "partial_rotary_factor": cfg["rotary_pct"]},
              "max_position_embeddings": cfg["l_max"], "layer_norm_eps": cfg["eps"], "use_parallel_residual": True,
              "attention_bias": True, "attention_dropout": rates["attn_dropout"],
              "hidden_dropout": rates["resid_dropout"], "tie_word_embeddings": cfg["tied"],
              "initializer_range": cfg["init_std"], "bos_token_id": cfg["n_vocab"] - 2,
              "eos_token_id": cfg["n_vocab"] - 1, "use_cache": True, "dtype": cfg["dtype"]}
        t = {"gpt_neox.embed_in.weight": P["W_e"].T}
        for l in range(cfg["L"]):
            h, q = f"gpt_neox.layers.{l}.", f"layers.{l}."
            W = np.stack([np.asarray(P[q + f"attn.W_{n}"]) for n in "qkv"], axis=1)  # (H, 3, d_h, d)
            b = np.stack([np.asarray(P[q + f"attn.b_{n}"]) for n in "qkv"], axis=1)  # (H, 3, d_h)
            t[h + "attention.query_key_value.weight"] = W.reshape(3 * d, d)
            t[h + "attention.query_key_value.bias"] = b.reshape(3 * d)
            t.update({h + a: P[q + ft] for a, ft in _LAYER})
        t.update({"gpt_neox." + a: P[ft] for a, ft in _BODY})
        if not cfg["tied"]:
            t["lm_head.weight"] = P["W_u"]
        return "GPTNeoXForCausalLM", hf, t
