"""attention="bigbird" with a key block repeated in a query block's list (docs/variants.md V17b, the multiset
note): a block listed m times is gathered m times, so it weighs m·exp(s) in the softmax (= softmax(S + log M))
and its gradient sums its occurrences. The kernel against a dense transcription with log M (float64 ≤ 1e-12),
reference.py's V17b and finite differences and torch autograd of a torch gather with repeated indices; the
model's forward, attention_weights and every gradient; and ft.from_hf at Hugging Face's "old plans" length
ℓ = 1024 (blocks of 32, r = 2: HF repeats a window block as a random one) and in HF's eval mode (every random
block is block 0), equal to HF in float64 with gradients against torch autograd."""
from __future__ import annotations

import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from formal_transformers.hf.bert import tensor_table as _bert_pairs
from conftest import hf_random_float64, numeric_grad, randomize_theta, rel_err, torch_or_skip


def repeated_layout(n, seed):
    """A layout (n, n) of multiplicities 0…3: every query block keeps its own block once, some blocks twice or
    three times."""
    rng = np.random.default_rng(seed)
    lay = rng.choice([0, 0, 1, 2, 3], size=(n, n)).astype(np.uint8)
    lay[np.arange(n), np.arange(n)] = np.maximum(lay[np.arange(n), np.arange(n)], 1)
    assert (lay >= 2).any()
    return lay


def dense_with_multiplicity(Q, K, V, M):
    """The definition: A[t_z, t_x] = M[t_z, t_x]·exp(s)/Σ M·exp(s), s = K[:, t_z]ᵀQ[:, t_x]/√d."""
    S = K.T @ Q / math.sqrt(Q.shape[0])
    E = M * np.exp(S - S.max(axis=0))
    return V @ (E / E.sum(axis=0))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_kernel_weighs_a_repeated_block_once_per_occurrence(dtype):
    n, b, d = 6, 3, 4
    rng = np.random.default_rng(1)
    Q, K, V = rng.normal(size=(d, n * b)), rng.normal(size=(d, n * b)), rng.normal(size=(2, n * b))
    lay = repeated_layout(n, 2)
    M = np.kron(lay.astype(float), np.ones((b, b)))
    want = dense_with_multiplicity(Q, K, V, M)
    Y, _ = ft.block_sparse_attention(Q.astype(dtype), K.astype(dtype), V.astype(dtype), lay, b)
    assert rel_err(Y, want) <= (1e-12 if dtype == "float64" else 1e-5)
    assert rel_err(ref.block_sparse_attention(Q, K, V, lay, b), want) <= 1e-12
    # Algorithm 4 in reference.py with the integer mask (log M on the scores) is the same function
    I, z = np.eye(d), np.zeros(d)  # W_q = W_k = W_v = I: Q, K and V = K
    assert rel_err(ref.attention(Q, K, I, z, I, z, I, z, ref.bigbird_mask(lay, b)),
                   dense_with_multiplicity(Q, K, K, M)) <= 1e-12
    # multiplicities 0/1 are the bool layout
    Yb, _ = ft.block_sparse_attention(Q, K, V, lay > 0, b)
    Y1, _ = ft.block_sparse_attention(Q, K, V, (lay > 0).astype(np.int32), b)
    assert np.array_equal(Yb, Y1) and rel_err(Yb, Y) > 1e-3


def test_kernel_backward_with_repeats_matches_finite_differences_and_torch_autograd():
    torch = torch_or_skip()
    n, b, d = 5, 2, 3
    rng = np.random.default_rng(3)
    Q, K, V, C = (rng.normal(size=(d, n * b)), rng.normal(size=(d, n * b)), rng.normal(size=(2, n * b)),
                  rng.normal(size=(2, n * b)))
    lay = repeated_layout(n, 4)
    _, lse = ft.block_sparse_attention(Q, K, V, lay, b)
    grads = ft.block_sparse_attention_backward(Q, K, V, lay, b, lse, C)
    f = lambda: float(np.sum(C * ft.block_sparse_attention(Q, K, V, lay, b)[0]))  # noqa: E731
    for X, dX in zip((Q, K, V), grads):
        assert rel_err(dX, numeric_grad(f, X)) <= 1e-7
    # torch: a gather with each repeated block's columns listed m times (autograd sums the occurrences)
    tQ, tK, tV = (torch.tensor(a, requires_grad=True) for a in (Q, K, V))
    out = []
    for i in range(n):
        cols = torch.tensor(np.concatenate([np.arange(j * b, (j + 1) * b) for j in np.repeat(np.arange(n), lay[:, i])]))
        out.append(tV[:, cols] @ torch.softmax(tK[:, cols].T @ tQ[:, i * b:(i + 1) * b] / math.sqrt(d), dim=0))
    Y = torch.cat(out, dim=1)
    (Y * torch.tensor(C)).sum().backward()
    assert rel_err(ft.block_sparse_attention(Q, K, V, lay, b)[0], Y.detach().numpy()) <= 1e-12
    for g, t in zip(grads, (tQ, tK, tV)):
        assert rel_err(g, t.grad.numpy()) <= 1e-12


def e_model(impl="auto"):
    return ft.ETransformer(19, 96, 2, 3, 12, 12, 8, dtype="float64", seed=3, attention="bigbird", block_size=3,
                           n_random_blocks=1, n_global_blocks=1, window_blocks=3, layout_seed=5, attention_impl=impl)


def test_model_with_repeated_blocks_forward_weights_and_gradients():
    rng = np.random.default_rng(5)
    model = e_model()
    theta = randomize_theta(model, rng, unit=(), spread=0.2, scale=0.5)
    n = 7
    lay = np.stack([np.stack([repeated_layout(n, 10 * l + h) for h in range(3)]) for l in range(2)])  # (L, H, n, n)
    model.set_bigbird_layouts(lay)
    got = model.bigbird_layouts(n)
    assert got.dtype == np.uint8 and np.array_equal(got, lay)
    x = rng.integers(0, 16, size=n * 3)
    want = ref.e_transformer(x, theta, L=2, H=3, attention="bigbird", layouts=lay, block_size=3)
    assert rel_err(model(x), want) <= 1e-12
    # attention_weights: the softmax with multiplicity (each column sums to 1; a repeated block weighs m·exp(s))
    model(x)
    A = model.attention_weights(0)
    X = np.stack([theta["W_e"][:, t] + theta["W_p"][:, i] for i, t in enumerate(x)], axis=1)
    a = "layers.0.attn."
    for h in range(3):
        wa = ref.attention_weights(X, X, theta[a + "W_q"][h], theta[a + "b_q"][h], theta[a + "W_k"][h],
                                   theta[a + "b_k"][h], ref.bigbird_mask(lay[0, h], 3))
        assert rel_err(A[h], wa) <= 1e-12 and rel_err(A[h].sum(axis=0), np.ones(n * 3)) <= 1e-12
    xt = list(x)
    xt[4] = xt[13] = model.mask_token
    _, g = model.loss_and_grad(xt, x)
    for k in ("layers.0.attn.W_q", "layers.0.attn.W_k", "layers.1.attn.W_v", "W_e"):
        num = numeric_grad(lambda: model.loss(xt, x), model.params[k], h=1e-4)
        assert rel_err(g[k], num) <= 1e-6, (k, rel_err(g[k], num))


def test_repeated_blocks_are_refused_where_a_mask_cannot_weigh_them():
    lay = np.stack([np.stack([repeated_layout(7, h) for h in range(3)]) for _ in range(2)])
    for impl in ("literal", "tiled"):
        model = e_model(impl)
        before = model.bigbird_layouts(7)
        with pytest.raises(ValueError, match="attention_impl='auto'"):
            model.set_bigbird_layouts(lay)
        assert np.array_equal(model.bigbird_layouts(7), before)
        model.set_bigbird_layouts(lay > 0)  # the 0/1 layout is a mask
    with pytest.raises(ValueError, match="multiplicity"):
        e_model().set_bigbird_layouts(-lay.astype(np.int16))
    with pytest.raises(ValueError, match="multiplicity"):
        ft.block_sparse_attention(np.zeros((2, 6)), np.zeros((2, 6)), np.zeros((2, 6)), np.full((3, 3), 256), 2)
    with pytest.raises(TypeError, match="bool"):
        e_model().set_bigbird_layouts(lay.astype(float))


# ---------------------------------------------------------------------------------------------------
# Hugging Face's BigBird where it repeats a block


def hf_bigbird_1024(cls, b, r, H=2, L=2):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BigBirdConfig(vocab_size=40, hidden_size=8, num_hidden_layers=L, num_attention_heads=H,
                                     intermediate_size=12, max_position_embeddings=1024, block_size=b,
                                     num_random_blocks=r, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     sep_token_id=None)
    return hf_random_float64(getattr(transformers, cls), cfg)


def check_mlm_against_hf(hf, model, torch, l, seed):
    """Logits ≤ 1e-12 and every gradient of the MLM loss against torch autograd on HF's model."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 37, size=l)
    xt = x.copy()
    masked = rng.choice(l, size=6, replace=False)
    xt[masked] = model.mask_token
    logits = hf(input_ids=torch.tensor(xt[None])).logits[0].T
    assert rel_err(model.logits(xt), logits.detach().numpy()) <= 1e-12
    loss_t = -torch.log_softmax(logits, dim=0)[torch.tensor(x[masked]), torch.tensor(masked)].sum()
    loss_t.backward()
    loss, grads = model.loss_and_grad(xt, x)
    assert abs(loss - loss_t.item()) <= 1e-12 * abs(loss)
    named = dict(hf.named_parameters())
    for a, k, kind in _bert_pairs(dict(L=2, tied=True), True):
        gt = named.get("bert." + a, named.get(a)).grad.numpy()
        gt = gt.T if kind == "T" else gt.reshape(2, -1, *gt.shape[1:]) if kind == "H" else gt
        if k.endswith("b_k"):  # a constant of each column of S: 0 up to rounding on both sides
            assert np.abs(grads[k]).max() <= 1e-13 and np.abs(gt).max() <= 1e-13
            continue
        assert rel_err(grads[k], gt) <= 1e-12, (k, rel_err(grads[k], gt))


def test_hf_old_plan_at_1024_tokens_repeats_a_block_and_is_equal_to_hf():
    """ℓ = 1024 in blocks of 32 with r = 2: HF's "old plan" draws a window block again as a random one."""
    torch = torch_or_skip()
    hf = hf_bigbird_1024("BigBirdForMaskedLM", 32, 2).train()
    model = ft.from_hf(hf, bigbird_lengths=[1024])
    lay = model.bigbird_layouts(32)
    assert lay.dtype == np.uint8 and lay.max() == 2  # HF's repeat, kept as a multiplicity
    check_mlm_against_hf(hf, model, torch, 1024, 12)


def test_hf_eval_mode_every_random_block_is_block_0():
    """HF's eval mode gathers block 0 once as global and r times as random: from_hf of an eval model installs
    that multiset and equals HF in eval mode; of the same model in training mode, HF in training mode."""
    torch = torch_or_skip()
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BigBirdConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=96, block_size=4,
                                     num_random_blocks=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     sep_token_id=None)
    hf = hf_random_float64(transformers.BigBirdForMaskedLM, cfg).eval()
    l = 48  # 12 blocks of 4 > (5 + 2r)·4 = 36: HF runs block_sparse
    ev = ft.from_hf(hf, bigbird_lengths=[l])
    lay = ev.bigbird_layouts(12)
    assert lay.dtype == np.uint8 and (lay[:, :, 0, 2:10] == 3).all()  # middle query blocks: block 0 1 + r times
    tr = ft.from_hf(hf.train(), bigbird_lengths=[l])
    x = np.random.default_rng(13).integers(1, 37, size=l)
    with torch.no_grad():
        want_tr = hf.train()(input_ids=torch.tensor(x[None])).logits[0].numpy().T
        want_ev = hf.eval()(input_ids=torch.tensor(x[None])).logits[0].numpy().T
    assert rel_err(ev.logits(x), want_ev) <= 1e-12 and rel_err(tr.logits(x), want_tr) <= 1e-12
    assert rel_err(ev.logits(x), want_tr) > 1e-6
    hf.eval()
    check_mlm_against_hf(hf, ev, torch, l, 14)
