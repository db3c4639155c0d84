"""An independent PyTorch transcription of Algorithms 4, 5, 6, 8, 9, 10 and the losses of Algorithms
11–13 (Phuong & Hutter 2022), in float64 with autograd: the gradient oracle of the architecture tests.

Written from the listings, not from reference.py (which it must not import), with torch's own kernels
where they exist (F.layer_norm, F.gelu, torch.softmax, F.cross_entropy) so that the two references share
no code. Column convention as in the paper: a sequence is a (d, ℓ) tensor, column t is token t; token ids
0-based. Parameters are the API's dict name → array (docs/api.md "Architectures"); a tied model may leave
`W_u` out (then W_u = W_eᵀ and its gradient flows into W_e).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

# These models are tiny: torch's intra-op threads only add overhead (and spin against the native core's
# threads on a 2-core machine: measured 30× slower), so the oracle runs single-threaded.
torch.set_num_threads(1)

ATTN = ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o")


# --- Algorithm 4: Ṽ ← Attention(X, Z | W_qkv, Mask) ------------------------------------------------
def attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, mask, drop=None):
    """X (d_x, ℓ_x), Z (d_z, ℓ_z), mask (ℓ_z, ℓ_x) bool: Mask[t_z, t_x] = token t_x may attend to t_z.
    drop: a function applying dropout to the weights (docs/regularisation.md), or None."""
    Q = W_q @ X + b_q[:, None]  # line 1
    K = W_k @ Z + b_k[:, None]  # line 2
    V = W_v @ Z + b_v[:, None]  # line 3
    S = K.T @ Q  # line 4
    S = S.masked_fill(~mask, float("-inf"))  # line 5
    A = torch.softmax(S / math.sqrt(W_q.shape[0]), dim=0)  # line 6 (softmax over each column)
    return V @ (A if drop is None else drop(A))  # line 6 (with dropout on the weights)


# --- Algorithm 5: Ṽ ← MHAttention(X, Z | W, Mask), heads stacked on the first axis ------------------
def mh_attention(X, Z, W, mask, drop=None):
    """W: dict W_q (H, d_attn, d_x), b_q (H, d_attn), W_k (H, d_attn, d_z), b_k, W_v (H, d_mid, d_z),
    b_v (H, d_mid), W_o (d_out, H·d_mid), b_o (d_out,). drop(h): head h's weight dropout, or None."""
    H = W["W_q"].shape[0]
    Y = torch.cat([attention(X, Z, W["W_q"][h], W["b_q"][h], W["W_k"][h], W["b_k"][h], W["W_v"][h], W["b_v"][h], mask,
                             None if drop is None else drop(h))
                   for h in range(H)], dim=0)  # lines 1–3
    return W["W_o"] @ Y + W["b_o"][:, None]  # line 4


# --- Algorithm 6 and RMSnorm, per column -------------------------------------------------------------
def layer_norm(X, gamma, beta, eps):
    return F.layer_norm(X.T, (X.shape[0],), gamma, beta, eps).T


def rms_norm(X, gamma, eps):
    return X / torch.sqrt((X * X).mean(dim=0, keepdim=True) + eps) * gamma[:, None]


def _mask_causal(l):
    t = torch.arange(l)
    return t[:, None] <= t[None, :]  # Mask[t_z, t_x] = [[t_z ≤ t_x]]


def _mask_full(l_z, l_x):
    return torch.ones((l_z, l_x), dtype=torch.bool)


def _embed(ids, p, stack="", *, fixnorm=False, scale=1.0, eps=1e-5, segments=None):
    """A stack's embedding (stack_embedding.hpp): e_t ← W_e[:, x[t]] + W_p[:, t] for every t, with the steps its
    options and θ hold: V13's unit-length column (fixnorm), the scale s, the decoder's own dec.W_p, BERT's W_s[:, s_t]
    (segments None: 0), the embedding's layer_norm(· | γ_e, β_e) (θ's <stack>gamma_e)."""
    ids = torch.as_tensor(np.asarray(ids), dtype=torch.long)
    E = p["W_e"][:, ids]
    if fixnorm:
        E = E / torch.sqrt((E * E).sum(0, keepdim=True) + eps)
    if scale != 1.0:
        E = scale * E
    E = E + p.get(stack + "W_p", p["W_p"])[:, : len(ids)]
    if stack + "W_s" in p:
        seg = torch.zeros(len(ids), dtype=torch.long) if segments is None else torch.as_tensor(np.asarray(segments))
        E = E + p[stack + "W_s"][:, seg]
    if stack + "gamma_e" in p:
        E = layer_norm(E, p[stack + "gamma_e"], p[stack + "beta_e"], eps)
    return E


def _W_u(p):
    return p["W_u"] if "W_u" in p else p["W_e"].T


def _attn(p, prefix):
    return {k: p[prefix + k] for k in ATTN}


class Drop:
    """Dropout with given masks (docs/regularisation.md): masks as model.dropout_masks() returns them for ONE
    sequence (True = kept), rates as model.config (embed_dropout, attn_dropout, resid_dropout). A place without
    a mask is left alone. Y ⊙ M / (1 − p), written out (not torch's F.dropout)."""

    def __init__(self, masks=None, rates=None):
        self.masks, self.rates = masks or {}, rates or {}

    def _apply(self, Y, M, p):
        return Y * torch.as_tensor(np.asarray(M), dtype=Y.dtype) / (1.0 - p)

    def out(self, name, Y, kind="resid"):  # the embeddings ("embed") or a sublayer's output ("resid")
        if name not in self.masks:
            return Y
        return self._apply(Y, self.masks[name], self.rates[kind + "_dropout"])

    def weights(self, name):  # h -> head h's dropout on its attention weights, or None
        if name not in self.masks:
            return None
        M = np.asarray(self.masks[name][0])
        return lambda h: (lambda A: self._apply(A, M[h], self.rates["attn_dropout"]))


# --- Algorithm 10: DTransformer (GPT, pre-LN) -----------------------------------------------------------
def d_logits(x, p, *, L, norm="layer", gelu="exact", eps=1e-5, drop=None, emb=None):
    approx = "tanh" if gelu == "tanh" else "none"
    nrm = (lambda X, g, b: rms_norm(X, p[g], eps)) if norm == "rms" else (lambda X, g, b: layer_norm(X, p[g], p[b], eps))
    d = drop or Drop()
    X = d.out("embed", _embed(x, p, eps=eps, **(emb or {})), "embed")  # lines 1–3 (then dropout)
    mask = _mask_causal(X.shape[1])
    for l in range(L):  # line 4
        q = f"layers.{l}."
        Xt = nrm(X, q + "gamma1", q + "beta1")  # line 5
        X = X + d.out(q + "attn.out", mh_attention(Xt, Xt, _attn(p, q + "attn."), mask, d.weights(q + "attn.weights")))  # line 6
        Xt = nrm(X, q + "gamma2", q + "beta2")  # line 7
        X = X + d.out(q + "mlp.out", p[q + "W_mlp2"] @ F.gelu(p[q + "W_mlp1"] @ Xt + p[q + "b_mlp1"][:, None], approximate=approx)
                      + p[q + "b_mlp2"][:, None])  # line 8
    X = nrm(X, "gamma", "beta")  # line 10
    return _W_u(p) @ X  # line 11 (before the softmax)


# --- Algorithm 9: ETransformer (BERT, post-LN) ------------------------------------------------------------
def e_logits(x, p, *, L, gelu="exact", eps=1e-5, drop=None, emb=None):
    approx = "tanh" if gelu == "tanh" else "none"
    d = drop or Drop()
    X = d.out("embed", _embed(x, p, eps=eps, **(emb or {})), "embed")  # lines 1–3 (then dropout)
    mask = _mask_full(X.shape[1], X.shape[1])
    for l in range(L):  # line 4
        q = f"layers.{l}."
        X = X + d.out(q + "attn.out", mh_attention(X, X, _attn(p, q + "attn."), mask, d.weights(q + "attn.weights")))  # line 5
        X = layer_norm(X, p[q + "gamma1"], p[q + "beta1"], eps)  # line 6
        X = X + d.out(q + "mlp.out", p[q + "W_mlp2"] @ F.gelu(p[q + "W_mlp1"] @ X + p[q + "b_mlp1"][:, None], approximate=approx)
                      + p[q + "b_mlp2"][:, None])  # line 7
        X = layer_norm(X, p[q + "gamma2"], p[q + "beta2"], eps)  # line 8
    X = F.gelu(p["W_f"] @ X + p["b_f"][:, None], approximate=approx)  # line 10
    X = layer_norm(X, p["gamma"], p["beta"], eps)  # line 11
    return _W_u(p) @ X  # line 12 (W_u is N_V × d_f)


# --- Algorithm 8: EDTransformer (seq2seq, post-LN, ReLU) --------------------------------------------------
def ed_logits(z, x, p, *, L_enc, L_dec, eps=1e-5, drop=None, emb=None):
    d = drop or Drop()
    Z = d.out("embed.z", _embed(z, p, "enc.", eps=eps, **(emb or {})), "embed")  # lines 1–3 (then dropout)
    l_z = Z.shape[1]
    for l in range(L_enc):  # line 4
        q = f"enc.{l}."
        Z = Z + d.out(q + "attn.out", mh_attention(Z, Z, _attn(p, q + "attn."), _mask_full(l_z, l_z), d.weights(q + "attn.weights")))  # line 5
        Z = layer_norm(Z, p[q + "gamma1"], p[q + "beta1"], eps)  # line 6
        Z = Z + d.out(q + "mlp.out", p[q + "W_mlp2"] @ torch.relu(p[q + "W_mlp1"] @ Z + p[q + "b_mlp1"][:, None]) + p[q + "b_mlp2"][:, None])  # line 7
        Z = layer_norm(Z, p[q + "gamma2"], p[q + "beta2"], eps)  # line 8
    X = d.out("embed.x", _embed(x, p, "dec.", eps=eps, **(emb or {})), "embed")  # lines 10–12 (then dropout)
    l_x = X.shape[1]
    for l in range(L_dec):  # line 13
        q = f"dec.{l}."
        X = X + d.out(q + "attn.out", mh_attention(X, X, _attn(p, q + "attn."), _mask_causal(l_x), d.weights(q + "attn.weights")))  # line 14
        X = layer_norm(X, p[q + "gamma3"], p[q + "beta3"], eps)  # line 15
        X = X + d.out(q + "cross_attn.out", mh_attention(X, Z, _attn(p, q + "cross_attn."), _mask_full(l_z, l_x),
                                                         d.weights(q + "cross_attn.weights")))  # line 16
        X = layer_norm(X, p[q + "gamma4"], p[q + "beta4"], eps)  # line 17
        X = X + d.out(q + "mlp.out", p[q + "W_mlp4"] @ torch.relu(p[q + "W_mlp3"] @ X + p[q + "b_mlp3"][:, None]) + p[q + "b_mlp4"][:, None])  # line 18
        X = layer_norm(X, p[q + "gamma5"], p[q + "beta5"], eps)  # line 19
    return _W_u(p) @ X  # line 21 (before the softmax)


# --- Losses: Algorithm 13 line 5 (D), Algorithm 12 line 9 (E), Algorithm 11 line 5 (ED) ------------------
def _nll(logits, targets, positions):
    """−Σ_{t ∈ positions} log softmax(logits)[targets[t], t], with torch's cross-entropy (log-sum-exp)."""
    if len(positions) == 0:
        return logits.sum() * 0.0
    pos = torch.as_tensor(positions, dtype=torch.long)
    tgt = torch.as_tensor(np.asarray(targets), dtype=torch.long)
    return F.cross_entropy(logits.T[pos], tgt[pos], reduction="sum")


def _seqs(x):
    return [np.asarray(x)] if np.ndim(x[0]) == 0 else [np.asarray(s) for s in x]


def d_loss(x, p, **hp):
    total = 0.0
    for s in _seqs(x):
        total = total + _nll(d_logits(s, p, **hp)[:, :-1], s[1:], list(range(len(s) - 1)))
    return total


def e_loss(x_tilde, x, p, mask_token, **hp):
    total = 0.0
    for st, s in zip(_seqs(x_tilde), _seqs(x)):
        total = total + _nll(e_logits(st, p, **hp), s, [t for t in range(len(st)) if st[t] == mask_token])
    return total


def ed_loss(z, x, p, **hp):
    total = 0.0
    for sz, sx in zip(_seqs(z), _seqs(x)):
        total = total + _nll(ed_logits(sz, sx, p, **hp)[:, :-1], sx[1:], list(range(len(sx) - 1)))
    return total


# --- numpy in, numpy out ---------------------------------------------------------------------------------
def to_torch(params, tied=False):
    """dict name → numpy array → dict name → float64 leaf tensor with requires_grad. With tied=True, W_u
    is dropped (W_u = W_eᵀ is used instead), whether or not the model lists it."""
    return {k: torch.tensor(np.array(v, dtype=np.float64), requires_grad=True)
            for k, v in params.items() if not (tied and k == "W_u")}


def loss_and_grad(kind, params, *inputs, tied=False, **hp):
    """kind "d" (inputs x), "e" (inputs x_tilde, x; hp must include mask_token), "ed" (inputs z, x).
    Returns (loss: float, grads: dict name → float64 numpy array, keys of the tensors used)."""
    p = to_torch(params, tied=tied)
    fn = {"d": d_loss, "e": e_loss, "ed": ed_loss}[kind]
    if kind == "e":
        mask_token = hp.pop("mask_token")
        loss = fn(inputs[0], inputs[1], p, mask_token, **hp)
    else:
        loss = fn(*inputs, p, **hp)
    grads = torch.autograd.grad(loss, list(p.values()), allow_unused=True)
    out = {k: (np.zeros(v.shape) if g is None else g.numpy().copy()) for (k, v), g in zip(p.items(), grads)}
    return float(loss.detach()), out


def probabilities(kind, params, *inputs, tied=False, **hp):
    """P of Algorithms 8/9/10 as a float64 numpy array (N_V, ℓ_x)."""
    p = {k: torch.tensor(np.array(v, dtype=np.float64)) for k, v in params.items() if not (tied and k == "W_u")}
    fn = {"d": d_logits, "e": e_logits, "ed": ed_logits}[kind]
    with torch.no_grad():
        return torch.softmax(fn(*inputs, p, **hp), dim=0).numpy()
