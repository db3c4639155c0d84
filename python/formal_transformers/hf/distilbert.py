"""DistilBERT (DistilBertForMaskedLM / DistilBertModel, Sanh et al. 2019) <-> ETransformer: Algorithm 9 without
segment embeddings (n_segments = 0), with BERT's embed_norm and unembed_bias, under DistilBERT's own names:

    embeddings.{word,position}_embeddings = W_eᵀ, W_pᵀ; embeddings.LayerNorm = γ_e, β_e;
    transformer.layer.l.attention.{q,k,v}_lin = W_q, W_k, W_v (H blocks of dim/H rows) and biases; attention.out_lin
    = W_o, b_o; sa_layer_norm = γ_l¹, β_l¹ (line 6); ffn.lin1 = W_mlp1, b_mlp1; ffn.lin2 = W_mlp2, b_mlp2 (line 7);
    output_layer_norm = γ_l², β_l² (line 8); DistilBertForMaskedLM's vocab_transform = W_f, b_f (line 10),
    vocab_layer_norm = γ, β (line 11), vocab_projector = W_u (tied: W_eᵀ) with its bias b_u (line 12).
Every layer norm of DistilBERT has eps 1e-12 (fixed in its code): ft's eps = 1e-12. The activation (config
"activation") is the MLP's and the head's, as ft's gelu. DistilBertModel has no MLM head: W_f, b_f, γ, β keep the
model's initialisation and b_u = 0. DistilBERT drops after its embedding norm and after each MLP (dropout) and on the
attention weights (attention_dropout), but not after the attention's out_lin, which ft's resid_dropout also drops:
from_hf maps embed_dropout = dropout and attn_dropout = attention_dropout and leaves resid_dropout 0 (training only;
the function is the same); to_hf refuses resid_dropout ≠ 0. sinusoidal_pos_embds=True (a frozen sinusoidal table in
position_embeddings) is refused by name; HF's padding_idx (pad_token_id) keeps that row of W_e out of HF's
gradient, ft has no padding token (to_hf writes pad_token_id = None)."""
from __future__ import annotations

import numpy as np

from ._common import (_HF_OF_GELU, _cfg_bool, _cfg_get, _cfg_int, _cfg_rate, _encoder_shapes, _export_all_kv_heads,
                      _export_heads_split_d_e, _gelu_of, _layered_table, _split_rates, _table_from_ft, _table_to_ft,
                      _unsupported, _width_and_heads)
from ._registry import Converter, register
from .bert import BERT

LAYER = (  # (HF name in transformer.layer.l., ft name in layers.l., how: "H" split into heads)
    ("attention.q_lin.weight", "attn.W_q", "H"), ("attention.q_lin.bias", "attn.b_q", "H"),
    ("attention.k_lin.weight", "attn.W_k", "H"), ("attention.k_lin.bias", "attn.b_k", "H"),
    ("attention.v_lin.weight", "attn.W_v", "H"), ("attention.v_lin.bias", "attn.b_v", "H"),
    ("attention.out_lin.weight", "attn.W_o", ""), ("attention.out_lin.bias", "attn.b_o", ""),
    ("sa_layer_norm.weight", "gamma1", ""), ("sa_layer_norm.bias", "beta1", ""),
    ("ffn.lin1.weight", "W_mlp1", ""), ("ffn.lin1.bias", "b_mlp1", ""),
    ("ffn.lin2.weight", "W_mlp2", ""), ("ffn.lin2.bias", "b_mlp2", ""),
    ("output_layer_norm.weight", "gamma2", ""), ("output_layer_norm.bias", "beta2", ""),
)
EMB = (("embeddings.word_embeddings.weight", "W_e", "T"), ("embeddings.position_embeddings.weight", "W_p", "T"),
       ("embeddings.LayerNorm.weight", "gamma_e", ""), ("embeddings.LayerNorm.bias", "beta_e", ""))
HEAD = (("vocab_transform.weight", "W_f", ""), ("vocab_transform.bias", "b_f", ""),
        ("vocab_layer_norm.weight", "gamma", ""), ("vocab_layer_norm.bias", "beta", ""),
        ("vocab_projector.bias", "b_u", ""))
EPS = 1e-12  # DistilBERT's LayerNorms (fixed in its code)


def is_distilbert(cfg: dict) -> bool:
    """An ETransformer that exports as DistilBERT (else as BERT): no segment embeddings, embed_norm, eps 1e-12."""
    return (cfg.get("arch") == "ETransformer" and not cfg.get("n_segments") and bool(cfg.get("embed_norm"))
            and cfg.get("eps") == EPS)


def tensor_table(hp: dict, head: bool) -> list:
    """(HF name, ft name, how) of every tensor of the body (under distilbert.) and the MLM head."""
    return _layered_table(hp, [("distilbert." + a, b, k) for a, b, k in EMB], "distilbert.transformer.layer.{}.", LAYER,
                          HEAD if head else (), "vocab_projector.weight" if head else None)


@register
class DistilBERT(Converter):
    name = "DistilBERT"
    arch = "ETransformer"
    classes = {"DistilBertForMaskedLM": (True, ""), "DistilBertModel": (False, "")}
    model_type = "distilbert"
    layers = ("distilbert.transformer.layer.", "n_layers")
    embedding = "distilbert.embeddings.word_embeddings.weight"
    head = "vocab_projector.weight"
    maps = BERT.maps  # BERT's options (DistilBERT's are BERT's without segments)

    def hyper(self, c):
        m = self.name
        if _cfg_bool(c, m, "sinusoidal_pos_embds", False):
            raise _unsupported(m, "sinusoidal_pos_embds", True, "only learned positions (Algorithm 2)")
        d, H = _width_and_heads(c, m, "dim", "n_heads")
        return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"),
                    L=_cfg_int(c, m, "n_layers"), H=H, d_e=d, d_mlp=_cfg_int(c, m, "hidden_dim"), d_f=d,
                    gelu=_gelu_of(m, "activation", _cfg_get(c, m, "activation", "gelu")), eps=EPS,
                    tied=_cfg_bool(c, m, "tie_word_embeddings", True), n_segments=0, embed_norm=True,
                    unembed_bias=True, embed_dropout=_cfg_rate(c, m, "dropout", 0.1),
                    attn_dropout=_cfg_rate(c, m, "attention_dropout", 0.1))

    def prepare(self, hp, T, head):
        if not any(k.startswith("distilbert.") for k in T):  # a DistilBertModel's names (no prefix)
            T = {"distilbert." + k: v for k, v in T.items()}
        return super().prepare(hp, T, head)

    def expected(self, hp, head):
        return _encoder_shapes(hp, tensor_table(hp, head))

    def to_ft(self, hp, T, head):
        return _table_to_ft(tensor_table(hp, head), T, hp)

    def takes(self, model, cfg):
        return is_distilbert(cfg)

    def export(self, cfg, P):
        cfg, rates = _split_rates(cfg)
        if cfg.get("positional") != "learned":
            raise ValueError(f"DistilBERT has no equivalent of positional={cfg.get('positional')!r} (learned only)")
        _export_heads_split_d_e("DistilBERT", cfg)
        _export_all_kv_heads("DistilBERT", cfg)
        if cfg["d_f"] != cfg["d_e"]:
            raise ValueError(f"DistilBERT needs d_f = d_e (vocab_transform is dim × dim), got d_f={cfg['d_f']}")
        if rates["resid_dropout"]:
            raise ValueError(f"DistilBERT has no equivalent of resid_dropout={rates['resid_dropout']!r}: it does not drop "
                             "the attention's output (its dropout acts after the embedding norm and the MLP)")
        hf = {"model_type": "distilbert", "architectures": ["DistilBertForMaskedLM"], "vocab_size": cfg["n_vocab"],
              "dim": cfg["d_e"], "n_layers": cfg["L"], "n_heads": cfg["H"], "hidden_dim": cfg["d_mlp"],
              "activation": _HF_OF_GELU[cfg["gelu"]], "dropout": rates["embed_dropout"],
              "attention_dropout": rates["attn_dropout"], "max_position_embeddings": cfg["l_max"],
              "sinusoidal_pos_embds": False, "pad_token_id": None, "tie_word_embeddings": cfg["tied"],
              "initializer_range": cfg["init_std"], "dtype": cfg["dtype"]}
        P = dict(P)
        P.setdefault("b_u", np.zeros((cfg["n_vocab"],), dtype=P["W_e"].dtype))  # no b_u: zeros (the same function)
        return "DistilBertForMaskedLM", hf, _table_from_ft(tensor_table(cfg, True), P)

    def prepare_hf(self, hf, state):
        if "vocab_projector.weight" in state:  # untied: its own W_u
            import torch

            hf.vocab_projector.weight = torch.nn.Parameter(hf.vocab_projector.weight.detach().clone())
