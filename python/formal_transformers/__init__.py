"""formal-transformers: the listings of Phuong & Hutter, "Formal Algorithms for Transformers" (2022),
exact and fast on a CPU.

Names follow the paper (README.md has the table listing -> C++ header -> Python name). Shapes use the
paper's column convention: a sequence of token vectors is a (d, ℓ) array whose column t is token t.
Everything public of the compiled core `_core` is re-exported here, beside the Python-side modules:
training (the trainers' options, progress and history), io (save/load), reference (numpy listings) and
datasets (tiny Shakespeare and Tatoeba eng-fra: local copy, cache or download; translation scores).
"""
from __future__ import annotations

import os as _os
from collections.abc import Mapping as _Mapping

# Developer builds: FT_CORE_PATH names a CMake build tree holding a freshly built _core
# (docs/DEVELOPING.md); installed packages ignore it unless it is set.
if _os.environ.get("FT_CORE_PATH"):
    __path__.insert(0, _os.path.abspath(_os.environ["FT_CORE_PATH"]))  # noqa: F821

# How our OpenMP threads wait between parallel regions (docs/benchmarks.md "Threads" has the measurements):
# a short bounded spin, OMP_WAIT_POLICY=active with GOMP_SPINCOUNT=1000, then sleep. Our libgomp reads both
# once, when _core loads it, so they are set for that moment only and the environment is restored: other
# OpenMP runtimes (PyTorch bundles its own) and child processes see the user's setting. An explicit
# OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone; FT_OMP_WAIT_POLICY=passive|active chooses a policy for us alone (with libgomp's own spin).


def _load_blas() -> None:
    """Load the BLAS that _core links (PyPI's scipy-openblas32, docs/design.md "BLAS") from wherever that
    package is installed, so _core finds it by name whatever the layout (its RPATH covers the usual
    site-packages one). A core built against another BLAS (-DFT_BLAS=system) does not need the package."""
    try:
        import scipy_openblas32 as sob
    except ImportError:
        return
    import ctypes

    ctypes.CDLL(_os.path.join(sob.get_lib_dir(), sob.get_library(True)))


_load_blas()
_omp_defaults = {}
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    if _os.environ.get("FT_OMP_WAIT_POLICY"):
        _omp_defaults = {"OMP_WAIT_POLICY": _os.environ["FT_OMP_WAIT_POLICY"]}
    else:
        _omp_defaults = {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "1000"}
_os.environ.update(_omp_defaults)
try:
    from . import _core  # noqa: E402
finally:
    for _k in _omp_defaults:
        del _os.environ[_k]
from ._core import *  # noqa: E402,F401,F403
from . import datasets, reference, speech, vision  # noqa: E402,F401
from .io import build_model, kv_cache_bytes_per_token, load, save  # noqa: E402
from .hf import from_hf, load_hf, save_hf, to_hf  # noqa: E402  (weights in and out)
from ._torch_api import from_torch, to_torch  # noqa: E402
from ._options import model_options  # noqa: E402  (the core's option schema)
from .training import DTraining, EDTraining, ETraining, History  # noqa: E402
from .lora import lora  # noqa: E402  (LoRA adapters)
from .speech import Whisper  # noqa: E402  (deprecated: the EDTransformer with the audio encoder)

_Mapping.register(_core.ParamDict)

__version__ = "0.1.0"

__all__ = sorted(
    {name for name in dir(_core) if not name.startswith("_")}
    | {"DTraining", "ETraining", "EDTraining", "History", "save", "load", "reference", "datasets", "speech", "vision",
       "build_model", "kv_cache_bytes_per_token", "lora", "Whisper"}
    | {"from_hf", "to_hf", "save_hf", "load_hf", "to_torch", "from_torch", "model_options"}
)
