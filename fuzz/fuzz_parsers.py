"""Coverage-guided fuzzing (atheris, libFuzzer's engine for Python) of the parsers that read files:
the tokenizer files (CharTokenizer / WordTokenizer / BPETokenizer .from_json, what .load reads), the two file
formats of the core's one reader (io.hpp): model files (ft.load: safetensors header, tensors) with the model config
inside them, and prompt caches (ft.PromptCache.load).

Input layout: the first byte picks the target, the rest is its payload:
    0  tokenizer file text (UTF-8, surrogatepass) -> every tokenizer class's from_json
    1  a whole model file (bytes) -> ft.load
    2  the config JSON of an otherwise valid model file -> ft.load
    3  the config.json of an otherwise valid Hugging Face directory (GPT-2, BERT or LLaMA-style, by the
       payload's first byte) -> ft.load_hf
    4  a run directory's run.json -> the CLI's checks of what --resume reads (cli.RunError)
    5  a cached data file (downloads off) -> ft.datasets.tiny_shakespeare (the pinned file or
       DataNotFoundError), and the same bytes as a downloaded fra-eng.zip -> the Tatoeba derivation
    6  GPT-2's vocab.json and merges.txt, separated by the first NUL byte -> BPETokenizer.from_gpt2_files
       (ids far beyond the entries, repeated or missing, must be a ValueError before any table is sized)
    7  a whole prompt cache file (bytes) -> ft.PromptCache.load for the model the corpus's caches were made with
       (PROMPT_MODEL), and a loaded cache continued one token
Accepted outcomes: a result, or ValueError / TypeError (the documented errors; for 4 the CLI's RunError, for
5 DataNotFoundError). Anything else — another exception, a crash, a hang (-timeout) — is a finding: atheris
stops and writes the input to crash-<sha1>.

Coverage is measured on the Python code atheris instruments (formal_transformers' io.py, hf.py, cli.py,
datasets.py); the C++ readers run on every input but are not instrumented (that needs the
core built with clang's -fsanitize=fuzzer-no-link). docs/fuzzing.md says how to run this longer.

    FT_CORE_PATH=build/dev PYTHONPATH=python python fuzz/fuzz_parsers.py /tmp/new-corpus fuzz/corpus \\
        -max_total_time=600
"""
from __future__ import annotations

import inspect
import json
import json.decoder
import os
import sys
import tempfile

import atheris

import numpy as np

import formal_transformers as ft
from formal_transformers import cli as ft_cli
from formal_transformers import datasets as ft_datasets
from formal_transformers import hf as ft_hf
from formal_transformers import io as ft_io


def instrument(*modules) -> int:
    """Coverage instrumentation of the Python functions (and methods) defined in these modules. (The modules
    are already imported by numpy & co., so atheris.instrument_imports would miss them, and instrument_all
    takes minutes on numpy.)"""
    n = 0
    for mod in modules:
        for obj in list(vars(mod).values()):
            funcs = [obj] if inspect.isfunction(obj) else \
                [f for f in vars(obj).values() if inspect.isfunction(f)] if inspect.isclass(obj) else []
            for f in funcs:
                if getattr(f, "__module__", None) == mod.__name__:
                    atheris.instrument_func(f)
                    n += 1
    return n


TMP = tempfile.mkdtemp(prefix="ft-atheris-")
MODEL = os.path.join(TMP, "model.safetensors")
FILE = os.path.join(TMP, "input.safetensors")
TOKENIZERS = (ft.CharTokenizer, ft.WordTokenizer, ft.BPETokenizer)


def _setup():
    ft.set_num_threads(1)
    ft.save(ft.DTransformer(12, 8, 1, 2, 4, 6), MODEL)
    from safetensors.numpy import load_file

    return load_file(MODEL), ft.io.read_metadata(MODEL)


TENSORS, META = _setup()
# the model of target 7's caches (fuzz/make_corpus.py makes the corpus's caches with the same one)
PROMPT_MODEL = ft.DTransformer(12, 8, 1, 2, 4, 6, positional="rope", seed=5)


def _hf_dirs() -> list:
    """save_hf directories of a tiny GPT-2, BERT and LLaMA-style model (their config.json is replaced per input)."""
    out = []
    for i, m in enumerate([ft.DTransformer(11, 6, 2, 2, 4, 6),
                           ft.ETransformer(11, 6, 2, 2, 4, 6, 4, embed_norm=True, unembed_bias=True, n_segments=2),
                           ft.DTransformer(11, 6, 2, 2, 4, 6, positional="rope", H_kv=1, mlp="swiglu", bias=False,
                                           norm="rms")]):
        d = os.path.join(TMP, f"hf{i}")
        ft.save_hf(m, d)
        out.append(d)
    return out


HF_DIRS = _hf_dirs()
RUN = os.path.join(TMP, "run")
os.makedirs(RUN)
GOOD_TEXT = b"First Citizen:\n"
DATA = os.path.join(TMP, "data")
os.makedirs(DATA)
CACHE = os.path.join(TMP, "cache")
os.makedirs(CACHE)
os.environ.update(FT_DATA_DIR=DATA, FT_CACHE_DIR=CACHE, FT_DOWNLOAD="0")
ft_datasets.SOURCES[ft_datasets.TINY_SHAKESPEARE] = ft_datasets.Source(
    "http://127.0.0.1:9/none", __import__("hashlib").sha256(GOOD_TEXT).hexdigest())


def with_config(config: str) -> str:
    from safetensors.numpy import save_file

    meta = dict(META, **{"formal_transformers.config": config})
    save_file(TENSORS, FILE, metadata=meta)
    return FILE


def test_one_input(data: bytes) -> None:
    if not data:
        return
    target, payload = data[0] % 8, data[1:]
    if target == 7:
        with open(FILE, "wb") as f:
            f.write(payload)
        try:
            cache = ft.PromptCache.load(FILE, PROMPT_MODEL)
        except ValueError:
            return
        ft.DInference(1, 0.0)(cache, PROMPT_MODEL)
        return
    if target == 3:
        d = HF_DIRS[payload[0] % 3] if payload else HF_DIRS[0]
        with open(os.path.join(d, "config.json"), "wb") as f:
            f.write(payload[1:])
        try:
            m = ft.load_hf(d)
        except ValueError:
            return
        m(np.array([0]))
        return
    if target == 4:
        with open(os.path.join(RUN, "run.json"), "wb") as f:
            f.write(payload)
        try:
            state = ft_cli._load_run_state(__import__("pathlib").Path(RUN))
            if state.get("early_stopping") is not None:
                ft.DTraining(1, 0.1).early_stopping = state["early_stopping"]
        except (ft_cli.RunError, ValueError, TypeError):
            pass
        return
    if target == 5:
        with open(os.path.join(CACHE, ft_datasets.TINY_SHAKESPEARE), "wb") as f:
            f.write(payload)
        try:
            text = ft_datasets.tiny_shakespeare()
            assert text == GOOD_TEXT.decode() and payload == GOOD_TEXT
        except ft_datasets.DataNotFoundError:
            assert payload != GOOD_TEXT
        try:
            ft_datasets._tatoeba_subset(payload, 3)
        except (ft_datasets.DataNotFoundError, ValueError):
            pass
        return
    if target == 0:
        text = payload.decode("utf-8", "surrogatepass") if _utf8(payload) else payload.decode("latin-1")
        for cls in TOKENIZERS:
            try:
                t = cls.from_json(text)
            except ValueError:
                continue
            t.encode("the cat \ud800 sat")
            t.decode(list(range(min(t.n_vocab, 50))))
            u = cls.from_json(t.to_json())  # what we write, we read back
            assert u.to_json() == t.to_json()
        return
    if target == 6:
        vocab, _, merges = payload.partition(b"\0")
        for name, blob in (("vocab.json", vocab), ("merges.txt", merges)):
            with open(os.path.join(TMP, name), "wb") as f:
                f.write(blob)
        try:
            t = ft.BPETokenizer.from_gpt2_files(os.path.join(TMP, "vocab.json"), os.path.join(TMP, "merges.txt"))
        except ValueError:
            return
        assert t.n_vocab <= vocab.count(b":") + 1  # no id beyond the entries: one "key": id pair per token
        t.decode(t.encode("the cat \u0100 sat", bos=False, eos=False))
        return
    if target == 1:
        with open(FILE, "wb") as f:
            f.write(payload)
        path = FILE
    else:
        path = with_config(payload.decode("utf-8", "replace"))
    try:
        m = ft_io.load(path)
    except (ValueError, TypeError):
        return
    x = np.array([0])  # a valid input for any loaded model (n_vocab >= 1, l_max >= 1)
    m(x, x) if isinstance(m, ft.EDTransformer) else m(x)


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8", "surrogatepass")
        return True
    except UnicodeDecodeError:
        return False


def main() -> None:
    hf_modules = [m for n, m in sys.modules.items() if n.startswith(ft_hf.__name__ + ".")]  # the package's modules
    instrument(ft_io, *hf_modules, ft_cli, ft_datasets, json, json.decoder, sys.modules[__name__])
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
