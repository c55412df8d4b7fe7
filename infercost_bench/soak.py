"""``infercost bench soak --hours 72``: the real daemon against the simulated node, with faults.

The daemon runs as its own process (``build_agent``, the same wiring as ``infercost run``) on an
accelerated clock shared with the simulated node (``--speed`` simulated seconds per real second),
its fake NVML driven from a control file. On a schedule laid over the run (fractions of
``--hours``) the bench injects:

- an engine killed and restarted (twice), a data-parallel rank's series vanishing and returning;
- an engine serving ±Inf, negative, NaN and garbage pages;
- the alert receiver down (503), then refusing with 429 and Retry-After;
- a full disk (``prlimit`` RLIMIT_FSIZE on the daemon: every write past 4 KiB fails);
- an NVML GPU lost and back;
- SIGKILL of the daemon and a restart (twice).

It scrapes ``/metrics`` every 0.25 s of real time and samples the daemon's RSS, then checks:
RSS flat after warm-up (slope < 1 MB per simulated day), the store within its cap, every alert in
the outbox delivered at least once with no duplicate, every ``_total`` counter (and every
bucket, count and sum of the re-based latency histograms) monotonic within a process lifetime,
conservation (Σ busy model cost + Σ GPU idle = Σ GPU cost within 0.1 %; a model's idle cost is
GPU idle charged to it, see ``agent.cost.attribution``), each model's dollars split within its
cost (prompt $ + idle $ ≤ cost $, usage-basis $ ≤ cost $), and
``/metrics`` never unavailable for more than 1 s except while the daemon is deliberately dead.
It prints a table of the faults injected, the invariants and the figures; exit status 1 when an
invariant fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from agent.clock import AcceleratedClock
from agent.cost.invariants import REL_TOL
from agent.records import iso
from infercost_bench.procs import free_port, status_mb

PROBE_SECONDS = 0.25  # real seconds between /metrics probes (4 per second: a 1 s gap is 4 misses)
MAX_GAP_SECONDS = 1.0  # real seconds /metrics may be unavailable (the bound)
RSS_SLOPE_MB_PER_DAY = 1.0  # the bound on memory growth after warm-up
# Why 48 h: the rules' baselines fill for days, so a slope over a few hours measures that filling,
# not a leak; below this span the slope is printed but not judged.
MIN_JUDGED_HOURS = 48.0
CONSERVATION_TOLERANCE = 1e-3  # 0.1 %
FAULTY_GPU = 8  # the faulty engine's GPU (the simulated node's engines use 0-7)
FULL_DISK_LIMIT = 4096  # bytes: RLIMIT_FSIZE during the disk-full window (every write past it fails)


# ---------------------------------------------------------------------------------------- schedule
@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault: from ``start`` to ``end`` (fractions of the run), what it is."""

    name: str
    kind: (
        str  # kill_engine | dp_rank | hostile | receiver_503 | receiver_429 | disk_full | gpu_lost | sigkill
    )
    start: float  # fraction of the run
    end: float  # fraction of the run (== start for an instant fault)
    target: str = ""


SCHEDULE: tuple[Fault, ...] = (
    Fault("engine qwen-14b killed, restarted", "kill_engine", 0.05, 0.10, "qwen-14b"),
    Fault("DP rank 1 of 'faulty' vanishes, returns", "dp_rank", 0.12, 0.17),
    Fault("±Inf / negative / NaN / garbage pages", "hostile", 0.19, 0.24),
    Fault("alert receiver down (503)", "receiver_503", 0.28, 0.42),
    Fault("NVML GPU 3 lost, back", "gpu_lost", 0.30, 0.36, "3"),
    Fault("alert receiver answers 429 + Retry-After", "receiver_429", 0.43, 0.53),
    Fault("engine mistral-7b killed, restarted", "kill_engine", 0.44, 0.50, "mistral-7b"),
    Fault("disk full (RLIMIT_FSIZE 4 KiB)", "disk_full", 0.56, 0.62),
    Fault("daemon SIGKILL, restart", "sigkill", 0.66, 0.66),
    Fault("engine qwen-14b killed, restarted (after the restart)", "kill_engine", 0.68, 0.74, "qwen-14b"),
    Fault("daemon SIGKILL, restart", "sigkill", 0.80, 0.80),
)


# ---------------------------------------------------------------------------------------- the daemon side
async def _daemon_main(d: Path) -> None:
    """The daemon process: build_agent on the shared accelerated clock, fake NVML from control.json."""
    from agent.app import build_agent
    from agent.config import load_config
    from agent.logs import setup_logging
    from agent.sources.nvml.backend import NvmlBackend
    from agent.sources.nvml.fake import FakeNvml

    setup_logging("info", "text")
    spec = json.loads((d / "soak.json").read_text())
    speed = float(spec["speed"])
    clock = AcceleratedClock(speed, start=spec["t0_sim"] + (time.time() - spec["t0_real"]) * speed)
    cfg = load_config(d / "node.yaml")
    fake = FakeNvml(cfg.nvml.fake_profile, cfg.nvml.fake_count, None, clock=clock.now)
    agent = await build_agent(cfg, clock=clock, backend=NvmlBackend(fake))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def control() -> None:
        lost: set[int] = set()
        while not stop.is_set():
            try:
                want = set(json.loads((d / "control.json").read_text()).get("lost_gpus", []))
            except (OSError, ValueError):
                want = lost
            for i in want - lost:
                fake.lose_gpu(i)
            for i in lost - want:
                fake.restore_gpu(i)
            lost = want
            await asyncio.sleep(0.2)

    ctl = asyncio.create_task(control())
    try:
        await agent.run(stop)
    finally:
        ctl.cancel()


# ---------------------------------------------------------------------------------------- bench side
class FaultyEngine:
    """A vLLM endpoint with two DP ranks whose page the schedule can break (real HTTP)."""

    RATE = 500.0  # generation tokens per simulated second per rank

    def __init__(self, clock: AcceleratedClock, t0: float) -> None:
        self.clock = clock
        self.t0 = t0
        self.rank1 = True
        self.hostile = False
        self.port = 0
        self.served = 0
        self._runner: web.AppRunner | None = None

    def page(self) -> str:
        """The page now (a hostile one cycles through bad values)."""
        t = self.clock.now() - self.t0
        lines = ["# TYPE vllm:generation_tokens_total counter", "# TYPE vllm:prompt_tokens_total counter"]
        ranks = ["0", "1"] if self.rank1 else ["0"]
        bad = ["+Inf", "-Inf", "-5", "NaN", "1e308"]
        for r in ranks:
            gen = f"{self.RATE * t:.0f}"
            if self.hostile and r == "0":
                gen = bad[self.served % len(bad)]
            lbl = f'{{engine="{r}",model_name="faulty"}}'
            lines.append(f"vllm:generation_tokens_total{lbl} {gen}")
            lines.append(f"vllm:prompt_tokens_total{lbl} {2 * self.RATE * t:.0f}")
            lines.append(f"vllm:num_requests_running{lbl} 8")
        if self.hostile and self.served % 3 == 0:
            lines.append('vllm:generation_tokens_total{model_name="faulty" garbage \x00\xff')
        return "\n".join(lines) + "\n"

    async def _handle(self, _req: web.Request) -> web.Response:
        self.served += 1
        return web.Response(text=self.page())

    async def start(self) -> None:
        """Serve on a free loopback port."""
        self._runner, self.port = await _serve("get", "/metrics", self._handle)

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()


async def _serve(
    method: str, path: str, handler: Callable[[web.Request], Awaitable[web.Response]]
) -> tuple[web.AppRunner, int]:
    """One route on a free loopback port: (runner to clean up, port)."""
    app = web.Application()
    app.router.add_route(method.upper(), path, handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, int(runner.addresses[0][1])


@dataclass
class Receiver:
    """An Alertmanager-webhook receiver (real HTTP) that the schedule can take down or make refuse."""

    mode: str = "ok"  # ok | 503 | 429
    received: list[tuple[str, str, str]] = field(default_factory=list)  # (fingerprint, status, startsAt)
    refused: int = 0
    port: int = 0
    _runner: web.AppRunner | None = None

    async def _handle(self, req: web.Request) -> web.Response:
        if self.mode == "503":
            self.refused += 1
            return web.Response(status=503, text="down")
        if self.mode == "429":
            self.refused += 1
            return web.Response(status=429, headers={"Retry-After": "1"}, text="slow down")
        body = await req.json()
        for a in body.get("alerts", []):
            self.received.append((a["fingerprint"], a["status"], a["startsAt"]))
        return web.Response(text="ok")

    async def start(self) -> None:
        """Serve on a free loopback port."""
        self._runner, self.port = await _serve("post", "/hook", self._handle)

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()


Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _parse(text: str) -> Series:
    out: Series = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _total(m: Series, name: str) -> float:
    return sum(v for (n, _), v in m.items() if n == name)


def _split_breaks(m: Series) -> list[str]:
    """Per model version, from its dollar counters: prompt $ + idle $ ≤ cost $ and usage-basis $ ≤
    cost $ (a window's cost is prompt + output + idle, each ≥ 0, and its usage basis is part of it),
    within the rounding of the sums (:data:`agent.cost.invariants.REL_TOL`)."""
    out: list[str] = []
    for (name, labels), cost in m.items():
        if name != "infercost_cost_usd_total":
            continue
        prompt = m.get(("infercost_prompt_cost_usd_total", labels), 0.0)
        idle = m.get(("infercost_idle_cost_usd_total", labels), 0.0)
        usage = m.get(("infercost_usage_cost_usd_total", labels))
        tol = REL_TOL * (abs(cost) + abs(prompt) + abs(idle) + abs(usage or 0.0))
        if prompt + idle > cost + tol:
            out.append(f"{dict(labels)}: prompt ${prompt} + idle ${idle} > cost ${cost}")
        if usage is not None and usage > cost + tol:
            out.append(f"{dict(labels)}: usage-basis ${usage} > cost ${cost}")
    return out


def _slope_per_day(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (simulated seconds, MB) in MB per simulated day."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return None
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx * 86400


@dataclass
class Lifetime:
    """One daemon process, from start to death."""

    pid: int
    started_real: float
    rss: list[tuple[float, float]] = field(default_factory=list)  # (sim seconds, MB)
    last: Series = field(default_factory=dict)
    nonmonotonic: list[str] = field(default_factory=list)
    out_of_range: list[str] = field(default_factory=list)  # ratios outside [0, 1], as probed
    max_efficiency: float = float("nan")  # the highest roofline efficiency any probe saw


class Soak:
    """The whole run (see the module docstring)."""

    def __init__(self, hours: float, speed: float, seed: int, print_fn: Callable[[str], Any]) -> None:
        self.hours = hours
        self.speed = speed
        self.seed = seed
        self.print = print_fn
        self.tmp = Path(tempfile.mkdtemp(prefix="infercost-soak-"))
        self.state = self.tmp / "state"
        self.t0 = float(int(time.time() // 3600 * 3600))
        self.clock = AcceleratedClock(speed, start=self.t0)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.lifetimes: list[Lifetime] = []
        self.log_lines = 0
        self.log_tail: list[str] = []
        self.log_file: IO[str] = (self.tmp / "daemon.log").open("w")
        self.max_gap = 0.0  # real seconds /metrics was unavailable outside deliberate deaths
        self.restart_seconds: list[float] = []  # real seconds from SIGKILL to /metrics answering again
        self.observed: dict[str, str] = {}
        self.scrapes = 0
        self.crashes: list[str] = []  # daemon processes that exited without being told to
        self.ever_enqueued: set[tuple[str, str, str]] = set()  # (dedup_key, kind, body) seen in the outbox

    # -- the daemon process -------------------------------------------------------------------
    def _write_config(self, engines: list[dict[str, Any]], hook_port: int) -> None:
        nvml_s = max(1.0, self.speed / 4)
        scrape_s = max(5.0, self.speed / 2)
        cfg = {
            "node": "soak-node",
            "state_dir": str(self.state),
            "intervals": {"nvml_seconds": nvml_s, "scrape_seconds": scrape_s, "window_seconds": 60},
            "nvml": {"backend": "fake", "fake_profile": "H100-SXM", "fake_count": FAULTY_GPU + 1},
            "engines": engines,
            "exporters": {"prometheus": {"host": "127.0.0.1", "port": self.port}},
            "alerts": {"webhook": {"url": {"env": "INFERCOST_SOAK_HOOK"}}},
        }
        (self.tmp / "node.yaml").write_text(yaml.safe_dump(cfg))
        (self.tmp / "soak.json").write_text(
            json.dumps({"speed": self.speed, "t0_sim": self.t0, "t0_real": self._t0_real})
        )
        (self.tmp / "control.json").write_text(json.dumps({"lost_gpus": []}))
        os.environ["INFERCOST_SOAK_HOOK"] = f"http://127.0.0.1:{hook_port}/hook"

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infercost_bench.soak", "--daemon", str(self.tmp)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.lifetimes.append(Lifetime(self.proc.pid, time.monotonic()))
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            self.log_lines += 1
            self.log_file.write(line)
            self.log_file.flush()
            self.log_tail = [*self.log_tail[-40:], line]

    # -- probing --------------------------------------------------------------------------------
    async def _probe(self, session: aiohttp.ClientSession) -> Series | None:
        try:
            async with session.get(
                f"http://127.0.0.1:{self.port}/metrics", timeout=aiohttp.ClientTimeout(total=1.0)
            ) as r:
                if r.status != 200:
                    return None
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None
        self.scrapes += 1
        return _parse(text)

    def _check_counters(self, life: Lifetime, m: Series) -> None:
        for key, v in m.items():
            name = key[0]
            if name.startswith("infercost_") and name.endswith("_ratio"):  # a share: in [0, 1] by definition
                if not 0.0 <= v <= 1.0:
                    life.out_of_range.append(f"{name}{dict(key[1])} = {v}")
                if name == "infercost_roofline_efficiency_ratio" and not v <= life.max_efficiency:
                    life.max_efficiency = v
            # counters, and the re-based latency histograms' buckets, counts and sums
            if not name.endswith("_total") and not (
                name.startswith("infercost_") and name.endswith(("_bucket", "_count", "_sum"))
            ):
                continue
            prev = life.last.get(key)
            if not math.isfinite(v) or v < 0 or (prev is not None and v < prev):
                life.nonmonotonic.append(f"{name}{dict(key[1])}: {prev} -> {v}")
        life.last = m

    # -- the run ----------------------------------------------------------------------------------
    async def run(self) -> bool:
        """Run the soak; print the table; True when every invariant holds."""
        from infercost_sim.node import SimNode

        self._t0_real = time.time()
        self.clock = AcceleratedClock(self.speed, start=self.t0)
        sim = SimNode(
            self.clock, self.tmp / "podinfo", target_page_bytes=None, tick_seconds=None, seed=self.seed
        )
        await sim.start()
        faulty = FaultyEngine(self.clock, self.t0)
        await faulty.start()
        receiver = Receiver()
        await receiver.start()
        engines = [e.model_dump(mode="json", exclude_none=True) for e in sim.engine_configs()]
        engines.append(
            {
                "name": "faulty",
                "kind": "vllm",
                "url": f"http://127.0.0.1:{faulty.port}/metrics",
                "gpus": [FAULTY_GPU],
            }
        )
        self.port = free_port()
        self._write_config(engines, receiver.port)
        self._spawn()
        total = self.hours * 3600.0
        done: set[int] = set()
        active: set[int] = set()
        down_since: float | None = time.monotonic()  # real time the daemon was (re)started on purpose
        last_ok = time.monotonic()
        seen_down: dict[str, bool] = defaultdict(bool)
        last_outbox_read = 0.0
        console = Console(stderr=True)
        try:
            async with aiohttp.ClientSession() as session:
                with Progress(
                    TextColumn("soak"),
                    BarColumn(),
                    TextColumn("{task.fields[sim]:.1f} of {task.total:.0f} simulated h"),
                    TimeRemainingColumn(),
                    console=console,
                    transient=True,
                ) as bar:
                    task = bar.add_task("soak", total=self.hours, sim=0.0)
                    while True:
                        elapsed = self.clock.now() - self.t0
                        frac = elapsed / total
                        bar.update(task, completed=min(self.hours, elapsed / 3600), sim=elapsed / 3600)
                        if frac >= 1.0:
                            break
                        for i, f in enumerate(SCHEDULE):
                            if i not in done and i not in active and frac >= f.start:
                                await self._begin(f, sim, faulty, receiver)
                                if f.kind == "sigkill":
                                    down_since = time.monotonic()
                                    done.add(i)
                                else:
                                    active.add(i)
                            if i in active and frac >= f.end:
                                await self._finish(f, sim, faulty, receiver)
                                active.discard(i)
                                done.add(i)
                        if self.proc is not None and self.proc.poll() is not None:
                            # it died on its own: an invariant broken; start it again and go on
                            self.crashes.append(f"pid {self.proc.pid} exited {self.proc.returncode}")
                            self._spawn()
                            down_since = time.monotonic()
                        m = await self._probe(session)
                        now = time.monotonic()
                        life = self.lifetimes[-1]
                        if m is not None:
                            if down_since is not None:
                                self.restart_seconds.append(now - down_since)
                                down_since = None
                            else:
                                self.max_gap = max(self.max_gap, now - last_ok)
                            last_ok = now
                            self._check_counters(life, m)
                            self._observe(m, active, seen_down)
                        if now - last_outbox_read >= 2.0:  # delivered rows are pruned after a day
                            self.ever_enqueued |= {(r[0], r[1], r[2]) for r in self._outbox_rows()}
                            last_outbox_read = now
                        rss = status_mb(life.pid, "VmRSS")
                        if rss is not None:
                            life.rss.append((elapsed, rss))
                        await asyncio.sleep(PROBE_SECONDS)
                    # let the outbox drain (the last faults end well before the run does)
                    for _ in range(int(30 / PROBE_SECONDS)):
                        if self._pending() == 0:
                            break
                        await asyncio.sleep(PROBE_SECONDS)
        finally:
            self._stop_daemon()
            await sim.stop()
            await faulty.stop()
            await receiver.stop()
            self.log_file.close()
        return self._report(receiver, seen_down)

    def _stop_daemon(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    async def _begin(self, f: Fault, sim: Any, faulty: FaultyEngine, receiver: Receiver) -> None:
        assert self.proc is not None
        if f.kind == "kill_engine":
            await sim._members[f.target].server.stop()
        elif f.kind == "dp_rank":
            faulty.rank1 = False
        elif f.kind == "hostile":
            faulty.hostile = True
        elif f.kind in ("receiver_503", "receiver_429"):
            receiver.mode = f.kind.removeprefix("receiver_")
        elif f.kind == "disk_full":
            resource.prlimit(self.proc.pid, resource.RLIMIT_FSIZE, (FULL_DISK_LIMIT, resource.RLIM_INFINITY))
        elif f.kind == "gpu_lost":
            (self.tmp / "control.json").write_text(json.dumps({"lost_gpus": [int(f.target)]}))
        elif f.kind == "sigkill":
            self.proc.kill()
            self.proc.wait()
            # the lock is released with the process; a new one starts at once, as a kubelet would
            self._spawn()

    async def _finish(self, f: Fault, sim: Any, faulty: FaultyEngine, receiver: Receiver) -> None:
        assert self.proc is not None
        if f.kind == "kill_engine":
            await sim._members[f.target].server.start()
        elif f.kind == "dp_rank":
            faulty.rank1 = True
        elif f.kind == "hostile":
            faulty.hostile = False
        elif f.kind in ("receiver_503", "receiver_429"):
            receiver.mode = "ok"
        elif f.kind == "disk_full":
            with contextlib.suppress(ProcessLookupError):
                resource.prlimit(
                    self.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
                )
        elif f.kind == "gpu_lost":
            (self.tmp / "control.json").write_text(json.dumps({"lost_gpus": []}))

    def _observe(self, m: Series, active: set[int], seen: dict[str, bool]) -> None:
        """Note what /metrics showed during each active fault."""
        for i in active:
            f = SCHEDULE[i]
            if f.kind == "kill_engine":
                hit = any(
                    n == "infercost_engine_up" and dict(k).get("engine") == f.target and v == 0.0
                    for (n, k), v in m.items()
                )
            elif f.kind == "disk_full":
                hit = any(n == "infercost_store_up" and v == 0.0 for (n, _), v in m.items())
            elif f.kind == "gpu_lost":
                hit = any(
                    n == "infercost_gpu_up" and dict(k).get("gpu") == f.target and v == 0.0
                    for (n, k), v in m.items()
                )
            elif f.kind in ("dp_rank", "hostile"):
                hit = any(
                    n == "infercost_engine_up" and dict(k).get("engine") == "faulty"
                    for (n, k), v in m.items()
                ) and any(
                    n == "infercost_generation_tokens_total" and dict(k).get("engine") == "llama-70b"
                    for (n, k), v in m.items()
                )
            else:
                hit = True
            seen[f.name] = seen[f.name] or hit

    def _outbox_rows(self) -> list[tuple[str, str, str, str]]:
        path = self.state / "outbox.sqlite"
        if not path.exists():
            return []
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return [
                (r[0], r[1], r[2], r[3])
                for r in db.execute("SELECT dedup_key, kind, body, state FROM outbox WHERE sink='webhook'")
            ]
        except sqlite3.Error:
            return []
        finally:
            db.close()

    def _pending(self) -> int:
        return sum(1 for r in self._outbox_rows() if r[3] == "pending")

    def _report(self, receiver: Receiver, seen: dict[str, bool]) -> bool:
        console = Console(width=120)
        faults = Table(title=f"faults injected ({self.hours:g} simulated h at {self.speed:g}×)")
        for col in ("at (sim h)", "fault", "seen on /metrics"):
            faults.add_column(col)
        for f in SCHEDULE:
            shown = (
                "—"
                if f.kind in ("sigkill", "receiver_503", "receiver_429")
                else ("yes" if seen[f.name] else "NO")
            )
            faults.add_row(f"{f.start * self.hours:.1f}", f.name, shown)
        console.print(faults)

        rows = self._outbox_rows()
        self.ever_enqueued |= {(r[0], r[1], r[2]) for r in rows}
        expected = {
            (k[:16], kind, iso(float(json.loads(b).get("active_since") or 0.0)))
            for k, kind, b in self.ever_enqueued
        }
        got: dict[tuple[str, str, str], int] = defaultdict(int)
        for r in receiver.received:
            got[r] += 1
        missing = expected - set(got)
        dups = sum(n - 1 for n in got.values() if n > 1)
        undelivered = sum(1 for r in rows if r[3] != "delivered")
        nonmono = [x for life in self.lifetimes for x in life.nonmonotonic]
        outside = [x for life in self.lifetimes for x in life.out_of_range]
        efficiencies = [life.max_efficiency for life in self.lifetimes if math.isfinite(life.max_efficiency)]
        max_eff = max(efficiencies, default=float("nan"))
        longest = max(self.lifetimes, key=lambda life: len(life.rss))
        warm = longest.rss[len(longest.rss) // 5 :]
        slope = _slope_per_day(warm)
        judged = bool(warm) and (warm[-1][0] - warm[0][0]) >= MIN_JUDGED_HOURS * 3600
        steady = sorted(v for _, v in warm)[len(warm) // 2] if warm else float("nan")
        peak = max((v for life in self.lifetimes for _, v in life.rss), default=float("nan"))
        store = self.state / "history.sqlite"
        store_mb = (
            sum(p.stat().st_size for p in self.state.glob("history.sqlite*")) / 1e6 if store.exists() else 0.0
        )
        from agent.store import DEFAULT_MAX_BYTES

        conservation: list[float] = []
        for life in self.lifetimes:
            m = life.last
            gpu = _total(m, "infercost_gpu_cost_usd_total")
            if gpu > 0:
                # busy model cost (a model's cost while it made tokens) + GPU idle = GPU cost
                busy = _total(m, "infercost_cost_usd_total") - _total(m, "infercost_idle_cost_usd_total")
                idle = _total(m, "infercost_gpu_idle_cost_usd_total")
                conservation.append(abs(busy + idle - gpu) / gpu)
        worst = max(conservation, default=float("nan"))
        split = [x for life in self.lifetimes for x in _split_breaks(life.last)]
        split_models = sum(
            1 for life in self.lifetimes for n, _ in life.last if n == "infercost_cost_usd_total"
        )

        checks: list[tuple[str, bool, str]] = [
            (
                "the daemon never exits on its own",
                not self.crashes and self.scrapes > 0,
                "; ".join(self.crashes) or f"{len(self.lifetimes)} processes, each stopped on purpose",
            ),
            (
                "RSS flat after warm-up",
                judged is False or (slope is not None and abs(slope) < RSS_SLOPE_MB_PER_DAY),
                f"{slope if slope is not None else float('nan'):+.2f} MB per simulated day "
                f"(longest lifetime, {len(warm)} samples; bound ±{RSS_SLOPE_MB_PER_DAY:g})"
                + ("" if judged else f"; not judged: under {MIN_JUDGED_HOURS:g} simulated h after warm-up"),
            ),
            (
                "store within its cap",
                store_mb * 1e6 <= DEFAULT_MAX_BYTES,
                f"{store_mb:.1f} MB of {DEFAULT_MAX_BYTES / 1e6:.0f} MB",
            ),
            (
                "every alert delivered at least once",
                not missing and undelivered == 0 and len(expected) > 0,
                f"{len(expected)} notifications enqueued, {len(missing)} never received, "
                f"{undelivered} not marked delivered; {receiver.refused} refused by the receiver",
            ),
            ("no duplicate delivery", dups == 0, f"{dups} duplicates over {len(receiver.received)} receipts"),
            (
                "counters monotonic",
                not nonmono,
                f"{len(nonmono)} violations" + (f": {nonmono[0]}" if nonmono else ""),
            ),
            (
                "every ratio in [0, 1] (decode efficiency included)",
                not outside,
                f"{len(outside)} outside"
                + (f": {outside[0]}" if outside else "")
                + f"; highest roofline efficiency seen {max_eff:.3f}",
            ),
            (
                "conservation Σ busy model + Σ GPU idle = Σ GPU",
                bool(conservation) and worst <= CONSERVATION_TOLERANCE,
                f"worst {worst * 100:.4f} % over {len(conservation)} lifetimes (bound 0.1 %)",
            ),
            (
                "per model: prompt $ + idle $ ≤ cost $, usage $ ≤ cost $",
                split_models > 0 and not split,
                f"{len(split)} violations over {split_models} model versions × lifetimes"
                + (f": {split[0]}" if split else ""),
            ),
            (
                "/metrics never unavailable > 1 s",
                self.max_gap <= MAX_GAP_SECONDS,
                f"longest gap {self.max_gap:.2f} s outside deliberate kills; restarts answered after "
                + ", ".join(f"{s:.1f} s" for s in self.restart_seconds),
            ),
            (
                "faults visible on /metrics",
                all(
                    seen[f.name]
                    for f in SCHEDULE
                    if f.kind not in ("sigkill", "receiver_503", "receiver_429")
                ),
                "",
            ),
        ]
        inv = Table(title="invariants")
        for col in ("invariant", "holds", "figures"):
            inv.add_column(col)
        for name, ok, fig in checks:
            inv.add_row(name, "yes" if ok else "NO", fig)
        console.print(inv)
        console.print(
            f"daemon: {len(self.lifetimes)} processes, RSS steady {steady:.1f} MB, peak {peak:.1f} MB; "
            f"{self.scrapes} /metrics probes; {self.log_lines} log lines "
            f"({self.log_lines / max(self.hours, 1e-9):.1f} per simulated hour); "
            f"logs in {self.tmp / 'daemon.log'}"
        )
        return all(ok for _, ok, _ in checks)


def run(hours: float = 6.0, speed: float = 240.0, seed: int = 7) -> int:
    """Run the soak; 0 when every invariant holds, else 1."""
    soak = Soak(hours, speed, seed, print)
    ok = asyncio.run(soak.run())
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--daemon":
        asyncio.run(_daemon_main(Path(sys.argv[2])))
    else:
        sys.exit(run(float(sys.argv[1]) if len(sys.argv) > 1 else 6.0))
