"""The cost query API: ``GET /api/v1/cost?window=…&aggregate=…&costBasis=allocation|usage``.

OpenCost's inference-cost parameter names over the node's own history (docs/cost-allocation.md):

- ``window``: a duration back from now (``30m``, ``1h``, ``24h``, ``7d``, ``2w``) or a pair of RFC 3339
  times (or Unix seconds) ``start,end``. A minute belongs to the window its start lies in. A window
  reaching before the history held (the store's retention) is read from the oldest minute kept and
  says so in ``warnings``.
- ``aggregate``: a comma list of ``node``, ``engine``, ``pod``, ``namespace``, ``role``, ``group``,
  ``model_name``, ``model_version`` or a cost label key (``team``, ``app.kubernetes.io/part-of``,
  also written ``label:team`` or ``label_team``). A minute whose engine lacks the property is in the
  ``__unallocated__`` group, as in OpenCost.
- ``costBasis``: ``allocation`` (default: every dollar of the GPU time an engine held) or ``usage``
  (the dollars of the time its GPUs were busy; the rest is idle).
- ``shareIdle``: ``true`` / ``false`` overrides ``allocation.idle_policy`` for one request.

Idle dollars (GPUs no engine used, and on the usage basis the held time no kernel ran) are their own
``__idle__`` item, or shared among the groups in proportion to their dollars. Over all items the
dollars add up to what the node's GPUs cost in the window, under either basis and policy.

Bounded work: one SQL scan of the window's minutes (at most the retention), stopped after
:data:`QUERY_SECONDS`; at most :data:`MAX_ITEMS` items. Served by the /metrics server, behind its
TLS and authentication.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime as dt
import math
import re
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from agent.config import cost_label_name
from agent.records import MINUTE, tokens_counted
from agent.sinks.costlabels import TABLE, has_table, parse_info

Basis = Literal["allocation", "usage"]
BASES: tuple[str, ...] = ("allocation", "usage")
IDLE = "__idle__"
UNALLOCATED = "__unallocated__"
# Properties of a minute every engine has; anything else is a cost label key.
BUILTIN = ("node", "engine", "pod", "namespace", "role", "group", "model_name", "model_version")
# Why 30 s: a 35-day window of a busy node is a few million minute rows, seconds of SQLite work even
# on a loaded node; a query still running after that is starving the node's tick of the disk and
# is stopped (503, "ask for a shorter window")
QUERY_SECONDS = 30.0
# Why 10,000: groups are at most series × identities, a few hundred on a node; more is a runaway
# label, and a page of 10,000 items is already more than a person or a dashboard reads.
MAX_ITEMS = 10_000
# Why a day: beyond it a window holds a large share of a 35-day store's rows, and a scan in
# primary-key order reads them faster than the minute index does (agent.store.hourly_model_sums)
SCAN_AFTER_SECONDS = 86400.0
# Why 256: engines change identity at a rollout that relabels them, a few times a week; more cuts
# inside one window is a relabelling loop, read with one identity lookup per minute instead
MAX_SEGMENTS = 256
MAX_AGGREGATE = 8  # properties per request (why: each multiplies the items; OpenCost UIs use 1–2)
_DURATION = re.compile(r"^(\d{1,6})(m|h|d|w)$")
_UNIT_SECONDS = {"m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,252}$")
PARAMS = ("window", "aggregate", "costBasis", "shareIdle", "accumulate")


class BadRequest(ValueError):
    """A request the API cannot answer; the message says which parameter and what it accepts."""


@dataclass(frozen=True, slots=True)
class CostQuery:
    """One question: a window, the properties to group by, a basis and an idle policy."""

    start: float  # epoch seconds
    end: float  # epoch seconds (exclusive)
    aggregate: tuple[str, ...]
    basis: Basis = "allocation"
    share_idle: bool = False
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MinuteSums:
    """Sums over the window of one (node, engine, model, version, identity)."""

    node: str
    engine: str
    model: str
    model_version: str
    info: Mapping[str, Any]  # the engine's cost identity then (agent.sinks.costlabels)
    prompt_tokens: float = 0.0  # tokens
    generation_tokens: float = 0.0  # tokens
    cost_usd: float = 0.0  # dollars (allocation)
    idle_usd: float = 0.0  # dollars of minutes without tokens (part of cost_usd)
    prompt_usd: float = 0.0  # dollars of prefill time, over the minutes with a split
    split_usd: float = 0.0  # dollars of the minutes with a split
    usage_usd: float = 0.0  # dollars of GPU busy time, over the minutes with a utilisation reading
    usage_alloc_usd: float = 0.0  # allocation dollars of those minutes
    seconds: float = 0.0  # seconds the minutes cover
    tokenless_seconds: float = 0.0  # seconds of them whose engine has no token counter


@dataclass(slots=True)
class Item:
    """One group's figures (what the API returns, before rounding to JSON)."""

    key: dict[str, str]
    cost_usd: float = 0.0
    idle_usd: float = 0.0
    prompt_share: float | None = None  # prefill share of the dollars (0–1), None without a split
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    _prompt_usd: float = 0.0
    _split_usd: float = 0.0
    own_usd: float = field(default=0.0, repr=False)  # before any shared idle
    seconds: float = 0.0
    tokenless_seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """The item in the API's camelCase shape; per-token prices null where not known, and the
        tokens themselves null for a group whose engines count none (a plain Triton): absent, not 0."""
        prompt = None if self.prompt_share is None else self.cost_usd * self.prompt_share
        output = None if prompt is None else self.cost_usd - prompt
        counted = tokens_counted(self.tokenless_seconds, self.seconds)
        prompt_tokens = self.prompt_tokens if counted else None
        output_tokens = self.output_tokens if counted else None
        return {
            "key": dict(self.key),
            "costUsd": self.cost_usd,
            "idleUsd": self.idle_usd,
            "promptCostUsd": prompt,
            "outputCostUsd": output,
            "promptTokens": prompt_tokens,
            "outputTokens": output_tokens,
            "usdPer1MInputTokens": _per_million(prompt, prompt_tokens),
            "usdPer1MOutputTokens": _per_million(output, output_tokens),
        }


def _per_million(usd: float | None, tokens: float | None) -> float | None:
    return None if usd is None or tokens is None or tokens <= 0 else usd / tokens * 1e6


# ------------------------------------------------------------------------------- parameters
def rfc3339(t: float) -> str:
    """Epoch seconds as RFC 3339 in UTC (``2026-06-11T00:00:00Z``)."""
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _instant(text: str) -> float:
    text = text.strip()
    if re.fullmatch(r"\d{9,11}(\.\d+)?", text):
        return float(text)
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadRequest(
            f"window: {text[:40]!r} is not an RFC 3339 time such as 2026-06-11T00:00:00Z"
        ) from None
    if t.tzinfo is None:
        raise BadRequest(f"window: {text[:40]!r} has no offset; write it with Z or +HH:MM (RFC 3339)")
    return t.timestamp()


def parse_window(text: str, now: float) -> tuple[float, float]:
    """(start, end) epoch seconds of a ``window`` value (see the module docstring)."""
    text = text.strip()
    m = _DURATION.match(text)
    if m is not None:
        secs = int(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        if secs <= 0:
            raise BadRequest("window: a duration must be longer than 0, e.g. 1h")
        return now - secs, now
    if "," in text:
        a, _, b = text.partition(",")
        start, end = _instant(a), _instant(b)
        if end <= start:
            raise BadRequest("window: the end must be after the start (start,end)")
        return start, end
    raise BadRequest(
        f"window: {text[:40]!r} is neither a duration (30m, 1h, 24h, 7d, 2w) nor an RFC 3339 pair "
        "such as 2026-06-11T00:00:00Z,2026-06-11T12:00:00Z"
    )


def parse_aggregate(text: str) -> tuple[str, ...]:
    """The properties of an ``aggregate`` value: built-in names or cost label keys."""
    out: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name.startswith("label:"):
            name = name[len("label:") :]
        if name not in BUILTIN and not _LABEL_KEY.match(name):
            raise BadRequest(
                f"aggregate: {name[:64]!r} is neither one of {', '.join(BUILTIN)} nor a label key "
                "(such as team or app.kubernetes.io/part-of)"
            )
        if name not in out:
            out.append(name)
    if not out:
        raise BadRequest(f"aggregate: give a comma list of {', '.join(BUILTIN)} or cost label keys")
    if len(out) > MAX_AGGREGATE:
        raise BadRequest(f"aggregate: at most {MAX_AGGREGATE} properties")
    return tuple(out)


def parse_query(
    params: Mapping[str, str],
    now: float,
    retention_seconds: float,
    share_idle: bool = False,
    oldest: float | None = None,
) -> CostQuery:
    """A :class:`CostQuery` from request parameters; :class:`BadRequest` on any problem.

    ``oldest``: the first minute the history holds (a window before it says so)."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0]!r}; this API takes {', '.join(PARAMS)}")
    if "window" not in params:
        raise BadRequest(
            "window: required, e.g. window=24h or window=2026-06-11T00:00:00Z,2026-06-12T00:00:00Z"
        )
    start, end = parse_window(params["window"], now)
    aggregate = parse_aggregate(params.get("aggregate", "model_name,model_version"))
    basis = params.get("costBasis", "allocation").strip().lower()
    if basis not in BASES:
        raise BadRequest(f"costBasis: {basis[:40]!r} is not allocation or usage")
    flag = params.get("shareIdle")
    if flag is not None:
        if flag.strip().lower() not in ("true", "false"):
            raise BadRequest("shareIdle: give true or false")
        share_idle = flag.strip().lower() == "true"
    warnings: list[str] = []
    if end > now:
        end = now
        if end <= start:
            raise BadRequest("window: it lies in the future; nothing is known about it yet")
    kept = now - retention_seconds
    if start < kept:
        warnings.append(
            f"the window starts before the history this node keeps ({retention_seconds / 86400:g} days): "
            f"read from {rfc3339(kept)}"
        )
        start = kept
        if end <= start:
            raise BadRequest("window: it ends before the oldest minute this node keeps")
    elif oldest is not None and start < oldest - MINUTE:
        warnings.append(f"the history starts at {rfc3339(oldest)}, after the window's start")
    return CostQuery(start, end, aggregate, basis, share_idle, tuple(warnings))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- reading
_SUMS = (
    "prompt_tokens",
    "generation_tokens",
    "cost_usd",
    "idle_usd",
    "prompt_usd",
    "split_usd",
    "usage_usd",
    "usage_alloc_usd",
    "seconds",
    "tokenless_seconds",
)


class QueryTooLong(Exception):
    """The scan ran past :data:`QUERY_SECONDS`."""


def _deadline(db: sqlite3.Connection, seconds: float) -> Callable[[], None]:
    stop_at = time.monotonic() + seconds
    db.set_progress_handler(lambda: int(time.monotonic() > stop_at), 10_000)
    return lambda: db.set_progress_handler(None, 0)


def _identities(db: sqlite3.Connection) -> dict[tuple[str, str], list[tuple[float, str]]]:
    """(node, engine) → its kept identities as (since, info), oldest first (a handful each)."""
    out: dict[tuple[str, str], list[tuple[float, str]]] = {}
    if not has_table(db):
        return out
    for node, engine, since, info in db.execute(
        f"SELECT node, engine, since, info FROM {TABLE} ORDER BY since"
    ):
        out.setdefault((str(node), str(engine)), []).append((float(since), str(info)))
    return out


def _identity_at(kept: Sequence[tuple[float, str]], t: float) -> str | None:
    """The identity in effect at ``t``: the latest kept at or before it."""
    i = bisect.bisect_right([since for since, _ in kept], t) - 1
    return kept[i][1] if i >= 0 else None


def read_sums(
    db: sqlite3.Connection, start: float, end: float, seconds: float = QUERY_SECONDS
) -> list[MinuteSums]:
    """Model minutes in [start, end) summed per series and the engine identity of each minute.

    One scan: the window is cut at every identity change inside it (a handful; at most
    :data:`MAX_SEGMENTS`) and the minutes summed per series and piece, inside which every engine
    keeps one identity; the pieces then take their engines' identities in Python."""
    kept = _identities(db)
    cuts = sorted({since for rows in kept.values() for since, _ in rows if start < since < end})
    if len(cuts) > MAX_SEGMENTS:  # a relabelling storm: correct, slower (one lookup per minute)
        cuts = []
        info_sql = (
            f"(SELECT l.since FROM {TABLE} l WHERE l.node = m.node AND l.engine = m.engine "
            "AND l.since <= m.minute ORDER BY l.since DESC LIMIT 1)"
        )
    elif cuts:
        info_sql = " ".join(["CASE", *("WHEN m.minute < ? THEN ?" for _ in cuts), "ELSE ? END"])
    else:  # one piece: the whole window
        info_sql = "?"
    # a long window reads most rows: a sequential scan in primary-key order ("+minute" keeps SQLite
    # off the minute index) beats visiting them through the index, as the store's own weekly sums do
    col = "+m.minute" if end - start > SCAN_AFTER_SECONDS else "m.minute"
    sql = (
        f"SELECT m.node, m.engine, m.model, m.model_version, {info_sql} AS at, "
        + ", ".join(f"SUM(m.{c})" for c in _SUMS)
        + f" FROM model_minutes m WHERE {col} >= ? AND {col} < ? GROUP BY 1, 2, 3, 4, 5"
    )
    # each piece is named by its first instant (the window's start, else the cut it starts at)
    starts = [start, *cuts]
    params: list[float] = [v for i, c in enumerate(cuts) for v in (c, starts[i])]
    if not info_sql.startswith("(SELECT"):
        params.append(starts[-1])
    done = _deadline(db, seconds)
    try:
        rows = db.execute(sql, (*params, start, end)).fetchall()
    except sqlite3.OperationalError as err:
        if "interrupt" in str(err):
            raise QueryTooLong from None
        raise
    finally:
        done()
    out = []
    for node, engine, model, version, at, *sums in rows:
        vals = {c: float(v or 0.0) for c, v in zip(_SUMS, sums, strict=True)}
        ident = None if at is None else _identity_at(kept.get((str(node), str(engine)), ()), float(at))
        out.append(MinuteSums(str(node), str(engine), str(model), str(version), parse_info(ident), **vals))
    return out


def read_unallocated(db: sqlite3.Connection, start: float, end: float) -> float:
    """Dollars of GPUs no engine used, over minutes in [start, end)."""
    col = "+minute" if end - start > SCAN_AFTER_SECONDS else "minute"  # as read_sums
    row = db.execute(
        f"SELECT SUM(unallocated_usd) FROM gpu_minutes WHERE {col} >= ? AND {col} < ?", (start, end)
    ).fetchone()
    return float(row[0] or 0.0)


def oldest_minute(db: sqlite3.Connection) -> float | None:
    """The first minute held for model series, None when empty."""
    row = db.execute("SELECT MIN(minute) FROM model_minutes").fetchone()
    return None if row is None or row[0] is None else float(row[0])


def open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to a history file (its writer keeps writing meanwhile: WAL)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    db.execute("PRAGMA busy_timeout=5000")
    return db


# ------------------------------------------------------------------------------- grouping
def property_of(row: MinuteSums, name: str) -> str:
    """The value of one aggregate property for a row; ``__unallocated__`` where it has none."""
    info = row.info
    builtin = {
        "node": row.node,
        "engine": row.engine,
        "model_name": row.model,
        "model_version": row.model_version,
        "namespace": info.get("namespace", ""),
        "pod": info.get("pod", ""),
        "role": info.get("role", "") or "both",
        "group": info.get("group", ""),
    }
    if name in builtin:
        value = str(builtin[name])
    else:
        labels = info.get("labels") or {}
        value = str(labels.get(name, ""))
        if not value:  # spelt as exported (label_team), or kept so (read from Prometheus)
            want = {name, cost_label_name(name)}
            value = next((str(v) for k, v in labels.items() if {k, cost_label_name(k)} & want), "")
    return value or UNALLOCATED


def allocate(
    rows: Sequence[MinuteSums],
    unallocated_usd: float,
    aggregate: Sequence[str],
    basis: Basis,
    share_idle: bool,
) -> list[Item]:
    """Group the rows, apply the basis and the idle policy; items by dollars, largest first.

    Allocation: a group's dollars are every dollar of the GPU time its engines held (idle minutes
    included, shown in idleUsd). Usage: the dollars of the time the GPUs were busy (minutes without a
    utilisation reading count as busy); the held time no kernel ran joins the idle dollars. Idle
    dollars — GPUs no engine used, plus that unused time — are one ``__idle__`` item, or shared in
    proportion to the groups' dollars."""
    groups: dict[tuple[str, ...], Item] = {}
    pool = max(0.0, unallocated_usd)
    for r in rows:
        key = tuple(property_of(r, a) for a in aggregate)
        it = groups.get(key)
        if it is None:
            it = groups[key] = Item(dict(zip(aggregate, key, strict=True)))
        if basis == "allocation":
            own, own_idle = r.cost_usd, r.idle_usd
        else:
            unused = min(max(0.0, r.usage_alloc_usd - r.usage_usd), r.cost_usd)
            own, own_idle = r.cost_usd - unused, 0.0
            pool += unused
        it.own_usd += own
        it.cost_usd += own
        it.idle_usd += own_idle
        it.prompt_tokens += r.prompt_tokens
        it.output_tokens += r.generation_tokens
        it._prompt_usd += r.prompt_usd
        it._split_usd += r.split_usd
        it.seconds += r.seconds
        it.tokenless_seconds += r.tokenless_seconds
    total_own = sum(it.own_usd for it in groups.values())
    items = list(groups.values())
    if share_idle and total_own > 0:
        for it in items:
            share = pool * it.own_usd / total_own
            it.cost_usd += share
            it.idle_usd += share
    elif pool > 0:
        items.append(Item({a: IDLE for a in aggregate}, cost_usd=pool, idle_usd=pool))
    for it in items:
        if it._split_usd > 0:
            it.prompt_share = min(1.0, max(0.0, it._prompt_usd / it._split_usd))
    items.sort(key=lambda it: (-it.cost_usd, sorted(it.key.items())))
    return items


# ------------------------------------------------------------------------------- the endpoint
def answer(db: sqlite3.Connection, q: CostQuery) -> dict[str, Any]:
    """The response body of one query over an open history file."""
    rows = read_sums(db, q.start, q.end)
    return body_of(
        q, allocate(rows, read_unallocated(db, q.start, q.end), q.aggregate, q.basis, q.share_idle)
    )


def body_of(q: CostQuery, items: Sequence[Item]) -> dict[str, Any]:
    """The response body: the window read, the basis, the items (at most :data:`MAX_ITEMS`)."""
    body: dict[str, Any] = {
        "window": {"start": rfc3339(q.start), "end": rfc3339(q.end)},
        "costBasis": q.basis,
        "aggregate": list(q.aggregate),
        "idle": "shared" if q.share_idle else IDLE,
        "items": [it.as_json() for it in items[:MAX_ITEMS]],
    }
    warnings = list(q.warnings)
    if len(items) > MAX_ITEMS:
        warnings.append(f"{len(items)} items, the first {MAX_ITEMS} by dollars returned; aggregate by fewer")
    if warnings:
        body["warnings"] = warnings
    return _finite(body)


def _finite(obj: Any) -> Any:
    """JSON without NaN or infinities (a ratio that is not finite is unknown: null)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


class CostApi:
    """``/api/v1/cost`` over a history file (read-only connections of its own, off the event loop)."""

    PATH = "/api/v1/cost"

    def __init__(
        self,
        path: Path,
        retention_days: float,
        share_idle: bool = False,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.retention_seconds = retention_days * 86400.0
        self.share_idle = share_idle
        self._now = now
        self._one = asyncio.Semaphore(1)  # one query at a time: the disk is the node's

    def query(self, params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) for one request's parameters (blocking: run off the loop)."""
        try:
            db = open_read_only(self.path)
        except sqlite3.Error as err:
            return 503, {"error": f"the history is not readable ({err})"}
        try:
            q = parse_query(params, self._now(), self.retention_seconds, self.share_idle, oldest_minute(db))
            return 200, answer(db, q)
        except BadRequest as err:
            return 400, {"error": str(err)}
        except QueryTooLong:
            return 503, {"error": f"the query ran past {QUERY_SECONDS:g} s; ask for a shorter window"}
        except sqlite3.Error as err:
            return 503, {"error": f"the history is not readable ({err})"}
        finally:
            db.close()

    async def handle(self, req: web.Request) -> web.Response:
        """The aiohttp handler."""
        params = {k: req.query.getone(k) for k in req.query}
        async with self._one:
            status, body = await asyncio.to_thread(self.query, params)
        return web.json_response(body, status=status)
