"""Chunked attention (docs/variants.md V19; Llama 4's attention_chunk_size), the worked example of a variant added
as one part (cpp/src/variants/chunked_mask.cpp and its registry row): the mask of reference.py against its
definition and Hugging Face's, the core against reference.py (float64 ≤ 1e-12, float32 ≤ 1e-5), gradients against
finite differences, cached, batched and tiled decoding against the full forward, saving, and bad options."""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, assert_grads_match_fd, randomize_theta, rel_err

V = 13


def make(C, dtype="float64", **extra):
    return ft.DTransformer(V, 16, 2, 2, 8, 12, dtype=dtype, seed=2, attention_chunk_size=C, **extra)


def test_chunked_mask_sees_its_own_chunk_up_to_itself():
    l = 11
    for C in (1, 3, 4, 11, 20):
        M = ref.chunked_mask(l, l, C)
        for t_z in range(l):
            for t_x in range(l):
                assert M[t_z, t_x] == (t_z // C == t_x // C and t_z <= t_x)
        assert (ref.chunked_mask(l, 3, C, q0=5) == M[:, 5:8]).all()  # queries at q0 (a cache): the full mask's columns
    assert (ref.chunked_mask(l, l, l) == ref.unidirectional_mask(l, l)).all()
    assert (ref.chunked_mask(l, l, 1) == np.eye(l, dtype=bool)).all()
    with pytest.raises(ValueError, match="attention_chunk_size"):
        ref.chunked_mask(l, l, 0)


def test_chunked_mask_follows_hugging_face_convention():
    torch = pytest.importorskip("torch")
    mu = pytest.importorskip("transformers.masking_utils")
    l = 10
    for C in (2, 3, 7):
        f = mu.and_masks(mu.chunked_causal_mask_function(C, torch.zeros(1, dtype=torch.long)), mu.causal_mask_function)
        t = torch.tensor
        hf = np.array([[bool(f(t(0), t(0), t(q), t(k))) for k in range(l)] for q in range(l)])  # [q, kv]
        assert (ref.chunked_mask(l, l, C) == hf.T).all(), C  # ours is [t_z, t_x] = [kv, q]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("C", [1, 3, 5])
def test_forward_and_loss_match_the_reference(C, dtype):
    model = make(C, dtype)
    theta = randomize_theta(model, np.random.default_rng(1))
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
    want = ref.d_transformer(x, theta, L=2, H=2, attention_chunk_size=C)
    assert rel_err(model(x), want) <= TOL[dtype]
    # the chunks matter: the causal model differs (C < ℓ)
    assert rel_err(want, ref.d_transformer(x, theta, L=2, H=2)) > 1e-6
    # the attention weights are zero outside the chunks (layer 1, sequence 0), and each column sums to 1
    A = model.attention_weights(1, 0)
    outside = ~ref.chunked_mask(len(x), len(x), C)
    assert (A[:, outside] == 0).all() and np.allclose(A.sum(axis=1), 1.0, atol=1e-5)


def test_gradients_match_finite_differences():
    model = make(3)
    randomize_theta(model, np.random.default_rng(2))
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    loss, grads = model.loss_and_grad(x)
    assert abs(loss - model.loss(x)) <= 1e-12 * abs(loss)
    assert_grads_match_fd(model, grads, lambda: model.loss(x))


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_decoding_with_the_cache_equals_the_literal_listing(positional):
    model = make(3, positional=positional)
    randomize_theta(model, np.random.default_rng(3))
    prompts = [np.array([1, 2, 3, 4]), np.array([5]), np.array([7, 8, 9, 10, 11, 0, 1])]
    for p in prompts:
        literal = ft.DInference(8, 0.0, cache=False)(p, model)
        assert np.array_equal(ft.DInference(8, 0.0)(p, model), literal)
    batched = ft.DInference(8, 0.0)(prompts, model)
    assert all(np.array_equal(b, ft.DInference(8, 0.0, cache=False)(p, model)) for b, p in zip(batched, prompts))


def test_tiled_attention_equals_the_literal_listing():
    x = np.arange(16) % V
    lit, til = make(5, attention_impl="literal"), make(5, attention_impl="tiled")
    theta = randomize_theta(lit, np.random.default_rng(4))
    for k, v in theta.items():
        til.params[k] = v
    assert rel_err(til(x), lit(x)) <= 1e-12
    _, g_lit = lit.loss_and_grad(x)
    _, g_til = til.loss_and_grad(x)
    assert max(rel_err(g_til[k], g_lit[k]) for k in g_lit if not k.endswith(".b_k")) <= 1e-10


def test_the_option_is_the_parts_and_round_trips(tmp_path):
    model = make(4)
    assert model.config["attention_chunk_size"] == 4
    assert ft.build_model(model.config_json()).config == model.config
    ft.save(model, tmp_path / "m.safetensors")
    back = ft.load(tmp_path / "m.safetensors")
    x = np.array([1, 2, 3, 4, 5, 6, 7])
    assert back.config == model.config and np.array_equal(back(x), model(x))
    assert ft.DTransformer(V, 16, 2, 2, 8, 12).config["attention_chunk_size"] is None  # off: Algorithm 10's mask
    assert "attention_chunk_size" in ft.model_options("DTransformer")


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(attention_chunk_size=0), ValueError, "attention_chunk_size must be a positive integer"),
    (dict(attention_chunk_size=-2), ValueError, "attention_chunk_size"),
    (dict(attention_chunk_size=2.5), TypeError, "attention_chunk_size"),
    (dict(attention_chunk_size=3, mask="prefix"), ValueError, "attention_chunk_size is an option of the 'chunked' mask"),
    (dict(attention_chunk_size=3, sliding_window=4), ValueError, "an option of the"),
])
def test_bad_options_name_themselves(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ft.DTransformer(V, 16, 2, 2, 8, 12, **kwargs)
    with pytest.raises(TypeError, match="attention_chunk_size"):
        ft.ETransformer(V, 16, 2, 2, 8, 12, 8, attention_chunk_size=3)


def test_export_to_hugging_face_refuses_it_by_name():
    with pytest.raises(ValueError, match="attention_chunk_size"):
        ft.to_hf(make(3))
