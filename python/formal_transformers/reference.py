"""The listings of Phuong & Hutter (2022) in plain numpy: one pure function per listing, line by line.

These are the executable specification that the native core is tested against (float64, ≤1e-12
relative) and that the notebooks show beside each native call. They favour the listing's shape over
speed: loops where the listing loops, the paper's symbols as names, `# line k` on every step.
Conventions as in API.md: column convention (a sequence is a (d, ℓ) array, column t is token t),
0-based token ids and positions.
"""
from __future__ import annotations

import math

import numpy as np

# ---------------------------------------------------------------------------------------------------
# Notation (paper §2 and §5)


def softmax(A: np.ndarray) -> np.ndarray:
    """softmax(A)[t1, t2] = exp(A[t1, t2]) / Σ_t exp(A[t, t2]): over the columns of A (a 1-D A is one
    column). The column max is subtracted first; -inf entries get probability 0."""
    A = np.asarray(A)
    m = np.max(A, axis=0, keepdims=True)
    E = np.exp(A - m)
    return E / np.sum(E, axis=0, keepdims=True)


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GELU(x) = x · Φ(x) (exact, with erf); approximate="tanh": GPT-2's tanh approximation."""
    x = np.asarray(x)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)


def relu(x: np.ndarray) -> np.ndarray:
    """ReLU(x) = max(0, x)."""
    return np.maximum(x, 0)


# ---------------------------------------------------------------------------------------------------
# Algorithm 6: ê ← layer_norm(e | γ, β)


def layer_norm(e: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """Algorithm 6 on one vector e ∈ R^{d_e}; eps inside the square root (eps = 0: the listing)."""
    d_e = e.shape[0]
    m = np.sum(e) / d_e  # line 1
    v = np.sum((e - m) ** 2) / d_e  # line 2
    return (e - m) / np.sqrt(v + eps) * gamma + beta  # line 3


def rms_norm(e: np.ndarray, gamma: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """Gopher's RMSnorm (paper §6): ê = e / √(Σ_i e[i]²/d_e + eps) ⊙ γ."""
    d_e = e.shape[0]
    return e / np.sqrt(np.sum(e**2) / d_e + eps) * gamma


def layer_norm_columns(E: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """for t ∈ [ℓ]: Ê[:, t] ← layer_norm(E[:, t] | γ, β), as the architectures write it."""
    return np.stack([layer_norm(E[:, t], gamma, beta, eps) for t in range(E.shape[1])], axis=1)


def rms_norm_columns(E: np.ndarray, gamma: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """RMSnorm applied to every column."""
    return np.stack([rms_norm(E[:, t], gamma, eps) for t in range(E.shape[1])], axis=1)
