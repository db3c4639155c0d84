"""The core's option schema as Python reads it (ft.model_options), and the exports' one rule over it: every option
an export (ft.to_hf, ft.save_hf, ft.to_torch) does not map must be at the core's default. No option name or
default is written here; they come from the core (ModelConfig::option_infos, models/config.cpp)."""
from __future__ import annotations

import json
from functools import lru_cache

from . import _core

__all__ = ["model_options"]


@lru_cache(maxsize=None)
def _infos(arch: str) -> tuple:
    return tuple((name, kind, json.loads(default), tuple(archs)) for name, kind, default, archs in _core._option_infos(arch))


def model_options(arch: str) -> dict:
    """The options of an architecture ("DTransformer", "ETransformer", "EDTransformer") from the core's schema,
    in its order: name -> {"kind", "default", "archs"}. kind is "size" (a required size: default None),
    "auto_size" / "auto_real" / "auto_id" (None: filled from the other options, or off), "count", "real",
    "bool", "seed", "enum" or "rates" (dropout: the default of the three rates); default is the value
    model.config holds for a model not given the option; archs are the architectures taking it.
    ValueError for another architecture name."""
    if not isinstance(arch, str):
        raise TypeError(f"arch must be a str, got {type(arch).__name__}")
    return {name: {"kind": kind, "default": default, "archs": list(archs)}
            for name, kind, default, archs in _infos(arch)}


def check_unmapped_at_defaults(cfg: dict, mapped, target: str) -> None:
    """ValueError naming the first option of the model's config (model.config) that `mapped` (the options the
    export reads and checks itself) does not hold and that is not at the core's default; an option the core
    does not know is refused unless it is None."""
    options = model_options(cfg["arch"])
    for k, v in cfg.items():
        if k in ("arch", "dtype") or k in mapped:
            continue
        if k in options:
            d = options[k]["default"]
            if v == d and isinstance(v, bool) == isinstance(d, bool):
                continue
        elif v is None:
            continue
        raise ValueError(f"{target} has no equivalent of the option {k}={v!r}")
