"""One table of GPU figures (the only one in the project), with their sources.

Used by the cost model (the decode-efficiency ceiling needs peak memory bandwidth) and by the
simulation core (step time needs bandwidth and tensor-core peak; the KV pool needs memory; power
needs TDP). Pure data: imports nothing from the agent, so every layer may use it.

Sources (NVIDIA data sheets; dense, i.e. without sparsity, BF16/FP16 tensor-core peak):
- H100 SXM5 80GB: 3.35 TB/s HBM3, 989 TFLOP/s, 700 W (H100 Tensor Core GPU datasheet, 2023);
- H100 PCIe 80GB: 2.0 TB/s HBM2e, 756 TFLOP/s, 350 W (same datasheet);
- H200 SXM 141GB: 4.8 TB/s HBM3e, 989 TFLOP/s, 700 W (H200 Tensor Core GPU datasheet, 2024);
- A100 SXM4 80GB: 2.039 TB/s HBM2e, 312 TFLOP/s, 400 W (A100 datasheet, 2021);
- A100 PCIe 80GB: 1.935 TB/s, 312 TFLOP/s, 300 W; A100 40GB: 1.555 TB/s, 312 TFLOP/s, 400 W (same);
- L40S 48GB: 864 GB/s GDDR6, 362 TFLOP/s, 350 W (L40S datasheet, 2023).
Memory is what NVML's ``memory.total`` reports on those boards (slightly under the marketing GB).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MIB = 1024 * 1024  # bytes


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model's figures that matter to decode, prefill, memory and power."""

    name: str  # as NVML reports it
    hbm_bandwidth_bytes_per_s: float  # bytes/s, peak memory bandwidth
    peak_flops: float  # FLOP/s, dense BF16/FP16 tensor-core peak
    memory_bytes: float  # bytes, memory.total as NVML reports it
    tdp_watts: float  # watts, board power limit


H100_SXM = GpuSpec("NVIDIA H100 80GB HBM3", 3.35e12, 989e12, 81559 * MIB, 700.0)
H100_PCIE = GpuSpec("NVIDIA H100 PCIe", 2.0e12, 756e12, 81559 * MIB, 350.0)
H200 = GpuSpec("NVIDIA H200", 4.8e12, 989e12, 143771 * MIB, 700.0)
A100_SXM_80GB = GpuSpec("NVIDIA A100-SXM4-80GB", 2.039e12, 312e12, 81920 * MIB, 400.0)
A100_PCIE_80GB = GpuSpec("NVIDIA A100 80GB PCIe", 1.935e12, 312e12, 81920 * MIB, 300.0)
A100_40GB = GpuSpec("NVIDIA A100-SXM4-40GB", 1.555e12, 312e12, 40960 * MIB, 400.0)
L40S = GpuSpec("NVIDIA L40S", 0.864e12, 362e12, 46068 * MIB, 350.0)

# Case-insensitive substring of the NVML name → figures; the longest match wins.
GPUS: Mapping[str, GpuSpec] = {
    "H100 80GB HBM3": H100_SXM,
    "H100 PCIe": H100_PCIE,
    "H100": H100_SXM,
    "H200": H200,
    "A100-SXM4-80GB": A100_SXM_80GB,
    "A100 80GB PCIe": A100_PCIE_80GB,
    "A100": A100_40GB,
    "L40S": L40S,
}


def gpu_spec(nvml_name: str) -> GpuSpec | None:
    """The figures of a GPU by the name NVML reports (longest matching key), or None."""
    name = nvml_name.lower()
    best: tuple[int, GpuSpec] | None = None
    for key, spec in GPUS.items():
        if key.lower() in name and (best is None or len(key) > best[0]):
            best = (len(key), spec)
    return None if best is None else best[1]
