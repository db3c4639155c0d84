"""The road past one machine (docs/interop.md): ft.to_torch(model) trained with PyTorch's
DistributedDataParallel — gloo, 2 processes on 127.0.0.1 — reaches after one SGD step the parameters of
ft's own step on the union batch, for all three architectures (float64, ≤1e-12)."""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import formal_transformers as ft  # noqa: E402

import _ddp_worker as W  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_one_step_equals_ft_step_on_the_union_batch(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.fail("this torch has no gloo backend")
    env = dict(os.environ)
    # the children import the package under test (docs/DEVELOPING.md): the folder above it, and an absolute core
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(ft.__file__)))
    if env.get("FT_CORE_PATH"):
        env["FT_CORE_PATH"] = os.path.abspath(env["FT_CORE_PATH"])
    env["OMP_NUM_THREADS"] = "1"
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "_ddp_worker.py"), str(r), "2", port, str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-3000:]
    for arch in ("D", "E", "ED"):
        model, args = W.case(arch)
        if arch == "E":
            _, grads = model.loss_and_grad(args[0], args[1], segments=args[2])
        else:
            _, grads = model.loss_and_grad(*args)
        before = {k: np.array(v) for k, v in model.params.items()}
        ft.SGD(W.LR).step(model, grads)
        r0, r1 = (np.load(tmp_path / f"{arch}_{r}.npz") for r in range(2))
        moved = 0
        for k, v in model.params.items():
            np.testing.assert_array_equal(r0[k], r1[k], err_msg=f"{arch} {k}: the ranks differ")
            # (b_k stays at rounding noise around 0: softmax ignores it, hence the absolute floor)
            assert np.abs(r0[k] - v).max() <= 1e-12 * max(1.0, np.abs(v).max()), (arch, k)
            moved += not np.array_equal(before[k], v)
        assert moved >= len(model.params) - 2  # the step changed (nearly) every parameter (not b_k-like zeros)
