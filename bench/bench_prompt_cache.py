"""Benchmark (not a test): time to the first new token after a 1,000-token prompt, recomputed (Algorithm 14's
first pass, ft.DInference(1)(prompt, model)) against continued from a prompt cache saved to disk
(ft.PromptCache.load(path, model) then ft.DInference(1)(cache, model): the load reads the file, checks the
config hash and θ's digest, and the first token is sampled from the cached logits).

GPT-2-small shape (N_V 50257, ℓ_max 1024, L 12, H 12, d_e 768, d_mlp 3072, tied, float32, random weights),
greedy. The two paths alternate over --reps repetitions in one process (the file is in the page cache after
the first read: what a server keeping its caches on a local disk sees); medians and their ratio are printed
with the CPU, ft.blas_info() and the load. The tokens of both paths are checked to be the same.

    FT_CORE_PATH=build/dev PYTHONPATH=python python bench/bench_prompt_cache.py [--reps 5] [--prompt 1000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import formal_transformers as ft

GPT2_SMALL = dict(n_vocab=50257, l_max=1024, L=12, H=12, d_e=768, d_mlp=3072)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=1000)
    a = ap.parse_args()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"CPU: {cpu}; {os.cpu_count()} logical CPUs; load at start {os.getloadavg()}")
    print("ft.blas_info():", ft.blas_info())
    model = ft.DTransformer(**GPT2_SMALL, tied=True, seed=0)
    prompt = np.random.default_rng(0).integers(0, GPT2_SMALL["n_vocab"], a.prompt)
    first = ft.DInference(1, 0.0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "prompt.safetensors")
        t0 = time.perf_counter()
        cache = ft.DInference.prefill(prompt, model)
        t_prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        cache.save(path)
        t_save = time.perf_counter() - t0
        print(f"prefill {t_prefill:.3f} s, save {t_save:.3f} s, file {os.path.getsize(path) / 2**20:.1f} MiB")
        rec, cached, loaded_only = [], [], []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            y_rec = first(prompt, model)
            rec.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            c = ft.PromptCache.load(path, model)
            t1 = time.perf_counter()
            y_c = first(c, model)
            cached.append(time.perf_counter() - t0)
            loaded_only.append(t1 - t0)
            assert np.array_equal(y_rec, y_c)
        more = ft.DInference(16, 0.0)
        assert np.array_equal(more(prompt, model), more(ft.PromptCache.load(path, model), model))
    mr, mc = statistics.median(rec), statistics.median(cached)
    print(f"time to first new token after a {a.prompt}-token prompt, medians of {a.reps}:")
    print(f"  recomputed (prefill + sample):                {mr * 1e3:9.1f} ms")
    print(f"  from the saved cache (load + check + sample): {mc * 1e3:9.1f} ms  (of which load + checks "
          f"{statistics.median(loaded_only) * 1e3:.1f} ms)")
    print(f"  ratio recomputed / cached: {mr / mc:.1f}x   (tokens identical: True)")
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
