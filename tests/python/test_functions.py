"""Free functions softmax (paper's column softmax), gelu, relu vs reference.py and PyTorch."""
import numpy as np
import pytest

import formal_transformers as ft
from formal_transformers import reference as ref

from conftest import TOL, rel_err, torch_or_skip


@pytest.mark.parametrize("shape", [(1,), (5,), (1, 1), (3, 7), (65, 13), (512, 9)])
def test_softmax_is_over_columns(dtype, rng, shape):
    A = (3 * rng.standard_normal(shape)).astype(dtype)
    P = ft.softmax(A)
    assert P.dtype == np.dtype(dtype) and P.shape == shape
    assert rel_err(P, ref.softmax(A.astype(np.float64))) <= TOL[dtype]
    np.testing.assert_allclose(P.sum(axis=0), 1.0, rtol=TOL[dtype] * 10)


def test_softmax_masked_entries_are_zero_not_nan():
    A = np.array([[0.0, -np.inf], [np.log(3.0), 2.0], [-np.inf, -np.inf]])
    P = ft.softmax(A)
    np.testing.assert_allclose(P, [[0.25, 0.0], [0.75, 1.0], [0.0, 0.0]], rtol=1e-15)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_reference_and_torch(dtype, rng, approximate):
    x = (3 * rng.standard_normal((17, 5))).astype(dtype)
    got = ft.gelu(x, approximate=approximate)
    assert rel_err(got, ref.gelu(x.astype(np.float64), approximate)) <= TOL[dtype]
    torch = torch_or_skip()
    want = torch.nn.functional.gelu(torch.from_numpy(x.astype(np.float64)), approximate=approximate).numpy()
    assert rel_err(got, want) <= TOL[dtype]


def test_relu(dtype, rng):
    x = rng.standard_normal(33).astype(dtype)
    np.testing.assert_array_equal(ft.relu(x), np.maximum(x, 0))


def test_functions_reject_bad_input():
    with pytest.raises(TypeError, match="float"):
        ft.softmax(np.arange(4))
    with pytest.raises(ValueError, match="empty"):
        ft.softmax(np.zeros((3, 0)))
    with pytest.raises(ValueError, match="approximate"):
        ft.gelu(np.zeros(3), approximate="erf")
