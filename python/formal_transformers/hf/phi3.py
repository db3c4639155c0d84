"""Phi-3 (Phi3ForCausalLM) <-> DTransformer: LLaMA's function (llama.py: V1 RoPE, V3 H_kv, V4 SwiGLU, V5 no biases,
norm="rms", pre-norm) with its projections fused in HF's tensors, split and joined here:

    layers.l.self_attn.qkv_proj = [W_q; W_k; W_v] (rows: H·head_dim of queries, then H_kv·head_dim of keys and
    of values; head_dim = hidden_size / num_attention_heads); o_proj = W_o; mlp.gate_up_proj = [W_gate; W_mlp1]
    (the gate's rows first: HF's chunk(2) gives gate, up); mlp.down_proj = W_mlp2; input_layernorm = γ_l¹;
    post_attention_layernorm = γ_l²; embed_tokens = W_eᵀ; norm = γ; lm_head = W_u (tied: W_eᵀ).
sliding_window = w: V8 (None: causal). Dropout: resid_pdrop on each sublayer's output = resid_dropout,
attention_dropout = attn_dropout (embd_pdrop is not applied by transformers' Phi3Model and is not read).
Refused, naming the option: a scaled rotary embedding (rope_scaling / rope_parameters with rope_type
"longrope", "su", "yarn", …: Phi-3's 128k models) and partial_rotary_factor ≠ 1 (Phi-4-mini: V1 rotates every
pair of a head). Export: to_hf writes Phi3ForCausalLM for a LLaMA-style model with resid_dropout > 0 (LLaMA has
none) or when asked (to_hf / save_hf hf_class="Phi3ForCausalLM"); otherwise the same function as
LlamaForCausalLM / MistralForCausalLM. HF computes RMSnorm and the RoPE angles in float32 (see llama.py)."""
from __future__ import annotations

import numpy as np

from ._common import (_bad_value, _cfg_bool, _cfg_float, _cfg_int, _cfg_rate, _export_causal, _export_head_dim,
                      _export_requires, _flat, _split_heads, _split_rates, _swiglu_unsplit, _unsupported)
from ._registry import Converter, register
from .llama import rope_theta

_LAYER = (("self_attn.o_proj.weight", "attn.W_o"), ("mlp.down_proj.weight", "W_mlp2"),
          ("input_layernorm.weight", "gamma1"), ("post_attention_layernorm.weight", "gamma2"))


def partial_rotary_factor(c: dict, m: str) -> None:
    """ValueError unless every pair of a head rotates (partial_rotary_factor 1, at the top level or among the
    RoPE parameters, as Phi3Config reads it)."""
    for key in ("rope_scaling", "rope_parameters"):
        rp = c.get(key)
        if isinstance(rp, dict) and rp.get("partial_rotary_factor") is not None:
            f = _cfg_float(rp, m, "partial_rotary_factor")
            if f != 1.0:
                raise _unsupported(m, f"{key}.partial_rotary_factor", f, "V1 rotates every pair of a head (1.0 only)")
    f = _cfg_float(c, m, "partial_rotary_factor", 1.0)
    if f != 1.0:
        raise _unsupported(m, "partial_rotary_factor", f, "V1 rotates every pair of a head (1.0 only)")


@register
class Phi3(Converter):
    name = "Phi-3"
    classes = {"Phi3ForCausalLM": (True, "model.")}
    model_type = "phi3"
    embedding = "embed_tokens.weight"
    maps = frozenset({"n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_attn", "d_mid", "H_kv", "positional",
                      "rope_theta", "mlp", "bias", "norm", "eps", "tied", "seed", "init_std", "attention_impl",
                      "mask", "sliding_window", "embed_dropout", "attn_dropout", "resid_dropout"})

    def class_of(self, config, T, class_names):
        return next(iter(self.classes)) if config.get("model_type") == self.model_type else None

    def hyper(self, c):
        m = self.name
        _swiglu_unsplit(c, m)
        partial_rotary_factor(c, m)
        theta = rope_theta(c, m)  # refuses rope_type longrope / su / yarn, naming the key
        d, H = _cfg_int(c, m, "hidden_size"), _cfg_int(c, m, "num_attention_heads")
        H_kv = _cfg_int(c, m, "num_key_value_heads", H)
        d_h = _cfg_int(c, m, "head_dim", max(d // H, 1))  # Phi3Attention: hidden_size // num_attention_heads
        if H % H_kv:
            raise _unsupported(m, "num_key_value_heads", H_kv, f"it must divide num_attention_heads = {H}")
        hp = dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"),
                  L=_cfg_int(c, m, "num_hidden_layers"), H=H, d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"),
                  d_attn=d_h, d_mid=d_h, H_kv=H_kv, positional="rope", rope_theta=theta, mlp="swiglu", bias=False,
                  norm="rms", eps=_cfg_float(c, m, "rms_norm_eps", 1e-5),
                  tied=_cfg_bool(c, m, "tie_word_embeddings", False),
                  attn_dropout=_cfg_rate(c, m, "attention_dropout", 0.0),
                  resid_dropout=_cfg_rate(c, m, "resid_pdrop", 0.0))
        w = c.get("sliding_window")
        if w is not None:
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise _bad_value(m, "sliding_window", w, "a window of w ≥ 1 keys (V8), or None")
            hp["sliding_window"] = int(w)
        return hp

    def expected(self, hp, head):
        d, V, m, H, H_kv, d_h = hp["d_e"], hp["n_vocab"], hp["d_mlp"], hp["H"], hp["H_kv"], hp["d_attn"]
        e = {"embed_tokens.weight": (V, d), "norm.weight": (d,)}
        for l in range(hp["L"]):
            p = f"layers.{l}."
            e.update({p + "self_attn.qkv_proj.weight": ((H + 2 * H_kv) * d_h, d), p + "self_attn.o_proj.weight": (d, H * d_h),
                      p + "mlp.gate_up_proj.weight": (2 * m, d), p + "mlp.down_proj.weight": (d, m),
                      p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,)})
        if head and not hp["tied"]:
            e["lm_head.weight"] = (V, d)
        return e

    def to_ft(self, hp, T, head):
        H, H_kv, d_h, m = hp["H"], hp["H_kv"], hp["d_attn"], hp["d_mlp"]
        p = {"W_e": T["embed_tokens.weight"].T, "gamma": T["norm.weight"]}
        for l in range(hp["L"]):
            h, q = f"layers.{l}.", f"layers.{l}."
            W = T[h + "self_attn.qkv_proj.weight"]
            p[q + "attn.W_q"] = _split_heads(W[:H * d_h], H)
            p[q + "attn.W_k"] = _split_heads(W[H * d_h:(H + H_kv) * d_h], H_kv)
            p[q + "attn.W_v"] = _split_heads(W[(H + H_kv) * d_h:], H_kv)
            G = T[h + "mlp.gate_up_proj.weight"]
            p[q + "W_gate"], p[q + "W_mlp1"] = G[:m], G[m:]
            p.update({q + b: T[h + a] for a, b in _LAYER})
        if head and not hp["tied"]:
            p["W_u"] = T["lm_head.weight"]
        return p

    def takes(self, model, cfg):
        # LLaMA and Mistral take the same function without dropout on the sublayers' outputs
        return (cfg.get("arch") == "DTransformer" and cfg.get("positional") == "rope" and not cfg.get("kv_lora_rank")
                and not cfg.get("qkv_bias") and not cfg.get("qk_norm") and cfg.get("norm") != "rms1p"
                and bool(cfg.get("resid_dropout")))

    def export(self, cfg, P):
        cfg, rates = _split_rates(cfg)
        if rates["embed_dropout"]:
            raise ValueError(f"Phi-3 has no equivalent of embed_dropout={rates['embed_dropout']!r} (transformers' "
                             "Phi3Model applies no dropout to its embeddings)")
        _export_causal("Phi-3", cfg)
        _export_requires("Phi-3", cfg, dict(positional="rope", mlp="swiglu", bias=False, norm="rms"), "Phi3ForCausalLM")
        _export_head_dim("Phi-3", cfg)
        w = cfg.get("sliding_window")
        hf = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": cfg["n_vocab"],
              "hidden_size": cfg["d_e"], "intermediate_size": cfg["d_mlp"], "num_hidden_layers": cfg["L"],
              "num_attention_heads": cfg["H"], "num_key_value_heads": cfg["H_kv"], "head_dim": cfg["d_attn"],
              "max_position_embeddings": cfg["l_max"], "original_max_position_embeddings": cfg["l_max"],
              "rms_norm_eps": cfg["eps"], "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_theta"],
                                                              "partial_rotary_factor": 1.0},
              "hidden_act": "silu", "sliding_window": int(w) if w else None, "resid_pdrop": rates["resid_dropout"],
              "embd_pdrop": 0.0, "attention_dropout": rates["attn_dropout"], "tie_word_embeddings": cfg["tied"],
              "initializer_range": cfg["init_std"], "bos_token_id": cfg["n_vocab"] - 2,
              "eos_token_id": cfg["n_vocab"] - 1, "pad_token_id": None, "use_cache": True, "dtype": cfg["dtype"]}
        t = {"model.embed_tokens.weight": P["W_e"].T, "model.norm.weight": P["gamma"]}
        for l in range(cfg["L"]):
            h, q = f"model.layers.{l}.", f"layers.{l}."
            t[h + "self_attn.qkv_proj.weight"] = np.concatenate([_flat(P[q + f"attn.W_{n}"]) for n in "qkv"])
            t[h + "mlp.gate_up_proj.weight"] = np.concatenate([P[q + "W_gate"], P[q + "W_mlp1"]])
            t.update({h + a: P[q + b] for a, b in _LAYER})
        if not cfg["tied"]:
            t["lm_head.weight"] = P["W_u"]
        return "Phi3ForCausalLM", hf, t
