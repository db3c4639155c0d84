"""Saving and loading models (safetensors) — θ with the hyperparameters that rebuild the model.

    ft.save(model, "model.safetensors")
    model = ft.load("model.safetensors")

The file holds one tensor per parameter (the names of `model.params`, row-major copies) and, in its
metadata, the model's config as the core writes it (ModelConfig.to_json, with the dtype) under
"formal_transformers.config", the dropout counter `model.dropout_step` and seed `model.dropout_seed`, plus a
format version, and for an ETransformer with given BigBird layouts (set_bigbird_layouts, ft.from_hf)
"formal_transformers.bigbird_layouts" (model.bigbird_layouts_json(): every given length, layer and head).
The reader and the writer are the core's (cpp/include/formal_transformers/io.hpp: the same for C++'s ft::save and
ft::load): writes are atomic; files written by other programs, or damaged ones, raise ValueError naming the file
and the problem.
"""
from __future__ import annotations

import errno
import os
import tempfile
from typing import Union

import numpy as np

from . import _core

__all__ = ["save", "load", "build_model"]

FORMAT = "1"  # the format version the core writes and reads (io.hpp)
LAYOUTS = "formal_transformers.bigbird_layouts"  # io.hpp's kBigBirdLayoutsKey
_ARCHS = {"DTransformer": _core.DTransformer, "ETransformer": _core.ETransformer, "EDTransformer": _core.EDTransformer}


def build_model(config: Union[dict, str], *, dtype: str | None = None):
    """The one way every front-end makes a model from its hyperparameters: `config` is a dict (model.config)
    or its JSON text, {"arch": "DTransformer" | "ETransformer" | "EDTransformer", option: value, …} (the core's
    ModelConfig.to_json; a missing option takes its default), dtype (if given) replaces config's. θ is
    initialised from config's seed. The core checks every name, type and value (TypeError / ValueError)."""
    if isinstance(config, str):
        config = _core._parse_json(config, "model config")  # the core's bounded parse: ValueError, never RecursionError
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict or its JSON text, got {type(config).__name__}")
    options = dict(config)
    arch = options.pop("arch", None)
    if arch not in _ARCHS:
        raise ValueError(f"config['arch'] must be one of {', '.join(_ARCHS)}, got {arch!r}")
    if dtype is not None:
        options["dtype"] = dtype
    return _ARCHS[arch](**options)


def _existing(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    return path


def _temp_beside(path: str) -> str:
    """A new, uniquely named empty file in `path`'s folder (two processes writing one path never share a temporary),
    to be renamed over `path` with os.replace once complete. (For the files written in Python: a run's run.json,
    tokenizer.json and optimizer state, save_hf's folder; model files and prompt caches are the core's.)"""
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    return tmp


def _replace_atomically(path, write) -> None:
    """write(tmp) into a unique temporary beside `path`, then os.replace: `path` holds the old file or the new
    one, never a partial one; the temporary is removed on any failure."""
    path = os.fspath(path)
    tmp = _temp_beside(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def save(model, path: Union[str, os.PathLike], *, metadata: dict | None = None) -> None:
    """Write model's parameters and hyperparameters to `path` (safetensors). `metadata`: extra str -> str."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    for k, v in meta.items():
        try:
            k.encode("utf-8"), v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"metadata {k!r}: {v!r} is not text a file can hold (a lone surrogate)") from None
    _core._save_model(model, os.fspath(path), meta)


def read_metadata(path: Union[str, os.PathLike]) -> dict:
    """The metadata of a saved file (str -> str)."""
    return _core._read_metadata(_existing(path))


def check_precision(precision, dtype=None) -> str:
    """precision= of the models, ft.load and ft.from_hf: 'float32' or 'bf16-mixed' (bf16 products, float32
    accumulation and master weights; float32 models only). TypeError / ValueError before anything is built."""
    if not isinstance(precision, str):
        raise TypeError(f"precision must be a str, 'float32' or 'bf16-mixed', got {type(precision).__name__}")
    if precision not in ("float32", "bf16-mixed"):
        raise ValueError(f"precision must be 'float32' or 'bf16-mixed', got {precision!r}")
    if precision == "bf16-mixed" and dtype is not None and np.dtype(dtype) != np.float32:
        raise ValueError("precision 'bf16-mixed' is for float32 models: dtype float64 computes in float64")
    return precision


def load(path: Union[str, os.PathLike], *, dtype: str | None = None, precision: str = "float32"):
    """Rebuild the model saved at `path` (optionally in another dtype) with its parameters. precision: how the
    rebuilt model's products run ('float32', or 'bf16-mixed' for a float32 model; not stored in the file: θ is
    float32 either way). An option of a part the file's config does not choose, at another value than its default
    (a file of an older version, or edited; it had no effect on the outputs), loads at its default with a
    UserWarning naming the file, the option and its part."""
    if dtype is not None:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
        if name not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64 (or None: as saved), got {dtype!r}")
        dtype = name
    check_precision(precision, dtype)
    model = _core._load_model(_existing(path), dtype)
    if precision != "float32":
        model.precision = precision  # ValueError for a float64 file loaded without dtype="float32"
    return model


def kv_cache_bytes_per_token(model) -> int:
    """The bytes a DTransformer's decoding cache (DInference, the KV cache) keeps per token, over all layers:
    L · H_kv · (d_attn + d_mid) numbers (K and V; H_kv = H: multi-head, < H: grouped-query attention), or with
    latent attention (kv_lora_rank, docs/variants.md V10) L · (kv_lora_rank + qk_rope_head_dim) (Ĉ_KV and K_R),
    times the size of the model's dtype."""
    c = model.config
    if c.get("arch") != "DTransformer":
        raise ValueError(f"kv_cache_bytes_per_token takes a DTransformer, got {c.get('arch')}")
    item = 4 if c.get("dtype", "float32") == "float32" else 8
    if c.get("kv_lora_rank"):
        rows = c["kv_lora_rank"] + c["qk_rope_head_dim"]
    else:
        rows = c["H_kv"] * (c["d_attn"] + c["d_mid"])
    return int(c["L"] * rows * item)
