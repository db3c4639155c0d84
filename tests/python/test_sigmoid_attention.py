"""attention="sigmoid" (Ramapuram et al. 2024, "Theory, Analysis, and Best Practices for Sigmoid Self-Attention",
arXiv 2409.04431; cpp/src/variants/sigmoid_attention.cpp): A = σ(S/√d_attn + b) with b = −log ℓ_z, masked entries 0,
no normalisation over the keys. The core against reference.py (float64 ≤ 1e-12, float32 ≤ 1e-5) in DTransformer
(causal, ALiBi) and ETransformer (bidirectional), its attention_weights against the formula, every gradient against
central differences and PyTorch autograd of an independent transcription (torch_variants.py), attention dropout
around it (it forms its weights), cached decoding against the literal generation, and the options it refuses."""
from __future__ import annotations

import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, numeric_grad, randomize_theta, rel_err, torch_or_skip


def d_model(dtype="float64", L=2, H=2, d_e=8, l_max=40, **kw):
    return ft.DTransformer(19, l_max, L, H, d_e, 12, dtype=dtype, seed=3, attention="sigmoid", **kw)


def e_model(dtype="float64", L=2, H=2, d_e=8, l_max=40, **kw):
    return ft.ETransformer(19, l_max, L, H, d_e, 12, 8, dtype=dtype, seed=3, attention="sigmoid", **kw)


def randomize(model, rng):
    return randomize_theta(model, rng, unit=(), spread=0.2, scale=0.8)


def test_the_option_takes_the_name_and_writes_it_back():
    model = d_model()
    assert model.config["attention"] == "sigmoid"
    assert "attention='sigmoid'" in repr(model)
    with pytest.raises(ValueError, match="attention must be one of 'softmax', .*'sigmoid'"):
        ft.DTransformer(19, 40, 1, 2, 8, 12, attention="sigmoids")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("positional", ["learned", "alibi"])
def test_dtransformer_matches_reference(dtype, positional):
    model = d_model(dtype, positional=positional)
    theta = randomize(model, np.random.default_rng(1))
    rng = np.random.default_rng(2)
    for l in (1, 6, 33):
        x = rng.integers(0, 19, size=l)
        want = ref.d_transformer_variant(x, theta, L=2, H=2, positional=positional, attention="sigmoid")
        assert rel_err(model(x), want) <= TOL[dtype], (l, rel_err(model(x), want))
    xs = [rng.integers(0, 19, size=n) for n in (12, 3, 30)]  # a ragged batch: each sequence its own ℓ_z
    P = model(xs)
    for b, s in enumerate(xs):
        want = ref.d_transformer_variant(s, theta, L=2, H=2, positional=positional, attention="sigmoid")
        assert rel_err(np.asarray(P[b])[:, :len(s)], want) <= TOL[dtype]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_etransformer_matches_reference(dtype):
    model = e_model(dtype)
    theta = randomize(model, np.random.default_rng(3))
    x = np.random.default_rng(4).integers(0, 19, size=25)
    want = ref.e_transformer(x, theta, L=2, H=2, attention="sigmoid", features=[None, None])
    assert rel_err(model(x), want) <= TOL[dtype]


def test_weights_are_the_formula():
    """attention_weights of a one-layer model: σ(S/√d_attn − log ℓ) on the causal entries, 0 above; no column sums
    to 1."""
    model = d_model(L=1)
    theta = randomize(model, np.random.default_rng(5))
    x = np.random.default_rng(6).integers(0, 19, size=17)
    model(x)
    A = model.attention_weights(0)
    X = np.stack([theta["W_e"][:, t] + theta["W_p"][:, i] for i, t in enumerate(x)], axis=1)
    Xt = ref.layer_norm_columns(X, theta["layers.0.gamma1"], theta["layers.0.beta1"], 1e-5)
    a = "layers.0.attn."
    for h in range(2):
        Q = theta[a + "W_q"][h] @ Xt + theta[a + "b_q"][h][:, None]
        K = theta[a + "W_k"][h] @ Xt + theta[a + "b_k"][h][:, None]
        S = K.T @ Q / math.sqrt(4)
        want = np.where(ref.unidirectional_mask(17, 17), 1 / (1 + np.exp(-(S - math.log(17)))), 0.0)
        assert rel_err(A[h], want) <= 1e-12
        assert np.abs(A[h].sum(axis=0) - 1).max() > 1e-3


@pytest.mark.parametrize("arch", ["D", "E"])
def test_every_gradient_matches_finite_differences(arch):
    model = d_model(L=1, l_max=12, positional="alibi") if arch == "D" else e_model(L=1, l_max=12)
    randomize(model, np.random.default_rng(7))
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
        num = numeric_grad(loss, view, h=1e-5)
        assert rel_err(grads[k], num) <= 1e-7, (k, rel_err(grads[k], num))


@pytest.mark.parametrize("opts", [dict(), dict(positional="alibi"), dict(positional="rope", H_kv=1, bias=False),
                                  dict(H=4, d_e=16, H_kv=2)])
def test_every_gradient_matches_torch_autograd(opts):
    torch_or_skip()
    import torch_variants as tv

    opts = dict(opts)
    H, d_e = opts.pop("H", 2), opts.pop("d_e", 8)
    model = d_model(H=H, d_e=d_e, **opts)
    theta = randomize(model, np.random.default_rng(8))
    batch = [list(np.random.default_rng(9).integers(0, 19, size=30)), [8, 9, 7, 9, 3]]
    loss, grads = model.loss_and_grad(batch)
    t_loss, t_grads = tv.loss_and_grad(theta, batch, L=2, H=H, positional=opts.get("positional", "learned"),
                                       attention="sigmoid")
    assert abs(loss - t_loss) <= 1e-10 * abs(t_loss)
    assert set(t_grads) == set(grads)
    for k, g in t_grads.items():
        assert rel_err(grads[k], g) <= 1e-8, (k, rel_err(grads[k], g))


def test_attention_dropout_wraps_it():
    """It forms its weights, so attn_dropout drops them (the kernel wrapper): a training step draws masks on the
    weights, its loss differs from the evaluation's, and its gradients match central differences of the same step's
    loss (its masks replayed)."""
    model = d_model(L=1, l_max=12, attn_dropout=0.3)
    randomize(model, np.random.default_rng(10))
    x = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 7]

    def step_loss():
        model.dropout_step = 2
        return model.loss_and_grad(x)[0]

    model.dropout_step = 2
    loss, grads = model.loss_and_grad(x)
    masks = model.dropout_masks()
    assert sorted(masks) == ["layers.0.attn.weights"]
    assert not np.all(masks["layers.0.attn.weights"][0])
    assert abs(loss - model.loss(x)) > 1e-6  # (evaluating: no dropout)
    for k, view in model.params.items():
        num = numeric_grad(step_loss, view, h=1e-5)
        assert rel_err(grads[k], num) <= 1e-7, (k, rel_err(grads[k], num))


def test_cached_decoding_equals_the_literal_generation():
    """b = −log ℓ_z counts the keys of the call: decoding one token at a time with the KV cache gives the literal
    listing's tokens (each step a forward over the prefix)."""
    model = d_model(l_max=30)
    randomize(model, np.random.default_rng(11))
    x = [3, 1, 4, 1, 5]
    cached = ft.DInference(l_gen=12, tau=0)(x, model)
    literal = ft.DInference(l_gen=12, tau=0, cache=False)(x, model)
    np.testing.assert_array_equal(cached, literal)


@pytest.mark.parametrize("kwargs, match", [
    (dict(attention_impl="tiled"), "attention='sigmoid' has no tiled form"),
    (dict(sliding_window=4), "not with the sliding_window mask"),
    (dict(mtp_depth=1), "mtp_depth"),
])
def test_what_it_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        d_model(**kwargs)


def test_speculative_decoding_refuses_it_by_name():
    """b counts the keys of each call, so a verify call over k drafted tokens differs from k single steps: speculative
    decoding is refused with a ValueError naming the kernel, in either seat, and the models are unchanged."""
    sig = d_model(l_max=40)
    exact = ft.DTransformer(19, 40, 1, 2, 8, 12, dtype="float64", seed=3)
    before = {k: np.array(v) for k, v in sig.params.items()}
    for target, draft, seat in ((exact, sig, "draft"), (sig, exact, "target")):
        with pytest.raises(ValueError, match=f"the {seat}'s attention='sigmoid' does not keep"):
            ft.SpeculativeInference(5, 2, 0.0)([1, 2, 3], target, draft)
    for k, v in sig.params.items():
        np.testing.assert_array_equal(v, before[k])
