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
# Masks (paper §5, Algorithm 4's hyperparameter): Mask ∈ {0,1}^{ℓ_z×ℓ_x}, Mask[t_z, t_x] = 1 means token
# t_x (a query of X) may attend to token t_z (of the context Z).


def bidirectional_mask(l_z: int, l_x: int) -> np.ndarray:
    """Mask ≡ 1: every token attends to every context token."""
    return np.ones((l_z, l_x), dtype=bool)


def unidirectional_mask(l_z: int, l_x: int) -> np.ndarray:
    """Mask[t_z, t_x] = [[t_z ≤ t_x]]: a token attends only to itself and earlier tokens."""
    return np.arange(l_z)[:, None] <= np.arange(l_x)[None, :]


# ---------------------------------------------------------------------------------------------------
# Algorithm 1: Token embedding.   e ← W_e[:, v]


def token_embedding(v, W_e: np.ndarray) -> np.ndarray:
    """Algorithm 1. v ∈ V ≅ [N_V] (0-based here), W_e ∈ R^{d_e×N_V}; a sequence gives (d_e, ℓ)."""
    return W_e[:, v]  # line 1: return e = W_e[:, v]


# ---------------------------------------------------------------------------------------------------
# Algorithm 2: Positional embedding.   e_p ← W_p[:, ℓ]


def positional_embedding(t, W_p: np.ndarray) -> np.ndarray:
    """Algorithm 2. t ∈ [ℓ_max] (0-based here), W_p ∈ R^{d_e×ℓ_max}; an array of positions gives (d_e, n)."""
    return W_p[:, t]  # line 1: return e_p = W_p[:, t]


def sinusoidal_positions(l_max: int, d_e: int, base: float | None = None) -> np.ndarray:
    """The paper's fixed W_p (§5, Positional embedding), with its 1-based i and t:
    W_p[2i−1, t] = sin(t / ℓ_max^{2i/d_e}),  W_p[2i, t] = cos(t / ℓ_max^{2i/d_e}),  i = 1..⌊d_e/2⌋.
    Stored 0-based: row 2i−1 is index 2i−2, column t is index t−1 (column j holds t = j+1). With odd d_e
    the last row is the sine of i = (d_e+1)/2. `base` replaces ℓ_max (Vaswani et al. use 10000)."""
    base = float(l_max if base is None else base)
    W_p = np.zeros((d_e, l_max))
    for t in range(1, l_max + 1):
        for i in range(1, d_e // 2 + (d_e % 2) + 1):
            angle = t / base ** (2 * i / d_e)
            W_p[2 * i - 2, t - 1] = math.sin(angle)
            if 2 * i - 1 < d_e:
                W_p[2 * i - 1, t - 1] = math.cos(angle)
    return W_p


# ---------------------------------------------------------------------------------------------------
# Algorithm 3: ṽ ← Attention(e, e_{1:T} | W_q, b_q, W_k, b_k, W_v, b_v)   (basic single-query attention)


def basic_attention(e, E, W_q, b_q, W_k, b_k, W_v, b_v) -> np.ndarray:
    """Algorithm 3. e ∈ R^{d_in} the current token, E ∈ R^{d_in×T} the context e_1..e_T (columns)."""
    d_attn = W_q.shape[0]
    T = E.shape[1]
    q = W_q @ e + b_q  # line 1
    k = [W_k @ E[:, t] + b_k for t in range(T)]  # line 2
    v = [W_v @ E[:, t] + b_v for t in range(T)]  # line 3
    scores = np.array([q @ k[t] / math.sqrt(d_attn) for t in range(T)])
    alpha = np.exp(scores - scores.max()) / np.sum(np.exp(scores - scores.max()))  # line 4
    return sum(alpha[t] * v[t] for t in range(T))  # line 5


# ---------------------------------------------------------------------------------------------------
# Algorithm 4: Ṽ ← Attention(X, Z | W_qkv, Mask)


def attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, mask) -> np.ndarray:
    """Algorithm 4. X ∈ R^{d_x×ℓ_x} (queries), Z ∈ R^{d_z×ℓ_z} (context), mask ∈ {0,1}^{ℓ_z×ℓ_x}."""
    d_attn = W_q.shape[0]
    Q = W_q @ X + b_q[:, None]  # line 1: Q ← W_q X + b_q 1ᵀ
    K = W_k @ Z + b_k[:, None]  # line 2: K ← W_k Z + b_k 1ᵀ
    V = W_v @ Z + b_v[:, None]  # line 3: V ← W_v Z + b_v 1ᵀ
    S = K.T @ Q  # line 4: S ← Kᵀ Q
    S = np.where(mask, S, -np.inf)  # line 5: ∀t_z, t_x, if ¬Mask[t_z, t_x] then S[t_z, t_x] ← −∞
    return V @ softmax(S / math.sqrt(d_attn))  # line 6: return Ṽ = V · softmax(S/√d_attn)


def attention_weights(X, Z, W_q, b_q, W_k, b_k, mask) -> np.ndarray:
    """softmax(S/√d_attn) of Algorithm 4 (lines 1, 2, 4–6): the (ℓ_z, ℓ_x) matrix whose column t_x says
    how much token t_x attends to each context token."""
    d_attn = W_q.shape[0]
    Q = W_q @ X + b_q[:, None]
    K = W_k @ Z + b_k[:, None]
    return softmax(np.where(mask, K.T @ Q, -np.inf) / math.sqrt(d_attn))


# ---------------------------------------------------------------------------------------------------
# Algorithm 5: Ṽ ← MHAttention(X, Z | W, Mask)


def mh_attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, W_o, b_o, mask) -> np.ndarray:
    """Algorithm 5, with the heads stacked as API.md lays them out: W_q (H, d_attn, d_x), b_q (H, d_attn),
    W_k (H, d_attn, d_z), b_k (H, d_attn), W_v (H, d_mid, d_z), b_v (H, d_mid), W_o (d_out, H·d_mid),
    b_o (d_out,)."""
    H = W_q.shape[0]
    Y = [attention(X, Z, W_q[h], b_q[h], W_k[h], b_k[h], W_v[h], b_v[h], mask) for h in range(H)]  # lines 1–2
    Y = np.concatenate(Y, axis=0)  # line 3: Y ← [Y¹; Y²; …; Y^H]
    return W_o @ Y + b_o[:, None]  # line 4: return Ṽ = W_o Y + b_o 1ᵀ


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


# ---------------------------------------------------------------------------------------------------
# Algorithm 7: Unembedding.   p ← softmax(W_u e)


def unembedding(e, W_u) -> np.ndarray:
    """Algorithm 7. e ∈ R^{d_e} (or (d_e, ℓ): every column), W_u ∈ R^{N_V×d_e} -> p ∈ Δ(V)."""
    return softmax(W_u @ e)  # line 1: return p = softmax(W_u e)
