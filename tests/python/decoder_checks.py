"""Checks the decoder variant suites share (test_parallel_block.py, test_sandwich_block.py, test_gemma.py,
test_qk_norm.py): finite differences of every gradient, the pre-LN layer's sublayers transcribed in numpy for
replaying dropout masks, and cached, batched decoding against the literal listing."""
from __future__ import annotations

import numpy as np

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import assert_grads_match_fd, randomize_theta, rel_err

PROMPTS = (np.array([1, 2, 3, 4]), np.array([5]), np.array([7, 8, 9, 10, 11, 0, 1]))
# the options a block's gradients are checked with: Algorithm 10's, and LLaMA's (RoPE, V3, no biases, RMSnorm, V4)
BLOCK_GRADIENT_OPTIONS = [{}, dict(positional="rope", H_kv=1, bias=False, norm="rms", mlp="swiglu")]


def assert_gradients_match_fd(model, x, b_k_zero=True):
    """loss_and_grad's loss is loss's, and every gradient matches central differences."""
    loss, grads = model.loss_and_grad(x)
    assert abs(loss - model.loss(x)) <= 1e-12 * abs(loss)
    assert_grads_match_fd(model, grads, lambda: model.loss(x), b_k_zero=b_k_zero)


def block_gradients_match_fd(model, extra: dict):
    """θ random; on two sequences, every gradient of a model made with one of BLOCK_GRADIENT_OPTIONS (extra) matches
    central differences."""
    randomize_theta(model, np.random.default_rng(2))
    x = [np.array([3, 1, 4, 1, 5, 9, 2, 6]), np.array([7, 0, 2])]
    assert_gradients_match_fd(model, x, b_k_zero=extra.get("positional") != "rope")


def dropped_run(model, x):
    """θ random, then one loss_and_grad of x with dropout: (θ as a dict, the model's dropout masks (the sublayers'
    outputs and the attention weights among them), the first layer's input W_e[:, x] + W_p[:, :ℓ])."""
    p = dict(randomize_theta(model, np.random.default_rng(4)))
    model.loss_and_grad(x)
    masks = model.dropout_masks()
    assert {"layers.0.attn.out", "layers.0.mlp.out", "layers.1.attn.weights"} <= set(masks)
    return p, masks, p["W_e"][:, x] + p["W_p"][:, :len(x)]


def dropped_sublayers(p: dict, masks: dict, l: int, q: str, H: int = 2, attn_p: float = 0.2):
    """Layer q's sublayers in numpy (dict θ p, sequence length l): its causal attention with the model's dropout
    masks of the attention weights (rate attn_p) replayed, and its GELU MLP; (attn, mlp) as functions of X̃."""
    a = q + "attn."
    W = masks[a + "weights"][0]

    def attn(Xt):
        M = ref.unidirectional_mask(l, l)
        heads = []
        for h in range(H):
            Qh = p[a + "W_q"][h] @ Xt + p[a + "b_q"][h][:, None]
            Kh = p[a + "W_k"][h] @ Xt + p[a + "b_k"][h][:, None]
            Vh = p[a + "W_v"][h] @ Xt + p[a + "b_v"][h][:, None]
            S = np.where(M, Kh.T @ Qh / np.sqrt(Qh.shape[0]), -np.inf)
            heads.append(Vh @ ref.dropout(ref.softmax(S), W[h], attn_p))
        return p[a + "W_o"] @ np.concatenate(heads) + p[a + "b_o"][:, None]

    def mlp(Xt):
        return p[q + "W_mlp2"] @ ref.gelu(p[q + "W_mlp1"] @ Xt + p[q + "b_mlp1"][:, None]) + p[q + "b_mlp2"][:, None]

    return attn, mlp


def assert_replayed_loss(model, p: dict, X, x):
    """The loss of the last layer's output X through Algorithm 10's final norm and unembedding equals the model's
    loss_and_grad with the same dropout masks (the step rewound to the masks' draw), to 1e-12."""
    logP = ref.log_softmax(p["W_u"] @ ref.layer_norm_columns(X, p["gamma"], p["beta"], 1e-5))
    model.dropout_step -= 1
    want = -sum(logP[x[t + 1], t] for t in range(len(x) - 1))
    assert rel_err(model.loss_and_grad(x)[0], want) <= 1e-12


def assert_decoding_equals_literal(model, prompts=PROMPTS, l_gen=8, full_forward=False):
    """Cached decoding of each prompt and batched decoding of all equal the literal listing's (no cache); with
    full_forward, each step is the full forward's argmax too."""
    literal = [ft.DInference(l_gen, 0.0, cache=False)(p, model) for p in prompts]
    for p, want in zip(prompts, literal):
        assert np.array_equal(ft.DInference(l_gen, 0.0)(p, model), want)
    batched = ft.DInference(l_gen, 0.0)(list(prompts), model)
    assert all(np.array_equal(b, w) for b, w in zip(batched, literal))
    if full_forward:
        for p, want in zip(prompts, literal):
            P = model(np.concatenate([p, want[:-1]]))
            assert np.array_equal(np.argmax(P[:, len(p) - 1:], axis=0), want)
