"""The window join: attribution of GPU cost to engines and models, hand-computed."""

from __future__ import annotations

import pytest

from agent.cost import counters as C
from agent.cost.counters import CounterMemory, Step, counter_increase, counter_step
from agent.cost.inputs import EngineSpec, PriceTable
from agent.cost.window import WindowJoiner
from agent.samples import EngineScrape, GpuSample, ModelSignals, NvmlRound
from agent.sources.prices import parse_price_book

T0 = 1_780_000_000.0
H100 = "NVIDIA H100 80GB HBM3"


def book(power: bool = False) -> PriceTable:
    raw: dict = {
        "gpus": [{"match": "H100", "usd_per_hour": 3.6}],
        "engines": {"cpu-engine": {"usd_per_hour": 0.36}},
    }
    if power:
        raw["power"] = {"usd_per_kwh": 0.10, "pue": 1.5}
    return parse_price_book(raw, "test-book").table()


def gpu(i: int, t: float, energy_j: float = 0.0, util: float = 0.5, power: float = 400.0) -> GpuSample:
    return GpuSample(
        index=i,
        uuid=f"GPU-{i}",
        name=H100,
        timestamp=t,
        util_gpu_ratio=util,
        power_watts=power,
        energy_joules=energy_j,
        dram_bw_ratio=util / 2,
    )


def rnd(t: float, energies: tuple[float, ...] = (0.0, 0.0, 0.0)) -> NvmlRound:
    return NvmlRound(timestamp=t, up=True, gpus=tuple(gpu(i, t, e) for i, e in enumerate(energies)))


def scrape(engine: str, t: float, *models: tuple[str, float, float], up: bool = True) -> EngineScrape:
    return EngineScrape(
        engine=engine,
        kind="vllm",
        timestamp=t,
        up=up,
        duration_seconds=0.01,
        models=tuple(
            ModelSignals(model=m, prompt_tokens_total=p, generation_tokens_total=g) for m, p, g in models
        ),
    )


ENGINES = (
    EngineSpec(name="a", gpus=(0, 1), model_version="v1"),
    EngineSpec(name="b", gpus=(1,), model_versions={"small": "s2"}),
)


def test_shared_gpu_split_equally_unused_gpu_is_idle_and_no_tokens_is_idle() -> None:
    j = WindowJoiner("n1", ENGINES, book())
    j.add_round(rnd(T0))
    j.close_tick(T0, {"a": scrape("a", T0, ("big", 0, 0)), "b": scrape("b", T0, ("small", 0, 0))})
    j.add_round(rnd(T0 + 10))
    res = j.close_tick(
        T0 + 10, {"a": scrape("a", T0 + 10, ("big", 500, 1000)), "b": scrape("b", T0 + 10, ("small", 0, 0))}
    )
    per_gpu = 3.6 * 10 / 3600  # $0.01 per GPU per tick
    w = {x.usage.engine: x for x in res.windows}
    assert w["a"].cost_usd == pytest.approx(per_gpu * 1.5)  # GPU0 + half of GPU1
    assert w["a"].usd_per_1m_output == pytest.approx(per_gpu * 1.5 / 1000 * 1e6)  # $15 per 1M
    assert w["a"].usd_per_1m_total == pytest.approx(per_gpu * 1.5 / 1500 * 1e6)
    assert w["a"].idle_usd == 0.0
    assert w["a"].usage.model_version == "v1"
    assert w["a"].usage.gpu_seconds == pytest.approx(15.0)
    assert w["b"].usd_per_1m_output is None and w["b"].usd_per_1m_total is None
    assert w["b"].idle_usd == pytest.approx(per_gpu * 0.5)
    assert w["b"].usage.model_version == "s2"
    g = {t.sample.uuid: t for t in res.gpus}
    assert g["GPU-2"].idle_usd == pytest.approx(per_gpu)  # no engine lists GPU 2
    assert g["GPU-1"].idle_usd == pytest.approx(per_gpu * 0.5)  # b's half made nothing
    assert g["GPU-0"].idle_usd == pytest.approx(0.0)
    assert sum(t.cost_usd for t in res.gpus) == pytest.approx(sum(x.cost_usd for x in res.windows) + per_gpu)


def test_counter_reset_counts_the_new_value_not_a_negative() -> None:
    j = WindowJoiner("n1", ENGINES[:1], book())
    j.close_tick(T0, {"a": scrape("a", T0, ("big", 1000, 5000))})
    res = j.close_tick(T0 + 5, {"a": scrape("a", T0 + 5, ("big", 10, 40))})  # the engine restarted
    (w,) = res.windows
    assert w.usage.prompt_tokens == 10 and w.usage.generation_tokens == 40


def test_energy_priced_from_the_counter_with_pue() -> None:
    j = WindowJoiner("n1", ENGINES[:1], book(power=True))
    j.add_round(rnd(T0, (1000.0, 2000.0, 0.0)))
    j.close_tick(T0, {"a": scrape("a", T0, ("big", 0, 0))})
    j.add_round(rnd(T0 + 10, (1000.0 + 3.6e6, 2000.0 + 3.6e6, 0.0)))  # 1 kWh each in 10 s
    res = j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, ("big", 0, 100))})
    (w,) = res.windows
    assert w.energy_usd == pytest.approx(2 * 0.10 * 1.5)  # 2 kWh × $0.10 × PUE 1.5
    assert w.usage.energy_joules == pytest.approx(2 * 3.6e6)


def test_cpu_only_engine_priced_per_hour() -> None:
    eng = EngineSpec(name="cpu-engine", gpus=())
    j = WindowJoiner("n1", (eng,), book())
    j.close_tick(T0, {"cpu-engine": scrape("cpu-engine", T0, ("tiny", 0, 0))})
    res = j.close_tick(T0 + 100, {"cpu-engine": scrape("cpu-engine", T0 + 100, ("tiny", 20, 80))})
    (w,) = res.windows
    assert w.cost_usd == pytest.approx(0.36 * 100 / 3600)
    assert w.usd_per_1m_output == pytest.approx(0.01 / 80 * 1e6)


def test_engine_down_its_gpus_cost_as_idle_then_tokens_come_back() -> None:
    j = WindowJoiner("n1", ENGINES[:1], book())
    j.add_round(rnd(T0))
    j.close_tick(T0, {"a": scrape("a", T0, ("big", 0, 100))})
    j.add_round(rnd(T0 + 5))
    down = j.close_tick(T0 + 5, {"a": scrape("a", T0 + 5, up=False)})
    (w,) = down.windows
    assert w.usage.model == "big" and w.usage.generation_tokens == 0
    assert w.idle_usd == pytest.approx(2 * 3.6 * 5 / 3600)
    j.add_round(rnd(T0 + 10))
    back = j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, ("big", 0, 400))})
    assert back.windows[0].usage.generation_tokens == 300


def test_tokens_share_policy() -> None:
    j = WindowJoiner("n1", ENGINES, book(), share_policy="tokens")
    j.add_round(rnd(T0))
    j.close_tick(T0, {"a": scrape("a", T0, ("big", 0, 0)), "b": scrape("b", T0, ("small", 0, 0))})
    j.add_round(rnd(T0 + 10))
    res = j.close_tick(
        T0 + 10, {"a": scrape("a", T0 + 10, ("big", 0, 300)), "b": scrape("b", T0 + 10, ("small", 0, 100))}
    )
    w = {x.usage.engine: x for x in res.windows}
    per_gpu = 0.01
    assert w["a"].cost_usd == pytest.approx(per_gpu + per_gpu * 0.75)
    assert w["b"].cost_usd == pytest.approx(per_gpu * 0.25)


def test_roofline_efficiency_is_decode_time_over_the_resident_kv_ceiling() -> None:
    eng = EngineSpec(
        name="a", gpus=(0,), weights_bytes=140e9, kv_bytes_per_token=327_680, kv_capacity_tokens=100_000,
    )  # fmt: skip
    j = WindowJoiner("n1", (eng,), book())
    sig = {"requests_running": 4.0, "kv_cache_usage_ratio": 0.5}
    for t, g, d in ((T0, 0.0, 0.0), (T0 + 10, 428.4, 40.0)):
        j.add_round(rnd(t))
        m = ModelSignals("m", 0.0, g, decode_seconds_total=d, **sig)
        res = j.close_tick(t, {"a": EngineScrape("a", "vllm", t, True, 0.0, (m,))})
    (w,) = res.windows
    # fastest step = (140e9 + 50,000 resident tokens × 327,680 B) / 3.35e12 B/s = 46.68 ms;
    # measured step = 40 request-seconds of decode / 428.4 tokens = 93.37 ms
    assert w.roofline_ratio == pytest.approx((156.384e9 / 3.35e12) / (40.0 / 428.4))
    assert 0.49 < w.roofline_ratio < 0.51


@pytest.mark.parametrize(
    ("kind", "step", "decode", "running"),
    [
        ("vllm", 300.0, 2400.0, 8.0),  # history at 5-minute steps: the counter's mean batch
        ("vllm", 120.0, 960.0, 8.0),  # 2 minutes is already coarse
        ("vllm", 119.0, 952.0, 8.0),  # a daemon tick too: the counter, not one instant
        ("tgi", 300.0, 2400.0, 16.0),  # engine seconds of decode say nothing of the batch
        ("vllm", 300.0, 0.0, 16.0),  # no decode time in the window: the gauge
    ],
)
def test_a_coarse_windows_requests_running_is_the_decode_counters_mean_batch(
    kind: str, step: float, decode: float, running: float
) -> None:
    j = WindowJoiner("n1", (EngineSpec(name="a", gpus=(0,)),), book())
    sig = {"requests_running": 16.0, "kv_cache_usage_ratio": 0.5}  # the gauge at the scrape instant
    for t, g, d in ((T0, 0.0, 0.0), (T0 + step, 24_000.0, decode)):
        j.add_round(rnd(t))
        m = ModelSignals("m", 0.0, g, decode_seconds_total=d, **sig)
        res = j.close_tick(t, {"a": EngineScrape("a", kind, t, True, 0.0, (m,))})
    (w,) = res.windows
    assert w.usage.requests_running == pytest.approx(running)


def test_a_gpu_in_mig_mode_is_paid_once_through_its_instances() -> None:
    parent = GpuSample(0, "GPU-0", H100, T0, util_gpu_ratio=None)
    inst = [GpuSample(0, f"MIG-{k}", f"{H100} MIG 1g.10gb", T0, mig_parent_uuid="GPU-0") for k in range(7)]
    eng_whole = EngineSpec(name="whole", gpus=(0,))  # the whole GPU = all instances
    eng_one = EngineSpec(name="one", gpus=("MIG-0",))
    j = WindowJoiner("n1", (eng_one,), book())
    for t in (T0, T0 + 3600):
        j.add_round(NvmlRound(t, True, (parent, *inst)))
        res = j.close_tick(t, {"one": scrape("one", t, ("m", 0, t - T0))})
    assert sum(g.cost_usd for g in res.gpus) == pytest.approx(3.6)  # one GPU-hour, not eight
    g = {x.sample.uuid: x for x in res.gpus}
    assert g["GPU-0"].cost_usd == pytest.approx(0.0)  # seven 1g slices: nothing left on the parent
    (w,) = res.windows
    assert w.cost_usd == pytest.approx(3.6 / 7)  # a 1g slice is a seventh of the GPU
    assert g["MIG-3"].idle_usd == pytest.approx(3.6 / 7) and g["MIG-0"].idle_usd == pytest.approx(0.0)
    j2 = WindowJoiner("n1", (eng_whole,), book())
    for t in (T0, T0 + 3600):
        j2.add_round(NvmlRound(t, True, (parent, *inst)))
        res2 = j2.close_tick(t, {"whole": scrape("whole", t, ("m", 0, t - T0))})
    assert res2.windows[0].cost_usd == pytest.approx(3.6)


def test_nvml_down_keeps_charging_time_at_the_last_price_and_energy_at_the_last_power() -> None:
    j = WindowJoiner("n1", ENGINES[:1], book(power=True))
    j.add_round(rnd(T0))
    j.close_tick(T0, {"a": scrape("a", T0, ("big", 0, 0))})
    j.add_round(rnd(T0 + 10))
    j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, ("big", 0, 100))})
    j.add_round(NvmlRound(T0 + 20, False, (), error="driver not loaded"))
    res = j.close_tick(T0 + 20, {"a": scrape("a", T0 + 20, ("big", 0, 600))})
    (w,) = res.windows
    # GPUs 0 and 1 at $3.60/h for 10 s = $0.02; energy 2 × 400 W × 10 s = 8,000 J = 2.222e-3 kWh
    # × $0.10 × PUE 1.5 = $0.000333…
    energy = 8000 / 3.6e6 * 0.10 * 1.5
    assert w.priced and w.estimated
    assert w.gpu_time_usd == pytest.approx(0.02)
    assert w.energy_usd == pytest.approx(energy)
    assert w.usd_per_1m_output == pytest.approx((0.02 + energy) / 500 * 1e6)  # $40.67 per 1M
    assert w.usage.generation_tokens == 500  # tokens are still counted
    g = {x.sample.uuid: x for x in res.gpus}
    assert g["GPU-2"].cost_usd == pytest.approx(0.01 + energy / 2) and g["GPU-2"].estimated
    assert not g["GPU-0"].sample.up  # the GPU's reading is not current: it is not shown as up


def test_nvml_down_from_the_start_makes_the_cost_unknown_not_zero() -> None:
    j = WindowJoiner("n1", ENGINES[:1], book())
    j.add_round(NvmlRound(T0, False, (), error="driver not loaded"))
    j.close_tick(T0, {"a": scrape("a", T0, ("big", 0, 0))})
    j.add_round(NvmlRound(T0 + 10, False, (), error="driver not loaded"))
    res = j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, ("big", 0, 500))})
    (w,) = res.windows
    assert not w.priced and w.usd_per_1m_output is None and w.usd_per_1m_total is None
    assert w.usage.generation_tokens == 500  # tokens are still counted


def test_an_unpriced_gpu_makes_the_ratio_absent() -> None:
    eng = EngineSpec(name="t4", gpus=(0,))
    j = WindowJoiner("n1", (eng,), book())
    t4 = lambda t: NvmlRound(t, True, (GpuSample(0, "GPU-T4", "Tesla T4", t),))  # noqa: E731
    j.add_round(t4(T0))
    j.close_tick(T0, {"t4": scrape("t4", T0, ("m", 0, 0))})
    j.add_round(t4(T0 + 10))
    (w,) = j.close_tick(T0 + 10, {"t4": scrape("t4", T0 + 10, ("m", 0, 100))}).windows
    assert w.usd_per_1m_output is None and not w.priced


def test_energy_after_a_gap_is_power_times_time_not_the_whole_gap() -> None:
    j = WindowJoiner("n1", ENGINES[:1], book(power=True))
    j.add_round(rnd(T0, (0.0, 0.0, 0.0)))
    j.close_tick(T0, {"a": scrape("a", T0, ("big", 0, 0))})
    j.close_tick(T0 + 10, {"a": scrape("a", T0 + 10, ("big", 0, 10))})  # NVML gave nothing this tick
    j.add_round(rnd(T0 + 20, (1e9, 1e9, 0.0)))  # the counter moved a lot while unread
    res = j.close_tick(T0 + 20, {"a": scrape("a", T0 + 20, ("big", 0, 20))})
    (w,) = res.windows
    assert w.usage.energy_joules == pytest.approx(2 * 400.0 * 10)  # 2 GPUs × 400 W × 10 s


def test_one_data_parallel_rank_restarting_is_not_a_reset_of_the_sum() -> None:
    def dp(t: float, rank0: float, rank1: float) -> dict[str, EngineScrape]:
        parts = {"generation_tokens_total": {"g,engine=0": rank0, "g,engine=1": rank1}}
        m = ModelSignals(
            "big", prompt_tokens_total=0.0, generation_tokens_total=rank0 + rank1, counter_parts=parts
        )
        return {"a": EngineScrape("a", "vllm", t, True, 0.0, (m,))}

    j = WindowJoiner("n1", ENGINES[:1], book())
    j.close_tick(T0, dp(T0, 10e6, 10e6))
    (w,) = j.close_tick(T0 + 5, dp(T0 + 5, 10e6 + 500, 20)).windows  # rank 1 restarted, then made 20
    assert w.usage.generation_tokens == 520  # not 10,000,520


# ---------------------------------------------------------------------------------------------
# counters with the exposition format's semantics (agent.cost.counters): resets, glitches, spikes
# ---------------------------------------------------------------------------------------------


INF = float("inf")
NAN = float("nan")


@pytest.mark.parametrize(
    ("prev", "cur", "budget", "restarted", "pending", "expected"),
    [
        (None, 5.0, 10.0, False, None, Step(5.0, 5.0)),  # a new series counts in full
        (None, 10.0, 10.0, False, None, Step(10.0, 10.0)),  # up to the bound
        (None, 11.0, 10.0, False, None, Step(0.0, 11.0, None, C.SPIKE)),  # beyond: a baseline
        (100.0, 150.0, 10.0, True, None, Step(0.0, 150.0, None, C.SPIKE)),  # a restart beyond the bound
        (1000.0, 1500.0, INF, True, None, Step(1500.0, 1500.0)),  # a restart: all of the new value
        (100.0, 100.0, 0.0, False, None, Step(0.0, 100.0)),  # no change, no budget
        (100.0, 110.0, 10.0, False, None, Step(10.0, 110.0)),  # growth up to the bound
        (100.0, 111.0, 10.0, False, None, Step(0.0, 100.0, 111.0, C.SPIKE)),  # beyond: refused
        (100.0, 49.0, 49.0, False, None, Step(49.0, 49.0)),  # under half, within the bound: a reset
        (100.0, 49.0, 48.0, False, None, Step(0.0, 100.0, 49.0, C.GLITCH)),  # beyond the bound
        (100.0, 50.0, INF, False, None, Step(0.0, 100.0, 50.0, C.GLITCH)),  # half: no reset
        (100.0, 99.0, INF, False, None, Step(0.0, 100.0, 99.0, C.GLITCH)),  # back by one
        (100.0, 99.0, INF, False, 99.0, Step(0.0, 99.0)),  # the glitch's level, again: a shift
        (100.0, 98.0, INF, False, 99.0, Step(0.0, 100.0, 98.0, C.GLITCH)),  # below it: still a glitch
        (100.0, 95.0, 5.0, False, 90.0, Step(5.0, 95.0)),  # continues the level, by the bound
        (100.0, 96.0, 5.0, False, 90.0, Step(0.0, 100.0, 96.0, C.GLITCH)),  # by more: no
        (10.0, 9e14 + 30, 100.0, False, 9e14, Step(30.0, 9e14 + 30)),  # a jump that stayed
        (10.0, 9e14 + 200, 100.0, False, 9e14, Step(0.0, 10.0, 9e14 + 200, C.SPIKE)),
    ],
)
def test_counter_step_tells_resets_glitches_spikes_and_shifts_apart(
    prev: float | None, cur: float, budget: float, restarted: bool, pending: float | None, expected: Step
) -> None:
    assert counter_step(prev, cur, budget, restarted, pending) == expected


def test_counter_step_defaults_are_unbounded_and_no_restart() -> None:
    assert counter_step(100.0, 1e12) == Step(1e12 - 100.0, 1e12)
    assert counter_step(100.0, 40.0) == Step(40.0, 40.0)


@pytest.mark.parametrize(
    ("names", "weights", "gpus", "expected"),
    [
        ([H100], 16e9, 0, 3.35e12 / 16e9 * 32768),  # bandwidth reads the weights once a step
        ([H100, H100], 16e9, 2, 2 * 3.35e12 / 16e9 * 32768),
        ([H100], None, 0, 989e12 * 4 / 2e8),  # compute: 2 FLOPs per parameter of a 1e8 model, FP4
        ([H100], 0.0, 0, 989e12 * 4 / 2e8),  # no weights figure: the compute bound
        (["Tesla T4"], None, 0, 2.25e15 * 4 / 2e8),  # unknown to the table: the fastest GPU
        ([], None, 0, 2.25e15 * 4 / 2e8),  # a CPU engine: one fastest GPU
        ([], 8e9, 0, 8e12 / 8e9 * 32768),
        ([], 0.5, 0, 8e12 / 0.5 * 32768),  # any positive figure is a figure
        ([H100], None, 3, (989e12 + 2 * 2.25e15) * 4 / 2e8),  # two configured but not read
    ],
)
def test_generation_ceiling(names: list[str], weights: float | None, gpus: int, expected: float) -> None:
    assert C.generation_ceiling(names, weights, gpus) == pytest.approx(expected, rel=1e-12)


def test_prompt_ceiling_is_one_nic_per_gpu_and_one_for_a_cpu_engine() -> None:
    assert C.prompt_ceiling([]) == 50e9
    assert C.prompt_ceiling([H100, H100]) == 100e9
    assert C.prompt_ceiling([H100], 4) == 200e9
    assert C.FASTEST_GPU.name == "NVIDIA B200"


@pytest.mark.parametrize("total", [None, NAN, -1.0, INF])
def test_a_reading_that_is_no_counter_value_changes_nothing(total: float | None) -> None:
    mem = CounterMemory(anonymous=3.0, at=T0)
    assert counter_increase(mem, total, None, T0 + 10, 1.0) == (None, mem)
    assert counter_increase(mem, total, {"a": 1.0}, T0 + 10, 1.0) == (None, mem)


def test_first_readings_keep_the_time_created_and_start_valid_ones_only() -> None:
    inc, mem = counter_increase(None, 5.0, {"a": 5.0, "b": NAN}, T0, 1.0, {"a": 7.0, "b": NAN}, 3.0)
    assert inc is None
    assert mem == CounterMemory({"a": 5.0}, at=T0, created={"a": 7.0}, started=3.0)
    inc, mem = counter_increase(None, 5.0, None, T0, 1.0, {"x": 7.0}, -1.0)
    assert mem == CounterMemory(anonymous=5.0, at=T0, created={"": 7.0})
    _, mem = counter_increase(None, 5.0, None, T0, 1.0, {"x": 7.0, "y": 8.0}, INF)
    assert mem == CounterMemory(anonymous=5.0, at=T0)  # two _created for one unnamed reading: none


@pytest.mark.parametrize(
    ("now", "ceiling", "at", "cur", "expected"),
    [
        (T0 + 10, 1.0, T0, 110.0, 10.0),  # 1/s × 10 s
        (T0 + 10, 1.0, T0, 111.0, 0.0),
        (T0 + 10, None, T0, 1e12, 1e12 - 100),  # unbounded
        (None, 1.0, T0, 1e12, 1e12 - 100),  # no clock
        (T0 + 10, 1.0, None, 1e12, 1e12 - 100),  # the memory has no time
        (T0 - 10, 1.0, T0, 101.0, 0.0),  # time went back: no budget
        (T0 - 10, 1.0, T0, 100.0, 0.0),
    ],
)
def test_the_budget_is_the_bound_times_the_time_since_the_last_reading(
    now: float | None, ceiling: float | None, at: float | None, cur: float, expected: float
) -> None:
    mem = CounterMemory(anonymous=100.0, at=at)
    assert counter_increase(mem, cur, None, now, ceiling)[0] == expected
    named = CounterMemory({"a": 100.0}, at=at)
    assert counter_increase(named, cur, {"a": cur}, now, ceiling)[0] == expected


def _later(a: float | None, b: float | None) -> float | None:
    return a if b is None else b if a is None else max(a, b)


@pytest.mark.parametrize(
    ("old_created", "created", "old_started", "started", "expected"),
    [
        (1.0, 2.0, None, None, 150.0),  # a new _created: the new value counts
        (1.0, 1.0, None, None, 50.0),  # the same: differenced
        (None, 2.0, None, None, 50.0),  # no old one to compare
        (1.0, None, None, None, 50.0),
        (None, None, 5.0, 6.0, 150.0),  # a new process start time
        (None, None, 5.0, 5.0, 50.0),
        (None, None, None, 6.0, 50.0),
        (None, None, 5.0, None, 50.0),
        (1.0, 1.0, 5.0, 6.0, 150.0),  # either is enough
        (2.0, 1.0, None, None, 50.0),  # an earlier one: another process at the address, no restart
        (None, None, 6.0, 5.0, 50.0),
    ],
)
def test_a_changed_created_or_start_time_is_a_restart(
    old_created: float | None,
    created: float | None,
    old_started: float | None,
    started: float | None,
    expected: float,
) -> None:
    old = {"a": old_created} if old_created is not None else {}
    new = {"a": created} if created is not None else None
    named = CounterMemory({"a": 100.0}, at=T0, created=old, started=old_started)
    inc, mem = counter_increase(named, 150.0, {"a": 150.0}, T0 + 10, 100.0, new, started)
    assert inc == expected and mem is not None
    assert mem.created.get("a") == _later(old_created, created)  # the latest is kept
    assert mem.started == _later(old_started, started)
    anon_old = {"": old_created} if old_created is not None else {}
    unnamed = CounterMemory(anonymous=100.0, at=T0, created=anon_old, started=old_started)
    inc, mem = counter_increase(unnamed, 150.0, None, T0 + 10, 100.0, new, started)
    assert inc == expected and mem is not None
    assert mem.created.get("") == _later(old_created, created)
    assert mem.started == _later(old_started, started)


def test_named_series_beyond_the_bound_together_are_refused_as_one_spike() -> None:
    mem = CounterMemory(
        {"a": 100.0, "b": 100.0, "c": 50.0, "z": 5.0}, at=T0, created={"b": 1.0}, pending={"z": 7.0}
    )
    # a +8, b restarted at 5, d new at 4: 17 > 10 (1/s × 10 s), each alone within it
    inc, mem2 = counter_increase(mem, 0.0, {"a": 108.0, "b": 5.0, "d": 4.0}, T0 + 10, 1.0, {"b": 2.0})
    assert inc == 0.0 and mem2 is not None
    assert mem2.series == {"a": 100.0, "b": 5.0, "c": 50.0, "z": 5.0, "d": 4.0}  # starts: baselines
    assert mem2.pending == {"z": 7.0, "a": 108.0}  # a goes on from 100 or from 108
    assert mem2.refused == {"a": C.SPIKE, "b": C.SPIKE, "d": C.SPIKE}
    assert mem2.created == {"b": 2.0} and mem2.at == T0 + 10
    # within the bound: counted, c untouched, the pending level of a series read again dropped
    inc, mem3 = counter_increase(mem2, 0.0, {"a": 108.0, "b": 6.0, "z": 9.0}, T0 + 30, 1.0)
    assert inc == 8.0 + 1.0 + 4.0 and mem3 is not None  # a: 100 → 108; b +1; z 5 → 9
    assert mem3.pending == {} and mem3.refused == {}
    assert mem3.series == {"a": 108.0, "b": 6.0, "c": 50.0, "d": 4.0, "z": 9.0}


def test_a_series_that_did_not_count_is_left_as_it_was_when_the_others_are_refused() -> None:
    mem = CounterMemory({"a": 100.0, "b": 100.0}, at=T0)
    # a glitches, c is new at 0; b +6 and d new at 5: 11 > 10 together, refused
    inc, mem2 = counter_increase(mem, 0.0, {"a": 99.0, "b": 106.0, "c": 0.0, "d": 5.0}, T0 + 10, 1.0)
    assert inc == 0.0 and mem2 is not None
    assert mem2.refused == {"a": C.GLITCH, "b": C.SPIKE, "d": C.SPIKE}  # c counted nothing: not refused
    assert mem2.pending == {"a": 99.0, "b": 106.0}
    assert mem2.series == {"a": 100.0, "b": 100.0, "c": 0.0, "d": 5.0}


def test_a_glitch_then_its_level_again_shifts_the_series_and_counts_from_there() -> None:
    mem = CounterMemory({"a": 1000.0}, at=T0)
    inc, mem = counter_increase(mem, 600.0, {"a": 600.0}, T0 + 10, 100.0)  # not under half
    assert inc == 0.0 and mem is not None and mem.refused == {"a": C.GLITCH} and mem.pending == {"a": 600.0}
    inc, mem = counter_increase(mem, 610.0, {"a": 610.0}, T0 + 20, 100.0)
    assert inc == 10.0 and mem is not None and mem.series == {"a": 610.0} and mem.pending == {}


@pytest.mark.parametrize(
    ("mem", "total", "inc", "after"),
    [
        # continuing the current named series
        (
            CounterMemory({"a": 100.0}, current="a", at=T0),
            95.0,
            0.0,
            CounterMemory(
                {"a": 100.0}, current="a", at=T0 + 10, pending={"a": 95.0}, refused={"a": C.GLITCH}
            ),
        ),
        (
            CounterMemory({"a": 100.0}, current="a", at=T0, pending={"a": 95.0}),
            96.0,
            1.0,
            CounterMemory({"a": 96.0}, current="a", at=T0 + 10),
        ),
        # an unnamed series
        (
            CounterMemory(anonymous=100.0, at=T0, pending={"b": 1.0}),
            99.0,
            0.0,
            CounterMemory(anonymous=100.0, at=T0 + 10, pending={"b": 1.0, "": 99.0}, refused={"": C.GLITCH}),
        ),
        (
            CounterMemory(anonymous=100.0, at=T0),
            2000.0,
            0.0,
            CounterMemory(anonymous=100.0, at=T0 + 10, pending={"": 2000.0}, refused={"": C.SPIKE}),
        ),
        # the closest series below: continued
        (
            CounterMemory({"a": 100.0, "b": 300.0}, at=T0),
            310.0,
            10.0,
            CounterMemory({"a": 100.0, "b": 310.0}, current="b", at=T0 + 10),
        ),
        # below every series, under half of the closest above and within the bound: a restart, unnamed
        (
            CounterMemory({"a": 100.0, "b": 300.0}, at=T0),
            49.0,
            49.0,
            CounterMemory({"a": 100.0, "b": 300.0}, anonymous=49.0, at=T0 + 10),
        ),
        # under half but beyond the bound: a glitch of the closest series above, not a restart
        (
            CounterMemory({"a": 100_000.0, "b": 300_000.0}, at=T0),
            4000.0,
            0.0,
            CounterMemory(
                {"a": 100_000.0, "b": 300_000.0},
                current="a",
                at=T0 + 10,
                pending={"a": 4000.0},
                refused={"a": C.GLITCH},
            ),
        ),
        # under half and exactly the bound (100/s × 10 s): a restart
        (
            CounterMemory({"a": 100_000.0}, at=T0),
            1000.0,
            1000.0,
            CounterMemory({"a": 100_000.0}, anonymous=1000.0, at=T0 + 10),
        ),
        # not under half: a glitch of it
        (
            CounterMemory({"a": 100.0, "b": 300.0}, at=T0),
            50.0,
            0.0,
            CounterMemory(
                {"a": 100.0, "b": 300.0},
                current="a",
                at=T0 + 10,
                pending={"a": 50.0},
                refused={"a": C.GLITCH},
            ),
        ),
        # a current series no longer remembered (a memory built by hand): the unnamed value goes on
        (
            CounterMemory({"a": 1.0}, anonymous=5.0, current="b", at=T0),
            6.0,
            1.0,
            CounterMemory({"a": 1.0}, anonymous=6.0, at=T0 + 10),
        ),
        # no series at all (a memory built by hand): a baseline
        (CounterMemory({}, at=T0), 5.0, 0.0, CounterMemory({}, anonymous=5.0, at=T0 + 10)),
    ],
)
def test_an_unnamed_reading_is_read_against_the_series_it_continues(
    mem: CounterMemory, total: float, inc: float, after: CounterMemory
) -> None:
    assert counter_increase(mem, total, None, T0 + 10, 100.0) == (inc, after)


def test_an_unnamed_baseline_over_a_memory_without_series_keeps_its_created() -> None:
    inc, mem = counter_increase(CounterMemory({}, at=T0), 5.0, None, T0 + 10, 100.0, {"x": 3.0}, 4.0)
    assert inc == 0.0 and mem == CounterMemory({}, anonymous=5.0, at=T0 + 10, created={"": 3.0}, started=4.0)


def test_an_unnamed_reading_below_every_series_with_a_new_start_time_is_a_restart() -> None:
    mem = CounterMemory({"a": 100.0}, at=T0, started=1.0)
    inc, after = counter_increase(mem, 90.0, None, T0 + 10, 100.0, None, 2.0)
    assert inc == 90.0 and after == CounterMemory({"a": 100.0}, anonymous=90.0, at=T0 + 10, started=2.0)
    inc, after = counter_increase(mem, 90.0, None, T0 + 10, 1.0, {"x": 5.0}, 2.0)  # beyond the bound
    assert inc == 0.0
    assert after == CounterMemory(
        {"a": 100.0}, anonymous=90.0, at=T0 + 10, created={"": 5.0}, started=2.0, refused={"": C.SPIKE}
    )


def test_the_window_join_bounds_generation_by_the_gpus_and_prompts_by_the_network() -> None:
    # one H100, an 8B fp16 model: 3.35e12 / 16e9 × 32,768 ≈ 6.9e6 tokens/s generated at most
    eng = EngineSpec(name="a", gpus=(0,), weights_bytes=16e9)
    j = WindowJoiner("n1", (eng,), book())
    seq = [(0.0, 0.0, 0.0), (6.8e7, 6.8e7, 5.0), (6.8e7 + 7e7, 6.8e7 + 7e7, 1e9)]
    got = []
    for k, (g, p, pre) in enumerate(seq):
        t = T0 + 10 * k
        j.add_round(rnd(t))
        m = ModelSignals("m", p, g, preemptions_total=pre, cached_prompt_tokens_total=p)
        res = j.close_tick(t, {"a": EngineScrape("a", "vllm", t, True, 0.0, (m,))})
        got.append(
            [
                (
                    w.usage.generation_tokens,
                    w.usage.prompt_tokens,
                    w.usage.preemptions,
                    w.usage.cached_prompt_tokens,
                )
                for w in res.windows
            ]
        )
        got.append(res.refused_counters)
    assert got[0] == [] and got[1] == ()
    assert got[2] == [(6.8e7, 6.8e7, 5.0, 6.8e7)] and got[3] == ()  # within both bounds
    # 7e7 generated in 10 s is beyond 6.9e7; as prompts it is far within 10 s × 50e9; preemptions unbounded
    assert got[4] == [(0.0, 7e7, 1e9 - 5.0, 7e7)]
    assert got[5] == ("a/m/generation_tokens_total/generation_tokens_total (spike)",)


def test_a_refused_counter_series_is_flagged_every_tick_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("WARNING", logger="agent.cost.window")
    j = WindowJoiner("n1", ENGINES[:1], book())
    flags = []
    for k, g in enumerate([1000.0, 999.0, 998.0, 1005.0, 1004.0]):
        t = T0 + 10 * k
        parts = {"generation_tokens_total": {"g,engine=0": g}}
        m = ModelSignals("big", 0.0, g, counter_parts=parts)
        flags.append(j.close_tick(t, {"a": EngineScrape("a", "vllm", t, True, 0.0, (m,))}).refused_counters)
    glitch = ("a/big/generation_tokens_total/g,engine=0 (glitch)",)
    assert flags == [(), glitch, glitch, (), glitch]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "engine a, model big: counter generation_tokens_total series g,engine=0 refused (glitch): it counts "
        "nothing until it reads as a counter again"
    ]


def test_the_window_join_reads_created_and_the_start_time_from_the_adapters_counter_parts() -> None:
    j = WindowJoiner("n1", ENGINES[:1], book())
    gens = []
    for k, (g, created, started) in enumerate(
        [(1000.0, 1.0, 5.0), (1500.0, 2.0, 5.0), (1400.0, 2.0, 6.0), (1450.0, 2.0, 6.0)]
    ):
        t = T0 + 10 * k
        parts = {
            "generation_tokens_total@created": {"g": created},
            "@process_start_time_seconds": {"p": started},
        }
        m = ModelSignals("big", 0.0, g, counter_parts=parts)
        gens.extend(
            w.usage.generation_tokens
            for w in j.close_tick(t, {"a": EngineScrape("a", "vllm", t, True, 0.0, (m,))}).windows
        )
    assert gens == [1500.0, 1400.0, 50.0]  # a new _created, then a new process start


def test_the_first_tick_sets_the_time_the_second_is_bounded_from() -> None:
    j = WindowJoiner("n1", (EngineSpec(name="a", gpus=(0,)),), book())
    for t, g in ((T0, 0.0), (T0 + 10, 1e9)):  # 1e9 in 10 s: beyond one H100's 1.98e7 tokens/s
        j.add_round(rnd(t))
        res = j.close_tick(t, {"a": scrape("a", t, ("m", 0.0, g))})
    assert [w.usage.generation_tokens for w in res.windows] == [0.0]
    assert res.refused_counters == ("a/m/generation_tokens_total/generation_tokens_total (spike)",)


def test_gpus_configured_but_not_read_count_as_the_fastest_in_the_bound() -> None:
    # GPU 0 is an H100 (1.98e7 tokens/s), GPU 5 is not on the node: bounded as a B200 (4.5e7/s)
    j = WindowJoiner("n1", (EngineSpec(name="a", gpus=(0, 5)),), book())
    for t, g in ((T0, 0.0), (T0 + 10, 3e8)):  # 3e8 in 10 s: beyond one H100, within both
        j.add_round(rnd(t))
        res = j.close_tick(t, {"a": scrape("a", t, ("m", 0.0, g))})
    assert [w.usage.generation_tokens for w in res.windows] == [3e8]
    assert res.refused_counters == ()


# ---------------------------------------------------------------- engine outages: the gap marking
@pytest.mark.parametrize(
    ("read", "known", "down_since", "want_down", "want_back"),
    [
        ({"a": True}, {"a": ("m",)}, {}, {}, {}),  # up, never down: nothing
        ({"a": False}, {"a": ("m",)}, {}, {"a": 100.0}, {}),  # goes down: since this tick's start
        ({"a": False}, {"a": ("m",)}, {"a": 50.0}, {"a": 50.0}, {}),  # stays down: since it went
        ({"a": True}, {"a": ("m",)}, {"a": 50.0}, {}, {"a": 50.0}),  # back: its gap began at 50
        ({"a": False}, {}, {}, {}, {}),  # never up: no models, no windows to hold
        ({"a": True, "b": False}, {"a": ("m",), "b": ("n",)}, {"b": 70.0}, {"b": 70.0}, {}),
        ({"b": True}, {"b": ("n",)}, {"a": 20.0}, {}, {}),  # an engine no longer listed is forgotten
    ],
)
def test_outages_say_which_engines_are_down_and_which_came_back_since_when(
    read: dict[str, bool],
    known: dict[str, tuple[str, ...]],
    down_since: dict[str, float],
    want_down: dict[str, float],
    want_back: dict[str, float],
) -> None:
    from agent.cost.window import outages

    assert outages(read, known, down_since, 100.0) == (want_down, want_back)


def test_the_tick_an_engine_comes_back_in_says_its_tokens_cover_the_outage() -> None:
    j = WindowJoiner("n", ENGINES[:1], book())
    for i, (up, gen) in enumerate([(True, 100.0), (True, 200.0), (False, 0.0), (False, 0.0), (True, 900.0)]):
        t = T0 + 5 * i
        j.add_round(rnd(t))
        tick = j.close_tick(t, {"a": scrape("a", t, ("m", 10.0, gen), up=up)})
        if i == 2:
            assert tick.down_since == {"a": T0 + 5} and tick.gap_since == {}
        if i == 3:
            assert tick.down_since == {"a": T0 + 5}
    assert tick.down_since == {} and tick.gap_since == {"a": T0 + 5}
    assert [w.usage.generation_tokens for w in tick.windows] == [700.0]  # counted since the outage began
    t = T0 + 25
    j.add_round(rnd(t))
    assert j.close_tick(t, {"a": scrape("a", t, ("m", 10.0, 950.0))}).gap_since == {}  # said once
