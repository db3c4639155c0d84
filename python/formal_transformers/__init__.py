"""formal-transformers: the listings of Phuong & Hutter, "Formal Algorithms for Transformers" (2022),
exact and fast on a CPU.

Names follow the paper (README.md has the table listing -> C++ header -> Python name). Shapes use the
paper's column convention: a sequence of token vectors is a (d, ℓ) array whose column t is token t.
Everything public of the compiled core `_core` is re-exported here, beside the Python-side modules:
training (the trainers' options, progress and history), io (save/load) and reference (numpy listings).
"""
from __future__ import annotations

import os as _os
from collections.abc import Mapping as _Mapping

# Developer builds: FT_CORE_PATH names a CMake build tree holding a freshly built _core
# (docs/DEVELOPING.md); installed packages ignore it unless it is set.
if _os.environ.get("FT_CORE_PATH"):
    __path__.insert(0, _os.path.abspath(_os.environ["FT_CORE_PATH"]))  # noqa: F821

from . import _core  # noqa: E402
from ._core import *  # noqa: E402,F401,F403
from . import reference  # noqa: E402,F401
from .io import load, save  # noqa: E402
from .training import DTraining, EDTraining, ETraining, History  # noqa: E402

_Mapping.register(_core.ParamDict)

__version__ = "0.1.0"

__all__ = sorted(
    {name for name in dir(_core) if not name.startswith("_")}
    | {"DTraining", "ETraining", "EDTraining", "History", "save", "load", "reference"}
)
