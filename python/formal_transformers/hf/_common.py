"""What every converter of formal_transformers.hf uses: reading HF config values (every value a mapping uses has
its type and range checked first: ValueError naming the key, never a ZeroDivisionError, OverflowError or KeyError
from a hostile config.json; RoPE's parameters), the head-split reshapes and name tables, the dropout rates and the
checks of an export."""
from __future__ import annotations

import json
import os

import numpy as np

_GELU_OF_HF = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
_HF_OF_GELU = {"exact": "gelu", "tanh": "gelu_new"}
_REQUIRED = object()
_MAX_SIZE = 2**31 - 1  # the core's sizes and counts are C++ ints


def _shown(value) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def _bad_value(model: str, key: str, value, want: str) -> ValueError:
    return ValueError(f"{model} config: {key} = {_shown(value)} is not {want}")


def _cfg_get(c: dict, model: str, key: str, default):
    if key in c and c[key] is not None:
        return c[key]
    if default is _REQUIRED:
        raise ValueError(f"{model} config: {key} is missing (a {model} config.json must give it)")
    return default


def _cfg_int(c: dict, model: str, key: str, default=_REQUIRED, lo: int = 1, hi: int = _MAX_SIZE) -> int:
    """An integer option in [lo, hi] (a JSON integer; an integral float such as 12.0 is taken as 12)."""
    v = _cfg_get(c, model, key, default)
    if isinstance(v, float) and np.isfinite(v) and v == int(v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise _bad_value(model, key, v, "an integer")
    if not lo <= v <= hi:
        raise _bad_value(model, key, v, f"an integer in [{lo}, {hi}]")
    return int(v)


def _cfg_float(c: dict, model: str, key: str, default=_REQUIRED, lo: float = 0.0, hi: float = np.inf,
               hi_open: bool = False, lo_open: bool = False) -> float:
    """A finite real option in [lo, hi] (open ends where asked)."""
    v = _cfg_get(c, model, key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise _bad_value(model, key, v, "a number")
    v = float(v)
    if not np.isfinite(v) or v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
        span = ("(" if lo_open else "[") + f"{lo:g}, {hi:g}" + (")" if hi_open or hi == np.inf else "]")
        raise _bad_value(model, key, v, f"a finite number in {span}")
    return v


def _cfg_bool(c: dict, model: str, key: str, default: bool) -> bool:
    v = _cfg_get(c, model, key, default)
    if not isinstance(v, (bool, np.bool_)):
        raise _bad_value(model, key, v, "true or false")
    return bool(v)


def _cfg_str(c: dict, model: str, key: str, default: str) -> str:
    v = _cfg_get(c, model, key, default)
    if not isinstance(v, str):
        raise _bad_value(model, key, v, "a string")
    return v


def _cfg_rate(c: dict, model: str, key: str, default: float) -> float:
    return _cfg_float(c, model, key, default, 0.0, 1.0, hi_open=True)


_CONFIG_BYTES = 16 << 20  # a model's config.json is a few KB; anything this large is not one


def _read_config_json(cfg_file: str) -> dict:
    """config.json as a dict: ValueError (never RecursionError, MemoryError or a decoding error) when the file
    is not a JSON object of sensible size."""
    try:
        size = os.path.getsize(cfg_file)
        if size > _CONFIG_BYTES:
            raise ValueError(f"{size:,} bytes, more than a model config's {_CONFIG_BYTES:,}")
        with open(cfg_file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: deeply nested JSON
        raise ValueError(f"{cfg_file}: not a readable JSON file ({type(e).__name__}: {_shown(str(e))})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{cfg_file}: expected a JSON object, got {type(config).__name__}")
    return config


def _config_class_names(config: dict, where: str) -> list:
    """config.json's "architectures": a list of class names (or absent)."""
    a = config.get("architectures")
    if a is None:
        return []
    if not isinstance(a, list) or not all(isinstance(x, str) for x in a):
        raise ValueError(f"{where}: architectures = {_shown(a)} is not a list of class names")
    return a

# ---------------------------------------------------------------------------------------------------
# HF configurations -> the paper's hyperparameters (ValueError naming any option we cannot express)

def _unsupported(model: str, option: str, value, why: str = "") -> ValueError:
    return ValueError(f"{model} config option {option}={value!r} is not supported{': ' + why if why else ''}")


def _require(c: dict, model: str, option: str, supported: bool, why: str) -> None:
    """A boolean option the layers express at one value only (HF's default): ValueError at the other."""
    if _cfg_bool(c, model, option, supported) != supported:
        raise _unsupported(model, option, not supported, why)


def _width_and_heads(c: dict, model: str, d_option: str, H_option: str) -> tuple:
    """d_e and H, read under the model's names; the heads split d_e evenly (d_attn = d_e / H)."""
    d, H = _cfg_int(c, model, d_option), _cfg_int(c, model, H_option)
    if d % H:
        raise _unsupported(model, H_option, H, f"{d_option} = {d} must be divisible by it")
    return d, H


def _swiglu_unsplit(c: dict, model: str) -> None:
    """LLaMA-family options: SwiGLU (V4) gated with SiLU, the layers unsplit (pretraining_tp = 1)."""
    act = _cfg_get(c, model, "hidden_act", "silu")
    if act != "silu":
        raise _unsupported(model, "hidden_act", act, "SwiGLU (V4) gates with SiLU")
    tp = _cfg_int(c, model, "pretraining_tp", 1)
    if tp != 1:
        raise _unsupported(model, "pretraining_tp", tp, "only the unsplit layers")


def _gelu_of(model: str, option: str, act) -> str:
    if not isinstance(act, str) or act not in _GELU_OF_HF:
        raise _unsupported(model, option, act, "the activation must be one of " + ", ".join(sorted(_GELU_OF_HF)))
    return _GELU_OF_HF[act]


def _rope_parameters(c: dict, model: str) -> tuple:
    """(key, parameters) of V1's rotary embedding as transformers 5 reads a config (RotaryEmbeddingConfigMixin):
    "rope_scaling" when it is set (the older name wins), else "rope_parameters" (absent: {}). Their rope_type (or
    "type") must be "default": scaled variants (linear, dynamic, yarn, llama3, …) change the angles in ways V1 does
    not express and are refused."""
    key = "rope_scaling" if c.get("rope_scaling") else "rope_parameters"
    rp = c.get(key)
    if rp is None:
        rp = {}
    if not isinstance(rp, dict):
        raise _bad_value(model, key, rp, "an object of RoPE parameters")
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind != "default":
        raise _unsupported(model, f"{key}.rope_type", kind, "only the plain rotary embedding of V1 (no scaling)")
    return key, rp


def _rope_float(c: dict, model: str, key: str, rp: dict, name: str, top: str, default: float, **bounds) -> float:
    """A RoPE number: rp[name] when given (named key.name, as the file nests it), else the config's top-level
    option `top`, else default; bounds as _cfg_float's."""
    if rp.get(name) is not None:
        nested = f"{key}.{name}"
        return _cfg_float({nested: rp[name]}, model, nested, **bounds)
    return _cfg_float(c, model, top, default, **bounds)


# ---------------------------------------------------------------------------------------------------
# Tensors

def _split_heads(W, H):  # (H·d_h, d) -> (H, d_h, d);  (H·d_h,) -> (H, d_h)
    return W.reshape(H, W.shape[0] // H, *W.shape[1:])


def _flat(a):  # (H, d_h, …) -> (H·d_h, …)
    return a.reshape(-1, *a.shape[2:])


def _table_to_ft(rows, T: dict, hp: dict) -> dict:
    """A name table's tensors in ft's layout: rows of (HF name, ft name, how: "T" transposed, "" as is, or the
    hp key of the head count the rows are split into)."""
    return {ft: (T[hf].T if how == "T" else _split_heads(T[hf], hp[how]) if how else T[hf]) for hf, ft, how in rows}


def _table_from_ft(rows, P: dict) -> dict:
    """The inverse of _table_to_ft: ft's parameters under the table's HF names."""
    return {hf: (P[ft].T if how == "T" else _flat(P[ft]) if how else P[ft]) for hf, ft, how in rows}


def _drop_stack_embeddings(T: dict, model: str, shared: str = "shared.weight") -> None:
    """An encoder-decoder's stack embeddings (encoder./decoder.embed_tokens.weight) dropped from T as aliases of the
    shared one: ValueError when one differs (transformers embeds that stack's tokens with it; ft's two stacks share
    one W_e)."""
    for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        if k in T:
            if shared in T and not np.array_equal(T[k], T[shared]):
                raise ValueError(f"{model}: tensor {k} differs from {shared}: transformers embeds that stack's "
                                 "tokens with it, and ft's encoder and decoder share one W_e (no equivalent)")
            T.pop(k)


def _layered_table(hp: dict, body, layer_at: str, layer, head=(), untied=None) -> list:
    """A name table of a whole model, rows (HF name, ft name, how): the body's rows (embeddings, final norm), layer
    l's rows with the HF name under layer_at.format(l) and ft's under layers.l., the head's rows, and W_u under the
    HF name `untied` when the model is not tied."""
    rows = list(body)
    for l in range(hp["L"]):
        rows += [(layer_at.format(l) + a, f"layers.{l}." + b, k) for a, b, k in layer]
    rows += list(head)
    if untied and not hp["tied"]:
        rows.append((untied, "W_u", ""))
    return rows


def _encoder_shapes(hp: dict, rows) -> dict:
    """The shape of each HF tensor of an Algorithm 9 encoder's name table (BERT's names on ft's side; d_attn = d_mid
    = d_e / H): {HF name: shape}."""
    d, V, m = hp["d_e"], hp["n_vocab"], hp["d_mlp"]
    shape = {"W_e": (V, d), "W_p": (hp["l_max"], d), "W_s": (hp.get("n_segments", 0), d), "W_f": (d, d),
             "b_u": (V,), "W_u": (V, d)}
    layer = {"attn.W_q": (d, d), "attn.W_k": (d, d), "attn.W_v": (d, d), "attn.W_o": (d, d), "W_mlp1": (m, d),
             "b_mlp1": (m,), "W_mlp2": (d, m)}
    return {a: shape.get(b) or layer.get(b.split(".", 2)[-1], (d,)) for a, b, _ in rows}


_RATES = ("embed_dropout", "attn_dropout", "resid_dropout")


def _split_rates(cfg: dict):
    """(the config without the dropout rates, the rates): the exports map the rates themselves."""
    cfg = dict(cfg)
    return cfg, {k: float(cfg.pop(k, 0.0)) for k in _RATES}


def _only_attention_dropout(model: str, rates: dict) -> None:
    for k in ("embed_dropout", "resid_dropout"):
        if rates[k]:
            raise ValueError(f"{model} has no equivalent of {k}={rates[k]!r}: it drops only its attention weights "
                             "(attention_dropout = attn_dropout)")


# ---------------------------------------------------------------------------------------------------
# Exports: ValueError naming an option of ft's config the HF class cannot express

def _export_requires(model: str, cfg: dict, want: dict, cls: str = "", note: str = "", absent_ok: bool = False) -> None:
    """Each option of `want` at its value (absent_ok: an option the config leaves out counts as at it), else
    "<model> has no equivalent of k=v<note> (<cls>: a='…', b=…)"."""
    for k, w in want.items():
        if (cfg.get(k, w) if absent_ok else cfg.get(k)) != w:
            wants = ", ".join(f"{a}={b!r}" for a, b in want.items())
            raise ValueError(f"{model} has no equivalent of {k}={cfg.get(k)!r}{note} ({cls + ': ' if cls else ''}{wants})")


def _export_causal(model: str, cfg: dict, has: str = "has") -> None:
    if cfg.get("mask", "causal") != "causal":
        raise ValueError(f"{model} {has} no equivalent of mask={cfg['mask']!r} (causal attention only)")


def _export_heads_split_d_e(model: str, cfg: dict) -> None:
    """One head width d_attn = d_mid = d_e / H (the HF class splits its width into the heads)."""
    if cfg["d_attn"] * cfg["H"] != cfg["d_e"] or cfg["d_mid"] * cfg["H"] != cfg["d_e"]:
        raise ValueError(f"{model} needs d_attn = d_mid = d_e / H, got d_attn={cfg['d_attn']}, d_mid={cfg['d_mid']}")


def _export_head_dim(model: str, cfg: dict, name: str = "head_dim") -> None:
    """One head width d_attn = d_mid (the HF config's `name`)."""
    if cfg["d_attn"] != cfg["d_mid"]:
        raise ValueError(f"{model} needs d_attn = d_mid (its {name}), got d_attn={cfg['d_attn']}, d_mid={cfg['d_mid']}")


def _export_all_kv_heads(model: str, cfg: dict) -> None:
    """H_kv = H: the HF class has no grouped-query attention (V3)."""
    if cfg.get("H_kv") not in (None, cfg["H"]):
        raise ValueError(f"{model} has no equivalent of the option H_kv={cfg['H_kv']!r} (grouped-query attention)")


def _torch_dtype(name):
    import torch

    return getattr(torch, name)
