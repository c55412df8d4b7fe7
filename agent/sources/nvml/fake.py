"""A fake ``pynvml`` module for machines without a GPU: the only fake in the agent's tests.

:class:`FakeNvml` exposes the functions the backend calls, with pynvml's own constants, ctypes
structures (``c_nvmlUtilization_t``, ``c_nvmlMemory_t``, ``c_nvmlGpmMetricsGet_t``, ...) and
``NVMLError_*`` classes (same ``.value`` codes), so :class:`~agent.sources.nvml.backend.NvmlBackend`
runs exactly the code path it runs on a real node. Anything not implemented here that looks
like an NVML function raises ``NVMLError_FunctionNotFound`` (as an old driver would); constants
and classes are the real pynvml ones.

Like the real library: calls before ``nvmlInit`` (or after the last ``nvmlShutdown``) raise
``NVMLError_Uninitialized``; ``nvmlInit``/``nvmlShutdown`` are reference counted; handles are
opaque; GPM samples are ctypes pointers allocated and freed explicitly.

Load: ``load(index, t)`` gives each GPU's :class:`~agent.samples.GpuLoad` at time ``t`` (seconds of
the injected ``clock``); ``None`` means idle. Power follows a simple model (``IDLE_POWER_FRACTION``
of TDP at rest, TDP at full load), the energy counter integrates that power over time, and GPM
ratios are the time-average of the load between two samples.

GPM model (what a test can check by hand): between two samples each metric is the time-average
of the load — SM_UTIL = ``util_gpu_ratio``; DRAM_BW_UTIL = ``dram_bw_ratio``; ANY_TENSOR_UTIL =
``tensor_active_ratio``, or where the load gives none ``util × (1 − dram)`` (the SM time not spent
on memory traffic ran on the tensor cores); SM_OCCUPANCY = ``OCCUPANCY_PER_ACTIVE × util``;
PCIE_RX/TX_PER_SEC and NVLINK_TOTAL_RX/TX_PER_SEC = the load's bytes/s in MiB/s (whole GPUs only:
NotSupported on a MIG instance's sample, as they are per board).

Faults: :meth:`FakeNvml.set_not_supported` (per device, per function), :meth:`FakeNvml.lose_gpu` /
:meth:`FakeNvml.restore_gpu`, ``driver="missing" | "not_loaded"`` and
:meth:`FakeNvml.unload_driver` / :meth:`FakeNvml.load_driver`, and MIG with ``mig_instances``.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

from agent.samples import GpuLoad
from agent.sources.nvml.backend import real_library

logger = logging.getLogger(__name__)

_nv: Any = real_library()  # constants, structs and error classes come from the real pynvml

P = ParamSpec("P")
R = TypeVar("R")

GIB = 1024**3  # bytes
MIB = 1024**2  # bytes
IDLE_POWER_FRACTION = 0.1  # why: a datacenter GPU at rest draws roughly 10 % of its TDP
UTIL_POWER_WEIGHT = 0.7  # why: SM activity dominates board power; DRAM traffic adds the rest
BW_POWER_WEIGHT = 0.3
IDLE_UTIL = 0.01  # 0–1; below this the SM clock drops to its idle value
AMBIENT_CELSIUS = 30.0  # degrees Celsius at rest
HOT_CELSIUS = 45.0  # degrees Celsius added at full TDP
ENERGY_AT_START_MJ = 1_000_000_000.0  # millijoules; the counter counts from driver load, not 0
DRIVER_VERSION = "550.54.15"
OCCUPANCY_PER_ACTIVE = 0.5  # why: LLM kernels keep about half the warps resident while SMs are active
# (the real H200 capture: a copy kernel 0.81 at 0.995 active, a GEMM 0.12 at 0.82)


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    """What one kind of GPU looks like to NVML."""

    name: str  # as nvmlDeviceGetName reports it
    memory_total_bytes: int  # bytes
    tdp_watts: float  # watts (power management limit)
    gpm: bool  # GPM metrics supported (Hopper and newer)
    max_sm_clock_mhz: int  # megahertz under load
    idle_sm_clock_mhz: int  # megahertz at rest
    mem_clock_mhz: int  # megahertz
    max_mig_devices: int = 7  # MIG slots (A100/H100/H200: seven 1g instances)


PROFILES: Mapping[str, DeviceProfile] = {
    "A100-80GB": DeviceProfile(
        name="NVIDIA A100-SXM4-80GB",
        memory_total_bytes=80 * GIB,
        tdp_watts=400.0,
        gpm=False,
        max_sm_clock_mhz=1410,
        idle_sm_clock_mhz=210,
        mem_clock_mhz=1593,
    ),
    "H100-SXM": DeviceProfile(
        name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=81559 * MIB,
        tdp_watts=700.0,
        gpm=True,
        max_sm_clock_mhz=1980,
        idle_sm_clock_mhz=345,
        mem_clock_mhz=2619,
    ),
    "H200": DeviceProfile(
        name="NVIDIA H200",
        memory_total_bytes=143771 * MIB,  # "141 GB" as nvidia-smi shows it
        tdp_watts=700.0,
        gpm=True,
        max_sm_clock_mhz=1980,
        idle_sm_clock_mhz=345,
        mem_clock_mhz=3201,
    ),
}

IDLE = GpuLoad(util_gpu_ratio=0.0, dram_bw_ratio=0.0, memory_used_bytes=0.0)


def model_power_watts(profile: DeviceProfile, load: GpuLoad) -> float:
    """Board power (watts) of the fake GPU under ``load``: idle fraction of TDP up to TDP."""
    activity = min(1.0, UTIL_POWER_WEIGHT * load.util_gpu_ratio + BW_POWER_WEIGHT * load.dram_bw_ratio)
    return profile.tdp_watts * (IDLE_POWER_FRACTION + (1.0 - IDLE_POWER_FRACTION) * max(0.0, activity))


def model_tensor_ratio(load: GpuLoad) -> float:
    """Tensor-core activity (0–1) of the fake GPU under ``load``: the load's own figure, else the
    SM time not spent on DRAM traffic, ``util × (1 − dram)``."""
    if load.tensor_active_ratio is not None:
        return load.tensor_active_ratio
    return load.util_gpu_ratio * (1.0 - load.dram_bw_ratio)


@dataclass(frozen=True, slots=True)
class _Handle:
    """An opaque device handle: a GPU (``mig_slot`` None) or one of its MIG instances."""

    index: int
    mig_slot: int | None = None


@dataclass(slots=True)
class _Device:
    index: int
    uuid: str
    profile: DeviceProfile
    mig_instances: int = 0
    t: float | None = None  # seconds; last time the integrals were advanced to
    load: GpuLoad = IDLE
    energy_mj: float = ENERGY_AT_START_MJ  # millijoules
    dram_busy_s: float = 0.0  # seconds × ratio, integral of the DRAM bandwidth ratio
    sm_busy_s: float = 0.0  # seconds × ratio, integral of the SM activity ratio
    tensor_busy_s: float = 0.0  # seconds × ratio, integral of the tensor-core activity ratio
    pcie_rx_bytes: float = 0.0  # bytes received over PCIe since the fake started
    pcie_tx_bytes: float = 0.0  # bytes
    nvlink_rx_bytes: float = 0.0  # bytes
    nvlink_tx_bytes: float = 0.0  # bytes
    calls: int = 0  # NVML calls that touched this device
    lost_after: int | None = None  # calls left before it is lost (0 = lost now)
    lost_code: int = _nv.NVML_ERROR_GPU_IS_LOST
    not_supported: dict[str, int] = field(default_factory=dict)  # function → NVML error code
    forced_reasons: int = 0  # clock event reasons a test holds on (thermal, hardware slowdown ...)


@dataclass(frozen=True, slots=True)
class _GpmSnapshot:
    key: tuple[int, int | None]  # (device index, GPU instance id or None)
    t: float  # seconds
    dram_busy_s: float
    sm_busy_s: float
    tensor_busy_s: float = 0.0
    pcie_rx_bytes: float = 0.0
    pcie_tx_bytes: float = 0.0
    nvlink_rx_bytes: float = 0.0
    nvlink_tx_bytes: float = 0.0


def _api(method: Callable[Concatenate[FakeNvml, P], R]) -> Callable[Concatenate[FakeNvml, P], R]:
    """Every NVML entry point: take the lock, then fail like the real library would."""

    @functools.wraps(method)
    def wrapper(self: FakeNvml, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            self._check_driver()
            if self._refcount <= 0:
                raise _nv.NVMLError(_nv.NVML_ERROR_UNINITIALIZED)
            return method(self, *args, **kwargs)

    return wrapper


class FakeNvml:
    """A stand-in for the ``pynvml`` module with ``count`` GPUs of one profile.

    ``profile`` is a key of :data:`PROFILES` or a :class:`DeviceProfile`; ``load(index, t)``
    drives utilisation, bandwidth and memory; ``clock()`` gives the time in seconds (inject the
    agent's clock so energy and GPM follow simulated time). ``driver`` simulates a node with no
    library (``"missing"``) or no kernel driver (``"not_loaded"``).
    """

    def __init__(
        self,
        profile: str | DeviceProfile = "H100-SXM",
        count: int = 1,
        load: Callable[[int, float], GpuLoad | None] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        mig_instances: int = 0,
        unsupported: Iterable[str] = (),
        driver: Literal["ok", "missing", "not_loaded"] = "ok",
    ) -> None:
        prof = PROFILES[profile] if isinstance(profile, str) else profile
        if not 0 <= mig_instances <= prof.max_mig_devices:
            raise ValueError(f"mig_instances must be 0..{prof.max_mig_devices}")
        self.profile = prof
        self._load = load
        self._clock = clock
        self._lock = threading.RLock()
        self._refcount = 0
        self._driver_code: int | None = {
            "ok": None,
            "missing": _nv.NVML_ERROR_LIBRARY_NOT_FOUND,
            "not_loaded": _nv.NVML_ERROR_DRIVER_NOT_LOADED,
        }[driver]
        self._devices = [
            _Device(
                index=i,
                uuid=_uuid("GPU", prof.name, i),
                profile=prof,
                mig_instances=mig_instances,
                not_supported=dict.fromkeys(unsupported, _nv.NVML_ERROR_NOT_SUPPORTED),
            )
            for i in range(count)
        ]
        self._gpm_samples: dict[int, tuple[ctypes.c_uint64, _GpmSnapshot | None]] = {}
        self.init_calls = 0  # times nvmlInit succeeded
        self.shutdown_calls = 0  # times nvmlShutdown succeeded

    # -- test controls (not part of pynvml) -------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """pynvml's constants, structs and error classes; missing ``nvml*`` functions → not found."""
        if name.startswith("nvml"):

            def missing(*_args: Any, **_kwargs: Any) -> Any:
                raise _nv.NVMLError(_nv.NVML_ERROR_FUNCTION_NOT_FOUND)

            return missing
        return getattr(_nv, name)

    @property
    def initialised(self) -> bool:
        """Whether nvmlInit has been called more often than nvmlShutdown."""
        return self._refcount > 0

    @property
    def live_gpm_samples(self) -> int:
        """GPM samples allocated and not yet freed (a leak check for tests)."""
        return len(self._gpm_samples)

    def uuid_of(self, index: int) -> str:
        """The UUID the fake gives GPU ``index``."""
        return self._devices[index].uuid

    def mig_uuid_of(self, index: int, slot: int) -> str:
        """The UUID the fake gives MIG instance ``slot`` of GPU ``index``."""
        return _uuid("MIG", self._devices[index].uuid, slot)

    def set_not_supported(
        self, function: str, index: int | None = None, code: int = _nv.NVML_ERROR_NOT_SUPPORTED
    ) -> None:
        """Make ``function`` (e.g. ``"nvmlDeviceGetPowerUsage"``) fail with ``code`` (NotSupported;
        FunctionNotFound for an older driver, NoPermission, ...) on device ``index`` or on all (None)."""
        with self._lock:
            for dev in self._devices:
                if index is None or dev.index == index:
                    dev.not_supported[function] = code

    def set_gpm_metric_not_supported(self, metric_id: int, index: int | None = None) -> None:
        """Make one GPM metric (``NVML_GPM_METRIC_*``) answer NotSupported in nvmlGpmMetricsGet on
        device ``index`` or on all (None), as an NVLink metric does on a board without NVLink."""
        self.set_not_supported(f"gpm_metric:{metric_id}", index)

    def set_clock_event_reasons(self, index: int, reasons: int) -> None:
        """Hold clock event reasons (an ``nvmlClocksEventReason*`` bitmask) on GPU ``index`` on top
        of those the load model gives (GpuIdle at rest, SwPowerCap at the power limit)."""
        with self._lock:
            self._devices[index].forced_reasons = reasons

    def lose_gpu(self, index: int, after_calls: int = 0, code: int = _nv.NVML_ERROR_GPU_IS_LOST) -> None:
        """GPU ``index`` fails every call with ``code`` (GpuIsLost by default) once
        ``after_calls`` more calls have touched it."""
        with self._lock:
            dev = self._devices[index]
            dev.lost_after = after_calls
            dev.lost_code = code

    def restore_gpu(self, index: int) -> None:
        """GPU ``index`` answers again."""
        with self._lock:
            self._devices[index].lost_after = None

    def unload_driver(self, code: int = _nv.NVML_ERROR_DRIVER_NOT_LOADED) -> None:
        """The kernel driver goes away: every call (and nvmlInit) fails with ``code``."""
        with self._lock:
            self._driver_code = code

    def load_driver(self) -> None:
        """The driver is back."""
        with self._lock:
            self._driver_code = None

    # -- internals --------------------------------------------------------------------------------

    def _check_driver(self) -> None:
        if self._driver_code is not None:
            raise _nv.NVMLError(self._driver_code)

    def _device(self, handle: Any, function: str) -> _Device:
        """The device behind ``handle``, after counting the call and applying faults."""
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self._devices):
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        dev = self._devices[handle.index]
        self._touch(dev)
        if handle.mig_slot is not None and handle.mig_slot >= dev.mig_instances:
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        if function in dev.not_supported:
            raise _nv.NVMLError(dev.not_supported[function])
        return dev

    def _touch(self, dev: _Device) -> None:
        dev.calls += 1
        if dev.lost_after is not None:
            if dev.lost_after <= 0:
                raise _nv.NVMLError(dev.lost_code)
            dev.lost_after -= 1

    def _advance(self, dev: _Device) -> None:
        """Integrate energy and GPM activity up to now (load held constant over each step)."""
        t = self._clock()
        if dev.t is None:
            dev.t = t
            dev.load = self._load_at(dev.index, t)
            return
        dt = t - dev.t
        if dt <= 0:
            return
        load = self._load_at(dev.index, t)
        dev.energy_mj += model_power_watts(dev.profile, load) * dt * 1000.0
        dev.dram_busy_s += load.dram_bw_ratio * dt
        dev.sm_busy_s += load.util_gpu_ratio * dt
        dev.tensor_busy_s += model_tensor_ratio(load) * dt
        dev.pcie_rx_bytes += load.pcie_rx_bytes_per_s * dt
        dev.pcie_tx_bytes += load.pcie_tx_bytes_per_s * dt
        dev.nvlink_rx_bytes += load.nvlink_rx_bytes_per_s * dt
        dev.nvlink_tx_bytes += load.nvlink_tx_bytes_per_s * dt
        dev.t = t
        dev.load = load

    def _load_at(self, index: int, t: float) -> GpuLoad:
        load = self._load(index, t) if self._load is not None else None
        if load is None:
            return IDLE
        tensor = load.tensor_active_ratio
        return GpuLoad(
            util_gpu_ratio=min(1.0, max(0.0, load.util_gpu_ratio)),
            dram_bw_ratio=min(1.0, max(0.0, load.dram_bw_ratio)),
            memory_used_bytes=min(float(self.profile.memory_total_bytes), max(0.0, load.memory_used_bytes)),
            tensor_active_ratio=None if tensor is None else min(1.0, max(0.0, tensor)),
            pcie_rx_bytes_per_s=max(0.0, load.pcie_rx_bytes_per_s),
            pcie_tx_bytes_per_s=max(0.0, load.pcie_tx_bytes_per_s),
            nvlink_rx_bytes_per_s=max(0.0, load.nvlink_rx_bytes_per_s),
            nvlink_tx_bytes_per_s=max(0.0, load.nvlink_tx_bytes_per_s),
        )

    def _not_on_mig(self, handle: _Handle) -> None:
        """Per-board readings are not supported on a MIG instance handle (as on real GPUs)."""
        if handle.mig_slot is not None:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)

    # -- pynvml API -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        """Initialise (reference counted); fails when there is no library or driver."""
        with self._lock:
            self._check_driver()
            self._refcount += 1
            self.init_calls += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        """Same as nvmlInit."""
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        """Drop one reference; raises Uninitialized when there is none."""
        with self._lock:
            if self._refcount <= 0:
                raise _nv.NVMLError(_nv.NVML_ERROR_UNINITIALIZED)
            self._refcount -= 1
            self.shutdown_calls += 1

    @_api
    def nvmlSystemGetDriverVersion(self) -> str:
        """The (fake) driver version."""
        return DRIVER_VERSION

    @_api
    def nvmlDeviceGetCount(self) -> int:
        """Number of GPUs."""
        return len(self._devices)

    @_api
    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        """An opaque handle for GPU ``index``."""
        if not 0 <= index < len(self._devices):
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        self._touch(self._devices[index])
        return _Handle(index)

    @_api
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        """ "GPU-…" or "MIG-…"."""
        dev = self._device(handle, "nvmlDeviceGetUUID")
        if handle.mig_slot is not None:
            return _uuid("MIG", dev.uuid, handle.mig_slot)
        return dev.uuid

    @_api
    def nvmlDeviceGetName(self, handle: Any) -> str:
        """The product name (MIG instances add their profile, e.g. "… MIG 1g.10gb")."""
        dev = self._device(handle, "nvmlDeviceGetName")
        if handle.mig_slot is not None:
            n = dev.mig_instances
            return f"{dev.profile.name} MIG {7 // n}g.{dev.profile.memory_total_bytes // n // 10**9}gb"
        return dev.profile.name

    @_api
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        """``c_nvmlUtilization_t`` in percent; NotSupported on MIG instances and MIG-mode GPUs."""
        dev = self._device(handle, "nvmlDeviceGetUtilizationRates")
        if handle.mig_slot is not None or dev.mig_instances:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        self._advance(dev)
        util = _nv.c_nvmlUtilization_t()
        util.gpu = round(dev.load.util_gpu_ratio * 100)
        util.memory = round(dev.load.dram_bw_ratio * 100)
        return util

    @_api
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Board power in milliwatts."""
        dev = self._device(handle, "nvmlDeviceGetPowerUsage")
        self._not_on_mig(handle)
        self._advance(dev)
        return round(model_power_watts(dev.profile, dev.load) * 1000.0)

    @_api
    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        """The power limit (TDP) in milliwatts."""
        dev = self._device(handle, "nvmlDeviceGetPowerManagementLimit")
        self._not_on_mig(handle)
        return round(dev.profile.tdp_watts * 1000.0)

    @_api
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        """Energy since driver load in millijoules (monotonic)."""
        dev = self._device(handle, "nvmlDeviceGetTotalEnergyConsumption")
        self._not_on_mig(handle)
        self._advance(dev)
        return int(dev.energy_mj)

    @_api
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        """``c_nvmlMemory_t`` (total, free, used) in bytes; a MIG instance sees its slice."""
        dev = self._device(handle, "nvmlDeviceGetMemoryInfo")
        self._advance(dev)
        total = dev.profile.memory_total_bytes
        used = int(dev.load.memory_used_bytes)
        if handle.mig_slot is not None:
            total //= dev.mig_instances
            used = min(total, used // dev.mig_instances)
        mem = _nv.c_nvmlMemory_t()
        mem.total = total
        mem.used = used
        mem.free = total - used
        return mem

    @_api
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        """Current SM or memory clock in MHz."""
        dev = self._device(handle, "nvmlDeviceGetClockInfo")
        self._not_on_mig(handle)
        self._advance(dev)
        if clock_type == _nv.NVML_CLOCK_MEM:
            return dev.profile.mem_clock_mhz
        if clock_type in (_nv.NVML_CLOCK_SM, _nv.NVML_CLOCK_GRAPHICS):
            busy = dev.load.util_gpu_ratio >= IDLE_UTIL
            return dev.profile.max_sm_clock_mhz if busy else dev.profile.idle_sm_clock_mhz
        raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)

    def _temperature(self, handle: Any, sensor: int, function: str) -> int:
        dev = self._device(handle, function)
        self._not_on_mig(handle)
        if sensor != _nv.NVML_TEMPERATURE_GPU:
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        self._advance(dev)
        share = model_power_watts(dev.profile, dev.load) / dev.profile.tdp_watts
        return round(AMBIENT_CELSIUS + HOT_CELSIUS * share)

    @_api
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        """GPU core temperature in degrees Celsius (the legacy call)."""
        return self._temperature(handle, sensor, "nvmlDeviceGetTemperature")

    @_api
    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int) -> int:
        """GPU core temperature in degrees Celsius (the versioned call of newer drivers)."""
        return self._temperature(handle, sensor, "nvmlDeviceGetTemperatureV")

    @_api
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        """Why the clocks are where they are (a bitmask): GpuIdle at rest, SwPowerCap when the load
        model draws the whole power limit, plus whatever a test holds on; per board, not per MIG."""
        dev = self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        self._not_on_mig(handle)
        self._advance(dev)
        reasons = dev.forced_reasons
        if dev.load.util_gpu_ratio < IDLE_UTIL:
            reasons |= _nv.nvmlClocksEventReasonGpuIdle
        if model_power_watts(dev.profile, dev.load) >= dev.profile.tdp_watts:
            reasons |= _nv.nvmlClocksEventReasonSwPowerCap
        return reasons

    @_api
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        """[current, pending] MIG mode."""
        dev = self._device(handle, "nvmlDeviceGetMigMode")
        mode = _nv.NVML_DEVICE_MIG_ENABLE if dev.mig_instances else _nv.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    @_api
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        """MIG slots of the GPU."""
        return self._device(handle, "nvmlDeviceGetMaxMigDeviceCount").profile.max_mig_devices

    @_api
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> _Handle:
        """The handle of MIG instance ``index``; NotFound for an empty slot."""
        dev = self._device(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if handle.mig_slot is not None or not dev.mig_instances:
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= index < dev.mig_instances:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_FOUND)
        return _Handle(dev.index, index)

    @_api
    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        """The GPU instance id of a MIG handle."""
        self._device(handle, "nvmlDeviceGetGpuInstanceId")
        if handle.mig_slot is None:
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        return int(handle.mig_slot) + 1

    @_api
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        """``c_nvmlGpmSupport_t``: GPM on Hopper and newer only."""
        dev = self._device(handle, "nvmlGpmQueryDeviceSupport")
        support = _nv.c_nvmlGpmSupport_t()
        support.version = _nv.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if dev.profile.gpm else 0
        return support

    @_api
    def nvmlGpmSampleAlloc(self) -> Any:
        """A new GPM sample buffer (a ctypes pointer, like the real one)."""
        buf = ctypes.c_uint64(0)
        ptr = ctypes.cast(ctypes.pointer(buf), _nv.c_nvmlGpmSample_t)
        self._gpm_samples[_address(ptr)] = (buf, None)
        return ptr

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        """Free a GPM sample buffer (host memory: works even when the driver has gone)."""
        with self._lock:
            if self._gpm_samples.pop(_address(sample), None) is None:
                raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)

    def _gpm_fill(self, dev: _Device, sample: Any, gpu_instance: int | None) -> Any:
        if not dev.profile.gpm:
            raise _nv.NVMLError(_nv.NVML_ERROR_NOT_SUPPORTED)
        addr = _address(sample)
        if addr not in self._gpm_samples:
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        self._advance(dev)
        snap = _GpmSnapshot(
            (dev.index, gpu_instance),
            dev.t or 0.0,
            dev.dram_busy_s,
            dev.sm_busy_s,
            dev.tensor_busy_s,
            dev.pcie_rx_bytes,
            dev.pcie_tx_bytes,
            dev.nvlink_rx_bytes,
            dev.nvlink_tx_bytes,
        )
        self._gpm_samples[addr] = (self._gpm_samples[addr][0], snap)
        return sample

    @_api
    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        """Take a GPM sample of a whole GPU."""
        dev = self._device(handle, "nvmlGpmSampleGet")
        if handle.mig_slot is not None:
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpm_fill(dev, sample, None)

    @_api
    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:
        """Take a GPM sample of one GPU instance (the fake gives it the parent's activity)."""
        dev = self._device(handle, "nvmlGpmMigSampleGet")
        if not 1 <= gpu_instance_id <= dev.mig_instances:
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpm_fill(dev, sample, gpu_instance_id)

    @_api
    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:
        """Fill ``c_nvmlGpmMetricsGet_t.metrics`` from two samples of the same device."""
        if metrics_get.version != _nv.NVML_GPM_METRICS_GET_VERSION:
            raise _nv.NVMLError(_nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self._gpm_samples.get(_address(metrics_get.sample1), (None, None))[1]
        second = self._gpm_samples.get(_address(metrics_get.sample2), (None, None))[1]
        if first is None or second is None or first.key != second.key:
            raise _nv.NVMLError(_nv.NVML_ERROR_INVALID_ARGUMENT)
        dev = self._devices[first.key[0]]
        self._touch(dev)
        dt = second.t - first.t
        mig = first.key[1] is not None

        def pct(attr: str) -> float:
            return 100.0 * (getattr(second, attr) - getattr(first, attr)) / dt

        def mib_s(attr: str) -> float:
            return (getattr(second, attr) - getattr(first, attr)) / dt / MIB

        metrics: dict[int, Callable[[], float]] = {
            _nv.NVML_GPM_METRIC_DRAM_BW_UTIL: lambda: pct("dram_busy_s"),
            _nv.NVML_GPM_METRIC_SM_UTIL: lambda: pct("sm_busy_s"),
            _nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL: lambda: pct("tensor_busy_s"),
            _nv.NVML_GPM_METRIC_SM_OCCUPANCY: lambda: OCCUPANCY_PER_ACTIVE * pct("sm_busy_s"),
        }
        if not mig:  # link throughput is per board
            metrics |= {
                _nv.NVML_GPM_METRIC_PCIE_RX_PER_SEC: lambda: mib_s("pcie_rx_bytes"),
                _nv.NVML_GPM_METRIC_PCIE_TX_PER_SEC: lambda: mib_s("pcie_tx_bytes"),
                _nv.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: lambda: mib_s("nvlink_rx_bytes"),
                _nv.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: lambda: mib_s("nvlink_tx_bytes"),
            }
        for i in range(metrics_get.numMetrics):
            m = metrics_get.metrics[i]
            fn = metrics.get(int(m.metricId))
            if f"gpm_metric:{int(m.metricId)}" in dev.not_supported:
                fn = None
            if dt <= 0:
                m.nvmlReturn = _nv.NVML_ERROR_INVALID_ARGUMENT
            elif fn is None:
                m.nvmlReturn = _nv.NVML_ERROR_NOT_SUPPORTED
            else:
                m.value = fn()
                m.nvmlReturn = _nv.NVML_SUCCESS
        return metrics_get


def _address(ptr: Any) -> int:
    """The address a ctypes pointer holds (how the fake tells GPM samples apart)."""
    return int(ctypes.cast(ptr, ctypes.c_void_p).value or 0)


def _uuid(prefix: str, seed: str, index: int) -> str:
    """A stable, realistic-looking UUID ("GPU-xxxxxxxx-…")."""
    return f"{prefix}-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'{seed}/{index}')}"
