"""``infercost explain``: why a model's cost per token changed, in dollars per factor.

Two windows of one model (on one engine, or the fleet's engines with that name) are read from the
local store (``--state-dir``) or from Prometheus (``--prometheus``), each as sums over its minutes
(store) or hours (Prometheus), and split by :func:`agent.cost.explain.split` into price, idle, mix,
step efficiency, model and context, batch and the closure gap.

- ``--version V --against V0``: every minute of V against every minute of V0 (within ``--since`` /
  ``--until`` when given) **at like load** (:func:`agent.detect.explain.like_load`: the bands of the
  cost-per-token rule's deploy comparison, V0's minutes weighted to V's load mix), as cost alerts
  compare them.
- ``--from T0 --to T1``: the ``--window`` starting at T0 against the one starting at T1, as they
  were (load included: a change of load shows as batch and idle).

:func:`run_explain` returns the exit status; ``agent/cli.py`` parses argv and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.cost.explain import LABELS, UNITS, ExplainError, Factors, Split, factors_of, split, with_chain
from agent.detect.explain import Bucket, bucket_of, like_load, total
from agent.report.data import ReportError

logger = logging.getLogger(__name__)

STORE_FILE = "history.sqlite"
PROM_STEP_SECONDS = 3600.0  # the Prometheus path's bucket (a longer range than an hour is hourly rows)
# The sums each exported series gives a Prometheus bucket: (sum name, PromQL with {by} and {w}).
PROM_COUNTERS: Mapping[str, str] = {
    "cost_usd": "infercost_cost_usd_total",
    "generation_tokens": "infercost_generation_tokens_total",
    "gpu_seconds": "infercost_gpu_seconds_total",
    "usage_usd": "infercost_usage_cost_usd_total",
}
PROM_GAUGES: Mapping[str, str] = {
    "roofline": "infercost_roofline_efficiency_ratio",
    "prefill_share": "infercost_prefill_share_ratio",
    "prefill_floor": "infercost_prefill_share_floor_ratio",
    "running": "infercost_requests_running",
    "floor": "infercost_usd_per_1m_output_tokens_floor",
}
SERIES = ("node", "engine", "model", "model_version")


# -- the two sources ------------------------------------------------------------------------------


Reader = Callable[[float, float], list[Bucket]]  # [start, end) → buckets of the selected series


def store_reader(state_dir: Path, match: Mapping[str, str]) -> tuple[Reader, Callable[[], None]]:
    """Buckets (minutes) from the store in ``state_dir`` for the series ``match`` selects, and a close."""
    from agent.store import Store, StoreError  # sqlite only on this path

    path = state_dir / STORE_FILE
    if not path.exists():
        raise ReportError(f"{path}: no store here; fix: pass the agent's state directory (--state-dir)")
    try:
        store = Store(path)
    except (StoreError, sqlite3.Error) as err:
        raise ReportError(f"{path}: cannot open the store: {err}") from None

    def read(start: float, end: float) -> list[Bucket]:
        try:
            recs = store.records(start, end, ("model",), match)
        except sqlite3.Error as err:
            raise ReportError(f"{path}: cannot read the store: {err}") from None
        return [bucket_of(r) for r in recs]

    return read, store.close


def prom_reader(url: str, match: Mapping[str, str], auth: Any = None) -> Reader:
    """Buckets (hours, or the range when shorter) from Prometheus at ``url`` for ``match``'s series."""
    from agent.report.prom import PromApi, http_fetcher

    api = PromApi(url, http_fetcher(auth))
    sel = ",".join(f'{k}="{_quote(v)}"' for k, v in sorted(match.items()))
    by = ", ".join(SERIES)

    def read(start: float, end: float) -> list[Bucket]:
        step = min(PROM_STEP_SECONDS, end - start)
        w = f"{step:.0f}s"
        acc: dict[tuple[tuple[str, ...], float], dict[str, float]] = defaultdict(dict)
        exprs = {
            **{k: f"sum by ({by}) (increase({m}{{{sel}}}[{w}]))" for k, m in PROM_COUNTERS.items()},
            **{k: f"avg by ({by}) (avg_over_time({m}{{{sel}}}[{w}]))" for k, m in PROM_GAUGES.items()},
        }
        for name, expr in exprs.items():
            for s in api.query_range(expr, start + step, end, step):
                labels = tuple(str(s["metric"].get(k, "")) for k in SERIES)
                for ts, v in s["values"]:
                    x = float(v)
                    if math.isfinite(x):
                        acc[(labels, float(ts) - step)][name] = x
        return [
            Bucket(at, labels[3], _prom_sums(f, step)) for (labels, at), f in acc.items() if "cost_usd" in f
        ]

    return read


def _quote(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def _prom_sums(f: Mapping[str, float], seconds: float) -> dict[str, float]:
    """One Prometheus bucket as the store's model sums, with its factor chain
    (:func:`agent.cost.explain.chain_sums`: a range of buckets is a ratio of those): a bucket whose
    usage cost grew counts its whole cost as covered by that figure; the gauges' means weigh the
    bucket's seconds; the floor's mean prices its output tokens (as the weekly report reads them)."""
    cost, gen = f.get("cost_usd", 0.0), f.get("generation_tokens", 0.0)
    sums = {k: f[k] for k in PROM_COUNTERS if k in f}
    sums["seconds"] = seconds
    if "usage_usd" in f:
        sums["usage_alloc_usd"] = cost
    for g in ("roofline", "running", "prefill_share", "prefill_floor"):
        if g in f:
            sums[g + ".s"], sums[g + ".w"] = f[g] * seconds, seconds
    if "floor" in f and gen > 0:
        sums["floor_usd"], sums["floor_tokens"] = f["floor"] * gen / 1e6, gen
    return with_chain(sums)


# -- the command ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Explained:
    """What the command prints: the split, both windows' factors, and what was compared."""

    what: str  # one line: which model, which windows
    split: Split
    before: Factors
    after: Factors
    matched_share: float | None = None  # like-load comparisons: share of output tokens compared


def explain_versions(read: Reader, version: str, against: str, start: float, end: float) -> Explained:
    """``version`` against ``against`` at like load over [start, end) (raises ReportError)."""
    buckets = read(start, end)
    mine = [b for b in buckets if b.version == version]
    ref = [b for b in buckets if b.version == against]
    for v, got in ((version, mine), (against, ref)):
        if not got:
            seen = sorted({b.version for b in buckets}) or ["none"]
            raise ReportError(f"no minutes of version {v!r}; versions there: {', '.join(seen)}")
    like = like_load(mine, ref)
    if not like.after:
        raise ReportError(f"{version} and {against} never ran at like load (no load band in common)")
    return _explained(f"{against} → {version} at like load", like.before, like.after, like.matched_share)


def explain_times(read: Reader, t0: float, t1: float, window: float) -> Explained:
    """The ``window`` from ``t0`` against the one from ``t1`` (raises ReportError)."""
    return _explained(
        f"[{_iso(t0)}, +{window:.0f} s) → [{_iso(t1)}, +{window:.0f} s)",
        total(read(t0, t0 + window)),
        total(read(t1, t1 + window)),
    )


def _explained(
    what: str, before: Mapping[str, float], after: Mapping[str, float], share: float | None = None
) -> Explained:
    fb, fa = factors_of(before), factors_of(after)
    try:
        s = split(fb, fa)
    except ExplainError as err:
        raise ReportError(str(err)) from None
    return Explained(what, s, fb, fa, share)


def _iso(t: float) -> str:
    from agent.records import iso

    return iso(t)


def to_json(e: Explained) -> dict[str, Any]:
    """The JSON form: ``total_usd_per_1m``, ``factors`` (summing to it) and both closure gaps."""
    s = e.split
    return {
        "what": e.what,
        "before_usd_per_1m": s.before_usd_per_1m,
        "after_usd_per_1m": s.after_usd_per_1m,
        "total_usd_per_1m": s.total_usd_per_1m,
        "factors": [{"name": t.name, "usd_per_1m": t.usd_per_1m, "share": t.share} for t in s.terms],
        "closure_gap": {"before": s.closure_gap_before, "after": s.closure_gap_after},
        "merged": list(s.merged),
        # share of the output tokens in minutes with every factor (the factors' own minutes; the
        # "coverage" term carries the rest's part of the change)
        "covered_share": {"before": e.before.covered_share, "after": e.after.covered_share},
        "values": {
            "before": {n: e.before.display(n) for n in UNITS},
            "after": {n: e.after.display(n) for n in UNITS},
            "units": dict(UNITS),
        },
        "like_load_matched_share": e.matched_share,
    }


BAR_WIDTH = 30  # characters of the largest term's bar


def to_text(e: Explained) -> str:
    """A waterfall table: the first window's $/1M, each term's step, the second window's $/1M."""
    s = e.split
    big = max((abs(t.usd_per_1m) for t in s.terms), default=0.0) or 1.0
    lines = [f"why $ per 1M output tokens changed: {e.what}"]
    if e.matched_share is not None:
        lines.append(f"  ({e.matched_share * 100:.0f} % of the output tokens ran at a load both had)")
    lines.append(f"  {'':<28} {'before':>10} {'after':>10} {'$/1M':>10} {'level':>10}")
    lines.append(f"  {'start':<28} {'':>10} {'':>10} {'':>10} {s.before_usd_per_1m:>10.4f}")
    level = s.before_usd_per_1m
    for t in s.terms:
        level += t.usd_per_1m
        bar = "█" * max(0, round(abs(t.usd_per_1m) / big * BAR_WIDTH))
        sign = "+" if t.usd_per_1m >= 0 else "−"
        b, a = (_value(e.before, t.name), _value(e.after, t.name))
        lines.append(
            f"  {t.label:<28} {b:>10} {a:>10} {sign}{abs(t.usd_per_1m):>9.4f} {level:>10.4f}  {sign}{bar}"
        )
    lines.append(f"  {'end':<28} {'':>10} {'':>10} {s.total_usd_per_1m:>+10.4f} {s.after_usd_per_1m:>10.4f}")
    gaps = (s.closure_gap_before, s.closure_gap_after)
    if None in gaps:
        lines.append("  closure gap: not measured (merged factors carry it)")
    else:
        lines.append(
            "  closure gap (product of factors ÷ measured $/token − 1): "
            f"before {gaps[0] * 100:+.2f} %, after {gaps[1] * 100:+.2f} %"  # type: ignore[operator]
        )
    shares = (e.before.covered_share, e.after.covered_share)
    if min(shares) < 1.0:
        lines.append(
            "  minutes with every factor (mix and step efficiency are read over them): "
            f"{shares[0] * 100:.0f} % of the output tokens before, {shares[1] * 100:.0f} % after"
        )
    for note in s.merged:
        lines.append(f"  merged: {note}")
    units = ", ".join(f"{LABELS[n]} in {u}" for n, u in UNITS.items())
    lines.append(f"  ({units})")
    return "\n".join(lines) + "\n"


def _value(f: Factors, name: str) -> str:
    if "+" in name or name in ("closure", "coverage"):
        return ""
    v = f.display(name)
    return "—" if v is None else f"{v:.4g}"


def run_explain(args: argparse.Namespace, print_fn: Callable[[str], None] = print) -> int:
    """Run ``infercost explain`` as ``args`` says; returns 0, 1 (no data) or 2 (bad options)."""
    versions = args.version is not None or args.against is not None
    times = args.from_ is not None or args.to is not None
    if (
        versions == times
        or (versions and None in (args.version, args.against))
        or (times and None in (args.from_, args.to))
    ):
        logger.error("explain: give either --version V --against V0, or --from T0 --to T1")
        return 2
    match = {k: v for k, v in (("engine", args.engine), ("model", args.model), ("node", args.node)) if v}
    close: Callable[[], None] = lambda: None  # noqa: E731
    try:
        if args.prometheus:
            from agent.report.cli import prom_auth

            read = prom_reader(args.prometheus, match, prom_auth(args))
        else:
            read, close = store_reader(Path(args.state_dir), match)
        try:
            if versions:
                start = args.since if args.since is not None else 0.0
                end = args.until if args.until is not None else math.inf
                if args.prometheus and (args.since is None or args.until is None):
                    logger.error("explain: --prometheus with --version needs --since and --until")
                    return 2
                e = explain_versions(read, args.version, args.against, start, end)
            else:
                e = explain_times(read, args.from_, args.to, args.window)
        finally:
            close()
    except ReportError as err:
        logger.error("explain: %s", err)
        return 1
    if args.format == "json":
        print_fn(json.dumps(to_json(e), indent=2, ensure_ascii=False))
    else:
        print_fn(to_text(e).rstrip("\n"))
    return 0
