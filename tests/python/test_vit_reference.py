"""Listing V14, the vision transformer (docs/variants.md): reference.vit, the numpy transcription, against
Hugging Face's ViTForImageClassification (float64, every weight random), the patch order, and the image
checks. (The core has no ViT model yet: this is the oracle it will be tested against.)"""
from __future__ import annotations

import numpy as np
import pytest

from formal_transformers import reference as ref
from conftest import rel_err

CFG = dict(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=20, num_labels=5, layer_norm_eps=1e-12)


def hf_vit(seed=0, **kw):
    """A ViTForImageClassification with every weight random (γ ≈ 1, β, biases, class token nonzero), float64,
    sdpa attention (its eager path takes the softmax in float32)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(**{**CFG, **kw}, attn_implementation="sdpa")
    torch.manual_seed(seed)
    m = transformers.ViTForImageClassification(cfg).to(torch.float64).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            z = torch.randn_like(p)
            if name.endswith("layernorm_before.weight") or name.endswith("layernorm_after.weight") \
                    or name == "vit.layernorm.weight":
                p.copy_(1.0 + 0.3 * z)
            elif p.dim() == 1:
                p.copy_(0.3 * z)
            else:
                p.copy_(z / np.sqrt(p.shape[-1] if p.dim() == 2 else np.prod(p.shape[1:])))
    return m


def theta_of(m) -> dict:
    """The listing's θ from a ViTForImageClassification (names of reference.vit)."""
    c = m.config
    H, d_e = c.num_attention_heads, c.hidden_size
    d = d_e // H
    sd = {k: v.detach().numpy().astype(np.float64) for k, v in m.state_dict().items()}
    emb = "vit.embeddings."
    th = {"W_patch": sd[emb + "patch_embeddings.projection.weight"].reshape(d_e, -1),
          "b_patch": sd[emb + "patch_embeddings.projection.bias"],
          "x_class": sd[emb + "cls_token"][0, 0], "W_p": sd[emb + "position_embeddings"][0].T}
    for l in range(c.num_hidden_layers):
        h, p = f"vit.layers.{l}.", f"layers.{l}."
        th[p + "gamma1"], th[p + "beta1"] = sd[h + "layernorm_before.weight"], sd[h + "layernorm_before.bias"]
        for ours in "qkv":
            th[p + f"attn.W_{ours}"] = sd[h + f"attention.{ours}_proj.weight"].reshape(H, d, d_e)
            th[p + f"attn.b_{ours}"] = sd[h + f"attention.{ours}_proj.bias"].reshape(H, d)
        th[p + "attn.W_o"], th[p + "attn.b_o"] = sd[h + "attention.o_proj.weight"], sd[h + "attention.o_proj.bias"]
        th[p + "gamma2"], th[p + "beta2"] = sd[h + "layernorm_after.weight"], sd[h + "layernorm_after.bias"]
        th[p + "W_mlp1"], th[p + "b_mlp1"] = sd[h + "mlp.fc1.weight"], sd[h + "mlp.fc1.bias"]
        th[p + "W_mlp2"], th[p + "b_mlp2"] = sd[h + "mlp.fc2.weight"], sd[h + "mlp.fc2.bias"]
    th["gamma"], th["beta"] = sd["vit.layernorm.weight"], sd["vit.layernorm.bias"]
    th["W_c"], th["b_c"] = sd["classifier.weight"], sd["classifier.bias"]
    return th


@pytest.mark.parametrize("kw", [{}, dict(num_channels=1, patch_size=2, num_hidden_layers=1),
                                dict(image_size=(12, 6), patch_size=3, num_labels=3)])
def test_reference_vit_equals_hf_vit_for_image_classification(kw):
    import torch

    m = hf_vit(**kw)
    c = m.config
    hw = tuple(c.image_size) if isinstance(c.image_size, (tuple, list)) else (c.image_size, c.image_size)
    images = np.random.default_rng(1).standard_normal((3, c.num_channels, *hw))
    with torch.no_grad():
        want = m(pixel_values=torch.from_numpy(images)).logits.numpy().T  # (n_classes, B)
    got = ref.vit(images, theta_of(m), H=c.num_attention_heads, patch_size=c.patch_size, eps=c.layer_norm_eps,
                  logits=True)
    assert got.shape == (c.num_labels, 3)
    assert rel_err(got, want) <= 1e-12
    P = ref.vit(images, theta_of(m), H=c.num_attention_heads, patch_size=c.patch_size, eps=c.layer_norm_eps)
    assert rel_err(P, torch.softmax(torch.from_numpy(want), 0).numpy()) <= 1e-12


def test_image_patches_are_hfs_convolution():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    image = rng.standard_normal((2, 6, 9))
    W = rng.standard_normal((5, 2, 3, 3))
    conv = torch.nn.functional.conv2d(torch.from_numpy(image)[None], torch.from_numpy(W), stride=3)[0]  # (5, 2, 3)
    got = W.reshape(5, -1) @ ref.image_patches(image, 3)
    assert rel_err(got, conv.flatten(1).numpy()) <= 1e-13
    # patch n = (i, j), n = i·3 + j: patch 4 is rows 3..5, columns 3..5
    assert np.array_equal(ref.image_patches(image, 3)[:, 4], image[:, 3:6, 3:6].reshape(-1))


@pytest.mark.parametrize("images, patch, err, match", [
    (np.zeros((2, 3, 8, 8)), 3, ValueError, "does not divide"),
    (np.zeros((3, 8, 8)), 4, ValueError, "4-D"),
    (np.zeros((2, 1, 8, 8)), 4, ValueError, r"\(B, 3, 8, 8\)"),
    (np.zeros((2, 3, 8, 4)), 4, ValueError, r"\(B, 3, 8, 8\)"),
    (np.zeros((0, 3, 8, 8)), 4, ValueError, "empty"),
    (np.zeros((2, 3, 8, 8), dtype=np.int64), 4, TypeError, "floating-point"),
    (np.full((2, 3, 8, 8), np.nan), 4, ValueError, "NaN"),
    (np.zeros((2, 3, 8, 8)), 0, ValueError, "positive integer"),
])
def test_bad_images_are_refused_naming_the_problem(images, patch, err, match):
    with pytest.raises(err, match=match):
        ref.check_images(images, n_channels=3, image_size=(8, 8), patch_size=patch)
