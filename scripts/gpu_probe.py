#!/usr/bin/env python3
"""Probe the REAL NVML (and GPM) through infercost's backend while known loads run on the GPU.

For a machine with an NVIDIA GPU (written for an H200; CI never runs it). Every ``--interval``
seconds it reads one NVML round through :class:`agent.sources.nvml.backend.NvmlBackend` while the
GPU goes through these phases:

    idle → matmul (compute bound: bf16 GEMMs) → idle → copy (bandwidth bound: device-to-device
    copies of a large buffer) → idle

Each sample is one JSON line in ``$OUT/nvml_samples.jsonl`` (the GpuSample fields plus the phase);
``$OUT/nvml_summary.json`` holds, per phase, the mean utilisation, GPM DRAM-bandwidth and SM
ratios, power and the energy counter's delta, next to what the load itself measured (TFLOP/s,
GB/s). Without PyTorch or CUDA only the idle phase runs. Usage::

    OUT=/tmp/probe python scripts/gpu_probe.py [--phase-seconds 60] [--idle-seconds 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.samples import GpuLoad, GpuSample
from agent.sources.nvml.backend import NvmlBackend, NvmlUnavailable
from agent.sources.nvml.fake import PROFILES, FakeNvml

logger = logging.getLogger("gpu_probe")

MATMUL_N = 8192  # square bf16 GEMM side: ~1.1 TFLOP per call, long enough to keep every SM busy
COPY_BYTES = 4 * 1024**3  # bytes per copy: far larger than L2 (50–60 MB), so every byte hits DRAM
SYNC_EVERY = 20  # launches between synchronisations (keeps the queue short so stop is prompt)
# With --fake (a dry run of the probe itself, no GPU): what each phase makes the fake GPU do.
FAKE_LOADS = {
    "matmul": GpuLoad(util_gpu_ratio=1.0, dram_bw_ratio=0.3, memory_used_bytes=0.4e9),
    "copy": GpuLoad(util_gpu_ratio=1.0, dram_bw_ratio=0.9, memory_used_bytes=8.6e9),
}


@dataclasses.dataclass
class LoadResult:
    """What a load phase measured itself (for comparison with NVML)."""

    name: str
    seconds: float = 0.0  # seconds the loop ran
    operations: int = 0  # GEMMs or copies completed
    tflops: float | None = None  # achieved TFLOP/s (matmul)
    copy_gbps: float | None = None  # achieved GB/s of DRAM traffic, read + write (copy)
    error: str | None = None


def _torch() -> Any | None:
    """PyTorch with a usable CUDA device, or None."""
    try:
        import torch
    except ImportError:
        logger.warning("PyTorch is not installed: only the idle phase will run")
        return None
    if not torch.cuda.is_available():
        logger.warning("PyTorch sees no CUDA device: only the idle phase will run")
        return None
    return torch


def matmul_load(torch: Any, device: int, stop: threading.Event, result: LoadResult) -> None:
    """bf16 GEMMs back to back until ``stop``."""
    dev = torch.device("cuda", device)
    a = torch.randn(MATMUL_N, MATMUL_N, device=dev, dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    torch.cuda.synchronize(dev)
    start = time.perf_counter()
    while not stop.is_set():
        for _ in range(SYNC_EVERY):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize(dev)
        result.operations += SYNC_EVERY
    result.seconds = time.perf_counter() - start
    if result.seconds > 0:
        result.tflops = 2 * MATMUL_N**3 * result.operations / result.seconds / 1e12
    del a, b, c
    torch.cuda.empty_cache()


def copy_load(torch: Any, device: int, stop: threading.Event, result: LoadResult) -> None:
    """Device-to-device copies of a large buffer until ``stop``."""
    dev = torch.device("cuda", device)
    src = torch.empty(COPY_BYTES, device=dev, dtype=torch.uint8).random_(0, 255)
    dst = torch.empty_like(src)
    torch.cuda.synchronize(dev)
    start = time.perf_counter()
    while not stop.is_set():
        for _ in range(SYNC_EVERY):
            dst.copy_(src)
        torch.cuda.synchronize(dev)
        result.operations += SYNC_EVERY
    result.seconds = time.perf_counter() - start
    if result.seconds > 0:
        result.copy_gbps = 2 * COPY_BYTES * result.operations / result.seconds / 1e9  # read + write
    del src, dst
    torch.cuda.empty_cache()


def _run_load(
    fn: Callable[[Any, int, threading.Event, LoadResult], None],
    torch: Any,
    device: int,
    stop: threading.Event,
    result: LoadResult,
) -> None:
    try:
        fn(torch, device, stop, result)
    except Exception as err:  # an OOM or a CUDA error ends the phase, not the probe
        result.error = f"{type(err).__name__}: {err}"
        logger.exception("load %s failed", result.name)


def sample_phase(
    backend: NvmlBackend, phase: str, seconds: float, interval: float, out: Any, device: int
) -> list[GpuSample]:
    """Read NVML every ``interval`` seconds for ``seconds``; write and return this device's samples."""
    samples: list[GpuSample] = []
    deadline = time.monotonic() + seconds
    next_at = time.monotonic()
    while time.monotonic() < deadline:
        rnd = backend.read_round(time.time())
        if not rnd.up:
            logger.warning("NVML round down: %s", rnd.error)
        for g in rnd.gpus:
            out.write(json.dumps({"phase": phase, **dataclasses.asdict(g)}) + "\n")
            if g.index == device and g.mig_parent_uuid is None:
                samples.append(g)
        out.flush()
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    return samples


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return sum(present) / len(present) if present else None


def summarise(phase: str, samples: list[GpuSample], load: LoadResult | None) -> dict[str, Any]:
    """Per-phase means of the NVML readings (the first GPM reading of a phase is skipped: it
    straddles the phase boundary), plus what the load measured."""
    steady = samples[2:] if len(samples) > 4 else samples  # why: the first second is a transition
    energies = [s.energy_joules for s in samples if s.energy_joules is not None]
    duration = samples[-1].timestamp - samples[0].timestamp if len(samples) > 1 else 0.0
    energy = energies[-1] - energies[0] if len(energies) > 1 else None
    return {
        "phase": phase,
        "samples": len(samples),
        "seconds": duration,
        "up_ratio": _mean([1.0 if s.up else 0.0 for s in samples]),
        "util_gpu_ratio": _mean([s.util_gpu_ratio for s in steady]),
        "util_memory_ratio": _mean([s.util_memory_ratio for s in steady]),
        "dram_bw_ratio": _mean([s.dram_bw_ratio for s in steady]),
        "sm_active_ratio": _mean([s.sm_active_ratio for s in steady]),
        "tensor_active_ratio": _mean([s.tensor_active_ratio for s in steady]),
        "sm_occupancy_ratio": _mean([s.sm_occupancy_ratio for s in steady]),
        "pcie_rx_bytes_per_s": _mean([s.pcie_rx_bytes_per_s for s in steady]),
        "pcie_tx_bytes_per_s": _mean([s.pcie_tx_bytes_per_s for s in steady]),
        "nvlink_rx_bytes_per_s": _mean([s.nvlink_rx_bytes_per_s for s in steady]),
        "nvlink_tx_bytes_per_s": _mean([s.nvlink_tx_bytes_per_s for s in steady]),
        "power_watts": _mean([s.power_watts for s in steady]),
        "energy_joules": energy,
        "energy_mean_watts": energy / duration if energy is not None and duration > 0 else None,
        "memory_used_bytes": _mean([s.memory_used_bytes for s in steady]),
        "sm_clock_hz": _mean([s.sm_clock_hz for s in steady]),
        "temperature_celsius": _mean([s.temperature_celsius for s in steady]),
        "load": dataclasses.asdict(load) if load is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the probe; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--phase-seconds", type=float, default=60.0, help="seconds of each load phase")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="seconds of each idle phase")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between NVML rounds")
    parser.add_argument("--device", type=int, default=0, help="CUDA / NVML device index to load")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")), help="output folder")
    parser.add_argument(
        "--fake", choices=sorted(PROFILES), help="dry run on the fake NVML (no GPU, simulated phases)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    current = ["idle0"]  # the phase running now (read by the fake's load function)
    fake = None
    if args.fake:
        fake = FakeNvml(args.fake, args.device + 1, lambda _i, _t: FAKE_LOADS.get(current[0]))
    backend = NvmlBackend(fake)
    try:
        driver = backend.open()
    except NvmlUnavailable as err:
        logger.error("NVML unavailable: %s", err.reason)
        return 1
    logger.info("NVML driver %s", driver)
    torch = _torch() if fake is None else None
    if torch is not None and torch.cuda.device_count() != 1:
        # CUDA and NVML may order devices differently; with one visible device they agree.
        logger.warning("several CUDA devices: make sure CUDA_VISIBLE_DEVICES maps --device to NVML's index")

    phases: list[tuple[str, float, Callable[..., None] | None]] = [("idle0", args.idle_seconds, None)]
    if torch is not None or fake is not None:
        phases += [
            ("matmul", args.phase_seconds, matmul_load),
            ("idle1", args.idle_seconds, None),
            ("copy", args.phase_seconds, copy_load),
            ("idle2", args.idle_seconds, None),
        ]

    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"driver_version": driver, "torch": getattr(torch, "__version__", None)}
    rows: list[dict[str, Any]] = []
    try:
        with (args.out / "nvml_samples.jsonl").open("w") as out:
            for name, seconds, fn in phases:
                logger.info("phase %s: %.0f s", name, seconds)
                stop = threading.Event()
                current[0] = name
                result = LoadResult(name) if fn is not None and torch is not None else None
                worker = None
                if fn is not None and result is not None:
                    worker = threading.Thread(
                        target=_run_load, args=(fn, torch, args.device, stop, result), daemon=True
                    )
                    worker.start()
                try:
                    samples = sample_phase(backend, name, seconds, args.interval, out, args.device)
                finally:
                    stop.set()
                    if worker is not None:
                        worker.join(timeout=60)
                rows.append(summarise(name, samples, result))
                logger.info("phase %s: %s", name, json.dumps(rows[-1]))
    finally:
        backend.close()
    summary["phases"] = rows
    (args.out / "nvml_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
