"""``infercost demo``: a simulated 8 × H100 node, the REAL daemon pipeline, and a live view.

The demo runs the same :class:`~agent.supervisor.Agent` as ``infercost run``: the fake NVML
library (driven by the simulated engines' load) and four simulated vLLM engines serving real
``/metrics`` pages over HTTP on 127.0.0.1, scraped like any engine. Everything runs on an
accelerated clock (``speed`` simulated seconds per real second). The story: five simulated minutes
in, the canary of Llama-3.1-70B gets a build that lost a fused kernel (steps 1.8× longer: about 40 %
fewer tokens per second at the same demand, measured); its cost per token rises by about 70 %,
a rule fires, and the alert — naming the deploy — reaches a local Slack-like receiver whose
messages the demo prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from agent.app import build_agent
from agent.clock import AcceleratedClock
from agent.config import (
    AlertsConfig,
    Config,
    ExportersConfig,
    IntervalsConfig,
    NvmlConfig,
    PrometheusExporterConfig,
    SecretRef,
    SlackConfig,
)
from agent.snapshot import ModelState, Snapshot
from agent.sources.prices import PriceBook, load_price_book
from agent.supervisor import Agent
from infercost_sim.node import SimNode
from infercost_sim.scenario import Rollout, Scenario

logger = logging.getLogger(__name__)

DEMO_SLACK_ENV = "INFERCOST_DEMO_SLACK_URL"
DEMO_STORY = Scenario(
    "demo",
    "Five minutes in, the Llama-3.1-70B canary gets build 2024-10, which lost a fused kernel "
    "(throughput x0.55 per step: about 40 % fewer tokens/s at the same demand).",
    # Why 0.55 rather than the ~0.65 of a "35 % slower" build: the canary's cost per token must rise
    # clearly past the demo rule's factor, not onto it, or whether the alert fires within the demo's
    # minute depends on noise; steps 1/0.55 ≈ 1.8× longer leave that margin.
    (Rollout(300.0, "llama-70b-canary", "2024-10", 0.55),),
)


@dataclass
class SlackInbox:
    """A local Slack-like incoming-webhook receiver; keeps what arrives."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> None:
        """Listen on a free loopback port."""
        app = web.Application()
        app.router.add_post("/slack", self._receive)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/slack"

    async def _receive(self, req: web.Request) -> web.Response:
        self.messages.append(await req.json())
        return web.Response(text="ok")

    async def stop(self) -> None:
        """Stop listening."""
        if self.runner is not None:
            await self.runner.cleanup()


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    return "—" if v is None else f"{v:{spec}}{unit}"


# Columns dropped, in this order, when the terminal is narrower than the full table (about 150
# columns): the view fits the terminal instead of wrapping every row.
_OPTIONAL_COLUMNS = ("idle $/h", "power", "mem BW", "prompt tok/s", "model")
_FULL_WIDTH = 150  # columns the whole table needs
_COLUMN_WIDTH = 11  # columns one optional column takes, about


def render_view(
    snap: Snapshot, clock: AcceleratedClock, inbox: SlackInbox, port: int, width: int = _FULL_WIDTH
) -> Group:
    """The live view: one row per model version, node totals, and the Slack messages received.
    ``width``: the terminal's columns; optional columns are dropped until the table fits."""
    drop = set(_OPTIONAL_COLUMNS[: max(0, -(-(_FULL_WIDTH - width) // _COLUMN_WIDTH))])
    t = Table(title=f"infercost demo — node {snap.node}, 8 × H100 SXM (simulated)", expand=True)
    cols = [
        ("engine", "left"),
        ("model", "left"),
        ("version", "left"),
        ("prompt tok/s", "right"),
        ("gen tok/s", "right"),
        ("$/1M out", "right"),
        ("$/1M total", "right"),
        ("GPU util", "right"),
        ("mem BW", "right"),
        ("power", "right"),
        ("idle $/h", "right"),
    ]
    keep = [i for i, (name, _) in enumerate(cols) if name not in drop]
    for i in keep:
        t.add_column(cols[i][0], justify=cols[i][1])  # type: ignore[arg-type]
    for m in snap.models:
        if m.generation_tokens_per_second is None and m.cost_usd_per_hour is None:
            continue  # a version that is no longer deployed
        cells = (
            m.engine,
            m.model.split("/")[-1],
            m.model_version,
            _fmt(m.prompt_tokens_per_second, ",.0f"),
            _fmt(m.generation_tokens_per_second, ",.0f"),
            _fmt(m.usd_per_1m_output_tokens, ".3f", ""),
            _fmt(m.usd_per_1m_tokens, ".3f"),
            _fmt(None if m.gpu_utilization_ratio is None else m.gpu_utilization_ratio * 100, ".0f", " %"),
            _fmt(None if m.memory_bandwidth_ratio is None else m.memory_bandwidth_ratio * 100, ".0f", " %"),
            _fmt(m.power_watts, ",.0f", " W"),
            _fmt(m.idle_cost_usd_per_hour, ".2f"),
        )
        t.add_row(*(cells[i] for i in keep))
    node_cost = sum(g.cost_usd_total or 0.0 for g in snap.gpus)
    node_idle = sum(g.idle_cost_usd_total or 0.0 for g in snap.gpus)
    now = dt.datetime.fromtimestamp(clock.now(), tz=dt.UTC).strftime("%H:%M")
    firing = sum(snap.alerts_firing.values())
    head = Text.assemble(
        (f"simulated time {now} UTC ({clock.factor:.0f}× real)   ", "bold"),
        f"GPU spend so far ${node_cost:,.2f} (idle ${node_idle:,.2f})   ",
        (f"alerts firing: {firing}   ", "bold red" if firing else "green"),
        f"metrics: http://127.0.0.1:{port}/metrics",
    )
    msgs = [Text(_slack_line(m)) for m in inbox.messages[-4:]] or [Text("(no alert yet)", style="dim")]
    slack = Panel(Group(*msgs), title="Slack (local receiver)", border_style="magenta")
    return Group(head, t, floor_panel(snap), slack)


def max_batch(requests_running: float | None, kv_cache_usage_ratio: float | None) -> float | None:
    """Sequences the KV cache would hold at the current mean context: the running batch over the
    share of the cache it fills (the same arithmetic as :mod:`agent.cost.floor`: capacity ÷
    (resident tokens ÷ batch)); None without a running batch or a KV reading."""
    if not requests_running or not kv_cache_usage_ratio or kv_cache_usage_ratio <= 0:
        return None
    return requests_running / kv_cache_usage_ratio


def floor_line(m: ModelState) -> str | None:
    """ "you pay $X per 1M; the floor at this batch is $Y; at batch B it would be $Z" for one model
    version (None without a price or a floor: the engine's model weights are not configured)."""
    pay, floor = m.usd_per_1m_output_tokens, m.usd_per_1m_output_tokens_floor
    if pay is None or floor is None:
        return None
    text = f"{m.engine} {m.model_version}: you pay ${pay:.3f} per 1M output tokens; the floor at this batch"
    if m.requests_running:
        text += f" ({m.requests_running:,.0f} running)"
    text += f" is ${floor:.3f}"
    at_max, batch = (
        m.usd_per_1m_output_tokens_floor_max_batch,
        max_batch(m.requests_running, m.kv_cache_usage_ratio),
    )
    if at_max is not None and batch is not None:
        text += f"; at batch {batch:,.0f} (a full KV cache) it would be ${at_max:.3f}"
    return text


def floor_panel(snap: Snapshot) -> Panel:
    """The cost floor of every served model version (bandwidth roofline, :mod:`agent.cost.floor`)."""
    lines = [Text(t) for m in snap.models if (t := floor_line(m)) is not None]
    body = Group(*lines) if lines else Text("(no floor yet: needs a price and the model's size)", style="dim")
    return Panel(body, title="Cost floor (memory-bandwidth roofline)", border_style="cyan")


def _slack_line(msg: dict[str, Any]) -> str:
    parts = [str(msg.get("text") or "")]
    for a in msg.get("attachments") or []:
        parts.append(str(a.get("title") or a.get("fallback") or ""))
        parts.append(str(a.get("text") or ""))
    return " | ".join(p.strip() for p in parts if p and p.strip())


def demo_config(state_dir: Path, port: int, speed: float, slack: bool) -> Config:
    """The demo's config: fake NVML, intervals scaled to keep CPU low on an accelerated clock."""
    # Why these intervals: at `speed`× the daemon still does about one NVML round and one scrape
    # round per real second or two, the same CPU a real node spends at 1 s / 5 s.
    nvml_s = max(1.0, speed / 4)
    scrape_s = max(5.0, speed / 2)
    alerts = (
        AlertsConfig(slack=SlackConfig(webhook_url=SecretRef(env=DEMO_SLACK_ENV)))
        if slack
        else AlertsConfig()
    )
    return Config(
        node="demo-node",
        state_dir=state_dir,
        intervals=IntervalsConfig(nvml_seconds=nvml_s, scrape_seconds=scrape_s, window_seconds=60.0),
        nvml=NvmlConfig(backend="fake", fake_profile="H100-SXM", fake_count=8),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(host="127.0.0.1", port=port)),
        alerts=alerts,
    )


async def run_demo(
    seconds: float = 60.0,
    speed: float = 120.0,
    port: int = 9464,
    live: bool = True,
    state_dir: Path | None = None,
    history_hours: float | None = None,
    console: Console | None = None,
) -> int:
    """Run the demo for ``seconds`` of real time (0 = until interrupted). With ``state_dir`` the
    history is kept there (a weekly report can be made from it afterwards); ``history_hours`` of
    simulated history are prepared first (default :data:`HISTORY_SECONDS`). ``console``: where the view
    goes (``cli.py`` routes log lines through the same console, so they print above the live view)."""
    console = console or Console()
    if not console.is_terminal:
        console = Console(width=150)  # a file or a pipe has no width: room for every column
    # the story starts at 13:00 UTC today (simulated): afternoon traffic, the node busy
    day = dt.datetime.now(tz=dt.UTC).replace(hour=13, minute=0, second=0, microsecond=0)
    clock = AcceleratedClock(speed, start=day.timestamp())
    inbox = SlackInbox()
    await inbox.start()
    os.environ[DEMO_SLACK_ENV] = inbox.url
    keep = contextlib.nullcontext(str(state_dir)) if state_dir is not None else None
    with keep or tempfile.TemporaryDirectory(prefix="infercost-demo-") as tmp:
        state = Path(tmp)
        state.mkdir(parents=True, exist_ok=True)
        history_s = HISTORY_SECONDS if history_hours is None else history_hours * 3600.0
        sim = SimNode(clock, state / "podinfo")
        await sim.start()
        DEMO_STORY.schedule(sim, clock.now())
        cfg = demo_config(state, port, speed, slack=True)
        book = load_price_book(None)
        console.print(FIRST_SCREEN.format(story=DEMO_STORY.description), highlight=False)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            bar.add_task(
                f"preparing {history_s / 3600:.0f} h of simulated history for the baselines", total=None
            )
            agent = await build_demo_agent(cfg, clock, book, sim, history_s)
        console.print(f"prepared {history_s / 3600:.0f} h of simulated history for the baselines")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError):
            import signal

            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        task = asyncio.create_task(agent.run(stop))
        started = asyncio.create_task(agent.started.wait())
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        if not agent.started.is_set():  # it could not start (e.g. the port is busy): say why
            started.cancel()
            await sim.stop()
            await inbox.stop()
            task.result()  # raises the StartupError for cli.py
            return 1
        real_port = agent.prometheus.port if agent.prometheus else port
        console.print(
            f"running: metrics on http://127.0.0.1:{real_port}/metrics; Ctrl-C stops", highlight=False
        )
        deadline = loop.time() + seconds if seconds > 0 else None
        try:
            if live:
                with Live(console=console, refresh_per_second=2) as view:
                    while not stop.is_set() and (deadline is None or loop.time() < deadline):
                        view.update(render_view(agent.snapshot(), clock, inbox, real_port, console.width))
                        await asyncio.sleep(0.5)
            else:
                while not stop.is_set() and (deadline is None or loop.time() < deadline):
                    await asyncio.sleep(0.5)
                console.print(render_view(agent.snapshot(), clock, inbox, real_port, console.width))
        finally:
            stop.set()
            await task
            await sim.stop()
            await inbox.stop()
            if state_dir is not None:
                end = dt.datetime.fromtimestamp(clock.now(), tz=dt.UTC).strftime("%Y-%m-%dT%H:%MZ")
                console.print(f"history kept in {state_dir}; the week's report:")
                console.print(
                    f"  infercost report --state-dir {state_dir} --end {end} --format html "
                    "--output report.html",
                    soft_wrap=True,
                    highlight=False,
                )
    return 0


# What the viewer is about to see and where to look, before anything else is printed.
FIRST_SCREEN = (
    "[bold]infercost demo[/]: a simulated 8 × H100 node serving four models through the real agent; "
    "watch the [bold]$/1M out[/] column of the canary and the Slack panel below it. {story}"
)

# The demo tells the cost story: the cost and health rules. The latency and efficiency rules are
# off here because the demo's day of history is too short a baseline for them.
DEMO_RULES = frozenset(
    {
        "cost_per_token_regression",
        "cost_per_token_ceiling",
        "idle_cost_budget",
        "engine_down",
        "nvml_down",
        "gpu_lost",
    }
)
HISTORY_SECONDS = 27 * 3600.0  # simulated history before the demo starts (since 10:00 yesterday): baselines


async def build_demo_agent(
    cfg: Config,
    clock: AcceleratedClock,
    book: PriceBook,
    sim: SimNode,
    history_seconds: float = HISTORY_SECONDS,
) -> Agent:
    """The real daemon (:func:`agent.app.build_agent`) over the simulated node, its store filled with
    :data:`HISTORY_SECONDS` of simulated history and the pipeline running the cost rules."""
    from agent.detect.rules import RuleSet, load_default_rules
    from infercost_sim.history import backfill

    rules = load_default_rules()
    rules = RuleSet(tuple(r for r in rules if r.id in DEMO_RULES), rules.sources)
    agent = await build_agent(
        cfg, clock=clock, book=book, load=sim.gpu_load, engines=sim.engine_configs(), rules=rules
    )
    if agent.hooks.store is not None:
        now = clock.now()
        await asyncio.to_thread(backfill, agent.hooks.store, cfg.node, book, now - history_seconds, now)
    return agent
