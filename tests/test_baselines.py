"""Baselines: one pure implementation over minute records (incremental and batch), hand-computed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.clock import ManualClock
from agent.detect.baselines import Baseline, TrailingBaseline, baseline_of, interpolate, stat_quantile
from agent.records import MinuteRecord
from agent.samples import CostWindow, UsageWindow
from agent.store import Store

T0 = 1699833600.0  # Monday 2023-11-13 00:00 UTC
KEY = {"node": "n1", "engine": "vllm-a", "model": "llama", "model_version": "v1"}
LABELS = tuple(KEY.items())


def ratio(v: Sequence[float]) -> float | None:
    return v[0] / v[1] if v[1] else None


def rec(minute: float, cost: float, gen: float, secs: float = 60.0, **extra: float) -> MinuteRecord:
    sums = {"cost_usd": cost, "generation_tokens": gen, "seconds": secs, **extra}
    return MinuteRecord("model", LABELS, minute, sums)


# ---------------------------------------------------------------------------------------------
# TrailingBaseline
# ---------------------------------------------------------------------------------------------


def test_mean_forgets_old_minutes_while_newer_ones_remain() -> None:
    b = TrailingBaseline(180.0, ratio, 2, False)  # a 3-minute window
    b.add("k", 0.0, (10.0, 1.0), 10.0)
    b.add("k", 60.0, (2.0, 1.0), 2.0)
    b.add("k", 120.0, (3.0, 1.0), 3.0)
    assert b.mean("k", 180.0) == (15.0 / 3, 3)  # [0, 180): all three
    assert b.mean("k", 180.0 + 1) == (5.0 / 2, 2)  # minute 0 is older than 180 s: (2 + 3) / 2
    assert b.count("k", 240.0 + 1) == 1  # only minute 120 is left
    assert b.mean("k", 240.0 + 1) == (3.0, 1)
    assert b.mean("k", 301.0) == (None, 0)  # everything expired
    assert b.mean("other", 60.0) == (None, 0) and b.count("other", 60.0) == 0


def test_several_minutes_expire_at_once_row_by_row() -> None:
    b = TrailingBaseline(180.0, ratio, 2, False)
    for i, (cost, tokens) in enumerate(((1.0, 4.0), (2.0, 8.0), (3.0, 16.0), (5.0, 1.0))):
        b.add("k", i * 60.0, (cost, tokens), cost / tokens)
    assert b.mean("k", 240.0) == ((2.0 + 3.0 + 5.0) / (8.0 + 16.0 + 1.0), 3)
    # at 300 + 1 s minutes 0, 60 and 120 have gone together: only (5, 1) is left
    assert b.mean("k", 301.0) == (5.0, 1)
    q = TrailingBaseline(180.0, ratio, 2, True)
    for i, v in enumerate((9.0, 1.0, 7.0, 3.0, 5.0)):
        q.add("k", i * 60.0, (v, 1.0), v)
    # at 240 + 1 s minutes 0 (9) and 60 (1) have gone: 7, 3, 5 remain
    assert q.quantile("k", 241.0, 1.0) == (7.0, 3) and q.quantile("k", 241.0, 0.0) == (3.0, 3)
    assert q.quantile("k", 301.0, 0.5) == (4.0, 2)  # 7 gone too: the median of 3 and 5


def test_runs_of_minutes_expire_across_their_boundaries() -> None:
    # runs held: [0, 60, 120], [300, 360], [360] (the same minute again: another series), [600]
    b = TrailingBaseline(300.0, ratio, 2, False)
    for minute, cost in ((0.0, 1.0), (60.0, 2.0), (120.0, 4.0), (300.0, 8.0), (360.0, 16.0), (360.0, 32.0)):
        b.add("k", minute, (cost, 1.0), cost)
    b.add("k", 600.0, (64.0, 1.0), 64.0)  # joining expires [0, 300): the first run goes whole
    assert b.mean("k", 600.0) == ((8.0 + 16.0 + 32.0 + 64.0) / 4, 4)
    assert b.count("k", 600.5) == 3  # minute 300 (the head of the second run) has gone
    assert b.mean("k", 600.5) == ((16.0 + 32.0 + 64.0) / 3, 3)
    assert b.mean("k", 660.0) == ((16.0 + 32.0 + 64.0) / 3, 3)  # 360 is exactly 300 s old: kept
    assert b.mean("k", 661.0) == (64.0, 1)  # both minutes 360 went together
    b.add("k", 660.0, (1.0, 1.0), 1.0)  # the next minute of the last run
    b.add("k", 1020.0, (2.0, 1.0), 2.0)  # 600 and 660 expire, one run
    assert b.mean("k", 1020.0) == (2.0, 1)


def test_minutes_out_of_order_are_held_in_arrival_order() -> None:
    # expiry drops from the oldest *arrival* while it is older than the window, so a minute that
    # arrives after a later one waits behind it
    b = TrailingBaseline(100.0, ratio, 2, False)
    b.add("k", 120.0, (1.0, 1.0), 1.0)
    b.add("k", 60.0, (3.0, 1.0), 3.0)  # 60 s before the run that holds 120: a run of its own
    assert b.mean("k", 161.0) == (2.0, 2)  # horizon 61: 120 is not older, so 60 stays behind it
    assert b.count("k", 230.0) == 0  # horizon 130: 120 goes, then 60
    q = TrailingBaseline(100.0, ratio, 2, False)
    for minute in (0.0, 60.0, 30.0):  # 30 s after the start of a two-minute run: a run of its own
        q.add("k", minute, (minute, 1.0), minute)
    assert q.count("k", 200.0) == 0  # horizon 100: 0, 60 and 30 all go


def test_minutes_off_the_whole_minute_keep_their_exact_times() -> None:
    b = TrailingBaseline(120.0, ratio, 2, True)
    for i, v in enumerate((3.0, 1.0, 2.0)):
        b.add("k", 0.1 + i * 60.0, (v, 1.0), v)
    assert b.quantile("k", 120.1, 0.0) == (1.0, 3)  # minute 0.1 is exactly 120 s old: kept
    assert b.quantile("k", 120.2, 0.0) == (1.0, 2)
    assert b.quantile("k", 180.2, 1.0) == (2.0, 1)


def test_a_baseline_keeps_what_its_statistic_needs_and_refuses_the_other() -> None:
    mean = TrailingBaseline(180.0, ratio, 2, False)
    refused = r"^this baseline keeps sums for mean\(\), not per-minute values for quantile\(\)$"
    with pytest.raises(TypeError, match=refused):
        mean.quantile("k", 60.0, 0.5)
    quantiles = TrailingBaseline(180.0, ratio, 2, True)
    refused = r"^this baseline keeps per-minute values for quantile\(\), not sums for mean\(\)$"
    with pytest.raises(TypeError, match=refused):
        quantiles.mean("k", 60.0)


def test_the_window_edge_is_inclusive() -> None:
    b = TrailingBaseline(120.0, ratio, 2, False)
    b.add("k", 0.0, (4.0, 1.0), 4.0)
    assert b.count("k", 120.0) == 1  # minute 0 is exactly 120 s old: still in [now - 120, now)
    assert b.count("k", 120.5) == 0


def test_a_quantile_baseline_expires_its_values_too() -> None:
    b = TrailingBaseline(180.0, ratio, 2, True)
    for i, v in enumerate((5.0, 1.0, 3.0, 4.0)):
        b.add("k", i * 60.0, (v, 1.0), v)
    # at 180 + 1 s minute 0 (5.0) has gone: 1, 3, 4 remain; the median is 3, p0 1, p100 4
    assert b.quantile("k", 181.0, 0.5) == (3.0, 3)
    assert b.quantile("k", 181.0, 0.0) == (1.0, 3)
    assert b.quantile("k", 181.0, 1.0) == (4.0, 3)
    # p25 of (1, 3, 4): position 0.5 → 1 + (3 − 1) × 0.5 = 2
    assert b.quantile("k", 181.0, 0.25) == (2.0, 3)
    assert b.quantile("k", 1000.0, 0.5) == (None, 0)
    assert b.quantile("nope", 0.0, 0.5) == (None, 0)


def test_a_bucket_emptied_by_expiry_starts_again_from_zero_sums() -> None:
    b = TrailingBaseline(60.0, ratio, 2, False)
    b.add("k", 0.0, (0.1, 0.3), 1 / 3)
    b.add("k", 600.0, (2.0, 4.0), 0.5)  # minute 0 expired on the way in
    assert b.mean("k", 600.0) == (0.5, 1)  # exactly 2/4, no float drift left from 0.1/0.3


def test_lag_holds_minutes_back_until_they_are_old_enough() -> None:
    b = TrailingBaseline(3600.0, ratio, 2, False, lag=120.0)
    b.add("k", 0.0, (1.0, 1.0), 1.0)
    b.add("k", 60.0, (9.0, 1.0), 9.0)
    assert b.mean("k", 120.0) == (None, 0)  # minute 0 is 120 s old: not strictly older than the lag
    assert b.mean("k", 121.0) == (1.0, 1)
    assert b.mean("k", 181.0) == (5.0, 2)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ((), 0.5, None),
        ((7.0,), 0.99, 7.0),
        ((1.0, 2.0), 0.5, 1.5),
        ((1.0, 2.0, 4.0, 8.0), 0.5, 3.0),  # position 1.5: 2 + (4 − 2) × 0.5
        ((1.0, 2.0, 4.0, 8.0), 0.9, 6.8),  # position 2.7: 4 + 4 × 0.7
        ((1.0, 2.0, 4.0, 8.0), 1.0, 8.0),
        ((1.0, 2.0, 4.0, 8.0), 0.0, 1.0),
    ],
)
def test_interpolate(values: tuple[float, ...], q: float, expected: float | None) -> None:
    assert interpolate(values, q) == pytest.approx(expected)


def test_stat_quantile() -> None:
    assert stat_quantile("mean") is None
    assert stat_quantile("median") == 0.5
    assert stat_quantile("p90") == pytest.approx(0.9)
    assert stat_quantile("p99.9") == pytest.approx(0.999)


# ---------------------------------------------------------------------------------------------
# baseline_of (batch, over records)
# ---------------------------------------------------------------------------------------------


def test_baseline_of_sums_series_per_minute_and_takes_a_ratio_of_sums() -> None:
    v2 = tuple({**KEY, "model_version": "v2"}.items())
    recs = [
        MinuteRecord("gpu", (("node", "n1"), ("gpu", "0")), T0, {"cost_usd": 99.0}),  # another kind
        rec(T0, 0.06, 6000),
        MinuteRecord("model", v2, T0, {"cost_usd": 0.06, "generation_tokens": 6000, "seconds": 60}),
        rec(T0 + 60, 0.03, 1000),
        rec(T0 - 61, 100.0, 1),  # before the window
        rec(T0 + 120, 100.0, 1),  # at the end: not included
    ]
    b = baseline_of(recs, "usd_per_1m_output_tokens", T0 + 120, window=121)
    # per minute: T0 → $0.12 / 12,000; T0+60 → $0.03 / 1,000: ratio of sums $0.15 / 13,000 tok
    assert b == Baseline(pytest.approx(0.15 / 13000 * 1e6), 2)
    med = baseline_of(recs, "usd_per_1m_output_tokens", T0 + 120, window=121, stat="median")
    # per-minute values $10/1M and $30/1M: the median is their midpoint
    assert med == Baseline(pytest.approx(20.0), 2)


def test_baseline_of_skips_minutes_without_a_value_and_below_the_floor() -> None:
    recs = [rec(T0, 0.06, 600), rec(T0 + 60, 0.06, 0), rec(T0 + 120, 0.06, 6000)]
    assert baseline_of(recs, "usd_per_1m_output_tokens", T0 + 180).minutes == 2  # T0+60 has no tokens
    # 6000 tokens / 60 s = 100 tok/s passes a floor of 100; 600 / 60 = 10 tok/s does not
    b = baseline_of(recs, "usd_per_1m_output_tokens", T0 + 180, min_tokens_per_second=100)
    assert b == Baseline(pytest.approx(10.0), 1)
    assert baseline_of(recs, "usd_per_1m_output_tokens", T0 + 180, min_tokens_per_second=101).value is None


def test_baseline_of_like_load_by_tokens_or_by_requests_running() -> None:
    recs = [
        rec(T0, 0.06, 6000, **{"running.s": 8 * 60.0, "running.w": 60.0}),  # 100 tok/s, 8 running
        rec(T0 + 60, 0.06, 3000, **{"running.s": 2 * 60.0, "running.w": 60.0}),  # 50 tok/s, 2 running
        rec(T0 + 120, 0.06, 1500),  # 25 tok/s, running unknown
    ]
    end = T0 + 180
    # bands ×2 wide: 100 tok/s is in band floor(log2 100) = 6 (64–128); 50 in band 5; 25 in band 4
    assert baseline_of(recs, "usd_per_1m_output_tokens", end, band_of=70.0) == Baseline(
        pytest.approx(10.0), 1
    )
    assert baseline_of(recs, "usd_per_1m_output_tokens", end, band_of=33.0) == Baseline(
        pytest.approx(20.0), 1
    )
    # by requests running: 2 is in band 1 (2–4); the minute without the gauge is never comparable
    b = baseline_of(recs, "usd_per_1m_output_tokens", end, band_of=3.0, band_signal="requests_running")
    assert b == Baseline(pytest.approx(20.0), 1)
    b = baseline_of(
        recs, "usd_per_1m_output_tokens", end, band_of=8.0, band_ratio=4.0, band_signal="requests_running"
    )
    assert b == Baseline(pytest.approx(10.0), 1)  # ×4 bands: 8 is in band 1 (4–16), 2 in band 0


def test_baseline_of_same_hour_of_week() -> None:
    week = 7 * 86400
    recs = [rec(T0 - week + 2 * 3600, 0.06, 600), rec(T0 - week + 3 * 3600, 0.06, 6000)]
    b = baseline_of(
        recs, "usd_per_1m_output_tokens", T0 + 3 * 3600, window=8 * 86400, same_hour_of_week_as=T0 + 3 * 3600
    )
    assert b == Baseline(pytest.approx(10.0), 1)  # Monday 03:00 a week ago, not 02:00


def test_baseline_of_over_store_records_day_and_night(tmp_path: Path) -> None:
    """The store persists minutes; the baseline is computed over what it returns."""
    st = Store(tmp_path / "h.sqlite", 35, ManualClock(T0 + 86400))
    wins = []
    for i in range(24 * 60):  # one day: busy (100 tok/s) from 08:00 to 20:00, quiet (10 tok/s) otherwise
        busy = 8 * 60 <= i < 20 * 60
        wins.append(_cw(T0 + i * 60, tokens=6000 if busy else 600, usd=0.03))
    st.write_windows(wins)
    end = T0 + 86400
    recs = st.series("model", KEY, end - 86400, end)
    mean = baseline_of(recs, "usd_per_1m_output_tokens", end, window=86400)
    # ratio of sums: $43.2 / (720×6000 + 720×600) tokens
    assert mean.value == pytest.approx(43.2 / (720 * 6600) * 1e6) and mean.minutes == 1440
    busy_b = baseline_of(recs, "usd_per_1m_output_tokens", end, window=86400, band_of=100.0)
    assert busy_b.value == pytest.approx(5.0) and busy_b.minutes == 720
    p90 = baseline_of(recs, "usd_per_1m_output_tokens", end, window=86400, stat="p90")
    assert p90.value == pytest.approx(50.0)
    util = baseline_of(recs, "model_gpu_utilization_ratio", end, window=86400, stat="median")
    assert util.value == pytest.approx(0.8)
    other = st.series("model", {**KEY, "model": "other"}, end - 86400, end)
    assert baseline_of(other, "usd_per_1m_output_tokens", end) == Baseline(None, 0)
    st.close()


def _cw(start: float, tokens: float, usd: float) -> CostWindow:
    u = UsageWindow(
        "n1", "vllm-a", "llama", "v1", start, start + 60, prompt_tokens=tokens / 2, generation_tokens=tokens,
        gpu_seconds=60, energy_joules=None, gpu_util_ratio=0.8,
    )  # fmt: skip
    return CostWindow(u, usd, 0.0, usd / tokens * 1e6, None, 0.0)


def test_count_holds_lagged_minutes_back_too() -> None:
    b = TrailingBaseline(3600.0, ratio, 2, False, lag=60.0)
    b.add("k", 0.0, (1.0, 1.0), 1.0)
    assert b.count("k", 30.0) == 0 and b.count("k", 61.0) == 1


def test_baseline_of_a_gauge_skips_minutes_without_it() -> None:
    recs = [
        rec(T0, 0.06, 6000, **{"gpu_util.s": 30.0, "gpu_util.w": 60.0}),
        rec(T0 + 60, 0.06, 6000),  # no utilisation reading this minute
    ]
    b = baseline_of(recs, "model_gpu_utilization_ratio", T0 + 120)
    assert b == Baseline(pytest.approx(0.5), 1)


def test_baseline_of_load_from_records_without_seconds_or_tokens() -> None:
    g = {"gpu_util.s": 30.0, "gpu_util.w": 60.0}
    recs = [
        MinuteRecord("model", LABELS, T0, {"generation_tokens": 60.0, **g}),  # no seconds: 0 tok/s
        MinuteRecord("model", LABELS, T0 + 60, {"seconds": 0.0, "generation_tokens": 60.0, **g}),
        MinuteRecord("model", LABELS, T0 + 120, {"seconds": 0.5, "generation_tokens": 30.0, **g}),  # 60 tok/s
        MinuteRecord("model", LABELS, T0 + 180, {"seconds": 60.0, **g}),  # no tokens: 0 tok/s
    ]
    sig = "model_gpu_utilization_ratio"
    assert baseline_of(recs, sig, T0 + 240).minutes == 4
    assert baseline_of(recs, sig, T0 + 240, min_tokens_per_second=0.5).minutes == 1  # only the 0.5 s minute
    assert baseline_of(recs, sig, T0 + 240, min_tokens_per_second=60.0).minutes == 1
    assert baseline_of(recs, sig, T0 + 240, min_tokens_per_second=0.01).minutes == 1  # no tokens: 0 tok/s


def test_baseline_of_requests_running_from_a_partial_minute_of_gauge() -> None:
    recs = [rec(T0, 0.06, 6000, **{"running.s": 1.5, "running.w": 0.5})]  # 3 running for half a second
    b = baseline_of(recs, "usd_per_1m_output_tokens", T0 + 60, band_of=3.0, band_signal="requests_running")
    assert b == Baseline(pytest.approx(10.0), 1)


def test_a_lag_under_a_second_still_holds_minutes_back() -> None:
    b = TrailingBaseline(3600.0, ratio, 2, True, lag=0.5)
    b.add("k", 0.0, (1.0, 1.0), 1.0)
    assert b.count("k", 0.25) == 0 and b.quantile("k", 0.25, 0.5) == (None, 0)
    assert b.quantile("k", 0.75, 0.5) == (1.0, 1)


def test_an_unknown_band_signal_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown band signal 'tokens'"):
        baseline_of([], "usd_per_1m_output_tokens", T0, band_signal="tokens")
