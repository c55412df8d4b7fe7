"""The weekly report compares at like load, shows gaps as gaps, and finds savings in dollars.

The scenario (hourly windows over two weeks ending at T; load follows the day: 8 requests running
from 08:00 to 20:00 UTC, 2 otherwise):
  prod    Llama-3.1-70B 2024-07 on 4 GPUs  $8/h  800 tok/s at 8 running, 250 at 2 (both weeks)
  canary  Llama-3.1-70B 2024-09 on 2 GPUs  $4/h  the same tokens (fp8: half prod's $/token) until
          84 h into this week, then build 2024-10: the same load, 1/1.75 of the tokens
  qwen    Qwen2.5-14B   2024-09 on 1 GPU   $1/h  400 / 100 tok/s, no data at all on day 6
Hand figures:
- 2024-10 costs 0.85 × prod per token (it looks cheaper than production), and its plain change
  against the model's last week is +13.8 % (under the 1.2 regression bar); at like load
  against the version it replaced on its engine it is +75 %: a regression, $336 − $336/1.75 = $144.
- prod served at 2024-09's like-load price would cost half: a $672 a week saving (a cheaper version).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent.clock import ManualClock
from agent.detect.deploys import record_deploy
from agent.report.data import WEEK_SECONDS, ModelWeek, WeeklyReport, build_from_store, build_from_windows
from agent.report.render import render_csv, render_html, render_json, render_markdown, render_slack
from agent.samples import CostWindow, UsageWindow
from agent.store import Store

HOUR = 3600.0
DAY = 86400.0
T = (math.floor(time.time() / DAY) - 1) * DAY  # midnight UTC: hours of day line up with the load
START = T - WEEK_SECONDS
DEPLOY_AT = START + 84 * HOUR
MODEL = "Llama-3.1-70B-Instruct"


def _running(t: float) -> float:
    return 8.0 if 8 <= (t % DAY) / HOUR < 20 else 2.0


def _window(
    node: str, engine: str, model: str, version: str, t: float, usd: float, tps: float, gpus: int
) -> CostWindow:
    gen = tps * HOUR
    u = UsageWindow(
        node, engine, model, version, t, t + HOUR,
        prompt_tokens=2 * gen, generation_tokens=gen, gpu_seconds=gpus * HOUR, energy_joules=None,
        gpu_util_ratio=0.9 if _running(t) > 4 else 0.3, requests_running=_running(t),
    )  # fmt: skip
    return CostWindow(u, usd, 0.0, usd / gen * 1e6, usd / (3 * gen) * 1e6, 0.0)


def scenario() -> list[CostWindow]:
    """The scenario's hourly windows over both weeks, in time order."""
    out = []
    for h in range(336):
        t = T - 2 * WEEK_SECONDS + h * HOUR
        busy = _running(t) > 4
        tps = 800.0 if busy else 250.0
        out.append(_window("n1", "llama-70b", MODEL, "2024-07", t, 8.0, tps, 4))
        if t < DEPLOY_AT:
            out.append(_window("n1", "llama-70b-canary", MODEL, "2024-09", t, 4.0, tps, 2))
        else:
            out.append(_window("n1", "llama-70b-canary", MODEL, "2024-10", t, 4.0, tps / 1.75, 2))
        if not START + 5 * DAY <= t < START + 6 * DAY:
            out.append(
                _window("n1", "qwen-14b", "Qwen2.5-14B", "2024-09", t, 1.0, 400.0 if busy else 100.0, 1)
            )
    return out


def by_version(rep: WeeklyReport) -> dict[str, ModelWeek]:
    return {m.model_version if m.model == MODEL else "qwen": m for m in rep.models}


def check(rep: WeeklyReport) -> None:
    v = by_version(rep)
    prod, old, new, qwen = v["2024-07"], v["2024-09"], v["2024-10"], v["qwen"]
    # 2024-10 runs hours 84–167: 44 busy (800/1.75 tok/s), 40 quiet (250/1.75 tok/s), $4/h
    new_price = 336.0 / ((44 * 800 + 40 * 250) * HOUR / 1.75) * 1e6
    prod_price = 1344.0 / (84 * (800 + 250) * HOUR) * 1e6  # 84 busy and 84 quiet hours at $8/h
    model_last_week = 2016.0 / (2 * 84 * (800 + 250) * HOUR) * 1e6  # prod + canary, $12/h
    # the canary looks cheaper than production per token (0.85×) ...
    assert new.usd_per_1m_output == pytest.approx(new_price)
    assert prod.usd_per_1m_output == pytest.approx(prod_price) and new_price < prod_price
    # ... and its plain change against the model's last week is +13.8 %: under the 1.2 bar
    assert new.baseline == "model"
    assert new.change_ratio == pytest.approx(new_price / model_last_week)
    assert new_price / model_last_week < 1.2
    # at like load against the build it replaced on the same engine: +75 %
    assert new.like_baseline == "replaced"
    assert new.like_change_ratio == pytest.approx(1.75)
    assert new.like_share == pytest.approx(1.0)
    assert new.excess_usd == pytest.approx(336.0 - 336.0 / 1.75)
    assert [(m.model_version) for m in rep.regressions] == ["2024-10"]
    # unchanged versions are unchanged at like load against themselves
    assert prod.like_baseline == "version" and prod.like_change_ratio == pytest.approx(1.0)
    assert old.like_change_ratio == pytest.approx(1.0)
    # savings: prod at 2024-09's like-load price costs half of its $1,344
    cheaper = [s for s in rep.savings if s.kind == "cheaper_version"]
    assert cheaper[0].subject == f"{MODEL} 2024-07" and cheaper[0].usd_per_week == pytest.approx(672.0)
    assert "2024-09" in cheaper[0].detail
    # gaps: qwen has no data on day 6 (index 5): absent, not $0
    t = qwen.trend
    assert t is not None
    assert t.daily_usd == (24.0, 24.0, 24.0, 24.0, 24.0, None, 24.0)
    assert t.usd_per_1m_output[5 * 24 : 6 * 24] == (None,) * 24
    assert t.usd_per_1m_output[0] == pytest.approx(1e6 / (100.0 * HOUR))  # midnight: 100 tok/s at $1/h
    # the old canary build stops at hour 84: the rest of the week is a gap
    assert old.trend is not None and old.trend.daily_usd[4:] == (None, None, None)
    assert rep.daily_usd == (312.0, 312.0, 312.0, 312.0, 312.0, 288.0, 312.0)  # $8 + $4 + $1 per hour


def test_like_load_from_windows() -> None:
    check(build_from_windows(scenario(), end=T))


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("like_load") / "history.sqlite"
    store = Store(
        path, retention_days=35, clock=ManualClock(start=T), deploys=record_deploy
    )  # as app.py builds it
    store.write_windows(scenario())
    store.close()
    return path


def test_like_load_from_the_store_in_sql(store_path: Path) -> None:
    rep = build_from_store(store_path, end=T)
    check(rep)
    (d,) = rep.deploys
    assert (d.engine, d.from_version, d.to_version, d.at) == (
        "llama-70b-canary",
        "2024-09",
        "2024-10",
        DEPLOY_AT,
    )


def test_renderers_show_like_load_gaps_and_savings(store_path: Path) -> None:
    rep = build_from_store(store_path, end=T)
    md = render_markdown(rep)
    assert "+75.0 % at like load vs the version it replaced on the same engine" in md
    assert "$144.00 more this week" in md
    assert f"| a cheaper version of the same model | {MODEL} 2024\\-07 | $672.00 |" not in md  # '-' unescaped
    assert f"| a cheaper version of the same model | {MODEL} 2024-07 | $672.00 |" in md
    slack = render_slack(rep)
    assert "+75.0 % at like load" in slack and "$672.00/week" in slack
    rows = {r["model_version"]: r for r in csv.DictReader(io.StringIO(render_csv(rep)))}
    assert float(rows["2024-10"]["like_load_change_ratio"]) == pytest.approx(1.75)
    assert rows["2024-10"]["like_load_baseline"] == "replaced"
    data = json.loads(render_json(rep))
    qwen = next(m for m in data["models"] if m["model"] == "Qwen2.5-14B")
    assert qwen["trend"]["daily_usd"][5] is None  # absent is null, never 0
    assert data["deploys"][0]["to_version"] == "2024-10"
    page = render_html(rep)
    assert page.count('stroke-dasharray="4 3"') >= 4  # the deploy on the fleet chart and 2024-09/10's
    assert "$0.00" not in page.split("By model version over the week")[1].split("Deploys this week")[0]


def test_html_screenshot_of_the_canary_week(store_path: Path, tmp_path: Path) -> None:
    """Headless Chromium renders the page (set INFERCOST_ARTIFACTS=DIR to keep the PNG and look at it)."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium not found: apt-get install chromium (CI's .ci/run does)"
    page = tmp_path / "report.html"
    page.write_text(render_html(build_from_store(store_path, end=T)))
    png = tmp_path / "report_canary_week.png"
    subprocess.run(
        [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,2600", f"--screenshot={png}",
            page.as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    keep = os.environ.get("INFERCOST_ARTIFACTS")  # a folder to keep the picture in, to look at it
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)


def test_a_gap_to_another_deployment_is_a_saving_not_a_regression() -> None:
    """Without last week's production data, production (bf16 on 4 GPUs) is compared at like load
    only with the model's other deployment (the fp8 canary on 2 GPUs, half the $/token): about twice as
    dear (1.79× against both canary builds), but nobody changed it. It is a $672 saving (hand:
    $1,344 at 2024-09's half price), not a regression."""
    ws = [w for w in scenario() if not (w.usage.engine == "llama-70b" and w.usage.start < START)]
    rep = build_from_windows(ws, end=T)
    prod = by_version(rep)["2024-07"]
    # the model's other versions over both weeks, per band: 2024-09 ($4/h, t tok) and 2024-10
    # ($4/h, t/1.75); busy: 124 h of 09 and 44 h of 10, quiet: 128 h and 40 h; prod is $8/h at t
    busy = 4 * 168 / (124 + 44 / 1.75)  # $ per busy-hour token unit
    quiet = 4 * 168 / (128 + 40 / 1.75)
    assert prod.like_baseline == "model"
    assert prod.like_change_ratio == pytest.approx(1344 / (84 * busy + 84 * quiet))
    assert prod.regression_ratio is None
    assert [m.model_version for m in rep.regressions] == ["2024-10"]
    (saving,) = [s for s in rep.savings if s.subject == f"{MODEL} 2024-07"]
    assert saving.kind == "cheaper_version" and saving.usd_per_week == pytest.approx(672.0)


def test_unused_gpus_are_a_saving(tmp_path: Path) -> None:
    """Two of a node's three H100s ($3.60/h) serve nothing for a day: $172.80 of GPUs no engine
    uses, from the store's per-GPU dollars (the model rows never see them)."""
    from test_cost_history import IDLE_PER_DAY, T0, _day

    st, _ = _day(tmp_path)
    st.close()
    rep = build_from_store(tmp_path / "h.sqlite", T0 + 7 * DAY)
    (unused,) = [s for s in rep.savings if s.kind == "unused_gpus"]
    assert (unused.subject, unused.usd_per_week) == ("n1", pytest.approx(IDLE_PER_DAY))
    assert "NVIDIA H100 80GB HBM3 GPUs no engine used" in unused.detail
    assert "| GPUs no engine uses | n1 | $172.80 |" in render_markdown(rep)


def test_deploys_seen_hour_to_hour_where_no_deploy_log_exists() -> None:
    """Prometheus keeps no deploy log: a new version on the same engine is a deploy at its first hour."""
    from agent.report.data import rows_from_windows
    from agent.report.prom import deploys_from_rows

    (d,) = deploys_from_rows(rows_from_windows(scenario(), T))
    assert (d.node, d.engine, d.model, d.from_version, d.to_version, d.at) == (
        "n1", "llama-70b-canary", MODEL, "2024-09", "2024-10", DEPLOY_AT,
    )  # fmt: skip
