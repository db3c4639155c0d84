"""The command line (python -m formal_transformers) under bad input (issue 27): an option out of range or a
damaged run directory is one line naming the problem and exit code 2, as argparse reports a bad argument —
never a traceback (ZeroDivisionError, SafetensorError, KeyError, IndexError, AttributeError,
JSONDecodeError) — and nothing in the run directory is changed; --resume without a saved model refuses
instead of starting over; --context below 2 is refused (1-token windows train on nothing)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import formal_transformers as ft
from formal_transformers import cli

SMALL = ["--text", "t.txt", "--context", "8", "--layers", "1", "--heads", "2", "--d-e", "8", "--d-mlp", "16",
         "--batch", "4", "--eval-every", "2", "--warmup", "1", "--quiet"]


def _main(args, capsys):
    """(exit code, stderr) of cli.main(args) in this process."""
    try:
        code = cli.main(args)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """A finished 4-step run with every file a run can hold (optimizer state, early stopping's θ*)."""
    d = tmp_path_factory.mktemp("cli")
    (d / "t.txt").write_text("abcdefgh " * 60 + "hgfedcba " * 10)
    cli.main(["train", *[a if a != "t.txt" else str(d / "t.txt") for a in SMALL], "--out", str(d / "run"),
              "--steps", "4", "--patience", "5", "--restore-best"])
    run = d / "run"
    for f in ("model.safetensors", "tokenizer.json", "optimizer.safetensors", "run.json", "early_stopping.safetensors"):
        assert (run / f).is_file(), f
    return d


def _files(run):
    return {p.name: p.read_bytes() for p in sorted(run.iterdir())}


@pytest.mark.parametrize("option,value", [
    ("--batch", "0"), ("--context", "0"), ("--context", "1"), ("--layers", "0"), ("--heads", "-1"), ("--d-e", "0"),
    ("--steps", "-3"), ("--lr", "nan"), ("--lr", "0"), ("--lr", "inf"), ("--val-frac", "1"), ("--val-frac", "-0.1"),
    ("--dropout", "1"), ("--val-seqs", "-5"), ("--seed", "-1"), ("--seed", str(2**70)), ("--threads", "-2"),
    ("--patience", "0"), ("--warmup", "-1"), ("--weight-decay", "-1"), ("--min-delta", "nan"), ("--batch", "x"),
    ("--tokens", "0"), ("--tau", "0"), ("--top-k", "0"), ("--samples", "0"),
])
def test_options_out_of_range_are_argparse_errors(option, value, capsys, tmp_path):
    cmd = "demo" if option in ("--tokens", "--tau", "--top-k", "--samples") else "train"
    code, err = _main([cmd, "--out", str(tmp_path / "r"), option, value], capsys)
    assert code == 2 and f"argument {option}" in err and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()


def test_an_option_the_model_refuses_is_one_line_exit_2(good_run, capsys, tmp_path):
    # --heads 3 does not divide --d-e 8: the model's ValueError, reported as argparse reports
    args = [a if a != "t.txt" else str(good_run / "t.txt") for a in SMALL]
    args[args.index("--heads") + 1] = "3"
    code, err = _main(["train", *args, "--out", str(tmp_path / "r"), "--steps", "1"], capsys)
    assert code == 2 and "error:" in err and "Traceback" not in err, err


def _damage_json(name, text):
    return lambda run: (run / name).write_text(text)


def _edit_run_json(edit):
    def apply(run):
        st = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps(edit(st)))
    return apply


def _edit_tensors(name, edit):
    def apply(run):
        t = load_file(str(run / name))
        save_file(edit(t), str(run / name))
    return apply


def _pop(d, k):
    d.pop(k)
    return d


DAMAGE = {  # name -> (damage, what the message must name)
    "no model": (lambda run: (run / "model.safetensors").unlink(), "no model.safetensors"),
    "model garbage": (lambda run: (run / "model.safetensors").write_bytes(b"\x00" * 50), "model.safetensors"),
    "model empty": (lambda run: (run / "model.safetensors").write_bytes(b""), "model.safetensors"),
    "no run.json": (lambda run: (run / "run.json").unlink(), "run.json"),
    "run.json garbage": (_damage_json("run.json", "{not json"), "run.json"),
    "run.json list": (_damage_json("run.json", "[1, 2]"), "run.json"),
    "run.json deep": (_damage_json("run.json", "[" * 100_000 + "]" * 100_000), "run.json"),
    "steps_done missing": (_edit_run_json(lambda st: _pop(st, "steps_done")), "steps_done"),
    "steps_done str": (_edit_run_json(lambda st: {**st, "steps_done": "3"}), "steps_done"),
    "history not lists": (_edit_run_json(lambda st: {**st, "history": {"loss": 3}}), "history"),
    "early state lacks restored": (_edit_run_json(lambda st: {**st, "early_stopping": {
        k: v for k, v in st["early_stopping"].items() if k != "restored"}}), "restored"),
    "early state a list": (_edit_run_json(lambda st: {**st, "early_stopping": [1]}), "early_stopping"),
    "tokenizer garbage": (_damage_json("tokenizer.json", "\x00\x01"), "tokenizer.json"),
    "tokenizer list": (_damage_json("tokenizer.json", "[]"), "tokenizer.json"),
    "tokenizer unknown type": (_damage_json("tokenizer.json", '{"type": ["char"]}'), "tokenizer.json"),
    "tokenizer other vocabulary": (lambda run: ft.CharTokenizer.fit("xyz", unk=True).save(str(run / "tokenizer.json")),
                                   "vocabulary"),
    "no tokenizer": (lambda run: (run / "tokenizer.json").unlink(), "tokenizer.json"),
    "optimizer garbage": (lambda run: (run / "optimizer.safetensors").write_bytes(b"garbage!"), "optimizer.safetensors"),
    "optimizer lacks m": (_edit_tensors("optimizer.safetensors", lambda t: _pop(t, "m")), "'m'"),
    "optimizer t empty": (_edit_tensors("optimizer.safetensors", lambda t: {**t, "t": np.zeros(0, np.int64)}), "t must"),
    "optimizer m shape": (_edit_tensors("optimizer.safetensors", lambda t: {**t, "m": np.zeros(3)}),
                          "optimizer.safetensors"),
    "early file garbage": (lambda run: (run / "early_stopping.safetensors").write_bytes(b"\xff" * 9),
                           "early_stopping.safetensors"),
    "early file wrong shapes": (_edit_tensors("early_stopping.safetensors", lambda t: {
        k: np.zeros(2, v.dtype) for k, v in t.items()}), "early_stopping.safetensors"),
    "early file lacks a tensor": (_edit_tensors("early_stopping.safetensors", lambda t: dict(list(t.items())[1:])),
                                  "early_stopping.safetensors"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_resume_directory_is_one_clear_error(good_run, case, capsys, tmp_path):
    damage, names = DAMAGE[case]
    run = tmp_path / "run"
    shutil.copytree(good_run / "run", run)
    damage(run)
    before = _files(run)
    args = [a if a != "t.txt" else str(good_run / "t.txt") for a in SMALL]
    code, err = _main(["train", *args, "--out", str(run), "--steps", "8", "--patience", "5", "--restore-best",
                       "--resume"], capsys)
    assert code == 2 and "error:" in err and names in err and "Traceback" not in err, f"{case}: {code} {err}"
    assert len(err.strip().splitlines()) == 1, err
    assert _files(run) == before  # nothing written: run.json is not overwritten by a fresh start
    if case not in ("no run.json", "run.json garbage", "run.json list", "run.json deep", "steps_done missing",
                    "steps_done str", "history not lists", "early state lacks restored", "early state a list",
                    "optimizer garbage", "optimizer lacks m", "optimizer t empty", "optimizer m shape",
                    "early file garbage", "early file wrong shapes", "early file lacks a tensor"):
        code, err = _main(["sample", "--run", str(run), "--tokens", "3", "--samples", "1"], capsys)
        assert code == 2 and names in err and "Traceback" not in err, f"sample, {case}: {code} {err}"


def test_resume_continues_a_good_run(good_run, capsys, tmp_path):
    # the checks refuse only damage: the same directory undamaged resumes
    run = tmp_path / "run"
    shutil.copytree(good_run / "run", run)
    args = [a if a != "t.txt" else str(good_run / "t.txt") for a in SMALL]
    code, _ = _main(["train", *args, "--out", str(run), "--steps", "6", "--patience", "5", "--restore-best",
                     "--resume"], capsys)
    assert code in (0, None)
    assert json.loads((run / "run.json").read_text())["steps_done"] == 6
    leftovers = [p.name for p in run.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".")]
    assert not leftovers, leftovers


def test_resume_in_an_empty_directory_refuses(good_run, capsys, tmp_path):
    args = [a if a != "t.txt" else str(good_run / "t.txt") for a in SMALL]
    code, err = _main(["train", *args, "--out", str(tmp_path / "new"), "--steps", "2", "--resume"], capsys)
    assert code == 2 and "no model.safetensors" in err and "drop --resume" in err
    assert not any((tmp_path / "new").iterdir())
