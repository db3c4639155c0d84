"""Gemma 2 (Gemma2ForCausalLM) and Gemma 3 text (Gemma3ForCausalLM) <-> DTransformer: Algorithm 10 with V1 RoPE, V3
grouped-query attention, V5 no biases, V18's GeGLU MLP (gelu_pytorch_tanh), the (1 + γ) RMS norm (norm="rms1p": the
checkpoint's weight is θ's γ), the embedding times √d_e (embed_scale), sandwich layers (V27, block="sandwich":
each sublayer's output normalised again before its residual add), local (sliding-window) and global layers (V26),
and V25's attention scale 1/√query_pre_attn_scalar and soft-capping; Gemma 2 caps the final logits too; Gemma 3 adds
V24's QK-norm and a RoPE θ of its own for the local layers.

    embed_tokens = W_eᵀ; layers.l.self_attn.{q,k,v}_proj = W_q (H blocks), W_k, W_v (H_kv blocks of head_dim rows);
    o_proj = W_o; self_attn.q_norm, k_norm = γ_q, γ_k (Gemma 3); mlp.gate_proj, up_proj, down_proj = W_gate, W_mlp1,
    W_mlp2; input_layernorm = γ_l¹; post_attention_layernorm = γ_l¹′; pre_feedforward_layernorm = γ_l²;
    post_feedforward_layernorm = γ_l²′; norm = γ; lm_head = W_u (tied: W_eᵀ).
    hidden_size**0.5 = embed_scale; query_pre_attn_scalar (= head_dim: None); attn_logit_softcapping,
    final_logit_softcapping (null: None); sliding_window = w with layer_types ↦ sliding_window_pattern p (layer l
    global iff (l + 1) is a multiple of p; every layer "sliding_attention": None; every layer "full_attention": no
    window); rope θ: Gemma 2's rope_parameters (or rope_theta); Gemma 3's rope_parameters["full_attention"] and
    ["sliding_attention"] (or rope_theta and rope_local_base_freq) ↦ rope_theta, rope_local_base_freq.
Gemma 3's linear RoPE scaling of its global layers (rope_parameters["full_attention"]: rope_type "linear", factor f;
4B and larger) ↦ rope_scaling_factor = f.
Refused (ValueError naming the option): another scaled RoPE (rope_type other than "default" / Gemma 3's global
"linear"; Gemma 2's rope_scaling), attention_bias,
use_bidirectional_attention, hidden_activation other than gelu_pytorch_tanh, layer_types with no period p as above,
and Gemma3ForConditionalGeneration's vision tower. attention_dropout ↦ attn_dropout (HF drops the softmax of the
capped scores, as the 'softcap' kernel's dropout does).
HF computes the RMS norms, the RoPE angles and the attention softmax in float32 even in a float64 model, and keeps
√d_e as a float32 number: tests/python/test_gemma.py runs those in float64 for the exactness checks."""
from __future__ import annotations

import math

from ._common import (_bad_value, _cfg_bool, _cfg_float, _cfg_get, _cfg_int, _cfg_rate, _export_head_dim,
                      _export_requires, _split_rates, _table_to_ft, _unsupported)
from ._registry import Converter, register
from .llama import decoder_shapes, hf_state, tensor_table as llama_table

LAYER = (  # (HF name in layers.l., ft name in layers.l., heads of the reshape)
    ("self_attn.q_proj.weight", "attn.W_q", "H"), ("self_attn.k_proj.weight", "attn.W_k", "H_kv"),
    ("self_attn.v_proj.weight", "attn.W_v", "H_kv"), ("self_attn.o_proj.weight", "attn.W_o", ""),
    ("mlp.gate_proj.weight", "W_gate", ""), ("mlp.up_proj.weight", "W_mlp1", ""), ("mlp.down_proj.weight", "W_mlp2", ""),
    ("input_layernorm.weight", "gamma1", ""), ("post_attention_layernorm.weight", "gamma1_post", ""),
    ("pre_feedforward_layernorm.weight", "gamma2", ""), ("post_feedforward_layernorm.weight", "gamma2_post", ""),
)
QK = (("self_attn.q_norm.weight", "attn.gamma_q", ""), ("self_attn.k_norm.weight", "attn.gamma_k", ""))


def tensor_table(hp: dict, head: bool) -> list:
    return llama_table(hp, head, LAYER + (QK if hp.get("qk_norm") else ()))


def from_ft(P: dict, cfg: dict) -> dict:
    """ft params of a Gemma-style DTransformer (or their gradients) -> Gemma{2,3}ForCausalLM's state (full names)."""
    return hf_state(tensor_table(cfg, True), P)


def layer_pattern(c: dict, m: str, L: int):
    """(sliding_window, sliding_window_pattern) of HF's layer_types (V26): (None, None) when every layer is global."""
    types = c.get("layer_types")
    if types is None:
        p = _cfg_int(c, m, "sliding_window_pattern", 2 if m == "Gemma 2" else 6)
        types = ["full_attention" if (l + 1) % p == 0 else "sliding_attention" for l in range(L)]
    if not isinstance(types, list) or len(types) != L or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise _bad_value(m, "layer_types", types, f"a list of {L} 'sliding_attention' / 'full_attention'")
    local = [t == "sliding_attention" for t in types]
    if not any(local):
        return None, None
    w = _cfg_int(c, m, "sliding_window")
    if all(local):
        return w, None
    p = local.index(False) + 1
    if any(local[l] != bool((l + 1) % p) for l in range(L)):
        raise _unsupported(m, "layer_types", types, "the global layers must be every p-th layer (l + 1 a multiple of p)")
    return w, p


def _rope(rp, m: str, key: str, linear: bool = False):
    """(θ, linear factor or None) of one set of RoPE parameters: rope_type "default", or "linear" where allowed."""
    if not isinstance(rp, dict):
        raise _bad_value(m, key, rp, "an object of RoPE parameters")
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind not in ("default", "linear") or (kind == "linear" and not linear):
        raise _unsupported(m, f"{key}.rope_type", kind, "only V1's rotary embedding" +
                           (" and its linear scaling" if linear else " (no scaling)"))
    theta = _cfg_float({f"{key}.rope_theta": rp.get("rope_theta")}, m, f"{key}.rope_theta", lo=0.0, lo_open=True)
    f = _cfg_float(rp, m, "factor", lo=0.0, lo_open=True) if kind == "linear" else None
    return theta, (None if f == 1.0 else f)


def rope_thetas(c: dict, m: str, gemma3: bool):
    """(θ of the global layers, θ of the local ones, the global layers' linear factor or None) as transformers 5 reads
    a Gemma config (Gemma 3: the factor of rope_parameters["full_attention"], or the older rope_scaling)."""
    rp = c.get("rope_parameters")
    if gemma3:
        if isinstance(rp, dict) and ("full_attention" in rp or "sliding_attention" in rp):
            g, f = _rope(rp.get("full_attention") or {"rope_theta": c.get("rope_theta", 1e6)}, m,
                         "rope_parameters.full_attention", linear=True)
            l, _ = _rope(rp.get("sliding_attention") or {"rope_theta": c.get("rope_local_base_freq", 1e4)}, m,
                         "rope_parameters.sliding_attention")
            return g, l, f
        g, f = _rope({"rope_theta": c.get("rope_theta", 1e6), **(c.get("rope_scaling") or {})}, m, "rope_scaling",
                     linear=True)
        return g, _cfg_float(c, m, "rope_local_base_freq", 1e4, lo_open=True), f
    if c.get("rope_scaling"):
        raise _unsupported(m, "rope_scaling", c["rope_scaling"], "only the plain rotary embedding of V1 (no scaling)")
    t = _rope(rp, m, "rope_parameters")[0] if rp else _cfg_float(c, m, "rope_theta", 1e4, lo_open=True)
    return t, t, None


class _Gemma(Converter):
    gemma3 = False
    model_type = ""
    embedding = "embed_tokens.weight"
    maps = frozenset({"n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_attn", "d_mid", "H_kv", "positional",
                      "rope_theta", "mlp", "bias", "norm", "eps", "tied", "seed", "init_std", "attention_impl", "mask",
                      "embed_dropout", "attn_dropout", "resid_dropout", "embed_scale", "block",
                      "final_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar", "sliding_window",
                      "sliding_window_pattern", "rope_local_base_freq", "qk_norm", "rope_scaling_factor"})

    def class_of(self, config, T, class_names):
        return next(iter(self.classes)) if config.get("model_type") == self.model_type else None

    def hyper(self, c):
        m = self.name
        for k in ("vision_config", "text_config"):
            if k in c:
                raise _unsupported(m, k, "…", "the vision tower of Gemma3ForConditionalGeneration is not mapped: "
                                   "convert its language model (Gemma3ForCausalLM)")
        act = _cfg_get(c, m, "hidden_activation", None) or _cfg_get(c, m, "hidden_act", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise _unsupported(m, "hidden_activation", act, "the GeGLU MLP gates with GELU's tanh form")
        if _cfg_bool(c, m, "attention_bias", False):
            raise _unsupported(m, "attention_bias", True, "Gemma's attention has no biases (V5)")
        if c.get("use_bidirectional_attention"):
            raise _unsupported(m, "use_bidirectional_attention", True, "Gemma's decoder is causal")
        d, H = _cfg_int(c, m, "hidden_size"), _cfg_int(c, m, "num_attention_heads")
        H_kv = _cfg_int(c, m, "num_key_value_heads", H)
        d_h = _cfg_int(c, m, "head_dim", max(d // H, 1))
        if H % H_kv:
            raise _unsupported(m, "num_key_value_heads", H_kv, f"it must divide num_attention_heads = {H}")
        L = _cfg_int(c, m, "num_hidden_layers")
        w, p = layer_pattern(c, m, L)
        theta, local, factor = rope_thetas(c, m, self.gemma3)
        s = _cfg_float(c, m, "query_pre_attn_scalar", float(d_h), lo_open=True)
        cap = c.get("attn_logit_softcapping")
        cap = None if cap is None else _cfg_float(c, m, "attn_logit_softcapping", lo_open=True)
        final = c.get("final_logit_softcapping")
        final = None if final is None else _cfg_float(c, m, "final_logit_softcapping", lo_open=True)
        drop = _cfg_rate(c, m, "attention_dropout", 0.0)
        hp = dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"), L=L, H=H,
                  d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"), d_attn=d_h, d_mid=d_h, H_kv=H_kv,
                  positional="rope", rope_theta=theta, mlp="geglu", bias=False, norm="rms1p",
                  eps=_cfg_float(c, m, "rms_norm_eps", 1e-6), tied=_cfg_bool(c, m, "tie_word_embeddings", True),
                  attn_dropout=drop, embed_scale=math.sqrt(d), block="sandwich",
                  final_logit_softcapping=final, attn_logit_softcapping=cap,
                  query_pre_attn_scalar=None if s == d_h else s, sliding_window=w, sliding_window_pattern=p)
        if self.gemma3:
            hp["qk_norm"] = True
            if w is not None and (local != theta or factor):  # (a local θ of its own keeps those layers unscaled)
                hp["rope_local_base_freq"] = local
            if factor:
                hp["rope_scaling_factor"] = factor
        return hp

    def expected(self, hp, head):
        return decoder_shapes(hp, tensor_table(hp, head))

    def to_ft(self, hp, T, head):
        return _table_to_ft(tensor_table(hp, head), T, hp)

    def takes(self, model, cfg):
        return (cfg.get("arch") == "DTransformer" and cfg.get("norm") == "rms1p"
                and bool(cfg.get("qk_norm")) == self.gemma3)

    def export(self, cfg, P):
        m = self.name
        cfg, rates = _split_rates(cfg)
        for k in ("embed_dropout", "resid_dropout"):
            if rates[k]:
                raise ValueError(f"{m} has no equivalent of {k}={rates[k]!r} (it drops only attention weights)")
        _export_requires(m, cfg, dict(positional="rope", mlp="geglu", bias=False, block="sandwich", mask="causal"),
                         next(iter(self.classes)), absent_ok=True)
        if cfg.get("embed_scale") is None or abs(cfg["embed_scale"] - math.sqrt(cfg["d_e"])) > 1e-12 * math.sqrt(cfg["d_e"]):
            raise ValueError(f"{m} scales the embedding by √hidden_size: embed_scale must be √d_e = "
                             f"{math.sqrt(cfg['d_e'])!r}, got {cfg.get('embed_scale')!r}")
        _export_head_dim(m, cfg)
        if not self.gemma3 and (cfg.get("rope_local_base_freq") is not None or cfg.get("rope_scaling_factor")):
            raise ValueError("Gemma 2 has one unscaled RoPE: rope_local_base_freq and rope_scaling_factor are Gemma 3's "
                             "(qk_norm=True)")
        f = cfg.get("rope_scaling_factor")
        if f and cfg.get("sliding_window") and cfg.get("rope_local_base_freq") is None:
            raise ValueError("Gemma 3 scales the RoPE of its global layers only: with rope_scaling_factor and "
                             "sliding_window, give the local layers their θ (rope_local_base_freq)")
        L, w, p = cfg["L"], cfg.get("sliding_window"), cfg.get("sliding_window_pattern")
        types = ["full_attention" if w is None or (p and (l + 1) % p == 0) else "sliding_attention" for l in range(L)]
        s = cfg.get("query_pre_attn_scalar") or cfg["d_attn"]
        if s != int(s):
            raise ValueError(f"{m}'s query_pre_attn_scalar is an integer, got query_pre_attn_scalar={s!r}")
        theta = cfg["rope_theta"]
        local = cfg.get("rope_local_base_freq") or theta
        arch = next(iter(self.classes))
        hf = {"model_type": self.model_type, "architectures": [arch], "vocab_size": cfg["n_vocab"],
              "hidden_size": cfg["d_e"], "intermediate_size": cfg["d_mlp"], "num_hidden_layers": L,
              "num_attention_heads": cfg["H"], "num_key_value_heads": cfg["H_kv"], "head_dim": cfg["d_attn"],
              "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": cfg["l_max"],
              "rms_norm_eps": cfg["eps"], "tie_word_embeddings": cfg["tied"], "attention_bias": False,
              "attention_dropout": rates["attn_dropout"],
              "query_pre_attn_scalar": int(s),
              "attn_logit_softcapping": cfg.get("attn_logit_softcapping"),
              "final_logit_softcapping": cfg.get("final_logit_softcapping"),
              "sliding_window": w, "layer_types": types, "initializer_range": cfg["init_std"],
              "pad_token_id": None, "bos_token_id": cfg["n_vocab"] - 2, "eos_token_id": cfg["n_vocab"] - 1,
              "use_cache": True, "dtype": cfg["dtype"]}
        if self.gemma3:
            full = {"rope_type": "linear", "factor": f, "rope_theta": theta} if f else {"rope_type": "default",
                                                                                        "rope_theta": theta}
            hf["rope_parameters"] = {"full_attention": full,
                                     "sliding_attention": {"rope_type": "default", "rope_theta": local}}
            hf["use_bidirectional_attention"] = False
        else:
            hf["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
        return arch, hf, from_ft(P, cfg)


@register
class Gemma2(_Gemma):
    name = "Gemma 2"
    classes = {"Gemma2ForCausalLM": (True, "model.")}
    model_type = "gemma2"


@register
class Gemma3(_Gemma):
    name = "Gemma 3"
    classes = {"Gemma3ForCausalLM": (True, "model."), "Gemma3ForConditionalGeneration": (True, "model.language_model.")}
    model_type = "gemma3_text"
    gemma3 = True

    def from_model(self, hf_model, cls_name, dtype, **kw):
        if cls_name == "Gemma3ForConditionalGeneration":
            raise ValueError("Gemma3ForConditionalGeneration: its vision tower (vision_config) is not mapped; "
                             "ft.from_hf takes the text model, Gemma3ForCausalLM")
        return super().from_model(hf_model, cls_name, dtype, **kw)

    def class_of(self, config, T, class_names):
        if config.get("model_type") == "gemma3":  # a multimodal checkpoint: refused by hyper, naming vision_config
            return "Gemma3ForConditionalGeneration"
        return super().class_of(config, T, class_names)
