"""LLaMA (LlamaForCausalLM) and Mistral (MistralForCausalLM) <-> DTransformer: Algorithm 10 with docs/variants.md's
V1 RoPE (half-split pairing, θ = rope_theta), V3 grouped-query attention (H_kv = num_key_value_heads), V4 SwiGLU,
V5 no biases, and norm="rms"; pre-norm. Mistral (Jiang et al. 2023) is LLaMA's layers, names and tensors with
sliding-window attention (V8: each query sees the last `sliding_window` keys; None: causal as LLaMA).

    embed_tokens = W_eᵀ; layers.l.self_attn.{q,k,v}_proj = W_q (H blocks), W_k, W_v (H_kv blocks of head_dim rows);
    o_proj = W_o; mlp.gate_proj, up_proj, down_proj = W_gate, W_mlp1, W_mlp2; input_layernorm = γ_l¹;
    post_attention_layernorm = γ_l²; norm = γ; lm_head = W_u (tied: W_eᵀ).
HF computes RMSnorm and the RoPE angles in float32 even for a float64 model, so a float64 HF LLaMA agrees with ft to
float32 accuracy unless those two run in float64 (tests/python/test_variants.py shows how)."""
from __future__ import annotations

from ._common import (_cfg_bool, _cfg_float, _cfg_int, _cfg_rate, _export_causal, _export_head_dim, _export_requires,
                      _layered_table, _only_attention_dropout, _require, _rope_float, _rope_parameters, _split_rates,
                      _swiglu_unsplit, _table_from_ft, _table_to_ft, _unsupported)
from ._registry import Converter, register

LAYER = (  # (HF name in layers.l., ft name in layers.l., heads of the reshape: "H", "H_kv" or "")
    ("self_attn.q_proj.weight", "attn.W_q", "H"), ("self_attn.k_proj.weight", "attn.W_k", "H_kv"),
    ("self_attn.v_proj.weight", "attn.W_v", "H_kv"), ("self_attn.o_proj.weight", "attn.W_o", ""),
    ("mlp.gate_proj.weight", "W_gate", ""), ("mlp.up_proj.weight", "W_mlp1", ""), ("mlp.down_proj.weight", "W_mlp2", ""),
    ("input_layernorm.weight", "gamma1", ""), ("post_attention_layernorm.weight", "gamma2", ""),
)


def rope_theta(c: dict, m: str = "LLaMA") -> float:
    """θ of V1's rotary embedding, read as transformers 5 reads a LLaMA config (RotaryEmbeddingConfigMixin):
    the RoPE parameters are "rope_scaling" when it is set (the older name wins), else "rope_parameters";
    their rope_type (or "type") must be "default" — scaled variants (linear, dynamic, yarn, llama3, …) change
    the angles in ways V1 does not express and are refused; θ is their "rope_theta", else the top-level
    "rope_theta", else 10,000. (partial_rotary_factor is not read by LLaMA's default rotary embedding.) m: the
    family named in the messages."""
    key, rp = _rope_parameters(c, m)
    return _rope_float(c, m, key, rp, "rope_theta", "rope_theta", 10000.0, lo=0.0, lo_open=True)



def _other_family(cfg: dict) -> bool:
    """A RoPE decoder another family exports: QK-norm (Qwen3, qwen3.py; Gemma 3), the (1 + γ) norm (Gemma, gemma.py),
    biases on q/k/v only (Qwen2, qwen2.py) or a residual dropout (Phi-3, phi3.py)."""
    return (bool(cfg.get("qk_norm")) or cfg.get("norm") == "rms1p" or bool(cfg.get("qkv_bias"))
            or bool(cfg.get("resid_dropout")))


BODY = (("embed_tokens.weight", "W_e", "T"), ("norm.weight", "gamma", ""))


def tensor_table(hp: dict, head: bool, layer=LAYER) -> list:
    """(HF name in the body (or lm_head.weight), ft name, how) of a LLaMA-style model whose layers have the rows
    `layer` (LLaMA's; a family with other tensors in its layers passes its own)."""
    return _layered_table(hp, BODY, "layers.{}.", layer, (), "lm_head.weight" if head else None)


def hf_state(rows, P: dict) -> dict:
    """ft params (or their gradients) under a LLaMA-style table's full HF names (the body's under model.)."""
    return {("" if a == "lm_head.weight" else "model.") + a: v for a, v in _table_from_ft(rows, P).items()}


def from_ft(P: dict, cfg: dict) -> dict:
    """ft params of a LLaMA-style DTransformer -> LlamaForCausalLM's state (full names)."""
    return hf_state(tensor_table(cfg, True), P)


def decoder_shapes(hp: dict, rows) -> dict:
    """The shape of each HF tensor of a LLaMA-style table (a family's own layer tensors included: q/k/v biases,
    QK-norm gains, sandwich norms): {HF name: shape}."""
    d, V, m, H, H_kv, d_h = hp["d_e"], hp["n_vocab"], hp["d_mlp"], hp["H"], hp["H_kv"], hp["d_attn"]
    shapes = {"attn.W_q": (H * d_h, d), "attn.W_k": (H_kv * d_h, d), "attn.W_v": (H_kv * d_h, d),
              "attn.b_q": (H * d_h,), "attn.b_k": (H_kv * d_h,), "attn.b_v": (H_kv * d_h,), "attn.W_o": (d, H * d_h),
              "attn.gamma_q": (d_h,), "attn.gamma_k": (d_h,), "W_gate": (m, d), "W_mlp1": (m, d), "W_mlp2": (d, m),
              "gamma1": (d,), "gamma1_post": (d,), "gamma2": (d,), "gamma2_post": (d,), "W_e": (V, d), "gamma": (d,),
              "W_u": (V, d)}
    return {a: shapes[b.split(".", 2)[-1] if b.startswith("layers.") else b] for a, b, _ in rows}


@register
class Llama(Converter):
    name = "LLaMA"
    classes = {"LlamaForCausalLM": (True, "model.")}
    model_type = "llama"
    embedding = "embed_tokens.weight"
    maps = frozenset({"n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_attn", "d_mid", "H_kv", "positional",
                      "rope_theta", "mlp", "bias", "norm", "eps", "tied", "seed", "init_std", "attention_impl",
                      "mask", "embed_dropout", "attn_dropout", "resid_dropout"})

    layer = LAYER  # a layer's name table (a family with more tensors in its layers: its own)

    def class_of(self, config, T, class_names):
        return next(iter(self.classes)) if config.get("model_type") == self.model_type else None

    def hyper(self, c):
        m = "LLaMA"
        _swiglu_unsplit(c, m)
        for opt in ("attention_bias", "mlp_bias"):
            _require(c, m, opt, False, "the LLaMA-style DTransformer has bias=False (V5) throughout")
        d, H = _cfg_int(c, m, "hidden_size"), _cfg_int(c, m, "num_attention_heads")
        H_kv = _cfg_int(c, m, "num_key_value_heads", H)  # null: H, as LlamaConfig
        d_h = _cfg_int(c, m, "head_dim", max(d // H, 1))  # null: hidden_size // num_attention_heads
        if H % H_kv:
            raise _unsupported(m, "num_key_value_heads", H_kv, f"it must divide num_attention_heads = {H}")
        return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"),
                    L=_cfg_int(c, m, "num_hidden_layers"), H=H, d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"),
                    d_attn=d_h, d_mid=d_h, H_kv=H_kv, positional="rope", rope_theta=rope_theta(c), mlp="swiglu",
                    bias=False, norm="rms", eps=_cfg_float(c, m, "rms_norm_eps", 1e-6),
                    tied=_cfg_bool(c, m, "tie_word_embeddings", False),
                    attn_dropout=_cfg_rate(c, m, "attention_dropout", 0.0))  # LLaMA drops only its attention weights

    def expected(self, hp, head):
        return decoder_shapes(hp, tensor_table(hp, head, self.layer))

    def to_ft(self, hp, T, head):
        return _table_to_ft(tensor_table(hp, head, self.layer), T, hp)

    def takes(self, model, cfg):
        return (cfg.get("arch") == "DTransformer" and cfg.get("positional") == "rope" and not cfg.get("kv_lora_rank")
                and not cfg.get("sliding_window") and cfg.get("block") != "parallel" and not _other_family(cfg))

    def export(self, cfg, P):
        cfg, rates = _split_rates(cfg)
        _export_causal("LLaMA and Mistral", cfg, has="have")
        _only_attention_dropout("LLaMA", rates)
        _export_requires("LLaMA", cfg, dict(mlp="swiglu", bias=False, norm="rms"), "LlamaForCausalLM",
                         note=" with positional='rope'")
        _export_head_dim("LLaMA", cfg)
        hf = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": cfg["n_vocab"],
              "hidden_size": cfg["d_e"], "intermediate_size": cfg["d_mlp"], "num_hidden_layers": cfg["L"],
              "num_attention_heads": cfg["H"], "num_key_value_heads": cfg["H_kv"], "head_dim": cfg["d_attn"],
              "max_position_embeddings": cfg["l_max"], "rms_norm_eps": cfg["eps"], "rope_theta": cfg["rope_theta"],
              "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
              "attention_dropout": rates["attn_dropout"], "tie_word_embeddings": cfg["tied"],
              "initializer_range": cfg["init_std"], "bos_token_id": cfg["n_vocab"] - 2,
              "eos_token_id": cfg["n_vocab"] - 1, "use_cache": True, "dtype": cfg["dtype"]}
        return "LlamaForCausalLM", hf, from_ft(P, cfg)


@register
class Mistral(Llama):
    name = "Mistral"
    classes = {"MistralForCausalLM": (True, "model.")}
    model_type = "mistral"
    maps = Llama.maps | {"sliding_window"}

    def hyper(self, c):
        for opt in ("attention_bias", "mlp_bias"):  # not MistralConfig options; a config carrying one is not Mistral's
            if c.get(opt, False):
                raise _unsupported("Mistral", opt, True, "Mistral has bias=False (V5) throughout")
        hp = super().hyper(c)
        w = c.get("sliding_window")
        if w is not None:
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise _unsupported("Mistral", "sliding_window", w, "a window of w ≥ 1 keys (V8), or None")
            hp["sliding_window"] = int(w)
        return hp

    def takes(self, model, cfg):
        return (cfg.get("arch") == "DTransformer" and cfg.get("positional") == "rope" and not cfg.get("kv_lora_rank")
                and bool(cfg.get("sliding_window")) and cfg.get("block") != "parallel" and not _other_family(cfg))

    def export(self, cfg, P):
        """A LLaMA-style DTransformer with sliding_window=w -> MistralForCausalLM (LLaMA's tensors and names)."""
        w = cfg.get("sliding_window")
        _, hf, state = super().export({k: v for k, v in cfg.items() if k != "sliding_window"}, P)
        hf = {**hf, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": int(w)}
        hf.pop("attention_bias", None)
        hf.pop("mlp_bias", None)
        return "MistralForCausalLM", hf, state
