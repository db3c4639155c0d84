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

# OpenMP threads that spin while they wait collapse when the machine is busy (measured on 2 cores with a
# second training process running: a baby-GPT step 855 ms spinning, 68 ms passive; README "Threads").
# Our libgomp reads OMP_WAIT_POLICY once, when _core loads it, so the default is set for that moment only
# and the environment is restored: other OpenMP runtimes (PyTorch bundles its own) and child processes
# see the user's setting. FT_OMP_WAIT_POLICY=active (or an explicit OMP_WAIT_POLICY) overrides it.


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
_had_policy = "OMP_WAIT_POLICY" in _os.environ
if not _had_policy:
    _os.environ["OMP_WAIT_POLICY"] = _os.environ.get("FT_OMP_WAIT_POLICY", "passive")
try:
    from . import _core  # noqa: E402
finally:
    if not _had_policy:
        del _os.environ["OMP_WAIT_POLICY"]
from ._core import *  # noqa: E402,F401,F403
from . import datasets, reference  # noqa: E402,F401
from .io import load, save  # noqa: E402
from .training import DTraining, EDTraining, ETraining, History  # noqa: E402

_Mapping.register(_core.ParamDict)

__version__ = "0.1.0"

__all__ = sorted(
    {name for name in dir(_core) if not name.startswith("_")}
    | {"DTraining", "ETraining", "EDTraining", "History", "save", "load", "reference", "datasets"}
)
