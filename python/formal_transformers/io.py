"""Saving and loading models (safetensors) — θ with the hyperparameters that rebuild the model.

    ft.save(model, "model.safetensors")
    model = ft.load("model.safetensors")

The file holds one tensor per parameter (the names of `model.params`, row-major copies) and, in its
metadata, the model's config as the core writes it (ModelConfig.to_json, with the dtype) under
"formal_transformers.config", the
dropout counter `model.dropout_step` and seed `model.dropout_seed`, plus a format version, and for an
ETransformer with given BigBird layouts (set_bigbird_layouts, ft.from_hf) "formal_transformers.bigbird_layouts"
(model.bigbird_layouts_json(): every given length, layer and head). A BigBird config without "bigbird_draw" (a file
written before it existed) loads with bigbird_draw="per_layer", the rule it was drawn with. Files written by other
programs, or damaged ones, raise ValueError naming the problem (the C++ side: io.hpp, the same file).
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Union

import numpy as np

from . import _core

__all__ = ["save", "load", "build_model"]

FORMAT = "1"
LAYOUTS = "formal_transformers.bigbird_layouts"  # io.hpp's kBigBirdLayoutsKey
_ARCHS = {"DTransformer": _core.DTransformer, "ETransformer": _core.ETransformer, "EDTransformer": _core.EDTransformer}


def build_model(config: Union[dict, str], *, dtype: str | None = None):
    """The one way every front-end makes a model from its hyperparameters: `config` is a dict (model.config)
    or its JSON text, {"arch": "DTransformer" | "ETransformer" | "EDTransformer", option: value, …} (the core's
    ModelConfig.to_json; a missing option takes its default), dtype (if given) replaces config's. θ is
    initialised from config's seed. The core checks every name, type and value (TypeError / ValueError)."""
    if isinstance(config, str):
        config = json.loads(config)
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict or its JSON text, got {type(config).__name__}")
    options = dict(config)
    arch = options.pop("arch", None)
    if arch not in _ARCHS:
        raise ValueError(f"config['arch'] must be one of {', '.join(_ARCHS)}, got {arch!r}")
    if dtype is not None:
        options["dtype"] = dtype
    return _ARCHS[arch](**options)


def _safetensors():
    try:
        from safetensors import numpy as st
    except ImportError as e:  # a dependency of the package; say what is missing
        raise ImportError("ft.save / ft.load need the 'safetensors' package: pip install safetensors") from e
    return st


def _temp_beside(path: str) -> str:
    """A new, uniquely named empty file in `path`'s folder (tempfile: two processes writing one path never share a
    temporary), to be renamed over `path` with os.replace once complete."""
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


def _path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return os.fspath(path)


def save(model, path: Union[str, os.PathLike], *, metadata: dict | None = None) -> None:
    """Write model's parameters and hyperparameters to `path` (safetensors). `metadata`: extra str -> str."""
    path = _path(path)
    if type(model).__name__ not in _ARCHS:
        raise TypeError(f"ft.save saves a DTransformer, ETransformer or EDTransformer, got {type(model).__name__}")
    st = _safetensors()
    tensors = {name: np.ascontiguousarray(arr) for name, arr in model.params.items()}
    meta = {"formal_transformers.format": FORMAT, "formal_transformers.config": model.config_json(),
            # dropout's counter and seed (docs/regularisation.md): a resumed run draws the masks it would have drawn
            "formal_transformers.dropout_step": str(model.dropout_step),
            "formal_transformers.dropout_seed": str(model.dropout_seed)}
    layouts = model.bigbird_layouts_json() if isinstance(model, _core.ETransformer) else ""
    if layouts:  # given BigBird layouts (a model without keeps the file as before)
        meta[LAYOUTS] = layouts
    for k, v in (metadata or {}).items():
        meta[str(k)] = str(v)
    # never a half-written file under the final name; concurrent saves of one path each use their own temporary
    _replace_atomically(path, lambda tmp: st.save_file(tensors, tmp, metadata=meta))


def read_metadata(path: Union[str, os.PathLike]) -> dict:
    """The metadata of a saved file (str -> str)."""
    path = _path(path)
    _safetensors()  # a clear ImportError naming the extra when safetensors is missing
    return _header(path)[0]


def _header(path) -> tuple[dict, int]:
    """The metadata and the number of tensors of a saved file (its header only)."""
    from safetensors import safe_open

    try:
        with safe_open(os.fspath(path), framework="numpy") as f:
            return dict(f.metadata() or {}), len(f.keys())
    except FileNotFoundError:
        raise
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None


def load(path: Union[str, os.PathLike], *, dtype: str | None = None):
    """Rebuild the model saved at `path` (optionally in another dtype) with its parameters."""
    path = _path(path)
    st = _safetensors()
    if dtype is not None:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
        if name not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64 (or None: as saved), got {dtype!r}")
        dtype = name
    meta, n_tensors = _header(path)
    if "formal_transformers.config" not in meta:
        raise ValueError(f"{path}: no formal_transformers config in its metadata (not written by ft.save)")
    if meta.get("formal_transformers.format") != FORMAT:
        raise ValueError(f"{path}: format {meta.get('formal_transformers.format')!r}, this version reads {FORMAT!r}")
    try:
        cfg = json.loads(meta["formal_transformers.config"])
        if not isinstance(cfg, dict):
            raise ValueError("not a JSON object")
        # every layer has parameters of its own: a config with more layers than the file has tensors cannot
        # match it, and is refused before the model is built (L = 10**6 layers would take minutes to build)
        layers = sum(v for k, v in cfg.items() if k in ("L", "L_enc", "L_dec") and isinstance(v, int))
        if layers > n_tensors:
            raise ValueError(f"the config has {layers} layers, the file only {n_tensors} tensors")
        # a BigBird file written before bigbird_draw existed: every head drew the layer's one layout (io.hpp's rule)
        if cfg.get("arch") == "ETransformer" and cfg.get("attention") == "bigbird" and "bigbird_draw" not in cfg:
            cfg["bigbird_draw"] = "per_layer"
        model = build_model(cfg, dtype=dtype)
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as e:  # RecursionError: deeply nested JSON
        raise ValueError(f"{path}: damaged or unusable config in the metadata ({type(e).__name__}: {e})") from None
    try:
        tensors = st.load_file(os.fspath(path))
    except Exception as e:
        raise ValueError(f"{path}: could not read the tensors ({e})") from None
    missing = set(model.params.keys()) - set(tensors)
    extra = set(tensors) - set(model.params.keys())
    if missing or extra:
        raise ValueError(f"{path}: parameters do not match the config (missing {sorted(missing)}, unexpected {sorted(extra)})")
    model.params.update(tensors)  # all or nothing: every dtype and shape is checked before writing
    # dropout's counter and seed (a file written before dropout_seed existed: the model's seed, as then); the
    # range is the property's own check, and the model is not returned if one fails
    for key in ("dropout_step", "dropout_seed"):
        v = meta.get(f"formal_transformers.{key}")
        if v is not None:
            try:
                setattr(model, key, int(v))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}: damaged {key} in the metadata ({e})") from None
    if LAYOUTS in meta:
        if not isinstance(model, _core.ETransformer):
            raise ValueError(f"{path}: BigBird layouts in the metadata of a {type(model).__name__} (a damaged file)")
        try:
            model.set_bigbird_layouts_json(meta[LAYOUTS])
        except ValueError as e:
            raise ValueError(f"{path}: damaged BigBird layouts in the metadata ({e})") from None
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
