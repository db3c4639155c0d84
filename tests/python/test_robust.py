"""Issue 11's findings, each as a regression test that failed before its fix:

  * size arithmetic (items 2, 5): huge sizes raise ValueError at once — no wrapped count, segfault,
    minutes-long loop, bad_alloc or vector::_M_default_append — in the constructors, free functions and
    ft.load of a damaged config;
  * the floating-point environment (item 3): importing or calling the package leaves the caller's
    flush-to-zero / denormals-are-zero bits alone;
  * non-finite training (item 6): a NaN/inf loss or gradient norm stops training naming the step, and is
    never applied (nonfinite="raise" | "warn" | "skip");
  * text that is not valid Unicode (item 7): lone surrogates are kept exactly by every tokenizer, through
    fit, encode, decode, to_json/from_json and files (the issue's reproducer).

Each call that used to crash runs in a child process, so a regression fails the test instead of killing
the run.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import formal_transformers as ft

ROOT = pathlib.Path(__file__).resolve().parents[2]
# the folder holding the package under test: python/ in a developer build (with FT_CORE_PATH), site-packages
# when installed (CI: the source tree's package has no compiled _core there)
PKG_PARENT = pathlib.Path(ft.__file__).resolve().parents[1]


def run_child(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with this package; return the finished process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PKG_PARENT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if env.get("FT_CORE_PATH"):
        env["FT_CORE_PATH"] = os.path.abspath(env["FT_CORE_PATH"])
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env)


# ------------------------------------------------------------------------------------------------------
# items 2 and 5: sizes
HUGE_CALLS = [
    "ft.TokenEmbedding(2**62, 4)",
    "ft.TokenEmbedding(2**40, 2**30)",
    "ft.DTransformer(2**62, 8, 1, 1, 4, 4)",
    "ft.PositionalEmbedding(2**62, 4)",
    "ft.PositionalEmbedding(2**62, 4, kind='sinusoidal')",
    "ft.BasicAttention(2**63 - 1, 2, 2)",
    "ft.Attention(2, 2, 2**62, 2)",
    "ft.MHAttention(2**40, 4, 4, 2**30, 4, 4)",
    "ft.unidirectional_mask(2**32, 2**32)",
    "ft.bidirectional_mask(2**32, 2**32)",
    "ft.unidirectional_mask(2**20, 2**30)",
    "ft.DTransformer(12, 8, 2**40, 2, 8, 16)",
    "ft.DTransformer(12, 8, 2**25, 1, 1, 1, d_attn=1, d_mid=1)",
    "ft.DTransformer(12, 8, 2, 2, 8, 16, d_attn=2**40)",
    "ft.DTransformer(12, 8, 2, 2, 8, 2**61)",
    "ft.ETransformer(12, 8, 2, 2, 8, 16, 2**62)",
    "ft.EDTransformer(12, 8, 2**40, 2**40, 2, 8, 16)",
    "ft.EDTransformer(12, 2**61, 1, 1, 2, 8, 16)",
    "ft.Unembedding(2**62, 4)",
    "ft.LayerNorm(2**62)",
]


@pytest.mark.parametrize("call", HUGE_CALLS)
def test_huge_sizes_raise_valueerror_at_once(call):
    code = f"""
        import time, formal_transformers as ft
        t = time.perf_counter()
        try:
            {call}
        except ValueError as e:
            print("ValueError", time.perf_counter() - t)
            print(e)
        else:
            print("no error")
    """
    r = run_child(code)
    assert r.returncode == 0, f"{call}: exit {r.returncode}\n{r.stderr[-2000:]}"
    lines = r.stdout.splitlines()
    assert lines and lines[0].startswith("ValueError"), f"{call}: {r.stdout}{r.stderr[-2000:]}"
    assert float(lines[0].split()[1]) < 2.0, f"{call} took {lines[0]}"
    msg = "\n".join(lines[1:])
    assert "_M_default_append" not in msg and "bad_alloc" not in msg
    assert "overflows" in msg or "exceeds" in msg, msg  # names the sizes


def test_size_error_names_the_sizes():
    with pytest.raises(ValueError, match=r"layers=1099511627776.*exceeds|overflows"):
        ft.DTransformer(12, 8, 2**40, 2, 8, 16)
    with pytest.raises(ValueError, match=r"parameter W_e"):
        ft.TokenEmbedding(2**62, 4)


def test_huge_model_embedding_call_after_rejection_is_impossible_and_small_models_still_work():
    # the issue: TokenEmbedding(2**62, 4) was accepted and e([0, 1, 2**40]) segfaulted
    e = ft.TokenEmbedding(50, 4)
    with pytest.raises(IndexError):
        e(np.array([0, 1, 2**40]))
    m = ft.DTransformer(12, 8, 2, 2, 8, 16)
    assert m.n_params > 0 and m(np.array([1, 2, 3])).shape == (12, 3)


def test_model_size_lower_bound_never_exceeds_the_real_count():
    """check_model_size estimates a lower bound of the parameter count: a model just inside any plausible
    bound must still construct (the estimate must not over-count), checked on varied configs."""
    def bound(V, l_max, L, H, d, d_mlp, d_attn, d_mid, L_cross=0):  # W_e, W_p, the layers' matrices, typed in
        attn = 3 * H * d_attn * d + H * d_mid * d
        return V * d + l_max * d + L * (attn + 2 * d_mlp * d) + L_cross * attn

    for args, kw in [((12, 8, 2, 2, 8, 16), {}), ((30, 16, 3, 4, 8, 5), dict(d_attn=3, d_mid=7)),
                     ((7, 5, 1, 1, 1, 1), {})]:
        V, l_max, L, H, d, d_mlp = args
        d_attn, d_mid = kw.get("d_attn", d // H), kw.get("d_mid", d // H)
        assert ft.DTransformer(*args, **kw).n_params >= bound(V, l_max, L, H, d, d_mlp, d_attn, d_mid)
        assert ft.ETransformer(*args, 3, **kw).n_params >= bound(V, l_max, L, H, d, d_mlp, d_attn, d_mid)
        ed = ft.EDTransformer(V, l_max, 1, 2, H, d, d_mlp, **kw)  # 3 layers, 2 with cross-attention
        assert ed.n_params >= bound(V, l_max, 3, H, d, d_mlp, d_attn, d_mid, L_cross=2)


def damaged_file(tmp_path, **changes):
    m = ft.DTransformer(12, 8, 2, 2, 8, 16)
    p = tmp_path / "m.safetensors"
    ft.save(m, p)
    from safetensors.numpy import load_file, save_file

    meta = ft.io.read_metadata(p)
    cfg = json.loads(meta["formal_transformers.config"])
    cfg.update(changes)
    meta["formal_transformers.config"] = json.dumps(cfg)
    q = tmp_path / "bad.safetensors"
    save_file(load_file(p), str(q), metadata=meta)
    return q


@pytest.mark.parametrize("changes", [{"L": 2**40}, {"d_attn": 2**40}, {"d_attn": 2**40 - 1, "d_mid": 3},
                                     {"n_vocab": 2**62}, {"l_max": 2**50}, {"d_mlp": 2**45}])
def test_load_of_a_config_with_huge_sizes_is_a_quick_valueerror(tmp_path, changes):
    q = damaged_file(tmp_path, **changes)
    t = time.perf_counter()
    with pytest.raises(ValueError, match="damaged or unusable config"):
        ft.load(q)
    assert time.perf_counter() - t < 2.0


def test_load_of_a_deeply_nested_config_is_a_valueerror(tmp_path):
    # found by fuzz/fuzz_parsers.py: json.loads raised RecursionError, which ft.load let through
    m = ft.DTransformer(12, 8, 2, 2, 8, 16)
    p = tmp_path / "m.safetensors"
    ft.save(m, p)
    from safetensors.numpy import load_file, save_file

    meta = ft.io.read_metadata(p)
    meta["formal_transformers.config"] = "[" * 100000 + "]" * 100000
    q = tmp_path / "deep.safetensors"
    save_file(load_file(p), str(q), metadata=meta)
    with pytest.raises(ValueError, match="damaged or unusable config"):
        ft.load(q)


def test_forward_of_a_huge_attention_workspace_is_a_valueerror():
    # attention weights H · ℓ_z · ℓ_x that cannot fit: ValueError naming them before allocating (was bad_alloc)
    r = run_child("""
        import numpy as np, formal_transformers as ft
        m = ft.MHAttention(16, 1, 1, 1, 1, 1, dtype="float32")  # A: 16 · 2**18 · 2**18 floats = 16 TiB
        x = np.zeros((1, 2**18), dtype=np.float32)
        try:
            m(x, x)
        except ValueError as e:
            print("ValueError:", e)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ValueError: attention weights" in r.stdout and "exceeds" in r.stdout, r.stdout + r.stderr[-1000:]


# ------------------------------------------------------------------------------------------------------
# item 3: the caller's floating-point environment
DENORMAL_CHECK = """
    import numpy as np
    def denormals_ok():
        x = np.float64(5e-324)
        return bool(x * 1.0 == 5e-324) and bool(np.float32(1e-40) * np.float32(1.0) != 0)
"""


def test_import_and_calls_leave_the_callers_denormals_alone():
    r = run_child(DENORMAL_CHECK + """
    assert denormals_ok(), "before import"
    import formal_transformers as ft
    assert denormals_ok(), "after import"
    ft.set_num_threads(2)
    assert denormals_ok(), "after set_num_threads"
    m = ft.DTransformer(12, 8, 2, 2, 8, 16)
    x = np.array([[1, 2, 3, 4], [4, 3, 2, 1]])
    m(x); m.loss_and_grad(x)
    assert denormals_ok(), "after a model call"
    ft.DTraining(1, 1e-3, batch_size=2, progress=False)(np.tile(x, (4, 1)), m)
    assert denormals_ok(), "after training"
    ft.DTraining(1, 1e-3, progress=False, callback=lambda info: denormals_ok() or (_ for _ in ()).throw(
        AssertionError("denormals flushed inside a training callback")))(np.tile(x, (2, 1)), m)
    ft.DInference(4, seed=1)(np.array([1, 2]), m)
    assert denormals_ok(), "after inference"
    try:
        m(np.array([99]))
    except IndexError:
        pass
    try:
        ft.DTraining(1, 1e300, optimizer="sgd", progress=False)(np.tile(x, (4, 1)), ft.DTransformer(12, 8, 2, 2, 8, 16))
    except FloatingPointError:
        pass
    assert denormals_ok(), "after a core call that raised"
    print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr[-3000:]


def test_core_calls_still_run_with_ftz_inside():
    # the core's own kernels flush denormals: gelu(1e-310) ≈ 5e-311 is denormal, so inside the core it is
    # 0 (FTZ/DAZ on for the call), while the same product in the caller's numpy keeps it
    x = np.array([[1e-310, 1.0]])
    y = ft.gelu(x)
    assert y[0, 0] == 0.0 and y[0, 1] > 0.8, y
    assert np.float64(1e-310) * 0.5 != 0.0  # the caller's environment is back (no FTZ)
    assert np.float64(5e-324) * 1.0 == 5e-324


# ------------------------------------------------------------------------------------------------------
# item 6: non-finite training
def diverging_setup():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 10, size=(16, 6))
    model = ft.DTransformer(12, 8, 2, 2, 8, 16, seed=3)
    return data, model


def test_nonfinite_loss_raises_naming_the_step_and_is_never_applied():
    data, model = diverging_setup()
    # find the first non-finite step with nonfinite="skip"
    probe = ft.DTraining(2, 1e4, optimizer="sgd", shuffle=False, progress=False, nonfinite="skip")
    probe(data, model)
    skipped = probe.history["skipped"]
    assert any(skipped), "the setup must diverge"
    k = skipped.index(True) + 1  # 1-based first non-finite step
    assert all(np.all(np.isfinite(v)) for v in model.params.values()), "skip applied a non-finite update"
    # raise: stops at step k, the model holding the parameters after step k-1
    data, model = diverging_setup()
    tr = ft.DTraining(2, 1e4, optimizer="sgd", shuffle=False, progress=False)
    with pytest.raises(FloatingPointError, match=rf"training step {k}: the loss is .*after step {k - 1}"):
        tr(data, model)
    assert tr.history["step"] == list(range(1, k))
    _, ref = diverging_setup()
    if k > 1:
        ft.DTraining(2, 1e4, optimizer="sgd", shuffle=False, progress=False, max_steps=k - 1)(data, ref)
    for name, v in model.params.items():
        assert np.array_equal(v, ref.params[name]), name
        assert np.all(np.isfinite(v))


def test_nonfinite_warn_and_skip_go_on_without_applying():
    data, model = diverging_setup()
    model.params["W_e"][:] = np.nan  # every step's loss is NaN
    before = {k: v.copy() for k, v in model.params.items()}
    tr = ft.DTraining(1, 1e-3, progress=False, nonfinite="warn", max_steps=3)
    with pytest.warns(RuntimeWarning, match="training step 1 skipped"):
        tr(data, model)
    assert tr.history["skipped"] == [True, True, True]
    for name, v in model.params.items():
        assert np.array_equal(v, before[name], equal_nan=True), name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ft.DTraining(1, 1e-3, progress=False, nonfinite="skip", max_steps=2)(data, model)
    with pytest.raises(ValueError, match="nonfinite must be"):
        ft.DTraining(1, 1e-3, nonfinite="ignore")
    with pytest.raises(TypeError, match="nonfinite must be a string"):
        ft.DTraining(1, 1e-3, nonfinite=1)


def test_nonfinite_in_etraining_and_edtraining_raise():
    x = np.random.default_rng(1).integers(0, 8, size=(6, 5))
    e = ft.ETransformer(12, 8, 1, 2, 8, 16, 8)
    e.params["W_e"][:] = np.inf
    with pytest.raises(FloatingPointError, match="training step 1"):
        ft.ETraining(1, 1e-3, progress=False)(x, e)
    ed = ft.EDTransformer(12, 8, 1, 1, 2, 8, 16)
    ed.params["W_e"][:] = np.nan
    with pytest.raises(FloatingPointError, match="training step 1"):
        ft.EDTraining(1, 1e-3, progress=False)(x, x, ed)


# ------------------------------------------------------------------------------------------------------
# item 7: lone surrogates are kept exactly, the same way by every tokenizer and file
def test_word_tokenizer_json_round_trip_with_lone_surrogates_issue_reproducer():
    t = ft.WordTokenizer.fit("\udfff\u00e9\ud800\udfff\u65e5", unk=True)
    u = ft.WordTokenizer.from_json(t.to_json())
    assert list(u.encode("\ud800\udfff")) == list(t.encode("\ud800\udfff"))
    assert u.to_json() == t.to_json()


SURROGATE_TEXTS = ["\udfff\u00e9\ud800\udfff\u65e5", "a\ud800\udfffb", "\ud800", "\udc00\ud800", "x \ud83d\ude00 \U0001F600",
                   "\ud800\ud800\udfff\udfff"]


@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
def test_every_tokenizer_keeps_lone_surrogates_exactly(kind, tmp_path):
    corpus = " ".join(SURROGATE_TEXTS) + " the cat sat on the mat " * 3
    if kind == "char":
        t = ft.CharTokenizer.fit(corpus, unk=True)
    elif kind == "word":
        t = ft.WordTokenizer.fit(corpus, unk=True, min_count=1)
    else:
        t = ft.BPETokenizer.train(corpus, 300)
    path = tmp_path / "tok.json"
    t.save(str(path))
    for u in (type(t).from_json(t.to_json()), type(t).load(str(path))):
        assert u.to_json() == t.to_json()
        for s in SURROGATE_TEXTS:
            ids = t.encode(s)
            assert list(u.encode(s)) == list(ids), (kind, s)
            assert u.decode(ids) == t.decode(ids)
            if kind in ("char", "bpe"):
                assert t.decode(ids) == s  # every str round-trips (no unknown characters here)
    # the file is what json.loads of to_json() reads too (Python's reader agrees with ours)
    assert json.loads(t.to_json()) == json.loads(t.to_json())
