"""Plain inputs of the cost layer: what an engine runs on and what things cost.

The cost layer imports no configuration model: the edge (``agent.config``, ``agent.sources.prices``)
builds these small frozen values once, and the pure steps read only them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.cost.model import gpu_time_cost
from agent.hardware import name_tokens

SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One inference engine as the cost layer sees it."""

    name: str
    kind: str = "auto"  # vllm | sglang | tgi | triton | trtllm | llamacpp | auto (from the scrape)
    gpus: tuple[int | str, ...] = ()  # NVML indexes or UUIDs; empty = a CPU-only engine
    model_version: str | None = None  # version of every model this engine serves
    model_versions: Mapping[str, str] = field(default_factory=dict)  # per served model name
    weights_bytes: float | None = None  # bytes read per decode step (roofline)
    flops_per_token: float | None = None  # FLOPs of one token through the weights (2 × active parameters)
    kv_bytes_per_token: float | None = None  # bytes of KV cache per resident token
    kv_capacity_tokens: float | None = None  # tokens the KV cache holds
    priority_class: str | None = None  # the traffic class of every model it serves (realtime, batch ...)
    priority_classes: Mapping[str, str] = field(default_factory=dict)  # per served model name

    def version_of(self, model: str) -> str:
        """The deployed version of ``model`` from deployment metadata, or "unknown"."""
        return self.model_versions.get(model) or self.model_version or "unknown"

    def class_of(self, model: str) -> str | None:
        """The priority class of ``model``'s traffic, or None when the config names none."""
        return self.priority_classes.get(model) or self.priority_class


@dataclass(frozen=True, slots=True)
class GpuRate:
    """One price of one GPU model from an instant on."""

    match: str  # words that must all be words of the NVML name (case-insensitive)
    usd_per_hour: float  # dollars per GPU-hour
    effective_from: float = 0.0  # epoch seconds from which the price applies


@dataclass(frozen=True, slots=True)
class PowerRate:
    """Energy price where the operator pays for power."""

    usd_per_kwh: float  # dollars per kilowatt-hour
    pue: float = 1.0  # power usage effectiveness (≥ 1)


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Prices as plain data, with pure lookups (the time is always passed in)."""

    gpus: tuple[GpuRate, ...] = ()
    nodes: Mapping[str, float] = field(default_factory=dict)  # node → dollars per GPU-hour (override)
    engines: Mapping[str, float] = field(default_factory=dict)  # engine → dollars per hour (CPU-only)
    power: PowerRate | None = None
    source: str = ""  # where the prices came from (for log lines)

    def gpu_usd_per_hour(self, gpu_name: str, node: str, at: float) -> float | None:
        """$ per GPU-hour of a GPU named ``gpu_name`` on ``node`` at epoch ``at``; None if unpriced.

        A node override wins; otherwise the most specific matching entry (every word of its
        ``match`` is a word of the NVML name, so "L4" never prices an L40S nor "A10" an A100;
        the entry with more words wins, then the longer one), and among those the latest price
        already in effect."""
        override = self.nodes.get(node)
        if override is not None:
            return override
        words = name_tokens(gpu_name)
        best: tuple[int, int, float] | None = None
        price: float | None = None
        for p in self.gpus:
            want = name_tokens(p.match)
            if not want <= words or p.effective_from > at:
                continue
            rank = (len(want), len(p.match), p.effective_from)
            if best is None or rank > best:
                best, price = rank, p.usd_per_hour
        return price

    def gpu_time_usd(self, gpu_name: str, node: str, start: float, end: float) -> float | None:
        """Dollars of GPU time over [start, end), prorated across price changes inside it.

        None when any part of the interval has no price (the cost is then unknown, not $0)."""
        if node in self.nodes:
            return gpu_time_cost(self.nodes[node], end - start)
        edges = sorted({p.effective_from for p in self.gpus if start < p.effective_from < end})
        total = 0.0
        for a, b in zip([start, *edges], [*edges, end], strict=True):
            price = self.gpu_usd_per_hour(gpu_name, node, a)
            if price is None:
                return None
            total += gpu_time_cost(price, b - a)
        return total

    def engine_usd_per_hour(self, engine: str) -> float | None:
        """$ per hour of a CPU-only (or whole-machine) engine, or None."""
        return self.engines.get(engine)
