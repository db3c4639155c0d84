"""Benchmark (not a test): greedy decoding (Algorithm 14 with its KV cache) in precision="bf16-mixed" against
float32, ms per generated token, on GPT-2 small's shape with random weights (docs/design.md "Mixed precision").

Two models with the same θ in one process, one per precision (float32 and bf16-mixed), timed in interleaved
rounds. Per-token cost: (T(ℓ_gen = 1 + g) − T(ℓ_gen = 1)) / g on a prompt of p tokens, so the prompt's prefill
and the call's fixed costs cancel; the fixed cost of a call, T(1), is printed beside it (bf16-mixed: the bf16
copy of θ is made by the first call and kept while θ is unchanged — the "first call" line shows that copy).
Medians over --rounds.

    FT_CORE_PATH=build/rel PYTHONPATH=python python bench/bench_bf16_decoding.py --threads 1 [--rounds 5]
        [--gen 16] [--prompt 32] [--shape gpt2|baby]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from _common import cpu_model, import_ft, load_avg

SHAPES = {"gpt2": dict(name="GPT-2 small", n_vocab=50257, l_max=1024, L=12, H=12, d_e=768, d_mlp=3072),
          "baby": dict(name="baby GPT", n_vocab=65, l_max=256, L=6, H=6, d_e=384, d_mlp=1536)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gpt2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen", type=int, default=16, help="g: generated tokens per timed call")
    ap.add_argument("--prompt", type=int, default=32, help="p: prompt tokens")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    ft = import_ft(args.threads)
    cfg = SHAPES[args.shape]
    print(f"CPU: {cpu_model()}; threads {ft.get_num_threads()}")
    print(f"BLAS: {ft.blas_info()}")
    print(f"load average before: {load_avg()}")
    dims = (cfg["n_vocab"], cfg["l_max"], cfg["L"], cfg["H"], cfg["d_e"], cfg["d_mlp"])
    models = {"float32": ft.DTransformer(*dims, seed=0), "bf16-mixed": ft.DTransformer(*dims, seed=0, precision="bf16-mixed")}
    prompt = np.random.default_rng(0).integers(0, cfg["n_vocab"], args.prompt)
    one, many = ft.DInference(1, tau=0), ft.DInference(1 + args.gen, tau=0)

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out

    first = {}
    for name, m in models.items():  # the first call (bf16-mixed: makes θ's bf16 copy)
        first[name], _ = timed(lambda: one(prompt, m))
    per_token, fixed = {k: [] for k in models}, {k: [] for k in models}
    tokens = {}
    for _ in range(args.rounds):
        for name, m in models.items():
            t1, _ = timed(lambda: one(prompt, m))
            tn, y = timed(lambda: many(prompt, m))
            tokens[name] = y
            fixed[name].append(t1)
            per_token[name].append((tn - t1) / args.gen)
    med = {k: statistics.median(v) * 1e3 for k, v in per_token.items()}
    fix = {k: statistics.median(v) * 1e3 for k, v in fixed.items()}
    print(f"\n{cfg['name']}: N_V {cfg['n_vocab']}, L {cfg['L']}, H {cfg['H']}, d_e {cfg['d_e']}, d_mlp {cfg['d_mlp']}; "
          f"prompt {args.prompt}, {args.gen} tokens per call, greedy; medians of {args.rounds} interleaved rounds")
    for k in models:
        print(f"  {k:11s} {med[k]:8.2f} ms/token   call with one token {fix[k]:8.1f} ms   first call {first[k] * 1e3:8.1f} ms")
    agree = int(np.sum(tokens["float32"] == tokens["bf16-mixed"]))
    print(f"  bf16-mixed speed-up per token: {med['float32'] / med['bf16-mixed']:.2f}x   "
          f"(tokens equal to float32's: {agree}/{len(tokens['float32'])})")
    print(f"load average after: {load_avg()}")


if __name__ == "__main__":
    main()
