"""GPT-NeoX's parallel residual (docs/variants.md V30), the worked example of a block added as one part
(cpp/src/variants/parallel_block.cpp and its registry row): X ← X + MHAttention(LN₁(X)) + MLP(LN₂(X)) in place of
Algorithm 10's lines 5–8. The core against reference.py (float64 ≤ 1e-12, float32 ≤ 1e-5) and its gradients
against torch autograd are test_variants.py's "parallel" and "neox" rows; here: the definition, finite differences,
dropout, cached, batched and paged decoding against the literal listing, saving, and the block's refusals."""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, randomize_theta, rel_err
from decoder_checks import (BLOCK_GRADIENT_OPTIONS, assert_decoding_equals_literal, assert_replayed_loss,
                            block_gradients_match_fd, dropped_run, dropped_sublayers)

V = 13


def make(dtype="float64", **extra):
    return ft.DTransformer(V, 16, 2, 2, 8, 12, dtype=dtype, seed=2, block="parallel", **extra)


def test_the_block_is_its_definition():
    """reference.parallel_block: X + attn(norm₁(X)) + mlp(norm₂(X)), both sublayers reading the layer's input."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, 5))
    got = ref.parallel_block(X, lambda A: 2 * A, lambda A: A ** 2, lambda Y: Y + 1, lambda Y: -Y)
    assert np.array_equal(got, X + 2 * (X + 1) + X ** 2)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_forward_matches_the_reference_and_differs_from_algorithm_10(dtype):
    model = make(dtype)
    theta = randomize_theta(model, np.random.default_rng(1))
    x = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
    want = ref.d_transformer_variant(x, theta, L=2, H=2, block="parallel")
    assert rel_err(model(x), want) <= TOL[dtype]
    assert rel_err(want, ref.d_transformer_variant(x, theta, L=2, H=2)) > 1e-3  # not the pre-LN layer
    same = ft.DTransformer(V, 16, 2, 2, 8, 12, dtype=dtype, seed=2)  # same parameters, names and order
    assert list(same.params) == list(model.params)


@pytest.mark.parametrize("extra", BLOCK_GRADIENT_OPTIONS)
def test_gradients_match_finite_differences(extra):
    block_gradients_match_fd(make(**extra), extra)


def test_dropout_masks_replay_through_the_reference():
    """With dropout, the block drops each sublayer's output before the residual add (the sites of the pre-LN
    layer): replaying the model's masks in a numpy transcription of the block gives its loss."""
    model = make(resid_dropout=0.3, attn_dropout=0.2)
    x = np.array([3, 1, 4, 1, 5, 9, 2])
    p, masks, X = dropped_run(model, x)
    l = len(x)
    for i in range(2):
        q = f"layers.{i}."
        attn, mlp = dropped_sublayers(p, masks, l, q)
        X = ref.parallel_block(
            X, lambda Xt: ref.dropout(attn(Xt), masks[q + "attn.out"], 0.3),
            lambda Xt: ref.dropout(mlp(Xt), masks[q + "mlp.out"], 0.3),
            lambda Y: ref.layer_norm_columns(Y, p[q + "gamma1"], p[q + "beta1"], 1e-5),
            lambda Y: ref.layer_norm_columns(Y, p[q + "gamma2"], p[q + "beta2"], 1e-5))
    assert_replayed_loss(model, p, X, x)


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_cached_batched_and_paged_decoding_equal_the_literal_listing(positional):
    model = make(positional=positional)
    randomize_theta(model, np.random.default_rng(3))
    assert_decoding_equals_literal(model, full_forward=True)  # and the full forward's argmax at every step


def test_saved_and_loaded(tmp_path):
    model = make()
    randomize_theta(model, np.random.default_rng(5))
    ft.save(model, tmp_path / "m.safetensors")
    got = ft.load(tmp_path / "m.safetensors")
    assert got.config == model.config and got.config["block"] == "parallel"
    x = np.array([1, 2, 3, 4, 5])
    assert np.array_equal(got(x), model(x))


def test_only_a_decoder_takes_it():
    with pytest.raises(ValueError, match="block='parallel' is a layer of the DTransformer, not of the ETransformer"):
        ft.ETransformer(V, 16, 1, 2, 8, 12, 8, block="parallel")
    with pytest.raises(ValueError, match="block='parallel' is a layer of the DTransformer, not of the EDTransformer"):
        ft.EDTransformer(V, 16, 1, 1, 2, 8, 12, block="parallel")
    with pytest.raises(ValueError, match="block must be 'pre_ln', 'post_ln', 'parallel' or 'sandwich', got 'neox'"):
        ft.DTransformer(V, 16, 1, 2, 8, 12, block="neox")


def test_sandwich_norms_are_not_the_parallel_blocks():
    # V27's second norms are the block 'sandwich' (the pre-LN layer's); sandwich_norm=True with block='parallel' is
    # refused by name
    with pytest.raises(ValueError, match="block='parallel' has no sandwich_norm"):
        ft.DTransformer(V, 16, 1, 2, 8, 12, block="parallel", sandwich_norm=True)
