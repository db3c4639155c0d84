"""Benchmark (not a test): one training step at long contexts — forward + backward + Adam(W) — of the baby GPT
shape (L 4, H 4, d_e 128, d_mlp 512, N_V 65) at ℓ 512 … 8192, batch 1, and (--gpt2) GPT-2 small at ℓ 1024,
batch 1: formal-transformers with attention_impl="literal" (Algorithm 4 as printed: every head's ℓ×ℓ weights
kept for the backward pass) and "tiled" (Algorithm T, docs/tiled_attention.md: FlashAttention-2's tiled exact
attention) against PyTorch's default, PyTorch with OMP_WAIT_POLICY=passive and torch.compile (inductor; passive
too), whose CPU scaled_dot_product_attention is a flash kernel.

Each side runs in its own process (two OpenMP runtimes in one process distort each other: bench_transformers.py),
started afresh for every length; the same θ and batch (ours writes them to an .npz, the torch workers load it and
the parent checks the initial losses agree); after set-up and --warmup steps (torch.compile compiles there,
TORCHINDUCTOR_COMPILE_THREADS=1), rounds are interleaved (literal, tiled, torch default, passive, compile, …),
--steps timed steps each, with a pause between rounds; the medians are reported with the ratios
best PyTorch / ours (> 1: ours faster).

The limit: a worker multiplying two 2048×2048 float32 matrices through the core's gemm (one BLAS call on the
same threads) runs in the same rounds; its median rate is the machine's large-gemm rate in this run. The step's
products are the dense ones (dense_gflop) and the attention's, counted as the tiled listing (and PyTorch's flash
kernel) does them: 7 products of d × (allowed query–key pairs) per head (forward QKᵀ, PV; backward QKᵀ again,
dṼVᵀ, dV, dQ, dK), ℓ(ℓ+1)/2 pairs under the causal mask. At the gemm rate they alone take the "roof" time; best
PyTorch / roof is the highest ratio any implementation doing these products could reach in this run, and each
side's share of the rate is its step's products over its step time.

Memory: each worker resets its peak resident set (VmHWM, by writing 5 to /proc/self/clear_refs) after the warm-up
and reads it after its timed steps: "peak RSS" is the process's peak during the steps (θ, optimizer state and the
libraries included); "step +" is that peak above the resident set just before the steps (the step's own memory).

    python bench/bench_long_context.py [--lengths 512 1024 2048 4096 8192] [--rounds 3] [--steps 1] [--gpt2]
        [--no-compile] [--threads N] [--bf16]

--bf16 (docs/design.md "Mixed precision"): the sides in bf16 instead — ours tiled with precision="bf16-mixed",
PyTorch and torch.compile under torch.autocast("cpu", dtype=torch.bfloat16) (passive), with ours tiled in float32
and the bf16 gemm rate (our _gemm with precision="bf16-mixed") as the limit, in the same rounds.
(with the package importable: installed, or PYTHONPATH=python FT_CORE_PATH=build/<dir> in a checkout).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from _common import PEAK_N, GemmSide, WorkerProcess, cpu_model, import_ft, serve_steps

BABY = dict(name="baby GPT", n_vocab=65, L=4, H=4, d_e=128, d_mlp=512, batch=1)
GPT2 = dict(name="GPT-2 small", n_vocab=50257, L=12, H=12, d_e=768, d_mlp=3072, batch=1)


def dense_gflop(cfg, length):
    """The step's dense products (forward W X, backward dW and dX: 3 products of 2 flops per multiply-add)
    over the batch's tokens: 6 · tokens · (L (4 d_e² + 2 d_e d_mlp) + N_V d_e); the attention's own products
    (QKᵀ, AV: ℓ² per head) not included."""
    per_token = cfg["L"] * (4 * cfg["d_e"] ** 2 + 2 * cfg["d_e"] * cfg["d_mlp"]) + cfg["n_vocab"] * cfg["d_e"]
    return 6 * cfg["batch"] * length * per_token / 1e9


def attention_gflop(cfg, length):
    """The attention's own products in one step, as the tiled listing and a flash kernel do them: per head and
    sequence, 7 products (T1: S = KᵀQ, Ṽ = VP; T2: S again, dP, dV, dQ, dK) of d_e/H × ℓ(ℓ+1)/2 pairs."""
    pairs = length * (length + 1) / 2
    return 7 * 2 * (cfg["d_e"] // cfg["H"]) * pairs * cfg["H"] * cfg["L"] * cfg["batch"] / 1e9


def status_kib(key):
    """A line of /proc/self/status in KiB: "VmRSS" (resident now), "VmHWM" (its peak); 0 where absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Ours:
    def __init__(self, cfg, impl, wdir, threads, precision="float32"):
        ft = import_ft(threads)
        rng = np.random.default_rng(0)
        self.batch = rng.integers(0, cfg["n_vocab"], (cfg["batch"], cfg["l"]))
        self.model = ft.DTransformer(cfg["n_vocab"], cfg["l"], cfg["L"], cfg["H"], cfg["d_e"], cfg["d_mlp"],
                                     dtype="float32", seed=0, attention_impl=impl, precision=precision)
        self.opt = ft.Adam(3e-4, weight_decay=0.1)
        if not os.path.exists(os.path.join(wdir, "theta.npz")):  # the first of ours: θ and the batch for torch
            np.savez(os.path.join(wdir, "theta.npz"), __batch__=self.batch,
                     **{k: np.asarray(v) for k, v in self.model.params.items()})
        self.loss = float(self.model.loss(self.batch))
        self.info = dict(version=ft.__version__, blas=ft.blas_info(), threads=ft.get_num_threads())

    def step(self):
        self.model.loss_and_grad(self.batch, copy=False)
        self.opt.step(self.model, self.model.grads)


class Torch:
    def __init__(self, cfg, compile_, wdir, threads, autocast=False):
        assert "formal_transformers" not in sys.modules
        import torch

        from bench_transformers import load_ours_into_torch, torch_gpt

        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(0)
        self.tm = torch_gpt(torch, dict(cfg, l_max=cfg["l"]), False)
        with np.load(os.path.join(wdir, "theta.npz")) as z:
            P = {k: z[k] for k in z.files}
        batch = P.pop("__batch__")
        load_ours_into_torch(torch, P, self.tm, cfg, False)
        self.idx = torch.from_numpy(batch.astype(np.int64))
        self.opt = torch.optim.AdamW(self.tm.parameters(), lr=3e-4, weight_decay=0.1)
        self.fn = torch.compile(self.tm.loss) if compile_ else self.tm.loss
        self.autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else None
        with torch.no_grad():
            self.loss = float(self.tm.loss(self.idx))
        self.info = dict(version=torch.__version__, threads=torch.get_num_threads())

    def step(self):
        if self.autocast is not None:
            with self.autocast():
                loss = self.fn(self.idx)
        else:
            loss = self.fn(self.idx)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def run_worker(args):
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    cfg = dict(GPT2 if args.shape == "gpt2" else BABY, l=args.length)
    if args.worker in ("literal", "tiled"):
        side = Ours(cfg, args.worker, args.wdir, args.threads)
    elif args.worker == "tiled-bf16":
        side = Ours(cfg, "tiled", args.wdir, args.threads, precision="bf16-mixed")
    elif args.worker == "gemm":
        side = GemmSide(threads=args.threads)
    elif args.worker == "gemm-bf16":
        from bench_transformers import GemmBf16Side

        side = GemmBf16Side(threads=args.threads)
    else:
        side = Torch(cfg, args.worker.startswith("compile"), args.wdir, args.threads,
                     autocast=args.worker.endswith("-autocast"))
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        side.step()
    warm = time.perf_counter() - t0
    reset_ok = reset_peak()
    base = status_kib("VmRSS")
    proto.write("@@" + json.dumps(dict(loss=side.loss, info=side.info, warmup_s=warm)) + "\n")
    serve_steps(side.step, proto, lambda times: dict(times=times, peak_kib=status_kib("VmHWM") if reset_ok else None,
                                                     base_kib=base))


SIDES = [("ours literal", "literal", {}), ("ours tiled", "tiled", {}),
         ("PyTorch default", "torch", {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}),
         ("PyTorch passive", "passive", {"OMP_WAIT_POLICY": "passive"}),
         ("torch.compile", "compile", {"OMP_WAIT_POLICY": "passive", "TORCHINDUCTOR_COMPILE_THREADS": "1"}),
         ("gemm", "gemm", {})]


# --bf16: the mixed-precision sides (the limit is the bf16 gemm rate; ours tiled in float32 beside them)
SIDES_BF16 = [("ours tiled bf16", "tiled-bf16", {}), ("ours tiled float32", "tiled", {}),
              ("PyTorch autocast", "passive-autocast", {"OMP_WAIT_POLICY": "passive"}),
              ("compile autocast", "compile-autocast", {"OMP_WAIT_POLICY": "passive", "TORCHINDUCTOR_COMPILE_THREADS": "1"}),
              ("gemm", "gemm-bf16", {})]


def bench_length(shape, length, args):
    results = {}
    with tempfile.TemporaryDirectory() as wdir:
        workers = []
        for label, kind, env in (SIDES_BF16 if args.bf16 else SIDES):
            if kind.startswith("compile") and args.no_compile:
                continue
            if kind == "literal" and args.no_literal:
                continue
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--shape", shape, "--length",
                   str(length), "--wdir", wdir, "--warmup", str(args.warmup)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            w = WorkerProcess(label, cmd, env)
            w.hello = w.read()  # sequential set-up: θ on disk before the torch workers load it
            workers.append(w)
        losses = {w.label: w.hello["loss"] for w in workers if w.hello["loss"] is not None}
        ref = next(iter(losses.values()))
        for k, v in losses.items():
            if abs(v - ref) > 1e-3 * abs(ref):
                raise SystemExit(f"initial losses differ: {losses}")
        times = {w.label: [] for w in workers}
        mem = {}
        for _ in range(args.rounds):
            for w in workers:
                r = w.ask(f"run {args.steps if w.label != 'gemm' else 3}")
                times[w.label] += r["times"]
                mem[w.label] = (r["peak_kib"], r["base_kib"])
                time.sleep(args.pause)
        for w in workers:
            w.close()
        for w in workers:
            results[w.label] = dict(median=statistics.median(times[w.label]), peak=mem[w.label][0],
                                    base=mem[w.label][1], info=w.hello["info"])
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="*", default=[512, 1024, 2048, 4096, 8192],
                    help="baby GPT lengths; none (--lengths --gpt2): GPT-2 small alone")
    ap.add_argument("--gpt2", action="store_true", help="also GPT-2 small at ℓ 1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--pause", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-literal", action="store_true", help="skip the literal path (its ℓ² memory at 8192)")
    ap.add_argument("--bf16", action="store_true", help="ours bf16-mixed vs PyTorch autocast bf16; the bf16 gemm rate")
    ap.add_argument("--worker")
    ap.add_argument("--shape", default="baby")
    ap.add_argument("--length", type=int)
    ap.add_argument("--wdir")
    args = ap.parse_args()
    if args.worker:
        return run_worker(args)
    from bench_transformers import cpu_bf16

    print(f"CPU: {cpu_model()}; bf16 instructions: {cpu_bf16()}")
    print(f"load before: {os.getloadavg()}")
    runs = [("baby", l) for l in args.lengths] + ([("gpt2", 1024)] if args.gpt2 else [])
    first = True
    for shape, length in runs:
        res = bench_length(shape, length, args)
        if first:
            ours = next(v for k, v in res.items() if k.startswith("ours"))
            torch_ = next((v for k, v in res.items() if k.startswith("PyTorch")), None)
            print(f"BLAS (ft.blas_info()): {ours['info']['blas']}")
            print(f"formal-transformers {ours['info']['version']}, PyTorch {torch_['info']['version'] if torch_ else '-'}, "
                  f"threads {ours['info']['threads']}")
            first = False
        name = (GPT2 if shape == "gpt2" else BABY)["name"]
        print(f"\n{name}, ℓ {length}, batch 1 (medians of {args.rounds}×{args.steps} steps; peak RSS during the steps, "
              f"step + = above the resident set before them)")
        gemm = res.pop("gemm", None)
        torch_best = min((v["median"] for k, v in res.items() if not k.startswith("ours")), default=None)
        for k, v in res.items():
            peak = f"{v['peak'] / 1024:8.0f} MiB (step + {(v['peak'] - v['base']) / 1024:6.0f})" if v["peak"] else "n/a"
            ratio = f"  best PyTorch / this = {torch_best / v['median']:.2f}×" if torch_best and k.startswith("ours") else ""
            print(f"  {k:18s} {v['median'] * 1e3:9.1f} ms   peak RSS {peak}{ratio}")
        cfg = GPT2 if shape == "gpt2" else BABY
        gf, ga = dense_gflop(cfg, length), attention_gflop(cfg, length)
        rates = ", ".join(f"{k} {gf / v['median']:.0f}" for k, v in res.items())
        print(f"  dense products {gf:.1f} GFLOP per step; GFLOP/s over the whole step: {rates}")
        if gemm:
            rate = 2.0 * PEAK_N**3 / gemm["median"] / 1e9
            roof = (gf + ga) / rate
            shares = ", ".join(f"{k} {100 * roof / v['median']:.0f}%" for k, v in res.items() if k != "ours literal")
            print(f"  the limit: large gemm ({PEAK_N}³ {'bf16' if args.bf16 else 'float32'}, same rounds) {rate:.1f} GFLOP/s; the step's products "
                  f"{gf:.1f} dense + {ga:.1f} attention GFLOP take {roof * 1e3:.1f} ms at that rate")
            print(f"  share of the gemm rate over the step: {shares}")
            if torch_best:
                print(f"  the highest ratio these products allow: best PyTorch / roof = {torch_best / roof:.2f}×")
        if "ours literal" in res and "ours tiled" in res:
            print(f"  tiled / literal speed: {res['ours literal']['median'] / res['ours tiled']['median']:.2f}×")
        sys.stdout.flush()
    print(f"\nload after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
