"""Attribution, one tick at a time (pure): each GPU's charge → engines → the models they serve.

- An engine holds the GPUs it lists (a whole GPU in MIG mode = all its instances); a GPU listed
  by several engines is split by the share policy (``equal`` by default, or ``tokens``); a GPU no
  engine lists, and a MIG parent's uncreated slices, are allocated to no one (node idle).
- An engine's share is split among its models by their share of the tick's tokens (equally when
  none made any); a CPU-only engine is priced per hour from the book's ``engines`` section.
- A GPU's cost is *used* where the model it went to made tokens, else it is idle.
- The cost of an engine is known (``priced``) only if every GPU it lists was read (or is
  remembered) and priced, or it has an hourly price of its own.
- Where GPU time went (:mod:`agent.cost.bound`): each model's GPU-seconds and GPU dollars spread
  by every one of its GPUs' bound shares; absent when any of its GPUs has none.

Conservation, per tick (asserted in the tests): Σ model cost + Σ unallocated = Σ GPU cost, and
Σ busy model cost + Σ GPU idle = Σ GPU cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.cost.bound import split_charges
from agent.cost.inputs import EngineSpec, PriceTable
from agent.cost.model import gpu_time_cost, split_shares
from agent.cost.pricing import GpuCharge
from agent.samples import GpuSample


@dataclass(frozen=True, slots=True)
class ModelTokens:
    """The tokens one model made in the tick (deltas; 0 when unknown or the engine was down)."""

    model: str
    prompt_tokens: float  # tokens
    generation_tokens: float  # tokens

    @property
    def tokens(self) -> float:
        """Prompt + generation tokens."""
        return self.prompt_tokens + self.generation_tokens


@dataclass(frozen=True, slots=True)
class ModelCharge:
    """What one model of one engine is charged for the tick."""

    engine: str
    model: str
    time_usd: float  # dollars of GPU (or CPU-engine) time
    energy_usd: float  # dollars of energy
    gpu_seconds: float  # GPU-seconds attributed (share × Δt, summed over GPUs)
    energy_joules: float | None  # joules attributed (None when no GPU reports energy or power)
    power_watts: float | None  # watts attributed (share of each GPU's mean power)
    gpus: tuple[str, ...]  # UUIDs of the engine's GPUs
    priced: bool  # every GPU read (or remembered) and priced, or the engine has its own price
    estimated: bool  # some GPU was not read this tick (charged from its last reading)
    usage_usd: float | None = None  # dollars weighted by each GPU's busy ratio; None: a ratio unknown
    throttled_gpu_seconds: float | None = None  # GPU-seconds with clocks held down; None: unknown
    bound_gpu_seconds: Mapping[str, float] | None = None  # bound → GPU-seconds (agent.cost.bound)
    bound_usd: Mapping[str, float] | None = None  # bound → GPU dollars; None: a GPU not measured

    @property
    def cost_usd(self) -> float:
        """Dollars of time and energy."""
        return self.time_usd + self.energy_usd


@dataclass(frozen=True, slots=True)
class Attribution:
    """One tick attributed: per model, and per GPU how much went to models at all and to busy ones."""

    models: tuple[ModelCharge, ...]
    allocated_usd: Mapping[str, float]  # GPU UUID → dollars charged to any model
    used_usd: Mapping[str, float]  # GPU UUID → dollars charged to models that made tokens
    engine_usd: float = 0.0  # dollars of engines' own hourly prices (CPU-only engines), not of GPUs
    # engine → dollars of its share of the GPUs it holds, whether or not it served a model this tick
    # (a multi-node engine's worker pods hold GPUs and count no tokens); only engines whose every
    # listed GPU was read and priced
    engine_gpu_usd: Mapping[str, float] = field(default_factory=dict)


def engine_gpus(spec: EngineSpec, gpus: Mapping[str, GpuSample]) -> list[str]:
    """The UUIDs of the engine's GPUs among ``gpus``; a whole GPU in MIG mode means its instances."""
    mig_parents = {s.mig_parent_uuid for s in gpus.values() if s.mig_parent_uuid}
    out: list[str] = []
    for ref in spec.gpus:
        for uuid, s in gpus.items():
            whole = isinstance(ref, int) and s.index == ref and s.mig_parent_uuid is None
            if whole and uuid in mig_parents:
                out.extend(u for u, m in gpus.items() if m.mig_parent_uuid == uuid)
            elif (isinstance(ref, str) and ref == uuid) or whole:
                out.append(uuid)
    return out


def attribute(
    engines: Sequence[EngineSpec],
    held: Mapping[str, Sequence[str]],
    tokens: Mapping[str, Sequence[ModelTokens]],
    charges: Mapping[str, GpuCharge],
    prices: PriceTable,
    share_policy: str,
    seconds: float,
    bounds: Mapping[str, Mapping[str, float] | None],
) -> Attribution:
    """Split the GPUs' charges among engines and models (see the module docstring).

    ``held``: every engine → UUIDs of its GPUs (from :func:`engine_gpus`); ``tokens``: every
    engine → its models this tick (an engine with none gets no window: its GPUs stay unallocated).
    ``bounds``: GPU UUID → its bound shares this tick (:func:`agent.cost.bound.bound_shares`); a
    model gets a bound split only when every one of its GPUs has one.
    """
    eng_tokens = {e.name: sum(m.tokens for m in tokens[e.name]) for e in engines}
    users: dict[str, list[str]] = {}
    for e in engines:
        for u in held[e.name]:
            users.setdefault(u, []).append(e.name)
    shares = {u: split_shares(us, share_policy, eng_tokens) for u, us in users.items()}
    allocated = {u: 0.0 for u in charges}
    used = {u: 0.0 for u in charges}
    out: list[ModelCharge] = []
    engine_usd = 0.0
    engine_gpu_usd = {
        e.name: sum(charges[u].cost_usd * shares[u][e.name] for u in held[e.name])
        for e in engines
        if held[e.name] and len(held[e.name]) >= len(e.gpus) and all(charges[u].priced for u in held[e.name])
    }
    for e in engines:
        models = tokens[e.name]
        if not models:
            continue
        mshare = split_shares([m.model for m in models], "tokens", {m.model: m.tokens for m in models})
        gpus = tuple(held[e.name])
        cpu_price = prices.engine_usd_per_hour(e.name)
        priced = (
            len(gpus) >= len(e.gpus)
            and all(charges[u].priced for u in gpus)
            and (bool(gpus) or cpu_price is not None)
        )
        estimated = any(charges[u].estimated for u in gpus)
        for m in models:
            ms = mshare[m.model]
            time_usd = energy_usd = gpu_seconds = 0.0
            joules: float | None = None
            watts: float | None = None
            busy: float | None = 0.0 if gpus else None
            throttled: float | None = None
            parts: list[tuple[float, float, Mapping[str, float] | None]] = []
            for u in gpus:
                c = charges[u]
                f = shares[u][e.name] * ms
                util = c.reading.util_ratio
                busy = None if busy is None or util is None else busy + c.cost_usd * f * util
                if c.reading.throttled_ratio is not None:
                    throttled = (throttled or 0.0) + seconds * f * c.reading.throttled_ratio
                time_usd += c.time_usd * f
                energy_usd += c.energy_usd * f
                gpu_seconds += seconds * f
                if c.energy_joules is not None:
                    joules = (joules or 0.0) + c.energy_joules * f
                if c.reading.mean_power_watts is not None:
                    watts = (watts or 0.0) + c.reading.mean_power_watts * f
                allocated[u] += c.cost_usd * f
                parts.append((seconds * f, c.cost_usd * f, bounds.get(u)))
                if m.tokens > 0:
                    used[u] += c.cost_usd * f
            if cpu_price is not None:
                own = gpu_time_cost(cpu_price, seconds) * ms
                time_usd += own
                engine_usd += own
            out.append(
                ModelCharge(
                    e.name,
                    m.model,
                    time_usd,
                    energy_usd,
                    gpu_seconds,
                    joules,
                    watts,
                    gpus,
                    priced,
                    estimated,
                    busy,
                    throttled,
                    *(split_charges(parts) or (None, None)),
                )
            )
    return Attribution(tuple(out), allocated, used, engine_usd, engine_gpu_usd)
