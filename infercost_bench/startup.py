"""``infercost bench startup``: restarting the daemon on a 35-day store.

Fills a state directory with ``days`` of 1-minute history for ``series`` model versions (the report
benchmark's generator; its last minute is then repeated up to now, see :func:`top_up`), starts the
real daemon on it (``infercost run``), and from the moment its port answers probes ``/metrics``
every 50 ms until the detection pipeline logs that it warmed up (the replay of up to a week of
history), then for ``steady`` more seconds. It prints the slowest
and the 99th-percentile ``/metrics`` answer during start-up, the daemon's peak RSS (VmHWM) and its
steady RSS (median VmRSS over the last part), and their ratio; then the whole agent's steady RSS:
the daemon plus every process it runs (the isolation-forest fit a store this old starts, which
exits within about a minute), sampled together. Steady means after the warm-up and after any fit
process has exited; the fit process' own peak RSS and run time are printed beside it.

Targets: ``/metrics`` answers within 200 ms throughout start-up; start-up peak RSS ≤ 1.5 × steady;
the whole agent ≤ 100 MB steady with this store; a fit ≤ 250 MB for ≤ 1 minute.
It prints figures; nothing asserts on them.
"""

from __future__ import annotations

import os
import signal
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
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from infercost_bench.procs import children, cpu_seconds, free_port, status_mb

PROBE_SECONDS = 0.05  # seconds between /metrics probes
TARGET_MS = 200.0
TARGET_PEAK_RATIO = 1.5
TARGET_AGENT_MB = 100.0  # whole agent, steady: less than dcgm-exporter's 128 Mi request
MAX_WAIT_SECONDS = 600.0  # for the warm-up and then for a fit process to exit: beyond that it hangs


def top_up(path: Path, days: float, ahead: float = 180.0) -> int:
    """Repeat the store's last minute of every model series up to ``ahead`` seconds past now, so the
    daemon finds live series, as after a restart under traffic: it scores them and, with no forest
    in its fresh state directory, starts a fit. Returns the windows written."""
    import dataclasses

    from agent.clock import ManualClock
    from agent.records import MINUTE, window_from_record
    from agent.store import Store

    now = time.time()
    store = Store(path, retention_days=days + 1, clock=ManualClock(start=now))
    try:
        span = store.span()
        if span is None:
            return 0
        last = store.records(span[1], span[1] + MINUTE, kinds=("model",))
        windows = []
        t = span[1] + MINUTE
        while t < now + ahead:
            for w in map(window_from_record, last):
                windows.append(
                    dataclasses.replace(w, usage=dataclasses.replace(w.usage, start=t, end=t + MINUTE))
                )
            t += MINUTE
        return store.write_windows(windows)
    finally:
        store.close()


def run(
    days: float = 35.0,
    series: int = 24,
    steady: float = 30.0,
    store: Path | None = None,
    print_fn: Callable[[str], Any] = print,
) -> dict[str, float]:
    """Run the benchmark; print and return the figures."""
    from infercost_bench.report import fill_store

    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="infercost-startup-") as tmp:
        d = Path(tmp)
        state = d / "state"
        state.mkdir()
        hist = state / "history.sqlite"
        end = time.time() // 60 * 60
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            bar.add_task(f"filling {days:g} days × {series} series of history", total=None)
            if store is not None and store.exists():
                hist.symlink_to(store.resolve())
            else:
                fill_store(hist, series, days, end)
                if store is not None:
                    os.link(hist, store)
            top_up(hist, days)
        size_mb = hist.stat().st_size / 1e6
        port = free_port()
        cfg = {
            "node": "bench-node",
            "state_dir": str(state),
            "intervals": {"nvml_seconds": 1, "scrape_seconds": 5, "window_seconds": 60},
            "nvml": {"backend": "fake", "fake_count": 8},
            "engines": [
                {"name": "engine-0", "kind": "vllm", "url": f"http://127.0.0.1:{free_port()}/metrics"}
            ],
            "store": {"retention_days": days + 1},
            "exporters": {"prometheus": {"host": "127.0.0.1", "port": port}},
        }
        (d / "node.yaml").write_text(yaml.safe_dump(cfg))
        daemon = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", str(d / "node.yaml")],
            stderr=subprocess.PIPE,
            text=True,
        )
        warmed = threading.Event()
        log: list[str] = []

        def drain() -> None:
            assert daemon.stderr is not None
            for line in daemon.stderr:
                log.append(line)
                if "detection warmed up" in line:
                    warmed.set()

        threading.Thread(target=drain, daemon=True).start()
        latencies: list[float] = []  # ms, during start-up
        rss: list[float] = []  # MB, the daemon after warm-up
        agent_rss: list[float] = []  # MB, daemon + its processes, after warm-up and any fit
        fit_peak: dict[int, float] = {}  # fit process id → its peak RSS (MB)
        fit_first: dict[int, float] = {}  # fit process id → monotonic seconds it was first seen
        fit_last: dict[int, float] = {}  # ... and last seen
        t_start = time.monotonic()
        t_first = t_warm = t_quiet = None  # t_quiet: warmed up and no fit process running
        cpu_first = cpu_warm = float("nan")  # the daemon's CPU seconds at those instants
        try:
            with Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as bar:
                task = bar.add_task("daemon starting", total=None)
                while True:
                    t0 = time.monotonic()
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                            r.read()
                        ok = True
                    except OSError:
                        ok = False
                    ms = (time.monotonic() - t0) * 1000
                    if ok and t_first is None:
                        t_first = time.monotonic()
                        cpu_first = cpu_seconds(daemon.pid)
                        bar.update(task, description="replaying history; probing /metrics every 50 ms")
                    if ok and t_warm is None:
                        latencies.append(ms)
                    if warmed.is_set() and t_warm is None:
                        t_warm = time.monotonic()
                        cpu_warm = cpu_seconds(daemon.pid)
                        bar.update(task, description="warmed up; measuring steady RSS")
                    kids = children(daemon.pid)
                    now = time.monotonic()
                    for k in kids:
                        hwm = status_mb(k, "VmHWM")
                        if hwm is not None:
                            fit_peak[k] = max(fit_peak.get(k, 0.0), hwm)
                            fit_first.setdefault(k, now)
                            fit_last[k] = now
                    if t_warm is not None:
                        v = status_mb(daemon.pid, "VmRSS")
                        if v is not None:
                            rss.append(v)
                        if kids:
                            t_quiet = None
                            agent_rss.clear()
                        elif v is not None:
                            t_quiet = t_quiet or now
                            agent_rss.append(v)
                        if t_quiet is not None and now - max(t_warm, t_quiet) > steady:
                            break
                    if daemon.poll() is not None:
                        raise RuntimeError("the daemon exited:\n" + "".join(log[-20:]))
                    if now - t_start > 2 * MAX_WAIT_SECONDS:
                        raise RuntimeError("no warm-up or a fit that never ends:\n" + "".join(log[-20:]))
                    time.sleep(PROBE_SECONDS)
            peak = status_mb(daemon.pid, "VmHWM") or float("nan")
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
    assert t_first is not None and t_warm is not None
    tail = sorted(rss[len(rss) // 2 :])
    steady_mb = tail[len(tail) // 2] if tail else float("nan")
    agent_tail = sorted(agent_rss[len(agent_rss) // 2 :])
    agent_mb = agent_tail[len(agent_tail) // 2] if agent_tail else float("nan")
    lat = sorted(latencies)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
    worst = lat[-1] if lat else float("nan")
    warm_line = next((line.strip() for line in log if "detection warmed up" in line), "")
    print_fn(f"daemon restarted on a {days:g}-day store ({series} model series, {size_mb:.0f} MB)")
    print_fn(f"  {warm_line.split(': ', 1)[-1]}")
    print_fn(
        f"  /metrics during start-up ({len(lat)} probes over {t_warm - t_first:.1f} s): "
        f"slowest {worst:.0f} ms, p99 {p99:.0f} ms (target <= {TARGET_MS:.0f} ms)"
    )
    print_fn(
        f"  replay: {cpu_warm - cpu_first:.1f} CPU-s of the daemon over {t_warm - t_first:.1f} s wall "
        "(from the first /metrics answer to the warm-up line; the wall time depends on the machine's load)"
    )
    print_fn(
        f"  RSS: peak {peak:.1f} MB, steady {steady_mb:.1f} MB, ratio {peak / steady_mb:.2f} "
        f"(target <= {TARGET_PEAK_RATIO})"
    )
    fit_s = max((fit_last[k] - fit_first[k] for k in fit_peak), default=0.0)
    fits = (
        f"{len(fit_peak)} ran, peak RSS {max(fit_peak.values()):.1f} MB, ~{fit_s:.0f} s "
        "(target <= 250 MB, <= 60 s)"
        if fit_peak
        else "none ran"
    )
    print_fn(f"  isolation-forest fit process: {fits}")
    print_fn(
        f"  whole agent steady RSS (daemon + every process it runs, after the warm-up and any fit): "
        f"{agent_mb:.1f} MB (target <= {TARGET_AGENT_MB:.0f} MB)"
    )
    return {
        "worst_ms": worst,
        "p99_ms": p99,
        "peak_mb": peak,
        "steady_mb": steady_mb,
        "replay_cpu_s": cpu_warm - cpu_first,
        "agent_steady_mb": agent_mb,
        "fit_peak_mb": max(fit_peak.values(), default=0.0),
    }


if __name__ == "__main__":
    run(float(sys.argv[1]) if len(sys.argv) > 1 else 35.0)
