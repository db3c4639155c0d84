"""The listings of Phuong & Hutter (2022) in plain numpy: one pure function per listing, line by line.

These are the executable specification that the native core is tested against (float64, ≤1e-12
relative) and that the notebooks show beside each native call. They favour the listing's shape over
speed: loops where the listing loops, the paper's symbols as names, `# line k` on every step.
Conventions as in docs/api.md: column convention (a sequence is a (d, ℓ) array, column t is token t),
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


def prefix_mask(l_z: int, l_x: int, p: int, q0: int = 0) -> np.ndarray:
    """Algorithm V7 (prefix LM): Mask[t_z, t_x] = [[t_z < p or t_z ≤ q0 + t_x]]: bidirectional over the first
    p context tokens, causal after them. Queries are at positions q0..q0+ℓ_x−1 (q0 > 0 when decoding with a
    cache). p = 0 is the unidirectional mask; p ≥ ℓ_z is the bidirectional one."""
    if p < 0:
        raise ValueError(f"prefix_len must be ≥ 0, got {p}")
    t_z, t_x = np.arange(l_z)[:, None], q0 + np.arange(l_x)[None, :]
    return (t_z < p) | (t_z <= t_x)


def sliding_window_mask(l_z: int, l_x: int, w: int, q0: int = 0) -> np.ndarray:
    """Algorithm V8 (sliding-window attention): Mask[t_z, t_x] = [[t_x − w < t_z ≤ t_x]] with t_x the query's
    absolute position q0 + column: each query sees itself and the w − 1 tokens before it (w keys), as
    Hugging Face's Mistral (masking_utils: kv_idx > q_idx − sliding_window, and causal). w ≥ ℓ is the
    unidirectional mask."""
    if w < 1:
        raise ValueError(f"sliding_window must be ≥ 1, got {w}")
    t_z, t_x = np.arange(l_z)[:, None], q0 + np.arange(l_x)[None, :]
    return (t_x - w < t_z) & (t_z <= t_x)


def chunked_mask(l_z: int, l_x: int, C: int, q0: int = 0) -> np.ndarray:
    """Algorithm V19 (chunked attention, Llama 4's attention_chunk_size): Mask[t_z, t_x] = [[⌊t_z/C⌋ = ⌊t_x/C⌋ and
    t_z ≤ t_x]] with t_x the query's absolute position q0 + column: each query sees the keys of its own chunk of C
    tokens up to itself, as Hugging Face's chunked_causal_mask_function. C ≥ ℓ is the unidirectional mask."""
    if C < 1:
        raise ValueError(f"attention_chunk_size must be ≥ 1, got {C}")
    t_z, t_x = np.arange(l_z)[:, None], q0 + np.arange(l_x)[None, :]
    return (t_z // C == t_x // C) & (t_z <= t_x)


def decoder_mask(l: int, *, mask: str = "causal", prefix_len: int = 0, sliding_window=None,
                 attention_chunk_size=None) -> np.ndarray:
    """The mask of a decoder's self-attention (Algorithm 10 line 6, V6 line 6): "causal" (the listing's
    [[t ≤ t']]), optionally with a sliding window w (V8) or chunks of C tokens (V19), or "prefix" with
    p = prefix_len (V7)."""
    if sliding_window is not None and attention_chunk_size is not None:
        raise ValueError("sliding_window and attention_chunk_size are two masks for one line")
    if attention_chunk_size is not None:
        if mask != "causal" or prefix_len:
            raise ValueError("attention_chunk_size is a mask of its own: not with mask='prefix'")
        return chunked_mask(l, l, attention_chunk_size)
    if mask == "prefix":
        if sliding_window is not None:
            raise ValueError("mask='prefix' does not combine with sliding_window")
        if not 0 <= prefix_len <= l:
            raise ValueError(f"prefix_len must be in [0, ℓ = {l}], got {prefix_len}")
        return prefix_mask(l, l, prefix_len)
    if mask != "causal":
        raise ValueError(f"mask must be 'causal' or 'prefix', got {mask!r}")
    if prefix_len:
        raise ValueError("prefix_len needs mask='prefix'")
    return unidirectional_mask(l, l) if sliding_window is None else sliding_window_mask(l, l, sliding_window)


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


def attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, mask, drop=None, bias=None) -> np.ndarray:
    """Algorithm 4. X ∈ R^{d_x×ℓ_x} (queries), Z ∈ R^{d_z×ℓ_z} (context), mask ∈ {0,1}^{ℓ_z×ℓ_x} (bool; integer
    multiplicities weigh exp(s) by M, V17b's multiset note: multiplicity_bias).
    drop = (M, p): dropout on the weights before the product of line 6 (docs/regularisation.md).
    bias: B ∈ R^{ℓ_z×ℓ_x} added in line 6, softmax(S/√d_attn + B) (V11's relative position bias)."""
    d_attn = W_q.shape[0]
    Q = W_q @ X + b_q[:, None]  # line 1: Q ← W_q X + b_q 1ᵀ
    K = W_k @ Z + b_k[:, None]  # line 2: K ← W_k Z + b_k 1ᵀ
    V = W_v @ Z + b_v[:, None]  # line 3: V ← W_v Z + b_v 1ᵀ
    S = K.T @ Q  # line 4: S ← Kᵀ Q
    S = np.where(mask, S, -np.inf)  # line 5: ∀t_z, t_x, if ¬Mask[t_z, t_x] then S[t_z, t_x] ← −∞
    A = softmax(S / math.sqrt(d_attn) + (0 if bias is None else bias) + multiplicity_bias(mask))  # line 6: softmax(S/√d_attn) …
    if drop is not None:  # (training) A ← Dropout(A | p, M)
        A = dropout(A, *drop)
    return V @ A  # line 6: return Ṽ = V · softmax(S/√d_attn)


def attention_weights(X, Z, W_q, b_q, W_k, b_k, mask) -> np.ndarray:
    """softmax(S/√d_attn) of Algorithm 4 (lines 1, 2, 4–6): the (ℓ_z, ℓ_x) matrix whose column t_x says
    how much token t_x attends to each context token."""
    d_attn = W_q.shape[0]
    Q = W_q @ X + b_q[:, None]
    K = W_k @ Z + b_k[:, None]
    return softmax(np.where(mask, K.T @ Q, -np.inf) / math.sqrt(d_attn) + multiplicity_bias(mask))


# ---------------------------------------------------------------------------------------------------
# Algorithm 5: Ṽ ← MHAttention(X, Z | W, Mask)


def mh_attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, W_o, b_o, mask, drop=None, bias=None) -> np.ndarray:
    """Algorithm 5, with the heads stacked as docs/api.md lays them out: W_q (H, d_attn, d_x), b_q (H, d_attn),
    W_k (H, d_attn, d_z), b_k (H, d_attn), W_v (H, d_mid, d_z), b_v (H, d_mid), W_o (d_out, H·d_mid),
    b_o (d_out,). drop = (M (H, ℓ_z, ℓ_x), p): dropout on every head's weights. bias: B^h (H, ℓ_z, ℓ_x) in
    line 6 of every head (V11)."""
    H = W_q.shape[0]
    Y = [attention(X, Z, W_q[h], b_q[h], W_k[h], b_k[h], W_v[h], b_v[h], mask,
                   None if drop is None else (drop[0][h], drop[1]),
                   None if bias is None else bias[h]) for h in range(H)]  # lines 1–2
    Y = np.concatenate(Y, axis=0)  # line 3: Y ← [Y¹; Y²; …; Y^H]
    return W_o @ Y + b_o[:, None]  # line 4: return Ṽ = W_o Y + b_o 1ᵀ


# ---------------------------------------------------------------------------------------------------
# Dropout (docs/regularisation.md, Algorithms D1 and D2; Srivastava et al. 2014), the mask given


def dropout(Y, M, p: float) -> np.ndarray:
    """Algorithm D1 with its mask M ∈ {0,1}^{d×ℓ} as an input (line 1 drawn by the caller):
    line 2: return Ỹ = Y ⊙ M / (1 − p)."""
    return Y * np.asarray(M, dtype=np.float64) / (1.0 - p)


def dropout_backward(dY, M, p: float) -> np.ndarray:
    """Algorithm D2: return dY = dỸ ⊙ M / (1 − p)."""
    return dY * np.asarray(M, dtype=np.float64) / (1.0 - p)


class _Drop:
    """The dropout of one training forward with given masks: `masks` as model.dropout_masks() returns them for
    one sequence (True = kept; a place without a mask is not dropped), `rates` as model.config (embed_dropout,
    attn_dropout, resid_dropout). No masks: the listings."""

    def __init__(self, masks=None, rates=None):
        self.masks, self.rates = masks or {}, rates or {}

    def out(self, name, Y, kind="resid"):
        return dropout(Y, self.masks[name], self.rates[kind + "_dropout"]) if name in self.masks else Y

    def weights(self, name):
        return (np.asarray(self.masks[name][0]), self.rates["attn_dropout"]) if name in self.masks else None


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


def scale_norm(e: np.ndarray, g, eps: float = 0.0) -> np.ndarray:
    """Listing V12, ScaleNorm (Nguyen & Salazar 2019): ê = g · e / √(‖e‖² + eps), one scalar g (shape (1,))."""
    return g * e / np.sqrt(np.sum(e**2) + eps)  # line 1


def scale_norm_columns(E: np.ndarray, g, eps: float = 0.0) -> np.ndarray:
    """ScaleNorm applied to every column."""
    return np.stack([scale_norm(E[:, t], g, eps) for t in range(E.shape[1])], axis=1)


def fixnorm_embedding(v, W_e: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """Listing V13, FixNorm (Nguyen & Chiang 2018): Algorithm 1 with a unit-norm column,
    e = W_e[:, v] / √(‖W_e[:, v]‖² + eps)."""
    w = W_e[:, v]  # line 1: w ← W_e[:, v]
    return w / np.sqrt(np.sum(w**2, axis=0) + eps)  # line 2: return e = w / √(‖w‖² + eps)


def stack_embedding(ids, W_e, W_p, *, fixnorm: bool = False, scale: float = 1.0, W_s=None, segments=None,
                    gamma=None, beta=None, eps: float = 1e-5, p0: int = 0) -> np.ndarray:
    """The embedding of one stack (stack_embedding.hpp): lines 1–3 of Algorithms 9 and 10 (Algorithm 8's 1–3 and
    10–12), e_t ← W_e[:, x[t]] + W_p[:, p0 + t] for every t, X ← [e_1, …, e_ℓ], with the steps a config chooses at
    their places: on W_e[:, x[t]] V13's unit-norm column (fixnorm, fixnorm_embedding) and then the embedding scale s
    (Gemma's embed_scale, BART's √d_e); W_p the stack's table (BART's decoder: dec.W_p; None: positions in attention,
    no table); W_s given: BERT's segment embeddings added at line 2 (segments None: segment 0); gamma given:
    X[:, t] ← layer_norm(X[:, t] | γ_e, β_e) after line 3. With no step: Algorithms 1 + 2 as printed."""
    ids = np.asarray(ids)
    l = len(ids)  # line 1: ℓ ← length(x)

    def tok(v):  # Algorithm 1 (and the steps on its column)
        e = fixnorm_embedding(v, W_e, eps) if fixnorm else token_embedding(v, W_e)
        return e if scale == 1.0 else scale * e

    if W_s is None and segments is not None:
        raise ValueError("segments given, but params has no W_s")
    seg = np.zeros(l, dtype=np.int64) if segments is None else np.asarray(segments)
    e = [tok(ids[t]) + (0.0 if W_p is None else positional_embedding(p0 + t, W_p))
         + (0.0 if W_s is None else W_s[:, seg[t]]) for t in range(l)]  # line 2: e_t ← W_e[:, x[t]] + W_p[:, t]
    X = np.stack(e, axis=1)  # line 3: X ← [e_1, e_2, …, e_ℓ]
    return X if gamma is None else layer_norm_columns(X, gamma, beta, eps)


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


# ---------------------------------------------------------------------------------------------------
# Algorithms 8–10: the three architectures, and the losses of Algorithms 11–13.
#
# `params` is the API's dict name → array (docs/api.md "Architectures"): `W_e` (d_e, N_V), `W_p` (d_e, ℓ_max),
# `W_u` (N_V, d_e) — ETransformer (N_V, d_f); layer ℓ (0-based) of D/E: `layers.ℓ.attn.{W_q, …, b_o}`,
# `layers.ℓ.{gamma1, beta1, gamma2, beta2, W_mlp1, b_mlp1, W_mlp2, b_mlp2}`; final `gamma`, `beta`
# (E also `W_f`, `b_f`); ED: `enc.ℓ.*`, `dec.ℓ.attn.*`, `dec.ℓ.cross_attn.*`, `dec.ℓ.{gamma3..5, …}`.
# A tied model (W_u = W_eᵀ) may leave `W_u` out: then W_eᵀ is used.
# Sinusoidal positions need nothing special here: W_p simply holds sinusoidal_positions(ℓ_max, d_e).

_ATTN_NAMES = ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o")
_gelu = gelu  # the module's GELU, before the architectures' `gelu=` keyword shadows the name


def _W(params, prefix: str) -> list:
    """The eight arrays of one MHAttention (Algorithm 5) stored under `prefix` (e.g. "layers.0.attn.")."""
    return [params[prefix + name] for name in _ATTN_NAMES]


def _unembedding_matrix(params) -> np.ndarray:
    """W_u, or W_eᵀ when the model is tied and W_u is not stored separately."""
    return params["W_u"] if "W_u" in params else params["W_e"].T


def _check_H(params, prefix: str, H: int) -> None:
    if params[prefix + "W_q"].shape[0] != H:
        raise ValueError(f"{prefix}W_q has {params[prefix + 'W_q'].shape[0]} heads, H = {H}")


def _gelu_kind(A: np.ndarray, kind: str) -> np.ndarray:
    if kind not in ("exact", "tanh"):
        raise ValueError(f"gelu must be 'exact' or 'tanh', got {kind!r}")
    return _gelu(A, "tanh" if kind == "tanh" else "none")


def log_softmax(A: np.ndarray) -> np.ndarray:
    """log softmax(A) over the columns of A, as a log-sum-exp (never the log of a probability)."""
    A = np.asarray(A, dtype=np.float64)
    m = np.max(A, axis=0, keepdims=True)
    return A - m - np.log(np.sum(np.exp(A - m), axis=0, keepdims=True))


def d_transformer(x, params, *, L: int, H: int, norm: str = "layer", gelu: str = "exact", eps: float = 1e-5,
                  logits: bool = False, masks=None, rates=None, mask: str = "causal", prefix_len: int = 0,
                  sliding_window=None, attention_chunk_size=None) -> np.ndarray:
    """Algorithm 10: P ← DTransformer(x | θ), GPT-2's decoder-only transformer (pre-LN).

    x: 1-D token ids (0-based, ℓ ≤ ℓ_max). Returns P ∈ (0,1)^{N_V×ℓ}, P[:, t] = P̂(x[t+1] | x[:t+1]);
    `logits=True` returns W_u X instead of its softmax (line 11 before the softmax).
    norm="rms" replaces every layer_norm by Gopher's RMSnorm (no β parameters); gelu="tanh" is GPT-2's
    approximation; eps sits inside the square root of every norm.
    masks, rates: dropout with these masks (model.dropout_masks() of one sequence) at these rates (model.config),
    after line 3, on the attention weights and on the sublayer outputs of lines 6 and 8.
    mask, prefix_len, sliding_window, attention_chunk_size: line 6's Mask (decoder_mask; V7 prefix LM, V8 sliding
    window, V19 chunked attention)."""
    drop = _Drop(masks, rates)
    if norm not in ("layer", "rms"):
        raise ValueError(f"norm must be 'layer' or 'rms', got {norm!r}")
    x = np.asarray(x)
    W_e, W_p = params["W_e"], params["W_p"]
    l = len(x)  # line 1: ℓ ← length(x)
    M = decoder_mask(l, mask=mask, prefix_len=prefix_len, sliding_window=sliding_window,
                     attention_chunk_size=attention_chunk_size)
    e = [token_embedding(x[t], W_e) + positional_embedding(t, W_p) for t in range(l)]  # line 2: e_t ← W_e[:, x[t]] + W_p[:, t]
    X = np.stack(e, axis=1)  # line 3: X ← [e_1, e_2, …, e_ℓ]
    X = drop.out("embed", X, "embed")  # (training) X ← Dropout(X | p_embed, M)
    for i in range(L):  # line 4: for l = 1, 2, …, L do
        p = f"layers.{i}."
        _check_H(params, p + "attn.", H)
        if norm == "rms":  # line 5: for t ∈ [ℓ]: X̃[:, t] ← layer_norm(X[:, t] | γ_l¹, β_l¹)
            X_tilde = rms_norm_columns(X, params[p + "gamma1"], eps)
        else:
            X_tilde = layer_norm_columns(X, params[p + "gamma1"], params[p + "beta1"], eps)
        X = X + drop.out(p + "attn.out", mh_attention(X_tilde, X_tilde, *_W(params, p + "attn."), M,
                                                      drop.weights(p + "attn.weights")))  # line 6: X ← X + MHAttention(X̃ | W_l, Mask[t, t'] = [[t ≤ t']])
        if norm == "rms":  # line 7: for t ∈ [ℓ]: X̃[:, t] ← layer_norm(X[:, t] | γ_l², β_l²)
            X_tilde = rms_norm_columns(X, params[p + "gamma2"], eps)
        else:
            X_tilde = layer_norm_columns(X, params[p + "gamma2"], params[p + "beta2"], eps)
        X = X + drop.out(p + "mlp.out", params[p + "W_mlp2"] @ _gelu_kind(params[p + "W_mlp1"] @ X_tilde + params[p + "b_mlp1"][:, None], gelu)
                         + params[p + "b_mlp2"][:, None])  # line 8: X ← X + W_mlp2^l GELU(W_mlp1^l X̃ + b_mlp1^l 1ᵀ) + b_mlp2^l 1ᵀ
    # line 9: end for
    if norm == "rms":  # line 10: for t ∈ [ℓ]: X[:, t] ← layer_norm(X[:, t] | γ, β)
        X = rms_norm_columns(X, params["gamma"], eps)
    else:
        X = layer_norm_columns(X, params["gamma"], params["beta"], eps)
    logits_ = _unembedding_matrix(params) @ X
    return logits_ if logits else softmax(logits_)  # line 11: return P = softmax(W_u X)


def e_transformer(x, params, *, L: int, H: int, gelu: str = "exact", eps: float = 1e-5,
                  logits: bool = False, segments=None, hidden: bool = False, masks=None, rates=None,
                  fixnorm: bool = False, attention: str = "softmax", features=None, layouts=None,
                  block_size: int | None = None) -> np.ndarray:
    """Algorithm 9: P ← ETransformer(x | θ), BERT's encoder-only transformer (post-LN).

    x: 1-D token ids (possibly holding mask_token). Returns P ∈ (0,1)^{N_V×ℓ}, P[:, t] = P̂(x[t] | x̃)
    (`logits=True`: W_u X).
    Erratum: the listing types W_u ∈ R^{N_V×d_e}, but line 12 applies it to X ∈ R^{d_f×ℓ} (line 10 maps
    to d_f), so W_u must be N_V × d_f (the two agree only when d_f = d_e).
    BERT's options (beyond the listing), present when their parameters are: `W_s` (d_e, n_segments) adds
    W_s[:, segments[t]] to e_t (segments None: all 0); `gamma_e`, `beta_e`: X ← layer_norm(X | γ_e, β_e)
    after line 3; `b_u`: P = softmax(W_u X + b_u 1ᵀ). hidden=True returns X after line 9.
    masks, rates: dropout as d_transformer (after line 3, or after BERT's embedding layer_norm).
    attention="performer" | "rfa" (V15): line 5's attention by random features, features[l] layer l's Ω;
    attention="sigmoid": by sigmoid attention (sigmoid_weights; features: None per layer).
    attention="bigbird" (V17): line 5's Mask is BigBird's, bigbird_mask(layouts[l], block_size) in layer l
    (layouts[l] (n, n): every head's; (H, n, n): head h's mask from layouts[l][h])."""
    drop = _Drop(masks, rates)
    x = np.asarray(x)
    l = len(x)
    # lines 1–3 (BERT's segment embeddings and layer_norm(· | γ_e, β_e) when θ holds them)
    X = stack_embedding(x, params["W_e"], params["W_p"], fixnorm=fixnorm, W_s=params.get("W_s"), segments=segments,
                        gamma=params.get("gamma_e"), beta=params.get("beta_e"), eps=eps)
    X = drop.out("embed", X, "embed")  # (training) X ← Dropout(X | p_embed, M)
    for i in range(L):  # line 4: for l = 1, 2, …, L do
        p = f"layers.{i}."
        _check_H(params, p + "attn.", H)
        if attention == "bigbird":  # V17: MHAttention with BigBird's block layout as its Mask (the dense definition)
            a = p + "attn."
            X = X + drop.out(p + "attn.out", gqa_mhattention(
                X, X, params[a + "W_q"], params.get(a + "b_q"), params[a + "W_k"], params.get(a + "b_k"),
                params[a + "W_v"], params.get(a + "b_v"), params[a + "W_o"], params.get(a + "b_o"),
                np.stack([bigbird_mask(Lh, block_size) for Lh in layouts[i]]) if np.ndim(layouts[i]) == 3
                else bigbird_mask(layouts[i], block_size)))
        elif attention != "softmax":  # V15: MHAttention with lines 4–6 by random features
            a = p + "attn."
            X = X + drop.out(p + "attn.out", gqa_mhattention(
                X, X, params[a + "W_q"], params.get(a + "b_q"), params[a + "W_k"], params.get(a + "b_k"),
                params[a + "W_v"], params.get(a + "b_v"), params[a + "W_o"], params.get(a + "b_o"),
                bidirectional_mask(l, l), attention=attention, Omega=features[i]))
        else:
            X = X + drop.out(p + "attn.out", mh_attention(X, X, *_W(params, p + "attn."), bidirectional_mask(l, l),
                                                          drop.weights(p + "attn.weights")))  # line 5: X ← X + MHAttention(X | W_l, Mask ≡ 1)
        X = layer_norm_columns(X, params[p + "gamma1"], params[p + "beta1"], eps)  # line 6: for t: X[:, t] ← layer_norm(X[:, t] | γ_l¹, β_l¹)
        X = X + drop.out(p + "mlp.out", params[p + "W_mlp2"] @ _gelu_kind(params[p + "W_mlp1"] @ X + params[p + "b_mlp1"][:, None], gelu)
                         + params[p + "b_mlp2"][:, None])  # line 7: X ← X + W_mlp2^l GELU(W_mlp1^l X + b_mlp1^l 1ᵀ) + b_mlp2^l 1ᵀ
        X = layer_norm_columns(X, params[p + "gamma2"], params[p + "beta2"], eps)  # line 8: for t: X[:, t] ← layer_norm(X[:, t] | γ_l², β_l²)
    # line 9: end for
    if hidden:
        return X
    X = _gelu_kind(params["W_f"] @ X + params["b_f"][:, None], gelu)  # line 10: X ← GELU(W_f X + b_f 1ᵀ)
    X = layer_norm_columns(X, params["gamma"], params["beta"], eps)  # line 11: for t: X[:, t] ← layer_norm(X[:, t] | γ, β)
    logits_ = _unembedding_matrix(params) @ X
    if "b_u" in params:  # BERT: + b_u 1ᵀ
        logits_ = logits_ + params["b_u"][:, None]
    return logits_ if logits else softmax(logits_)  # line 12: return P = softmax(W_u X)


def relative_bucket(r: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> int:
    """Algorithm V11 (T5's relative position buckets; Raffel et al. 2020 §2.1): the bucket k of the offset
    r = t_z − t_x (key minus query position). Line 5 in float32 as Hugging Face's T5 computes it."""
    if bidirectional:  # line 1: N ← N_b/2; β ← N·[[r > 0]]; n ← |r|
        N, beta, n = num_buckets // 2, (num_buckets // 2) * int(r > 0), abs(r)
    else:  # line 2: N ← N_b; β ← 0; n ← max(−r, 0)
        N, beta, n = num_buckets, 0, max(-r, 0)
    m = N // 2  # line 3: m ← N/2
    if n < m:  # line 4
        return beta + n
    f32 = np.float32
    v = f32(np.log(f32(n) / f32(m))) / f32(math.log(max_distance / m)) * f32(N - m)
    return beta + min(N - 1, m + int(v))  # line 5: β + min(N − 1, m + ⌊ln(n/m)/ln(d_max/m)·(N − m)⌋)


def relative_bias(l_z: int, l_x: int, table, *, bidirectional: bool, max_distance: int = 128, q0: int = 0) -> np.ndarray:
    """V11's bias of every head: B^h[t_z, t_x] = b[bucket(t_z − (q0 + t_x)), h], table b ∈ R^{N_b×H}.
    Returns (H, ℓ_z, ℓ_x)."""
    table = np.asarray(table, dtype=np.float64)
    N_b = table.shape[0]
    k = np.array([[relative_bucket(t_z - (q0 + t_x), bidirectional, N_b, max_distance) for t_x in range(l_x)]
                  for t_z in range(l_z)])
    return np.moveaxis(table[k], -1, 0)


def ed_transformer(z, x, params, *, L_enc: int, L_dec: int, H: int, eps: float = 1e-5,
                   logits: bool = False, masks=None, rates=None, positional: str = "learned",
                   relative_max_distance: int = 128, fixnorm: bool = False, scale_embedding: bool = False) -> np.ndarray:
    """Algorithm 8: P ← EDTransformer(z, x | θ), the original sequence-to-sequence transformer (post-LN,
    ReLU). z: 1-D source ids, x: 1-D target ids; one W_e, W_p embed both. Returns P ∈ (0,1)^{N_V×ℓ_x},
    P[:, t] = P̂(x[t+1] | x[:t+1], z) (`logits=True`: W_u X).
    Errata: line 6 writes γ_t¹, β_t¹ where the layer's γ_l¹, β_l¹ are meant; line 13 loops over i but the
    body indexes l (the decoder layer). Both are implemented as evidently intended: per-layer parameters.
    masks, rates: dropout as d_transformer (after lines 3 and 12, on the weights of the three attentions,
    on the outputs of lines 5, 7, 14, 16, 18).
    positional="relative" (V11, T5): no W_p; the self-attentions add T5's relative position bias, the encoder's
    bidirectional from the table enc.rel_bias, the decoder's causal from dec.rel_bias (each shared by its layers).
    The embedding's steps (stack_embedding): fixnorm, √d_e with scale_embedding (V22), and when θ holds them the
    decoder's own dec.W_p and each stack's layer_norm(· | γ_e, β_e) (enc.gamma_e, dec.gamma_e)."""
    drop = _Drop(masks, rates)
    z, x = np.asarray(z), np.asarray(x)
    rel = positional == "relative"
    W_e = params["W_e"]
    W_p = None if rel else params["W_p"]

    # Encoder
    l_z = len(z)  # line 1: ℓ_z ← length(z)
    B_enc = relative_bias(l_z, l_z, params["enc.rel_bias"], bidirectional=True,
                          max_distance=relative_max_distance) if rel else None
    s = math.sqrt(W_e.shape[0]) if scale_embedding else 1.0
    Z = stack_embedding(z, W_e, W_p, fixnorm=fixnorm, scale=s, gamma=params.get("enc.gamma_e"),
                        beta=params.get("enc.beta_e"), eps=eps)  # lines 2–3: e_t ← W_e[:, z[t]] + W_p[:, t]; Z ← [e_1, …]
    Z = drop.out("embed.z", Z, "embed")  # (training) Z ← Dropout(Z | p_embed, M)
    for i in range(L_enc):  # line 4: for l = 1, 2, …, L_enc do
        p = f"enc.{i}."
        _check_H(params, p + "attn.", H)
        Z = Z + drop.out(p + "attn.out", mh_attention(Z, Z, *_W(params, p + "attn."), bidirectional_mask(l_z, l_z),
                                                      drop.weights(p + "attn.weights"), B_enc))  # line 5: Z ← Z + MHAttention(Z | W_l^enc, Mask ≡ 1)
        Z = layer_norm_columns(Z, params[p + "gamma1"], params[p + "beta1"], eps)  # line 6: for t: Z[:, t] ← layer_norm(Z[:, t] | γ_l¹, β_l¹) (erratum: γ_t)
        Z = Z + drop.out(p + "mlp.out", params[p + "W_mlp2"] @ relu(params[p + "W_mlp1"] @ Z + params[p + "b_mlp1"][:, None])
                         + params[p + "b_mlp2"][:, None])  # line 7: Z ← Z + W_mlp2^l ReLU(W_mlp1^l Z + b_mlp1^l 1ᵀ) + b_mlp2^l 1ᵀ
        Z = layer_norm_columns(Z, params[p + "gamma2"], params[p + "beta2"], eps)  # line 8: for t: Z[:, t] ← layer_norm(Z[:, t] | γ_l², β_l²)
    # line 9: end for
    # Decoder
    l_x = len(x)  # line 10: ℓ_x ← length(x)
    B_dec = relative_bias(l_x, l_x, params["dec.rel_bias"], bidirectional=False,
                          max_distance=relative_max_distance) if rel else None
    X = stack_embedding(x, W_e, params.get("dec.W_p", W_p), fixnorm=fixnorm, scale=s, gamma=params.get("dec.gamma_e"),
                        beta=params.get("dec.beta_e"), eps=eps)  # lines 11–12: e_t ← W_e[:, x[t]] + W_p[:, t]; X ← [e_1, …]
    X = drop.out("embed.x", X, "embed")  # (training) X ← Dropout(X | p_embed, M)
    for i in range(L_dec):  # line 13: for l = 1, 2, …, L_dec do (erratum: the listing writes "for i")
        p = f"dec.{i}."
        _check_H(params, p + "attn.", H)
        X = X + drop.out(p + "attn.out", mh_attention(X, X, *_W(params, p + "attn."), unidirectional_mask(l_x, l_x),
                                                      drop.weights(p + "attn.weights"), B_dec))  # line 14: X ← X + MHAttention(X | W_l^dec, Mask[t, t'] = [[t ≤ t']])
        X = layer_norm_columns(X, params[p + "gamma3"], params[p + "beta3"], eps)  # line 15: for t: X[:, t] ← layer_norm(X[:, t] | γ_l³, β_l³)
        X = X + drop.out(p + "cross_attn.out", mh_attention(X, Z, *_W(params, p + "cross_attn."), bidirectional_mask(l_z, l_x),
                                                            drop.weights(p + "cross_attn.weights")))  # line 16: X ← X + MHAttention(X, Z | W_l^e/d, Mask ≡ 1)
        X = layer_norm_columns(X, params[p + "gamma4"], params[p + "beta4"], eps)  # line 17: for t: X[:, t] ← layer_norm(X[:, t] | γ_l⁴, β_l⁴)
        X = X + drop.out(p + "mlp.out", params[p + "W_mlp4"] @ relu(params[p + "W_mlp3"] @ X + params[p + "b_mlp3"][:, None])
                         + params[p + "b_mlp4"][:, None])  # line 18: X ← X + W_mlp4^l ReLU(W_mlp3^l X + b_mlp3^l 1ᵀ) + b_mlp4^l 1ᵀ
        X = layer_norm_columns(X, params[p + "gamma5"], params[p + "beta5"], eps)  # line 19: for t: X[:, t] ← layer_norm(X[:, t] | γ_l⁵, β_l⁵)
    # line 20: end for
    logits_ = _unembedding_matrix(params) @ X
    return logits_ if logits else softmax(logits_)  # line 21: return P = softmax(W_u X)


def bart_transformer(z, x, params, *, L_enc: int, L_dec: int, H: int, eps: float = 1e-5, mlp: str = "gelu",
                     scale_embedding: bool = False, pre_norm: bool = False, logits: bool = False) -> np.ndarray:
    """V22 (docs/variants.md): P ← EDTransformer(z, x | θ) with BART's options — Algorithm 8's post-LN layers with
    φ = GELU (mlp="gelu"; "relu": the listing's), each stack embedded by stack_embedding (√d_e scaling with
    scale_embedding; the encoder's W_p and the decoder's dec.W_p when θ holds it; enc.gamma_e / dec.gamma_e when θ holds
    them), P = softmax(W_u X + b_u 1ᵀ) when θ holds b_u. pre_norm (mBART): V18a's layers with layer_norm (γ and β) and
    each stack's final norm (enc.gamma, enc.beta; dec.gamma, dec.beta). Parameter names as ft's EDTransformer."""
    z, x = np.asarray(z), np.asarray(x)
    W_e = params["W_e"]
    s = math.sqrt(W_e.shape[0]) if scale_embedding else 1.0
    phi = relu if mlp == "relu" else gelu

    def emb(ids, stack, W_p):
        return stack_embedding(ids, W_e, W_p, scale=s, gamma=params.get(stack + ".gamma_e"),
                               beta=params.get(stack + ".beta_e"), eps=eps)

    def ln(X, p, k):
        return layer_norm_columns(X, params[f"{p}gamma{k}"], params[f"{p}beta{k}"], eps)

    def ff(X, p, W1, b1, W2, b2):
        return params[p + W2] @ phi(params[p + W1] @ X + params[p + b1][:, None]) + params[p + b2][:, None]

    l_z, l_x = len(z), len(x)
    Z = emb(z, "enc", params["W_p"])  # lines 2′–3′
    X = emb(x, "dec", params.get("dec.W_p", params["W_p"]))  # lines 11′–12′
    if pre_norm:  # mBART: V18a lines 4–17 with layer_norm
        for i in range(L_enc):
            p = f"enc.{i}."
            Zt = ln(Z, p, 1)
            Z = Z + mh_attention(Zt, Zt, *_W(params, p + "attn."), bidirectional_mask(l_z, l_z))
            Z = Z + ff(ln(Z, p, 2), p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2")
        Z = layer_norm_columns(Z, params["enc.gamma"], params["enc.beta"], eps)
        for i in range(L_dec):
            p = f"dec.{i}."
            Xt = ln(X, p, 1)
            X = X + mh_attention(Xt, Xt, *_W(params, p + "attn."), unidirectional_mask(l_x, l_x))
            X = X + mh_attention(ln(X, p, 2), Z, *_W(params, p + "cross_attn."), bidirectional_mask(l_z, l_x))
            X = X + ff(ln(X, p, 3), p, "W_mlp3", "b_mlp3", "W_mlp4", "b_mlp4")
        X = layer_norm_columns(X, params["dec.gamma"], params["dec.beta"], eps)
    else:  # Algorithm 8's post-LN layers
        for i in range(L_enc):
            p = f"enc.{i}."
            _check_H(params, p + "attn.", H)
            Z = ln(Z + mh_attention(Z, Z, *_W(params, p + "attn."), bidirectional_mask(l_z, l_z)), p, 1)  # lines 5–6
            Z = ln(Z + ff(Z, p, "W_mlp1", "b_mlp1", "W_mlp2", "b_mlp2"), p, 2)  # lines 7–8 (φ = GELU)
        for i in range(L_dec):
            p = f"dec.{i}."
            X = ln(X + mh_attention(X, X, *_W(params, p + "attn."), unidirectional_mask(l_x, l_x)), p, 3)  # lines 14–15
            X = ln(X + mh_attention(X, Z, *_W(params, p + "cross_attn."), bidirectional_mask(l_z, l_x)), p, 4)  # 16–17
            X = ln(X + ff(X, p, "W_mlp3", "b_mlp3", "W_mlp4", "b_mlp4"), p, 5)  # lines 18–19
    logits_ = _unembedding_matrix(params) @ X
    if "b_u" in params:
        logits_ = logits_ + params["b_u"][:, None]
    return logits_ if logits else softmax(logits_)  # line 21: P = softmax(W_u X + b_u 1ᵀ)


def unscaled_mh_attention(X, Z, W_q, W_k, W_v, W_o, mask, bias=None) -> np.ndarray:
    """Algorithm 5 without biases (V5) whose heads run Algorithm 4 with V18's line 4: the scores are not
    scaled, A ← softmax(Kᵀ Q + B^h) (T5 folds 1/√d_attn into its initialisation). Heads as mh_attention."""
    Y = []
    for h in range(W_q.shape[0]):  # lines 1–2
        Q, K, V = W_q[h] @ X, W_k[h] @ Z, W_v[h] @ Z  # Algorithm 4 lines 1–3 (no biases)
        S = np.where(mask, K.T @ Q, -np.inf)  # lines 4–5: S ← Kᵀ Q (V18: unscaled); masked ← −∞
        Y.append(V @ softmax(S + (0 if bias is None else bias[h])))  # line 6: Ṽ ← V softmax(S + B^h)
    return W_o @ np.concatenate(Y, axis=0)  # lines 3–4: W_o [Y¹; …; Y^H]


def geglu_mlp(X_tilde, W_gate, W_mlp1, W_mlp2) -> np.ndarray:
    """V18b GEGLU without biases: W_mlp2 (GELU_tanh(W_gate X̃) ⊙ W_mlp1 X̃) (T5 v1.1's gated-gelu, gelu_new)."""
    return W_mlp2 @ (_gelu(W_gate @ X_tilde, "tanh") * (W_mlp1 @ X_tilde))  # lines 1–4


def t5_transformer(z, x, params, *, L_enc: int, L_dec: int, H: int, eps: float = 1e-6, mlp: str = "relu",
                   relative_max_distance: int = 128, unembed_rescale: bool = True, logits: bool = False) -> np.ndarray:
    """V18 (docs/variants.md): P ← EDTransformer(z, x | θ) with T5's choices — block="pre_ln", norm="rms",
    bias=False, positional="relative" (V11), scale_scores=False, mlp="relu" | "geglu" (| "swiglu"), unembed_rescale.
    Parameter names as ft's EDTransformer (enc.l.gamma1, …, enc.gamma, dec.l.gamma1–3, dec.gamma)."""
    z, x = np.asarray(z), np.asarray(x)
    W_e = params["W_e"]

    def ff(X, p, W1, W2):  # MLP(X̃): ReLU, GEGLU or (mlp="swiglu") V4's SwiGLU
        if mlp == "geglu":
            return geglu_mlp(X, params[p + "W_gate"], params[p + W1], params[p + W2])
        if mlp == "swiglu":
            return swiglu_mlp(X, params[p + "W_gate"], None, params[p + W1], None, params[p + W2], None)
        return params[p + W2] @ relu(params[p + W1] @ X)

    def att(X, Z, p, mask, bias=None):
        return unscaled_mh_attention(X, Z, *(params[p + w] for w in ("W_q", "W_k", "W_v", "W_o")), mask, bias)

    l_z, l_x = len(z), len(x)
    B_enc = relative_bias(l_z, l_z, params["enc.rel_bias"], bidirectional=True, max_distance=relative_max_distance)
    Z = np.stack([W_e[:, v] for v in z], axis=1)  # lines 1–3 (no W_p)
    for i in range(L_enc):
        p = f"enc.{i}."
        Zt = rms_norm_columns(Z, params[p + "gamma1"], eps)
        Z = Z + att(Zt, Zt, p + "attn.", bidirectional_mask(l_z, l_z), B_enc)  # Z ← Z + MHAttention(norm(Z | γ¹))
        Z = Z + ff(rms_norm_columns(Z, params[p + "gamma2"], eps), p, "W_mlp1", "W_mlp2")  # Z ← Z + MLP(norm(Z))
    Z = rms_norm_columns(Z, params["enc.gamma"], eps)  # Z ← norm(Z | γ_enc)
    B_dec = relative_bias(l_x, l_x, params["dec.rel_bias"], bidirectional=False, max_distance=relative_max_distance)
    X = np.stack([W_e[:, v] for v in x], axis=1)  # lines 10–12
    for i in range(L_dec):
        p = f"dec.{i}."
        Xt = rms_norm_columns(X, params[p + "gamma1"], eps)
        X = X + att(Xt, Xt, p + "attn.", unidirectional_mask(l_x, l_x), B_dec)  # line 1
        X = X + att(rms_norm_columns(X, params[p + "gamma2"], eps), Z, p + "cross_attn.",
                    bidirectional_mask(l_z, l_x))  # line 2
        X = X + ff(rms_norm_columns(X, params[p + "gamma3"], eps), p, "W_mlp3", "W_mlp4")  # line 3
    X = rms_norm_columns(X, params["dec.gamma"], eps)  # X ← norm(X | γ_dec)
    if unembed_rescale:
        X = X / math.sqrt(X.shape[0])  # X ← d_e^−1/2 X
    logits_ = _unembedding_matrix(params) @ X
    return logits_ if logits else softmax(logits_)  # P = softmax(W_u X)


def _sequences(x) -> list:
    """A 1-D sequence → [x]; a 2-D (N, ℓ) array or a list of 1-D sequences → its sequences."""
    if np.ndim(x[0]) == 0:  # a 1-D sequence of ids (array or list)
        return [np.asarray(x)]
    return [np.asarray(s) for s in x]


def _prefix_lens(prefix_len, n: int) -> list:
    """prefix_len: an int for every sequence, or one per sequence."""
    if np.ndim(prefix_len) == 0:
        return [int(prefix_len)] * n
    if len(prefix_len) != n:
        raise ValueError(f"prefix_len has {len(prefix_len)} entries for {n} sequences")
    return [int(p) for p in prefix_len]


def _next_token_loss(logP, s, p: int) -> float:
    """−Σ_t log P[x[t+1], t] over the predictions of non-prefix tokens: 0-based t from max(p − 1, 0) to ℓ − 2
    (V7: the prefix is given, not predicted; p = 0 is Algorithm 13's line 5)."""
    return -sum(logP[s[t + 1], t] for t in range(max(p - 1, 0), len(s) - 1))


def d_loss(x, params, prefix_len=0, **hp) -> float:
    """Algorithm 13 line 5 (DTraining): loss(θ) = −Σ_{t=1}^{ℓ−1} log P[x[t+1], t], P ← DTransformer(x | θ);
    0-based: −Σ_{t=0}^{ℓ−2} log P[x[t+1], t]. A batch (2-D or list) gives the sum over its sequences.
    hp: L, H, norm, gelu, eps, mask, sliding_window of d_transformer. prefix_len (with mask="prefix"; an
    int or one per sequence): only the predictions of tokens p+1.. (1-based) count (V7)."""
    total = 0.0
    seqs = _sequences(x)
    for s, p in zip(seqs, _prefix_lens(prefix_len, len(seqs))):
        logP = log_softmax(d_transformer(s, params, logits=True, prefix_len=p, **hp))
        total += _next_token_loss(logP, s, p)
    return float(total)


def e_loss(x_tilde, x, params, mask_token: int, segments=None, **hp) -> float:
    """Algorithm 12 line 9 (ETraining): loss(θ) = −Σ_{t∈T̃} log P[x[t], t], P ← ETransformer(x̃ | θ),
    T̃ = {t : x̃[t] = mask_token}. A batch gives the sum over its sequences. hp: L, H, gelu, eps.
    segments: BERT's segment ids shaped like x (None: all 0)."""
    total = 0.0
    segs = [None] * len(_sequences(x)) if segments is None else _sequences(segments)
    for s_tilde, s, sg in zip(_sequences(x_tilde), _sequences(x), segs):
        logP = log_softmax(e_transformer(s_tilde, params, logits=True, segments=sg, **hp))
        T_tilde = [t for t in range(len(s_tilde)) if s_tilde[t] == mask_token]
        total -= sum(logP[s[t], t] for t in T_tilde)
    return float(total)


def ed_loss(z, x, params, **hp) -> float:
    """Algorithm 11 line 5 (EDTraining): loss(θ) = −Σ_{t=1}^{ℓ_x−1} log P[x[t+1], t], P ← EDTransformer(z, x | θ);
    0-based: −Σ_{t=0}^{ℓ_x−2}. A batch gives the sum over its pairs. hp: L_enc, L_dec, H, eps."""
    total = 0.0
    for s_z, s_x in zip(_sequences(z), _sequences(x)):
        logP = log_softmax(ed_transformer(s_z, s_x, params, logits=True, **hp))
        total -= sum(logP[s_x[t + 1], t] for t in range(len(s_x) - 1))
    return float(total)


# ---------------------------------------------------------------------------------------------------
# Algorithms 11–13: training. The listings' loops with the plain update of line 6 (SGD). numpy has no
# autograd, so the gradient of the listing's loss is an argument: `loss_and_grad(..., theta)` returns
# (loss, grads) with grads a dict of the keys of theta (e.g. a float64 model's loss_and_grad after
# copying theta into its params, or finite differences of d_loss / e_loss / ed_loss for a tiny model).
# theta is a dict name → array; it is copied, never changed in place. `losses`, when a list, receives the
# loss of every step (line 5 / line 9), as the listing computes it before the update.


def _sgd_update(theta: dict, grads: dict, eta: float) -> dict:
    """Line 6 of Algorithms 11 and 13 (line 10 of Algorithm 12): θ ← θ − η · ∇loss(θ). Parameters without
    a gradient entry (none in the API's models; a frozen sinusoidal W_p has a zero one) stay as they are."""
    return {k: (v - eta * np.asarray(grads[k], dtype=v.dtype)) if k in grads else v for k, v in theta.items()}


def _copy_theta(theta) -> dict:
    return {k: np.array(v, copy=True) for k, v in dict(theta).items()}


def d_training(x_data, theta, loss_and_grad, *, n_epochs: int, eta: float, losses: list | None = None) -> dict:
    """Algorithm 13: θ̂ ← DTraining(x_{1:N_data}, θ), next-token training of a DTransformer.

    x_data: sequences of token ids (a list of 1-D arrays or a 2-D array); theta: dict name → array;
    loss_and_grad(x_n, theta) -> (loss, grads) computes lines 4–5 (P(θ) ← DTransformer(x_n | θ) and
    loss(θ) = −Σ_{t=1}^{ℓ−1} log P(θ)[x_n[t+1], t]) and ∇loss(θ). Returns θ̂."""
    theta = _copy_theta(theta)
    for i in range(n_epochs):  # line 1: for i = 1, 2, …, N_epochs do
        for n in range(len(x_data)):  # line 2: for n = 1, 2, …, N_data do
            x_n = np.asarray(x_data[n])
            l = len(x_n)  # line 3: ℓ ← length(x_n)
            if l < 2:
                raise ValueError(f"x_data[{n}] has {l} token(s): DTraining needs ℓ ≥ 2 (one prediction)")
            # line 4: P(θ) ← DTransformer(x_n | θ)
            # line 5: loss(θ) = −Σ_{t=1}^{ℓ−1} log P(θ)[x_n[t+1], t]
            loss, grads = loss_and_grad(x_n, theta)  # lines 4–5, and ∇loss(θ)
            if losses is not None:
                losses.append(float(loss))
            theta = _sgd_update(theta, grads, eta)  # line 6: θ ← θ − η · ∇loss(θ)
        # line 7: end
    # line 8: end
    return theta  # line 9: return θ̂ = θ


def mask_sequence(x_n, *, p_mask: float, mask_token: int, rng) -> np.ndarray:
    """Algorithm 12 lines 4–6: x̃_n[t] ← mask_token or x_n[t], randomly with probability p_mask or 1 − p_mask.
    rng: anything with a random() method giving a uniform number in [0, 1) (numpy's Generator); token t
    is masked when its number is < p_mask (one number per token, in order)."""
    x_n = np.asarray(x_n)
    x_tilde = x_n.copy()
    for t in range(len(x_n)):  # line 4: for t = 1, 2, …, ℓ do
        x_tilde[t] = mask_token if rng.random() < p_mask else x_n[t]  # line 5
    # line 6: end
    return x_tilde


def e_training(x_data, theta, loss_and_grad, *, n_epochs: int, eta: float, p_mask: float, mask_token: int, rng,
               losses: list | None = None) -> dict:
    """Algorithm 12: θ̂ ← ETraining(x_{1:N_data}, θ), masked-language-model training of an ETransformer.

    loss_and_grad(x_tilde, x_n, theta) -> (loss, grads) computes lines 8–9 (P(θ) ← ETransformer(x̃_n | θ),
    loss(θ) = −Σ_{t∈T̃} log P(θ)[x_n[t], t]) and ∇loss(θ); rng draws the masks of lines 4–6 (see
    mask_sequence). Returns θ̂."""
    theta = _copy_theta(theta)
    for i in range(n_epochs):  # line 1: for i = 1, 2, …, N_epochs do
        for n in range(len(x_data)):  # line 2: for n = 1, 2, …, N_data do
            x_n = np.asarray(x_data[n])
            l = len(x_n)  # line 3: ℓ ← length(x_n)
            x_tilde = mask_sequence(x_n, p_mask=p_mask, mask_token=mask_token, rng=rng)  # lines 4–6
            T_tilde = [t for t in range(l) if x_tilde[t] == mask_token]  # line 7: T̃ ← {t ∈ [ℓ] : x̃_n[t] = mask_token}
            # line 8: P(θ) ← ETransformer(x̃_n | θ)
            # line 9: loss(θ) = −Σ_{t∈T̃} log P(θ)[x_n[t], t]   (0 when T̃ is empty)
            loss, grads = loss_and_grad(x_tilde, x_n, theta)  # lines 8–9, and ∇loss(θ)
            if losses is not None:
                losses.append(float(loss) if T_tilde else 0.0)
            theta = _sgd_update(theta, grads, eta)  # line 10: θ ← θ − η · ∇loss(θ)
        # line 11: end
    # line 12: end
    return theta  # line 13: return θ̂ = θ


def ed_training(z_data, x_data, theta, loss_and_grad, *, n_epochs: int, eta: float,
                losses: list | None = None) -> dict:
    """Algorithm 11: θ̂ ← EDTraining(z_{1:N_data}, x_{1:N_data}, θ), seq2seq training of an EDTransformer.

    loss_and_grad(z_n, x_n, theta) -> (loss, grads) computes lines 4–5 (P(θ) ← EDTransformer(z_n, x_n | θ),
    loss(θ) = −Σ_{t=1}^{ℓ−1} log P(θ)[x_n[t+1], t]) and ∇loss(θ). Returns θ̂."""
    if len(z_data) != len(x_data):
        raise ValueError(f"z_data and x_data must be pairs: {len(z_data)} != {len(x_data)}")
    theta = _copy_theta(theta)
    for i in range(n_epochs):  # line 1: for i = 1, 2, …, N_epochs do
        for n in range(len(x_data)):  # line 2: for n = 1, 2, …, N_data do
            z_n, x_n = np.asarray(z_data[n]), np.asarray(x_data[n])
            l = len(x_n)  # line 3: ℓ ← length(x_n)
            if l < 2:
                raise ValueError(f"x_data[{n}] has {l} token(s): EDTraining needs ℓ ≥ 2 (one prediction)")
            # line 4: P(θ) ← EDTransformer(z_n, x_n | θ)
            # line 5: loss(θ) = −Σ_{t=1}^{ℓ−1} log P(θ)[x_n[t+1], t]
            loss, grads = loss_and_grad(z_n, x_n, theta)  # lines 4–5, and ∇loss(θ)
            if losses is not None:
                losses.append(float(loss))
            theta = _sgd_update(theta, grads, eta)  # line 6: θ ← θ − η · ∇loss(θ)
        # line 7: end
    # line 8: end
    return theta  # line 9: return θ̂ = θ


# ---------------------------------------------------------------------------------------------------
# Algorithms 14–15: inference. `forward` is the trained model as a function returning P (e.g.
# lambda x: d_transformer(x, params, L=…, H=…)); rng draws the samples (numpy's Generator).


def sampling_distribution(p: np.ndarray, tau: float) -> np.ndarray:
    """q ∝ p^{1/τ} (Algorithm 14 line 5, Algorithm 15 line 6), computed as softmax(log p / τ). τ = 0 is the
    limit: all mass on the argmax (the first of ties)."""
    p = np.asarray(p, dtype=np.float64)
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    if tau == 0:
        q = np.zeros_like(p)
        q[int(np.argmax(p))] = 1.0
        return q
    with np.errstate(divide="ignore"):
        a = np.log(p) / tau
    return softmax(a)


def sample_token(p: np.ndarray, tau: float, rng) -> int:
    """Sample a token y from q ∝ p^{1/τ} (τ = 0: argmax), by inverting q's cumulative sum at one uniform
    number from rng.random()."""
    if tau == 0:
        return int(np.argmax(p))
    q = sampling_distribution(p, tau)
    c = np.cumsum(q)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(q) - 1))


def d_inference(x, forward, *, l_gen: int, tau: float, rng=None, l_max: int | None = None) -> np.ndarray:
    """Algorithm 14: y ← DInference(x, θ̂), prompting a trained DTransformer.

    x: the prompt (1-D ids, ℓ ≥ 1); forward(x) -> P (N_V, length(x)). Returns the ℓ_gen new ids.
    l_max: when given, the model sees only the last l_max tokens once x grows past it (the API's sliding
    window; the listing assumes ℓ + ℓ_gen ≤ ℓ_max)."""
    x = [int(v) for v in np.asarray(x).ravel()]
    l = len(x)  # line 1: ℓ ← length(x)
    for i in range(1, l_gen + 1):  # line 2: for i = 1, 2, …, ℓ_gen do
        context = x if l_max is None else x[-l_max:]
        P = forward(np.asarray(context))  # line 3: P ← DTransformer(x | θ̂)
        p = P[:, len(context) - 1]  # line 4: p ← P[:, ℓ + i − 1]   (1-based column ℓ+i−1: the last one)
        y = sample_token(p, tau, rng)  # line 5: sample a token y from q ∝ p^{1/τ}
        x = x + [y]  # line 6: x ← [x, y]
    # line 7: end
    return np.asarray(x[l:l + l_gen], dtype=np.int64)  # line 8: return y = x[ℓ+1 : ℓ+ℓ_gen]


def ed_inference(z, forward, *, tau: float, bos_token: int, eos_token: int, max_len: int, rng=None) -> np.ndarray:
    """Algorithm 15: x̂ ← EDInference(z, θ̂), sequence-to-sequence decoding with an EDTransformer.

    forward(z, x) -> P (N_V, length(x)). Returns x̂, starting with bos_token and ending with eos_token, or
    cut at max_len tokens (the API's stopping rule, so that the loop always ends)."""
    x_hat = [int(bos_token)]  # line 1: x̂ ← [bos_token]
    y = None  # line 2: y ← 0, "no token yet": never eos_token, whatever its id (eos_token 0, or bos_token's)
    while y != eos_token:  # line 3: while y ≠ eos_token do
        if len(x_hat) >= max_len:
            break
        P = forward(np.asarray(z), np.asarray(x_hat))  # line 4: P ← EDTransformer(z, x̂ | θ̂)
        p = P[:, len(x_hat) - 1]  # line 5: p ← P[:, length(x̂)]   (1-based: the last column)
        y = sample_token(p, tau, rng)  # line 6: sample a token y from q ∝ p^{1/τ}
        x_hat = x_hat + [y]  # line 7: x̂ ← [x̂, y]
    # line 8: end
    return np.asarray(x_hat, dtype=np.int64)  # line 9: return x̂


# ---------------------------------------------------------------------------------------------------
# Speculative decoding (Leviathan et al. 2023; Chen et al. 2023), Algorithm S of docs/speculative_decoding.md,
# uncached: every P and P̃ is a whole-model call on the whole sequence, as Algorithm 14's line 3.


def _sample_from(w: np.ndarray, rng) -> int:
    """Sample a token from norm(w) (w ≥ 0, Σ w > 0) by inverting the cumulative sum at one uniform number; a
    one-hot w (τ = 0) needs none."""
    nz = np.flatnonzero(w > 0)
    if len(nz) == 1:
        return int(nz[0])
    c = np.cumsum(w)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(w) - 1))


def speculative_acceptance(q_x: float, p_x: float) -> float:
    """Line 13's acceptance probability min(1, q_j[x̂_j] / p_j[x̂_j])."""
    return min(1.0, q_x / p_x)


def speculative_inference(x, target, draft, *, l_gen: int, k: int, tau: float, rng=None,
                          stats: dict | None = None, accept=speculative_acceptance) -> np.ndarray:
    """Algorithm S: y ← SpeculativeInference(x, θ̂_target, θ̂_draft), speculative decoding.

    x: the prompt (1-D ids, ℓ ≥ 1); target(x), draft(x) -> P (N_V, length(x)), the two DTransformers as
    functions (e.g. lambda x: d_transformer(x, params, L=…, H=…)). Returns the ℓ_gen new ids. stats, when
    given, receives target_passes, draft_passes, drafted and accepted (per target pass). accept(q_x, p_x) is
    line 13's probability (a test swaps in a wrong rule to show the distribution check catches it)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    if rng is None:  # only τ > 0 needs random numbers (at τ = 0 line 13's ratio is 0 or 1)
        rng = np.random.default_rng()
    st = stats if stats is not None else {}
    st.update(target_passes=0, draft_passes=0, drafted=[], accepted=[])
    x = [int(v) for v in np.asarray(x).ravel()]
    l = len(x)  # line 1: ℓ ← length(x)
    while len(x) < l + l_gen:  # line 2: while length(x) < ℓ + ℓ_gen do
        m = len(x)  # line 3: m ← length(x); k' ← min(k, ℓ + ℓ_gen − m − 1)
        kp = min(k, l + l_gen - m - 1)
        x_hat, p = [], []
        for j in range(1, kp + 1):  # line 4: for j = 1, 2, …, k' do
            P_d = draft(np.asarray(x + x_hat))  # line 5: P̃ ← DTransformer([x, x̂_1, …, x̂_{j−1}] | θ̂_draft)
            p.append(sampling_distribution(P_d[:, m + j - 2], tau))  # line 6: p_j ∝ P̃[:, m + j − 1]^{1/τ}
            x_hat.append(_sample_from(p[-1], rng))  # line 7: sample a token x̂_j from p_j
            st["draft_passes"] += 1
        # line 8: end
        P = target(np.asarray(x + x_hat))  # line 9: P ← DTransformer([x, x̂_1, …, x̂_{k'}] | θ̂_target)
        st["target_passes"] += 1
        # line 10: q_j ∝ P[:, m + j − 1]^{1/τ} for j = 1, …, k' + 1   (1-based column m + j − 1)
        q = [sampling_distribution(P[:, m + j - 2], tau) for j in range(1, kp + 2)]
        y = None
        for j in range(1, kp + 1):  # line 11: for j = 1, 2, …, k' do
            r = rng.random()  # line 12: sample r uniformly from [0, 1)
            xj = x_hat[j - 1]
            if r >= accept(q[j - 1][xj], p[j - 1][xj]):  # line 13: if r ≥ min(1, q_j[x̂_j] / p_j[x̂_j]) then
                res = np.maximum(0.0, q[j - 1] - p[j - 1])
                y = _sample_from(res if res.sum() > 0 else q[j - 1], rng)  # line 14: y ~ norm(max(0, q_j − p_j))
                x = x + x_hat[:j - 1] + [y]  # line 15: x ← [x, x̂_1, …, x̂_{j−1}, y]; continue at line 2
                st["accepted"].append(j - 1)
                break
            # line 16: end
        # line 17: end
        if y is None:
            y = _sample_from(q[kp], rng)  # line 18: sample a token y from q_{k'+1}
            x = x + x_hat + [y]  # line 19: x ← [x, x̂_1, …, x̂_{k'}, y]
            st["accepted"].append(kp)
        st["drafted"].append(kp)
    # line 20: end
    return np.asarray(x[l:l + l_gen], dtype=np.int64)  # line 21: return y = x[ℓ+1 : ℓ+ℓ_gen]
# Decoder variants (docs/variants.md): V1 RoPE, V2 ALiBi, V3 grouped-query attention, V4 SwiGLU/SiLU,
# V5 bias-free maps, V6 the DTransformer composed of them.


def rope(X, p, theta: float = 10000.0, interleaved: bool = False, rotary_pct: float = 1.0) -> np.ndarray:
    """Algorithm V1: X′ ← RoPE(X, p | θ). X ∈ R^{d×ℓ} one head's queries or keys (d even), p the absolute
    position of each column. Rows i and i + d/2 form a pair (half-split, as HF LLaMA); interleaved=True
    pairs rows 2i−1 and 2i (the RoPE paper). rotary_pct < 1 (GPT-NeoX's partial rotary): the listing on the first
    r = ⌊d · rotary_pct⌋ rows only (d = r in it), the others unchanged."""
    X = np.asarray(X, dtype=np.float64)
    r = int(X.shape[0] * rotary_pct)
    if r != X.shape[0]:
        return np.concatenate([rope(X[:r], p, theta, interleaved), X[r:]], axis=0)
    d, l = X.shape
    p = np.asarray(p)
    omega = theta ** (-2.0 * np.arange(d // 2) / d)  # line 1: ω_i ← θ^{−2(i−1)/d}
    Xp = np.empty_like(X)
    for t in range(l):  # line 2: for t ∈ [ℓ], i ∈ [d/2]
        for i in range(d // 2):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
            c, s = math.cos(p[t] * omega[i]), math.sin(p[t] * omega[i])  # line 3
            Xp[a, t] = c * X[a, t] - s * X[b, t]  # line 4
            Xp[b, t] = s * X[a, t] + c * X[b, t]  # line 5
    return Xp  # line 6


def alibi_slopes(H: int) -> np.ndarray:
    """Algorithm V2: m ← ALiBiSlopes(H) (0-based: m[h] is m_{h+1})."""
    n = 2 ** int(math.floor(math.log2(H)))  # line 1: n ← 2^{⌊log₂ H⌋}
    m = [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]  # line 2: m_h ← 2^{−8h/n}
    m += [2.0 ** (-4.0 * (2 * h - 1) / n) for h in range(1, H - n + 1)]  # line 3: m_{n+h} ← 2^{−4(2h−1)/n}
    return np.array(m)  # line 4


def alibi_bias(l_z: int, l_x: int, q0: int = 0) -> np.ndarray:
    """D of V2's line 6′: D[t_z, t_x] = |(q0 + t_x) − t_z| (the score of head h gets −m_h D)."""
    return np.abs((q0 + np.arange(l_x))[None, :] - np.arange(l_z)[:, None]).astype(np.float64)


def variant_attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, mask, *, positional: str = "none",
                      theta: float = 10000.0, slope: float = 0.0, q0: int = 0, attention: str = "softmax",
                      Omega=None, rotary_pct: float = 1.0) -> np.ndarray:
    """Algorithm 4 with V1's lines 2a–2b (positional="rope") or V2's line 6′ (positional="alibi", slope m_h);
    b_* may be None (V5). attention="performer" | "rfa": lines 4–6 replaced by V15c with the projection Omega
    (the mask must be the bidirectional or the causal one); attention="sigmoid": line 6's softmax replaced by
    sigmoid_weights."""
    d_attn = W_q.shape[0]
    l_x, l_z = X.shape[1], Z.shape[1]
    Q = W_q @ X + (0 if b_q is None else b_q[:, None])  # line 1
    K = W_k @ Z + (0 if b_k is None else b_k[:, None])  # line 2
    if positional == "rope":
        Q = rope(Q, q0 + np.arange(l_x), theta, rotary_pct=rotary_pct)  # line 2a
        K = rope(K, np.arange(l_z), theta, rotary_pct=rotary_pct)  # line 2b
    V = W_v @ Z + (0 if b_v is None else b_v[:, None])  # line 3
    B = -slope * alibi_bias(l_z, l_x, q0) if positional == "alibi" else 0.0
    if attention == "sigmoid":  # lines 4–6 with σ(· − log ℓ_z) for the softmax
        return V @ sigmoid_weights(K.T @ Q / math.sqrt(d_attn) + B, mask)
    if attention != "softmax":  # V15c instead of lines 4–6
        mask = np.asarray(mask, dtype=bool)
        if mask.all():
            return rf_attention(Q, K, V, Omega, attention, causal=False)
        if np.array_equal(mask, unidirectional_mask(l_z, l_x) if q0 == 0 else
                          (np.arange(l_z)[:, None] <= q0 + np.arange(l_x)[None, :])):
            return rf_attention(Q, K, V, Omega, attention, causal=True, q0=q0)
        raise ValueError("random-feature attention takes the bidirectional or the causal mask")
    S = K.T @ Q  # line 4
    S = np.where(mask, S, -np.inf)  # line 5
    return V @ softmax(S / math.sqrt(d_attn) + B + multiplicity_bias(mask))  # line 6 (6′ with ALiBi)


def sigmoid_weights(S, mask) -> np.ndarray:
    """Sigmoid attention's weights (Ramapuram et al. 2024, arXiv 2409.04431; attention="sigmoid"): S (ℓ_z, ℓ_x) line
    4's scaled scores (with a score bias), then line 5: A[t_z, t_x] ← 0 where ¬Mask, and line 6: A ← σ(S + b) elsewhere,
    b = −log ℓ_z (the paper's bias; ℓ_z the keys); no normalisation over the keys."""
    S = np.asarray(S, dtype=np.float64)
    b = -math.log(S.shape[0])
    return np.where(np.asarray(mask, dtype=bool), 0.5 * (1.0 + np.tanh(0.5 * (S + b))), 0.0)  # σ(x) = ½(1 + tanh(x/2))


# ---------------------------------------------------------------------------------------------------
# Algorithm V15: random-feature attention (RFA, Peng et al. 2021; Performer's FAVOR+, Choromanski et al. 2021)


def random_features(X, Omega, kind: str, query: bool = False) -> np.ndarray:
    """Algorithm V15b: Φ ← φ(X | Ω). X (d, ℓ) one head's queries or keys, Ω (D, d) the fixed projection
    (ft.random_feature_matrix). kind "performer": exp(s Ω X − ½ s² ‖X‖²)/√D (D rows); "rfa": [sin U; cos U]
    exp(½ s² ‖X‖²)/√D with U = s Ω X (2D rows); s = d^{−1/4}. query=True: each column times a positive factor
    that cancels in line 4 (performer: exp(−max_i U[i, t]) instead of the norm term; rfa: without exp(½ s² ‖x‖²))."""
    X = np.asarray(X, dtype=np.float64)
    d, D = X.shape[0], Omega.shape[0]
    s = d ** -0.25
    U = s * (Omega @ X)  # U ← s Ω X
    half = 0.5 * s * s * np.sum(X * X, axis=0)  # ½ s² ‖x_t‖²
    if kind == "performer":
        U = U - (U.max(axis=0) if query else half)[None, :]
        return np.exp(U) / math.sqrt(D)
    if kind == "rfa":
        h = np.ones_like(half) if query else np.exp(half)
        return np.concatenate([np.sin(U), np.cos(U)], axis=0) * h[None, :] / math.sqrt(D)
    raise ValueError(f"kind must be 'performer' or 'rfa', got {kind!r}")


def rf_attention(Q, K, V, Omega, kind: str, causal: bool, q0: int = 0) -> np.ndarray:
    """Algorithm V15c, lines 1–4: Ṽ ← RFAttention(Q, K, V | Ω). causal: key t_z seen by query t_x iff
    t_z ≤ q0 + t_x, by prefix sums over the keys (lines 2′–3′, one key at a time)."""
    Pq = random_features(Q, Omega, kind, query=True)  # line 1: Φ_q ← φ(Q)
    Pk = random_features(K, Omega, kind)  # Φ_k ← φ(K)
    if not causal:
        S, z = V @ Pk.T, Pk.sum(axis=1)  # line 2: S ← V Φ_kᵀ, z ← Φ_k 1
        N, n = S @ Pq, Pq.T @ z  # line 3: N ← S Φ_q, n ← Φ_qᵀ z
        return N / n[None, :]  # line 4: Ṽ = N diag(n)^{−1}
    l_x, l_z = Q.shape[1], K.shape[1]
    S, z = np.zeros((V.shape[0], Pk.shape[0])), np.zeros(Pk.shape[0])
    out, t_z = np.empty((V.shape[0], l_x)), 0
    for t in range(l_x):
        while t_z < l_z and t_z <= q0 + t:  # line 2′: S_t ← S_{t−1} + v φ(k)ᵀ, z_t ← z_{t−1} + φ(k)
            S, z = S + np.outer(V[:, t_z], Pk[:, t_z]), z + Pk[:, t_z]
            t_z += 1
        out[:, t] = (S @ Pq[:, t]) / (z @ Pq[:, t])  # lines 3′, 4
    return out


def rf_attention_quadratic(Q, K, V, Omega, kind: str, mask) -> np.ndarray:
    """The same estimator in the quadratic form: Ṽ = V A, A = (Mask ⊙ Φ_kᵀ Φ_q) normalised per column (the
    weights attention_weights returns for attention='performer'/'rfa'); the check of the prefix sums."""
    Pq, Pk = random_features(Q, Omega, kind, query=True), random_features(K, Omega, kind)
    A = np.where(mask, Pk.T @ Pq, 0.0)
    return V @ (A / A.sum(axis=0, keepdims=True))


def bigbird_mask(layout, b: int) -> np.ndarray:
    """Algorithm V17 (docs/variants.md): Mask[t_z, t_x] = [[layout[⌊t_z/b⌋, ⌊t_x/b⌋]]] for a block layout
    layout ∈ {0,1}^{n×n} (layout[j, i]: key block j live for query block i; ft.bigbird_layout draws V17a).
    An integer layout (multiplicities m, V17b's multiset note) gives M[t_z, t_x] = m_{⌊t_z/b⌋⌊t_x/b⌋} (integers:
    the listings here weigh exp(s) by it, multiplicity_bias)."""
    layout = np.asarray(layout)
    if layout.dtype == bool:
        return np.kron(layout, np.ones((b, b), dtype=bool)).astype(bool)
    return np.kron(layout.astype(np.int64), np.ones((b, b), dtype=np.int64))


def multiplicity_bias(mask):
    """V17b's multiset: a key listed m times weighs m·exp(s) in the softmax, softmax(S + log M) (log 0 = −∞ is
    the mask, applied by line 5 already); 0 for a 0/1 (bool) mask."""
    mask = np.asarray(mask)
    if mask.dtype == bool:
        return 0.0
    return np.log(np.maximum(mask, 1).astype(float))


def block_sparse_attention(Q, K, V, layout, b: int) -> np.ndarray:
    """Algorithm V17b: Ṽ ← BlockSparseAttention(Q, K, V | 𝓛, b), one head; Q, K ∈ R^{d×ℓ}, V ∈ R^{d_v×ℓ}, ℓ = n·b.
    layout bool, or integer multiplicities: J lists block j layout[j, i] times (gathered that many times)."""
    layout = np.asarray(layout)
    layout = layout.astype(np.int64)  # bool: 0/1
    n, d = layout.shape[0], Q.shape[0]
    Vt = np.zeros((V.shape[0], Q.shape[1]))
    for i in range(n):  # line 1: for each query block i
        J = np.repeat(np.arange(n), layout[:, i])  # J ← 𝓛[i] (block j m_ji times)
        cols = np.concatenate([np.arange(j * b, (j + 1) * b) for j in J])  # line 2: K_J, V_J gathered
        S = K[:, cols].T @ Q[:, i * b:(i + 1) * b] / math.sqrt(d)  # line 3: S ← K_Jᵀ Q_i / √d_attn
        Vt[:, i * b:(i + 1) * b] = V[:, cols] @ softmax(S)  # lines 4–5: Ṽ[:, block i] ← V_J softmax(S)
    return Vt


def gqa_mhattention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, W_o, b_o, mask, *, positional: str = "none",
                    theta: float = 10000.0, q0: int = 0, attention: str = "softmax", Omega=None,
                    rotary_pct: float = 1.0) -> np.ndarray:
    """Algorithm V3 (grouped-query attention): W_q (H, d_attn, d_x); W_k (H_kv, d_attn, d_z), W_v (H_kv, d_mid,
    d_z); b_* None with bias=False. With RoPE/ALiBi on every head (V1/V2). mask (ℓ_z, ℓ_x), or (H, ℓ_z, ℓ_x): one
    per query head (V17's per-head layouts)."""
    H, H_kv = W_q.shape[0], W_k.shape[0]
    if H % H_kv:
        raise ValueError(f"H_kv = {H_kv} must divide H = {H}")
    m = alibi_slopes(H) if positional == "alibi" else np.zeros(H)
    Y = []
    for h in range(1, H + 1):  # line 1: for h ∈ [H]
        g = math.ceil(h * H_kv / H)  # line 2: g ← ⌈h·H_kv/H⌉
        Y.append(variant_attention(X, Z, W_q[h - 1], None if b_q is None else b_q[h - 1], W_k[g - 1],
                                   None if b_k is None else b_k[g - 1], W_v[g - 1],
                                   None if b_v is None else b_v[g - 1], mask[h - 1] if np.ndim(mask) == 3 else mask,
                                   positional=positional, theta=theta,
                                   slope=m[h - 1], q0=q0, attention=attention, Omega=Omega,
                                   rotary_pct=rotary_pct))  # line 3
    Y = np.concatenate(Y, axis=0)  # line 4: Y ← [Y¹; …; Y^H]
    return W_o @ Y + (0 if b_o is None else b_o[:, None])  # line 5


def mla_attention(X, W_o, *, H: int, qk_rope_head_dim: int, theta: float, mask, W_dkv, gamma_kv, W_ukv,
                  W_dq=None, gamma_q=None, W_uq=None, W_q=None, q0: int = 0) -> np.ndarray:
    """Algorithm V10 (multi-head latent attention, DeepSeek-V2/V3) then Algorithm 5's lines 1–4 (no biases).
    W_uq / W_q (H, d_attn, ·), W_ukv (H, d_N + d_v, d_c), W_dkv (d_c + d_R, d_x); no query latent when W_dq is None."""
    d_R = qk_rope_head_dim
    d_attn = (W_uq if W_uq is not None else W_q).shape[1]
    d_N, d_c = d_attn - d_R, W_ukv.shape[2]
    d_v = W_ukv.shape[1] - d_N
    l = X.shape[1]
    p = q0 + np.arange(l)
    if W_dq is not None:
        C_Q = W_dq @ X  # line 1: C_Q ← W_DQ X
        C_Q_hat = rms_norm_columns(C_Q, gamma_q, 1e-6)
        Q = [W_uq[h] @ C_Q_hat for h in range(H)]  # line 2: Q ← W_UQ rms_norm(C_Q | γ_Q)
    else:
        Q = [W_q[h] @ X for h in range(H)]  # line 2 (no query latent): Q ← W_Q X
    CKR = W_dkv @ X  # line 3: [C_KV; K̃_R] ← W_DKV X
    C_hat = rms_norm_columns(CKR[:d_c], gamma_kv, 1e-6)  # line 4: Ĉ_KV ← rms_norm(C_KV | γ_KV)
    KV = [W_ukv[h] @ C_hat for h in range(H)]  # line 5: [K_N^h; V^h] ← W_UKV^h Ĉ_KV
    K_R = rope(CKR[d_c:], p, theta)  # line 6: K_R ← RoPE(K̃_R, p | θ)
    Y = []
    for h in range(H):  # Algorithm 5 line 1
        Qh = np.concatenate([Q[h][:d_N], rope(Q[h][d_N:], p, theta)], axis=0)  # line 6: Q_R^h ← RoPE(Q_R^h)
        Kh = np.concatenate([KV[h][:d_N], K_R], axis=0)  # line 7: K^h ← [K_N^h; K_R]
        Vh = KV[h][d_N:d_N + d_v]
        S = np.where(mask, Kh.T @ Qh, -np.inf)  # Algorithm 4 lines 4–5
        Y.append(Vh @ softmax(S / math.sqrt(d_attn)))  # line 6 (√(d_N + d_R))
    return W_o @ np.concatenate(Y, axis=0)  # Algorithm 5 lines 3–4


def rms1p_norm_columns(E: np.ndarray, gamma: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """The (1 + γ) RMS norm (Gemma's; norm="rms1p") on every column: ê = e / √(Σ e[i]²/d + eps) ⊙ (1 + γ), γ the
    stored offset of the gain from 1."""
    return rms_norm_columns(E, 1.0 + np.asarray(gamma), eps)


def qk_norm(M, gamma, eps: float = 0.0, norm: str = "rms") -> np.ndarray:
    """Algorithm V24 lines 1′/2′ (QK-norm): M (heads, d_attn, ℓ), every head's columns normalised by the model's
    RMS norm ("rms", or "rms1p": Gemma's (1 + γ)) with the one gain γ (d_attn,) of queries (or of keys)."""
    if norm not in ("rms", "rms1p"):
        raise ValueError(f"qk_norm normalises with an RMS norm: norm must be 'rms' or 'rms1p', got {norm!r}")
    f = rms1p_norm_columns if norm == "rms1p" else rms_norm_columns
    return np.stack([f(np.asarray(M[h], dtype=np.float64), gamma, eps) for h in range(len(M))])


def soft_cap(S, cap) -> np.ndarray:
    """Soft-capping (Gemma 2): c·tanh(S / c) element-wise; cap None or 0: S unchanged."""
    return np.asarray(S, dtype=np.float64) if not cap else cap * np.tanh(np.asarray(S, dtype=np.float64) / cap)


def capped_mhattention(X, W_q, W_k, W_v, W_o, mask, *, theta: float = 10000.0, q0: int = 0, gamma_q=None,
                       gamma_k=None, eps: float = 0.0, norm: str = "rms", query_pre_attn_scalar=None,
                       attn_logit_softcapping=None, rope_scaling_factor=None, drop=None) -> np.ndarray:
    """Algorithm 5 (self-attention, no biases, V3's H_kv heads, V1 RoPE at q0, q0+1, …) with V24's QK-norm (gamma_q,
    gamma_k given) and the 'softcap' head kernel (V25): line 4's S ← Kᵀ Q / √s with s = query_pre_attn_scalar (None:
    d_attn), then S ← c·tanh(S / c) with c = attn_logit_softcapping (None: no cap), then lines 5–6. RoPE at the
    positions p / f with f = rope_scaling_factor (linear scaling; None: 1). drop = (M (H, ℓ, ℓ), p): dropout on every
    head's weights before line 6's product (docs/regularisation.md), as mh_attention's."""
    H, H_kv, d = W_q.shape[0], W_k.shape[0], W_q.shape[1]
    l = X.shape[1]
    p = (q0 + np.arange(l)) / (rope_scaling_factor or 1.0)
    Q = np.stack([W_q[h] @ X for h in range(H)])  # line 1
    K = np.stack([W_k[g] @ X for g in range(H_kv)])  # line 2
    if gamma_q is not None:  # V24 lines 1′, 2′
        Q, K = qk_norm(Q, gamma_q, eps, norm), qk_norm(K, gamma_k, eps, norm)
    s = d if query_pre_attn_scalar is None else query_pre_attn_scalar
    Y = []
    for h in range(H):
        g = h // (H // H_kv)
        Kg = rope(K[g], p, theta)  # (self-attention: the keys at the same positions as the queries)
        S = soft_cap(Kg.T @ rope(Q[h], p, theta) / math.sqrt(s), attn_logit_softcapping)  # line 4 (V25)
        S = np.where(mask, S, -np.inf)  # line 5
        A = softmax(S)  # line 6: softmax(S) …
        if drop is not None:  # (training) A ← Dropout(A | p, M)
            A = dropout(A, drop[0][h], drop[1])
        Y.append(W_v[g] @ X @ A)  # line 6: Ṽ = V · A
    return W_o @ np.concatenate(Y, axis=0)


def gemma_layer_kinds(L: int, sliding_window=None, sliding_window_pattern=None) -> list:
    """V26: which layers attend locally (a sliding window of w keys) and which globally (causal): with a window,
    layer l (0-based) is global when (l + 1) is a multiple of the pattern p, local otherwise (p None: every layer
    local); without a window every layer is global."""
    if sliding_window is None:
        return ["global"] * L
    return ["global" if sliding_window_pattern and (l + 1) % sliding_window_pattern == 0 else "local" for l in range(L)]


def gemma_transformer(x, params, *, L: int, H: int, eps: float = 1e-6, rope_theta: float = 10000.0,
                      sliding_window=None, sliding_window_pattern=None, rope_local_base_freq=None,
                      qk_norm: bool = False, query_pre_attn_scalar=None, attn_logit_softcapping=None,
                      final_logit_softcapping=None, embed_scale=None, rope_scaling_factor=None,
                      logits: bool = False, masks=None, rates=None) -> np.ndarray:
    """Gemma 2 / Gemma 3 (text) as Algorithm 10 with their parts: the embedding times embed_scale (√d_e), norm
    "rms1p" everywhere, sandwich layers (V27: X ← X + norm(MHAttention(norm(X | γ¹)) | γ¹′), then X ← X +
    norm(GeGLU(norm(X | γ²)) | γ²′)), per-layer local/global attention (V26, gemma_layer_kinds) with RoPE θ =
    rope_local_base_freq on the local layers, V24's QK-norm, V25's scale and soft-capping of the scores, and the
    final logits soft-capped: P = softmax(c_f·tanh(W_u X / c_f)). rope_scaling_factor f: RoPE at positions p / f in the
    layers with θ = rope_theta (a local layer with rope_local_base_freq is unscaled). masks, rates: dropout on the
    attention weights (attn_dropout) with these masks (model.dropout_masks() of one sequence) at these rates
    (model.config); a mask at another place is a ValueError (this reference drops only the weights)."""
    drop = _Drop(masks, rates)
    if set(drop.masks) - {f"layers.{i}.attn.weights" for i in range(L)}:
        raise ValueError("gemma_transformer drops only the attention weights")
    x = np.asarray(x)
    l = len(x)
    X = stack_embedding(x, params["W_e"], None, scale=1.0 if embed_scale is None else embed_scale)  # lines 1–3
    kinds = gemma_layer_kinds(L, sliding_window, sliding_window_pattern)
    n = lambda A, g: rms1p_norm_columns(A, params[g], eps)
    for i in range(L):  # line 4
        pfx, a = f"layers.{i}.", f"layers.{i}.attn."
        local = kinds[i] == "local"
        mask = decoder_mask(l, sliding_window=sliding_window if local else None)
        own = local and rope_local_base_freq is not None
        theta = rope_local_base_freq if own else rope_theta
        A = capped_mhattention(n(X, pfx + "gamma1"), params[a + "W_q"], params[a + "W_k"], params[a + "W_v"],
                               params[a + "W_o"], mask, theta=theta, gamma_q=params.get(a + "gamma_q") if qk_norm else None,
                               gamma_k=params.get(a + "gamma_k") if qk_norm else None, eps=eps, norm="rms1p",
                               query_pre_attn_scalar=query_pre_attn_scalar, attn_logit_softcapping=attn_logit_softcapping,
                               rope_scaling_factor=None if own else rope_scaling_factor,
                               drop=drop.weights(a + "weights"))
        X = X + n(A, pfx + "gamma1_post")  # lines 5–6 with the sandwich's second norm
        M = geglu_mlp(n(X, pfx + "gamma2"), params[pfx + "W_gate"], params[pfx + "W_mlp1"], params[pfx + "W_mlp2"])
        X = X + n(M, pfx + "gamma2_post")  # lines 7–8
    Z = soft_cap(_unembedding_matrix(params) @ n(X, "gamma"), final_logit_softcapping)  # line 10, the logits
    return Z if logits else softmax(Z)  # line 11


def silu(x) -> np.ndarray:
    """SiLU(x) = x σ(x) = x / (1 + e^{−x}), element-wise."""
    x = np.asarray(x, dtype=np.float64)
    return x / (1.0 + np.exp(-x))


def swiglu_mlp(X_tilde, W_gate, b_gate, W_mlp1, b_mlp1, W_mlp2, b_mlp2) -> np.ndarray:
    """Algorithm V4: Y ← SwiGLU(X̃ | W_gate, W_mlp1, W_mlp2); biases may be None (V5)."""
    G = W_gate @ X_tilde + (0 if b_gate is None else b_gate[:, None])  # line 1: G ← W_gate X̃ + b_gate 1ᵀ
    U = W_mlp1 @ X_tilde + (0 if b_mlp1 is None else b_mlp1[:, None])  # line 2: U ← W_mlp1 X̃ + b_mlp1 1ᵀ
    A = silu(G) * U  # line 3: A ← SiLU(G) ⊙ U
    return W_mlp2 @ A + (0 if b_mlp2 is None else b_mlp2[:, None])  # line 4: Y = W_mlp2 A + b_mlp2 1ᵀ


def d_transformer_variant(x, params, *, L: int, H: int, norm: str = "layer", gelu: str = "exact",
                          eps: float = 1e-5, positional: str = "learned", rope_theta: float = 10000.0,
                          mlp: str = "gelu", logits: bool = False, mask: str = "causal", prefix_len: int = 0,
                          sliding_window=None, qk_rope_head_dim=None, fixnorm: bool = False, attention: str = "softmax",
                          features=None, mtp_depth: int = 0, qk_norm: bool = False, block: str = "pre_ln",
                          rotary_pct: float = 1.0, embed_scale=None):
    """Algorithm V6: DTransformer with the variants. H_kv and bias=False are read off params (W_k's heads,
    absent b's; V20's qkv_bias: b_q, b_k, b_v present, b_o and the MLP's absent); positional="rope" | "alibi" has
    no W_p (any length ℓ); mlp="swiglu" uses W_gate, mlp="relu" (V21) the MLP with φ = ReLU;
    mask="prefix" with prefix_len p (V7), sliding_window w (V8): line 6's Mask (decoder_mask);
    norm="scale": ScaleNorm (V12) with the scalar g stored as gamma1/gamma2/gamma; fixnorm: FixNorm's
    unit-norm token embedding (V13) at line 2; attention="performer" | "rfa" (V15): features[l] is layer l's Ω
    (ft.random_feature_matrix). mtp_depth = D > 0 (V16): returns (the logits W_u X, [the logits of module k,
    (N_V, ℓ − k), for k = 1..D]) instead. norm="rms1p": the (1 + γ) RMS norm; qk_norm: V24 (no biases) with each
    layer's gamma_q, gamma_k. block="parallel": every layer is parallel_block's (GPT-NeoX) in place of lines 5–8 (the
    V16 modules keep lines 5–8); block="sandwich": sandwich_block's (V27, Gemma: each sublayer's output normalised
    again with gamma1_post, gamma2_post). rotary_pct: V1 on the first ⌊d_attn · rotary_pct⌋ rows of each head. embed_scale s: the
    embedding's scale step (V27), e ← s · W_e[:, v]."""
    if norm not in ("layer", "rms", "scale", "rms1p"):
        raise ValueError(f"norm must be 'layer', 'rms', 'scale' or 'rms1p', got {norm!r}")
    x = np.asarray(x)
    get = params.get
    l = len(x)  # line 1
    has_Wp = positional in ("learned", "sinusoidal")
    X = stack_embedding(x, params["W_e"], params["W_p"] if has_Wp else None, fixnorm=fixnorm,
                        scale=1.0 if embed_scale is None else embed_scale, eps=eps)  # lines 1–3
    pos_attn = positional if positional in ("rope", "alibi") else "none"

    def nrm(X, g, b):
        if norm == "scale":
            return scale_norm_columns(X, params[g], eps)
        if norm == "rms1p":
            return rms1p_norm_columns(X, params[g], eps)
        return rms_norm_columns(X, params[g], eps) if norm == "rms" else layer_norm_columns(X, params[g], params[b], eps)

    def attn(X_tilde, p, Omega=None):  # MHAttention(X̃ | W_l, Mask) of line 6, with the variants
        a = p + "attn."
        if a + "W_dkv" not in params:
            _check_H(params, a, H)
        if a + "W_dkv" in params:  # line 6 with V10 (latent attention; qk_rope_head_dim: its d_R)
            return mla_attention(X_tilde, params[a + "W_o"], H=H, qk_rope_head_dim=qk_rope_head_dim, theta=rope_theta,
                                 mask=decoder_mask(X_tilde.shape[1], mask=mask, prefix_len=prefix_len,
                                                   sliding_window=sliding_window),
                                 **{k: get(a + k) for k in ("W_dkv", "gamma_kv", "W_ukv", "W_dq", "gamma_q", "W_uq", "W_q")})
        if qk_norm:  # line 6 with V24
            if any(a + b in params for b in ("b_q", "b_k", "b_v", "b_o")):
                raise ValueError("the reference's QK-norm attention has no biases (bias=False)")
            return capped_mhattention(X_tilde, params[a + "W_q"], params[a + "W_k"], params[a + "W_v"], params[a + "W_o"],
                                      decoder_mask(X_tilde.shape[1], mask=mask, prefix_len=prefix_len,
                                                   sliding_window=sliding_window),
                                      theta=rope_theta, gamma_q=params[a + "gamma_q"], gamma_k=params[a + "gamma_k"],
                                      eps=eps, norm=norm)
        return gqa_mhattention(X_tilde, X_tilde, params[a + "W_q"], get(a + "b_q"), params[a + "W_k"],
                               get(a + "b_k"), params[a + "W_v"], get(a + "b_v"), params[a + "W_o"],
                               get(a + "b_o"), decoder_mask(X_tilde.shape[1], mask=mask, prefix_len=prefix_len,
                                                            sliding_window=sliding_window),
                               positional=pos_attn, theta=rope_theta, attention=attention, Omega=Omega,
                               rotary_pct=rotary_pct)

    def mlp_(X_tilde, p):  # the MLP of line 8
        if mlp == "swiglu":  # V4
            return swiglu_mlp(X_tilde, params[p + "W_gate"], get(p + "b_gate"), params[p + "W_mlp1"],
                              get(p + "b_mlp1"), params[p + "W_mlp2"], get(p + "b_mlp2"))
        b1, b2 = get(p + "b_mlp1"), get(p + "b_mlp2")
        H1 = params[p + "W_mlp1"] @ X_tilde + (0 if b1 is None else b1[:, None])
        phi = relu(H1) if mlp == "relu" else _gelu_kind(H1, gelu)  # V21: mlp="relu" (OPT)
        return params[p + "W_mlp2"] @ phi + (0 if b2 is None else b2[:, None])

    def layer(X, p, Omega=None):  # lines 5–8 of the layer whose parameters are named p…
        X = X + attn(nrm(X, p + "gamma1", p + "beta1"), p, Omega)  # lines 5, 6
        return X + mlp_(nrm(X, p + "gamma2", p + "beta2"), p)      # lines 7, 8

    def parallel(X, p, Omega=None):
        return parallel_block(X, lambda Xt: attn(Xt, p, Omega), lambda Xt: mlp_(Xt, p),
                              lambda Y: nrm(Y, p + "gamma1", p + "beta1"), lambda Y: nrm(Y, p + "gamma2", p + "beta2"))

    def sandwich(X, p, Omega=None):
        return sandwich_block(X, lambda Xt: attn(Xt, p, Omega), lambda Xt: mlp_(Xt, p),
                              *(lambda Y, g=g: nrm(Y, p + "gamma" + g, p + "beta" + g) for g in ("1", "2", "1_post", "2_post")))

    if block not in ("pre_ln", "parallel", "sandwich"):
        raise ValueError(f"block must be 'pre_ln', 'parallel' or 'sandwich', got {block!r}")
    trunk = {"parallel": parallel, "sandwich": sandwich}.get(block, layer)

    for i in range(L):  # line 4
        X = trunk(X, f"layers.{i}.", None if features is None else features[i])  # lines 5–8
    W_u = _unembedding_matrix(params)
    if mtp_depth:  # V16: H⁰ = X before line 10; module k's logits W_u layer_norm(H^k | γ, β) over ℓ − k columns
        out, Hk = [], X
        for k in range(1, mtp_depth + 1):  # V16 line 2
            q = f"mtp.{k - 1}."
            E = stack_embedding(x[k:], params["W_e"], None, fixnorm=fixnorm, scale=1.0 if embed_scale is None else embed_scale,
                            eps=eps)  # W_e[:, x[t+k]], t ∈ [ℓ − k] (Algorithm 1 with the steps on its column, no position)
            Hp = params[q + "W_m"] @ np.concatenate([nrm(Hk[:, :l - k], q + "gamma_h", q + "beta_h"),
                                                      nrm(E, q + "gamma_e", q + "beta_e")], axis=0)  # line 3
            Hk = layer(Hp, q)  # line 4
            out.append(W_u @ nrm(Hk, "gamma", "beta"))  # line 5 (logits)
        mtp_logits = out
    X = nrm(X, "gamma", "beta")  # line 10
    logits_ = W_u @ X
    if mtp_depth:
        return logits_, mtp_logits
    return logits_ if logits else softmax(logits_)  # line 11


def parallel_block(X, attn, mlp, norm1, norm2) -> np.ndarray:
    """GPT-NeoX's parallel residual (block='parallel', docs/variants.md V30), in place of Algorithm 10's lines 5–8:
        1  X̃₁ ← norm(X | γ_l¹, β_l¹)
        2  X̃₂ ← norm(X | γ_l², β_l²)
        3  X ← X + MHAttention(X̃₁ | W_l, Mask) + MLP(X̃₂)
    attn, mlp, norm1, norm2: the layer's sublayers as functions of a [d_e, ℓ] matrix."""
    X1 = norm1(X)  # line 1
    X2 = norm2(X)  # line 2
    return X + attn(X1) + mlp(X2)  # line 3


def sandwich_block(X, attn, mlp, norm1, norm2, post1, post2) -> np.ndarray:
    """Gemma's sandwich layer (block='sandwich', docs/variants.md V27), Algorithm 10's lines 5–8 with each sublayer's
    output normalised again before its residual add:
        5  X̃ ← norm(X | γ_l¹)
        6  X ← X + norm(MHAttention(X̃ | W_l, Mask) | γ_l¹′)
        7  X̃ ← norm(X | γ_l²)
        8  X ← X + norm(MLP(X̃) | γ_l²′)
    attn, mlp, norm1, norm2, post1, post2: the layer's sublayers and norms as functions of a [d_e, ℓ] matrix."""
    X = X + post1(attn(norm1(X)))  # lines 5, 6
    return X + post2(mlp(norm2(X)))  # lines 7, 8


def d_mtp_loss(x, params, *, mtp_depth: int, mtp_weight: float = 0.3, terms: bool = False, **hp):
    """Algorithm V16 line 9: L = L_main + (λ/D) Σ_k L_k, L_k = −Σ_{t=1}^{ℓ−k−1} log P^k[x[t+k+1], t] (0-based:
    t = 0..ℓ−k−2, target x[t+k+1]), summed over the batch; hp: d_transformer_variant's keywords. Every sequence
    needs ℓ ≥ D + 2. terms=True returns [L_main, L_1, …, L_D] instead."""
    D = mtp_depth
    sums = np.zeros(D + 1)
    for s in _sequences(x):
        if len(s) < D + 2:
            raise ValueError(f"mtp_depth = {D}: the loss needs sequences of at least D + 2 = {D + 2} tokens")
        main, mods = d_transformer_variant(s, params, mtp_depth=D, **hp)
        sums[0] += _next_token_loss(log_softmax(main), s, 0)  # line 8
        for k, Zk in enumerate(mods, start=1):
            logP = log_softmax(Zk)
            sums[k] -= sum(logP[s[t + k + 1], t] for t in range(len(s) - k - 1))  # line 6
    if terms:
        return [float(v) for v in sums]
    return float(sums[0] + mtp_weight / D * sums[1:].sum())  # line 9


def d_variant_loss(x, params, prefix_len=0, **hp) -> float:
    """Algorithm 13 line 5 on d_transformer_variant (hp: its keywords); prefix_len as d_loss (V7)."""
    total = 0.0
    seqs = _sequences(x)
    for s, p in zip(seqs, _prefix_lens(prefix_len, len(seqs))):
        logP = log_softmax(d_transformer_variant(s, params, logits=True, prefix_len=p, **hp))
        total += _next_token_loss(logP, s, p)
    return float(total)


# ---------------------------------------------------------------------------------------------------
# Algorithm V14: the vision transformer (Dosovitskiy et al. 2021), forward only (docs/variants.md V14)


def image_patches(image, P: int) -> np.ndarray:
    """Listing V14 line 2 for one image (C, H_img, W_img): the N = (H_img/P)(W_img/P) non-overlapping P×P
    patches as the columns of a (C·P·P, N) matrix. Patches are numbered row by row (patch n = (i, j) with
    n = i·W_img/P + j); a patch is flattened channel-major, then row, then column (C, P, P) — the order of
    a convolution weight (d_e, C, P, P) flattened to (d_e, C·P·P)."""
    C, Hi, Wi = image.shape
    gh, gw = Hi // P, Wi // P
    blocks = image.reshape(C, gh, P, gw, P)  # [c, i, r, j, s] = image[c, i·P + r, j·P + s]
    return blocks.transpose(0, 2, 4, 1, 3).reshape(C * P * P, gh * gw)


def check_images(images, *, n_channels: int, image_size, patch_size: int):
    """The ValueError/TypeError a ViT raises for bad images (before anything runs): a real floating-point
    array (B, C, H_img, W_img) with C = n_channels, (H_img, W_img) = image_size and P dividing both."""
    if isinstance(patch_size, bool) or not isinstance(patch_size, (int, np.integer)) or patch_size < 1:
        raise ValueError(f"patch_size must be a positive integer, got {patch_size!r}")
    Hs, Ws = image_size
    if Hs % patch_size or Ws % patch_size:
        raise ValueError(f"patch_size {patch_size} does not divide the image size {Hs}×{Ws}")
    a = np.asarray(images)
    if a.dtype.kind not in "f":
        raise TypeError(f"images must be a floating-point array, got dtype {a.dtype}")
    if a.ndim != 4:
        raise ValueError(f"images must be 4-D (B, C, H, W), got shape {a.shape}")
    if a.shape[0] < 1:
        raise ValueError("images is an empty batch (B = 0)")
    if a.shape[1:] != (n_channels, Hs, Ws):
        raise ValueError(f"images must be (B, {n_channels}, {Hs}, {Ws}) (C, H, W of the model), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("images contain NaN or infinite values")
    return a


def vit(images, params, *, H: int, patch_size: int, eps: float = 1e-12, gelu: str = "exact",
        logits: bool = False) -> np.ndarray:
    """Listing V14: P ← ViT(images | θ), Dosovitskiy et al. 2021's vision transformer (pre-LN, GELU) as
    Hugging Face's ViTForImageClassification computes it. images (B, C, H_img, W_img) -> P (n_classes, B)
    (`logits=True`: W_c x + b_c before the softmax). θ: W_patch (d_e, C·P·P), b_patch (d_e,), x_class (d_e,),
    W_p (d_e, N + 1), layers.l.{gamma1, beta1, attn.*, gamma2, beta2, W_mlp1, b_mlp1, W_mlp2, b_mlp2},
    gamma, beta, W_c (n_classes, d_e), b_c (n_classes,)."""
    W_patch, W_p = params["W_patch"], params["W_p"]
    d_e, CPP = W_patch.shape
    C = CPP // (patch_size * patch_size)
    a = np.asarray(images)
    if a.ndim == 4:
        check_images(a, n_channels=C, image_size=a.shape[2:], patch_size=patch_size)
    else:
        raise ValueError(f"images must be 4-D (B, C, H, W), got shape {a.shape}")
    L = 1 + max(int(k.split(".")[1]) for k in params if k.startswith("layers.")) if any(
        k.startswith("layers.") for k in params) else 0
    out = []
    for image in a.astype(np.float64):  # line 1: for each image
        X_p = image_patches(image, patch_size)  # line 2: X_p ← [patch_1, …, patch_N] ∈ R^{C P² × N}
        E = W_patch @ X_p + params["b_patch"][:, None]  # line 3: E ← W_patch X_p + b_patch 1ᵀ
        if E.shape[1] + 1 != W_p.shape[1]:
            raise ValueError(f"the image has {E.shape[1]} patches, W_p has {W_p.shape[1] - 1} patch positions")
        X = np.concatenate([params["x_class"][:, None], E], axis=1) + W_p  # line 4: X ← [x_class, E] + W_p
        M = bidirectional_mask(X.shape[1], X.shape[1])
        for i in range(L):  # line 5: for l = 1, 2, …, L do
            p = f"layers.{i}."
            _check_H(params, p + "attn.", H)
            X_t = layer_norm_columns(X, params[p + "gamma1"], params[p + "beta1"], eps)  # line 6
            X = X + mh_attention(X_t, X_t, *_W(params, p + "attn."), M)  # line 7: X ← X + MHAttention(X̃ | W_l, Mask ≡ 1)
            X_t = layer_norm_columns(X, params[p + "gamma2"], params[p + "beta2"], eps)  # line 8
            X = X + params[p + "W_mlp2"] @ _gelu_kind(params[p + "W_mlp1"] @ X_t + params[p + "b_mlp1"][:, None], gelu) \
                + params[p + "b_mlp2"][:, None]  # line 9
        # line 10: end
        x = layer_norm(X[:, 0], params["gamma"], params["beta"], eps)  # line 11: x ← layer_norm(X[:, 1] | γ, β)
        out.append(params["W_c"] @ x + params["b_c"])  # line 12: z ← W_c x + b_c
    Z = np.stack(out, axis=1)
    return Z if logits else softmax(Z)  # line 13: return P = softmax(z)


# ---------------------------------------------------------------------------------------------------
# LoRA (Hu et al. 2021; docs/variants.md "LoRA", cpp/src/variants/lora.cpp)

def lora_weight(W, A, B, *, alpha: float, r: int) -> np.ndarray:
    """Line 1 of the LoRA listing: W' = W + (α/r)·B·A. W is (d_out, d_in), or stacked heads (H, d, d_in) whose row
    blocks make the (H·d, d_in) matrix; A (r, d_in), B (H·d or d_out, r). Returns W' in W's shape."""
    W = np.asarray(W)
    return W + (alpha / r) * (np.asarray(B) @ np.asarray(A)).reshape(W.shape)


class LoraDropped:
    """Lines 2′–3′ of the LoRA listing as the operand of the listing's product, for a training forward whose adapter
    input drops: `self @ X` = W X + s·B (A X̃), X̃ = Dropout(X | p, M) (line 2′ with the mask M given: the model's
    dropout_masks()[<name>.lora_dropout] of one sequence). W (d_out, d_in) or stacked heads (H, d, d_in): indexing
    gives head h's rows of W and of B (the same A and M: one dropout on the matrix's input)."""

    def __init__(self, W, A, B, s: float, M, p: float):
        self.W, self.A, self.B, self.s, self.M, self.p = np.asarray(W), np.asarray(A), np.asarray(B), s, M, p
        self.shape = self.W.shape

    def __getitem__(self, h):
        d = self.W.shape[1]
        return LoraDropped(self.W[h], self.A, self.B.reshape(self.W.shape[0], d, -1)[h], self.s, self.M, self.p)

    def __matmul__(self, X):
        X_tilde = dropout(X, self.M, self.p)  # line 2′: X̃ ← Dropout(X | p, M)
        return self.W @ X + self.s * (self.B @ (self.A @ X_tilde))  # line 3′: W X + s·B (A X̃)


def lora_params(params: dict, *, alpha: float, r: int, masks=None, dropout: float = 0.0) -> dict:
    """θ with every adapter folded in: each <name>.lora_A / <name>.lora_B pair replaced by W' = lora_weight(...)
    at <name> (what the listings compute with, and what merge_lora stores). With masks (model.dropout_masks() of
    one training forward on one sequence) and the rate `dropout`, an adapter whose <name>.lora_dropout mask is there
    is LoraDropped instead (lines 2′–3′)."""
    masks = masks or {}
    out = {k: np.asarray(v) for k, v in params.items() if not k.endswith((".lora_A", ".lora_B"))}
    for k in params:
        if k.endswith(".lora_A"):
            name = k[: -len(".lora_A")]
            A, B = params[k], params[name + ".lora_B"]
            if name + ".lora_dropout" in masks:
                out[name] = LoraDropped(params[name], A, B, alpha / r, masks[name + ".lora_dropout"], dropout)
            else:
                out[name] = lora_weight(params[name], A, B, alpha=alpha, r=r)
    return out


def conv3_columns(X, stride: int) -> np.ndarray:
    """Listing V28 lines 1 and 3: the columns of a kernel-3, padding-1 convolution with stride s over X (C, T):
    U (3C, ⌈T/s⌉), U[c·3 + k, t] = X[c, s·t + k − 1] (0-based; 0 outside [0, T))."""
    X = np.asarray(X)
    C, T = X.shape
    P = np.concatenate([np.zeros((C, 1), X.dtype), X, np.zeros((C, 1), X.dtype)], axis=1)  # F[:, 0] = F[:, T+1] = 0
    n = (T + stride - 1) // stride
    U = np.empty((C, 3, n), dtype=X.dtype)
    for k in range(3):
        U[:, k, :] = P[:, k:k + stride * (n - 1) + 1:stride]
    return U.reshape(3 * C, n)


def whisper_sinusoids(n: int, d: int) -> np.ndarray:
    """Listing V28 line 5's W_sin (d, n): openai/whisper's sinusoids(n, d) — sin(t τ_i) in the first d/2 rows,
    cos(t τ_i) in the last d/2, τ_i = 10000^(−i/(d/2 − 1)), t = 0, …, n − 1."""
    if d % 2 or d < 4:
        raise ValueError(f"d must be even and >= 4, got {d}")
    tau = np.exp(-np.log(10000.0) / (d // 2 - 1) * np.arange(d // 2))
    a = np.arange(n)[None, :] * tau[:, None]
    return np.concatenate([np.sin(a), np.cos(a)], axis=0)


def audio_front_end(F, W_c1, b_c1, W_c2, b_c2, W_sin=None) -> np.ndarray:
    """Listing V28: Z ← AudioFrontEnd(F | W_c1, b_c1, W_c2, b_c2, W_sin), Whisper's two convolutions with GELU.
    F (n_mels, T) -> Z (d_e, ⌈T/2⌉); W_c1 (d_e, 3·n_mels), W_c2 (d_e, 3·d_e) in (c, k) column order (a Conv1d
    weight (d_e, C, 3) reshaped to (d_e, 3C)). W_sin: None adds Whisper's sinusoids; an array, its first ⌈T/2⌉ columns."""
    F = np.asarray(F, dtype=np.float64)
    U = conv3_columns(F, 1)  # line 1
    H_ = gelu(W_c1 @ U + b_c1[:, None])  # line 2: H ← GELU(W_c1 U + b_c1 1ᵀ)
    V = conv3_columns(H_, 2)  # line 3
    Z = gelu(W_c2 @ V + b_c2[:, None])  # line 4: Z ← GELU(W_c2 V + b_c2 1ᵀ)
    if W_sin is None:
        W_sin = whisper_sinusoids(Z.shape[1], Z.shape[0])
    if W_sin.shape[1] < Z.shape[1]:
        raise ValueError(f"the spectrogram gives {Z.shape[1]} positions, W_sin has {W_sin.shape[1]}")
    return Z + W_sin[:, :Z.shape[1]]  # line 5: Z ← Z + W_sin[:, 1:ℓ_z]


def whisper(features, x, params, *, H: int, eps: float = 1e-5, W_sin=None, logits: bool = False) -> np.ndarray:
    """Listing V29: P ← Whisper(F, x | θ) for one spectrogram F (n_mels, T) and tokens x -> P (N_V, ℓ_x).
    θ: the names of the EDTransformer with the audio encoder — conv.{W_c1, b_c1, W_c2, b_c2}; enc.l.{gamma1, beta1,
    attn.*, gamma2, beta2, W_mlp1, b_mlp1, W_mlp2, b_mlp2}; enc.gamma, enc.beta; W_e (d_e, N_V), W_p (d_e, n_text_ctx); dec.l.{gamma1–3, beta1–3,
    attn.*, cross_attn.*, W_mlp3, b_mlp3, W_mlp4, b_mlp4}; dec.gamma, dec.beta. W_sin: the encoder's table (None:
    Whisper's sinusoids)."""
    x = np.asarray(x)
    layers = lambda g: 1 + max([int(k.split(".")[1]) for k in params if k.startswith(g + ".") and k.split(".")[1].isdigit()],
                               default=-1)
    Z = audio_front_end(features, params["conv.W_c1"], params["conv.b_c1"], params["conv.W_c2"], params["conv.b_c2"],
                        W_sin)  # line 1
    l_z, l_x = Z.shape[1], len(x)
    for i in range(layers("enc")):  # line 2: pre-LN layers, Mask ≡ 1, GELU
        p = f"enc.{i}."
        _check_H(params, p + "attn.", H)
        Zt = layer_norm_columns(Z, params[p + "gamma1"], params[p + "beta1"], eps)
        Z = Z + mh_attention(Zt, Zt, *_W(params, p + "attn."), bidirectional_mask(l_z, l_z))
        Zt = layer_norm_columns(Z, params[p + "gamma2"], params[p + "beta2"], eps)
        Z = Z + params[p + "W_mlp2"] @ gelu(params[p + "W_mlp1"] @ Zt + params[p + "b_mlp1"][:, None]) + params[p + "b_mlp2"][:, None]
    Z = layer_norm_columns(Z, params["enc.gamma"], params["enc.beta"], eps)  # line 3
    W_e = params["W_e"]
    X = W_e[:, x] + params["W_p"][:, :l_x]  # line 4: e_t ← W_e[:, x[t]] + W_p[:, t]
    for i in range(layers("dec")):  # line 5: V18a's pre-norm cross layers with layer_norm, biases, GELU
        p = f"dec.{i}."
        Xt = layer_norm_columns(X, params[p + "gamma1"], params[p + "beta1"], eps)
        X = X + mh_attention(Xt, Xt, *_W(params, p + "attn."), unidirectional_mask(l_x, l_x))
        Xt = layer_norm_columns(X, params[p + "gamma2"], params[p + "beta2"], eps)
        X = X + mh_attention(Xt, Z, *_W(params, p + "cross_attn."), bidirectional_mask(l_z, l_x))
        Xt = layer_norm_columns(X, params[p + "gamma3"], params[p + "beta3"], eps)
        X = X + params[p + "W_mlp4"] @ gelu(params[p + "W_mlp3"] @ Xt + params[p + "b_mlp3"][:, None]) + params[p + "b_mlp4"][:, None]
    X = layer_norm_columns(X, params["dec.gamma"], params["dec.beta"], eps)  # line 6
    Zl = W_e.T @ X  # line 7: P = softmax(W_eᵀ X)
    return Zl if logits else softmax(Zl)


def whisper_loss(features, x, params, **hp) -> float:
    """Algorithm 11's loss of V29 for one spectrogram: −Σ_{t=1}^{ℓ−1} log P[x[t+1], t]."""
    x = np.asarray(x)
    logP = log_softmax(whisper(features, x, params, logits=True, **hp))
    return float(-sum(logP[x[t + 1], t] for t in range(len(x) - 1)))
