"""The window join: attribution of GPU cost to engines and models, hand-computed."""

from __future__ import annotations

import pytest

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
        ("vllm", 119.0, 952.0, 16.0),  # a daemon tick: the gauge as read
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
