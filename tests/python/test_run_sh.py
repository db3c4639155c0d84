"""./run.sh builds the package once for every verb (run.sh "One build for every verb").

The verbs run `setup`, which builds the wheel and installs it into the venv only when the venv's stamp does
not match the sources, build options and compiler, or the wheel in dist/. Running the real build here would
take minutes and would reinstall the package under the running tests, so these tests run run.sh's own logic
on a copy of the wheel's sources (a git work tree of its own) against a stand-in venv: its `bin/python` is a
script that records every `pip` command (`pip wheel .` leaves a stand-in wheel in build/wheel/raw/, and the
GoogleTest binary in the CMake tree when the tests are asked for; installing a wheel puts a stand-in extension
module where the real one goes) and hands everything else to this interpreter; its `bin/auditwheel` copies the
wheel into dist/ under a manylinux tag. apt is off (FT_APT=0). What is asserted is what the user sees: the
second verb builds nothing, says "up to date" and returns within seconds; a changed source, option, compiler,
install or wheel rebuilds; a new extra installs only its dependencies; the test verb's tests are built in the
wheel's own tree.
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

TAG = "cp311-cp311-linux_x86_64"
SHIM = """#!/usr/bin/env bash
# stand-in venv python: records pip commands, fakes the build and the install, runs everything else for real
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  shift 2
  echo "$*" >> "{log}"
  if [ "$1" = wheel ]; then
    mkdir -p build/wheel/raw
    echo "$RANDOM$RANDOM" > build/wheel/raw/formal_transformers-0.1.0-{tag}.whl
    case "$*" in *FT_BUILD_TESTS=ON*) mkdir -p build/wheel/{tag}; touch build/wheel/{tag}/ft_tests
                                      chmod +x build/wheel/{tag}/ft_tests; echo TESTS >> "{log}" ;; esac
    echo BUILD >> "{log}"
  fi
  case "$*" in *--force-reinstall*.whl*) mkdir -p "{site}/formal_transformers"
          echo "$RANDOM$RANDOM" > "{site}/formal_transformers/_core.stand-in.so" ;; esac
  exit 0
fi
exec "{python}" "$@"
"""
# stand-in auditwheel: `repair ... -w dist raw.whl` copies the wheel under a manylinux tag
AUDITWHEEL = """#!/usr/bin/env bash
out=""; whl=""
while [ $# -gt 0 ]; do
  case "$1" in -w) out=$2; shift ;; *.whl) whl=$1 ;; esac
  shift
done
mkdir -p "$out"
cp "$whl" "$out/$(basename "$whl" | sed 's/linux_x86_64/manylinux_2_34_x86_64/')"
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
    py.write_text(SHIM.replace("{log}", str(log)).replace("{site}", str(site)).replace("{tag}", TAG)
                  .replace("{python}", sys.executable))
    py.chmod(0o755)
    aw = venv / "bin" / "auditwheel"
    aw.write_text(AUDITWHEEL)
    aw.chmod(0o755)
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
    assert "wheel: building" in out and "installing dist/formal_transformers-" in out and "[io] into" in out
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


@pytest.mark.parametrize("change", ["source", "new source", "option", "compiler", "install", "wheel"])
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
    elif change == "wheel":  # the wheel in dist/ replaced or removed: the venv's package may not be it
        next((src / "dist").glob("*.whl")).write_text("another wheel\n")
    out, _, pip = setup(tree, **env)
    assert built(pip), (change, out, pip)
    out, _, pip = setup(tree, **env)  # and then it is up to date again
    assert pip == [] and "up to date" in out, (change, out, pip)


def test_rebuild_on_request(tree):
    setup(tree)
    out, _, pip = setup(tree, FT_REBUILD="1")
    assert built(pip), (out, pip)


def test_the_wheel_is_what_the_venv_has(tree):
    """The build is the wheel users get: pip wheel (portable, no build isolation, a persistent CMake tree),
    auditwheel's repair into dist/, then that wheel installed into the venv."""
    src = tree[0]
    out, _, pip = setup(tree)
    build = next(c for c in pip if c.startswith("wheel "))
    assert "--no-build-isolation" in build and "FT_NATIVE=OFF" in build, build
    assert "build-dir=build/wheel/{wheel_tag}" in build, build
    wheels = list((src / "dist").glob("*.whl"))
    assert [w.name for w in wheels] == [f"formal_transformers-0.1.0-{TAG.replace('linux', 'manylinux_2_34')}.whl"]
    assert f"install -q --force-reinstall --no-deps dist/{wheels[0].name}" in pip, pip
    assert f"install -q dist/{wheels[0].name}[io]" in pip, pip


def test_the_test_verb_builds_its_tests_in_the_wheels_tree(tree):
    """`./run.sh test` wants the GoogleTest suites in the wheel's CMake tree: a venv set up without them
    rebuilds (incrementally, in the same tree), one set up with them is up to date for every verb."""
    src = tree[0]
    setup(tree)
    out, _, pip = setup(tree, FT_WANT_TESTS="1")
    assert built(pip) and "TESTS" in pip, (out, pip)
    assert (tree[1] / "formal-transformers.stamp").read_text().splitlines()[4] == f"build/wheel/{TAG}"
    assert (src / "build" / "wheel" / TAG / "ft_tests").is_file()
    out, _, pip = setup(tree, FT_WANT_TESTS="1")
    assert pip == [] and "up to date" in out, (out, pip)
    out, _, pip = setup(tree)
    assert pip == [] and "up to date" in out, (out, pip)
