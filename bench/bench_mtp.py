"""Benchmark (not a test): self-speculative decoding with multi-token prediction (docs/variants.md V16) against
Algorithm 14 on the project's benchmark model trained on tiny Shakespeare (characters, N_V 65).

model: the baby GPT of bench_speculative.py — DTransformer N_V 65, ℓ_max 64, L 4, H 4, d_e 128, d_mlp 512, tied —
with mtp_depth = D sequential MTP modules (--depth, default 3; mtp_weight --weight, default 0.3), trained here for
--steps Adam steps (the notebook 06 setting: windows of ℓ_max characters at random offsets, batch 12) and cached
under ~/.cache/formal-transformers/bench_mtp (ft.save / ft.load), so reruns only measure.

Measured, for τ in --taus and k ≤ D in --ks: over --prompts prompts (the first 4 characters of validation
windows), ℓ_gen = 61 tokens each: ms per generated token of ft.DInference (cached) and of
ft.SpeculativeInference(l_gen, k, τ)(x, model) (the modules draft, no second model), their ratio measured in the
same run (plain and self-speculative interleaved per prompt and repetition), the accepted drafts and the tokens
per target pass. τ = 0 also checks that both give the same tokens. Per prompt the minimum over --reps, then the
median over prompts. CPU, ft.blas_info() and the load average before and after are printed.

    FT_CORE_PATH=build/dev PYTHONPATH=python python bench/bench_mtp.py [--steps 600] [--depth 3] [--ks 1 2 3]
        [--taus 0 0.8] [--prompts 8] [--reps 3] [--retrain]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (add_decoding_args, decoding_prompts, median_of_minima, ms_per_token, print_end,  # noqa: E402
                     print_sample, start_char_bench, train_cached)
from bench_speculative import DRAFT, L_MAX  # noqa: E402

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "formal-transformers", "bench_mtp")


def train(ft, depth, weight, n_steps, train_ids, val_seqs, retrain):
    path = os.path.join(CACHE, f"baby_mtp{depth}_w{weight}_{n_steps}steps.safetensors")
    model = train_cached(ft, path, lambda: ft.DTransformer(65, L_MAX, DRAFT["L"], DRAFT["H"], DRAFT["d_e"],
                                                           DRAFT["d_mlp"], tied=True, seed=0, mtp_depth=depth,
                                                           mtp_weight=weight),
                         n_steps, train_ids, L_MAX, retrain)
    model.loss(val_seqs)
    terms = np.array(model.loss_terms()) / (len(val_seqs) * np.array([L_MAX - 1 - k for k in range(depth + 1)]))
    print(f"{model.n_params:,} parameters; validation nats/char, trunk and modules 1..D: "
          + ", ".join(f"{v:.3f}" for v in terms))
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--weight", type=float, default=0.3)
    ap.add_argument("--ks", type=int, nargs="+", default=None)
    add_decoding_args(ap)
    run = start_char_bench(ap, L_MAX)
    if run is None:
        return
    a, ft, chars, train_ids, val_seqs = run
    model = train(ft, a.depth, a.weight, a.steps, train_ids, val_seqs, a.retrain)
    ks = a.ks or list(range(1, a.depth + 1))
    l_gen, prompts = decoding_prompts(val_seqs, a.prompts, a.reps, L_MAX)
    print(f"{'tau':>4} {'k':>3} {'DInference ms/tok':>18} {'self-spec ms/tok':>17} {'speed-up':>9} "
          f"{'accepted/pass':>14} {'tokens/pass':>12}")
    for tau in a.taus:
        ft.DInference(l_gen, tau, seed=0)(prompts[0], model)
        ft.SpeculativeInference(l_gen, ks[0], tau, seed=0)(prompts[0], model)
        plain = [[] for _ in prompts]
        spec = {k: [[] for _ in prompts] for k in ks}
        stats = {k: [] for k in ks}
        for i, x in enumerate(prompts):
            for _ in range(a.reps):
                y_plain = ms_per_token(plain[i], lambda: ft.DInference(l_gen, tau, seed=i)(x, model), l_gen)
                for k in ks:
                    y, st = ms_per_token(spec[k][i], lambda: ft.SpeculativeInference(l_gen, k, tau, seed=i)(
                        x, model, stats=True), l_gen)
                    if tau == 0:
                        assert np.array_equal(y, y_plain), "τ = 0: self-speculation must give the greedy tokens"
            for k in ks:
                stats[k].append(ft.SpeculativeInference(l_gen, k, tau, seed=i)(x, model, stats=True)[1])
        mp = median_of_minima(plain)
        for k in ks:
            ms = median_of_minima(spec[k])
            acc = statistics.median(float(np.mean(st["accepted"][1:])) for st in stats[k])  # [0]: the prompt's pass
            tpp = statistics.median(st["tokens_per_pass"] for st in stats[k])
            print(f"{tau:>4} {k:>3} {mp:>18.3f} {ms:>17.3f} {mp / ms:>8.2f}x {acc:>14.2f} {tpp:>12.2f}", flush=True)
        x = prompts[0]
        print_sample(chars, x, ft.SpeculativeInference(l_gen, ks[-1], tau, seed=0)(x, model), tau, ks[-1])
    print_end("the ratio is of runs interleaved in one process")


if __name__ == "__main__":
    main()
