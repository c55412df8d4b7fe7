"""The window join's dollars, hand-computed: every regression found in review, every mutation survivor.

Unless a test says otherwise: an H100 at $3.60 per GPU-hour ($0.001 per second), ticks of 10 s
(so $0.01 per GPU per tick), power at $0.10 per kWh with a PUE of 1.5 ($0.15 per kWh drawn).
Every tick is also checked for conservation: Σ model cost + Σ unallocated = Σ GPU cost, and
Σ busy model cost + Σ GPU idle = Σ GPU cost.
"""

from __future__ import annotations

import datetime as dt
import math

import pytest

from agent.cost.inputs import EngineSpec, GpuRate, PowerRate, PriceTable
from agent.cost.window import TickResult, WindowJoiner
from agent.samples import EngineScrape, GpuSample, Histogram, ModelSignals, NvmlRound

T0 = 1_780_000_000.0
H100 = "NVIDIA H100 80GB HBM3"
INF = math.inf
POWER = PowerRate(usd_per_kwh=0.10, pue=1.5)
BOOK = PriceTable(gpus=(GpuRate("H100", 3.6),), engines={"cpu": 0.36})
BOOK_POWER = PriceTable(gpus=(GpuRate("H100", 3.6),), power=POWER)


def conserved(res: TickResult) -> TickResult:
    """Assert both conservation identities of one tick and hand it back."""
    gpu = sum(g.cost_usd for g in res.gpus)
    assert res.unexplained_usd() == pytest.approx(0.0, abs=1e-12)
    busy = sum(w.cost_usd - w.idle_usd for w in res.windows) - res.engine_usd
    assert busy + sum(g.idle_usd for g in res.gpus) == pytest.approx(gpu, abs=1e-12)
    return res


def gpu(
    i: int, t: float, energy: float | None = None, power: float | None = 400.0, name: str = H100
) -> GpuSample:
    return GpuSample(i, f"GPU-{i}", name, t, util_gpu_ratio=0.5, power_watts=power, energy_joules=energy)


def rnd(t: float, *gpus: GpuSample) -> NvmlRound:
    return NvmlRound(t, True, gpus or tuple(gpu(i, t) for i in range(3)))


def sig(model: str, gen: float, prompt: float = 0.0, **kw: object) -> ModelSignals:
    return ModelSignals(model, prompt_tokens_total=prompt, generation_tokens_total=gen, **kw)  # type: ignore[arg-type]


def scrape(engine: str, t: float, *models: ModelSignals, up: bool = True) -> EngineScrape:
    return EngineScrape(engine, "vllm", t, up, 0.01, models)


def two_ticks(
    j: WindowJoiner,
    first: dict[str, EngineScrape],
    second: dict[str, EngineScrape],
    rounds: tuple[NvmlRound, NvmlRound] | None = None,
    dt_s: float = 10.0,
) -> TickResult:
    r0, r1 = rounds or (rnd(T0), rnd(T0 + dt_s))
    j.add_round(r0)
    j.close_tick(T0, first)
    j.add_round(r1)
    return conserved(j.close_tick(T0 + dt_s, second))


# ---------------------------------------------------------------------------------------------
# a data-parallel rank (or Triton version) that vanishes for a scrape
# ---------------------------------------------------------------------------------------------


def dp(model: str, **ranks: float) -> ModelSignals:
    parts = {f"vllm:generation_tokens_total,engine={k}": v for k, v in ranks.items()}
    return sig(
        model, sum(ranks.values()), counter_parts={"generation_tokens_total": parts} if len(ranks) > 1 else {}
    )


def test_a_rank_missing_for_one_scrape_is_no_reset_and_counts_only_what_it_made() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    gens = []
    pages = [
        dp("m", r0=500_000, r1=500_000),
        dp("m", r0=500_400),  # rank 1 missing: one unnamed series, 500,400
        dp("m", r0=500_800, r1=500_400),  # rank 1 back: it made 400 meanwhile
        dp("m", r0=500_900, r1=500_450),
    ]
    for k, page in enumerate(pages):
        t = T0 + 10 * k
        j.add_round(rnd(t))
        res = j.close_tick(t, {"a": scrape("a", t, page)})
        gens.extend(w.usage.generation_tokens for w in conserved(res).windows)
    # rank 0 made 400 + 400 + 100, rank 1 400 + 50: 1,350 in all (the old join counted 1,001,600)
    assert gens == [400.0, 800.0, 150.0]


def test_through_the_adapter_a_lone_rank_is_named_so_its_delta_is_its_own() -> None:
    """Two vLLM DP ranks (500 and 600 tokens), then only rank 0 at 601, then both again (601, 700).
    The adapter names even a lone series, so rank 0 made 101 and rank 1 100 — not the 1 a guess by
    the nearest remembered value (rank 1's 600) would give."""
    from agent.sources.engines import ADAPTERS

    def page(**ranks: float) -> ModelSignals:
        lines = ["# TYPE vllm:generation_tokens_total counter"] + [
            f'vllm:generation_tokens_total{{engine="{r[1:]}",model_name="m"}} {v}' for r, v in ranks.items()
        ]
        (m,) = ADAPTERS["vllm"].read("\n".join(lines) + "\n").models
        return m

    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    gens = []
    for k, p in enumerate([page(r0=500, r1=600), page(r0=601), page(r0=601, r1=700)]):
        j.add_round(rnd(T0 + 10 * k))
        res = j.close_tick(T0 + 10 * k, {"a": scrape("a", T0 + 10 * k, p)})
        gens.extend(w.usage.generation_tokens for w in conserved(res).windows)
    assert gens == [101.0, 100.0]


def test_a_triton_version_series_missing_for_a_scrape_comes_back_without_a_reset() -> None:
    def page(**versions: float) -> ModelSignals:
        parts = {f"nv_inference_count,version={v}": c for v, c in versions.items()}
        return sig("m", sum(versions.values()), counter_parts={"generation_tokens_total": parts})

    j = WindowJoiner("n1", (EngineSpec("t", gpus=(0,)),), BOOK)
    gens = []
    for k, p in enumerate(
        [page(v1=1000, v2=2000, v3=10), page(v1=1010, v3=20), page(v1=1020, v2=2005, v3=30)]
    ):
        j.add_round(rnd(T0 + 10 * k))
        res = j.close_tick(T0 + 10 * k, {"t": scrape("t", T0 + 10 * k, p)})
        gens.extend(w.usage.generation_tokens for w in res.windows)
    assert gens == [20.0, 25.0]  # 10 + 10; then 10 + 5 (v2 against its own last value) + 10


def test_a_new_rank_counts_in_full_and_a_single_series_becoming_two_is_continued() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    gens = []
    for k, page in enumerate([dp("m", r0=100), dp("m", r0=150, r1=30), dp("m", r0=160, r1=35, r2=7)]):
        j.add_round(rnd(T0 + 10 * k))
        res = j.close_tick(T0 + 10 * k, {"a": scrape("a", T0 + 10 * k, page)})
        gens.extend(w.usage.generation_tokens for w in res.windows)
    # 100 → 150 is rank 0's 50, rank 1 is new (30 in full); then 10 + 5 + 7 (rank 2 new)
    assert gens == [80.0, 22.0]


# ---------------------------------------------------------------------------------------------
# MIG — the whole GPU is paid, the parent's energy is split by slice
# ---------------------------------------------------------------------------------------------


def test_two_3g_instances_pay_six_sevenths_and_the_uncreated_seventh_is_node_idle() -> None:
    def mig_round(t: float, energy: float) -> NvmlRound:
        parent = GpuSample(0, "GPU-0", H100, t, power_watts=None, energy_joules=energy)
        inst = [
            GpuSample(0, f"MIG-{x}", f"{H100} MIG 3g.40gb", t, mig_parent_uuid="GPU-0") for x in ("a", "b")
        ]
        return NvmlRound(t, True, (parent, *inst))

    j = WindowJoiner("n1", (EngineSpec("one", gpus=("MIG-a",)),), BOOK_POWER)
    res = two_ticks(
        j,
        {"one": scrape("one", T0, sig("m", 0))},
        {"one": scrape("one", T0 + 3600, sig("m", 1000))},
        (mig_round(T0, 0.0), mig_round(T0 + 3600, 3.6e6)),
        dt_s=3600,
    )
    # the parent: $3.60 of time + 1 kWh × $0.10 × 1.5 = $0.15 of energy = $3.75 for the hour
    g = {x.sample.uuid: x for x in res.gpus}
    assert sum(x.cost_usd for x in res.gpus) == pytest.approx(3.75)  # not 2 × 3/7 × 3.60 = $3.09
    assert g["MIG-a"].cost_usd == pytest.approx(3.75 * 3 / 7)
    assert g["MIG-a"].usd_per_hour == pytest.approx(3.6 * 3 / 7)
    assert g["MIG-b"].unallocated_usd == pytest.approx(3.75 * 3 / 7)  # created, held by no engine
    assert g["GPU-0"].cost_usd == pytest.approx(3.75 / 7)  # the seventh slice never created
    assert g["GPU-0"].unallocated_usd == pytest.approx(3.75 / 7) and g["GPU-0"].idle_usd == pytest.approx(
        3.75 / 7
    )
    (w,) = res.windows
    assert w.gpu_time_usd == pytest.approx(3.6 * 3 / 7)
    assert w.energy_usd == pytest.approx(0.15 * 3 / 7)
    assert w.usage.energy_joules == pytest.approx(3.6e6 * 3 / 7)
    assert w.usd_per_1m_output == pytest.approx(3.75 * 3 / 7 / 1000 * 1e6)


def test_a_mig_instance_whose_parent_was_not_read_pays_its_profile_share() -> None:
    def inst(t: float) -> NvmlRound:
        return NvmlRound(t, True, (GpuSample(0, "MIG-a", f"{H100} MIG 2g.20gb", t, mig_parent_uuid="GPU-0"),))

    j = WindowJoiner("n1", (EngineSpec("one", gpus=("MIG-a",)),), BOOK)
    res = two_ticks(
        j,
        {"one": scrape("one", T0, sig("m", 0))},
        {"one": scrape("one", T0 + 10, sig("m", 5))},
        (inst(T0), inst(T0 + 10)),
    )
    assert res.windows[0].cost_usd == pytest.approx(0.01 * 2 / 7)
    assert res.gpus[0].estimated is False
    j.add_round(NvmlRound(T0 + 20, False, ()))
    later = conserved(j.close_tick(T0 + 20, {"one": scrape("one", T0 + 20, sig("m", 9))}))
    assert later.gpus[0].estimated is True and later.windows[0].cost_usd == pytest.approx(0.01 * 2 / 7)


# ---------------------------------------------------------------------------------------------
# a price change inside a tick is prorated
# ---------------------------------------------------------------------------------------------


def test_a_price_change_inside_a_tick_is_prorated() -> None:
    change = dt.datetime(2026, 7, 1, tzinfo=dt.UTC).timestamp()
    book = PriceTable(gpus=(GpuRate("H100", 3.0), GpuRate("H100", 2.4, change)))
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), book)
    j.add_round(rnd(change - 30))
    j.close_tick(change - 30, {"a": scrape("a", change - 30, sig("m", 0))})
    j.add_round(rnd(change + 30))
    res = conserved(j.close_tick(change + 30, {"a": scrape("a", change + 30, sig("m", 100))}))
    # 30 s at $3.00/h + 30 s at $2.40/h = $0.025 + $0.020 (not 60 s at $2.40 = $0.040)
    assert res.windows[0].cost_usd == pytest.approx(0.045)
    assert {g.sample.uuid: g.usd_per_hour for g in res.gpus}["GPU-0"] == 2.4  # the price now


# ---------------------------------------------------------------------------------------------
# survivors of mutation testing, each pinned by a hand-computed number
# ---------------------------------------------------------------------------------------------


def test_priced_power_is_in_the_headline_dollars_per_million() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK_POWER)
    rounds = (rnd(T0, gpu(0, T0, 0.0)), rnd(T0 + 10, gpu(0, T0 + 10, 3.6e6)))  # 1 kWh in 10 s
    res = two_ticks(
        j, {"a": scrape("a", T0, sig("m", 0))}, {"a": scrape("a", T0 + 10, sig("m", 1000))}, rounds
    )
    (w,) = res.windows
    assert w.gpu_time_usd == pytest.approx(0.01) and w.energy_usd == pytest.approx(0.15)
    assert w.cost_usd == pytest.approx(0.16)
    assert w.usd_per_1m_output == pytest.approx(160.0)  # $0.16 / 1,000 tokens × 1e6
    assert w.usd_per_1m_total == pytest.approx(160.0)


def test_an_engines_cost_is_split_among_its_models_by_token_share() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0, 1)),), BOOK)
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("x", 0), sig("y", 0), sig("z", 0))},
        {"a": scrape("a", T0 + 10, sig("x", 200, prompt=100), sig("y", 100), sig("z", 0))},
    )
    w = {x.usage.model: x for x in res.windows}
    # 400 tokens: x 300 (3/4), y 100 (1/4), z none; the engine's two GPUs cost $0.02
    assert w["x"].cost_usd == pytest.approx(0.015) and w["x"].usage.gpu_seconds == pytest.approx(15.0)
    assert w["y"].cost_usd == pytest.approx(0.005) and w["y"].usage.gpu_seconds == pytest.approx(5.0)
    assert w["z"].cost_usd == 0.0 and w["z"].idle_usd == 0.0
    assert w["x"].usd_per_1m_output == pytest.approx(0.015 / 200 * 1e6)
    assert w["x"].usd_per_1m_total == pytest.approx(0.015 / 300 * 1e6)


def test_models_without_tokens_split_the_engine_equally_as_idle() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0, 1)),), BOOK)
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("x", 5), sig("y", 5))},
        {"a": scrape("a", T0 + 10, sig("x", 5), sig("y", 5))},
    )
    assert [(w.cost_usd, w.idle_usd) for w in res.windows] == [pytest.approx((0.01, 0.01))] * 2


def test_tokens_policy_with_an_idle_user_charges_the_busy_one_alone() -> None:
    engines = (EngineSpec("a", gpus=(0, 1)), EngineSpec("b", gpus=(1,)))
    j = WindowJoiner("n1", engines, BOOK, share_policy="tokens")
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("m", 0)), "b": scrape("b", T0, sig("s", 0))},
        {"a": scrape("a", T0 + 10, sig("m", 300)), "b": scrape("b", T0 + 10, sig("s", 0))},
    )
    w = {x.usage.engine: x for x in res.windows}
    assert w["a"].cost_usd == pytest.approx(0.02)  # all of GPU 1: b made no tokens
    assert w["b"].cost_usd == 0.0 and w["b"].usage.gpu_seconds == 0.0
    assert {g.sample.uuid: g.idle_usd for g in res.gpus}["GPU-1"] == pytest.approx(0.0)


def test_the_energy_share_and_idle_cost_of_a_gpu_shared_by_engines() -> None:
    engines = (EngineSpec("a", gpus=(0, 1)), EngineSpec("b", gpus=(1,)))
    j = WindowJoiner("n1", engines, BOOK_POWER)
    rounds = (
        rnd(T0, gpu(0, T0, 0.0), gpu(1, T0, 0.0, power=300.0)),
        rnd(T0 + 10, gpu(0, T0 + 10, 3.6e5), gpu(1, T0 + 10, 7.2e5, power=300.0)),  # 0.1 and 0.2 kWh
    )
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("m", 0)), "b": scrape("b", T0, sig("s", 0))},
        {"a": scrape("a", T0 + 10, sig("m", 100)), "b": scrape("b", T0 + 10, sig("s", 0))},
        rounds,
    )
    w = {x.usage.engine: x for x in res.windows}
    # GPU 0: $0.01 + 0.1 kWh × $0.15 = $0.025; GPU 1: $0.01 + 0.2 × $0.15 = $0.04, halved
    assert w["a"].gpu_time_usd == pytest.approx(0.015) and w["a"].energy_usd == pytest.approx(0.015 + 0.015)
    assert w["a"].usage.energy_joules == pytest.approx(3.6e5 + 3.6e5)
    assert w["a"].usage.power_watts == pytest.approx(400 + 150)
    assert w["b"].cost_usd == pytest.approx(0.02) and w["b"].idle_usd == pytest.approx(0.02)
    assert w["b"].energy_usd == pytest.approx(0.015) and w["b"].usage.energy_joules == pytest.approx(3.6e5)
    g = {x.sample.uuid: x for x in res.gpus}
    assert g["GPU-1"].cost_usd == pytest.approx(0.04) and g["GPU-1"].idle_usd == pytest.approx(0.02)
    assert g["GPU-1"].unallocated_usd == pytest.approx(0.0)
    assert g["GPU-0"].idle_usd == pytest.approx(0.0)


def test_an_unpriced_gpu_with_energy_is_not_priced_and_never_charged_a_made_up_rate() -> None:
    j = WindowJoiner("n1", (EngineSpec("t4", gpus=(0,)),), BOOK_POWER)
    t4 = "Tesla T4"
    rounds = (rnd(T0, gpu(0, T0, 0.0, name=t4)), rnd(T0 + 10, gpu(0, T0 + 10, 3.6e5, name=t4)))
    res = two_ticks(
        j, {"t4": scrape("t4", T0, sig("m", 0))}, {"t4": scrape("t4", T0 + 10, sig("m", 100))}, rounds
    )
    (w,) = res.windows
    assert not w.priced and w.usd_per_1m_output is None and w.usd_per_1m_total is None
    assert w.gpu_time_usd == 0.0  # unknown, not $1/h
    assert w.energy_usd == pytest.approx(0.015)  # 0.1 kWh × $0.15: the energy is still known
    (g,) = res.gpus
    assert g.usd_per_hour is None and g.cost_usd == pytest.approx(0.015)


def test_an_engine_without_models_does_not_stop_the_engines_after_it() -> None:
    engines = (EngineSpec("empty", gpus=(2,)), EngineSpec("a", gpus=(0, 1)))
    j = WindowJoiner("n1", engines, BOOK)
    res = two_ticks(
        j,
        {"empty": scrape("empty", T0), "a": scrape("a", T0, sig("m", 0))},
        {"empty": scrape("empty", T0 + 10), "a": scrape("a", T0 + 10, sig("m", 100))},
    )
    (w,) = res.windows
    assert w.usage.engine == "a" and w.cost_usd == pytest.approx(0.02)
    assert {g.sample.uuid: g.unallocated_usd for g in res.gpus}["GPU-2"] == pytest.approx(0.01)


def h(*buckets: tuple[float, float], total: float) -> Histogram:
    return Histogram(tuple(buckets), total, buckets[-1][1])


def test_latency_deltas_p99_preemptions_prefill_and_decode_seconds_come_out_of_the_join() -> None:
    before = sig(
        "m", 0, ttft_seconds=h((0.1, 5), (0.5, 10), (1.0, 20), (INF, 20), total=5.0),
        itl_seconds=h((0.01, 10), (0.05, 10), (INF, 10), total=0.5),
        preemptions_total=3.0, prefill_seconds_total=10.0, decode_seconds_total=100.0,
    )  # fmt: skip
    after = sig(
        "m", 100, ttft_seconds=h((0.1, 15), (0.5, 70), (1.0, 120), (INF, 120), total=45.0),
        itl_seconds=h((0.01, 60), (0.05, 110), (INF, 110), total=2.5),
        preemptions_total=7.0, prefill_seconds_total=12.5, decode_seconds_total=140.0,
    )  # fmt: skip
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    res = two_ticks(j, {"a": scrape("a", T0, before)}, {"a": scrape("a", T0 + 10, after)})
    u = res.windows[0].usage
    assert u.ttft_delta == h((0.1, 10), (0.5, 60), (1.0, 100), (INF, 100), total=40.0)
    assert u.ttft_p99_seconds == pytest.approx(0.5 + 0.5 * (99 - 60) / 40)  # 0.9875 s
    assert u.itl_delta == h((0.01, 50), (0.05, 100), (INF, 100), total=2.0)
    assert u.itl_p99_seconds == pytest.approx(0.01 + 0.04 * (99 - 50) / 50)  # 0.0492 s
    assert (u.preemptions, u.prefill_seconds, u.decode_seconds) == (4.0, 2.5, 40.0)


def test_energy_falls_back_to_mean_power_over_the_ticks_rounds() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK_POWER)
    j.add_round(rnd(T0, gpu(0, T0, None, power=100.0)))
    j.close_tick(T0, {"a": scrape("a", T0, sig("m", 0))})
    for t, watts in ((T0 + 2, 300.0), (T0 + 5, None), (T0 + 8, 500.0), (T0 + 10, 400.0)):
        j.add_round(rnd(t, gpu(0, t, None, power=watts)))
    res = conserved(j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, sig("m", 10))}))
    (w,) = res.windows
    # mean of 300, 500 and 400 W (the missing reading is skipped) = 400 W × 10 s = 4,000 J
    assert w.usage.energy_joules == pytest.approx(4000.0)
    assert w.usage.power_watts == pytest.approx(400.0)
    assert w.energy_usd == pytest.approx(4000 / 3.6e6 * 0.15)


def test_a_node_override_prices_every_gpu_of_that_node_only() -> None:
    book = PriceTable(gpus=(GpuRate("H100", 3.6),), nodes={"reserved-1": 1.8})
    for node, per_tick in (("reserved-1", 0.005), ("other", 0.01)):
        j = WindowJoiner(node, (EngineSpec("a", gpus=(0,)),), book)
        res = two_ticks(j, {"a": scrape("a", T0, sig("m", 0))}, {"a": scrape("a", T0 + 10, sig("m", 1))})
        assert res.windows[0].cost_usd == pytest.approx(per_tick)


def test_a_cpu_engine_is_its_own_price_and_outside_gpu_conservation() -> None:
    j = WindowJoiner("n1", (EngineSpec("cpu"), EngineSpec("a", gpus=(0,))), BOOK)
    res = two_ticks(
        j,
        {"cpu": scrape("cpu", T0, sig("t", 0)), "a": scrape("a", T0, sig("m", 0))},
        {"cpu": scrape("cpu", T0 + 10, sig("t", 80)), "a": scrape("a", T0 + 10, sig("m", 0))},
    )
    w = {x.usage.engine: x for x in res.windows}
    assert w["cpu"].cost_usd == pytest.approx(0.001) and res.engine_usd == pytest.approx(0.001)  # $0.36/h
    assert w["cpu"].priced and w["cpu"].usage.gpu_seconds == 0.0


# ---------------------------------------------------------------------------------------------
# more behaviour pinned (each found by a surviving mutant)
# ---------------------------------------------------------------------------------------------


def test_the_first_tick_and_a_repeated_instant_only_set_baselines() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    j.add_round(rnd(T0))
    assert j.close_tick(T0, {"a": scrape("a", T0, sig("m", 0))}) == TickResult(T0, T0)
    j.add_round(rnd(T0))
    assert j.close_tick(T0, {"a": scrape("a", T0, sig("m", 50))}) == TickResult(T0, T0)  # no Δt
    j.add_round(rnd(T0 + 10))
    res = conserved(j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, sig("m", 80))}))
    assert res.windows[0].usage.generation_tokens == 30.0  # from the last baseline (50), not 0


def test_gpu_ticks_carry_the_ticks_readings_and_its_seconds() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK_POWER)

    def reading(
        t: float, util: float, bw: float | None, busy: float, watts: float, joules: float
    ) -> NvmlRound:
        g = GpuSample(
            0, "GPU-0", H100, t, util_gpu_ratio=util, dram_bw_ratio=bw, util_memory_ratio=busy,
            power_watts=watts, energy_joules=joules,
        )  # fmt: skip
        return NvmlRound(t, True, (g,))

    j.add_round(reading(T0, 0.1, 0.1, 0.1, 100.0, 0.0))
    j.close_tick(T0, {"a": scrape("a", T0, sig("m", 0, requests_running=1.0))})
    j.add_round(reading(T0 + 5, 0.2, None, 0.5, 200.0, 1000.0))
    j.add_round(reading(T0 + 10, 0.4, None, 0.7, 400.0, 3000.0))
    res = conserved(j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, sig("m", 10, requests_running=6.0))}))
    (g,) = res.gpus
    assert g.seconds == 10.0 and g.energy_joules == 3000.0  # the counter: 3,000 J since the last tick
    # no GPM bandwidth this tick: the memory-busy ratio stands in for it
    assert (g.util_ratio, g.bw_ratio, g.power_watts) == pytest.approx((0.3, 0.6, 300.0))
    assert not g.estimated and g.sample.timestamp == T0 + 10
    (w,) = res.windows
    assert (w.usage.gpu_util_ratio, w.usage.mem_bw_ratio) == pytest.approx((0.3, 0.6))
    assert w.usage.requests_running == 6.0 and w.usage.power_watts == pytest.approx(300.0)


def test_gpm_bandwidth_wins_over_the_memory_busy_ratio() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    g = lambda t: GpuSample(0, "GPU-0", H100, t, dram_bw_ratio=0.25, util_memory_ratio=0.9)  # noqa: E731
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("m", 0))},
        {"a": scrape("a", T0 + 10, sig("m", 1))},
        (rnd(T0, g(T0)), rnd(T0 + 10, g(T0 + 10))),
    )
    assert res.gpus[0].bw_ratio == 0.25 and res.windows[0].usage.mem_bw_ratio == 0.25


def test_a_gpu_lost_this_tick_shows_its_down_reading_and_no_power() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    j.add_round(rnd(T0, gpu(0, T0)))
    j.close_tick(T0, {"a": scrape("a", T0, sig("m", 0))})
    lost = GpuSample(0, "GPU-0", H100, T0 + 4, up=False, error="GPU is lost")
    j.add_round(rnd(T0 + 4, lost))
    res = conserved(j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, sig("m", 10))}))
    (g,) = res.gpus
    assert g.sample == lost and g.estimated and g.power_watts is None
    assert g.energy_joules == pytest.approx(400.0 * 10)  # its last known 400 W
    assert res.windows[0].estimated and res.windows[0].cost_usd == pytest.approx(0.01)


def test_a_gpu_not_in_the_round_is_shown_down_at_the_ticks_time() -> None:
    parent = lambda t: GpuSample(0, "GPU-0", H100, t, power_watts=700.0)  # noqa: E731
    inst = lambda t: GpuSample(0, "MIG-a", f"{H100} MIG 7g.80gb", t, mig_parent_uuid="GPU-0")  # noqa: E731
    j = WindowJoiner("n1", (EngineSpec("a", gpus=("MIG-a",)),), BOOK)
    j.add_round(rnd(T0, parent(T0), inst(T0)))
    j.close_tick(T0, {"a": scrape("a", T0, sig("m", 0))})
    j.add_round(NvmlRound(T0 + 10, False, (), error="driver not loaded"))
    res = conserved(j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, sig("m", 5))}))
    g = {x.sample.uuid: x for x in res.gpus}
    assert g["MIG-a"].sample == GpuSample(
        0, "MIG-a", f"{H100} MIG 7g.80gb", T0 + 10, up=False, mig_parent_uuid="GPU-0"
    )
    assert g["GPU-0"].sample == GpuSample(0, "GPU-0", H100, T0 + 10, up=False)
    assert g["MIG-a"].estimated and g["GPU-0"].estimated
    assert res.windows[0].cost_usd == pytest.approx(0.01) and res.windows[0].estimated


def test_a_mig_instance_missing_from_a_round_is_estimated_its_siblings_are_not() -> None:
    parent = lambda t: GpuSample(0, "GPU-0", H100, t)  # noqa: E731
    inst = lambda x, t: GpuSample(0, f"MIG-{x}", f"{H100} MIG 3g.40gb", t, mig_parent_uuid="GPU-0")  # noqa: E731
    j = WindowJoiner("n1", (), BOOK)
    j.add_round(rnd(T0, parent(T0), inst("a", T0), inst("b", T0)))
    j.close_tick(T0, {})
    j.add_round(rnd(T0 + 10, parent(T0 + 10), inst("a", T0 + 10)))
    res = conserved(j.close_tick(T0 + 10, {}))
    est = {x.sample.uuid: x.estimated for x in res.gpus}
    assert est == {"GPU-0": False, "MIG-a": False, "MIG-b": True}


def test_gpus_after_a_mig_instance_in_the_round_are_priced_too() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(1,)),), BOOK)
    inst = lambda t: GpuSample(0, "MIG-a", f"{H100} MIG 7g.80gb", t, mig_parent_uuid="GPU-0")  # noqa: E731
    rounds = tuple(rnd(t, inst(t), GpuSample(0, "GPU-0", H100, t), gpu(1, t)) for t in (T0, T0 + 10))
    res = two_ticks(j, {"a": scrape("a", T0, sig("m", 0))}, {"a": scrape("a", T0 + 10, sig("m", 1))}, rounds)  # type: ignore[arg-type]
    assert {g.sample.uuid for g in res.gpus} == {"MIG-a", "GPU-0", "GPU-1"}
    assert res.windows[0].cost_usd == pytest.approx(0.01)


def test_an_unpriced_mig_gpu_has_no_price_on_any_slice() -> None:
    a30 = "NVIDIA A30"
    rounds = tuple(
        rnd(
            t,
            GpuSample(0, "GPU-0", a30, t),
            GpuSample(0, "MIG-a", f"{a30} MIG 2g.12gb", t, mig_parent_uuid="GPU-0"),
        )
        for t in (T0, T0 + 10)
    )
    j = WindowJoiner("n1", (EngineSpec("a", gpus=("MIG-a",)),), BOOK)
    res = two_ticks(j, {"a": scrape("a", T0, sig("m", 0))}, {"a": scrape("a", T0 + 10, sig("m", 1))}, rounds)  # type: ignore[arg-type]
    assert [g.usd_per_hour for g in res.gpus] == [None, None]
    assert not res.windows[0].priced


def test_a_gpu_priced_only_from_inside_the_tick_is_unknown_for_the_tick() -> None:
    book = PriceTable(gpus=(GpuRate("H100", 3.6, T0 + 5),))
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), book)
    res = two_ticks(j, {"a": scrape("a", T0, sig("m", 0))}, {"a": scrape("a", T0 + 10, sig("m", 1))})
    (w,) = res.windows
    assert not w.priced and w.gpu_time_usd == 0.0
    assert {g.sample.uuid: g.usd_per_hour for g in res.gpus}["GPU-0"] is None


def test_a_node_override_is_the_price_shown_per_gpu() -> None:
    j = WindowJoiner("reserved", (EngineSpec("a", gpus=(0,)),), PriceTable(nodes={"reserved": 1.8}))
    res = two_ticks(j, {"a": scrape("a", T0, sig("m", 0))}, {"a": scrape("a", T0 + 10, sig("m", 1))})
    assert {g.usd_per_hour for g in res.gpus} == {1.8}


def test_an_engine_down_from_the_start_leaves_its_gpus_unallocated() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    res = two_ticks(j, {"a": scrape("a", T0, up=False)}, {"a": scrape("a", T0 + 10, up=False)})
    assert res.windows == ()
    assert {g.sample.uuid: g.unallocated_usd for g in res.gpus}["GPU-0"] == pytest.approx(0.01)


def test_an_engine_going_down_with_histograms_gives_idle_windows_without_latency() -> None:
    hist = h((0.1, 1), (INF, 2), total=0.3)
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("m", 5, ttft_seconds=hist, itl_seconds=hist))},
        {"a": scrape("a", T0 + 10, up=False)},
    )
    (w,) = res.windows
    assert w.usage.ttft_delta is None and w.usage.itl_delta is None and w.usage.requests_running is None
    assert w.idle_usd == pytest.approx(0.01)


def test_a_model_new_this_tick_has_no_deltas_yet() -> None:
    hist = h((0.1, 1), (INF, 2), total=0.3)
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("old", 0))},
        {"a": scrape("a", T0 + 10, sig("old", 10), sig("new", 500, ttft_seconds=hist, itl_seconds=hist))},
    )
    w = {x.usage.model: x for x in res.windows}
    assert w["new"].usage.generation_tokens == 0.0 and w["new"].usage.ttft_delta is None
    assert w["new"].cost_usd == 0.0 and w["old"].cost_usd == pytest.approx(0.01)


def test_a_version_from_deployment_metadata_wins_over_the_config() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,), model_version="cfg"),), BOOK)
    j.add_round(rnd(T0))
    j.close_tick(T0, {"a": scrape("a", T0, sig("m", 0))})
    j.add_round(rnd(T0 + 10))
    res = j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, sig("m", 1))}, {"a": "v9", "b": "x"})
    assert res.windows[0].usage.model_version == "v9"


def test_an_unpriced_gpu_is_logged_once_naming_the_gpu_and_the_book(caplog: pytest.LogCaptureFixture) -> None:
    t4 = "Tesla T4"
    book = PriceTable(gpus=(GpuRate("H100", 3.6),), source="/etc/prices.yaml")
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0, 1)),), book)
    caplog.set_level("WARNING", logger="agent.cost.window")
    for t in (T0, T0 + 10, T0 + 20):
        j.add_round(rnd(t, gpu(0, t, name=t4), gpu(1, t)))
        j.close_tick(t, {"a": scrape("a", t, sig("m", t - T0))})
    assert [r.getMessage() for r in caplog.records] == [
        "GPU GPU-0 (Tesla T4) has no price in /etc/prices.yaml: its cost is unknown (ratios absent)"
    ]


def test_cpu_prices_split_by_token_share_and_add_to_an_engines_gpus() -> None:
    book = PriceTable(gpus=(GpuRate("H100", 3.6),), engines={"cpu": 0.36, "a": 0.72})
    j = WindowJoiner("n1", (EngineSpec("cpu"), EngineSpec("a", gpus=(0,))), book)
    res = two_ticks(
        j,
        {"cpu": scrape("cpu", T0, sig("x", 0), sig("y", 0)), "a": scrape("a", T0, sig("m", 0))},
        {"cpu": scrape("cpu", T0 + 10, sig("x", 30), sig("y", 10)), "a": scrape("a", T0 + 10, sig("m", 5))},
    )
    w = {x.usage.model: x for x in res.windows}
    # $0.36/h for 10 s = $0.001: x 3/4, y 1/4; engine a: $0.01 of GPU + $0.002 of its own price
    assert (w["x"].cost_usd, w["y"].cost_usd) == pytest.approx((0.00075, 0.00025))
    assert w["m"].cost_usd == pytest.approx(0.012)
    assert res.engine_usd == pytest.approx(0.003)


def test_decode_efficiency_per_data_parallel_replica_and_from_the_engines_kv_capacity() -> None:
    spec = EngineSpec(
        "a", gpus=(0, 1), weights_bytes=140e9, kv_bytes_per_token=327_680, kv_capacity_tokens=1.0
    )
    parts = lambda a, b: {"generation_tokens_total": {"g,engine=0": a, "g,engine=1": b}}  # noqa: E731
    before = sig("m", 0, counter_parts=parts(0, 0), decode_seconds_total=0.0)
    after = sig(
        "m", 428.4, counter_parts=parts(214.2, 214.2), decode_seconds_total=40.0, requests_running=8.0,
        kv_cache_usage_ratio=0.5, kv_capacity_tokens=100_000.0,
    )  # fmt: skip
    j = WindowJoiner("n1", (spec,), BOOK)
    res = two_ticks(j, {"a": scrape("a", T0, before)}, {"a": scrape("a", T0 + 10, after)})
    # two replicas, one H100 each (3.35 TB/s): KV in use 0.5 × 100,000 (the engine's figure) over the
    # 8 sequences read at the instant, times the 4 in decode over the window (40 request-seconds in 10 s)
    ideal = (140e9 + 50_000 * (40.0 / 10.0) / 8.0 * 327_680) / 3.35e12
    assert res.windows[0].roofline_ratio == pytest.approx(ideal / (40.0 / 428.4))


def test_decode_efficiency_of_a_batch_time_engine_and_of_an_unknown_gpu() -> None:
    spec = EngineSpec("t", gpus=(0,), weights_bytes=140e9)
    before = sig("m", 0, decode_seconds_total=0.0)
    after = sig("m", 1000, decode_seconds_total=12.0, requests_running=4.0)
    j = WindowJoiner("n1", (spec,), BOOK)
    j.add_round(rnd(T0))
    j.close_tick(T0, {"t": EngineScrape("t", "tgi", T0, True, 0.0, (before,))})
    j.add_round(rnd(T0 + 10))
    res = j.close_tick(T0 + 10, {"t": EngineScrape("t", "tgi", T0 + 10, True, 0.0, (after,))})
    # TGI's decode seconds are batch seconds: a step = 12 s × 4 running / 1,000 tokens = 48 ms
    assert res.windows[0].roofline_ratio == pytest.approx((140e9 / 3.35e12) / (12.0 * 4 / 1000))
    j2 = WindowJoiner("n1", (spec,), BOOK)
    mystery = "Mystery GPU 9000"
    res2 = two_ticks(
        j2,
        {"t": scrape("t", T0, before)},
        {"t": scrape("t", T0 + 10, after)},
        (rnd(T0, gpu(0, T0, name=mystery)), rnd(T0 + 10, gpu(0, T0 + 10, name=mystery))),
    )
    assert res2.windows[0].roofline_ratio is None  # unknown bandwidth: absent, not guessed
    assert res2.windows[0].floor_usd_per_1m_output is None  # no ceiling, so no floor under it
    # one GPU known and one not: the known one's bandwidth alone is no ceiling of the engine
    spec2 = EngineSpec("t", gpus=(0, 1), weights_bytes=140e9)
    res3 = two_ticks(
        WindowJoiner("n1", (spec2,), BOOK),
        {"t": scrape("t", T0, before)},
        {"t": scrape("t", T0 + 10, after)},
        (
            rnd(T0, gpu(0, T0), gpu(1, T0, name=mystery)),
            rnd(T0 + 10, gpu(0, T0 + 10), gpu(1, T0 + 10, name=mystery)),
        ),
    )
    assert res3.windows[0].roofline_ratio is None and res3.windows[0].floor_usd_per_1m_output is None


def test_a_histogram_missing_from_a_page_gives_no_latency_for_that_tick() -> None:
    hist = h((0.1, 1), (INF, 2), total=0.3)
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    res = two_ticks(
        j, {"a": scrape("a", T0, sig("m", 0, ttft_seconds=hist))}, {"a": scrape("a", T0 + 10, sig("m", 5))}
    )
    assert res.windows[0].usage.ttft_delta is None and res.windows[0].usage.ttft_p99_seconds is None


def test_a_lost_gpu_listed_first_does_not_stop_the_others_being_remembered() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(1,)),), BOOK_POWER)
    lost = lambda t: GpuSample(0, "GPU-0", H100, t, up=False, error="lost")  # noqa: E731
    j.add_round(rnd(T0, lost(T0), gpu(1, T0, 1000.0)))
    j.close_tick(T0, {"a": scrape("a", T0, sig("m", 0))})
    j.add_round(rnd(T0 + 10, lost(T0 + 10), gpu(1, T0 + 10, 1360.0)))
    res = conserved(j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, sig("m", 5))}))
    # GPU 1's counter: 360 J since the last tick (not 400 W × 10 s = 4,000 J)
    assert res.windows[0].usage.energy_joules == pytest.approx(360.0)


# ---------------------------------------------------------------------------------------------
# prompt vs output by phase time, usage basis, prefix-cache savings
# ---------------------------------------------------------------------------------------------


def test_prompt_and_output_dollars_by_phase_time_usage_basis_and_cache_savings() -> None:
    before = sig(
        "m", 0, prompt=0, prefill_seconds_total=0.0, decode_seconds_total=0.0, cached_prompt_tokens_total=0.0
    )
    after = sig(
        "m",
        1000,
        prompt=500,
        prefill_seconds_total=10.0,
        decode_seconds_total=30.0,
        cached_prompt_tokens_total=100.0,
    )
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    res = two_ticks(j, {"a": scrape("a", T0, before)}, {"a": scrape("a", T0 + 10, after)})  # GPU busy 0.5
    (w,) = res.windows
    # $0.01: prefill took 10 of 40 request-seconds → $0.0025 for 500 prompt tokens ($5 per 1M)
    assert w.prompt_usd == pytest.approx(0.0025) and w.output_usd == pytest.approx(0.0075)
    assert w.usage.cached_prompt_tokens == 100.0
    # 400 prompt tokens were computed for $0.0025; the 100 cached ones would have cost $0.000625
    assert w.prefix_cache_saved_usd == pytest.approx(100 * 0.0025 / 400)
    assert w.usage_usd == pytest.approx(0.005)  # the GPU was busy half the time


def test_without_phase_times_there_is_no_split_and_without_utilisation_no_usage_cost() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    plain = lambda t: GpuSample(0, "GPU-0", H100, t)  # noqa: E731  (no utilisation reading)
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("m", 0, prefill_seconds_total=0.0))},
        {"a": scrape("a", T0 + 10, sig("m", 10, prefill_seconds_total=1.0))},
        (rnd(T0, plain(T0)), rnd(T0 + 10, plain(T0 + 10))),
    )
    (w,) = res.windows
    assert w.prompt_usd is None and w.output_usd == pytest.approx(0.01) and w.prefix_cache_saved_usd is None
    assert w.usage_usd is None


def test_an_idle_window_has_no_prompt_split() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    s = sig("m", 0, prefill_seconds_total=1.0, decode_seconds_total=1.0)
    res = two_ticks(j, {"a": scrape("a", T0, s)}, {"a": scrape("a", T0 + 10, s)})
    assert res.windows[0].prompt_usd is None and res.windows[0].idle_usd == pytest.approx(0.01)


def test_the_ledger_exports_prompt_and_decode_prices_usage_cost_and_savings() -> None:
    from agent.snapshot import Ledger

    before = sig(
        "m", 0, prompt=0, prefill_seconds_total=0.0, decode_seconds_total=0.0, cached_prompt_tokens_total=0.0
    )
    after = sig(
        "m",
        1000,
        prompt=500,
        prefill_seconds_total=10.0,
        decode_seconds_total=30.0,
        cached_prompt_tokens_total=100.0,
    )
    engines = (EngineSpec("a", gpus=(0,)), EngineSpec("b", gpus=(1,)))
    j = WindowJoiner("n1", engines, BOOK)
    res = two_ticks(
        j,
        {"a": scrape("a", T0, before), "b": scrape("b", T0, sig("x", 0))},
        {"a": scrape("a", T0 + 10, after), "b": scrape("b", T0 + 10, sig("x", 10))},
    )
    led = Ledger("n1", "test")
    led.apply(res)
    m = {s.engine: s for s in led.snapshot().models}
    assert m["a"].prompt_cost_usd_total == pytest.approx(0.0025)
    assert m["a"].usd_per_1m_prompt_tokens == pytest.approx(5.0)  # $0.0025 / 500 prompt tokens
    assert m["a"].usd_per_1m_output_tokens_decode == pytest.approx(7.5)  # $0.0075 / 1,000 output tokens
    assert m["a"].usd_per_1m_output_tokens == pytest.approx(10.0)  # the all-in figure stays
    assert m["a"].usage_cost_usd_total == pytest.approx(0.005)
    assert m["a"].prefix_cache_saved_usd_total == pytest.approx(0.000625)
    # engine b reports no phase times and no cache: absent, not 0
    assert m["b"].prompt_cost_usd_total is None and m["b"].usd_per_1m_prompt_tokens is None
    assert m["b"].prefix_cache_saved_usd_total is None and m["b"].usage_cost_usd_total == pytest.approx(0.005)


def test_the_ledger_exports_latency_quantiles_queue_and_preemptions() -> None:
    from agent.snapshot import Ledger

    zero = h((0.1, 0), (0.5, 0), (1.0, 0), (INF, 0), total=0.0)
    delta = h((0.1, 10), (0.5, 60), (1.0, 100), (INF, 100), total=40.0)
    before = sig("m", 0, ttft_seconds=zero, itl_seconds=zero, e2e_seconds=zero, preemptions_total=5.0)
    after = sig(
        "m", 100, ttft_seconds=delta, itl_seconds=delta, e2e_seconds=delta, preemptions_total=8.0,
        requests_waiting=7.0,
    )  # fmt: skip
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    res = two_ticks(j, {"a": scrape("a", T0, before)}, {"a": scrape("a", T0 + 10, after)})
    led = Ledger("n1", "test")
    led.apply(res)
    (m,) = led.snapshot().models
    # rank 50 of 100 in (0.1, 0.5] holding 50: 0.1 + 0.4 × 40/50; rank 95 in (0.5, 1] holding 40
    p50, p95, p99 = 0.1 + 0.4 * 40 / 50, 0.5 + 0.5 * 35 / 40, 0.5 + 0.5 * 39 / 40
    assert (m.ttft_p50_seconds, m.ttft_p95_seconds, m.ttft_p99_seconds) == pytest.approx((p50, p95, p99))
    assert (m.itl_p50_seconds, m.itl_p95_seconds) == pytest.approx((p50, p95))
    assert (m.e2e_p50_seconds, m.e2e_p95_seconds, m.e2e_p99_seconds) == pytest.approx((p50, p95, p99))
    assert m.requests_waiting == 7.0 and m.preemptions_total == 3.0


def test_each_model_version_names_its_gpu_model_for_cost_by_gpu() -> None:
    from agent.catalog import CATALOG
    from agent.snapshot import Ledger, series

    engines = (EngineSpec("a", gpus=(0,)), EngineSpec("cpu"))
    j = WindowJoiner("n1", engines, BOOK)
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("m", 0)), "cpu": scrape("cpu", T0, sig("t", 0))},
        {"a": scrape("a", T0 + 10, sig("m", 1)), "cpu": scrape("cpu", T0 + 10, sig("t", 1))},
    )
    led = Ledger("n1", "test")
    led.apply(res)
    (spec,) = [s for s in CATALOG if s.name == "model_gpu_info"]
    assert list(series(spec, led.snapshot())) == [(("n1", "a", "m", "unknown", H100), 1.0)]  # no CPU row


def test_gpu_seconds_spent_throttled_are_charged_to_the_model_that_held_the_gpu() -> None:
    from agent.snapshot import Ledger

    def g(t: float, reasons: int | None) -> GpuSample:
        return GpuSample(0, "GPU-0", H100, t, util_gpu_ratio=0.9, clock_event_reasons=reasons)

    engines = (EngineSpec("a", gpus=(0,)), EngineSpec("b", gpus=(0,)))
    j = WindowJoiner("n1", engines, BOOK)
    j.add_round(rnd(T0, g(T0, 0)))
    j.close_tick(T0, {"a": scrape("a", T0, sig("m", 0)), "b": scrape("b", T0, sig("x", 0))})
    j.add_round(rnd(T0 + 5, g(T0 + 5, 0x4)))  # power capped
    j.add_round(rnd(T0 + 10, g(T0 + 10, 0x1)))  # idle: not throttling
    res = conserved(
        j.close_tick(
            T0 + 10, {"a": scrape("a", T0 + 10, sig("m", 3)), "b": scrape("b", T0 + 10, sig("x", 1))}
        )
    )
    w = {x.usage.engine: x for x in res.windows}
    # half the tick's readings were throttled: 10 s × 0.5, split equally between the two engines
    assert w["a"].usage.throttled_gpu_seconds == pytest.approx(2.5)
    assert w["b"].usage.throttled_gpu_seconds == pytest.approx(2.5)
    led = Ledger("n1", "test")
    led.apply(res)
    assert {m.engine: m.throttled_gpu_seconds_total for m in led.snapshot().models} == pytest.approx(
        {"a": 2.5, "b": 2.5}
    )
    # without reasons from NVML the figure is absent, not 0
    j2 = WindowJoiner("n1", engines[:1], BOOK)
    res2 = two_ticks(j2, {"a": scrape("a", T0, sig("m", 0))}, {"a": scrape("a", T0 + 10, sig("m", 1))})
    assert res2.windows[0].usage.throttled_gpu_seconds is None


def test_each_window_carries_its_cost_floor_and_the_ledger_exports_it() -> None:
    from agent.snapshot import Ledger

    spec = EngineSpec(
        "a", gpus=(0,), weights_bytes=140e9, kv_bytes_per_token=327_680, kv_capacity_tokens=100_000
    )
    before = sig("m", 0)
    after = sig("m", 500, requests_running=4.0, kv_cache_usage_ratio=0.04)  # 4,000 resident tokens
    j = WindowJoiner("n1", (spec,), BOOK)
    res = two_ticks(j, {"a": scrape("a", T0, before)}, {"a": scrape("a", T0 + 10, after)})
    (w,) = res.windows
    # $0.001/s; batch 4 at 1,000 tokens each: step = (140e9 + 4,000 × 327,680) / 3.35e12
    step = (140e9 + 4000 * 327_680) / 3.35e12
    assert w.floor_usd_per_1m_output == pytest.approx(0.001 / (4 / step) * 1e6)
    step_full = (140e9 + 100_000 * 327_680) / 3.35e12  # 100 sequences of 1,000 tokens
    assert w.floor_usd_per_1m_output_max_batch == pytest.approx(0.001 / (100 / step_full) * 1e6)
    led = Ledger("n1", "test")
    led.apply(res)
    (m,) = led.snapshot().models
    assert m.usd_per_1m_output_tokens_floor == pytest.approx(w.floor_usd_per_1m_output)
    assert m.usd_per_1m_output_tokens == pytest.approx(20.0)  # paid: $0.01 for 500 tokens
    assert m.usd_per_1m_output_tokens_floor is not None and m.usd_per_1m_output_tokens_floor < 20.0


def test_the_floor_per_replica_with_the_engines_capacity_and_none_on_an_unknown_gpu() -> None:
    spec = EngineSpec("a", gpus=(0, 1), weights_bytes=140e9, kv_bytes_per_token=1000.0)
    parts = lambda a, b: {"generation_tokens_total": {"g,engine=0": a, "g,engine=1": b}}  # noqa: E731
    before = sig("m", 0, counter_parts=parts(0, 0))
    after = sig(
        "m", 20, counter_parts=parts(10, 10), requests_running=8.0, kv_cache_usage_ratio=0.5,
        kv_capacity_tokens=8000.0,
    )  # fmt: skip
    j = WindowJoiner("n1", (spec,), BOOK)
    res = two_ticks(
        j, {"a": scrape("a", T0, before)}, {"a": scrape("a", T0 + 5, after)}, (rnd(T0), rnd(T0 + 5)), dt_s=5
    )
    (w,) = res.windows
    # 2 replicas, 4 running each, 4,000 resident per replica (1,000 each): step = (140e9 + 4e6) / 3.35e12
    step = (140e9 + 4000 * 1000.0) / 3.35e12
    usd_per_s = 2 * 0.001
    assert w.floor_usd_per_1m_output == pytest.approx(usd_per_s / (2 * 4 / step) * 1e6)
    step_full = (140e9 + 8000 * 1000.0) / 3.35e12  # 8 sequences of 1,000 tokens per replica
    assert w.floor_usd_per_1m_output_max_batch == pytest.approx(usd_per_s / (2 * 8 / step_full) * 1e6)
    # no KV usage reading: weights only, no max batch
    res2 = two_ticks(
        WindowJoiner("n1", (spec,), BOOK), {"a": scrape("a", T0, before)},
        {"a": scrape("a", T0 + 5, sig("m", 20, counter_parts=parts(10, 10), requests_running=8.0,
                                      kv_capacity_tokens=8000.0))},
        (rnd(T0), rnd(T0 + 5)), dt_s=5,
    )  # fmt: skip
    assert res2.windows[0].floor_usd_per_1m_output == pytest.approx(
        usd_per_s / (2 * 4 / (140e9 / 3.35e12)) * 1e6
    )
    assert res2.windows[0].floor_usd_per_1m_output_max_batch is None
    mystery = lambda t: rnd(t, gpu(0, t, name="Mystery GPU"), gpu(1, t, name="Mystery GPU"))  # noqa: E731
    priced = PriceTable(gpus=(GpuRate("Mystery", 3.6),))  # priced, but of unknown bandwidth
    res3 = two_ticks(
        WindowJoiner("n1", (spec,), priced), {"a": scrape("a", T0, before)},
        {"a": scrape("a", T0 + 5, after)}, (mystery(T0), mystery(T0 + 5)), dt_s=5,
    )  # fmt: skip
    assert res3.windows[0].priced and res3.windows[0].floor_usd_per_1m_output is None


def test_mixed_gpus_are_named_together_and_a_cpu_engine_has_no_usage_cost() -> None:
    a100 = "NVIDIA A100-SXM4-80GB"
    book = PriceTable(gpus=(GpuRate("H100", 3.6), GpuRate("A100", 1.8)), engines={"cpu": 0.36})
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0, 1)), EngineSpec("cpu")), book)
    rounds = tuple(rnd(t, gpu(0, t), gpu(1, t, name=a100)) for t in (T0, T0 + 10))
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("m", 0)), "cpu": scrape("cpu", T0, sig("t", 0))},
        {"a": scrape("a", T0 + 10, sig("m", 1)), "cpu": scrape("cpu", T0 + 10, sig("t", 1))},
        rounds,  # type: ignore[arg-type]
    )
    w = {x.usage.engine: x for x in res.windows}
    assert w["a"].usage.gpu_model == f"{a100}, {H100}"
    assert w["cpu"].usage.gpu_model is None and w["cpu"].usage_usd is None


def test_the_prompt_split_needs_tokens_one_is_enough() -> None:
    j = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    b = sig("m", 0, prefill_seconds_total=0.0, decode_seconds_total=0.0)
    one = sig("m", 1, prefill_seconds_total=1.0, decode_seconds_total=3.0)
    res = two_ticks(j, {"a": scrape("a", T0, b)}, {"a": scrape("a", T0 + 10, one)})
    assert res.windows[0].prompt_usd == pytest.approx(0.0025)
    j2 = WindowJoiner("n1", (EngineSpec("a", gpus=(0,)),), BOOK)
    none = sig("m", 0, prefill_seconds_total=1.0, decode_seconds_total=3.0)  # phase time, no tokens
    res2 = two_ticks(j2, {"a": scrape("a", T0, b)}, {"a": scrape("a", T0 + 10, none)})
    assert res2.windows[0].prompt_usd is None and res2.windows[0].idle_usd == pytest.approx(0.01)


def test_decode_efficiency_reads_the_step_from_the_inter_token_latency_of_the_window() -> None:
    spec = EngineSpec("a", gpus=(0,), weights_bytes=140e9)
    itl0, itl1 = h((0.1, 0), (INF, 0), total=0.0), h((0.1, 400), (INF, 400), total=20.0)
    before = sig("m", 0, decode_seconds_total=0.0, prefill_seconds_total=0.0, itl_seconds=itl0)
    # 2 s of prefill request time changes nothing; 400 intervals in 20 s: the step ran 50 ms,
    # although the requests that finished report 40 request-seconds for 428.4 tokens (93 ms)
    after = sig("m", 428.4, decode_seconds_total=40.0, prefill_seconds_total=2.0, itl_seconds=itl1)
    j = WindowJoiner("n1", (spec,), BOOK)
    res = two_ticks(j, {"a": scrape("a", T0, before)}, {"a": scrape("a", T0 + 10, after)})
    assert res.windows[0].roofline_ratio == pytest.approx((140e9 / 3.35e12) / 0.05)


def test_the_prefill_floor_takes_the_least_time_the_windows_prompts_could_cost_out_of_the_step() -> None:
    from agent.hardware import gpu_spec

    peak = gpu_spec(H100)
    assert peak is not None
    itl0, itl1 = h((0.1, 0), (INF, 0), total=0.0), h((0.1, 400), (INF, 400), total=20.0)
    before = sig("m", 0, 0.0, decode_seconds_total=0.0, itl_seconds=itl0, cached_prompt_tokens_total=0.0)
    # 20,000 prompt tokens, 10,000 of them prefix-cache hits: 10,000 prefilled in the 10 s window
    after = sig(
        "m", 428.4, 20_000.0, decode_seconds_total=40.0, itl_seconds=itl1, cached_prompt_tokens_total=10_000.0
    )
    figs = {}
    for flops in (None, 2 * 70e9):
        spec = EngineSpec("a", gpus=(0,), weights_bytes=140e9, flops_per_token=flops)
        res = two_ticks(
            WindowJoiner("n1", (spec,), BOOK),
            {"a": scrape("a", T0, before)},
            {"a": scrape("a", T0 + 10, after)},
        )
        figs[flops] = res.windows[0].roofline_ratio
    share = 10_000 * 2 * 70e9 / (peak.peak_flops * 10.0)  # the floor of the prefill share of the window
    assert figs[None] == pytest.approx((140e9 / 3.35e12) / 0.05)  # without FLOPs: the step as run
    assert figs[2 * 70e9] == pytest.approx((140e9 / 3.35e12) / (0.05 * (1 - share)))


def test_priority_classes_by_engine_or_by_model_are_exported_to_join_on() -> None:
    from agent.catalog import CATALOG
    from agent.config import EngineConfig
    from agent.snapshot import Ledger, series

    cfg = EngineConfig(
        name="a",
        url="http://x/metrics",
        gpus=(0,),
        priority_class="batch",
        priority_classes={"chat": "realtime"},
    )
    spec = cfg.cost_spec()
    assert (spec.class_of("chat"), spec.class_of("summarise")) == ("realtime", "batch")
    j = WindowJoiner("n1", (spec, EngineSpec("b", gpus=(1,))), BOOK)
    res = two_ticks(
        j,
        {"a": scrape("a", T0, sig("chat", 0), sig("summarise", 0)), "b": scrape("b", T0, sig("x", 0))},
        {
            "a": scrape("a", T0 + 10, sig("chat", 1), sig("summarise", 1)),
            "b": scrape("b", T0 + 10, sig("x", 1)),
        },
    )
    led = Ledger("n1", "test")
    led.apply(res)
    (row,) = [s for s in CATALOG if s.name == "model_class_info"]
    assert sorted(series(row, led.snapshot())) == [
        (("n1", "a", "chat", "unknown", "realtime"), 1.0),
        (("n1", "a", "summarise", "unknown", "batch"), 1.0),
    ]  # engine b names no class: no row
