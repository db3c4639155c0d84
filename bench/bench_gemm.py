"""GFLOP/s of one gemm through the native core (ft._core._gemm -> ft::gemm -> OpenBLAS) vs numpy.matmul,
side by side in one run. A benchmark, not a test.

    python bench/bench_gemm.py [--sizes 256 512 768 1024 2048] [--repeats 7] [--threads N]

(with the package importable: installed, or PYTHONPATH=python FT_CORE_PATH=build/<dir> in a checkout).
C = A B for square n×n matrices, 2n³ flops; each figure is the median of --repeats timed runs after a pause
(--settle) and one warm-up run. Each side gets the same numbers in its natural layout (the core
F-ordered, numpy C-ordered), so neither pays for a conversion.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

try:
    import formal_transformers as ft
except ImportError:  # a checkout without an install: python/ beside this directory
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import formal_transformers as ft


def median_seconds(f, repeats: int, settle: float) -> float:
    """Median wall time of f over `repeats` runs, after a pause and one warm-up run. The pause matters:
    numpy's OpenBLAS (a pthread pool) and the core's (OpenMP) keep spinning for a while after their last
    call, and on a 2-core machine a still-spinning pool of the other side halves the measured speed."""
    time.sleep(settle)
    f()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 768, 1024, 2048])
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per figure (median; at least 5)")
    ap.add_argument("--threads", type=int, default=None, help="ft.set_num_threads(N) before measuring")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--settle", type=float, default=0.5, help="seconds of pause before each block of runs")
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error("--repeats must be at least 5")
    if args.threads:
        ft.set_num_threads(args.threads)

    print(f"formal_transformers {ft.__version__} from {os.path.dirname(ft._core.__file__)}")
    print(f"core BLAS: {ft.blas_info()}")
    print(f"core threads: {ft.get_num_threads()}   numpy {np.__version__}   CPU: {platform.processor() or platform.machine()}"
          f"   os.cpu_count() = {os.cpu_count()}")
    print(f"median of {args.repeats} runs after a {args.settle} s pause and one warm-up; C = A B, n×n, 2n³ flops\n")
    header = f"{'dtype':<8} {'n':>5} {'ft._gemm GFLOP/s':>17} {'numpy GFLOP/s':>14} {'ft / numpy':>11} {'max rel diff':>13}"
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    for dtype in args.dtypes:
        for n in args.sizes:
            A = rng.standard_normal((n, n)).astype(dtype)
            B = rng.standard_normal((n, n)).astype(dtype)
            flops = 2.0 * n**3
            Af, Bf = np.asfortranarray(A), np.asfortranarray(B)  # each side gets its natural layout
            t_ft = median_seconds(lambda: ft._core._gemm(Af, Bf), args.repeats, args.settle)
            t_np = median_seconds(lambda: np.matmul(A, B), args.repeats, args.settle)
            C_ft, C_np = ft._core._gemm(A, B), np.matmul(A, B)
            diff = float(np.max(np.abs(C_ft - C_np)) / np.max(np.abs(C_np)))
            g_ft, g_np = flops / t_ft / 1e9, flops / t_np / 1e9
            print(f"{dtype:<8} {n:>5} {g_ft:>17.1f} {g_np:>14.1f} {g_ft / g_np:>11.2f} {diff:>13.1e}", flush=True)


if __name__ == "__main__":
    main()
