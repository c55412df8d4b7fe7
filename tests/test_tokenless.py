"""An engine that exposes no token counter (a plain Triton serving a CPU Python model) has its tokens
ABSENT everywhere — on /metrics, in the store, in the report — while an engine that counts tokens
and made none in a minute reads 0 there. Its dollars stay present in both cases.

Two CPU-only engines priced by the hour go through the real window join, ledger, Prometheus
exposition, SQLite store and weekly report: ``plain`` (request and queue-time counters, no tokens)
and ``quiet`` (token counters that do not move, requests counted without their durations).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.clock import ManualClock
from agent.cost.inputs import EngineSpec, PriceTable
from agent.cost.window import TickResult, WindowJoiner
from agent.records import window_from_record
from agent.report.data import build_from_windows
from agent.report.render import render_csv, render_json, render_markdown
from agent.samples import CostWindow, EngineScrape, ModelSignals
from agent.sinks.prometheus import render
from agent.snapshot import Ledger
from agent.store import Store

T0 = 1_794_999_960.0  # epoch seconds, a minute boundary in the past (the cost API answers no future window)
TICK = 15.0  # seconds between ticks
TICKS = 8  # two minutes of windows
USD_PER_HOUR = 0.36  # dollars per hour of each CPU engine: 0.0015 $ per 15 s tick
REQUESTS_PER_TICK = 3.0  # successful requests the plain engine serves per tick
QUEUE_PER_REQUEST = 0.02  # seconds each waits in its queue
COMPUTE_PER_REQUEST = 0.05  # seconds of compute each


def _scrape(engine: str, i: int, model: ModelSignals) -> EngineScrape:
    return EngineScrape(engine, "triton", T0 + i * TICK, True, 0.01, (model,))


def _plain(i: int) -> ModelSignals:
    done = REQUESTS_PER_TICK * i
    return ModelSignals(
        "tiny",
        requests_waiting=0.0,
        requests_finished_total={"success": done, "failure": 0.0},
        queue_seconds_total=QUEUE_PER_REQUEST * done,
        compute_seconds_total=COMPUTE_PER_REQUEST * done,
        timed_requests_total=done,
    )


def _quiet(i: int) -> ModelSignals:
    # requests counted but no duration counters: its mean queue and compute times are absent, not 0
    return ModelSignals(
        "llm", prompt_tokens_total=1000.0, generation_tokens_total=400.0, timed_requests_total=2.0 * i
    )


@pytest.fixture(scope="module")
def windows() -> list[CostWindow]:
    prices = PriceTable(engines={"plain": USD_PER_HOUR, "quiet": USD_PER_HOUR}, source="test")
    joiner = WindowJoiner("n1", [EngineSpec("plain", "triton"), EngineSpec("quiet", "vllm")], prices)
    out: list[CostWindow] = []
    for i in range(TICKS + 1):
        scrapes = {"plain": _scrape("plain", i, _plain(i)), "quiet": _scrape("quiet", i, _quiet(i))}
        out += joiner.close_tick(T0 + i * TICK, scrapes).windows
    return out


def _by_engine(windows: list[CostWindow], engine: str) -> list[CostWindow]:
    return [w for w in windows if w.usage.engine == engine]


def test_the_window_join_tells_no_counter_from_no_tokens(windows: list[CostWindow]) -> None:
    plain, quiet = _by_engine(windows, "plain"), _by_engine(windows, "quiet")
    assert len(plain) == len(quiet) == TICKS
    assert all(not w.usage.tokens_counted for w in plain)
    assert all(w.usage.tokens_counted and w.usage.generation_tokens == 0.0 for w in quiet)
    for w in plain + quiet:
        assert w.cost_usd == pytest.approx(USD_PER_HOUR * TICK / 3600)  # dollars present for both
        assert w.usd_per_1m_output is None and w.usd_per_1m_total is None
    # the engine's own request-time counters, differenced like any counter
    for w in plain:
        assert w.usage.timed_requests == pytest.approx(REQUESTS_PER_TICK)
        assert w.usage.queue_seconds == pytest.approx(QUEUE_PER_REQUEST * REQUESTS_PER_TICK)
        assert w.usage.compute_seconds == pytest.approx(COMPUTE_PER_REQUEST * REQUESTS_PER_TICK)
    assert all(w.usage.timed_requests is None for w in quiet)


def _text(windows: list[CostWindow]) -> bytes:
    ledger = Ledger("n1", "test", trailing_seconds=60.0)
    for i in range(TICKS):
        mine = [w for w in windows if w.usage.start == T0 + i * TICK]
        ledger.apply(TickResult(T0 + i * TICK, T0 + (i + 1) * TICK, tuple(mine)))
    return render(ledger.snapshot(), process=False)


def _page(windows: list[CostWindow]) -> dict[tuple[str, str], float]:
    text = _text(windows).decode()
    return {
        (s.name, s.labels["engine"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if "engine" in s.labels and "model" in s.labels
    }


def test_metrics_carry_no_token_series_for_the_tokenless_engine(windows: list[CostWindow]) -> None:
    page = _page(windows)
    tokenish = ("_tokens_", "usd_per_1m_")
    plain = {name for name, engine in page if engine == "plain"}
    assert not [n for n in plain if any(t in n for t in tokenish)], plain
    # the quiet engine counts tokens: they read 0 (present); its $/1M stays absent (no tokens)
    assert page[("infercost_generation_tokens_total", "quiet")] == 0.0
    assert page[("infercost_prompt_tokens_total", "quiet")] == 0.0
    assert page[("infercost_generation_tokens_per_second", "quiet")] == 0.0
    assert ("infercost_usd_per_1m_output_tokens", "quiet") not in page
    for engine in ("plain", "quiet"):  # dollars present for both
        assert page[("infercost_cost_usd_total", engine)] == pytest.approx(USD_PER_HOUR * TICK * TICKS / 3600)
    # the mean queue and compute time per request over the trailing minute, for the engine that
    # has the counters only
    assert page[("infercost_queue_seconds_per_request", "plain")] == pytest.approx(QUEUE_PER_REQUEST)
    assert page[("infercost_compute_seconds_per_request", "plain")] == pytest.approx(COMPUTE_PER_REQUEST)
    assert ("infercost_queue_seconds_per_request", "quiet") not in page


def test_promtool_accepts_the_page(windows: list[CostWindow]) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: .ci/run installs the Debian 'prometheus' package"
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=_text(windows), capture_output=True, timeout=30
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_the_store_keeps_the_difference(windows: list[CostWindow], tmp_path: Path) -> None:
    store = Store(tmp_path / "history.sqlite", clock=ManualClock(start=T0 + TICKS * TICK))
    store.write_windows(windows)
    records = store.records(T0, T0 + TICKS * TICK, kinds=("model",))
    store.close()
    assert len(records) == 4  # two minutes × two engines
    for r in records:
        w = window_from_record(r)
        if r.label("engine") == "plain":
            assert not w.usage.tokens_counted and r.sums["tokenless_seconds"] == pytest.approx(60.0)
            assert r.sums["timed_requests"] == pytest.approx(4 * REQUESTS_PER_TICK)
            assert r.sums["request_queue_seconds"] == pytest.approx(4 * REQUESTS_PER_TICK * QUEUE_PER_REQUEST)
        else:
            assert w.usage.tokens_counted and w.usage.generation_tokens == 0.0
            assert r.sums["tokenless_seconds"] == 0.0 and w.usage.timed_requests is None
        assert w.cost_usd == pytest.approx(USD_PER_HOUR * 60 / 3600)


def test_the_report_shows_absent_tokens_as_absent(windows: list[CostWindow]) -> None:
    rep = build_from_windows(windows, end=T0 + 3600.0)
    weeks = {m.model: m for m in rep.models}
    assert not weeks["tiny"].tokens_counted and weeks["llm"].tokens_counted
    assert weeks["tiny"].cost_usd == pytest.approx(weeks["llm"].cost_usd)
    data = {m["model"]: m for m in json.loads(render_json(rep))["models"]}
    assert data["tiny"]["output_tokens"] is None and data["tiny"]["prompt_tokens"] is None
    assert data["llm"]["output_tokens"] == 0.0
    md = render_markdown(rep)
    tiny = next(line for line in md.splitlines() if line.startswith("| tiny |"))
    llm = next(line for line in md.splitlines() if line.startswith("| llm |"))
    assert tiny.split("|")[4].strip() == "—" and llm.split("|")[4].strip() == "0"
    rows = {line.split(",")[0]: line.split(",") for line in render_csv(rep).splitlines()}
    assert rows["tiny"][3:5] == ["", ""] and rows["llm"][3:5] == ["0", "0"]


def test_the_cost_api_shows_absent_tokens_as_null(windows: list[CostWindow], tmp_path: Path) -> None:
    store = Store(tmp_path / "history.sqlite", clock=ManualClock(start=T0 + TICKS * TICK))
    store.write_windows(windows)
    store.close()
    window = f"{T0:.0f},{T0 + TICKS * TICK:.0f}"
    query = [sys.executable, "-m", "agent.cli", "query", "--state-dir", str(tmp_path), "--window", window]
    out = subprocess.run([*query, "--aggregate", "engine"], capture_output=True, text=True, check=True)
    items = {it["key"]["engine"]: it for it in json.loads(out.stdout)["items"]}
    assert items["plain"]["costUsd"] == pytest.approx(USD_PER_HOUR * TICKS * TICK / 3600)
    assert items["plain"]["outputTokens"] is None and items["plain"]["promptTokens"] is None
    assert items["plain"]["usdPer1MOutputTokens"] is None
    assert items["quiet"]["outputTokens"] == 0.0 and items["quiet"]["promptTokens"] == 0.0
    # a group holding both has its tokens counted: the counting engine's zero is a figure
    both = subprocess.run([*query, "--aggregate", "node"], capture_output=True, text=True, check=True)
    (item,) = json.loads(both.stdout)["items"]
    assert item["outputTokens"] == 0.0
    table = subprocess.run(
        [*query, "--aggregate", "engine", "--format", "table"], capture_output=True, text=True, check=True
    ).stdout
    plain = next(line.split() for line in table.splitlines() if line.startswith("plain"))
    assert plain[3:5] == ["-", "-"]
