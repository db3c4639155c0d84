"""Benchmark (not a test): Algorithm 14 (DInference) — ms per generated token with the KV cache (one column
of work per layer per new token) and without it (the listing literally: the whole model on the whole
sequence for every token), as the context grows; optionally a minimal PyTorch GPT doing the same without a
cache.

Model: DTransformer N_V 65, ℓ_max 512, L 4, H 4, d_e 128, d_mlp 512, float32 (random init, seed 0), τ = 0.
Per-token cost at context c: a prompt of p = c − g tokens, then
    (min T(ℓ_gen = 1 + g) − min T(ℓ_gen = 1)) / g,
so the prompt's processing (the cache's prefill) cancels and what remains are the g tokens generated at
contexts c − g + 1 … c (never past ℓ_max, so no sliding window). Minima over --reps repetitions of each call
(on a shared machine the minimum is the stable statistic: noise only adds time; the median of the per-rep
differences is printed beside it); the two paths alternate so machine noise hits both alike. The two paths
are first checked to give the same tokens.
PyTorch (--torch, if installed): the bench_transformers.py GPT with our parameters, greedy decoding with a
full forward of the context per token (torch.no_grad), ms per token over g tokens from the same prompt.

    FT_CORE_PATH=build/dev PYTHONPATH=python python bench/bench_inference.py [--reps 5] [--torch]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import formal_transformers as ft

CFG = dict(n_vocab=65, l_max=512, L=4, H=4, d_e=128, d_mlp=512)


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class PerToken:
    """Timings of DInference(1) and DInference(1 + g) on one prompt, one path; ms per generated token."""

    def __init__(self, model, prompt, g, cache):
        self.one = lambda: ft.DInference(1, tau=0, cache=cache)(prompt, model)
        self.many = lambda: ft.DInference(1 + g, tau=0, cache=cache)(prompt, model)
        self.g, self.t1, self.tn = g, [], []

    def rep(self):
        self.t1.append(timed(self.one))
        self.tn.append(timed(self.many))

    def ms_min(self):
        return (min(self.tn) - min(self.t1)) / self.g * 1e3

    def ms_median(self):
        return statistics.median((b - a) / self.g * 1e3 for a, b in zip(self.t1, self.tn))


def torch_per_token_ms(torch, tm, prompt, g, reps):
    idx0 = torch.from_numpy(prompt.astype(np.int64))[None, :]

    def generate():
        idx = idx0
        with torch.no_grad():
            for _ in range(g):
                T = idx.shape[1]
                x = tm.wte(idx) + tm.wpe(torch.arange(T))
                for b in tm.blocks:
                    x = b(x)
                logits = tm.lm_head(tm.ln_f(x[:, -1:]))
                idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return idx[0, prompt.size:].numpy()

    generate()  # warm-up
    samples = [timed(generate) / g * 1e3 for _ in range(reps)]
    return statistics.median(samples), generate()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="repetitions per measurement (≥3); the median is reported")
    ap.add_argument("--gen", type=int, default=32, help="g: generated tokens per measurement")
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--threads", type=int, default=None, help="threads (default: ft.get_num_threads())")
    ap.add_argument("--torch", action="store_true", help="also a PyTorch GPT without a cache")
    args = ap.parse_args()
    if args.reps < 3:
        ap.error("use at least 3 repetitions")
    if args.threads:
        ft.set_num_threads(args.threads)
    g = args.gen
    if max(args.contexts) > CFG["l_max"] or min(args.contexts) <= g:
        ap.error(f"contexts must lie in ({g}, {CFG['l_max']}]")

    model = ft.DTransformer(**CFG, dtype="float32", seed=0)
    rng = np.random.default_rng(0)
    tm = torch = None
    if args.torch:
        try:
            import torch
        except ImportError:
            print("PyTorch is not installed: no torch column")
            torch = None
        if torch is not None:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from bench_transformers import copy_ours_into_torch, torch_gpt

            torch.set_num_threads(ft.get_num_threads())
            cfg = dict(CFG, l=0, batch=1)
            tm = torch_gpt(torch, cfg, False).eval()
            copy_ours_into_torch(torch, model, tm, cfg, False)

    print(f"formal-transformers {ft.__version__}; {ft.blas_info() if callable(getattr(ft, 'blas_info', None)) else ''}")
    print(f"DInference, DTransformer N_V {CFG['n_vocab']}, l_max {CFG['l_max']}, L {CFG['L']}, H {CFG['H']}, "
          f"d_e {CFG['d_e']}, d_mlp {CFG['d_mlp']}, float32, tau=0, {ft.get_num_threads()} threads; "
          f"ms per generated token = (min T(1+{g}) - min T(1)) / {g} over {args.reps} runs "
          f"(median of per-run differences in brackets)")
    head = f"{'context':>8s}{'cached ms/tok':>22s}{'literal ms/tok':>22s}{'literal/cached':>16s}"
    if tm is not None:
        head += f"{'torch no-cache':>16s}"
    print(head)
    rows = []
    for c in args.contexts:
        prompt = rng.integers(0, CFG["n_vocab"] - 3, c - g)
        a = ft.DInference(1 + g, tau=0, cache=True)(prompt, model)
        b = ft.DInference(1 + g, tau=0, cache=False)(prompt, model)
        same = np.array_equal(a, b)
        cached, literal = PerToken(model, prompt, g, True), PerToken(model, prompt, g, False)
        cached.rep()  # warm-up (workspaces, thread pool)
        literal.rep()
        cached.t1.clear(), cached.tn.clear(), literal.t1.clear(), literal.tn.clear()
        for _ in range(args.reps):  # alternate the two paths
            cached.rep()
            literal.rep()
        mc, ml = cached.ms_min(), literal.ms_min()
        line = (f"{c:8d}{mc:12.3f} [{cached.ms_median():6.3f}]{ml:12.3f} [{literal.ms_median():7.3f}]"
                f"{ml / mc:15.1f}x")
        if tm is not None:
            mt, ty = torch_per_token_ms(torch, tm, prompt, g, args.reps)
            agree = np.array_equal(ty, a[:g])
            line += f"{mt:16.3f}" + ("" if agree else " (tokens differ)")
        if not same:
            line += "   <-- CACHED AND LITERAL TOKENS DIFFER"
        print(line)
        rows.append((c, mc, ml))
    c0, c1 = rows[0], rows[-1]
    print(f"growth from context {c0[0]} to {c1[0]} ({c1[0] / c0[0]:.0f}x longer): cached {c1[1] / c0[1]:.2f}x, "
          f"literal {c1[2] / c0[2]:.2f}x")


if __name__ == "__main__":
    main()
