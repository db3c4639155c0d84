"""RoBERTa (RobertaForMaskedLM / RobertaModel) <-> ETransformer: BERT's layers, names and options (bert.py) under
"roberta." and "lm_head.", with padding-offset positions:

    embeddings.position_embeddings = [pad_token_id + 1 rows; W_pᵀ]; lm_head.dense = W_f, b_f;
    lm_head.layer_norm = γ, β; lm_head.decoder = W_u (tied: W_eᵀ) with lm_head.bias = b_u; the rest as BERT.
Positions: RoBERTa numbers a token padding_idx + 1 + (the non-padding tokens before it), padding_idx = pad_token_id
(create_position_ids_from_input_ids), so an unpadded sequence's token t reads row padding_idx + 1 + t: W_p = the
table without its first padding_idx + 1 rows (ℓ_max = max_position_embeddings − padding_idx − 1), exact for every
input that holds no pad_token_id token except as padding (left or right: RoBERTa's positions do not depend on it);
a pad_token_id inside a sequence is padding to RoBERTa and a token to ft. The dropped rows are read only at
padding (whose outputs have no counterpart) and are written as zeros by to_hf (ft → HF → ft is exact). The head's
activation is the exact GELU whatever hidden_act says, so hidden_act must be "gelu". Export: an ETransformer
exports as BERT (the same function) unless asked for hf_class="RobertaForMaskedLM" (pad_token_id 1, bos 0, eos 2,
RoBERTa's; the exported model then equals ft's on inputs without token 1)."""
from __future__ import annotations

import numpy as np

from ._common import _cfg_get, _cfg_int, _layered_table, _table_from_ft, _table_to_ft, _unsupported
from ._registry import register
from .bert import BERT, EMB, LAYER

HEAD = (("lm_head.dense.weight", "W_f", ""), ("lm_head.dense.bias", "b_f", ""), ("lm_head.layer_norm.weight", "gamma", ""),
        ("lm_head.layer_norm.bias", "beta", ""), ("lm_head.bias", "b_u", ""))
_NOT_POS = tuple(r for r in EMB if r[1] != "W_p")


def tensor_table(hp: dict, head: bool) -> list:
    """(HF name, ft name, how) of every tensor but the position table (which to_ft / export slice)."""
    return _layered_table(hp, _NOT_POS, "encoder.layer.{}.", LAYER, HEAD if head else (),
                          "lm_head.decoder.weight" if head else None)


@register
class RoBERTa(BERT):
    name = "RoBERTa"
    classes = {"RobertaForMaskedLM": (True, "roberta."), "RobertaModel": (False, "")}
    model_type = "roberta"
    head = "lm_head.decoder.weight"

    def class_of(self, config, T, class_names):
        if config.get("model_type") != self.model_type:
            return None
        return "RobertaForMaskedLM" if any(k.startswith("lm_head.") for k in T) else "RobertaModel"

    def hyper(self, c):
        m = self.name
        act = _cfg_get(c, m, "hidden_act", "gelu")
        if act != "gelu":
            raise _unsupported(m, "hidden_act", act, "RoBERTa's head applies the exact GELU, so its layers must too")
        pad = _cfg_int(c, m, "pad_token_id", 1, lo=0)
        P = _cfg_int(c, m, "max_position_embeddings", 514)
        if P <= pad + 1:
            raise _unsupported(m, "max_position_embeddings", P, f"the positions start at pad_token_id + 1 = {pad + 1}")
        hp = super().hyper({**c, "max_position_embeddings": P - pad - 1})
        hp["_pad"] = pad  # keys starting with "_" are the converter's, not the model's
        return hp

    def prepare(self, hp, T, head):
        T = super(BERT, self).prepare(hp, T, head)  # the tied alias (Converter.prepare)
        if head and "lm_head.decoder.bias" in T:  # HF ties it to lm_head.bias unless the head is untied
            T["lm_head.bias"] = T.pop("lm_head.decoder.bias")
        return T

    def expected(self, hp, head):
        e = super().expected(hp, False)
        d, V = hp["d_e"], hp["n_vocab"]
        e["embeddings.position_embeddings.weight"] = (hp["l_max"] + hp["_pad"] + 1, d)
        if head:
            e.update({"lm_head.dense.weight": (d, d), "lm_head.dense.bias": (d,), "lm_head.layer_norm.weight": (d,),
                      "lm_head.layer_norm.bias": (d,), "lm_head.bias": (V,)})
            if not hp["tied"]:
                e["lm_head.decoder.weight"] = (V, d)
        return e

    def to_ft(self, hp, T, head):
        p = _table_to_ft(tensor_table(hp, head), T, hp)
        p["W_p"] = T["embeddings.position_embeddings.weight"][hp["_pad"] + 1:].T  # token t reads row pad + 1 + t
        return p

    def takes(self, model, cfg):
        return False  # an ETransformer exports as BERT unless hf_class asks for RoBERTa

    def export(self, cfg, P):
        _, hf, t = super().export(cfg, P)  # BERT's checks and config
        pad = 1
        if cfg["gelu"] != "exact":
            raise ValueError(f"RoBERTa has no equivalent of gelu={cfg['gelu']!r} (its head's GELU is exact)")
        hf = {**hf, "model_type": "roberta", "architectures": ["RobertaForMaskedLM"], "pad_token_id": pad,
              "bos_token_id": 0, "eos_token_id": 2, "max_position_embeddings": cfg["l_max"] + pad + 1}
        hp = dict(cfg, n_segments=max(cfg.get("n_segments", 0), 1))
        P = dict(P)
        P.setdefault("W_s", np.zeros((hp["d_e"], 1), dtype=P["W_e"].dtype))
        P.setdefault("b_u", np.zeros((cfg["n_vocab"],), dtype=P["W_e"].dtype))
        out = {("roberta." if a.startswith(("embeddings", "encoder")) else "") + a: v
               for a, v in _table_from_ft(tensor_table(hp, True), P).items()}
        W_p = P["W_p"].T
        out["roberta.embeddings.position_embeddings.weight"] = np.concatenate(
            [np.zeros((pad + 1, W_p.shape[1]), W_p.dtype), W_p])
        if not cfg["tied"]:
            out["lm_head.decoder.bias"] = out["lm_head.bias"]
        return "RobertaForMaskedLM", hf, out
