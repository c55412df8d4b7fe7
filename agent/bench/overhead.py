"""``infercost bench overhead``: what the daemon costs the node it watches.

Runs, as separate processes, a simulated 8-GPU node (four vLLM engine endpoints serving
realistic ~100 KB pages) and the real daemon (``infercost run``) against it, at 1 s NVML sampling
and 5 s scrapes, with a Prometheus-like scrape of the daemon every 15 s. After a warm-up it
measures, for ``seconds`` of wall time, the daemon's CPU time (user + system, from /proc) and
its peak RSS (VmHWM). In the same run it times one of those pages with the agent's parser and
with prometheus_client's, and prints the ratio.

Targets (issue #2): ≤ 0.6 CPU-seconds per minute of wall time, ≤ 120 MB peak RSS, ≥ 10× parse.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from agent.bench.parse import compare

WARMUP_SECONDS = 8.0  # imports, first NVML open, first scrapes: not the steady state we measure
TARGET_CPU_S_PER_MIN = 0.6  # 1 % of one core
TARGET_RSS_MB = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


async def _serve_sim(out: Path) -> None:
    """Run the simulated node until SIGTERM; write the engines' config to ``out``."""
    from agent.clock import SystemClock
    from agent.sim.node import SimNode

    sim = SimNode(SystemClock(), out.parent / "podinfo", target_page_bytes=100_000)
    await sim.start()
    engines = [e.model_dump(mode="json", exclude_none=True) for e in sim.engine_configs()]
    out.write_text(json.dumps(engines))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await sim.stop()


def _wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def run(seconds: float = 60.0, print_fn: Callable[[str], Any] = print) -> dict[str, float]:
    """Run the benchmark; print and return the figures."""
    with tempfile.TemporaryDirectory(prefix="infercost-bench-") as tmp:
        d = Path(tmp)
        engines_file = d / "engines.json"
        sim = subprocess.Popen(
            [sys.executable, "-m", "agent.bench.overhead", "--serve-sim", str(engines_file)]
        )
        daemon: subprocess.Popen[bytes] | None = None
        try:
            _wait_for(engines_file.exists, 30, "the simulated node")
            engines = json.loads(engines_file.read_text())
            port = _free_port()
            cfg = {
                "node": "bench-node",
                "state_dir": str(d / "state"),
                "intervals": {"nvml_seconds": 1, "scrape_seconds": 5, "window_seconds": 60},
                "nvml": {"backend": "fake", "fake_profile": "H100-SXM", "fake_count": 8},
                "engines": engines,
                "exporters": {"prometheus": {"host": "127.0.0.1", "port": port}},
            }
            (d / "node.yaml").write_text(yaml.safe_dump(cfg))
            log = (d / "daemon.log").open("wb")
            daemon = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agent.cli",
                    "--log-level",
                    "warning",
                    "run",
                    "--config",
                    str(d / "node.yaml"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            metrics_url = f"http://127.0.0.1:{port}/metrics"

            def _up() -> bool:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                        return bool(r.status == 200)
                except OSError:
                    return False

            _wait_for(_up, 60, "the daemon's /healthz")
            time.sleep(WARMUP_SECONDS)
            cpu0, t0 = _cpu_seconds(daemon.pid), time.monotonic()
            next_scrape = t0
            scrapes = 0
            with Progress(
                TextColumn("measuring the daemon"),
                BarColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            ) as bar:
                task = bar.add_task("measure", total=seconds)
                while time.monotonic() - t0 < seconds:
                    if time.monotonic() >= next_scrape:
                        with urllib.request.urlopen(metrics_url, timeout=5) as r:
                            r.read()
                        scrapes += 1
                        next_scrape += 15.0
                    bar.update(task, completed=time.monotonic() - t0)
                    time.sleep(0.25)
            wall = time.monotonic() - t0
            cpu = _cpu_seconds(daemon.pid) - cpu0
            rss = _peak_rss_mb(daemon.pid)
            workers = _children(daemon.pid)  # the isolation-forest worker
            worker_rss = sum(_peak_rss_mb(p) for p in workers)
            worker_cpu = sum(_cpu_seconds(p) for p in workers)  # since it started (imports included)
            assert daemon.poll() is None, (d / "daemon.log").read_text()
            with urllib.request.urlopen(engines[0]["url"], timeout=5) as r:
                page = r.read().decode()
        finally:
            for p in (daemon, sim):
                if p is not None and p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        p.kill()
    cpu_per_min = cpu / wall * 60
    print_fn(
        f"daemon vs simulated 8-GPU node, {len(engines)} engines, NVML 1 s, scrape 5 s, "
        f"{wall:.0f} s wall ({scrapes} scrapes of the daemon)"
    )
    print_fn(
        f"  CPU: {cpu:.2f} CPU-s in {wall:.0f} s = {cpu_per_min:.3f} CPU-s per minute "
        f"({cpu_per_min / 60 * 100:.2f} % of one core; target <= {TARGET_CPU_S_PER_MIN})"
    )
    print_fn(f"  peak RSS: {rss:.1f} MB (target <= {TARGET_RSS_MB:.0f})")
    print_fn(
        f"  isolation-forest worker process: {len(workers)} running, peak RSS {worker_rss:.1f} MB, "
        f"{worker_cpu:.2f} CPU-s since it started "
        "(scikit-learn lives there, outside the daemon; with under 2 days of history it only waits)"
    )
    print_fn(
        f"  whole agent (every process it runs): peak RSS {rss + worker_rss:.1f} MB "
        f"(daemon + {len(workers)} worker(s); the sum of peaks, an upper bound)"
    )
    parse = compare(page, "one simulated engine page", print_fn)
    return {
        "cpu_s_per_min": cpu_per_min,
        "peak_rss_mb": rss,
        "agent_peak_rss_mb": rss + worker_rss,
        "wall_s": wall,
        **{f"parse_{k}": v for k, v in parse.items()},
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-sim":
        asyncio.run(_serve_sim(Path(sys.argv[2])))
    else:
        run(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)
