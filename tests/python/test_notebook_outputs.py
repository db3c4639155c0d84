"""The committed notebooks' outputs name no machine: no absolute path of the computer that ran them (data
files are printed by name and kind of place, notebooks/ft_notebook.py `where`; warnings that would print a
library's absolute path are silenced there). Reads the .ipynb files as JSON: nothing is executed here."""
from __future__ import annotations

import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# An absolute path: a top-level folder of a Unix machine (or a Windows drive's user folder, or a virtual
# environment's site-packages) not preceded by a word character or a dot (so URLs' paths do not count).
ABSOLUTE = re.compile(r"(?<![\w.~/-])/(?:work|home|root|tmp|Users|usr|opt|var|private|mnt|srv|data|scratch)/"
                      r"|\b[A-Za-z]:\\(?:Users|Documents and Settings)\\|site-packages")


def output_texts(nb: dict):
    """(cell index, text) of every textual output: streams, results, displays and errors."""
    for i, cell in enumerate(nb.get("cells", [])):
        for out in cell.get("outputs", []):
            if "text" in out:
                yield i, "".join(out["text"]) if isinstance(out["text"], list) else out["text"]
            for mime, body in out.get("data", {}).items():
                if mime.startswith("text/") or mime.endswith("json"):
                    yield i, "".join(body) if isinstance(body, list) else str(body)
            if "traceback" in out:
                yield i, "\n".join(out["traceback"])


def absolute_paths(nb: dict) -> list[str]:
    return [f"cell {i}: {line.strip()[:160]}" for i, text in output_texts(nb) for line in text.splitlines()
            if ABSOLUTE.search(line)]


def test_there_are_notebooks_with_outputs():
    assert len(NOTEBOOKS) >= 10
    assert sum(1 for p in NOTEBOOKS for _ in output_texts(json.loads(p.read_text(encoding="utf-8")))) > 100


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_outputs_hold_no_absolute_path(path):
    found = absolute_paths(json.loads(path.read_text(encoding="utf-8")))
    assert not found, f"{path.name}: outputs name a machine's absolute path:\n" + "\n".join(found)


def test_the_check_finds_what_it_is_for():
    def nb(*lines, kind="stream"):
        out = ({"output_type": "stream", "name": "stdout", "text": list(lines)} if kind == "stream" else
               {"output_type": "execute_result", "data": {"text/plain": list(lines)}, "metadata": {}})
        return {"cells": [{"cell_type": "code", "outputs": [out]}]}

    for bad in ["data: /work/shared/data/tinyshakespeare.txt\n", "'/home/ann/x.txt'", "(/root/.cache/f)",
                "/tmp/pytest-1/a", "C:\\Users\\ann\\data.tsv",
                "/opt/venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning"]:
        assert absolute_paths(nb(bad)), bad
        assert absolute_paths(nb(bad, kind="result")), bad
    for good in ["data: tinyshakespeare.txt (the data folder: FT_DATA_DIR or ../shared/data)\n",
                 "See https://ipywidgets.readthedocs.io/en/stable/user_install.html", "ratio 3/4 = 0.75",
                 "docs/design.md", "../shared/data", "a/b/home/c"]:
        assert not absolute_paths(nb(good)), good


def test_ft_notebook_prints_where_a_file_is_not_its_path(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install '.[notebooks]')")
    pytest.importorskip("IPython", reason="IPython is not installed (pip install '.[notebooks]')")
    monkeypatch.syspath_prepend(str(ROOT / "notebooks"))
    sys.modules.pop("ft_notebook", None)
    import ft_notebook

    folder, cache, other = tmp_path / "data", tmp_path / "cache", tmp_path / "elsewhere"
    for d in (folder, cache, other):
        d.mkdir()
        (d / "tinyshakespeare.txt").write_text("x")
    monkeypatch.setenv("FT_DATA_DIR", str(folder))
    monkeypatch.setenv("FT_CACHE_DIR", str(cache))
    got = {d.name: ft_notebook.where(d / "tinyshakespeare.txt") for d in (folder, cache, other)}
    assert got == {"data": "the data folder: FT_DATA_DIR or ../shared/data", "cache": "the download cache",
                   "elsewhere": "the path given"}
