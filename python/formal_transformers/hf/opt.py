"""OPT (OPTForCausalLM) <-> DTransformer: Algorithm 10 (pre-LN, learned positions, biases) with the ReLU MLP
(docs/variants.md V21, mlp="relu") and a tied head:

    decoder.embed_tokens = W_eᵀ; decoder.embed_positions = [2 rows; W_pᵀ] (OPT's table has max_position_embeddings
    + 2 rows: token t reads row t + 2); decoder.layers.l.self_attn.{q,k,v}_proj = W_q, W_k, W_v (H blocks of
    d_e/H rows) and biases; out_proj = W_o, b_o; self_attn_layer_norm = γ_l¹, β_l¹; fc1 = W_mlp1, b_mlp1;
    fc2 = W_mlp2, b_mlp2; final_layer_norm (of layer l) = γ_l², β_l²; decoder.final_layer_norm = γ, β;
    lm_head = W_u (tied: W_eᵀ). enable_bias=False: bias=False (V5).
Positions: OPT computes them from the attention mask (cumsum(mask)·mask − 1, then + 2), so a token's position is
the number of unpadded tokens before it, whatever the padding (left or right): ft's sequence x[m == 1] gets the
same positions, and W_p = the table without its first two rows is exact for every unpadded token. Row 1 is read
only at padded positions (whose outputs have no counterpart) and row 0 never: both are dropped by from_hf and
written as zeros by to_hf (so HF → ft → HF is exact except those two rows; ft → HF → ft is exact).
Dropout: dropout on each sublayer's output = resid_dropout, attention_dropout = attn_dropout (OPT has none on
its embeddings). Refused, naming the option: word_embed_proj_dim ≠ hidden_size (project_in / project_out, OPT-350m),
do_layer_norm_before=False (post-LN layers, OPT-350m), _remove_final_layer_norm, layer_norm_elementwise_affine=False,
layerdrop > 0, activation_function other than relu."""
from __future__ import annotations

import numpy as np

from ._common import (_cfg_bool, _cfg_float, _cfg_get, _cfg_int, _cfg_rate, _export_all_kv_heads,
                      _export_heads_split_d_e, _export_requires, _require, _split_rates, _table_from_ft, _table_to_ft,
                      _unsupported, _width_and_heads)
from ._registry import Converter, register

OFFSET = 2  # OPTLearnedPositionalEmbedding.offset
ATTN = (("self_attn.q_proj", "attn.W_q", "attn.b_q"), ("self_attn.k_proj", "attn.W_k", "attn.b_k"),
        ("self_attn.v_proj", "attn.W_v", "attn.b_v"))
OTHER = (("self_attn.out_proj", "attn.W_o", "attn.b_o"), ("fc1", "W_mlp1", "b_mlp1"), ("fc2", "W_mlp2", "b_mlp2"))
NORMS = (("self_attn_layer_norm", "gamma1", "beta1"), ("final_layer_norm", "gamma2", "beta2"))


def tensor_table(hp: dict, head: bool) -> list:
    """(HF name, ft name, how) of every tensor but the position table (which to_ft / export slice)."""
    bias = hp.get("bias", True)
    rows = [("decoder.embed_tokens.weight", "W_e", "T"), ("decoder.final_layer_norm.weight", "gamma", ""),
            ("decoder.final_layer_norm.bias", "beta", "")]
    for l in range(hp["L"]):
        p, q = f"decoder.layers.{l}.", f"layers.{l}."
        for a, w, b in ATTN:
            rows.append((p + a + ".weight", q + w, "H"))
            if bias:
                rows.append((p + a + ".bias", q + b, "H"))
        for a, w, b in OTHER:
            rows.append((p + a + ".weight", q + w, ""))
            if bias:
                rows.append((p + a + ".bias", q + b, ""))
        rows += [(p + a + ".weight", q + g, "") for a, g, _ in NORMS] + [(p + a + ".bias", q + b, "") for a, _, b in NORMS]
    if head and not hp["tied"]:
        rows.append(("lm_head.weight", "W_u", ""))
    return rows


@register
class OPT(Converter):
    name = "OPT"
    classes = {"OPTForCausalLM": (True, "model.")}
    model_type = "opt"
    embedding = "decoder.embed_tokens.weight"
    layers = ("decoder.layers.", "num_hidden_layers")
    maps = frozenset({"n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_attn", "d_mid", "H_kv", "positional", "mlp",
                      "bias", "norm", "eps", "tied", "seed", "init_std", "attention_impl", "embed_dropout",
                      "attn_dropout", "resid_dropout"})

    def class_of(self, config, T, class_names):
        return next(iter(self.classes)) if config.get("model_type") == self.model_type else None

    def hyper(self, c):
        m = self.name
        d, H = _width_and_heads(c, m, "hidden_size", "num_attention_heads")
        p = _cfg_int(c, m, "word_embed_proj_dim", d)
        if p != d:
            raise _unsupported(m, "word_embed_proj_dim", p, f"the embedding must have hidden_size = {d} columns "
                               "(no project_in / project_out)")
        _require(c, m, "do_layer_norm_before", True, "Algorithm 10's layers are pre-LN")
        _require(c, m, "_remove_final_layer_norm", False, "Algorithm 10 ends with a layer_norm")
        _require(c, m, "layer_norm_elementwise_affine", True, "the layer_norms have γ and β")
        act = _cfg_get(c, m, "activation_function", "relu")
        if act != "relu":
            raise _unsupported(m, "activation_function", act, "OPT's ReLU MLP (V21) only")
        if _cfg_float(c, m, "layerdrop", 0.0) != 0.0:
            raise _unsupported(m, "layerdrop", c["layerdrop"], "every layer runs (0 only)")
        return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"),
                    L=_cfg_int(c, m, "num_hidden_layers"), H=H, d_e=d, d_mlp=_cfg_int(c, m, "ffn_dim"),
                    mlp="relu", bias=_cfg_bool(c, m, "enable_bias", True), eps=1e-5,  # nn.LayerNorm's default
                    tied=_cfg_bool(c, m, "tie_word_embeddings", True),
                    attn_dropout=_cfg_rate(c, m, "attention_dropout", 0.0), resid_dropout=_cfg_rate(c, m, "dropout", 0.1))

    def expected(self, hp, head):
        d, V, mm = hp["d_e"], hp["n_vocab"], hp["d_mlp"]
        shape = {"W_e": (V, d), "W_u": (V, d), "attn.W_q": (d, d), "attn.W_k": (d, d), "attn.W_v": (d, d),
                 "attn.W_o": (d, d), "W_mlp1": (mm, d), "b_mlp1": (mm,), "W_mlp2": (d, mm)}
        e = {a: shape.get(b.split(".", 2)[-1] if b.startswith("layers.") else b, (d,)) for a, b, _ in tensor_table(hp, head)}
        e["decoder.embed_positions.weight"] = (hp["l_max"] + OFFSET, d)
        return e

    def to_ft(self, hp, T, head):
        p = _table_to_ft(tensor_table(hp, head), T, hp)
        p["W_p"] = T["decoder.embed_positions.weight"][OFFSET:].T  # token t reads row t + 2
        return p

    def takes(self, model, cfg):
        return cfg.get("arch") == "DTransformer" and cfg.get("mlp") == "relu"

    def export(self, cfg, P):
        cfg, rates = _split_rates(cfg)
        if rates["embed_dropout"]:
            raise ValueError(f"OPT has no equivalent of embed_dropout={rates['embed_dropout']!r} (it drops no "
                             "embeddings; dropout = resid_dropout)")
        _export_requires("OPT", cfg, dict(positional="learned", norm="layer", mlp="relu"), "OPTForCausalLM")
        _export_heads_split_d_e("OPT", cfg)
        _export_all_kv_heads("OPT", cfg)
        if cfg["eps"] != 1e-5:
            raise ValueError(f"OPT has no equivalent of eps={cfg['eps']!r} (its layer_norms use 1e-5)")
        hf = {"model_type": "opt", "architectures": ["OPTForCausalLM"], "vocab_size": cfg["n_vocab"],
              "hidden_size": cfg["d_e"], "word_embed_proj_dim": cfg["d_e"], "num_hidden_layers": cfg["L"],
              "num_attention_heads": cfg["H"], "ffn_dim": cfg["d_mlp"], "max_position_embeddings": cfg["l_max"],
              "do_layer_norm_before": True, "activation_function": "relu", "enable_bias": bool(cfg["bias"]),
              "layer_norm_elementwise_affine": True, "dropout": rates["resid_dropout"],
              "attention_dropout": rates["attn_dropout"], "layerdrop": 0.0, "tie_word_embeddings": cfg["tied"],
              "init_std": cfg["init_std"], "pad_token_id": None, "bos_token_id": cfg["n_vocab"] - 2,
              "eos_token_id": cfg["n_vocab"] - 1, "use_cache": True, "dtype": cfg["dtype"]}
        t = {("" if a == "lm_head.weight" else "model.") + a: v for a, v in _table_from_ft(tensor_table(cfg, True), P).items()}
        W_p = P["W_p"].T
        t["model.decoder.embed_positions.weight"] = np.concatenate([np.zeros((OFFSET, W_p.shape[1]), W_p.dtype), W_p])
        return "OPTForCausalLM", hf, t
