"""GFLOP/s of one gemm through the native core (ft._core._gemm -> ft::gemm -> one BLAS call) vs numpy.matmul
(numpy's own OpenBLAS), each side in its own worker process, rounds interleaved, medians. A benchmark, not a
test: it always exits 0 once it has printed.

    python bench/bench_gemm.py [--threads N] [--rounds 5] [--sizes 256 512 768 1024 2048] [--dtypes float32 float64]
    python bench/bench_gemm.py --inprocess ft --case "NT 768x50257x256" --iters 20    # one side alone, flat out
(with the package importable: installed, or PYTHONPATH=python FT_CORE_PATH=build/<dir> in a checkout).

Why processes: numpy's OpenBLAS has its own thread pool and the core's runs on our OpenMP pool; in one
process, a pool still spinning after its last call halves the other's speed on a small machine. So the parent
(which imports neither) starts one worker per side, each with the same number of threads (--threads, default
ft.get_num_threads(); numpy's through OPENBLAS_NUM_THREADS set before it loads), and alternates them:
for each case, --rounds rounds of (ft, numpy), each round a few timed samples after a --pause.

Cases, C (M×N) = op(A) op(B) with K the inner dimension, "NT" = op(A) = A, op(B) = Bᵀ and so on:
  * the shapes of a training step (float32): NN 128×768×128 (a baby-GPT layer's product), TN 64×64×32 (one
    head's score block), NN 768×256×3072 and NT 768×50257×256 (GPT-2 small's MLP and unembedding), NN 2048³;
  * squares n×n×n for --sizes, in each of --dtypes.
Each side gets the operands in its natural layout and does one BLAS call without a copy: the core gets
F-ordered (column-major) A and B and the transposes as _gemm's transA/transB flags; numpy gets C-ordered
arrays and the transposes as views (A.T), which numpy.matmul hands to cblas_?gemm as a transpose flag.
"Without a copy" is checked, not assumed: each worker measures with tracemalloc (numpy reports its data
allocations to it, and the core's _gemm allocates through numpy) the memory one call allocates, which must
be the output C alone; a copy would show as the operand's size in the "extra MB" columns.
A timed sample is as many calls as make ~--sample-flops flops (many for the small shapes, one for the big
ones), so the clock's resolution does not matter; the per-call time includes each library's Python call.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc

import numpy as np

from _common import WorkerProcess, cpu_model, import_ft

STEP_CASES = [("NN", 128, 768, 128), ("TN", 64, 64, 32), ("NN", 768, 256, 3072), ("NT", 768, 50257, 256),
              ("NN", 2048, 2048, 2048)]


def make_cases(sizes, dtypes):
    cases = [dict(op=op, m=m, n=n, k=k, dtype="float32") for op, m, n, k in STEP_CASES]
    cases += [dict(op="NN", m=s, n=s, k=s, dtype=dt) for dt in dtypes for s in sizes]
    for c in cases:
        c["name"] = f"{c['op']} {c['m']}x{c['n']}x{c['k']}"
    return cases


def operands(c, order):
    """A stored as (m, k) or, for op(A) = Aᵀ, as (k, m); B as (k, n) or (n, k); the same numbers for both sides."""
    rng = np.random.default_rng(0)
    ta, tb = c["op"][0] == "T", c["op"][1] == "T"
    A = rng.standard_normal((c["k"], c["m"]) if ta else (c["m"], c["k"]), dtype=np.float32).astype(c["dtype"])
    B = rng.standard_normal((c["n"], c["k"]) if tb else (c["k"], c["n"]), dtype=np.float32).astype(c["dtype"])
    return np.asarray(A, order=order), np.asarray(B, order=order), ta, tb


class FtSide:
    name = "ft._core._gemm"

    def __init__(self, threads):
        ft = import_ft(threads)
        self.gemm = ft._core._gemm
        self.info = dict(version=ft.__version__, blas=ft.blas_info(), threads=ft.get_num_threads())

    def prepare(self, c):
        A, B, ta, tb = operands(c, "F")
        return lambda: self.gemm(A, B, ta, tb)


def numpy_openblas_kernel() -> str:
    """The kernel and threads of the OpenBLAS bundled in numpy's wheel (numpy.libs), if that is what it uses."""
    import ctypes
    import glob

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "lib*openblas*.so*"))
    for path in libs:
        try:
            lib = ctypes.CDLL(path)  # already loaded by numpy: the same handle
        except OSError:
            continue
        for pre, suf in (("scipy_openblas_", "64_"), ("scipy_openblas_", ""), ("openblas_", "64_"), ("openblas_", "")):
            try:
                core, nth = getattr(lib, f"{pre}get_corename{suf}"), getattr(lib, f"{pre}get_num_threads{suf}")
            except AttributeError:
                continue
            core.restype = ctypes.c_char_p
            return f"; kernel {core().decode()}, {nth()} threads"
    return ""


class NumpySide:
    name = "numpy.matmul"

    def __init__(self, threads):
        assert "formal_transformers" not in sys.modules
        try:
            blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
            blas = f"{blas.get('name')} {blas.get('version')}"
        except Exception:  # older numpy: no dict mode
            blas = "?"
        self.info = dict(version=np.__version__, blas=blas + numpy_openblas_kernel(),
                         threads=os.environ.get("OPENBLAS_NUM_THREADS", "numpy's default"))

    def prepare(self, c):
        A, B, ta, tb = operands(c, "C")
        a, b = (A.T if ta else A), (B.T if tb else B)  # views: no data moves
        return lambda: np.matmul(a, b)


SIDES = {"ft": FtSide, "numpy": NumpySide}


def extra_bytes(f, out_bytes):
    """Bytes one call of f allocates beyond its output (tracemalloc's peak; 0 when nothing is copied)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    C = f()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del C
    return max(0, peak - out_bytes)


def sample_points(c, C):
    """C at 64 fixed positions (as float64), for the parent to compare the two sides without moving C."""
    rng = np.random.default_rng(7)
    i, j = rng.integers(0, c["m"], 64), rng.integers(0, c["n"], 64)
    return np.asarray(C)[i, j].astype(np.float64).tolist()


def run_worker(args) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    cases = make_cases(args.sizes, args.dtypes)
    side = SIDES[args.worker](args.threads)
    proto.write("@@" + json.dumps(dict(info=side.info)) + "\n")
    f = None
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "case":  # set up a case: operands, one warm-up call (checked for copies), sample of C
            f = None
            c = cases[int(cmd[1])]
            f = side.prepare(c)
            out_bytes = c["m"] * c["n"] * np.dtype(c["dtype"]).itemsize
            extra = extra_bytes(f, out_bytes)
            proto.write("@@" + json.dumps(dict(extra=extra, sample=sample_points(c, f()))) + "\n")
        else:  # run <samples> <calls per sample>
            samples, calls = int(cmd[1]), int(cmd[2])
            times = []
            for _ in range(samples):
                t = time.perf_counter()
                for _ in range(calls):
                    f()
                times.append((time.perf_counter() - t) / calls)
            proto.write("@@" + json.dumps(times) + "\n")


class Worker(WorkerProcess):
    def __init__(self, kind, args, threads, env_changes):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--threads", str(threads or 0),
               "--sizes", *map(str, args.sizes), "--dtypes", *args.dtypes]
        super().__init__(kind, cmd, env_changes)
        self.kind = kind
        self.hello = self.ask(None)


def run_inprocess(args) -> None:
    cases = {c["name"]: c for c in make_cases(args.sizes, args.dtypes)}
    if args.case not in cases:
        sys.exit(f"--case must be one of: {', '.join(cases)}")
    c = cases[args.case]
    side = SIDES[args.inprocess](args.threads)
    f = side.prepare(c)
    f()
    t = time.perf_counter()
    for _ in range(args.iters):
        f()
    t = (time.perf_counter() - t) / args.iters
    print(f"{side.name} in-process, {c['dtype']} {c['name']}: {1e3 * t:.3f} ms/call, "
          f"{2.0 * c['m'] * c['n'] * c['k'] / t / 1e9:.1f} GFLOP/s ({side.info})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 768, 1024, 2048])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--threads", type=int, default=None, help="threads for both sides (default: ft.get_num_threads())")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case and side")
    ap.add_argument("--samples", type=int, default=2, help="timed samples per round (median over all)")
    ap.add_argument("--sample-flops", type=float, default=5e8, help="flops per timed sample (sets the calls)")
    ap.add_argument("--pause", type=float, default=0.2, help="seconds of pause before each round")
    ap.add_argument("--no-steps", action="store_true", help="only the square sizes")
    ap.add_argument("--inprocess", choices=sorted(SIDES), help="one side alone in this process, flat out (profiling)")
    ap.add_argument("--case", default="NN 2048x2048x2048", help="the case for --inprocess, e.g. 'NT 768x50257x256'")
    ap.add_argument("--iters", type=int, default=20, help="calls for --inprocess")
    ap.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)  # internal: a subprocess
    args = ap.parse_args()
    if args.worker:
        return run_worker(args)
    if args.inprocess:
        if args.inprocess == "numpy" and args.threads:
            print("(numpy's threads: set OPENBLAS_NUM_THREADS before starting python)")
        return run_inprocess(args)
    if args.rounds * args.samples < 5:
        ap.error("use at least 5 timed samples per side (rounds × samples)")

    cases = make_cases(args.sizes, args.dtypes)
    ft_w = Worker("ft", args, args.threads, {})
    threads = ft_w.hello["info"]["threads"]
    np_w = Worker("numpy", args, threads, {"OPENBLAS_NUM_THREADS": str(threads)})
    workers = [ft_w, np_w]
    print(f"CPU: {cpu_model()}; os.cpu_count() = {os.cpu_count()}")
    print(f"formal_transformers {ft_w.hello['info']['version']}, core BLAS: {ft_w.hello['info']['blas']}")
    print(f"numpy {np_w.hello['info']['version']}, its BLAS: {np_w.hello['info']['blas']}; {threads} threads each")
    print(f"each side in its own process; per case {args.rounds} interleaved rounds × {args.samples} samples after "
          f"a {args.pause} s pause and one warm-up call; medians. C = op(A) op(B), M×N×K, 2MNK flops\n")
    head = (f"{'dtype':<8} {'case':<20} {'ft GFLOP/s':>11} {'numpy GFLOP/s':>14} {'ft / numpy':>11} "
            f"{'max rel diff':>13} {'extra MB ft/np':>15}")
    print(head)
    print("-" * len(head))
    squares = []
    try:
        for ci, c in enumerate(cases):
            if args.no_steps and ci < len(STEP_CASES):
                continue
            flops = 2.0 * c["m"] * c["n"] * c["k"]
            calls = max(1, round(args.sample_flops / flops))
            setup = [w.ask(f"case {ci}") for w in workers]
            times = {w.kind: [] for w in workers}
            for _ in range(args.rounds):
                for w in workers:
                    time.sleep(args.pause)
                    times[w.kind] += w.ask(f"run {args.samples} {calls}")
            s_ft, s_np = (np.array(s["sample"]) for s in setup)
            diff = float(np.max(np.abs(s_ft - s_np)) / np.max(np.abs(s_np)))
            g_ft, g_np = (flops / statistics.median(times[k]) / 1e9 for k in ("ft", "numpy"))
            if c["m"] == c["n"] == c["k"] >= 256 and ci >= len(STEP_CASES):
                squares.append(g_ft / g_np)
            extra = "/".join(f"{s['extra'] / 1e6:.1f}" for s in setup)
            print(f"{c['dtype']:<8} {c['name']:<20} {g_ft:>11.1f} {g_np:>14.1f} {g_ft / g_np:>11.2f} {diff:>13.1e} "
                  f"{extra:>15}", flush=True)
    finally:
        for w in workers:
            w.close()
    if squares:
        print(f"\nsquare n ≥ 256: ft / numpy from {min(squares):.2f} to {max(squares):.2f} (issue 9's target: ≥ 0.8)")


if __name__ == "__main__":
    main()
