"""Benchmark: the agent's parse + map of engine pages against prometheus_client's text parser.

``run()`` times, for every recorded page under ``tests/fixtures/expositions`` (when run from a source
checkout) and for two generated vLLM pages (a ~100 KB page of 2 models and a dense ~1.2 MB page of
32 models), the engine adapter's parse-and-map against prometheus_client's
``text_string_to_metric_families`` over the same text. Each figure is the median of several
repeats of this process's CPU time per parse (batches of calls), the two parsers timed in turn;
the adapter is warm, as after an engine's first scrape: the page's label blocks, its layout (the
same wanted lines in the same order), its histograms' bucket layouts and its compiled map are known,
so every value on the page is still converted and checked on every call, as on a live engine whose
values change between scrapes; a second column times a first scrape (nothing known). It prints one
line per page and the minimum ratios, and returns the figures. It prints figures; nothing asserts on them.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from agent.sim.pagegen import make_vllm_page
from agent.sources.engines.registry import ADAPTERS, detect_kind

BENCH_MODELS = [
    "meta-llama/Llama-3.1-70B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
]
DENSE_MODELS = 32  # the dense page: 32 models ≈ 1.2 MB, one engine serving many models
TARGET_SPEEDUP = 10.0  # prometheus_client time ÷ ours; the goal: at least 10× on every page
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "expositions"
# Recorded pages quote a shell prompt or "..." here and there; prometheus_client would refuse them.
_KEEP = re.compile(r"^(?:[ \t]*$|#|[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?[ \t]+\S)")


@dataclass(frozen=True, slots=True)
class PageFigures:
    """One page's timings."""

    page: str
    page_bytes: int  # bytes
    ours_ms: float  # CPU milliseconds per page, median: adapter parse + map
    prometheus_client_ms: float  # CPU milliseconds per page, median: text_string_to_metric_families
    speedup: float  # prometheus_client_ms ÷ ours_ms
    cold_ms: float = math.nan  # CPU milliseconds, median: parse + map with no label block known


def _per_call_seconds(fn: Callable[[], object], budget_s: float = 0.005) -> Callable[[], float]:
    """A timer for ``fn``: each call times a batch of calls lasting about ``budget_s`` of CPU (so
    a 30 µs parse is not timed one call at a time) and returns CPU seconds per call. CPU time of
    this process, not wall time: on a shared machine other processes' load does not count."""
    t0 = time.process_time()
    fn()
    once = max(time.process_time() - t0, 1e-7)
    batch = max(1, int(budget_s / once))

    def timed() -> float:
        t0 = time.process_time()
        for _ in range(batch):
            fn()
        return (time.process_time() - t0) / batch

    return timed


def _medians(ours: Callable[[], object], theirs: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median seconds per call of each, the two timed in turn (both see the same machine load)."""
    t_ours, t_theirs = _per_call_seconds(ours), _per_call_seconds(theirs)
    a, b = [], []
    for _ in range(runs):
        a.append(t_ours())
        b.append(t_theirs())
    return statistics.median(a), statistics.median(b)


def _exposition_only(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if _KEEP.match(ln)) + "\n"


def time_page(page: str, label: str, kind: str = "vllm", runs: int = 15) -> PageFigures:
    """Time the ``kind`` adapter and prometheus_client on ``page`` (median of ``runs`` repeats)."""
    adapter = ADAPTERS[kind]
    adapter.parse(page)  # warm up: compiled patterns, label blocks seen (as after the first scrape)
    ours, theirs = _medians(
        lambda: adapter.parse(page), lambda: list(text_string_to_metric_families(page)), runs
    )

    def cold() -> object:
        adapter.forget()
        return adapter.parse(page)

    first, _ = _medians(cold, lambda: None, max(3, runs // 3))
    adapter.parse(page)
    return PageFigures(
        page=label,
        page_bytes=len(page.encode()),
        ours_ms=ours * 1e3,
        prometheus_client_ms=theirs * 1e3,
        speedup=theirs / ours if ours > 0 else float("inf"),
        cold_ms=first * 1e3,
    )


def compare(
    page: str, label: str, print_fn: Callable[[str], Any] = print, runs: int = 15
) -> dict[str, float]:
    """Time both parsers on one vLLM ``page``; print one line and return ``page_bytes``,
    ``ours_ms``, ``prometheus_client_ms`` and ``speedup`` (used by ``bench overhead``)."""
    r = time_page(page, label, "vllm", runs)
    print_fn(
        f"{label} {r.page_bytes / 1024:.0f} KiB: infercost parse+map {r.ours_ms:.2f} ms, "
        f"prometheus_client parse {r.prometheus_client_ms:.2f} ms, "
        f"{r.speedup:.1f}x faster (target >= {TARGET_SPEEDUP:g}x)"
    )
    return {
        "page_bytes": float(r.page_bytes),
        "ours_ms": r.ours_ms,
        "prometheus_client_ms": r.prometheus_client_ms,
        "speedup": r.speedup,
    }


def pages() -> list[tuple[str, str, str]]:
    """(label, kind, text) of every page the benchmark times."""
    out: list[tuple[str, str, str]] = []
    if FIXTURES.is_dir():
        for path in sorted(FIXTURES.glob("*.txt")):
            text = _exposition_only(path.read_text())
            kind = detect_kind(text)
            if kind is not None:
                out.append((path.name, kind, text))
    out.append((f"generated vLLM, {len(BENCH_MODELS)} models", "vllm", make_vllm_page(BENCH_MODELS, seed=0)))
    dense = [f"org{i % 4}/model-{i:02d}-Instruct" for i in range(DENSE_MODELS)]
    out.append((f"generated vLLM, {DENSE_MODELS} models", "vllm", make_vllm_page(dense, seed=0)))
    return out


def run(print_fn: Callable[[str], Any] = print, runs: int = 15) -> list[PageFigures]:
    """Time every page; print one line each and the minimum ratio; return the figures."""
    results: list[PageFigures] = []
    print_fn(
        f"{'page':<36} {'KiB':>6} {'infercost ms':>13} {'prom_client ms':>15} {'ratio':>7} "
        f"{'first-scrape ms':>16} {'ratio':>6}"
    )
    for label, kind, text in pages():
        r = time_page(text, label, kind, runs)
        results.append(r)
        print_fn(
            f"{r.page:<36} {r.page_bytes / 1024:>6.0f} {r.ours_ms:>13.3f} "
            f"{r.prometheus_client_ms:>15.3f} {r.speedup:>6.1f}x {r.cold_ms:>16.3f} "
            f"{r.prometheus_client_ms / r.cold_ms:>5.1f}x"
        )
    worst = min(results, key=lambda r: r.speedup)
    print_fn(
        f"minimum {worst.speedup:.1f}x on {worst.page} (target >= {TARGET_SPEEDUP:g}x; median of {runs} "
        "interleaved repeats of CPU time each; steady state: the previous scrape's label blocks and "
        "layouts reused, every value converted)"
    )
    cold = min(results, key=lambda r: r.prometheus_client_ms / r.cold_ms)
    print_fn(
        f"first scrape (no label block known yet): minimum "
        f"{cold.prometheus_client_ms / cold.cold_ms:.1f}x on {cold.page}"
    )
    return results
