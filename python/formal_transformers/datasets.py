"""Helpers for the notebooks: where the real data is, the Tatoeba pairs, and translation scores.

    from formal_transformers import datasets
    path = datasets.data_file("tinyshakespeare.txt")   # None where ../shared/data is absent
    if path is None:
        print(datasets.skip_message("tinyshakespeare.txt"))

The real data (README of ../shared/data) is not the project's own and is never copied into the
repository: it is found at run time, and code using it skips with a message where it is absent (as on a
user's machine). Nothing here is exported from `formal_transformers` itself.

Translation scores (used by notebooks/08_translation_edtraining.ipynb):
  * exact_match: the fraction of hypotheses equal to one of their references after `normalize`
    (Unicode NFC, surrounding whitespace stripped, inner runs of whitespace as one space).
  * bleu: corpus BLEU-4 (Papineni et al. 2002) on `bleu_tokens` (words and single punctuation marks,
    case kept): modified n-gram precisions p_1..p_4 with counts clipped by the maximum count over the
    references, the geometric mean of the four, times the brevity penalty exp(min(0, 1 − r/c)) where c is
    the hypotheses' total length and r the sum of the reference lengths closest to each hypothesis
    length (ties: the shorter). Smoothing (Lin & Och 2004, "add one"): for n ≥ 2, p_n = (m_n + 1)/(d_n + 1),
    so a corpus without a 4-gram match is not scored 0. Reported on a 0–100 scale. Close to, but not the
    same number as, sacreBLEU's default (which tokenizes with 13a and smooths differently).
"""
from __future__ import annotations

import collections
import math
import os
import pathlib
import re
import unicodedata
from typing import Iterable, NamedTuple, Optional, Sequence, Union

__all__ = [
    "data_dir", "data_file", "skip_message", "quick", "TatoebaPair", "read_tatoeba", "split_by_source",
    "group_references", "normalize", "bleu_tokens", "bleu", "exact_match",
]

_MARKER = "tinyshakespeare.txt"  # a file every copy of ../shared/data holds


def _candidates() -> list[pathlib.Path]:
    """shared/data beside every ancestor of the current directory and of this package."""
    out = []
    for start in (pathlib.Path.cwd(), pathlib.Path(__file__).resolve().parent):
        for d in (start, *start.parents):
            out.append(d / "shared" / "data")
            if d.name == "shared":
                out.append(d / "data")
    return out


def data_dir() -> Optional[pathlib.Path]:
    """The folder of the real data: $FT_DATA_DIR when set (None if it does not exist), else the first
    `shared/data` found walking up from the current directory and then from this package (the project's
    ../shared/data). None when there is none."""
    env = os.environ.get("FT_DATA_DIR")
    if env:
        p = pathlib.Path(env).expanduser()
        return p.resolve() if p.is_dir() else None
    seen = set()
    for c in _candidates():
        if c in seen:
            continue
        seen.add(c)
        if c.is_dir() and any(c.iterdir()):
            return c.resolve()
    return None


def data_file(name: str) -> Optional[pathlib.Path]:
    """The path of `name` in data_dir(), or None when the folder or the file is absent."""
    d = data_dir()
    if d is None:
        return None
    p = d / name
    return p if p.is_file() else None


def skip_message(name: str) -> str:
    """What a notebook prints when `name` is not available."""
    where = os.environ.get("FT_DATA_DIR") or "../shared/data (beside the repository)"
    return (f"skipped: {name} is not available (looked in {where}; set FT_DATA_DIR to the folder holding it). "
            "The rest of the notebook does not need it.")


def quick() -> bool:
    """True when FT_QUICK is set to a non-empty value other than 0: the notebooks' shortened runs (CI)."""
    return os.environ.get("FT_QUICK", "").strip() not in ("", "0", "false", "False")


# ---------------------------------------------------------------------------------------------------
# Tatoeba English → French pairs


class TatoebaPair(NamedTuple):
    english: str
    french: str
    attribution: str  # the pair's CC-BY 2.0 (France) attribution, to be kept with anything derived from it


def read_tatoeba(path: Union[str, os.PathLike, None] = None) -> list[TatoebaPair]:
    """The pairs of a Tatoeba TSV file (English, French, attribution per line), in file order.
    Default path: data_file("tatoeba-eng-fra-5k.tsv"). ValueError for a line without three fields."""
    if path is None:
        path = data_file("tatoeba-eng-fra-5k.tsv")
        if path is None:
            raise FileNotFoundError(skip_message("tatoeba-eng-fra-5k.tsv"))
    pairs = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != 3:
                raise ValueError(f"{path}:{i}: expected 3 tab-separated fields, got {len(fields)}")
            pairs.append(TatoebaPair(*fields))
    return pairs


def split_by_source(pairs: Sequence[TatoebaPair], test_fraction: float = 0.1, seed: int = 0):
    """(train, test): the distinct English sentences are shuffled (numpy, seeded) and the last
    `test_fraction` of them go to the test split with ALL their French translations, so no test sentence
    is seen in training. Returns two lists of pairs."""
    import numpy as np

    sources = sorted({p.english for p in pairs})
    order = np.random.default_rng(seed).permutation(len(sources))
    n_test = max(1, int(round(test_fraction * len(sources))))
    test_src = {sources[i] for i in order[len(sources) - n_test:]}
    train = [p for p in pairs if p.english not in test_src]
    test = [p for p in pairs if p.english in test_src]
    return train, test


# ---------------------------------------------------------------------------------------------------
# Scores


def normalize(s: str) -> str:
    """Unicode NFC, whitespace runs as one space, stripped (what exact_match compares)."""
    return " ".join(unicodedata.normalize("NFC", s).split())


_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def bleu_tokens(s: str) -> list[str]:
    """The tokens BLEU counts: runs of word characters and single punctuation marks (case kept), e.g.
    "Je suis désolé !" -> ["Je", "suis", "désolé", "!"], "J'ai" -> ["J", "'", "ai"]."""
    return _TOKEN.findall(normalize(s))


def _ngrams(tokens: Sequence[str], n: int) -> collections.Counter:
    return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def bleu(hypotheses: Sequence[str], references: Sequence[Union[str, Sequence[str]]], max_n: int = 4,
         smooth: bool = True) -> float:
    """Corpus BLEU (0–100) of the hypotheses against their references (one str or a list of str per
    hypothesis); the definition is in this module's docstring."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference sets")
    if not hypotheses:
        raise ValueError("no hypotheses")
    matches = [0] * max_n
    totals = [0] * max_n
    c_len = r_len = 0
    for hyp, refs in zip(hypotheses, references):
        refs = [refs] if isinstance(refs, str) else list(refs)
        if not refs:
            raise ValueError("every hypothesis needs at least one reference")
        h = bleu_tokens(hyp)
        rs = [bleu_tokens(r) for r in refs]
        c_len += len(h)
        r_len += min((abs(len(r) - len(h)), len(r)) for r in rs)[1]
        for n in range(1, max_n + 1):
            hc = _ngrams(h, n)
            if not hc:
                continue
            best = collections.Counter()
            for r in rs:
                best |= _ngrams(r, n)  # max count over the references
            matches[n - 1] += sum(min(c, best[g]) for g, c in hc.items())
            totals[n - 1] += sum(hc.values())
    if c_len == 0:
        return 0.0
    log_p = 0.0
    for n in range(max_n):
        m, d = matches[n], totals[n]
        if smooth and n > 0:
            m, d = m + 1, d + 1
        if m == 0 or d == 0:
            return 0.0
        log_p += math.log(m / d) / max_n
    bp = math.exp(min(0.0, 1.0 - r_len / c_len))
    return 100.0 * bp * math.exp(log_p)


def exact_match(hypotheses: Sequence[str], references: Sequence[Union[str, Sequence[str]]]) -> float:
    """Fraction (0–1) of hypotheses equal, after normalize(), to one of their references."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference sets")
    if not hypotheses:
        raise ValueError("no hypotheses")
    hits = 0
    for hyp, refs in zip(hypotheses, references):
        refs = [refs] if isinstance(refs, str) else list(refs)
        hits += normalize(hyp) in {normalize(r) for r in refs}
    return hits / len(hypotheses)


def group_references(pairs: Iterable[TatoebaPair]) -> dict:
    """English sentence -> (list of its French translations, list of their attributions), in file order."""
    out: dict = {}
    for p in pairs:
        fr, at = out.setdefault(p.english, ([], []))
        fr.append(p.french)
        at.append(p.attribution)
    return out
