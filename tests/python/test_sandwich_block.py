"""Gemma's sandwich layers as a block (docs/variants.md V27; cpp/src/variants/sandwich_block.cpp and its registry
row): Algorithm 10's lines 5–8 with each sublayer's output normalised again before its residual add,
X ← X + norm(MHAttention(norm(X | γ¹)) | γ¹′), X ← X + norm(MLP(norm(X | γ²)) | γ²′). The core against reference.py
(float64 ≤ 1e-12, float32 ≤ 1e-5) and its gradients against torch autograd are test_variants.py's "sandwich" row,
Gemma's are test_gemma.py's; here: the definition, the parameters, finite differences with layer_norm's β′, dropout's
masks replayed, cached and batched decoding against the literal listing, and sandwich_norm (the option of earlier
versions, in keywords and saved files) read as the block."""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, randomize_theta, rel_err
from decoder_checks import (BLOCK_GRADIENT_OPTIONS, assert_decoding_equals_literal, assert_replayed_loss,
                            block_gradients_match_fd, dropped_run, dropped_sublayers)
from test_config import outputs, save_with_config

V = 13
SIZES = (V, 16, 2, 2, 8, 12)


def make(dtype="float64", **extra):
    return ft.DTransformer(*SIZES, dtype=dtype, seed=2, block="sandwich", **extra)


def test_the_block_is_its_definition():
    """reference.sandwich_block: X + post₁(attn(norm₁(X))), then + post₂(mlp(norm₂(X)))."""
    X = np.random.default_rng(0).standard_normal((4, 5))
    got = ref.sandwich_block(X, lambda A: 2 * A, lambda A: A ** 2, lambda Y: Y + 1, lambda Y: -Y, lambda Y: Y - 3,
                             lambda Y: 5 * Y)
    X1 = X + (2 * (X + 1) - 3)
    assert np.array_equal(got, X1 + 5 * (-X1) ** 2)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_forward_matches_the_reference_and_the_parameters_follow_algorithm_10s(dtype):
    model = make(dtype)
    theta = randomize_theta(model, np.random.default_rng(1))
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
    want = ref.d_transformer_variant(x, theta, L=2, H=2, block="sandwich")
    assert rel_err(model(x), want) <= TOL[dtype]
    assert rel_err(want, ref.d_transformer_variant(x, theta, L=2, H=2)) > 1e-3  # not the pre-LN layer
    plain = list(ft.DTransformer(*SIZES, dtype=dtype).params)  # the pre-LN layer's names and order, then γ′, β′
    post = [f"layers.{i}.{g}" for i in range(2) for g in ("gamma1_post", "beta1_post", "gamma2_post", "beta2_post")]
    assert [k for k in model.params if k not in post] == plain
    layer0 = [k for k in model.params if k.startswith("layers.0.")]
    assert layer0[-4:] == post[:4]
    assert all(k not in plain for k in post)
    fresh = make(dtype)
    assert (fresh.params["layers.1.gamma2_post"] == 1).all() and (fresh.params["layers.1.beta2_post"] == 0).all()


@pytest.mark.parametrize("extra", BLOCK_GRADIENT_OPTIONS)
def test_gradients_match_finite_differences(extra):
    block_gradients_match_fd(make(**extra), extra)


def test_dropout_masks_replay_through_the_reference():
    """With dropout, the block drops each sublayer's normalised output before the residual add (the pre-LN layer's
    sites): replaying the model's masks in a numpy transcription of the block gives its loss."""
    model = make(resid_dropout=0.3, attn_dropout=0.2)
    x = np.array([3, 1, 4, 1, 5, 9, 2])
    p, masks, X = dropped_run(model, x)
    l = len(x)
    for i in range(2):
        q = f"layers.{i}."
        attn, mlp = dropped_sublayers(p, masks, l, q)

        def norm(g):
            return lambda Y: ref.layer_norm_columns(Y, p[q + "gamma" + g], p[q + "beta" + g], 1e-5)

        X = ref.sandwich_block(X, attn, mlp, norm("1"), norm("2"),
                               lambda Y: ref.dropout(norm("1_post")(Y), masks[q + "attn.out"], 0.3),
                               lambda Y: ref.dropout(norm("2_post")(Y), masks[q + "mlp.out"], 0.3))
    assert_replayed_loss(model, p, X, x)


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_cached_and_batched_decoding_equal_the_literal_listing(positional):
    model = make(positional=positional)
    randomize_theta(model, np.random.default_rng(3))
    assert_decoding_equals_literal(model, full_forward=True)  # and the full forward's argmax at every step


def test_sandwich_norm_reads_as_the_block(tmp_path):
    a = ft.DTransformer(*SIZES, sandwich_norm=True, seed=5)
    b = ft.DTransformer(*SIZES, block="sandwich", seed=5)
    assert a.config == b.config and a.config["block"] == "sandwich" and "sandwich_norm" not in a.config
    assert ft.DTransformer(*SIZES, sandwich_norm=True, block="pre_ln", seed=5).config == b.config  # its norms
    assert ft.DTransformer(*SIZES, sandwich_norm=False).config["block"] == "pre_ln"
    assert ft.DTransformer(*SIZES, sandwich_norm=False, block="parallel").config["block"] == "parallel"
    with pytest.raises(ValueError, match="block='parallel' has no sandwich_norm"):
        ft.DTransformer(*SIZES, sandwich_norm=True, block="parallel")
    with pytest.raises(ValueError, match="sandwich_norm=False contradicts block='sandwich'"):
        ft.DTransformer(*SIZES, sandwich_norm=False, block="sandwich")
    with pytest.raises(TypeError, match="sandwich_norm must be True or False, got int"):
        ft.DTransformer(*SIZES, sandwich_norm=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sandwich_norm'"):
        ft.EDTransformer(V, 9, 1, 1, 2, 8, 12, sandwich_norm=True)
    # files of earlier versions: "sandwich_norm": true with no "block" (before blocks were parts), and with
    # "block": "pre_ln" beside it; both load as the block, with the same outputs
    randomize_theta(b, np.random.default_rng(1))
    for old in ({**{k: v for k, v in b.config.items() if k != "block"}, "sandwich_norm": True},
                {**b.config, "block": "pre_ln", "sandwich_norm": True}):
        save_with_config(b, old, tmp_path / "old.safetensors")
        got = ft.load(tmp_path / "old.safetensors")
        assert got.config == b.config and np.array_equal(outputs(got), outputs(b))
    with pytest.raises(TypeError, match="sandwich_norm must be True or False, got str"):
        ft.build_model({**b.config, "sandwich_norm": "yes"})


def test_only_a_decoder_takes_it():
    with pytest.raises(ValueError, match="block='sandwich' is a layer of the DTransformer, not of the ETransformer"):
        ft.ETransformer(V, 16, 1, 2, 8, 12, 8, block="sandwich")
    with pytest.raises(ValueError, match="block='sandwich' is a layer of the DTransformer, not of the EDTransformer"):
        ft.EDTransformer(V, 16, 1, 1, 2, 8, 12, block="sandwich")
    with pytest.raises(ValueError, match="mtp_depth .* block='sandwich'"):
        make(mtp_depth=1)
