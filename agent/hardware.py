"""One table of GPU figures (the only one in the project), with their sources.

Used by the cost model (the decode-efficiency ceiling needs peak memory bandwidth; the bound split
of :mod:`agent.cost.bound` needs the PCIe and NVLink peaks to turn GPM's MiB/s into a ratio) and by
the simulation core (step time needs bandwidth and tensor-core peak; the KV pool needs memory; power
needs TDP). Pure data: imports nothing from the agent, so every layer may use it.

Figures: memory bandwidth, dense (without sparsity) BF16 tensor-core peak, board power, host and
NVLink bandwidth, from NVIDIA's data sheets unless said otherwise. Data sheets quote PCIe and NVLink
as *bidirectional* totals; the table keeps one direction (half), which is what GPM's per-direction
rx / tx throughput is compared with. Memory is what NVML's ``memory.total`` reports (slightly under
the marketing GB), as printed by ``nvidia-smi`` on those boards.

- A10G 24GB (AWS G5 only; NVIDIA publishes no data sheet): 600 GB/s GDDR6, 300 W (the power limit
  ``nvidia-smi`` shows on g5 instances), 23028 MiB; 70 TFLOP/s BF16 (Baseten, "NVIDIA A10 vs A10G
  for ML model inference", 2023, from AWS' figures); PCIe Gen4 x16; no NVLink.
- A10 24GB: 600 GB/s, 125 TFLOP/s, 150 W, 23028 MiB (A10 data sheet, 2021); PCIe Gen4.
- L4 24GB: 300 GB/s GDDR6, 121 TFLOP/s (242 with sparsity), 72 W, 23034 MiB (L4 data sheet,
  2023); PCIe Gen4 x16 64 GB/s; no NVLink.
- L40 48GB: 864 GB/s GDDR6, 181 TFLOP/s (362 with sparsity), 300 W, 46068 MiB (L40 data sheet,
  2022); PCIe Gen4 x16 64 GB/s; no NVLink.
- L40S 48GB: 864 GB/s, 362 TFLOP/s (733 with sparsity), 350 W, 46068 MiB (L40S data sheet, 2023);
  PCIe Gen4 x16 64 GB/s; no NVLink.
- A100 40GB SXM4: 1,555 GB/s HBM2, 312 TFLOP/s, 400 W; A100 40GB PCIe: same memory and peak,
  250 W; 40960 MiB (A100 data sheet, 2021); PCIe Gen4 64 GB/s; NVLink 600 GB/s (PCIe boards:
  through a two-GPU bridge).
- A100 80GB SXM4: 2,039 GB/s HBM2e, 400 W; A100 80GB PCIe: 1,935 GB/s, 300 W; both 312 TFLOP/s,
  81920 MiB, PCIe Gen4 64 GB/s, NVLink 600 GB/s (A100 data sheet, 2021).
- H100 SXM5 80GB: 3.35 TB/s HBM3, 989 TFLOP/s, 700 W, NVLink 900 GB/s; H100 PCIe 80GB: 2.0 TB/s
  HBM2e, 756 TFLOP/s, 350 W, NVLink bridge 600 GB/s; both 81559 MiB and PCIe Gen5 128 GB/s (H100
  Tensor Core GPU data sheet, 2023).
- H100 NVL 94GB: 3.9 TB/s HBM3, 835 TFLOP/s (1,671 with sparsity), 400 W, NVLink bridge
  600 GB/s, PCIe Gen5 128 GB/s (H100 NVL product brief, 2023); 95830 MiB.
- H20 96GB: 4.0 TB/s HBM3, 148 TFLOP/s (296 with sparsity), 400 W (NVIDIA's published figure;
  some boards report a 500 W limit), NVLink 900 GB/s, PCIe Gen5 128 GB/s (NVIDIA H20 product
  brief, 2024); 97871 MiB.
- H200 SXM 141GB: 4.8 TB/s HBM3e, 989 TFLOP/s, 700 W, NVLink 900 GB/s, PCIe Gen5 128 GB/s (H200
  Tensor Core GPU data sheet, 2024); 143771 MiB (read by NVML on a real H200,
  ``scripts/h200-2026-11-30/nvml_raw_summary.json``).
- B200 180GB: 8 TB/s HBM3e, 2.25 PFLOP/s (HGX B200 data sheet, 2024: 36 PFLOP/s with sparsity
  for eight GPUs), 1,000 W, NVLink 5 1.8 TB/s, PCIe Gen5 128 GB/s; 183359 MiB. (The driver's
  corrected bus width of 7,680 bits gives 7.67 TB/s; the table keeps the data-sheet figure.)

Matching (:func:`gpu_spec`) is on whole *tokens* of the NVML name (split on spaces and hyphens), so
"L4" never matches "NVIDIA L40S" and "A10" never matches "NVIDIA A100-SXM4-80GB"; a GPU whose name
holds no key is unknown (``None``: no efficiency figure, no bound split), never guessed, and so is a
name that names a board variant its key does not ("NVIDIA H200 NVL" is not the H200 SXM). Missing
(no entry yet): T4, A30, A40, L20, H800/A800, H200 NVL, GH200, GB200, B100, B300, RTX PRO 6000.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

MIB = 1024 * 1024  # bytes
PCIE4_X16 = 32e9  # bytes/s one direction (data sheets: "PCIe Gen4 x16: 64 GB/s" bidirectional)
PCIE5_X16 = 64e9  # bytes/s one direction ("PCIe Gen5: 128 GB/s" bidirectional)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model's figures that matter to decode, prefill, memory, power and communication."""

    name: str  # as NVML reports it
    hbm_bandwidth_bytes_per_s: float  # bytes/s, peak memory bandwidth
    peak_flops: float  # FLOP/s, dense BF16/FP16 tensor-core peak
    memory_bytes: float  # bytes, memory.total as NVML reports it
    tdp_watts: float  # watts, board power limit
    pcie_bytes_per_s: float | None = None  # bytes/s, host link peak in one direction
    nvlink_bytes_per_s: float | None = None  # bytes/s, NVLink peak in one direction; None: no NVLink


A10G = GpuSpec("NVIDIA A10G", 600e9, 70e12, 23028 * MIB, 300.0, PCIE4_X16)
A10 = GpuSpec("NVIDIA A10", 600e9, 125e12, 23028 * MIB, 150.0, PCIE4_X16)
L4 = GpuSpec("NVIDIA L4", 300e9, 121e12, 23034 * MIB, 72.0, PCIE4_X16)
L40 = GpuSpec("NVIDIA L40", 864e9, 181e12, 46068 * MIB, 300.0, PCIE4_X16)
L40S = GpuSpec("NVIDIA L40S", 864e9, 362e12, 46068 * MIB, 350.0, PCIE4_X16)
A100_40GB = GpuSpec("NVIDIA A100-SXM4-40GB", 1.555e12, 312e12, 40960 * MIB, 400.0, PCIE4_X16, 300e9)
A100_PCIE_40GB = GpuSpec("NVIDIA A100-PCIE-40GB", 1.555e12, 312e12, 40960 * MIB, 250.0, PCIE4_X16, 300e9)
A100_SXM_80GB = GpuSpec("NVIDIA A100-SXM4-80GB", 2.039e12, 312e12, 81920 * MIB, 400.0, PCIE4_X16, 300e9)
A100_PCIE_80GB = GpuSpec("NVIDIA A100 80GB PCIe", 1.935e12, 312e12, 81920 * MIB, 300.0, PCIE4_X16, 300e9)
H100_SXM = GpuSpec("NVIDIA H100 80GB HBM3", 3.35e12, 989e12, 81559 * MIB, 700.0, PCIE5_X16, 450e9)
H100_PCIE = GpuSpec("NVIDIA H100 PCIe", 2.0e12, 756e12, 81559 * MIB, 350.0, PCIE5_X16, 300e9)
H100_NVL = GpuSpec("NVIDIA H100 NVL", 3.9e12, 835e12, 95830 * MIB, 400.0, PCIE5_X16, 300e9)
H20 = GpuSpec("NVIDIA H20", 4.0e12, 148e12, 97871 * MIB, 400.0, PCIE5_X16, 450e9)
H200 = GpuSpec("NVIDIA H200", 4.8e12, 989e12, 143771 * MIB, 700.0, PCIE5_X16, 450e9)
B200 = GpuSpec("NVIDIA B200", 8.0e12, 2.25e15, 183359 * MIB, 1000.0, PCIE5_X16, 900e9)

# Key → figures. A key is a set of tokens that must all be in the NVML name (any order, case
# ignored; tokens are split on spaces, hyphens and underscores); the key with the most tokens wins.
# A name naming a board variant (below) the key does not name is another board: "NVIDIA H200 NVL"
# is not the H200 SXM entry.
VARIANTS = frozenset({"nvl", "pcie", "sxm", "sxm2", "sxm4", "sxm5"})
GPUS: Mapping[str, GpuSpec] = {
    "A10G": A10G,
    "A10": A10,
    "L4": L4,
    "L40": L40,
    "L40S": L40S,
    "A100-SXM4-40GB": A100_40GB,
    "A100-PCIE-40GB": A100_PCIE_40GB,
    "A100-SXM4-80GB": A100_SXM_80GB,
    "A100-SXM-80GB": A100_SXM_80GB,  # the name some HGX A100 80GB boards report
    "A100 80GB PCIe": A100_PCIE_80GB,
    "H100 80GB HBM3": H100_SXM,
    "H100 PCIe": H100_PCIE,
    "H100 NVL": H100_NVL,
    "H20": H20,
    "H200": H200,
    "B200": B200,
}


# Why cached: the window join asks for the same few names (each GPU's, each price entry's) for
# every GPU at every tick; a name's words and figures never change (both results are immutable).
@functools.lru_cache(maxsize=1024)
def name_tokens(name: str) -> frozenset[str]:
    """The lower-cased words of a GPU name, split on spaces, hyphens and underscores."""
    return frozenset(t for t in re.split(r"[\s\-_]+", name.lower()) if t)


_KEYS: tuple[tuple[frozenset[str], GpuSpec], ...] = tuple(
    sorted(((name_tokens(k), v) for k, v in GPUS.items()), key=lambda kv: -len(kv[0]))
)


@functools.lru_cache(maxsize=1024)
def gpu_spec(nvml_name: str) -> GpuSpec | None:
    """The figures of a GPU by the name NVML reports (the key with the most tokens all in the
    name), or None when no key matches. A MIG instance ("… MIG 3g.40gb") gets its parent's figures."""
    have = name_tokens(nvml_name)
    for key, spec in _KEYS:
        if key <= have and not (have & VARIANTS) - key:
            return spec
    return None
