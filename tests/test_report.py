"""The weekly cost report: hand-checked figures from both data paths (a real Prometheus holding two
weeks of backfilled history, and the local store's CostWindow records of the same traffic), the
Markdown/CSV/HTML renderers, and the HTML page rendered by headless Chromium.

The scenario (two weeks ending at T, every rate constant within a week):
  node-a e1 llama-70b v1   both weeks  $2/h  1000 output tok/s  2000 prompt tok/s
  node-b e2 llama-70b v2   this week   $2/h   500 output tok/s   500 prompt tok/s
  node-b e3 qwen-7b   v1   both weeks  $1/h  1000 → 700 output tok/s  100 prompt tok/s
Hand figures: this week $840 (last $504); llama v1 $0.5556/1M (unchanged); llama v2 $1.1111/1M,
a new version, 2.0 × its model's $0.5556 last week; qwen $0.3968/1M vs $0.2778 (×1.4286).
GPU idle (Prometheus): node-a $0.5/h both weeks, node-b $0.25/h this week → $126 (last $84).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from promstack import Prometheus, backfilled_prometheus

from agent.clock import ManualClock
from agent.report.cli import run_report
from agent.report.data import (
    MIN_OUTPUT_TOKENS,
    ReportError,
    WeeklyReport,
    build_from_windows,
    calendar_days,
)
from agent.report.prom import PromAuth, build_from_prometheus, parse_header
from agent.report.render import render_csv, render_html, render_json, render_markdown
from agent.samples import CostWindow, UsageWindow
from agent.store import Store

HOUR = 3600.0
WEEK = 7 * 86400.0
T = math.floor(time.time() / HOUR) * HOUR - HOUR  # report end: an hour boundary in the recent past
STEP = 600.0  # seconds between backfilled samples


@dataclass(frozen=True)
class Run:
    """One model version's traffic: rates per week (None = not running that week)."""

    node: str
    engine: str
    model: str
    version: str
    usd_per_hour: tuple[float | None, float | None]  # (last week, this week)
    out_tps: tuple[float, float]  # output tokens per second
    prompt_tps: tuple[float, float]  # prompt tokens per second
    util: float  # 0–1


RUNS = (
    Run("node-a", "e1", "llama-70b", "v1", (2.0, 2.0), (1000, 1000), (2000, 2000), 0.8),
    Run("node-b", "e2", "llama-70b", "v2", (None, 2.0), (0, 500), (0, 500), 0.4),
    Run("node-b", "e3", "qwen-7b", "v1", (1.0, 1.0), (1000, 700), (100, 100), 0.4),
)
GPU_IDLE_USD_PER_HOUR = {"node-a": (0.5, 0.5), "node-b": (0.0, 0.25)}
GPUS = {"node-a": ("NVIDIA H100 80GB HBM3", 0.8), "node-b": ("NVIDIA A100-SXM4-80GB", 0.4)}
GPU_USD_PER_HOUR = 3.0


def windows() -> list[CostWindow]:
    """Hourly cost windows of the scenario over both weeks."""
    out = []
    for r in RUNS:
        for h in range(336):
            week = 0 if h < 168 else 1
            rate = r.usd_per_hour[week]
            if rate is None:
                continue
            start = T - 2 * WEEK + h * HOUR
            gen, prompt = r.out_tps[week] * HOUR, r.prompt_tps[week] * HOUR
            usage = UsageWindow(
                node=r.node,
                engine=r.engine,
                model=r.model,
                model_version=r.version,
                start=start,
                end=start + HOUR,
                prompt_tokens=prompt,
                generation_tokens=gen,
                gpu_seconds=HOUR,
                energy_joules=None,
                gpu_util_ratio=r.util,
            )
            out.append(
                CostWindow(
                    usage=usage,
                    gpu_time_usd=rate,
                    energy_usd=0.0,
                    usd_per_1m_output=rate / gen * 1e6 if gen else None,
                    usd_per_1m_total=rate / (gen + prompt) * 1e6 if gen + prompt else None,
                    idle_usd=0.0 if gen + prompt else rate,
                )
            )
    return out


def openmetrics() -> str:
    """The same traffic as the agents' counters, sampled every 10 minutes over 15 days."""
    t0 = T - 15 * 86400  # a day of warm-up before the two weeks
    times = [t0 + i * STEP for i in range(int(15 * 86400 / STEP) + 1)]

    def week_of(t: float) -> int:
        return 0 if t <= T - WEEK else 1

    def counter(rate_of: dict[int, float | None], t: float) -> float | None:
        """Integral of a per-week constant per-second rate from t0 to t (None while absent)."""
        if rate_of[week_of(t)] is None:
            return None
        spans = {0: (t0, T - WEEK), 1: (T - WEEK, T)}
        return sum((rate_of[w] or 0.0) * max(0.0, min(t, b) - a) for w, (a, b) in spans.items())

    families: dict[str, list[str]] = {}

    def add(name: str, labels: str, value_at: dict[int, float | None], kind: str = "counter") -> None:
        lines = families.setdefault(name, [])
        for t in times:
            v = counter(value_at, t) if kind == "counter" else value_at[week_of(t)]
            if v is not None:
                lines.append(f"{name}{{{labels}}} {v} {t:.0f}")

    for r in RUNS:
        lbl = f'node="{r.node}",engine="{r.engine}",model="{r.model}",model_version="{r.version}"'
        per_s = [None if u is None else u / HOUR for u in r.usd_per_hour]
        running = [u is not None for u in r.usd_per_hour]
        add("infercost_cost_usd_total", lbl, {0: per_s[0], 1: per_s[1]})
        for name, tps in (("generation", r.out_tps), ("prompt", r.prompt_tps)):
            add(
                f"infercost_{name}_tokens_total",
                lbl,
                {w: (float(tps[w]) if running[w] else None) for w in (0, 1)},
            )
        add("infercost_idle_cost_usd_total", lbl, {w: (0.0 if running[w] else None) for w in (0, 1)})
        util = {w: (r.util if running[w] else None) for w in (0, 1)}
        add("infercost_model_gpu_utilization_ratio", lbl, util, kind="gauge")
    for node, (gpu_model, util) in GPUS.items():
        lbl = f'node="{node}",gpu="0"'
        idle = GPU_IDLE_USD_PER_HOUR[node]
        add("infercost_gpu_idle_cost_usd_total", lbl, {0: idle[0] / HOUR, 1: idle[1] / HOUR})
        add("infercost_gpu_cost_usd_total", lbl, {0: GPU_USD_PER_HOUR / HOUR, 1: GPU_USD_PER_HOUR / HOUR})
        add("infercost_gpu_utilization_ratio", lbl, {0: util, 1: util}, kind="gauge")
        info = f'{lbl},uuid="GPU-{node}",gpu_model="{gpu_model}",mig_parent=""'
        add("infercost_gpu_info", info, {0: 1.0, 1: 1.0}, kind="gauge")
    out = []
    for name, lines in families.items():
        family = name.removesuffix("_total")
        kind = "counter" if name.endswith("_total") else "gauge"
        out.append(f"# TYPE {family} {kind}")
        out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"


def check_common(rep: WeeklyReport) -> None:
    """The hand figures both data paths must produce."""
    assert rep.end == T and rep.start == T - WEEK
    assert rep.total_usd == pytest.approx(840.0)
    assert rep.last_total_usd == pytest.approx(504.0)
    by = {(m.model, m.model_version): m for m in rep.models}
    assert list(by) == [("llama-70b", "v1"), ("llama-70b", "v2"), ("qwen-7b", "v1")]  # by cost, then name
    v1, v2, qwen = by[("llama-70b", "v1")], by[("llama-70b", "v2")], by[("qwen-7b", "v1")]
    assert v1.usd_per_1m_output == pytest.approx(336 / 604.8)
    assert v1.change_ratio == pytest.approx(1.0) and v1.baseline == "version"
    assert v2.usd_per_1m_output == pytest.approx(336 / 302.4)
    assert v2.baseline == "model" and v2.last_usd_per_1m_output == pytest.approx(336 / 604.8)
    assert v2.change_ratio == pytest.approx(2.0)
    assert qwen.usd_per_1m_output == pytest.approx(168 / 423.36)
    assert qwen.change_ratio == pytest.approx(1000 / 700)
    assert v1.usd_per_1m_total == pytest.approx(336 / (604.8 * 3))
    # Fleet: Σ cost / Σ output tokens, not the mean of the three ratios (0.6878).
    assert rep.usd_per_1m_output == pytest.approx(840 / 1330.56)
    assert [(m.model, m.model_version) for m in rep.regressions] == [("llama-70b", "v2"), ("qwen-7b", "v1")]
    # calendar days (UTC): a week ending at an hour boundary has a partial first and last day
    days = calendar_days(T - WEEK, T)
    hours = [(min(b, T) - max(a, T - WEEK)) / HOUR for a, b in zip(days, (*days[1:], math.inf), strict=True)]
    assert rep.daily_usd == pytest.approx([840.0 / 168 * h for h in hours])


# ---------------------------------------------------------------------------------------------
# From the local store
# ---------------------------------------------------------------------------------------------


def test_from_windows() -> None:
    rep = build_from_windows(windows(), end=T)
    check_common(rep)
    assert rep.source == "local store"
    assert rep.idle_usd == 0.0 and rep.last_idle_usd == 0.0
    assert rep.utilization_by == "engine"
    util = {u.group: (u.gpu_util_ratio, u.cost_usd) for u in rep.utilization}
    assert util == {"e1": (pytest.approx(0.8), 336.0), "e2": (pytest.approx(0.4), 336.0), "e3": (0.4, 168.0)}


def test_windows_outside_the_two_weeks_are_ignored() -> None:
    ws = windows()
    shifted = build_from_windows(ws, end=T + WEEK)  # "last week" is now the scenario's this week
    assert shifted.total_usd == 0.0
    assert shifted.last_total_usd == pytest.approx(840.0)
    assert shifted.models == ()
    assert build_from_windows([], end=T).last_total_usd is None


def test_idle_windows_and_no_tokens() -> None:
    """A version that produced no tokens: cost is idle, $/1M absent (not 0, not inf)."""
    usage = UsageWindow("node-c", "e9", "mixtral", "v3", T - 60, T, 0.0, 0.0, 60.0, None, gpu_util_ratio=0.0)
    w = CostWindow(
        usage,
        gpu_time_usd=0.05,
        energy_usd=0.01,
        usd_per_1m_output=None,
        usd_per_1m_total=None,
        idle_usd=0.06,
    )
    rep = build_from_windows([w], end=T)
    assert rep.idle_usd == pytest.approx(0.06)
    assert [(n.node, n.idle_usd) for n in rep.idle_by_node] == [("node-c", pytest.approx(0.06))]
    (m,) = rep.models
    assert m.usd_per_1m_output is None and m.usd_per_1m_total is None and m.change_ratio is None
    assert rep.usd_per_1m_output is None and rep.regressions == ()
    assert "| mixtral | v3 | $0.06 | 0 | — | — | — | — |" in render_markdown(rep)


def test_small_versions_are_not_regressions() -> None:
    """Under MIN_OUTPUT_TOKENS a version's ratio is noise and stays off the regression list."""
    tiny = [w for w in windows() if w.usage.model == "qwen-7b"]
    scale = (MIN_OUTPUT_TOKENS / 2) / sum(w.usage.generation_tokens for w in tiny if w.usage.end > T - WEEK)
    scaled = [
        CostWindow(
            UsageWindow(
                w.usage.node,
                w.usage.engine,
                w.usage.model,
                w.usage.model_version,
                w.usage.start,
                w.usage.end,
                w.usage.prompt_tokens * scale,
                w.usage.generation_tokens * scale,
                w.usage.gpu_seconds,
                None,
            ),
            w.gpu_time_usd,
            0.0,
            None,
            None,
            0.0,
        )
        for w in tiny
    ]
    rep = build_from_windows(scaled, end=T)
    assert rep.models[0].change_ratio == pytest.approx(1000 / 700)
    assert rep.regressions == ()


# ---------------------------------------------------------------------------------------------
# From a real Prometheus with two weeks of backfilled history
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with backfilled_prometheus(tmp_path_factory.mktemp("report_prom"), openmetrics()) as prom:
        yield prom


def test_from_prometheus(prometheus: Prometheus) -> None:
    rep = build_from_prometheus(prometheus.url, end=T)
    check_common(rep)
    assert rep.source == f"Prometheus {prometheus.url}"
    assert rep.idle_usd == pytest.approx(126.0)
    assert rep.last_idle_usd == pytest.approx(84.0)
    assert [(n.node, n.idle_usd) for n in rep.idle_by_node] == [
        ("node-a", pytest.approx(84.0)),
        ("node-b", pytest.approx(42.0)),
    ]
    assert rep.utilization_by == "gpu_model"
    util = {u.group: (u.gpu_util_ratio, u.cost_usd) for u in rep.utilization}
    assert util == {
        "NVIDIA A100-SXM4-80GB": (pytest.approx(0.4), pytest.approx(504.0)),
        "NVIDIA H100 80GB HBM3": (pytest.approx(0.8), pytest.approx(504.0)),
    }


def test_from_prometheus_end_from_clock(prometheus: Prometheus) -> None:
    rep = build_from_prometheus(prometheus.url, clock=ManualClock(start=T))
    assert rep.end == T and rep.total_usd == pytest.approx(840.0)


def test_both_paths_agree(prometheus: Prometheus) -> None:
    a, b = build_from_prometheus(prometheus.url, end=T), build_from_windows(windows(), end=T)
    assert [(m.model, m.model_version) for m in a.models] == [(m.model, m.model_version) for m in b.models]
    for x, y in zip(a.models, b.models, strict=True):
        assert x.usd_per_1m_output == pytest.approx(y.usd_per_1m_output)
        assert x.change_ratio == pytest.approx(y.change_ratio)
        assert (
            x.like_change_ratio == pytest.approx(y.like_change_ratio) and x.like_baseline == y.like_baseline
        )
        assert x.trend is not None and y.trend is not None
        assert x.trend.daily_usd == pytest.approx(y.trend.daily_usd)
    assert a.savings == b.savings


def test_unreachable_prometheus_raises_report_error() -> None:
    from netutil import free_port

    with pytest.raises(ReportError, match="cannot query Prometheus"):
        build_from_prometheus(f"http://127.0.0.1:{free_port()}", end=T)


def test_http_error_raises_report_error(prometheus: Prometheus) -> None:
    with pytest.raises(ReportError, match="HTTP 404"):
        build_from_prometheus(f"{prometheus.url}/not-prometheus", end=T)


# ---------------------------------------------------------------------------------------------
# Renderers
# ---------------------------------------------------------------------------------------------


def test_markdown() -> None:
    md = render_markdown(build_from_windows(windows(), end=T))
    assert md.startswith("# infercost weekly cost report: ")
    assert "| Total cost | $840.00 | $504.00 | +66.7 % |" in md
    assert (
        "| llama-70b | v2 | $336.00 | 302.40 M | $1.1111 | $0.5556 | +100.0 % | model, all versions | — |"
        in md
    )
    # qwen: 1000 → 700 tok/s stays in one load band (2^9 ≤ tps < 2^10): a like-load comparison
    assert (
        "| qwen-7b | v1 | $168.00 | 423.36 M | $0.3968 | $0.2778 | +42.9 % | same version | +42.9 % vs" in md
    )
    # v2 at 500 tok/s shares no load band with v1 at 1000: the plain change, said to be so;
    # excess = $336 − 302.4 M × $0.5556/1M = $168
    assert (
        "- **llama-70b v2**: $1.1111 per 1M output tokens, +100.0 % (not at like load: no common load band) "
        "vs model, all versions last week ($0.5556); $168.00 more this week" in md
    )
    # qwen: $168 − 423.36 M × $0.27778/1M = $50.40
    assert "+42.9 % at like load vs same version last week (100 % of tokens compared); $50.40 more" in md
    # e2 at 40 % busy over 167 steady hours ($334): 334 × (1 − 0.4 / 0.85) = $176.82
    assert "| low utilisation at steady load | node-b/e2 llama-70b v2 | $176.82 |" in md
    assert "| e1 | 80.0 % | $336.00 |" in md


def test_csv() -> None:
    rows = list(csv.DictReader(io.StringIO(render_csv(build_from_windows(windows(), end=T)))))
    assert [r["model_version"] for r in rows] == ["v1", "v2", "v1", ""]
    v2 = rows[1]
    assert float(v2["cost_usd"]) == 336.0 and float(v2["output_tokens"]) == 302_400_000
    assert float(v2["usd_per_1m_output"]) == pytest.approx(1.11111, rel=1e-5)
    assert float(v2["change_ratio"]) == pytest.approx(2.0) and v2["baseline"] == "model"
    total = rows[-1]
    assert total["model"] == "(all)" and float(total["cost_usd"]) == 840.0
    assert float(total["usd_per_1m_output"]) == pytest.approx(840 / 1330.56, rel=1e-5)


def test_html_is_self_contained_and_escaped() -> None:
    ws = windows()
    evil = ws[-1].usage
    ws.append(
        CostWindow(
            UsageWindow(
                evil.node, "e4", "<script>alert(1)</script>", "v&1", evil.start, evil.end, 1.0, 1.0, 1.0, None
            ),
            0.01,
            0.0,
            1e4,
            5e3,
            0.0,
        )
    )
    page = render_html(build_from_windows(ws, end=T))
    assert page.startswith("<!DOCTYPE html>")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "v&amp;1" in page
    assert "<svg" in page and "$840.01" in page
    for external in ("http://", "https://", "src=", "<link", "@import"):
        assert external not in page.replace('xmlns="http://www.w3.org/2000/svg"', ""), external


def _chromium() -> str:
    path = shutil.which("chromium")
    assert path, "chromium not found: apt-get install chromium (CI's .ci/run does)"
    return path


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--hide-scrollbars",
)


def test_html_renders_in_chromium(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(build_from_windows(windows(), end=T)))
    png = tmp_path / "report.png"
    common = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    shot = subprocess.run(
        [*common, "--window-size=1100,1400", f"--screenshot={png}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert png.exists(), shot.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000, "a page of tables and bars is more than a blank PNG"
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert "$840.00" in dom.stdout and "$504.00" in dom.stdout
    assert "llama-70b" in dom.stdout and "<svg" in dom.stdout


# ---------------------------------------------------------------------------------------------
# `infercost report` (agent.report.cli): through the real store and the real Prometheus
# ---------------------------------------------------------------------------------------------


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "state_dir": None,
        "prometheus": None,
        "format": "md",
        "end": T,
        "output": None,
    }
    return argparse.Namespace(**{**base, **kw})


def test_cli_from_store(tmp_path: Path) -> None:
    store = Store(tmp_path / "history.sqlite", retention_days=35, clock=ManualClock(start=T))
    store.write_windows(windows())
    out = tmp_path / "report.csv"
    assert run_report(_args(state_dir=tmp_path, format="csv", output=out)) == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert rows[-1]["model"] == "(all)" and float(rows[-1]["cost_usd"]) == pytest.approx(840.0)
    v2 = next(r for r in rows if r["model_version"] == "v2")
    assert float(v2["change_ratio"]) == pytest.approx(2.0) and v2["baseline"] == "model"


def test_cli_from_prometheus(prometheus: Prometheus, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_report(_args(prometheus=prometheus.url)) == 0
    assert "| Total cost | $840.00 | $504.00 | +66.7 % |" in capsys.readouterr().out


def test_cli_missing_store_is_an_error(tmp_path: Path) -> None:
    assert run_report(_args(state_dir=tmp_path / "nope")) == 1


# ---------------------------------------------------------------------------------------------
# Behind a gateway, as Thanos / Mimir / managed Prometheus are reached: auth, TLS, tenant header
# ---------------------------------------------------------------------------------------------


def _pki(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it (openssl)."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl missing (CI's .ci/run installs it)"

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=report test CA")  # fmt: skip
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "tls.key",
        "-out",
        "tls.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "tls.crt", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return d / "ca.crt", d / "tls.crt", d / "tls.key"


@pytest.fixture
async def gateway(
    prometheus: Prometheus, tmp_path: Path
) -> AsyncIterator[tuple[str, Path, list[dict[str, str]]]]:
    """An HTTPS gateway in front of the real Prometheus that, like Mimir's or a managed
    Prometheus' front end, refuses a request without the tenant header and valid credentials
    (bearer token ``tok-123`` or basic ``report:s3cret``). Yields (URL, CA file, headers seen)."""
    import base64
    import ssl

    import aiohttp
    from aiohttp import web

    ca, cert, key = _pki(tmp_path)
    seen: list[dict[str, str]] = []
    good = {"Bearer tok-123", "Basic " + base64.b64encode(b"report:s3cret").decode()}

    async def handle(request: web.Request) -> web.Response:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        if request.headers.get("X-Scope-OrgID") != "team-a":
            return web.Response(status=401, text="no org id")
        if request.headers.get("Authorization") not in good:
            return web.json_response({"status": "error", "error": "unauthorized"}, status=401)
        async with aiohttp.ClientSession() as s:
            upstream = f"{prometheus.url}/{request.match_info['tail']}?{request.query_string}"
            async with s.get(upstream) as r:
                return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    app = web.Application()
    app.router.add_get("/prometheus/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}/prometheus", ca, seen
    finally:
        await runner.cleanup()


async def test_from_prometheus_behind_an_authenticating_gateway(
    gateway: tuple[str, Path, list[dict[str, str]]], tmp_path: Path
) -> None:
    import asyncio

    url, ca, seen = gateway
    token = tmp_path / "token"
    token.write_text("tok-123\n")
    password = tmp_path / "password"
    password.write_text("s3cret")
    tenant = (("X-Scope-OrgID", "team-a"),)
    for auth in (
        PromAuth(bearer_token_file=token, ca_file=ca, headers=tenant),
        PromAuth(basic_auth_user="report", basic_auth_password_file=password, ca_file=ca, headers=tenant),
    ):
        rep = await asyncio.to_thread(build_from_prometheus, url, T, None, None, auth)
        check_common(rep)
    assert {h["x-scope-orgid"] for h in seen} == {"team-a"}  # on every query
    # without the tenant header, with a wrong token, or without the CA: a clear error, no report
    with pytest.raises(ReportError, match="HTTP 401"):
        await asyncio.to_thread(
            build_from_prometheus, url, T, None, None, PromAuth(bearer_token_file=token, ca_file=ca)
        )
    token.write_text("wrong")
    with pytest.raises(ReportError, match="HTTP 401: unauthorized"):
        await asyncio.to_thread(
            build_from_prometheus,
            url,
            T,
            None,
            None,
            PromAuth(bearer_token_file=token, ca_file=ca, headers=tenant),
        )
    with pytest.raises(ReportError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        await asyncio.to_thread(
            build_from_prometheus, url, T, None, None, PromAuth(bearer_token_file=token, headers=tenant)
        )
    # the same through `infercost report` options
    token.write_text("tok-123")
    out = tmp_path / "report.json"
    args = _args(
        prometheus=url,
        format="json",
        output=out,
        bearer_token_file=token,
        ca_file=ca,
        header=["X-Scope-OrgID: team-a"],
    )
    assert await asyncio.to_thread(run_report, args) == 0
    assert json.loads(out.read_text())["total_usd"] == pytest.approx(840.0)


def test_prometheus_auth_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ReportError, match=f"{missing}: cannot read the bearer token file"):
        PromAuth(bearer_token_file=missing).request_headers()
    with pytest.raises(ReportError, match="without a password file"):
        PromAuth(basic_auth_user="u").request_headers()
    with pytest.raises(ReportError, match="expected 'Name: value'"):
        parse_header("X-Scope-OrgID team-a")
    with pytest.raises(ReportError, match="expected 'Name: value'"):
        parse_header("X-Evil: a\r\nInjected: b")
    assert parse_header(" X-Scope-OrgID :  team-a ") == ("X-Scope-OrgID", "team-a")


async def test_cli_posts_the_summary_to_slack_and_dates_the_file(
    prometheus: Prometheus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the chart's CronJob runs: the report to a dated file, the summary to a Slack webhook."""
    import asyncio
    import datetime as dt

    from receivers import Receiver

    slack = Receiver("slack", path="/services/T0/B0/secret")
    await slack.start()
    try:
        monkeypatch.setenv("TEST_REPORT_SLACK", slack.url)
        args = _args(
            prometheus=prometheus.url,
            format="html",
            output=tmp_path / "fleet-%Y-%m-%d.html",
            slack_webhook_env="TEST_REPORT_SLACK",
        )
        assert await asyncio.to_thread(run_report, args) == 0
        day = dt.datetime.fromtimestamp(T, dt.UTC).strftime("%Y-%m-%d")
        assert (tmp_path / f"fleet-{day}.html").read_text().startswith("<!DOCTYPE html>")
        (msg,) = slack.received
        assert msg["text"].startswith("*infercost weekly cost report*")
        assert "Total $840.00 (last week $504.00, +66.7 %)" in msg["text"]
        monkeypatch.setenv("TEST_REPORT_SLACK", "")
        assert await asyncio.to_thread(run_report, args) == 1  # no webhook: an error, not a silent skip
    finally:
        await slack.stop()


def test_an_empty_week_renders_everywhere() -> None:
    """A store with nothing in the two weeks: every format renders, absent stays absent."""
    rep = build_from_windows([], end=T)
    n = len(calendar_days(T - WEEK, T))
    assert rep.daily_usd == (None,) * n and rep.models == () and rep.savings == ()
    assert json.loads(render_json(rep))["daily_usd"] == [None] * n
    assert (
        "| 20" in render_markdown(rep) and "$0.00 |" not in render_markdown(rep).split("## Cost per day")[1]
    )
    assert render_html(rep).startswith("<!DOCTYPE html>")
    (total,) = csv.DictReader(io.StringIO(render_csv(rep)))
    assert total["model"] == "(all)"


def test_an_outlier_hour_does_not_flatten_the_chart() -> None:
    """One near-idle hour at $1,000 per 1M among $1 hours: the axis stops at 2 × the 95th
    percentile ($2) and the hour is marked at the top edge; without outliers nothing is marked."""
    from agent.report.render import axis_max, line_chart

    hours: list[float | None] = [1.0] * 167 + [1000.0]
    assert axis_max([v for v in hours if v is not None]) == 2.0
    svg = line_chart("t", [(hours, "#000", "l")], 168, T)
    assert ">$2.00</text>" in svg and "above the axis" in svg
    assert "above the axis" not in line_chart("t", [([1.0] * 168, "#000", "l")], 168, T)
