"""Dropout on the attention weights is a part around the head kernel (variants/attention_dropout.cpp): one rule
refuses every kernel that forms no weights, with one message; V25's softcap kernel forms them (a training step
against reference.gemma_transformer with the model's masks, its gradients against central differences); BigBird's dense runs ('literal', and 'tiled' whose
tiles draw the same masks) take it; the option keeps its keyword, JSON key and place."""
import numpy as np
import pytest

import formal_transformers as ft

from formal_transformers import reference as ref
from conftest import numeric_grad, randomize_theta, rel_err

V = 19


@pytest.mark.parametrize("kind, kwargs", [
    ("performer", dict(attention="performer")),
    ("rfa", dict(attention="rfa")),
    ("bigbird", dict(attention="bigbird", block_size=4)),
])
def test_one_rule_refuses_every_kernel_that_forms_no_weights(kind, kwargs):
    make = ft.ETransformer if kind == "bigbird" else ft.DTransformer
    sizes = (V, 96, 1, 2, 8, 12, 8) if kind == "bigbird" else (V, 96, 1, 2, 8, 12)
    make(*sizes, **kwargs)  # the kernel alone is fine
    msg = (f"attn_dropout = 0.1 drops attention weights, which the '{kind}' head kernel does not form "
           r"\(kernels that do: 'softmax', 'softcap', 'sigmoid'\): attn_dropout must be 0")
    with pytest.raises(ValueError, match=msg):
        make(*sizes, attn_dropout=0.1, **kwargs)
    with pytest.raises(ValueError, match=msg):  # `dropout` sets the weights' rate too
        make(*sizes, dropout=0.1, **kwargs)
    make(*sizes, dropout=0.1, attn_dropout=0.0, **kwargs)  # the other places drop


# a Gemma 2 decoder (reference.gemma_transformer's parts: V25's softcap kernel, local and global layers, sandwich
# norms, GeGLU) with dropout on its attention weights
SOFTCAP = dict(positional="rope", rope_theta=500.0, mlp="geglu", bias=False, norm="rms1p", eps=1e-6, block="sandwich",
               sliding_window=3, sliding_window_pattern=2, query_pre_attn_scalar=6.0, attn_logit_softcapping=2.0,
               attn_dropout=0.3)


@pytest.mark.parametrize("kwargs", [{}, dict(attn_logit_softcapping=None), dict(query_pre_attn_scalar=None)],
                         ids=["both", "scale", "cap"])
def test_softcap_drops_its_weights_as_the_reference(kwargs):
    """The 'softcap' kernel forms its weights: a training step's loss is reference.gemma_transformer's with the
    step's masks on the weights (float64, ≤ 1e-12), the evaluating loss is the reference's without them."""
    model = ft.DTransformer(V, 16, 2, 4, 16, 20, dtype="float64", seed=2, H_kv=2, **{**SOFTCAP, **kwargs})
    c = model.config
    assert c["attn_dropout"] == 0.3
    theta = randomize_theta(model, np.random.default_rng(1))
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
    hp = dict(L=2, H=4, eps=1e-6, rope_theta=500.0, sliding_window=3, sliding_window_pattern=2,
              query_pre_attn_scalar=c["query_pre_attn_scalar"], attn_logit_softcapping=c["attn_logit_softcapping"])

    def ref_loss(**drop):
        logP = np.log(ref.gemma_transformer(x, theta, **hp, **drop))
        return -sum(logP[x[t + 1], t] for t in range(len(x) - 1))

    model.dropout_step = 5
    loss, _ = model.loss_and_grad(x)
    masks = model.dropout_masks()
    assert sorted(masks) == ["layers.0.attn.weights", "layers.1.attn.weights"]
    assert all(not np.all(masks[k][0]) for k in masks)
    want = ref_loss(masks=masks, rates=c)
    assert abs(loss - want) <= 1e-12 * abs(want)
    evaluating = model.loss(x)
    assert abs(evaluating - ref_loss()) <= 1e-12 * abs(evaluating)
    assert abs(loss - evaluating) > 1e-6


def test_softcap_dropout_gradients_match_finite_differences():
    """Every gradient of a training step through the dropped softcap weights against central differences of the
    same step's loss (its masks replayed)."""
    model = ft.DTransformer(V, 12, 1, 2, 8, 10, dtype="float64", seed=2, H_kv=1, **SOFTCAP)
    randomize_theta(model, np.random.default_rng(2))
    x = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 7]

    def step_loss():
        model.dropout_step = 2
        return model.loss_and_grad(x)[0]

    model.dropout_step = 2
    loss, grads = model.loss_and_grad(x)
    assert not np.all(model.dropout_masks()["layers.0.attn.weights"][0])
    assert abs(loss - model.loss(x)) > 1e-6  # (evaluating: no dropout)
    assert set(grads) == set(model.params)
    for k, view in model.params.items():
        num = numeric_grad(step_loss, view, h=1e-5)
        assert rel_err(grads[k], num) <= 1e-7, (k, rel_err(grads[k], num))


def test_bigbird_tiled_drops_the_weights_as_the_literal_listing():
    """BigBird's layouts run densely with attention_impl 'literal' or 'tiled' (the block-sparse kernel of 'auto' forms
    no weights): the tiled kernel draws the literal path's masks, so the same losses, gradients and masks."""
    models = [ft.ETransformer(V, 96, 1, 2, 8, 12, 8, dtype="float64", seed=3, attention="bigbird", block_size=2,
                              n_random_blocks=1, n_global_blocks=1, window_blocks=3, layout_seed=7, attention_impl=impl,
                              attn_dropout=0.3) for impl in ("literal", "tiled")]
    rng = np.random.default_rng(4)
    for k, v in models[0].params.items():
        val = rng.normal(0, 0.4, v.shape)
        for m in models:
            m.params[k][...] = val
    x = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 7, 8, 11, 2]
    xt = list(x)
    xt[2] = xt[9] = models[0].mask_token
    for step in (0, 3):
        for m in models:
            m.dropout_step = step
        (L_lit, g_lit), (L_til, g_til) = (m.loss_and_grad(xt, x) for m in models)
        assert abs(L_til - L_lit) <= 1e-12 * abs(L_lit)
        for k in g_lit:
            assert rel_err(g_til[k], g_lit[k]) <= 1e-12 or np.max(np.abs(g_lit[k])) < 1e-14, k
        m_lit, m_til = (m.dropout_masks() for m in models)
        assert sorted(m_lit) == sorted(m_til) == ["layers.0.attn.weights"]
        for a, b in zip(m_til["layers.0.attn.weights"], m_lit["layers.0.attn.weights"]):
            np.testing.assert_array_equal(a, b)
            assert not np.all(b)
    assert models[0].loss(xt, x) == models[0].loss(xt, x)  # evaluating: no masks drawn


def test_the_option_keeps_its_keyword_json_key_and_place():
    for make, sizes in ((ft.DTransformer, (V, 16, 1, 2, 8, 12)), (ft.ETransformer, (V, 16, 1, 2, 8, 12, 8)),
                        (ft.EDTransformer, (V, 16, 1, 1, 2, 8, 12))):
        m = make(*sizes, dropout=0.2, attn_dropout=0.1)
        keys = list(m.config)
        i = keys.index("attn_dropout")
        assert keys[i - 1:i + 2] == ["embed_dropout", "attn_dropout", "resid_dropout"]
        assert m.config["attn_dropout"] == 0.1 and m.config["embed_dropout"] == 0.2
        assert ft.model_options(make.__name__)["attn_dropout"]["default"] == 0.0
        assert "attn_dropout=None" in make.__init__.__doc__
        assert make(*sizes, dropout=0.2).config["attn_dropout"] == 0.2
