#!/usr/bin/env bash
# formal-transformers: the two commands of the README.
#
#   ./run.sh demo    install what is missing, then the main job: train a small GPT (DTransformer) on a
#                    text and sample from it (python -m formal_transformers demo; see README.md)
#   ./run.sh test    install what is missing, then every test: GoogleTest (release build, and again
#                    under AddressSanitizer + UndefinedBehaviorSanitizer), pytest (vs the numpy reference,
#                    finite differences and PyTorch autograd) and the notebooks, all through ctest
#
#   ./run.sh notebooks [jupyter lab options]
#                    install what is missing (with JupyterLab), register this venv's kernel as
#                    "formal-transformers", then open JupyterLab on notebooks/ (e.g. --no-browser --port 8890)
#
# Other verbs: setup (install only), bench (benchmarks), clean.
# Works on a fresh Debian/Ubuntu machine: apt packages are installed with sudo when not root; Python
# packages go into ./.venv. Environment knobs: PYTHON (interpreter for the venv, default python3),
# JOBS (build parallelism, default: nproc), PIP_TORCH_ARGS (e.g. "--index-url
# https://download.pytorch.org/whl/cpu" to fetch the small CPU build of torch instead of PyPI's default).
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
APT_PACKAGES=(g++ cmake ninja-build pkg-config git
              libxtensor-dev libxsimd-dev libgtest-dev nlohmann-json3-dev robin-map-dev
              python3-dev python3-venv)

log() { printf '\n== %s\n' "$*"; }

install_apt() {
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
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
}

# $1: extras, e.g. "io" or "test,notebooks,io"
install_package() {
  if [[ "$1" == *test* ]]; then
    # torch first, pinned, so nothing pulls another build (PIP_TORCH_ARGS may name the CPU index)
    "$VENV/bin/python" -c "import torch" 2>/dev/null || \
      "$VENV/bin/python" -m pip install -q ${PIP_TORCH_ARGS:-} "torch==2.13.0"
  fi
  log "python: building and installing formal-transformers[$1]"
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$VENV/bin/python" -m pip install -q ".[$1]"
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
  setup "test,notebooks,io,lab"
  local py; py="$(cd "$VENV" && pwd)/bin/python"
  log "tests: release build (GoogleTest + pytest + notebooks through ctest)"
  cmake -S . -B build/tests -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_BUILD_TESTS=ON -DFT_PYTEST=ON \
        -DFT_PYTHON="$py" >/dev/null
  cmake --build build/tests -j "$JOBS"
  ctest --test-dir build/tests --output-on-failure -j 1
  log "tests: GoogleTest under AddressSanitizer + UndefinedBehaviorSanitizer"
  cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFT_BUILD_TESTS=ON -DFT_SANITIZE=ON \
        -DFT_PYTHON="$py" >/dev/null
  cmake --build build/asan -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan --output-on-failure -L cpp -j 1
  log "all tests passed"
}

case "${1:-}" in
  demo)  shift; setup "io"; "$VENV/bin/python" -m formal_transformers demo "$@" ;;
  test)  run_tests ;;
  notebooks) shift; notebooks "$@" ;;
  setup) setup "${2:-test,notebooks,io,lab}" ;;
  bench) setup "test,notebooks,io"; for b in bench/bench_*.py; do "$VENV/bin/python" "$b"; done ;;
  clean) rm -rf build "$VENV" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
