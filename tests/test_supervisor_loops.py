"""The supervisor's list of loops: a loop is an interval and a round, or a part that runs until
stop; at shutdown every close gets the one deadline, in the list's order; a close that hangs is
abandoned at the deadline and one that fails is logged, and neither keeps the others from closing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent.app import build_agent
from agent.config import Config, ExportersConfig, IntervalsConfig, NvmlConfig, PrometheusExporterConfig
from agent.sources.prices import parse_price_book
from agent.supervisor import CLOSE_GRACE_SECONDS, SHUTDOWN_SECONDS, Loop, close_by


async def _nothing() -> None:
    return None


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # neither a round nor a run
        {"run_once": _nothing},  # a round without an interval
        {"interval": 1.0},  # an interval without a round
        {"run_once": _nothing, "interval": 1.0, "run": lambda stop: _nothing()},  # both
    ],
)
def test_a_loop_is_a_round_with_an_interval_or_a_run(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="loop x: either run_once with an interval, or run"):
        Loop("x", **kwargs)  # type: ignore[arg-type]


async def test_close_by_abandons_a_hanging_close_and_logs_a_failing_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def hang() -> None:
        await asyncio.sleep(3600)

    async def fail() -> None:
        raise RuntimeError("boom")

    loop = asyncio.get_running_loop()
    start = loop.time()
    with caplog.at_level(logging.WARNING, logger="agent.supervisor"):
        await close_by(start + 0.2, "the hanging part", hang())
        await close_by(start + 0.2, "the failing part", fail())  # past the deadline: still run
        await close_by(start + 0.2, "a part after the deadline", hang())  # its grace, then abandoned
    assert 0.2 + CLOSE_GRACE_SECONDS <= loop.time() - start < 5.0
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "the hanging part did not close within the shutdown deadline; abandoned"
    assert messages[1:] == [
        "shutdown of the failing part failed",
        "a part after the deadline did not close within the shutdown deadline; abandoned",
    ]


async def test_every_loop_runs_and_closes_by_one_deadline_in_order(tmp_path: Path) -> None:
    cfg = Config(
        node="n",
        state_dir=tmp_path,
        intervals=IntervalsConfig(nvml_seconds=1, scrape_seconds=1, window_seconds=60),
        nvml=NvmlConfig(backend="none"),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
    )
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 2.0}]}, "book")
    agent = await build_agent(cfg, book=book, backend=None, engines=[], discover=False, history=False)
    rounds: list[float] = []
    closed: list[tuple[str, float]] = []
    ran = asyncio.Event()

    async def tick() -> None:
        rounds.append(asyncio.get_running_loop().time())
        ran.set()

    async def until_stop(stop: asyncio.Event) -> None:
        await stop.wait()

    def closer(name: str) -> Callable[[float], Awaitable[None]]:
        async def close(deadline: float) -> None:
            closed.append((name, deadline))

        return close

    agent.hooks.loops += [
        Loop("every second", tick, 1.0, close=closer("every second")),
        Loop("until stop", run=until_stop, close=closer("until stop")),
    ]
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await asyncio.wait_for(ran.wait(), 10)
    stopped_at = asyncio.get_running_loop().time()
    stop.set()
    await asyncio.wait_for(task, 10)
    assert [n for n, _ in closed] == ["every second", "until stop"]  # the hooks' loops, in their order
    d1, d2 = closed[0][1], closed[1][1]
    assert d1 == d2  # one deadline, handed to both
    assert stopped_at + SHUTDOWN_SECONDS - 1 <= d1 <= stopped_at + SHUTDOWN_SECONDS + 5
    assert rounds
