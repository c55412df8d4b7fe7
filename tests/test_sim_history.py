"""Simulated history for the demo's baselines goes through the real window join."""

from __future__ import annotations

import pytest

from agent.sources.prices import parse_price_book
from infercost_sim.history import simulated_history

BOOK = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 3.6}]}, "book")


def test_an_hour_of_history_is_priced_per_minute_per_engine() -> None:
    start = 1_780_000_000.0 // 86400 * 86400 + 13 * 3600
    ticks = list(simulated_history("n", BOOK, start, start + 3600))
    assert len(ticks) == 59  # the first minute only sets the counters' baseline
    for windows in ticks:
        by_engine = {w.usage.engine: w for w in windows}
        assert set(by_engine) == {"llama-70b", "llama-70b-canary", "mistral-7b", "qwen-14b"}
        # one minute of 4, 2, 1, 1 GPUs at $3.60/h
        assert by_engine["llama-70b"].cost_usd == pytest.approx(4 * 3.6 / 60)
        assert by_engine["mistral-7b"].cost_usd == pytest.approx(3.6 / 60)
        assert all(w.usage.generation_tokens > 0 and w.usd_per_1m_output is not None for w in windows)
        assert by_engine["llama-70b"].usage.model_version == "2024-07"
