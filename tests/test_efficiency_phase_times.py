"""The decode efficiency's prefill share from vLLM's request phase times (agent/cost/efficiency.py):
synthetic counters of an engine whose true pure-decode step and prefill work are known, computed
by hand."""

from __future__ import annotations

import pytest

from agent.cost.efficiency import DecodeObservation, ModelFigures, decode_efficiency, prefill_share

H100_BW = 3.35e12  # bytes/s
W = 140e9  # bytes of weights: the roofline step is W / H100_BW ≈ 41.79 ms
PEAK = 1e15  # FLOP/s
F = 1e11  # FLOPs per token


def engine(
    *,
    pure_step: float,
    prefill_work: float,
    finished: float,
    window: float = 10.0,
    replicas: int = 1,
    prefilled: float = 0.0,
    **kw: object,
) -> DecodeObservation:
    """A window of an engine whose decode steps take ``pure_step`` seconds of decode work and carry
    ``prefill_work`` seconds of prompt chunks per replica over ``window`` seconds (chunked prefill:
    the step as run is ``pure_step ÷ (1 − share)``), and whose ``finished`` requests' prefill times
    are, as vLLM V1 times them, the step that made their first token plus their own prompt's
    compute (which adds up to the prefill work over all of them)."""
    share = prefill_work / window
    step = pure_step / (1.0 - share)
    tokens = 1000.0 * replicas
    base: dict[str, object] = {
        "engine_kind": "vllm", "generation_tokens": tokens, "decode_seconds": tokens * step,
        "requests_running": None, "kv_cache_usage_ratio": None, "kv_capacity_tokens": None,
        "replicas": replicas, "bandwidth_bytes_per_s": H100_BW * replicas, "window_seconds": window,
        "itl_seconds": tokens * step, "itl_count": tokens,
        "prefill_seconds": finished * step + prefill_work * replicas, "finished_requests": finished,
        "prefill_tokens": prefilled, "peak_flops_per_s": PEAK * replicas,
    }  # fmt: skip
    return DecodeObservation(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pure_step", "prefill_work", "finished", "replicas"),
    [
        (0.05, 2.5, 20.0, 1),  # a quarter of the window prefilling: step as run 66.7 ms
        (0.05, 6.0, 50.0, 1),  # 60 %: step as run 125 ms, 50 first steps = 6.25 s of prefill time
        (0.042, 0.0, 5.0, 1),  # no prompt work: the prefill times are the first steps alone
        (0.08, 4.0, 160.0, 8),  # eight DP replicas, 20 requests each
    ],
)
def test_the_efficiency_is_the_roofline_over_the_true_pure_decode_step(
    pure_step: float, prefill_work: float, finished: float, replicas: int
) -> None:
    fig = ModelFigures(W, None, None, F)
    o = engine(pure_step=pure_step, prefill_work=prefill_work, finished=finished, replicas=replicas)
    assert prefill_share(o, fig, o.itl_seconds / o.itl_count) == pytest.approx(prefill_work / 10.0)  # type: ignore[operator]
    assert decode_efficiency(o, fig) == pytest.approx((W / H100_BW) / pure_step)


def test_without_the_finished_count_or_the_prefill_time_the_floor_is_the_share() -> None:
    fig = ModelFigures(W, None, None, F)
    # 5,000 prefilled tokens × 1e11 FLOPs at 1e15 FLOP/s = 0.5 s of a 10 s window: a floor of 0.05
    kw = {"pure_step": 0.05, "prefill_work": 2.5, "finished": 20.0, "prefilled": 5000.0}
    step = 0.05 / 0.75
    for missing in ({"finished_requests": None}, {"finished_requests": 0.0}, {"prefill_seconds": None}):
        o = engine(**kw, **missing)  # type: ignore[arg-type]
        assert prefill_share(o, fig, step) == pytest.approx(0.05)
        assert decode_efficiency(o, fig) == pytest.approx((W / H100_BW) / (step * 0.95))
    # the phase times say a quarter: above the floor, they are the share
    assert prefill_share(engine(**kw), fig, step) == pytest.approx(0.25)  # type: ignore[arg-type]


def test_an_engine_that_defines_prefill_time_otherwise_gets_the_floor() -> None:
    fig = ModelFigures(W, None, None, F)
    o = engine(pure_step=0.05, prefill_work=2.5, finished=20.0, prefilled=5000.0, engine_kind="trtllm")
    assert prefill_share(o, fig, 0.05 / 0.75) == pytest.approx(0.05)


def test_phase_times_below_the_physical_floor_leave_the_floor() -> None:
    fig = ModelFigures(W, None, None, F)
    # the prefill times hold only the first steps (no prompt work) while the prompt counter says
    # 20,000 tokens were prefilled: at least 2 s of the 10 s at the GPU's peak
    o = engine(pure_step=0.05, prefill_work=0.0, finished=20.0, prefilled=20_000.0)
    assert prefill_share(o, fig, 0.05) == pytest.approx(0.2)
    # fewer request-seconds than the first steps themselves (counters out of step): the floor again
    short = engine(pure_step=0.05, prefill_work=0.0, finished=20.0, prefilled=20_000.0, prefill_seconds=0.5)
    assert prefill_share(short, fig, 0.05) == pytest.approx(0.2)


def test_a_share_that_leaves_a_step_under_the_roofline_is_absent_not_clamped() -> None:
    fig = ModelFigures(W, None, None, F)
    # step as run 50 ms, prefill times say 50 % prefill: a 25 ms decode step, under the 41.79 ms
    # roofline: impossible, so no figure (the counters of this window do not line up)
    o = engine(pure_step=0.05, prefill_work=0.0, finished=20.0, prefill_seconds=20 * 0.05 + 5.0)
    assert decode_efficiency(o, fig) is None
    # a share of 1 or more: no decode time left at all
    assert (
        decode_efficiency(engine(pure_step=0.05, prefill_work=0.0, finished=20.0, prefill_seconds=20.0), fig)
        is None
    )


def test_small_but_real_readings_count_at_their_boundaries() -> None:
    """One prefilled token, a one-second window, one finished request, one inter-token interval and
    intervals summing under a second are readings, not "unknown" (each a boundary of the guards)."""
    from agent.cost.efficiency import measured_step_seconds, prefill_share_floor

    fig = ModelFigures(W, None, None, F)
    one = engine(pure_step=0.05, prefill_work=0.0, finished=1.0, window=1.0, prefilled=1.0)
    assert prefill_share_floor(one, fig) == pytest.approx(1.0 * F / (PEAK * 1.0))  # 1 token, 1 s
    # one finished request whose prefill time is its first step plus 0.2 s of prompt compute
    o = engine(pure_step=0.05, prefill_work=0.2, finished=1.0, window=1.0)
    step = o.itl_seconds / o.itl_count  # type: ignore[operator]
    assert prefill_share(o, fig, step) == pytest.approx(0.2)
    # one interval of 40 ms observed: the step is the interval, not decode seconds ÷ tokens
    itl = engine(pure_step=0.05, prefill_work=0.0, finished=1.0, itl_seconds=0.04, itl_count=1.0)
    assert measured_step_seconds(itl, "request", 1) == pytest.approx(0.04)


@pytest.mark.parametrize(
    ("finished", "first_tokens"),
    [
        (30.0, 20.0),  # after a burst: 10 of the finished requests were prefilled before the window
        (10.0, 20.0),  # in a burst: half the requests prefilled have not finished yet
        (20.0, 20.0),  # steady: the two counts agree
    ],
)
def test_the_windows_prefills_are_its_first_tokens_at_the_finished_requests_mean(
    finished: float, first_tokens: float
) -> None:
    """20 requests prefilled in the window (2.5 s of prompt work in 10 s, 0.125 s each), whatever
    number of requests finished in it, each finished request's prefill time its first step plus
    its 0.125 s of prompt compute (vLLM times the phases when a request finishes, TTFT when its
    first token is made)."""
    fig = ModelFigures(W, None, None, F)
    pure_step = 0.05
    step = pure_step / 0.75
    o = engine(
        pure_step=pure_step, prefill_work=2.5, finished=20.0, finished_requests=finished,
        prefill_seconds=finished * (step + 0.125), first_tokens=first_tokens,
    )  # fmt: skip
    assert prefill_share(o, fig, step) == pytest.approx(0.25)
    assert decode_efficiency(o, fig) == pytest.approx((W / H100_BW) / pure_step)


def test_without_the_first_token_count_the_finished_requests_count_the_prefills() -> None:
    fig = ModelFigures(W, None, None, F)
    step = 0.05 / 0.75
    drained = {"finished_requests": 30.0, "prefill_seconds": 30 * (step + 0.125)}
    o = engine(pure_step=0.05, prefill_work=2.5, finished=20.0, **drained)  # type: ignore[arg-type]
    # 30 finished requests' prompt work, 3.75 s of the 10: a share of 0.375 for the true 0.25, so a
    # decode step of 41.7 ms for the true 50 ms: under the 41.79 ms roofline, no figure
    assert prefill_share(o, fig, step) == pytest.approx(0.375)
    assert decode_efficiency(o, fig) is None
    # the TTFT count says 20 prefills: the window's own share, and a figure
    counted = engine(pure_step=0.05, prefill_work=2.5, finished=20.0, first_tokens=20.0, **drained)  # type: ignore[arg-type]
    assert decode_efficiency(counted, fig) == pytest.approx((W / H100_BW) / 0.05)


def test_a_window_without_first_tokens_prefilled_at_most_its_floor() -> None:
    fig = ModelFigures(W, None, None, F)
    step = 0.05 / 0.75
    # requests finished (prefilled before the window) but none began: no prompt work from the phase
    # times, so the share is the prompt counter's FLOPs floor (5,000 tokens: 0.05) or nothing
    for prefilled, share in ((5000.0, 0.05), (0.0, 0.0)):
        o = engine(pure_step=0.05, prefill_work=2.5, finished=20.0, prefilled=prefilled, first_tokens=0.0)
        assert prefill_share(o, fig, step) == pytest.approx(share)


def test_a_window_of_no_seconds_takes_no_share_from_the_phase_times() -> None:
    """No replica-seconds to share: the phase times say nothing (not a division by zero)."""
    fig = ModelFigures(W, None, None, F)
    o = engine(pure_step=0.05, prefill_work=2.5, finished=20.0, window_seconds=0.0, first_tokens=20.0)
    assert prefill_share(o, fig, 0.05) == 0.0
