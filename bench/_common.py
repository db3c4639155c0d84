"""What the benchmark scripts share: importing the package, naming the CPU, and the worker process each
side of a comparison runs in (a persistent subprocess that answers one JSON line, prefixed "@@", per
command on its stdin)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def import_ft():
    """formal_transformers, installed or (in a checkout without an install) from python/ beside bench/."""
    try:
        import formal_transformers as ft
    except ImportError:
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import formal_transformers as ft
    return ft


def cpu_model() -> str:
    """/proc/cpuinfo's "model name" with vendor, family, model and stepping (else platform's guess)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                k, _, v = line.partition(":")
                info[k.strip()] = v.strip()
    except OSError:
        pass
    if "model name" not in info:
        import platform
        return platform.processor() or platform.machine()
    return (f"{info['model name']} (vendor {info.get('vendor_id', '?')}, family {info.get('cpu family', '?')}, "
            f"model {info.get('model', '?')}, stepping {info.get('stepping', '?')})")


class WorkerProcess:
    """`cmd` in a subprocess with the environment changed by `env_changes` (a value None removes the
    variable). `ask(line)` sends a command and returns the worker's JSON reply; `read()` the next reply."""

    def __init__(self, label, cmd, env_changes):
        env = dict(os.environ)
        for k, v in env_changes.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        self.label = label
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def read(self):
        line = self.proc.stdout.readline()
        if not line.startswith("@@"):
            raise RuntimeError(f"worker '{self.label}' stopped (exit code {self.proc.wait()}); see its stderr above")
        return json.loads(line[2:])

    def ask(self, line):
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        return self.read()

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        self.proc.wait()


def serve_steps(step, proto, after=None):
    """The worker's side of WorkerProcess: for each command "run N" on stdin, N calls of step() timed one by
    one, answered on `proto` as "@@" + JSON (the list of times in seconds, or after(times) when given, e.g.
    with the peak memory); "quit" or end of input ends it."""
    import sys
    import time

    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        times = []
        for _ in range(int(cmd[1])):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        proto.write("@@" + json.dumps(times if after is None else after(times)) + "\n")
