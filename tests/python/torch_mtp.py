"""An independent PyTorch transcription of multi-token prediction (docs/variants.md V16; DeepSeek-V3 §2.2) on the
decoder of torch_variants.py, float64 with autograd: the gradient oracle of test_multi_token.py.

Written from the listing: the trunk's hidden states before the final norm feed module 1; module k concatenates the
normed hidden state with the normed embedding of the token k ahead (torch.cat), projects with M_k, runs one
decoder layer and predicts through the shared final norm and W_u (F.cross_entropy). Column convention: (d, ℓ).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from torch_variants import _lin, gqa


def _norm(p, X, g, b, norm, eps):
    if norm == "rms":
        return X * torch.rsqrt((X * X).mean(0, keepdim=True) + eps) * p[g][:, None]
    return F.layer_norm(X.T, (X.shape[0],), p[g], p[b], eps).T


def _layer(p, X, q, *, H, norm, gelu, eps, positional, rope_theta, mlp):
    X = X + gqa(_norm(p, X, q + "gamma1", q + "beta1", norm, eps), p, q + "attn.", H, positional, rope_theta)
    Xt = _norm(p, X, q + "gamma2", q + "beta2", norm, eps)
    if mlp == "swiglu":
        A = F.silu(_lin(p, q + "W_gate", q + "b_gate", Xt)) * _lin(p, q + "W_mlp1", q + "b_mlp1", Xt)
    else:
        A = F.gelu(_lin(p, q + "W_mlp1", q + "b_mlp1", Xt), approximate="tanh" if gelu == "tanh" else "none")
    return X + _lin(p, q + "W_mlp2", q + "b_mlp2", A)


def mtp_loss(p, s, *, L, H, D, lam, norm="layer", gelu="exact", eps=1e-5, positional="learned", rope_theta=10000.0,
             mlp="gelu"):
    kw = dict(H=H, norm=norm, gelu=gelu, eps=eps, positional=positional, rope_theta=rope_theta, mlp=mlp)
    ids = torch.as_tensor(np.asarray(s), dtype=torch.long)
    n = len(ids)
    X = p["W_e"][:, ids]
    if positional in ("learned", "sinusoidal"):
        X = X + p["W_p"][:, :n]
    for l in range(L):
        X = _layer(p, X, f"layers.{l}.", **kw)
    W_u = p["W_u"] if "W_u" in p else p["W_e"].T
    head = lambda Y: W_u @ _norm(p, Y, "gamma", "beta", norm, eps)  # noqa: E731
    main = F.cross_entropy(head(X).T[:-1], ids[1:], reduction="sum")
    extra, h = 0.0, X
    for k in range(1, D + 1):
        q = f"mtp.{k - 1}."
        h = h[:, : n - k]  # positions whose token k ahead exists
        e = p["W_e"][:, ids[k:]]
        h = p[q + "W_m"] @ torch.cat([_norm(p, h, q + "gamma_h", q + "beta_h", norm, eps),
                                      _norm(p, e, q + "gamma_e", q + "beta_e", norm, eps)], dim=0)
        h = _layer(p, h, q, **kw)
        extra = extra + F.cross_entropy(head(h).T[:-1], ids[k + 1:], reduction="sum")
    return main + lam / D * extra


def loss_and_grad(params, x, **hp):
    """The V16 loss summed over the sequences of x and every parameter's gradient (numpy)."""
    p = {k: torch.tensor(np.array(v, dtype=np.float64), requires_grad=True) for k, v in params.items()}
    loss = sum(mtp_loss(p, s, **hp) for s in x)
    grads = torch.autograd.grad(loss, list(p.values()), allow_unused=True)
    return float(loss.detach()), {k: (np.zeros(v.shape) if g is None else g.numpy().copy())
                                  for (k, v), g in zip(p.items(), grads)}
