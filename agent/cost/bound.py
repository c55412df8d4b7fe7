"""Where GPU time goes (pure): each GPU-second split into compute-, memory-, communication-bound
and idle shares from NVML GPM, and a charge split by those shares.

The decision, per GPU and tick (GPM ratios are time-averages over the tick):

- **idle** = 1 − SM activity (``SM_UTIL``: the share of time the SMs had work at all);
- the busy rest is split between three pressures, each a ratio of its own peak (0–1):
  **compute** = tensor-core activity (``ANY_TENSOR_UTIL``), **memory** = DRAM bandwidth
  (``DRAM_BW_UTIL``), **communication** = the busier of the host link and NVLink, each the busier
  direction's throughput (``PCIE_RX/TX_PER_SEC``, ``NVLINK_TOTAL_RX/TX_PER_SEC``) over that link's
  one-direction peak from :mod:`agent.hardware`. A share = busy × its pressure / the sum of the
  three, so the four shares add up to 1;
- busy time with no pressure at all (SMs issuing non-tensor work, or kernels too short to load
  anything) is **compute**: the SMs were the only thing busy.

Absent (``None``), never guessed: where GPM does not answer (pre-Hopper GPUs, NotSupported), where
any of the three activity ratios is missing, where the GPU is not in the hardware table (no link
peaks), where a link the GPU has (PCIe always; NVLink when the table gives it a peak) was not
measured, and on MIG instances (link throughput is per board, not per instance — the window join
passes nothing for them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

COMPUTE = "compute"
MEMORY = "memory"
COMMUNICATION = "communication"
IDLE = "idle"
BOUNDS = (COMPUTE, MEMORY, COMMUNICATION, IDLE)


@dataclass(frozen=True, slots=True)
class GpmActivity:
    """What GPM measured on one GPU over one tick (means of the tick's readings)."""

    sm_active_ratio: float | None  # 0–1, SM_UTIL
    tensor_active_ratio: float | None  # 0–1, ANY_TENSOR_UTIL
    dram_bw_ratio: float | None  # 0–1, DRAM_BW_UTIL
    pcie_rx_bytes_per_s: float | None = None  # bytes/s, PCIE_RX_PER_SEC
    pcie_tx_bytes_per_s: float | None = None  # bytes/s, PCIE_TX_PER_SEC
    nvlink_rx_bytes_per_s: float | None = None  # bytes/s, NVLINK_TOTAL_RX_PER_SEC
    nvlink_tx_bytes_per_s: float | None = None  # bytes/s, NVLINK_TOTAL_TX_PER_SEC


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


def link_ratio(rx: float | None, tx: float | None, peak_bytes_per_s: float | None) -> float | None:
    """The busier direction's throughput over the link's one-direction peak (0–1); None when the
    link has no known peak or neither direction was measured."""
    if peak_bytes_per_s is None or peak_bytes_per_s <= 0:
        return None
    known = [v for v in (rx, tx) if v is not None]
    if not known:
        return None
    return _clamp(max(known) / peak_bytes_per_s)


def communication_ratio(
    gpm: GpmActivity, pcie_peak_bytes_per_s: float | None, nvlink_peak_bytes_per_s: float | None
) -> float | None:
    """The busier of the host link and NVLink (0–1). None when the host link was not measured, or
    the GPU has NVLink and it was not measured."""
    pcie = link_ratio(gpm.pcie_rx_bytes_per_s, gpm.pcie_tx_bytes_per_s, pcie_peak_bytes_per_s)
    if pcie is None:
        return None
    if nvlink_peak_bytes_per_s is None:
        return pcie
    nvlink = link_ratio(gpm.nvlink_rx_bytes_per_s, gpm.nvlink_tx_bytes_per_s, nvlink_peak_bytes_per_s)
    return None if nvlink is None else max(pcie, nvlink)


def bound_shares(
    gpm: GpmActivity, pcie_peak_bytes_per_s: float | None, nvlink_peak_bytes_per_s: float | None
) -> dict[str, float] | None:
    """Shares of one GPU's time (bound → 0–1, summing to 1), or None when not measurable (see the
    module docstring)."""
    busy, tensor, dram = gpm.sm_active_ratio, gpm.tensor_active_ratio, gpm.dram_bw_ratio
    if busy is None or tensor is None or dram is None:
        return None
    if not (math.isfinite(busy) and math.isfinite(tensor) and math.isfinite(dram)):
        return None  # a NaN or infinite reading is no measurement: absent, not clamped to 0 or 1
    comm = communication_ratio(gpm, pcie_peak_bytes_per_s, nvlink_peak_bytes_per_s)
    if comm is None:
        return None
    busy = _clamp(busy)
    pressure = {COMPUTE: _clamp(tensor), MEMORY: _clamp(dram), COMMUNICATION: comm}
    total = sum(pressure.values())
    if total <= 0:
        return {COMPUTE: busy, MEMORY: 0.0, COMMUNICATION: 0.0, IDLE: 1.0 - busy}
    out = {b: busy * p / total for b, p in pressure.items()}
    out[IDLE] = 1.0 - busy
    return out


def split_charges(
    parts: Sequence[tuple[float, float, Mapping[str, float] | None]],
) -> tuple[dict[str, float], dict[str, float]] | None:
    """Σ over a model's GPUs of (GPU-seconds, dollars), each spread by that GPU's shares:
    ``parts`` is one (seconds, dollars, shares) per GPU. None when there is no GPU or any GPU has
    no shares (the model's split is then unknown, not partial)."""
    known = [(s, d, sh) for s, d, sh in parts if sh is not None]
    if not parts or len(known) < len(parts):
        return None
    secs = {b: sum(s * sh.get(b, 0.0) for s, _, sh in known) for b in BOUNDS}
    usd = {b: sum(d * sh.get(b, 0.0) for _, d, sh in known) for b in BOUNDS}
    return secs, usd
