"""The real daemon's ``infercost_outbox_pending`` follows deliveries, not only detection: Slack is
down while two notifications wait, comes back, and /metrics shows the queue drained within a few
ticks, long before the next detection (the window is an hour of the accelerated clock)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from netutil import async_wait_until
from prometheus_client.parser import text_string_to_metric_families
from receivers import Receiver

from agent.app import build_agent
from agent.clock import AcceleratedClock
from agent.config import (
    Config,
    ExportersConfig,
    IntervalsConfig,
    NvmlConfig,
    PrometheusExporterConfig,
    SecretRef,
    SlackConfig,
)
from agent.records import Alert, AlertEvent, dedup_key
from agent.sinks.slack import slack_sink
from agent.sources.prices import parse_price_book

SPEED = 60.0  # simulated seconds per real second


async def _pending(port: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    return {
        sample.labels["sink"]: sample.value
        for fam in text_string_to_metric_families(text)
        for sample in fam.samples
        if sample.name == "infercost_outbox_pending"
    }


def _event(kind: str, model: str, at: float) -> AlertEvent:
    labels = (("node", "n1"), ("engine", "vllm-a"), ("model", model), ("model_version", "v1"))
    a = Alert(
        rule_id="expensive",
        dedup_key=dedup_key("expensive", labels),
        severity="warning",
        state="firing",
        labels={**dict(labels), "alertname": "expensive", "severity": "warning"},
        annotations={"summary": f"{model} is expensive"},
        active_since=at,
        last_true_at=at,
        value=9.0,
        threshold=5.0,
    )
    return AlertEvent("firing", a, at)  # type: ignore[arg-type]


async def test_outbox_pending_on_metrics_follows_every_delivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slack = Receiver("slack", path="/services/T0/B0/secret")
    await slack.start()
    await slack.stop()  # down: connections refused until start()
    monkeypatch.setenv("T_SLACK_URL", slack.url)
    clock = AcceleratedClock(SPEED)
    cfg = Config(
        node="n1",
        state_dir=tmp_path,
        intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=10, window_seconds=3600),
        nvml=NvmlConfig(backend="fake", fake_count=1),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
    )
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 2.0}]}, "book")
    sink = slack_sink(SlackConfig(webhook_url=SecretRef(env="T_SLACK_URL"), min_interval_seconds=0))
    agent = await build_agent(
        cfg, clock=clock, book=book, engines=[], discover=False, sinks=[sink], scorer=False
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await agent.started.wait()
        assert agent.prometheus is not None and agent.hooks.delivery is not None
        port = agent.prometheus.port
        await async_wait_until(lambda: _is(port, {"slack": 0.0}), timeout=20, what="(first detection)")
        now = clock.now()
        # what a detection step hands over; the next detection is an hour (60 s real) away
        agent.hooks.delivery.enqueue([_event("firing", "m1", now), _event("firing", "m2", now)])
        await async_wait_until(lambda: _is(port, {"slack": 2.0}), timeout=10, what="(2 pending)")
        await slack.start()
        await async_wait_until(lambda: _is(port, {"slack": 0.0}), timeout=20, what="(drained)")
        assert [b["attachments"][0]["title"] for b in slack.received] == [
            "m1 is expensive",
            "m2 is expensive",
        ]
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await slack.stop()


async def _is(port: int, expected: dict[str, float]) -> bool:
    return await _pending(port) == expected
