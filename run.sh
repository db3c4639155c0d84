#!/usr/bin/env bash
# formal-transformers: the two commands of the README.
#
#   ./run.sh demo    install what is missing, then the main job: train a small GPT (DTransformer) on a
#                    text and sample from it (python -m formal_transformers demo; see README.md)
#   ./run.sh test    install what is missing, then every test, through ctest in the wheel's own CMake tree:
#                    GoogleTest, the C++ CMake package, pytest (vs the numpy reference, finite differences and
#                    PyTorch autograd) and the notebooks against the wheel installed in the venv; then GoogleTest
#                    again in a separate build under AddressSanitizer + UndefinedBehaviorSanitizer
#
#   ./run.sh notebooks [jupyter lab options]
#                    install what is missing (with JupyterLab), register this venv's kernel as
#                    "formal-transformers", then open JupyterLab on notebooks/ (e.g. --no-browser --port 8890)
#
#   ./run.sh docs [--build-only] [--check]
#                    build the documentation site into build/docs (Sphinx + MyST: one page per listing, the
#                    notebooks with their outputs, the API reference; warnings are errors, internal links
#                    checked), then serve it on 127.0.0.1 (FT_DOCS_PORT, default 8000) and print the URL.
#                    --build-only: no server. --check (CI): also open it in headless Chromium (tools/check_site.py:
#                    math typeset, code blocks equal to the current sources, notebook images, search) and keep
#                    three screenshots in build/docs-check/
#   ./run.sh wheel [--check]
#                    the wheel and the sdist in dist/: the wheel is the one every verb builds and installs (below),
#                    reused when up to date. --check (CI): install the wheel into a fresh venv on a PATH with no
#                    compiler and no cmake and run tests/wheel/test_smoke.py there
#
# Other verbs: setup (install only), bench (benchmarks), clean.
# Works on a fresh Debian/Ubuntu machine: apt packages are installed with sudo when not root; Python
# packages go into ./.venv. Environment knobs: PYTHON (interpreter for the venv, default python3),
# JOBS (build parallelism, default: nproc), PIP_TORCH_ARGS (e.g. "--index-url
# https://download.pytorch.org/whl/cpu" to fetch the small CPU build of torch instead of PyPI's default),
# FT_APT=0 (never look at apt packages), FT_REBUILD=1 (rebuild the package even when it is up to date).
#
# One build for every verb: the wheel users get. pip wheel through scikit-build-core, portable (FT_NATIVE=OFF:
# no -march=native), in a persistent CMake tree build/wheel/<tag> (no build isolation: the build requirements
# are installed into the venv, so a rebuild is incremental); repaired by auditwheel into dist/ (a manylinux tag,
# libgomp and oneDNN inside, OpenBLAS from its PyPI package scipy-openblas32); then that wheel is installed
# into the venv. `./run.sh test` builds the GoogleTest suites in the same tree (the same object files of the
# core as the module's) and runs ctest there, pytest importing the installed wheel. The venv keeps a stamp
# beside the install ($VENV/formal-transformers.stamp): a hash of the source files that go into the wheel
# (cpp/, cmake/, python/formal_transformers/ and the top-level build files; git's tracked and untracked,
# not ignored files), the build options (CMAKE_ARGS, SKBUILD_*, CXX, CXXFLAGS, ...), the compiler,
# the venv's Python and the CPU; then the extras installed, the installed extension file, the wheel in
# dist/ and whether the tree has the tests. A verb whose stamp matches prints "up to date" and starts its work
# at once; a changed source, option or compiler rebuilds; a new extra installs only that extra's dependencies.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
APT_PACKAGES=(g++ cmake ninja-build pkg-config git
              libxtensor-dev libxsimd-dev libgtest-dev nlohmann-json3-dev robin-map-dev
              python3-dev python3-venv libdnnl-dev
              espeak-ng)  # libdnnl-dev: bf16-mixed products (docs/design.md); espeak-ng: notebook 18's synthesized speech (docs/data.md)

DOCS_CHECK_APT_PACKAGES=(chromium)  # ./run.sh docs --check: the headless browser
log() { printf '\n== %s\n' "$*"; }

install_apt() {
  [ "${FT_APT:-1}" = 0 ] && return 0
  command -v dpkg-query >/dev/null || { echo "not a Debian/Ubuntu system: install ${APT_PACKAGES[*]} by hand"; return 0; }
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt: installing ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}"; exit 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "python: creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
  fi
}

STAMP_FILE="$VENV/formal-transformers.stamp"

# The files that go into the wheel: git's view (tracked, plus untracked files that are not ignored, so a
# new cpp/src/*.cpp counts) when this is a git work tree, else every file under the same paths.
wheel_sources() {
  local paths=(CMakeLists.txt pyproject.toml README.md cmake cpp python/formal_transformers)
  if [ -e .git ] && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard -- "${paths[@]}" | sort -zu |
      while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done
  else
    find "${paths[@]}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 2>/dev/null | sort -z
  fi
}

# One line: what the installed package must have been built from (sources, options, toolchain, CPU).
build_key() {
  {
    set +e  # a missing tool is part of the key, not an error
    wheel_sources | xargs -0 -r sha256sum
    env | grep -E '^(CMAKE_ARGS|CMAKE_GENERATOR|CMAKE_TOOLCHAIN_FILE|SKBUILD_[A-Z_]*|CXX|CC|CXXFLAGS|CFLAGS|CPPFLAGS|LDFLAGS)=' | sort
    "${CXX:-c++}" --version 2>&1 | head -n 1
    "$VENV/bin/python" -c 'import sys; print(sys.version)'
    grep -m 1 -E '^(model name|cpu model|Processor)' /proc/cpuinfo 2>/dev/null || uname -m
  } | sha256sum | cut -d ' ' -f 1
}

# The installed extension module (path, size, modification time): a reinstall by other means changes it.
installed_core() {
  local f out=""
  for f in "$VENV"/lib/python*/site-packages/formal_transformers/_core*.so; do
    [ -f "$f" ] && out+="$(stat -c '%n %s %Y' "$f") "
  done
  [ -n "$out" ] && printf '%s' "$out"
}

# Sorted, comma-separated union of extras lists ("io" "test,io" -> "io,test")
extras_union() { printf '%s\n' "$@" | tr ',' '\n' | grep -v '^$' | sort -u | paste -sd, -; }

# The requirements of the extras in $1 that $2 lacks, one a line, read from pyproject.toml (tomllib:
# Python 3.11+); fails when it cannot tell (older Python, unknown extra), and the caller rebuilds.
missing_extra_requirements() {
  "$VENV/bin/python" - "$1" "$2" <<'EOF'
import sys
try:
    import tomllib
except ImportError:
    sys.exit(1)
want, have = set(filter(None, sys.argv[1].split(","))), set(filter(None, sys.argv[2].split(",")))
with open("pyproject.toml", "rb") as f:
    extras = tomllib.load(f)["project"].get("optional-dependencies", {})
if not want - have <= set(extras):
    sys.exit(1)
print("\n".join(sorted({r for e in want - have for r in extras[e]})))
EOF
}

install_torch() {  # torch first, pinned, so nothing pulls another build (PIP_TORCH_ARGS may name the CPU index)
  # shellcheck disable=SC2086
  "$VENV/bin/python" -c "import torch" 2>/dev/null || \
    "$VENV/bin/python" -m pip install -q ${PIP_TORCH_ARGS:-} "torch==2.13.0"
}

# The requirements named in pyproject.toml: [build-system] requires and the extras given, one a line. tomllib
# (Python 3.11+), else tomli, installed for the purpose.
pyproject_requirements() {
  "$VENV/bin/python" -c "import tomllib" 2>/dev/null || "$VENV/bin/python" -c "import tomli" 2>/dev/null ||
    "$VENV/bin/python" -m pip install -q tomli
  "$VENV/bin/python" - "$@" <<'EOF'
import sys
try:
    import tomllib
except ImportError:
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)
reqs = list(project["build-system"]["requires"])
for extra in sys.argv[1:]:
    reqs += project["project"]["optional-dependencies"][extra]
print("\n".join(sorted(set(reqs))))
EOF
}

# The wheel (run.sh's header "One build for every verb"), into dist/; with $1 = tests, the GoogleTest suites and
# ctest's pytest entry in its CMake tree too (they change nothing in the wheel: same core, same flags).
build_wheel() {
  local reqs req_list=() py defs=(-C cmake.define.FT_NATIVE=OFF)
  reqs=$(pyproject_requirements wheel) || { echo "cannot read the build requirements from pyproject.toml"; exit 1; }
  mapfile -t req_list <<< "$reqs"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q "${req_list[@]}"
  py="$(cd "$VENV" && pwd)/bin/python"
  [ "${1:-}" = tests ] && defs+=(-C cmake.define.FT_BUILD_TESTS=ON -C cmake.define.FT_PYTEST=ON
                                 -C "cmake.define.FT_PYTHON=$py")
  local t0=$SECONDS
  log "wheel: building (pip wheel, scikit-build-core, portable: FT_NATIVE=OFF; CMake tree build/wheel/<tag>${1:+, with the GoogleTest suites})"
  rm -rf build/wheel/raw dist
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$VENV/bin/python" -m pip wheel . --no-deps --no-build-isolation -q \
    -w build/wheel/raw -C "build-dir=build/wheel/{wheel_tag}" "${defs[@]}"
  log "wheel: auditwheel repair (libgomp and oneDNN inside the wheel; OpenBLAS is the scipy-openblas32 dependency)"
  PATH="$(cd "$VENV" && pwd)/bin:$PATH" "$VENV/bin/auditwheel" repair --exclude libscipy_openblas.so \
    -w dist build/wheel/raw/*.whl
  log "wheel: built in $((SECONDS - t0)) s"
}

# The wheel in dist/ and its hash; fails when there is not exactly one.
dist_wheel() {
  local w=(dist/*.whl)
  [ ${#w[@]} -eq 1 ] && [ -f "${w[0]}" ] && sha256sum "${w[0]}"
}

# The CMake tree the wheel was built in: build/wheel/<the raw wheel's tag>.
wheel_tree() {
  local w=(build/wheel/raw/*.whl) tag
  [ -f "${w[0]}" ] || return 1
  tag=$(basename "${w[0]}" .whl | cut -d - -f 3-)
  printf 'build/wheel/%s' "$tag"
}

# $1: extras, e.g. "io" or "test,notebooks,io"; FT_WANT_TESTS=1: the wheel's tree must hold the GoogleTest suites.
# Builds the wheel and installs it unless the stamp says the installed package is the wheel in dist/, built from
# these sources, options and toolchain (and with the tests in its tree when they are wanted), and has these extras.
install_package() {
  local key core whl tree="" stamp_key="" stamp_extras="" stamp_core="" stamp_whl="" stamp_tree="" merged reqs
  local want_tests=${FT_WANT_TESTS:-0}
  key=$(build_key)
  if [ -f "$STAMP_FILE" ] && [ "${FT_REBUILD:-0}" != 1 ] && core=$(installed_core) && whl=$(dist_wheel); then
    { IFS= read -r stamp_key; IFS= read -r stamp_extras; IFS= read -r stamp_core; IFS= read -r stamp_whl
      IFS= read -r stamp_tree; } < "$STAMP_FILE" || true
    if [ "$stamp_key" = "$key" ] && [ "$stamp_core" = "$core" ] && [ "$stamp_whl" = "$whl" ] &&
       { [ "$want_tests" != 1 ] || { [ -n "$stamp_tree" ] && [ -x "$stamp_tree/ft_tests" ]; }; }; then
      merged=$(extras_union "$stamp_extras" "$1")
      if [ "$merged" = "$stamp_extras" ]; then
        log "python: formal-transformers in $VENV is up to date (the wheel in dist/; same sources, options and compiler; extras $stamp_extras)"
        return 0
      fi
      if reqs=$(missing_extra_requirements "$1" "$stamp_extras"); then
        log "python: formal-transformers in $VENV is up to date; installing what extras $1 add"
        [[ "$1" == *test* ]] && install_torch
        local req_list=()
        mapfile -t req_list <<< "$reqs"
        [ -z "$reqs" ] || "$VENV/bin/python" -m pip install -q "${req_list[@]}"
        printf '%s\n%s\n%s\n%s\n%s\n' "$key" "$merged" "$core" "$whl" "$stamp_tree" > "$STAMP_FILE"
        return 0
      fi
    fi
  fi
  [[ "$1" == *test* ]] && install_torch
  rm -f "$STAMP_FILE"
  if [ "$want_tests" = 1 ]; then build_wheel tests; else build_wheel; fi
  whl=$(dist_wheel) || { echo "the build left no single wheel in dist/"; exit 1; }
  [ "$want_tests" = 1 ] && tree=$(wheel_tree)
  log "python: installing ${whl##* }[$1] into $VENV"
  "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "${whl##* }"
  "$VENV/bin/python" -m pip install -q "${whl##* }[$1]"
  core=$(installed_core) || { echo "the wheel installed no formal_transformers/_core module into $VENV"; exit 1; }
  printf '%s\n%s\n%s\n%s\n%s\n' "$key" "$(extras_union "$1")" "$core" "$whl" "$tree" > "$STAMP_FILE"
}

setup() {
  install_apt
  venv
  install_package "${1:-test,notebooks,io}"
}

notebooks() {
  setup "notebooks,io,lab"
  log "jupyter: kernel \"formal-transformers\" ($VENV/bin/python), JupyterLab on notebooks/ (Ctrl-C stops it)"
  "$VENV/bin/python" -m ipykernel install --sys-prefix --name formal-transformers \
    --display-name "Python (formal-transformers)" >/dev/null
  local root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-root)   # containers often run as root
  exec "$VENV/bin/python" -m jupyter lab --notebook-dir=notebooks \
    --MappingKernelManager.default_kernel_name=formal-transformers "${root[@]}" "$@"
}

run_tests() {
  FT_WANT_TESTS=1 setup "test,notebooks,io,lab"
  local py tree t0=$SECONDS
  py="$(cd "$VENV" && pwd)/bin/python"
  local whl
  { IFS= read -r _; IFS= read -r _; IFS= read -r _; IFS= read -r whl; IFS= read -r tree; } < "$STAMP_FILE"
  whl="$(pwd)/${whl##* }"
  log "tests: ctest in the wheel's tree $tree (GoogleTest, the C++ package; pytest and the notebooks against the installed wheel)"
  # FT_TESTED_WHEEL: tests/python/test_package.py checks that the module under test is this wheel's
  FT_TESTED_WHEEL="$whl" ctest --test-dir "$tree" --output-on-failure -j 1
  log "tests: release tests done in $((SECONDS - t0)) s"
  # a build of its own by nature: the instrumented core (and xtensor's assertions) is not the one users get
  log "tests: GoogleTest under AddressSanitizer + UndefinedBehaviorSanitizer (a separate, instrumented build)"
  t0=$SECONDS
  cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFT_BUILD_TESTS=ON -DFT_SANITIZE=ON \
        -DFT_PYTHON="$py" >/dev/null
  cmake --build build/asan -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan --output-on-failure -L cpp -j 1
  log "tests: sanitizer build and tests done in $((SECONDS - t0)) s"
  log "all tests passed"
}

docs() {
  local serve=1 check=0 a
  for a in "$@"; do
    case "$a" in
      --build-only) serve=0 ;;
      --check) check=1; serve=0 ;;
      *) echo "./run.sh docs: unknown option $a (--build-only, --check)"; exit 2 ;;
    esac
  done
  [ "$check" = 1 ] && APT_PACKAGES+=("${DOCS_CHECK_APT_PACKAGES[@]}")
  setup "docs,io"   # autodoc reads the installed package, the compiled module included
  log "docs: building the site into build/docs (warnings are errors)"
  local t0=$SECONDS
  rm -rf build/docs build/docs-doctrees
  "$VENV/bin/python" -m sphinx -W --keep-going -q -b html -d build/docs-doctrees docs build/docs
  "$VENV/bin/python" tools/check_site.py links build/docs
  log "docs: $(find build/docs -name '*.html' ! -path '*/_*' | wc -l) pages in $((SECONDS - t0)) s: build/docs/index.html"
  if [ "$check" = 1 ]; then
    log "docs: the site in headless Chromium"
    "$VENV/bin/python" tools/check_site.py browser build/docs build/docs-check
  fi
  if [ "$serve" = 1 ]; then
    local port=${FT_DOCS_PORT:-8000}
    log "docs: serving build/docs at http://127.0.0.1:$port/ (Ctrl-C stops)"
    exec "$VENV/bin/python" -m http.server --bind 127.0.0.1 --directory build/docs "$port"
  fi
}

wheel() {
  local check=0 a
  for a in "$@"; do
    case "$a" in
      --check) check=1 ;;
      *) echo "./run.sh wheel: unknown option $a (--check)"; exit 2 ;;
    esac
  done
  setup "io"   # the wheel every verb builds and installs; up to date (reused) after ./run.sh test
  local whl t0=$SECONDS
  whl=$(dist_wheel) && whl=${whl##* } || { echo "no single wheel in dist/"; exit 1; }
  log "wheel: $whl ($(du -k "$whl" | cut -f 1) KiB)"
  "$VENV/bin/auditwheel" show "$whl"
  log "wheel: the sdist"
  rm -f dist/*.tar.gz
  "$VENV/bin/python" -m build --sdist --no-isolation --outdir dist . >/dev/null
  "$VENV/bin/python" - dist/*.tar.gz <<'EOF'
import sys, tarfile
names = tarfile.open(sys.argv[1]).getnames()
top = {n.split("/")[1] for n in names if n.count("/")}
stray = sorted(top & {".venv", "build", "dist", "runs", ".git"})
need = {"CMakeLists.txt", "pyproject.toml", "cpp", "python", "LICENSE", "README.md"}
if stray or not need <= top:
    sys.exit(f"the sdist holds {stray} or lacks {sorted(need - top)}")
print(f"sdist: {len(names)} files")
EOF
  ls -l dist
  log "wheel: sdist in $((SECONDS - t0)) s"
  [ "$check" = 1 ] || return 0
  log "wheel: installed into a fresh venv, smoke suite on a PATH without a compiler or cmake"
  t0=$SECONDS
  local sv
  sv="$(pwd)/build/wheel/venv"
  rm -rf "$sv" build/wheel/run
  "$PYTHON" -m venv "$sv"
  "$sv/bin/python" -m pip install -q --only-binary :all: "$whl[io]" "pytest>=7"
  mkdir -p build/wheel/run
  (cd build/wheel/run && PATH="$sv/bin" FT_REPO="$OLDPWD" "$sv/bin/python" -m pytest -q -p no:cacheprovider \
    "$OLDPWD/tests/wheel/test_smoke.py")
  log "wheel: smoke suite in $((SECONDS - t0)) s"
}

case "${1:-}" in
  demo)  shift; setup "io"; "$VENV/bin/python" -m formal_transformers demo "$@" ;;
  test)  run_tests ;;
  notebooks) shift; notebooks "$@" ;;
  setup) setup "${2:-test,notebooks,io,lab}" ;;
  docs) shift; docs "$@" ;;
  wheel) shift; wheel "$@" ;;
  bench) setup "test,notebooks,io"; for b in bench/bench_*.py; do "$VENV/bin/python" "$b"; done ;;
  clean) rm -rf build "$VENV" ;;
  *) sed -n '2,33p' "$0"; exit 2 ;;
esac
