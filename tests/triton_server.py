"""A real Triton Inference Server for tests: the ``tritonserver`` that PyPI ``nvidia-pytriton`` bundles,
serving two Python-backend models on CPU from a model repository written here.

- ``tiny``: doubles an FP32 vector (one instance, no batching, so concurrent requests queue and
  ``nv_inference_pending_request_count`` rises); a negative input raises in ``execute``, which Triton
  counts as ``nv_inference_request_failure{reason="BACKEND"}``; a first element ≥ 100 sleeps that
  many milliseconds (a slow request others wait behind).
- ``stream``: a decoupled model sending ``n`` responses to one request (token-like streaming, read
  through the HTTP ``generate_stream`` endpoint), the kind of model Triton's first-response histogram
  is for (newer Triton releases only: the 2.51 this wheel bundles has none).

Why the server is started directly and not through pytriton's ``Triton`` class: pytriton's Python
layer pins ``numpy<2``, which has no wheel for Python 3.13 (a long source build), while the bundled
server needs only the wheel's files and numpy. Why Python 3.13: the backend's stubs are linked
against the wheel's libpython 3.13, so the interpreter on ``PATH`` (whose stdlib and site-packages
the stub loads) must be a 3.13 virtualenv (``.ci/run`` makes ``.venv-triton``). Why DLPack in the
models: the stub was built against numpy 1's C ABI, so with numpy 2 ``as_numpy()`` and
``Tensor(name, ndarray)`` read the wrong item size; ``from_dlpack`` carries dtype and shape itself
(the stub then prints a harmless ``PyCapsule_GetPointer`` traceback per tensor in its log).

``python tests/triton_server.py`` serves until Ctrl-C (the ports are printed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from netutil import free_port
from procs import terminate

VENV = Path(__file__).resolve().parent.parent / ".venv-triton"  # made by .ci/run
START_TIMEOUT = 120.0  # seconds; the server is ready 5-10 s after start on a loaded 2-core box
INSTALL_HINT = (
    "python3.13 -m venv .venv-triton && "
    ".venv-triton/bin/pip install --no-deps nvidia-pytriton==0.7.0 'numpy>=2.1,<3'"
)

TINY_CONFIG = """\
backend: "python"
max_batch_size: 0
input [ { name: "x", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
TINY_MODEL = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = np.from_dlpack(pb_utils.get_input_tensor_by_name(r, "x"))
            if (x < 0).any():
                raise pb_utils.TritonModelException("negative input")
            if x.size and x[0] >= 100:
                time.sleep(float(x[0]) / 1000)
            y = np.ascontiguousarray(x * 2, dtype=np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("y", y.__dlpack__())]))
        return out
"""
STREAM_CONFIG = """\
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "n", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "token", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
STREAM_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            n = int(np.from_dlpack(pb_utils.get_input_tensor_by_name(r, "n"))[0])
            for i in range(n):
                token = pb_utils.Tensor.from_dlpack("token", np.array([i], dtype=np.int32).__dlpack__())
                sender.send(pb_utils.InferenceResponse([token]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
MODELS = {"tiny": (TINY_CONFIG, TINY_MODEL), "stream": (STREAM_CONFIG, STREAM_MODEL)}


def distribution(venv: Path = VENV) -> Path | None:
    """The wheel's ``pytriton/tritonserver`` folder in ``venv`` (a Python 3.13 virtualenv), or None."""
    dist = venv / "lib" / "python3.13" / "site-packages" / "pytriton" / "tritonserver"
    return dist if (dist / "bin" / "tritonserver").is_file() else None


def _write_repository(root: Path) -> Path:
    repo = root / "models"
    for name, (config, model) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(model)
    return repo


def _write_backends(root: Path, dist: Path) -> Path:
    """A backend folder whose ``python`` backend uses the wheel's Python 3.13 stub."""
    python = root / "backends" / "python"
    python.mkdir(parents=True)
    for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
        (python / f).symlink_to(dist / "backends" / "python" / f)
    (python / "triton_python_backend_stub").symlink_to(
        dist / "python_backend_stubs" / "3.13" / "triton_python_backend_stub"
    )
    return root / "backends"


class TritonServer:
    """``tritonserver`` on 127.0.0.1 (HTTP and metrics ports; no gRPC) in a subprocess."""

    def __init__(self, dist: Path, venv: Path = VENV) -> None:
        self.dist = dist
        self.venv = venv
        self.http_port = free_port()
        self.metrics_port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="triton-")
        root = Path(self._dir.name)
        self.repository = _write_repository(root)
        self.backends = _write_backends(root, dist)
        self.log = root / "tritonserver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:HTTP_PORT``."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        """``http://127.0.0.1:METRICS_PORT/metrics``."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> None:
        """Start the server and wait until ``/v2/health/ready`` (every model loaded)."""
        env = dict(os.environ)
        env["PATH"] = f"{self.venv / 'bin'}:{env.get('PATH', '')}"  # the stub's interpreter
        libs = self.dist.parent.parent / "nvidia_pytriton.libs"
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (env.get("LD_LIBRARY_PATH"), str(libs)) if p)
        args = [
            str(self.dist / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.backends}",
            f"--cache-directory={self.backends.parent / 'caches'}",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--allow-grpc=false",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",  # no GPU here: DCGM would only log that it failed
            "--metrics-config=summary_latencies=true",  # summaries too: more of the format parsed
            "--metrics-config=histogram_latencies=true",  # the first-response histogram (newer releases)
        ]
        log = self.log.open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/v2/health/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"tritonserver was not ready in {START_TIMEOUT} s: {self.tail()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s (Triton waits for in-flight requests first)."""
        if self.proc is not None:
            terminate(self.proc, timeout=30.0)
            self.proc = None

    def close(self) -> None:
        """Stop the server and remove its model repository."""
        self.stop()
        self._dir.cleanup()

    def tail(self, chars: int = 2000) -> str:
        """The end of the server's log (for failure messages)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-chars:]

    def _post(self, path: str, body: dict[str, Any]) -> tuple[int, str]:
        req = urllib.request.Request(
            self.base_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def infer(self, x: list[float]) -> list[float] | None:
        """One KServe-v2 ``infer`` request to ``tiny``: its ``y``, or None when Triton answered an error."""
        body = {"inputs": [{"name": "x", "shape": [len(x)], "datatype": "FP32", "data": x}]}
        status, text = self._post("/v2/models/tiny/infer", body)
        if status != 200:
            return None
        (out,) = json.loads(text)["outputs"]
        return [float(v) for v in out["data"]]

    def stream(self, n: int) -> list[int]:
        """One ``generate_stream`` request to the decoupled ``stream`` model: the tokens it sent."""
        status, text = self._post("/v2/models/stream/generate_stream", {"n": n})
        assert status == 200, text
        events = [
            json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")
        ]
        return [int(e["token"]) for e in events]

    def metrics(self) -> str:
        """The server's ``/metrics`` page."""
        with urllib.request.urlopen(self.metrics_url, timeout=30) as resp:
            return str(resp.read().decode())


if __name__ == "__main__":
    found = distribution()
    if found is None:
        print(f"no tritonserver in {VENV}; make it with: {INSTALL_HINT}", file=sys.stderr)
        raise SystemExit(2)
    server = TritonServer(found)
    server.start()
    print(f"HTTP {server.base_url}  metrics {server.metrics_url}  (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
