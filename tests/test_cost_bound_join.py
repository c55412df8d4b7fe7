"""Where GPU time goes, end to end: the fake NVML's GPM model (hand-checked), the backend reading
it, the window join splitting each model version's GPU-seconds and dollars, the ledger and the
Prometheus exposition. Absent, not guessed, where GPM cannot say (pre-Hopper, MIG, NotSupported,
a GPU not in the hardware table).

An H200 at $3.60 per GPU-hour ($0.001 per second); ticks of 10 s ($0.01 per GPU per tick). Its
host link peak is 64 GB/s per direction and its NVLink 450 GB/s (agent/hardware.py).
"""

from __future__ import annotations

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.clock import ManualClock
from agent.cost.inputs import EngineSpec, GpuRate, PriceTable
from agent.cost.window import TickResult, WindowJoiner
from agent.samples import EngineScrape, GpuLoad, GpuSample, ModelSignals, NvmlRound
from agent.sinks.prometheus import render
from agent.snapshot import Ledger
from agent.sources.nvml.backend import NvmlBackend
from agent.sources.nvml.fake import FakeNvml

T0 = 1_780_000_000.0
H200 = "NVIDIA H200"
BOOK = PriceTable(gpus=(GpuRate("H200", 3.6), GpuRate("A100", 1.8), GpuRate("GH200", 3.0)))
# util 0.8, DRAM 0.5, tensor 0.3, PCIe rx 12.8 GB/s (0.2 of 64 GB/s), NVLink idle
LOAD = GpuLoad(0.8, 0.5, 10e9, tensor_active_ratio=0.3, pcie_rx_bytes_per_s=12.8e9, pcie_tx_bytes_per_s=6.4e9)
# busy 0.8 split 0.3 : 0.5 : 0.2 (sum 1.0), idle 0.2
SHARES = {"compute": 0.24, "memory": 0.40, "communication": 0.16, "idle": 0.20}


def rig(
    profile: str = "H200", load: GpuLoad | None = LOAD, **kw: object
) -> tuple[FakeNvml, NvmlBackend, ManualClock]:
    clock = ManualClock(T0)
    fake = FakeNvml(profile, 1, lambda _i, _t: load, clock=clock.now, **kw)  # type: ignore[arg-type]
    backend = NvmlBackend(fake)
    backend.open()
    return fake, backend, clock


# -- the fake's GPM model, read through the backend ------------------------------------------------


def test_the_fake_gpm_model_read_by_the_backend() -> None:
    _fake, backend, clock = rig()
    first = backend.read_round(clock.now()).gpus[0]
    clock.advance(10.0)
    g = backend.read_round(clock.now()).gpus[0]
    # one sample is no interval: every GPM figure is absent, never 0
    assert first.tensor_active_ratio is None and first.pcie_rx_bytes_per_s is None
    assert g.sm_active_ratio == pytest.approx(0.8)
    assert g.dram_bw_ratio == pytest.approx(0.5)
    assert g.tensor_active_ratio == pytest.approx(0.3)
    assert g.sm_occupancy_ratio == pytest.approx(0.4)  # 0.5 × 0.8
    assert g.pcie_rx_bytes_per_s == pytest.approx(12.8e9)  # through MiB/s and back
    assert g.pcie_tx_bytes_per_s == pytest.approx(6.4e9)
    assert g.nvlink_rx_bytes_per_s == 0.0 and g.nvlink_tx_bytes_per_s == 0.0


def test_without_a_tensor_figure_the_fake_models_it_from_util_and_dram() -> None:
    # tensor = util × (1 − dram) = 0.5 × (1 − 0.8) = 0.1
    _fake, backend, clock = rig(load=GpuLoad(0.5, 0.8, 1e9))
    backend.read_round(clock.now())
    clock.advance(5.0)
    g = backend.read_round(clock.now()).gpus[0]
    assert g.tensor_active_ratio == pytest.approx(0.1)
    assert g.sm_occupancy_ratio == pytest.approx(0.25)


def test_a_changing_load_is_time_averaged() -> None:
    # 4 s busy (tensor 0.5, PCIe rx 10 GB/s, NVLink tx 9 GB/s), then 6 s idle, between two GPM
    # samples: tensor 0.5 × 0.4 = 0.2, PCIe 10 × 0.4 = 4 GB/s, NVLink 9 × 0.4 = 3.6 GB/s
    clock = ManualClock(T0)
    busy = GpuLoad(
        1.0, 0.0, 1e9, tensor_active_ratio=0.5, pcie_rx_bytes_per_s=10e9, nvlink_tx_bytes_per_s=9e9
    )
    fake = FakeNvml("H100-SXM", 1, lambda _i, t: busy if t <= T0 + 4 else None, clock=clock.now)
    backend = NvmlBackend(fake)
    backend.read_round(clock.now())
    clock.advance(4.0)
    # the fake holds each load over the step that ends at a call: any NVML call at the switch
    fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(0))
    clock.advance(6.0)
    g = backend.read_round(clock.now()).gpus[0]
    assert g.tensor_active_ratio == pytest.approx(0.2)
    assert g.sm_active_ratio == pytest.approx(0.4)
    assert g.pcie_rx_bytes_per_s == pytest.approx(4e9)
    assert g.nvlink_tx_bytes_per_s == pytest.approx(3.6e9)
    assert g.pcie_tx_bytes_per_s == 0.0


def test_pre_hopper_has_no_gpm_figures_at_all() -> None:
    _fake, backend, clock = rig("A100-80GB")
    backend.read_round(clock.now())
    clock.advance(10.0)
    g = backend.read_round(clock.now()).gpus[0]
    assert g.util_gpu_ratio == pytest.approx(0.8)  # NVML itself answers
    for f in ("sm_active_ratio", "tensor_active_ratio", "sm_occupancy_ratio", "pcie_rx_bytes_per_s"):
        assert getattr(g, f) is None, f


def test_a_mig_instance_has_activity_but_no_link_throughput() -> None:
    _fake, backend, clock = rig(mig_instances=2)
    backend.read_round(clock.now())
    clock.advance(10.0)
    parent, mig0, _mig1 = backend.read_round(clock.now()).gpus
    assert mig0.mig_parent_uuid == parent.uuid
    assert mig0.tensor_active_ratio == pytest.approx(0.3)
    assert mig0.pcie_rx_bytes_per_s is None and mig0.nvlink_tx_bytes_per_s is None
    assert parent.pcie_rx_bytes_per_s == pytest.approx(12.8e9)


def test_a_not_supported_gpm_metric_is_absent_and_so_is_the_split() -> None:
    fake, backend, clock = rig()
    fake.set_gpm_metric_not_supported(pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC)
    fake.set_gpm_metric_not_supported(pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC)
    j = WindowJoiner("n", [EngineSpec("e", gpus=(0,))], BOOK)
    res = fake_ticks(j, backend, clock, (("m", 0.0, 500.0),))
    g = res.gpus[0].sample
    assert g.nvlink_rx_bytes_per_s is None and g.nvlink_tx_bytes_per_s is None
    assert g.tensor_active_ratio == pytest.approx(0.3)  # the others still answer
    (w,) = res.windows
    assert w.bound_usd is None  # an H200 has NVLink: not measured is not "no traffic"


# -- the join ---------------------------------------------------------------------------------------


def sig(model: str, gen: float) -> ModelSignals:
    return ModelSignals(model, prompt_tokens_total=0.0, generation_tokens_total=gen)


def scrape(t: float, *models: ModelSignals, engine: str = "e") -> EngineScrape:
    return EngineScrape(engine, "vllm", t, True, 0.01, models)


def fake_ticks(
    j: WindowJoiner, backend: NvmlBackend, clock: ManualClock, models: tuple[tuple[str, float, float], ...]
) -> TickResult:
    """Two ticks 10 s apart: NVML read at each tick's close; ``models``: (name, tokens then, now)."""
    j.add_round(backend.read_round(clock.now()))
    j.close_tick(clock.now(), {"e": scrape(clock.now(), *(sig(m, a) for m, a, _ in models))})
    clock.advance(10.0)
    j.add_round(backend.read_round(clock.now()))
    return j.close_tick(clock.now(), {"e": scrape(clock.now(), *(sig(m, b) for m, _, b in models))})


def test_the_join_splits_a_models_seconds_and_dollars_from_the_fake() -> None:
    _fake, backend, clock = rig()
    j = WindowJoiner("n", [EngineSpec("e", gpus=(0,))], BOOK)
    (w,) = fake_ticks(j, backend, clock, (("m", 0.0, 500.0),)).windows
    assert w.bound_gpu_seconds == pytest.approx({b: 10.0 * s for b, s in SHARES.items()})
    assert w.bound_usd == pytest.approx({b: 0.01 * s for b, s in SHARES.items()})
    assert sum(w.bound_usd.values()) == pytest.approx(w.cost_usd)  # type: ignore[union-attr]


def test_two_models_on_one_gpu_split_by_their_token_share() -> None:
    _fake, backend, clock = rig()
    j = WindowJoiner("n", [EngineSpec("e", gpus=(0,))], BOOK)
    res = fake_ticks(j, backend, clock, (("a", 0.0, 300.0), ("b", 0.0, 100.0)))
    a, b = sorted(res.windows, key=lambda w: w.usage.model)
    # a: 3/4 of 10 s = 7.5 GPU-s; b: 2.5 GPU-s; each split by the GPU's shares
    assert a.bound_gpu_seconds == pytest.approx({k: 7.5 * s for k, s in SHARES.items()})
    assert b.bound_usd == pytest.approx({k: 0.0025 * s for k, s in SHARES.items()})


def gpm_sample(i: int, t: float, name: str = H200, **kw: float | None) -> GpuSample:
    base: dict[str, float | None] = {
        "sm_active_ratio": 0.6,
        "tensor_active_ratio": 0.2,
        "dram_bw_ratio": 0.6,
        "pcie_rx_bytes_per_s": 0.0,
        "pcie_tx_bytes_per_s": 0.0,
        "nvlink_rx_bytes_per_s": 0.0,
        "nvlink_tx_bytes_per_s": 0.0,
    }
    return GpuSample(i, f"GPU-{i}", name, t, util_gpu_ratio=0.6, **{**base, **kw})  # type: ignore[arg-type]


def sample_ticks(j: WindowJoiner, first: list[GpuSample], second: list[list[GpuSample]]) -> TickResult:
    """Tick 1 closes at T0 on ``first``; tick 2 at T0 + 10 on several rounds (``second``)."""
    j.add_round(NvmlRound(T0, True, tuple(first)))
    j.close_tick(T0, {"e": scrape(T0, sig("m", 0.0))})
    for k, gpus in enumerate(second, start=1):
        j.add_round(NvmlRound(T0 + 10.0 * k / len(second), True, tuple(gpus)))
    return j.close_tick(T0 + 10.0, {"e": scrape(T0 + 10.0, sig("m", 100.0))})


def test_the_tick_uses_the_mean_of_its_rounds_and_sums_over_gpus() -> None:
    j = WindowJoiner("n", [EngineSpec("e", gpus=(0, 1))], BOOK)
    # GPU 0: two rounds, SM 0.4 and 0.8 (mean 0.6), tensor 0.1 and 0.3 (0.2), DRAM 0.6 → busy 0.6
    # split 0.2 : 0.6 → compute 0.15, memory 0.45, idle 0.4. GPU 1: NVLink tx 180 GB/s = 0.4 of
    # 450 GB/s with SM 1.0, tensor 0.2, DRAM 0.4 → compute 0.2, memory 0.4, communication 0.4.
    g0a = gpm_sample(0, T0 + 5, sm_active_ratio=0.4, tensor_active_ratio=0.1)
    g0b = gpm_sample(0, T0 + 10, sm_active_ratio=0.8, tensor_active_ratio=0.3)
    g1 = gpm_sample(1, T0 + 10, sm_active_ratio=1.0, dram_bw_ratio=0.4, nvlink_tx_bytes_per_s=180e9)
    res = sample_ticks(j, [gpm_sample(0, T0), gpm_sample(1, T0)], [[g0a, g1], [g0b, g1]])
    (w,) = res.windows
    assert w.bound_gpu_seconds == pytest.approx(
        {"compute": 1.5 + 2.0, "memory": 4.5 + 4.0, "communication": 0.0 + 4.0, "idle": 4.0 + 0.0}
    )
    assert w.bound_usd == pytest.approx(
        {"compute": 0.0035, "memory": 0.0085, "communication": 0.004, "idle": 0.004}
    )


def test_the_busier_direction_of_each_link_is_what_counts() -> None:
    # both GPUs: SM 1.0, tensor 0.25, DRAM 0.25; GPU 0 transmits 32 GB/s over PCIe (0.5 of 64),
    # GPU 1 receives 225 GB/s over NVLink (0.5 of 450): each 0.25 : 0.25 : 0.5 of its 10 s
    kw = {"sm_active_ratio": 1.0, "tensor_active_ratio": 0.25, "dram_bw_ratio": 0.25}
    g0 = gpm_sample(0, T0 + 10, pcie_rx_bytes_per_s=1e9, pcie_tx_bytes_per_s=32e9, **kw)
    g1 = gpm_sample(1, T0 + 10, nvlink_rx_bytes_per_s=225e9, nvlink_tx_bytes_per_s=1e9, **kw)
    j = WindowJoiner("n", [EngineSpec("e", gpus=(0, 1))], BOOK)
    (w,) = sample_ticks(j, [gpm_sample(0, T0), gpm_sample(1, T0)], [[g0, g1]]).windows
    assert w.bound_gpu_seconds == pytest.approx(
        {"compute": 5.0, "memory": 5.0, "communication": 10.0, "idle": 0.0}
    )


@pytest.mark.parametrize(
    ("gpu1", "why"),
    [
        (GpuSample(1, "GPU-1", "NVIDIA A100-SXM4-80GB", T0 + 10, util_gpu_ratio=0.6), "pre-Hopper: no GPM"),
        (gpm_sample(1, T0 + 10, tensor_active_ratio=None), "a GPM metric NotSupported"),
        (gpm_sample(1, T0 + 10, nvlink_rx_bytes_per_s=None, nvlink_tx_bytes_per_s=None), "NVLink not read"),
        (gpm_sample(1, T0 + 10, name="NVIDIA GH200 480GB"), "not in the hardware table"),
    ],
)
def test_one_unmeasured_gpu_makes_the_models_split_absent(gpu1: GpuSample, why: str) -> None:
    j = WindowJoiner("n", [EngineSpec("e", gpus=(0, 1))], BOOK)
    res = sample_ticks(j, [gpm_sample(0, T0), gpu1], [[gpm_sample(0, T0 + 10), gpu1]])
    (w,) = res.windows
    assert w.bound_gpu_seconds is None and w.bound_usd is None, why
    assert w.cost_usd > 0  # the window is still priced


def test_a_mig_instance_has_no_split_and_a_gpu_not_read_this_tick_neither() -> None:
    parent = gpm_sample(0, T0)
    mig = GpuSample(
        0,
        "MIG-a",
        "NVIDIA H200 MIG 3g.71gb",
        T0,
        mig_parent_uuid="GPU-0",
        sm_active_ratio=0.5,
        tensor_active_ratio=0.5,
        dram_bw_ratio=0.5,
        pcie_rx_bytes_per_s=0.0,
        nvlink_rx_bytes_per_s=0.0,
    )
    j = WindowJoiner("n", [EngineSpec("e", gpus=("MIG-a",))], BOOK)
    res = sample_ticks(j, [parent, mig], [[parent, mig]])
    (w,) = res.windows
    assert w.cost_usd == pytest.approx(0.01 * 3 / 7)
    assert w.bound_gpu_seconds is None
    # a GPU missing from this tick's rounds: charged (estimated), no split
    j = WindowJoiner("n", [EngineSpec("e", gpus=(0,))], BOOK)
    res = sample_ticks(j, [gpm_sample(0, T0)], [[]])
    (w,) = res.windows
    assert w.estimated and w.bound_usd is None


def test_an_engine_without_gpus_has_no_split() -> None:
    j = WindowJoiner("n", [EngineSpec("e")], PriceTable(engines={"e": 3.6}))
    res = sample_ticks(j, [], [[]])
    (w,) = res.windows
    assert w.cost_usd == pytest.approx(0.01) and w.bound_usd is None


# -- ledger and exposition -------------------------------------------------------------------------


def test_the_ledger_adds_bounds_and_prometheus_shows_one_series_per_bound() -> None:
    _fake, backend, clock = rig()
    j = WindowJoiner("n", [EngineSpec("e", gpus=(0,), model_version="v1")], BOOK)
    ledger = Ledger("n", "test")
    ledger.apply(fake_ticks(j, backend, clock, (("m", 0.0, 500.0),)))
    clock.advance(10.0)
    j.add_round(backend.read_round(clock.now()))
    ledger.apply(j.close_tick(clock.now(), {"e": scrape(clock.now(), sig("m", 900.0))}))
    (m,) = ledger.snapshot().models
    assert m.bound_gpu_seconds_total == pytest.approx({b: 20.0 * s for b, s in SHARES.items()})
    assert m.bound_cost_usd_total == pytest.approx({b: 0.02 * s for b, s in SHARES.items()})
    text = render(ledger.snapshot(), process=False).decode()
    got = {
        (sample.name, sample.labels.get("bound"), sample.labels.get("model_version")): sample.value
        for fam in text_string_to_metric_families(text)
        for sample in fam.samples
        if fam.name
        in (
            "infercost_cost_bound_usd",
            "infercost_gpu_time_bound_seconds",
            "infercost_gpu_tensor_active_ratio",
        )
    }
    for bound, share in SHARES.items():
        assert got["infercost_cost_bound_usd_total", bound, "v1"] == pytest.approx(0.02 * share)
        assert got["infercost_gpu_time_bound_seconds_total", bound, "v1"] == pytest.approx(20.0 * share)
    assert got["infercost_gpu_tensor_active_ratio", None, None] == pytest.approx(0.3)
    assert len(got) == 9


def test_a_model_never_measured_exports_no_bound_series() -> None:
    _fake, backend, clock = rig("A100-80GB")
    j = WindowJoiner("n", [EngineSpec("e", gpus=(0,))], BOOK)
    ledger = Ledger("n", "test")
    ledger.apply(fake_ticks(j, backend, clock, (("m", 0.0, 500.0),)))
    text = render(ledger.snapshot(), process=False).decode()
    assert "infercost_cost_usd_total{" in text
    assert "infercost_cost_bound_usd_total{" not in text
    assert "infercost_gpu_time_bound_seconds_total{" not in text
