"""Prefix LM (docs/variants.md V7) and sliding-window attention with its rolling KV cache (V8, V9): the masks
of reference.py against their definitions and Hugging Face's, the core against reference.py (float64 ≤ 1e-12,
float32 ≤ 1e-5), gradients against finite differences, cached decoding against the full forward, Hugging Face's
MistralForCausalLM with its weights copied in, bad options."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, numeric_grad, rel_err, torch_or_skip

# ---------------------------------------------------------------------------------------------------
# The masks of reference.py


def test_prefix_mask_is_bidirectional_over_the_prefix_and_causal_after():
    l, p = 7, 3
    M = ref.prefix_mask(l, l, p)
    for t_z in range(l):
        for t_x in range(l):
            assert M[t_z, t_x] == (t_z < p or t_z <= t_x)
    assert (ref.prefix_mask(l, l, 0) == ref.unidirectional_mask(l, l)).all()
    assert (ref.prefix_mask(l, l, l) == ref.bidirectional_mask(l, l)).all()
    # the prefix block is all ones, the rest of each column is causal
    assert M[:p, :p].all() and not M[p:, :p].any()
    # queries at q0 (a cache): the columns of the full mask
    assert (ref.prefix_mask(l, 2, p, q0=4) == M[:, 4:6]).all()


def test_sliding_window_mask_sees_the_last_w_keys():
    l = 9
    for w in (1, 2, 3, 9, 20):
        M = ref.sliding_window_mask(l, l, w)
        for t_z in range(l):
            for t_x in range(l):
                assert M[t_z, t_x] == (t_x - w < t_z <= t_x)
        assert (M.sum(axis=0) == np.minimum(np.arange(l) + 1, w)).all()  # w keys once t_x ≥ w − 1
        assert (ref.sliding_window_mask(l, 3, w, q0=5) == M[:, 5:8]).all()
    assert (ref.sliding_window_mask(l, l, l) == ref.unidirectional_mask(l, l)).all()
    assert (ref.sliding_window_mask(l, l, 1) == np.eye(l, dtype=bool)).all()


def test_sliding_window_mask_follows_hugging_face_mistral_convention():
    torch = torch_or_skip()
    pytest.importorskip("transformers")
    from transformers import masking_utils as mu

    l = 11
    q, k = torch.arange(l)[:, None], torch.arange(l)[None, :]
    for w in (1, 3, 4, 11):
        f = mu.sliding_window_causal_mask_function(w)
        hf = f(0, 0, q, k).numpy()  # [q_idx, kv_idx], broadcast
        assert (ref.sliding_window_mask(l, l, w) == hf.T).all(), w  # ours is [t_z, t_x] = [kv, q]


def test_reference_prefix_zero_is_algorithm_10_and_the_loss_skips_the_prefix():
    rng = np.random.default_rng(0)
    model = ft.DTransformer(11, 8, 1, 2, 8, 12, dtype="float64", seed=1)
    theta = {k: np.array(v) for k, v in model.params.items()}
    x = rng.integers(0, 11, 8)
    P = ref.d_transformer(x, theta, L=1, H=2)
    assert rel_err(ref.d_transformer(x, theta, L=1, H=2, mask="prefix", prefix_len=0), P) == 0.0
    assert rel_err(ref.d_transformer(x, theta, L=1, H=2, sliding_window=8), P) == 0.0
    for p in range(len(x) + 1):
        logP = ref.log_softmax(ref.d_transformer(x, theta, L=1, H=2, mask="prefix", prefix_len=p, logits=True))
        want = -sum(logP[x[t + 1], t] for t in range(max(p - 1, 0), len(x) - 1))
        assert ref.d_loss(x, theta, L=1, H=2, mask="prefix", prefix_len=p) == pytest.approx(want, rel=1e-15)
    # the prefix changes the function: column 0 sees the whole prefix
    assert rel_err(ref.d_transformer(x, theta, L=1, H=2, mask="prefix", prefix_len=4), P) > 1e-3
    with pytest.raises(ValueError, match="prefix_len"):
        ref.d_transformer(x, theta, L=1, H=2, mask="prefix", prefix_len=9)
    with pytest.raises(ValueError, match="sliding_window"):
        ref.d_transformer(x, theta, L=1, H=2, sliding_window=0)
