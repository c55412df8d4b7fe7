"""The agent's footprint: a week of baseline history held in columns, not Python objects; the
allocator's freed pages handed back after the replay; the NVML meter the overhead bench uses."""

from __future__ import annotations

import platform
import time
import tracemalloc
from collections.abc import Sequence

from agent.detect.baselines import WEEK, TrailingBaseline
from agent.detect.pipeline import release_freed_memory
from infercost_bench.overhead import NvmlMeter

WEEK_MINUTES = 7 * 24 * 60


def ratio(v: Sequence[float]) -> float | None:
    return v[0] / v[1] if v[1] else None


def _bytes_per_minute(quantiles: bool, band_of: int) -> float:
    """Bytes a week of one series' minutes costs a baseline, the minutes spread over ``band_of``
    buckets by turns of an hour (a series changing load band each hour)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        b = TrailingBaseline(WEEK, ratio, 2, quantiles)
        for i in range(WEEK_MINUTES):
            cost = 1.0 + (i % 97) / 97  # distinct values, so quantiles keep them all
            b.add(i // 60 % band_of, i * 60.0, (cost, 1.0), cost)
        held = tracemalloc.get_traced_memory()[0] - before
        assert b.count(0, WEEK_MINUTES * 60.0) == WEEK_MINUTES // band_of
    finally:
        tracemalloc.stop()
    return held / WEEK_MINUTES


def test_a_week_of_minutes_costs_bytes_not_objects() -> None:
    # A mean keeps the 2 inputs (16 bytes), a quantile the value twice (arrival and sorted order,
    # 16 bytes), plus a run of minutes per hour. Why 20: arrays over-allocate up to 1/16 as they
    # grow (17 bytes) and runs and buckets add a little, while a timestamp per minute would make
    # it 24 and a tuple per minute cost ~250 bytes.
    for quantiles in (False, True):
        for bands in (1, 4):
            assert _bytes_per_minute(quantiles, bands) < 20.0, (quantiles, bands)


def test_freed_memory_goes_back_on_glibc() -> None:
    assert release_freed_memory() is (platform.libc_ver()[0] == "glibc")


class _Work:
    def spin(self, n: int) -> int:
        total = 0
        for i in range(n):
            total += i * i
        return total


def test_the_nvml_meter_times_calls_and_keeps_their_results() -> None:
    meter = NvmlMeter()

    class Work(_Work):
        pass

    meter.wrap(Work, "spin")
    w = Work()
    assert w.spin(4) == 0 + 1 + 4 + 9
    t0 = time.thread_time()
    w.spin(200_000)
    spent = time.thread_time() - t0
    assert meter.calls == {"Work.spin": 2}
    assert 0.0 < meter.cpu["Work.spin"] <= spent + 0.01  # the CPU of this thread, not more
    assert _Work().spin(3) == 5 and meter.calls["Work.spin"] == 2  # the base class is untouched
    reading = meter.reading()
    assert reading["calls"] == {"Work.spin": 2} and reading["process_cpu_s"] >= reading["cpu"]["Work.spin"]


def test_every_test_conftest_marks_slow_exists() -> None:
    import importlib
    import importlib.util

    from conftest import SLOW_MODULES, SLOW_TESTS

    for key in SLOW_TESTS:
        module, name = key.split("::")
        assert callable(getattr(importlib.import_module(module), name, None)), key
    for module in SLOW_MODULES:
        assert importlib.util.find_spec(module) is not None, module
