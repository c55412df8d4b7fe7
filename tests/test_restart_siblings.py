"""One process' counters restart together: a token counter read as a restart restarts the model's
other counters, even one that already counted past its old value; one rank's restart does not."""

from __future__ import annotations

from agent.cost.inputs import EngineSpec, GpuRate, PriceTable
from agent.cost.window import WindowJoiner
from agent.samples import EngineScrape, GpuSample, ModelSignals, NvmlRound

T0 = 1_780_000_000.0
H100 = "NVIDIA H100 80GB HBM3"
PRICES = PriceTable(gpus=(GpuRate("H100", 3.6),), source="test book")


def _tick(j: WindowJoiner, t: float, m: ModelSignals):  # type: ignore[no-untyped-def]
    j.add_round(NvmlRound(t, True, (GpuSample(0, "GPU-0", H100, t, util_gpu_ratio=0.5),)))
    return j.close_tick(t, {"e": EngineScrape("e", "vllm", t, True, 0.01, (m,))})


def _joiner() -> WindowJoiner:
    return WindowJoiner("n", [EngineSpec("e", kind="vllm", gpus=(0,), weights_bytes=14e9)], PRICES, "equal")


def test_a_restart_seen_on_the_token_counters_restarts_the_time_counters() -> None:
    j = _joiner()
    old = dict(prompt_tokens_total=2e6, prefill_seconds_total=3.0, decode_seconds_total=1.0)
    _tick(j, T0, ModelSignals("m", generation_tokens_total=1e6, **old))
    # the process restarted within the tick: its tokens from zero, and its decode request-seconds
    # (two sequences for the whole second) already above the old process' 1 s
    new = dict(prompt_tokens_total=100.0, prefill_seconds_total=0.5, decode_seconds_total=2.0)
    tick = _tick(j, T0 + 1, ModelSignals("m", generation_tokens_total=239.0, **new))
    (w,) = tick.windows
    assert w.usage.generation_tokens == 239.0
    assert w.usage.prompt_tokens == 100.0
    assert w.usage.decode_seconds == 2.0  # not 2 − 1 = 1: the new process counted from zero
    assert w.usage.prefill_seconds == 0.5


def test_a_plain_increase_of_the_time_counters_is_not_a_restart() -> None:
    j = _joiner()
    _tick(j, T0, ModelSignals("m", generation_tokens_total=1e6, decode_seconds_total=1.0))
    tick = _tick(j, T0 + 1, ModelSignals("m", generation_tokens_total=1e6 + 239, decode_seconds_total=2.0))
    assert tick.windows[0].usage.decode_seconds == 1.0


def test_one_ranks_restart_leaves_the_other_counters_alone() -> None:
    j = _joiner()
    ranks = "generation_tokens_total"

    def page(r0: float, r1: float, prompt: float) -> ModelSignals:
        parts = {
            ranks: {"vllm:generation_tokens_total,engine=0": r0, "vllm:generation_tokens_total,engine=1": r1}
        }
        return ModelSignals(
            "m", generation_tokens_total=r0 + r1, prompt_tokens_total=prompt, counter_parts=parts
        )

    _tick(j, T0, page(5e5, 5e5, 2e6))
    tick = _tick(j, T0 + 1, page(5e5 + 100, 50.0, 2e6 + 300))  # rank 1 restarted, rank 0 went on
    (w,) = tick.windows
    assert w.usage.generation_tokens == 150.0
    assert w.usage.prompt_tokens == 300.0  # the prompt counter's 2e6 tokens of history are not counted again


def test_the_floor_batch_is_at_least_what_the_counted_tokens_need() -> None:
    """A decode-seconds counter read two counts short (a read-out glitch) reads a batch of 3.99 for
    four sequences decoding at the roofline; the floor's batch is never below what the output
    tokens need at the fastest step, so the floor stays at or under the price paid."""
    from agent.cost.efficiency import min_step_seconds
    from agent.cost.model import bandwidth_of

    j = _joiner()
    step = min_step_seconds(14e9, 0.0, 0.0, bandwidth_of(H100) or 0.0)
    made = float(int(4 * 300 / step))  # four sequences for 300 s at the roofline
    _tick(j, T0, ModelSignals("m", generation_tokens_total=1e6, decode_seconds_total=0.0))
    tick = _tick(
        j, T0 + 300, ModelSignals("m", generation_tokens_total=1e6 + made, decode_seconds_total=1198.0)
    )
    (w,) = tick.windows
    assert w.usd_per_1m_output is not None and w.floor_usd_per_1m_output is not None
    assert w.floor_usd_per_1m_output <= w.usd_per_1m_output
    assert w.floor_usd_per_1m_output > 0.99 * w.usd_per_1m_output  # at the roofline: the floor is the price
