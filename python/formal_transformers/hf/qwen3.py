"""Qwen3 (Qwen3ForCausalLM) <-> DTransformer: LLaMA's layers (llama.py: V1 RoPE, V3 grouped-query attention, V4
SwiGLU, V5 no biases, norm="rms") with V24's QK-norm: every head's queries and keys RMS-normalised with their own
gains before RoPE (qk_norm=True).

    embed_tokens = W_eᵀ; layers.l.self_attn.{q,k,v,o}_proj = W_q, W_k, W_v, W_o (as LLaMA);
    self_attn.q_norm = γ_q, self_attn.k_norm = γ_k (d_attn each, shared by the heads); mlp.* and the norms as LLaMA.
Refused (ValueError naming the option): use_sliding_window=True / layer_types with "sliding_attention" (Qwen3's
window on the upper layers), attention_bias=True, any scaled rope_parameters, hidden_act other than silu."""
from __future__ import annotations

from ._common import _cfg_bool, _unsupported
from ._registry import register
from .llama import LAYER, Llama, hf_state, tensor_table as llama_table

QK = (("self_attn.q_norm.weight", "attn.gamma_q", ""), ("self_attn.k_norm.weight", "attn.gamma_k", ""))


def from_ft(P: dict, cfg: dict) -> dict:
    """ft params of a Qwen3-style DTransformer (or their gradients) -> Qwen3ForCausalLM's state (full names)."""
    return hf_state(llama_table(cfg, True, LAYER + QK), P)


def check_layer_types(c: dict, m: str) -> None:
    """Every layer attends causally: use_sliding_window False and layer_types (when given) all "full_attention"."""
    if _cfg_bool(c, m, "use_sliding_window", False):
        raise _unsupported(m, "use_sliding_window", True, "the sliding window of the upper layers is not mapped")
    for t in c.get("layer_types") or []:
        if t != "full_attention":
            raise _unsupported(m, "layer_types", t, "every layer must be 'full_attention'")


@register
class Qwen3(Llama):
    name = "Qwen3"
    classes = {"Qwen3ForCausalLM": (True, "model.")}
    model_type = "qwen3"
    maps = Llama.maps | {"qk_norm"}
    layer = LAYER + QK

    def hyper(self, c):
        check_layer_types(c, "Qwen3")
        hp = super().hyper({k: v for k, v in c.items() if k != "sliding_window"})  # (read only with the window)
        hp["qk_norm"] = True
        return hp

    def takes(self, model, cfg):
        return (cfg.get("arch") == "DTransformer" and cfg.get("positional") == "rope" and bool(cfg.get("qk_norm"))
                and cfg.get("norm") == "rms")

    def export(self, cfg, P):
        """A LLaMA-style DTransformer with qk_norm=True -> Qwen3ForCausalLM (LLaMA's tensors and q_norm, k_norm)."""
        if cfg.get("sliding_window"):
            raise ValueError("Qwen3ForCausalLM: sliding_window is not mapped (its window covers the upper layers only)")
        _, hf, _ = super().export({k: v for k, v in cfg.items() if k != "qk_norm"}, P)
        hf = {**hf, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "use_sliding_window": False,
              "sliding_window": None}
        hf.pop("mlp_bias", None)
        return "Qwen3ForCausalLM", hf, from_ft(P, cfg)
