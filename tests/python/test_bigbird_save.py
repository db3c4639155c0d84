"""attention="bigbird" through ft.save / ft.load (docs/variants.md V17, docs/api.md "Saving"): given layouts
(set_bigbird_layouts, ft.from_hf) are kept in the file, every given length, layer and head with its
multiplicities, so the loaded model uses the same layouts and gives the same outputs bit for bit; a model without
given layouts writes the file as before. bigbird_draw: a BigBird file written before it existed (no such option in
its config) loads with the rule it was drawn with, every head the layer's one layout (head 0's draw), and so gives
its old outputs (against reference.py with those layouts); new files keep the per-head draws."""
from __future__ import annotations

import json

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import io as ftio
from formal_transformers import reference as ref
from conftest import hf_random_float64, randomize_theta, rel_err, torch_or_skip

BASE_KEYS = {"formal_transformers.format", "formal_transformers.config", "formal_transformers.dropout_step",
             "formal_transformers.dropout_seed"}


def e_model(dtype="float64", impl="auto", **kw):
    return ft.ETransformer(19, 96, 2, 3, 12, 12, 8, dtype=dtype, seed=3, attention="bigbird", block_size=3,
                           n_random_blocks=2, n_global_blocks=1, window_blocks=3, layout_seed=5,
                           attention_impl=impl, **kw)


def rewrite(path, fn):
    """The file at `path` with its metadata replaced by fn(metadata) (the tensors kept)."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata())
    tensors = load_file(str(path))
    save_file(tensors, str(path), metadata=fn(meta))


def without_bigbird_draw(meta):
    """A file as written before bigbird_draw existed: the option absent from its config."""
    cfg = json.loads(meta["formal_transformers.config"])
    del cfg["bigbird_draw"]
    meta["formal_transformers.config"] = json.dumps(cfg)
    return meta


def multiplicities(rng, L, H, n):
    """Layouts (L, H, n, n) of multiplicities 0…2: every query block reads its own block, some blocks twice."""
    lay = rng.choice([0, 0, 0, 1, 2], size=(L, H, n, n)).astype(np.uint8)
    idx = np.arange(n)
    lay[:, :, idx, idx] = np.maximum(lay[:, :, idx, idx], 1)
    assert (lay >= 2).any()
    return lay


def test_given_layouts_survive_save_and_load(tmp_path):
    rng = np.random.default_rng(11)
    model = e_model()
    randomize_theta(model, rng, unit=(), spread=0.2, scale=0.5)
    per_head = multiplicities(rng, 2, 3, 8)  # 8 blocks: one per layer and head, with repeated blocks (auto only)
    per_layer = rng.random((2, 10, 10)) < 0.4  # 10 blocks: one per layer for all its heads, 0/1
    per_layer[:, np.arange(10), np.arange(10)] = True
    model.set_bigbird_layouts(per_head)
    model.set_bigbird_layouts(per_layer)
    xs = [rng.integers(0, 16, size=n * 3) for n in (8, 10, 9)]  # 9 blocks: drawn, not given
    before = [model(x) for x in xs]
    ft.save(model, tmp_path / "m")
    meta = ftio.read_metadata(tmp_path / "m")
    stored = json.loads(meta[ftio.LAYOUTS])
    assert sorted(stored) == ["10", "8"] and len(stored["8"][1]) == 3 and len(stored["10"][1]) == 1  # as given
    back = ft.load(tmp_path / "m")
    for n, want in ((8, per_head), (10, np.repeat(per_layer[:, None], 3, axis=1))):
        got = back.bigbird_layouts(n)
        assert got.dtype == model.bigbird_layouts(n).dtype and np.array_equal(got, want), n
    assert np.array_equal(back.bigbird_layouts(9), model.bigbird_layouts(9))  # drawn from layout_seed again
    assert back.bigbird_layouts_json() == model.bigbird_layouts_json()
    for x, b in zip(xs, before):
        assert np.array_equal(back(x), b)  # bit for bit
    # in float32 too (the layouts do not depend on the dtype)
    back32 = ft.load(tmp_path / "m", dtype="float32")
    assert np.array_equal(back32.bigbird_layouts(8), per_head)
    assert rel_err(back32(xs[0]), before[0]) <= 1e-5


def test_layouts_given_without_the_file_are_lost_and_the_file_is_what_keeps_them(tmp_path):
    """The check fails without the fix: a model rebuilt from the config alone draws other layouts."""
    rng = np.random.default_rng(12)
    model = e_model()
    randomize_theta(model, rng, unit=(), spread=0.2, scale=0.5)
    lay = multiplicities(rng, 2, 3, 8) > 0
    model.set_bigbird_layouts(lay)
    x = rng.integers(0, 16, size=24)
    fresh = ft.build_model(model.config)
    fresh.params.update({k: np.array(v) for k, v in model.params.items()})
    assert not np.array_equal(fresh.bigbird_layouts(8), lay) and rel_err(fresh(x), model(x)) > 1e-3
    ft.save(model, tmp_path / "m")
    assert np.array_equal(ft.load(tmp_path / "m")(x), model(x))


def test_a_model_without_given_layouts_saves_as_before(tmp_path):
    model = e_model()
    assert model.bigbird_layouts_json() == ""
    model.bigbird_layouts(8)  # drawn (and kept) layouts are not given ones
    assert model.bigbird_layouts_json() == ""
    ft.save(model, tmp_path / "m")
    assert set(ftio.read_metadata(tmp_path / "m")) == BASE_KEYS
    plain = ft.ETransformer(19, 96, 2, 3, 12, 12, 8)
    assert plain.bigbird_layouts_json() == ""
    ft.save(plain, tmp_path / "p")
    assert set(ftio.read_metadata(tmp_path / "p")) == BASE_KEYS
    assert ft.load(tmp_path / "p").config == plain.config


def test_from_hf_layouts_survive_save_and_load(tmp_path):
    torch = torch_or_skip()
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BigBirdConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=96, attention_type="block_sparse",
                                     block_size=4, num_random_blocks=2, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, hidden_act="gelu_new", sep_token_id=None)
    hf = hf_random_float64(transformers.BigBirdForMaskedLM, cfg).eval()  # eval: every random block is block 0
    model = ft.from_hf(hf, bigbird_lengths=[48])
    x = np.random.default_rng(3).integers(1, 37, size=48)
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(x[None])).logits[0].numpy().T
    assert rel_err(model.logits(x), want) <= 1e-12
    ft.save(model, tmp_path / "bb")
    back = ft.load(tmp_path / "bb")
    assert back.bigbird_layouts(12).max() >= 2  # a repeated block (multiplicities), kept
    assert np.array_equal(back.bigbird_layouts(12), model.bigbird_layouts(12))
    assert np.array_equal(back.logits(x), model.logits(x))


def test_old_bigbird_file_without_bigbird_draw_loads_with_the_per_layer_draw(tmp_path):
    rng = np.random.default_rng(13)
    model = e_model()
    assert model.config["bigbird_draw"] == "per_head"
    theta = randomize_theta(model, rng, unit=(), spread=0.2, scale=0.5)
    n = 9
    x = rng.integers(0, 16, size=n * 3)
    ft.save(model, tmp_path / "new")
    new = ft.load(tmp_path / "new")
    assert new.config["bigbird_draw"] == "per_head"
    assert np.array_equal(new.bigbird_layouts(n), model.bigbird_layouts(n))
    assert np.array_equal(new(x), model(x))
    ft.save(model, tmp_path / "old")
    rewrite(tmp_path / "old", without_bigbird_draw)
    old = ft.load(tmp_path / "old")
    assert old.config["bigbird_draw"] == "per_layer"
    lay = old.bigbird_layouts(n)
    for l in range(2):
        head0 = ft.bigbird_layout(n, 3, 1, 2, 5, f"layers.{l}.attn.", head=0)  # the old per-layer draw
        for h in range(3):
            assert np.array_equal(lay[l, h], head0), (l, h)
        assert np.array_equal(model.bigbird_layouts(n)[l, 0], head0)
    assert any(not np.array_equal(model.bigbird_layouts(n)[l, h], lay[l, h]) for l in range(2) for h in range(3))
    # its outputs are Algorithm 9 with each layer's one layout for every head (the old model's)
    want = ref.e_transformer(x, theta, L=2, H=3, attention="bigbird", layouts=lay[:, 0], block_size=3)
    assert rel_err(old(x), want) <= 1e-12
    # saved again, it says so, and stays per-layer
    ft.save(old, tmp_path / "again")
    again = ft.load(tmp_path / "again")
    assert again.config["bigbird_draw"] == "per_layer" and np.array_equal(again(x), old(x))
    # a file of a model without BigBird is unaffected by the rule
    plain = ft.ETransformer(19, 96, 1, 2, 8, 12, 8)
    ft.save(plain, tmp_path / "plain")
    rewrite(tmp_path / "plain", without_bigbird_draw)
    assert ft.load(tmp_path / "plain").config["bigbird_draw"] == "per_head"


def test_bigbird_draw_option():
    model = e_model(bigbird_draw="per_layer")
    lay = model.bigbird_layouts(9)
    assert all(np.array_equal(lay[l, h], lay[l, 0]) for l in range(2) for h in range(3))
    model.set_bigbird_layouts(np.ones((2, 3, 9, 9), bool))  # given layouts: per head as ever
    with pytest.raises(ValueError, match="bigbird_draw must be one of 'per_head', 'per_layer'"):
        e_model(bigbird_draw="per_block")
    with pytest.raises(TypeError, match="bigbird_draw"):
        e_model(bigbird_draw=1)
    with pytest.raises(TypeError, match="bigbird_draw"):
        ft.DTransformer(19, 96, 1, 2, 8, 12, bigbird_draw="per_head")


def test_damaged_layouts_in_a_file_are_value_errors(tmp_path):
    model = e_model()
    model.set_bigbird_layouts(np.ones((2, 3, 8, 8), bool))
    ft.save(model, tmp_path / "m")
    good = ftio.read_metadata(tmp_path / "m")[ftio.LAYOUTS]
    stored = json.loads(good)
    bad = {
        "not JSON": "{",
        "a key block outside": json.dumps({"8": [[[[9]] * 8]] * 2}),
        "no key blocks": json.dumps({"8": [[[[]] * 8]] * 2}),
        "layers for L = 2": json.dumps({"8": stored["8"][:1]}),
        "l_max": json.dumps({"40": [[[[0]] * 40]] * 2}),
        "a layout of 8 blocks": json.dumps({"7": stored["8"]}),
        "not an integer": json.dumps({"8": [[[["0"]] * 8]] * 2}),
    }
    for what, text in bad.items():
        rewrite(tmp_path / "m", lambda meta: {**meta, ftio.LAYOUTS: text})
        with pytest.raises(ValueError, match="damaged BigBird layouts") as e:
            ft.load(tmp_path / "m")
        assert what in str(e.value), (what, str(e.value))
    # repeated blocks in a file of an attention_impl that cannot weigh them
    lit = e_model(impl="literal")
    ft.save(lit, tmp_path / "lit")
    rewrite(tmp_path / "lit", lambda meta: {**meta, ftio.LAYOUTS: json.dumps({"8": [[[[0, 0]] * 8]] * 2})})
    with pytest.raises(ValueError, match="attention_impl='auto'"):
        ft.load(tmp_path / "lit")
    # the key in the file of another architecture
    d = ft.DTransformer(19, 96, 1, 2, 8, 12)
    ft.save(d, tmp_path / "d")
    rewrite(tmp_path / "d", lambda meta: {**meta, ftio.LAYOUTS: good})
    with pytest.raises(ValueError, match="BigBird layouts in the metadata of a DTransformer"):
        ft.load(tmp_path / "d")
    with pytest.raises(ValueError, match="not 'bigbird'"):
        ft.ETransformer(19, 96, 2, 3, 12, 12, 8).set_bigbird_layouts_json(good)
