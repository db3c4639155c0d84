"""What every converter of formal_transformers.hf uses: reading HF config values (every value a mapping uses has
its type and range checked first: ValueError naming the key, never a ZeroDivisionError, OverflowError or KeyError
from a hostile config.json), the head-split reshapes, the dropout rates of an export."""
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


def _torch_dtype(name):
    import torch

    return getattr(torch, name)
