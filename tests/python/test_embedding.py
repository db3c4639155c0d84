"""Algorithms 1 and 2 (TokenEmbedding, PositionalEmbedding): native vs reference.py, scatter-add backward vs
numpy, finite differences and PyTorch autograd, the paper's sinusoidal W_p (frozen), zero-copy parameters,
and bad ids / positions."""
import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref

from conftest import TOL, numeric_grad, rel_err, torch_or_skip


# ===================================================================================================
# Algorithm 1
@pytest.mark.parametrize("n_vocab,d_e,l", [(1, 1, 1), (5, 3, 1), (7, 4, 9), (50, 16, 33), (300, 8, 200)])
def test_token_embedding_forward_matches_reference(dtype, rng, n_vocab, d_e, l):
    te = ft.TokenEmbedding(n_vocab, d_e, dtype=dtype, seed=1)
    ids = rng.integers(0, n_vocab, size=l)
    E = te(ids)
    assert E.shape == (d_e, l) and E.dtype == np.dtype(dtype)
    want = ref.token_embedding(ids, te.params["W_e"].astype(np.float64))
    assert rel_err(E, want) <= TOL[dtype]
    np.testing.assert_array_equal(E, te.params["W_e"][:, ids])  # a gather: exact
    # one id -> one vector (d_e,)
    e = te(int(ids[0]))
    assert e.shape == (d_e,)
    np.testing.assert_array_equal(e, want[:, 0])


@pytest.mark.parametrize("make", [
    lambda a: a.astype(np.int8), lambda a: a.astype(np.uint8), lambda a: a.astype(np.int16),
    lambda a: a.astype(np.uint32), lambda a: a.astype(np.int64), lambda a: a.astype(np.uint64),
    lambda a: a.tolist(), lambda a: tuple(a.tolist()), lambda a: a[::-1][::-1], lambda a: np.repeat(a, 2)[::2],
])
def test_any_integer_ids_are_accepted(make):
    te = ft.TokenEmbedding(10, 3, dtype="float64")
    ids = np.array([3, 0, 9, 3])
    np.testing.assert_array_equal(te(make(ids)), te.params["W_e"][:, ids])


def test_scalar_ids_of_any_integer_type():
    te = ft.TokenEmbedding(10, 3, dtype="float64")
    for v in [7, np.int64(7), np.uint8(7), np.int32(7), np.array(7)]:
        e = te(v)
        assert e.shape == (3,)
        np.testing.assert_array_equal(e, te.params["W_e"][:, 7])


def test_token_embedding_backward_scatter_adds(rng):
    n_vocab, d_e = 6, 4
    te = ft.TokenEmbedding(n_vocab, d_e, dtype="float64")
    ids = np.array([5, 1, 5, 5, 0, 1])
    dE = rng.standard_normal((d_e, ids.size))
    te(ids)
    assert te.backward(dE) is None  # ids have no gradient
    want = np.zeros((d_e, n_vocab))
    np.add.at(want.T, ids, dE.T)  # repeated ids: every column is added
    np.testing.assert_allclose(te.grads["W_e"], want, rtol=1e-15)
    assert not te.grads["W_e"][:, [2, 3, 4]].any()
    # a scalar call takes a vector dE
    te.zero_grad()
    te(3)
    te.backward(np.arange(4.0))
    np.testing.assert_array_equal(te.grads["W_e"][:, 3], np.arange(4.0))


def test_token_embedding_backward_matches_finite_differences_and_torch(rng):
    n_vocab, d_e = 7, 3
    te = ft.TokenEmbedding(n_vocab, d_e, dtype="float64", seed=5)
    ids = np.array([2, 6, 2, 0, 2])
    G = rng.standard_normal((d_e, ids.size))
    loss = lambda: float(np.sum(te(ids) * G))
    te(ids)
    te.zero_grad()
    te.backward(G)
    assert rel_err(te.grads["W_e"], numeric_grad(loss, te.params["W_e"])) <= 1e-6
    # an independent PyTorch transcription of Algorithm 1: e = W_e[:, v]
    torch = torch_or_skip()
    W_e = torch.tensor(te.params["W_e"].copy(), requires_grad=True)
    E = W_e[:, torch.from_numpy(ids)]
    (E * torch.from_numpy(G)).sum().backward()
    assert rel_err(te(ids), E.detach().numpy()) <= 1e-12
    assert rel_err(te.grads["W_e"], W_e.grad.numpy()) <= 1e-8


def test_token_embedding_float32_backward_close_to_float64(rng):
    t32 = ft.TokenEmbedding(9, 5, dtype="float32")
    t64 = ft.TokenEmbedding(9, 5, dtype="float64")
    ids = rng.integers(0, 9, size=30)
    G = rng.standard_normal((5, 30))
    t32(ids), t64(ids)
    t32.backward(G.astype(np.float32))
    t64.backward(G)
    assert t32.grads["W_e"].dtype == np.float32
    assert rel_err(t32.grads["W_e"], t64.grads["W_e"]) <= 1e-5


def test_token_embedding_init_is_seeded_standard_normal():
    a, b, c = (ft.TokenEmbedding(200, 50, dtype="float64", seed=s) for s in (0, 0, 1))
    np.testing.assert_array_equal(a.params["W_e"], b.params["W_e"])
    assert not np.array_equal(a.params["W_e"], c.params["W_e"])
    W = a.params["W_e"]
    n = W.size  # 10⁴ draws of N(0, 1): within 4 standard errors
    assert abs(W.mean()) < 4 / math.sqrt(n) and abs(W.std() - 1) < 4 / math.sqrt(2 * n)
    # float32 holds the same draws, rounded
    np.testing.assert_array_equal(ft.TokenEmbedding(200, 50, seed=0).params["W_e"], W.astype(np.float32))


def test_token_embedding_params_are_zero_copy_and_stay_valid(rng):
    te = ft.TokenEmbedding(8, 3, dtype="float64")
    W = te.params["W_e"]
    assert W.shape == (3, 8) and W.flags.writeable
    assert list(te.params.keys()) == ["W_e"] and list(te.grads.keys()) == ["W_e"]
    W[:, 4] = [1.0, 2.0, 3.0]  # write into the view: the next call sees it
    np.testing.assert_array_equal(te(4), [1.0, 2.0, 3.0])
    te.params["W_e"] = np.ones((3, 8))  # assignment copies into the storage
    np.testing.assert_array_equal(te([0, 7]), np.ones((3, 2)))
    g = te.grads["W_e"]
    for _ in range(200):
        ids = rng.integers(0, 8, size=int(rng.integers(1, 60)))
        te(ids)
        te.backward(np.ones((3, ids.size)))
    assert np.shares_memory(W, te.params["W_e"]) and np.shares_memory(g, te.grads["W_e"])
    W[:, 2] = -5.0
    np.testing.assert_array_equal(te(2), [-5.0, -5.0, -5.0])
    assert g.sum() > 0
    te.zero_grad()
    assert not g.any()


@pytest.mark.parametrize(
    "ids,exc,msg",
    [
        (np.array([1, 10, 2]), IndexError, r"token id 10 at position 1 is out of range \[0, 10\)"),
        (np.array([1, 2, -1]), IndexError, r"token id -1 at position 2"),
        (10, IndexError, "token id 10"),
        (-3, IndexError, "token id -3"),
        ([0, 99], IndexError, "token id 99 at position 1"),
        (2**70, IndexError, "token id 1180591620717411303424 is out of range"),
        (np.uint64(2**63), IndexError, "token id 9223372036854775808 is out of range"),
        (np.array([3, 2**63 + 5], dtype=np.uint64), IndexError, "token id 9223372036854775813 at position 1"),
        (np.array([1.0, 2.0]), TypeError, "integer"),
        (1.0, TypeError, "float"),
        (True, TypeError, "bool"),
        (np.array([True, False]), TypeError, "integer"),
        (np.array([np.nan]), TypeError, "integer"),  # NaN cannot be an id
        (np.array([], dtype=np.int64), ValueError, "empty"),
        ([], ValueError, "empty"),
        (np.zeros((2, 3), dtype=np.int64), ValueError, "1-D"),
        ("abc", TypeError, "array"),
        (None, TypeError, "None"),
    ],
)
def test_token_embedding_bad_ids(ids, exc, msg):
    te = ft.TokenEmbedding(10, 3)
    with pytest.raises(exc, match=msg):
        te(ids)


def test_token_embedding_bad_backward_and_hyperparameters():
    te = ft.TokenEmbedding(10, 3)
    with pytest.raises(ValueError, match="before"):
        te.backward(np.zeros(3, np.float32))
    te([1, 2])
    with pytest.raises(ValueError, match="columns"):
        te.backward(np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match="rows"):
        te.backward(np.zeros((4, 2), np.float32))
    with pytest.raises(TypeError, match="float"):
        te.backward(np.zeros((3, 2), np.int64))
    g = te.grads["W_e"].copy()
    with pytest.raises(ValueError):
        te.backward(np.zeros((3, 5), np.float32))
    np.testing.assert_array_equal(te.grads["W_e"], g)  # nothing half-updated
    with pytest.raises(ValueError, match="n_vocab"):
        ft.TokenEmbedding(0, 3)
    with pytest.raises(ValueError, match="d_e"):
        ft.TokenEmbedding(3, -1)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        ft.TokenEmbedding(3, 3, dtype="int64")
    with pytest.raises(ValueError, match="seed"):
        ft.TokenEmbedding(3, 3, seed=-1)
    with pytest.raises(TypeError):
        ft.TokenEmbedding(3, 3, "float64")  # dtype is keyword-only
    with pytest.raises(ValueError, match="shape"):
        te.params["W_e"] = np.zeros((10, 3))


def test_nan_in_dE_stays_in_its_token_column():
    """Documented: NaN is not an error; it propagates as numpy's np.add.at would."""
    te = ft.TokenEmbedding(5, 2, dtype="float64")
    te([1, 3, 1])
    dE = np.ones((2, 3))
    dE[0, 1] = np.nan
    te.backward(dE)
    want = np.zeros((2, 5))
    np.add.at(want.T, [1, 3, 1], dE.T)
    np.testing.assert_array_equal(np.isnan(te.grads["W_e"]), np.isnan(want))
    assert np.isnan(te.grads["W_e"][0, 3]) and not np.isnan(te.grads["W_e"][:, 1]).any()


# ===================================================================================================
# Algorithm 2
@pytest.mark.parametrize("l_max,d_e", [(1, 1), (4, 5), (16, 8), (64, 33), (512, 64)])
@pytest.mark.parametrize("base", [None, 10000.0])
def test_sinusoidal_is_the_papers_formula(dtype, l_max, d_e, base):
    pe = ft.PositionalEmbedding(l_max, d_e, "sinusoidal", base=base, dtype=dtype)
    W = pe.params["W_p"]
    assert W.shape == (d_e, l_max) and W.dtype == np.dtype(dtype)
    assert rel_err(W, ref.sinusoidal_positions(l_max, d_e, base)) <= TOL[dtype]
    assert pe.base == (float(l_max) if base is None else base)
    # whole columns come out of a call
    t = np.arange(l_max)
    assert rel_err(pe(t), ref.sinusoidal_positions(l_max, d_e, base)) <= TOL[dtype]


def test_sinusoidal_tiny_case_by_hand():
    """ℓ_max = 4, d_e = 5 typed in from the paper's formula with 1-based i and t (column j holds t = j+1)."""
    pe = ft.PositionalEmbedding(4, 5, kind="sinusoidal", dtype="float64")
    want = np.empty((5, 4))
    for j in range(4):
        t = j + 1
        want[:, j] = [math.sin(t / 4 ** (2 / 5)), math.cos(t / 4 ** (2 / 5)), math.sin(t / 4 ** (4 / 5)),
                      math.cos(t / 4 ** (4 / 5)), math.sin(t / 4 ** (6 / 5))]
    np.testing.assert_allclose(pe.params["W_p"], want, rtol=1e-15, atol=1e-16)
    np.testing.assert_allclose(pe(0), want[:, 0], rtol=1e-15)
    assert pe(0)[0] == pytest.approx(0.5432885103126853, rel=1e-15)


def test_sinusoidal_is_frozen(rng):
    pe = ft.PositionalEmbedding(6, 4, "sinusoidal", dtype="float64")
    W0 = pe.params["W_p"].copy()
    pe(np.array([0, 5, 5]))
    pe.backward(rng.standard_normal((4, 3)))
    assert not pe.grads["W_p"].any()  # backward adds nothing to a fixed W_p
    np.testing.assert_array_equal(pe.params["W_p"], W0)
    assert "frozen" in ft.PositionalEmbedding.__doc__.lower()


@pytest.mark.parametrize("l_max,d_e,n", [(1, 3, 1), (5, 2, 1), (9, 4, 12), (128, 32, 64)])
def test_learned_positional_forward_matches_reference(dtype, rng, l_max, d_e, n):
    pe = ft.PositionalEmbedding(l_max, d_e, dtype=dtype, seed=3)
    t = rng.integers(0, l_max, size=n)
    E = pe(t)
    assert E.shape == (d_e, n) and E.dtype == np.dtype(dtype)
    assert rel_err(E, ref.positional_embedding(t, pe.params["W_p"].astype(np.float64))) <= TOL[dtype]
    e = pe(int(t[-1]))
    assert e.shape == (d_e,)
    np.testing.assert_array_equal(e, pe.params["W_p"][:, t[-1]])


def test_learned_positional_backward_matches_numpy_fd_and_torch(rng):
    l_max, d_e = 6, 3
    pe = ft.PositionalEmbedding(l_max, d_e, dtype="float64", seed=9)
    t = np.array([0, 1, 2, 3, 1, 1])
    G = rng.standard_normal((d_e, t.size))
    pe(t)
    assert pe.backward(G) is None
    want = np.zeros((d_e, l_max))
    np.add.at(want.T, t, G.T)
    np.testing.assert_allclose(pe.grads["W_p"], want, rtol=1e-15)
    pe.zero_grad()
    loss = lambda: float(np.sum(pe(t) * G))
    pe(t)
    pe.backward(G)
    assert rel_err(pe.grads["W_p"], numeric_grad(loss, pe.params["W_p"])) <= 1e-6
    torch = torch_or_skip()
    W_p = torch.tensor(pe.params["W_p"].copy(), requires_grad=True)
    E = W_p[:, torch.from_numpy(t)]  # Algorithm 2: e_p = W_p[:, t]
    (E * torch.from_numpy(G)).sum().backward()
    assert rel_err(pe(t), E.detach().numpy()) <= 1e-12
    assert rel_err(pe.grads["W_p"], W_p.grad.numpy()) <= 1e-8


def test_learned_positional_init_and_zero_copy(rng):
    a, b = ft.PositionalEmbedding(100, 80, dtype="float64", seed=2), ft.PositionalEmbedding(100, 80, dtype="float64", seed=2)
    np.testing.assert_array_equal(a.params["W_p"], b.params["W_p"])
    W = a.params["W_p"]
    assert abs(W.mean()) < 4 / math.sqrt(W.size) and abs(W.std() - 1) < 4 / math.sqrt(2 * W.size)
    W[:, 7] = 42.0
    np.testing.assert_array_equal(a(7), 42.0)
    for _ in range(100):
        t = rng.integers(0, 100, size=int(rng.integers(1, 100)))
        a(t)
        a.backward(np.ones((80, t.size)))
    assert np.shares_memory(W, a.params["W_p"])
    W[:, 8] = -1.0
    np.testing.assert_array_equal(a([8, 7])[:, 0], -1.0)


@pytest.mark.parametrize(
    "t,exc,msg",
    [
        (8, IndexError, r"position 8 is out of range \[0, 8\)"),
        (-1, IndexError, "position -1"),
        (np.array([0, 7, 8]), IndexError, r"position 8 \(entry 2\)"),
        (np.array([3, -2]), IndexError, "position -2"),
        (np.array([2**63], dtype=np.uint64), IndexError, "position"),
        (2**70, IndexError, "position 1180591620717411303424"),
        (np.uint64(2**64 - 1), IndexError, "position 18446744073709551615"),
        (np.array([1, 2**64 - 1], dtype=np.uint64), IndexError, "position 18446744073709551615"),
        (np.array([0.0, 1.0]), TypeError, "integer"),
        (1.5, TypeError, "float"),
        (False, TypeError, "bool"),
        (np.array([], dtype=np.int32), ValueError, "empty"),
        ([], ValueError, "empty"),
        (np.zeros((2, 2), dtype=np.int64), ValueError, "1-D"),
        ("3", TypeError, "str"),
        (None, TypeError, "None"),
    ],
)
@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_positions_out_of_range_and_bad_types(kind, t, exc, msg):
    pe = ft.PositionalEmbedding(8, 4, kind)
    with pytest.raises(exc, match=msg):
        pe(t)


def test_positional_bad_hyperparameters_and_backward():
    with pytest.raises(ValueError, match="kind"):
        ft.PositionalEmbedding(4, 4, "rotary")
    with pytest.raises(ValueError, match="base"):
        ft.PositionalEmbedding(4, 4, "learned", base=100.0)
    with pytest.raises(ValueError, match="base"):
        ft.PositionalEmbedding(4, 4, "sinusoidal", base=0.0)
    with pytest.raises(ValueError, match="base"):
        ft.PositionalEmbedding(4, 4, "sinusoidal", base=float("nan"))
    with pytest.raises(TypeError, match="base"):
        ft.PositionalEmbedding(4, 4, "sinusoidal", base="big")
    with pytest.raises(ValueError, match="l_max"):
        ft.PositionalEmbedding(0, 4)
    with pytest.raises(ValueError, match="d_e"):
        ft.PositionalEmbedding(4, 0)
    pe = ft.PositionalEmbedding(4, 2)
    with pytest.raises(ValueError, match="before"):
        pe.backward(np.zeros(2, np.float32))
    pe([0, 1, 2])
    with pytest.raises(ValueError, match="columns"):
        pe.backward(np.zeros((2, 2), np.float32))
    assert repr(pe) == "PositionalEmbedding(l_max=4, d_e=2, kind='learned', dtype='float32')"
    assert pe.kind == "learned" and pe.base is None and pe.l_max == 4 and pe.d_e == 2
    assert repr(ft.TokenEmbedding(5, 3, dtype="float64")) == "TokenEmbedding(n_vocab=5, d_e=3, dtype='float64')"


def test_non_contiguous_dE_equals_its_contiguous_copy(rng):
    te = ft.TokenEmbedding(5, 3, dtype="float64")
    ids = np.array([4, 0, 4, 2])
    big = rng.standard_normal((6, 8))
    te(ids)
    te.backward(big[::2, ::2])
    g1 = te.grads["W_e"].copy()
    te.zero_grad()
    te(ids)
    te.backward(np.ascontiguousarray(big[::2, ::2]))
    np.testing.assert_array_equal(te.grads["W_e"], g1)
    # and float32 dE into a float64 unit is converted
    te.zero_grad()
    te(ids)
    te.backward(big[::2, ::2].astype(np.float32))
    assert rel_err(te.grads["W_e"], g1) <= 1e-6


def test_optimizers_update_learned_tables_and_skip_the_sinusoidal_one(rng):
    """The components are objects with parameters for ft.SGD / ft.Adam (θ ← θ − η∇ of the listings)."""
    te = ft.TokenEmbedding(6, 3, dtype="float64")
    te([1, 4, 4])
    te.backward(rng.standard_normal((3, 3)))
    W0, g = te.params["W_e"].copy(), te.grads["W_e"].copy()
    ft.SGD(0.1).step(te)
    np.testing.assert_allclose(te.params["W_e"], W0 - 0.1 * g, rtol=1e-15)
    for make in [lambda: ft.SGD(0.1), lambda: ft.Adam(0.1)]:  # an Adam holds one model's moments
        pe = ft.PositionalEmbedding(5, 4, "sinusoidal", dtype="float64")
        W_p = pe.params["W_p"].copy()
        pe([0, 4])
        pe.backward(np.ones((4, 2)))
        make().step(pe)
        np.testing.assert_array_equal(pe.params["W_p"], W_p)  # frozen
        pl = ft.PositionalEmbedding(5, 4, dtype="float64")
        W_l = pl.params["W_p"].copy()
        pl([0, 4])
        pl.backward(np.ones((4, 2)))
        make().step(pl)
        assert not np.array_equal(pl.params["W_p"][:, [0, 4]], W_l[:, [0, 4]])
        np.testing.assert_array_equal(pl.params["W_p"][:, 1:4], W_l[:, 1:4])
