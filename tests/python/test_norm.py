"""Algorithm 6 (LayerNorm) and RMSNorm: native vs reference.py, finite differences, PyTorch, bad input."""
import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref

from conftest import TOL, numeric_grad, rel_err, torch_or_skip


# (d_e = 1 with eps = 0 is left out: v = 0 there and the listing divides by zero, as documented)
@pytest.mark.parametrize(
    "d_e,l,eps", [(1, 1, 1e-5), (2, 1, 0.0), (2, 1, 1e-5), (7, 5, 0.0), (64, 3, 1e-5), (129, 17, 0.0), (129, 17, 1e-5)]
)
def test_layer_norm_forward_matches_reference(dtype, rng, d_e, l, eps):
    ln = ft.LayerNorm(d_e, eps=eps, dtype=dtype)
    ln.params["gamma"][:] = rng.standard_normal(d_e)
    ln.params["beta"][:] = rng.standard_normal(d_e)
    E = rng.standard_normal((d_e, l)).astype(dtype)
    got = ln(E)
    assert got.dtype == np.dtype(dtype) and got.shape == (d_e, l)
    want = ref.layer_norm_columns(E.astype(np.float64), ln.params["gamma"].astype(np.float64),
                                  ln.params["beta"].astype(np.float64), eps)
    assert rel_err(got, want) <= TOL[dtype]
    # a vector is one column
    got1 = ln(E[:, 0])
    assert got1.shape == (d_e,)
    assert rel_err(got1, want[:, 0]) <= TOL[dtype]


def test_rms_norm_forward_matches_reference(dtype, rng):
    rn = ft.RMSNorm(9, eps=1e-6, dtype=dtype)
    rn.params["gamma"][:] = rng.standard_normal(9)
    E = rng.standard_normal((9, 4)).astype(dtype)
    want = ref.rms_norm_columns(E.astype(np.float64), rn.params["gamma"].astype(np.float64), 1e-6)
    assert rel_err(rn(E), want) <= TOL[dtype]
    assert list(rn.params.keys()) == ["gamma"]


@pytest.mark.parametrize("cls", [ft.LayerNorm, ft.RMSNorm])
def test_backward_matches_finite_differences(rng, cls):
    d_e, l = 6, 3
    norm = cls(d_e, eps=1e-5, dtype="float64")
    for name in norm.params:
        norm.params[name][:] = rng.standard_normal(norm.params[name].shape)
    E = rng.standard_normal((d_e, l))
    W = rng.standard_normal((d_e, l))
    loss = lambda: float(np.sum(norm(E) * W))
    norm(E)
    norm.zero_grad()
    dE = norm.backward(W)
    assert rel_err(dE, numeric_grad(loss, E)) <= 1e-6
    for name in norm.params:
        assert rel_err(norm.grads[name], numeric_grad(loss, norm.params[name])) <= 1e-6, name


def test_backward_matches_torch(rng):
    torch = torch_or_skip()
    d_e, l = 10, 4
    ln = ft.LayerNorm(d_e, eps=1e-5, dtype="float64")
    ln.params["gamma"][:] = rng.standard_normal(d_e)
    ln.params["beta"][:] = rng.standard_normal(d_e)
    E = rng.standard_normal((d_e, l))
    W = rng.standard_normal((d_e, l))
    tl = torch.nn.LayerNorm(d_e, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        tl.weight.copy_(torch.from_numpy(ln.params["gamma"].copy()))
        tl.bias.copy_(torch.from_numpy(ln.params["beta"].copy()))
    tE = torch.tensor(E.T.copy(), requires_grad=True)  # torch is row-per-token: (ℓ, d_e)
    out = tl(tE)
    (out * torch.from_numpy(W.T.copy())).sum().backward()
    assert rel_err(ln(E), out.detach().numpy().T) <= 1e-12
    ln.zero_grad()
    dE = ln.backward(W)
    assert rel_err(dE, tE.grad.numpy().T) <= 1e-10
    assert rel_err(ln.grads["gamma"], tl.weight.grad.numpy()) <= 1e-10
    assert rel_err(ln.grads["beta"], tl.bias.grad.numpy()) <= 1e-10


def test_grads_accumulate_until_zero_grad(rng):
    ln = ft.LayerNorm(4, dtype="float64")
    E, W = rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    ln(E)
    ln.backward(W)
    g1 = ln.grads["beta"].copy()
    ln.backward(W)
    np.testing.assert_allclose(ln.grads["beta"], 2 * g1)
    ln.zero_grad()
    assert not ln.grads["beta"].any()


def test_params_are_zero_copy_views(rng):
    ln = ft.LayerNorm(3, dtype="float64")
    E = rng.standard_normal((3, 2))
    y0 = ln(E)
    g = ln.params["gamma"]
    g[:] = 3.0  # write into the view: the next call sees it
    np.testing.assert_allclose(ln(E), 3.0 * y0, rtol=1e-14)
    ln.params["beta"] = np.array([1.0, 2.0, 3.0])  # assignment copies into the storage
    np.testing.assert_allclose(ln(E), 3.0 * y0 + np.array([[1.0], [2.0], [3.0]]), rtol=1e-14)
    # views stay valid across many calls (no reallocation behind numpy's back)
    for _ in range(200):
        ln(rng.standard_normal((3, int(rng.integers(1, 50)))))
        ln.backward(rng.standard_normal((3, ln(E).shape[1])))
    assert np.all(g == 3.0)
    assert np.shares_memory(g, ln.params["gamma"])


def test_float32_input_to_float64_model_is_converted(rng):
    ln = ft.LayerNorm(3, dtype="float64")
    E = rng.standard_normal((3, 2))
    np.testing.assert_allclose(ln(E.astype(np.float32)), ln(E.astype(np.float32).astype(np.float64)))
    # any layout: C-ordered, non-contiguous views, transposes
    big = rng.standard_normal((6, 8))
    np.testing.assert_array_equal(ln(big[::2, 1::3]), ln(np.asfortranarray(big[::2, 1::3])))


@pytest.mark.parametrize(
    "bad,exc,msg",
    [
        (np.zeros((4, 2)), ValueError, "rows"),
        (np.zeros((3, 0)), ValueError, "empty"),
        (np.zeros((3, 2, 1)), ValueError, "2-D"),
        (np.zeros((3, 2), dtype=np.int64), TypeError, "float"),
        (np.zeros((3, 2), dtype=np.complex128), TypeError, "float"),
        ("abc", TypeError, "array"),
        (None, TypeError, "None"),
    ],
)
def test_bad_input_raises_clear_errors(bad, exc, msg):
    ln = ft.LayerNorm(3)
    with pytest.raises(exc, match=msg):
        ln(bad)


def test_bad_hyperparameters_and_backward_misuse():
    with pytest.raises(ValueError, match="d_e"):
        ft.LayerNorm(0)
    with pytest.raises(ValueError, match="eps"):
        ft.LayerNorm(3, eps=-1.0)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        ft.LayerNorm(3, dtype="int32")
    ln = ft.LayerNorm(3)
    with pytest.raises(ValueError, match="before"):
        ln.backward(np.zeros((3, 1), np.float32))
    ln(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="columns"):
        ln.backward(np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="shape"):
        ln.params["gamma"] = np.zeros(4)
    with pytest.raises(KeyError):
        ln.params["nope"]


def test_nan_propagates_to_its_column_only():
    """Documented: NaN in an input is not an error; it propagates like numpy's arithmetic would."""
    ln = ft.LayerNorm(3, dtype="float64")
    E = np.ones((3, 2))
    E[1, 0] = np.nan
    E[:, 1] = [1.0, 2.0, 4.0]
    y = ln(E)
    assert np.isnan(y[:, 0]).all() and np.isfinite(y[:, 1]).all()


def test_rms_norm_backward_matches_torch(rng):
    """Gopher's RMSnorm against torch.nn.functional.rms_norm (eps inside the root, as ours) and autograd."""
    torch = torch_or_skip()
    d_e, l = 9, 5
    rn = ft.RMSNorm(d_e, eps=1e-5, dtype="float64")
    rn.params["gamma"][:] = rng.standard_normal(d_e)
    E = rng.standard_normal((d_e, l))
    W = rng.standard_normal((d_e, l))
    g = torch.tensor(rn.params["gamma"].copy(), requires_grad=True)
    tE = torch.tensor(E.T.copy(), requires_grad=True)  # torch is row-per-token: (ℓ, d_e)
    out = torch.nn.functional.rms_norm(tE, (d_e,), weight=g, eps=1e-5)
    (out * torch.from_numpy(W.T.copy())).sum().backward()
    assert rel_err(rn(E), out.detach().numpy().T) <= 1e-12
    rn.zero_grad()
    dE = rn.backward(W)
    assert rel_err(dE, tE.grad.numpy().T) <= 1e-10
    assert rel_err(rn.grads["gamma"], g.grad.numpy()) <= 1e-10
