"""DeepSeek-V3 (DeepseekV3ForCausalLM, DeepSeek-AI 2024) with dense MLPs only <-> DTransformer: LLaMA's decoder
(RMSnorm, SwiGLU, no biases) with multi-head latent attention (docs/variants.md V10). Its RoPE pairs rows
(2i, 2i+1) of the rotated part (rope_interleave, the default) where V1 pairs (i, i + d_R/2): the rotated rows of
q_b_proj (q_proj) and kv_a_proj_with_mqa are permuted on the way in (even rows first, then odd) and back on the way
out, which gives the same scores (HF's own interleaved code computes exactly these products)."""
from __future__ import annotations

import numpy as np

from ._common import (_cfg_bool, _cfg_float, _cfg_int, _cfg_rate, _export_requires, _flat, _only_attention_dropout,
                      _require, _split_heads, _split_rates, _swiglu_unsplit, _unsupported)
from ._registry import Converter, register
from .llama import rope_theta


def layer_table(hp: dict) -> list:  # (HF name in layers.l., ft name in layers.l., heads of the reshape or "")
    q = ([("self_attn.q_a_proj.weight", "attn.W_dq", ""), ("self_attn.q_a_layernorm.weight", "attn.gamma_q", ""),
          ("self_attn.q_b_proj.weight", "attn.W_uq", "H")] if hp.get("q_lora_rank")
         else [("self_attn.q_proj.weight", "attn.W_q", "H")])
    return q + [("self_attn.kv_a_proj_with_mqa.weight", "attn.W_dkv", ""),
                ("self_attn.kv_a_layernorm.weight", "attn.gamma_kv", ""),
                ("self_attn.kv_b_proj.weight", "attn.W_ukv", "H"), ("self_attn.o_proj.weight", "attn.W_o", ""),
                ("mlp.gate_proj.weight", "W_gate", ""), ("mlp.up_proj.weight", "W_mlp1", ""),
                ("mlp.down_proj.weight", "W_mlp2", ""), ("input_layernorm.weight", "gamma1", ""),
                ("post_attention_layernorm.weight", "gamma2", "")]


def rope_rows(hp: dict, name: str, v, inverse: bool):
    """The rows of W_uq / W_q (per head) and W_dkv that V1 rotates, from DeepSeek's interleaved pairs (2i, 2i+1)
    to V1's (i, i + d_R/2) (inverse: back)."""
    d_R = hp["qk_rope_head_dim"]
    perm = np.concatenate([np.arange(0, d_R, 2), np.arange(1, d_R, 2)])
    order = np.argsort(perm) if inverse else perm
    v = np.array(v, copy=True)
    if name == "attn.W_dkv":
        v[-d_R:] = v[-d_R:][order]
    elif name in ("attn.W_uq", "attn.W_q"):  # (H, d_attn, ·): each head's last d_R rows
        v[:, -d_R:] = v[:, -d_R:][:, order]
    return v



@register
class DeepseekV3(Converter):
    name = "DeepSeek-V3"
    classes = {"DeepseekV3ForCausalLM": (True, "model.")}
    model_type = "deepseek_v3"
    embedding = "embed_tokens.weight"
    maps = frozenset({"n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_attn", "d_mid", "H_kv", "positional",
                      "rope_theta", "mlp", "bias", "norm", "eps", "tied", "seed", "init_std", "attention_impl",
                      "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "embed_dropout", "attn_dropout",
                      "resid_dropout"})

    def class_of(self, config, T, class_names):
        return None  # a directory names its class

    def hyper(self, c):
        m = self.name
        L = _cfg_int(c, m, "num_hidden_layers")
        k_dense = c.get("first_k_dense_replace")
        if k_dense is None or isinstance(k_dense, bool) or not isinstance(k_dense, int) or k_dense < L:
            raise _unsupported(m, "first_k_dense_replace", k_dense,
                               f"only dense MLP layers (first_k_dense_replace >= num_hidden_layers = {L}); layers from "
                               "first_k_dense_replace on are mixtures of experts (n_routed_experts), which we do not "
                               "express")
        _swiglu_unsplit(c, m)
        _require(c, m, "attention_bias", False, "latent attention has no biases (V10)")
        d, H = _cfg_int(c, m, "hidden_size"), _cfg_int(c, m, "num_attention_heads")
        H_kv = _cfg_int(c, m, "num_key_value_heads", H)
        if H_kv != H:
            raise _unsupported(m, "num_key_value_heads", H_kv, f"latent attention makes every head's keys (= {H})")
        d_R, d_N = _cfg_int(c, m, "qk_rope_head_dim"), _cfg_int(c, m, "qk_nope_head_dim", lo=0)
        if d_R % 2:
            raise _unsupported(m, "qk_rope_head_dim", d_R, "RoPE rotates pairs: an even size")
        hp = dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"), L=L, H=H,
                  d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"), d_attn=d_N + d_R,
                  d_mid=_cfg_int(c, m, "v_head_dim"), positional="rope", rope_theta=rope_theta(c), mlp="swiglu",
                  bias=False, norm="rms", eps=_cfg_float(c, m, "rms_norm_eps", 1e-6),
                  tied=_cfg_bool(c, m, "tie_word_embeddings", False),
                  attn_dropout=_cfg_rate(c, m, "attention_dropout", 0.0), kv_lora_rank=_cfg_int(c, m, "kv_lora_rank"),
                  qk_rope_head_dim=d_R, _rope_interleave=_cfg_bool(c, m, "rope_interleave", True))
        if c.get("q_lora_rank") is not None:
            hp["q_lora_rank"] = _cfg_int(c, m, "q_lora_rank")
        return hp

    def expected(self, hp, head):
        d, V, m, H = hp["d_e"], hp["n_vocab"], hp["d_mlp"], hp["H"]
        d_attn, d_v, d_c, d_R = hp["d_attn"], hp["d_mid"], hp["kv_lora_rank"], hp["qk_rope_head_dim"]
        d_cq = hp.get("q_lora_rank", 0)
        shapes = {"attn.W_dq": (d_cq, d), "attn.gamma_q": (d_cq,), "attn.W_uq": (H * d_attn, d_cq),
                  "attn.W_q": (H * d_attn, d), "attn.W_dkv": (d_c + d_R, d), "attn.gamma_kv": (d_c,),
                  "attn.W_ukv": (H * (d_attn - d_R + d_v), d_c), "attn.W_o": (d, H * d_v), "W_gate": (m, d),
                  "W_mlp1": (m, d), "W_mlp2": (d, m), "gamma1": (d,), "gamma2": (d,)}
        e = {"embed_tokens.weight": (V, d), "norm.weight": (d,)}
        for l in range(hp["L"]):
            e.update({f"layers.{l}.{a}": shapes[b] for a, b, _ in layer_table(hp)})
        if head and not hp["tied"]:
            e["lm_head.weight"] = (V, d)
        return e

    def to_ft(self, hp, T, head):
        p = {"W_e": T["embed_tokens.weight"].T, "gamma": T["norm.weight"]}
        for l in range(hp["L"]):
            for a, b, heads in layer_table(hp):
                v = T[f"layers.{l}.{a}"]
                v = _split_heads(v, hp[heads]) if heads else v
                p[f"layers.{l}.{b}"] = rope_rows(hp, b, v, False) if hp["_rope_interleave"] else v
        if head and not hp["tied"]:
            p["W_u"] = T["lm_head.weight"]
        return p

    def takes(self, model, cfg):
        return cfg.get("arch") == "DTransformer" and bool(cfg.get("kv_lora_rank"))

    def export(self, cfg, P):
        """A DTransformer with kv_lora_rank (V10), mlp='swiglu', bias=False, norm='rms' -> DeepseekV3ForCausalLM
        with dense MLPs (first_k_dense_replace = L) and rope_interleave=True (DeepSeek's layout)."""
        cfg, rates = _split_rates(cfg)
        _only_attention_dropout(self.name, rates)
        _export_requires("DeepSeek-V3", cfg, dict(mlp="swiglu", norm="rms", bias=False))
        if cfg.get("H_kv") not in (None, cfg["H"]):
            raise ValueError(f"DeepSeek-V3 has no equivalent of H_kv={cfg['H_kv']!r}: latent attention makes every "
                             "head's keys")
        hp = {**cfg, "_rope_interleave": True}
        hf = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": cfg["n_vocab"],
              "hidden_size": cfg["d_e"], "intermediate_size": cfg["d_mlp"], "num_hidden_layers": cfg["L"],
              "first_k_dense_replace": cfg["L"], "num_attention_heads": cfg["H"], "num_key_value_heads": cfg["H"],
              "kv_lora_rank": cfg["kv_lora_rank"], "q_lora_rank": cfg.get("q_lora_rank"),
              "qk_rope_head_dim": cfg["qk_rope_head_dim"], "qk_nope_head_dim": cfg["d_attn"] - cfg["qk_rope_head_dim"],
              "v_head_dim": cfg["d_mid"], "max_position_embeddings": cfg["l_max"], "rms_norm_eps": cfg["eps"],
              "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_theta"]}, "rope_interleave": True,
              "hidden_act": "silu", "attention_bias": False, "attention_dropout": rates["attn_dropout"],
              "tie_word_embeddings": cfg["tied"], "initializer_range": cfg["init_std"],
              "bos_token_id": cfg["n_vocab"] - 2, "eos_token_id": cfg["n_vocab"] - 1, "use_cache": True,
              "num_mtp_layers": 0, "dtype": cfg["dtype"]}
        t = {"model.embed_tokens.weight": P["W_e"].T, "model.norm.weight": P["gamma"]}
        for l in range(cfg["L"]):
            for a, b, heads in layer_table(hp):
                v = rope_rows(hp, b, P[f"layers.{l}.{b}"], True)
                t[f"model.layers.{l}.{a}"] = _flat(v) if heads else v
        if not cfg["tied"]:
            t["lm_head.weight"] = P["W_u"]
        return "DeepseekV3ForCausalLM", hf, t
