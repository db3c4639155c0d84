"""The package as a user meets it: import from anywhere, exports, typing files, threads, the main job (CLI)."""
import json
import platform
import re
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import formal_transformers as ft

PKG = pathlib.Path(ft.__file__).parent

LISTING_NAMES = [
    "TokenEmbedding", "PositionalEmbedding", "BasicAttention", "Attention", "MHAttention", "LayerNorm", "RMSNorm",
    "Unembedding", "EDTransformer", "ETransformer", "DTransformer", "EDTraining", "ETraining", "DTraining",
    "DInference", "EDInference", "CharTokenizer", "WordTokenizer", "BPETokenizer", "chunk", "softmax", "gelu",
    "relu", "bidirectional_mask", "unidirectional_mask", "Adam", "SGD", "ViT", "Whisper",
]


def test_every_api_name_is_exported():
    for name in LISTING_NAMES:
        assert hasattr(ft, name), name
        assert name in ft.__all__, name
    assert not [n for n in ft.__all__ if n.startswith("_")]


def test_import_works_from_any_directory(tmp_path):
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", "import formal_transformers as ft; print(ft.DTransformer.__name__)"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "DTransformer"


def test_typing_files_ship_with_the_package():
    assert (PKG / "py.typed").exists()
    stub = PKG / "_core.pyi"
    assert stub.exists()
    text = stub.read_text()
    public = {n for n in dir(ft._core) if not n.startswith("_")}
    # the stub's __all__ lists exactly the compiled module's public names (regenerate: docs/DEVELOPING.md)
    line = next(l for l in text.splitlines() if l.startswith("__all__"))
    stub_all = set(eval(line.split("=", 1)[1]))
    assert stub_all == public, f"stub out of date: missing {public - stub_all}, extra {stub_all - public}"


def test_stub_is_what_stubgen_makes_of_the_module(tmp_path):
    """_core.pyi is regenerated from the compiled module exactly as docs/DEVELOPING.md says; a binding whose
    signature or docstring changed without regenerating the stub fails here."""
    pytest.importorskip("pybind11_stubgen", reason="pybind11-stubgen is in the test extra (pip install '.[test]')")
    env = dict(os.environ)
    if env.get("FT_CORE_PATH"):
        env["FT_CORE_PATH"] = str(pathlib.Path(env["FT_CORE_PATH"]).resolve())
    env["PYTHONPATH"] = os.pathsep.join([str(PKG.resolve().parent)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    r = subprocess.run([sys.executable, "-m", "pybind11_stubgen", "formal_transformers._core", "-o", str(tmp_path),
                        "--numpy-array-use-type-var"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    made = (tmp_path / "formal_transformers" / "_core.pyi").read_text()
    assert made == (PKG / "_core.pyi").read_text(), "python/formal_transformers/_core.pyi is out of date: regenerate it (docs/DEVELOPING.md)"


def test_the_tests_run_the_wheel_users_get():
    """`./run.sh test` (CI) names the wheel it built, repaired and installed in FT_TESTED_WHEEL: the module every test
    imports is that wheel's file byte for byte, from site-packages (not a build tree), and the wheel is the portable
    one (a manylinux tag, OpenMP's runtime inside). Elsewhere the module is the developer's build tree's when
    FT_CORE_PATH names one (docs/DEVELOPING.md), else the installed package's own."""
    import zipfile

    core = pathlib.Path(ft._core.__file__).resolve()
    wheel = os.environ.get("FT_TESTED_WHEEL")
    if not wheel:
        where = pathlib.Path(os.environ["FT_CORE_PATH"]).resolve() if os.environ.get("FT_CORE_PATH") else PKG.resolve()
        assert core.parent == where, (core, where)
        return
    assert not os.environ.get("FT_CORE_PATH"), "FT_TESTED_WHEEL and FT_CORE_PATH: which module is under test?"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        module = [n for n in names if n.startswith("formal_transformers/_core") and n.endswith(".so")]
        assert len(module) == 1, module
        assert z.read(module[0]) == core.read_bytes(), f"the module under test ({core}) is not {wheel}'s"
        assert any(n.startswith("formal_transformers.libs/libgomp") for n in names), names
        meta = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    tags = [l.split(":", 1)[1].strip() for l in meta.splitlines() if l.startswith("Tag:")]
    assert tags and all("manylinux" in t for t in tags), tags
    assert "site-packages" in core.parts and core.parent == PKG.resolve(), core


def test_threads_and_blas():
    n = ft.get_num_threads()
    assert n >= 1
    ft.set_num_threads(1)
    assert ft.get_num_threads() == 1
    ft.set_num_threads(n)
    assert ft.get_num_threads() == n
    with pytest.raises(ValueError, match="n must be >= 1"):
        ft.set_num_threads(0)
    assert "OpenBLAS" in ft.blas_info()
    assert f"kernel {ft.blas_kernel()}" in ft.blas_info()


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


# OpenBLAS kernel sets (openblas_get_corename) by the widest SIMD they use. A CPU with AVX2 must get one
# of these; anything else (Prescott, Core2, Nehalem, Sandybridge, ...) is a generic fallback, 3.5-5x slower
# (Debian 12's OpenBLAS 0.3.21 on an Emerald Rapids: Prescott; docs/design.md "BLAS").
_AVX2_KERNELS = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids", "excavator"}
_AVX512_KERNELS = {"skylakex", "cooperlake", "sapphirerapids"}


def test_blas_kernel_fits_the_cpu():
    flags = _cpu_flags()
    if flags is None or platform.machine() not in ("x86_64", "AMD64"):
        # no CPU flags to hold the kernel against (not Linux on x86-64): only that a kernel is named
        assert ft.blas_kernel()
        return
    kernel = ft.blas_kernel().lower()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags and "GenuineIntel" in open("/proc/cpuinfo").read():
        assert kernel in _AVX512_KERNELS, f"AVX-512 Intel CPU but BLAS kernel {ft.blas_kernel()!r}: {ft.blas_info()}"
    if {"avx2", "fma"} <= flags:
        assert kernel in _AVX2_KERNELS, f"AVX2 CPU but generic BLAS kernel {ft.blas_kernel()!r}: {ft.blas_info()}"
    # and the library is a current OpenBLAS (0.3.28+: its parallel jobs on our pool), not an older one the
    # loader found first
    version = tuple(int(v) for v in re.search(r"OpenBLAS (\d+)\.(\d+)\.(\d+)", ft.blas_info()).groups())
    assert version >= (0, 3, 28), ft.blas_info()
    assert "OpenMP pool" in ft.blas_info(), ft.blas_info()


def test_params_is_a_mapping():
    from collections.abc import Mapping

    m = ft.LayerNorm(3)
    assert isinstance(m.params, Mapping)
    assert dict(m.params.items()).keys() == {"gamma", "beta"}


def _run_cli(args, cwd, timeout=600):
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "formal_transformers", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"{args}: {r.stdout}\n{r.stderr}"
    return r.stdout


def test_main_job_trains_samples_and_resumes(tmp_path):
    """The README's main job end to end on a tiny model: train, sample, resume where it stopped."""
    text = "the quick brown fox jumps over the lazy dog. " * 60
    (tmp_path / "t.txt").write_text(text)
    small = ["--text", "t.txt", "--out", "run", "--context", "16", "--layers", "1", "--heads", "2", "--d-e", "16",
             "--d-mlp", "32", "--batch", "4", "--eval-every", "5", "--warmup", "2", "--quiet"]
    out = _run_cli(["train", *small, "--steps", "10"], tmp_path)
    assert "trained 10 steps" in out
    run = tmp_path / "run"
    for f in ("model.safetensors", "tokenizer.json", "optimizer.safetensors", "run.json"):
        assert (run / f).exists(), f
    state = json.loads((run / "run.json").read_text())
    assert state["steps_done"] == 10 and len(state["history"]["loss"]) == 10
    assert state["history"]["loss"][-1] < state["history"]["loss"][0]
    out = _run_cli(["sample", "--run", "run", "--prompt", "the ", "--tokens", "20", "--seed", "1", "--samples", "1"],
                   tmp_path)
    assert "the " in out and "sample 1" in out
    out = _run_cli(["train", *small, "--steps", "15", "--resume"], tmp_path)
    assert "resuming" in out and "trained 5 steps" in out
    state = json.loads((run / "run.json").read_text())
    assert state["steps_done"] == 15 and len(state["history"]["loss"]) == 15
    assert state["history"]["step"] == list(range(1, 16))  # numbered across the resumption
    # the schedule continued where it stopped (no second warm-up; the decay now spans --steps 15): steps
    # 11–15 have the η of one uninterrupted 15-step run at those steps
    _run_cli(["train", *[a if a != "run" else "run15" for a in small], "--steps", "15"], tmp_path)
    once = json.loads((tmp_path / "run15" / "run.json").read_text())["history"]["lr"]
    np.testing.assert_allclose(state["history"]["lr"][10:], once[10:], rtol=1e-12)
    # the saved model is the trained one: its loss on the text is what training reached, not the initial one
    model = ft.load(run / "model.safetensors")
    tok = ft.CharTokenizer.load(str(run / "tokenizer.json"))
    ids = tok.encode(text[:17], bos=False, eos=False)
    assert model.loss(ids, reduction="mean") < np.log(tok.n_vocab)


def test_demo_command_trains_then_samples(tmp_path):
    """`./run.sh demo` runs `python -m formal_transformers demo`: train, save under runs/demo, print samples."""
    (tmp_path / "t.txt").write_text("to be or not to be, that is the question. " * 40)
    out = _run_cli(["demo", "--text", "t.txt", "--steps", "4", "--context", "16", "--layers", "1", "--heads", "2",
                    "--d-e", "16", "--d-mlp", "32", "--batch", "4", "--warmup", "1", "--tokens", "12",
                    "--samples", "1", "--quiet"], tmp_path)
    assert "trained 4 steps" in out and "sample 1" in out
    assert (tmp_path / "runs" / "demo" / "model.safetensors").exists()


def test_main_job_default_text_is_the_stdlib_source():
    from formal_transformers import cli

    text = cli.default_text(50_000)
    assert len(text) == 50_000
    assert "def " in text and "import" in text


def test_openmp_wait_default_is_set_only_while_the_core_loads():
    """The bounded spin (OMP_WAIT_POLICY=active, GOMP_SPINCOUNT=1000) is our libgomp's default only while
    _core loads: afterwards the process (and its children) see the user's environment; a user's own
    setting is left alone."""
    code = ("import os, formal_transformers as ft; "
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))")
    pkg_parent = str(pathlib.Path(ft.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "FT_OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if env.get("FT_CORE_PATH"):
        env["FT_CORE_PATH"] = os.path.abspath(env["FT_CORE_PATH"])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["None", "None"]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(env, OMP_WAIT_POLICY="passive"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["passive", "None"]
