"""BERT (BertForMaskedLM / BertModel) <-> ETransformer: Algorithm 9 with its BERT options (n_segments, embed_norm,
unembed_bias; post-LN):

    embeddings.{word,position,token_type}_embeddings = W_eᵀ, W_pᵀ, W_sᵀ; embeddings.LayerNorm = γ_e, β_e;
    encoder.layer.l.attention.self.{query,key,value} = W_q, W_k, W_v (H blocks of d_e/H rows) and biases;
    attention.output.dense = W_o, b_o; attention.output.LayerNorm = γ_l¹, β_l¹; intermediate.dense = W_mlp1, b_mlp1;
    output.dense = W_mlp2, b_mlp2; output.LayerNorm = γ_l², β_l²; BertForMaskedLM's head
    cls.predictions.transform.dense = W_f, b_f (line 10), transform.LayerNorm = γ, β (line 11), decoder = W_u
    (tied: W_eᵀ) with its bias = b_u (line 12; cls.predictions.decoder.bias, which HF ties to cls.predictions.bias
    unless the head is untied).
BERT's last_hidden_state is model.hidden(x) (X after line 9). A BertModel has no MLM head: W_f, b_f, γ, β keep the
model's initialisation and b_u = 0 (its pooler, a tanh layer over the first token, is not part of the paper's model
and is not read). HF's BERT embedding has padding_idx = pad_token_id, which keeps that row of W_e out of the
embedding gradient; ft has no padding token. to_hf writes pad_token_id = None."""
from __future__ import annotations

import numpy as np

from ._common import (_HF_OF_GELU, _cfg_bool, _cfg_float, _cfg_get, _cfg_int, _cfg_rate, _encoder_shapes,
                      _export_all_kv_heads, _export_heads_split_d_e, _gelu_of, _layered_table, _require, _split_rates,
                      _table_from_ft, _table_to_ft, _unsupported, _width_and_heads)
from ._registry import Converter, register

LAYER = (  # (HF name in encoder.layer.l., ft name in layers.l., how: "H" split into heads, "T" transposed)
    ("attention.self.query.weight", "attn.W_q", "H"), ("attention.self.query.bias", "attn.b_q", "H"),
    ("attention.self.key.weight", "attn.W_k", "H"), ("attention.self.key.bias", "attn.b_k", "H"),
    ("attention.self.value.weight", "attn.W_v", "H"), ("attention.self.value.bias", "attn.b_v", "H"),
    ("attention.output.dense.weight", "attn.W_o", ""), ("attention.output.dense.bias", "attn.b_o", ""),
    ("attention.output.LayerNorm.weight", "gamma1", ""), ("attention.output.LayerNorm.bias", "beta1", ""),
    ("intermediate.dense.weight", "W_mlp1", ""), ("intermediate.dense.bias", "b_mlp1", ""),
    ("output.dense.weight", "W_mlp2", ""), ("output.dense.bias", "b_mlp2", ""),
    ("output.LayerNorm.weight", "gamma2", ""), ("output.LayerNorm.bias", "beta2", ""),
)
EMB = (("embeddings.word_embeddings.weight", "W_e", "T"), ("embeddings.position_embeddings.weight", "W_p", "T"),
       ("embeddings.token_type_embeddings.weight", "W_s", "T"), ("embeddings.LayerNorm.weight", "gamma_e", ""),
       ("embeddings.LayerNorm.bias", "beta_e", ""))
HEAD = (("cls.predictions.transform.dense.weight", "W_f", ""), ("cls.predictions.transform.dense.bias", "b_f", ""),
        ("cls.predictions.transform.LayerNorm.weight", "gamma", ""),
        ("cls.predictions.transform.LayerNorm.bias", "beta", ""), ("cls.predictions.bias", "b_u", ""))


def tensor_table(hp: dict, head: bool) -> list:
    """(HF name, ft name, how) of every tensor of the body (and the MLM head)."""
    return _layered_table(hp, EMB, "encoder.layer.{}.", LAYER, HEAD if head else (),
                          "cls.predictions.decoder.weight" if head else None)


@register
class BERT(Converter):
    name = "BERT"
    arch = "ETransformer"
    classes = {"BertForMaskedLM": (True, "bert."), "BertModel": (False, "")}
    model_type = "bert"
    layers = ("encoder.layer.", "num_hidden_layers")
    embedding = "embeddings.word_embeddings.weight"
    head = "cls.predictions.decoder.weight"
    maps = frozenset({"n_vocab", "l_max", "L", "H", "d_e", "d_mlp", "d_f", "d_attn", "d_mid", "H_kv", "positional",
                      "gelu", "eps", "tied", "seed", "init_std", "attention_impl", "embed_dropout", "attn_dropout",
                      "resid_dropout", "n_segments", "embed_norm", "unembed_bias"})

    def class_of(self, config, T, class_names):
        if config.get("model_type") != self.model_type:
            return None
        return "BertForMaskedLM" if any(k.startswith("cls.predictions.") for k in T) else "BertModel"

    def hyper(self, c):
        m = self.name
        pos = _cfg_get(c, m, "position_embedding_type", "absolute")
        if pos != "absolute":
            raise _unsupported(m, "position_embedding_type", pos, "only learned absolute positions (Algorithm 2)")
        _require(c, m, "is_decoder", False, "ETransformer is bidirectional (Mask ≡ 1)")
        _require(c, m, "add_cross_attention", False, "ETransformer has no cross-attention")
        d, H = _width_and_heads(c, m, "hidden_size", "num_attention_heads")
        n_seg = _cfg_int(c, m, "type_vocab_size", 2, lo=0)
        if n_seg < 1:
            raise _unsupported(m, "type_vocab_size", n_seg, "BERT adds a token-type embedding to every token")
        hidden_rate = _cfg_rate(c, m, "hidden_dropout_prob", 0.1)
        return dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"),
                    L=_cfg_int(c, m, "num_hidden_layers"), H=H, d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"), d_f=d,
                    gelu=_gelu_of(m, "hidden_act", _cfg_get(c, m, "hidden_act", "gelu")),
                    eps=_cfg_float(c, m, "layer_norm_eps", 1e-12),
                    tied=_cfg_bool(c, m, "tie_word_embeddings", True), n_segments=n_seg, embed_norm=True,
                    unembed_bias=True,
                    # BERT's hidden dropout acts after its embedding layer_norm and on each sublayer's output
                    embed_dropout=hidden_rate, resid_dropout=hidden_rate,
                    attn_dropout=_cfg_rate(c, m, "attention_probs_dropout_prob", 0.1))

    def prepare(self, hp, T, head):
        T = super().prepare(hp, T, head)
        if head and "cls.predictions.decoder.bias" in T:
            # the bias the decoder adds (HF ties it to cls.predictions.bias unless the head is untied)
            T["cls.predictions.bias"] = T.pop("cls.predictions.decoder.bias")
        return T

    def expected(self, hp, head):
        return _encoder_shapes(hp, tensor_table(hp, head))

    def to_ft(self, hp, T, head):
        return _table_to_ft(tensor_table(hp, head), T, hp)

    def takes(self, model, cfg):
        from .distilbert import is_distilbert  # without segments, with eps 1e-12: DistilBERT's

        return cfg.get("arch") == "ETransformer" and not is_distilbert(cfg)

    def export(self, cfg, P):
        cfg, rates = _split_rates(cfg)
        if cfg.get("positional") != "learned":
            raise ValueError(f"BERT has no equivalent of positional={cfg.get('positional')!r} (learned positions only)")
        _export_heads_split_d_e("BERT", cfg)
        _export_all_kv_heads("BERT", cfg)
        if not cfg.get("embed_norm"):
            raise ValueError("BERT has no equivalent of embed_norm=False: it always normalises its embeddings")
        if cfg["d_f"] != cfg["d_e"]:
            raise ValueError(f"BERT needs d_f = d_e (its head's dense layer is d_e × d_e), got d_f={cfg['d_f']}")
        if rates["embed_dropout"] != rates["resid_dropout"]:
            raise ValueError("BERT has one hidden_dropout_prob for its embeddings and its sublayer outputs: "
                             f"embed_dropout={rates['embed_dropout']!r} and resid_dropout={rates['resid_dropout']!r} differ")
        hf = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": cfg["n_vocab"],
              "hidden_size": cfg["d_e"], "num_hidden_layers": cfg["L"], "num_attention_heads": cfg["H"],
              "intermediate_size": cfg["d_mlp"], "hidden_act": _HF_OF_GELU[cfg["gelu"]],
              "hidden_dropout_prob": rates["resid_dropout"], "attention_probs_dropout_prob": rates["attn_dropout"],
              "max_position_embeddings": cfg["l_max"], "type_vocab_size": max(cfg.get("n_segments", 0), 1),
              "layer_norm_eps": cfg["eps"], "pad_token_id": None, "position_embedding_type": "absolute",
              "tie_word_embeddings": cfg["tied"], "initializer_range": cfg["init_std"], "dtype": cfg["dtype"]}
        hp = dict(cfg, n_segments=max(cfg.get("n_segments", 0), 1))
        P = dict(P)
        P.setdefault("W_s", np.zeros((hp["d_e"], 1), dtype=P["W_e"].dtype))  # n_segments = 0: one segment of zeros
        P.setdefault("b_u", np.zeros((cfg["n_vocab"],), dtype=P["W_e"].dtype))  # no b_u: zeros (the same function)
        t = {("bert." if a.startswith(("embeddings", "encoder")) else "") + a: v
             for a, v in _table_from_ft(tensor_table(hp, True), P).items()}
        if not cfg["tied"]:  # untied, HF's decoder keeps its own bias (the one it adds)
            t["cls.predictions.decoder.bias"] = t["cls.predictions.bias"]
        return "BertForMaskedLM", hf, t
