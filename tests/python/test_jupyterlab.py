"""`./run.sh notebooks` opens JupyterLab on notebooks/ (README): here, headless and on 127.0.0.1 only, the
same server (`python -m jupyter lab`, this interpreter) starts, serves the JupyterLab page, lists the
notebooks through its REST API (/api/contents), executes one notebook cell by cell through a kernel it
started (/api/sessions, then the kernel's websocket channels, as the browser does), and shuts down on
/api/shutdown. Every step has a deadline; Jupyter's config, data and runtime folders are temporary."""
from __future__ import annotations

import asyncio
import datetime
import json
import os
import pathlib
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest

pytest.importorskip("jupyterlab", reason="JupyterLab is not installed (pip install '.[lab]'; ./run.sh notebooks)")
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install '.[notebooks]')")
from tornado.httpclient import HTTPRequest  # noqa: E402  (installed with jupyter_server)
from tornado.websocket import websocket_connect  # noqa: E402

import formal_transformers as ft  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"
NOTEBOOK = "02_components.ipynb"  # every listing of Alg 1–7 against reference.py, a few seconds
START_TIMEOUT = 120.0
CELL_TIMEOUT = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp: pathlib.Path) -> dict:
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)
    env["FT_QUICK"] = "1"
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        d = tmp / var.lower()
        d.mkdir()
        env[var] = str(d)
    # the kernels inherit the server's environment: absolute paths reach a developer build (DEVELOPING.md)
    paths = [str(pathlib.Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    pkg_parent = pathlib.Path(ft.__file__).resolve().parent.parent
    if "site-packages" not in pkg_parent.parts and "dist-packages" not in pkg_parent.parts:
        paths.insert(0, str(pkg_parent))
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if env.get("FT_CORE_PATH"):
        env["FT_CORE_PATH"] = str(pathlib.Path(env["FT_CORE_PATH"]).resolve())
    return env


class Server:
    def __init__(self, tmp: pathlib.Path):
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "jupyterlab.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
             "--port-retries=0", f"--ServerApp.root_dir={NB_DIR}", f"--IdentityProvider.token={self.token}",
             "--ServerApp.open_browser=False", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
             "jupyterlab.NeverCheckForUpdate"] + (["--allow-root"] if os.geteuid() == 0 else []),
            cwd=NB_DIR, env=_env(tmp), stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def request(self, method: str, path: str, body=None, timeout: float = 30.0):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw and r.headers.get_content_type() == "application/json" else raw)

    def wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {self.proc.returncode}:\n{self.output()}")
            try:
                status, _ = self.request("GET", "/api/status", timeout=5)
                if status == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        pytest.fail(f"jupyter lab did not answer within {START_TIMEOUT:.0f} s:\n{self.output()}")

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.request("POST", "/api/shutdown", timeout=10)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


async def _run_cells(server: Server, kernel_id: str, cells: list[str]) -> list[str]:
    """Send each cell as an execute_request on the kernel's shell channel; return the stdout text. Fails on
    the first cell whose execute_reply is not ok (with the traceback from iopub)."""
    url = f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}"
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {server.token}"},
                                             connect_timeout=30))
    session = uuid.uuid4().hex
    out = []
    try:
        for i, code in enumerate(cells):
            msg_id = uuid.uuid4().hex
            await ws.write_message(json.dumps({
                "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": session, "username": "test",
                           "version": "5.3", "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
                "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                            "allow_stdin": False, "stop_on_error": True},
            }))
            errors = []
            while True:
                raw = await asyncio.wait_for(ws.read_message(), CELL_TIMEOUT)
                assert raw is not None, f"the kernel's websocket closed during cell {i}"
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["header"]["msg_type"]
                if kind == "stream" and msg["content"]["name"] == "stdout":
                    out.append(msg["content"]["text"])
                elif kind == "error":
                    errors.append("\n".join(msg["content"]["traceback"]))
                elif kind == "execute_reply" and msg["channel"] == "shell":
                    assert msg["content"]["status"] == "ok", f"cell {i} of {NOTEBOOK} failed:\n{code}\n{errors}"
                    break
    finally:
        ws.close()
    return out


def test_run_sh_notebooks_server(tmp_path):
    server = Server(tmp_path)
    try:
        server.wait_ready()
        # the JupyterLab page itself
        status, page = server.request("GET", "/lab")
        assert status == 200 and b"JupyterLab" in page
        # the notebooks, through the contents API
        status, listing = server.request("GET", "/api/contents/")
        names = sorted(e["name"] for e in listing["content"] if e["type"] == "notebook")
        assert names == sorted(p.name for p in NB_DIR.glob("*.ipynb")) and NOTEBOOK in names
        # the kernel the browser would get (the environment's python3), started for a notebook
        status, specs = server.request("GET", "/api/kernelspecs")
        assert specs["default"] in specs["kernelspecs"]
        status, sess = server.request("POST", "/api/sessions", {
            "path": NOTEBOOK, "name": NOTEBOOK, "type": "notebook", "kernel": {"name": specs["default"]}})
        assert status == 201, sess
        status, model = server.request("GET", f"/api/contents/{NOTEBOOK}")
        nb = nbformat.from_dict(model["content"])
        cells = [c.source for c in nb.cells if c.cell_type == "code"]
        assert cells
        stdout = "".join(asyncio.run(_run_cells(server, sess["kernel"]["id"], cells)))
        assert "quick mode: True" in stdout  # the first cell (ft_notebook) ran in this kernel
        assert stdout.count("✓") >= 10  # the notebook's agreement checks ran and passed
        server.request("DELETE", f"/api/sessions/{sess['id']}")
    finally:
        server.stop()
    assert server.proc.returncode is not None
