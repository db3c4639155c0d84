"""Benchmark (not a test): batched decoding (Algorithm P, docs/paged_decoding.md) against decoding the same
prompts one by one with ft.DInference, and against HF transformers' batched generate (left padding).

Workload: 32 prompts of random lengths 8–256 (uniform, seed 0), 128 new tokens each, greedy
(τ = 0), GPT-2-small shape (N_V 50257, ℓ_max 1024, L 12, H 12, d_e 768, d_mlp 3072, tied W_u, float32,
random weights). Tokens/s = (prompts × new tokens) / wall time of the whole call (prefill included).

Each side runs in its own process (a fresh interpreter per measurement: no shared caches, one BLAS pool
each), the sides interleaved round by round so machine noise hits all alike; medians over the rounds. The
CPU, the BLAS (ft.blas_info()), torch's threads and the load (os.getloadavg) are printed. Before timing, the
batched and the one-by-one outputs are checked to be the same tokens (round 1).

    FT_CORE_PATH=build/dev PYTHONPATH=python python bench/bench_batched_decoding.py [--rounds 3]
        [--prompts 32] [--new 128] [--max-batch 32] [--no-hf] [--no-single]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

GPT2_SMALL = dict(n_vocab=50257, l_max=1024, L=12, H=12, d_e=768, d_mlp=3072)


def prompts_of(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 257, n)
    return [rng.integers(0, GPT2_SMALL["n_vocab"], int(k)) for k in lengths]


def worker(side: str, n: int, new: int, max_batch: int, check: bool) -> dict:
    prompts = prompts_of(n)
    if side == "hf":
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=GPT2_SMALL["n_vocab"], n_positions=GPT2_SMALL["l_max"], n_embd=768, n_layer=12,
                         n_head=12)
        model = GPT2LMHeadModel(cfg).eval()
        width = max(len(p) for p in prompts)
        ids = torch.zeros((n, width), dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding, as decoder-only batched generation needs
            ids[i, width - len(p):] = torch.from_numpy(p.astype(np.int64))
            mask[i, width - len(p):] = 1
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                 do_sample=False, pad_token_id=0)
            dt = time.perf_counter() - t0
        assert out.shape[1] == width + new
        return {"seconds": dt, "threads": torch.get_num_threads()}
    import formal_transformers as ft

    model = ft.DTransformer(**GPT2_SMALL, tied=True, seed=0)
    inf = ft.DInference(new, 0.0, seed=0, max_batch=max_batch)
    t0 = time.perf_counter()
    if side == "batched":
        got = inf(prompts, model)
    else:
        got = [inf(p, model) for p in prompts]
    dt = time.perf_counter() - t0
    r = {"seconds": dt, "blas": ft.blas_info()}
    if check:
        r["tokens"] = [list(map(int, y)) for y in got]
    return r


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-single", action="store_true")
    ap.add_argument("--worker", choices=["batched", "single", "hf"])
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.prompts, a.new, a.max_batch, a.check)))
        return
    sides = ["batched"] + ([] if a.no_single else ["single"]) + ([] if a.no_hf else ["hf"])
    print(f"CPU: {cpu_name()}; {os.cpu_count()} logical CPUs; load (1, 5, 15 min) at start: {os.getloadavg()}")
    print(f"workload: {a.prompts} prompts of lengths 8-256, {a.new} new tokens each, greedy, GPT-2-small shape, "
          f"float32; max_batch {a.max_batch}; {a.rounds} interleaved rounds, each side in its own process")
    times: dict[str, list[float]] = {s: [] for s in sides}
    tokens: dict[str, list] = {}
    for r in range(a.rounds):
        for s in sides:
            cmd = [sys.executable, __file__, "--worker", s, "--prompts", str(a.prompts), "--new", str(a.new),
                   "--max-batch", str(a.max_batch)] + (["--check"] if r == 0 and s != "hf" else [])
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
            times[s].append(res["seconds"])
            if "tokens" in res:
                tokens[s] = res["tokens"]
            if r == 0 and "blas" in res and s == "batched":
                print("ft.blas_info():", res["blas"])
            if r == 0 and "threads" in res:
                print("torch threads:", res["threads"])
            print(f"round {r + 1} {s:8s} {res['seconds']:8.2f} s  ({a.prompts * a.new / res['seconds']:7.1f} tokens/s)"
                  f"  load {os.getloadavg()[0]:.2f}", flush=True)
    if "single" in tokens:
        same = tokens["single"] == tokens["batched"]
        print("batched tokens == one-by-one tokens:", same)
    med = {s: statistics.median(v) for s, v in times.items()}
    tps = {s: a.prompts * a.new / med[s] for s in sides}
    print("\nmedians: " + ", ".join(f"{s} {med[s]:.2f} s = {tps[s]:.1f} tokens/s" for s in sides))
    if "single" in tps:
        print(f"batched / one by one: {tps['batched'] / tps['single']:.2f}x  (target >= 3x)")
    if "hf" in tps:
        print(f"batched / HF generate (padded): {tps['batched'] / tps['hf']:.2f}x  (target >= 1x)")
    print(f"load (1, 5, 15 min) at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
