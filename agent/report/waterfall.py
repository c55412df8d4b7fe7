"""The weekly report's factor waterfall: why each model version's $ per 1M output tokens changed
from last week to this week, and the fleet's (or node's) total, split by factor
(:mod:`agent.cost.explain`) from the report's hourly rows (pure).

Each side's factors are ratios of its minutes' factor chain sums (:func:`agent.cost.explain.chain_sums`:
steps, roofline, decode and as-run GPU-seconds, busy GPU-seconds, tokens), which each hourly row
carries added over its minutes, so a week's split is what ``infercost explain`` prints for the same
minutes; a row without them (a Prometheus hour) is its own one window, as that command reads one.
The hourly gauge means (decode efficiency, requests running, the prefill shares) weigh each hour's
seconds where no minute has the whole chain (the factors are then read as one window)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.cost.explain import ExplainError, Split, chain_sums, factors_of, one_line, split
from agent.records import add_sums

if TYPE_CHECKING:
    from agent.report.data import HourRow

TOTAL = "(all)"  # the subject of the fleet's (or node's) total


@dataclass(frozen=True, slots=True)
class Waterfall:
    """One subject's week-over-week split."""

    model: str  # TOTAL for the total
    model_version: str  # "" for the total
    split: Split

    @property
    def line(self) -> str:
        """The split in one line, largest terms first."""
        return one_line(self.split)


def sums_of(rows: Iterable[HourRow]) -> dict[str, float]:
    """The model sums (:func:`agent.cost.explain.factors_of`'s names) of some hourly rows, with
    their factor chains (each row's minutes', or the row's own where it has none)."""
    out: dict[str, float] = {}
    for r in rows:
        row = _row_sums(r)
        for sums in (row, chain_sums(row) if r.chain is None else r.chain):
            add_sums(out, sums)
    return out


def _row_sums(r: HourRow) -> dict[str, float]:
    """One hourly row as the model sums (the gauges' means weigh the hour's seconds)."""
    out = {
        "seconds": r.seconds,
        "cost_usd": r.cost_usd,
        "generation_tokens": r.output_tokens,
        "gpu_seconds": r.gpu_seconds,
    }
    for gauge, value in (
        ("roofline", r.roofline_ratio),
        ("running", r.requests_running),
        ("prefill_share", r.prefill_share),
        ("prefill_floor", r.prefill_floor),
    ):
        if value is not None:
            out[gauge + ".s"], out[gauge + ".w"] = value * r.seconds, r.seconds
    if r.split is not None:
        for k in ("usage_usd", "usage_alloc_usd", "floor_usd", "floor_tokens"):
            out[k] = getattr(r.split, k)
    return out


def week_over_week(
    this: Mapping[tuple[str, str], Sequence[HourRow]], last: Mapping[tuple[str, str], Sequence[HourRow]]
) -> tuple[Waterfall, ...]:
    """The split of every (model, version) with cost per token in both weeks, then the total; by
    the size of the change, largest first (the total last)."""
    out: list[Waterfall] = []
    for key in sorted(set(this) & set(last)):
        s = _split(sums_of(last[key]), sums_of(this[key]))
        if s is not None:
            out.append(Waterfall(key[0], key[1], s))
    out.sort(key=lambda w: -abs(w.split.total_usd_per_1m))
    everything = _split(
        sums_of(r for rs in last.values() for r in rs), sums_of(r for rs in this.values() for r in rs)
    )
    if everything is not None:
        out.append(Waterfall(TOTAL, "", everything))
    return tuple(out)


def _split(before: Mapping[str, float], after: Mapping[str, float]) -> Split | None:
    try:
        return split(factors_of(before), factors_of(after))
    except ExplainError:
        return None  # a side without cost per token: nothing to split


def markdown(waterfalls: Sequence[Waterfall], esc: object = None) -> list[str]:
    """The report's Markdown section (lines), or nothing without a split."""
    if not waterfalls:
        return []
    md = getattr(esc, "md", lambda s: s)
    out = [
        "",
        "## Why $ per 1M output tokens changed (week over week, by factor)",
        "",
        "| model | version | last week | this week | change by factor | closure gap |",
        "|---|---|---:|---:|---|---:|",
    ]
    for w in waterfalls:
        s = w.split
        gap = s.closure_gap_after
        out.append(
            f"| {md(w.model)} | {md(w.model_version)} | ${s.before_usd_per_1m:.4f} "
            f"| ${s.after_usd_per_1m:.4f} | {md(w.line)} | {'—' if gap is None else f'{gap * 100:+.1f} %'} |"
        )
    return out
