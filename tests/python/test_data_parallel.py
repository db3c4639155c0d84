"""Data-parallel training in the native core (docs/data_parallel.md): 2 and 3 processes on 127.0.0.1 over
gloo, the process group initialised by the trainers from torchrun's environment variables.

* one data-parallel step equals the single-process step on the union minibatch (float64, ≤1e-12) for D, E
  and ED models, both loss reductions, uneven slices and an empty one; the ranks end bit-identical;
* dropout: rank r draws the masks keyed by dropout_seed + r·φ (checked against a step rebuilt by hand);
* a 50-step run (Adam, shuffling, cosine schedule, clipping, validation) equals the single-process run;
* a callback's stop on one rank stops all; a rank given its own shard of the data, or whose θ drifts, makes
  every rank raise;
* the CLI: launched by torchrun, rank 0 alone prints and writes; a run saved with 2 ranks resumes with 3
  (and with 1) as the single-process run; a killed rank, or a hung one (SIGSTOP, --dist-timeout), ends the run with an error in bounded time,
  and the checkpoint resumes.
Every child runs under a subprocess timeout: a hang fails the test instead of stalling the suite."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import formal_transformers as ft  # noqa: E402

import _dp_worker as W  # noqa: E402
from conftest import child_env, rel_err  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PHI = 0x9E3779B97F4A7C15  # the documented stride of the ranks' dropout seeds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank=None, world=None, port=None) -> dict:
    env = child_env()
    env["OMP_NUM_THREADS"] = "1"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if world is not None:
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
    return env


def _finish(procs, timeout):
    """Wait for every process (the test fails, and they are killed, past `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outs


def _shard(n, r, world):
    """The documented rule: rank r takes the r-th contiguous slice; the first n mod world take one more."""
    q, extra = divmod(n, world)
    lo = r * q + min(r, extra)
    return lo, lo + q + (r < extra)


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, tmp_path_factory):
    """The worker's scenarios run by `world` ranks: (world, their output folder)."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.fail("this torch has no gloo backend")
    world = request.param
    out = tmp_path_factory.mktemp(f"dp{world}")
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "_dp_worker.py"), str(r), str(world), str(port),
                               str(out)], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = _finish(procs, 240)
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-4000:]
    return world, out


def _close(a, b, tol, what):
    # (b_k-like parameters stay at rounding noise around 0: an absolute floor of tol)
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max()), (what, float(np.abs(a - b).max()))


def test_one_step_equals_the_single_process_step_on_the_union_batch(ranks):
    world, out = ranks
    for arch, red, b in W.STEP_CASES:
        ref, _ = W.one_step(arch, red, b, False)
        model0, _ = W.model_and_data(arch)
        r0 = np.load(out / f"step_{arch}_{red}_{b}_0.npz")
        assert int(r0["allreduce_calls"]) == 1  # one all-reduce of the flat gradient per step
        moved = 0
        for r in range(world):
            got = np.load(out / f"step_{arch}_{red}_{b}_{r}.npz")
            for k, v in ref.items():
                np.testing.assert_array_equal(got[k], r0[k], err_msg=f"{arch} {red} {k}: rank {r} differs from rank 0")
                _close(got[k], v, 1e-12, (arch, red, b, k))
        for k, v in ref.items():
            moved += not np.array_equal(np.asarray(model0.params[k]), v)
        assert moved >= len(ref) - 2, (arch, red)  # the step moved (nearly) every parameter


def test_an_explicit_process_group(ranks):
    """process_group= a torch group (dist.new_group): the step equals the single-process step."""
    world, out = ranks
    ref, _ = W.one_step("ED", "mean", 5, False)
    for r in range(world):
        got = np.load(out / f"group_{r}.npz")
        assert int(got["group_rank"]) == r
        for k, v in ref.items():
            _close(got[k], v, 1e-12, k)


def test_dropout_masks_are_keyed_by_the_rank_and_replay(ranks):
    """Two data-parallel SGD steps with dropout equal the steps rebuilt by hand: rank r's slice through
    loss_and_grad with dropout_seed + r·φ and the step's dropout_step, the gradients summed over the ranks;
    with one seed for all ranks the result differs (the ranks' masks are their own)."""
    world, out = ranks

    def rebuild(seed_of):
        m, (x,) = W.model_and_data("D", dropout=0.2)
        seed = m.dropout_seed
        for step in range(2):
            total = {}
            for r in range(world):
                lo, hi = _shard(5, r, world)
                m.dropout_seed, m.dropout_step = seed_of(seed, r), step
                _, g = m.loss_and_grad(x[lo:hi])
                for k, v in g.items():
                    total[k] = total.get(k, 0) + np.asarray(v)
            for k, v in total.items():
                m.params[k][...] -= W.LR * v / 5  # reduction "sum": the mean over the minibatch
        m.dropout_seed = seed
        return m

    want = rebuild(lambda s, r: (s + r * PHI) % 2**64)
    same = rebuild(lambda s, r: s)
    for r in range(world):
        got = np.load(out / f"dropout_{r}.npz")
        assert int(got["dropout_step"]) == 2 and int(got["dropout_seed"]) == want.dropout_seed
        for k, v in want.params.items():
            _close(got[k], np.asarray(v), 1e-12, k)
    assert max(rel_err(np.asarray(same.params[k]), np.asarray(want.params[k])) for k in want.params) > 1e-6


def test_fifty_steps_equal_the_single_process_run(ranks):
    world, out = ranks
    ref = W.run50(False)
    r0 = np.load(out / "run50_0.npz")
    for r in range(world):
        got = np.load(out / f"run50_{r}.npz")
        for k in ref:
            np.testing.assert_array_equal(got[k], r0[k], err_msg=f"{k}: rank {r} differs from rank 0")
        assert got["h.step"].tolist() == list(range(1, 51))
        assert got["h.tokens"].tolist() == ref["h.tokens"].tolist()
        for k, v in ref.items():
            if k.startswith("p."):
                _close(got[k], v, 1e-10, k)
        for k in ("h.loss", "h.grad_norm", "h.val_loss", "h.val_accuracy"):
            _close(got[k], ref[k], 1e-10, k)


def test_a_stop_on_one_rank_stops_all_and_bad_starts_and_drift_raise(ranks):
    world, out = ranks
    for r in range(world):
        assert np.load(out / f"vote_{r}.npz")["steps"].tolist() == [1, 2, 3]
        errors = json.loads((out / f"errors_{r}.json").read_text())
        assert "data differs" in errors["data"] and "whole data set" in errors["data"], errors
        assert "diverged" in errors["diverged"] and "after step 4" in errors["diverged"], errors


def test_single_process_never_imports_torch(tmp_path):
    code = ("import sys, numpy as np, formal_transformers as ft\n"
            "m = ft.DTransformer(11, 8, 1, 1, 4, 8, dtype='float64')\n"
            "t = ft.DTraining(1, 0.01, batch_size=2, progress=False)\n"
            "t([np.arange(5) % 11, np.arange(6) % 11], m)\n"
            "assert t.data_parallel is None and 'torch' not in sys.modules, sorted(sys.modules)[:5]\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_options_are_checked():
    with pytest.raises(TypeError, match="process_group"):
        ft.DTraining(1, 0.1, process_group="gloo")
    with pytest.raises(ValueError, match="dist_timeout"):
        ft.DTraining(1, 0.1, dist_timeout=0)
    with pytest.raises(TypeError, match="dist_timeout"):
        ft.ETraining(1, 0.1, dist_timeout="5")
    with pytest.raises(ValueError, match="sync_check_every"):
        ft.EDTraining(1, 0.1, sync_check_every=-1)
    # process_group=False trains alone even under a launcher's environment
    m, (x,) = W.model_and_data("D")
    t = ft.DTraining(1, 0.1, batch_size=5, process_group=False, progress=False)
    t(x, m)
    assert t.data_parallel is None and len(t.history["step"]) == 1


@pytest.mark.parametrize("env,match", [
    (dict(WORLD_SIZE="0"), r"WORLD_SIZE must be >= 1 .*got '0'"),
    (dict(WORLD_SIZE="-3"), r"WORLD_SIZE must be >= 1 .*got '-3'"),
    (dict(WORLD_SIZE="two"), r"WORLD_SIZE must be an integer .*got 'two'"),
    (dict(RANK="2"), r"RANK must be in \[0, 2\) .*got '2'"),
    (dict(RANK="-1"), r"RANK must be in \[0, 2\) .*got '-1'"),
    (dict(RANK="1.0"), r"RANK must be an integer .*got '1.0'"),
    (dict(MASTER_PORT="70000"), r"MASTER_PORT must be in \[1, 65536\) .*got '70000'"),
    (dict(MASTER_PORT="0"), r"MASTER_PORT must be in \[1, 65536\) .*got '0'"),
    (dict(MASTER_ADDR=" "), r"MASTER_ADDR must name rank 0's host"),
    (dict(LOCAL_RANK="5"), r"LOCAL_RANK must be in \[0, 2\) .*got '5'"),
    (dict(LOCAL_WORLD_SIZE="3"), r"LOCAL_WORLD_SIZE must be in \[1, 3\) .*got '3'"),
])
def test_torchrun_environment_is_checked_before_any_connection(monkeypatch, env, match):
    """WORLD_SIZE=0 or -3 trained alone without a word; RANK >= WORLD_SIZE waited 6–14 s for torch's own store
    error: every variable is checked first, ValueError naming it and its value, at once."""
    base = dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    for k, v in {**base, **env}.items():
        monkeypatch.setenv(k, v)
    m, (x,) = W.model_and_data("D")
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=match):
        ft.DTraining(1, 0.1, batch_size=5, progress=False, dist_timeout=30)(x, m)
    assert time.monotonic() - t0 < 5 and not torch.distributed.is_initialized()


MISSING_PEER = ("import numpy as np, formal_transformers as ft\n"
                "m = ft.DTransformer(11, 8, 1, 1, 4, 8, dtype='float64')\n"
                "ft.DTraining(1, 0.01, batch_size=2, progress=False, dist_timeout=2)([np.arange(5) % 11] * 2, m)\n")


@pytest.mark.parametrize("world,present,missing", [(2, [0], "rank 1 did not join"), (3, [0, 2], "rank 1 did not join"),
                                                   (3, [0], "ranks 1, 2 did not join"), (2, [1], "rank 0 did not join")])
def test_a_missing_peer_is_named_within_the_timeout(world, present, missing):
    """A rank that never starts: the ranks that did raise an error naming it after dist_timeout (2 s), not torch's
    store error with C++ frames."""
    port = _free_port()
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", MISSING_PEER], env=_env(r, world, port), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in present]
    outs = _finish(procs, 120)
    for r, p, (o, e) in zip(present, procs, outs):
        assert p.returncode != 0
        last = e.strip().splitlines()[-1]
        assert last.startswith("RuntimeError: data parallel, rank %d of %d: " % (r, world)), e[-3000:]
        assert missing in last and "within 2 s" in last, last
    assert time.monotonic() - t0 < 60


# ------------------------------------------------------------------------------------------------ the CLI
TEXT = "the quick brown fox jumps over the lazy dog. " * 40
SMALL = ["--text", "t.txt", "--out", "run", "--context", "16", "--layers", "1", "--heads", "2", "--d-e", "16",
         "--d-mlp", "32", "--batch", "5", "--eval-every", "0", "--warmup", "1", "--quiet", "--threads", "1",
         "--dtype", "float64", "--val-seqs", "4"]


def _cli(cwd, world, extra, timeout=180):
    """`python -m formal_transformers train` by `world` ranks (1: a plain process) in cwd."""
    (cwd / "t.txt").write_text(TEXT)
    port = _free_port()
    cmd = [sys.executable, "-m", "formal_transformers", "train", *SMALL, *extra]
    procs = [subprocess.Popen(cmd, cwd=cwd, env=_env(r, world, port) if world > 1 else _env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    outs = _finish(procs, timeout)
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-4000:]
    return outs


def _theta(run):
    m = ft.load(run / "model.safetensors")
    return {k: np.array(v) for k, v in m.params.items()}, m


def test_cli_resumes_across_world_sizes(tmp_path):
    """6 steps with 2 ranks then to 12 with 3 ranks (and to 12 with 1 rank) equal 6 + 6 steps in one process."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "t.txt").write_text(TEXT)
    # the first part by torchrun itself (its --standalone rendezvous on this machine)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "formal_transformers", "train", *SMALL, "--steps", "6"], cwd=tmp_path / "a",
                       env=_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count("2 data-parallel ranks") == 1 and r.stdout.count("saved to") == 1  # rank 0 alone prints
    _cli(tmp_path / "b", 1, ["--steps", "6"])
    a6, _ = _theta(tmp_path / "a" / "run")
    b6, _ = _theta(tmp_path / "b" / "run")
    for k, v in b6.items():
        _close(a6[k], v, 1e-11, k)
    (tmp_path / "c").mkdir()
    import shutil

    shutil.copytree(tmp_path / "a" / "run", tmp_path / "c" / "run")
    _cli(tmp_path / "a", 3, ["--steps", "12", "--resume"])
    _cli(tmp_path / "c", 1, ["--steps", "12", "--resume"])
    _cli(tmp_path / "b", 1, ["--steps", "12", "--resume"])
    b12, mb = _theta(tmp_path / "b" / "run")
    for d in ("a", "c"):
        got, m = _theta(tmp_path / d / "run")
        assert m.dropout_step == mb.dropout_step == 12 and m.dropout_seed == mb.dropout_seed
        for k, v in b12.items():
            _close(got[k], v, 1e-10, (d, k))
        state = json.loads((tmp_path / d / "run" / "run.json").read_text())
        assert state["steps_done"] == 12 and state["history"]["step"] == list(range(1, 13))


def _wait_for(path, procs, timeout):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_dead_or_hung_rank_ends_the_run_with_an_error_and_the_checkpoint_resumes(tmp_path, how):
    """Rank 1 SIGKILLed (or SIGSTOPped, --dist-timeout 4) mid-run: rank 0 stops with the data-parallel error
    within the subprocess timeout, having saved its last completed step; that checkpoint resumes."""
    (tmp_path / "t.txt").write_text(TEXT)
    port = _free_port()
    cmd = [sys.executable, "-m", "formal_transformers", "train", *SMALL, "--steps", "1000000", "--save-every", "3",
           "--dist-timeout", "4"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=_env(r, 2, port), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        _wait_for(tmp_path / "run" / "run.json", procs, 120)
        t0 = time.monotonic()
        procs[1].send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        o, e = procs[0].communicate(timeout=90)
        waited = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert procs[0].returncode not in (0, None)
    assert "data parallel, rank 0 of 2" in e and "resume from the last checkpoint" in e, e[-3000:]
    if how == "hung":
        assert waited >= 3.5  # it waited for the timeout (4 s) rather than failing at once
    state = json.loads((tmp_path / "run" / "run.json").read_text())
    done = state["steps_done"]
    assert done >= 3 and state["history"]["step"] == list(range(1, done + 1))
    _, m = _theta(tmp_path / "run")
    assert m.dropout_step == done
    r = subprocess.run(cmd[:-6] + ["--steps", str(done + 2), "--resume"], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "run" / "run.json").read_text())["steps_done"] == done + 2
