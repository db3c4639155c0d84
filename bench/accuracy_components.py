"""Measured accuracy of every component (Algorithms 1–7, softmax, GELU).
A measurement, not a test (tests/python holds the thresholds).

    python bench/accuracy_components.py [--trials 8] [--seed 0]

(with the package importable: installed, or PYTHONPATH=python FT_CORE_PATH=build/<dir> in a checkout; the
backward columns need PyTorch.) For each component, over --trials random shapes (ℓ = 1 included), the max of:

  fwd f32    forward in float32 vs reference.py (float64 numpy on the same float32 weights and inputs)
  fwd f64    forward in float64 vs reference.py
  bwd f64/torch  every gradient (inputs and parameters) of Σ G ⊙ output in float64 vs PyTorch autograd on an
             independent transcription of the listing, same weights
  bwd f32/f64    the same gradients in float32 vs float64 (same weights, rounded)
  (torch f32/f64)  the yardstick for the previous column: PyTorch's float32 backward vs its float64 one on the
             same case. Where a gradient is small next to the terms it is the difference of (the softmax
             derivative α ⊙ (dα − αᵀdα) when attention is nearly one-hot or its scores nearly equal), float32
             loses digits in any implementation; this column shows how many.

Errors are norm-wise relative, max|a − b| / max|b| per tensor. Exception: Attention's b_k, whose gradient is
0 in exact arithmetic (adding qᵀb_k to a whole column of scores leaves its softmax unchanged), is measured
relative to the largest gradient entry of the unit (otherwise it would compare rounding noise with noise).
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

try:
    import formal_transformers as ft
except ImportError:  # a checkout without an install: python/ beside this directory
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import formal_transformers as ft
from formal_transformers import reference as ref

try:
    import torch
except ImportError:  # the torch column then reads "n/a"
    torch = None

F64 = np.float64


def rel_err(a, b) -> float:
    a, b = np.asarray(a, dtype=F64), np.asarray(b, dtype=F64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-300))


def grad_errors(got: dict, want: dict) -> float:
    """Max over tensors of the relative error; b_k relative to the largest gradient of the unit (see above)."""
    scale = max(float(np.max(np.abs(np.asarray(w, dtype=F64)))) for w in want.values())
    errs = []
    for k, w in want.items():
        if k == "b_k":
            errs.append(float(np.max(np.abs(np.asarray(got[k], F64) - np.asarray(w, F64)))) / scale)
        else:
            errs.append(rel_err(got[k], w))
    return max(errs)


# ---------------------------------------------------------------------------------------------------
# PyTorch transcriptions of the listings (column convention), used for the backward column.
def t_attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, mask):
    S = (W_k @ Z + b_k[:, None]).T @ (W_q @ X + b_q[:, None])
    S = S.masked_fill(~mask, float("-inf"))
    return (W_v @ Z + b_v[:, None]) @ torch.softmax(S / math.sqrt(W_q.shape[0]), dim=0)


def t_mh_attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, W_o, b_o, mask):
    Y = torch.cat([t_attention(X, Z, W_q[h], b_q[h], W_k[h], b_k[h], W_v[h], b_v[h], mask) for h in range(W_q.shape[0])])
    return W_o @ Y + b_o[:, None]


def t_basic_attention(e, E, W_q, b_q, W_k, b_k, W_v, b_v):
    alpha = torch.softmax((W_k @ E + b_k[:, None]).T @ (W_q @ e + b_q) / math.sqrt(W_q.shape[0]), dim=0)
    return (W_v @ E + b_v[:, None]) @ alpha


def t_layer_norm(E, gamma, beta, eps):
    m = E.mean(dim=0, keepdim=True)
    v = ((E - m) ** 2).mean(dim=0, keepdim=True)
    return (E - m) / torch.sqrt(v + eps) * gamma[:, None] + beta[:, None]


def t_rms_norm(E, gamma, eps):
    return E / torch.sqrt((E**2).mean(dim=0, keepdim=True) + eps) * gamma[:, None]


# ---------------------------------------------------------------------------------------------------
def measure_unit(rng, make, x64, reference, torch_forward, input_names, randomize=True, self_attention=False):
    """(fwd f32, fwd f64, bwd f64 vs torch, bwd f32 vs f64, torch's bwd f32 vs f64) for one unit on one set
    of inputs.
    make(dtype) builds the unit; x64 are the call's inputs; reference(x, params) and torch_forward(tx, tparams)
    compute the listing; input_names name what backward() returns. self_attention: the call is u(X) and
    backward returns (dX, dZ) whose sum is the gradient of X."""
    u64, u32 = make("float64"), make("float32")
    if randomize:
        for k in u64.params:
            u64.params[k][...] = 0.5 * rng.standard_normal(u64.params[k].shape)
    for k in u64.params:
        u32.params[k] = u64.params[k]
    x32 = [x.astype(np.float32) if x.dtype.kind == "f" else x for x in x64]
    p64 = {k: np.array(v, F64) for k, v in u64.params.items()}
    p32 = {k: np.array(v, F64) for k, v in u32.params.items()}
    Y64, Y32 = u64(*x64), u32(*x32)
    fwd64 = rel_err(Y64, reference(x64, p64))
    fwd32 = rel_err(Y32, reference([x.astype(F64) if x.dtype.kind == "f" else x for x in x32], p32))

    G = rng.standard_normal(Y64.shape)

    def grads(u, g):
        g = [] if g is None else list(g) if isinstance(g, tuple) else [g]
        if self_attention:
            g = [g[0] + g[1]]
        out = dict(zip(input_names, g))
        out.update({k: np.array(v) for k, v in u.grads.items() if u.params[k].flags.writeable})
        return out

    ours64, ours32 = grads(u64, u64.backward(G)), grads(u32, u32.backward(G.astype(np.float32)))
    bwd32 = grad_errors(ours32, ours64)
    bwd_t = torch32 = float("nan")
    if torch is not None:

        def torch_grads(xs, ps, g):
            tx = [torch.tensor(x, requires_grad=(x.dtype.kind == "f")) for x in xs]
            tp = {k: torch.tensor(v, requires_grad=True) for k, v in ps.items()}
            tY = torch_forward(tx, tp)
            (tY * torch.from_numpy(g)).sum().backward()
            out = {n: tx[i].grad.numpy() for i, n in enumerate(input_names)}
            out.update({k: t.grad.numpy() for k, t in tp.items()})
            return tY.detach().numpy(), out

        tY64, want = torch_grads(x64, p64, G)
        bwd_t = max(grad_errors(ours64, want), rel_err(Y64, tY64))
        # the yardstick: PyTorch's own float32 backward vs its float64 one, same weights and inputs
        _, t32 = torch_grads(x32, {k: v.astype(np.float32) for k, v in p32.items()}, G.astype(np.float32))
        torch32 = grad_errors(t32, want)
    return fwd32, fwd64, bwd_t, bwd32, torch32


def ri(rng, lo, hi):
    return int(rng.integers(lo, hi + 1))


def explicit_mask(rng, l_z, l_x):
    m = rng.random((l_z, l_x)) < 0.5
    m[rng.integers(0, l_z, size=l_x), np.arange(l_x)] = True  # every query keeps a context token
    return m


QKV = ["W_q", "b_q", "W_k", "b_k", "W_v", "b_v"]
MH = QKV + ["W_o", "b_o"]


def trial_token_embedding(rng):
    N, d, l = ri(rng, 1, 300), ri(rng, 1, 64), ri(rng, 1, 64)
    return measure_unit(rng, lambda dt: ft.TokenEmbedding(N, d, dtype=dt, seed=1), [rng.integers(0, N, size=l)],
                        lambda x, p: ref.token_embedding(x[0], p["W_e"]), lambda x, p: p["W_e"][:, x[0]], [],
                        randomize=False)


def trial_positional_learned(rng):
    L, d, l = ri(rng, 1, 512), ri(rng, 1, 64), ri(rng, 1, 64)
    return measure_unit(rng, lambda dt: ft.PositionalEmbedding(L, d, dtype=dt, seed=2), [rng.integers(0, L, size=l)],
                        lambda x, p: ref.positional_embedding(x[0], p["W_p"]), lambda x, p: p["W_p"][:, x[0]], [],
                        randomize=False)


def trial_basic_attention(rng):
    d_in, d_attn, d_out, T = ri(rng, 1, 32), ri(rng, 1, 32), ri(rng, 1, 32), ri(rng, 1, 48)
    return measure_unit(rng, lambda dt: ft.BasicAttention(d_in, d_attn, d_out, dtype=dt),
                        [rng.standard_normal(d_in), rng.standard_normal((d_in, T))],
                        lambda x, p: ref.basic_attention(x[0], x[1], *(p[k] for k in QKV)),
                        lambda x, p: t_basic_attention(x[0], x[1], *(p[k] for k in QKV)), ["e", "E"])


def trial_attention_cross_causal(rng):
    d_x, d_z, d_attn, d_out = ri(rng, 1, 32), ri(rng, 1, 32), ri(rng, 1, 16), ri(rng, 1, 32)
    l_x, l_z = ri(rng, 1, 48), ri(rng, 1, 48)
    M = ref.unidirectional_mask(l_z, l_x)
    return measure_unit(rng, lambda dt: ft.Attention(d_x, d_z, d_attn, d_out, mask="unidirectional", dtype=dt),
                        [rng.standard_normal((d_x, l_x)), rng.standard_normal((d_z, l_z))],
                        lambda x, p: ref.attention(x[0], x[1], *(p[k] for k in QKV), M),
                        lambda x, p: t_attention(x[0], x[1], *(p[k] for k in QKV), torch.from_numpy(M)), ["X", "Z"])


def trial_mh_self_causal(rng):
    H, d_x, d_attn, d_mid, d_out, l = ri(rng, 1, 4), ri(rng, 1, 32), ri(rng, 1, 16), ri(rng, 1, 16), ri(rng, 1, 32), ri(rng, 1, 48)
    M = ref.unidirectional_mask(l, l)
    return measure_unit(rng, lambda dt: ft.MHAttention(H, d_x, d_x, d_attn, d_mid, d_out, mask="unidirectional", dtype=dt),
                        [rng.standard_normal((d_x, l))],
                        lambda x, p: ref.mh_attention(x[0], x[0], *(p[k] for k in MH), M),
                        lambda x, p: t_mh_attention(x[0], x[0], *(p[k] for k in MH), torch.from_numpy(M)), ["X"],
                        self_attention=True)


def trial_mh_cross_explicit(rng):
    H, d_x, d_z = ri(rng, 1, 4), ri(rng, 1, 32), ri(rng, 1, 32)
    d_attn, d_mid, d_out, l_x, l_z = ri(rng, 1, 16), ri(rng, 1, 16), ri(rng, 1, 32), ri(rng, 1, 48), ri(rng, 1, 48)
    M = explicit_mask(rng, l_z, l_x)
    return measure_unit(rng, lambda dt: ft.MHAttention(H, d_x, d_z, d_attn, d_mid, d_out, mask=M, dtype=dt),
                        [rng.standard_normal((d_x, l_x)), rng.standard_normal((d_z, l_z))],
                        lambda x, p: ref.mh_attention(x[0], x[1], *(p[k] for k in MH), M),
                        lambda x, p: t_mh_attention(x[0], x[1], *(p[k] for k in MH), torch.from_numpy(M)), ["X", "Z"])


def trial_layer_norm(rng):
    d, l = ri(rng, 2, 128), ri(rng, 1, 64)
    return measure_unit(rng, lambda dt: ft.LayerNorm(d, eps=1e-5, dtype=dt), [rng.standard_normal((d, l))],
                        lambda x, p: ref.layer_norm_columns(x[0], p["gamma"], p["beta"], 1e-5),
                        lambda x, p: t_layer_norm(x[0], p["gamma"], p["beta"], 1e-5), ["E"])


def trial_rms_norm(rng):
    d, l = ri(rng, 1, 128), ri(rng, 1, 64)
    return measure_unit(rng, lambda dt: ft.RMSNorm(d, eps=1e-5, dtype=dt), [rng.standard_normal((d, l))],
                        lambda x, p: ref.rms_norm_columns(x[0], p["gamma"], 1e-5),
                        lambda x, p: t_rms_norm(x[0], p["gamma"], 1e-5), ["E"])


def trial_unembedding(rng):
    N, d, l = ri(rng, 1, 1000), ri(rng, 1, 64), ri(rng, 1, 48)
    return measure_unit(rng, lambda dt: ft.Unembedding(N, d, dtype=dt, seed=3), [3 * rng.standard_normal((d, l))],
                        lambda x, p: ref.unembedding(x[0], p["W_u"]),
                        lambda x, p: torch.softmax(p["W_u"] @ x[0], dim=0), ["E"], randomize=False)


COMPONENTS = [
    ("TokenEmbedding (Alg 1)", trial_token_embedding),
    ("PositionalEmbedding learned (Alg 2)", trial_positional_learned),
    ("BasicAttention (Alg 3)", trial_basic_attention),
    ("Attention (Alg 4) cross, unidirectional", trial_attention_cross_causal),
    ("MHAttention (Alg 5) self, unidirectional", trial_mh_self_causal),
    ("MHAttention (Alg 5) cross, explicit mask", trial_mh_cross_explicit),
    ("LayerNorm (Alg 6), eps=1e-5", trial_layer_norm),
    ("RMSNorm (Alg 6 variant), eps=1e-5", trial_rms_norm),
    ("Unembedding (Alg 7)", trial_unembedding),
]


def function_measures(rng, trials):
    """softmax and GELU (free functions; their backward is exercised inside the units and the C++ tests)."""
    rows = []
    for name, f, r in [("softmax (column)", ft.softmax, ref.softmax),
                       ("gelu (exact)", ft.gelu, ref.gelu),
                       ("gelu (tanh)", lambda a: ft.gelu(a, approximate="tanh"), lambda a: ref.gelu(a, "tanh"))]:
        e32 = e64 = 0.0
        for _ in range(trials):
            A = 4 * rng.standard_normal((int(rng.integers(1, 600)), int(rng.integers(1, 64))))
            e64 = max(e64, rel_err(f(A), r(A)))
            A32 = A.astype(np.float32)
            e32 = max(e32, rel_err(f(A32), r(A32.astype(F64))))
        rows.append((name, e32, e64, None, None))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8, help="random shapes per component (the max is reported)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"formal_transformers {ft.__version__} ({os.path.dirname(ft._core.__file__)}); numpy {np.__version__}; "
          f"torch {torch.__version__ if torch is not None else 'not installed'}")
    print(f"max over {args.trials} random shapes per component of the norm-wise relative error max|a−b|/max|b|\n")
    header = (f"{'component':<42} {'fwd f32':>9} {'fwd f64':>9} {'bwd f64/torch':>14} {'bwd f32/f64':>12} "
              f"{'(torch f32/f64)':>16}")
    print(header)
    print("-" * len(header))
    fmt = lambda v: "—" if v is None else ("n/a" if v != v else f"{v:.1e}")
    for name, trial in COMPONENTS:
        worst = [0.0] * 5
        for _ in range(args.trials):
            for i, v in enumerate(trial(rng)):
                worst[i] = max(worst[i], v) if v == v and worst[i] == worst[i] else float("nan")
        print(f"{name:<42} {fmt(worst[0]):>9} {fmt(worst[1]):>9} {fmt(worst[2]):>14} {fmt(worst[3]):>12} "
              f"{fmt(worst[4]):>16}", flush=True)
    # the sinusoidal W_p: forward only (it is frozen; backward adds nothing)
    e32 = e64 = 0.0
    for _ in range(args.trials):
        L, d = int(rng.integers(1, 1024)), int(rng.integers(1, 128))
        t = np.arange(L)
        e64 = max(e64, rel_err(ft.PositionalEmbedding(L, d, "sinusoidal", dtype="float64")(t), ref.sinusoidal_positions(L, d)))
        e32 = max(e32, rel_err(ft.PositionalEmbedding(L, d, "sinusoidal", dtype="float32")(t), ref.sinusoidal_positions(L, d)))
    print(f"{'PositionalEmbedding sinusoidal (Alg 2)':<42} {fmt(e32):>9} {fmt(e64):>9} {'— (frozen)':>14} {'—':>12} {'—':>16}")
    for name, a, b, c_, d_ in function_measures(rng, args.trials):
        print(f"{name:<42} {fmt(a):>9} {fmt(b):>9} {fmt(c_):>14} {fmt(d_):>12} {'—':>16}")
    print("\n(sinusoidal f32 is vs the exact float64 formula: the error is float32 rounding of W_p itself; "
          "softmax/gelu have no Python backward: '—')")


if __name__ == "__main__":
    main()
