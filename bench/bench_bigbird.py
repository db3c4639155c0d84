"""V17 (docs/variants.md): one loss_and_grad of a small ETransformer (L 2, H 4, d_e 64, float32, batch 1) against ℓ,
with exact softmax attention as printed (attention_impl="literal"), tiled, and BigBird's block-sparse kernel
(block_size 32, window 3, 1 global block at each end, 2 random blocks), best of 3; the log-log slopes and the load.

    PYTHONPATH=python FT_CORE_PATH=build/dev python bench/bench_bigbird.py
"""
from __future__ import annotations

import os
import time

import numpy as np

import formal_transformers as ft

LENGTHS = [512, 1024, 2048, 4096]
SIDES = {"literal": dict(attention_impl="literal"), "tiled": dict(attention_impl="tiled"),
         "bigbird b=32 r=2": dict(attention="bigbird", block_size=32, n_random_blocks=2)}


def step_times(lengths=LENGTHS, repeats=3):
    rng = np.random.default_rng(1)
    res = {s: [] for s in SIDES}
    for l in lengths:
        x = list(rng.integers(0, 64, size=l))
        xt = list(x)
        xt[::7] = [64] * len(xt[::7])  # mask_token = n_vocab − 3
        for s, kw in SIDES.items():
            m = ft.ETransformer(67, max(lengths), 2, 4, 64, 256, 64, dtype="float32", seed=0, **kw)
            m.loss_and_grad(xt, x)  # warm-up
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                m.loss_and_grad(xt, x)
                best = min(best, time.perf_counter() - t)
            res[s].append(best)
    return res


def main():
    print("load average before:", os.getloadavg())
    res = step_times()
    print(f"{'ℓ':>6} " + " ".join(f"{s:>17}" for s in SIDES) + "   (ms)")
    for i, l in enumerate(LENGTHS):
        print(f"{l:>6} " + " ".join(f"{res[s][i] * 1e3:>17.1f}" for s in SIDES))
    for s in SIDES:
        print(f"{s}: log-log slope {np.polyfit(np.log(LENGTHS), np.log(res[s]), 1)[0]:.2f}")
    print("load average after:", os.getloadavg(), "BLAS:", ft.blas_info())


if __name__ == "__main__":
    main()
