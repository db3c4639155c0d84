"""What every notebook of this folder imports first: printing options, the agreement check against
formal_transformers.reference, the paper's dimension notation, and the real-data switch.

    from ft_notebook import *          # np, plt, ft, R, datasets, QUICK, show, rel_err, check, dims, ...
    DATA = use_data("tinyshakespeare.txt")   # real-data notebooks: the file's path or None; %%needs_data

Kept beside the notebooks (their working directory), not in the package: it is notebook plumbing.
"""
import inspect
import os
import pathlib
import time  # noqa: F401  (the notebooks time their runs)
import unicodedata
import warnings

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

# tqdm.auto (imported by transformers) warns that ipywidgets is absent, naming its own file's absolute path:
# the text progress bar it falls back to is what the notebooks want anyway
warnings.filterwarnings("ignore", message="IProgress not found")

import formal_transformers as ft  # noqa: E402
from formal_transformers import datasets  # noqa: E402
from formal_transformers import reference as R  # noqa: E402

__all__ = ["np", "plt", "ft", "R", "datasets", "os", "time", "display", "Markdown", "QUICK", "show", "rel_err",
           "check", "dims", "use_data", "where", "machine",
           "inspect", "unicodedata"]

QUICK = datasets.quick()  # FT_QUICK=1 (CI): shortened training; the agreement checks always run in full
np.set_printoptions(precision=4, suppress=True, linewidth=110)
plt.rcParams.update({"figure.dpi": 80, "savefig.dpi": 80, "figure.figsize": (6, 3.2), "image.cmap": "viridis"})
print(f"formal-transformers {ft.__version__}; {ft.get_num_threads()} threads; quick mode: {QUICK}")


def show(fn):
    """The numpy transcription of a listing, as written in formal_transformers/reference.py."""
    display(Markdown(f"```python\n# formal_transformers.reference.{fn.__name__}\n{inspect.getsource(fn)}```"))


def rel_err(a, b):
    """max |a − b| / max |b| (norm-wise relative error)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)) if b.size else 0.0


def check(what, native, ref, tol=1e-12):
    """The agreement assertion: native (C++) and reference.py (numpy) agree in float64."""
    err = rel_err(native, ref)
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:g}"
    print(f"✓ {what}: native = reference.py, relative error {err:.1e} (≤ {tol:g})")


def dims(symbol, A, notation, field="ℝ", **sizes):
    """Print A's shape in the paper's notation, e.g. dims("W_e", W_e, "d_e×N_V", d_e=6, N_V=12), and check it."""
    names = notation.split("×")
    values = [sizes.get(unicodedata.normalize("NFKC", n), n) for n in names]  # Python reads the keyword ℓ as l
    if all(isinstance(v, (int, np.integer)) for v in values):
        assert tuple(np.shape(A)) == tuple(values), f"{symbol}: shape {np.shape(A)}, expected {tuple(values)}"
    print(f"{symbol:>8} ∈ {field}^({notation}) = {field}^({'×'.join(map(str, values))})")


def where(path):
    """Where a data file was found, for printing: the kind of place (the data folder, the download cache),
    never the machine's absolute path, which would end up in the committed outputs."""
    path = pathlib.Path(path).resolve()
    folder, cache = datasets.data_dir(), datasets.cache_dir()
    if folder is not None and path.parent == pathlib.Path(folder).resolve():
        return "the data folder: FT_DATA_DIR or ../shared/data"
    if path.parent == cache.expanduser().resolve():
        return "the download cache"
    return "the path given"


def use_data(name):
    """Find (or download: formal_transformers.datasets) the data file `name` and register the cell magic
    %%needs_data, which runs its cell only when the file is available and otherwise prints `skipped: …`
    and moves on. Returns the file's path, or None."""
    from IPython import get_ipython
    from IPython.core.magic import register_cell_magic

    try:
        path = datasets.locate(name)
        print(f"data: {name} ({where(path)})")
    except datasets.DataNotFoundError as e:
        path = None
        print(f"skipped: {e}")

    @register_cell_magic
    def needs_data(line, cell):
        if path is None:
            print(f"skipped: this cell needs {name} (not available)")
            return
        exec(compile(cell, "<cell>", "exec"), get_ipython().user_ns)

    return path


def machine():
    """Threads and load: wall times depend on both."""
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return f"{ft.get_num_threads()} thread(s), load average {load} on {os.cpu_count()} cores"
