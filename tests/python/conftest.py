"""Shared helpers for the pytest suite.

Tolerances (README "Tests"): forward vs the numpy reference ≤1e-12 relative in float64 and ≤1e-5 in
float32; backward vs central finite differences in float64 ≤1e-6; vs PyTorch autograd ≤1e-8 (float64).
"""
from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import formal_transformers as ft

ROOT = pathlib.Path(__file__).resolve().parents[2]

TOL = {"float64": 1e-12, "float32": 1e-5}

# the folder holding the package under test: python/ in a developer build (with FT_CORE_PATH), site-packages
# when installed (CI: the source tree's package has no compiled _core there)
PKG_PARENT = pathlib.Path(ft.__file__).resolve().parents[1]


def child_env() -> dict:
    """The environment of a child Python that must import the package under test from any working directory
    (docs/DEVELOPING.md): the package's parent first on PYTHONPATH, FT_CORE_PATH made absolute."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PKG_PARENT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONFAULTHANDLER"] = "1"
    if env.get("FT_CORE_PATH"):
        env["FT_CORE_PATH"] = os.path.abspath(env["FT_CORE_PATH"])
    return env


def rel_err(a, b) -> float:
    """max |a − b| / max |b|: norm-wise relative error (does not blow up where b has zeros)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    den = np.max(np.abs(b)) if b.size else 0.0
    return float(np.max(np.abs(a - b)) / max(den, 1e-300)) if a.size else 0.0


def numeric_grad(f, x: np.ndarray, h: float = 1e-6, entries=None) -> np.ndarray:
    """Central differences of the scalar function f() with respect to the array x (modified in place,
    restored afterwards). x may be a zero-copy view of a model's parameters. With `entries` (index tuples of
    x), only those: an array of their differences in that order."""
    def central(i):
        old = x[i].copy()
        x[i] = old + h
        fp = f()
        x[i] = old - h
        fm = f()
        x[i] = old
        return (fp - fm) / (2 * h)

    if entries is not None:
        return np.array([central(i) for i in entries])
    g = np.zeros(x.shape, dtype=np.float64)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        g[it.multi_index] = central(it.multi_index)
    return g


def assert_grads_match_fd(model, grads, loss, *, b_k_zero=True, label=None):
    """Every parameter's gradient (`grads`: the model's at its parameters now, one for each) against central
    differences of loss() (≤ 1e-6 relative). Where b_k_zero, each .b_k's is 0 up to rounding instead (≤ 1e-12 of
    the largest gradient): b_k adds a per-column constant to S, which the softmax ignores (not so under RoPE,
    which rotates it by each position)."""
    assert set(grads) == set(model.params)
    scale = max(np.abs(g).max() for g in grads.values())
    for k, view in model.params.items():
        if k.endswith(".b_k") and b_k_zero:
            assert np.abs(grads[k]).max() <= 1e-12 * scale, (label, k)  # exactly 0: a per-column constant of S
            continue
        num = numeric_grad(loss, view)
        assert rel_err(grads[k], num) <= 1e-6, (label, k)


def replayed_loss(model, inp, step):
    """The loss of model(*inp) with the dropout masks of step `step` (dropout_step set back to it: a replay)."""
    model.dropout_step = step
    return model.loss_and_grad(*inp, copy=True)[0]


def assert_directional_fd(model, inp, step, grads, rng, *, h=1e-6, tol=1e-6, skip=()):
    """Every parameter's gradient (but those named in skip) against the central difference of the replayed loss
    (masks of step `step`) along a random direction of that parameter, ≤ tol · max(1, |analytic|)."""
    for name, p in model.params.items():
        if name in skip:
            continue
        v = rng.normal(size=p.shape)  # a random direction in this parameter
        base = np.array(p)
        p[...] = base + h * v
        lp = replayed_loss(model, inp, step)
        p[...] = base - h * v
        lm = replayed_loss(model, inp, step)
        p[...] = base
        fd, an = (lp - lm) / (2 * h), float(np.sum(grads[name] * v))
        assert abs(fd - an) <= tol * max(1.0, abs(an)), (name, fd, an)


def kind_inputs(kind, rng, n_vocab, l, l_z, masked):
    """One sequence's inputs for a model kind, ids below the three special tokens (< n_vocab − 3): (x,) for "d";
    (x̃, x) for "e", x̃ = x with the positions `masked` set to the mask token n_vocab − 3; (z, x) for "ed"."""
    x = rng.integers(0, n_vocab - 3, size=l)
    if kind == "d":
        return (x,)
    if kind == "e":
        xt = x.copy()
        xt[list(masked)] = n_vocab - 3  # mask_token
        return (xt, x)
    return (rng.integers(0, n_vocab - 3, size=l_z), x)


def randomize_theta(model, rng, *, skip=(), unit=("W_e",), spread=0.3, scale=1.0) -> dict:
    """Every parameter of `model` random, in place (γ = 1 + spread·z, biases and β spread·z, the names in `unit`
    z, the other matrices scale·z/√columns), except the names in `skip`; returns θ as float64 copies (without
    `skip`). The variant tests' one way to leave the initialiser's special values (β = 0, γ = 1) behind."""
    for name, view in model.params.items():
        if name in skip:
            continue
        last = name.rsplit(".", 1)[-1]
        z = rng.standard_normal(view.shape)
        if last.startswith("gamma"):
            view[...] = 1.0 + spread * z
        elif last.startswith(("beta", "b_")):
            view[...] = spread * z
        elif last in unit:
            view[...] = z
        else:
            view[...] = scale * z / np.sqrt(view.shape[-1])
    return {k: np.array(v, dtype=np.float64) for k, v in model.params.items() if k not in skip}


def make_decoder(base: dict, opts: dict, dtype="float64", seed=3, **extra):
    """The variant suites' model builder: ft.DTransformer with the options of `base`, overridden by `opts` and
    `extra` (n_vocab, l_max, L, H, d_e, d_mlp positional, the others by keyword)."""
    kw = {**base, **opts, **extra}
    args = [kw.pop(k) for k in ("n_vocab", "l_max", "L", "H", "d_e", "d_mlp")]
    return ft.DTransformer(*args, dtype=dtype, seed=seed, **kw)


def reference_hp(base: dict, opts: dict, keys) -> dict:
    """The hyperparameters formal_transformers.reference takes for the model make_decoder(base, opts) builds:
    L, H and the options named in `keys`."""
    return dict(L=base["L"], H=opts.get("H", base["H"]), **{k: v for k, v in opts.items() if k in keys})


def randomize_normal(model, seed, scale=0.4):
    """Every parameter N(0, scale²) from `seed`, in place, except a sinusoidal W_p (fixed, not learned):
    spread-out parameters, so that sampled paths differ when anything differs. Returns the model."""
    r = np.random.default_rng(seed)
    for k in model.params.keys():
        if k == "W_p" and model.config.get("positional") == "sinusoidal":
            continue
        model.params[k][...] = scale * r.standard_normal(model.params[k].shape)
    return model


@pytest.fixture
def one_thread():
    """Tiny models: a single-threaded core (no OpenMP hand-offs on a shared 2-core machine); the count is
    restored afterwards. A module uses it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = ft.get_num_threads()
    ft.set_num_threads(1)
    yield
    ft.set_num_threads(n)


def hf_float64(monkeypatch, rms_norm_class, rotary_class):
    """HF computes RMSnorm and the RoPE angles in float32 even in a float64 model (a choice for mixed precision);
    for an exactness check both run the same formulas in float64 here (the model family's RMSNorm and
    RotaryEmbedding classes patched for this test)."""
    import torch

    def rms_forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rope_forward(self, x, position_ids):
        d = self.inv_freq.shape[0] * 2
        theta = self.config.rope_parameters["rope_theta"]
        inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        freqs = position_ids[..., None].to(torch.float64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    if rms_norm_class is not None:  # (a family with layer_norm: None)
        monkeypatch.setattr(rms_norm_class, "forward", rms_forward)
    monkeypatch.setattr(rotary_class, "forward", rope_forward)


def hf_random_float64(model_class, config, scale=1.0):
    """An HF model in float64 with every weight random (torch seed 0, in named_parameters order): the norms'
    weights 1 + 0.3 z (not their init 1), the other weights scale · z / √(columns)."""
    import math

    import torch

    torch.manual_seed(0)
    hf = model_class(config).to(torch.float64)
    with torch.no_grad():
        for name, w in hf.named_parameters():
            w.copy_(1.0 + 0.3 * torch.randn_like(w) if "norm" in name else scale * torch.randn_like(w) / math.sqrt(w.shape[-1]))
    return hf


def check_gil_released_and_ctrl_c(calls, min_seconds=0.2):
    """A long core call lets another Python thread run (the GIL is released: ≥ 20 ticks of 1 ms) and a real
    SIGINT 0.05 s in stops it with KeyboardInterrupt well before it would have ended (< 0.8 of its time).
    `calls`: zero-argument callables, each longer than the one before (a generator may build them); the first
    whose second (warm) run lasts over min_seconds is the one interrupted (a fast machine finishes a short one too
    soon to test; a first run can take several times a warm one).
    Returns that call."""
    import signal
    import threading
    import time

    ticks, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    th = threading.Thread(target=count)
    th.start()
    try:
        for call in calls:
            call()  # untimed: a call's first run pays one-time set-up (allocation, first touch of its pages), so
            t0 = time.perf_counter()  # the time it is judged by, below and in the interrupt, is a warm run's
            call()
            full = time.perf_counter() - t0
            if full > min_seconds:
                break
    finally:
        stop.set()
        th.join()
    assert full > min_seconds, f"the call took {full:.3f} s: too short to test"
    assert ticks[0] >= 20, f"only {ticks[0]} ticks of the other thread in {full:.2f} s: the GIL was held"
    timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
    # Python raises KeyboardInterrupt on SIGINT only when the process did not inherit SIGINT ignored (a shell starts
    # a background job so): the handler a terminal's Python has, for the duration of the check
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
            raise AssertionError(f"the call ended after {time.perf_counter() - t0:.3f} s (a warm run took {full:.3f} s) "
                                 "without the SIGINT sent at 0.05 s stopping it")
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert time.perf_counter() - t0 < 0.8 * full + 0.05
    return call


def shared_data(name: str) -> pathlib.Path:
    """A file of ../shared/data (or $FT_DATA_DIR); skips the test with a message when it is absent,
    as on a user's machine."""
    base = pathlib.Path(os.environ.get("FT_DATA_DIR", ROOT.parent / "shared" / "data"))
    p = base / name
    if not p.exists():
        pytest.skip(f"real data {p} is not available (it lives in ../shared/data beside the repository)")
    return p


@pytest.fixture(params=["float64", "float32"])
def dtype(request):
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def torch_or_skip():
    return pytest.importorskip("torch", reason="PyTorch is not installed (pip install '.[test]')")


def pytest_sessionfinish(session, exitstatus):
    """FT_NO_SKIP=1 (set by the ctest entry that ./run.sh test and CI run): every test extra is installed
    there, so a skip means a test silently did not run — fail the session. The one allowed skip is the
    real data of ../shared/data being absent, as on a user's machine (its message says so)."""
    if os.environ.get("FT_NO_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    bad = [r for r in skipped if "real data" not in str(r.longrepr)]
    if bad:
        if reporter:
            reporter.write_line(f"FT_NO_SKIP=1: {len(bad)} test(s) skipped that must run:", red=True)
            for r in bad[:20]:
                reporter.write_line(f"  {r.nodeid}: {r.longrepr}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
