"""The weekly report: where GPU time goes (compute, memory, communication, idle), per
model version and for the week, from the local store (real SQLite, summed in SQL) and from a real
Prometheus holding the same traffic as the agents' counters. Both paths must give the hand figures.

The scenario (two weeks ending at T, 10-minute windows, every rate constant):
  node-a e1 llama-70b v1    1 GPU at $2/h; every window split 0.5 compute, 0.3 memory,
                            0.1 communication, 0.1 idle.
  node-b e2 qwen-7b   v1    1 GPU at $1/h; no GPM: never a split (absent, not zero).
  node-c e3 mistral-7b v1   2 GPUs at $0.50/h each ($1/h); every other window split 0.2 compute,
                            0.6 memory, 0 communication, 0.2 idle; the rest without a split.
This week (168 h), by hand:
  llama:   $336, 604,800 GPU-s; covered wholly: compute $168, memory $100.80, communication
           $33.60, idle $33.60; time shares 50 / 30 / 10 / 10 %, coverage 100 %.
  qwen:    $168, no split: shares absent, coverage 0 %.
  mistral: $168, 1,209,600 GPU-s; half covered ($84, 604,800 GPU-s): compute $16.80, memory
           $50.40, communication $0, idle $16.80; shares 20 / 60 / 0 / 20 %, coverage 50 %.
  all:     $672; covered $420 (coverage 62.5 %): compute $184.80 (44 %), memory $151.20 (36 %),
           communication $33.60 (8 %), idle $50.40 (12 %); GPU time covered 1,209,600 s:
           compute 423,360 (35 %), memory 544,320 (45 %), communication 60,480 (5 %), idle 181,440
           (15 %). Time and dollar shares differ because llama's GPU-second costs 4× mistral's.
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
from agent.cost.bound import BOUNDS
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
    """One model version's constant traffic and where its GPU time goes (None: no GPM)."""

    node: str
    engine: str
    model: str
    usd_per_hour: float
    gpus: int
    shares: tuple[float, float, float, float] | None  # compute, memory, communication, idle
    every: int  # a split in one window of `every` (1: all)


RUNS = (
    Run("node-a", "e1", "llama-70b", 2.0, 1, (0.5, 0.3, 0.1, 0.1), 1),
    Run("node-b", "e2", "qwen-7b", 1.0, 1, None, 1),
    Run("node-c", "e3", "mistral-7b", 1.0, 2, (0.2, 0.6, 0.0, 0.2), 2),
)


def split_in(r: Run, i: int) -> bool:
    return r.shares is not None and i % r.every == 0


def windows() -> list[CostWindow]:
    """10-minute cost windows of the scenario over both weeks."""
    out = []
    for r in RUNS:
        cost, gpu_s = r.usd_per_hour * STEP / HOUR, r.gpus * STEP
        for i in range(int(2 * WEEK / STEP)):
            start = T - 2 * WEEK + i * STEP
            u = UsageWindow(
                r.node, r.engine, r.model, "v1", start, start + STEP,
                prompt_tokens=1000.0, generation_tokens=1000.0, gpu_seconds=gpu_s, energy_joules=None,
            )  # fmt: skip
            sh = dict(zip(BOUNDS, r.shares, strict=True)) if split_in(r, i) and r.shares else None
            out.append(
                CostWindow(
                    u,
                    gpu_time_usd=cost,
                    energy_usd=0.0,
                    usd_per_1m_output=cost / 1000 * 1e6,
                    usd_per_1m_total=cost / 2000 * 1e6,
                    idle_usd=0.0,
                    bound_gpu_seconds=None if sh is None else {b: gpu_s * v for b, v in sh.items()},
                    bound_usd=None if sh is None else {b: cost * v for b, v in sh.items()},
                )
            )
    return out


def openmetrics() -> str:
    """The same traffic as the agents' counters, sampled every 10 minutes over 15 days (a counter
    at t holds every window that ended by t)."""
    t0 = T - 15 * 86400
    n = int(15 * 86400 / STEP)
    families: dict[str, list[str]] = {}
    for r in RUNS:
        lbl = f'node="{r.node}",engine="{r.engine}",model="{r.model}",model_version="v1"'
        cost, gpu_s = r.usd_per_hour * STEP / HOUR, r.gpus * STEP
        acc = {
            "cost": 0.0,
            "gpu": 0.0,
            "tok": 0.0,
            **{f"s_{b}": 0.0 for b in BOUNDS},
            **{f"u_{b}": 0.0 for b in BOUNDS},
        }
        for k in range(n + 1):
            t = t0 + k * STEP
            if k > 0:  # the window [t − STEP, t), numbered as windows() numbers it
                i = round((t - STEP - (T - 2 * WEEK)) / STEP)
                acc["cost"] += cost
                acc["gpu"] += gpu_s
                acc["tok"] += 1000.0
                if split_in(r, i) and r.shares:
                    for b, v in zip(BOUNDS, r.shares, strict=True):
                        acc[f"s_{b}"] += gpu_s * v
                        acc[f"u_{b}"] += cost * v
            for name, key in (
                ("infercost_cost_usd_total", "cost"),
                ("infercost_gpu_seconds_total", "gpu"),
                ("infercost_generation_tokens_total", "tok"),
                ("infercost_prompt_tokens_total", "tok"),
                ("infercost_idle_cost_usd_total", None),
            ):
                families.setdefault(name, []).append(f"{name}{{{lbl}}} {acc[key] if key else 0.0} {t:.0f}")
            if r.shares is None:
                continue  # no GPM: the agent exports no bound series at all
            for b in BOUNDS:
                for name, key in (
                    ("infercost_gpu_time_bound_seconds_total", f"s_{b}"),
                    ("infercost_cost_bound_usd_total", f"u_{b}"),
                ):
                    families.setdefault(name, []).append(f'{name}{{{lbl},bound="{b}"}} {acc[key]} {t:.0f}')
    out = []
    for name, lines in families.items():
        out.append(f"# TYPE {name.removesuffix('_total')} counter")
        out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"


def check(rep: WeeklyReport) -> None:
    """The hand figures (module docstring) that every data path must give."""
    by = {m.model: m.gpu_time for m in rep.models}
    llama, qwen, mistral = by["llama-70b"], by["qwen-7b"], by["mistral-7b"]
    assert llama.cost_usd == pytest.approx(336.0) and llama.gpu_seconds == pytest.approx(604_800)
    assert llama.usd == pytest.approx(
        {"compute": 168.0, "memory": 100.8, "communication": 33.6, "idle": 33.6}
    )
    assert llama.time_share == pytest.approx(
        {"compute": 0.5, "memory": 0.3, "communication": 0.1, "idle": 0.1}
    )
    assert llama.usd_coverage == pytest.approx(1.0) and llama.gpu_time_coverage == pytest.approx(1.0)
    # no GPM: absent, not zero
    assert qwen.usd is None and qwen.time_share is None and qwen.usd_share is None
    assert qwen.usd_coverage == 0.0 and qwen.covered_usd == 0.0
    assert mistral.cost_usd == pytest.approx(168.0) and mistral.covered_usd == pytest.approx(84.0)
    assert mistral.usd_coverage == pytest.approx(0.5) and mistral.gpu_time_coverage == pytest.approx(0.5)
    assert mistral.covered_gpu_seconds == pytest.approx(604_800)
    assert mistral.usd == pytest.approx({"compute": 16.8, "memory": 50.4, "communication": 0.0, "idle": 16.8})
    assert mistral.usd_share == pytest.approx(
        {"compute": 0.2, "memory": 0.6, "communication": 0.0, "idle": 0.2}
    )
    g = rep.gpu_time
    assert g.cost_usd == pytest.approx(672.0) and g.covered_usd == pytest.approx(420.0)
    assert g.usd_coverage == pytest.approx(0.625)
    assert g.usd == pytest.approx({"compute": 184.8, "memory": 151.2, "communication": 33.6, "idle": 50.4})
    assert g.usd_share == pytest.approx(
        {"compute": 0.44, "memory": 0.36, "communication": 0.08, "idle": 0.12}
    )
    assert g.covered_gpu_seconds == pytest.approx(1_209_600)
    assert g.time_share == pytest.approx(
        {"compute": 0.35, "memory": 0.45, "communication": 0.05, "idle": 0.15}
    )
    # the shares sum to 1 over the covered part, per version and for the week
    for x in (llama, mistral, g):
        assert sum((x.time_share or {}).values()) == pytest.approx(1.0)
        assert sum((x.usd_share or {}).values()) == pytest.approx(1.0)
        assert sum((x.usd or {}).values()) == pytest.approx(x.covered_usd)


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
    with backfilled_prometheus(tmp_path_factory.mktemp("report_bound"), openmetrics()) as prom:
        yield prom


def test_from_prometheus(prometheus: Prometheus) -> None:
    check(build_from_prometheus(prometheus.url, end=T))


def test_markdown_csv_json_slack_and_html() -> None:
    rep = build_from_windows(windows(), end=T)
    md = render_markdown(rep)
    assert "## Where GPU time goes" in md
    summary = (
        "GPU time: compute 35.0 %, memory 45.0 %, communication 5.0 %, idle 15.0 %; dollars: compute $184.80 "
        "(44.0 %), memory $151.20 (36.0 %), communication $33.60 (8.0 %), idle $50.40 (12.0 %); the split "
        "covers 62.5 % of the $672.00."
    )
    assert summary in md
    assert (
        "| llama-70b | v1 | $336.00 | 100.0 % | 50.0 % | 30.0 % | 10.0 % | 10.0 % | $168.00 | $100.80 "
        "| $33.60 | $33.60 |"
    ) in md
    assert "| qwen-7b | v1 | $168.00 | 0.0 % | — | — | — | — | — | — | — | — |" in md
    assert (
        "| mistral-7b | v1 | $168.00 | 50.0 % | 20.0 % | 60.0 % | 0.0 % | 20.0 % | $16.80 | $50.40 | $0.00 "
        "| $16.80 |"
    ) in md
    assert "| (all) | | $672.00 | 62.5 % | 35.0 % | 45.0 % | 5.0 % | 15.0 % | $184.80 |" in md
    rows = {r["model"]: r for r in csv.DictReader(io.StringIO(render_csv(rep)))}
    assert float(rows["mistral-7b"]["bound_usd_coverage"]) == pytest.approx(0.5)
    assert float(rows["mistral-7b"]["memory_bound_time_share"]) == pytest.approx(0.6)
    assert float(rows["llama-70b"]["compute_bound_usd"]) == pytest.approx(168.0)
    assert rows["qwen-7b"]["compute_bound_usd"] == "" and rows["qwen-7b"]["idle_bound_time_share"] == ""
    assert float(rows["(all)"]["bound_usd_coverage"]) == pytest.approx(0.625)
    assert float(rows["(all)"]["memory_bound_usd"]) == pytest.approx(151.2)
    assert float(rows["(all)"]["prompt_usd"]) == 0.0  # the dollar-split cells stay in their columns
    data = json.loads(render_json(rep))
    assert data["gpu_time"]["usd_coverage"] == pytest.approx(0.625)
    assert data["gpu_time"]["usd_share"]["compute"] == pytest.approx(0.44)
    qwen = next(m for m in data["models"] if m["model"] == "qwen-7b")
    assert qwen["gpu_time"]["usd"] is None and qwen["gpu_time"]["time_share"] is None
    assert summary in render_slack(rep)
    page = render_html(rep)
    assert "<h2>Where GPU time goes</h2>" in page and "$184.80" in page and "62.5 %" in page


def test_a_week_without_gpm_says_unknown() -> None:
    only_qwen = [w for w in windows() if w.usage.model == "qwen-7b"]
    rep = build_from_windows(only_qwen, end=T)
    g = rep.gpu_time
    assert g.usd is None and g.time_share is None and g.usd_coverage == 0.0
    assert "where it went is unknown" in render_markdown(rep)
    assert "where it went is unknown" not in render_slack(rep)  # no line about a split nobody had
    row = {r["model"]: r for r in csv.DictReader(io.StringIO(render_csv(rep)))}["(all)"]
    assert row["compute_bound_usd"] == "" and float(row["bound_usd_coverage"]) == 0.0


# ---------------------------------------------------------------------------------------------
# Through the real window join: NVML GPM readings and engine counters → store → weekly report
# ---------------------------------------------------------------------------------------------


def test_the_real_join_to_the_report_by_hand(tmp_path: Path) -> None:
    """Engine a on an H100 SXM at $3.60/h; engine b on an A100 at $1.80/h, whose NVML has no GPM.
    Each 600 s tick the H100's GPM reads SMs busy 90 %, tensor cores 50 %, DRAM 30 %, PCIe receive
    6.4 GB/s (10 % of Gen5 x16's 64 GB/s one way) and NVLink transmit 22.5 GB/s (5 % of 450 GB/s):
    communication = the busier link, 10 %. Busy 0.9 split 5 : 3 : 1 → compute 0.5, memory 0.3,
    communication 0.1, idle 0.1 of each GPU-second and dollar.

    A day (144 ticks): a costs 144 × $0.60 = $86.40 over 86,400 GPU-s: compute $43.20, memory
    $25.92, communication $8.64, idle $8.64 (43,200 / 25,920 / 8,640 / 8,640 s); b costs $43.20 with
    no split. The week: $129.60, of which $86.40 (2/3) has a split, shares as a's."""
    from agent.cost.inputs import EngineSpec, GpuRate, PriceTable
    from agent.cost.window import WindowJoiner
    from agent.hardware import PCIE5_X16
    from agent.samples import EngineScrape, GpuSample, ModelSignals, NvmlRound

    end = T
    start = end - 86400.0
    specs = (EngineSpec("a", gpus=(0,), model_version="v1"), EngineSpec("b", gpus=(1,), model_version="v1"))
    prices = PriceTable(gpus=(GpuRate("H100", 3.6), GpuRate("A100", 1.8)))
    j = WindowJoiner("n1", specs, prices)
    st = Store(tmp_path / "h.sqlite", 35, ManualClock(end))
    ticks = 144  # a day; the first round only starts the first tick
    for k in range(ticks + 1):
        t = start + k * STEP
        h100 = GpuSample(
            0, "GPU-0", "NVIDIA H100 80GB HBM3", t, util_gpu_ratio=0.9,
            sm_active_ratio=0.9, tensor_active_ratio=0.5, dram_bw_ratio=0.3,
            pcie_rx_bytes_per_s=0.1 * PCIE5_X16, pcie_tx_bytes_per_s=0.0,
            nvlink_rx_bytes_per_s=0.0, nvlink_tx_bytes_per_s=0.05 * 450e9,
        )  # fmt: skip
        a100 = GpuSample(1, "GPU-1", "NVIDIA A100-SXM4-80GB", t, util_gpu_ratio=0.9)
        j.add_round(NvmlRound(t, True, (h100, a100)))
        pages = {
            name: EngineScrape(
                name,
                "vllm",
                t,
                True,
                0.01,
                (ModelSignals(model, prompt_tokens_total=1000.0 * k, generation_tokens_total=500.0 * k),),
            )
            for name, model in (("a", "llama-70b"), ("b", "qwen-7b"))
        }
        tick = j.close_tick(t, pages)
        st.write_windows(list(tick.windows))
    st.close()
    rep = build_from_store(tmp_path / "h.sqlite", end=end)
    by = {m.model: m.gpu_time for m in rep.models}
    a, b = by["llama-70b"], by["qwen-7b"]
    assert a.cost_usd == pytest.approx(ticks * 0.6) and a.gpu_seconds == pytest.approx(ticks * 600.0)
    assert a.usd == pytest.approx({"compute": 43.2, "memory": 25.92, "communication": 8.64, "idle": 8.64})
    assert a.time_share == pytest.approx({"compute": 0.5, "memory": 0.3, "communication": 0.1, "idle": 0.1})
    assert a.covered_gpu_seconds == pytest.approx(86_400.0) and a.usd_coverage == pytest.approx(1.0)
    assert b.cost_usd == pytest.approx(ticks * 0.3) and b.usd is None and b.usd_coverage == 0.0
    g = rep.gpu_time
    assert g.cost_usd == pytest.approx(129.6) and g.usd_coverage == pytest.approx(2 / 3)
    assert g.usd_share == pytest.approx({"compute": 0.5, "memory": 0.3, "communication": 0.1, "idle": 0.1})
