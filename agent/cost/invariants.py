"""The physical laws of one priced tick (pure): what every derived number may be, checked as data.

:func:`violations` reads a :class:`~agent.cost.window.TickResult` and says, one line per broken law,
what is impossible in it; an empty list means every number is physically possible:

- **conservation**: Σ model cost + Σ unallocated = Σ GPU cost + engines' own hourly dollars, and
  Σ GPU dollars of models that made tokens + Σ GPU idle = Σ GPU cost; engines' own dollars are
  their hourly prices × the tick;
- **the split of a window**: prompt $, output $ (the rest of a window with tokens) and idle $ are
  each ≥ 0 and add up to its cost; usage-basis, bound and GPU-idle dollars lie within the costs
  they are part of;
- **ranges**: utilisation, bandwidth and KV-cache usage in [0, 1]; decode efficiency in (0, 1];
  tokens, seconds, joules, watts and dollars never negative; every number finite;
- **the hardware**: generation tokens ≤ the engine's ceiling
  (:func:`agent.cost.counters.generation_ceiling`, the bound the join refuses counters by) × the
  seconds its counter counted over; $ per 1M output tokens ≥ the cost floor (the same tokens at the
  roofline) where both are present and the counter counted over the window alone;
- **absent, not zero**: no $ per token, decode efficiency or prompt split where a window has no
  tokens, and no $ ratio where its cost is unpriced.

The token laws need to know when each counter last counted (a counter that was not read, or whose
reading was refused, counts at its next reading what the engine made meanwhile):
:func:`counters_read_at` follows that from the scrapes and the refusals, tick by tick.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence

from agent.cost.attribution import engine_gpus
from agent.cost.counters import generation_ceiling
from agent.cost.inputs import EngineSpec, PriceTable
from agent.cost.model import PER_MILLION, gpu_time_cost
from agent.cost.window import GpuTick, TickResult
from agent.samples import CostWindow, EngineScrape, Histogram

# Why 1e-9 of the magnitude: the laws compare sums and products of doubles, and a sum of n doubles
# is off by at most (n − 1)·ε·Σ|x| (Higham, "Accuracy and Stability of Numerical Algorithms", §4.2),
# each product by ε more: 1e-9 is 4.5 million ε, more than the rounding of any tick (GPUs × engines ×
# models terms), while a real leak is a whole term (a share counted twice or not at all).
REL_TOL = 1e-9


def _tol(*magnitudes: float) -> float:
    """How far two computations of the same dollars (or tokens) may differ by rounding alone."""
    return REL_TOL * sum(abs(m) for m in magnitudes if math.isfinite(m))


def _tokens(w: CostWindow) -> float:
    return w.usage.prompt_tokens + w.usage.generation_tokens


def _window_name(w: CostWindow) -> str:
    u = w.usage
    return f"window {u.engine}/{u.model}/{u.model_version} [{u.start:.0f}, {u.end:.0f}]"


_FIELDS: dict[type, tuple[str, ...]] = {}  # dataclass → its field names but "sample" (read once)


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.name != "sample")
    return names


# one number a window or GPU tick carries: (path of the dataclasses it is in, field, what in the
# field: "" for the field itself, ".sum" / ".count" of a histogram, "[le=…]" / "[key]" of an entry)
_Number = tuple[str, str, str, float]


def _numbers(obj: object, prefix: str = "") -> Iterator[_Number]:
    """Every number a window or GPU tick carries (histograms: their sums and counts; not the inputs
    a GPU tick keeps as read, nor the bucket bounds, of which the last is +Inf by definition). Its
    name is put together only where a law fails (every tick walks thousands of them)."""
    for name in _field_names(type(obj)):
        v = getattr(obj, name)
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int | float):
            yield prefix, name, "", float(v)
        elif isinstance(v, Histogram):
            yield prefix, name, ".sum", v.sum
            yield prefix, name, ".count", v.count
            for le, count in v.buckets:
                yield prefix, name, f"[le={le}]", count
        elif isinstance(v, Mapping):
            for k, x in v.items():
                yield prefix, name, f"[{k}]", x
        elif dataclasses.is_dataclass(v):
            yield from _numbers(v, prefix + name + ".")


def _number_laws(where: str, obj: object) -> list[str]:
    """Every number finite (NaN or ±Inf is no measurement: absent is None), and none negative
    (tokens, seconds, joules, watts, requests and dollars)."""
    out = []
    for prefix, name, part, v in _numbers(obj):
        if not math.isfinite(v):
            out.append(f"{where}: {prefix}{name}{part} = {v} is not finite")
        elif v < 0:
            out.append(f"{where}: {prefix}{name}{part} = {v} < 0")
    return out


def _in_unit(where: str, name: str, v: float | None, open_low: bool = False) -> list[str]:
    """A ratio in [0, 1] (or (0, 1]): exact, since a mean of values in [0, 1] rounds into [0, 1]."""
    if v is None or (0.0 < v <= 1.0 if open_low else 0.0 <= v <= 1.0):
        return []
    return [f"{where}: {name} = {v} outside {'(0, 1]' if open_low else '[0, 1]'}"]


def _gpu_laws(g: GpuTick) -> list[str]:
    """One GPU's dollars: 0 ≤ unallocated ≤ idle ≤ cost (unallocated dollars are idle too)."""
    where = f"GPU {g.sample.uuid}"
    out = _number_laws(where, g)
    tol = _tol(g.cost_usd)
    if g.idle_usd > g.cost_usd + tol:
        out.append(f"{where}: idle ${g.idle_usd!r} > cost ${g.cost_usd!r}")
    if g.unallocated_usd > g.idle_usd + tol:
        out.append(f"{where}: unallocated ${g.unallocated_usd!r} > idle ${g.idle_usd!r}")
    out += _in_unit(where, "util_ratio", g.util_ratio)
    out += _in_unit(where, "bw_ratio", g.bw_ratio)
    return out


def _split_laws(where: str, w: CostWindow, own_usd: float | None) -> list[str]:
    """prompt $ + output $ + idle $ = cost, each ≥ 0; usage-basis and bound dollars within the cost."""
    u = w.usage
    cost = w.cost_usd
    tokens = u.prompt_tokens + u.generation_tokens
    tol = _tol(cost)
    out: list[str] = []
    idle_should = cost if tokens <= 0 else 0.0
    if abs(w.idle_usd - idle_should) > tol:
        out.append(f"{where}: idle ${w.idle_usd!r} with {tokens:g} tokens and cost ${cost!r}")
    prompt = w.prompt_usd or 0.0
    output = cost - prompt - w.idle_usd if tokens > 0 else 0.0
    if prompt > cost + tol or output < -tol:
        out.append(f"{where}: prompt ${prompt!r} + idle ${w.idle_usd!r} > cost ${cost!r}")
    if w.usage_usd is not None and w.usage_usd > cost + tol:
        out.append(f"{where}: usage-basis ${w.usage_usd!r} > cost ${cost!r}")
    if w.bound_usd is not None:
        gpu_usd = cost - (own_usd or 0.0)
        spread = sum(w.bound_usd.values())
        if abs(spread - gpu_usd) > _tol(cost, *w.bound_usd.values()):
            out.append(f"{where}: bound dollars sum to ${spread!r}, its GPU dollars are ${gpu_usd!r}")
    if w.bound_gpu_seconds is not None:
        secs = sum(w.bound_gpu_seconds.values())
        if abs(secs - u.gpu_seconds) > _tol(u.gpu_seconds, *w.bound_gpu_seconds.values()):
            out.append(f"{where}: bound GPU-seconds sum to {secs!r}, the window holds {u.gpu_seconds!r}")
    if u.throttled_gpu_seconds is not None and u.throttled_gpu_seconds > u.gpu_seconds + _tol(u.gpu_seconds):
        out.append(f"{where}: throttled {u.throttled_gpu_seconds!r} GPU-s > {u.gpu_seconds!r} held")
    return out


def _absent_laws(where: str, w: CostWindow) -> list[str]:
    """No ratio without its denominator: none per token without tokens, no $ ratio unpriced."""
    u = w.usage
    tokens = u.prompt_tokens + u.generation_tokens
    out: list[str] = []
    if u.generation_tokens <= 0:
        for name in ("usd_per_1m_output", "roofline_ratio"):
            if getattr(w, name) is not None:
                out.append(f"{where}: {name} = {getattr(w, name)} without output tokens")
    if tokens <= 0:
        for name in ("usd_per_1m_total", "prompt_usd", "prefix_cache_saved_usd"):
            if getattr(w, name) is not None:
                out.append(f"{where}: {name} = {getattr(w, name)} without tokens")
    if not w.priced:
        for name in (
            "usd_per_1m_output",
            "usd_per_1m_total",
            "floor_usd_per_1m_output",
            "floor_usd_per_1m_output_max_batch",
        ):
            if getattr(w, name) is not None:
                out.append(f"{where}: {name} = {getattr(w, name)} of an unpriced cost")
    return out


def _ratio_laws(where: str, w: CostWindow) -> list[str]:
    """$/1M = cost ÷ tokens × 1e6; per total ≤ per output; floor at the largest batch ≤ at the running."""
    u = w.usage
    out: list[str] = []
    for name, per, tokens in (
        ("usd_per_1m_output", w.usd_per_1m_output, u.generation_tokens),
        ("usd_per_1m_total", w.usd_per_1m_total, u.prompt_tokens + u.generation_tokens),
    ):
        if per is not None and abs(per * tokens / PER_MILLION - w.cost_usd) > _tol(w.cost_usd):
            out.append(f"{where}: {name} ${per!r} × {tokens:g} tokens ≠ cost ${w.cost_usd!r}")
    per_out, per_all = w.usd_per_1m_output, w.usd_per_1m_total
    if per_out is not None and per_all is not None and per_all > per_out + _tol(per_out):
        out.append(f"{where}: $/1M of all tokens {per_all!r} > of output tokens {per_out!r}")
    floor, at_max = w.floor_usd_per_1m_output, w.floor_usd_per_1m_output_max_batch
    if floor is not None and at_max is not None and at_max > floor + _tol(floor):
        out.append(f"{where}: floor at the largest batch {at_max!r} > at the running batch {floor!r}")
    return out


def _hardware_laws(
    where: str,
    w: CostWindow,
    spec: EngineSpec | None,
    tick: TickResult,
    read_at: Mapping[tuple[str, str], float],
) -> list[str]:
    """Generation tokens ≤ ceiling × seconds counted; $/1M output ≥ floor where counted over the window."""
    u = w.usage
    if spec is None:
        return [f"{where}: no engine spec named {u.engine}: the hardware laws cannot be checked"]
    out: list[str] = []
    since = read_at.get((u.engine, u.model), u.start)
    seconds = u.end - since
    samples = {g.sample.uuid: g.sample for g in tick.gpus}
    held = engine_gpus(spec, samples)
    ceiling = generation_ceiling([samples[x].name for x in held], spec.weights_bytes, len(spec.gpus))
    bound = ceiling * max(0.0, seconds)
    if u.generation_tokens > bound + _tol(bound):
        out.append(
            f"{where}: {u.generation_tokens:g} generation tokens > ceiling {ceiling:g} tok/s × {seconds:g} s"
        )
    per, floor = w.usd_per_1m_output, w.floor_usd_per_1m_output
    if per is not None and floor is not None and since >= u.start and per < floor - _tol(floor):
        out.append(f"{where}: ${per!r} per 1M output tokens < the roofline's floor ${floor!r}")
    return out


def _conservation_laws(tick: TickResult, prices: PriceTable) -> list[str]:
    """Σ model + Σ unallocated = Σ GPU + own = Σ busy GPU + Σ GPU idle + own; own = prices × the tick."""
    out: list[str] = []
    gpu = sum(g.cost_usd for g in tick.gpus)
    models = sum(w.cost_usd for w in tick.windows)
    unallocated = sum(g.unallocated_usd for g in tick.gpus)
    gpu_idle = sum(g.idle_usd for g in tick.gpus)
    tol = _tol(gpu, models, unallocated, tick.engine_usd, gpu_idle)
    if abs(models + unallocated - gpu - tick.engine_usd) > tol:
        out.append(
            f"tick [{tick.start:.0f}, {tick.end:.0f}]: Σ model ${models!r} + Σ unallocated ${unallocated!r} "
            f"≠ Σ GPU ${gpu!r} + engines' own ${tick.engine_usd!r}"
        )
    dt = tick.end - tick.start
    own = {
        e: gpu_time_cost(p, dt)
        for e in {w.usage.engine for w in tick.windows}
        if (p := prices.engine_usd_per_hour(e)) is not None
    }
    if abs(sum(own.values()) - tick.engine_usd) > tol:
        out.append(
            f"tick [{tick.start:.0f}, {tick.end:.0f}]: engines' own ${tick.engine_usd!r} ≠ their hourly "
            f"prices × {dt:g} s = ${sum(own.values())!r}"
        )
    busy_engines = {w.usage.engine for w in tick.windows if _tokens(w) > 0}
    busy = sum(w.cost_usd - w.idle_usd for w in tick.windows) - sum(own.get(e, 0.0) for e in busy_engines)
    if abs(busy + gpu_idle - gpu) > tol:
        out.append(
            f"tick [{tick.start:.0f}, {tick.end:.0f}]: Σ GPU dollars of models with tokens ${busy!r} + "
            f"Σ GPU idle ${gpu_idle!r} ≠ Σ GPU ${gpu!r}"
        )
    return out


def _own_share(w: CostWindow, tick: TickResult, prices: PriceTable) -> float | None:
    """The engine's own hourly dollars in this window: by its share of the engine's tokens (equal without)."""
    price = prices.engine_usd_per_hour(w.usage.engine)
    if price is None:
        return None
    mine = [x for x in tick.windows if x.usage.engine == w.usage.engine]
    total = sum(x.usage.prompt_tokens + x.usage.generation_tokens for x in mine)
    tokens = w.usage.prompt_tokens + w.usage.generation_tokens
    share = tokens / total if total > 0 else 1.0 / len(mine)
    return gpu_time_cost(price, tick.end - tick.start) * share


def violations(
    tick: TickResult,
    engines: Sequence[EngineSpec],
    prices: PriceTable,
    read_at: Mapping[tuple[str, str], float] | None = None,
) -> list[str]:
    """Every physical law one tick breaks, one line each (see the module docstring); [] when none.

    ``engines`` and ``prices``: what the join priced the tick with (``WindowJoiner.engines``,
    ``.prices``); ``read_at``: (engine, model) → when its generation counter last counted before
    this tick (:func:`counters_read_at`); without it every counter is taken to span its window."""
    read_at = read_at or {}
    specs = {e.name: e for e in engines}
    out: list[str] = []
    if not (math.isfinite(tick.start) and math.isfinite(tick.end) and tick.end >= tick.start):
        out.append(f"tick [{tick.start}, {tick.end}]: not a finite interval")
    if not math.isfinite(tick.engine_usd) or tick.engine_usd < 0:
        out.append(f"tick: engines' own dollars {tick.engine_usd!r}")
    for g in tick.gpus:
        out += _gpu_laws(g)
    held = 0.0
    for w in tick.windows:
        where = _window_name(w)
        u = w.usage
        out += _number_laws(where, w)
        for name in ("gpu_util_ratio", "mem_bw_ratio", "kv_cache_usage_ratio"):
            out += _in_unit(where, name, getattr(u, name))
        out += _in_unit(where, "roofline_ratio", w.roofline_ratio, open_low=True)
        out += _split_laws(where, w, _own_share(w, tick, prices))
        out += _absent_laws(where, w)
        out += _ratio_laws(where, w)
        out += _hardware_laws(where, w, specs.get(u.engine), tick, read_at)
        held += u.gpu_seconds
    rows = len(tick.gpus) * (tick.end - tick.start)
    if held > rows + _tol(rows):
        out.append(f"tick: windows hold {held!r} GPU-seconds of {len(tick.gpus)} GPUs × the tick = {rows!r}")
    if tick.gpus or tick.windows:
        out += _conservation_laws(tick, prices)
    return out


def _read(value: float | None) -> bool:
    """A reading the join's counter arithmetic takes (finite, ≥ 0)."""
    return value is not None and math.isfinite(value) and value >= 0.0


def counters_read_at(
    previous: Mapping[tuple[str, str], float], tick: TickResult, scrapes: Mapping[str, EngineScrape]
) -> dict[tuple[str, str], float]:
    """(engine, model) → when its generation counter last counted, once ``tick`` has read
    ``scrapes``: a scrape that is up with a reading the join took and did not refuse (a refused
    reading keeps the last value, so the next increase spans from the reading before it)."""
    out = dict(previous)
    for name, sc in scrapes.items():
        if not sc.up:
            continue
        for m in sc.models:
            refused = f"{name}/{m.model}/generation_tokens_total/"
            if _read(m.generation_tokens_total) and not any(
                r.startswith(refused) for r in tick.refused_counters
            ):
                out[(name, m.model)] = tick.end
    return out
