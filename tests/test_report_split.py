"""The weekly report: prompt vs output dollars, allocation − usage as waste and the cost
floor's possible saving, from the local store (real SQLite, aggregated in SQL) and from a real
Prometheus holding the same traffic as the agents' counters. Both paths must give the hand figures.

The scenario (two weeks ending at T, every rate constant):
  node-a e1 llama-70b v1  $2/h, 200 output tok/s (720,000/h), 400 prompt tok/s (1,440,000/h);
                          prefill is a quarter of the phase time: prompt $0.50/h; GPUs busy 75 %:
                          usage $1.50/h; prefix cache saved $0.10/h; floor $0.80 per 1M output at the
                          running batch, $0.25 at the largest batch the KV cache holds.
  node-b e2 qwen-7b   v1  $1/h, 100 output tok/s (360,000/h), 10 prompt tok/s; no phase times, no
                          usage figure, no floor (the engine and GPU say nothing of them).
This week (168 h), by hand:
  llama: cost $336; prompt $84, output $252 (= 336 − 84); 241.92 M prompt tokens → $0.3472 per 1M;
         decode $252 / 120.96 M output tokens → $2.0833 per 1M (all-in $336 / 120.96 M = $2.7778);
         usage $252, waste $84; cache saved $16.80; floor $0.80 × 120.96 M = $96.768 → saving
         $239.232; at the largest batch $0.25 × 120.96 = $30.24 → saving $305.76.
  qwen:  cost $168, prompt $0, output $168 (no split: all of it counts as output), no $/1M prompt,
         no waste figure, no floor.
  all:   cost $504 = prompt $84 + output $420; waste $84; floor $0.80 per 1M (over the tokens that
         have one); saving $239.232 ($305.76 at the largest batch).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from promstack import Prometheus, backfilled_prometheus

from agent.clock import ManualClock
from agent.report.data import WeeklyReport, build_from_store, build_from_windows
from agent.report.prom import build_from_prometheus
from agent.report.render import render_csv, render_html, render_json, render_markdown, render_slack
from agent.samples import CostWindow, UsageWindow
from agent.store import Store

HOUR = 3600.0
WEEK = 7 * 86400.0
T = math.floor(time.time() / HOUR) * HOUR - HOUR  # report end: an hour boundary in the recent past
STEP = 600.0  # seconds per window and between backfilled samples


@dataclass(frozen=True)
class Run:
    """One model version's constant traffic and where its dollars go (None: not known)."""

    node: str
    engine: str
    model: str
    usd_per_hour: float
    out_tps: float  # output tokens per second
    prompt_tps: float  # prompt tokens per second
    prompt_usd_per_hour: float | None
    usage_usd_per_hour: float | None
    cache_saved_usd_per_hour: float | None
    floor: float | None  # dollars per 1M output tokens, running batch
    floor_max: float | None  # at the largest batch


RUNS = (
    Run("node-a", "e1", "llama-70b", 2.0, 200, 400, 0.5, 1.5, 0.1, 0.8, 0.25),
    Run("node-b", "e2", "qwen-7b", 1.0, 100, 10, None, None, None, None, None),
)


def windows() -> list[CostWindow]:
    """10-minute cost windows of the scenario over both weeks."""
    out = []
    f = STEP / HOUR
    for r in RUNS:
        for i in range(int(2 * WEEK / STEP)):
            start = T - 2 * WEEK + i * STEP
            gen, prompt = r.out_tps * STEP, r.prompt_tps * STEP
            split = r.prompt_usd_per_hour is not None
            u = UsageWindow(
                r.node,
                r.engine,
                r.model,
                "v1",
                start,
                start + STEP,
                prompt_tokens=prompt,
                generation_tokens=gen,
                gpu_seconds=STEP,
                energy_joules=None,
                prefill_seconds=150.0 if split else None,
                decode_seconds=450.0 if split else None,
            )
            cost = r.usd_per_hour * f
            out.append(
                CostWindow(
                    u,
                    gpu_time_usd=cost,
                    energy_usd=0.0,
                    usd_per_1m_output=cost / gen * 1e6,
                    usd_per_1m_total=cost / (gen + prompt) * 1e6,
                    idle_usd=0.0,
                    prompt_usd=None if r.prompt_usd_per_hour is None else r.prompt_usd_per_hour * f,
                    usage_usd=None if r.usage_usd_per_hour is None else r.usage_usd_per_hour * f,
                    prefix_cache_saved_usd=(
                        None if r.cache_saved_usd_per_hour is None else r.cache_saved_usd_per_hour * f
                    ),
                    floor_usd_per_1m_output=r.floor,
                    floor_usd_per_1m_output_max_batch=r.floor_max,
                )
            )
    return out


def openmetrics() -> str:
    """The same traffic as the agents' series, sampled every 10 minutes over 15 days."""
    t0 = T - 15 * 86400
    times = [t0 + i * STEP for i in range(int(15 * 86400 / STEP) + 1)]
    families: dict[str, list[str]] = {}
    for r in RUNS:
        lbl = f'node="{r.node}",engine="{r.engine}",model="{r.model}",model_version="v1"'
        counters = {
            "infercost_cost_usd_total": r.usd_per_hour / HOUR,
            "infercost_generation_tokens_total": float(r.out_tps),
            "infercost_prompt_tokens_total": float(r.prompt_tps),
            "infercost_idle_cost_usd_total": 0.0,
            "infercost_prompt_cost_usd_total": None
            if r.prompt_usd_per_hour is None
            else r.prompt_usd_per_hour / HOUR,
            "infercost_usage_cost_usd_total": None
            if r.usage_usd_per_hour is None
            else r.usage_usd_per_hour / HOUR,
            "infercost_prefix_cache_saved_usd_total": (
                None if r.cache_saved_usd_per_hour is None else r.cache_saved_usd_per_hour / HOUR
            ),
        }
        gauges = {
            "infercost_usd_per_1m_output_tokens_floor": r.floor,
            "infercost_usd_per_1m_output_tokens_floor_max_batch": r.floor_max,
        }
        for name, rate in counters.items():
            if rate is not None:
                families.setdefault(name, []).extend(
                    f"{name}{{{lbl}}} {rate * (t - t0)} {t:.0f}" for t in times
                )
        for name, v in gauges.items():
            if v is not None:
                families.setdefault(name, []).extend(f"{name}{{{lbl}}} {v} {t:.0f}" for t in times)
    out = []
    for name, lines in families.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        out.append(f"# TYPE {name.removesuffix('_total')} {kind}")
        out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"


def check(rep: WeeklyReport) -> None:
    """The hand figures (module docstring) that every data path must give."""
    by = {m.model: m for m in rep.models}
    llama, qwen = by["llama-70b"].dollars, by["qwen-7b"].dollars
    assert llama.cost_usd == pytest.approx(336.0)
    assert llama.prompt_usd == pytest.approx(84.0) and llama.output_usd == pytest.approx(252.0)
    assert llama.usd_per_1m_prompt == pytest.approx(84 / 241.92)
    assert llama.usd_per_1m_output_decode == pytest.approx(252 / 120.96)
    assert by["llama-70b"].usd_per_1m_output == pytest.approx(336 / 120.96)  # all-in, unchanged
    assert llama.split_share == pytest.approx(1.0)
    assert llama.usage_usd == pytest.approx(252.0) and llama.waste_usd == pytest.approx(84.0)
    assert llama.cache_saved_usd == pytest.approx(16.8)
    assert llama.floor_usd_per_1m == pytest.approx(0.8) and llama.floor_max_batch_usd_per_1m == pytest.approx(
        0.25
    )
    assert llama.floor_saving_usd == pytest.approx(336 - 96.768)
    assert llama.floor_max_batch_saving_usd == pytest.approx(336 - 30.24)
    assert by["llama-70b"].cost_floor_usd_per_1m == pytest.approx(0.8)
    # no phase times, usage or floor: all of it is output; the rest is absent, not $0
    assert qwen.prompt_usd == 0.0 and qwen.output_usd == pytest.approx(168.0)
    assert qwen.usd_per_1m_prompt is None and qwen.usd_per_1m_output_decode is None
    assert qwen.split_share == 0.0
    assert qwen.waste_usd is None and qwen.usage_usd is None
    assert qwen.floor_usd_per_1m is None and qwen.floor_saving_usd is None
    assert by["qwen-7b"].cost_floor_usd_per_1m is None
    total = rep.dollars
    assert total.cost_usd == pytest.approx(504.0) == pytest.approx(rep.total_usd)
    assert total.prompt_usd == pytest.approx(84.0) and total.output_usd == pytest.approx(420.0)
    assert total.split_share == pytest.approx(336 / 504)
    assert total.waste_usd == pytest.approx(84.0)
    assert total.floor_usd_per_1m == pytest.approx(0.8)
    assert total.floor_saving_usd == pytest.approx(239.232)
    assert total.floor_max_batch_saving_usd == pytest.approx(305.76)
    # conservation: prompt $ + output $ = model $, per version and in total
    for m in rep.models:
        d = m.dollars
        assert d.prompt_usd + d.output_usd + d.idle_usd == pytest.approx(m.cost_usd)
    assert total.prompt_usd + total.output_usd + total.idle_usd == pytest.approx(total.cost_usd)


def test_from_windows() -> None:
    check(build_from_windows(windows(), end=T))


def test_from_the_store(tmp_path: Path) -> None:
    p = tmp_path / "history.sqlite"
    st = Store(p, 35, ManualClock(T))
    st.write_windows(windows())
    st.close()
    check(build_from_store(p, end=T))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with backfilled_prometheus(tmp_path_factory.mktemp("report_split"), openmetrics()) as prom:
        yield prom


def test_from_prometheus(prometheus: Prometheus) -> None:
    check(build_from_prometheus(prometheus.url, end=T))


def test_markdown_csv_json_and_html() -> None:
    rep = build_from_windows(windows(), end=T)
    md = render_markdown(rep)
    assert "## Where the dollars went" in md
    assert (
        "Prompt $84.00 (16.7 %), output $420.00, idle $0.00; waste (allocation − usage) $84.00; the prefix "
        "cache saved "
        "$16.80; at the cost floor "
        "the same output tokens would cost $239.23 less "
        "($305.76 less at the largest batch the KV cache holds)."
    ) in md
    assert (
        "| llama-70b | v1 | $336.00 | $84.00 | $252.00 | $0.00 | $0.3472 | $2.0833 | $84.00 | $2.7778 "
        "| $0.8000 | $0.2500 | $239.23 | $305.76 |"
    ) in md
    assert "| qwen-7b | v1 | $168.00 | $0.00 | $168.00 | $0.00 | — | — | — | $2.7778 | — | — | — | — |" in md
    assert (
        "| (all) | | $504.00 | $84.00 | $420.00 | $0.00 | $0.3472 | $2.0833 | $84.00 | $2.7778 | $0.8000"
        in md
    )
    rows = {r["model"]: r for r in csv.DictReader(io.StringIO(render_csv(rep)))}
    assert float(rows["llama-70b"]["prompt_usd"]) == pytest.approx(84.0)
    assert float(rows["llama-70b"]["waste_usd"]) == pytest.approx(84.0)
    assert float(rows["llama-70b"]["floor_saving_usd"]) == pytest.approx(239.232)
    assert rows["qwen-7b"]["waste_usd"] == "" and rows["qwen-7b"]["usd_per_1m_prompt"] == ""
    assert float(rows["(all)"]["output_usd"]) == pytest.approx(420.0)
    assert float(rows["(all)"]["floor_max_batch_saving_usd"]) == pytest.approx(305.76)
    data = json.loads(render_json(rep))
    assert data["dollars"]["waste_usd"] == pytest.approx(84.0)
    llama = next(m for m in data["models"] if m["model"] == "llama-70b")
    assert llama["dollars"]["usd_per_1m_prompt"] == pytest.approx(84 / 241.92)
    assert "Prompt $84.00 (16.7 %), output $420.00, idle $0.00; waste (allocation − usage) $84.00" in (
        render_slack(rep)
    )
    page = render_html(rep)
    assert "<h2>Where the dollars went</h2>" in page and "$239.23" in page and "$305.76" in page


# ---------------------------------------------------------------------------------------------
# Through the real window join: engine counters and an NVML reading → store → weekly report
# ---------------------------------------------------------------------------------------------


def test_the_real_join_to_the_report_by_hand(tmp_path: Path) -> None:
    """One H100 at $3.60/h, 60 % busy, serving 70B fp16 (140 GB of weights, 320 KiB of KV per token,
    400,000 tokens of KV cache). Each 600 s tick: 240,000 prompt and 120,000 output tokens (200
    tok/s), 3,200 s of prefill and 9,600 s of decode request time (16 sequences decoding all tick: a
    coarse window's batch is read from that counter), 16 sequences running, the KV cache a quarter full.

    Per tick $0.60: prompt $0.15 (3,200 / 12,800 of the phase time), output $0.45; $0.625 per 1M prompt
    tokens, $3.75 per 1M output of decode; usage $0.36 (60 % busy), waste $0.24.
    Floor: a step reads 140e9 + 100,000 × 327,680 bytes at 3.35 TB/s = 51.5725 ms for 16 tokens:
    $0.001/s × 0.0515725 / 16 × 1e6 = $3.2233 per 1M (a ceiling of 310 tok/s); the 120,000 tokens at
    the floor cost $0.38679, a saving of $0.21321 a tick. Full cache: 64 sequences (400,000 ÷ 6,250
    tokens each), a step of (140e9 + 400,000 × 327,680) / 3.35e12 = 80.917 ms: $1.2643 per 1M, a
    saving of 0.60 − 0.12 × 1.2643 = $0.44828 a tick.
    """
    from agent.cost.inputs import EngineSpec, GpuRate, PriceTable
    from agent.cost.window import WindowJoiner
    from agent.samples import EngineScrape, GpuSample, ModelSignals, NvmlRound

    end = T
    start = end - 86400.0
    spec = EngineSpec(
        "a", gpus=(0,), model_version="v1", weights_bytes=140e9, kv_bytes_per_token=327_680,
        kv_capacity_tokens=400_000,
    )  # fmt: skip
    j = WindowJoiner("n1", (spec,), PriceTable(gpus=(GpuRate("H100", 3.6),)))
    st = Store(tmp_path / "h.sqlite", 35, ManualClock(end))
    ticks = 144  # a day; the first round only starts the first tick
    for k in range(ticks + 1):
        t = start + k * STEP
        gpu = GpuSample(0, "GPU-0", "NVIDIA H100 80GB HBM3", t, util_gpu_ratio=0.6)
        j.add_round(NvmlRound(t, True, (gpu,)))
        page = ModelSignals(
            "llama-70b",
            prompt_tokens_total=240_000.0 * k,
            generation_tokens_total=120_000.0 * k,
            prefill_seconds_total=3200.0 * k,
            decode_seconds_total=9600.0 * k,
            requests_running=16.0,
            kv_cache_usage_ratio=0.25,
        )
        tick = j.close_tick(t, {"a": EngineScrape("a", "vllm", t, True, 0.01, (page,))})
        st.write_windows(list(tick.windows))
    st.close()
    rep = build_from_store(tmp_path / "h.sqlite", end=end)
    (m,) = rep.models
    d = m.dollars
    assert m.cost_usd == pytest.approx(ticks * 0.6) and m.output_tokens == pytest.approx(ticks * 120_000)
    assert d.prompt_usd == pytest.approx(ticks * 0.15) and d.output_usd == pytest.approx(ticks * 0.45)
    assert d.prompt_usd + d.output_usd + d.idle_usd == pytest.approx(m.cost_usd)  # conservation
    assert d.usd_per_1m_prompt == pytest.approx(0.625)
    assert d.usd_per_1m_output_decode == pytest.approx(3.75)
    assert d.usage_usd == pytest.approx(ticks * 0.36) and d.waste_usd == pytest.approx(ticks * 0.24)
    assert d.floor_usd_per_1m == pytest.approx(0.001 * (140e9 + 100_000 * 327_680) / 3.35e12 / 16 * 1e6)
    assert d.floor_usd_per_1m == pytest.approx(3.2233, rel=1e-4)
    assert d.floor_max_batch_usd_per_1m == pytest.approx(1.2643, rel=1e-4)
    assert d.floor_saving_usd == pytest.approx(ticks * 0.21321, rel=1e-4)
    assert d.floor_max_batch_saving_usd == pytest.approx(ticks * 0.44828, rel=1e-4)
