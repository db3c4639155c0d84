"""The notebooks (notebooks/*.ipynb) execute top to bottom without an error (README "Tests").

Each notebook runs in a fresh kernel of THIS interpreter (a kernel spec written to a temporary folder, so no
globally installed spec is needed or used), with notebooks/ as its working directory. The kernel gets this
process's environment, plus:
  * FT_QUICK=1, unless FT_NOTEBOOKS_FULL=1: the notebooks shorten their long training runs (their agreement
    assertions with reference.py always run in full); the full runs assert the reported targets.
  * absolute FT_CORE_PATH / PYTHONPATH, so a developer build (docs/DEVELOPING.md) reaches the kernel.
A notebook has a deadline (FT_NOTEBOOK_TIMEOUT seconds; default 300 quick, 3600 full) and fails on the
first cell that raises. The notebooks that use ../shared/data also run once with the data hidden
(FT_DATA_DIR pointing nowhere, an empty cache, FT_DOWNLOAD=0): their data cells must skip with a message, as on a user's machine.
FT_NOTEBOOKS_SAVE=1 writes the executed notebooks (with their outputs) back to notebooks/ — how the
committed outputs are made (docs/notebooks.md).
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install '.[notebooks]')")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install '.[notebooks]')")
pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install '.[notebooks]')")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install '.[notebooks]')")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402  (installed with nbclient)
from jupyter_client.manager import AsyncKernelManager  # noqa: E402
from nbclient.util import run_sync  # noqa: E402

import formal_transformers as ft  # noqa: E402
from formal_transformers import datasets as ft_datasets  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
FULL = os.environ.get("FT_NOTEBOOKS_FULL", "") == "1"
SAVE = os.environ.get("FT_NOTEBOOKS_SAVE", "") == "1"
TIMEOUT = float(os.environ.get("FT_NOTEBOOK_TIMEOUT", 3600 if FULL else 300))
KERNEL = "ft-notebooks"


def _uses_data(path: pathlib.Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return any(c.cell_type == "code" and c.source.lstrip().startswith("%%needs_data") for c in nb.cells)


DATA_NOTEBOOKS = [p for p in NOTEBOOKS if _uses_data(p)]


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> pathlib.Path:
    """A kernel spec that starts ipykernel with the running interpreter."""
    d = tmp_path_factory.mktemp("kernels")
    spec = d / KERNEL
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python {sys.version.split()[0]} (formal-transformers tests)",
        "language": "python",
    }))
    return d


def _kernel_env(**extra) -> dict:
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)  # the kernel's inline backend draws the figures into the notebook
    env.pop("FT_QUICK", None)
    if not FULL:
        env["FT_QUICK"] = "1"
    # relative paths would resolve against notebooks/ in the kernel: make them absolute
    paths = [str(pathlib.Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    pkg_parent = pathlib.Path(ft.__file__).resolve().parent.parent
    if "site-packages" not in pkg_parent.parts and "dist-packages" not in pkg_parent.parts:
        paths.insert(0, str(pkg_parent))  # a source checkout: the kernel imports the same package
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if env.get("FT_CORE_PATH"):
        env["FT_CORE_PATH"] = str(pathlib.Path(env["FT_CORE_PATH"]).resolve())
    env.update(extra)
    return env


def _execute(path: pathlib.Path, kernel_dir: pathlib.Path, env: dict):
    nb = nbformat.read(path, as_version=4)
    km = AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
    deadline = time.monotonic() + TIMEOUT
    client = nbclient.NotebookClient(
        nb, km=km, kernel_name=KERNEL, allow_errors=False, record_timing=True,
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
        resources={"metadata": {"path": str(NB_DIR)}},
    )
    t0 = time.perf_counter()
    try:
        client.execute(env=env, cwd=str(NB_DIR))
    except nbclient.exceptions.CellTimeoutError as e:
        pytest.fail(f"{path.name} did not finish within {TIMEOUT:.0f} s (FT_NOTEBOOK_TIMEOUT): {e}")
    finally:
        try:
            if run_sync(km.is_alive)():
                run_sync(km.shutdown_kernel)(now=True)
        except RuntimeError:
            pass
        run_sync(km.cleanup_resources)()
    return nb, time.perf_counter() - t0


def _stdout(nb) -> str:
    return "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("name") == "stdout"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_dir):
    nb, seconds = _execute(path, kernel_dir, _kernel_env())
    print(f"{path.name}: {seconds:.1f} s ({'full' if FULL else 'quick'} mode)")
    if path in DATA_NOTEBOOKS and ft_datasets.data_dir() is not None:
        # the data is here: its cells must have run (their checks are the point), not printed a skip
        skipped = [line for line in _stdout(nb).splitlines() if line.startswith("skipped:")]
        assert not skipped, f"{path.name} skipped data cells although {ft_datasets.data_dir()} exists: {skipped[:3]}"
    if SAVE:
        nbformat.write(nb, path)


@pytest.mark.parametrize("path", DATA_NOTEBOOKS, ids=[p.stem for p in DATA_NOTEBOOKS])
def test_notebook_skips_without_data(path, kernel_dir, tmp_path):
    missing = tmp_path / "no-shared-data"
    empty_cache = tmp_path / "empty-cache"
    empty_cache.mkdir()
    # as on a user's machine without the data and without network: no local copy, no cache, no download
    nb, _ = _execute(path, kernel_dir, _kernel_env(FT_DATA_DIR=str(missing), FT_CACHE_DIR=str(empty_cache),
                                                   FT_DOWNLOAD="0"))
    text = _stdout(nb)
    assert "skipped:" in text, f"{path.name}: no 'skipped:' message with the data absent"


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks in {NB_DIR}"
