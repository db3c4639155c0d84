"""Benchmark (not a test): A/B of two builds of the core on Adam's step alone (ft.Adam.step: the all-or-nothing
check and the writing pass) over GPT-2 small's 124 M float32 parameters (W_u tied to W_e, as published) (docs/benchmarks.md "The float32
GPT-2-small step from f9cbf25 to db314f5"), the two sides in alternating processes.

Each round starts one process per side (A first in odd rounds, B first in even ones), each with its own
FT_CORE_PATH; the model (DTransformer, GPT-2 small with ℓ 1024, tied, float32, seed 0) gets a fixed random gradient (seed 1,
entries ~1e-3), AdamW (3e-4, λ 0.1) takes --warmup steps, then --steps steps are timed, each its wall and
process-CPU time; the report is the median over rounds of each side's median, A/B (> 1: B faster), and
`uptime`'s load before and after. Thread count: OMP_NUM_THREADS / OPENBLAS_NUM_THREADS as set by the caller.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/bench_adam_step.py A_BUILD B_BUILD [--rounds 5]
        [--steps 7] [--warmup 2] [--pythonpath-a DIR] [--pythonpath-b DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(args):
    import numpy as np

    import formal_transformers as ft

    model = ft.DTransformer(50257, 1024, 12, 12, 768, 3072, dtype="float32", seed=0, tied=True)
    rng = np.random.default_rng(1)
    n = 0
    for k, g in model.grads.items():
        g[...] = 1e-3 * rng.standard_normal(g.shape, dtype=np.float32)
        n += g.size
    opt = ft.Adam(3e-4, weight_decay=0.1)
    for _ in range(args.warmup):
        opt.step(model, model.grads)
    wall, cpu = [], []
    for _ in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.step(model, model.grads)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(json.dumps(dict(wall=statistics.median(wall), cpu=statistics.median(cpu), n=n,
                          theta0=float(model.params["W_e"][0, 0]))))


def load():
    return open("/proc/loadavg").read().split()[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a", nargs="?")
    p.add_argument("b", nargs="?")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--pythonpath-a", default=os.path.join(HERE, "..", "python"))
    p.add_argument("--pythonpath-b", default=os.path.join(HERE, "..", "python"))
    p.add_argument("--worker", action="store_true")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    sides = dict(A=(args.a, args.pythonpath_a), B=(args.b, args.pythonpath_b))
    res = {"A": [], "B": []}
    load0 = load()
    for r in range(args.rounds):
        for s in ("AB" if r % 2 == 0 else "BA"):
            core, pp = sides[s]
            env = dict(os.environ, FT_CORE_PATH=os.path.abspath(core), PYTHONPATH=os.path.abspath(pp))
            out = subprocess.run([sys.executable, __file__, "--worker", "--steps", str(args.steps), "--warmup",
                                  str(args.warmup)], env=env, capture_output=True, text=True, check=True)
            res[s].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {s: {k: statistics.median(x[k] for x in res[s]) for k in ("wall", "cpu")} for s in res}
    same = res["A"][0]["theta0"] == res["B"][0]["theta0"]
    print(f"Adam step, {res['A'][0]['n']} float32: A wall {med['A']['wall']*1e3:.1f} ms cpu {med['A']['cpu']*1e3:.1f} | "
          f"B wall {med['B']['wall']*1e3:.1f} ms cpu {med['B']['cpu']*1e3:.1f} | A/B wall "
          f"{med['A']['wall']/med['B']['wall']:.3f} cpu {med['A']['cpu']/med['B']['cpu']:.3f} | same θ bits: {same} | "
          f"load {load0} -> {load()} | rounds (cpu ms) "
          + " ".join(f"{a['cpu']*1e3:.0f}/{b['cpu']*1e3:.0f}" for a, b in zip(res["A"], res["B"])), flush=True)


if __name__ == "__main__":
    main()
