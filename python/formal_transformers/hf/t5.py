"""T5 (T5ForConditionalGeneration, Raffel et al. 2020) <-> EDTransformer with docs/variants.md's V11 relative
position bias and V18 (block="pre_ln", norm="rms", bias=False, scale_scores=False, mlp="relu" | "geglu",
unembed_rescale, bos_id = decoder_start_token_id, eos_id = eos_token_id; no W_p):

    shared = W_eᵀ; encoder.block.l.layer.0.SelfAttention.{q,k,v} = W_q, W_k, W_v (H blocks of d_kv rows), o = W_o,
    layer_norm = γ_l¹; layer.1.DenseReluDense.wi = W_mlp1 (gated: wi_0 = W_gate, wi_1 = W_mlp1), wo = W_mlp2,
    layer_norm = γ_l²; encoder.block.0.…relative_attention_bias = enc.rel_bias; encoder.final_layer_norm = γ_enc;
    decoder.block.l.layer.0 the same (γ¹, dec.rel_bias), layer.1.EncDecAttention = cross_attn (γ²), layer.2 = W_mlp3
    (W_gate), W_mlp4 (γ³); decoder.final_layer_norm = γ_dec; lm_head = W_u (tied: W_eᵀ).
transformers 5 ties encoder.embed_tokens, decoder.embed_tokens and lm_head to shared unless a file holds one that
differs (then it uses that tensor), and scales by d_model^−1/2 when the config's tie_word_embeddings is not False
(scale_decoder_outputs): ft's tied and unembed_rescale are those two facts (an lm_head differing from shared is an
untied W_u; a stack's embed_tokens differing from shared has no place in ft, whose stacks share W_e, and is refused
by name). The MLP is what transformers builds: is_gated_act and dense_act_fn when the config gives them, else what
feed_forward_proj says. T5 drops inside its MLP and after the final norms, places ft has no dropout site for:
from_hf leaves the rates 0 (training-time only; the function is the same) and to_hf writes dropout_rate = 0.
HF's T5LayerNorm computes its mean square in float32 even for a float64 model (tests/python/test_t5_hf.py says what
that costs and how the test runs it in float64). The relative buckets are checked by the core (resolve)."""
from __future__ import annotations

from ._common import (_bad_value, _cfg_bool, _cfg_float, _cfg_int, _cfg_str, _drop_stack_embeddings,
                      _export_all_kv_heads, _export_head_dim, _export_requires, _require, _split_rates, _table_from_ft,
                      _table_to_ft, _unsupported)
from ._registry import Converter, check_layer_count, encoder_takes_tokens, register

# (is_gated_act, dense_act_fn) -> ft's mlp
_MLPS = {(False, "relu"): "relu", (True, "gelu_new"): "geglu", (True, "gelu_pytorch_tanh"): "geglu"}


def _attn(stack: str, l: int, i: int, kind: str):
    return [(f"{stack}.block.{l}.layer.{i}.{kind}.{w}.weight", f"{stack[:3]}.{l}.{'attn' if i == 0 else 'cross_attn'}.W_{w}",
             "" if w == "o" else "H") for w in "qkvo"]


def tensor_table(hp: dict, head: bool) -> list:
    """(HF name, ft name, how: "T" transposed, "H" split into heads, "" as is) of every tensor of a
    T5ForConditionalGeneration (hp: an EDTransformer's config or options)."""
    gated = hp["mlp"] == "geglu"
    r = [("shared.weight", "W_e", "T"), ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                                         "enc.rel_bias", ""),
         ("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", "dec.rel_bias", ""),
         ("encoder.final_layer_norm.weight", "enc.gamma", ""), ("decoder.final_layer_norm.weight", "dec.gamma", "")]
    for stack, L, ff in (("encoder", hp["L_enc"], 1), ("decoder", hp["L_dec"], 2)):
        s = stack[:3]
        W1, W2 = ("W_mlp1", "W_mlp2") if stack == "encoder" else ("W_mlp3", "W_mlp4")
        for l in range(L):
            b = f"{stack}.block.{l}.layer"
            r += _attn(stack, l, 0, "SelfAttention") + [(f"{b}.0.layer_norm.weight", f"{s}.{l}.gamma1", "")]
            if stack == "decoder":
                r += _attn(stack, l, 1, "EncDecAttention") + [(f"{b}.1.layer_norm.weight", f"{s}.{l}.gamma2", "")]
            d = f"{b}.{ff}.DenseReluDense"
            r += ([(f"{d}.wi_0.weight", f"{s}.{l}.W_gate", ""), (f"{d}.wi_1.weight", f"{s}.{l}.{W1}", "")] if gated
                  else [(f"{d}.wi.weight", f"{s}.{l}.{W1}", "")])
            r += [(f"{d}.wo.weight", f"{s}.{l}.{W2}", ""), (f"{b}.{ff}.layer_norm.weight", f"{s}.{l}.gamma{ff + 1}", "")]
    if head and not hp["tied"]:
        r.append(("lm_head.weight", "W_u", ""))
    return r


def mlp_of(c: dict) -> str:
    """ft's mlp for the MLP transformers builds from a T5 config: T5Config derives is_gated_act and dense_act_fn from
    feed_forward_proj ("relu", "gated-gelu" = gated gelu_new, "[gated-]ACT") unless the config gives them."""
    m = "T5"
    ff = _cfg_str(c, m, "feed_forward_proj", "relu")
    parts = ff.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise _unsupported(m, "feed_forward_proj", ff, "'ACT' or 'gated-ACT' (transformers refuses it too)")
    act = c.get("dense_act_fn")
    if act is None:
        act = "gelu_new" if ff == "gated-gelu" else parts[-1]
    elif not isinstance(act, str):
        raise _bad_value(m, "dense_act_fn", act, "an activation's name")
    gated = c.get("is_gated_act")
    gated = parts[0] == "gated" if gated is None else _cfg_bool(c, m, "is_gated_act", False)
    if (gated, act) not in _MLPS:
        key = "dense_act_fn" if c.get("dense_act_fn") is not None else "feed_forward_proj"
        shown = act if key == "dense_act_fn" else ff
        raise _unsupported(m, key, shown, f"with is_gated_act={gated} T5's MLP is ft's mlp='relu' (is_gated_act=False, "
                                          "relu) or mlp='geglu' (is_gated_act=True, gelu_new: V18b GEGLU) only")
    return _MLPS[gated, act]


@register
class T5(Converter):
    name = "T5"
    arch = "EDTransformer"
    classes = {"T5ForConditionalGeneration": (True, "")}
    model_type = "t5"
    embedding = "shared.weight"
    maps = frozenset({"n_vocab", "l_max", "L_enc", "L_dec", "H", "d_e", "d_mlp", "d_attn", "d_mid", "norm", "block",
                      "bias", "positional", "relative_buckets", "relative_max_distance", "scale_scores", "mlp",
                      "unembed_rescale", "eps", "bos_id", "eos_id", "tied", "H_kv", "seed", "init_std", "attention_impl",
                      "fixnorm", "embed_dropout", "attn_dropout", "resid_dropout"})

    def hyper(self, c):
        m = self.name
        _require(c, m, "is_encoder_decoder", True, "T5ForConditionalGeneration is an encoder-decoder (Algorithm 8)")
        _require(c, m, "is_decoder", False, "the stack configuration of T5ForConditionalGeneration has is_decoder=False")
        mlp = mlp_of(c)
        eos = c.get("eos_token_id", 1)
        if isinstance(eos, bool) or not isinstance(eos, int) or eos < 0:
            raise _unsupported(m, "eos_token_id", eos, "one token id (EDInference's eos_id)")
        start = c.get("decoder_start_token_id")
        if start is None:
            start = c.get("pad_token_id", 0)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise _unsupported(m, "decoder_start_token_id", start, "one token id (EDInference's bos_id)")
        scale = c.get("scale_decoder_outputs")
        if scale is None:  # a config.json: transformers 5 reads its tie_word_embeddings as this (see the notes above)
            scale = _cfg_bool(c, m, "tie_word_embeddings", True)
        d_kv, L = _cfg_int(c, m, "d_kv"), _cfg_int(c, m, "num_layers")
        L_dec = c.get("num_decoder_layers")
        return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "n_positions", 512), L_enc=L,
                    L_dec=_cfg_int(c, m, "num_decoder_layers") if L_dec is not None else L,
                    H=_cfg_int(c, m, "num_heads"), d_e=_cfg_int(c, m, "d_model"), d_mlp=_cfg_int(c, m, "d_ff"),
                    d_attn=d_kv, d_mid=d_kv, norm="rms", block="pre_ln", bias=False, positional="relative",
                    relative_buckets=_cfg_int(c, m, "relative_attention_num_buckets", 32, lo=0),
                    relative_max_distance=_cfg_int(c, m, "relative_attention_max_distance", 128, lo=0),
                    scale_scores=False, mlp=mlp, unembed_rescale=bool(scale),
                    eps=_cfg_float(c, m, "layer_norm_epsilon", 1e-6), bos_id=int(start), eos_id=int(eos),
                    tied=True)  # untied by prepare when the file's lm_head differs from shared

    def prepare(self, hp, T, head):
        T = super().prepare(hp, T, head)
        _drop_stack_embeddings(T, "T5", self.embedding)
        return T

    def check_layers(self, hp, T, where, cls_name):
        check_layer_count(hp["L_enc"], ("encoder.block.", "num_layers"), T, where, cls_name)
        check_layer_count(hp["L_dec"], ("decoder.block.", "num_decoder_layers"), T, where, cls_name)

    def expected(self, hp, head):
        d, V, m, H, d_kv, N_b = hp["d_e"], hp["n_vocab"], hp["d_mlp"], hp["H"], hp["d_attn"], hp["relative_buckets"]
        shape = {"W_e": (V, d), "W_u": (V, d), "rel_bias": (N_b, H), "gamma": (d,), "gamma1": (d,), "gamma2": (d,),
                 "gamma3": (d,), "W_q": (H * d_kv, d), "W_k": (H * d_kv, d), "W_v": (H * d_kv, d),
                 "W_o": (d, H * d_kv), "W_gate": (m, d), "W_mlp1": (m, d), "W_mlp3": (m, d), "W_mlp2": (d, m),
                 "W_mlp4": (d, m)}
        return {hf: shape[ft.split(".")[-1]] for hf, ft, _ in tensor_table(hp, head)}

    def to_ft(self, hp, T, head):
        return _table_to_ft(tensor_table(hp, head), T, hp)

    def takes(self, model, cfg):
        from .bart import is_bart  # BART's options (V22) on: BART's or mBART's

        return (cfg.get("arch") == "EDTransformer" and (cfg.get("block") == "pre_ln" or cfg.get("positional") == "relative")
                and not is_bart(cfg) and encoder_takes_tokens(model))  # (not Whisper's log-mel features)

    def export(self, cfg, P):
        """An EDTransformer with T5's options (V11, V18) -> T5ForConditionalGeneration."""
        cfg, rates = _split_rates(cfg)
        for k, v in rates.items():
            if v:
                raise ValueError(f"T5 has no equivalent of {k}={v!r}: it drops inside its MLP and after the final "
                                 "norms (set the rates to 0 to export)")
        _export_requires("T5", cfg, dict(block="pre_ln", norm="rms", bias=False, positional="relative",
                                         scale_scores=False, fixnorm=False), "T5ForConditionalGeneration")
        if cfg.get("mlp") not in ("relu", "geglu"):
            raise ValueError(f"T5 has no equivalent of mlp={cfg.get('mlp')!r} ('relu' or 'geglu')")
        _export_all_kv_heads("T5", cfg)
        _export_head_dim("T5", cfg, "d_kv")
        bos = cfg["bos_id"] if cfg.get("bos_id") is not None else cfg["n_vocab"] - 2
        eos = cfg["eos_id"] if cfg.get("eos_id") is not None else cfg["n_vocab"] - 1
        hf = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "vocab_size": cfg["n_vocab"],
              "d_model": cfg["d_e"], "d_kv": cfg["d_attn"], "d_ff": cfg["d_mlp"], "num_layers": cfg["L_enc"],
              "num_decoder_layers": cfg["L_dec"], "num_heads": cfg["H"],
              "relative_attention_num_buckets": cfg["relative_buckets"],
              "relative_attention_max_distance": cfg["relative_max_distance"], "dropout_rate": 0.0,
              "layer_norm_epsilon": cfg["eps"], "feed_forward_proj": "gated-gelu" if cfg["mlp"] == "geglu" else "relu",
              "tie_word_embeddings": bool(cfg["unembed_rescale"]), "is_encoder_decoder": True,
              "decoder_start_token_id": int(bos), "pad_token_id": int(bos), "eos_token_id": int(eos),
              "n_positions": cfg["l_max"], "dtype": cfg["dtype"]}
        return "T5ForConditionalGeneration", hf, _table_from_ft(tensor_table(cfg, True), P)

    def prepare_hf(self, hf, state):
        if "lm_head.weight" in state:  # untied: its own W_u (transformers 5 ties T5's lm_head to shared)
            import torch

            hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone())
