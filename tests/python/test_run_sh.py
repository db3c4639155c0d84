"""./run.sh builds the package once for every verb (run.sh "One build for every verb").

The verbs run `setup`, which builds and installs the package into the venv only when the venv's stamp does
not match the sources, build options and compiler. Running the real build here would take minutes and
would reinstall the package under the running tests, so these tests run run.sh's own logic on a copy of
the wheel's sources (a git work tree of its own) against a stand-in venv: its `bin/python` is a script
that records every `pip` command (and, for the build, `pip install .[extras]`, puts a stand-in extension
module where the real one goes) and hands everything else to this interpreter. apt is off (FT_APT=0).
What is asserted is what the user sees: the second verb builds nothing, says "up to date" and returns
within seconds; a changed source, option, compiler or install rebuilds; a new extra installs only its
dependencies.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# what run.sh hashes, and what it needs to run
SOURCES = ["CMakeLists.txt", "pyproject.toml", "README.md", "cmake", "cpp", "python/formal_transformers"]
BUILD_ENV = ("CMAKE_ARGS", "CMAKE_GENERATOR", "CMAKE_TOOLCHAIN_FILE", "CXX", "CC", "CXXFLAGS", "CFLAGS",
             "CPPFLAGS", "LDFLAGS")

SHIM = """#!/usr/bin/env bash
# stand-in venv python: records pip commands, fakes the build's install, runs everything else for real
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  shift 2
  echo "$*" >> "{log}"
  for a in "$@"; do
    case "$a" in
      .\\[*) mkdir -p "{site}/formal_transformers"
            echo "$RANDOM$RANDOM" > "{site}/formal_transformers/_core.stand-in.so"
            echo BUILD >> "{log}" ;;
    esac
  done
  exit 0
fi
exec "{python}" "$@"
"""


@pytest.fixture
def tree(tmp_path):
    """A copy of the sources and run.sh (a git work tree), and a stand-in venv whose pip calls are logged."""
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    for name in SOURCES + ["run.sh", ".gitignore"]:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=ignore)
        else:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, src / name)
    subprocess.run(["git", "init", "-q"], cwd=src, check=True)
    subprocess.run(["git", "add", "-A"], cwd=src, check=True)
    venv = tmp_path / "venv"
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    log = tmp_path / "pip.log"
    log.touch()
    py = venv / "bin" / "python"
    py.parent.mkdir()
    py.write_text(SHIM.format(log=log, site=site, python=sys.executable))
    py.chmod(0o755)
    return src, venv, log, site


def setup(tree, extras="io", **env):
    """`./run.sh setup extras` in the copy: (output, seconds, pip commands it ran)."""
    src, venv, log, _ = tree
    e = {k: v for k, v in os.environ.items() if k not in BUILD_ENV and not k.startswith("SKBUILD_")}
    e.update(VENV=str(venv), FT_APT="0", JOBS="1", **env)
    before = log.read_text().splitlines()
    t0 = time.perf_counter()
    r = subprocess.run(["bash", "run.sh", "setup", extras], cwd=src, env=e, capture_output=True, text=True,
                       timeout=300)
    seconds = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, seconds, log.read_text().splitlines()[len(before):]


def built(pip):
    return "BUILD" in pip


def test_second_verb_reuses_the_install_and_starts_within_seconds(tree):
    out, _, pip = setup(tree)
    assert built(pip), (out, pip)
    assert "building and installing formal-transformers[io]" in out
    assert (tree[1] / "formal-transformers.stamp").is_file()
    out, seconds, pip = setup(tree)
    assert not built(pip) and pip == [], (out, pip)  # not even pip's self-upgrade
    assert "up to date" in out, out
    assert seconds < 15, f"the second verb took {seconds:.1f} s before its work"
    # a subset of the installed extras: still nothing to do
    out, _, pip = setup(tree, "io")
    assert pip == [] and "up to date" in out


def test_a_new_extra_installs_its_dependencies_without_a_build(tree):
    setup(tree, "io")
    out, _, pip = setup(tree, "io,lab")
    if sys.version_info < (3, 11):  # no tomllib to read the extras with: run.sh rebuilds instead
        assert built(pip)
        return
    assert not built(pip), (out, pip)
    assert pip == ["install -q jupyterlab>=4"], pip
    out, _, pip = setup(tree, "lab")
    assert pip == [] and "up to date" in out, (out, pip)


@pytest.mark.parametrize("change", ["source", "new source", "option", "compiler", "install"])
def test_a_change_rebuilds(tree, change, tmp_path):
    src, _, _, site = tree
    setup(tree)
    env = {}
    if change == "source":
        source = sorted((src / "cpp" / "src").rglob("*.cpp"))[0]  # a tracked source of the core
        with open(source, "a") as f:
            f.write("// changed\n")
    elif change == "new source":  # untracked, not ignored: CMake's glob would compile it
        (src / "cpp" / "src" / "extra.cpp").write_text("// new\n")
    elif change == "option":
        env["CMAKE_ARGS"] = "-DFT_NATIVE=OFF"
    elif change == "compiler":
        cxx = tmp_path / "c++"
        cxx.write_text("#!/bin/sh\necho 'c++ (stand-in) 99.0.0'\n")
        cxx.chmod(0o755)
        env["CXX"] = str(cxx)
    elif change == "install":  # the extension module replaced by other means
        so = site / "formal_transformers" / "_core.stand-in.so"
        so.write_text("another build, a longer file than before\n")
    out, _, pip = setup(tree, **env)
    assert built(pip), (change, out, pip)
    out, _, pip = setup(tree, **env)  # and then it is up to date again
    assert pip == [] and "up to date" in out, (change, out, pip)


def test_rebuild_on_request(tree):
    setup(tree)
    out, _, pip = setup(tree, FT_REBUILD="1")
    assert built(pip), (out, pip)
