"""Benchmark (not a test): A/B of two builds of the core on one training step of the baby GPT shape (L 4, H 4,
d_e 128, d_mlp 512, N_V 65, batch 1; forward + backward + Adam(W); --shape gpt2: GPT-2 small; --batch B), the two
sides in alternating processes.

Each round starts one process per side (A first in odd rounds, B first in even ones), each with its own
FT_CORE_PATH (a build directory holding _core), the same θ and batch (seed 0); after set-up and --warmup steps
it times --steps steps and prints their median wall and process-CPU times, and the main thread's CPU time
(time.thread_time: on a busy machine it leaves out the time the thread waited for a core, and other threads'
spinning). The report is the median over the rounds of each side and the ratio A/B (> 1: B faster), with `uptime`'s load before and after: on a shared
machine only such interleaved ratios mean anything.

    python bench/ab_step.py A_BUILD B_BUILD [--lengths 512 2048] [--rounds 5] [--steps 5] [--impl auto]
        [--shape baby|gpt2] [--batch 1] [--precision float32|bf16-mixed]
        [--pythonpath-a DIR] [--pythonpath-b DIR]
(e.g. A = /work/wt/after/build/rel with python path /work/wt/after/python, B = build/rel with python/)

More than two builds: --side NAME BUILD PYTHONPATH, once per build (in place of A and B). Round r starts the
sides rotated by r; each process's figures are printed as it ends with the load (`/proc/loadavg`'s first field)
before and after it, then per side the medians of process CPU and wall time and the first side's CPU over each
side's (> 1: that side faster).
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

    rng = np.random.default_rng(0)
    n_v, L, H, d_e = (50257, 12, 12, 768) if args.shape == "gpt2" else (65, 4, 4, 128)
    batch = rng.integers(0, n_v, (args.batch, args.length))
    # "auto" is the default: not passed, so that builds from before attention_impl existed run too
    impl = {} if args.impl == "auto" else dict(attention_impl=args.impl)
    if args.precision != "float32":  # likewise: builds from before precision existed run float32
        impl["precision"] = args.precision
    model = ft.DTransformer(n_v, args.length, L, H, d_e, 4 * d_e, dtype="float32", seed=0, **impl)
    opt = ft.Adam(3e-4, weight_decay=0.1)
    for _ in range(args.warmup):
        model.loss_and_grad(batch, copy=False)
        opt.step(model, model.grads)
    wall, cpu, thread = [], [], []
    for _ in range(args.steps):
        t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
        loss, _ = model.loss_and_grad(batch, copy=False)
        opt.step(model, model.grads)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        thread.append(time.thread_time() - h0)
    print(json.dumps(dict(wall=statistics.median(wall), cpu=statistics.median(cpu), thread=statistics.median(thread),
                          loss=float(loss))))


def load():
    return open("/proc/loadavg").read().split()[0]


def run_worker(args, core, pp, l):
    env = dict(os.environ, FT_CORE_PATH=os.path.abspath(core), PYTHONPATH=os.path.abspath(pp))
    out = subprocess.run([sys.executable, __file__, "--worker", "--length", str(l), "--steps", str(args.steps),
                          "--warmup", str(args.warmup), "--impl", args.impl, "--shape", args.shape, "--batch",
                          str(args.batch), "--precision", args.precision],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def n_way(args, l):
    """--side NAME BUILD PYTHONPATH, repeated: round r starts the sides rotated by r; the load beside each figure."""
    sides = args.side
    res = {name: [] for name, _, _ in sides}
    tag = f"{args.shape} batch {args.batch} l {l} impl {args.impl} {args.precision}"
    for r in range(args.rounds):
        k = r % len(sides)
        for name, core, pp in sides[k:] + sides[:k]:
            l0 = load()
            d = run_worker(args, core, pp, l)
            d["load"] = f"{l0}->{load()}"
            res[name].append(d)
            print(f"{tag} round {r} {name}: cpu {d['cpu']*1e3:.1f} ms wall {d['wall']*1e3:.1f} ms "
                  f"(load {d['load']}) loss {d['loss']:.6f}", flush=True)
    first = statistics.median(x["cpu"] for x in res[sides[0][0]])
    for name, _, _ in sides:
        cpu = statistics.median(x["cpu"] for x in res[name])
        wall = statistics.median(x["wall"] for x in res[name])
        print(f"{tag} {name}: cpu median {cpu*1e3:.1f} ms, wall {wall*1e3:.1f} ms, {sides[0][0]}/{name} cpu "
              f"{first/cpu:.3f} | rounds (cpu, load) " + " ".join(f"{x['cpu']*1e3:.1f} ({x['load']})" for x in res[name]),
              flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a", nargs="?")
    p.add_argument("b", nargs="?")
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--impl", default="auto")
    p.add_argument("--pythonpath-a", default=os.path.join(HERE, "..", "python"))
    p.add_argument("--pythonpath-b", default=os.path.join(HERE, "..", "python"))
    p.add_argument("--side", nargs=3, action="append", metavar=("NAME", "BUILD", "PYTHONPATH"),
                   help="N-way: one build per --side (repeat), rounds rotated; in place of A and B")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--shape", choices=("baby", "gpt2"), default="baby",
                   help="gpt2: GPT-2 small (N_V 50257, L 12, H 12, d_e 768, d_mlp 3072)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--precision", choices=("float32", "bf16-mixed"), default="float32",
                   help="the models' precision (bf16-mixed: bf16 products, float32 master weights)")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.side:
        if args.a or args.b:
            p.error("give the builds either as A B or as --side NAME BUILD PYTHONPATH, not both")
        for l in args.lengths:
            n_way(args, l)
        return
    if not (args.a and args.b):
        p.error("two builds A B (or --side NAME BUILD PYTHONPATH, repeated)")
    sides = dict(A=(args.a, args.pythonpath_a), B=(args.b, args.pythonpath_b))
    for l in args.lengths:
        res = {"A": [], "B": []}
        load0 = load()
        for r in range(args.rounds):
            for s in ("AB" if r % 2 == 0 else "BA"):
                core, pp = sides[s]
                env = dict(os.environ, FT_CORE_PATH=os.path.abspath(core), PYTHONPATH=os.path.abspath(pp))
                out = subprocess.run([sys.executable, __file__, "--worker", "--length", str(l), "--steps",
                                      str(args.steps), "--warmup", str(args.warmup), "--impl", args.impl,
                                      "--shape", args.shape, "--batch", str(args.batch), "--precision", args.precision],
                                     env=env, capture_output=True, text=True, check=True)
                res[s].append(json.loads(out.stdout.strip().splitlines()[-1]))
        med = {s: {k: statistics.median(x[k] for x in res[s]) for k in ("wall", "cpu", "thread")} for s in res}
        losses = {s: res[s][0]["loss"] for s in res}
        print(f"{args.shape} batch {args.batch} l {l} impl {args.impl} {args.precision}: A wall {med['A']['wall']*1e3:.1f} ms cpu {med['A']['cpu']*1e3:.1f} | "
              f"B wall {med['B']['wall']*1e3:.1f} ms cpu {med['B']['cpu']*1e3:.1f} | A/B wall "
              f"{med['A']['wall']/med['B']['wall']:.3f} cpu {med['A']['cpu']/med['B']['cpu']:.3f} | main thread's cpu A "
              f"{med['A']['thread']*1e3:.1f} B {med['B']['thread']*1e3:.1f} ms, A/B {med['A']['thread']/med['B']['thread']:.3f} | "
              f"loss A {losses['A']:.6f} B {losses['B']:.6f} | load {load0} -> {load()} | rounds "
              + " ".join(f"{a['wall']*1e3:.0f}/{b['wall']*1e3:.0f}" for a, b in zip(res["A"], res["B"])),
              flush=True)


if __name__ == "__main__":
    main()
