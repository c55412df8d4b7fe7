"""Benchmark-style figures: where GPU time goes (:mod:`agent.cost.bound`) on real GPM readings.

``run()`` reads the per-phase GPM means a real H200 reported (``scripts/h200-2026-11-30/
nvml_raw_summary.json`` in a source checkout: an idle phase, a BF16 GEMM, a device-to-device copy),
splits each phase with :func:`agent.cost.bound.bound_shares` and the H200's link peaks from
:mod:`agent.hardware`, and prints one line per phase. It prints figures; nothing asserts on them.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent.cost.bound import BOUNDS, GpmActivity, bound_shares
from agent.hardware import gpu_spec

CAPTURE = Path(__file__).resolve().parents[1] / "scripts" / "h200-2026-11-30" / "nvml_raw_summary.json"
PERCENT = 0.01  # GPM percentages → ratios
MIB = 1024 * 1024  # bytes; GPM throughput is MiB/s


def run(capture: Path = CAPTURE) -> dict[str, dict[str, float] | None]:
    """Print and return phase → bound shares (None where the split is absent)."""
    data = json.loads(capture.read_text())
    name = data["info"]["name"]
    spec = gpu_spec(name)
    print(f"{name} (driver {data['info']['driver']}), GPM means per phase from {capture.name}")
    print(
        f"{'phase':<8} {'SM':>6} {'tensor':>7} {'DRAM':>6} {'PCIe MB/s':>10} "
        + " ".join(f"{b:>13}" for b in BOUNDS)
    )
    out: dict[str, dict[str, float] | None] = {}
    for phase, p in data["phases"].items():
        g = p["gpm_means"]

        def pct(key: str, g: dict[str, float] = g) -> float | None:
            v = g.get(key)
            return None if v is None else v * PERCENT

        def mib(key: str, g: dict[str, float] = g) -> float | None:
            v = g.get(key)
            return None if v is None else v * MIB

        gpm = GpmActivity(
            sm_active_ratio=pct("SM_UTIL"),
            tensor_active_ratio=pct("ANY_TENSOR_UTIL"),
            dram_bw_ratio=pct("DRAM_BW_UTIL"),
            pcie_rx_bytes_per_s=mib("PCIE_RX_PER_SEC"),
            pcie_tx_bytes_per_s=mib("PCIE_TX_PER_SEC"),
            nvlink_rx_bytes_per_s=mib("NVLINK_TOTAL_RX_PER_SEC"),
            nvlink_tx_bytes_per_s=mib("NVLINK_TOTAL_TX_PER_SEC"),
        )
        shares = bound_shares(
            gpm, spec.pcie_bytes_per_s if spec else None, spec.nvlink_bytes_per_s if spec else None
        )
        out[phase] = shares
        pcie = max(gpm.pcie_rx_bytes_per_s or 0.0, gpm.pcie_tx_bytes_per_s or 0.0) / 1e6
        cells = " ".join(f"{shares[b]:>12.1%} " if shares else f"{'absent':>13}" for b in BOUNDS)
        print(
            f"{phase:<8} {gpm.sm_active_ratio or 0:>6.1%} {gpm.tensor_active_ratio or 0:>7.1%} "
            f"{gpm.dram_bw_ratio or 0:>6.1%} {pcie:>10.1f} {cells}"
        )
    return out
