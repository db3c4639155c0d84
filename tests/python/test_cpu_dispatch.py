"""Run-time CPU dispatch of our kernels (docs/design.md "CPU dispatch in the portable build"): ft.blas_info() names
the level, FT_CPU_LEVEL=baseline (or x86-64-v3) gives the same results as the level chosen on this machine (float64
training steps through the tiled attention, softmax, GELU, layer norm and RMSnorm kernels, then Adam's kernel: AdamW and
L2-coupled steps), and an unknown FT_CPU_LEVEL is a ValueError. Each level is
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
x = np.random.default_rng(0).integers(0, 11, (2, 40))
out = dict(info=info)
for norm, decoupled in (("layer", True), ("rms", False)):
    model = ft.DTransformer(11, 40, 2, 2, 16, 32, dtype="float64", seed=3, attention_impl="tiled", norm=norm)
    loss, g = model.loss_and_grad(x)
    out[norm] = dict(loss=float(loss), grads={k: np.asarray(v).ravel().tolist() for k, v in g.items()})
    opt = ft.Adam(1e-2, weight_decay=0.1, decoupled=decoupled)
    for _ in range(2):  # Adam's kernel: θ, m, v after two steps
        opt.step(model, model.loss_and_grad(x)[1])
    st = opt.state_dict()
    out[norm]["after_adam"] = dict({k: np.asarray(v).ravel().tolist() for k, v in model.params.items()},
                                   m=np.asarray(st["m"]).tolist(), v=np.asarray(st["v"]).tolist())
print(json.dumps(out))
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
    for norm in ("layer", "rms"):
        ra, rb = a[norm], b[norm]
        assert abs(ra["loss"] - rb["loss"]) <= 1e-12 * abs(ra["loss"]), norm
        for what in ("grads", "after_adam"):
            assert ra[what].keys() == rb[what].keys() and ra[what], (norm, what)
            # relative to the largest entry of any gradient or parameter (b_k's gradient is zero in exact
            # arithmetic: rounding noise on either side); Adam's flat m, v to their own. b_k after Adam is left out:
            # Adam's step divides that noise by its own root mean square (amplified up to ~1e-8 here)
            top = max(np.max(np.abs(v)) for k, v in ra[what].items() if k not in ("m", "v"))
            for k in ra[what]:
                if what == "after_adam" and k.endswith(".b_k"):
                    continue
                va, vb = np.array(ra[what][k]), np.array(rb[what][k])
                assert va.shape == vb.shape and va.size, (norm, what, k)
                scale = np.max(np.abs(va)) if k in ("m", "v") else top
                assert scale > 0 and np.max(np.abs(va - vb)) <= 1e-12 * scale, (norm, what, k)


def test_unknown_cpu_level_is_a_value_error():
    r = run("x86-64-v9")
    assert r.returncode != 0
    assert "ValueError" in r.stderr and "FT_CPU_LEVEL" in r.stderr and "x86-64-v9" in r.stderr, r.stderr
