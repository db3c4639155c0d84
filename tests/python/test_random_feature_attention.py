"""attention="performer" | "rfa" (Algorithm V15 of docs/variants.md: random-feature attention, Performer's FAVOR+
and RFA's trigonometric features): the draw of Ω, the core against reference.py (float64 ≤ 1e-12, float32 ≤ 1e-5)
in DTransformer (causal: prefix sums) and ETransformer (bidirectional), every gradient against finite differences
and PyTorch autograd of an independent transcription (torch_variants.py: the quadratic form), the prefix sums
against the masked quadratic form, cached decoding (an O(D·d) state per head) against the full forward, the
estimator converging to exact softmax attention as D grows, save/load, bad options.
The sequences pass 64 tokens: the causal kernel's chunk of queries."""
from __future__ import annotations

import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, numeric_grad, randomize_theta, rel_err, torch_or_skip

KINDS = ["performer", "rfa"]


def omegas(kind, D, d_attn, L, seed):
    """Every layer's Ω as the model draws it (ft.random_feature_matrix with the layer's name)."""
    return [ft.random_feature_matrix(kind, D, d_attn, seed, f"layers.{l}.attn.") for l in range(L)]


def randomize(model, rng, scale=0.5):
    """Every parameter random (conftest.randomize_theta): γ = 1 + 0.2 z, biases and β 0.2 z, matrices
    scale·z/√columns (W_e too)."""
    return randomize_theta(model, rng, unit=(), spread=0.2, scale=scale)


def d_model(kind, dtype="float64", L=2, H=2, d_e=8, D=7, l_max=160, **kw):
    return ft.DTransformer(19, l_max, L, H, d_e, 12, dtype=dtype, seed=3, attention=kind, n_features=D,
                           feature_seed=5, **kw)


def e_model(kind, dtype="float64", L=2, H=2, d_e=8, D=7, l_max=160, **kw):
    return ft.ETransformer(19, l_max, L, H, d_e, 12, 8, dtype=dtype, seed=3, attention=kind, n_features=D,
                           feature_seed=5, **kw)


# ---------------------------------------------------------------------------------------------------
# V15a: Ω


def test_performer_features_are_orthogonal_blocks_with_chi_norms():
    d, D = 8, 20  # blocks of 8, 8 and 4 rows
    W = ft.random_feature_matrix("performer", D, d, 11, "x")
    assert W.shape == (D, d)
    for i0 in (0, 8, 16):
        B = W[i0:i0 + 8]
        U = B / np.linalg.norm(B, axis=1, keepdims=True)
        assert np.abs(U @ U.T - np.eye(len(B))).max() <= 1e-12  # Gram–Schmidt: orthonormal directions
    assert np.abs(W[0] @ W[8]) > 1e-6  # independent blocks are not orthogonal to each other
    # the norms: chi with d degrees of freedom, E‖ω‖² = d (a sample of 4000 rows, a generous bound)
    big = ft.random_feature_matrix("performer", 4000, d, 12, "x")
    assert abs(np.mean(np.sum(big * big, axis=1)) - d) <= 0.15 * d
    # rfa: independent Gaussian rows (E ω ωᵀ = I)
    g = ft.random_feature_matrix("rfa", 4000, d, 12, "x")
    assert np.abs(g.T @ g / 4000 - np.eye(d)).max() <= 0.1


def test_features_are_redrawn_from_the_seed_and_the_name():
    a = ft.random_feature_matrix("performer", 9, 4, 1, "layers.0.attn.")
    assert np.array_equal(a, ft.random_feature_matrix("performer", 9, 4, 1, "layers.0.attn."))
    assert not np.allclose(a, ft.random_feature_matrix("performer", 9, 4, 2, "layers.0.attn."))
    assert not np.allclose(a, ft.random_feature_matrix("performer", 9, 4, 1, "layers.1.attn."))


# ---------------------------------------------------------------------------------------------------
# forward: the core against reference.py


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", KINDS)
def test_dtransformer_matches_reference(kind, dtype):
    model = d_model(kind, dtype)
    theta = randomize(model, np.random.default_rng(1))
    F = omegas(kind, 7, 4, 2, 5)
    rng = np.random.default_rng(2)
    for l in (1, 5, 140):  # 140: three chunks of the causal kernel
        x = rng.integers(0, 16, size=l)
        want = ref.d_transformer_variant(x, theta, L=2, H=2, attention=kind, features=F)
        assert rel_err(model(x), want) <= TOL[dtype], (l, rel_err(model(x), want))
    # a ragged batch: every sequence on its own
    xs = [rng.integers(0, 16, size=n) for n in (70, 9, 130)]
    P = model(xs)
    for b, s in enumerate(xs):
        want = ref.d_transformer_variant(s, theta, L=2, H=2, attention=kind, features=F)
        assert rel_err(np.asarray(P[b])[:, :len(s)], want) <= TOL[dtype]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", KINDS)
def test_etransformer_matches_reference(kind, dtype):
    model = e_model(kind, dtype)
    theta = randomize(model, np.random.default_rng(3))
    F = omegas(kind, 7, 4, 2, 5)
    x = np.random.default_rng(4).integers(0, 16, size=100)
    want = ref.e_transformer(x, theta, L=2, H=2, attention=kind, features=F)
    assert rel_err(model(x), want) <= TOL[dtype]


def test_rope_and_grouped_query_heads_with_random_features():
    model = d_model("performer", H=4, d_e=16, positional="rope", H_kv=2, D=12)
    theta = randomize(model, np.random.default_rng(5))
    F = omegas("performer", 12, 4, 2, 5)
    x = np.random.default_rng(6).integers(0, 16, size=90)
    want = ref.d_transformer_variant(x, theta, L=2, H=4, positional="rope", attention="performer", features=F)
    assert rel_err(model(x), want) <= 1e-12


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("q0", [0, 7])
def test_prefix_sums_equal_the_masked_quadratic_form(kind, q0):
    rng = np.random.default_rng(7)
    d, d_v, l_x = 6, 5, 40
    l_z = q0 + l_x
    Q, K, V = rng.normal(size=(d, l_x)), rng.normal(size=(d, l_z)), rng.normal(size=(d_v, l_z))
    W = ft.random_feature_matrix(kind, 10, d, 3)
    mask = np.arange(l_z)[:, None] <= q0 + np.arange(l_x)[None, :]
    a = ref.rf_attention(Q, K, V, W, kind, causal=True, q0=q0)
    b = ref.rf_attention_quadratic(Q, K, V, W, kind, mask)
    assert rel_err(a, b) <= 1e-12
    full = ref.rf_attention(Q, K, V, W, kind, causal=False)
    assert rel_err(full, ref.rf_attention_quadratic(Q, K, V, W, kind, np.ones((l_z, l_x), bool))) <= 1e-12


@pytest.mark.parametrize("kind", KINDS)
def test_core_prefix_sums_equal_its_weights_times_values(kind):
    """The core's causal output (prefix sums in chunks) equals V A with A its attention_weights (the masked
    quadratic form, normalised), through a one-layer model's residual: Y = W_o [V¹A¹; …] + b_o."""
    model = d_model(kind, L=1, l_max=200)
    theta = randomize(model, np.random.default_rng(8))
    F = omegas(kind, 7, 4, 1, 5)
    x = np.random.default_rng(9).integers(0, 16, size=150)
    model(x)
    A = model.attention_weights(0)
    X = np.stack([theta["W_e"][:, t] + theta["W_p"][:, i] for i, t in enumerate(x)], axis=1)
    Xt = ref.layer_norm_columns(X, theta["layers.0.gamma1"], theta["layers.0.beta1"], 1e-5)
    a = "layers.0.attn."
    for h in range(2):
        Q = theta[a + "W_q"][h] @ Xt + theta[a + "b_q"][h][:, None]
        K = theta[a + "W_k"][h] @ Xt + theta[a + "b_k"][h][:, None]
        mask = ref.unidirectional_mask(150, 150)
        Pq, Pk = ref.random_features(Q, F[0], kind, query=True), ref.random_features(K, F[0], kind)
        W = np.where(mask, Pk.T @ Pq, 0.0)
        assert rel_err(A[h], W / W.sum(axis=0)) <= 1e-12


# ---------------------------------------------------------------------------------------------------
# backward


@pytest.mark.parametrize("arch", ["D", "E"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_gradient_matches_finite_differences(kind, arch):
    make = d_model if arch == "D" else e_model
    model = make(kind, L=1, D=5, l_max=12)
    randomize(model, np.random.default_rng(10))
    x = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 7]
    if arch == "D":
        loss = lambda: model.loss(x)  # noqa: E731
        _, grads = model.loss_and_grad(x)
    else:
        xt = list(x)
        xt[2] = xt[6] = model.mask_token
        loss = lambda: model.loss(xt, x)  # noqa: E731
        _, grads = model.loss_and_grad(xt, x)
    assert set(grads) == set(model.params)
    for k, view in model.params.items():
        # step 1e-5, not the default 1e-6: the differences' own rounding, about ε·|loss|/h, is ~1e-6 of W_q's small
        # gradients at h = 1e-6 (1.1e-6 in the portable wheel's build, E/performer); at 1e-5 it is ~8e-8
        num = numeric_grad(loss, view, h=1e-5)
        assert rel_err(grads[k], num) <= 1e-6, (k, rel_err(grads[k], num))


@pytest.mark.parametrize("opts", [dict(attention="performer"), dict(attention="rfa"),
                                  dict(attention="performer", positional="rope", H_kv=1, bias=False),
                                  dict(attention="rfa", H=4, d_e=16, H_kv=2)])
def test_every_gradient_matches_torch_autograd(opts):
    torch_or_skip()
    import torch_variants as tv

    opts = dict(opts)
    kind = opts.pop("attention")
    H, d_e = opts.pop("H", 2), opts.pop("d_e", 8)
    model = d_model(kind, H=H, d_e=d_e, **opts)
    theta = randomize(model, np.random.default_rng(11))
    F = omegas(kind, 7, d_e // H, 2, 5)
    batch = [list(np.random.default_rng(12).integers(0, 16, size=100)), [8, 9, 7, 9, 3]]
    loss, grads = model.loss_and_grad(batch)
    hp = dict(L=2, H=H, positional=opts.get("positional", "learned"), attention=kind, features=F)
    t_loss, t_grads = tv.loss_and_grad(theta, batch, **hp)
    assert abs(loss - t_loss) <= 1e-10 * abs(t_loss)
    assert set(t_grads) == set(grads)
    for k, g in t_grads.items():
        assert rel_err(grads[k], g) <= 1e-8, (k, rel_err(grads[k], g))


def test_float32_gradients_match_float64():
    m64, m32 = d_model("performer"), d_model("performer", "float32")
    theta = randomize(m64, np.random.default_rng(13))
    for k, v in theta.items():
        m32.params[k] = v
    x = list(np.random.default_rng(14).integers(0, 16, size=80))
    (l64, g64), (l32, g32) = m64.loss_and_grad(x), m32.loss_and_grad(x)
    assert abs(l32 - l64) <= 1e-5 * abs(l64)
    scale = max(np.abs(g).max() for g in g64.values())
    for k in g64:
        assert np.abs(np.asarray(g32[k], np.float64) - g64[k]).max() <= 1e-4 * scale, k


# ---------------------------------------------------------------------------------------------------
# decoding: the O(D·d) state


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("opts", [dict(), dict(positional="rope")])
def test_cached_decoding_equals_full_forward(kind, opts):
    model = d_model(kind, l_max=40, **opts)
    randomize(model, np.random.default_rng(15), scale=1.5)
    prompt = [1, 2, 3, 4, 5]
    for tau in (0.0, 1.0):
        cached = ft.DInference(30, tau, seed=7, cache=True)(prompt, model)
        full = ft.DInference(30, tau, seed=7, cache=False)(prompt, model)
        assert list(cached) == list(full), (kind, tau)


def test_cached_decoding_follows_the_reference_greedily():
    model = d_model("performer", l_max=40, positional="rope")
    theta = randomize(model, np.random.default_rng(16), scale=1.5)
    F = omegas("performer", 7, 4, 2, 5)
    prompt = [3, 1, 4]
    got = ft.DInference(20, 0.0, seed=0, cache=True)(prompt, model)
    forward = lambda c: ref.d_transformer_variant(c, theta, L=2, H=2, positional="rope", attention="performer",  # noqa: E731
                                                  features=F)
    want = ref.d_inference(prompt, forward, l_gen=20, tau=0.0, l_max=40)
    assert list(got) == list(want)


# ---------------------------------------------------------------------------------------------------
# the estimator: unbiased for exp(qᵀk/√d), so the weights converge to softmax(S/√d_attn) as D grows


@pytest.mark.parametrize("kind", KINDS)
def test_estimator_converges_to_softmax_attention(kind):
    exact = ft.DTransformer(19, 64, 1, 2, 8, 12, dtype="float64", seed=3)
    x = np.random.default_rng(17).integers(0, 16, size=48)
    exact(x)
    A = exact.attention_weights(0)
    errs = []
    for D in (8, 128, 2048):
        m = ft.DTransformer(19, 64, 1, 2, 8, 12, dtype="float64", seed=3, attention=kind, n_features=D, feature_seed=1)
        for k, v in exact.params.items():
            assert np.array_equal(m.params[k], v)  # the same θ: only lines 4–6 differ
        m(x)
        errs.append(float(np.abs(m.attention_weights(0) - A).mean()))
    # error ~ 1/√D: a factor 16 from D = 8 to 2048; asked: at least 4, and small in absolute terms
    assert errs[2] <= errs[0] / 4, errs
    assert errs[2] <= 0.01, errs


# ---------------------------------------------------------------------------------------------------
# options


def test_config_save_and_load_keep_the_features(tmp_path):
    model = d_model("rfa")
    randomize(model, np.random.default_rng(18))
    cfg = model.config
    assert (cfg["attention"], cfg["n_features"], cfg["feature_seed"]) == ("rfa", 7, 5)
    ft.save(model, tmp_path / "m")
    back = ft.load(tmp_path / "m")
    assert back.config == cfg
    x = [1, 2, 3, 4, 5, 6]
    assert np.array_equal(back(x), model(x))


def test_default_number_of_features():
    m = ft.DTransformer(19, 16, 1, 2, 16, 12, attention="performer")
    assert m.config["n_features"] == math.ceil(8 * math.log(8))  # ⌈d_attn ln d_attn⌉
    assert ft.DTransformer(19, 16, 1, 2, 16, 12).config["attention"] == "softmax"


@pytest.mark.parametrize("kw, match", [
    (dict(attention="performer", n_features=0), "n_features"),
    (dict(attention="rfa", n_features=-3), "n_features"),
    (dict(attention="favor"), "attention"),
    (dict(n_features=8), "n_features"),
    (dict(attention="performer", positional="alibi"), "ALiBi"),
    (dict(attention="performer", sliding_window=4), "sliding_window"),
    (dict(attention="rfa", attn_dropout=0.1), "attn_dropout"),
    (dict(attention="performer", attention_impl="tiled"), "tiled"),
])
def test_bad_options_are_value_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        ft.DTransformer(19, 16, 1, 2, 8, 12, **kw)


def test_bad_feature_matrix_arguments():
    with pytest.raises(ValueError, match="n_features"):
        ft.random_feature_matrix("performer", 0, 4)
    with pytest.raises(ValueError, match="attention"):
        ft.random_feature_matrix("softmax", 4, 4)
    with pytest.raises(TypeError):
        ft.EDTransformer(19, 16, 1, 1, 2, 8, 12, attention="performer")


def test_speculative_decoding_refuses_random_features():
    """Speculative decoding rolls the caches back; the folded state of V15 cannot forget: a ValueError, not a crash."""
    rf = d_model("performer", l_max=40)
    exact = ft.DTransformer(19, 40, 2, 2, 8, 12, dtype="float64", seed=3)
    for target, draft in ((exact, rf), (rf, exact)):
        with pytest.raises(ValueError, match="performer"):
            ft.SpeculativeInference(5, 2, 0.0)([1, 2, 3], target, draft)
