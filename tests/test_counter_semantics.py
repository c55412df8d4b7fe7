"""Counters with the exposition format's semantics, end to end: a real local HTTP server serves a
sequence of vLLM pages, the project's scraper reads them and the window join counts the tokens.

Each hostile sequence (a counter going back by one every scrape, an absurd jump, a series written
twice with two values, a restart that out-counts its previous lifetime) must store the tokens the
engine really made, flag what it refused and log it once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

import aiohttp
import pytest
from aiohttp import web

from agent.clock import ManualClock
from agent.config import EngineConfig
from agent.cost.inputs import EngineSpec
from agent.cost.window import WindowJoiner
from agent.samples import GpuSample, NvmlRound
from agent.sources.engines.scraper import EngineScraper
from agent.sources.prices import parse_price_book

T0 = 1_780_000_000.0  # epoch seconds of the first scrape
STEP = 15.0  # seconds between scrapes, as a daemon scrapes
H100 = "NVIDIA H100 80GB HBM3"
BOOK = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 3.6}]}, "test").table()


def gen(value: float, *, rank: str | None = "0", created: float | None = None, model: str = "m") -> str:
    """A vLLM generation-token counter line (V1: with its DP rank), with its _created line."""
    labels = f'engine="{rank}",model_name="{model}"' if rank is not None else f'model_name="{model}"'
    lines = [
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {value!r}",
    ]
    if created is not None:
        lines += [
            "# TYPE vllm:generation_tokens_created gauge",
            f"vllm:generation_tokens_created{{{labels}}} {created!r}",
        ]
    return "\n".join(lines) + "\n"


def started(at: float) -> str:
    """prometheus_client's process start time line."""
    return f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {at!r}\n"


@pytest.fixture
async def engine() -> AsyncIterator[tuple[str, list[str]]]:
    """A local server answering each GET of /metrics with the next page of a list the test fills
    (the last one again once the list is spent)."""
    pages: list[str] = []

    async def metrics(_: web.Request) -> web.Response:
        body = pages.pop(0) if len(pages) > 1 else pages[0]
        return web.Response(body=body.encode(), headers={"Content-Type": "text/plain; version=0.0.4"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/metrics", pages
    finally:
        await runner.cleanup()


def _round(t: float) -> NvmlRound:
    return NvmlRound(t, True, (GpuSample(0, "GPU-0", H100, t, util_gpu_ratio=0.5, power_watts=400.0),))


async def _run(
    url: str, pages: list[str], sequence: Sequence[str]
) -> tuple[list[float], list[tuple[str, ...]]]:
    """Scrape ``sequence`` one page per tick through the real scraper and window join: the
    generation tokens of each window after the first, and each tick's refused counter series."""
    pages[:] = list(sequence)
    clock = ManualClock(T0)
    cfg = EngineConfig.model_validate({"name": "e", "kind": "vllm", "url": url, "timeout_seconds": 5})
    joiner = WindowJoiner("n1", (EngineSpec("e", kind="vllm", gpus=(0,)),), BOOK)
    tokens: list[float] = []
    refused: list[tuple[str, ...]] = []
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(cfg, session, clock)
        for k in range(len(sequence)):
            scrape = await scraper.scrape()
            assert scrape.up, scrape.error
            joiner.add_round(_round(clock.now()))
            res = joiner.close_tick(clock.now(), {"e": scrape})
            if k:
                tokens.append(sum(w.usage.generation_tokens for w in res.windows))
                refused.append(res.refused_counters)
            clock.advance(STEP)
    return tokens, refused


async def test_a_counter_going_back_by_one_every_scrape_counts_nothing_and_logs_once(
    engine: tuple[str, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent.cost.window")
    url, pages = engine
    base = 1_000_000_000.0
    tokens, refused = await _run(url, pages, [gen(base - k) for k in range(9)])
    # the old join read each decrease as a reset: 8 × 1e9 tokens from an engine that made none
    assert tokens == [0.0] * 8
    assert all(
        r == ("e/m/generation_tokens_total/vllm:generation_tokens_total,engine=0 (glitch)",) for r in refused
    )
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and "vllm:generation_tokens_total,engine=0" in lines[0] and "glitch" in lines[0]


async def test_an_absurd_jump_in_one_scrape_is_refused_whether_it_stays_or_not(
    engine: tuple[str, list[str]],
) -> None:
    url, pages = engine
    # in range for the adapter (under 1e15), far beyond what one H100 generates in 15 s
    transient = [gen(1000.0), gen(1000.0 + 9e14), gen(1010.0), gen(1030.0)]
    tokens, refused = await _run(url, pages, transient)
    assert tokens == [0.0, 10.0, 20.0]
    assert refused[0] == ("e/m/generation_tokens_total/vllm:generation_tokens_total,engine=0 (spike)",)
    assert refused[1:] == [(), ()]
    # a jump that stays: the counter goes on from the level it jumped to, the jump never counted
    kept = [gen(1000.0), gen(1000.0 + 9e14), gen(1010.0 + 9e14), gen(1030.0 + 9e14)]
    tokens, _ = await _run(url, pages, kept)
    assert tokens == [0.0, 10.0, 20.0]


async def test_a_series_written_twice_with_two_values_is_refused_for_that_scrape(
    engine: tuple[str, list[str]],
) -> None:
    url, pages = engine
    dup = gen(1100.0) + 'vllm:generation_tokens_total{engine="0",model_name="m"} 1100000.0\n'
    same = gen(1300.0) + 'vllm:generation_tokens_total{engine="0",model_name="m"} 1300.0\n'
    tokens, _ = await _run(url, pages, [gen(1000.0), dup, gen(1200.0), same])
    # the duplicate scrape has no reading (not 1,000× the tokens); the next one counts from 1000
    assert tokens == [0.0, 200.0, 100.0]


async def test_a_restart_that_out_counts_its_previous_lifetime_is_read_by_its_created(
    engine: tuple[str, list[str]],
) -> None:
    url, pages = engine
    for rank in ("0", None):  # a V1 page (DP rank label) and a lone series (V0, no rank)
        seq = [
            gen(1000.0, rank=rank, created=T0 - 3600),
            gen(1000.0, rank=rank, created=T0 - 3600),
            gen(1500.0, rank=rank, created=T0 + 20),  # restarted 10 s after the last scrape
            gen(1600.0, rank=rank, created=T0 + 20),
        ]
        tokens, refused = await _run(url, pages, seq)
        assert tokens == [0.0, 1500.0, 100.0]  # not 500: the new process counted 1,500
        assert refused == [(), (), ()]


async def test_a_restart_is_read_by_the_process_start_time_where_no_created_is_exposed(
    engine: tuple[str, list[str]],
) -> None:
    url, pages = engine
    seq = [
        started(T0 - 3600) + gen(1000.0),
        started(T0 + 5) + gen(1500.0),  # a new process: all 1,500 are new
        started(T0 + 5) + gen(1499.0),  # a glitch of the new process: nothing
        started(T0 + 5) + gen(1510.0),
    ]
    tokens, refused = await _run(url, pages, seq)
    assert tokens == [1500.0, 0.0, 10.0]
    assert refused[1] == ("e/m/generation_tokens_total/vllm:generation_tokens_total,engine=0 (glitch)",)


async def test_a_restart_without_created_is_a_fall_a_new_process_could_have_counted(
    engine: tuple[str, list[str]],
) -> None:
    url, pages = engine
    # 1e9 → 40: under half and ≤ what the GPU makes in 15 s, a reset; 1e9 → 9e8 is a glitch
    tokens, _ = await _run(url, pages, [gen(1e9), gen(40.0), gen(90.0)])
    assert tokens == [40.0, 50.0]
    tokens, refused = await _run(url, pages, [gen(1e9), gen(9e8), gen(1e9 + 70)])
    assert tokens == [0.0, 70.0]
    assert refused[0] and "glitch" in refused[0][0]


# ---- the adapter's side: what reaches the window join -------------------------------------------

from agent.cost.counters import CREATED, STARTED  # noqa: E402
from agent.sources.engines import ADAPTERS  # noqa: E402

TTFT = "vllm:time_to_first_token_seconds"


def _hist(buckets: Sequence[tuple[str, float]], count: float, rank: str = "0") -> str:
    lines = ['vllm:num_requests_running{model_name="m"} 1', f"# TYPE {TTFT} histogram"]
    lines += [f'{TTFT}_bucket{{engine="{rank}",le="{le}",model_name="m"}} {c!r}' for le, c in buckets]
    lines += [
        f'{TTFT}_sum{{engine="{rank}",model_name="m"}} 1.5',
        f'{TTFT}_count{{engine="{rank}",model_name="m"}} {count!r}',
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("page", "valid", "why"),
    [
        (_hist([("0.1", 1.0), ("+Inf", 3.0)], 3.0), True, None),
        (_hist([("0.1", 1.0), ("+Inf", 3.0)], 4.0), False, "_count differs from the +Inf bucket"),
        (_hist([("0.1", 2.0), ("+Inf", 1.0)], 1.0), False, "bucket counts decrease"),
        # two ranks: each its own histogram, their sum checked as one
        (
            _hist([("0.1", 1.0), ("+Inf", 3.0)], 3.0) + _hist([("0.1", 1.0), ("+Inf", 2.0)], 2.0, "1"),
            True,
            None,
        ),
        (
            _hist([("0.1", 1.0), ("+Inf", 3.0)], 3.0) + _hist([("0.1", 1.0), ("+Inf", 2.0)], 5.0, "1"),
            False,
            "_count",
        ),
        # a bucket written twice with two values: the histogram is refused
        (
            _hist([("0.1", 1.0), ("+Inf", 3.0)], 3.0)
            + f'{TTFT}_bucket{{engine="0",le="0.1",model_name="m"}} 2\n',
            False,
            "written twice with different values",
        ),
    ],
)
def test_a_histogram_is_read_only_when_its_buckets_and_count_agree(
    page: str, valid: bool, why: str | None
) -> None:
    for _ in range(3):  # line by line, then through the remembered layout and the compiled map
        reading = ADAPTERS["vllm"].read(page)
        (m,) = reading.models
        assert (m.ttft_seconds is not None) == valid
        if why is not None:
            assert len(reading.invalid_series) == 1 and why in reading.invalid_series[0]
        else:
            assert reading.invalid_series == ()


def test_each_series_created_and_the_start_time_reach_counter_parts() -> None:
    page = (
        gen(10.0, created=T0 - 5)
        + gen(20.0, rank="1", created=T0 - 4)
        + started(T0 - 9)
        + 'vllm:prompt_tokens_total{engine="0",model_name="m"} 3\n'
        + 'vllm:prompt_tokens_created{engine="0",model_name="m"} 7\n'
        + 'vllm:prompt_tokens_created{engine="0",model_name="other"} 8\n'
    )
    for _ in range(3):
        (m,) = ADAPTERS["vllm"].read(page).models
        assert m.counter_parts["generation_tokens_total" + CREATED] == {
            "vllm:generation_tokens_total,engine=0": T0 - 5,
            "vllm:generation_tokens_total,engine=1": T0 - 4,
        }
        assert m.counter_parts["prompt_tokens_total" + CREATED] == {"vllm:prompt_tokens_total,engine=0": 7.0}
        assert m.counter_parts[STARTED] == {"process_start_time_seconds": T0 - 9}
        assert len(m.counter_parts["generation_tokens_total"]) == 2  # the ranks, as before


def test_a_lone_series_created_is_its_own_and_two_disagreeing_ones_are_none() -> None:
    (m,) = ADAPTERS["vllm"].read(gen(10.0, rank=None, created=5.0)).models
    assert "generation_tokens_total" not in m.counter_parts  # a lone series: no parts
    assert m.counter_parts["generation_tokens_total" + CREATED] == {"vllm:generation_tokens_total": 5.0}
    # the same series' _created under two spellings with two values: no _created at all
    page = gen(10.0, rank=None, created=5.0) + 'vllm_generation_tokens_created{model_name="m"} 6\n'
    (m,) = ADAPTERS["vllm"].read(page).models
    assert m.generation_tokens_total == 10.0
    two_pages = started(1.0) + 'process_start_time_seconds{pid="2"} 2\n' + gen(10.0)
    (m,) = ADAPTERS["vllm"].read(two_pages).models
    assert STARTED not in m.counter_parts  # two processes' start times: not one process


def test_a_refused_counter_drops_its_created_too() -> None:
    page = (
        gen(10.0, created=5.0)
        + 'vllm:generation_tokens_total{engine="1",model_name="m"} -1\n'
        + 'vllm:num_requests_running{model_name="m"} 1\n'
    )
    (m,) = ADAPTERS["vllm"].read(page).models
    assert m.generation_tokens_total is None
    assert ("generation_tokens_total" + CREATED) not in m.counter_parts
