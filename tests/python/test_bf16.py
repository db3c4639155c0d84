"""Mixed precision (precision="bf16-mixed", docs/design.md "Mixed precision"): every matrix product takes its
operands rounded to bfloat16 and accumulates in float32; θ, the optimizer's moments, norms, softmax and the loss
stay float32.

Checked here, on any CPU (the emulated path — rounded operands, float32 BLAS products — runs everywhere; the
native one, oneDNN on AVX512_BF16 / AMX, where the CPU has it):
- one product equals the float64 product of the operands rounded to bfloat16 (round to nearest even), to
  float32 accumulation's error, and is far from the unrounded product (so the rounding happened);
- a model's P equals reference.py's Algorithm 10 run with every product's operands rounded the same way;
- training in bf16-mixed follows float32 training on the baby shape, decoding with the bf16 copy of θ gives
  the tokens of the per-call rounding, and bad precision values are refused before anything changes.
"""
import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import _core, reference


def bf16(x):
    """x rounded to the nearest bfloat16 (ties to even) through float32, as float64."""
    u = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.fixture(params=["native", "emulated"])
def path(request):
    """Both ways of running bf16 products (native falls back to emulated on a CPU without bf16)."""
    _core._bf16_allow_native(request.param == "native")
    yield request.param
    _core._bf16_allow_native(True)


def test_rounding_is_to_nearest_even():
    one = np.float32(1.0)
    ulp = np.float32(2.0 ** -7)  # bfloat16's spacing at 1
    x = np.array([[one + ulp / 2], [one + 3 * ulp / 2], [one + ulp / 2 + ulp / 64], [-(one + ulp / 4)],
                  [np.float32(3.0e38)], [-(one + 5 * ulp / 2)]], dtype=np.float32)
    got = _core._gemm(x, np.ones((1, 1), np.float32), precision="bf16-mixed")
    want = np.array([[1.0], [1.0 + 2 * float(ulp)], [1.0 + float(ulp)], [-1.0], [float(bf16(np.array([3.0e38]))[0])],
                     [-(1.0 + 2 * float(ulp))]])
    np.testing.assert_array_equal(got.astype(np.float64), want)


@pytest.mark.parametrize("m,k,n,ta,tb", [(64, 48, 32, False, False), (300, 200, 150, True, False),
                                         (256, 768, 129, False, True), (7, 5, 1, True, True), (1, 100, 64, False, False),
                                         (96, 1000, 3, False, False)])
def test_one_product_is_the_float64_product_of_rounded_operands(path, m, k, n, ta, tb):
    rng = np.random.default_rng(m * 1000 + n)
    A = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    B = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    C = _core._gemm(A, B, ta, tb, precision="bf16-mixed")
    a, b = bf16(A), bf16(B)
    a, b = (a.T if ta else a), (b.T if tb else b)
    scale = np.abs(a) @ np.abs(b)  # the size of each sum's terms: float32 accumulation errs by ~k·2⁻²⁴ of it
    err = np.max(np.abs(C - a @ b) / scale)
    assert err <= 4 * k * 2.0 ** -24, err
    a32, b32 = A.astype(np.float64), B.astype(np.float64)
    unrounded = (a32.T if ta else a32) @ (b32.T if tb else b32)
    assert np.max(np.abs(C - unrounded) / scale) > 1e-4  # the operands were rounded
    C32 = _core._gemm(A, B, ta, tb)  # and float32 stays float32
    assert np.max(np.abs(C32 - unrounded) / scale) <= 4 * k * 2.0 ** -24


def test_precision_values_are_checked():
    A = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="precision"):
        _core._gemm(A, A, precision="bf16")
    with pytest.raises(ValueError, match="float32"):
        _core._gemm(A.astype(np.float64), A, precision="bf16-mixed")
    m = ft.DTransformer(11, 8, 1, 2, 8, 16, seed=0)
    with pytest.raises(TypeError, match="str"):
        m.precision = 16
    with pytest.raises(ValueError, match="'float32' or 'bf16-mixed'"):
        m.precision = "fp16"
    assert m.precision == "float32"
    with pytest.raises(ValueError, match="float64"):
        ft.DTransformer(11, 8, 1, 2, 8, 16, dtype="float64", precision="bf16-mixed")
    m64 = ft.DTransformer(11, 8, 1, 2, 8, 16, dtype="float64")
    with pytest.raises(ValueError, match="float64"):
        m64.precision = "bf16-mixed"
    assert m64.precision == "float32"
    with pytest.raises(ValueError, match="precision"):
        ft.ETransformer(11, 8, 1, 2, 8, 16, precision="half")


class _Rounded(np.ndarray):
    """float64 arrays whose matrix products take their operands rounded to bfloat16 (the rest: float64)."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [np.asarray(i).view(np.ndarray) if isinstance(i, np.ndarray) else i for i in inputs]
        if ufunc is np.matmul and method == "__call__":
            plain = [bf16(p) for p in plain]
        out = getattr(ufunc, method)(*plain, **kwargs)
        return out.view(_Rounded) if isinstance(out, np.ndarray) else out


def test_a_model_is_algorithm_10_with_rounded_operands(path):
    m = ft.DTransformer(40, 24, 2, 2, 32, 64, seed=3, precision="bf16-mixed")
    rng = np.random.default_rng(0)
    for k in m.params:  # away from initialisation's small values, so products are not dominated by biases
        m.params[k][...] = rng.standard_normal(m.params[k].shape) * 0.3
    x = rng.integers(0, 40, 20)
    P = m(x).astype(np.float64)
    params = {k: np.asarray(v, np.float64).view(_Rounded) for k, v in m.params.items()}
    want = np.asarray(reference.d_transformer(x, params, L=2, H=2))
    plain = reference.d_transformer(x, {k: np.asarray(v, np.float64) for k, v in m.params.items()}, L=2, H=2)
    err = np.max(np.abs(P - want)) / np.max(want)
    assert err < 2e-4, err
    assert np.max(np.abs(P - plain)) / np.max(plain) > 10 * err  # far closer to the rounded reference
    m.precision = "float32"
    assert np.max(np.abs(m(x) - plain)) / np.max(plain) < 1e-5


def test_every_model_kind_takes_the_mode():
    e = ft.ETransformer(30, 16, 1, 2, 16, 32, 16, seed=1)
    ed = ft.EDTransformer(30, 16, 1, 1, 2, 16, 32, seed=1)
    v = ft.ViT(8, 4, 3, 1, 2, 16, 32, seed=1)
    z, x = np.arange(10) % 30, np.arange(7) % 30
    img = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    for model, call in ((e, lambda mo: mo(x)), (ed, lambda mo: mo(z, x)), (v, lambda mo: mo(img))):
        full = call(model)
        model.precision = "bf16-mixed"
        mixed = call(model)
        d = np.max(np.abs(mixed - full))
        assert 0 < d < 1e-2 * np.max(np.abs(full)), (type(model).__name__, d)
        model.precision = "float32"
        np.testing.assert_array_equal(call(model), full)


def test_gradients_follow_float32():
    m = ft.DTransformer(40, 24, 2, 2, 32, 64, seed=5)
    x = np.random.default_rng(1).integers(0, 40, (3, 20))
    loss32, g32 = m.loss_and_grad(x)
    g32 = {k: np.array(v) for k, v in g32.items()}
    m.precision = "bf16-mixed"
    loss16, g16 = m.loss_and_grad(x)
    assert loss16 != loss32 and abs(loss16 - loss32) < 1e-2 * abs(loss32)
    for k in g32:
        if k.endswith("b_k"):  # ∂loss/∂b_k is 0 (softmax ignores a shift shared by a query's scores): both are noise
            assert np.max(np.abs(g16[k])) < 1e-2 * np.max(np.abs(g32[k.replace("b_k", "b_q")]))
            continue
        rel = np.linalg.norm(g16[k] - g32[k]) / max(np.linalg.norm(g32[k]), 1e-30)
        assert rel < 5e-2, (k, rel)


def test_training_reaches_the_float32_validation_loss():
    rng = np.random.default_rng(7)
    # a learnable stream: each token is the previous one plus a small random step (mod 32)
    seqs = np.cumsum(rng.integers(0, 3, (96, 17)), axis=1) % 32
    train, val = seqs[:80], seqs[80:]
    out = {}
    for precision in ("float32", "bf16-mixed"):
        m = ft.DTransformer(32, 17, 2, 2, 32, 64, seed=11, precision=precision)
        ft.DTraining(n_epochs=6, eta=3e-3, batch_size=8)(train, m)
        assert m.precision == precision
        out[precision] = m.loss(val)
    first = ft.DTransformer(32, 17, 2, 2, 32, 64, seed=11).loss(val)
    assert out["float32"] < 0.7 * first  # it learned
    assert abs(out["bf16-mixed"] - out["float32"]) < 0.03 * out["float32"], out


def test_decoding_with_the_bf16_copy_of_theta():
    m = ft.DTransformer(50, 40, 2, 2, 32, 64, seed=2, precision="bf16-mixed")
    rng = np.random.default_rng(3)
    for k in m.params:
        m.params[k][...] = rng.standard_normal(m.params[k].shape) * 0.3
    prompt = rng.integers(0, 50, 6)
    y = ft.DInference(12, 1.0, top_k=1, seed=0)(prompt, m)
    # the same greedy tokens by whole forward calls (every product's weights rounded per call)
    seq = list(prompt)
    for _ in range(12):
        seq.append(int(np.argmax(m(np.array(seq))[:, -1])))
    np.testing.assert_array_equal(np.asarray(y)[-12:], np.array(seq[-12:]))


def _greedy_by_forward_calls(m, prompt, n):
    """n greedy tokens by whole forward calls (every product's weights rounded per call: no copy of θ)"""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(m(np.array(seq))[:, -1])))
    return np.array(seq[-n:])


def _bf16_decoder(seed=2):
    m = ft.DTransformer(50, 40, 2, 2, 32, 64, seed=seed, precision="bf16-mixed")
    rng = np.random.default_rng(seed + 1)
    m.params.update({k: rng.standard_normal(v.shape) * 0.3 for k, v in m.params.items()})
    return m


def _change_by_view(m):  # in place through a numpy view of params, kept from before the decoding call
    m.params["W_u"][...] *= -1.0


def _change_by_assignment(m):
    m.params["W_u"] = -np.asarray(m.params["W_u"])


def _change_by_update(m):
    rng = np.random.default_rng(7)
    m.params.update({k: rng.standard_normal(v.shape) * 0.3 for k, v in m.params.items()})


def _change_by_optimizer(m):
    loss, G = m.loss_and_grad(np.arange(20) % 50)
    ft.Adam(0.5).step(m, G)


def _change_by_trainer(m):
    ft.DTraining(1, 0.5, batch_size=2, seed=0, progress=False)([np.arange(12) % 50, np.arange(5, 17) % 50], m)


def _change_by_merge_lora(m):
    ft.lora(m, r=2, alpha=16)
    rng = np.random.default_rng(8)
    for k in m.params:
        if k.endswith("lora_B"):
            m.params[k] = rng.standard_normal(m.params[k].shape)
    m.merge_lora()


def _change_by_precision(m):  # θ changed while the model computes in float32, then back to bf16-mixed
    m.precision = "float32"
    _change_by_view(m)
    m.precision = "bf16-mixed"


@pytest.mark.parametrize("change", [_change_by_view, _change_by_assignment, _change_by_update, _change_by_optimizer,
                                    _change_by_trainer, _change_by_merge_lora, _change_by_precision])
def test_decoding_follows_theta_after_every_kind_of_change(change):
    # decoding keeps θ's bf16 copy between calls: whatever changes θ in between, the next call decodes with the new θ
    m = _bf16_decoder()
    prompt = np.random.default_rng(3).integers(0, 50, 6)
    decode = ft.DInference(10, 1.0, top_k=1, seed=0)
    before = np.asarray(decode(prompt, m))[-10:]
    view = m.params["W_u"]  # a view alive across the calls
    change(m)
    after = np.asarray(decode(prompt, m))[-10:]
    np.testing.assert_array_equal(after, _greedy_by_forward_calls(m, prompt, 10))
    assert not np.array_equal(after, before)  # the change mattered: a stale copy would have failed above
    assert view.shape == m.params["W_u"].shape


def test_the_bf16_copy_is_kept_while_theta_is_unchanged(tmp_path):
    m = _bf16_decoder()
    prompt = np.arange(5)
    decode = ft.DInference(4, 1.0, top_k=1, seed=0)
    decode(prompt, m)
    n = _core._bf16_theta_copies()
    y = [np.asarray(decode(prompt, m)) for _ in range(3)]
    ft.DInference.prefill(prompt, m)
    assert _core._bf16_theta_copies() == n  # no copy while θ is unchanged
    m.params["W_u"][0, 0] += 1.0
    decode(prompt, m)
    assert _core._bf16_theta_copies() == n + 1  # a new one after a change
    np.testing.assert_array_equal(y[0], y[2])
    # a loaded model decodes with its own θ
    ft.save(m, tmp_path / "m.safetensors")
    other = _bf16_decoder(seed=5)
    decode(prompt, other)
    loaded = ft.load(tmp_path / "m.safetensors", precision="bf16-mixed")
    np.testing.assert_array_equal(np.asarray(decode(prompt, loaded))[-4:], _greedy_by_forward_calls(m, prompt, 4))
    m32 = ft.DTransformer(50, 40, 2, 2, 32, 64, seed=2)
    decode(prompt, m32)
    assert _core._bf16_theta_copies() == n + 3  # float32 decoding makes none


def test_load_and_from_hf_take_precision(tmp_path):
    m = ft.DTransformer(20, 8, 1, 2, 8, 16, seed=0)
    ft.save(m, tmp_path / "m.safetensors")
    b = ft.load(tmp_path / "m.safetensors", precision="bf16-mixed")
    assert b.precision == "bf16-mixed" and ft.load(tmp_path / "m.safetensors").precision == "float32"
    with pytest.raises(ValueError, match="float64"):
        ft.load(tmp_path / "m.safetensors", dtype="float64", precision="bf16-mixed")
    with pytest.raises(TypeError, match="precision"):
        ft.load(tmp_path / "m.safetensors", precision=None)
    transformers = pytest.importorskip("transformers")  # in the test extras: present in CI
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1,
                                                              n_head=2)).eval()
    g = ft.from_hf(hf, precision="bf16-mixed")
    assert g.precision == "bf16-mixed"
    with pytest.raises(ValueError, match="precision"):
        ft.from_hf(hf, precision="int8")


def test_blas_info_says_what_runs_bf16():
    info = ft.bf16_info()
    assert "AVX512_BF16" in info and "AMX-BF16" in info
    assert "bf16-mixed products: " in info
    assert info.split(" (")[0] in ft.blas_info()


def test_cli_trains_and_samples_in_bf16_mixed(tmp_path, capsys):
    from formal_transformers import cli

    (tmp_path / "t.txt").write_text("abcdefgh " * 60 + "hgfedcba " * 10)
    small = ["--text", str(tmp_path / "t.txt"), "--context", "8", "--layers", "1", "--heads", "2", "--d-e", "8",
             "--d-mlp", "16", "--batch", "4", "--eval-every", "2", "--warmup", "1", "--quiet"]
    assert cli.main(["train", *small, "--out", str(tmp_path / "run"), "--steps", "3", "--precision", "bf16-mixed"]) in (0, None)
    assert cli.main(["sample", "--run", str(tmp_path / "run"), "--tokens", "5", "--samples", "1",
                     "--precision", "bf16-mixed"]) in (0, None)
    with pytest.raises(SystemExit):
        cli.main(["train", *small, "--out", str(tmp_path / "r2"), "--precision", "bf16"])
    assert "bf16-mixed" in capsys.readouterr().err
    code = None
    try:
        code = cli.main(["train", *small, "--out", str(tmp_path / "r3"), "--steps", "1", "--dtype", "float64",
                         "--precision", "bf16-mixed"])
    except SystemExit as e:
        code = e.code
    assert code == 2 and "float64" in capsys.readouterr().err


def _steps_with_copy(copy, change=None, n=4):
    """n Adam steps of a bf16-mixed model through loss_and_grad (θ's bf16 copy on or off): the losses and θ after.
    change(m, step) runs before each step (a write to θ by the user)"""
    _core._bf16_allow_theta_copy(copy)
    try:
        m = ft.DTransformer(40, 24, 2, 2, 32, 64, seed=5, precision="bf16-mixed")
        opt = ft.Adam(1e-2, weight_decay=0.1)
        x = np.random.default_rng(1).integers(0, 40, (3, 20))
        losses = []
        for s in range(n):
            if change:
                change(m, s)
            loss, _ = m.loss_and_grad(x, copy=False)
            losses.append(loss)
            opt.step(m, m.grads)
        return losses, {k: np.array(v) for k, v in m.params.items()}
    finally:
        _core._bf16_allow_theta_copy(True)


def _write_through_view(m, step):
    if step == 2:
        m.params["layers.0.W_mlp1"][...] *= -1.0


@pytest.mark.parametrize("change", [None, _write_through_view])
def test_training_with_the_bf16_copy_of_theta_is_bit_identical(path, change):
    # training calls read θ's operands from its bf16 copy (made once, then kept up to date by Adam) instead of
    # rounding them at every product: the same rounding of the same values, so the same bits — also after a write
    # to θ through a numpy view between steps (the copy is brought up to date at every call)
    n = _core._bf16_theta_copies()
    with_copy = _steps_with_copy(True, change)
    made = _core._bf16_theta_copies() - n
    assert made == (1 if change is None else 2)  # once, then Adam writes it with θ; again after the user's write
    without = _steps_with_copy(False, change)
    assert _core._bf16_theta_copies() - n == made  # none without
    assert with_copy[0] == without[0]
    for k in with_copy[1]:
        np.testing.assert_array_equal(with_copy[1][k], without[1][k], err_msg=k)


def test_trainer_with_the_bf16_copy_of_theta_is_bit_identical():
    # the trainer keeps the copy for the run (Adam writes it with θ) and brings it up to date after each hook call,
    # which may change θ; SGD keeps no copy
    rng = np.random.default_rng(3)
    data = [rng.integers(0, 40, 12) for _ in range(6)]

    def hook(m):
        def h(info):
            if info["step"] == 2:
                m.params["W_u"][...] *= -1.0
        return h

    for optimizer in ("adam", "sgd"):
        runs = []
        for copy in (True, False):
            _core._bf16_allow_theta_copy(copy)
            try:
                m = ft.DTransformer(40, 24, 2, 2, 32, 64, seed=5, precision="bf16-mixed")
                tr = ft.DTraining(1, 1e-2, batch_size=2, seed=0, optimizer=optimizer, progress=False, callback=hook(m))
                tr(data, m)
                runs.append((list(tr.history["loss"]), {k: np.array(v) for k, v in m.params.items()}))
            finally:
                _core._bf16_allow_theta_copy(True)
        assert len(runs[0][0]) == 3 and runs[0][0] == runs[1][0], optimizer
        for k in runs[0][1]:
            np.testing.assert_array_equal(runs[0][1][k], runs[1][1][k], err_msg=k)


def _kept_input_models():
    """Models whose listings write and read their affine maps' inputs in different ways: fused projections, LoRA
    (merged, and dropping the adapters' input), dropout, GQA + SwiGLU + RMSnorm, tiled attention, multi-token
    prediction, latent attention, an encoder and an encoder–decoder (post-LN blocks, cross-attention)."""
    d = dict(seed=5, precision="bf16-mixed")
    x = np.random.default_rng(1).integers(0, 37, (3, 20))
    z = np.random.default_rng(2).integers(0, 37, (3, 14))
    xt = x.copy()
    xt[:, ::3] = 37  # the encoder's mask token (n_vocab − 3)
    lora = lambda m, **kw: ft.lora(m, r=2, **kw)  # noqa: E731
    yield "decoder", lambda: ft.DTransformer(40, 24, 2, 2, 32, 64, **d), (x,)
    yield "lora", lambda: lora(ft.DTransformer(40, 24, 2, 2, 32, 64, **d), targets=["W_q", "W_v", "W_mlp1"]), (x,)
    yield "lora_dropout", lambda: lora(ft.DTransformer(40, 24, 2, 2, 32, 64, **d), targets=["W_q", "W_o", "W_mlp2"],
                                       dropout=0.2), (x,)
    yield "dropout", lambda: ft.DTransformer(40, 24, 2, 2, 32, 64, dropout=0.1, **d), (x,)
    yield "gqa_swiglu_rms", lambda: ft.DTransformer(40, 24, 2, 4, 32, 64, H_kv=2, mlp="swiglu", norm="rms", **d), (x,)
    yield "tiled", lambda: ft.DTransformer(40, 24, 1, 2, 32, 64, attention_impl="tiled", **d), (x,)
    yield "mtp", lambda: ft.DTransformer(40, 24, 1, 2, 32, 64, mtp_depth=2, **d), (x,)
    yield "latent", lambda: ft.DTransformer(40, 24, 1, 2, 32, 64, kv_lora_rank=8, q_lora_rank=12, qk_rope_head_dim=4,
                                            positional="rope", bias=False, **d), (x,)
    yield "encoder", lambda: ft.ETransformer(40, 24, 2, 2, 32, 64, 16, **d), (xt, x)
    yield "encoder_decoder", lambda: ft.EDTransformer(40, 24, 1, 1, 2, 32, 64, **d), (z, x)


@pytest.mark.parametrize("name, make, data", list(_kept_input_models()), ids=[n for n, _, _ in _kept_input_models()])
def test_training_with_kept_affine_inputs_is_bit_identical(name, make, data):
    # an affine map's input X rounded once for its forward product W X and its backward's dW += dY Xᵀ (the rounding
    # kept from the forward, Bf16AffineInput) instead of rounding X again for the backward: the same bits
    native = "products: oneDNN" in ft.bf16_info()
    runs = []
    for keep in (True, False):
        _core._bf16_allow_kept_inputs(keep)
        try:
            m = make()
            m.precision = "bf16-mixed"
            opt = ft.Adam(1e-2, weight_decay=0.1)
            before = _core._bf16_kept_inputs_read()
            losses, grads = [], []
            for _ in range(3):
                loss, g = m.loss_and_grad(*data, copy=True)
                losses.append(loss)
                grads.append(g)
                opt.step(m, m.grads)
            runs.append((losses, grads, {k: np.array(v) for k, v in m.params.items()},
                         _core._bf16_kept_inputs_read() - before))
        finally:
            _core._bf16_allow_kept_inputs(True)
    (l1, g1, p1, read), (l0, g0, p0, read_off) = runs
    assert read_off == 0 and (read > 0) == native, (read, read_off)
    assert l1 == l0
    for a, b in zip(g1, g0):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    for k in p1:
        np.testing.assert_array_equal(p1[k], p0[k], err_msg=k)


def _tiled_rounded_attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, mask, drop=None, bias=None, Bq=128, Bk=256):
    """Algorithm 4 as the tiled listing computes it under bf16-mixed (Algorithm T1, docs/tiled_attention.md): per
    query block J and key block I, S = K_Iᵀ Q_J / √d_attn and Ṽ_J += V_I P from operands rounded to bfloat16 —
    P = exp(S − m′) rounded tile by tile, before the normalisation by l — the rest in float64."""
    assert drop is None and bias is None
    d_attn = W_q.shape[0]
    plain = [np.asarray(a).view(np.ndarray) for a in (X, Z, W_q, b_q, W_k, b_k, W_v, b_v)]
    X, Z, W_q, b_q, W_k, b_k, W_v, b_v = plain
    Q, K, V = (bf16(W) @ bf16(E) + b[:, None] for W, E, b in ((W_q, X, b_q), (W_k, Z, b_k), (W_v, Z, b_v)))
    l_z, l_x = mask.shape
    Vt = np.zeros((V.shape[0], l_x))
    for j0 in range(0, l_x, Bq):
        J = slice(j0, min(j0 + Bq, l_x))
        m = np.full(J.stop - j0, -np.inf)
        s = np.zeros(J.stop - j0)
        for t0 in range(0, l_z, Bk):
            I = slice(t0, min(t0 + Bk, l_z))
            if not mask[I, J].any():
                continue
            S = np.where(mask[I, J], bf16(K[:, I]).T @ bf16(Q[:, J]) / math.sqrt(d_attn), -np.inf)
            m_new = np.maximum(m, S.max(axis=0))
            corr = np.exp(m - m_new)
            P = np.exp(S - m_new)
            s = corr * s + P.sum(axis=0)
            Vt[:, J] = Vt[:, J] * corr + bf16(V[:, I]) @ bf16(P)
            m = m_new
        Vt[:, J] /= s
    return Vt.view(_Rounded)


def test_tiled_attention_rounds_its_tiles(path, monkeypatch):
    """The tiled listing's products under bf16-mixed round their operands too, the weights P tile by tile: the model
    is Algorithm 10 with every product rounded and attention as Algorithm T1 on rounded tiles (several query and key
    blocks, the causal diagonal inside them), closer to that than to the literal listing's rounding of A."""
    m = ft.DTransformer(40, 300, 1, 2, 32, 64, seed=3, precision="bf16-mixed", attention_impl="tiled")
    rng = np.random.default_rng(0)
    for k in m.params:
        m.params[k][...] = rng.standard_normal(m.params[k].shape) * 0.3
    x = rng.integers(0, 40, 300)
    P = m(x).astype(np.float64)
    params = {k: np.asarray(v, np.float64).view(_Rounded) for k, v in m.params.items()}
    literal = np.asarray(reference.d_transformer(x, params, L=1, H=2))
    monkeypatch.setattr(reference, "attention", _tiled_rounded_attention)
    want = np.asarray(reference.d_transformer(x, params, L=1, H=2))
    err = np.max(np.abs(P - want)) / np.max(want)
    assert err < 2e-4, err
    assert np.max(np.abs(P - literal)) / np.max(literal) > 3 * err
    m.precision = "float32"  # float32: the tiles' own kernels again, as the literal listing to float32's rounding
    monkeypatch.undo()
    plain = reference.d_transformer(x, {k: np.asarray(v, np.float64) for k, v in m.params.items()}, L=1, H=2)
    assert np.max(np.abs(m(x) - plain)) / np.max(plain) < 1e-5


def test_tiled_gradients_under_bf16_follow_the_literal_listing():
    """The tiled backward (Algorithm T2) under bf16-mixed: its products rounded too, the gradients those of the
    literal listing in bf16-mixed up to the different rounding of P and dS (and far from zero)."""
    kw = dict(seed=4, precision="bf16-mixed")
    a = ft.DTransformer(40, 300, 1, 2, 32, 64, attention_impl="tiled", **kw)
    b = ft.DTransformer(40, 300, 1, 2, 32, 64, attention_impl="literal", **kw)
    x = np.random.default_rng(1).integers(0, 40, (2, 300))
    la, ga = a.loss_and_grad(x)
    lb, gb = b.loss_and_grad(x)
    assert abs(la - lb) < 1e-3 * abs(lb)
    for k in gb:
        if k.endswith("attn.b_k"):  # zero in exact arithmetic (the softmax does not see a shift of the scores)
            continue
        scale = np.max(np.abs(gb[k]))
        assert scale > 0, k
        assert np.max(np.abs(ga[k] - gb[k])) < 3e-2 * scale, (k, np.max(np.abs(ga[k] - gb[k])) / scale)


_TILED_CHILD = r"""
import json, sys
import numpy as np
import formal_transformers as ft
from formal_transformers import _core
_core._bf16_allow_native(sys.argv[1] == "native")
m = ft.DTransformer(40, 300, 1, 2, 32, 64, seed=5, precision="bf16-mixed", attention_impl="tiled")
x = np.random.default_rng(2).integers(0, 40, 300)
print(json.dumps(dict(info=ft.blas_info(), P=np.asarray(m(x), np.float64).ravel().tolist())))
"""


@pytest.mark.parametrize("native", ["native", "emulated"])
def test_tiled_attention_in_bf16_at_the_baseline_cpu_level(native):
    """The tiled listing in bf16-mixed with our kernels forced to the baseline level (a CPU without AVX-512; each
    level is chosen once per process, so in a child) gives this process's results, both ways of running bf16
    products."""
    import json
    import subprocess
    import sys

    from conftest import child_env

    env = child_env()
    env["FT_CPU_LEVEL"] = "baseline"
    r = subprocess.run([sys.executable, "-c", _TILED_CHILD, native], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    _core._bf16_allow_native(native == "native")
    try:
        m = ft.DTransformer(40, 300, 1, 2, 32, 64, seed=5, precision="bf16-mixed", attention_impl="tiled")
        want = np.asarray(m(np.random.default_rng(2).integers(0, 40, 300)), np.float64).ravel()
    finally:
        _core._bf16_allow_native(True)
    P = np.array(got["P"])
    assert P.shape == want.shape
    assert np.max(np.abs(P - want)) <= 1e-5 * np.max(np.abs(want))
