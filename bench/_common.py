"""What the benchmark scripts share: importing the package, naming the CPU, and the worker process each
side of a comparison runs in (a persistent subprocess that answers one JSON line, prefixed "@@", per
command on its stdin)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def import_ft(threads=0):
    """formal_transformers, installed or (in a checkout without an install) from python/ beside bench/; with
    `threads`, the core's thread count set to it."""
    try:
        import formal_transformers as ft
    except ImportError:
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import formal_transformers as ft
    if threads:
        ft.set_num_threads(threads)
    return ft


def cpu_model() -> str:
    """/proc/cpuinfo's "model name" with vendor, family, model and stepping (else platform's guess)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                k, _, v = line.partition(":")
                info[k.strip()] = v.strip()
    except OSError:
        pass
    if "model name" not in info:
        import platform
        return platform.processor() or platform.machine()
    return (f"{info['model name']} (vendor {info.get('vendor_id', '?')}, family {info.get('cpu family', '?')}, "
            f"model {info.get('model', '?')}, stepping {info.get('stepping', '?')})")


class WorkerProcess:
    """`cmd` in a subprocess with the environment changed by `env_changes` (a value None removes the
    variable). `ask(line)` sends a command and returns the worker's JSON reply; `read()` the next reply."""

    def __init__(self, label, cmd, env_changes):
        env = dict(os.environ)
        for k, v in env_changes.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        self.label = label
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def read(self):
        line = self.proc.stdout.readline()
        if not line.startswith("@@"):
            raise RuntimeError(f"worker '{self.label}' stopped (exit code {self.proc.wait()}); see its stderr above")
        return json.loads(line[2:])

    def ask(self, line):
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        return self.read()

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        self.proc.wait()


PEAK_N = 2048  # the large-gemm side: C = A B of two PEAK_N × PEAK_N float32 matrices


class GemmSide:
    """C = A B, A and B PEAK_N×PEAK_N float32, through the core's gemm (one BLAS call, no copies): the machine's
    large-gemm rate in a benchmark's run (2·PEAK_N³ flops per step)."""

    def __init__(self, threads=0):
        import numpy as np

        ft = import_ft(threads)
        rng = np.random.default_rng(1)
        self.A = np.asfortranarray(rng.standard_normal((PEAK_N, PEAK_N), dtype=np.float32))
        self.B = np.asfortranarray(rng.standard_normal((PEAK_N, PEAK_N), dtype=np.float32))
        self.gemm = ft._core._gemm
        self.loss = None
        self.info = dict(threads=ft.get_num_threads())

    def step(self):
        self.gemm(self.A, self.B)


def serve_steps(step, proto, after=None):
    """The worker's side of WorkerProcess: for each command "run N" on stdin, N calls of step() timed one by
    one, answered on `proto` as "@@" + JSON (the list of times in seconds, or after(times) when given, e.g.
    with the peak memory); "quit" or end of input ends it."""
    import sys
    import time

    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        times = []
        for _ in range(int(cmd[1])):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        proto.write("@@" + json.dumps(times if after is None else after(times)) + "\n")


# ---------------------------------------------------------------------------------------------------
# Character-level benchmarks on tiny Shakespeare (bench_speculative.py, bench_mtp.py): the data, the cached
# models trained in the notebook 06 setting, the machine's line, and the decoders' timing.

def load_avg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def print_machine(ft):
    """The CPU, the core's threads and BLAS, and the load average: printed before every measurement."""
    print(f"CPU: {cpu_model()}; os.cpu_count() = {os.cpu_count()}; threads {ft.get_num_threads()}")
    print(f"BLAS: {ft.blas_info()}")
    print(f"load average: {load_avg()}")


def shakespeare_chars(ft, l_max, n_val=200):
    """tiny Shakespeare as character ids (N_V 65): (chars, the first 90% as one id array, the first n_val
    whole windows of l_max ids of the last 10%); None, said, where the text is absent and not downloadable."""
    import numpy as np

    try:
        text = ft.datasets.tiny_shakespeare()
    except Exception as e:  # absent and not downloadable here
        print(f"skipped: tiny Shakespeare not available ({e})")
        return None
    chars = np.array(sorted(set(text)))
    assert len(chars) == 65
    ids = np.searchsorted(chars, np.array(list(text)))
    n_train = int(0.9 * len(ids))
    train_ids, val_ids = ids[:n_train], ids[n_train:]
    val_seqs = np.stack([s for s in ft.chunk(val_ids, l_max) if len(s) == l_max])[:n_val]
    return chars, train_ids, val_seqs


def train_cached(ft, path, make_model, n_steps, train_ids, l_max, retrain=False, name=""):
    """The model saved at `path` (ft.load), else make_model() trained for n_steps Adam steps in the notebook 06
    setting (windows of l_max ids at random offsets drawn up front, batch 12, cosine schedule) and saved there."""
    import time

    import numpy as np

    os.makedirs(os.path.dirname(path), exist_ok=True)
    who = f"{name}: " if name else ""
    if os.path.exists(path) and not retrain:
        print(f"{who}loaded {path}")
        return ft.load(path)
    model = make_model()
    rng = np.random.default_rng(0)
    offsets = rng.integers(0, len(train_ids) - l_max + 1, size=12 * n_steps)
    seqs = np.lib.stride_tricks.sliding_window_view(train_ids, l_max)[offsets]
    t0 = time.perf_counter()
    trainer = ft.DTraining(n_epochs=1, eta=1e-3, optimizer="adam", betas=(0.9, 0.99), weight_decay=0.1,
                           batch_size=12, reduction="mean", shuffle=False, schedule="cosine", warmup=100,
                           min_lr=1e-4, clip=1.0, max_steps=n_steps, seed=0, progress=False)
    trainer(seqs, model)
    ft.save(model, path)
    print(f"{who}trained {n_steps} steps in {time.perf_counter() - t0:.0f} s "
          f"(load average {os.getloadavg()[0]:.1f}) -> {path}")
    return model


def ms_per_token(times, decode, l_gen):
    """decode() timed: its milliseconds per generated token appended to `times`; returns what decode returned."""
    import time

    t0 = time.perf_counter()
    out = decode()
    times.append(1e3 * (time.perf_counter() - t0) / l_gen)
    return out


def median_of_minima(per_prompt):
    """Per prompt the minimum over its repetitions (noise only adds time), then the median over prompts."""
    import statistics

    return statistics.median(min(t) for t in per_prompt)


def add_decoding_args(ap):
    """The options the decoding benchmarks share: --taus, --prompts, --reps, --retrain."""
    ap.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.8])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--retrain", action="store_true")


def decoding_prompts(val_seqs, n_prompts, n_reps, l_max, n_prompt=4):
    """(ℓ_gen, prompts): the first n_prompt ids of n_prompts validation windows spread evenly, each to be
    continued to the full window (ℓ_gen = l_max − n_prompt + 1); the measurement's line is printed."""
    l_gen = l_max - n_prompt + 1
    prompts = [val_seqs[i * (len(val_seqs) // n_prompts)][:n_prompt] for i in range(n_prompts)]
    print(f"\nℓ_gen = {l_gen} tokens after {n_prompts} prompts of {n_prompt} characters; per prompt the minimum "
          f"over {n_reps} repetitions, then the median over prompts")
    return l_gen, prompts


def start_char_bench(ap, l_max):
    """The start of a tiny Shakespeare benchmark: (its options, ft, chars, train ids, validation windows) with
    the machine's line printed; None where the text is not available."""
    a = ap.parse_args()
    ft = import_ft()
    data = shakespeare_chars(ft, l_max)
    if data is None:
        return None
    print_machine(ft)
    return (a, ft) + data


def print_sample(chars, x, y, tau, k):
    """A decoded sample: the prompt x, then the generated ids y, as characters."""
    print(f"  sample (τ = {tau}, k = {k}): {''.join(chars[x])}{''.join(chars[y])!r}")


def print_end(note):
    """The load average after the measurement, and what the figures are (`note`)."""
    print(f"\nload average: {load_avg()}")
    print(f"(the machine is shared: timings are noisy; {note})")
