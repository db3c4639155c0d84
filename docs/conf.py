# The documentation site (./run.sh docs): Sphinx + MyST over docs/*.md, the committed notebooks with their
# outputs (myst-nb, never executed), one generated page per listing (docs/_ext/ft_listings.py) and the API
# reference from the installed package's docstrings (the compiled module included).
import os
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "_ext"))

project = "formal-transformers"
author = "the formal-transformers authors"
release = re.search(r'^__version__ = "([^"]+)"', (ROOT / "python/formal_transformers/__init__.py").read_text(),
                    re.M).group(1)
version = release
copyright = "2026, " + author

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "ft_listings",
]
root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "notebooks/ft_notebook.py"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# MyST: $…$ and $$…$$ math, ::: fences, heading anchors for links like design.md#blas
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
# the docs name source files in prose (`cpp/src/…`), not as links; links between docs pages are checked
suppress_warnings = ["myst.xref_missing"] if os.environ.get("FT_DOCS_LAX") else []
# a new docs/*.md that is not yet in index.md's toctrees is built (and reachable by search) instead of failing
# the build: add it to a toctree to put it in the navigation
suppress_warnings.append("toc.not_included")

# notebooks: rendered with the outputs they were committed with
nb_execution_mode = "off"
nb_merge_streams = True

# math offline: MathJax 3 from a Python package (django-static-mathjax ships its es5 build), copied into the
# site; never a CDN
def _mathjax_static():
    import mathjax  # django-static-mathjax

    src = Path(mathjax.__file__).resolve().parent / "static" / "mathjax" / "es5"
    dst = ROOT / "build" / "docs-static" / "mathjax"
    if not (dst / "tex-chtml.js").exists():
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        shutil.copy2(src / "tex-chtml.js", dst / "tex-chtml.js")
        for sub in ("output/chtml/fonts/woff-v2", "input/tex/extensions", "ui", "a11y", "sre"):
            if (src / sub).exists():
                shutil.copytree(src / sub, dst / sub)
    return dst.parent


html_static_path = ["_static", str(_mathjax_static())]
mathjax_path = "mathjax/tex-chtml.js"
mathjax3_config = {"loader": {"load": []}, "options": {"enableMenu": False}}

html_theme = "furo"
html_title = "formal-transformers"
html_css_files = ["ft.css"]
html_show_sourcelink = False
html_theme_options = {"navigation_with_keys": True}

# the API reference: autodoc on the installed package (run.sh installs it into the venv first)
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
nitpicky = False


# The docstrings are plain text (the paper's notation, aligned columns), not reStructuredText: shown as
# written, in a literal block, so that no reST markup rule (e.g. `*` or `|x|`) changes or rejects them.
def _docstring_as_written(app, what, name, obj, options, lines):
    if lines and any(line.strip() for line in lines):
        text = list(lines)
        while text and not text[-1].strip():
            text.pop()
        lines[:] = [".. code-block:: text", ""] + ["    " + line for line in text] + [""]


def setup(app):
    app.connect("autodoc-process-docstring", _docstring_as_written)
