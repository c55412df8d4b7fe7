"""GPU pricing, one tick at a time (pure): what each GPU cost over [start, end).

Per GPU: time = the book's $/GPU-hour prorated over the interval (a price change inside the tick
counts from its instant); energy (where the book prices power) = ΔE from NVML's energy counter,
falling back to mean power × Δt, × $/kWh × PUE.

- **MIG**: the whole GPU is paid for. The parent is priced (time and energy, from its own power
  and energy readings: instances report none) and each instance holds its profile's share
  (``3g`` = 3/7 of an H100); what no instance holds (slices never created) stays on the parent's
  own row as cost no engine can use.
- **Not read this tick** (NVML down, the GPU not in the round, or lost): a GPU is paid whether
  NVML answers or not, so a GPU read before keeps costing time at its book price, and energy at
  its last known power; the charge is marked ``estimated``.
- **Unpriced** (no price in the book): time is unknown, so the charge is not ``priced`` and every
  ratio built on it is absent; energy is still counted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from agent.cost.inputs import PriceTable
from agent.cost.model import energy_cost, energy_from_counter
from agent.samples import GpuSample

MIG_SLICES = 7  # compute slices of an A100 / H100 / H200 / B200 in MIG mode (profiles 1g … 7g)
MIG_SLICES_BY_MODEL = {"A30": 4}  # the A30 has four (profiles 1g, 2g, 4g)


def mig_slice_fraction(instance_name: str) -> float:
    """The share of its GPU a MIG instance holds, from its profile name ("… MIG 3g.40gb" → 3/7);
    one slice when the name carries no profile."""
    slices = next((n for k, n in MIG_SLICES_BY_MODEL.items() if k in instance_name), MIG_SLICES)
    m = re.search(r"(\d+)g\.", instance_name)
    g = int(m.group(1)) if m else 1
    return min(g, slices) / slices


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What the join knows of one GPU for one tick."""

    sample: GpuSample  # the last reading in the tick (or the last one ever, when not read)
    seen: bool  # False: not read this tick; the charge is estimated from ``sample``
    mean_power_watts: float | None  # watts over the tick's readings (the last known when not read)
    prev_energy_joules: float | None  # the energy counter at the previous tick's close (None: a gap)
    util_ratio: float | None = None  # 0–1, mean utilisation over the tick's readings
    bw_ratio: float | None = None  # 0–1, mean DRAM bandwidth (GPM), else memory-busy ratio
    throttled_ratio: float | None = None  # 0–1, share of readings with clocks held down (power, heat)


@dataclass(frozen=True, slots=True)
class GpuCharge:
    """What one GPU (or MIG instance) cost over one tick."""

    reading: GpuReading
    usd_per_hour: float | None  # price at the end of the tick (an instance's share of it); None: unpriced
    time_usd: float  # dollars of GPU time (0 when unpriced)
    energy_usd: float  # dollars of energy (0 when the book does not price power)
    energy_joules: float | None  # joules used (an instance's share of its parent's)
    estimated: bool = False  # not read this tick: time from the book, energy from the last known power

    @property
    def uuid(self) -> str:
        """The GPU's (or instance's) UUID."""
        return self.reading.sample.uuid

    @property
    def priced(self) -> bool:
        """Whether the book prices this GPU's time."""
        return self.usd_per_hour is not None

    @property
    def cost_usd(self) -> float:
        """Dollars of time and energy."""
        return self.time_usd + self.energy_usd


def _own_charge(r: GpuReading, prices: PriceTable, node: str, start: float, end: float) -> GpuCharge:
    s = r.sample
    dt = end - start
    time_usd = prices.gpu_time_usd(s.name, node, start, end)
    price = prices.gpu_usd_per_hour(s.name, node, end)
    # a reading not taken this tick has no previous counter (and a down reading no counter)
    joules = energy_from_counter(r.prev_energy_joules, s.energy_joules, r.mean_power_watts, dt)
    power = prices.power
    energy_usd = energy_cost(joules, power.usd_per_kwh, power.pue) if power and joules is not None else 0.0
    return GpuCharge(
        reading=r,
        usd_per_hour=price if time_usd is not None else None,
        time_usd=time_usd or 0.0,
        energy_usd=energy_usd,
        energy_joules=joules,
        estimated=not r.seen,
    )


def price_gpus(
    readings: Mapping[str, GpuReading], prices: PriceTable, node: str, start: float, end: float
) -> dict[str, GpuCharge]:
    """Charge every GPU and MIG instance for [start, end) (see the module docstring)."""
    out: dict[str, GpuCharge] = {}
    parents = {r.sample.mig_parent_uuid for r in readings.values() if r.sample.mig_parent_uuid}
    for uuid, r in readings.items():
        if r.sample.mig_parent_uuid in readings:
            continue  # an instance of a parent that was read: priced below, as a share of it
        out[uuid] = _own_charge(r, prices, node, start, end)
        if r.sample.mig_parent_uuid:  # an instance without its parent: its profile's share
            out[uuid] = _share(out[uuid], r, mig_slice_fraction(r.sample.name), not r.seen)
    for parent in parents & set(out):
        whole = out[parent]
        held = 0.0
        for uuid, r in readings.items():
            if r.sample.mig_parent_uuid == parent:
                f = mig_slice_fraction(r.sample.name)
                held += f
                out[uuid] = _share(whole, r, f, whole.estimated or not r.seen)
        rest = max(0.0, 1.0 - held)
        out[parent] = _share(whole, whole.reading, rest, whole.estimated)  # the slices never created
    return out


def _share(whole: GpuCharge, reading: GpuReading, f: float, estimated: bool) -> GpuCharge:
    """``f`` of a whole GPU's charge, carried by ``reading`` (a MIG instance, or the parent's rest)."""
    return GpuCharge(
        reading=reading,
        usd_per_hour=None if whole.usd_per_hour is None else whole.usd_per_hour * f,
        time_usd=whole.time_usd * f,
        energy_usd=whole.energy_usd * f,
        energy_joules=None if whole.energy_joules is None else whole.energy_joules * f,
        estimated=estimated,
    )
