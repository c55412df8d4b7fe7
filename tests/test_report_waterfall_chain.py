"""The weekly report's factor waterfall reads its minutes' factor chain (agent.cost.explain.chain_sums),
as ``infercost explain --state-dir`` does: on bursty minutes (a busy minute of 96 sequences and long
prompts among quiet ones of 4, within every hour) the report's week-over-week split of each model,
and of the total, is the command's for the same two weeks of the same real SQLite store, term by
term, where the hours' gauge means the report used to multiply miss it by whole percents. From a
real Prometheus holding the same minutes as the agent exports them, the report's split is the
command's ``--prometheus`` split (each hour one window, prefill's share read for mix in both)."""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from promstack import Prometheus, backfilled_prometheus, openmetrics_of
from test_explain import sums_of
from test_explain_chain import DAY, NIGHT

from agent.cli import main
from agent.clock import ManualClock
from agent.cost.explain import CHAIN, Split, factors_of
from agent.detect.explain import total
from agent.explain import explain_times, store_reader, to_json
from agent.records import mean_of
from agent.report.data import build_from_store
from agent.report.prom import build_from_prometheus
from agent.report.waterfall import TOTAL
from agent.store import ModelSpan, Store

WEEK = 7 * 86400.0
END = 1700438400.0  # a Monday 00:00 UTC
HOURS = (2, 9, 14, 15, 20, 23)  # the hours of each day-one of a week that carry traffic


def minutes(model: str, engine: str, this_week: bool, end: float = END) -> list[ModelSpan]:
    """One week of a model's minutes: in each traffic hour a busy minute every ``k`` among quiet ones
    (``k`` 3 last week, 2 this week: the load mix moves); this week ``m1``'s steps run 1.4× longer
    and ``m2``'s GPUs cost 1.3× as much."""
    start = end - (WEEK if this_week else 2 * WEEK)
    every = 2 if this_week else 3
    slower = 1.4 if this_week and model == "m1" else 1.0
    pricier = 1.3 if this_week and model == "m2" else 1.0
    out = []
    for h in HOURS:
        for j in range(60):
            x = DAY if j % every == 0 else NIGHT
            x = replace(
                x, step_seconds=x.step_seconds * slower, usd_per_gpu_hour=x.usd_per_gpu_hour * pricier
            )
            t = start + h * 3600.0 + j * 60.0
            out.append(ModelSpan("n1", engine, model, "v1", t, t + 60.0, sums_of(x)))
    return out


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("report-chain")
    st = Store(d / "history.sqlite", 35, ManualClock(END))
    for model, engine in (("m1", "e1"), ("m2", "e2")):
        st.write_spans(minutes(model, engine, False) + minutes(model, engine, True))
    st.close()
    return d


def cli_json(capsys: pytest.CaptureFixture[str], source: list[str], model: str, end: float = END) -> dict:
    argv = ["explain", *source, "--model", model, "--format", "json"]
    assert main([*argv, "--from", str(end - 2 * WEEK), "--to", str(end - WEEK), "--window", "7d"]) == 0
    return json.loads(capsys.readouterr().out)


def same(report: dict, cli: dict) -> None:
    """The report's split is the command's, term by term, to 1e-9 of the levels."""
    scale = abs(cli["before_usd_per_1m"]) + abs(cli["after_usd_per_1m"])
    for k in ("before_usd_per_1m", "after_usd_per_1m", "total_usd_per_1m"):
        assert report[k] == pytest.approx(cli[k], rel=1e-9)
    got = {f["name"]: f["usd_per_1m"] for f in report["factors"]}
    want = {f["name"]: f["usd_per_1m"] for f in cli["factors"]}
    assert set(got) == set(want)
    for name, usd in want.items():
        assert got[name] == pytest.approx(usd, rel=1e-9, abs=1e-9 * scale), name
    for side in ("before", "after"):
        assert report["closure_gap"][side] == pytest.approx(cli["closure_gap"][side], rel=1e-9, abs=1e-12)


def as_json(s: Split) -> dict:
    """A split in the command's JSON names (agent.explain.to_json)."""
    return {
        "before_usd_per_1m": s.before_usd_per_1m,
        "after_usd_per_1m": s.after_usd_per_1m,
        "total_usd_per_1m": s.total_usd_per_1m,
        "factors": [{"name": t.name, "usd_per_1m": t.usd_per_1m} for t in s.terms],
        "closure_gap": {"before": s.closure_gap_before, "after": s.closure_gap_after},
    }


def test_the_reports_waterfall_is_the_commands(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rep = build_from_store(state_dir / "history.sqlite", end=END)
    by = {w.model: w.split for w in rep.waterfalls}
    assert set(by) == {"m1", "m2", TOTAL}
    for model in ("m1", "m2"):
        same(as_json(by[model]), cli_json(capsys, ["--state-dir", str(state_dir)], model))
    # the total: every model's minutes, as the command's reader gives them without a model
    read, close = store_reader(state_dir, {})
    try:
        everything = to_json(explain_times(read, END - 2 * WEEK, END - WEEK, WEEK))
    finally:
        close()
    same(as_json(by[TOTAL]), everything)


def test_the_minutes_are_bursty_enough_to_tell(state_dir: Path) -> None:
    """The same week read as one window (the gauges' means, as the report summed its hours) misses the
    measured $/token by more than a percent, where the minutes' chain closes on it."""
    read, close = store_reader(state_dir, {"model": "m1"})
    try:
        week = total(read(END - WEEK, END))
    finally:
        close()
    chained = factors_of(week).closure_gap
    means = factors_of({k: v for k, v in week.items() if not k.startswith(CHAIN)}).closure_gap
    assert chained is not None and abs(chained) < 1e-9
    assert means is not None and abs(means) > 0.01


# -- the same minutes from a real Prometheus -------------------------------------------------------

RECENT_END = math.floor(time.time() / 3600.0) * 3600.0 - 3600.0  # recent, so Prometheus keeps it
COUNTERS = {
    "infercost_cost_usd_total": "cost_usd",
    "infercost_generation_tokens_total": "generation_tokens",
    "infercost_gpu_seconds_total": "gpu_seconds",
    "infercost_usage_cost_usd_total": "usage_usd",
}
GAUGES = {
    "infercost_roofline_efficiency_ratio": "roofline",
    "infercost_prefill_share_ratio": "prefill_share",
    "infercost_prefill_share_floor_ratio": "prefill_floor",
    "infercost_requests_running": "running",
}


def openmetrics(spans: list[ModelSpan]) -> str:
    """The minutes as the agent exports them: cumulative counters and each minute's gauges, sampled
    at the minute's end."""
    families: dict[str, list[str]] = defaultdict(list)
    acc: dict[tuple[str, str], float] = defaultdict(float)
    for sp in sorted(spans, key=lambda sp: sp.start):
        lbl = f'node="{sp.node}",engine="{sp.engine}",model="{sp.model}",model_version="{sp.model_version}"'
        t = f"{sp.end:.0f}"
        for name, key in COUNTERS.items():
            acc[(lbl, name)] += sp.sums[key]
            families[name].append(f"{name}{{{lbl}}} {acc[(lbl, name)]!r} {t}")
        gauges = {name: mean_of(sp.sums, key) for name, key in GAUGES.items()}
        gauges["infercost_usd_per_1m_output_tokens_floor"] = (
            sp.sums["floor_usd"] / sp.sums["floor_tokens"] * 1e6
        )
        for name, g in gauges.items():
            families[name].append(f"{name}{{{lbl}}} {g!r} {t}")
    return openmetrics_of(families)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    spans = [sp for week in (False, True) for sp in minutes("m1", "e1", week, RECENT_END)]
    with backfilled_prometheus(tmp_path_factory.mktemp("report-chain-prom"), openmetrics(spans)) as prom:
        yield prom


def test_from_prometheus_the_reports_waterfall_is_the_commands(
    prometheus: Prometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    rep = build_from_prometheus(prometheus.url, end=RECENT_END)
    by = {w.model: w.split for w in rep.waterfalls}
    assert set(by) == {"m1", TOTAL}
    cli = cli_json(capsys, ["--prometheus", prometheus.url], "m1", RECENT_END)
    assert not cli["merged"]  # prefill's share read: mix and step efficiency each their own term
    same(as_json(by["m1"]), cli)
