"""Benchmark (not a test): random-feature attention (docs/variants.md V15: attention="performer" | "rfa") against
exact attention (Algorithm 4 as printed, attention_impl="literal", and the tiled listing, "tiled").

1. Approximation error against D: one layer of a DTransformer (H 4, d_attn 16, causal) on ℓ random tokens with a
   random θ; the same θ with attention="softmax" gives the exact weights A = softmax(S/√d_attn). Printed: the mean
   over query columns and heads of the total-variation distance ½ Σ_t |Â[t, t_x] − A[t, t_x]| between the
   estimator's weights Â (attention_weights) and A, averaged over --seeds feature seeds, for D = 4 … 4096.
2. Step time against ℓ: one loss_and_grad (forward + backward) of a small DTransformer (L 2, H 4, d_e 64, RoPE:
   no table of positions), batch 1, float32, for literal, tiled and performer (D = --features), best of --repeats,
   and the slope of log(time) against log(ℓ) over the lengths (2 for exact attention's ℓ², 1 for linear).

    python bench/bench_random_features.py [--lengths 256 512 1024 2048 4096] [--features 64] [--repeats 3]
(with the package importable: installed, or PYTHONPATH=python FT_CORE_PATH=build/<dir> in a checkout).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from _common import cpu_model, import_ft

ft = import_ft()


def approximation_errors(kinds, Ds, l=256, seeds=3):
    exact = ft.DTransformer(67, l, 1, 4, 64, 128, dtype="float64", seed=0, positional="rope")
    rng = np.random.default_rng(0)
    for k, v in exact.params.items():  # sharper softmaxes than the initialisation's
        if "attn.W_q" in k or "attn.W_k" in k:
            v[...] = rng.normal(0, 0.1, v.shape)
    x = rng.integers(0, 64, size=l)
    exact(x)
    A = exact.attention_weights(0)
    out = {}
    for kind in kinds:
        for D in Ds:
            tv = []
            for s in range(seeds):
                m = ft.DTransformer(67, l, 1, 4, 64, 128, dtype="float64", seed=0, positional="rope", attention=kind,
                                    n_features=D, feature_seed=s)
                for k, v in exact.params.items():
                    m.params[k] = v
                m(x)
                tv.append(0.5 * np.abs(m.attention_weights(0) - A).sum(axis=1).mean())
            out[kind, D] = float(np.mean(tv))
    return out


def step_time(model, x, repeats):
    model.loss_and_grad(x)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        model.loss_and_grad(x)
        best = min(best, time.perf_counter() - t)
    return best


def slope(ls, ts):
    return float(np.polyfit(np.log(ls), np.log(ts), 1)[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--Ds", type=int, nargs="+", default=[4, 16, 64, 256, 1024, 4096])
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    print(f"CPU: {cpu_model()}; threads {ft.get_num_threads()}; load average {os.getloadavg()[0]:.1f}")
    print(f"BLAS: {ft.blas_info()}")

    errs = approximation_errors(["performer", "rfa"], a.Ds, seeds=a.seeds)
    print("\n1. weights' total-variation distance to softmax(S/√d_attn) (ℓ 256, H 4, d_attn 16, causal; "
          f"mean of {a.seeds} feature seeds)")
    print(f"{'D':>6} {'performer':>11} {'rfa':>11}")
    for D in a.Ds:
        print(f"{D:>6} {errs['performer', D]:>11.4f} {errs['rfa', D]:>11.4f}")
    for kind in ("performer", "rfa"):
        print(f"log-log slope of the error against D, {kind}: "
              f"{slope(a.Ds, [errs[kind, D] for D in a.Ds]):.2f} (1/√D: −0.5)")

    print(f"\n2. one loss_and_grad, L 2, H 4, d_e 64 (d_attn 16), RoPE, batch 1, float32; best of {a.repeats}")
    sides = {"literal": dict(attention_impl="literal"), "tiled": dict(attention_impl="tiled"),
             f"performer D={a.features}": dict(attention="performer", n_features=a.features)}
    times = {s: [] for s in sides}
    rng = np.random.default_rng(1)
    print(f"{'ℓ':>6} " + " ".join(f"{s:>16}" for s in sides) + "   (ms)")
    for l in a.lengths:
        x = list(rng.integers(0, 64, size=l))
        for s, kw in sides.items():
            m = ft.DTransformer(67, 64, 2, 4, 64, 256, dtype="float32", seed=0, positional="rope", **kw)
            times[s].append(step_time(m, x, a.repeats))
        print(f"{l:>6} " + " ".join(f"{times[s][-1] * 1e3:>16.1f}" for s in sides))
    print("log-log slope (time against ℓ): " +
          ", ".join(f"{s} {slope(a.lengths, times[s]):.2f}" for s in sides))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
