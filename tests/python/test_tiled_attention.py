"""attention_impl="tiled" (Algorithm T, docs/tiled_attention.md: FlashAttention-2's tiled exact attention)
against attention_impl="literal" (Algorithm 4 as printed, itself held to reference.py, finite differences and
PyTorch elsewhere): MHAttention and the three models, forward, backward and loss_and_grad (float64 ≤ 1e-12,
float32 ≤ 1e-5), every mask, RoPE, ALiBi, grouped-query attention, dropout with the same masks, cached
decoding, attention_weights computed on demand, finite differences of the tiled gradients, save/load keeping
the option, bad values refused. The lengths cross the tiles' edges (64 queries × 128 keys): 70 and 150 tokens.
"""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft
from conftest import TOL, kind_inputs, numeric_grad, rel_err

V = 13


def pair(cls, *args, **kw):
    """The same model twice (same seed): literal and tiled."""
    return cls(*args, attention_impl="literal", **kw), cls(*args, attention_impl="tiled", **kw)


def grads_close(g_til, g_lit, tol):
    """Every gradient, norm-wise over the whole gradient (θ's largest entry): b_k's is 0 in exact arithmetic
    (the softmax ignores a shift common to all keys), so its own relative error would compare rounding noise."""
    scale = max(float(np.max(np.abs(v))) for v in g_lit.values())
    for k in g_lit:
        err = float(np.max(np.abs(np.asarray(g_til[k]) - np.asarray(g_lit[k]))))
        assert err <= tol * scale, (k, err, scale)


def randomise(models, rng, scale=0.3):
    """θ away from the initialisation, the same in every model (larger scores: sharper softmaxes)."""
    for k, v in models[0].params.items():
        val = rng.normal(0, scale, v.shape) + (1.0 if k.split(".")[-1].startswith("gamma") else 0.0)
        for m in models:
            m.params[k] = val


# ---------------------------------------------------------------------------------------------------
# MHAttention (Algorithm 5) alone

MH_CASES = {
    "bidirectional": dict(mask="bidirectional"),
    "causal": dict(mask="unidirectional"),
    "rope": dict(mask="unidirectional", positional="rope"),
    "alibi": dict(mask="unidirectional", positional="alibi"),
    "alibi_bidirectional": dict(mask="bidirectional", positional="alibi"),
    "gqa": dict(mask="unidirectional", H_kv=2),
    "mqa_no_bias": dict(mask="bidirectional", H_kv=1, bias=False),
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", sorted(MH_CASES))
def test_mhattention_tiled_equals_literal(case, dtype, rng):
    H, d_x, d_attn, d_mid, d_out, l = 4, 12, 6, 5, 7, 150
    lit, til = pair(ft.MHAttention, H, d_x, d_x, d_attn, d_mid, d_out, dtype=dtype, seed=5, **MH_CASES[case])
    assert (lit.attention_impl, til.attention_impl) == ("literal", "tiled")
    X = rng.normal(size=(d_x, l)) * 2
    dY = rng.normal(size=(d_out, l))
    Y_lit, Y_til = lit(X), til(X)
    assert rel_err(Y_til, Y_lit) <= TOL[dtype]
    (dX_lit, dZ_lit), (dX_til, dZ_til) = lit.backward(dY), til.backward(dY)
    assert rel_err(dX_til + dZ_til, dX_lit + dZ_lit) <= TOL[dtype]
    grads_close(til.grads, lit.grads, TOL[dtype])
    # the weights are computed when read, as the literal path keeps them
    assert rel_err(til.weights, lit.weights) <= TOL[dtype]


@pytest.mark.parametrize("mask", ["bidirectional", "unidirectional", "explicit"])
def test_mhattention_cross_attention_and_explicit_masks(mask, rng):
    """ℓ_x ≠ ℓ_z (cross-attention), incl. an explicit mask whose first key block is masked for some queries."""
    H, d_x, d_z, l_x, l_z = 2, 6, 5, 70, 150
    if mask == "explicit":
        m = rng.random((l_z, l_x)) < 0.3
        m[:140, 3] = False  # query 3 sees only the last keys (the online softmax starts from m = −∞)
        m[rng.integers(0, l_z, size=l_x), np.arange(l_x)] = True
    else:
        m = mask
    lit, til = pair(ft.MHAttention, H, d_x, d_z, 4, 3, 5, mask=m, dtype="float64", seed=2)
    X, Z, dY = rng.normal(size=(d_x, l_x)), rng.normal(size=(d_z, l_z)), rng.normal(size=(5, l_x))
    assert rel_err(til(X, Z), lit(X, Z)) <= 1e-12
    for a, b in zip(til.backward(dY), lit.backward(dY)):
        assert rel_err(a, b) <= 1e-12
    grads_close(til.grads, lit.grads, 1e-12)
    assert rel_err(til.weights, lit.weights) <= 1e-12


def test_mhattention_tiled_backward_matches_finite_differences(rng):
    """The tiled gradients themselves against central differences of the tiled forward (float64)."""
    att = ft.MHAttention(2, 4, 4, 3, 3, 4, mask="unidirectional", dtype="float64", seed=1, positional="alibi",
                         attention_impl="tiled")
    X, W = rng.normal(size=(4, 9)), rng.normal(size=(4, 9))
    att(X)
    att.backward(W)
    h = 1e-6
    for name in ("W_q", "W_k", "W_v"):
        p = att.params[name]
        g = np.array(att.grads[name])
        num = np.zeros_like(g)
        for idx in np.ndindex(p.shape):
            old = p[idx]
            p[idx] = old + h
            fp = np.sum(att(X) * W)
            p[idx] = old - h
            fm = np.sum(att(X) * W)
            p[idx] = old
            num[idx] = (fp - fm) / (2 * h)
        assert rel_err(g, num) <= 1e-6, name


@pytest.mark.parametrize("bad", ["flash", "", "Tiled"])
def test_bad_attention_impl_is_a_value_error(bad):
    with pytest.raises(ValueError, match="attention_impl"):
        ft.MHAttention(2, 4, 4, 2, 2, 4, attention_impl=bad)
    with pytest.raises(ValueError, match="attention_impl"):
        ft.DTransformer(V, 8, 1, 2, 8, 8, attention_impl=bad)
    with pytest.raises(TypeError):
        ft.DTransformer(V, 8, 1, 2, 8, 8, attention_impl=1)


# ---------------------------------------------------------------------------------------------------
# The three models

D_CASES = {
    "plain": dict(),
    "rope": dict(positional="rope"),
    "alibi": dict(positional="alibi"),
    "llama": dict(positional="rope", H_kv=2, mlp="swiglu", bias=False, norm="rms"),
    "alibi_gqa": dict(positional="alibi", H_kv=1, bias=False),
    # the sliding-window mask part (V8): the tiles outside every query block's window are skipped
    "window": dict(sliding_window=40),
    "mistral": dict(sliding_window=70, positional="rope", H_kv=2, mlp="swiglu", bias=False, norm="rms"),
    "window_alibi": dict(sliding_window=33, positional="alibi"),
}


def build(kind, dtype="float64", seed=3, **kw):
    if kind == "d":
        return pair(ft.DTransformer, V, 160, 2, 4, 16, 20, dtype=dtype, seed=seed, **kw)
    if kind == "e":
        return pair(ft.ETransformer, V, 160, 2, 4, 16, 20, 16, dtype=dtype, seed=seed, **kw)
    return pair(ft.EDTransformer, V, 160, 1, 2, 4, 16, 20, dtype=dtype, seed=seed, **kw)


def inputs(kind, rng, l=150, l_z=70):
    return kind_inputs(kind, rng, V, l, l_z, masked=(1, 40, 90, 149))


def check_models(lit, til, kind, inp, tol):
    P_lit = lit(inp[0]) if kind != "ed" else lit(*inp)
    P_til = til(inp[0]) if kind != "ed" else til(*inp)
    assert rel_err(P_til, P_lit) <= tol
    (L_lit, g_lit), (L_til, g_til) = lit.loss_and_grad(*inp), til.loss_and_grad(*inp)
    assert abs(L_til - L_lit) <= tol * abs(L_lit)
    grads_close(g_til, g_lit, tol)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", sorted(D_CASES))
def test_dtransformer_tiled_equals_literal(case, dtype, rng):
    lit, til = build("d", dtype=dtype, **D_CASES[case])
    randomise((lit, til), rng)
    x = inputs("d", rng)
    check_models(lit, til, "d", x, TOL[dtype])
    # batches: ragged lists (each sequence its own blocks)
    xs = [x[0][:150], x[0][:77]]
    P_lit, P_til = lit(xs), til(xs)
    for a, b in zip(P_til, P_lit):
        assert rel_err(a, b) <= TOL[dtype]
    for l in range(2):
        assert rel_err(til.attention_weights(l, seq=1), lit.attention_weights(l, seq=1)) <= TOL[dtype]


@pytest.mark.parametrize("kind", ["e", "ed"])
def test_encoder_and_encoder_decoder_tiled_equal_literal(kind, rng):
    lit, til = build(kind)
    randomise((lit, til), rng)
    inp = inputs(kind, rng)
    check_models(lit, til, kind, inp, 1e-12)
    if kind == "e":
        assert rel_err(til.attention_weights(1), lit.attention_weights(1)) <= 1e-12
    else:
        for k in ("enc", "dec", "cross"):
            assert rel_err(til.attention_weights(k, 0), lit.attention_weights(k, 0)) <= 1e-12


@pytest.mark.parametrize("kind", ["d", "e", "ed"])
def test_dropout_on_the_weights_draws_the_literal_masks(kind, rng):
    """With dropout the tiles redraw the literal path's masks entry by entry: the same losses and gradients,
    and dropout_masks() (materialised on demand) the same."""
    lit, til = build(kind, dropout=0.2)
    randomise((lit, til), rng)
    inp = inputs(kind, rng)
    for step in (0, 5):
        lit.dropout_step = til.dropout_step = step
        (L_lit, g_lit), (L_til, g_til) = lit.loss_and_grad(*inp), til.loss_and_grad(*inp)
        assert abs(L_til - L_lit) <= 1e-12 * abs(L_lit)
        grads_close(g_til, g_lit, 1e-12)
        m_lit, m_til = lit.dropout_masks(), til.dropout_masks()
        assert sorted(m_lit) == sorted(m_til)
        for k in m_lit:
            a, b = m_til[k], m_lit[k]
            for u, v in zip(a, b) if isinstance(b, list) else [(a, b)]:
                np.testing.assert_array_equal(u, v)
        assert any(not np.all(v) for v in m_til["layers.0.attn.weights" if kind != "ed" else "dec.0.attn.weights"])


def test_tiled_loss_and_grad_matches_finite_differences(rng):
    lit, til = build("d", positional="alibi")
    randomise((til,), rng)
    x = inputs("d", rng, l=140)[0]
    _, g = til.loss_and_grad(x)
    h = 1e-6
    for name in ("layers.0.attn.W_q", "layers.1.attn.W_k", "layers.1.attn.W_v"):
        p = til.params[name]
        entries = [(0, 0, 1), (1, 2, 3), (3, 1, 0)]
        for idx, num in zip(entries, numeric_grad(lambda: til.loss(x), p, h, entries)):
            assert abs(g[name][idx] - num) <= 1e-6 * max(1.0, abs(num)), (name, idx)


@pytest.mark.parametrize("opts", [dict(), dict(positional="rope", H_kv=2), dict(positional="alibi"),
                                  dict(sliding_window=12, positional="rope"), dict(sliding_window=9, positional="alibi")])
def test_cached_decoding_with_tiled_equals_literal(opts, rng):
    """DInference decodes with the KV cache (queries at q0 > 0 over the cached keys; a window: the rolling cache,
    V9, its keys from a start > 0)."""
    lit, til = build("d", **opts)
    randomise((lit, til), rng, scale=0.5)
    prompt = rng.integers(0, V - 3, size=20)
    y_lit = ft.DInference(l_gen=30, tau=0)(prompt, lit)
    y_til = ft.DInference(l_gen=30, tau=0)(prompt, til)
    np.testing.assert_array_equal(y_til, y_lit)


def test_config_and_save_load_keep_the_option(tmp_path):
    pytest.importorskip("safetensors")
    _, til = build("d")
    assert til.config["attention_impl"] == "tiled"
    default = ft.DTransformer(V, 16, 1, 2, 8, 8)
    assert default.config["attention_impl"] == "auto"
    ft.save(til, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    assert back.config["attention_impl"] == "tiled"
    x = np.arange(10) % (V - 3)
    np.testing.assert_array_equal(back(x), til(x))


def test_auto_equals_literal_on_both_sides_of_its_threshold(rng):
    """auto picks one of the two listings per call (tiled from 256 keys on): equal to literal either way."""
    auto = ft.DTransformer(V, 300, 1, 2, 8, 8, dtype="float64", seed=4)
    lit = ft.DTransformer(V, 300, 1, 2, 8, 8, dtype="float64", seed=4, attention_impl="literal")
    for l in (100, 270):
        x = rng.integers(0, V - 3, size=l)
        assert rel_err(auto(x), lit(x)) <= 1e-12
        assert rel_err(auto.attention_weights(0), lit.attention_weights(0)) <= 1e-12
