"""Benchmark (not a test): data-parallel training (docs/data_parallel.md) against one process on this machine.

Two models, DTraining with Adam on random token ids (the speed does not depend on the text), float32:
  baby GPT      L 4, H 4, d_e 128, d_mlp 512, ℓ 64 (l_max 65), batch 12, vocabulary 65 (nanoGPT's CPU model)
  GPT-2 small   L 12, H 12, d_e 768, d_mlp 3072, ℓ 64, batch 4, vocabulary 50257 (few steps: seconds each)
each trained by 1 rank × 2 threads and by 2 ranks × 1 thread (processes on 127.0.0.1 over gloo, started as
torchrun starts them: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Printed per run: tokens per second
(the global minibatch's predicted tokens over the mean step time after the warm-up steps), the all-reduce's
share of a step (time inside the trainer's all-reduce — waiting for the slower rank included — over the
step time), the same all-reduce alone (after a barrier, so no waiting: the transport's own cost), the bytes
each step reduces, and what that all-reduce would cost two machines on a 10 Gb/s link (a ring all-reduce of
W = 2 ranks sends and receives (W−1)/W · 2 = 1 times the buffer per rank: bytes · 8 / 10⁹·10 s, latency
not counted). Also the CPU, ft.blas_info() and the load average before and after: the figures are this
machine's at that load, not the method's.

    python bench/bench_data_parallel.py [--models baby,gpt2] [--baby-steps 30] [--gpt2-steps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

from _common import cpu_model, import_ft

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = {
    "baby": dict(n_vocab=65, l_max=65, L=4, H=4, d_e=128, d_mlp=512, batch=12, warm=5),
    "gpt2": dict(n_vocab=50257, l_max=65, L=12, H=12, d_e=768, d_mlp=3072, batch=4, warm=1),
}
LINK_BITS_PER_S = 10e9


def worker(args):
    """One rank (or the single process): train, then report rank 0's figures as one JSON line."""
    ft = import_ft()
    ft.set_num_threads(args.threads)
    c = MODELS[args.model]
    steps = args.steps + c["warm"]
    rng = np.random.default_rng(0)
    data = rng.integers(0, c["n_vocab"], (c["batch"] * steps, c["l_max"]))
    model = ft.DTransformer(c["n_vocab"], c["l_max"], c["L"], c["H"], c["d_e"], c["d_mlp"], seed=0, tied=True)
    tr = ft.DTraining(1, 1e-4, batch_size=c["batch"], reduction="mean", clip=1.0, max_steps=steps, progress=False)
    tr(data, model)
    t = np.asarray(tr.history["time"])
    step_s = (t[-1] - t[c["warm"] - 1]) / args.steps  # the steps after the warm-up ones
    out = dict(step_s=step_s, tokens_per_s=c["batch"] * (c["l_max"] - 1) / step_s, params=model.n_params)
    dp = tr.data_parallel
    if dp is not None:
        # the trainer's all-reduce figures cover every step, the warm-up ones too: the share over the whole run
        out.update(allreduce_share=dp.allreduce_seconds / (t[-1]), allreduce_bytes=dp.allreduce_bytes / steps)
        import torch
        import torch.distributed as dist

        flat = torch.zeros(model.n_params, dtype=torch.float32)
        alone = []
        for _ in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(flat)
            alone.append(time.perf_counter() - t0)
        out["allreduce_alone_s"] = float(np.median(alone))
        if dp.rank != 0:
            return
    print("@@" + json.dumps(out), flush=True)


def run(model, ranks, threads, steps):
    port = None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--threads", str(threads),
           "--steps", str(steps)]
    procs = []
    for r in range(ranks):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        if ranks > 1:
            env.update(RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a worker failed: {[p.returncode for p in procs]}")
    line = [ln for ln in outs[0].splitlines() if ln.startswith("@@")][-1]
    return json.loads(line[2:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="baby", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=30, help=argparse.SUPPRESS)
    ap.add_argument("--models", default="baby,gpt2")
    ap.add_argument("--baby-steps", type=int, default=30)
    ap.add_argument("--gpt2-steps", type=int, default=3)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    ft = import_ft()
    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs")
    print(f"BLAS: {ft.blas_info()}")
    print(f"load average before: {os.getloadavg()}")
    for name in args.models.split(","):
        c = MODELS[name]
        steps = args.baby_steps if name == "baby" else args.gpt2_steps
        print(f"\n{name}: L {c['L']}, H {c['H']}, d_e {c['d_e']}, d_mlp {c['d_mlp']}, ℓ {c['l_max'] - 1}, "
              f"batch {c['batch']}, vocabulary {c['n_vocab']}; float32; {steps} timed steps after {c['warm']}")
        one = run(name, 1, 2, steps)
        two = run(name, 2, 1, steps)
        print(f"  {one['params']:,} parameters")
        print(f"  1 rank  × 2 threads: {one['tokens_per_s']:8.0f} tokens/s ({1000 * one['step_s']:.1f} ms/step)")
        print(f"  2 ranks × 1 thread : {two['tokens_per_s']:8.0f} tokens/s ({1000 * two['step_s']:.1f} ms/step); "
              f"ratio {two['tokens_per_s'] / one['tokens_per_s']:.2f}")
        b = two["allreduce_bytes"]
        print(f"  all-reduce: {b / 1e6:.1f} MB per step, {100 * two['allreduce_share']:.1f}% of the step inside "
              f"the trainer's all-reduce (waiting for the slower rank included); alone {1000 * two['allreduce_alone_s']:.1f} ms")
        link = b * 8 / LINK_BITS_PER_S
        print(f"  two machines on 10 Gb/s: ≥ {1000 * link:.0f} ms per step for the all-reduce "
              f"(ring, 2 ranks: each sends and receives the buffer's {b / 1e6:.0f} MB once), against "
              f"{1000 * two['step_s']:.0f} ms of step here")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
