"""An independent PyTorch transcription of the decoder variants of docs/variants.md (RoPE, ALiBi, grouped-query
attention, SwiGLU, bias-free maps) inside Algorithm 10, float64 with autograd: the gradient oracle of
test_variants.py.

Written from the listings, not from reference.py or the core: RoPE in the vectorised `rotate_half` form
(cos/sin tables, no per-pair loop), the ALiBi slopes by Press et al.'s recursive construction (not the
closed form of listing V2), grouped-query attention by repeating each key/value head over its group
(`repeat_interleave`), SiLU from torch (F.silu). Column convention: a sequence is a (d, ℓ) tensor.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)


def rope(X, pos, theta, rotary_pct=1.0):
    """X (n_heads, d, ℓ), pos (ℓ,) -> rotated, pairs (i, i + d/2); rotary_pct < 1: the first int(d·rotary_pct) rows
    only (GPT-NeoX's rotate_half on q[..., :rotary_ndims])."""
    r = int(X.shape[1] * rotary_pct)
    if r != X.shape[1]:
        return torch.cat([rope(X[:, :r], pos, theta), X[:, r:]], dim=1)
    d = X.shape[1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))  # (d/2,)
    ang = pos.to(torch.float64)[None, :] * inv[:, None]  # (d/2, ℓ)
    cos, sin = torch.cat([ang.cos(), ang.cos()], 0), torch.cat([ang.sin(), ang.sin()], 0)  # (d, ℓ)
    rot = torch.cat([-X[:, d // 2:], X[:, : d // 2]], dim=1)  # rotate_half
    return X * cos + rot * sin


def alibi_slopes(H):
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(H).is_integer():
        return pow2(H)
    c = 2 ** math.floor(math.log2(H))
    return pow2(c) + alibi_slopes(2 * c)[0::2][: H - c]


def features(X, Omega, kind):
    """φ of V15b on (heads, d, ℓ) with no stabiliser (queries and keys alike): performer exp(ΩX s − ½ s²‖x‖²)/√D,
    rfa [sin; cos](ΩX s) exp(½ s²‖x‖²)/√D."""
    d, D = X.shape[1], Omega.shape[0]
    s = d ** -0.25
    U = torch.einsum("md,hdt->hmt", Omega, X) * s
    sq = 0.5 * s * s * (X * X).sum(1, keepdim=True)
    if kind == "performer":
        return torch.exp(U - sq) / math.sqrt(D)
    return torch.cat([torch.sin(U), torch.cos(U)], 1) * torch.exp(sq) / math.sqrt(D)


def gqa(X, p, a, H, positional, theta, attention="softmax", Omega=None, causal_mask=True, rotary_pct=1.0):
    """Causal self-attention with H query heads and H_kv = W_k's heads; X (d, ℓ). attention="performer" |
    "rfa": the random-feature estimate in its quadratic form, A = Mask ⊙ φ(K)ᵀφ(Q) normalised per column;
    attention="sigmoid": A = Mask ⊙ σ(S − log ℓ)."""
    W_q, W_k, W_v = p[a + "W_q"], p[a + "W_k"], p[a + "W_v"]
    H_kv, d_attn, l = W_k.shape[0], W_q.shape[1], X.shape[1]

    def proj(W, b):
        Y = torch.einsum("hij,jt->hit", W, X)
        return Y if b not in p else Y + p[b][:, :, None]

    Q, K, V = proj(W_q, a + "b_q"), proj(W_k, a + "b_k"), proj(W_v, a + "b_v")  # (heads, d, ℓ)
    pos = torch.arange(l)
    if positional == "rope":
        Q, K = rope(Q, pos, theta, rotary_pct), rope(K, pos, theta, rotary_pct)
    K = K.repeat_interleave(H // H_kv, dim=0)  # each key/value head serves H/H_kv consecutive query heads
    V = V.repeat_interleave(H // H_kv, dim=0)
    causal = pos[:, None] <= pos[None, :]
    if attention in ("performer", "rfa"):
        A = torch.einsum("hmz,hmx->hzx", features(K, Omega, attention), features(Q, Omega, attention))
        if causal_mask:
            A = A * causal.to(torch.float64)
        Y = torch.einsum("hdz,hzx->hdx", V, A / A.sum(1, keepdim=True)).reshape(-1, l)
        out = p[a + "W_o"] @ Y
        return out if (a + "b_o") not in p else out + p[a + "b_o"][:, None]
    S = torch.einsum("hiz,hix->hzx", K, Q) / math.sqrt(d_attn)  # (H, ℓ_z, ℓ_x)
    if positional == "alibi":
        dist = (pos[None, :] - pos[:, None]).abs().to(torch.float64)  # |t_x − t_z|
        S = S - torch.tensor(alibi_slopes(H), dtype=torch.float64)[:, None, None] * dist
    if attention == "sigmoid":  # Ramapuram et al. 2024: σ(S − log ℓ) on the causal entries, 0 above, no normalisation
        A = torch.sigmoid(S - math.log(l)).masked_fill(~causal, 0.0)
    else:
        A = torch.softmax(S.masked_fill(~causal, float("-inf")), dim=1)
    Y = torch.einsum("hdz,hzx->hdx", V, A).reshape(-1, l)
    out = p[a + "W_o"] @ Y
    return out if (a + "b_o") not in p else out + p[a + "b_o"][:, None]


def _lin(p, W, b, X):
    Y = p[W] @ X
    return Y if b not in p else Y + p[b][:, None]


def d_logits(x, p, *, L, H, norm="layer", gelu="exact", eps=1e-5, positional="learned", rope_theta=10000.0,
             mlp="gelu", fixnorm=False, attention="softmax", features=None, block="pre_ln", rotary_pct=1.0):
    ids = torch.as_tensor(np.asarray(x), dtype=torch.long)
    W_e = p["W_e"]
    if fixnorm:  # V13: every column of W_e scaled to unit length (eps inside the root)
        W_e = W_e / torch.sqrt((W_e * W_e).sum(0, keepdim=True) + eps)
    X = W_e[:, ids]
    if positional in ("learned", "sinusoidal"):
        X = X + p["W_p"][:, : len(ids)]

    def nrm(X, g, b):
        if norm == "rms":
            return X * torch.rsqrt((X * X).mean(0, keepdim=True) + eps) * p[g][:, None]
        if norm == "scale":  # V12: one scalar g, ‖·‖ over the column
            return p[g] * X / torch.linalg.vector_norm(torch.cat([X, torch.full((1, X.shape[1]), math.sqrt(eps),
                                                                             dtype=X.dtype)]), dim=0)
        return F.layer_norm(X.T, (X.shape[0],), p[g], p[b], eps).T

    def ffn(Xt, q):
        if mlp == "swiglu":
            A = F.silu(_lin(p, q + "W_gate", q + "b_gate", Xt)) * _lin(p, q + "W_mlp1", q + "b_mlp1", Xt)
        elif mlp == "relu":  # V21
            A = F.relu(_lin(p, q + "W_mlp1", q + "b_mlp1", Xt))
        else:
            A = F.gelu(_lin(p, q + "W_mlp1", q + "b_mlp1", Xt), approximate="tanh" if gelu == "tanh" else "none")
        return _lin(p, q + "W_mlp2", q + "b_mlp2", A)

    for l in range(L):
        q = f"layers.{l}."
        Om = None if features is None else torch.as_tensor(features[l], dtype=torch.float64)
        if block == "parallel":  # GPT-NeoX's parallel residual: both sublayers read the layer's input
            X = (X + gqa(nrm(X, q + "gamma1", q + "beta1"), p, q + "attn.", H, positional, rope_theta, attention, Om,
                         rotary_pct=rotary_pct)
                 + ffn(nrm(X, q + "gamma2", q + "beta2"), q))
            continue
        if block == "sandwich":  # V27 (Gemma): each sublayer's output normalised again before its residual add
            X = X + nrm(gqa(nrm(X, q + "gamma1", q + "beta1"), p, q + "attn.", H, positional, rope_theta, attention, Om,
                            rotary_pct=rotary_pct), q + "gamma1_post", q + "beta1_post")
            X = X + nrm(ffn(nrm(X, q + "gamma2", q + "beta2"), q), q + "gamma2_post", q + "beta2_post")
            continue
        X = X + gqa(nrm(X, q + "gamma1", q + "beta1"), p, q + "attn.", H, positional, rope_theta, attention, Om,
                    rotary_pct=rotary_pct)
        X = X + ffn(nrm(X, q + "gamma2", q + "beta2"), q)
    X = nrm(X, "gamma", "beta")
    return (p["W_u"] if "W_u" in p else p["W_e"].T) @ X


def loss_and_grad(params, x, **hp):
    """Algorithm 13 line 5 summed over the sequences of x, and every parameter's gradient (numpy)."""
    p = {k: torch.tensor(np.array(v, dtype=np.float64), requires_grad=True) for k, v in params.items()}
    seqs = [np.asarray(x)] if np.ndim(x[0]) == 0 else [np.asarray(s) for s in x]
    loss = 0.0
    for s in seqs:
        Z = d_logits(s, p, **hp)
        loss = loss + F.cross_entropy(Z.T[:-1], torch.as_tensor(s[1:], dtype=torch.long), reduction="sum")
    grads = torch.autograd.grad(loss, list(p.values()), allow_unused=True)
    return float(loss.detach()), {k: (np.zeros(v.shape) if g is None else g.numpy().copy())
                                  for (k, v), g in zip(p.items(), grads)}
