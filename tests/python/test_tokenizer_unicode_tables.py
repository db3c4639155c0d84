"""The pre-tokenizer's Unicode tables (cpp/src/tokenize/unicode_tables.cpp) are what tools/gen_unicode_tables.py
makes from Python's unicodedata: regenerated and compared byte for byte when this Python's unicodedata has
the Unicode version the committed file states; otherwise the comparison is impossible and the test says so
(a skip naming both versions, which CI's FT_NO_SKIP turns into a failure: CI's Python must match)."""
from __future__ import annotations

import importlib.util
import pathlib
import re
import unicodedata

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLES = ROOT / "cpp" / "src" / "tokenize" / "unicode_tables.cpp"
GEN = ROOT / "tools" / "gen_unicode_tables.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_unicode_tables", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _committed_version(text: str) -> str:
    m = re.search(r'kUnicodeVersion = "([0-9.]+)"', text)
    assert m, "unicode_tables.cpp states no Unicode version"
    return m.group(1)


def test_generator_reproduces_the_committed_tables():
    committed = TABLES.read_text(encoding="utf-8")
    version = _committed_version(committed)
    assert f"(Unicode {version})" in committed.splitlines()[0]
    if unicodedata.unidata_version != version:
        pytest.skip(f"cannot compare: the tables are Unicode {version}, this Python's unicodedata is "
                    f"{unicodedata.unidata_version} (run the test with a Python whose unicodedata is {version})")
    assert _generator().render() == committed, \
        "cpp/src/tokenize/unicode_tables.cpp differs from what tools/gen_unicode_tables.py generates; rerun it"


def test_generated_ranges_classify_like_unicodedata():
    """The range logic itself (independent of the committed file): every code point's class from the
    generated runs equals unicodedata's category, and runs are maximal and sorted."""
    gen = _generator()
    rs = gen.ranges()
    assert all(a[1] < b[0] for a, b in zip(rs, rs[1:]))
    assert all(not (a[1] + 1 == b[0] and a[2] == b[2]) for a, b in zip(rs, rs[1:]))  # maximal
    import bisect
    los = [r[0] for r in rs]
    for cp in list(range(0x80, 0x3000)) + [0x4E00, 0x10FFFF, 0x1D7CE, 0x1F600, 0xFF10, 0x2160]:
        i = bisect.bisect_right(los, cp) - 1
        got = rs[i][2] if i >= 0 and cp <= rs[i][1] else None
        assert got == {"L": "L", "N": "N"}.get(unicodedata.category(chr(cp))[0]), hex(cp)
