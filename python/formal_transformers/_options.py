"""Which model options an export (ft.to_hf, ft.save_hf, ft.to_torch) maps: the rest must be at their listing
defaults. Its own module so that hf.py and _torch.py both use it without importing each other."""
from __future__ import annotations

_KNOWN = {"arch", "n_vocab", "l_max", "L", "L_enc", "L_dec", "H", "d_e", "d_mlp", "d_f", "d_attn", "d_mid", "norm",
          "positional", "base", "tied", "gelu", "eps", "seed", "init_std", "dtype", "n_segments", "embed_norm",
          "unembed_bias", "rope_theta", "relative_buckets", "relative_max_distance",
          "attention_impl"}  # rope_theta acts only with positional="rope" (the LLaMA path), relative_* only with
# positional="relative" (refused by the exports through `positional`); attention_impl: how, not what


def _check_options(cfg: dict, target: str) -> None:
    """Options beyond the ones this module maps (the decoder variants' names of docs/api.md, or later ones)
    must be at their listing defaults."""
    if cfg.get("bias", True) is False:
        raise ValueError(f"{target} has no equivalent of the option bias=False")
    if cfg.get("H_kv") not in (None, 0, cfg.get("H")):
        raise ValueError(f"{target} has no equivalent of the option H_kv={cfg['H_kv']!r} (grouped-query attention)")
    if cfg.get("arch") == "EDTransformer" and cfg.get("norm", "layer") != "layer":
        raise ValueError(f"{target} has no equivalent of the option norm={cfg['norm']!r} for an EDTransformer")
    for k, v in cfg.items():
        if k in ("bias", "H_kv") or k in _KNOWN:
            continue
        if k == "mlp" and v in (None, "", "gelu", "mlp", "default"):
            continue
        if k == "mlp" and v == "relu" and cfg.get("arch") == "EDTransformer":
            continue  # Algorithm 8's MLP (ED's default)
        if k == "scale_scores":
            if v is True:
                continue  # V18's option at its default (Algorithm 4's 1/√d_attn)
            raise ValueError(f"{target} has no equivalent of the option scale_scores={v!r} (scores without 1/√d_attn)")
        if k == "mask" and v in (None, "", "causal"):
            continue
        if k == "attention" and v == "softmax":
            continue
        if k in ("n_features", "feature_seed") and cfg.get("attention", "softmax") == "softmax":
            continue  # V15's options act only with attention='performer' or 'rfa'
        if k == "mtp_weight" and not cfg.get("mtp_depth"):
            continue  # V16's weight acts only with mtp_depth > 0 (refused below as any other option)
        if k in ("block_size", "window_blocks", "n_global_blocks", "n_random_blocks", "layout_seed", "bigbird_draw") and \
                cfg.get("attention", "softmax") != "bigbird":
            continue  # V17's options act only with attention='bigbird'
        if k == "attention":
            kind = "block-sparse attention" if v == "bigbird" else "random-feature attention"
            raise ValueError(f"{target} has no equivalent of the option attention={v!r} ({kind})")
        if v not in (None, False, 0, "", "none"):
            raise ValueError(f"{target} has no equivalent of the option {k}={v!r}")
