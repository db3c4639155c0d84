"""BigBird (BigBirdForMaskedLM / BigBirdModel) -> ETransformer: BERT's tensors and names (bert.py's table),
attention_type "block_sparse" as attention="bigbird" (docs/variants.md V17: w = 3, g = 1, r = num_random_blocks,
b = block_size) with HF's own per-head random layouts installed for the lengths of from_hf's bigbird_lengths (the
draw of the mode the HF model is in; eval mode puts every random block at block 0: a repeated block, weighed once
per occurrence as HF gathers it, V17b's multiset note); "original_full" as BERT. Import only: an ETransformer
exports as BERT."""
from __future__ import annotations

import numpy as np

from ._common import _cfg_bool, _cfg_float, _cfg_get, _cfg_int, _cfg_rate, _gelu_of, _require, _shown, _unsupported, \
    _width_and_heads
from ._registry import build, register, state_arrays
from .bert import BERT


@register
class BigBird(BERT):
    name = "BigBird"
    classes = {"BigBirdForMaskedLM": (True, "bert."), "BigBirdModel": (False, "")}
    model_type = "big_bird"

    def class_of(self, config, T, class_names):
        return None  # a directory names its class

    def hyper(self, c):
        """BERT's tensors and post-LN layers; attention_type "block_sparse" is V17 with w = 3, g = 1 and
        r = num_random_blocks in blocks of block_size ("original_full": Algorithm 9's full attention). HF's
        block-sparse attention drops no weights (attention_probs_dropout_prob acts in "original_full" only) and HF
        drops its embeddings before their LayerNorm, a place ft has no dropout site for: embed_dropout is left 0
        there (training-time only; the function is the same)."""
        m = self.name
        _require(c, m, "is_decoder", False, "ETransformer is bidirectional")
        _require(c, m, "add_cross_attention", False, "ETransformer has no cross-attention")
        _require(c, m, "use_bias", True, "BERT's layers have biases")
        _require(c, m, "rescale_embeddings", False, "Algorithm 9 adds W_e[:, x[t]] unscaled")
        kind = _cfg_get(c, m, "attention_type", "block_sparse")
        if kind not in ("block_sparse", "original_full"):
            raise _unsupported(m, "attention_type", kind, "'block_sparse' (V17) or 'original_full'")
        d, H = _width_and_heads(c, m, "hidden_size", "num_attention_heads")
        n_seg = _cfg_int(c, m, "type_vocab_size", 2, lo=1)
        hidden_rate = _cfg_rate(c, m, "hidden_dropout_prob", 0.1)
        hp = dict(n_vocab=_cfg_int(c, m, "vocab_size"), l_max=_cfg_int(c, m, "max_position_embeddings"),
                  L=_cfg_int(c, m, "num_hidden_layers"), H=H, d_e=d, d_mlp=_cfg_int(c, m, "intermediate_size"), d_f=d,
                  gelu=_gelu_of(m, "hidden_act", _cfg_get(c, m, "hidden_act", "gelu_new")),
                  eps=_cfg_float(c, m, "layer_norm_eps", 1e-12), tied=_cfg_bool(c, m, "tie_word_embeddings", True),
                  n_segments=n_seg, embed_norm=True, unembed_bias=True, embed_dropout=0.0, resid_dropout=hidden_rate,
                  attn_dropout=0.0)
        if kind == "original_full":
            hp["attn_dropout"] = _cfg_rate(c, m, "attention_probs_dropout_prob", 0.1)
        else:
            hp.update(attention="bigbird", block_size=_cfg_int(c, m, "block_size", 64), window_blocks=3,
                      n_global_blocks=1, n_random_blocks=_cfg_int(c, m, "num_random_blocks", 3, lo=0))
        return hp

    def refuse_file(self, config, cls_name, where):
        if config.get("attention_type", "block_sparse") == "block_sparse":
            raise ValueError(f"{where}: a block_sparse BigBird draws its random layouts with its own code: load it "
                             "with transformers and use ft.from_hf(model, bigbird_lengths=[…]) (docs/variants.md V17)")

    def from_model(self, hf_model, cls_name, dtype, bigbird_lengths=()):
        config = hf_model.config.to_dict()
        # the attention HF runs now (it falls back to original_full for short inputs)
        config["attention_type"] = getattr(getattr(hf_model, "bert", hf_model), "attention_type",
                                           config.get("attention_type"))
        lengths = [bigbird_lengths] if isinstance(bigbird_lengths, (int, np.integer)) else list(bigbird_lengths)
        if lengths and config.get("attention_type") != "block_sparse":
            raise ValueError(f"bigbird_lengths: {cls_name} is not a BigBird with attention_type='block_sparse'")
        layouts = [hf_layouts(hf_model, l) for l in lengths]  # every one checked before a model is made
        model = build(cls_name, config, state_arrays(hf_model), dtype, cls_name)
        for lay in layouts:
            model.set_bigbird_layouts(lay)
        return model

    def takes(self, model, cfg):
        return False  # an ETransformer exports as BERT


def hf_layouts(hf_model, l) -> np.ndarray:
    """The block layouts (L, H, n, n) a BigBird block-sparse model draws for sequences of ℓ tokens in the mode
    each layer is in: in training mode each layer's BigBirdBlockSparseAttention seeds numpy with its seed (the
    layer index) and draws every head's random blocks with its own methods, called here as its
    bigbird_block_sparse_attention calls them (transformers 5.x; numpy's global state is restored after); in
    eval mode those methods return every random block as block 0. Query block i of head h then reads blocks
    i − 1, i, i + 1, 0, n − 1 and the random blocks of row i (rows 0 and n − 1 read everything), as uint8
    multiplicities: HF gathers a random block that repeats another random block or one of the window and global
    blocks (its "old plans" at ℓ ∈ {1024, 3072, 4096} can) once per occurrence, so it weighs m·exp(s) in the
    softmax (docs/variants.md V17b's multiset note). ValueError if HF would not run block-sparse at ℓ."""
    c = hf_model.config
    b, r, H = int(c.block_size), int(c.num_random_blocks), int(c.num_attention_heads)
    if isinstance(l, bool) or not isinstance(l, (int, np.integer)):
        raise TypeError(f"bigbird_lengths: a sequence length must be an integer, got {_shown(l)}")
    l = int(l)
    if l % b:
        raise ValueError(f"BigBird layouts: block_size = {b} does not divide the sequence length {l}")
    if l <= (5 + 2 * r) * b:
        raise ValueError(f"BigBird layouts: at ℓ = {l} ≤ (5 + 2·num_random_blocks)·block_size = {(5 + 2 * r) * b} "
                         "Hugging Face runs full attention (original_full), not block_sparse")
    n = l // b
    base = getattr(hf_model, "bert", hf_model)
    out = np.zeros((len(base.encoder.layer), H, n, n), dtype=np.uint8)
    state = np.random.get_state()
    try:
        for li, layer in enumerate(base.encoder.layer):
            att = layer.attention.self  # its own mode (eval: every random block is block 0, a repeat)
            np.random.seed(att.seed)
            if l in (1024, 3072, 4096):  # HF's "old plans used in paper"
                rand = [att._bigbird_block_rand_mask(att.max_seqlen, att.max_seqlen, b, b, r, last_idx=1024)[: n - 2]
                        for _ in range(H)]
            else:
                plan, plan_r = att._get_rand_attn_plan(l, b, r)
                rand = att._bigbird_block_rand_mask_with_head(
                    from_seq_length=l, to_seq_length=l, from_block_size=b, to_block_size=b, num_heads=H,
                    plan_from_length=plan, plan_num_rand_blocks=plan_r)
            for h in range(H):
                out[li, h, :, 0] = out[li, h, :, n - 1] = 1
                for i in range(1, n - 1):
                    # the window and global blocks once each (distinct for 1 ≤ i ≤ n − 2), then every random draw
                    for j in [*sorted({i - 1, i, i + 1, 0, n - 1}), *(int(j) for j in np.asarray(rand[h])[i - 1])]:
                        out[li, h, j, i] += 1
    finally:
        np.random.set_state(state)
    return out

