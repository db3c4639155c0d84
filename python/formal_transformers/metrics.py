"""Translation scores (used by notebooks/08_tatoeba_translation.ipynb; re-exported by ft.datasets).

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
import numbers
import re
import unicodedata
from typing import Sequence, Union

__all__ = ["normalize", "bleu_tokens", "bleu", "exact_match"]


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
    if isinstance(max_n, bool) or not isinstance(max_n, numbers.Integral):
        raise TypeError(f"max_n must be an int, got {type(max_n).__name__}")
    if not 1 <= max_n <= 100:
        raise ValueError(f"max_n must be in [1, 100] (the longest n-gram counted; BLEU-4: 4), got {max_n}")
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


