"""Algorithms 3, 4, 5 (BasicAttention, Attention, MHAttention) and the masks: native vs reference.py,
vs central finite differences, vs independent PyTorch transcriptions of the listings (autograd), zero-copy
parameters, causality, the `weights` property, and bad input."""
import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref

from conftest import TOL, numeric_grad, rel_err, torch_or_skip

# ---------------------------------------------------------------------------------------------------
# Shapes: (H, d_x, d_z, d_attn, d_mid, d_out, l_x, l_z, mask). Self-attention where d_z = d_x and
# l_z = l_x is marked by `self`; the rest is cross-attention (ℓ_z ≠ ℓ_x, d_z ≠ d_x).
CASES = [
    (1, 4, 4, 3, 5, 6, 1, 1, "bidirectional", True),  # l1-H1-self-bi
    (1, 4, 4, 3, 5, 6, 1, 1, "unidirectional", True),  # l1-H1-self-uni
    (2, 5, 5, 3, 4, 7, 6, 6, "unidirectional", True),  # self-uni
    (3, 5, 7, 2, 4, 6, 4, 9, "bidirectional", False),  # cross-lz>lx
    (2, 6, 3, 4, 3, 5, 7, 3, "unidirectional", False),  # cross-lz<lx-uni
    (2, 4, 5, 3, 2, 8, 5, 6, "explicit", False),  # cross-explicit
    (1, 3, 3, 8, 2, 5, 9, 9, "explicit", True),  # H1-self-explicit
    (3, 6, 4, 5, 2, 3, 1, 5, "bidirectional", False),  # lx1-cross
    (4, 16, 16, 8, 6, 12, 33, 33, "unidirectional", True),  # bigger-self-uni
]
IDS = ['l1-H1-self-bi', 'l1-H1-self-uni', 'self-uni', 'cross-lz>lx', 'cross-lz<lx-uni', 'cross-explicit', 'H1-self-explicit', 'lx1-cross', 'bigger-self-uni']
# a smaller set for the finite-difference and PyTorch gradient checks
GRAD = [0, 2, 3, 4, 5, 7]
GRAD_CASES = [CASES[i] for i in GRAD]
GRAD_IDS = [IDS[i] for i in GRAD]


def make_mask(kind, l_z, l_x, rng):
    """The constructor argument: a string, or a random bool (l_z, l_x) array whose every column keeps an entry."""
    if kind != "explicit":
        return kind
    m = rng.random((l_z, l_x)) < 0.5
    m[rng.integers(0, l_z, size=l_x), np.arange(l_x)] = True
    return m


def mask_matrix(mask, l_z, l_x):
    if isinstance(mask, str):
        return getattr(ref, f"{mask}_mask")(l_z, l_x)
    return mask


def randomize(unit, rng, scale=0.5):
    """Random values for every parameter, biases included (so no test depends on b = 0)."""
    for name in unit.params:
        unit.params[name][...] = scale * rng.standard_normal(unit.params[name].shape)


def check_param_grads(unit, want, tol):
    """unit.grads vs `want` (name -> array), each relative to the largest gradient entry of the whole unit:
    b_k's gradient is exactly 0 in exact arithmetic (adding qᵀb_k to a whole column of scores does not change
    its softmax), so a per-parameter relative error would compare rounding noise with rounding noise."""
    scale = max(float(np.max(np.abs(w))) for w in want.values())
    assert scale > 0
    for name, w in want.items():
        got = np.asarray(unit.grads[name], dtype=np.float64)
        assert got.shape == w.shape, name
        err = float(np.max(np.abs(got - w))) / scale
        assert err <= tol, (name, err)


def params64(unit):
    return {k: np.array(v, dtype=np.float64) for k, v in unit.params.items()}


def build(cls, case, dtype, rng):
    H, d_x, d_z, d_attn, d_mid, d_out, l_x, l_z, kind, self_attn = case
    mask = make_mask(kind, l_z, l_x, rng)
    if cls is ft.MHAttention:
        unit = ft.MHAttention(H, d_x, d_z, d_attn, d_mid, d_out, mask=mask, dtype=dtype)
    else:
        unit = ft.Attention(d_x, d_z, d_attn, d_out, mask=mask, dtype=dtype)
    randomize(unit, rng)
    X = rng.standard_normal((d_x, l_x))
    Z = X if self_attn else rng.standard_normal((d_z, l_z))
    return unit, mask_matrix(mask, l_z, l_x), X.astype(dtype), Z.astype(dtype)


def reference(unit, X, Z, M):
    p = params64(unit)
    X, Z = X.astype(np.float64), Z.astype(np.float64)
    if isinstance(unit, ft.MHAttention):
        return ref.mh_attention(X, Z, p["W_q"], p["b_q"], p["W_k"], p["b_k"], p["W_v"], p["b_v"], p["W_o"], p["b_o"], M)
    return ref.attention(X, Z, p["W_q"], p["b_q"], p["W_k"], p["b_k"], p["W_v"], p["b_v"], M)


# ---------------------------------------------------------------------------------------------------
# Independent PyTorch transcriptions of the listings (column convention, float64, autograd).
def t_attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, mask):
    import torch

    Q = W_q @ X + b_q[:, None]  # line 1
    K = W_k @ Z + b_k[:, None]  # line 2
    V = W_v @ Z + b_v[:, None]  # line 3
    S = K.T @ Q  # line 4
    S = S.masked_fill(~mask, float("-inf"))  # line 5
    return V @ torch.softmax(S / math.sqrt(W_q.shape[0]), dim=0)  # line 6 (softmax over each column)


def t_mh_attention(X, Z, W_q, b_q, W_k, b_k, W_v, b_v, W_o, b_o, mask):
    import torch

    Y = torch.cat([t_attention(X, Z, W_q[h], b_q[h], W_k[h], b_k[h], W_v[h], b_v[h], mask) for h in range(W_q.shape[0])])
    return W_o @ Y + b_o[:, None]


def t_basic_attention(e, E, W_q, b_q, W_k, b_k, W_v, b_v):
    import torch

    q = W_q @ e + b_q  # line 1
    K = W_k @ E + b_k[:, None]  # line 2: column t is k_t
    V = W_v @ E + b_v[:, None]  # line 3
    alpha = torch.softmax(K.T @ q / math.sqrt(W_q.shape[0]), dim=0)  # line 4
    return V @ alpha  # line 5: Σ_t α_t v_t


# ===================================================================================================
# Forward vs reference.py
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
def test_forward_matches_reference(cls, case, dtype, rng):
    unit, M, X, Z = build(cls, case, dtype, rng)
    Y = unit(X, Z)
    assert Y.dtype == np.dtype(dtype)
    assert Y.shape == (unit.d_out, X.shape[1])
    assert rel_err(Y, reference(unit, X, Z, M)) <= TOL[dtype]
    # weights: softmax(S/√d_attn), masked entries exactly 0, columns sum to 1
    p = params64(unit)
    W = unit.weights
    if cls is ft.MHAttention:
        assert W.shape == (unit.H, Z.shape[1], X.shape[1])
        want = np.stack([ref.attention_weights(X.astype(np.float64), Z.astype(np.float64), p["W_q"][h], p["b_q"][h],
                                               p["W_k"][h], p["b_k"][h], M) for h in range(unit.H)])
    else:
        assert W.shape == (Z.shape[1], X.shape[1])
        want = ref.attention_weights(X.astype(np.float64), Z.astype(np.float64), p["W_q"], p["b_q"], p["W_k"], p["b_k"], M)
    assert W.dtype == np.dtype(dtype)
    assert rel_err(W, want) <= TOL[dtype]
    assert np.all(W[..., ~M] == 0)
    np.testing.assert_allclose(W.sum(axis=-2), 1.0, rtol=10 * TOL[dtype])


@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
def test_self_attention_with_z_omitted_is_z_equals_x(cls, rng):
    unit, _, X, _ = build(cls, CASES[2], "float64", rng)
    Y1 = unit(X)
    dX1, dZ1 = unit.backward(np.ones_like(Y1))
    Y2 = unit(X, X)
    dX2, dZ2 = unit.backward(np.ones_like(Y2))
    np.testing.assert_array_equal(Y1, Y2)
    np.testing.assert_array_equal(dX1, dX2)
    np.testing.assert_array_equal(dZ1, dZ2)


@pytest.mark.parametrize("T", [1, 2, 7])
def test_basic_attention_forward_matches_reference(dtype, rng, T):
    d_in, d_attn, d_out = 5, 3, 4
    ba = ft.BasicAttention(d_in, d_attn, d_out, dtype=dtype)
    randomize(ba, rng)
    e = rng.standard_normal(d_in).astype(dtype)
    E = rng.standard_normal((d_in, T)).astype(dtype)
    v = ba(e, E)
    assert v.shape == (d_out,) and v.dtype == np.dtype(dtype)
    p = params64(ba)
    want = ref.basic_attention(e.astype(np.float64), E.astype(np.float64), p["W_q"], p["b_q"], p["W_k"], p["b_k"],
                               p["W_v"], p["b_v"])
    assert rel_err(v, want) <= TOL[dtype]
    # Algorithm 3 = Algorithm 4 with one query and no mask
    alpha = ba.weights
    assert alpha.shape == (T,)
    np.testing.assert_allclose(alpha.sum(), 1.0, rtol=10 * TOL[dtype])
    assert rel_err(alpha, ref.attention_weights(e.astype(np.float64)[:, None], E.astype(np.float64), p["W_q"], p["b_q"],
                                                p["W_k"], p["b_k"], np.ones((T, 1), bool))[:, 0]) <= TOL[dtype]


def test_huge_scores_stay_finite(rng):
    """Softmax is max-subtracted: scores of ±1e4 give exact 0/1 weights, no overflow, no NaN."""
    att = ft.Attention(3, 3, 2, 3, mask="unidirectional", dtype="float64")
    randomize(att, rng)
    X = 300 * rng.standard_normal((3, 6))
    Y = att(X)
    assert np.isfinite(Y).all() and np.isfinite(att.weights).all()
    assert rel_err(Y, reference(att, X, X, ref.unidirectional_mask(6, 6))) <= 1e-12
    dX, dZ = att.backward(np.ones_like(Y))
    assert np.isfinite(dX).all() and np.isfinite(dZ).all()


# ===================================================================================================
# Backward vs finite differences (float64)
def _loss_fd(unit, X, Z, G, self_attn):
    return lambda: float(np.sum(unit(X, X if self_attn else Z) * G))


@pytest.mark.parametrize("case", GRAD_CASES, ids=GRAD_IDS)
@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
def test_backward_matches_finite_differences(cls, case, rng):
    vals = case
    self_attn = vals[-1]
    unit, _, X, Z = build(cls, vals, "float64", rng)
    if self_attn:
        Z = X
    Y = unit(X, Z)
    G = rng.standard_normal(Y.shape)
    unit.zero_grad()
    dX, dZ = unit.backward(G)
    assert dX.shape == X.shape and dZ.shape == Z.shape
    loss = _loss_fd(unit, X, Z, G, self_attn)
    if self_attn:  # Z is X: the gradient of X is dX + dZ
        assert rel_err(dX + dZ, numeric_grad(loss, X)) <= 1e-6
    else:
        assert rel_err(dX, numeric_grad(loss, X)) <= 1e-6
        assert rel_err(dZ, numeric_grad(loss, Z)) <= 1e-6
    check_param_grads(unit, {name: numeric_grad(loss, unit.params[name]) for name in unit.params}, 1e-6)
    assert abs(unit.grads["b_k"]).max() <= 1e-12 * abs(unit.grads["W_q"]).max()  # see check_param_grads


@pytest.mark.parametrize("T", [1, 4])
def test_basic_attention_backward_matches_finite_differences(rng, T):
    ba = ft.BasicAttention(4, 3, 5, dtype="float64")
    randomize(ba, rng)
    e, E, g = rng.standard_normal(4), rng.standard_normal((4, T)), rng.standard_normal(5)
    ba(e, E)
    ba.zero_grad()
    de, dE = ba.backward(g)
    assert de.shape == (4,) and dE.shape == (4, T)
    loss = lambda: float(ba(e, E) @ g)
    assert rel_err(de, numeric_grad(loss, e)) <= 1e-6
    assert rel_err(dE, numeric_grad(loss, E)) <= 1e-6
    check_param_grads(ba, {name: numeric_grad(loss, ba.params[name]) for name in ba.params}, 1e-6)


# ===================================================================================================
# Forward and backward vs PyTorch autograd on the same weights
@pytest.mark.parametrize("case", GRAD_CASES, ids=GRAD_IDS)
@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
def test_matches_torch_autograd(cls, case, rng):
    torch = torch_or_skip()
    vals = case
    self_attn = vals[-1]
    unit, M, X, Z = build(cls, vals, "float64", rng)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params64(unit).items()}
    tX = torch.tensor(X, requires_grad=True)
    tZ = tX if self_attn else torch.tensor(Z, requires_grad=True)
    tM = torch.from_numpy(np.ascontiguousarray(M))
    if cls is ft.MHAttention:
        tY = t_mh_attention(tX, tZ, *(tp[k] for k in ["W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o"]), tM)
    else:
        tY = t_attention(tX, tZ, *(tp[k] for k in ["W_q", "b_q", "W_k", "b_k", "W_v", "b_v"]), tM)
    G = rng.standard_normal(tuple(tY.shape))
    (tY * torch.from_numpy(G)).sum().backward()
    Y = unit(X) if self_attn else unit(X, Z)
    assert rel_err(Y, tY.detach().numpy()) <= 1e-12
    unit.zero_grad()
    dX, dZ = unit.backward(G)
    if self_attn:
        assert rel_err(dX + dZ, tX.grad.numpy()) <= 1e-8
    else:
        assert rel_err(dX, tX.grad.numpy()) <= 1e-8
        assert rel_err(dZ, tZ.grad.numpy()) <= 1e-8
    check_param_grads(unit, {name: t.grad.numpy() for name, t in tp.items()}, 1e-8)


def test_basic_attention_matches_torch_autograd(rng):
    torch = torch_or_skip()
    ba = ft.BasicAttention(6, 4, 3, dtype="float64")
    randomize(ba, rng)
    e, E, g = rng.standard_normal(6), rng.standard_normal((6, 5)), rng.standard_normal(3)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params64(ba).items()}
    te, tE = torch.tensor(e, requires_grad=True), torch.tensor(E, requires_grad=True)
    tv = t_basic_attention(te, tE, *(tp[k] for k in ["W_q", "b_q", "W_k", "b_k", "W_v", "b_v"]))
    (tv * torch.from_numpy(g)).sum().backward()
    assert rel_err(ba(e, E), tv.detach().numpy()) <= 1e-12
    ba.zero_grad()
    de, dE = ba.backward(g)
    assert rel_err(de, te.grad.numpy()) <= 1e-8
    assert rel_err(dE, tE.grad.numpy()) <= 1e-8
    check_param_grads(ba, {name: t.grad.numpy() for name, t in tp.items()}, 1e-8)


def test_float32_backward_close_to_float64(rng):
    case = CASES[3]
    u64, _, X, Z = build(ft.MHAttention, case, "float64", rng)
    u32 = ft.MHAttention(*case[:6], mask=case[8], dtype="float32")
    for k in u64.params:
        u32.params[k] = u64.params[k]
    G = rng.standard_normal((case[5], case[6]))
    u64(X, Z)
    u32(X.astype(np.float32), Z.astype(np.float32))
    d64, d32 = u64.backward(G), u32.backward(G.astype(np.float32))
    assert d32[0].dtype == np.float32
    for a, b in zip(d32, d64):
        assert rel_err(a, b) <= 1e-5
    check_param_grads(u32, {k: np.array(v) for k, v in u64.grads.items()}, 1e-5)


# ===================================================================================================
# Masks
@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
@pytest.mark.parametrize("t", [0, 3, 6])
def test_unidirectional_is_causal(cls, rng, t):
    """Changing X[:, t+1:] must not change the output's first t+1 columns (and bidirectional does)."""
    l = 8
    args = (2, 5, 5, 3, 4, 6) if cls is ft.MHAttention else (5, 5, 3, 6)
    for mask in ["unidirectional", "bidirectional"]:
        unit = cls(*args, mask=mask, dtype="float64", seed=3)
        randomize(unit, rng)
        X = rng.standard_normal((5, l))
        Y = unit(X)
        X2 = X.copy()
        X2[:, t + 1:] = 10 * rng.standard_normal((5, l - t - 1))
        Y2 = unit(X2)
        if mask == "unidirectional":
            np.testing.assert_array_equal(Y2[:, : t + 1], Y[:, : t + 1])
            # the gradient does not flow backwards in time either
            G = np.zeros_like(Y)
            G[:, : t + 1] = rng.standard_normal((Y.shape[0], t + 1))
            dX, dZ = unit.backward(G)
            assert not np.any((dX + dZ)[:, t + 1:])
        else:  # the control: the same change is visible without the mask
            assert not np.allclose(Y2[:, : t + 1], Y[:, : t + 1])


def test_unidirectional_cross_attention_is_causal_in_z(rng):
    att = ft.MHAttention(2, 4, 3, 3, 2, 5, mask="unidirectional", dtype="float64")
    randomize(att, rng)
    X, Z = rng.standard_normal((4, 6)), rng.standard_normal((3, 9))
    Y = att(X, Z)
    Z2 = Z.copy()
    Z2[:, 3:] += 1.0  # context tokens 3.. are visible only to queries t_x ≥ 3
    np.testing.assert_array_equal(att(X, Z2)[:, :3], Y[:, :3])


def test_explicit_mask_masks_exactly_its_false_entries(rng):
    m = np.array([[True, False, True], [False, False, True], [True, True, False], [False, True, True]])
    att = ft.Attention(3, 2, 2, 4, mask=m, dtype="float64")
    randomize(att, rng)
    X, Z = rng.standard_normal((3, 3)), rng.standard_normal((2, 4))
    Y = att(X, Z)
    assert rel_err(Y, reference(att, X, Z, m)) <= 1e-12
    assert np.all(att.weights[~m] == 0) and np.all(att.weights[m] > 0)
    np.testing.assert_array_equal(att.mask, m)
    att.mask[0, 0] = False  # a copy: the hyperparameter does not change
    np.testing.assert_array_equal(att.mask, m)
    assert ft.Attention(3, 3, 2, 2, mask="unidirectional").mask == "unidirectional"
    # a mask given as a nested list of bools works too
    att2 = ft.Attention(3, 2, 2, 4, mask=m.tolist(), dtype="float64")
    np.testing.assert_array_equal(att2.mask, m)


@pytest.mark.parametrize("l_z,l_x", [(1, 1), (3, 3), (2, 5), (6, 2)])
def test_mask_free_functions(l_z, l_x):
    for name in ["bidirectional_mask", "unidirectional_mask"]:
        got = getattr(ft, name)(l_z, l_x)
        assert got.dtype == np.bool_ and got.shape == (l_z, l_x)
        np.testing.assert_array_equal(got, getattr(ref, name)(l_z, l_x))
    np.testing.assert_array_equal(ft.unidirectional_mask(4), ref.unidirectional_mask(4, 4))
    with pytest.raises(ValueError, match="l_z"):
        ft.unidirectional_mask(0, 3)
    with pytest.raises(ValueError, match="l_x"):
        ft.bidirectional_mask(2, -1)


def test_explicit_mask_as_a_free_function_result_equals_the_string_kind(rng):
    l = 5
    a = ft.MHAttention(2, 4, 4, 3, 3, 4, mask="unidirectional", dtype="float64", seed=7)
    b = ft.MHAttention(2, 4, 4, 3, 3, 4, mask=ft.unidirectional_mask(l, l), dtype="float64", seed=7)
    X = rng.standard_normal((4, l))
    assert rel_err(b(X), a(X)) <= 1e-15


@pytest.mark.parametrize(
    "mask,exc,msg",
    [
        ("causal", ValueError, "bidirectional"),
        (None, TypeError, "None"),
        (3, TypeError, "int"),
        (np.ones((3, 3), dtype=np.int64), TypeError, "bool"),
        (np.ones((3, 3), dtype=np.float64), TypeError, "bool"),
        (np.ones(3, dtype=bool), ValueError, "2-D"),
        (np.ones((0, 3), dtype=bool), ValueError, "empty"),
        (np.array([[True, False, True], [True, False, False]]), ValueError, "column 1 is all False"),
    ],
)
def test_bad_masks(mask, exc, msg):
    for make in [lambda: ft.Attention(3, 3, 2, 2, mask=mask), lambda: ft.MHAttention(2, 3, 3, 2, 2, 2, mask=mask)]:
        with pytest.raises(exc, match=msg):
            make()


@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
def test_explicit_mask_shape_must_match_the_call(cls, rng):
    args = (2, 3, 3, 2, 2, 4) if cls is ft.MHAttention else (3, 3, 2, 4)
    unit = cls(*args, mask=ref.unidirectional_mask(4, 5))
    unit(rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32))
    for l_x, l_z in [(4, 4), (5, 5), (3, 4), (5, 3)]:
        with pytest.raises(ValueError, match=r"mask has shape \(4, 5\)"):
            unit(np.zeros((3, l_x), np.float32), np.zeros((3, l_z), np.float32))


# ===================================================================================================
# Parameters: zero-copy views, accumulation, initialisation
@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention, ft.BasicAttention])
def test_params_shapes_as_api(cls):
    if cls is ft.MHAttention:
        unit = cls(3, 5, 7, 2, 4, 6)
        want = {"W_q": (3, 2, 5), "b_q": (3, 2), "W_k": (3, 2, 7), "b_k": (3, 2), "W_v": (3, 4, 7), "b_v": (3, 4),
                "W_o": (6, 12), "b_o": (6,)}
    elif cls is ft.Attention:
        unit = cls(5, 7, 2, 6)
        want = {"W_q": (2, 5), "b_q": (2,), "W_k": (2, 7), "b_k": (2,), "W_v": (6, 7), "b_v": (6,)}
    else:
        unit = cls(5, 2, 6)
        want = {"W_q": (2, 5), "b_q": (2,), "W_k": (2, 5), "b_k": (2,), "W_v": (6, 5), "b_v": (6,)}
    assert {k: v.shape for k, v in unit.params.items()} == want
    assert {k: v.shape for k, v in unit.grads.items()} == want
    assert all(v.dtype == np.float32 for v in unit.params.values())
    assert all(v.flags.writeable for v in unit.params.values())


@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
def test_writing_params_changes_the_next_output_and_views_stay_valid(cls, rng):
    unit, M, X, Z = build(cls, CASES[3], "float64", rng)
    W_v, b_o = unit.params["W_v"], unit.params["b_v" if cls is ft.Attention else "b_o"]
    Y0 = unit(X, Z)
    b_o[...] += 1.0  # zero-copy: the next call sees it (the output shifts by 1 in every entry)
    np.testing.assert_allclose(unit(X, Z), Y0 + 1.0, rtol=1e-13, atol=1e-13)
    W_v[...] = 0.0
    assert rel_err(unit(X, Z), reference(unit, X, Z, M)) <= 1e-12
    unit.params["W_v"] = rng.standard_normal(W_v.shape)  # assignment copies into the same storage
    assert np.shares_memory(W_v, unit.params["W_v"])
    # many calls of different lengths: the views never go stale (no reallocation behind numpy's back)
    grads = unit.grads["W_q"]
    for _ in range(100):
        Xl = rng.standard_normal((X.shape[0], int(rng.integers(1, 40))))
        Zl = rng.standard_normal((Z.shape[0], int(rng.integers(1, 40))))
        Y = unit(Xl, Zl)
        unit.backward(np.ones_like(Y))
    assert np.shares_memory(W_v, unit.params["W_v"]) and np.shares_memory(grads, unit.grads["W_q"])
    W_v[...] = 0.0
    b_o[...] = 2.0
    Y = unit(X, Z)
    if cls is ft.Attention:  # Ṽ = V A with V = b_v 1ᵀ = 2, and the columns of A sum to 1
        np.testing.assert_allclose(Y, 2.0, rtol=1e-15)
    assert rel_err(Y, reference(unit, X, Z, M)) <= 1e-12
    assert np.any(grads != 0)
    unit.zero_grad()
    assert not np.any(grads)


def small_unit_forward(cls, rng):
    """A small float64 unit of class cls (random parameters) and its output on a random X (3×5): (unit, Y)."""
    unit = {ft.Attention: lambda: cls(3, 3, 2, 4, dtype="float64"),
            ft.MHAttention: lambda: cls(2, 3, 3, 2, 2, 4, dtype="float64"),
            ft.BasicAttention: lambda: cls(3, 2, 4, dtype="float64")}[cls]()
    randomize(unit, rng)
    X = rng.standard_normal((3, 5))
    return unit, (unit(X[:, 0], X) if cls is ft.BasicAttention else unit(X))


@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention, ft.BasicAttention])
def test_grads_accumulate_until_zero_grad(cls, rng):
    unit, Y = small_unit_forward(cls, rng)
    G = rng.standard_normal(Y.shape)
    unit.backward(G)
    g1 = {k: v.copy() for k, v in unit.grads.items()}
    unit.backward(G)
    check_param_grads(unit, {k: 2 * v for k, v in g1.items()}, 1e-14)
    unit.zero_grad()
    assert not any(np.any(v) for v in unit.grads.values())


def test_backward_uses_copies_of_the_inputs(rng):
    """The user may overwrite X, Z after the call: backward differentiates the call that happened."""
    att = ft.MHAttention(2, 4, 3, 3, 2, 5, dtype="float64")
    X, Z = rng.standard_normal((4, 6)), rng.standard_normal((3, 7))
    G = rng.standard_normal((5, 6))
    att(X, Z)
    want = att.backward(G)
    gw = {k: v.copy() for k, v in att.grads.items()}
    att.zero_grad()
    att(X, Z)
    X[:] = 0.0
    Z[:] = np.nan
    got = att.backward(G)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    for k in gw:
        np.testing.assert_array_equal(att.grads[k], gw[k])


@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention, ft.BasicAttention])
def test_initialisation_is_seeded_normal_over_fan_in_and_zero_bias(cls):
    if cls is ft.MHAttention:
        make = lambda seed: cls(4, 64, 48, 32, 16, 40, seed=seed, dtype="float64")
        fan = {"W_q": 64, "W_k": 48, "W_v": 48, "W_o": 64}
    elif cls is ft.Attention:
        make = lambda seed: cls(64, 48, 32, 40, seed=seed, dtype="float64")
        fan = {"W_q": 64, "W_k": 48, "W_v": 48}
    else:
        make = lambda seed: cls(64, 32, 40, seed=seed, dtype="float64")
        fan = {"W_q": 64, "W_k": 64, "W_v": 64}
    a, b, c = make(0), make(0), make(1)
    for k, v in a.params.items():
        np.testing.assert_array_equal(v, b.params[k])
        if k.startswith("b_"):
            assert not np.any(v)
        else:
            assert not np.array_equal(v, c.params[k])
            std = np.std(v)
            assert abs(std * math.sqrt(fan[k]) - 1) < 0.1, (k, std)  # ≥1280 draws: ±3% at 1σ
            assert abs(np.mean(v)) < 4 * std / math.sqrt(v.size)


# ===================================================================================================
# Input handling
@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
def test_any_layout_and_precision_is_accepted_and_equal(cls, rng):
    unit, _, X, Z = build(cls, CASES[3], "float64", rng)
    Y = unit(X, Z)
    bigX = rng.standard_normal((2 * X.shape[0], 3 * X.shape[1]))
    bigX[::2, ::3] = X
    np.testing.assert_array_equal(unit(bigX[::2, ::3], Z), Y)  # non-contiguous view: same result
    np.testing.assert_array_equal(unit(np.ascontiguousarray(X), np.asfortranarray(Z)), Y)  # C and F order
    np.testing.assert_array_equal(unit(X.T.copy().T, Z.tolist()), Y)  # lists are arrays too
    np.testing.assert_array_equal(unit(X.astype(np.float32), Z), unit(X.astype(np.float32).astype(np.float64), Z))
    dY = rng.standard_normal(Y.shape)
    unit(X, Z)
    want = unit.backward(dY)
    bigY = np.zeros((dY.shape[0], 2 * dY.shape[1]))
    bigY[:, ::2] = dY
    unit(X, Z)
    got = unit.backward(bigY[:, ::2])
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
@pytest.mark.parametrize(
    "X,Z,exc,msg",
    [
        (np.zeros((4, 2)), np.zeros((3, 2)), ValueError, "X has 4 rows but d_x = 3"),
        (np.zeros((3, 2)), np.zeros((5, 2)), ValueError, "Z has 5 rows but d_z = 3"),
        (np.zeros(3), np.zeros((3, 2)), ValueError, "2-D"),
        (np.zeros((3, 2, 1)), np.zeros((3, 2)), ValueError, "2-D"),
        (np.zeros((3, 0)), np.zeros((3, 2)), ValueError, "empty"),
        (np.zeros((3, 2)), np.zeros((3, 0)), ValueError, "empty"),
        (np.zeros((3, 2), dtype=np.int64), np.zeros((3, 2)), TypeError, "float"),
        (np.zeros((3, 2)), np.zeros((3, 2), dtype=np.complex128), TypeError, "float"),
        (np.zeros((3, 2)), np.zeros((3, 2), dtype=bool), TypeError, "float"),
        ("abc", np.zeros((3, 2)), TypeError, "array"),
        (None, np.zeros((3, 2)), TypeError, "None"),
    ],
)
def test_bad_input_raises_clear_errors(cls, X, Z, exc, msg):
    unit = cls(2, 3, 3, 2, 2, 4) if cls is ft.MHAttention else cls(3, 3, 2, 4)
    with pytest.raises(exc, match=msg):
        unit(X, Z)


@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
def test_backward_misuse_and_bad_hyperparameters(cls):
    unit = cls(2, 3, 3, 2, 2, 4) if cls is ft.MHAttention else cls(3, 3, 2, 4)
    assert unit.weights is None
    with pytest.raises(ValueError, match="before"):
        unit.backward(np.zeros((4, 1), np.float32))
    unit(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="columns"):
        unit.backward(np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="rows"):
        unit.backward(np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="float"):
        unit.backward(np.zeros((4, 2), np.int32))
    with pytest.raises(ValueError, match="shape"):
        unit.params["W_q"] = np.zeros((1, 1))
    with pytest.raises(KeyError):
        unit.params["W_x"]
    names = ["H", "d_x", "d_z", "d_attn", "d_mid", "d_out"] if cls is ft.MHAttention else ["d_x", "d_z", "d_attn", "d_out"]
    for i, name in enumerate(names):
        args = [2] * len(names)
        args[i] = 0
        with pytest.raises(ValueError, match=name):
            cls(*args)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        cls(*[2] * len(names), dtype="int32")
    with pytest.raises(ValueError, match="seed"):
        cls(*[2] * len(names), seed=-1)


def test_basic_attention_bad_input():
    ba = ft.BasicAttention(3, 2, 4)
    assert ba.weights is None
    with pytest.raises(ValueError, match="before"):
        ba.backward(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="one token vector"):
        ba(np.zeros((3, 2)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="e has 4 rows but d_in = 3"):
        ba(np.zeros(4), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="E has 2 rows"):
        ba(np.zeros(3), np.zeros((2, 5)))
    with pytest.raises(ValueError, match="empty"):
        ba(np.zeros(3), np.zeros((3, 0)))
    with pytest.raises(TypeError, match="float"):
        ba(np.zeros(3, dtype=int), np.zeros((3, 5)))
    ba(np.zeros(3), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="rows"):
        ba.backward(np.zeros(3))
    with pytest.raises(ValueError, match="d_attn"):
        ft.BasicAttention(3, 0, 4)


@pytest.mark.parametrize("cls", [ft.Attention, ft.MHAttention])
def test_nan_propagates_as_in_numpy(cls, rng):
    """Documented: NaN in an input is not an error; it propagates exactly where numpy's arithmetic of the
    listing (reference.py) puts it. A NaN query column stays in its column; a NaN context token reaches
    every query that multiplies it (0 · NaN = NaN, as in numpy)."""
    for mask in ["bidirectional", "unidirectional"]:
        unit = cls(2, 3, 3, 2, 2, 4, mask=mask, dtype="float64") if cls is ft.MHAttention else \
            cls(3, 3, 2, 4, mask=mask, dtype="float64")
        randomize(unit, rng)
        X, Z = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
        X[1, 2] = np.nan
        Y = unit(X, Z)
        want = reference(unit, X, Z, mask_matrix(mask, 5, 5))
        np.testing.assert_array_equal(np.isnan(Y), np.isnan(want))
        assert np.isnan(Y[:, 2]).all() and not np.isnan(np.delete(Y, 2, axis=1)).any()
        Z[0, 3] = np.nan
        Y = unit(X, Z)
        np.testing.assert_array_equal(np.isnan(Y), np.isnan(reference(unit, X, Z, mask_matrix(mask, 5, 5))))
        unit.backward(np.ones_like(Y))  # no crash


def test_repr_names_the_hyperparameters():
    assert repr(ft.MHAttention(2, 3, 4, 5, 6, 7, mask="unidirectional")) == (
        "MHAttention(H=2, d_x=3, d_z=4, d_attn=5, d_mid=6, d_out=7, mask='unidirectional', dtype='float32')")
    assert "mask=<bool array (2, 3)>" in repr(ft.Attention(1, 1, 1, 1, mask=np.ones((2, 3), bool), dtype="float64"))
    assert repr(ft.BasicAttention(2, 3, 4)) == "BasicAttention(d_in=2, d_attn=3, d_out=4, dtype='float32')"
    for cls in [ft.BasicAttention, ft.Attention, ft.MHAttention]:
        assert "Algorithm" in cls.__doc__ and "backward" in cls.__doc__ and "Parameters" in cls.__doc__


@pytest.mark.parametrize("cls", [ft.BasicAttention, ft.Attention, ft.MHAttention])
def test_sgd_step_is_theta_minus_eta_grad(cls, rng):
    unit, Y = small_unit_forward(cls, rng)
    unit.backward(rng.standard_normal(Y.shape))
    before = {k: v.copy() for k, v in unit.params.items()}
    grads = {k: v.copy() for k, v in unit.grads.items()}
    ft.SGD(0.05).step(unit)
    for k in before:
        np.testing.assert_allclose(unit.params[k], before[k] - 0.05 * grads[k], rtol=1e-15, atol=1e-16)
