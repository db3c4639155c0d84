"""attention="bigbird" (Algorithm V17 of docs/variants.md: BigBird's block-sparse attention, Zaheer et al. 2020): the
layout V17a (sliding, global and seeded random blocks), the block-sparse kernel V17b against Algorithm 4 with the
same mask (the dense definition: float64 ≤ 1e-12, float32 ≤ 1e-5) and against reference.py's transcription, in
ETransformer (ragged batches, grouped-query heads) against attention_impl='literal' and reference.py, every
gradient against finite differences, the kernel's backward against PyTorch autograd of a torch transcription, and
Hugging Face's BigBirdModel (attention_type='block_sparse') on the same weights and the same random layout, bad
options."""
from __future__ import annotations

import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref
from conftest import TOL, numeric_grad, randomize_theta, rel_err, torch_or_skip


def randomize(model, rng, scale=0.5):
    """Every parameter random (conftest.randomize_theta): γ = 1 + 0.2 z, biases and β 0.2 z, matrices
    scale·z/√columns (W_e too)."""
    return randomize_theta(model, rng, unit=(), spread=0.2, scale=scale)


def e_model(dtype="float64", L=2, H=2, d_e=8, b=4, r=1, g=1, w=3, impl="auto", **kw):
    return ft.ETransformer(19, 96, L, H, d_e, 12, 8, dtype=dtype, seed=3, attention="bigbird", block_size=b,
                           n_random_blocks=r, n_global_blocks=g, window_blocks=w, layout_seed=7,
                           attention_impl=impl, **kw)


def layouts(n, L, r=1, g=1, w=3, seed=7, H=2):
    """Every layer's layouts (H, n, n), head h drawn as a model's layer l head h draws them."""
    return [np.stack([ft.bigbird_layout(n, w, g, r, seed, f"layers.{l}.attn.", head=h) for h in range(H)])
            for l in range(L)]


def dense(Q, K, V, mask):
    """Algorithm 4's lines 4–6 with the mask (the dense definition)."""
    S = np.where(mask, K.T @ Q, -np.inf) / math.sqrt(Q.shape[0])
    return V @ ref.softmax(S)


# ---------------------------------------------------------------------------------------------------
# V17a: the layout


@pytest.mark.parametrize("n,w,g,r", [(10, 3, 1, 2), (12, 5, 2, 1), (7, 3, 1, 0), (9, 1, 0, 3)])
def test_layout_is_sliding_global_and_random_blocks(n, w, g, r):
    Lay = ft.bigbird_layout(n, w, g, r, 11, "x")
    assert Lay.shape == (n, n) and Lay.dtype == bool
    glob = [j for j in range(n) if j < g or j >= n - g]
    for i in range(n):
        col = Lay[:, i]
        if i in glob:
            assert col.all()  # global query blocks attend everywhere
            continue
        fixed = {j for j in range(n) if abs(i - j) <= (w - 1) // 2} | set(glob)
        assert all(col[j] for j in fixed)
        extra = set(np.flatnonzero(col)) - fixed
        assert len(extra) == r, (i, extra)  # r distinct random blocks outside the window and the globals
    assert np.array_equal(Lay, ft.bigbird_layout(n, w, g, r, 11, "x"))  # redrawn from the seed
    if r and n - 2 * g - w > r:
        assert not all(np.array_equal(Lay, ft.bigbird_layout(n, w, g, r, s, "x")) for s in range(12, 16))
        assert not all(np.array_equal(Lay, ft.bigbird_layout(n, w, g, r, 11, f"y{s}")) for s in range(4))


def test_random_blocks_are_spread_over_the_candidates():
    """Line 6 draws uniformly: over many seeds each candidate of a middle query block is picked about r/|cand|."""
    n, r, i = 12, 2, 6
    counts = np.zeros(n)
    for s in range(600):
        counts += ft.bigbird_layout(n, 3, 1, r, s, "z")[:, i]
    cand = [j for j in range(1, n - 1) if abs(j - i) > 1]  # 7 candidates
    freq = counts[cand] / 600
    assert np.all(np.abs(freq - r / len(cand)) < 0.08), freq


# ---------------------------------------------------------------------------------------------------
# V17b: the kernel = Algorithm 4 with the mask


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n,b,w,g,r", [(8, 4, 3, 1, 2), (10, 3, 5, 2, 1), (6, 5, 1, 0, 2)])
def test_kernel_equals_dense_attention_with_the_mask(dtype, n, b, w, g, r):
    rng = np.random.default_rng(n * b)
    d, d_v, l = 6, 5, n * b
    Q, K, V = rng.normal(size=(d, l)), rng.normal(size=(d, l)), rng.normal(size=(d_v, l))
    Lay = ft.bigbird_layout(n, w, g, r, 3)
    Y, lse = ft.block_sparse_attention(Q.astype(dtype), K.astype(dtype), V.astype(dtype), Lay, b)
    assert Y.dtype == np.dtype(dtype)
    mask = ref.bigbird_mask(Lay, b)
    assert rel_err(Y, dense(Q, K, V, mask)) <= TOL[dtype]
    assert rel_err(ref.block_sparse_attention(Q, K, V, Lay, b), dense(Q, K, V, mask)) <= 1e-12
    S = np.where(mask, K.T @ Q / math.sqrt(d), -np.inf)
    m = S.max(axis=0)
    assert rel_err(lse, m + np.log(np.exp(S - m).sum(axis=0))) <= TOL[dtype]


def kernel_case(seed, n, b, d, d_v, layout):
    """The kernel's inputs from default_rng(seed): Q, K (d × n·b), V (d_v × n·b), the layout
    ft.bigbird_layout(n, *layout), and C (d_v × n·b), the weights of the scalar Σ C ⊙ Y whose gradient is taken."""
    rng = np.random.default_rng(seed)
    l = n * b
    Q, K, V = rng.normal(size=(d, l)), rng.normal(size=(d, l)), rng.normal(size=(d_v, l))
    return Q, K, V, ft.bigbird_layout(n, *layout), rng.normal(size=(d_v, l))


def test_kernel_backward_matches_finite_differences():
    b = 2
    Q, K, V, Lay, C = kernel_case(5, 7, b, 3, 2, (3, 1, 1, 9))
    _, lse = ft.block_sparse_attention(Q, K, V, Lay, b)
    dQ, dK, dV = ft.block_sparse_attention_backward(Q, K, V, Lay, b, lse, C)
    f = lambda: float(np.sum(C * ft.block_sparse_attention(Q, K, V, Lay, b)[0]))  # noqa: E731
    for X, dX in ((Q, dQ), (K, dK), (V, dV)):
        assert rel_err(dX, numeric_grad(f, X)) <= 1e-7


def test_kernel_backward_matches_torch_autograd():
    torch = torch_or_skip()
    n, b, d = 9, 4, 5
    Q, K, V, Lay, C = kernel_case(6, n, b, d, 3, (3, 1, 2, 4))
    tQ, tK, tV = (torch.tensor(a, requires_grad=True) for a in (Q, K, V))
    blocks = []  # a torch transcription of V17b: per query block, its gathered key blocks
    for i in range(n):
        cols = torch.tensor(np.concatenate([np.arange(j * b, (j + 1) * b) for j in np.flatnonzero(Lay[:, i])]))
        S = tK[:, cols].T @ tQ[:, i * b:(i + 1) * b] / math.sqrt(d)
        blocks.append(tV[:, cols] @ torch.softmax(S, dim=0))
    Y = torch.cat(blocks, dim=1)
    (Y * torch.tensor(C)).sum().backward()
    got, lse = ft.block_sparse_attention(Q, K, V, Lay, b)
    assert rel_err(got, Y.detach().numpy()) <= 1e-12
    for g, t in zip(ft.block_sparse_attention_backward(Q, K, V, Lay, b, lse, C), (tQ, tK, tV)):
        assert rel_err(g, t.grad.numpy()) <= 1e-12


# ---------------------------------------------------------------------------------------------------
# ETransformer(attention="bigbird")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_etransformer_sparse_equals_literal_and_reference(dtype):
    sparse, literal = e_model(dtype), e_model(dtype, impl="literal")
    theta = randomize(sparse, np.random.default_rng(1))
    for k, v in theta.items():
        literal.params[k][...] = v
    rng = np.random.default_rng(2)
    xs = [rng.integers(0, 16, size=n) for n in (32, 24, 44)]  # a ragged batch: 8, 6 and 11 blocks
    P, Pd = sparse(xs), literal(xs)
    for bi, s in enumerate(xs):
        l = len(s)
        a, dn = np.asarray(P[bi])[:, :l], np.asarray(Pd[bi])[:, :l]
        want = ref.e_transformer(s, theta, L=2, H=2, attention="bigbird", layouts=layouts(l // 4, 2), block_size=4)
        assert rel_err(a, dn) <= TOL[dtype]
        assert rel_err(a, want) <= TOL[dtype]
        assert rel_err(dn, want) <= TOL[dtype]


def test_grouped_query_heads_and_wide_layouts():
    sparse = e_model(H=4, d_e=16, H_kv=2, b=3, r=2, g=2, w=5)
    literal = e_model(H=4, d_e=16, H_kv=2, b=3, r=2, g=2, w=5, impl="literal")
    theta = randomize(sparse, np.random.default_rng(3))
    for k, v in theta.items():
        literal.params[k][...] = v
    x = np.random.default_rng(4).integers(0, 16, size=39)  # 13 blocks of 3
    want = ref.e_transformer(x, theta, L=2, H=4, attention="bigbird", layouts=layouts(13, 2, r=2, g=2, w=5, H=4),
                             block_size=3)
    assert rel_err(sparse(x), want) <= 1e-12
    assert rel_err(literal(x), want) <= 1e-12


def test_attention_weights_after_a_sparse_forward_are_the_masked_softmax():
    model = e_model(L=1)
    theta = randomize(model, np.random.default_rng(5))
    x = np.random.default_rng(6).integers(0, 16, size=28)
    model(x)
    A = model.attention_weights(0)
    masks = [ref.bigbird_mask(Lh, 4) for Lh in layouts(7, 1)[0]]  # each head its own layout
    for h in range(2):
        assert np.all(A[h][~masks[h]] == 0)
    assert rel_err(A.sum(axis=1), np.ones((2, 28))) <= 1e-12
    X = np.stack([theta["W_e"][:, t] + theta["W_p"][:, i] for i, t in enumerate(x)], axis=1)
    a = "layers.0.attn."
    for h in range(2):
        want = ref.attention_weights(X, X, theta[a + "W_q"][h], theta[a + "b_q"][h], theta[a + "W_k"][h],
                                     theta[a + "b_k"][h], masks[h])
        assert rel_err(A[h], want) <= 1e-12


def test_every_gradient_matches_finite_differences_and_the_literal_listing():
    model, literal = e_model(L=1, b=2), e_model(L=1, b=2, impl="literal")
    theta = randomize(model, np.random.default_rng(10))
    for k, v in theta.items():
        literal.params[k][...] = v
    x = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 7, 8, 11, 2]  # 7 blocks of 2
    xt = list(x)
    xt[2] = xt[9] = model.mask_token
    _, grads = model.loss_and_grad(xt, x)
    _, grads_d = literal.loss_and_grad(xt, x)
    assert set(grads) == set(model.params)
    for k, view in model.params.items():
        if k.endswith("b_k"):  # b_kᵀq_t is a constant of each column of S: the gradient is 0 up to rounding
            assert np.abs(grads[k]).max() <= 1e-14 and np.abs(grads_d[k]).max() <= 1e-14
            continue
        assert rel_err(grads[k], grads_d[k]) <= 1e-12, k
        num = numeric_grad(lambda: model.loss(xt, x), view)
        # central differences with h = 1e-6 on a loss of order 1: W_q's gradients are ~1e-4 here, so ~1e-6 noise
        assert rel_err(grads[k], num) <= 1e-5, (k, rel_err(grads[k], num))


def test_bad_options_raise_naming_them():
    with pytest.raises(ValueError, match="block_size"):
        ft.ETransformer(19, 96, 1, 2, 8, 12, 8, attention="bigbird")
    with pytest.raises(ValueError, match="window_blocks"):
        e_model(w=2)
    with pytest.raises(ValueError, match="ETransformer"):
        ft.DTransformer(19, 96, 1, 2, 8, 12, attention="bigbird")
    with pytest.raises(ValueError, match="block_size"):
        ft.ETransformer(19, 96, 1, 2, 8, 12, 8, block_size=4)
    with pytest.raises(ValueError, match="attn_dropout"):
        e_model(attn_dropout=0.1)
    e_model(attn_dropout=0.1, impl="literal")  # the dense listing drops weights as Algorithm 4 does
    model = e_model()
    with pytest.raises(ValueError, match="block_size = 4 does not divide the sequence length 30"):
        model(list(range(15)) * 2)
    with pytest.raises(ValueError, match="too few"):
        model([1] * 20)  # 5 blocks < 2 + 3 + 1
    with pytest.raises(ValueError, match="too few"):
        ft.bigbird_layout(5, 3, 1, 1)
    with pytest.raises(ValueError, match="window_blocks"):
        ft.bigbird_layout(9, 4, 1, 1)
    with pytest.raises(ValueError, match="columns"):
        ft.block_sparse_attention(np.zeros((2, 8)), np.zeros((2, 8)), np.zeros((2, 8)), np.ones((3, 3), bool), 2)


# ---------------------------------------------------------------------------------------------------
# Hugging Face BigBird, attention_type="block_sparse"


def test_equal_to_hugging_face_block_sparse_attention_on_its_layout():
    """HF's BigBirdBlockSparseAttention (transformers 5.x) draws its random blocks with numpy, seeded with the
    layer index, in training mode only (in eval mode every random block is block 0). With every dropout rate 0,
    training mode is deterministic: we record the layout HF drew (its _bigbird_block_rand_mask_with_head), turn it
    into V17's block layout (w = 3, g = 1: rows 0 and n−1 global; row i: blocks i−1, i, i+1, 0, n−1 and HF's
    random blocks of row i for head h), and compare the kernel on HF's own Q, K, V per head with HF's output."""
    torch = torch_or_skip()
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BigBirdConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=64, attention_type="block_sparse",
                                     block_size=4, num_random_blocks=2, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    hf = transformers.BigBirdModel(cfg).double().train()
    n, b, H, d = 12, 4, 2, 8  # ℓ = 48 > (5 + 2r)·b = 36: HF keeps block_sparse
    seen = {}

    for li, layer in enumerate(hf.encoder.layer):
        att = layer.attention.self
        orig = att._bigbird_block_rand_mask_with_head

        def rec(*a, _o=orig, _li=li, **k):
            r = _o(*a, **k)
            seen.setdefault(_li, [np.array(x) for x in r])
            return r
        att._bigbird_block_rand_mask_with_head = rec

        def hook(mod, args, kwargs, out, _li=li):
            seen[("io", _li)] = (kwargs.get("hidden_states", args[0] if args else None), out[0])
        att.register_forward_hook(hook, with_kwargs=True)
    ids = torch.tensor(np.random.default_rng(1).integers(0, 50, size=(1, n * b)))
    with torch.no_grad():
        hf(input_ids=ids)
    for li in range(2):
        att = hf.encoder.layer[li].attention.self
        X, out = seen[("io", li)]
        with torch.no_grad():
            Q, K, V = (m(X)[0].numpy().T for m in (att.query, att.key, att.value))  # (H·d, ℓ)
        rand = seen[li]
        assert len(rand) == H
        for h in range(H):
            Lay = np.zeros((n, n), bool)
            Lay[:, 0] = Lay[:, n - 1] = True
            for i in range(1, n - 1):
                R = rand[h][i - 1]
                fixed = {i - 1, i, i + 1, 0, n - 1}
                assert len(set(R.tolist())) == len(R) and not fixed & set(R.tolist())  # a set, no duplicates
                for j in fixed | set(R.tolist()):
                    Lay[j, i] = True
            rows = slice(h * d, (h + 1) * d)
            Y, _ = ft.block_sparse_attention(Q[rows], K[rows], V[rows], Lay, b)
            want = out[0].detach().numpy().T[rows]
            assert rel_err(Y, want) <= 1e-12, (li, h, rel_err(Y, want))
            assert rel_err(dense(Q[rows], K[rows], V[rows], ref.bigbird_mask(Lay, b)), want) <= 1e-12


def test_save_load_keeps_the_layout_and_exports_refuse(tmp_path):
    model = e_model(r=2)
    randomize(model, np.random.default_rng(8))
    x = np.random.default_rng(9).integers(0, 16, size=40)
    ft.save(model, tmp_path / "m")
    back = ft.load(tmp_path / "m")
    assert back.config["attention"] == "bigbird" and back.config["block_size"] == 4
    assert back.config["n_random_blocks"] == 2 and back.config["layout_seed"] == 7
    assert np.array_equal(np.asarray(back(x)), np.asarray(model(x)))
    with pytest.raises(ValueError, match="attention='bigbird'"):
        ft.to_hf(model)
