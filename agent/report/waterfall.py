"""The weekly report's factor waterfall: why each model version's $ per 1M output tokens changed
from last week to this week, and the fleet's (or node's) total, split by factor
(:mod:`agent.cost.explain`) from the report's hourly rows (pure).

Each side is the ratio of sums over its week's hours; the hourly gauge means (decode efficiency,
requests running, the prefill shares) weigh each hour's seconds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.cost.explain import ExplainError, Split, factors_of, one_line, split

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
    """The model sums (:func:`agent.cost.explain.factors_of`'s names) of some hourly rows."""
    out: dict[str, float] = {}

    def add(k: str, v: float) -> None:
        out[k] = out.get(k, 0.0) + v

    for r in rows:
        add("seconds", r.seconds)
        add("cost_usd", r.cost_usd)
        add("generation_tokens", r.output_tokens)
        add("gpu_seconds", r.gpu_seconds)
        for gauge, value in (
            ("roofline", r.roofline_ratio),
            ("running", r.requests_running),
            ("prefill_share", r.prefill_share),
            ("prefill_floor", r.prefill_floor),
        ):
            if value is not None:
                add(gauge + ".s", value * r.seconds)
                add(gauge + ".w", r.seconds)
        if r.split is not None:
            for k in ("usage_usd", "usage_alloc_usd", "floor_usd", "floor_tokens"):
                add(k, getattr(r.split, k))
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
