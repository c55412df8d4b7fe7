#!/usr/bin/env python3
"""Record raw NVML readings that infercost does not read yet, while a GPU load runs.

For a machine with an NVIDIA GPU (written for an H200; CI never runs it). It complements
``scripts/gpu_probe.py`` (which goes through infercost's backend): here pynvml is called directly, so
the output shows what the real library answers for the fields a later change may add — every GPM
metric id the bindings name (tensor, NVLink, PCIe, DRAM, SM), clock-event (throttle) reasons, clocks,
power limits — each either a value or the NVML error it raised. One JSON line per round per phase in
``$OUT/nvml_raw.jsonl``; per-phase means in ``$OUT/nvml_raw_summary.json``. Usage::

    OUT=/tmp/raw python scripts/gpu_raw_probe.py [--phase-seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pynvml  # noqa: TID251 - a probe script of the real library, not part of the agent


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def gpm_ids() -> dict[str, int]:
    """Every NVML_GPM_METRIC_* constant the installed bindings define."""
    return {
        n[len("NVML_GPM_METRIC_") :]: getattr(pynvml, n)
        for n in dir(pynvml)
        if n.startswith("NVML_GPM_METRIC_")
        and isinstance(getattr(pynvml, n), int)
        and n != "NVML_GPM_METRIC_MAX"
    }


def gpm_round(handle: Any, prev: Any, ids: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    """Take a GPM sample; with a previous one, every metric (in chunks the struct can hold)."""
    cur = pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(handle, cur)
    out: dict[str, Any] = {}
    if prev is not None:
        items = list(ids.items())
        chunk = 32  # metrics per nvmlGpmMetricsGet call (well under the struct's array)
        for start in range(0, len(items), chunk):
            part = items[start : start + chunk]
            mg = pynvml.c_nvmlGpmMetricsGet_t()
            mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(part)
            mg.sample1 = prev
            mg.sample2 = cur
            for i, (_, mid) in enumerate(part):
                mg.metrics[i].metricId = mid
            try:
                pynvml.nvmlGpmMetricsGet(mg)
            except pynvml.NVMLError as e:
                out["_error"] = _err(e)
                continue
            for i, (name, _) in enumerate(part):
                m = mg.metrics[i]
                out[name] = float(m.value) if m.nvmlReturn == 0 else f"nvmlReturn={m.nvmlReturn}"
        pynvml.nvmlGpmSampleFree(prev)
    return cur, out


def call(fn: Any, *args: Any) -> Any:
    try:
        v = fn(*args)
    except Exception as e:  # the probe records whatever the library raises
        return {"error": _err(e)}
    if hasattr(v, "_fields_"):
        return {f[0]: getattr(v, f[0]) for f in v._fields_ if isinstance(getattr(v, f[0]), int | float)}
    return v


def scalars(handle: Any) -> dict[str, Any]:
    """The non-GPM readings of one round."""
    p = pynvml
    return {
        "clocks_event_reasons": call(
            getattr(p, "nvmlDeviceGetCurrentClocksEventReasons", p.nvmlDeviceGetCurrentClocksThrottleReasons),
            handle,
        ),
        "sm_clock_mhz": call(p.nvmlDeviceGetClockInfo, handle, p.NVML_CLOCK_SM),
        "mem_clock_mhz": call(p.nvmlDeviceGetClockInfo, handle, p.NVML_CLOCK_MEM),
        "max_sm_clock_mhz": call(p.nvmlDeviceGetMaxClockInfo, handle, p.NVML_CLOCK_SM),
        "power_mw": call(p.nvmlDeviceGetPowerUsage, handle),
        "power_limit_mw": call(p.nvmlDeviceGetEnforcedPowerLimit, handle),
        "energy_mj": call(p.nvmlDeviceGetTotalEnergyConsumption, handle),
        "util": call(p.nvmlDeviceGetUtilizationRates, handle),
        "pcie_tx_kbs": call(p.nvmlDeviceGetPcieThroughput, handle, p.NVML_PCIE_UTIL_TX_BYTES),
        "pcie_rx_kbs": call(p.nvmlDeviceGetPcieThroughput, handle, p.NVML_PCIE_UTIL_RX_BYTES),
        "temperature_c": call(p.nvmlDeviceGetTemperature, handle, p.NVML_TEMPERATURE_GPU),
        "perf_state": call(p.nvmlDeviceGetPerformanceState, handle),
    }


def load(kind: str, stop: threading.Event, result: dict[str, Any]) -> None:
    """matmul (compute bound) or copy (bandwidth bound) until stop."""
    import torch

    dev = torch.device("cuda", 0)
    if kind == "matmul":
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        op = lambda: torch.matmul(a, b)  # noqa: E731
    else:
        src = torch.empty(4 * 1024**3, device=dev, dtype=torch.uint8)
        dst = torch.empty_like(src)
        op = lambda: dst.copy_(src)  # noqa: E731
    n, t0 = 0, time.perf_counter()
    while not stop.is_set():
        for _ in range(20):
            op()
        torch.cuda.synchronize(dev)
        n += 20
    result.update(kind=kind, ops=n, seconds=time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase-seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    info = {
        "name": call(pynvml.nvmlDeviceGetName, handle),
        "driver": call(pynvml.nvmlSystemGetDriverVersion),
        "nvml_version": call(pynvml.nvmlSystemGetNVMLVersion),
        "cuda_driver": call(pynvml.nvmlSystemGetCudaDriverVersion_v2),
        "gpm_supported": call(pynvml.nvmlGpmQueryDeviceSupport, handle),
        "mig_mode": call(pynvml.nvmlDeviceGetMigMode, handle),
        "memory": call(pynvml.nvmlDeviceGetMemoryInfo, handle),
        "bus_width_bits": call(pynvml.nvmlDeviceGetMemoryBusWidth, handle),
        "max_mem_clock_mhz": call(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM),
        "nvlink_states": [call(pynvml.nvmlDeviceGetNvLinkState, handle, i) for i in range(18)],
        "pynvml_file": pynvml.__file__,
    }
    ids = gpm_ids()
    summary: dict[str, Any] = {"info": info, "gpm_metric_ids": ids, "phases": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "nvml_raw.jsonl").open("w") as f:
        for phase in ("idle", "matmul", "copy"):
            stop, result = threading.Event(), {}
            worker = None
            if phase != "idle":
                worker = threading.Thread(target=load, args=(phase, stop, result), daemon=True)
                worker.start()
            prev, rows = None, []
            end = time.monotonic() + args.phase_seconds
            while time.monotonic() < end:
                try:
                    prev, gpm = gpm_round(handle, prev, ids)
                except pynvml.NVMLError as e:
                    gpm = {"_error": _err(e)}
                row = {"phase": phase, "t": time.time(), "gpm": gpm, **scalars(handle)}
                rows.append(row)
                f.write(json.dumps(row, default=str) + "\n")
                time.sleep(args.interval)
            stop.set()
            if worker is not None:
                worker.join(timeout=60)
            means: dict[str, float] = {}
            steady = rows[2:] if len(rows) > 4 else rows
            for name in ids:
                vals = [r["gpm"][name] for r in steady if isinstance(r["gpm"].get(name), float)]
                if vals:
                    means[name] = sum(vals) / len(vals)
            reasons = sorted(
                {r["clocks_event_reasons"] for r in rows if isinstance(r["clocks_event_reasons"], int)}
            )
            summary["phases"][phase] = {
                "gpm_means": means,
                "clocks_event_reasons_seen": reasons,
                "last": {k: v for k, v in rows[-1].items() if k != "gpm"},
                "load": result,
            }
    pynvml.nvmlShutdown()
    (args.out / "nvml_raw_summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(json.dumps(summary["phases"], indent=1, default=str)[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
