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
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu_model, import_ft  # noqa: E402

L_MAX = 64
DRAFT = dict(L=4, H=4, d_e=128, d_mlp=512)
TARGET = dict(L=8, H=8, d_e=384, d_mlp=1536)
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "formal-transformers", "bench_speculative")


def load_text(ft):
    try:
        return ft.datasets.tiny_shakespeare()
    except Exception as e:  # absent and not downloadable here
        print(f"skipped: tiny Shakespeare not available ({e})")
        return None


def train(ft, name, cfg, n_steps, train_ids, val_seqs, retrain):
    """A model of `cfg` trained for `n_steps` Adam steps (cached by config and step count)."""
    os.makedirs(CACHE, exist_ok=True)
    path = os.path.join(CACHE, f"{name}_L{cfg['L']}_H{cfg['H']}_de{cfg['d_e']}_{n_steps}steps.safetensors")
    if os.path.exists(path) and not retrain:
        model = ft.load(path)
        print(f"{name}: loaded {path}")
    else:
        model = ft.DTransformer(65, L_MAX, cfg["L"], cfg["H"], cfg["d_e"], cfg["d_mlp"], tied=True, seed=0)
        rng = np.random.default_rng(0)
        offsets = rng.integers(0, len(train_ids) - L_MAX + 1, size=12 * n_steps)  # windows drawn up front
        seqs = np.lib.stride_tricks.sliding_window_view(train_ids, L_MAX)[offsets]
        t0 = time.perf_counter()
        trainer = ft.DTraining(n_epochs=1, eta=1e-3, optimizer="adam", betas=(0.9, 0.99), weight_decay=0.1,
                               batch_size=12, reduction="mean", shuffle=False, schedule="cosine", warmup=100,
                               min_lr=1e-4, clip=1.0, max_steps=n_steps, seed=0, progress=False)
        trainer(seqs, model)
        ft.save(model, path)
        print(f"{name}: trained {n_steps} steps in {time.perf_counter() - t0:.0f} s "
              f"(load average {os.getloadavg()[0]:.1f}) -> {path}")
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
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6])
    ap.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.8])
    ap.add_argument("--retrain", action="store_true")
    a = ap.parse_args()
    ft = import_ft()
    text = load_text(ft)
    if text is None:
        return
    chars = np.array(sorted(set(text)))
    assert len(chars) == 65
    ids = np.searchsorted(chars, np.array(list(text)))
    n_train = int(0.9 * len(ids))
    train_ids, val_ids = ids[:n_train], ids[n_train:]
    val_seqs = np.stack([s for s in ft.chunk(val_ids, L_MAX) if len(s) == L_MAX])[:200]

    print(f"CPU: {cpu_model()}; os.cpu_count() = {os.cpu_count()}; threads {ft.get_num_threads()}")
    print(f"BLAS: {ft.blas_info()}")
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
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

    l_gen = L_MAX - 4 + 1
    prompts = [val_seqs[i * (len(val_seqs) // a.prompts)][:4] for i in range(a.prompts)]
    print(f"\nℓ_gen = {l_gen} tokens after {a.prompts} prompts of 4 characters; per prompt the minimum over "
          f"{a.reps} repetitions, then the median over prompts")
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
                t0 = time.perf_counter()
                y_plain = ft.DInference(l_gen, tau, seed=i)(x, target)
                plain[i].append(1e3 * (time.perf_counter() - t0) / l_gen)
                t0 = time.perf_counter()
                ft.DInference(l_gen, tau, seed=i)(x, draft)
                plain_draft[i].append(1e3 * (time.perf_counter() - t0) / l_gen)
                for k in a.ks:
                    t0 = time.perf_counter()
                    y, st = ft.SpeculativeInference(l_gen, k, tau, seed=i)(x, target, draft, stats=True)
                    spec[k][i].append(1e3 * (time.perf_counter() - t0) / l_gen)
                    if tau == 0:
                        assert np.array_equal(y, y_plain), "τ = 0: speculative decoding must give the greedy tokens"
            for k in a.ks:  # the statistics of one run per prompt (the seed fixes them)
                stats[k].append(ft.SpeculativeInference(l_gen, k, tau, seed=i)(x, target, draft, stats=True)[1])
        mp = statistics.median(min(t) for t in plain)
        md = statistics.median(min(t) for t in plain_draft)
        for k in a.ks:
            ms = statistics.median(min(t) for t in spec[k])
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
        print(f"  sample (τ = {tau}, k = {a.ks[-1]}): {''.join(chars[x])}"
              f"{''.join(chars[ft.SpeculativeInference(l_gen, a.ks[-1], tau, seed=0)(x, target, draft)])!r}")
    print(f"\nload average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("(the machine is shared: timings are noisy; medians over prompts)")


if __name__ == "__main__":
    main()
