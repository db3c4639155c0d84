"""Benchmark (not a test): byte-level BPE (paper §4) of formal-transformers vs Hugging Face `tokenizers`,
measured in the same run on tinyshakespeare.txt.

For each vocabulary size (512 and 4096 by default) and each implementation it reports the median over
--repeats runs of
  * train s        training time (ours: BPETokenizer.train; HF: BpeTrainer with the ByteLevel
                   pre-tokenizer, the 256-byte initial alphabet, 3 special tokens, min_frequency 2, so
                   both end with 256 + merges + 3 = N_V tokens);
  * encode MB/s    encoding the whole text as one string (UTF-8 megabytes per second);
  * batch MB/s     encoding the text's lines as a batch (encode_batch; HF uses its thread pool here);
  * tokens/byte    compression: tokens (without bos/eos) per UTF-8 byte of the text;
and the ratios (train: HF time / our time; MB/s: ours / HF; so > 1 means we are faster; tokens/byte:
ours / HF, 1 means the same compression).

    FT_CORE_PATH=build/dev PYTHONPATH=python python bench/bench_tokenizer.py [--repeats 5] [--vocab 512 4096]

Data: $FT_DATA_DIR/tinyshakespeare.txt or <repo>/../shared/data/tinyshakespeare.txt; skipped with a
message when absent.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import formal_transformers as ft

ROOT = pathlib.Path(__file__).resolve().parents[1]


def data_path() -> pathlib.Path:
    base = pathlib.Path(os.environ.get("FT_DATA_DIR", ROOT.parent / "shared" / "data"))
    return base / "tinyshakespeare.txt"


def timed(f, repeats):
    """(median seconds, last result)"""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_ours(text, lines, n_vocab, repeats):
    nbytes = len(text.encode("utf-8"))
    t_train, tok = timed(lambda: ft.BPETokenizer.train(text, n_vocab), repeats)
    t_enc, ids = timed(lambda: tok.encode(text, bos=False, eos=False), repeats)
    t_batch, batch = timed(lambda: tok.encode_batch(lines, bos=False, eos=False), repeats)
    assert tok.decode(ids) == text, "round trip failed"
    assert sum(len(b) for b in batch) == len(ids)
    return dict(n_vocab=tok.n_vocab, train=t_train, enc=nbytes / t_enc / 1e6, batch=nbytes / t_batch / 1e6,
                tpb=len(ids) / nbytes)


def bench_hf(text, lines, n_vocab, repeats):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    nbytes = len(text.encode("utf-8"))

    def train():
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tk.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=n_vocab, min_frequency=2, show_progress=False,
                                 special_tokens=["<mask>", "<bos>", "<eos>"],
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tk.train_from_iterator([text], tr)
        return tk

    t_train, tk = timed(train, repeats)
    t_enc, enc = timed(lambda: tk.encode(text), repeats)
    t_batch, batch = timed(lambda: tk.encode_batch(lines), repeats)
    assert tk.decode(enc.ids) == text, "HF round trip failed"
    return dict(n_vocab=tk.get_vocab_size(), train=t_train, enc=nbytes / t_enc / 1e6, batch=nbytes / t_batch / 1e6,
                tpb=len(enc.ids) / nbytes)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab", type=int, nargs="+", default=[512, 4096])
    args = ap.parse_args(argv)

    path = data_path()
    if not path.exists():
        print(f"skipped: {path} is not available (set FT_DATA_DIR or put ../shared/data beside the repository)")
        return 0
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    try:
        import tokenizers

        hf_version = tokenizers.__version__
    except ImportError:
        hf_version = None
        print("note: Hugging Face tokenizers is not installed; only our figures are shown (pip install tokenizers)")

    print(f"BPE on {path.name}: {len(text.encode('utf-8')) / 1e6:.3f} MB, {len(lines)} lines; medians of "
          f"{args.repeats} runs; formal-transformers {ft.__version__} (1 thread), "
          f"tokenizers {hf_version or '-'} (its own thread pool, {os.cpu_count()} cores)")
    head = f"{'N_V':>5}  {'impl':<22} {'train s':>9} {'encode MB/s':>12} {'batch MB/s':>11} {'tokens/byte':>12}"
    print(head)
    print("-" * len(head))
    for n_vocab in args.vocab:
        ours = bench_ours(text, lines, n_vocab, args.repeats)
        rows = [("formal-transformers", ours)]
        if hf_version:
            hf = bench_hf(text, lines, n_vocab, args.repeats)
            rows.append(("HF tokenizers", hf))
        for name, r in rows:
            print(f"{r['n_vocab']:>5}  {name:<22} {r['train']:>9.3f} {r['enc']:>12.2f} {r['batch']:>11.2f} {r['tpb']:>12.4f}")
        if hf_version:
            print(f"{'':>5}  {'speed-up (ratio)':<22} {'x%.1f' % (hf['train'] / ours['train']):>9} "
                  f"{'x%.1f' % (ours['enc'] / hf['enc']):>12} {'x%.1f' % (ours['batch'] / hf['batch']):>11} "
                  f"{ours['tpb'] / hf['tpb']:>12.4f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
