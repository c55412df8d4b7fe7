"""Benchmark: the agent's parse + map of one busy vLLM page against prometheus_client's parser.

``run()`` times (median of several runs) the vLLM adapter's parse-and-map of a generated ~100 KB
page (two models, every V1 family, ``_created`` series, http_* and process_*) and
prometheus_client's ``text_string_to_metric_families`` over the same page, prints both and the
ratio, and returns the figures. It prints figures; nothing asserts on them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from agent.sources.engines.pagegen import make_vllm_page
from agent.sources.engines.vllm import ADAPTER

BENCH_MODELS = [
    "meta-llama/Llama-3.1-70B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
]


def _median_seconds(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(
    page: str, label: str, print_fn: Callable[[str], Any] = print, runs: int = 15
) -> dict[str, float]:
    """Time both parsers on ``page``; print and return ``page_bytes``, ``ours_ms``,
    ``prometheus_client_ms`` and ``speedup`` (prometheus_client time ÷ ours)."""
    ADAPTER.parse(page)  # warm up (regex caches)
    ours = _median_seconds(lambda: ADAPTER.parse(page), runs)
    theirs = _median_seconds(lambda: list(text_string_to_metric_families(page)), max(3, runs // 3))
    result = {
        "page_bytes": float(len(page.encode())),
        "ours_ms": ours * 1e3,
        "prometheus_client_ms": theirs * 1e3,
        "speedup": theirs / ours if ours > 0 else float("inf"),
    }
    print_fn(
        f"{label} {result['page_bytes'] / 1024:.0f} KiB: "
        f"infercost parse+map {result['ours_ms']:.2f} ms, "
        f"prometheus_client parse {result['prometheus_client_ms']:.2f} ms, "
        f"{result['speedup']:.1f}x faster (target >= 10x)"
    )
    return result


def run(print_fn: Callable[[str], Any] = print, runs: int = 15) -> dict[str, float]:
    """Time both parsers on a generated ~100 KB vLLM page with two models."""
    page = make_vllm_page(BENCH_MODELS, seed=0)
    return compare(page, f"generated vLLM page ({len(BENCH_MODELS)} models)", print_fn, runs)
