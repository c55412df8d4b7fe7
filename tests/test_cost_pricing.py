"""Prices as plain data, GPU charges and per-series counters, hand-computed."""

from __future__ import annotations

import math

import pytest

from agent.cost.counters import CounterMemory, counter_increase
from agent.cost.inputs import EngineSpec, GpuRate, PowerRate, PriceTable
from agent.cost.pricing import GpuReading, mig_slice_fraction, price_gpus
from agent.samples import GpuSample

DAY = 86400.0
H100 = "NVIDIA H100 80GB HBM3"
TABLE = PriceTable(
    gpus=(
        GpuRate("H100", 3.0),
        GpuRate("H100", 2.4, 10 * DAY),
        GpuRate("H100 80GB HBM3", 4.0, 20 * DAY),  # longer match, later date
        GpuRate("A100", 1.5, 5 * DAY),
    ),
    engines={"cpu": 0.5},
)


@pytest.mark.parametrize(
    ("name", "at", "expected"),
    [
        (H100, 0.0, 3.0),
        (H100, 10 * DAY - 1, 3.0),
        (H100, 10 * DAY, 2.4),  # in effect from its instant
        (H100, 20 * DAY, 4.0),  # the longest match wins once in effect
        ("NVIDIA H100 PCIe", 20 * DAY, 2.4),  # "H100 80GB HBM3" does not match a PCIe card
        ("nvidia a100-sxm4-80gb", 6 * DAY, 1.5),  # case-insensitive
        ("NVIDIA A100-SXM4-80GB", 4 * DAY, None),  # not yet priced
        ("Tesla T4", 0.0, None),
    ],
)
def test_gpu_usd_per_hour(name: str, at: float, expected: float | None) -> None:
    assert TABLE.gpu_usd_per_hour(name, "n1", at) == expected


WORDS = PriceTable(
    gpus=(
        GpuRate("L4", 0.8),
        GpuRate("L40S", 1.9),
        GpuRate("A10", 1.0),
        GpuRate("a100", 1.5),
        GpuRate("Blackwell", 7.0),  # one word, longer than "RTX PRO"
        GpuRate("RTX PRO", 5.0),  # two words
    )
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA L4", 0.8),
        ("NVIDIA L40S", 1.9),  # "L4" is a word of "NVIDIA L4", not of "NVIDIA L40S"
        ("NVIDIA L40", None),  # neither L4 nor L40S
        ("NVIDIA A10", 1.0),
        ("NVIDIA A10G", None),  # A10G is another board
        ("NVIDIA A100-SXM4-80GB", 1.5),  # hyphens split words; case ignored
        ("NVIDIA A100_PCIE_40GB", 1.5),  # so do underscores
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 5.0),  # more words beat a longer word
        ("NVIDIA RTX 6000 Ada", None),  # "RTX PRO" needs both words
        ("rtx-pro", 5.0),  # a match may be the whole name
    ],
)
def test_a_price_matches_whole_words_of_the_nvml_name(name: str, expected: float | None) -> None:
    assert WORDS.gpu_usd_per_hour(name, "n1", 0.0) == expected


def test_gpu_time_is_prorated_over_every_price_change_inside_the_interval() -> None:
    # [9.5 d, 20.5 d): 0.5 d at $3.00, 10 d at $2.40, 0.5 d at $4.00 (in GPU-hours: 12, 240, 12)
    assert TABLE.gpu_time_usd(H100, "n1", 9.5 * DAY, 20.5 * DAY) == pytest.approx(
        12 * 3.0 + 240 * 2.4 + 12 * 4.0
    )
    assert TABLE.gpu_time_usd(H100, "n1", 0.0, 3600.0) == pytest.approx(3.0)
    # an interval partly before the A100 was priced is unknown, not partly free
    assert TABLE.gpu_time_usd("NVIDIA A100", "n1", 4 * DAY, 6 * DAY) is None
    assert TABLE.gpu_time_usd("NVIDIA A100", "n1", 5 * DAY, 5 * DAY + 7200) == pytest.approx(3.0)


def test_a_node_override_wins_over_every_gpu_price_and_date() -> None:
    t = PriceTable(gpus=TABLE.gpus, nodes={"reserved": 1.1})
    assert t.gpu_usd_per_hour("Tesla T4", "reserved", 0.0) == 1.1
    assert t.gpu_time_usd(H100, "reserved", 9 * DAY, 9 * DAY + 1800) == pytest.approx(0.55)
    assert t.gpu_usd_per_hour(H100, "other", 0.0) == 3.0


def test_engine_prices_and_engine_versions() -> None:
    assert TABLE.engine_usd_per_hour("cpu") == 0.5 and TABLE.engine_usd_per_hour("gpu") is None
    e = EngineSpec("a", model_version="v1", model_versions={"big": "b7"})
    assert (e.version_of("big"), e.version_of("small")) == ("b7", "v1")
    assert EngineSpec("b").version_of("x") == "unknown"


@pytest.mark.parametrize(
    ("name", "fraction"),
    [
        (f"{H100} MIG 1g.10gb", 1 / 7),
        (f"{H100} MIG 3g.40gb", 3 / 7),
        (f"{H100} MIG 7g.80gb", 1.0),
        (f"{H100} MIG 1g.10gb+me", 1 / 7),
        ("NVIDIA A30 MIG 2g.12gb", 2 / 4),
        ("NVIDIA A30 MIG 4g.24gb", 1.0),
        ("NVIDIA A100-SXM4-40GB MIG 9g.99gb", 1.0),  # more than the GPU has: capped at the whole
        ("MIG instance", 1 / 7),  # no profile in the name: one slice
    ],
)
def test_mig_slice_fraction(name: str, fraction: float) -> None:
    assert mig_slice_fraction(name) == pytest.approx(fraction)


def _reading(uuid: str, name: str = H100, parent: str | None = None, **kw: object) -> GpuReading:
    s = GpuSample(0, uuid, name, 100.0, mig_parent_uuid=parent)
    return GpuReading(sample=s, **{"seen": True, "mean_power_watts": None, "prev_energy_joules": None, **kw})  # type: ignore[arg-type]


def test_a_gpu_not_read_is_charged_time_and_last_known_power_marked_estimated() -> None:
    t = PriceTable(gpus=(GpuRate("H100", 3.6),), power=PowerRate(0.1, 1.5))
    (c,) = price_gpus({"g": _reading("g", seen=False, mean_power_watts=720.0)}, t, "n1", 0.0, 100.0).values()
    # 100 s at $3.60/h = $0.10; 720 W × 100 s = 72,000 J = 0.02 kWh × $0.15 = $0.003
    assert c.estimated and c.priced
    assert c.time_usd == pytest.approx(0.10) and c.energy_usd == pytest.approx(0.003)
    assert c.energy_joules == pytest.approx(72_000.0)
    (d,) = price_gpus({"g": _reading("g", mean_power_watts=720.0)}, t, "n1", 0.0, 100.0).values()
    assert not d.estimated


def test_without_a_power_price_energy_is_measured_but_costs_nothing() -> None:
    t = PriceTable(gpus=(GpuRate("H100", 3.6),))
    (c,) = price_gpus({"g": _reading("g", mean_power_watts=500.0)}, t, "n1", 0.0, 10.0).values()
    assert c.energy_joules == 5000.0 and c.energy_usd == 0.0 and c.cost_usd == pytest.approx(0.01)


def test_a_mig_parent_pays_whole_and_its_instances_take_their_shares() -> None:
    t = PriceTable(gpus=(GpuRate("H100", 7.0),))
    readings = {
        "P": _reading("P", mean_power_watts=700.0),
        "a": _reading("a", f"{H100} MIG 4g.40gb", parent="P"),
        "b": _reading("b", f"{H100} MIG 2g.20gb", parent="P"),
    }
    out = price_gpus(readings, t, "n1", 0.0, 3600.0)
    assert (out["a"].time_usd, out["b"].time_usd, out["P"].time_usd) == pytest.approx((4.0, 2.0, 1.0))
    assert (out["a"].energy_joules, out["P"].energy_joules) == pytest.approx((4 * 360_000.0, 360_000.0))
    assert out["a"].usd_per_hour == pytest.approx(4.0) and out["P"].usd_per_hour == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# counters summed over several series
# ---------------------------------------------------------------------------------------------


def test_counter_increase_first_reading_sets_the_baseline() -> None:
    assert counter_increase(None, 10.0, None) == (None, CounterMemory(anonymous=10.0))
    assert counter_increase(None, 10.0, {"a": 4.0, "b": 6.0}) == (None, CounterMemory({"a": 4.0, "b": 6.0}))
    mem = CounterMemory(anonymous=3.0)
    assert counter_increase(mem, None, None) == (None, mem)  # not exposed this time: nothing changes
    assert counter_increase(mem, math.nan, None) == (None, mem)


def test_counter_increase_single_series_resets_like_prometheus() -> None:
    inc, mem = counter_increase(CounterMemory(anonymous=10.0), 25.0, None)
    assert inc == 15.0 and mem == CounterMemory(anonymous=25.0)
    inc, mem = counter_increase(mem, 4.0, None)
    assert inc == 4.0 and mem == CounterMemory(anonymous=4.0)


def test_counter_increase_per_series_with_a_restarted_one() -> None:
    inc, mem = counter_increase(CounterMemory({"a": 100.0, "b": 50.0}), 130.0, {"a": 120.0, "b": 10.0})
    assert inc == 30.0  # a made 20; b restarted and made 10 since
    assert mem == CounterMemory({"a": 120.0, "b": 10.0})


def test_counter_increase_an_unnamed_reading_continues_the_closest_series_below_it() -> None:
    mem = CounterMemory({"a": 100.0, "b": 300.0})
    inc, mem = counter_increase(mem, 310.0, None)  # b alone: 300 → 310 (a at 100 would be +210)
    assert inc == 10.0 and mem == CounterMemory({"a": 100.0, "b": 310.0}, current="b")
    inc, mem = counter_increase(mem, 312.0, None)  # still b
    assert inc == 2.0 and mem == CounterMemory({"a": 100.0, "b": 312.0}, current="b")
    inc, mem = counter_increase(mem, 5.0, None)  # b restarted
    assert inc == 5.0 and mem.series["b"] == 5.0
    inc, mem = counter_increase(mem, 20.0, {"a": 101.0, "b": 20.0})  # both back
    assert inc == 16.0 and mem == CounterMemory({"a": 101.0, "b": 20.0})


def test_counter_increase_an_unnamed_reading_below_every_series_is_a_reset() -> None:
    inc, mem = counter_increase(CounterMemory({"a": 100.0, "b": 300.0}), 7.0, None)
    assert inc == 7.0 and mem == CounterMemory({"a": 100.0, "b": 300.0}, anonymous=7.0)
    inc, mem = counter_increase(mem, 9.0, None)  # the restarted series goes on
    assert inc == 2.0 and mem.anonymous == 9.0
    # named again: the unnamed 9 continues the closest series at or above it (a at 12)
    inc, mem = counter_increase(mem, 312.0, {"a": 12.0, "b": 300.0})
    assert inc == 3.0 and mem == CounterMemory({"a": 12.0, "b": 300.0})


def test_of_two_prices_as_specific_and_as_recent_the_first_listed_wins() -> None:
    t = PriceTable(gpus=(GpuRate("H100", 2.0, DAY), GpuRate("H100", 9.0, DAY)))
    assert t.gpu_usd_per_hour(H100, "n1", 2 * DAY) == 2.0


def test_counter_ties_go_to_the_first_series_seen() -> None:
    # two ranks at the same value; one unnamed reading above both continues the first (a)
    inc, mem = counter_increase(CounterMemory({"a": 100.0, "b": 100.0}), 110.0, None)
    assert inc == 10.0 and mem.current == "a"
    # an unnamed 100 continues whichever series is at exactly 100 (no tokens: not a reset)
    inc, mem = counter_increase(CounterMemory({"a": 50.0, "b": 100.0}), 100.0, None)
    assert inc == 0.0 and mem.current == "b"
    # named again after an unnamed reading: it continues the closest series at or above it
    inc, mem = counter_increase(
        CounterMemory({"a": 0.0, "b": 0.0}, anonymous=40.0), 140.0, {"a": 40.0, "b": 100.0}
    )
    assert inc == 100.0 and mem == CounterMemory({"a": 40.0, "b": 100.0})  # a: 40 → 40, b: 0 → 100
    inc, mem = counter_increase(
        CounterMemory({"a": 0.0, "b": 0.0}, anonymous=40.0), 100.0, {"a": 50.0, "b": 50.0}
    )
    assert inc == 60.0  # a continues 40 → 50 (+10); b counts 0 → 50


def test_an_unnamed_reading_continues_the_closest_series_at_or_above_it_first_listed_on_ties() -> None:
    # a was last at 30 and b never seen; the unnamed 40 continued a (exactly at 40 now): a +0, b +100
    inc, _ = counter_increase(CounterMemory({"a": 30.0}, anonymous=40.0), 140.0, {"a": 40.0, "b": 100.0})
    assert inc == 100.0
    # a tie (both at 50): the first listed (a) continued 40: a +10, b counts in full
    inc, _ = counter_increase(CounterMemory({"a": 30.0}, anonymous=40.0), 100.0, {"a": 50.0, "b": 50.0})
    assert inc == 60.0


@pytest.mark.parametrize(
    ("prefill", "decode", "expected"),
    [
        (1.0, 3.0, 2.5),
        (0.0, 5.0, 0.0),
        (2.0, 0.0, 10.0),
        (0.0, 0.0, None),
        (None, 1.0, None),
        (1.0, None, None),
    ],
)
def test_prompt_cost_by_phase_time(
    prefill: float | None, decode: float | None, expected: float | None
) -> None:
    from agent.cost.split import prompt_cost

    assert prompt_cost(10.0, prefill, decode) == expected


@pytest.mark.parametrize(
    ("prompt_usd", "prompt_tokens", "cached", "expected"),
    [
        (1.0, 500.0, 100.0, 0.25),  # 400 computed for $1: 100 more would have cost $0.25
        (1.0, 500.0, 0.0, 0.0),
        (1.0, 500.0, 500.0, None),  # nothing computed: no price per computed token
        (1.0, 500.0, 499.0, 499.0),
        (None, 500.0, 100.0, None),
        (1.0, 500.0, None, None),
    ],
)
def test_prefix_cache_saved(
    prompt_usd: float | None, prompt_tokens: float, cached: float | None, expected: float | None
) -> None:
    from agent.cost.split import prefix_cache_saved

    assert prefix_cache_saved(prompt_usd, prompt_tokens, cached) == expected


def test_cost_floor_reference_70b_on_one_h100() -> None:
    from agent.cost.floor import cost_floor

    # $3.60/h = $0.001/s; one sequence: step = 140e9 / 3.35e12 = 41.79 ms → 23.93 tok/s → $41.79 per 1M
    f = cost_floor(
        0.001, 140e9, 3.35e12, replicas=1, running=None, resident_kv_tokens=0.0, kv_bytes_per_token=None,
        kv_capacity_tokens=None,
    )  # fmt: skip
    assert f is not None and f.usd_per_1m_at_batch == pytest.approx(0.001 * (140e9 / 3.35e12) * 1e6)
    assert f.usd_per_1m_at_max_batch is None and f.max_batch is None


def test_cost_floor_at_the_batch_and_at_the_largest_batch_the_kv_cache_holds() -> None:
    from agent.cost.floor import cost_floor

    kv = 327_680.0
    # 16 running over 2 replicas (8 each) on 2 H100s, 8,000 resident tokens per replica (1,000 each)
    f = cost_floor(0.002, 140e9, 2 * 3.35e12, replicas=2, running=16, resident_kv_tokens=8000,
                   kv_bytes_per_token=kv, kv_capacity_tokens=100_000)  # fmt: skip
    assert f is not None
    step = (140e9 + 8000 * kv) / 3.35e12  # one replica's step
    assert f.usd_per_1m_at_batch == pytest.approx(0.002 / (2 * 8 / step) * 1e6)
    # the cache holds 100,000 / 1,000 = 100 sequences per replica; a step then reads it all
    step_full = (140e9 + 100_000 * kv) / 3.35e12
    assert f.max_batch == pytest.approx(100.0)
    assert f.usd_per_1m_at_max_batch == pytest.approx(0.002 / (2 * 100 / step_full) * 1e6)
    none = {"replicas": 1, "running": None, "resident_kv_tokens": 0.0, "kv_bytes_per_token": None,
            "kv_capacity_tokens": None}  # fmt: skip
    assert cost_floor(0.002, 0.0, 3.35e12, **none) is None and cost_floor(0.002, 140e9, 0.0, **none) is None  # type: ignore[arg-type]
    # any positive weights and bandwidth count (only ≤ 0 means unknown): 1 byte at 1 B/s is a 1 s step
    tiny = cost_floor(0.002, 1.0, 1.0, **none)  # type: ignore[arg-type]
    assert tiny is not None and tiny.usd_per_1m_at_batch == pytest.approx(0.002 * 1e6)


@pytest.mark.parametrize(
    ("resident", "kv", "capacity", "at_batch_bytes", "max_batch"),
    [
        (500.0, None, 100_000.0, 140e9, None),  # no KV size: weights only, no max batch
        (500.0, 10.0, None, 140e9 + 5000.0, None),  # no capacity: no max batch
        (0.0, 10.0, 100_000.0, 140e9, None),  # nothing resident: no context to size a batch by
        (0.5, 10.0, 100_000.0, 140e9 + 5.0, 200_000.0),  # half a token resident: 0.5 per sequence
    ],
)
def test_cost_floor_edges(
    resident: float, kv: float | None, capacity: float | None, at_batch_bytes: float, max_batch: float | None
) -> None:
    from agent.cost.floor import cost_floor

    f = cost_floor(0.001, 140e9, 1e12, replicas=1, running=1.0, resident_kv_tokens=resident,
                   kv_bytes_per_token=kv, kv_capacity_tokens=capacity)  # fmt: skip
    assert f is not None
    assert f.usd_per_1m_at_batch == 0.001 / (1 / (at_batch_bytes / 1e12)) * 1e6
    assert f.max_batch == max_batch


def test_prompt_cost_with_less_than_a_second_of_phase_time() -> None:
    from agent.cost.split import prompt_cost

    assert prompt_cost(10.0, 0.25, 0.25) == 5.0
