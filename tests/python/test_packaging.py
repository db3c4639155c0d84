"""Packaging: the version is written once, and a build on a machine without the system packages stops at
the start of the configure with one message naming every missing Debian/Ubuntu package (what `pip install`
of the sdist shows there)."""
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

import formal_transformers as ft

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_written_in_one_place():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    init = (ROOT / "python/formal_transformers/__init__.py").read_text()
    assert re.findall(r'^__version__ = "([^"]+)"', init, re.M) == [ft.__version__]
    assert meta["tool"]["scikit-build"]["metadata"]["version"]["input"] == "python/formal_transformers/__init__.py"
    for key in ("license", "readme", "classifiers", "urls", "description"):
        assert meta["project"].get(key), key


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_missing_system_packages_are_named_in_one_message_before_anything_else(tmp_path):
    r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "b"),
                        "-DCMAKE_DISABLE_FIND_PACKAGE_xsimd=ON", "-DCMAKE_DISABLE_FIND_PACKAGE_tsl-robin-map=ON",
                        "-DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON"],
                       capture_output=True, text=True, timeout=120)
    out = re.sub(r"\s+", " ", r.stdout + r.stderr)
    assert r.returncode != 0
    assert "sudo apt-get install libxsimd-dev nlohmann-json3-dev robin-map-dev" in out, out
    assert out.count("CMake Error") == 1, out
    assert "BLAS" not in out and "OpenMP" not in out  # it stopped before the rest of the configure
