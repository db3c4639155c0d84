"""Arguments every constructor shares are parsed by one function each: a seed is any int in [0, 2**64) for a
component exactly as for a model (components used to take only [0, 2**63)); an explicit attention mask's
shape is checked by the core's Mask::check, with the same message for a stand-alone layer."""
from __future__ import annotations

import numpy as np
import pytest

import formal_transformers as ft

COMPONENTS = [
    lambda seed: ft.TokenEmbedding(5, 3, seed=seed),
    lambda seed: ft.PositionalEmbedding(5, 3, seed=seed),
    lambda seed: ft.Unembedding(5, 3, seed=seed),
    lambda seed: ft.BasicAttention(3, 2, 4, seed=seed),
    lambda seed: ft.Attention(3, 3, 2, 4, seed=seed),
    lambda seed: ft.MHAttention(2, 3, 3, 2, 2, 4, seed=seed),
    lambda seed: ft.DTransformer(5, 4, 1, 1, 4, 4, seed=seed),
]


@pytest.mark.parametrize("make", COMPONENTS)
def test_seed_range_is_the_same_everywhere(make):
    a, b = make(2**64 - 1), make(2**64 - 1)
    for k, v in a.params.items():
        np.testing.assert_array_equal(v, b.params[k])  # the seed is used, deterministically
    assert any(not np.array_equal(v, make(2**63).params[k]) for k, v in a.params.items())
    with pytest.raises(ValueError, match="seed"):
        make(2**64)
    with pytest.raises(ValueError, match="seed"):
        make(-1)
    with pytest.raises(TypeError, match="seed"):
        make(True)
    with pytest.raises(TypeError, match="seed"):
        make(1.5)


def test_explicit_mask_shape_is_checked_once_by_the_core():
    mask = np.ones((4, 5), dtype=bool)
    for layer in [ft.Attention(3, 3, 2, 4, mask=mask), ft.MHAttention(2, 3, 3, 2, 2, 4, mask=mask)]:
        layer(np.ones((3, 5)), np.ones((3, 4)))  # (l_z, l_x) = (4, 5): fits
        with pytest.raises(ValueError, match=r"mask has shape \(4, 5\) but this attention has \(l_z, l_x\) = \(4, 6\)"):
            layer(np.ones((3, 6)), np.ones((3, 4)))


@pytest.mark.parametrize("make", [
    lambda eps: ft.LayerNorm(4, eps=eps),
    lambda eps: ft.RMSNorm(4, eps=eps),
    lambda eps: ft.DTransformer(5, 4, 1, 1, 4, 4, eps=eps),
    lambda eps: ft.DTransformer(5, 4, 1, 1, 4, 4, eps=eps, norm="rms"),
    lambda eps: ft.ETransformer(5, 4, 1, 1, 4, 4, 4, eps=eps),
    lambda eps: ft.EDTransformer(5, 4, 1, 1, 1, 4, 4, eps=eps),
])
def test_eps_is_checked_by_the_core_with_its_value(make):
    """eps < 0 or NaN: a ValueError naming eps and the value given (one check, in the core)."""
    make(0.0)  # the listing exactly
    with pytest.raises(ValueError, match=r"eps must be >= 0, got -0\.5"):
        make(-0.5)
    with pytest.raises(ValueError, match=r"eps must be >= 0, got -?nan"):
        make(float("nan"))
