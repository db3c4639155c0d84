"""Benchmark (not a test): speculative decoding (docs/speculative_decoding.md) against Algorithm 14 on models
trained on tiny Shakespeare (characters, N_V 65).

draft:  the baby GPT — DTransformer N_V 65, ℓ_max 64, L 4, H 4, d_e 128, d_mlp 512 (tied W_u);
target: a bigger one — by default L 8, H 8, d_e 384, d_mlp 1536 (tied), same ℓ_max; --target-size L H d_e.
Both are trained here for a fixed number of steps (--draft-steps, --target-steps: the models are the same
on a busy machine and a quiet one; Adam, the notebook 06 setting: windows of ℓ_max characters at random
offsets, batch 12) and cached under ~/.cache/formal-transformers/bench_speculative (ft.save / ft.load), so
reruns only measure.

Measured, for τ in --taus and k in --ks: over --prompts prompts (the first 4 characters of validation
windows), ℓ_gen = ℓ_max − 4 + 1 = 61 tokens each: ms per generated token of ft.DInference on the target
(cached) and of ft.SpeculativeInference(target, draft), the speed-up (ratio of the two),
and the accepted drafts / tokens per target pass. τ = 0 also checks that both give the same tokens. Per prompt
the minimum over --reps repetitions (plain and speculative interleaved), then the median over prompts.
Also ft.DInference on the draft (the cost ratio c of a draft step to a target step), and the verify pass's
implied cost v in target decode steps: speculative ms/token = (target passes/token) v t_target + (draft
passes/token) t_draft, solved for v (t_· = DInference ms/token of that model). The load average is printed
before and after.

    FT_CORE_PATH=build/dev PYTHONPATH=python python bench/bench_speculative.py [--draft-steps 2500]
        [--target-steps 2000] [--target-size 8 8 384] [--train-only [draft|target]] [--prompts 8] [--reps 3] [--ks 2 4 6] [--taus 0 0.8] [--retrain]
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

L_MAX = 64
DRAFT = dict(L=4, H=4, d_e=128, d_mlp=512)
TARGET = dict(L=8, H=8, d_e=384, d_mlp=1536)
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "formal-transformers", "bench_speculative")


def train(ft, name, cfg, n_steps, train_ids, val_seqs, retrain):
    """A model of `cfg` trained for `n_steps` Adam steps (cached by config and step count)."""
    path = os.path.join(CACHE, f"{name}_L{cfg['L']}_H{cfg['H']}_de{cfg['d_e']}_{n_steps}steps.safetensors")
    model = train_cached(ft, path, lambda: ft.DTransformer(65, L_MAX, cfg["L"], cfg["H"], cfg["d_e"], cfg["d_mlp"],
                                                           tied=True, seed=0),
                         n_steps, train_ids, L_MAX, retrain, name)
    loss = model.loss(val_seqs, reduction="mean")
    print(f"{name}: {model.n_params:,} parameters, validation loss {loss:.4f} nats/char ({len(val_seqs)} windows)")
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft-steps", type=int, default=2500)
    ap.add_argument("--target-steps", type=int, default=2000)
    ap.add_argument("--train-only", choices=["both", "draft", "target"], nargs="?", const="both",
                    help="train (or load) the two models (or one) and stop")
    ap.add_argument("--target-size", type=int, nargs=3, metavar=("L", "H", "d_e"),
                    default=[TARGET["L"], TARGET["H"], TARGET["d_e"]], help="the target's L, H, d_e (d_mlp = 4 d_e)")
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6])
    add_decoding_args(ap)
    run = start_char_bench(ap, L_MAX)
    if run is None:
        return
    a, ft, chars, train_ids, val_seqs = run
    L, H, d_e = a.target_size
    target_cfg = dict(L=L, H=H, d_e=d_e, d_mlp=4 * d_e)
    if a.train_only in ("draft", "target"):  # one model (e.g. the two in parallel processes)
        cfg, steps = (DRAFT, a.draft_steps) if a.train_only == "draft" else (target_cfg, a.target_steps)
        train(ft, a.train_only, cfg, steps, train_ids, val_seqs, a.retrain)
        return
    draft = train(ft, "draft", DRAFT, a.draft_steps, train_ids, val_seqs, a.retrain)
    target = train(ft, "target", target_cfg, a.target_steps, train_ids, val_seqs, a.retrain)
    if a.train_only:
        return

    l_gen, prompts = decoding_prompts(val_seqs, a.prompts, a.reps, L_MAX)
    print(f"{'tau':>4} {'k':>3} {'DInference ms/tok':>18} {'speculative ms/tok':>19} {'speed-up':>9} "
          f"{'accepted/pass':>14} {'tokens/pass':>12} {'draft passes/tok':>17} {'verify v':>9}")
    for tau in a.taus:
        # warm-up (first-touch allocations, the thread pool), then per prompt and repetition the plain run and
        # the speculative runs one after the other, so machine noise hits them alike; per prompt the minimum
        # over --reps (noise only adds time), then the median over prompts
        ft.DInference(l_gen, tau, seed=0)(prompts[0], target)
        ft.DInference(l_gen, tau, seed=0)(prompts[0], draft)
        ft.SpeculativeInference(l_gen, a.ks[0], tau, seed=0)(prompts[0], target, draft)
        plain = [[] for _ in prompts]
        plain_draft = [[] for _ in prompts]
        spec = {k: [[] for _ in prompts] for k in a.ks}
        stats = {k: [] for k in a.ks}
        for i, x in enumerate(prompts):
            for _ in range(a.reps):
                y_plain = ms_per_token(plain[i], lambda: ft.DInference(l_gen, tau, seed=i)(x, target), l_gen)
                ms_per_token(plain_draft[i], lambda: ft.DInference(l_gen, tau, seed=i)(x, draft), l_gen)
                for k in a.ks:
                    y, st = ms_per_token(spec[k][i], lambda: ft.SpeculativeInference(l_gen, k, tau, seed=i)(
                        x, target, draft, stats=True), l_gen)
                    if tau == 0:
                        assert np.array_equal(y, y_plain), "τ = 0: speculative decoding must give the greedy tokens"
            for k in a.ks:  # the statistics of one run per prompt (the seed fixes them)
                stats[k].append(ft.SpeculativeInference(l_gen, k, tau, seed=i)(x, target, draft, stats=True)[1])
        mp = median_of_minima(plain)
        md = median_of_minima(plain_draft)
        for k in a.ks:
            ms = median_of_minima(spec[k])
            acc = statistics.median(float(np.mean(st["accepted"])) for st in stats[k])
            tpp = statistics.median(st["tokens_per_pass"] for st in stats[k])
            dpt = statistics.median(st["draft_passes"] / l_gen for st in stats[k])
            tpt = statistics.median(st["target_passes"] / l_gen for st in stats[k])
            v = (ms - dpt * md) / (tpt * mp)  # the verify pass in target decode steps (implied)
            print(f"{tau:>4} {k:>3} {mp:>18.3f} {ms:>19.3f} {mp / ms:>8.2f}x {acc:>14.2f} {tpp:>12.2f} {dpt:>17.2f}"
                  f" {v:>9.2f}", flush=True)
        print(f"  DInference on the draft: {md:.3f} ms/tok; a draft step costs c = {md / mp:.3f} target steps "
              f"(the target step = {mp / md:.1f} draft steps)")
        x = prompts[0]
        print_sample(chars, x, ft.SpeculativeInference(l_gen, a.ks[-1], tau, seed=0)(x, target, draft), tau, a.ks[-1])
    print_end("medians over prompts")


if __name__ == "__main__":
    main()
