"""ScaleNorm (norm="scale", docs/variants.md V12) and FixNorm (fixnorm=True, V13) beyond test_variants.py's
table (which checks D's forward against reference.py and every gradient against PyTorch autograd): the
initialisation, E and ED with FixNorm against reference.py, finite differences on every new parameter, the
eps edge cases, save/load, and bad values."""
from __future__ import annotations

import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, numeric_grad, randomize_theta, rel_err

D_SIZES = (13, 8, 2, 2, 6, 10)  # n_vocab, l_max, L, H, d_e, d_mlp
X = [[3, 1, 4, 1, 5, 9, 2], [8, 9, 7, 1]]  # token 1 twice: FixNorm's scatter-add of two positions


def randomize(model, rng):
    return randomize_theta(model, rng)


def test_scale_norm_has_one_scalar_per_norm_initialised_to_sqrt_d_e():
    m = ft.DTransformer(*D_SIZES, norm="scale", dtype="float64")
    names = [k for k in m.params if k.rsplit(".", 1)[-1].startswith(("gamma", "beta"))]
    assert names == ["layers.0.gamma1", "layers.0.gamma2", "layers.1.gamma1", "layers.1.gamma2", "gamma"]
    for k in names:
        assert m.params[k].shape == (1,)
        assert m.params[k][0] == pytest.approx(math.sqrt(6), abs=1e-15)
    assert ft.DTransformer(*D_SIZES, norm="scale").config["norm"] == "scale"


@pytest.mark.parametrize("norm, fixnorm", [("scale", False), ("layer", True), ("scale", True), ("rms", True)])
def test_d_every_new_parameter_matches_finite_differences(norm, fixnorm):
    m = ft.DTransformer(*D_SIZES, norm=norm, fixnorm=fixnorm, dtype="float64", seed=1)
    randomize(m, np.random.default_rng(5))
    _, grads = m.loss_and_grad(X)
    new = ["W_e"] if fixnorm else []
    new += [k for k in m.params if norm == "scale" and k.rsplit(".", 1)[-1].startswith("gamma")]
    for k in new:
        num = numeric_grad(lambda: m.loss(X), m.params[k])
        assert rel_err(grads[k], num) <= 1e-7, k


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_e_with_fixnorm_matches_reference(dtype):
    V = 12
    m = ft.ETransformer(V, 8, 2, 2, 6, 10, 6, fixnorm=True, dtype=dtype, seed=2)
    th = randomize(m, np.random.default_rng(6))
    x = [3, 1, 4, 1, 5, 2]
    assert rel_err(m(x), ref.e_transformer(x, th, L=2, H=2, fixnorm=True)) <= TOL[dtype]
    assert rel_err(m(x), ref.e_transformer(x, th, L=2, H=2)) > 1e-3  # the option does change the model


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_ed_with_fixnorm_matches_reference(dtype):
    m = ft.EDTransformer(12, 8, 1, 2, 2, 6, 10, fixnorm=True, dtype=dtype, seed=3)
    th = randomize(m, np.random.default_rng(7))
    z, x = [3, 1, 4, 1, 5], [2, 7, 1, 8]
    assert rel_err(m(z, x), ref.ed_transformer(z, x, th, L_enc=1, L_dec=2, H=2, fixnorm=True)) <= TOL[dtype]


def test_e_and_ed_fixnorm_w_e_gradient_matches_finite_differences():
    e = ft.ETransformer(12, 8, 1, 2, 6, 10, 6, fixnorm=True, dtype="float64", seed=4)
    randomize(e, np.random.default_rng(8))
    x = [3, 1, 4, 1, 5, 2]
    xt = [3, e.mask_token, 4, 1, e.mask_token, 2]
    _, g = e.loss_and_grad(xt, x)
    assert rel_err(g["W_e"], numeric_grad(lambda: e.loss(xt, x), e.params["W_e"])) <= 1e-7
    ed = ft.EDTransformer(12, 8, 1, 1, 2, 6, 10, fixnorm=True, dtype="float64", seed=5)
    randomize(ed, np.random.default_rng(9))
    z, x = [3, 1, 4, 1, 5], [2, 7, 1, 8]
    _, g = ed.loss_and_grad(z, x)
    assert rel_err(g["W_e"], numeric_grad(lambda: ed.loss(z, x), ed.params["W_e"])) <= 1e-7


def test_eps_zero_is_the_papers_formula_and_a_zero_column_stays_finite_with_eps():
    # eps = 0: ScaleNorm is g·e/‖e‖ and FixNorm's columns have length exactly 1 (reference with eps = 0)
    m = ft.DTransformer(*D_SIZES, norm="scale", fixnorm=True, eps=0.0, dtype="float64", seed=6)
    th = randomize(m, np.random.default_rng(10))
    assert rel_err(m(X[0]), ref.d_transformer_variant(X[0], th, L=2, H=2, norm="scale", fixnorm=True, eps=0.0)) <= 1e-12
    e = ref.fixnorm_embedding(np.arange(13), th["W_e"], 0.0)
    assert np.allclose(np.linalg.norm(e, axis=0), 1.0, rtol=0, atol=1e-15)
    # eps > 0: a zero embedding column (and zero position) gives a zero column, not NaN, through both norms
    m2 = ft.DTransformer(*D_SIZES, norm="scale", fixnorm=True, eps=1e-5, dtype="float64", seed=7)
    th2 = randomize(m2, np.random.default_rng(11))
    m2.params["W_e"][:, 3] = 0.0
    m2.params["W_p"][:, 0] = 0.0
    th2["W_e"][:, 3] = 0.0
    th2["W_p"][:, 0] = 0.0
    P = m2([3, 1, 4])
    assert np.all(np.isfinite(P))
    assert rel_err(P, ref.d_transformer_variant([3, 1, 4], th2, L=2, H=2, norm="scale", fixnorm=True, eps=1e-5)) <= 1e-12
    _, g = m2.loss_and_grad([3, 1, 4])
    assert np.all(np.isfinite(g["W_e"]))  # at w = 0: dW_e[:, v] = de/√eps, finite
    col = m2.params["W_e"][:, 3]
    assert rel_err(g["W_e"][:, 3], numeric_grad(lambda: m2.loss([3, 1, 4]), col, h=1e-9)) <= 1e-6  # ~h²: curved at the scale √eps


def test_cached_decoding_with_fixnorm_and_scale_norm_equals_the_full_forward():
    m = ft.DTransformer(*D_SIZES, norm="scale", fixnorm=True, dtype="float64", seed=8)
    randomize(m, np.random.default_rng(12))
    for tau in (0.0, 1.0):
        assert list(ft.DInference(10, tau, seed=3, cache=True)([1, 2, 3], m)) == \
            list(ft.DInference(10, tau, seed=3, cache=False)([1, 2, 3], m))


def test_save_load_keeps_the_options(tmp_path):
    m = ft.DTransformer(*D_SIZES, norm="scale", fixnorm=True, dtype="float64", seed=9)
    randomize(m, np.random.default_rng(13))
    ft.save(m, tmp_path / "m.safetensors")
    m2 = ft.load(tmp_path / "m.safetensors")
    assert m2.config == m.config
    assert np.array_equal(m2(X[0]), m(X[0]))


def test_bad_values():
    with pytest.raises(ValueError, match="'layer', 'rms', 'scale'"):
        ft.DTransformer(*D_SIZES, norm="scalenorm")
    with pytest.raises(TypeError, match="norm"):  # an option the encoders do not take
        ft.ETransformer(12, 8, 1, 2, 6, 10, 6, norm="scale")
    with pytest.raises(ValueError, match="'layer', 'rms', 'scale'"):  # (an EDTransformer option since V18, T5)
        ft.EDTransformer(12, 8, 1, 1, 2, 6, 10, norm="scalenorm")
    with pytest.raises(TypeError, match="fixnorm"):
        ft.DTransformer(*D_SIZES, fixnorm="yes")
    for eps in (-1e-5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps"):
            ft.DTransformer(*D_SIZES, norm="scale", fixnorm=True, eps=eps)
    with pytest.raises(ValueError, match="norm"):
        ref.d_transformer_variant([1, 2], {}, L=1, H=1, norm="scalenorm")
    with pytest.raises(ValueError, match="fixnorm"):
        ft.to_torch(ft.DTransformer(*D_SIZES, fixnorm=True))
    with pytest.raises(ValueError, match="scale"):
        ft.to_torch(ft.DTransformer(*D_SIZES, norm="scale"))
    with pytest.raises(ValueError, match="fixnorm"):
        ft.to_hf(ft.DTransformer(*D_SIZES, fixnorm=True))
    with pytest.raises(ValueError, match="scale"):
        ft.to_hf(ft.DTransformer(*D_SIZES, norm="scale"))
