"""The overhead benchmark's measure of the agent's own NVML code: a round read through the replay
library is the same round (so what it times is the agent's work on real answers)."""

from __future__ import annotations

import time

from agent.sources.nvml.backend import NvmlBackend
from agent.sources.nvml.fake import FakeNvml
from infercost_bench.overhead import _Replay, own_code_fraction


def test_a_replayed_round_reads_what_the_recorded_round_read() -> None:
    replay = _Replay(FakeNvml("H100-SXM", 8))
    backend = NvmlBackend(replay)
    backend.open()
    t = time.time()
    for i in range(5):  # GPM needs two samples: rounds after the first carry its ratios
        replay._tape.clear()
        recorded = backend.read_round(t + i)
    calls = len(replay._tape)
    for i in range(3):
        replay.rewind()
        again = backend.read_round(t + 5 + i)
        assert replay._at == calls  # every recorded answer used, none beyond
        assert [g.up for g in again.gpus] == [g.up for g in recorded.gpus] == [True] * 8
        assert again.gpus[3].power_watts == recorded.gpus[3].power_watts
        assert again.gpus[3].dram_bw_ratio == recorded.gpus[3].dram_bw_ratio is not None


def test_the_own_code_fraction_is_a_fraction_of_a_round() -> None:
    round_ms, own = own_code_fraction(rounds=20)
    assert round_ms > 0
    assert 0.0 < own <= 1.0
