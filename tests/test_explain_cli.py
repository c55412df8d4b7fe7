"""``infercost explain`` on a store written by the real window join, and on a real Prometheus holding
the same history as the agent's exported series.

The history (one H100 at $3.60/h serving 70B fp16: 140 GB of weights, 320 KiB of KV per token, a
400,000-token cache a quarter full, 16 sequences running; 1-minute ticks):
  A  v1, 3 h: steps of 75 ms as run (60 ms of decode, 15 ms of the prefill chunks they carry: prefill
     20 % of the steps' time), the GPU 80 % busy (steps run while it is);
  B  v2, 3 h: the same load, steps 1.8× longer (a build that lost a fused kernel);
  C  v2, 3 h: steps as in B, the GPU 50 % busy (the rest of the time paid for nothing).
The roofline step is (140e9 + 100,000 × 327,680) / 3.35e12 = 51.57 ms, so v1 runs at 0.86 of it.
Every series agrees with every other here, so the factors' product closes on the measured $/token.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from promstack import Prometheus, backfilled_prometheus, openmetrics_of

from agent.cli import main
from agent.clock import ManualClock
from agent.cost.inputs import EngineSpec, GpuRate, PriceTable
from agent.cost.window import WindowJoiner
from agent.detect.deploys import record_deploy
from agent.records import mean_of
from agent.samples import EngineScrape, GpuSample, ModelSignals, NvmlRound
from agent.store import Store

HOUR = 3600.0
TICK = 60.0
T0 = math.floor(time.time() / HOUR) * HOUR - 12 * HOUR  # recent, hour-aligned (Prometheus keeps it)
RUNNING = 16.0


@dataclass(frozen=True)
class Phase:
    version: str
    hours: float
    step_seconds: float  # seconds of one step's decode part (the step as run less its prefill)
    busy: float  # 0–1, NVML utilisation
    prefill_share: float = 0.2  # of the steps' time


PHASES = (Phase("v1", 3, 0.060, 0.8), Phase("v2", 3, 0.108, 0.8), Phase("v2", 3, 0.108, 0.5))


def phase_start(i: int) -> float:
    return T0 + sum(p.hours for p in PHASES[:i]) * HOUR


def write_history(state_dir: Path) -> Path:
    """The history through the real window join into the real store (state_dir/history.sqlite)."""
    spec = EngineSpec(
        "vllm-0", kind="vllm", gpus=(0,), weights_bytes=140e9, kv_bytes_per_token=327_680,
        kv_capacity_tokens=400_000,
    )  # fmt: skip
    joiner = WindowJoiner("n1", (spec,), PriceTable(gpus=(GpuRate("H100", 3.6),)))
    end = phase_start(len(PHASES))
    store = Store(state_dir / "history.sqlite", 35, ManualClock(end), deploys=record_deploy)
    totals: defaultdict[str, float] = defaultdict(float)
    t = T0
    for i, p in enumerate(PHASES):
        for _ in range(int(p.hours * HOUR / TICK) + (1 if i == 0 else 0)):
            gpu = GpuSample(0, "GPU-0", "NVIDIA H100 80GB HBM3", t, util_gpu_ratio=p.busy)
            joiner.add_round(NvmlRound(t, True, (gpu,)))
            page = ModelSignals(
                "llama-70b",
                prompt_tokens_total=totals["prompt"],
                generation_tokens_total=totals["gen"],
                prefill_seconds_total=totals["prefill"],
                decode_seconds_total=totals["decode"],
                requests_running=RUNNING * p.busy,  # sequences running, mean over the tick
                kv_cache_usage_ratio=0.25,
            )
            tick = joiner.close_tick(t, {"vllm-0": EngineScrape("vllm-0", "vllm", t, True, 0.01, (page,))},
                                     {"vllm-0": p.version})  # fmt: skip
            store.write_windows(list(tick.windows))
            # the next tick's counters: steps of step ÷ (1 − prefill share) run for busy × the tick, each
            # a token for every running sequence; decode request-seconds count the running sequences
            # all along, prefill request-seconds the one prefill at a time
            steps = TICK * p.busy * (1 - p.prefill_share) / p.step_seconds
            totals["gen"] += steps * RUNNING
            totals["prompt"] += steps * RUNNING * 4
            totals["decode"] += RUNNING * TICK * p.busy
            totals["prefill"] += TICK * p.busy * p.prefill_share
            t += TICK
    store.close()
    return state_dir


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_history(tmp_path_factory.mktemp("explain"))


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["explain", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def check_sum(out: dict) -> None:
    total = out["total_usd_per_1m"]
    assert out["after_usd_per_1m"] - out["before_usd_per_1m"] == pytest.approx(total, rel=1e-12)
    assert math.fsum(f["usd_per_1m"] for f in out["factors"]) == pytest.approx(total, rel=1e-9)
    assert math.fsum(f["share"] for f in out["factors"]) == pytest.approx(1.0, rel=1e-9)


def test_a_slower_build_at_like_load_is_step_efficiency(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_json(
        capsys, "--state-dir", str(state_dir), "--model", "llama-70b", "--version", "v2", "--against", "v1"
    )
    check_sum(out)
    # by hand: $0.001/s; v1 makes 16 × 0.8 × 0.8 / 0.060 = 170.67 tok/s → $5.859 per 1M; v2 1.8× that
    assert out["before_usd_per_1m"] == pytest.approx(0.001 / (16 * 0.64 / 0.060) * 1e6, rel=1e-6)
    # v2 at like load: only its minutes at 16 running, i.e. phases B and C (C: idle too)
    top = out["factors"][0]
    assert top["name"] == "step_efficiency" and top["share"] > 0.5
    names = {f["name"]: f for f in out["factors"]}
    assert abs(names["price"]["usd_per_1m"]) < 1e-9
    # v2's minutes at v1's load are phase B's (phase C decodes fewer sequences: another band), but
    # for the tick at the switch to C (the GPU read at 50 % busy, the counters still B's): a few
    # hundredths of idle and batch, opposite, of mix (prefill's share of the busy time) and of model
    # and context (that tick's gauge reads C's sequences, its counters B's: the resident KV the
    # efficiency and the floor read, the gauge's KV per sequence times the counters' sequences, is
    # 1.6× every other tick's)
    for f in ("idle", "batch", "mix", "model", "closure"):
        assert abs(names[f]["usd_per_1m"]) < 0.005 * out["total_usd_per_1m"]
    # 1.8× longer steps: +80 %, all of it step efficiency
    assert out["after_usd_per_1m"] == pytest.approx(1.8 * out["before_usd_per_1m"], rel=0.01)
    assert top["share"] == pytest.approx(1.0, abs=0.005)
    for gap in out["closure_gap"].values():
        assert abs(gap) < 1e-3  # every series agrees: the chain closes on the measured $/token
    # prefill's share is of the window (0.16: the GPU idles a fifth of it), so the decode step reads
    # 75 ms × 0.84, not 60 ms, and mix 1 ÷ 0.84, not 1.25 (their product is the 75 ms step as run)
    assert out["values"]["before"]["step_efficiency"] == pytest.approx(0.075 * 0.84 / 0.0515725, rel=1e-4)
    assert out["values"]["before"]["price"] == pytest.approx(3.6)
    assert out["values"]["before"]["model"] == pytest.approx(51.5725, rel=1e-4)  # GPU-ms per step
    assert out["values"]["before"]["batch"] == pytest.approx(RUNNING)
    assert out["values"]["before"]["mix"] == pytest.approx(1 / 0.84)
    # phase C's tokens (busy 0.5: 10 of 16 sequences in decode) are in a band v1 never ran at
    c_tokens = 16 * 0.4 / 0.108
    assert out["like_load_matched_share"] == pytest.approx(
        16 * 0.64 / 0.108 / (16 * 0.64 / 0.108 + c_tokens), rel=0.01
    )


def test_two_windows_idle_time(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys, "--state-dir", str(state_dir), "--model", "llama-70b", "--engine", "vllm-0",
        "--from", str(phase_start(1)), "--to", str(phase_start(2)), "--window", "3h",
    )  # fmt: skip
    check_sum(out)
    (top, *rest) = out["factors"]
    # busy 0.8 → 0.5: $/token × 1.6, all of it idle (but for the first tick of each window, which
    # joins the new GPU reading with the counters of the phase before: under a hundredth)
    assert top["name"] == "idle" and top["share"] == pytest.approx(1.0, abs=0.005)
    assert out["after_usd_per_1m"] / out["before_usd_per_1m"] == pytest.approx(1.6, rel=0.01)
    # prefill's share of the window falls with the busy share: mix and step efficiency move opposite
    by = {f["name"]: f["usd_per_1m"] for f in rest}
    assert abs(by.pop("mix") + by.pop("step_efficiency")) < 0.01 * abs(top["usd_per_1m"])
    assert all(abs(v) < 0.01 * abs(top["usd_per_1m"]) for v in by.values())


def test_text_waterfall(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--state-dir",
        str(state_dir),
        "--model",
        "llama-70b",
        "--from",
        str(T0),
        "--to",
        str(phase_start(1)),
    ]
    assert main(["explain", *argv, "--window", "3h"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    row = next(line for line in lines if line.strip().startswith("step efficiency"))
    assert "█" in row and "+" in row
    gap = next(line for line in lines if "closure gap (product of factors" in line)
    before, after = (float(x.split()[0]) for x in gap.split("before ")[1].split("after "))
    assert abs(before) < 0.1 and abs(after) < 0.1  # per cent
    start = next(line for line in lines if line.strip().startswith("start"))
    end = next(line for line in lines if line.strip().startswith("end"))
    assert float(end.split()[-1]) == pytest.approx(float(start.split()[-1]) * 1.8, rel=0.01)


def test_bad_options_and_missing_data(
    state_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = ["explain", "--state-dir", str(state_dir), "--model", "llama-70b"]
    assert main([*base, "--version", "v2"]) == 2
    assert main([*base, "--version", "v2", "--against", "v1", "--from", "0", "--to", "1"]) == 2
    assert main([*base, "--version", "v9", "--against", "v1"]) == 1
    assert "no minutes of version 'v9'; versions there: v1, v2" in capsys.readouterr().err
    assert main(["explain", "--state-dir", str(tmp_path), "--model", "m", "--from", "0", "--to", "1"]) == 1
    assert "no store here" in capsys.readouterr().err
    assert main([*base, "--from", str(T0 - 86400), "--to", str(T0)]) == 1
    assert "no cost per token in the first window" in capsys.readouterr().err


# -- the same history from a real Prometheus ---------------------------------------------------------


def openmetrics(state_dir: Path) -> str:
    """The store's minutes as the agent exports them: cumulative counters and per-minute gauges."""
    store = Store(state_dir / "history.sqlite", 35, ManualClock(phase_start(len(PHASES))))
    recs = store.records(0, math.inf, ("model",))
    store.close()
    counters = {
        "infercost_cost_usd_total": "cost_usd",
        "infercost_generation_tokens_total": "generation_tokens",
        "infercost_gpu_seconds_total": "gpu_seconds",
        "infercost_usage_cost_usd_total": "usage_usd",
    }
    families: dict[str, list[str]] = defaultdict(list)
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in sorted(recs, key=lambda r: r.minute):
        v = r.label("model_version")
        lbl = f'node="n1",engine="vllm-0",model="llama-70b",model_version="{v}"'
        t = r.minute + TICK
        for name, key in counters.items():
            acc[v][name] += r.sums.get(key, 0.0)
            families[name].append(f"{name}{{{lbl}}} {acc[v][name]!r} {t:.0f}")
        gauges = {
            "infercost_roofline_efficiency_ratio": mean_of(r.sums, "roofline"),
            "infercost_prefill_share_ratio": mean_of(r.sums, "prefill_share"),
            "infercost_prefill_share_floor_ratio": mean_of(r.sums, "prefill_floor"),
            "infercost_requests_running": mean_of(r.sums, "running"),
            "infercost_usd_per_1m_output_tokens_floor": r.sums["floor_usd"] / r.sums["floor_tokens"] * 1e6,
        }
        for name, g in gauges.items():
            assert g is not None
            families[name].append(f"{name}{{{lbl}}} {g!r} {t:.0f}")
    return openmetrics_of(families)


@pytest.fixture(scope="module")
def prometheus(state_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with backfilled_prometheus(tmp_path_factory.mktemp("explain_prom"), openmetrics(state_dir)) as prom:
        yield prom


def test_from_prometheus_as_from_the_store(
    prometheus: Prometheus, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    window = ["--from", str(T0 + HOUR), "--to", str(phase_start(1) + HOUR), "--window", "2h"]
    common = ["--model", "llama-70b", *window]
    prom = run_json(capsys, "--prometheus", prometheus.url, *common)
    local = run_json(capsys, "--state-dir", str(state_dir), *common)
    check_sum(prom)
    assert prom["factors"][0]["name"] == local["factors"][0]["name"] == "step_efficiency"
    assert prom["total_usd_per_1m"] == pytest.approx(local["total_usd_per_1m"], rel=1e-3)
    assert prom["factors"][0]["share"] == pytest.approx(1.0, abs=1e-3)
    for gap in prom["closure_gap"].values():
        assert abs(gap) < 1e-3
    versions = run_json(
        capsys, "--prometheus", prometheus.url, "--model", "llama-70b", "--version", "v2", "--against", "v1",
        "--since", str(T0), "--until", str(phase_start(len(PHASES))),
    )  # fmt: skip
    check_sum(versions)
    assert versions["factors"][0]["name"] == "step_efficiency"
