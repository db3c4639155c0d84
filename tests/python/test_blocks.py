"""Blocks as parts (docs/design.md "Adding a block"): each stack's layer is a registered block chosen by the config's
`block` — Algorithm 10's "pre_ln" in a DTransformer, Algorithm 9's "post_ln" in an ETransformer, Algorithm 8's
"post_ln" layers or T5's "pre_ln" ones (V18a) in an EDTransformer; the names, their checks, the key in the JSON, and
`pre_norm`, the name earlier versions gave ED's pre-norm layers, read as the block."""
from __future__ import annotations

import json

import numpy as np
import pytest

import formal_transformers as ft
from conftest import randomize_theta
from test_config import outputs, save_with_config

V = 11
D_SIZES = (V, 9, 1, 2, 8, 12)
E_SIZES = (V, 9, 1, 2, 8, 12, 8)
ED_SIZES = (V, 9, 1, 1, 2, 8, 12)
T5 = dict(norm="rms", bias=False, scale_scores=False)


def test_each_architecture_takes_its_listings_block_by_default():
    for make, sizes, block in ((ft.DTransformer, D_SIZES, "pre_ln"), (ft.ETransformer, E_SIZES, "post_ln"),
                               (ft.EDTransformer, ED_SIZES, "post_ln")):
        m = make(*sizes)
        assert m.config["block"] == block
        assert ft.model_options(m.config["arch"])["block"] == {"kind": "enum", "default": block,
                                                               "archs": ["DTransformer", "ETransformer", "EDTransformer"]}
        given = make(*sizes, block=block, seed=m.config["seed"])
        assert given.config == m.config
        assert all(np.array_equal(given.params[k], v) for k, v in m.params.items())
        assert f"block='{block}'" in repr(m)


def test_a_block_is_checked_by_its_row():
    with pytest.raises(ValueError, match="block='post_ln' is a layer of the ETransformer and EDTransformer, not of "
                                         "the DTransformer"):
        ft.DTransformer(*D_SIZES, block="post_ln")
    with pytest.raises(ValueError, match="block='pre_ln' is a layer of the DTransformer and EDTransformer, not of "
                                         "the ETransformer"):
        ft.ETransformer(*E_SIZES, block="pre_ln")
    with pytest.raises(ValueError, match="block must be 'pre_ln'.*'post_ln'.*got 'bogus'"):
        ft.DTransformer(*D_SIZES, block="bogus")
    with pytest.raises(TypeError, match="block must be a str, got int"):
        ft.EDTransformer(*ED_SIZES, block=1)
    with pytest.raises(ValueError, match="block='post_ln' is a layer of"):  # a file's config is checked the same way
        ft.build_model({**ft.DTransformer(*D_SIZES).config, "block": "post_ln"})


def test_an_ed_models_blocks_choose_its_layers_and_final_norms():
    post = ft.EDTransformer(*ED_SIZES, seed=4)
    pre = ft.EDTransformer(*ED_SIZES, block="pre_ln", seed=4)
    assert "enc.gamma" not in post.params and "enc.gamma" in pre.params and "dec.gamma" in pre.params
    assert "dec.0.gamma5" in post.params and "dec.0.gamma5" not in pre.params
    z, x = np.array([3, 4, 1]), np.array([1, 5, 2, 0])
    assert not np.allclose(post(z, x), pre(z, x))


def test_pre_norm_of_earlier_versions_names_the_block(tmp_path):
    a = ft.EDTransformer(*ED_SIZES, pre_norm=True, **T5, seed=5, dtype="float64")
    b = ft.EDTransformer(*ED_SIZES, block="pre_ln", **T5, seed=5, dtype="float64")
    assert a.config == b.config and a.config["block"] == "pre_ln" and "pre_norm" not in a.config
    assert ft.EDTransformer(*ED_SIZES, pre_norm=False).config["block"] == "post_ln"
    with pytest.raises(TypeError, match="multiple values for argument 'block'"):
        ft.EDTransformer(*ED_SIZES, pre_norm=True, block="pre_ln")
    with pytest.raises(TypeError, match="pre_norm must be True or False, got str"):
        ft.EDTransformer(*ED_SIZES, pre_norm="yes")
    with pytest.raises(TypeError, match="unexpected keyword argument 'pre_norm'"):
        ft.DTransformer(*D_SIZES, pre_norm=True)
    # a file of an earlier version: "pre_norm": true where "block" is now, at the same place in the JSON
    randomize_theta(b, np.random.default_rng(1))
    old = {("pre_norm" if k == "block" else k): (True if k == "block" else v) for k, v in b.config.items()}
    assert list(old).index("pre_norm") == list(b.config).index("block")
    save_with_config(b, old, tmp_path / "old.safetensors")
    got = ft.load(tmp_path / "old.safetensors")
    assert got.config == b.config and np.array_equal(outputs(got), outputs(b))
    ft.save(got, tmp_path / "new.safetensors")
    again = ft.load(tmp_path / "new.safetensors")
    assert again.config == b.config and np.array_equal(outputs(again), outputs(b))


def test_the_block_sits_where_pre_norm_was_in_the_json():
    keys = list(json.loads(ft.EDTransformer(*ED_SIZES).config_json()))
    assert keys[keys.index("block") + 1:keys.index("block") + 3] == ["scale_scores", "unembed_rescale"]
    keys_d = list(json.loads(ft.DTransformer(*D_SIZES).config_json()))
    assert keys_d[keys_d.index("block") + 1] == "fixnorm" and keys_d[-1] == "dtype"
