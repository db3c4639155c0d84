"""Early stopping in the three trainers (docs/early_stopping.md): patience, min_delta, restore_best.

Validation data unlike the training data makes the validation loss fall, then rise; each run's recorded
evaluations are replayed through the listing's rule (`expected_stop`) to find where it must stop, and the
run must have stopped exactly there; restore_best must leave the model bit for bit at the θ a callback
saved at the best evaluation; a run that keeps improving is the same run as without early stopping; a run
split in two with the state carried over stops where one run stops; bad input raises before any update;
the CLI's --patience / --restore-best / --resume end to end.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import formal_transformers as ft

from test_training import assert_identical as assert_params_equal  # bit for bit, parameter by parameter

pytestmark = pytest.mark.usefixtures("one_thread")  # a single-threaded core (conftest.one_thread)

N_V = 8  # tokens 0..4 are data, 5 = mask, 6 = bos, 7 = eos
BOS, EOS = N_V - 2, N_V - 1


def cycles(l=12, step=1):
    """The cycle 0 1 2 3 4 (step 1) or 4 3 2 1 0 (step −1), one sequence starting at each phase."""
    return [(p + step * np.arange(l)) % 5 for p in range(5)]


def model(kind, seed=3):
    if kind == "d":
        return ft.DTransformer(N_V, 12, 1, 2, 16, 32, dtype="float64", seed=seed)
    if kind == "e":
        return ft.ETransformer(N_V, 12, 1, 2, 16, 32, 8, dtype="float64", seed=seed)
    return ft.EDTransformer(N_V, 12, 1, 1, 2, 16, 32, dtype="float64", seed=seed)


def task(kind):
    """(training data, validation data): the validation loss first falls (what both share is learnt),
    then rises (the model grows confident in what the validation data contradicts)."""
    fwd, bwd = cycles(), cycles(step=-1)
    if kind == "d":
        return (fwd,), fwd + bwd  # half the validation sequences run backwards
    if kind == "e":
        return (fwd,), [np.full(12, p) for p in range(5)]  # constant sequences
    z = cycles(6)
    rev = [np.concatenate([[BOS], s[::-1], [EOS]]) for s in z]  # learn to reverse z
    same = [np.concatenate([[BOS], s, [EOS]]) for s in z]  # validate on copying it
    return (z, rev), (z, rev[:2] + same[2:])


ETA = {"d": 0.005, "e": 0.02, "ed": 0.01}  # the validation loss is lowest after a few evaluations


def trainer(kind, val, **kw):
    kw = dict(dict(optimizer="sgd", shuffle=False, eval_every=5, progress=False), **kw)
    n_epochs, eta = kw.pop("n_epochs", 60), kw.pop("eta", ETA[kind])
    if kind == "ed":
        return ft.EDTraining(n_epochs, eta, val_data=val, **kw)
    if kind == "e":
        return ft.ETraining(n_epochs, eta, p_mask=0.3, val_data=val, **kw)
    return ft.DTraining(n_epochs, eta, val_data=val, **kw)


def flat(m):
    return np.concatenate([np.asarray(v).ravel(order="K") for v in m.params.values()])


def run(kind, m=None, snapshots=None, **kw):
    """Train with a callback that keeps θ at every evaluation; returns (model, trainer)."""
    m = m if m is not None else model(kind)
    data, val = task(kind)

    def keep(info):
        if snapshots is not None and info["val_loss"] is not None:
            snapshots[info["step"]] = {k: np.array(v) for k, v in m.params.items()}

    tr = trainer(kind, val, callback=keep, **kw)
    tr(*data, m)
    return m, tr


def expected_stop(val_loss, patience, min_delta=0.0):
    """The listing's lines 4–9 replayed: (index of the evaluation that stops training or None, index of
    the best)."""
    best, i_best, k = np.inf, None, 0
    for i, loss in enumerate(val_loss):
        if loss < best - min_delta:
            best, i_best, k = loss, i, 0
        else:
            k += 1
            if k == patience:
                return i, i_best
    return None, i_best


def val_loss_of(kind, m):
    _, val = task(kind)
    return m.loss(*val, reduction="mean") if kind == "ed" else m.loss(val, reduction="mean")


# ------------------------------------------------------------------------------------------------------
# stopping, restoring


@pytest.mark.parametrize("kind", ["d", "e", "ed"])
@pytest.mark.parametrize("patience", [1, 3])
def test_stops_after_exactly_patience_evaluations_without_improvement(kind, patience):
    m, tr = run(kind, patience=patience)
    h = tr.history
    stop, best = expected_stop(h["val_loss"], patience)
    assert stop is not None and best > 0, "the validation loss should fall, then rise"
    assert len(h["val_loss"]) == stop + 1  # not one evaluation more or less
    assert h["step"][-1] == h["val_step"][-1] == 5 * (stop + 1)  # ended at that evaluation's step
    assert h["step"][-1] < 60 * 5
    assert h["stopped_early"] is True and h["restored_best"] is False
    assert h["best_step"] == h["val_step"][best] and h["best_val_loss"] == h["val_loss"][best]
    assert tr.early_stopping["bad_evals"] == patience


@pytest.mark.parametrize("kind", ["d", "e", "ed"])
def test_restore_best_holds_the_best_evaluations_parameters_bit_for_bit(kind):
    snaps = {}
    m, tr = run(kind, snapshots=snaps, patience=3, restore_best=True)
    h = tr.history
    assert h["stopped_early"] and h["restored_best"]
    best = h["best_step"]
    assert best < h["step"][-1]
    assert_params_equal(m, snaps[best])
    assert h["best_val_loss"] == min(h["val_loss"])
    if kind != "e":  # ETraining's validation masks are the trainer's own; the others: loss of the model
        assert val_loss_of(kind, m) == pytest.approx(h["best_val_loss"], rel=1e-12)
    # the state: θ* and the last step's θ (what a resumed run continues from)
    assert_params_equal(tr.early_stopping["best_params"], snaps[best])
    assert_params_equal(tr.early_stopping["last_params"], snaps[h["step"][-1]])
    # without restore_best: the same run, and the model holds the last θ
    snaps2 = {}
    m2, tr2 = run(kind, snapshots=snaps2, patience=3)
    assert tr2.history["step"] == h["step"] and tr2.history["val_loss"] == h["val_loss"]
    assert_params_equal(m2, snaps2[h["step"][-1]])
    assert not tr2.history["restored_best"] and tr2.early_stopping["best_params"] is None
    with pytest.raises(AssertionError):
        assert_params_equal(m2, m)


def test_restore_best_without_patience_runs_every_epoch_and_restores():
    snaps = {}
    m, tr = run("d", snapshots=snaps, n_epochs=20, restore_best=True)
    h = tr.history
    assert h["step"][-1] == 100 and not h["stopped_early"] and h["restored_best"]
    assert_params_equal(m, snaps[h["best_step"]])
    assert h["best_val_loss"] == min(h["val_loss"])
    # max_steps ends a run normally too: restored
    m, tr = run("d", snapshots=snaps, max_steps=60, restore_best=True)
    assert tr.history["restored_best"] and tr.history["step"][-1] == 60
    assert_params_equal(m, snaps[tr.history["best_step"]])


def test_min_delta_counts_only_large_enough_improvements():
    _, plain = run("d", patience=3)
    delta = 0.05
    _, tr = run("d", patience=3, min_delta=delta)
    stop, best = expected_stop(tr.history["val_loss"], 3, delta)
    assert len(tr.history["val_loss"]) == stop + 1
    assert tr.history["best_step"] == tr.history["val_step"][best]
    assert len(tr.history["val_loss"]) < len(plain.history["val_loss"])  # small gains no longer count


def test_a_run_that_keeps_improving_is_unaffected():
    data = cycles()
    m1, m2 = model("d"), model("d")
    kw = dict(optimizer="sgd", shuffle=False, eval_every=5, progress=False, val_data=data)
    t1 = ft.DTraining(8, 0.05, patience=1, restore_best=True, **kw)
    t1(data, m1)
    t2 = ft.DTraining(8, 0.05, **kw)
    t2(data, m2)
    v = t1.history["val_loss"]
    assert len(v) == 8 and all(b < a for a, b in zip(v, v[1:]))  # improves at every evaluation
    assert_params_equal(m1, m2)
    for k in t1.history.KEYS:
        if k != "time":
            assert t1.history[k] == t2.history[k], k
    assert not t1.history["stopped_early"] and not t1.history["restored_best"]
    assert t1.history["best_step"] == 40


def test_ctrl_c_restores_nothing_and_keeps_the_state():
    snaps = {}
    m = model("d")
    data, val = task("d")

    def cb(info):
        if info["val_loss"] is not None:
            snaps[info["step"]] = {k: np.array(v) for k, v in m.params.items()}
        if info["step"] == 25:
            raise KeyboardInterrupt

    ref, tr_ref = run("d", patience=3)
    assert tr_ref.history["step"][-1] > 25  # the uninterrupted run goes further
    tr = trainer("d", val, callback=cb, patience=3, restore_best=True)
    with pytest.raises(KeyboardInterrupt):
        tr(*data, m)
    assert tr.history["step"][-1] == 25 and not tr.history["restored_best"]
    assert_params_equal(m, snaps[25])  # the last completed step's θ, as without early stopping
    assert_params_equal(tr.early_stopping["best_params"], snaps[tr.history["best_step"]])


# ------------------------------------------------------------------------------------------------------
# resuming


@pytest.mark.parametrize("restore", [False, True])
def test_a_run_split_in_two_stops_where_one_run_stops(restore):
    one, t_one = run("d", patience=3, restore_best=restore)
    h = t_one.history
    cut = h["val_step"][-2]  # the last evaluation before the stop: past the best, two bad ones counted
    assert h["best_step"] < cut
    # first part: a trainer limited to `cut` steps; then a new trainer with start_step and the state
    m = model("d")
    _, t1 = run("d", m, patience=3, restore_best=restore, max_steps=cut)
    state = t1.early_stopping
    assert state["bad_evals"] == 2 and not state["stopped"]
    assert state["restored"] == restore
    if restore:
        m.params.update(state["last_params"])  # continue from the last step, as the CLI does
    saved = json.loads(json.dumps({k: state[k] for k in ("best_val_loss", "best_step", "bad_evals")}))
    if restore:
        saved["best_params"] = state["best_params"]
    data, val = task("d")
    t2 = trainer("d", val, patience=3, restore_best=restore, start_step=cut)
    t2.early_stopping = saved
    t2(*data, m)
    assert cut + t2.history["step"][-1] == h["step"][-1]  # the same stop step
    assert len(t2.history["val_loss"]) == 1  # one more bad evaluation was enough
    assert t2.history["stopped_early"]
    assert t2.early_stopping["best_step"] == t2.history["best_step"] == h["best_step"]  # counted from the start
    assert t2.history["best_val_loss"] == h["best_val_loss"]
    assert_params_equal(m, one)


def test_calling_the_same_trainer_again_continues_its_counters_and_a_new_model_starts_afresh():
    m = model("d")
    data, val = task("d")
    tr = trainer("d", val, patience=3, n_epochs=1)  # 5 steps and one evaluation per call
    calls = 0
    while not tr.history["stopped_early"]:
        tr(*data, m)
        calls += 1
        assert calls < 60
    _, one = run("d", patience=3)
    assert tr.history["step"] == one.history["step"] and tr.history["val_loss"] == one.history["val_loss"]
    assert tr.history["best_step"] == one.history["best_step"]
    tr(*data, model("d", seed=4))  # another model: fresh counters
    assert tr.early_stopping["bad_evals"] == 0 and not tr.history["stopped_early"]


# ------------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("kind", ["d", "e", "ed"])
def test_early_stopping_without_validation_data_is_a_value_error(kind):
    for opts in (dict(patience=2), dict(restore_best=True)):
        with pytest.raises(ValueError, match="val_data"):
            trainer(kind, None, **opts)
    # and when val_data is removed afterwards, the core refuses before any update
    data, val = task(kind)
    m, fresh = model(kind), model(kind)
    tr = trainer(kind, val, patience=2)
    tr.val_data = None
    with pytest.raises(ValueError, match="validation data"):
        tr(*data, m)
    assert_params_equal(m, fresh)


@pytest.mark.parametrize(
    "opts, err, match",
    [
        (dict(patience=0), ValueError, "patience"),
        (dict(patience=-2), ValueError, "patience"),
        (dict(patience=1.5), TypeError, "patience"),
        (dict(patience=True), TypeError, "patience"),
        (dict(patience="3"), TypeError, "patience"),
        (dict(min_delta=-0.1), ValueError, "min_delta"),
        (dict(min_delta=float("nan")), ValueError, "min_delta"),
        (dict(min_delta="0"), TypeError, "min_delta"),
        (dict(restore_best=1), TypeError, "restore_best"),
        (dict(restore_best="yes"), TypeError, "restore_best"),
    ],
)
def test_bad_early_stopping_options(opts, err, match):
    _, val = task("d")
    with pytest.raises(err, match=match):
        trainer("d", val, **opts)


def test_bad_states_are_refused_before_any_update():
    data, val = task("d")
    tr = trainer("d", val, patience=2, restore_best=True)
    with pytest.raises(TypeError):
        tr.early_stopping = [1, 2]
    m, fresh = model("d"), model("d")
    bad = [
        (dict(best_val_loss=1.0, best_step=3, bad_evals=0, best_params=None), ValueError),  # θ* missing
        (dict(best_val_loss=1.0, best_step=3, bad_evals=-1), ValueError),
        (dict(best_val_loss="x", best_step=3, bad_evals=0), TypeError),
        (dict(best_val_loss=1.0, best_step=3, bad_evals=0, best_params={"W_e": np.zeros((2, 2))}), ValueError),
        (dict(best_val_loss=1.0, best_step=3, bad_evals=0, best_params=[1]), TypeError),
    ]
    wrong_shape = {k: np.zeros(np.asarray(v).shape) for k, v in m.params.items()}
    wrong_shape["W_e"] = np.zeros((3, 3))
    bad.append((dict(best_val_loss=1.0, best_step=3, bad_evals=0, best_params=wrong_shape), ValueError))
    for state, err in bad:
        tr.early_stopping = state
        with pytest.raises(err):
            tr(*data, m)
        assert_params_equal(m, fresh)
        assert tr.history["step"] == []


def test_a_resumed_states_keys_are_checked_up_front():
    """A state lacking 'restored', with bad val_data, was a KeyError raised while handling the ValueError: the
    keys are checked when the state is assigned (ValueError naming the key), and a failed call never reads a
    resumed state's own stopped / restored back."""
    _, val = task("d")
    tr = trainer("d", val, patience=2)
    full = dict(best_val_loss=1.0, best_step=3, bad_evals=0, stopped=False, restored=False)
    for k in ("best_val_loss", "best_step", "bad_evals", "stopped", "restored"):
        with pytest.raises(ValueError, match=k):
            tr.early_stopping = {kk: v for kk, v in full.items() if kk != k}
        assert tr.early_stopping is None  # nothing taken from a refused state
    with pytest.raises(ValueError, match="bogus"):
        tr.early_stopping = {**full, "bogus": 1}
    data, _ = task("d")
    m, fresh = model("d"), model("d")
    for state in (full, {k: full[k] for k in ("best_val_loss", "best_step", "bad_evals")}):
        bad = trainer("d", [np.array([0, 1, 99])], patience=2)  # token 99 >= n_vocab: the core refuses it
        bad.early_stopping = state
        with pytest.raises((ValueError, IndexError)) as e:
            bad(*data, m)
        assert not isinstance(e.value, KeyError)
        assert bad.early_stopping == state  # the resumed state is kept as it was
        assert_params_equal(m, fresh)


# ------------------------------------------------------------------------------------------------------
# the CLI


def _cli(args, cwd):
    env = dict(os.environ)
    package_parent = str(__import__("pathlib").Path(ft.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if env.get("FT_CORE_PATH"):
        env["FT_CORE_PATH"] = str(__import__("pathlib").Path(env["FT_CORE_PATH"]).resolve())
    r = subprocess.run([sys.executable, "-m", "formal_transformers", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"{args}: {r.stdout}\n{r.stderr}"
    return r.stdout


def _write_text(tmp_path):
    # training text: one phrase over and over; validation (its last 10 %): the phrase backwards
    phrase = "abcdefgh "
    (tmp_path / "t.txt").write_text(phrase * 450 + phrase[::-1] * 50)


SMALL = ["--text", "t.txt", "--context", "16", "--layers", "1", "--heads", "2", "--d-e", "16", "--d-mlp", "32",
         "--batch", "4", "--eval-every", "4", "--warmup", "2", "--lr", "1e-3", "--min-lr", "1e-3", "--quiet"]


def _state(run):
    return json.loads((run / "run.json").read_text())


def test_cli_patience_and_restore_best_end_to_end(tmp_path):
    from safetensors.numpy import load_file

    _write_text(tmp_path)
    out = _cli(["train", *SMALL, "--out", "run", "--steps", "400", "--patience", "2", "--restore-best"], tmp_path)
    st = _state(tmp_path / "run")
    es, hist = st["early_stopping"], st["history"]
    assert es["stopped"] and es["restored"] and "stopped early" in out
    assert st["steps_done"] < 400 and st["steps_done"] == hist["step"][-1] == hist["val_step"][-1]
    stop, best = expected_stop(hist["val_loss"], 2)
    assert best > 0, "the validation loss should fall first"
    assert stop == len(hist["val_loss"]) - 1 and es["best_step"] == hist["val_step"][best]
    assert es["best_val_loss"] == hist["val_loss"][best] and es["bad_evals"] == 2
    # the saved model is θ*; the last step's θ is kept for --resume
    m = ft.load(tmp_path / "run" / "model.safetensors")
    t = load_file(tmp_path / "run" / "early_stopping.safetensors")
    for k, v in m.params.items():
        assert np.array_equal(np.asarray(v), t["best." + k]), k
    assert any(not np.array_equal(np.asarray(v), t["last." + k]) for k, v in m.params.items())
    # resuming a run that stopped early does nothing
    out = _cli(["train", *SMALL, "--out", "run", "--steps", "800", "--patience", "2", "--restore-best", "--resume"],
               tmp_path)
    assert "nothing to do" in out and _state(tmp_path / "run")["steps_done"] == st["steps_done"]


def test_cli_resume_carries_the_counters_and_the_last_parameters(tmp_path):
    from formal_transformers import cli

    _write_text(tmp_path)
    _cli(["train", *SMALL, "--out", "one", "--steps", "400", "--patience", "3"], tmp_path)
    one = _state(tmp_path / "one")
    stop_step, best_step = one["steps_done"], one["early_stopping"]["best_step"]
    assert one["early_stopping"]["stopped"] and best_step < stop_step - 4
    cut = best_step + 4  # one bad evaluation counted when the first part ends
    args = ["train", *SMALL, "--out", "two", "--patience", "3", "--restore-best"]
    _cli([*args, "--steps", str(cut)], tmp_path)
    first = _state(tmp_path / "two")
    assert first["early_stopping"]["bad_evals"] >= 1 and not first["early_stopping"]["stopped"]
    k0 = first["early_stopping"]["bad_evals"]
    # the model saved is the restored best; the state puts the last step's θ back for resuming
    run = tmp_path / "two"
    m = ft.load(run / "model.safetensors")
    if first["early_stopping"]["restored"]:
        from safetensors.numpy import load_file

        saved = load_file(run / "early_stopping.safetensors")
        last = {k: saved["last." + k] for k in m.params.keys()}
        early = cli._load_early_stopping(run, first, m)
        assert_params_equal(m, last)
        assert early["best_step"] == first["early_stopping"]["best_step"]
    _cli([*args, "--steps", "400", "--resume"], tmp_path)
    st = _state(tmp_path / "two")
    es, hist = st["early_stopping"], st["history"]
    assert es["stopped"] and es["bad_evals"] == 3
    # the counters went on: the resumed part stopped after 3 − k0 more bad evaluations (unless it found a
    # new best), and over the whole history the rule holds
    stop, best = expected_stop(hist["val_loss"], 3)
    assert stop == len(hist["val_loss"]) - 1 and es["best_step"] == hist["val_step"][best]
    if es["best_step"] <= cut:
        assert len([s for s in hist["val_step"] if s > cut]) == 3 - k0
