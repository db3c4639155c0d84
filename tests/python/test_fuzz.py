"""The fuzz suite in CI, with a bounded budget (docs/fuzzing.md: how to run it longer).

* fuzz/props.py — hypothesis properties over every public constructor, component call, model call
  sequence (a state machine), tokenizer and file loader — runs in a child process: a segfault or abort
  fails the test and prints the input being run (the last line of the child's log, written before each
  example). The number of generated inputs is printed.
* fuzz/fuzz_parsers.py — atheris, coverage-guided, on the tokenizer files, model files and their configs,
  prompt caches (both file formats of the core's reader), from the committed corpus fuzz/corpus, for FT_FUZZ_SECONDS (default 30) seconds.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import formal_transformers as ft
from conftest import child_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("FT_FUZZ_EXAMPLES", "100"))
SECONDS = int(os.environ.get("FT_FUZZ_SECONDS", "30"))


def last_input(log: pathlib.Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "<no log>"
    return lines[-1] if lines else "<none>"


def test_hypothesis_fuzz_suite(tmp_path):
    log = tmp_path / "inputs.log"
    cmd = [sys.executable, str(ROOT / "fuzz" / "props.py"), "--examples", str(EXAMPLES), "--log", str(log),
           "--seed", os.environ.get("FT_FUZZ_SEED", "0")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=child_env(), cwd=tmp_path)
    print(r.stdout)
    if r.returncode != 0 and not r.stdout.strip().endswith("}"):
        pytest.fail(f"fuzz child died (exit {r.returncode}) on input:\n{last_input(log)}\n{r.stderr[-4000:]}")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"hypothesis fuzz suite: {summary['inputs']} generated inputs in {summary['seconds']} s "
          f"{summary['per_property']}", file=sys.stderr)
    assert r.returncode == 0 and not summary["failed"], f"{summary['failed']}\n{r.stderr[-6000:]}"
    assert summary["inputs"] >= 5 * EXAMPLES  # the properties really ran


def test_atheris_parsers_from_the_corpus(tmp_path):
    pytest.importorskip("atheris", reason="atheris is in the test extra (pip install '.[test]')")
    corpus = ROOT / "fuzz" / "corpus"
    assert len(list(corpus.iterdir())) >= 5
    targets = {p.read_bytes()[0] % 8 for p in corpus.iterdir() if p.stat().st_size}
    assert {1, 2, 7} <= targets  # both file formats of the core's reader: model files (and configs), prompt caches
    new = tmp_path / "new"
    new.mkdir()
    cmd = [sys.executable, str(ROOT / "fuzz" / "fuzz_parsers.py"), str(new), str(corpus),
           f"-max_total_time={SECONDS}", "-timeout=20", "-max_len=8192", "-rss_limit_mb=4096", f"-artifact_prefix={tmp_path}/",
           "-print_final_stats=1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=SECONDS + 120, env=child_env(), cwd=tmp_path)
    out = r.stdout + r.stderr
    crashes = [p for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-"))]
    if r.returncode != 0 or crashes:
        detail = "".join(f"\n{p.name}: {p.read_bytes()[:2000]!r}" for p in crashes)
        pytest.fail(f"atheris found a failure (exit {r.returncode}):{detail}\n{out[-6000:]}")
    execs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", out)
    cov = re.findall(r"cov: (\d+)", out)
    print(f"atheris: {execs[-1] if execs else '?'} executions, coverage {cov[-1] if cov else '?'} "
          f"edges in {SECONDS} s", file=sys.stderr)
    assert execs and int(execs[-1]) > 50, out[-3000:]
    shutil.rmtree(new, ignore_errors=True)
