"""Algorithm 7 (Unembedding): native vs reference.py, backward vs finite differences and a PyTorch
transcription, extreme logits, zero-copy parameters, bad input; and the private _gemm of the benchmark."""
import math

import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref

from conftest import TOL, numeric_grad, rel_err, torch_or_skip


@pytest.mark.parametrize("n_vocab,d_e,l", [(1, 1, 1), (2, 3, 1), (11, 4, 7), (65, 16, 33), (1000, 24, 5)])
def test_forward_matches_reference(dtype, rng, n_vocab, d_e, l):
    un = ft.Unembedding(n_vocab, d_e, dtype=dtype, seed=4)
    un.params["W_u"][...] = 2 * rng.standard_normal((n_vocab, d_e))
    E = rng.standard_normal((d_e, l)).astype(dtype)
    P = un(E)
    assert P.shape == (n_vocab, l) and P.dtype == np.dtype(dtype)
    W_u = un.params["W_u"].astype(np.float64)
    assert rel_err(P, ref.unembedding(E.astype(np.float64), W_u)) <= TOL[dtype]
    np.testing.assert_allclose(P.sum(axis=0), 1.0, rtol=10 * TOL[dtype])
    # a vector e -> p (N_V,)
    p = un(E[:, 0])
    assert p.shape == (n_vocab,)
    assert rel_err(p, ref.unembedding(E[:, 0].astype(np.float64), W_u)) <= TOL[dtype]
    # logits = W_u e
    assert rel_err(un.logits(E), W_u @ E.astype(np.float64)) <= TOL[dtype]
    assert un.logits(E[:, 0]).shape == (n_vocab,)


def test_extreme_logits_give_exact_zeros_and_ones_not_nan(dtype):
    un = ft.Unembedding(3, 1, dtype=dtype)
    un.params["W_u"][:, 0] = [1e4, -1e4, 0.0]
    P = un(np.array([[1.0, -1.0]], dtype=dtype))
    assert np.isfinite(P).all()
    np.testing.assert_array_equal(P, [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    dE = un.backward(np.ones((3, 2), dtype=dtype))
    assert np.isfinite(dE).all()


def test_backward_matches_finite_differences(rng):
    for l in [1, 5]:
        un = ft.Unembedding(9, 4, dtype="float64", seed=l)
        E = rng.standard_normal((4, l))
        G = rng.standard_normal((9, l))
        loss = lambda: float(np.sum(un(E) * G))
        un(E)
        un.zero_grad()
        dE = un.backward(G)
        assert dE.shape == (4, l)
        assert rel_err(dE, numeric_grad(loss, E)) <= 1e-6
        assert rel_err(un.grads["W_u"], numeric_grad(loss, un.params["W_u"])) <= 1e-6
    # a vector call takes a vector dP and returns a vector dE
    un(E[:, 0])
    de = un.backward(G[:, 0])
    assert de.shape == (4,)


def test_backward_matches_torch_autograd(rng):
    torch = torch_or_skip()
    un = ft.Unembedding(13, 6, dtype="float64", seed=2)
    E = rng.standard_normal((6, 4))
    G = rng.standard_normal((13, 4))
    W_u = torch.tensor(un.params["W_u"].copy(), requires_grad=True)
    tE = torch.tensor(E, requires_grad=True)
    tP = torch.softmax(W_u @ tE, dim=0)  # Algorithm 7, line 1, on every column
    (tP * torch.from_numpy(G)).sum().backward()
    assert rel_err(un(E), tP.detach().numpy()) <= 1e-12
    un.zero_grad()
    assert rel_err(un.backward(G), tE.grad.numpy()) <= 1e-8
    assert rel_err(un.grads["W_u"], W_u.grad.numpy()) <= 1e-8


def test_backward_as_cross_entropy_gives_p_minus_onehot(rng):
    """With dP = −1/p at the target (the gradient of −log p_y), dZ = p − e_y, so dE = W_uᵀ (p − e_y)."""
    un = ft.Unembedding(7, 3, dtype="float64")
    e = rng.standard_normal(3)
    p = un(e)
    y = 4
    dP = np.zeros(7)
    dP[y] = -1.0 / p[y]
    de = un.backward(dP)
    z = p.copy()
    z[y] -= 1.0
    assert rel_err(de, un.params["W_u"].T @ z) <= 1e-13
    assert rel_err(un.grads["W_u"], np.outer(z, e)) <= 1e-13


def test_float32_backward_close_to_float64(rng):
    u64 = ft.Unembedding(20, 8, dtype="float64")
    u32 = ft.Unembedding(20, 8, dtype="float32")
    u32.params["W_u"] = u64.params["W_u"]
    E, G = rng.standard_normal((8, 6)), rng.standard_normal((20, 6))
    u64(E)
    u32(E.astype(np.float32))
    d64, d32 = u64.backward(G), u32.backward(G.astype(np.float32))
    assert d32.dtype == np.float32
    assert rel_err(d32, d64) <= 1e-5
    assert rel_err(u32.grads["W_u"], u64.grads["W_u"]) <= 1e-5


def test_backward_does_not_touch_the_callers_arrays(rng):
    un = ft.Unembedding(5, 2, dtype="float64")
    E = rng.standard_normal((2, 3))
    G = np.asfortranarray(rng.standard_normal((5, 3)))  # F-ordered float64: the zero-copy input path
    un(E)
    G0 = G.copy()
    d1 = un.backward(G)
    np.testing.assert_array_equal(G, G0)  # the core overwrites its own copy of dP, never the caller's
    # and the input is copied at the call: overwriting E afterwards changes nothing
    un.zero_grad()
    un(E)
    E[:] = np.nan
    np.testing.assert_array_equal(un.backward(G), d1)


def test_logits_do_not_change_what_backward_differentiates(rng):
    un = ft.Unembedding(6, 3, dtype="float64")
    E = rng.standard_normal((3, 2))
    G = rng.standard_normal((6, 2))
    un(E)
    want = un.backward(G)
    un(E)
    un.logits(rng.standard_normal((3, 9)))
    np.testing.assert_array_equal(un.backward(G), want)


def test_init_is_seeded_normal_over_fan_in():
    a, b, c = (ft.Unembedding(400, 64, dtype="float64", seed=s) for s in (5, 5, 6))
    np.testing.assert_array_equal(a.params["W_u"], b.params["W_u"])
    assert not np.array_equal(a.params["W_u"], c.params["W_u"])
    W = a.params["W_u"]
    n = W.size
    assert abs(W.std() * math.sqrt(64) - 1) < 4 / math.sqrt(2 * n)
    assert abs(W.mean()) * math.sqrt(64) < 4 / math.sqrt(n)


def test_params_are_zero_copy_and_stay_valid(rng):
    un = ft.Unembedding(4, 2, dtype="float64")
    W = un.params["W_u"]
    assert W.shape == (4, 2) and list(un.params.keys()) == ["W_u"]
    W[...] = 0.0
    np.testing.assert_array_equal(un(np.ones(2)), 0.25)  # all logits equal: uniform
    W[2, :] = [100.0, 100.0]
    np.testing.assert_allclose(un(np.ones(2)), [0, 0, 1, 0], atol=1e-80)
    g = un.grads["W_u"]
    for _ in range(200):
        l = int(rng.integers(1, 50))
        un(rng.standard_normal((2, l)))
        un.backward(rng.standard_normal((4, l)))
    assert np.shares_memory(W, un.params["W_u"]) and np.shares_memory(g, un.grads["W_u"])
    W[...] = 0.0
    np.testing.assert_array_equal(un(np.ones(2)), 0.25)
    assert g.any()
    un.zero_grad()
    assert not g.any()


def test_any_layout_is_accepted_and_equal(rng):
    un = ft.Unembedding(7, 3, dtype="float64")
    big = rng.standard_normal((6, 10))
    E = big[::2, ::2]
    P = un(E)
    np.testing.assert_array_equal(P, un(np.ascontiguousarray(E)))
    np.testing.assert_array_equal(P, un(np.asfortranarray(E)))
    np.testing.assert_array_equal(un(E.astype(np.float32)), un(E.astype(np.float32).astype(np.float64)))
    G = rng.standard_normal((7, 10))
    un(E)
    d1 = un.backward(G[:, ::2])
    un(E)
    np.testing.assert_array_equal(un.backward(np.ascontiguousarray(G[:, ::2])), d1)


@pytest.mark.parametrize(
    "e,exc,msg",
    [
        (np.zeros(4), ValueError, "e has 4 rows but d_e = 3"),
        (np.zeros((2, 5)), ValueError, "rows"),
        (np.zeros((3, 0)), ValueError, "empty"),
        (np.zeros((3, 2, 2)), ValueError, "2-D"),
        (np.zeros(3, dtype=np.int32), TypeError, "float"),
        (np.zeros(3, dtype=np.complex64), TypeError, "float"),
        ("abc", TypeError, "array"),
        (None, TypeError, "None"),
    ],
)
def test_bad_input(e, exc, msg):
    un = ft.Unembedding(5, 3)
    with pytest.raises(exc, match=msg):
        un(e)
    with pytest.raises(exc, match=msg):
        un.logits(e)


def test_bad_backward_and_hyperparameters():
    un = ft.Unembedding(5, 3)
    with pytest.raises(ValueError, match="before"):
        un.backward(np.zeros(5, np.float32))
    un(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="columns"):
        un.backward(np.zeros((5, 3), np.float32))
    with pytest.raises(ValueError, match="rows"):
        un.backward(np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="float"):
        un.backward(np.zeros((5, 2), bool))
    with pytest.raises(ValueError, match="n_vocab"):
        ft.Unembedding(0, 3)
    with pytest.raises(ValueError, match="d_e"):
        ft.Unembedding(3, 0)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        ft.Unembedding(3, 3, dtype="float16")
    with pytest.raises(ValueError, match="shape"):
        un.params["W_u"] = np.zeros((3, 5))
    assert repr(un) == "Unembedding(n_vocab=5, d_e=3, dtype='float32')"
    assert "Algorithm 7" in ft.Unembedding.__doc__


def test_nan_stays_in_its_column():
    """Documented: NaN is not an error; it propagates as numpy's arithmetic of the listing would."""
    un = ft.Unembedding(4, 2, dtype="float64")
    E = np.ones((2, 3))
    E[1, 1] = np.nan
    P = un(E)
    want = ref.unembedding(E, un.params["W_u"].copy())
    np.testing.assert_array_equal(np.isnan(P), np.isnan(want))
    assert np.isnan(P[:, 1]).all() and np.isfinite(P[:, [0, 2]]).all()
    un.backward(np.ones((4, 3)))  # no crash


# ---------------------------------------------------------------------------------------------------
# ft._core._gemm (for bench/bench_gemm.py): one BLAS gemm through the core
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 2), (64, 33, 17), (130, 7, 129)])
@pytest.mark.parametrize("transA,transB", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_matches_numpy(dtype, rng, m, k, n, transA, transB):
    A = rng.standard_normal((k, m) if transA else (m, k)).astype(dtype)
    B = rng.standard_normal((n, k) if transB else (k, n)).astype(dtype)
    want = (A.T if transA else A).astype(np.float64) @ (B.T if transB else B).astype(np.float64)
    for a, b in [(A, B), (np.asfortranarray(A), np.asfortranarray(B)), (np.asfortranarray(A), B)]:
        C = ft._core._gemm(a, b, transA, transB)
        assert C.shape == (m, n) and C.dtype == np.dtype(dtype)
        assert rel_err(C, want) <= TOL[dtype] * max(1, math.sqrt(k))


def test_gemm_bad_input(rng):
    with pytest.raises(ValueError, match="inner"):
        ft._core._gemm(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(TypeError, match="float"):
        ft._core._gemm(np.zeros((2, 2), int), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="2-D"):
        ft._core._gemm(np.zeros(2), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="empty"):
        ft._core._gemm(np.zeros((0, 2)), np.zeros((2, 2)))
    # non-contiguous and mixed precision (B follows A's)
    A = rng.standard_normal((8, 6))[::2, ::2]
    B = rng.standard_normal((3, 5)).astype(np.float32)
    assert rel_err(ft._core._gemm(A, B), A @ B.astype(np.float64)) <= 1e-12


def test_sgd_step_is_theta_minus_eta_grad(rng):
    un = ft.Unembedding(5, 3, dtype="float64")
    un(rng.standard_normal((3, 2)))
    un.backward(rng.standard_normal((5, 2)))
    W, g = un.params["W_u"].copy(), un.grads["W_u"].copy()
    ft.SGD(0.5).step(un)
    np.testing.assert_allclose(un.params["W_u"], W - 0.5 * g, rtol=1e-15)
