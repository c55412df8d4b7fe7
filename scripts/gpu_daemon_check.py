#!/usr/bin/env python3
"""The whole daemon on a real GPU: ``infercost run`` with the real NVML backend, a compute load on
the GPU, and an engine page whose token counters rise at a known rate; the $ per 1M output tokens the
daemon exports is checked against a figure computed here from the price book and NVML's own energy
counter (read directly with pynvml, not through infercost).

For a machine with an NVIDIA GPU and PyTorch (written for an H200; CI never runs it). Outputs in
``$OUT``: ``daemon.log``, ``metrics_first.txt``/``metrics_last.txt`` (two scrapes of the agent's
/metrics) and ``daemon_check.json`` (expected against measured). ``--fake`` runs the same check on
infercost's fake NVML (no GPU, no load) to test the script itself. Usage::

    OUT=/tmp/check python scripts/gpu_daemon_check.py [--seconds 70]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
GEN_PER_SECOND = 1000.0  # output tokens/s the engine page reports
PROMPT_PER_SECOND = 500.0  # prompt tokens/s
USD_PER_GPU_HOUR = 3.50  # the book below
USD_PER_KWH, PUE = 0.12, 1.3
ENGINE_PORT, AGENT_PORT = 18000, 19464
T0 = time.time()


class Page(BaseHTTPRequestHandler):
    """A vLLM-shaped /metrics page whose counters grow at a fixed rate with wall time."""

    def do_GET(self) -> None:
        t = time.time() - T0
        m = 'model_name="probe-model"'
        body = (
            "# HELP vllm:prompt_tokens_total Prompt tokens.\n# TYPE vllm:prompt_tokens_total counter\n"
            f"vllm:prompt_tokens_total{{{m}}} {PROMPT_PER_SECOND * t:.3f}\n"
            "# HELP vllm:generation_tokens_total Output tokens.\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            f"vllm:generation_tokens_total{{{m}}} {GEN_PER_SECOND * t:.3f}\n"
            "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{m}}} 8\n"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


def gemm(stop: threading.Event) -> None:
    import torch

    dev = torch.device("cuda", 0)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            torch.matmul(a, b)
        torch.cuda.synchronize(dev)


def scrape() -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{AGENT_PORT}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {"_text": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if (
                s.labels.get("model") == "probe-model"
                or s.labels.get("gpu") == "0"
                or not s.labels.keys() - {"node"}
            ):
                out[s.name] = s.value
    out["_raw"] = text  # type: ignore[assignment]
    return out


def energy_joules(fake: bool) -> float | None:
    if fake:
        return None
    import pynvml  # noqa: TID251 - read the real counter directly, not through infercost

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    return pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=70.0, help="seconds between the two scrapes")
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/infercost-gpu-check")
    work.mkdir(exist_ok=True)
    (work / "book.yaml").write_text(
        f'gpus:\n  - match: "H200"\n    usd_per_hour: {USD_PER_GPU_HOUR}\n    effective_from: "2025-01-01"\n'
        f"power:\n  usd_per_kwh: {USD_PER_KWH}\n  pue: {PUE}\n"
    )
    backend = "fake\n  fake_profile: H200\n  fake_count: 1" if args.fake else "real"
    (work / "node.yaml").write_text(
        f"node: gpu-check\nstate_dir: {work}/state\nintervals:\n  nvml_seconds: 1\n  scrape_seconds: 5\n"
        f"  window_seconds: 60\nnvml:\n  backend: {backend}\nprices:\n  book: {work}/book.yaml\n"
        f"exporters:\n  prometheus:\n    port: {AGENT_PORT}\nengines:\n  - name: probe\n    kind: vllm\n"
        f"    url: http://127.0.0.1:{ENGINE_PORT}/metrics\n    gpus: [0]\n    model_version: v1\n"
    )
    if not args.fake:
        import pynvml  # noqa: TID251 - read the real counter directly, not through infercost

        pynvml.nvmlInit()
    server = ThreadingHTTPServer(("127.0.0.1", ENGINE_PORT), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()
    if not args.fake:
        threading.Thread(target=gemm, args=(stop,), daemon=True).start()
    log = (out / "daemon.log").open("w")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    daemon = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "run", "--config", str(work / "node.yaml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    result: dict[str, Any] = {}
    try:
        deadline = time.time() + 60
        first: dict[str, float] = {}
        while time.time() < deadline:
            time.sleep(2)
            try:
                first = scrape()
            except OSError:
                continue
            if first.get("infercost_generation_tokens_total", 0) > 0:
                break
        e0, t0 = energy_joules(args.fake), time.time()
        time.sleep(args.seconds)
        last = scrape()
        e1, t1 = energy_joules(args.fake), time.time()
        (out / "metrics_first.txt").write_text(str(first.pop("_raw", "")))
        (out / "metrics_last.txt").write_text(str(last.pop("_raw", "")))
        d = {k: last.get(k, 0.0) - first.get(k, 0.0) for k in last if isinstance(last.get(k), float)}
        gen = d.get("infercost_generation_tokens_total", 0.0)
        cost = d.get("infercost_cost_usd_total", 0.0)
        energy_usd = d.get("infercost_energy_cost_usd_total", 0.0)
        watts = (e1 - e0) / (t1 - t0) if e0 is not None and e1 is not None else None
        # what 1M output tokens cost at GEN_PER_SECOND: GPU time plus energy at the mean power NVML saw
        seconds_per_1m = 1e6 / GEN_PER_SECOND
        expected = USD_PER_GPU_HOUR * seconds_per_1m / 3600.0
        if watts is not None:
            expected += watts * seconds_per_1m / 3.6e6 * USD_PER_KWH * PUE
        measured = cost / gen * 1e6 if gen > 0 else None
        result = {
            "window_seconds": t1 - t0,
            "generation_tokens": gen,
            "generation_tokens_expected": GEN_PER_SECOND * (t1 - t0),
            "cost_usd": cost,
            "energy_cost_usd": energy_usd,
            "mean_watts_from_nvml_counter": watts,
            "daemon_gpu_power_watts": last.get("infercost_gpu_power_watts"),
            "usd_per_1m_output_expected": expected,
            "usd_per_1m_output_measured": measured,
            "usd_per_1m_output_gauge": last.get("infercost_usd_per_1m_output_tokens"),
            "relative_error": (measured / expected - 1) if measured else None,
            "gpu_power_capped": last.get("infercost_gpu_power_capped"),
            "gpu_sm_clock_hertz": last.get("infercost_gpu_sm_clock_hertz"),
            "throttled_gpu_seconds": d.get("infercost_throttled_gpu_seconds_total"),
            "gpu_model_label": None,
        }
        for line in str((out / "metrics_last.txt").read_text()).splitlines():
            if line.startswith("infercost_gpu_info"):
                result["gpu_model_label"] = line
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
        stop.set()
        server.shutdown()
        result["daemon_exit"] = daemon.returncode
    (out / "daemon_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
