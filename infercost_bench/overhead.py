"""``infercost bench overhead``: what the daemon costs the node it watches.

Runs, as separate processes, a simulated 8-GPU node (four vLLM engine endpoints serving
realistic ~100 KB pages) and the real daemon (``infercost run``) against it, at 1 s NVML sampling
and 5 s scrapes, with a Prometheus-like scrape of the daemon every 15 s. After a warm-up it
measures, for ``seconds`` of wall time, the daemon's CPU time (user + system, from /proc) and
its peak RSS (VmHWM). In the same run it times one of those pages with the agent's parser and
with prometheus_client's, and prints the ratio.

The NVML sampler's share of the daemon's CPU is timed inside the daemon: the daemon runs under
``python -m infercost_bench.overhead --daemon FILE <infercost args>``, which wraps each step of the
NVML path — the round's reads (:meth:`NvmlBackend.read_round`, in its worker thread), adding it to
the cost window (:meth:`WindowJoiner.add_round`), the exported gauges (:meth:`Ledger.observe_nvml`)
and writing the buffered rounds to history (:meth:`Store.write_nvml_rounds`) — in
``time.thread_time()`` (CPU of the thread it runs in), and on SIGUSR1 writes those CPU seconds and
the process' CPU (``time.process_time()``, every thread) to ``FILE``. The bench signals it at the
start and the end of the measured span; the share is the ratio of the two differences. Not
counted: asyncio's hand-off to the worker thread (``to_thread``), a few microseconds a round. The
fake backend's reads include simulating the GPUs, which real NVML calls would not.

Targets: ≤ 0.6 CPU-seconds per minute of wall time, ≤ 120 MB peak RSS, a parse ≥ 10× faster than
prometheus_client's; NVML work at a 1 s interval ≤ 20 % of the daemon's CPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from infercost_bench.procs import children, cpu_seconds, free_port, status_mb

WARMUP_SECONDS = 8.0  # imports, first NVML open, first scrapes: not the steady state we measure
TARGET_CPU_S_PER_MIN = 0.6  # 1 % of one core
TARGET_RSS_MB = 120.0
TARGET_NVML_SHARE = 0.20  # NVML rounds at 1 s must not dominate the daemon's CPU
# the agent's own share of that (the fake library's simulation left out): a real node's NVML calls
# are C calls, so this is the part of the sampler a real node pays in Python
TARGET_OWN_NVML_SHARE = 0.15

# The NVML path, step by step: (module, class, method) timed inside the daemon.
NVML_STEPS = (
    ("agent.sources.nvml.backend", "NvmlBackend", "read_round"),
    ("agent.cost.window", "WindowJoiner", "add_round"),
    ("agent.snapshot", "Ledger", "observe_nvml"),
    ("agent.store", "Store", "write_nvml_rounds"),
)


class NvmlMeter:
    """CPU seconds the daemon spends in each step of :data:`NVML_STEPS` (``time.thread_time``
    around every call, in whatever thread runs it)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}  # "Class.method" → CPU seconds
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def wrap(self, owner: type, name: str) -> None:
        """Replace ``owner.name`` by a timed call of the original."""
        original = getattr(owner, name)
        key = f"{owner.__name__}.{name}"
        self.cpu[key], self.calls[key] = 0.0, 0

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.thread_time() - t0
                with self._lock:
                    self.cpu[key] += spent
                    self.calls[key] += 1

        timed.__doc__ = original.__doc__
        setattr(owner, name, timed)

    def install(self) -> None:
        """Time every step of :data:`NVML_STEPS`."""
        import importlib

        for module, cls, method in NVML_STEPS:
            self.wrap(getattr(importlib.import_module(module), cls), method)

    def reading(self) -> dict[str, Any]:
        """The counters now, with the process' CPU seconds (all threads) to compare them with."""
        with self._lock:
            return {"process_cpu_s": time.process_time(), "cpu": dict(self.cpu), "calls": dict(self.calls)}


class _Replay:
    """An NVML library that answers a round's calls with the answers the fake gave them, in order
    (errors raised again): what is left of a round read through it is the agent's own code (and
    one list step per call, so the figure is an upper bound). Constants and error classes are the
    fake's."""

    def __init__(self, fake: Any) -> None:
        self._fake = fake
        self.recording = True
        self._tape: list[tuple[bool, Any]] = []
        self._at = 0

    def rewind(self) -> None:
        """Replay the recorded round from its first call."""
        self.recording = False
        self._at = 0

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._fake, name)
        if not name.startswith("nvml") or not callable(value):
            object.__setattr__(self, name, value)  # looked up once: later lookups cost the agent's own
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.recording:
                try:
                    out = value(*args, **kwargs)
                except Exception as err:
                    self._tape.append((False, err))
                    raise
                self._tape.append((True, out))
                return out
            ok, out = self._tape[self._at]
            self._at += 1
            if not ok:
                raise out
            return out

        object.__setattr__(self, name, call)
        return call


def own_code_fraction(rounds: int = 300) -> tuple[float, float]:
    """(CPU ms per ``read_round`` of the fake 8 × H100 backend, the largest fraction of it that is
    the agent's own code), measured here, outside the daemon: ``rounds`` plain rounds, then as many
    read through :class:`_Replay`, which answers every NVML call with the fake's recorded answer at
    the cost of a list step. The fake simulates the GPUs in Python where a real node calls
    NVIDIA's library, so its time says nothing about the agent."""
    from agent.sources.nvml.backend import NvmlBackend
    from agent.sources.nvml.fake import FakeNvml

    t = time.time()
    plain_backend = NvmlBackend(FakeNvml("H100-SXM", 8))
    replay = _Replay(FakeNvml("H100-SXM", 8))
    replay_backend = NvmlBackend(replay)
    plain_backend.open()
    replay_backend.open()
    for i in range(20):  # first reads probe capabilities; not the steady state
        plain_backend.read_round(t + i)
        replay._tape.clear()
        replay_backend.read_round(t + i)  # the last of these is the round replayed
    plain: list[float] = []
    own: list[float] = []
    for i in range(rounds):  # interleaved, so a change in the machine's load falls on both alike
        t0 = time.thread_time()
        plain_backend.read_round(t + 20 + i)
        t1 = time.thread_time()
        replay.rewind()
        replay_backend.read_round(t + 20 + i)
        t2 = time.thread_time()
        plain.append(t1 - t0)
        own.append(t2 - t1)
    plain_backend.close()
    # not closed: its GPM samples are the recording's, freed with the fake
    return statistics.median(plain) * 1e3, min(1.0, statistics.median(own) / statistics.median(plain))


def _daemon_main(counters: Path, argv: list[str]) -> None:
    """``infercost <argv>`` with the NVML path timed; each SIGUSR1 writes a reading to ``counters``.
    The command line runs as ``python -m agent.cli`` would (benchmarks sit below the CLI)."""
    meter = NvmlMeter()
    meter.install()
    seq = 0

    def dump(_sig: int, _frame: Any) -> None:
        nonlocal seq
        seq += 1
        tmp = counters.with_suffix(".tmp")
        tmp.write_text(json.dumps({"seq": seq, **meter.reading()}))
        os.replace(tmp, counters)

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["infercost", *argv]
    runpy.run_module("agent.cli", run_name="__main__", alter_sys=True)


def _read_meter(pid: int, counters: Path, seq: int) -> dict[str, Any]:
    """Ask the metered daemon for reading number ``seq`` and wait for it."""
    os.kill(pid, signal.SIGUSR1)

    def ready() -> bool:
        try:
            return bool(json.loads(counters.read_text())["seq"] >= seq)
        except (OSError, ValueError, KeyError):
            return False

    _wait_for(ready, 10, "the daemon's NVML counters")
    data: dict[str, Any] = json.loads(counters.read_text())
    return data


async def _serve_sim(out: Path) -> None:
    """Run the simulated node until SIGTERM; write the engines' config to ``out``."""
    from agent.clock import SystemClock
    from infercost_sim.node import SimNode

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
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from infercost_bench.parse import compare

    with tempfile.TemporaryDirectory(prefix="infercost-bench-") as tmp:
        d = Path(tmp)
        engines_file = d / "engines.json"
        sim = subprocess.Popen(
            [sys.executable, "-m", "infercost_bench.overhead", "--serve-sim", str(engines_file)]
        )
        daemon: subprocess.Popen[bytes] | None = None
        try:
            _wait_for(engines_file.exists, 30, "the simulated node")
            engines = json.loads(engines_file.read_text())
            port = free_port()
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
                    "infercost_bench.overhead",
                    "--daemon",
                    str(d / "nvml-cpu.json"),
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
            meter0 = _read_meter(daemon.pid, d / "nvml-cpu.json", 1)
            cpu0, t0 = cpu_seconds(daemon.pid), time.monotonic()
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
            cpu = cpu_seconds(daemon.pid) - cpu0
            meter1 = _read_meter(daemon.pid, d / "nvml-cpu.json", 2)
            rss = status_mb(daemon.pid, "VmHWM") or float("nan")
            workers = children(daemon.pid)  # the isolation-forest worker
            worker_rss = sum(status_mb(p, "VmHWM") or 0.0 for p in workers)
            worker_cpu = sum(cpu_seconds(p) for p in workers)  # since it started (imports included)
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
    proc_cpu = meter1["process_cpu_s"] - meter0["process_cpu_s"]
    spent = {k: meter1["cpu"][k] - meter0["cpu"][k] for k in meter1["cpu"]}
    calls = {k: meter1["calls"][k] - meter0["calls"][k] for k in meter1["calls"]}
    steps = [f"{cls}.{method}" for _, cls, method in NVML_STEPS]
    nvml_cpu = sum(spent[k] for k in steps)
    round_ms, own_fraction = own_code_fraction()
    driver_cpu = spent["NvmlBackend.read_round"] * (1.0 - own_fraction)
    share = nvml_cpu / proc_cpu if proc_cpu > 0 else float("nan")
    own_share = (nvml_cpu - driver_cpu) / proc_cpu if proc_cpu > 0 else float("nan")
    print_fn(
        f"  NVML sampler (1 s rounds, timed in the daemon: time.thread_time around each step, "
        f"process_time for the daemon): {nvml_cpu:.3f} of {proc_cpu:.2f} CPU-s = {share * 100:.1f} % "
        f"of the daemon's CPU (target <= {TARGET_NVML_SHARE * 100:.0f} %)"
    )
    for k in steps:
        v = spent[k]
        print_fn(f"    {k}: {v:.3f} CPU-s in {calls[k]} calls ({v / max(calls[k], 1) * 1e3:.2f} ms each)")
    print_fn(
        f"    read_round's own code (the same rounds with every NVML call answered from a recording of "
        f"the fake's answers; the fake simulates 8 GPUs in Python where a real node calls NVIDIA's; "
        f"measured apart over 300 rounds of {round_ms:.2f} ms): at most {own_fraction * 100:.0f} %, so "
        f"{driver_cpu:.3f} CPU-s here were the fake's; the agent's own NVML code: at most "
        f"{own_share * 100:.1f} % of the daemon's CPU (target <= {TARGET_OWN_NVML_SHARE * 100:.0f} %)"
    )
    parse = compare(page, "one simulated engine page", print_fn)
    return {
        "cpu_s_per_min": cpu_per_min,
        "peak_rss_mb": rss,
        "agent_peak_rss_mb": rss + worker_rss,
        "wall_s": wall,
        "nvml_share": share,
        "nvml_own_share": own_share,
        **{f"parse_{k}": v for k, v in parse.items()},
    }


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--daemon":
        _daemon_main(Path(sys.argv[2]), sys.argv[3:])
    elif len(sys.argv) == 3 and sys.argv[1] == "--serve-sim":
        asyncio.run(_serve_sim(Path(sys.argv[2])))
    else:
        run(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)
