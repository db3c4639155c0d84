"""Data-parallel training over torch.distributed (docs/data_parallel.md): what the trainers add in Python.

The native loop (cpp/src/training.cpp, `Replicas`) shards each minibatch and calls `_Replicas.sum` between
the backward pass and the update: one all-reduce of the flat gradient, on a zero-copy torch view of the
model's buffer, and one of the step's loss. This module finds the process group (the script's, or one it
initialises from torchrun's environment), checks that every rank starts from the same state, fingerprints
θ every few steps, and turns a failed collective (a rank that died or hung past the timeout) into one clear
RuntimeError. torch is imported only when there is a group to find: a single process never imports it.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import sys
import time
from datetime import timedelta
from typing import Any, Optional

import numpy as np

from . import _core

# rank r's dropout masks are keyed by dropout_seed + r·φ (φ = 2⁶⁴/golden ratio, odd): rank 0 keeps the model's
# seed, so one rank draws the masks of one process; the others draw their own (docs/data_parallel.md)
RANK_SEED_STRIDE = 0x9E3779B97F4A7C15


def rank_dropout_seed(seed: int, rank: int) -> int:
    """The dropout seed rank `rank` trains with, for a model whose dropout_seed is `seed`."""
    return (int(seed) + int(rank) * RANK_SEED_STRIDE) % 2**64


def _torch_distributed(required: bool):
    try:
        import torch.distributed as dist
    except ImportError as e:
        if required:
            raise ImportError("data-parallel training needs torch (pip install torch): "
                              f"launched with WORLD_SIZE={os.environ.get('WORLD_SIZE')}") from e
        return None
    if not dist.is_available():
        if required:
            raise RuntimeError("data-parallel training needs torch.distributed, which this torch build lacks")
        return None
    return dist


def _env_int(name: str, lo: int, hi: Optional[int] = None, what: str = "") -> int:
    """The integer environment variable `name`, in [lo, hi) (hi None: no upper bound); ValueError naming the
    variable and its value otherwise."""
    raw = os.environ[name]
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer{what}, got {raw!r}") from None
    if v < lo or (hi is not None and v >= hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi})"
        raise ValueError(f"{name} must be {bound}{what}, got {raw!r}")
    return v


def env_world_size() -> int:
    """WORLD_SIZE from the launcher's environment (torchrun sets it; 1 when absent); ValueError unless >= 1
    (WORLD_SIZE=0 or -3 trained alone, silently)."""
    if "WORLD_SIZE" not in os.environ:
        return 1
    return _env_int("WORLD_SIZE", 1, None, " (the number of ranks torchrun launched)")


def check_launch_env() -> tuple[int, int, str, int]:
    """torchrun's environment, checked before any connection is tried: (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT). RuntimeError when one is missing, ValueError naming the variable and its value when it is
    out of range (RANK >= WORLD_SIZE gave torch's own store error after seconds)."""
    world = env_world_size()
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {', '.join(missing)} not set: launch "
                           "with torchrun, or call torch.distributed.init_process_group yourself")
    rank = _env_int("RANK", 0, world, f" (this process's rank among WORLD_SIZE={world})")
    if "LOCAL_WORLD_SIZE" in os.environ:
        local_world = _env_int("LOCAL_WORLD_SIZE", 1, world + 1, f" (ranks on this machine, at most WORLD_SIZE={world})")
        if "LOCAL_RANK" in os.environ:
            _env_int("LOCAL_RANK", 0, local_world, f" (this process's rank on its machine, LOCAL_WORLD_SIZE={local_world})")
    elif "LOCAL_RANK" in os.environ:
        _env_int("LOCAL_RANK", 0, world, f" (this process's rank on its machine, WORLD_SIZE={world})")
    addr = os.environ["MASTER_ADDR"]
    if not addr.strip():
        raise ValueError(f"MASTER_ADDR must name rank 0's host, got {addr!r}")
    port = _env_int("MASTER_PORT", 1, 65536, " (the rendezvous port, 1 … 65535)")
    return rank, world, addr, port


_joins = 0  # the process groups this module initialised: the join keys of each are its own


def _join(dist, timeout: float):
    """Rendezvous from torchrun's environment, every rank checked in by name: rank 0 (or torchrun's agent) hosts
    the store, each rank writes its key and waits for the others' within `timeout` seconds; a rank missing at the
    deadline is named (torch's own store error named none, after seconds, with C++ frames). Returns (store,
    rank, world) for init_process_group."""
    global _joins
    rank, world, addr, port = check_launch_env()
    _joins += 1
    td = timedelta(seconds=timeout)
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent hosts it (as torch's env://)
    try:
        store = dist.TCPStore(addr, port, world, is_master=rank == 0 and not agent, timeout=td,
                              wait_for_workers=False, multi_tenant=True)
    except Exception as e:  # no store to connect to within the timeout: its host did not join
        host = "torchrun's agent" if agent else "rank 0"
        raise RuntimeError(f"data parallel, rank {rank} of {world}: {host} did not join within {timeout:g} s "
                           f"(no rendezvous at MASTER_ADDR:MASTER_PORT = {addr}:{port}; {type(e).__name__}: "
                           f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''})") from None
    key = f"formal_transformers/join/{_joins}/"
    store.set(key + str(rank), "1")
    deadline = time.monotonic() + timeout
    missing = [r for r in range(world) if r != rank]
    while time.monotonic() < deadline:
        try:
            missing = [r for r in missing if not store.check([key + str(r)])]
        except Exception:  # the store's host reached its deadline first and left: the same ranks are missing
            break
        if not missing:
            return store, rank, world
        time.sleep(0.02)
    who = ", ".join(map(str, missing))
    raise RuntimeError(f"data parallel, rank {rank} of {world}: rank{'s' if len(missing) > 1 else ''} {who} did not "
                       f"join within {timeout:g} s (dist_timeout; rendezvous at {addr}:{port}): start every rank with "
                       "the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT")


def _destroy_if_initialized(dist) -> None:
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # at exit: nothing left to report to
        pass


def find_group(process_group: Any, timeout: float):
    """(torch.distributed, group) for process_group: None — the default group, initialised here (gloo,
    `timeout` seconds) from torchrun's environment when the script did not and WORLD_SIZE > 1; False — none;
    else a torch ProcessGroup. (None, None): train alone."""
    if process_group is False:
        return None, None
    if process_group is None:
        if "torch" not in sys.modules and env_world_size() == 1:
            return None, None  # not launched for data parallelism, and no torch around: never import it
        dist = _torch_distributed(required=env_world_size() > 1)
        if dist is None:
            return None, None
        if not dist.is_initialized():
            if env_world_size() == 1:
                return None, None
            store, rank, world = _join(dist, timeout)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
            # the group this module made is also ended by it, before the interpreter's teardown (a gloo group
            # left to the teardown can abort the process at exit: "terminate called without an active exception")
            atexit.register(_destroy_if_initialized, dist)
        return dist, dist.group.WORLD
    dist = _torch_distributed(required=True)
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError("process_group must be a torch.distributed ProcessGroup, None (the default group) or False "
                        f"(train alone), got {type(process_group).__name__}")
    return dist, process_group


def fingerprint(a: np.ndarray) -> tuple[int, int]:
    """Two 63-bit checks of an array's bits (the wrapping sum and the xor of its words): cheap (one pass
    each at memory speed), and any change of one value changes both."""
    a = np.ascontiguousarray(a)
    w = a.view(np.uint64 if a.itemsize == 8 else np.uint32)
    s = int(w.sum(dtype=np.uint64)) if w.size else 0
    x = int(np.bitwise_xor.reduce(w)) if w.size else 0
    return s & (2**63 - 1), x & (2**63 - 1)


def data_digest(*datasets) -> int:
    """A 63-bit digest of token data (2-D arrays or lists of sequences; None allowed), to check that every
    rank was given the same data."""
    h = hashlib.blake2b(digest_size=8)
    for d in datasets:
        if d is None:
            h.update(b"none")
            continue
        if isinstance(d, np.ndarray) and d.ndim == 2:
            h.update(repr(d.shape).encode())
            h.update(np.ascontiguousarray(d, dtype=np.int64).tobytes())
            continue
        h.update(b"seqs%d" % len(d))
        for x in d:
            a = np.asarray(x, dtype=np.int64).reshape(-1)
            h.update(b"%d;" % a.size)
            h.update(a.tobytes())
    return int.from_bytes(h.digest(), "little") & (2**63 - 1)


class ReplicaFailure(RuntimeError):
    """A collective with the other ranks failed: one died, hung past the timeout, or left training. Every
    surviving rank holds θ after the last completed step (the failed step was not applied)."""


class Replicas:
    """One rank's view of the data-parallel run: what the native loop calls (`rank`, `world`, `sum`) and the
    checks the trainer runs (trainer.data_parallel after a call). allreduce_seconds / allreduce_bytes /
    allreduce_calls: the time in `sum` (waiting for the slowest rank included), the gradient bytes reduced and
    the gradient all-reduces of the call."""

    def __init__(self, dist, group, timeout: float):
        import torch

        self.torch, self.dist, self.group, self.timeout = torch, dist, group, timeout
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.step = 0  # the last completed step, start_step-based (for messages)
        self.allreduce_seconds = 0.0
        self.allreduce_bytes = 0
        self.allreduce_calls = 0

    def _failed(self, what: str, e: BaseException) -> ReplicaFailure:
        return ReplicaFailure(
            f"data parallel, rank {self.rank} of {self.world}: {what} failed after step {self.step} "
            f"({type(e).__name__}: {str(e).strip()[:300]}). Another rank died, hung longer than the timeout "
            f"({self.timeout:g} s for a group the trainer initialised), or stopped training alone. The model holds "
            f"θ after step {self.step}; resume from the last checkpoint.")

    def sum(self, grad: Optional[np.ndarray], figures: np.ndarray) -> None:
        """Called by the native loop between the backward pass and the update: Σ over the ranks, in place, of
        the flat gradient (one all-reduce on a zero-copy torch view) and of the step's figures."""
        t0 = time.perf_counter()
        f = self.torch.from_numpy(figures)
        try:
            if grad is None:
                self.dist.all_reduce(f, group=self.group)
            else:
                work = self.dist.all_reduce(f, group=self.group, async_op=True)
                self.dist.all_reduce(self.torch.from_numpy(grad), group=self.group)
                work.wait()
                self.allreduce_bytes += grad.nbytes
                self.allreduce_calls += 1
        except Exception as e:  # a dead peer, a timeout: gloo's RuntimeError / DistBackendError
            raise self._failed("the all-reduce", e) from e
        self.allreduce_seconds += time.perf_counter() - t0

    def gather(self, values, what: str) -> np.ndarray:
        """(world, k) int64: every rank's `values`."""
        t = self.torch.tensor([int(v) for v in values], dtype=self.torch.int64)
        out = [self.torch.zeros_like(t) for _ in range(self.world)]
        try:
            self.dist.all_gather(out, t, group=self.group)
        except Exception as e:
            raise self._failed(what, e) from e
        return self.torch.stack(out).numpy()

    def agree(self, ok: bool) -> bool:
        """True when every rank says True (the callbacks' vote: one rank stopping stops all)."""
        return bool(self.gather([int(bool(ok))], "the callbacks' vote").min())

    def check_start(self, named: dict) -> None:
        """Every rank must start from the same state: named int64 figures compared across the ranks."""
        names = list(named)
        rows = self.gather([named[k] for k in names], "the start check")
        for j, k in enumerate(names):
            bad = [r for r in range(self.world) if rows[r, j] != rows[0, j]]
            if bad:
                hint = {
                    "theta": "every rank must build or load the same model (the same seed, the same file)",
                    "data": "give every rank the whole data set: the trainer shards each minibatch itself",
                    "val_data": "give every rank the same validation data",
                    "options": "every rank's trainer must have the same options, and a callback on every rank or on none",
                    "optimizer": "every rank must start from the same optimizer state",
                    "dropout": "every rank's model must have the same dropout_step and dropout_seed",
                }[k.split(".")[0]]
                raise RuntimeError(f"data parallel: rank {bad[0]} does not start from rank 0's state: its {k} differs "
                                   f"({hint})")

    def check_theta(self, theta: np.ndarray) -> None:
        """θ must be the same on every rank: its fingerprints compared (after self.step)."""
        rows = self.gather(fingerprint(theta), "the θ check")
        bad = [r for r in range(self.world) if (rows[r] != rows[0]).any()]
        if bad:
            raise RuntimeError(f"data parallel: θ diverged across the ranks after step {self.step}: rank(s) {bad} "
                               "differ from rank 0 (a nondeterministic step, or a model changed on one rank only)")


def start_figures(model, optimizer, listing: str, options: dict, data, val_data, callback: bool) -> dict:
    """The figures check_start compares (the same names on every rank): θ, the data, the options (and
    whether a callback votes), the optimizer's state, dropout's key."""
    th = fingerprint(_core._flat_params(model))
    fig = {"theta.sum": th[0], "theta.xor": th[1], "data": data_digest(*data),
           "val_data": data_digest(*val_data),
           "options": int.from_bytes(hashlib.blake2b(repr((listing, sorted(options.items()))).encode(),
                                                     digest_size=8).digest(), "little") & (2**63 - 1),
           "options.callback": int(bool(callback)),
           "optimizer.t": 0, "optimizer.m": 0, "optimizer.v": 0}
    if isinstance(optimizer, _core.Adam):
        sd = optimizer.state_dict()
        fig["optimizer.t"] = int(sd["t"])
        if sd["t"]:
            fig["optimizer.m"] = fingerprint(sd["m"])[0]
            fig["optimizer.v"] = fingerprint(sd["v"])[0]
    fig["dropout.step"] = int(model.dropout_step) & (2**63 - 1)
    fig["dropout.seed"] = int(model.dropout_seed) & (2**63 - 1)
    return fig
