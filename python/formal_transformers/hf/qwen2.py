"""Qwen2 (Qwen2ForCausalLM) <-> DTransformer: LLaMA's layers (llama.py: V1 RoPE, V3 H_kv, V4 SwiGLU, norm="rms",
pre-norm) with biases on the query, key and value maps only (docs/variants.md V20, qkv_bias=True with bias=False):

    embed_tokens = W_eᵀ; layers.l.self_attn.{q,k,v}_proj.weight = W_q, W_k, W_v (H, H_kv, H_kv blocks of head_dim
    rows) and .bias = b_q, b_k, b_v; o_proj = W_o (no bias); mlp.gate_proj, up_proj, down_proj = W_gate, W_mlp1,
    W_mlp2; input_layernorm = γ_l¹; post_attention_layernorm = γ_l²; norm = γ; lm_head = W_u (tied: W_eᵀ).
Sliding-window attention: HF's use_sliding_window makes layers max_window_layers … L−1 sliding (layer_types);
when every layer slides, that is V8 with w = sliding_window; a mix of sliding and full layers is refused
(layer_types names it). attention_dropout = attn_dropout (Qwen2 drops only its attention weights).
HF computes RMSnorm and the RoPE angles in float32 even in a float64 model (see llama.py)."""
from __future__ import annotations

from ._common import (_cfg_bool, _cfg_float, _cfg_int, _cfg_rate, _export_causal, _export_head_dim, _export_requires,
                      _only_attention_dropout, _split_rates, _swiglu_unsplit, _table_to_ft, _unsupported)
from ._registry import Converter, register
from .llama import LAYER, decoder_shapes, hf_state, rope_theta, tensor_table as llama_table

BIASES = (("self_attn.q_proj.bias", "attn.b_q", "H"), ("self_attn.k_proj.bias", "attn.b_k", "H_kv"),
          ("self_attn.v_proj.bias", "attn.b_v", "H_kv"))


def tensor_table(hp: dict, head: bool) -> list:
    return llama_table(hp, head, LAYER + BIASES)


def sliding_window(c: dict, m: str, L: int):
    """V8's w when every layer slides, None when none does (ValueError for a mix): layer_types as the config
    gives them, else as Qwen2Config derives them (sliding from layer max_window_layers on when use_sliding_window)."""
    use = _cfg_bool(c, m, "use_sliding_window", False)
    types = c.get("layer_types")
    if types is None:
        first = _cfg_int(c, m, "max_window_layers", 28, lo=0) if use else L
        types = ["sliding_attention" if use and i >= first else "full_attention" for i in range(L)]
    if not isinstance(types, list) or len(types) != L or any(t not in ("full_attention", "sliding_attention")
                                                             for t in types):
        raise _unsupported(m, "layer_types", types, f"a list of {L} 'full_attention' / 'sliding_attention'")
    if all(t == "full_attention" for t in types):
        return None
    if not all(t == "sliding_attention" for t in types):
        raise _unsupported(m, "layer_types", types, "sliding and full layers mixed (max_window_layers with "
                           "use_sliding_window): every layer full, or every layer sliding (V8)")
    return _cfg_int(c, m, "sliding_window")


@register
class Qwen2(Converter):
    name = "Qwen2"
    classes = {"Qwen2ForCausalLM": (True, "model.")}
    model_type = "qwen2"
    embedding = "embed_tokens.weight"
    maps = frozenset({"n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_attn", "d_mid", "H_kv", "positional",
                      "rope_theta", "mlp", "bias", "qkv_bias", "norm", "eps", "tied", "seed", "init_std",
                      "attention_impl", "mask", "sliding_window", "embed_dropout", "attn_dropout", "resid_dropout"})

    def class_of(self, config, T, class_names):
        return next(iter(self.classes)) if config.get("model_type") == self.model_type else None

    def hyper(self, c):
        m = self.name
        _swiglu_unsplit(c, m)
        d, H = _cfg_int(c, m, "hidden_size"), _cfg_int(c, m, "num_attention_heads")
        H_kv = _cfg_int(c, m, "num_key_value_heads", H)
        d_h = _cfg_int(c, m, "head_dim", max(d // H, 1))  # Qwen2Attention: head_dim, else hidden_size // heads
        if H % H_kv:
            raise _unsupported(m, "num_key_value_heads", H_kv, f"it must divide num_attention_heads = {H}")
        L = _cfg_int(c, m, "num_hidden_layers")
        hp = dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"), L=L, H=H,
                  d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"), d_attn=d_h, d_mid=d_h, H_kv=H_kv,
                  positional="rope", rope_theta=rope_theta(c, m), mlp="swiglu", bias=False, qkv_bias=True,
                  norm="rms", eps=_cfg_float(c, m, "rms_norm_eps", 1e-6),
                  tied=_cfg_bool(c, m, "tie_word_embeddings", False),
                  attn_dropout=_cfg_rate(c, m, "attention_dropout", 0.0))
        w = sliding_window(c, m, L)
        if w is not None:
            hp["sliding_window"] = w
        return hp

    def expected(self, hp, head):
        return decoder_shapes(hp, tensor_table(hp, head))

    def to_ft(self, hp, T, head):
        return _table_to_ft(tensor_table(hp, head), T, hp)

    def takes(self, model, cfg):
        return (cfg.get("arch") == "DTransformer" and cfg.get("positional") == "rope" and bool(cfg.get("qkv_bias"))
                and not cfg.get("kv_lora_rank") and not cfg.get("qk_norm") and cfg.get("norm") != "rms1p")

    def export(self, cfg, P):
        cfg, rates = _split_rates(cfg)
        _export_causal("Qwen2", cfg)
        _only_attention_dropout("Qwen2", rates)
        _export_requires("Qwen2", cfg, dict(mlp="swiglu", bias=False, qkv_bias=True, norm="rms", positional="rope"),
                         "Qwen2ForCausalLM")
        _export_head_dim("Qwen2", cfg)
        w = cfg.get("sliding_window")
        hf = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": cfg["n_vocab"],
              "hidden_size": cfg["d_e"], "intermediate_size": cfg["d_mlp"], "num_hidden_layers": cfg["L"],
              "num_attention_heads": cfg["H"], "num_key_value_heads": cfg["H_kv"], "head_dim": cfg["d_attn"],
              "max_position_embeddings": cfg["l_max"], "rms_norm_eps": cfg["eps"], "rope_theta": cfg["rope_theta"],
              "hidden_act": "silu", "use_sliding_window": bool(w), "sliding_window": int(w) if w else None,
              "max_window_layers": 0 if w else cfg["L"],
              "layer_types": [("sliding_attention" if w else "full_attention")] * cfg["L"],
              "attention_dropout": rates["attn_dropout"], "tie_word_embeddings": cfg["tied"],
              "initializer_range": cfg["init_std"], "bos_token_id": cfg["n_vocab"] - 2,
              "eos_token_id": cfg["n_vocab"] - 1, "use_cache": True, "dtype": cfg["dtype"]}
        return "Qwen2ForCausalLM", hf, hf_state(tensor_table(cfg, True), P)
