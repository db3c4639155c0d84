"""Benchmark (not a test): where `attention_impl="auto"` should switch from Algorithm 4 as printed to the tiled
listing (kTiledFromLength, variants.hpp; docs/benchmarks.md "Tiled attention"). The baby GPT shape (L 4, H 4, d_e 128,
d_mlp 512, N_V 65), one process, a literal and a tiled model with the same θ, their training steps (loss_and_grad)
interleaved, literal first and tiled first in turn; per length the median wall time of each and the median
process CPU time (both threads; on a machine shared with other work it is disturbed less than the wall time),
and the ratio literal / tiled (> 1: the tiled listing faster). The load average is printed before and after.

    python bench/bench_tiled_threshold.py [--lengths 128 192 256 384 512 768 1024] [--batch 1] [--steps 9]
(with the package importable: installed, or PYTHONPATH=python FT_CORE_PATH=build/<dir> in a checkout).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from _common import cpu_model, import_ft


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 192, 256, 384, 512, 768, 1024])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=9, help="timed steps of each side per length")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    ft = import_ft()
    if args.threads:
        ft.set_num_threads(args.threads)
    print(f"CPU: {cpu_model()}; BLAS: {ft.blas_info()}; threads {ft.get_num_threads()}")
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print(f"{'ℓ':>6} {'batch':>5} | {'literal ms':>10} {'tiled ms':>9} {'ratio':>6} | {'literal CPU':>11} {'tiled CPU':>9} "
          f"{'ratio':>6}")
    rng = np.random.default_rng(0)
    for l in args.lengths:
        models = {impl: ft.DTransformer(65, l, 4, 4, 128, 512, dtype="float32", seed=0, attention_impl=impl)
                  for impl in ("literal", "tiled")}
        batch = rng.integers(0, 65, (args.batch, l))
        wall = {k: [] for k in models}
        cpu = {k: [] for k in models}
        for m in models.values():  # warm-up (buffers, caches)
            m.loss_and_grad(batch, copy=False)
        for s in range(args.steps):
            order = ("literal", "tiled") if s % 2 == 0 else ("tiled", "literal")
            for k in order:
                t0, c0 = time.perf_counter(), time.process_time()
                models[k].loss_and_grad(batch, copy=False)
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
        w = {k: statistics.median(v) * 1e3 for k, v in wall.items()}
        c = {k: statistics.median(v) * 1e3 for k, v in cpu.items()}
        print(f"{l:>6} {args.batch:>5} | {w['literal']:>10.1f} {w['tiled']:>9.1f} {w['literal'] / w['tiled']:>5.2f}x | "
              f"{c['literal']:>11.1f} {c['tiled']:>9.1f} {c['literal'] / c['tiled']:>5.2f}x", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
