"""The installed wheel, in a fresh virtual environment on a PATH with no compiler and no cmake
(`./run.sh wheel --check` runs this file there, from a folder outside the checkout): import, a forward
pass against the numpy listing, one training step, DInference, and ft.load of a saved file."""
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import formal_transformers as ft

REPO = Path(os.environ.get("FT_REPO", Path(__file__).resolve().parents[2]))


def small_model(**kw):
    return ft.DTransformer(n_vocab=23, l_max=16, L=2, H=2, d_e=8, d_mlp=16, dtype="float64", seed=3, **kw)


def test_the_installed_package_not_the_checkout_and_no_toolchain():
    here = Path(ft.__file__).resolve()
    assert Path(sys.prefix).resolve() in here.parents, f"{here} is not inside this venv ({sys.prefix})"
    assert (REPO / "python").resolve() not in here.parents  # not the source tree
    core = Path(ft._core.__file__)
    assert core.suffix == ".so" and core.parent == here.parent
    # the machine's compiler and cmake are not on this PATH: nothing here could have built the core
    for tool in ("cc", "c++", "g++", "gcc", "cmake"):
        assert shutil.which(tool) is None, f"{tool} is on the PATH: {shutil.which(tool)}"
    # OpenMP's runtime comes inside the wheel, OpenBLAS from the scipy-openblas32 package
    libs = here.parent.parent / "formal_transformers.libs"
    assert any(p.name.startswith("libgomp") for p in libs.iterdir()), list(libs.iterdir())
    assert "OpenBLAS" in ft.blas_info()


def test_forward_equals_the_numpy_listing():
    model = small_model()
    x = np.array([1, 5, 2, 7, 3, 0, 9])
    P = model(x)
    R = ft.reference.d_transformer(x, {k: np.array(v) for k, v in model.params.items()}, L=2, H=2)
    assert P.shape == (23, 7)
    assert np.max(np.abs(P - R) / np.maximum(np.abs(R), 1e-300)) <= 1e-12


def test_one_training_step_is_the_listings_update():
    model = small_model()
    x = np.array([4, 1, 6, 2, 8, 3])
    theta = {k: np.array(v) for k, v in model.params.items()}
    loss, grads = model.loss_and_grad(x)
    assert np.isfinite(loss) and loss > 0
    ft.DTraining(n_epochs=1, eta=0.05, optimizer="sgd", batch_size=1, shuffle=False)([x], model)
    for k, v in model.params.items():
        np.testing.assert_allclose(v, theta[k] - 0.05 * grads[k], rtol=1e-12, atol=1e-15)


def test_dinference_greedy_equals_the_numpy_listing():
    model = small_model()
    x = np.array([2, 4, 6])
    y = ft.DInference(l_gen=6, tau=0.0)(x, model)
    params = {k: np.array(v) for k, v in model.params.items()}
    ref = ft.reference.d_inference(x, lambda s: ft.reference.d_transformer(s, params, L=2, H=2), l_gen=6, tau=0.0)
    assert list(y) == list(ref)


def test_load_of_a_saved_file(tmp_path):
    model = small_model(norm="rms", positional="rope")
    x = np.array([3, 1, 4, 1, 5])
    path = tmp_path / "model.safetensors"
    ft.save(model, path)
    again = ft.load(path)
    assert type(again) is type(model)
    np.testing.assert_array_equal(again(x), model(x))


def test_bad_input_is_an_exception_not_a_crash():
    model = small_model()
    with pytest.raises(IndexError):
        model(np.array([1, 99]))


def test_the_wheels_metadata():
    from importlib.metadata import metadata, version

    m = metadata("formal-transformers")
    assert version("formal-transformers") == ft.__version__
    assert m["License"] == "MIT" or "MIT" in (m.get("License-Expression") or "")
    assert any(c.startswith("License :: OSI Approved :: MIT") for c in m.get_all("Classifier"))
    assert m.get_all("Project-URL") and "Formal Algorithms for Transformers" in m["Summary"]
    assert "./run.sh" in m.get_payload() or "./run.sh" in (m["Description"] or "")  # the README
    assert any(r.startswith("scipy-openblas32") for r in m.get_all("Requires-Dist"))
