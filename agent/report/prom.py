"""The weekly report from Prometheus' HTTP API (the fleet), also behind what fleets put in front of
Prometheus (Thanos Query, Mimir, managed Prometheus): a bearer token or basic-auth password read
from a file, a CA bundle, and extra headers such as ``X-Scope-OrgID``.

The agents' raw counters are read as ``increase(…[1h])`` at a 1-hour step over the two weeks
before ``end`` (one range query per series family), which gives the same hourly rows as the local
store (where GPU time went: ``increase`` of the two ``bound``-labelled families, summed by bound);
:func:`agent.report.data.assemble` does the rest. Correct whether or not the fleet recording
rules were deployed, and cheap: a dozen range queries per report.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import math
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.clock import Clock, SystemClock
from agent.cost.bound import BOUNDS
from agent.records import BOUND_SUMS, DeployEvent
from agent.report.data import (
    HOUR_SECONDS,
    WEEK_SECONDS,
    BoundSplit,
    DollarSplit,
    HourRow,
    ReportError,
    UtilRow,
    WeeklyReport,
    assemble,
)

logger = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 30.0  # seconds; two weeks at 1 h steps is a moderate query on a big Prometheus
SERIES = ("node", "engine", "model", "model_version")
# hourly row field → PromQL (``{by}`` is the label list); counters summed, gauges averaged
HOURLY: Mapping[str, str] = {
    "cost_usd": "sum by ({by}) (increase(infercost_cost_usd_total[1h]))",
    "output_tokens": "sum by ({by}) (increase(infercost_generation_tokens_total[1h]))",
    "prompt_tokens": "sum by ({by}) (increase(infercost_prompt_tokens_total[1h]))",
    "idle_usd": "sum by ({by}) (increase(infercost_idle_cost_usd_total[1h]))",
    "gpu_seconds": "sum by ({by}) (increase(infercost_gpu_seconds_total[1h]))",
    "gpu_util_ratio": "avg by ({by}) (avg_over_time(infercost_model_gpu_utilization_ratio[1h]))",
    "requests_running": "avg by ({by}) (avg_over_time(infercost_requests_running[1h]))",
    "roofline_ratio": "avg by ({by}) (avg_over_time(infercost_roofline_efficiency_ratio[1h]))",
    # prefill's share and the part the efficiency took out (the waterfall's mix, as `infercost explain`)
    "prefill_share": "avg by ({by}) (avg_over_time(infercost_prefill_share_ratio[1h]))",
    "prefill_floor": "avg by ({by}) (avg_over_time(infercost_prefill_share_floor_ratio[1h]))",
    # where the dollars went (agent.report.data.DollarSplit, see _split)
    "prompt_usd": "sum by ({by}) (increase(infercost_prompt_cost_usd_total[1h]))",
    "usage_usd": "sum by ({by}) (increase(infercost_usage_cost_usd_total[1h]))",
    "cache_saved_usd": "sum by ({by}) (increase(infercost_prefix_cache_saved_usd_total[1h]))",
    "floor": "avg by ({by}) (avg_over_time(infercost_usd_per_1m_output_tokens_floor[1h]))",
    "floor_max": "avg by ({by}) (avg_over_time(infercost_usd_per_1m_output_tokens_floor_max_batch[1h]))",
}
# where GPU time went, by bound (agent.report.data.BoundSplit): field prefix → PromQL, by the series
# labels and ``bound``; each bound's hourly increase lands in ``<prefix>_<bound>``
BOUND_HOURLY: Mapping[str, str] = {
    "seconds": "sum by ({by}, bound) (increase(infercost_gpu_time_bound_seconds_total[1h]))",
    "usd": "sum by ({by}, bound) (increase(infercost_cost_bound_usd_total[1h]))",
}
# Attach gpu_model to per-GPU series from infercost_gpu_info (any GPU seen during the week).
GPU_MODEL_JOIN = (
    "* on (node, gpu) group_left (gpu_model)"
    " max by (node, gpu, gpu_model) (max_over_time(infercost_gpu_info[1w]))"
)


@dataclass(frozen=True, slots=True)
class PromAuth:
    """How to reach a Prometheus-compatible API. Secrets are files, read when the report runs."""

    bearer_token_file: Path | None = None  # Authorization: Bearer <file contents>
    basic_auth_user: str | None = None  # with basic_auth_password_file
    basic_auth_password_file: Path | None = None
    ca_file: Path | None = None  # PEM bundle that signs the server's certificate
    headers: tuple[tuple[str, str], ...] = ()  # e.g. (("X-Scope-OrgID", "team-a"),)

    def request_headers(self) -> dict[str, str]:
        """The HTTP headers to send (raises ReportError naming the file that cannot be read)."""
        out = {"Accept": "application/json", "User-Agent": "infercost-report"}
        for k, v in self.headers:
            out[k] = v
        if self.bearer_token_file is not None:
            out["Authorization"] = f"Bearer {_read_secret(self.bearer_token_file, 'bearer token')}"
        elif self.basic_auth_user is not None:
            if self.basic_auth_password_file is None:
                raise ReportError("basic auth: a user without a password file; fix: pass the password file")
            pw = _read_secret(self.basic_auth_password_file, "basic-auth password")
            cred = base64.b64encode(f"{self.basic_auth_user}:{pw}".encode()).decode()
            out["Authorization"] = f"Basic {cred}"
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS context trusting ``ca_file`` (None: the system's default trust)."""
        if self.ca_file is None:
            return None
        try:
            return ssl.create_default_context(cafile=str(self.ca_file))
        except (OSError, ssl.SSLError) as err:
            raise ReportError(f"{self.ca_file}: cannot load the CA bundle: {err}") from None


def parse_header(text: str) -> tuple[str, str]:
    """``Name: value`` → (name, value); raises ReportError on a malformed header."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name or any(c in text for c in "\r\n") or not name.replace("-", "").isalnum():
        raise ReportError(f"header {text!r}: expected 'Name: value' (e.g. 'X-Scope-OrgID: team-a')")
    return name, value


def _read_secret(path: Path, what: str) -> str:
    try:
        value = path.read_text().strip()
    except OSError as err:
        raise ReportError(f"{path}: cannot read the {what} file: {err.strerror}") from None
    if not value:
        raise ReportError(f"{path}: the {what} file is empty")
    return value


Fetch = Callable[[str], Any]  # URL → decoded JSON body


def http_fetcher(auth: PromAuth | None = None) -> Fetch:
    """A blocking JSON GET with ``auth``'s headers and TLS trust."""
    auth = auth or PromAuth()
    headers = auth.request_headers()
    context = auth.ssl_context()

    def fetch(url: str) -> Any:
        req = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S, context=context) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            try:
                detail = json.loads(err.read()).get("error", "")
            except (ValueError, OSError, AttributeError):
                detail = ""
            raise ReportError(f"Prometheus answered HTTP {err.code}: {detail or err.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise ReportError(f"cannot query Prometheus: {err}") from None

    return fetch


class PromApi:
    """The few Prometheus HTTP API calls the report makes."""

    def __init__(self, base_url: str, fetch: Fetch) -> None:
        self.base = base_url.rstrip("/")
        self.fetch = fetch

    def _call(self, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
        body = self.fetch(f"{self.base}{path}?{urllib.parse.urlencode(params)}")
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ReportError(f"Prometheus query failed: {body!r:.300}")
        return list(body["data"]["result"])

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """Instant vector at ``at``."""
        return self._call("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Range matrix from ``start`` to ``end``."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.0f}s"}
        return self._call("/api/v1/query_range", params)


def _num(v: Any) -> float | None:
    x = float(v)
    return None if math.isnan(x) or math.isinf(x) else x


def _split(f: Mapping[str, float]) -> DollarSplit:
    """One series-hour's dollars split from the exported series. An hour with a prompt-cost (or
    usage-cost) increase counts its whole cost and tokens as covered by the split (or the usage
    basis); the floor gauges' hourly mean prices the hour's output tokens. Both are exact when
    the figure is known for the whole hour (the agent exports it from the first window that has it)."""
    cost, gen = f.get("cost_usd", 0.0), f.get("output_tokens", 0.0)
    split, usage = "prompt_usd" in f, "usage_usd" in f
    floor = f.get("floor") if gen > 0 else None
    floor_max = f.get("floor_max") if gen > 0 else None
    return DollarSplit(
        prompt_usd=f.get("prompt_usd", 0.0),
        split_usd=cost if split else 0.0,
        split_prompt_tokens=f.get("prompt_tokens", 0.0) if split else 0.0,
        split_generation_tokens=gen if split else 0.0,
        usage_usd=f.get("usage_usd", 0.0),
        usage_alloc_usd=cost if usage else 0.0,
        cache_saved_usd=f.get("cache_saved_usd", 0.0),
        floor_usd=0.0 if floor is None else floor * gen / 1e6,
        floor_cost_usd=0.0 if floor is None else cost,
        floor_tokens=0.0 if floor is None else gen,
        floor_max_usd=0.0 if floor_max is None else floor_max * gen / 1e6,
        floor_max_cost_usd=0.0 if floor_max is None else cost,
        floor_max_tokens=0.0 if floor_max is None else gen,
    )


def hourly_rows(api: PromApi, end: float) -> list[HourRow]:
    """The two weeks before ``end`` as hourly rows (a point at t is the hour (t − 1 h, t])."""
    first = end - 2 * WEEK_SECONDS
    by = ", ".join(SERIES)
    acc: dict[tuple[tuple[str, ...], float], dict[str, float]] = defaultdict(dict)
    for name, expr in HOURLY.items():
        for s in api.query_range(expr.format(by=by), first + HOUR_SECONDS, end, HOUR_SECONDS):
            labels = tuple(str(s["metric"].get(k, "")) for k in SERIES)
            for ts, v in s["values"]:
                x = _num(v)
                if x is not None:
                    acc[(labels, float(ts) - HOUR_SECONDS)][name] = x
    for unit, expr in BOUND_HOURLY.items():
        for s in api.query_range(expr.format(by=by), first + HOUR_SECONDS, end, HOUR_SECONDS):
            labels = tuple(str(s["metric"].get(k, "")) for k in SERIES)
            bound = str(s["metric"].get("bound", ""))
            if bound not in BOUNDS:
                continue  # a bound this agent does not know (a newer exporter): not counted
            for ts, v in s["values"]:
                x = _num(v)
                if x is not None:
                    acc[(labels, float(ts) - HOUR_SECONDS)][f"bound_{bound}_{unit}"] = x
    rows = []
    for (labels, hour), f in acc.items():
        if "cost_usd" not in f and "output_tokens" not in f:
            continue  # a gauge alone is no hour of cost data
        tokens = f.get("output_tokens", 0.0) + f.get("prompt_tokens", 0.0)
        gpu_s = f.get("gpu_seconds", 0.0)
        rows.append(
            HourRow(
                labels[0],
                labels[1],
                labels[2],
                labels[3] or "unknown",
                hour=hour,
                seconds=HOUR_SECONDS,
                prompt_tokens=f.get("prompt_tokens", 0.0),
                output_tokens=f.get("output_tokens", 0.0),
                cost_usd=f.get("cost_usd", 0.0),
                idle_usd=f.get("idle_usd", 0.0),
                gpu_seconds=gpu_s,
                idle_gpu_seconds=None if tokens > 0 or "gpu_seconds" not in f else gpu_s,
                gpu_util_ratio=f.get("gpu_util_ratio"),
                requests_running=f.get("requests_running"),
                roofline_ratio=f.get("roofline_ratio"),
                prefill_share=f.get("prefill_share"),
                prefill_floor=f.get("prefill_floor"),
                split=_split(f),
                bound=BoundSplit(*(f.get(name, 0.0) for name in BOUND_SUMS)),
                # no token series at all that hour: an engine that counts none (absent, not 0)
                tokenless_seconds=0.0 if "output_tokens" in f or "prompt_tokens" in f else HOUR_SECONDS,
            )
        )
    return rows


def deploys_from_rows(rows: Sequence[HourRow]) -> list[DeployEvent]:
    """Version changes of each (node, engine, model) seen hour to hour (Prometheus keeps no deploy
    log): at the first hour of a new version after another version was seen."""
    seen: dict[tuple[str, str, str], list[HourRow]] = defaultdict(list)
    for r in rows:
        seen[(r.node, r.engine, r.model)].append(r)
    out = []
    for (node, engine, model), rs in seen.items():
        versions: dict[str, float] = {}
        for r in rs:
            versions[r.model_version] = min(versions.get(r.model_version, r.hour), r.hour)
        ordered = sorted(versions.items(), key=lambda kv: kv[1])
        for (old, _), (new, at) in itertools.pairwise(ordered):
            out.append(DeployEvent(node, engine, model, old, new, at))
    out.sort(key=lambda d: (d.at, d.node, d.engine, d.model))
    return out


def _scalar(api: PromApi, expr: str, at: float) -> float | None:
    result = api.query(expr, at)
    return _num(result[0]["value"][1]) if result else None


def build_from_prometheus(
    url: str,
    end: float | None = None,
    clock: Clock | None = None,
    fetch: Fetch | None = None,
    auth: PromAuth | None = None,
    tz: str = "UTC",
) -> WeeklyReport:
    """The fleet's week ending at ``end`` (default: now by ``clock``) from Prometheus' HTTP API at
    ``url`` (e.g. ``http://prometheus:9090``), in the calendar days of ``tz``. Raises
    :class:`ReportError` when it cannot."""
    end = (clock or SystemClock()).now() if end is None else end
    api = PromApi(url, fetch or http_fetcher(auth))
    start = end - WEEK_SECONDS
    rows = hourly_rows(api, end)
    idle_expr = "sum(increase(infercost_gpu_idle_cost_usd_total[1w]))"
    idle = _scalar(api, idle_expr, end)
    last_idle = _scalar(api, idle_expr, start)
    idle_by_node = {
        str(s["metric"].get("node", "")): v
        for s in api.query("sum by (node) (increase(infercost_gpu_idle_cost_usd_total[1w]))", end)
        if (v := _num(s["value"][1])) is not None
    }
    util = {
        str(s["metric"].get("gpu_model", "")): _num(s["value"][1])
        for s in api.query(
            f"avg by (gpu_model) (avg_over_time(infercost_gpu_utilization_ratio[1w]) {GPU_MODEL_JOIN})", end
        )
    }
    gpu_cost = {
        str(s["metric"].get("gpu_model", "")): _num(s["value"][1]) or 0.0
        for s in api.query(
            f"sum by (gpu_model) (increase(infercost_gpu_cost_usd_total[1w]) {GPU_MODEL_JOIN})", end
        )
    }
    logger.info("weekly report from %s: %d hourly series rows", url, len(rows))
    return assemble(
        rows,
        end=end,
        source=f"Prometheus {url}",
        deploys=deploys_from_rows(rows),
        idle_usd=idle if idle is not None else None,
        last_idle_usd=last_idle,
        idle_by_node=idle_by_node if idle is not None else None,
        utilization=[
            UtilRow(g, util.get(g), gpu_cost.get(g, 0.0)) for g in sorted(set(util) | set(gpu_cost))
        ],
        utilization_by="gpu_model",
        tz=tz,
    )
