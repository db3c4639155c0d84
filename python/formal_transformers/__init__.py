"""formal-transformers: the listings of Phuong & Hutter, "Formal Algorithms for Transformers" (2022),
exact and fast on a CPU.

Names follow the paper (see README.md for the table listing -> C++ header -> Python name). Shapes use
the paper's column convention: a sequence of token vectors is a (d, ℓ) array whose column t is token t.
"""
from __future__ import annotations

from collections.abc import Mapping as _Mapping

from . import _core
from ._core import (
    LayerNorm,
    ParamDict,
    RMSNorm,
    blas_info,
    gelu,
    get_num_threads,
    relu,
    set_num_threads,
    softmax,
)

_Mapping.register(ParamDict)

__version__ = "0.1.0"

__all__ = [
    "LayerNorm",
    "ParamDict",
    "RMSNorm",
    "blas_info",
    "gelu",
    "get_num_threads",
    "relu",
    "set_num_threads",
    "softmax",
]
