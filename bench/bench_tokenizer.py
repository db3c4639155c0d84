"""Benchmark (not a test): byte-level BPE (paper §4) of formal-transformers vs Hugging Face `tokenizers`,
measured in the same run on tinyshakespeare.txt, each side in its own worker process (bench/_common.py), the
sides' runs interleaved round by round so that a busy machine slows both alike.

For each vocabulary size (512 and 4096 by default) and each side it reports the median over the rounds of
  * train s        training time (ours: BPETokenizer.train; HF: BpeTrainer with the ByteLevel
                   pre-tokenizer, the 256-byte initial alphabet, 3 special tokens, min_frequency 2, so
                   both end with 256 + merges + 3 = N_V tokens);
  * encode MB/s    encoding the whole text as one string (UTF-8 megabytes per second);
  * batch MB/s     encoding the text's lines as a batch (encode_batch; HF uses its thread pool here);
  * tokens/byte    compression: tokens (without bos/eos) per UTF-8 byte of the text;
and the ratios (train: HF time / our time; MB/s: ours / HF; so > 1 means we are faster; tokens/byte:
ours / HF, 1 means the same compression).

--baseline DIR adds a third worker running another build of our core (FT_CORE_PATH=DIR, e.g. a build of an
earlier commit), so that one run gives the ratio against HF before and after a change on the same machine.

    FT_CORE_PATH=build/dev PYTHONPATH=python python bench/bench_tokenizer.py [--rounds 5] [--vocab 512 4096] \\
        [--baseline /path/to/older/build]

Data: $FT_DATA_DIR/tinyshakespeare.txt or <repo>/../shared/data/tinyshakespeare.txt; skipped with a
message when absent.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import WorkerProcess, cpu_model, import_ft  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASKS = ("train", "encode", "batch")


def data_path() -> pathlib.Path:
    base = pathlib.Path(os.environ.get("FT_DATA_DIR", ROOT.parent / "shared" / "data"))
    return base / "tinyshakespeare.txt"


# ------------------------------------------------------------------------------------------------------
# The two sides (each runs in a worker process)
class Ours:
    def __init__(self, text, n_vocab):
        ft = import_ft()
        self.ft, self.text, self.n_vocab = ft, text, n_vocab
        self.lines = text.splitlines(keepends=True)
        self.info = dict(impl="formal-transformers", version=ft.__version__, blas=ft.blas_info(),
                         core=os.environ.get("FT_CORE_PATH") or "installed", threads=1)
        self.tok = self.train()

    def train(self):
        self.tok = self.ft.BPETokenizer.train(self.text, self.n_vocab)
        return self.tok

    def encode(self):
        return self.tok.encode(self.text, bos=False, eos=False)

    def batch(self):
        return self.tok.encode_batch(self.lines, bos=False, eos=False)

    def stats(self):
        ids = self.encode()
        assert self.tok.decode(ids) == self.text, "round trip failed"
        assert sum(len(b) for b in self.batch()) == len(ids)
        return dict(n_vocab=self.tok.n_vocab, tokens=len(ids))


class HF:
    def __init__(self, text, n_vocab):
        import tokenizers

        self.text, self.n_vocab = text, n_vocab
        self.lines = text.splitlines(keepends=True)
        self.info = dict(impl="HF tokenizers", version=tokenizers.__version__, threads=f"its pool, {os.cpu_count()} cores")
        self.tk = self.train()

    def train(self):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tk.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=self.n_vocab, min_frequency=2, show_progress=False,
                                 special_tokens=["<mask>", "<bos>", "<eos>"],
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tk.train_from_iterator([self.text], tr)
        self.tk = tk
        return tk

    def encode(self):
        return self.tk.encode(self.text)

    def batch(self):
        return self.tk.encode_batch(self.lines)

    def stats(self):
        enc = self.encode()
        assert self.tk.decode(enc.ids) == self.text, "HF round trip failed"
        return dict(n_vocab=self.tk.get_vocab_size(), tokens=len(enc.ids))


SIDES = {"ours": Ours, "hf": HF}


def run_worker(args) -> None:
    """Build the side, then answer `<task> k` with k timings and `stats` with the side's figures, until
    `quit`. The protocol uses a private copy of stdout; fd 1 goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    text = data_path().read_text(encoding="utf-8")
    side = SIDES[args.worker](text, args.n_vocab)
    proto.write("@@" + json.dumps(side.info) + "\n")
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "stats":
            proto.write("@@" + json.dumps(side.stats()) + "\n")
            continue
        f = getattr(side, cmd[0])
        times = []
        for _ in range(int(cmd[1])):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        proto.write("@@" + json.dumps(times) + "\n")


# ------------------------------------------------------------------------------------------------------
def bench(n_vocab, args, nbytes):
    specs = [("formal-transformers", "ours", {})]
    if args.baseline:
        specs.append(("ours, baseline build", "ours", {"FT_CORE_PATH": os.path.abspath(args.baseline)}))
    if not args.no_hf:
        specs.append(("HF tokenizers", "hf", {}))
    workers = []
    try:
        for label, kind, env in specs:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--n-vocab", str(n_vocab)]
            workers.append(WorkerProcess(label, cmd, env))
        infos = [w.read() for w in workers]
        times = [{t: [] for t in TASKS} for _ in workers]
        for _ in range(args.rounds):  # interleaved: each round runs every task on every side once
            for task in TASKS:
                for w, tm in zip(workers, times):
                    tm[task] += w.ask(f"{task} 1")
        stats = [w.ask("stats") for w in workers]
    finally:
        for w in workers:
            w.close()
    rows = []
    for (label, _, _), info, tm, st in zip(specs, infos, times, stats):
        med = {t: statistics.median(v) for t, v in tm.items()}
        rows.append(dict(label=label, info=info, n_vocab=st["n_vocab"], train=med["train"],
                         enc=nbytes / med["encode"] / 1e6, batch=nbytes / med["batch"] / 1e6,
                         tpb=st["tokens"] / nbytes))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", "--repeats", type=int, default=5, help="timed runs per task and side (interleaved)")
    ap.add_argument("--vocab", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--baseline", default=None, help="a build directory of another version of our core to compare too")
    ap.add_argument("--no-hf", action="store_true", help="without Hugging Face tokenizers")
    ap.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)  # internal: a subprocess
    ap.add_argument("--n-vocab", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return run_worker(args)

    path = data_path()
    if not path.exists():
        print(f"skipped: {path} is not available (set FT_DATA_DIR or put ../shared/data beside the repository)")
        return 0
    if not args.no_hf:
        try:
            import tokenizers  # noqa: F401  (only to fail early; the parent runs neither side)
        except ImportError:
            print("note: Hugging Face tokenizers is not installed; only our figures are shown (pip install tokenizers)")
            args.no_hf = True
    text = path.read_text(encoding="utf-8")
    nbytes = len(text.encode("utf-8"))
    print(f"CPU: {cpu_model()}; os.cpu_count() = {os.cpu_count()}")
    print(f"BPE on {path.name}: {nbytes / 1e6:.3f} MB, {len(text.splitlines())} lines; each side in its own worker "
          f"process, medians of {args.rounds} interleaved rounds")
    head = f"{'N_V':>5}  {'impl':<22} {'train s':>9} {'encode MB/s':>12} {'batch MB/s':>11} {'tokens/byte':>12}"
    shown = False
    for n_vocab in args.vocab:
        rows = bench(n_vocab, args, nbytes)
        if not shown:
            for r in rows:
                print(f"  {r['label']}: " + ", ".join(f"{k}={v}" for k, v in r["info"].items()))
            print(head)
            print("-" * len(head))
            shown = True
        for r in rows:
            print(f"{r['n_vocab']:>5}  {r['label']:<22} {r['train']:>9.3f} {r['enc']:>12.2f} {r['batch']:>11.2f} "
                  f"{r['tpb']:>12.4f}")
        hf = rows[-1] if not args.no_hf else None
        for r in rows[:-1] if hf else []:
            name = "ratio vs HF" if r is rows[0] else "baseline ratio vs HF"
            print(f"{'':>5}  {name:<22} {'x%.1f' % (hf['train'] / r['train']):>9} "
                  f"{'x%.1f' % (r['enc'] / hf['enc']):>12} {'x%.1f' % (r['batch'] / hf['batch']):>11} "
                  f"{r['tpb'] / hf['tpb']:>12.4f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
