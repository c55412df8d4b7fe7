"""The NVML backend: the only module of the agent that imports ``pynvml`` (nvidia-ml-py).

:class:`NvmlBackend` takes the library *module* as a constructor parameter (the seam): the real
``pynvml`` in production, :class:`agent.sources.nvml.fake.FakeNvml` in tests. Both expose the same
functions, constants, ctypes structures and ``NVMLError_*`` classes, so the code path below is the
same for both.

One call of :meth:`NvmlBackend.read_round` is one batched round over every device (blocking C
calls; the sampler runs it in a thread). Error taxonomy, per call:

- ``NotSupported`` / ``NoPermission`` / ``FunctionNotFound`` (and ``NotFound``): the field is
  absent (``None``, never 0 or NaN), logged once per (device, field) at info.
- other transient codes (``Timeout``, ``NoData``, ...): the field is absent this round, logged
  once per (device, field) at warning.
- ``GpuIsLost`` / ``Unknown`` / ``ResetRequired``: that device is ``up=False`` with the error,
  logged at warning once per transition; the other devices carry on.
- ``Uninitialized`` / ``DriverNotLoaded`` / ``LibraryNotFound`` / ``LibRmVersionMismatch``: the
  driver is gone, the whole round is ``NvmlRound(up=False)``; the next round re-initialises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import pynvml

from agent.samples import GpuSample, NvmlRound

logger = logging.getLogger(__name__)

T = TypeVar("T")

MHZ = 1e6  # hertz per megahertz
MILLI = 1e-3  # milliwatts → watts, millijoules → joules
PERCENT = 0.01  # NVML percentages (0–100) → ratios (0–1)
MIB = 1024 * 1024  # bytes; GPM reports PCIe and NVLink throughput in MiB/s

# Codes that mean "this device does not expose this": the field is absent.
_ABSENT_CODES = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_FOUND,
    }
)
# Codes that mean "this driver lacks that call" (probe a versioned call, fall back to the old one).
_NO_SUCH_CALL_CODES = frozenset(
    {pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}
)
# Codes that mean "this device is unreadable": the whole GpuSample is down.
_DEVICE_DOWN_CODES = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_RESET_REQUIRED,
    }
)
# Codes that mean "the driver / library is gone": the whole round is down.
_ROUND_DOWN_CODES = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)


def real_library() -> Any:
    """The real ``pynvml`` module (for the fake, which reuses its constants, structs and errors)."""
    return pynvml


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine (no library, no driver); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _NeverRaised(Exception):
    """Stands in for NVMLLibraryMismatchError in bindings that lack it."""


class _DeviceDown(Exception):
    """A device answered GpuIsLost / Unknown: its sample is ``up=False``."""


class _RoundDown(Exception):
    """The driver went away during the round: the round is ``up=False``."""


def _describe(err: BaseException) -> str:
    """A short text for an NVML error: its class name and message."""
    return f"{type(err).__name__}: {err}"


@dataclass(slots=True)
class _GpmState:
    """Per-device GPM bookkeeping: whether it is supported and the previous sample."""

    supported: bool
    previous: Any = None  # an nvmlGpmSample_t from the last round, or None
    request: Any = None  # the device's nvmlGpmMetricsGet_t, filled once (metric ids), reused each round


class NvmlBackend:
    """Blocking reader of NVML; one :meth:`read_round` reads every GPU and MIG instance.

    ``lib`` is the NVML module (``pynvml`` by default; a :class:`FakeNvml` in tests). Not
    thread-safe for concurrent rounds: the sampler runs one round at a time (a lock enforces it).
    """

    def __init__(self, lib: Any = None) -> None:
        self._lib: Any = pynvml if lib is None else lib
        self._lock = threading.Lock()
        # Raised by pynvml itself (not an NVMLError) when the driver lacks a struct version.
        self._mismatch: type[Exception] = getattr(self._lib, "NVMLLibraryMismatchError", _NeverRaised)
        self._open = False
        self._driver_version: str | None = None
        self._gpm: dict[str, _GpmState] = {}  # by device UUID
        self._logged: set[tuple[str, str]] = set()  # (device uuid or index, field) logged once
        self._down: dict[int, str] = {}  # device index → error, while a device is down
        self._names: dict[int, tuple[str, str]] = {}  # index → (uuid, name), for down devices
        self._round_error: str | None = None  # last round-level error (for transition logs)
        self._temperature_v: bool | None = None  # versioned temperature call present (None: not probed)
        self._ids = _GpmIds.of(self._lib)

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def driver_version(self) -> str | None:
        """The driver version NVML reported at :meth:`open`, or None before it."""
        return self._driver_version

    def open(self) -> str:
        """Initialise NVML and return the driver version; idempotent.

        Raises :class:`NvmlUnavailable` when the library or the driver is missing.
        """
        with self._lock:
            return self._open_locked()

    def _open_locked(self) -> str:
        if self._open and self._driver_version is not None:
            return self._driver_version
        lib = self._lib
        try:
            lib.nvmlInit()
        except lib.NVMLError as err:
            raise NvmlUnavailable(_describe(err)) from None
        except OSError as err:  # a broken libnvidia-ml.so can fail in the loader itself
            raise NvmlUnavailable(f"cannot load libnvidia-ml: {err}") from None
        self._open = True
        try:
            version = lib.nvmlSystemGetDriverVersion()
        except lib.NVMLError as err:
            logger.info("NVML driver version not readable: %s", _describe(err))
            version = "unknown"
        self._driver_version = version.decode() if isinstance(version, bytes) else str(version)
        return self._driver_version

    def close(self) -> None:
        """Free GPM samples and shut NVML down (once; later calls do nothing)."""
        with self._lock:
            self._shutdown_locked()

    def _shutdown_locked(self) -> None:
        if not self._open:
            return
        self._free_gpm()
        self._open = False
        try:
            self._lib.nvmlShutdown()
        except self._lib.NVMLError as err:
            logger.debug("nvmlShutdown failed: %s", _describe(err))

    def _free_gpm(self) -> None:
        for state in self._gpm.values():
            if state.previous is not None:
                self._free_sample(state.previous)
        self._gpm.clear()

    def _free_sample(self, sample: Any) -> None:
        try:
            self._lib.nvmlGpmSampleFree(sample)
        except self._lib.NVMLError as err:
            logger.debug("nvmlGpmSampleFree failed: %s", _describe(err))

    # -- one round --------------------------------------------------------------------------------

    def read_round(self, now: float) -> NvmlRound:
        """Read every device once (blocking); ``now`` (epoch seconds) stamps the samples.

        Never raises for NVML errors: a missing driver gives ``NvmlRound(up=False, error=...)``.
        """
        with self._lock:
            if not self._open:
                try:
                    self._open_locked()
                except NvmlUnavailable as err:
                    return self._round_down(now, err.reason)
            try:
                gpus = self._read_all(now)
            except _RoundDown as err:
                # Re-initialise on the next round: handles from before a driver reload are stale.
                self._shutdown_locked()
                return self._round_down(now, str(err))
        if self._round_error is not None:
            logger.info("NVML is readable again (driver %s)", self._driver_version)
            self._round_error = None
        return NvmlRound(timestamp=now, up=True, gpus=tuple(gpus), driver_version=self._driver_version)

    def _round_down(self, now: float, error: str) -> NvmlRound:
        if self._round_error is None:
            logger.warning("NVML unavailable: %s", error)
        self._round_error = error
        return NvmlRound(timestamp=now, up=False, error=error, driver_version=self._driver_version)

    def _read_all(self, now: float) -> list[GpuSample]:
        lib = self._lib
        try:
            count = int(lib.nvmlDeviceGetCount())
        except lib.NVMLError as err:
            raise _RoundDown(_describe(err)) from None
        gpus: list[GpuSample] = []
        for index in range(count):
            gpus.extend(self._read_device(index, now))
        return gpus

    def _classify(self, err: Any) -> None:
        """Re-raise an NVML error as device-down or round-down when it is one of those."""
        code = getattr(err, "value", None)
        if code in _ROUND_DOWN_CODES:
            raise _RoundDown(_describe(err)) from None
        if code in _DEVICE_DOWN_CODES:
            raise _DeviceDown(_describe(err)) from None

    def _call(self, key: str, field: str, fn: Callable[[], T]) -> T | None:
        """Run one NVML call for ``field`` of device ``key``; absent → None (logged once)."""
        lib = self._lib
        try:
            return fn()
        except self._mismatch as err:  # pynvml's own "struct version unknown to this driver"
            if (key, field) not in self._logged:
                self._logged.add((key, field))
                logger.info("NVML %s absent on %s: %s", field, key, err)
            return None
        except lib.NVMLError as err:
            self._classify(err)
            if (key, field) not in self._logged:
                self._logged.add((key, field))
                if getattr(err, "value", None) not in _ABSENT_CODES:
                    level = logging.WARNING
                elif key.startswith("MIG-"):
                    level = logging.DEBUG  # board-level readings are never exposed per MIG instance
                else:
                    level = logging.INFO
                logger.log(level, "NVML %s absent on %s: %s", field, key, _describe(err))
            return None

    def _mark_up(self, index: int, uuid: str) -> None:
        if self._down.pop(index, None) is not None:
            logger.warning("GPU %d (%s) is readable again", index, uuid)

    def _mark_down(self, index: int, uuid: str, error: str) -> None:
        if index not in self._down:
            logger.warning("GPU %d (%s) is down: %s", index, uuid, error)
        self._down[index] = error

    def _read_device(self, index: int, now: float) -> list[GpuSample]:
        lib = self._lib
        uuid, name = self._names.get(index, (f"GPU-index-{index}", "unknown"))
        try:
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(lib.nvmlDeviceGetUUID(handle))
                name = _text(lib.nvmlDeviceGetName(handle))
            except lib.NVMLError as err:
                self._classify(err)
                raise _DeviceDown(_describe(err)) from None
            self._names[index] = (uuid, name)
            mig_on = self._mig_enabled(uuid, handle)
            sample = self._read_one(index, uuid, name, handle, now, gpm_key=uuid, parent=None)
            migs = self._read_migs(index, uuid, handle, now) if mig_on else []
        except _DeviceDown as err:
            self._mark_down(index, uuid, str(err))
            self._drop_gpm(uuid)
            return [GpuSample(index=index, uuid=uuid, name=name, timestamp=now, up=False, error=str(err))]
        self._mark_up(index, uuid)
        return [sample, *migs]

    def _mig_enabled(self, uuid: str, handle: Any) -> bool:
        lib = self._lib
        mode = self._call(uuid, "mig_mode", lambda: lib.nvmlDeviceGetMigMode(handle))
        return mode is not None and mode[0] == lib.NVML_DEVICE_MIG_ENABLE

    def _read_migs(self, index: int, parent_uuid: str, handle: Any, now: float) -> list[GpuSample]:
        lib = self._lib
        slots = self._call(parent_uuid, "mig_count", lambda: lib.nvmlDeviceGetMaxMigDeviceCount(handle))
        out: list[GpuSample] = []
        for slot in range(int(slots or 0)):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except lib.NVMLError as err:
                self._classify(err)
                continue  # NotFound: an empty slot (instances need not be contiguous)
            mig_uuid = self._call(parent_uuid, f"mig{slot}_uuid", partial(lib.nvmlDeviceGetUUID, mig))
            if mig_uuid is None:
                continue
            mig_uuid = _text(mig_uuid)
            mig_name = _text(self._call(mig_uuid, "name", partial(lib.nvmlDeviceGetName, mig)) or "")
            gi = self._call(mig_uuid, "gpu_instance_id", partial(lib.nvmlDeviceGetGpuInstanceId, mig))
            out.append(
                self._read_one(
                    index, mig_uuid, mig_name, mig, now, gpm_key=mig_uuid, parent=(parent_uuid, handle, gi)
                )
            )
        return out

    def _read_one(
        self,
        index: int,
        uuid: str,
        name: str,
        handle: Any,
        now: float,
        *,
        gpm_key: str,
        parent: tuple[str, Any, int | None] | None,
    ) -> GpuSample:
        lib = self._lib
        util = self._call(uuid, "utilization", lambda: lib.nvmlDeviceGetUtilizationRates(handle))
        power_mw = self._call(uuid, "power", lambda: lib.nvmlDeviceGetPowerUsage(handle))
        energy_mj = self._call(uuid, "energy", lambda: lib.nvmlDeviceGetTotalEnergyConsumption(handle))
        mem = self._call(uuid, "memory", lambda: lib.nvmlDeviceGetMemoryInfo(handle))
        sm_mhz = self._call(uuid, "sm_clock", lambda: lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_SM))
        mem_mhz = self._call(
            uuid, "mem_clock", lambda: lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_MEM)
        )
        temp = self._call(uuid, "temperature", lambda: self._temperature(handle))
        reasons = self._call(uuid, "clock_event_reasons", lambda: self._clock_event_reasons(handle))
        gpm = self._read_gpm(gpm_key, handle, parent)
        ids = self._ids
        return GpuSample(
            index=index,
            uuid=uuid,
            name=name,
            timestamp=now,
            mig_parent_uuid=parent[0] if parent else None,
            util_gpu_ratio=util.gpu * PERCENT if util is not None else None,
            util_memory_ratio=util.memory * PERCENT if util is not None else None,
            dram_bw_ratio=gpm.get(ids.dram),
            sm_active_ratio=gpm.get(ids.sm),
            tensor_active_ratio=gpm.get(ids.tensor),
            sm_occupancy_ratio=gpm.get(ids.occupancy),
            pcie_rx_bytes_per_s=gpm.get(ids.pcie_rx),
            pcie_tx_bytes_per_s=gpm.get(ids.pcie_tx),
            nvlink_rx_bytes_per_s=gpm.get(ids.nvlink_rx),
            nvlink_tx_bytes_per_s=gpm.get(ids.nvlink_tx),
            power_watts=power_mw * MILLI if power_mw is not None else None,
            energy_joules=energy_mj * MILLI if energy_mj is not None else None,
            memory_used_bytes=float(mem.used) if mem is not None else None,
            memory_total_bytes=float(mem.total) if mem is not None else None,
            sm_clock_hz=sm_mhz * MHZ if sm_mhz is not None else None,
            mem_clock_hz=mem_mhz * MHZ if mem_mhz is not None else None,
            temperature_celsius=float(temp) if temp is not None else None,
            clock_event_reasons=int(reasons) if reasons is not None else None,
        )

    def _clock_event_reasons(self, handle: Any) -> Any:
        """The clock event reasons bitmask (drivers ≥ 535 name it so; older ones "throttle reasons")."""
        lib = self._lib
        try:
            return lib.nvmlDeviceGetCurrentClocksEventReasons(handle)
        except lib.NVMLError as err:
            if getattr(err, "value", None) != lib.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
        return lib.nvmlDeviceGetCurrentClocksThrottleReasons(handle)

    def _temperature(self, handle: Any) -> Any:
        """GPU temperature: the versioned call where the driver has it (probed once, cached),
        else the legacy one (deprecated in NVML 13, gone in CUDA 14)."""
        lib = self._lib
        if self._temperature_v is not False and hasattr(lib, "nvmlDeviceGetTemperatureV"):
            try:
                value = lib.nvmlDeviceGetTemperatureV(handle, lib.NVML_TEMPERATURE_GPU)
            except lib.NVMLError as err:
                if self._temperature_v or getattr(err, "value", None) not in _NO_SUCH_CALL_CODES:
                    raise
                logger.info("nvmlDeviceGetTemperatureV not in this driver; using nvmlDeviceGetTemperature")
                self._temperature_v = False
            else:
                self._temperature_v = True
                return value
        return lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU)

    # -- GPM (Hopper and newer) -------------------------------------------------------------------

    def _drop_gpm(self, key: str) -> None:
        """Forget a device's previous GPM sample (after it went down), keeping the support probe."""
        state = self._gpm.get(key)
        if state is not None and state.previous is not None:
            self._free_sample(state.previous)
            state.previous = None

    def _gpm_supported(self, key: str, handle: Any, parent: tuple[str, Any, int | None] | None) -> bool:
        """Probe GPM support once per device (the answer is cached; MIG instances ask the parent)."""
        state = self._gpm.get(key)
        if state is not None:
            return state.supported
        lib = self._lib
        probe_handle = parent[1] if parent else handle
        support = self._call(key, "gpm", lambda: lib.nvmlGpmQueryDeviceSupport(probe_handle))
        supported = bool(support is not None and support.isSupportedDevice)
        if parent is not None and parent[2] is None:
            supported = False  # no GPU instance id: nvmlGpmMigSampleGet cannot address it
        if support is not None and not supported and (key, "gpm") not in self._logged:
            self._logged.add((key, "gpm"))
            logger.info("NVML GPM not supported on %s (pre-Hopper): DRAM bandwidth ratio absent", key)
        self._gpm[key] = _GpmState(supported=supported)
        return supported

    def _read_gpm(
        self, key: str, handle: Any, parent: tuple[str, Any, int | None] | None
    ) -> dict[int, float]:
        """GPM metric id → value between the previous round's sample and now: ratios (0–1) for
        activity metrics, bytes/s for throughput (PCIe and NVLink: whole GPUs only, they are per
        board); a metric that failed is left out."""
        if not self._gpm_supported(key, handle, parent):
            return {}
        lib = self._lib
        state = self._gpm[key]

        def take() -> Any:
            sample = lib.nvmlGpmSampleAlloc()
            try:
                if parent is None:
                    lib.nvmlGpmSampleGet(handle, sample)
                else:
                    lib.nvmlGpmMigSampleGet(parent[1], parent[2], sample)
            except lib.NVMLError:
                self._free_sample(sample)
                raise
            return sample

        current = self._call(key, "gpm_sample", take)
        previous, state.previous = state.previous, current
        if previous is None or current is None:
            if previous is not None:
                self._free_sample(previous)
            return {}
        if state.request is None:
            ids = self._ids
            state.request = self._gpm_request(
                ids.activity if parent is not None else ids.activity + ids.throughput
            )
        try:
            values = self._call(
                key, "gpm_metrics", lambda: self._gpm_metrics(state.request, previous, current)
            )
        finally:
            self._free_sample(previous)
        return values or {}

    def _gpm_request(self, wanted: tuple[int, ...]) -> Any:
        """An nvmlGpmMetricsGet_t asking for ``wanted`` (metric ids); a round sets its two samples.
        Prepared once per device: pynvml's structures answer every attribute through a Python
        ``__getattribute__``, which made building one per round most of the sampler's own time."""
        lib = self._lib
        mg = lib.c_nvmlGpmMetricsGet_t()
        mg.version = lib.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(wanted)
        metrics = mg.metrics
        for i, metric in enumerate(wanted):
            metrics[i].metricId = metric
        return mg

    def _gpm_metrics(self, mg: Any, older: Any, newer: Any) -> dict[int, float]:
        """Run nvmlGpmMetricsGet over two samples; metric id → ratio (percentages) or bytes/s
        (MiB/s metrics); metrics that failed are left out."""
        lib = self._lib
        throughput = self._ids.throughput
        success = lib.NVML_SUCCESS
        mg.sample1 = older
        mg.sample2 = newer
        lib.nvmlGpmMetricsGet(mg)
        out: dict[int, float] = {}
        # the fields read past pynvml's structure __getattribute__ (a bytes-to-str conversion none
        # of these numeric fields needs, at several times the cost of the read)
        field = object.__getattribute__
        metrics = field(mg, "metrics")
        for i in range(field(mg, "numMetrics")):
            m = metrics[i]
            if field(m, "nvmlReturn") != success:
                continue
            metric = int(field(m, "metricId"))
            value = float(field(m, "value"))
            if metric in throughput:
                out[metric] = max(0.0, value * MIB)
            else:
                out[metric] = min(1.0, max(0.0, value * PERCENT))
        return out


@dataclass(frozen=True, slots=True)
class _GpmIds:
    """The GPM metric ids the agent reads (pynvml's constants, looked up on the library in use)."""

    dram: int
    sm: int
    tensor: int
    occupancy: int
    pcie_rx: int
    pcie_tx: int
    nvlink_rx: int
    nvlink_tx: int

    @classmethod
    def of(cls, lib: Any) -> _GpmIds:
        """The ids as ``lib`` (pynvml or the fake) names them."""

        def c(name: str) -> int:
            return int(getattr(lib, f"NVML_GPM_METRIC_{name}"))

        return cls(
            c("DRAM_BW_UTIL"),
            c("SM_UTIL"),
            c("ANY_TENSOR_UTIL"),
            c("SM_OCCUPANCY"),
            c("PCIE_RX_PER_SEC"),
            c("PCIE_TX_PER_SEC"),
            c("NVLINK_TOTAL_RX_PER_SEC"),
            c("NVLINK_TOTAL_TX_PER_SEC"),
        )

    @property
    def activity(self) -> tuple[int, ...]:
        """Percent metrics, readable on whole GPUs and MIG instances."""
        return (self.dram, self.sm, self.tensor, self.occupancy)

    @property
    def throughput(self) -> tuple[int, ...]:
        """MiB/s metrics of the board's links."""
        return (self.pcie_rx, self.pcie_tx, self.nvlink_rx, self.nvlink_tx)


def _text(value: Any) -> str:
    """NVML strings arrive as str (pynvml's convertStrBytes) or bytes (older bindings)."""
    return value.decode() if isinstance(value, bytes) else str(value)
