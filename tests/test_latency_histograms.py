"""The engines' latency histograms re-based under infercost's labels (agent/cost/latency.py).

Pure arithmetic first (hand-computed), then the real path: real engine pages (tests/fixtures) →
engine adapter → window join → ledger → /metrics text, then a real Prometheus scraping the real
daemon, whose ``histogram_quantile`` over the re-based buckets must equal the quantile worked
out by hand from the page's buckets.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from histpages import PAGES, advance, restart
from netutil import async_wait_until
from prometheus_client.parser import text_string_to_metric_families
from promstack import Prometheus

from agent.catalog import HISTOGRAMS
from agent.cost.counters import counter_increase
from agent.cost.latency import HistogramMemory, accumulate, carry_over, histogram_increase, is_histogram
from agent.cost.quantiles import histogram_delta, quantile
from agent.cost.window import WindowJoiner
from agent.samples import EngineScrape, Histogram
from agent.sinks.prometheus import render, render_catalogue, render_with_client
from agent.snapshot import Ledger, Snapshot
from agent.sources.engines.registry import ADAPTERS
from agent.sources.prices import parse_price_book

INF = math.inf
NAN = math.nan
T0 = 1_780_000_000.0


def H(*buckets: tuple[float, float], s: float = 0.0, n: float | None = None) -> Histogram:
    """A histogram from (le, cumulative count) pairs; count defaults to the last bucket."""
    return Histogram(tuple(buckets), s, buckets[-1][1] if n is None else n)


# ---------------------------------------------------------------------------------------------
# Pure arithmetic
# ---------------------------------------------------------------------------------------------


def test_first_window_is_the_total_and_later_ones_add_bucket_by_bucket() -> None:
    first = accumulate(None, H((0.1, 2.0), (1.0, 5.0), (INF, 6.0), s=2.5))
    assert first == H((0.1, 2.0), (1.0, 5.0), (INF, 6.0), s=2.5)
    nxt = accumulate(first, H((0.1, 1.0), (1.0, 1.0), (INF, 3.0), s=4.0))
    assert nxt == H((0.1, 3.0), (1.0, 6.0), (INF, 9.0), s=6.5)


def test_no_window_or_an_empty_one_leaves_the_total() -> None:
    total = H((0.1, 2.0), (INF, 6.0), s=2.5)
    assert accumulate(total, None) is total
    assert accumulate(None, None) is None
    # a quiet window (no observations) is a valid histogram of zeros: the series stays, unchanged
    zero = H((0.1, 0.0), (INF, 0.0), s=0.0)
    assert accumulate(None, zero) == zero
    assert accumulate(total, zero) == total


def test_count_is_the_inf_bucket() -> None:
    # the engine's _count said 7 but its +Inf bucket 6: the exposition's _count is the +Inf bucket
    assert accumulate(None, H((0.1, 2.0), (INF, 6.0), n=7.0)).count == 6.0  # type: ignore[union-attr]
    total = H((0.1, 2.0), (INF, 6.0))
    assert accumulate(total, H((0.1, 0.0), (INF, 1.0), n=5.0)).count == 7.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "delta, why",
    [
        (H((0.1, NAN), (INF, 3.0)), "NaN bucket"),
        (H((0.1, -1.0), (INF, 3.0)), "negative bucket"),
        (H((0.1, 4.0), (INF, 3.0)), "buckets decrease"),
        (H((0.1, 1.0), (1.0, 0.5), (INF, 3.0)), "a middle bucket decreases"),
        (H((0.1, 1.0), (1.0, 2.0)), "no +Inf bucket"),
        (Histogram((), 0.0, 0.0), "no bucket at all"),
        (H((0.1, 1.0), (INF, 3.0), s=NAN), "NaN sum"),
        (H((0.1, 1.0), (INF, 3.0), s=-0.5), "negative sum"),
        (H((0.1, 1.0), (INF, 3.0), s=INF), "infinite sum"),
        (H((0.1, 1.0), (INF, 3.0), n=-1.0), "negative count"),
        (H((0.1, 1.0), (INF, 3.0), n=INF), "infinite count"),
        (H((0.1, 1.0), (INF, INF)), "infinite bucket"),
        (H((0.1, 1.0), (INF, INF), n=3.0), "infinite +Inf bucket beside a finite count"),
        (H((0.1, 1.0), (0.1, 2.0), (INF, 3.0)), "a bound twice"),
        (H((0.5, 1.0), (0.1, 2.0), (INF, 3.0)), "bounds out of order"),
        (H((-0.1, 1.0), (INF, 3.0)), "a negative latency bound"),
        (H((NAN, 1.0), (INF, 3.0)), "a NaN bound"),
    ],
)
def test_a_hostile_window_adds_nothing(delta: Histogram, why: str) -> None:
    total = H((0.1, 2.0), (INF, 6.0), s=2.5)
    assert not is_histogram(delta), why
    assert accumulate(total, delta) is total, why
    assert accumulate(None, delta) is None, why


@pytest.mark.parametrize(
    "delta",
    [
        H((0.0, 0.0), (INF, 0.0)),  # a 0 bound, no observations, sum 0, count 0
        H((0.1, 3.0), (0.2, 3.0), (INF, 3.0), s=0.2),  # equal counts in neighbouring buckets
        H((INF, 4.0), s=1.0),  # only the +Inf bucket
    ],
)
def test_edge_windows_are_histograms(delta: Histogram) -> None:
    assert is_histogram(delta)


def test_a_total_that_would_overflow_stops() -> None:
    total = H((0.1, 1.0), (INF, 1.7e308), s=1.0)
    assert accumulate(total, H((0.1, 0.0), (INF, 1.7e308), s=1.0)) is total  # +Inf bucket → inf
    total = H((0.1, 1.0), (1.0, 1.0), (INF, 1.7e308), s=1.0)  # the +Inf bucket is the last, not the second
    assert accumulate(total, H((0.1, 0.0), (1.0, 0.0), (INF, 1.7e308), s=1.0)) is total
    total = H((0.1, 1.0), (INF, 2.0), s=1.7e308)
    assert accumulate(total, H((0.1, 0.0), (INF, 1.0), s=1.7e308)) is total  # sum → inf


def test_other_bounds_carry_the_total_over_and_nothing_goes_down() -> None:
    total = H((0.1, 2.0), (1.0, 5.0), (INF, 6.0), s=2.5)
    # 0.05: nothing known at or below it → 0; 0.5: the count at 0.1 (2); 2.0: at 1.0 (5); +Inf: 6
    assert carry_over(total, (0.05, 0.5, 2.0, INF)) == H(
        (0.05, 0.0), (0.5, 2.0), (2.0, 5.0), (INF, 6.0), s=2.5
    )
    assert carry_over(total, (0.1, INF)) == H((0.1, 2.0), (INF, 6.0), s=2.5)  # a bound kept continues
    nxt = accumulate(total, H((0.05, 1.0), (0.5, 1.0), (2.0, 2.0), (INF, 2.0), s=3.0))
    assert nxt == H((0.05, 1.0), (0.5, 3.0), (2.0, 7.0), (INF, 8.0), s=5.5)


def test_a_restart_is_read_for_the_whole_histogram_not_bucket_by_bucket() -> None:
    # the engine had 10 observations, all ≤ 0.1 s; it restarts and has made 12 since, 3 of them ≤ 0.1 s
    before, after = H((0.1, 10.0), (INF, 10.0), s=0.5), H((0.1, 3.0), (INF, 12.0), s=9.0)
    total = accumulate(None, before)
    total = accumulate(total, histogram_delta(before, after))
    # the reset is read once: all 12 new observations count → 13 ≤ 0.1 s out of 22
    assert total == H((0.1, 13.0), (INF, 22.0), s=9.5)
    # a counter reset per bucket would count 3 for le=0.1 (it went down) but only 2 for +Inf (it
    # went up 10 → 12): 13 at or below 0.1 s out of 12 in all — no longer a histogram
    per_bucket = [counter_increase(counter_increase(None, b, None)[1], a, None)[0] for (_, b), (_, a) in
                  zip(before.buckets, after.buckets, strict=True)]  # fmt: skip
    assert per_bucket == [3.0, 2.0]


def test_increase_of_a_histogram_read_as_one_series() -> None:
    a = H((0.1, 2.0), (INF, 5.0), s=1.0)
    b = H((0.1, 3.0), (INF, 9.0), s=2.5)
    assert histogram_increase(None, None, None) == (None, None)
    got, mem = histogram_increase(None, a, None)  # the first reading is the baseline
    assert got is None and mem == HistogramMemory({}, a)
    got, mem2 = histogram_increase(mem, b, None)
    assert got == H((0.1, 1.0), (INF, 4.0), s=1.5) and mem2 == HistogramMemory({}, b)
    assert histogram_increase(mem2, None, None) == (None, mem2)  # not on this scrape: kept
    restarted = H((0.1, 1.0), (INF, 1.0), s=0.2)
    assert histogram_increase(mem2, restarted, None)[0] == restarted  # a restart: all since it
    # named series remembered before, now one unnamed reading: a baseline, the series are kept
    named = HistogramMemory({"r0": a})
    assert histogram_increase(named, b, None) == (None, HistogramMemory({"r0": a}, b))


def test_increase_of_a_histogram_split_over_ranks() -> None:
    r0, r1 = H((0.1, 2.0), (INF, 5.0), s=1.0), H((0.1, 1.0), (INF, 1.0), s=0.1)
    got, mem = histogram_increase(None, r0, {"r0": r0, "r1": r1})
    assert got is None and mem == HistogramMemory({"r0": r0, "r1": r1})
    # a memory of the sum only: the first named reading is a baseline too
    assert histogram_increase(HistogramMemory({}, r0), r0, {"r0": r0})[0] is None
    # r0 +1 ≤ 0.1 and +2 above; r1 missing (adds nothing, kept); r2 new (counts in full)
    r0b, r2 = H((0.1, 3.0), (INF, 8.0), s=2.0), H((0.1, 0.0), (INF, 4.0), s=6.0)
    got, mem = histogram_increase(mem, r0b, {"r0": r0b, "r2": r2})
    assert got == H((0.1, 1.0), (INF, 7.0), s=7.0)
    assert mem == HistogramMemory({"r0": r0b, "r1": r1, "r2": r2})
    # r1 back with 2 more; r0 restarted (1 since); r2 came back with other bounds: left out
    r1b, r0c = H((0.1, 3.0), (INF, 3.0), s=0.4), H((0.1, 1.0), (INF, 1.0), s=0.3)
    r2b = H((0.5, 1.0), (INF, 5.0), s=7.0)
    got, mem = histogram_increase(mem, r0c, {"r0": r0c, "r1": r1b, "r2": r2b})
    assert got == H((0.1, 3.0), (INF, 3.0), s=pytest.approx(0.6))  # type: ignore[arg-type]
    assert mem.series["r2"] == r2b  # type: ignore[union-attr]
    # a rank whose bounds differ from the first rank's adds nothing to the sum
    x, y = H((0.1, 1.0), (INF, 1.0)), H((0.2, 1.0), (INF, 1.0))
    base = HistogramMemory({"x": H((0.1, 0.0), (INF, 0.0)), "y": H((0.2, 0.0), (INF, 0.0))})
    assert histogram_increase(base, x, {"x": x, "y": y})[0] == H((0.1, 1.0), (INF, 1.0))
    # nothing comparable at all: no observations
    gone = HistogramMemory({"x": H((0.3, 0.0), (INF, 0.0))})
    assert histogram_increase(gone, x, {"x": x})[0] is None


def test_a_rank_with_other_bounds_is_left_out_and_the_next_one_still_counts() -> None:
    zero_a, zero_b = H((0.1, 0.0), (INF, 0.0)), H((0.2, 0.0), (INF, 0.0))
    mem = HistogramMemory({"x": zero_a, "y": zero_b, "z": zero_a})
    x, y, z = H((0.1, 1.0), (INF, 1.0), s=0.05), H((0.2, 1.0), (INF, 1.0)), H((0.1, 0.0), (INF, 2.0), s=3.0)
    # x and z share bounds and add up; y, between them, has other bounds and is left out
    assert histogram_increase(mem, x, {"x": x, "y": y, "z": z})[0] == H((0.1, 1.0), (INF, 3.0), s=3.05)


def test_an_engine_up_without_models_keeps_the_models_it_served_for_its_idle_time() -> None:
    from test_window import ENGINES, book, rnd, scrape

    j = WindowJoiner("n1", ENGINES[:1], book())
    j.add_round(rnd(T0))
    j.close_tick(T0, {"a": scrape("a", T0, ("big", 0, 100))})
    j.add_round(rnd(T0 + 5))
    j.close_tick(T0 + 5, {"a": scrape("a", T0 + 5)})  # up, but serving no model this scrape
    j.add_round(rnd(T0 + 10))
    down = j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, up=False)})
    (w,) = down.windows  # the engine's GPUs are still the idle cost of the model it served
    assert w.usage.model == "big" and w.idle_usd == pytest.approx(2 * 3.6 * 5 / 3600)


# ---------------------------------------------------------------------------------------------
# Real pages → adapter → window join → ledger → exposition
# ---------------------------------------------------------------------------------------------

SGLANG = "sglang:time_to_first_token_seconds"
VLLM = "vllm:time_to_first_token_seconds"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def _ledger_over(pages: list[str], kind: str, version: str = "v1") -> Iterator[Snapshot]:
    """Snapshots of a ledger fed one page per 10 s tick through the real adapter and window join."""
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 3.6}]}, "book")
    from agent.config import EngineConfig

    eng = EngineConfig(name="e0", kind=kind, url="http://x/metrics", model_version=version)  # type: ignore[arg-type]
    j = WindowJoiner("node-a", [eng.cost_spec()], book.table())
    led = Ledger("node-a", "0.1.0")
    for k, page in enumerate(pages):
        reading = ADAPTERS[kind].read(page)
        sc = EngineScrape("e0", kind, T0 + 10 * k, True, 0.01, reading.models)
        led.observe_scrape(sc)
        led.apply(j.close_tick(T0 + 10 * k, {"e0": sc}))
        yield led.snapshot()


def _ttft(snap: Snapshot) -> Histogram | None:
    (m,) = snap.models
    return m.ttft_histogram


def test_sglang_page_rebased_through_a_restart() -> None:
    p0 = (PAGES / "ref_sglang.txt").read_text()
    p1 = advance(p0, SGLANG, {}, {0.06: 10, 0.08: 30, 2.5: 60}, 122.6)
    p2 = restart(p1, SGLANG, {})  # the engine restarted: its histogram is back at zero
    p3 = advance(p2, SGLANG, {}, {0.04: 4, 30.0: 1}, 12.5)  # and records 5 requests
    snaps = list(_ledger_over([p0, p1, p2, p3], "sglang"))
    assert snaps[0].models == ()  # the first scrape only sets the baseline
    h1 = _ttft(snaps[1])
    assert h1 is not None
    got = dict(h1.buckets)
    # the sglang page's own bounds, kept: 0.001 … 30 and +Inf (20 of them)
    assert list(got) == [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                         5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0, INF]  # fmt: skip
    assert (got[0.04], got[0.06], got[0.08], got[1.0], got[2.5], got[INF]) == (0, 10, 40, 40, 100, 100)
    assert h1.sum == pytest.approx(122.6) and h1.count == 100
    # the restart's scrape adds nothing (an empty histogram since the restart) and goes down nowhere
    assert _ttft(snaps[2]) == h1
    h3 = _ttft(snaps[3])
    assert h3 is not None
    got3 = dict(h3.buckets)
    assert (got3[0.04], got3[0.06], got3[2.5], got3[25.0], got3[30.0], got3[INF]) == (
        4,
        14,
        104,
        104,
        105,
        105,
    )
    assert h3.sum == pytest.approx(135.1)
    for a, b in zip(h1.buckets, h3.buckets, strict=True):
        assert b[1] >= a[1]  # no bucket went down across the restart


def test_vllm_data_parallel_ranks_are_summed_and_a_hostile_scrape_is_absent_for_its_window() -> None:
    p0 = (PAGES / "vllm_v1_dp2.txt").read_text()
    p1 = advance(p0, VLLM, {"engine": "0"}, {0.25: 40}, 6.0)
    p1 = advance(p1, VLLM, {"engine": "1"}, {0.75: 60}, 36.0)
    bad = p1.replace(f'{VLLM}_bucket{{engine="1",model_name="{LLAMA}",le="0.5"}} 850.0',
                     f'{VLLM}_bucket{{engine="1",model_name="{LLAMA}",le="0.5"}} NaN')  # fmt: skip
    assert bad != p1
    p3 = advance(p1, VLLM, {"engine": "1"}, {0.1: 5}, 0.4)
    p4 = advance(p3, VLLM, {"engine": "0"}, {0.08: 2}, 0.1)
    snaps = list(_ledger_over([p0, p1, bad, p3, p4], "vllm"))
    h1 = _ttft(snaps[1])
    assert h1 is not None
    got = dict(h1.buckets)
    # 40 in (0.1, 0.25] on rank 0 and 60 in (0.5, 0.75] on rank 1, summed over the ranks
    assert (got[0.1], got[0.25], got[0.5], got[0.75], got[2560.0], got[INF]) == (0, 40, 40, 100, 100, 100)
    assert h1.sum == pytest.approx(42.0)
    assert _ttft(snaps[2]) == h1  # the NaN bucket: the histogram is absent for that window
    # the last good reading is kept: the next window counts the 5 made across the refused scrape
    h3 = _ttft(snaps[3])
    assert h3 is not None
    got3 = dict(h3.buckets)
    assert (got3[0.08], got3[0.1], got3[0.25], got3[0.75], got3[INF]) == (0, 5, 45, 105, 105)
    h4 = _ttft(snaps[4])  # then 2 more in (0.06, 0.08]
    assert h4 is not None
    got4 = dict(h4.buckets)
    assert (got4[0.06], got4[0.08], got4[0.1], got4[0.25], got4[INF]) == (0, 2, 7, 47, 107)
    assert h4.sum == pytest.approx(42.5)


def _without_rank(page: str, rank: str) -> str:
    """The page with one data-parallel rank's TTFT series missing (as when a rank is not reporting)."""
    gone = f'engine="{rank}"'
    return "".join(
        line for line in page.splitlines(keepends=True) if not (line.startswith(VLLM) and gone in line)
    )


def test_a_data_parallel_rank_missing_or_restarting_is_not_a_restart_of_the_sum() -> None:
    p0 = (PAGES / "vllm_v1_dp2.txt").read_text()  # TTFT: rank 0 has 986 observations, rank 1 913
    p1 = _without_rank(p0, "1")  # rank 1 missing for a scrape: the sum drops from 1,899 to 986
    p2 = advance(p0, VLLM, {"engine": "1"}, {0.25: 3}, 0.6)  # it is back, with 3 more
    p3 = advance(restart(p2, VLLM, {"engine": "1"}), VLLM, {"engine": "1"}, {0.5: 4}, 1.2)  # restarted
    snaps = list(_ledger_over([p0, p1, p2, p3], "vllm"))
    # a lone rank is read as the sum: that window has no baseline and no histogram yet
    assert _ttft(snaps[1]) is None
    h2 = _ttft(snaps[2])
    assert h2 is not None
    # each rank against its own last reading: rank 0 made none, rank 1 three (read as a restart
    # of the sum, rank 0's 986 would count again)
    assert (dict(h2.buckets)[0.1], dict(h2.buckets)[0.25], h2.count) == (0, 3, 3)
    h3 = _ttft(snaps[3])
    assert h3 is not None
    # rank 1 restarted: its 4 since the restart count, rank 0's history does not
    assert (dict(h3.buckets)[0.25], dict(h3.buckets)[0.5], h3.count) == (3, 7, 7)
    assert h3.sum == pytest.approx(1.8)


def _small_snapshot() -> Snapshot:
    p0 = (PAGES / "ref_sglang.txt").read_text()
    p1 = advance(p0, SGLANG, {}, {0.06: 10, 0.08: 30, 2.5: 60}, 122.6)
    return list(_ledger_over([p0, p1], "sglang", version="2024-06"))[-1]


def test_exposition_has_the_histograms_under_infercost_labels() -> None:
    snap = _small_snapshot()
    fams = {f.name: f for f in text_string_to_metric_families(render(snap, process=False).decode())}
    fam = fams["infercost_ttft_seconds"]
    assert fam.type == "histogram"
    labels = {"node": "node-a", "engine": "e0", "model": LLAMA, "model_version": "2024-06"}
    values = {
        (s.name, s.labels.get("le")): s.value for s in fam.samples if s.labels.items() >= labels.items()
    }
    assert values[("infercost_ttft_seconds_bucket", "0.06")] == 10
    assert values[("infercost_ttft_seconds_bucket", "2.5")] == 100
    assert values[("infercost_ttft_seconds_bucket", "+Inf")] == 100
    assert values[("infercost_ttft_seconds_count", None)] == 100
    assert values[("infercost_ttft_seconds_sum", None)] == pytest.approx(122.6)
    # the e2e and ITL histograms of the sglang page did not move: re-based, all zero
    assert "infercost_e2e_seconds" in fams and "infercost_itl_seconds" in fams
    assert {s.value for s in fams["infercost_e2e_seconds"].samples} == {0.0}
    # p50 / p95 / p99 gauges and the re-based buckets describe the same observations
    (m,) = snap.models
    assert m.ttft_histogram is not None
    assert quantile(m.ttft_histogram, 0.99) == pytest.approx(m.ttft_p99_seconds)  # type: ignore[arg-type]


def test_fast_renderer_writes_the_histograms_as_prometheus_client_does() -> None:
    snap = _small_snapshot()
    hostile = replace(snap.models[0], model='we"ird\\name\nline2', model_version="v\\7")
    for s in (snap, replace(snap, models=(hostile,))):
        assert render_catalogue(s) == render_with_client(s)


def test_promtool_check_metrics_accepts_the_histograms() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: .ci/run installs the Debian 'prometheus' package"
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=render(_small_snapshot()), capture_output=True, timeout=30
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_catalogue_rows() -> None:
    assert [h.full_name for h in HISTOGRAMS] == [
        "infercost_ttft_seconds",
        "infercost_itl_seconds",
        "infercost_e2e_seconds",
    ]
    assert all(h.kind == "histogram" and h.unit == "s" and h.source == "model" for h in HISTOGRAMS)


# ---------------------------------------------------------------------------------------------
# A real Prometheus over the real daemon, fed by real engine pages
# ---------------------------------------------------------------------------------------------

FLEET_P = (
    "histogram_quantile({q}, sum by (model, model_version, le) (rate(infercost_ttft_seconds_bucket[5m])))"
)
CUMULATIVE_P = "histogram_quantile({q}, sum by (model, model_version, le) (infercost_ttft_seconds_bucket))"


class _Pages:
    """A local HTTP server standing in for three engines: each path serves its current page."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages = pages
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _handle(self, request: web.Request) -> web.Response:
        text = self.pages[request.match_info["name"]]
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{name}/metrics", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def _daemon_series(port: int, name: str) -> dict[str, float]:
    """{engine: value} of one model-labelled series on the daemon's own /metrics."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == name:
                out[smp.labels["engine"]] = smp.value
    return out


def _by_version(result: list[dict[str, object]]) -> dict[str, float]:
    return {r["metric"]["model_version"]: float(r["value"][1]) for r in result}  # type: ignore[index]


@pytest.mark.slow
async def test_real_prometheus_histogram_quantile_over_the_rebased_buckets(tmp_path: Path) -> None:
    """Two vLLM engines (same model version: the fleet sums them) and one SGLang engine (another
    version, other bucket bounds) on one real daemon; a real Prometheus scrapes it. The quantiles
    Prometheus computes over the re-based buckets equal the ones worked out by hand below."""
    from agent.app import build_agent
    from agent.clock import AcceleratedClock
    from agent.config import (
        Config,
        EngineConfig,
        ExportersConfig,
        IntervalsConfig,
        NvmlConfig,
        PrometheusExporterConfig,
    )

    vllm0 = (PAGES / "vllm_v1_dp2.txt").read_text()
    sgl0 = (PAGES / "ref_sglang.txt").read_text()
    rank0, rank1 = {"engine": "0"}, {"engine": "1"}
    # window 1 (before Prometheus starts): 100 first tokens per engine in its lowest busy bucket
    w1 = {
        "a": advance(vllm0, VLLM, rank0, {0.1: 100}, 9.0),
        "b": advance(vllm0, VLLM, rank1, {0.1: 100}, 9.0),
        "s": advance(sgl0, SGLANG, {}, {0.06: 100}, 5.0),
    }
    # window 2 (Prometheus watching): vllm-a 40 in (0.1, 0.25] on rank 0 and 60 in (0.5, 0.75] on
    # rank 1; vllm-b 100 in (0.25, 0.5]; sglang 10 in (0.04, 0.06], 30 in (0.06, 0.08], 60 in (1, 2.5]
    w2 = {
        "a": advance(advance(w1["a"], VLLM, rank0, {0.25: 40}, 8.0), VLLM, rank1, {0.75: 60}, 36.0),
        "b": advance(w1["b"], VLLM, rank0, {0.5: 100}, 40.0),
        "s": advance(w1["s"], SGLANG, {}, {0.06: 10, 0.08: 30, 2.5: 60}, 122.6),
    }
    pages = _Pages({"a": vllm0, "b": vllm0, "s": sgl0})
    await pages.start()
    base = f"http://127.0.0.1:{pages.port}"
    engines = (
        EngineConfig(name="vllm-a", kind="vllm", url=f"{base}/a/metrics", gpus=(0,), model_version="v2"),
        EngineConfig(name="vllm-b", kind="vllm", url=f"{base}/b/metrics", gpus=(1,), model_version="v2"),
        EngineConfig(name="sglang", kind="sglang", url=f"{base}/s/metrics", gpus=(2,), model_version="v1"),
    )
    cfg = Config(
        node="node-a",
        state_dir=tmp_path / "state",
        intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=5, window_seconds=10),
        nvml=NvmlConfig(backend="fake", fake_count=3),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
    )
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 2.0}]}, "test-book")
    agent = await build_agent(
        cfg, clock=AcceleratedClock(20.0), book=book, engines=engines, history=False, scorer=False
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    prom: Prometheus | None = None
    try:
        await agent.started.wait()
        assert agent.prometheus is not None
        port = agent.prometheus.port
        count = "infercost_ttft_seconds_count"

        async def counts_are(want: dict[str, float]) -> bool:
            return await _daemon_series(port, count) == want

        # the baseline is the captured page; then window 1 arrives
        await async_wait_until(lambda: counts_are({"vllm-a": 0, "vllm-b": 0, "sglang": 0}), 30)
        pages.pages.update(w1)
        await async_wait_until(lambda: counts_are({"vllm-a": 100, "vllm-b": 100, "sglang": 100}), 30)

        prom = await asyncio.to_thread(Prometheus, tmp_path / "prom", [f"127.0.0.1:{port}"])
        assert await asyncio.to_thread(prom.wait_for, f"{count} == 100", 30)
        await asyncio.sleep(3)  # a few scrapes of window 1
        pages.pages.update(w2)

        async def prometheus_saw_window_2() -> bool:
            got = await asyncio.to_thread(prom.query, f"sum by (model_version) ({count})")  # type: ignore[union-attr]
            return _by_version(got) == {"v1": 200.0, "v2": 400.0}

        await async_wait_until(prometheus_saw_window_2, 30)
        await asyncio.sleep(2)  # a few scrapes of window 2

        async def q(expr: str) -> dict[str, float]:
            return _by_version(await asyncio.to_thread(prom.query, expr))  # type: ignore[union-attr]

        # rate over window 2 only (window 1 is every series' first sample):
        # v2 = vllm-a + vllm-b: le 0.25: 40, 0.5: 140, 0.75: 200, +Inf: 200
        #   p99: rank 198 in (0.5, 0.75]: 0.5 + 0.25 × (198 − 140) / 60 = 0.741666…
        #   p50: rank 100 in (0.25, 0.5]: 0.25 + 0.25 × (100 − 40) / 100 = 0.4
        # v1 = sglang: le 0.06: 10, 0.08: 40, 1.0: 40, 2.5: 100, +Inf: 100
        #   p99: rank 99 in (1, 2.5]: 1 + 1.5 × (99 − 40) / 60 = 2.475
        #   p50: rank 50 in (1, 2.5]: 1 + 1.5 × (50 − 40) / 60 = 1.25
        p99 = await q(FLEET_P.format(q=0.99))
        assert p99 == {"v2": pytest.approx(0.5 + 0.25 * 58 / 60), "v1": pytest.approx(2.475)}
        p50 = await q(FLEET_P.format(q=0.5))
        assert p50 == {"v2": pytest.approx(0.4), "v1": pytest.approx(1.25)}
        # the cumulative buckets (windows 1 + 2) at an instant:
        # v2: 0.1: 200, 0.25: 240, 0.5: 340, 0.75: 400 → p99 rank 396: 0.5 + 0.25 × 56 / 60
        # v1: 0.06: 110, 0.08: 140, 1.0: 140, 2.5: 200 → p99 rank 198: 1 + 1.5 × 58 / 60 = 2.45
        cum = await q(CUMULATIVE_P.format(q=0.99))
        assert cum == {"v2": pytest.approx(0.5 + 0.25 * 56 / 60), "v1": pytest.approx(2.45)}
        mean = await q(
            "sum by (model_version) (infercost_ttft_seconds_sum)"
            " / sum by (model_version) (infercost_ttft_seconds_count)"
        )
        # v2: (9 + 9 + 44 + 40) s / 400 = 0.255 s; v1: (5 + 122.6) s / 200 = 0.638 s
        assert mean == {"v2": pytest.approx(0.255), "v1": pytest.approx(0.638)}

        # vllm-a restarts (both ranks back at zero) and serves 5 requests in (0.1, 0.25]
        pages.pages["a"] = advance(restart(w2["a"], VLLM, {}), VLLM, rank0, {0.25: 5}, 1.0)

        async def prometheus_saw_the_restart() -> bool:
            return (await q(f"sum by (model_version) ({count})")).get("v2") == 405.0

        await async_wait_until(prometheus_saw_the_restart, 30)
        # no re-based series ever went down: Prometheus saw no counter reset in any bucket
        resets = await asyncio.to_thread(
            prom.query,
            "max(resets(infercost_ttft_seconds_bucket[5m])) + max(resets(infercost_ttft_seconds_count[5m]))",
        )
        assert [float(r["value"][1]) for r in resets] == [0.0]
    finally:
        if prom is not None:
            prom.close()
        stop.set()
        await asyncio.wait_for(task, 10)
        await pages.stop()


async def test_otlp_carries_the_histograms_with_the_engines_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_otlp import HttpReceiver

    from agent.config import OtlpExporterConfig
    from agent.sinks.otlp import otlp_exporter

    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    rx = HttpReceiver()
    await rx.start()
    snap = _small_snapshot()
    cfg = OtlpExporterConfig(endpoint=f"http://127.0.0.1:{rx.port}/v1/metrics", interval_seconds=3600)
    exp = otlp_exporter(lambda: snap, cfg, snap.node)
    assert exp is not None
    try:
        assert await asyncio.to_thread(exp.flush, 10.0)
    finally:
        await asyncio.to_thread(exp.shutdown)
        await rx.close()
    _, _, msg = rx.got[0]
    hists = {
        m.name: m
        for rm in msg.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.WhichOneof("data") == "histogram"
    }
    assert set(hists) == {
        "infercost.time_to_first_token",
        "infercost.time_per_output_token",
        "infercost.request.duration",
    }
    ttft = hists["infercost.time_to_first_token"]
    assert ttft.unit == "s"
    assert ttft.histogram.aggregation_temporality == 2  # AGGREGATION_TEMPORALITY_CUMULATIVE
    (dp,) = ttft.histogram.data_points
    attrs = {a.key: a.value.string_value for a in dp.attributes}
    assert attrs == {
        "gen_ai.request.model": LLAMA,
        "infercost.model.version": "2024-06",
        "infercost.engine": "e0",
    }
    # the sglang page's 20 finite bounds; per-bucket counts: 10 in (0.04, 0.06], 30 in (0.06, 0.08],
    # 60 in (1, 2.5], none above (the +Inf bucket is the 21st count)
    assert list(dp.explicit_bounds) == [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                        0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0]  # fmt: skip
    want = [0] * 21
    want[5], want[6], want[12] = 10, 30, 60
    assert list(dp.bucket_counts) == want
    assert dp.count == 100 and dp.sum == pytest.approx(122.6)
    assert not dp.HasField("min") and not dp.HasField("max")  # unknown: unset, not 0
    assert dp.start_time_unix_nano < dp.time_unix_nano
