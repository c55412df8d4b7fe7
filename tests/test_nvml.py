"""The NVML source end to end over the fake library seam: backend values and units, faults
(NotSupported, GPU lost, no driver, driver gone), MIG, energy and GPM, and the async sampler."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import fields

import pynvml
import pytest

from agent.clock import ManualClock
from agent.config import ConfigError, NvmlConfig
from agent.samples import GpuLoad, GpuSample, NvmlRound
from agent.sources.nvml.backend import NvmlBackend, NvmlUnavailable
from agent.sources.nvml.fake import ENERGY_AT_START_MJ, PROFILES, FakeNvml, model_power_watts
from agent.sources.nvml.sampler import NvmlSampler, make_backend

GIB = 1024**3
MIB = 1024**2
HALF = GpuLoad(util_gpu_ratio=0.5, dram_bw_ratio=0.8, memory_used_bytes=40e9)
READINGS = [f.name for f in fields(GpuSample) if f.name not in {"index", "uuid", "name", "timestamp", "up"}]
READINGS.remove("mig_parent_uuid")
READINGS.remove("error")


def constant(load: GpuLoad | None) -> Callable[[int, float], GpuLoad | None]:
    return lambda _i, _t: load


def rig(
    profile: str = "H100-SXM", count: int = 1, load: GpuLoad | None = HALF, **kw: object
) -> tuple[FakeNvml, NvmlBackend, ManualClock]:
    clock = ManualClock()
    fake = FakeNvml(profile, count, constant(load), clock=clock.now, **kw)  # type: ignore[arg-type]
    backend = NvmlBackend(fake)
    backend.open()
    return fake, backend, clock


def rounds(backend: NvmlBackend, clock: ManualClock, n: int, step: float = 1.0) -> list[NvmlRound]:
    out = []
    for _ in range(n):
        out.append(backend.read_round(clock.now()))
        clock.advance(step)
    return out


# -- values and units, per profile ----------------------------------------------------------------

# Expected figures by hand: power = TDP × (0.1 + 0.9 × (0.7 × util + 0.3 × bw)); at util 0.5, bw 0.8
# that is TDP × 0.631.
PROFILE_TABLE = [
    # profile, name, memory total bytes, watts at HALF, SM Hz busy, mem Hz, GPM
    ("A100-80GB", "NVIDIA A100-SXM4-80GB", 80 * GIB, 252.4, 1410e6, 1593e6, False),
    ("H100-SXM", "NVIDIA H100 80GB HBM3", 81559 * MIB, 441.7, 1980e6, 2619e6, True),
    ("H200", "NVIDIA H200", 143771 * MIB, 441.7, 1980e6, 3201e6, True),
]


@pytest.mark.parametrize(("profile", "name", "mem_total", "watts", "sm_hz", "mem_hz", "gpm"), PROFILE_TABLE)
def test_values_and_units(
    profile: str, name: str, mem_total: float, watts: float, sm_hz: float, mem_hz: float, gpm: bool
) -> None:
    fake, backend, clock = rig(profile, count=2)
    first, second = rounds(backend, clock, 2, step=2.0)
    assert first.up and second.up and second.driver_version == "550.54.15"
    assert [g.index for g in second.gpus] == [0, 1]
    g = second.gpus[1]
    assert g.up and g.error is None and g.mig_parent_uuid is None
    assert g.name == name and g.uuid == fake.uuid_of(1) and g.uuid.startswith("GPU-")
    assert g.timestamp == first.timestamp + 2.0
    assert g.util_gpu_ratio == pytest.approx(0.5)
    assert g.util_memory_ratio == pytest.approx(0.8)
    assert g.power_watts == pytest.approx(watts, abs=1e-3)
    assert g.energy_joules is not None and first.gpus[1].energy_joules is not None
    assert first.gpus[1].energy_joules == pytest.approx(ENERGY_AT_START_MJ / 1000)
    assert g.energy_joules - first.gpus[1].energy_joules == pytest.approx(2.0 * watts, abs=1e-2)
    assert g.memory_used_bytes == 40e9
    assert g.memory_total_bytes == mem_total
    assert g.sm_clock_hz == sm_hz and g.mem_clock_hz == mem_hz
    assert g.temperature_celsius == round(30 + 45 * watts / PROFILES[profile].tdp_watts)
    # GPM needs two samples: absent in the first round, the load's ratios in the second.
    assert first.gpus[1].dram_bw_ratio is None and first.gpus[1].sm_active_ratio is None
    if gpm:
        assert g.dram_bw_ratio == pytest.approx(0.8) and g.sm_active_ratio == pytest.approx(0.5)
    else:
        assert g.dram_bw_ratio is None and g.sm_active_ratio is None


@pytest.mark.parametrize("profile", list(PROFILES))
def test_idle_gpu_draws_a_tenth_of_tdp(profile: str) -> None:
    _fake, backend, clock = rig(profile, load=None)
    g = rounds(backend, clock, 2)[1].gpus[0]
    assert g.power_watts == pytest.approx(0.1 * PROFILES[profile].tdp_watts)
    assert g.util_gpu_ratio == 0.0 and g.memory_used_bytes == 0.0
    assert g.sm_clock_hz == PROFILES[profile].idle_sm_clock_mhz * 1e6


# -- NotSupported and friends: absent, never 0 / NaN ----------------------------------------------

GPM_FIELDS = {
    "dram_bw_ratio",
    "sm_active_ratio",
    "tensor_active_ratio",
    "sm_occupancy_ratio",
    "pcie_rx_bytes_per_s",
    "pcie_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
}
NOT_SUPPORTED_TABLE = [
    ("nvmlDeviceGetPowerUsage", {"power_watts"}),
    ("nvmlDeviceGetTotalEnergyConsumption", {"energy_joules"}),
    ("nvmlDeviceGetUtilizationRates", {"util_gpu_ratio", "util_memory_ratio"}),
    ("nvmlDeviceGetMemoryInfo", {"memory_used_bytes", "memory_total_bytes"}),
    ("nvmlDeviceGetClockInfo", {"sm_clock_hz", "mem_clock_hz"}),
    ("nvmlDeviceGetTemperatureV", {"temperature_celsius"}),
    ("nvmlGpmQueryDeviceSupport", GPM_FIELDS),
    ("nvmlGpmSampleGet", GPM_FIELDS),
]


@pytest.mark.parametrize(("function", "absent"), NOT_SUPPORTED_TABLE)
def test_not_supported_is_absent_and_logged_once(
    function: str, absent: set[str], caplog: pytest.LogCaptureFixture
) -> None:
    fake, backend, clock = rig("H200", count=2)
    fake.set_not_supported(function, index=0)
    caplog.set_level(logging.DEBUG, logger="agent.sources.nvml.backend")
    last = rounds(backend, clock, 4)[-1]
    assert last.up
    broken, fine = last.gpus
    assert broken.up and fine.up
    for name in READINGS:
        value = getattr(broken, name)
        if name in absent:
            assert value is None, name
        else:
            assert value is not None and not math.isnan(value), name
        assert getattr(fine, name) is not None, name
    absent_logs = [r for r in caplog.records if "absent" in r.getMessage() or "supported" in r.getMessage()]
    assert len(absent_logs) == len({r.getMessage() for r in absent_logs}) >= 1  # once per field
    assert all(fake.uuid_of(0) in r.getMessage() for r in absent_logs)


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_TIMEOUT]
)
def test_other_field_errors_are_absent_too(code: int) -> None:
    class Denying(FakeNvml):
        def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
            raise pynvml.NVMLError(code)

    clock = ManualClock()
    backend = NvmlBackend(Denying("H100-SXM", 1, constant(HALF), clock=clock.now))
    backend.open()
    g = rounds(backend, clock, 2)[1].gpus[0]
    assert g.up and g.power_watts is None and g.energy_joules is not None


TEMPERATURE_TABLE = [
    # missing (FunctionNotFound) on this driver, temperature read?
    ((), True),
    (("nvmlDeviceGetTemperatureV",), True),  # an older driver: the legacy call answers
    (("nvmlDeviceGetTemperature",), True),  # a newer one without the deprecated call
    (("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"), False),
]


@pytest.mark.parametrize(("missing", "present"), TEMPERATURE_TABLE)
def test_versioned_temperature_call_falls_back(missing: tuple[str, ...], present: bool) -> None:
    fake, backend, clock = rig("A100-80GB", count=2)
    for function in missing:
        fake.set_not_supported(function, code=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    for r in rounds(backend, clock, 3):
        for g in r.gpus:
            assert g.up and g.power_watts is not None
            assert g.temperature_celsius == (round(30 + 45 * 0.631) if present else None)


def test_library_mismatch_error_is_absent() -> None:
    class Mismatched(FakeNvml):
        def nvmlDeviceGetMemoryInfo(self, handle: object, version: object = None) -> object:
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called")

    clock = ManualClock()
    backend = NvmlBackend(Mismatched("H100-SXM", 1, constant(HALF), clock=clock.now))
    backend.open()
    g = backend.read_round(clock.now()).gpus[0]
    assert g.up and g.memory_used_bytes is None and g.memory_total_bytes is None and g.power_watts


# -- GPU lost: that GPU down, the others carry on --------------------------------------------------

LOST_TABLE = [
    (pynvml.NVML_ERROR_GPU_IS_LOST, 0, "GpuIsLost"),
    (pynvml.NVML_ERROR_UNKNOWN, 0, "Unknown"),
    (pynvml.NVML_ERROR_GPU_IS_LOST, 5, "GpuIsLost"),  # lost in the middle of a round
]


@pytest.mark.parametrize(("code", "after_calls", "text"), LOST_TABLE)
def test_gpu_lost(code: int, after_calls: int, text: str, caplog: pytest.LogCaptureFixture) -> None:
    fake, backend, clock = rig("H100-SXM", count=4)
    rounds(backend, clock, 1)
    fake.lose_gpu(2, after_calls=after_calls, code=code)
    caplog.set_level(logging.WARNING, logger="agent.sources.nvml.backend")
    for r in rounds(backend, clock, 3):
        assert r.up and len(r.gpus) == 4
        lost = r.gpus[2]
        assert not lost.up and lost.error is not None and text in lost.error
        assert lost.uuid == fake.uuid_of(2) and lost.name == "NVIDIA H100 80GB HBM3"
        assert all(getattr(lost, n) is None for n in READINGS)
        for g in (r.gpus[0], r.gpus[1], r.gpus[3]):
            assert g.up and g.power_watts == pytest.approx(441.7) and g.dram_bw_ratio == pytest.approx(0.8)
    down_logs = [r for r in caplog.records if "is down" in r.getMessage()]
    assert len(down_logs) == 1 and fake.uuid_of(2) in down_logs[0].getMessage()

    fake.restore_gpu(2)
    back = rounds(backend, clock, 2)
    assert back[0].gpus[2].up and back[0].gpus[2].power_watts == pytest.approx(441.7)
    assert back[1].gpus[2].dram_bw_ratio == pytest.approx(0.8)  # GPM restarts from a fresh sample
    assert len([r for r in caplog.records if "readable again" in r.getMessage()]) == 1


def test_gpu_lost_before_first_read_still_reports_a_down_sample() -> None:
    fake, backend, clock = rig("A100-80GB", count=2)
    fake.lose_gpu(0)
    r = backend.read_round(clock.now())
    assert r.up and not r.gpus[0].up and r.gpus[0].uuid and r.gpus[1].up


# -- no driver, driver gone, lifecycle -------------------------------------------------------------


@pytest.mark.parametrize(
    ("driver", "text"), [("missing", "LibraryNotFound"), ("not_loaded", "DriverNotLoaded")]
)
def test_no_driver_is_a_clean_unavailability(driver: str, text: str) -> None:
    fake = FakeNvml("H100-SXM", 8, driver=driver)  # type: ignore[arg-type]
    backend = NvmlBackend(fake)
    with pytest.raises(NvmlUnavailable) as info:
        backend.open()
    assert text in info.value.reason
    r = backend.read_round(123.0)
    assert r == NvmlRound(timestamp=123.0, up=False, error=r.error) and r.error and text in r.error
    backend.close()  # nothing was opened: no shutdown
    assert fake.shutdown_calls == 0


def test_driver_gone_mid_run_then_back() -> None:
    fake, backend, clock = rig("H200", count=2)
    assert rounds(backend, clock, 2)[-1].up
    fake.unload_driver()
    gone = rounds(backend, clock, 2)
    assert all(not r.up and r.gpus == () and r.error and "DriverNotLoaded" in r.error for r in gone)
    fake.load_driver()
    back = rounds(backend, clock, 2)
    assert all(r.up and len(r.gpus) == 2 for r in back)
    assert back[1].gpus[0].dram_bw_ratio == pytest.approx(0.8)
    assert fake.init_calls == 2  # re-initialised once
    backend.close()
    backend.close()
    assert not fake.initialised and fake.shutdown_calls == 2 and fake.live_gpm_samples == 0


def test_fake_behaves_like_the_library() -> None:
    fake = FakeNvml("H100-SXM", 2)
    with pytest.raises(pynvml.NVMLError_Uninitialized) as info:
        fake.nvmlDeviceGetCount()
    assert info.value.value == pynvml.NVML_ERROR_UNINITIALIZED
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlShutdown()
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == 2
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        fake.nvmlDeviceGetNvLinkState(fake.nvmlDeviceGetHandleByIndex(0), 0)
    assert fake.NVML_GPM_METRIC_DRAM_BW_UTIL == pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL == 10
    assert fake.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    h = fake.nvmlDeviceGetHandleByIndex(1)
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetUUID(h)


# -- MIG -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("profile", "instances"), [("H100-SXM", 3), ("A100-80GB", 7), ("H200", 1)])
def test_mig_instances(profile: str, instances: int) -> None:
    fake, backend, clock = rig(profile, count=2, mig_instances=instances)
    r = rounds(backend, clock, 2)[1]
    assert r.up and len(r.gpus) == 2 * (1 + instances)
    total = PROFILES[profile].memory_total_bytes
    for index in (0, 1):
        parent, *migs = [g for g in r.gpus if g.index == index]
        assert parent.uuid == fake.uuid_of(index) and parent.mig_parent_uuid is None
        assert parent.util_gpu_ratio is None  # not supported in MIG mode
        assert parent.power_watts == pytest.approx(model_power_watts(PROFILES[profile], HALF))
        assert [m.uuid for m in migs] == [fake.mig_uuid_of(index, s) for s in range(instances)]
        for m in migs:
            assert m.up and m.uuid.startswith("MIG-") and m.mig_parent_uuid == parent.uuid
            assert m.name.startswith(PROFILES[profile].name + " MIG ")
            assert m.util_gpu_ratio is None and m.power_watts is None and m.energy_joules is None
            assert m.memory_total_bytes == total // instances
            assert m.memory_used_bytes == pytest.approx(min(40e9 // instances, total // instances))
            if PROFILES[profile].gpm:
                assert m.dram_bw_ratio == pytest.approx(0.8)
            else:
                assert m.dram_bw_ratio is None


# -- energy and GPM over a changing load -----------------------------------------------------------


def wave(index: int, t: float) -> GpuLoad:
    """A load that changes every second, differently per GPU."""
    phase = (t + 3 * index) % 10 / 10
    return GpuLoad(util_gpu_ratio=phase, dram_bw_ratio=1 - phase, memory_used_bytes=1e9 * (1 + phase))


def test_energy_is_monotonic_and_integrates_power() -> None:
    clock = ManualClock()
    fake = FakeNvml("H200", 3, wave, clock=clock.now)
    backend = NvmlBackend(fake)
    backend.open()
    steps = [0.5, 1.0, 1.5, 2.0, 0.25] * 8
    prev = backend.read_round(clock.now())
    for dt in steps:
        clock.advance(dt)
        cur = backend.read_round(clock.now())
        for a, b in zip(prev.gpus, cur.gpus, strict=True):
            assert a.energy_joules is not None and b.energy_joules is not None and b.power_watts is not None
            assert b.energy_joules >= a.energy_joules
            # The fake holds each round's load over the step before it: ΔE = P × Δt (mJ rounding).
            assert b.energy_joules - a.energy_joules == pytest.approx(b.power_watts * dt, abs=2e-3)
        prev = cur


def test_gpm_ratios_follow_the_load_and_samples_are_freed() -> None:
    clock = ManualClock()
    fake = FakeNvml("H100-SXM", 2, wave, clock=clock.now)
    backend = NvmlBackend(fake)
    backend.open()
    for _ in range(12):
        clock.advance(1.0)
        r = backend.read_round(clock.now())
        for g in r.gpus:
            expected = wave(g.index, clock.now())
            if g.dram_bw_ratio is not None:
                assert g.dram_bw_ratio == pytest.approx(expected.dram_bw_ratio)
                assert g.sm_active_ratio == pytest.approx(expected.util_gpu_ratio)
                assert 0.0 <= g.dram_bw_ratio <= 1.0
        assert fake.live_gpm_samples == 2  # one kept per GPU, the older one freed
    assert all(g.dram_bw_ratio is not None for g in r.gpus)
    backend.close()
    assert fake.live_gpm_samples == 0 and not fake.initialised


# -- the async sampler -----------------------------------------------------------------------------


async def test_sampler_runs_rounds_in_a_thread() -> None:
    entered = threading.Event()
    release = threading.Event()
    seen_threads: set[int] = set()

    def blocking_load(_i: int, _t: float) -> GpuLoad:
        seen_threads.add(threading.get_ident())
        entered.set()
        release.wait(timeout=5)
        return HALF

    clock = ManualClock()
    sampler = NvmlSampler(NvmlBackend(FakeNvml("H200", 1, blocking_load, clock=clock.now)), clock)
    assert await sampler.start() == "550.54.15"
    task = asyncio.create_task(sampler.sample())
    loop_turns = 0
    while not entered.is_set():  # the loop keeps turning while NVML is blocked in its thread
        loop_turns += 1
        await asyncio.sleep(0.005)
    release.set()
    r = await task
    assert r.up and r.gpus[0].power_watts == pytest.approx(441.7)
    assert loop_turns >= 1 and threading.get_ident() not in seen_threads
    await sampler.close()


async def test_sampler_never_raises() -> None:
    def broken(_i: int, _t: float) -> GpuLoad:
        raise RuntimeError("simulator exploded")

    clock = ManualClock()
    sampler = NvmlSampler(NvmlBackend(FakeNvml("H100-SXM", 2, broken, clock=clock.now)), clock)
    await sampler.start()
    r = await sampler.sample()
    assert r == NvmlRound(timestamp=clock.now(), up=False, error="RuntimeError: simulator exploded")


async def test_sampler_without_driver_reports_down_then_recovers() -> None:
    clock = ManualClock()
    fake = FakeNvml("H100-SXM", 2, constant(HALF), clock=clock.now, driver="not_loaded")
    sampler = NvmlSampler(NvmlBackend(fake), clock)
    assert await sampler.start() is None and sampler.driver_version is None
    r = await sampler.sample()
    assert not r.up and r.error and "DriverNotLoaded" in r.error
    fake.load_driver()
    clock.advance(1)
    r = await sampler.sample()
    assert r.up and len(r.gpus) == 2 and sampler.driver_version == "550.54.15"
    await sampler.close()
    await sampler.close()
    assert fake.shutdown_calls == 1 and not fake.initialised
    assert not (await sampler.sample()).up


# -- make_backend ----------------------------------------------------------------------------------


def test_make_backend_none_and_fake() -> None:
    assert make_backend(NvmlConfig(backend="none")) is None
    clock = ManualClock()
    cfg = NvmlConfig(backend="fake", fake_profile="H200", fake_count=3)
    backend = make_backend(cfg, constant(HALF), clock)
    assert backend is not None
    backend.open()
    r = backend.read_round(clock.now())
    assert [g.name for g in r.gpus] == ["NVIDIA H200"] * 3 and r.gpus[0].util_gpu_ratio == pytest.approx(0.5)
    backend.close()
    with pytest.raises(ConfigError, match="fake_profile"):
        make_backend(NvmlConfig(backend="fake", fake_profile="B200"))


def test_make_backend_auto_and_real_on_this_machine(caplog: pytest.LogCaptureFixture) -> None:
    """Uses the real pynvml: on a node without a driver, auto gives None and one clear line."""
    caplog.set_level(logging.INFO, logger="agent.sources.nvml.sampler")
    backend = make_backend(NvmlConfig(backend="auto"))
    if backend is None:
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and lines[0].startswith("no NVIDIA driver found: ")
        with pytest.raises(NvmlUnavailable):
            make_backend(NvmlConfig(backend="real"))
    else:  # a GPU node: the real library answered
        try:
            assert backend.driver_version
            r = backend.read_round(0.0)
            assert r.up and all(g.name for g in r.gpus)
        finally:
            backend.close()


def test_clock_event_reasons_power_cap_thermal_slowdown_and_absent() -> None:
    full = GpuLoad(util_gpu_ratio=1.0, dram_bw_ratio=1.0, memory_used_bytes=40e9)
    loads = {0: full, 1: HALF, 2: None}
    clock = ManualClock()
    fake = FakeNvml("H100-SXM", 4, lambda i, _t: loads.get(i, HALF), clock=clock.now)
    fake.set_clock_event_reasons(1, pynvml.nvmlClocksEventReasonHwThermalSlowdown)
    fake.set_not_supported("nvmlDeviceGetCurrentClocksEventReasons", 3)
    backend = NvmlBackend(fake)
    backend.open()
    g = {s.index: s for s in backend.read_round(clock.now()).gpus}
    # GPU 0 draws its whole 700 W limit: the power cap holds its clocks
    assert g[0].clock_event_reasons == 0x4 and g[0].power_capped == 1.0 and g[0].throttled == 1.0
    assert (g[1].clock_event_reasons, g[1].thermal_throttled, g[1].power_capped) == (0x40, 1.0, 0.0)
    # an idle GPU reports GpuIdle, which is not throttling
    assert g[2].clock_event_reasons == 0x1 and g[2].throttled == 0.0 and g[2].hw_slowdown == 0.0
    assert g[3].clock_event_reasons is None and g[3].throttled is None  # NotSupported: absent


def test_clock_event_reasons_fall_back_to_the_throttle_reasons_call() -> None:
    class OldDriver(FakeNvml):
        def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:
            return 0x8  # HwSlowdown, under its pre-535 name

    fake = OldDriver("H100-SXM", 1, constant(HALF), clock=ManualClock().now)
    fake.set_not_supported(
        "nvmlDeviceGetCurrentClocksEventReasons", code=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    )
    backend = NvmlBackend(fake)
    backend.open()
    (s,) = backend.read_round(0.0).gpus
    assert s.clock_event_reasons == 0x8 and s.hw_slowdown == 1.0
