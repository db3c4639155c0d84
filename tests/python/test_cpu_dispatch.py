"""Run-time CPU dispatch of our kernels (docs/design.md "CPU dispatch in the portable build"): ft.blas_info() names
the level, FT_CPU_LEVEL=baseline (or x86-64-v3) gives the same results as the level chosen on this machine (float64 training step
through the tiled attention, softmax and GELU kernels), and an unknown FT_CPU_LEVEL is a ValueError. Each level is
chosen once per process: every case runs in a child."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import child_env

CHILD = r"""
import json, sys
import numpy as np
import formal_transformers as ft
info = ft.blas_info()
model = ft.DTransformer(11, 40, 2, 2, 16, 32, dtype="float64", seed=3, attention_impl="tiled")
x = np.random.default_rng(0).integers(0, 11, (2, 40))
loss, g = model.loss_and_grad(x)
print(json.dumps(dict(info=info, loss=float(loss), grads={k: np.asarray(v).ravel().tolist() for k, v in g.items()})))
"""


def run(level: str | None):
    env = child_env()
    env.pop("FT_CPU_LEVEL", None)
    if level is not None:
        env["FT_CPU_LEVEL"] = level
    return subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("level", ["baseline", "x86-64-v3"])
def test_forced_level_gives_the_dispatched_results(level):
    chosen, base = run(None), run(level)
    assert chosen.returncode == 0, chosen.stderr
    assert base.returncode == 0, base.stderr
    a, b = json.loads(chosen.stdout.splitlines()[-1]), json.loads(base.stdout.splitlines()[-1])
    assert "our kernels " in a["info"]
    if "run-time choice" in a["info"]:  # the portable build: the forced level's copy ran in the child
        name = "baseline x86-64" if level == "baseline" or "baseline x86-64" in a["info"] else level  # (≤ the CPU's)
        assert f"our kernels {name} (run-time choice)" in b["info"], b["info"]
    assert abs(a["loss"] - b["loss"]) <= 1e-12 * abs(a["loss"])
    assert a["grads"].keys() == b["grads"].keys() and a["grads"]
    # relative to the gradient's largest entry (b_k's is zero in exact arithmetic: rounding noise on either side)
    scale = max(np.max(np.abs(v)) for v in a["grads"].values())
    for k in a["grads"]:
        ga, gb = np.array(a["grads"][k]), np.array(b["grads"][k])
        assert np.max(np.abs(ga - gb)) <= 1e-12 * scale, k


def test_unknown_cpu_level_is_a_value_error():
    r = run("x86-64-v9")
    assert r.returncode != 0
    assert "ValueError" in r.stderr and "FT_CPU_LEVEL" in r.stderr and "x86-64-v9" in r.stderr, r.stderr
