"""ft.ViT (listing V14, docs/variants.md): equal to Hugging Face's ViTForImageClassification (float64, every
weight random: logits and every gradient), to reference.vit (float64 and float32), gradients vs finite
differences, to_hf back, bad input, and training on scikit-learn's digits."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import hf as fthf
from formal_transformers import reference as ref
from conftest import TOL, numeric_grad, rel_err, torch_or_skip
from test_vit_reference import hf_vit

SIZES = dict(image_size=8, patch_size=4, n_classes=5, L=2, H=4, d_e=16, d_mlp=20)


def randomize(m, rng):
    for k, v in m.params.items():
        z = rng.standard_normal(v.shape)
        last = k.rsplit(".", 1)[-1]
        v[...] = 1.0 + 0.3 * z if last.startswith("gamma") else 0.3 * z if v.ndim == 1 or last.startswith("b_") \
            else z / np.sqrt(v.shape[-1])
    return {k: np.array(v, dtype=np.float64) for k, v in m.params.items()}


def images_of(B, C=3, h=8, w=8, seed=1):
    return np.random.default_rng(seed).standard_normal((B, C, h, w))


@pytest.mark.parametrize("kw", [{}, dict(num_channels=1, patch_size=2, num_hidden_layers=1),
                                dict(image_size=(12, 6), patch_size=3, num_labels=3)])
def test_from_hf_equals_vit_for_image_classification_logits_and_every_gradient(kw):
    torch_or_skip()
    import torch

    hf = hf_vit(**kw)
    c = hf.config
    m = ft.from_hf(hf)
    assert isinstance(m, ft.ViT) and m.dtype == "float64"
    hw = tuple(c.image_size) if isinstance(c.image_size, (tuple, list)) else (c.image_size, c.image_size)
    x = images_of(3, c.num_channels, *hw)
    y = np.array([0, 2, 1])
    xt = torch.from_numpy(x)
    out = hf(pixel_values=xt)
    assert rel_err(m.logits(x), out.logits.detach().numpy().T) <= 1e-12
    assert rel_err(m(x), torch.softmax(out.logits, -1).detach().numpy().T) <= 1e-12
    loss_t = torch.nn.functional.cross_entropy(out.logits, torch.from_numpy(y), reduction="sum")
    hf.zero_grad()
    loss_t.backward()
    g_hf = copy.deepcopy(hf)  # the same model with every parameter replaced by its gradient: mapped as θ
    with torch.no_grad():
        for (_, p), (_, q) in zip(hf.named_parameters(), g_hf.named_parameters()):
            q.copy_(p.grad)
    want = fthf.vit_theta(g_hf)
    loss, grads = m.loss_and_grad(x, y)
    assert abs(loss - loss_t.item()) <= 1e-12 * abs(loss_t.item())
    assert set(grads) == set(want)
    scale = max(np.abs(g).max() for g in want.values())
    for k, g in want.items():
        if k.endswith(".b_k"):  # exactly 0 in exact arithmetic (a per-column constant of S): rounding noise on both sides
            assert np.abs(grads[k]).max() <= 1e-12 * scale and np.abs(g).max() <= 1e-12 * scale
            continue
        assert rel_err(grads[k], g.reshape(grads[k].shape)) <= 1e-12, k


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_forward_matches_reference(dtype):
    m = ft.ViT(**SIZES, dtype=dtype, seed=2)
    th = randomize(m, np.random.default_rng(3))
    x = images_of(4)
    assert rel_err(m(x), ref.vit(x, th, H=4, patch_size=4, eps=1e-12)) <= TOL[dtype]
    assert m(x).shape == (5, 4)


def test_every_gradient_matches_finite_differences():
    m = ft.ViT(image_size=(4, 6), patch_size=2, n_classes=3, L=1, H=2, d_e=6, d_mlp=8, n_channels=2, eps=1e-5,
               dtype="float64", seed=4)
    randomize(m, np.random.default_rng(5))
    x = images_of(2, 2, 4, 6, seed=6)
    y = np.array([2, 0])
    _, grads = m.loss_and_grad(x, y)
    for k in m.params:
        num = numeric_grad(lambda: m.loss(x, y), m.params[k])
        if k.endswith(".b_k"):  # exactly 0 (a per-column constant of S): both sides at rounding level
            assert np.abs(grads[k]).max() <= 1e-12 and np.abs(num).max() <= 1e-8
            continue
        assert rel_err(grads[k], num) <= 1e-7, k


def test_to_hf_round_trip():
    torch_or_skip()
    import torch

    m = ft.ViT(**SIZES, dtype="float64", seed=7)
    randomize(m, np.random.default_rng(8))
    hf = ft.to_hf(m)
    x = images_of(2)
    with torch.no_grad():
        z = hf(pixel_values=torch.from_numpy(x)).logits.numpy().T
    assert rel_err(m.logits(x), z) <= 1e-12
    m2 = ft.from_hf(hf)
    assert all(np.array_equal(m2.params[k], m.params[k]) for k in m.params)


def test_bad_input_is_refused_naming_the_problem():
    with pytest.raises(ValueError, match="does not divide"):
        ft.ViT(image_size=8, patch_size=3, n_classes=2, L=1, H=2, d_e=4, d_mlp=4)
    with pytest.raises(ValueError, match="divisible by H"):
        ft.ViT(image_size=8, patch_size=4, n_classes=2, L=1, H=3, d_e=4, d_mlp=4)
    with pytest.raises(ValueError, match="n_classes"):
        ft.ViT(image_size=8, patch_size=4, n_classes=0, L=1, H=2, d_e=4, d_mlp=4)
    m = ft.ViT(**SIZES, dtype="float64")
    before = {k: np.array(v) for k, v in m.params.items()}
    for bad, err, match in [(np.zeros((3, 8, 8)), ValueError, "4-D"),
                            (np.zeros((2, 1, 8, 8)), ValueError, r"\(B, 3, 8, 8\)"),
                            (np.zeros((2, 3, 8, 4)), ValueError, r"\(B, 3, 8, 8\)"),
                            (np.zeros((0, 3, 8, 8)), ValueError, "empty"),
                            (np.zeros((2, 3, 8, 8), dtype=np.int64), TypeError, "floating-point"),
                            (np.full((2, 3, 8, 8), np.nan), ValueError, "NaN"),
                            ("images", TypeError, "floating-point")]:
        with pytest.raises(err, match=match):
            m(bad)
        with pytest.raises(err, match=match):
            m.loss_and_grad(bad, [0, 1])
    with pytest.raises(IndexError, match="out of range"):
        m.loss_and_grad(images_of(2), [0, 5])
    with pytest.raises(ValueError, match="one label per image"):
        m.loss_and_grad(images_of(2), [0])
    with pytest.raises(TypeError, match="integer"):
        m.loss(images_of(2), [0.5, 1.0])
    assert all(np.array_equal(before[k], m.params[k]) for k in before)  # nothing changed


def test_training_on_digits_beats_chance_by_far():
    """Six epochs of Adam on scikit-learn's digits (the fixed split of ft.vision.digits_split) with 4×4 patches:
    test accuracy ≥ 0.80 (chance: 0.10; 0.88 when written; the logistic-regression baseline of
    bench/bench_vit_digits.py is ≈ 0.97, which the bench's longer run approaches: docs/variants.md V14)."""
    pytest.importorskip("sklearn")
    from formal_transformers.vision import accuracy, digits_split, train_vit

    (x_tr, y_tr), (x_te, y_te) = digits_split()
    assert (len(x_tr), len(x_te)) == (1347, 450) and x_tr.shape[1:] == (1, 8, 8)
    m = ft.ViT(image_size=8, patch_size=4, n_classes=10, L=1, H=2, d_e=32, d_mlp=64, n_channels=1, seed=0)
    losses = train_vit(m, x_tr, y_tr, epochs=6, batch_size=32, lr=3e-3, seed=0)
    assert losses[-1] < losses[0]
    assert accuracy(m, x_te, y_te) >= 0.80
