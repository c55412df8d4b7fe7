"""The price book: $ per GPU-hour by GPU model (with per-node overrides and effective dates), $ per
hour for CPU-only engines, and optionally $ per kWh and PUE for on-prem power.

A book is a YAML file (see ``agent/data/prices-example.yaml``); a bad book raises ConfigError
naming the file, the key and the fix. A book that loads but prices a GPU model only from a future
date (so its GPUs have no price today) is logged as a warning at load (``infercost check`` and
start-up), naming the entry and the fix (:func:`not_yet_priced`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.config import ConfigError, format_validation_error, load_yaml
from agent.cost.inputs import GpuRate, PowerRate, PriceTable
from agent.hardware import name_tokens

logger = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parents[1] / "data"  # files shipped inside the package
EXAMPLE_BOOK = DATA_DIR / "prices-example.yaml"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuPrice(_Frozen):
    """One price of one GPU model from a date."""

    match: str = Field(min_length=1)  # words of the NVML name (case-insensitive), e.g. "H100 PCIe"
    usd_per_hour: float = Field(ge=0)  # dollars per GPU-hour
    effective_from: dt.date = dt.date(1970, 1, 1)


class NodePrice(_Frozen):
    """A per-node override."""

    usd_per_gpu_hour: float = Field(ge=0)  # dollars per GPU-hour on this node


class EnginePrice(_Frozen):
    """An hourly price for an engine that uses no GPU (or a whole machine)."""

    usd_per_hour: float = Field(ge=0)  # dollars per hour


class PowerPrice(_Frozen):
    """Energy price where the operator pays for power."""

    usd_per_kwh: float = Field(ge=0)  # dollars per kilowatt-hour
    pue: float = Field(1.0, ge=1.0, le=3.0)  # power usage effectiveness of the data centre


class PriceBookModel(_Frozen):
    """The YAML schema of a price book."""

    currency: str = "USD"
    as_of: dt.date | None = None
    source: str | None = None
    gpus: tuple[GpuPrice, ...] = ()
    nodes: dict[str, NodePrice] = Field(default_factory=dict)
    engines: dict[str, EnginePrice] = Field(default_factory=dict)
    power: PowerPrice | None = None


@dataclass(frozen=True, slots=True)
class PriceBook:
    """Lookups over a validated book. Pure: the time of the lookup is passed in."""

    model: PriceBookModel
    source_path: str

    def table(self) -> PriceTable:
        """The book as plain data for the cost layer (effective dates as epoch seconds, 00:00 UTC)."""
        m = self.model
        return PriceTable(
            gpus=tuple(GpuRate(p.match, p.usd_per_hour, _epoch(p.effective_from)) for p in m.gpus),
            nodes={k: v.usd_per_gpu_hour for k, v in m.nodes.items()},
            engines={k: v.usd_per_hour for k, v in m.engines.items()},
            power=PowerRate(m.power.usd_per_kwh, m.power.pue) if m.power is not None else None,
            source=self.source_path,
        )

    def gpu_usd_per_hour(self, gpu_name: str, node: str, at: float) -> float | None:
        """$ per GPU-hour of a GPU named ``gpu_name`` on ``node`` at epoch time ``at``; None if unpriced."""
        return self.table().gpu_usd_per_hour(gpu_name, node, at)

    def engine_usd_per_hour(self, engine: str) -> float | None:
        """$ per hour of a CPU-only (or whole-machine) engine, or None."""
        return self.table().engine_usd_per_hour(engine)

    @property
    def power(self) -> PowerPrice | None:
        """The energy price, when the book prices power."""
        return self.model.power


def _epoch(day: dt.date) -> float:
    """Epoch seconds of 00:00 UTC on ``day``."""
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def parse_price_book(raw: Any, source: str) -> PriceBook:
    """Validate a raw tree into a PriceBook, or raise ConfigError."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a price book must be a mapping (gpus, nodes, engines, power)")
    try:
        return PriceBook(PriceBookModel.model_validate(raw), source)
    except ValidationError as err:
        raise ConfigError(format_validation_error(source, err)) from None


def not_yet_priced(book: PriceBook, now: float) -> list[str]:
    """Warnings for GPU prices that are all in the future at ``now`` (epoch seconds): for the whole
    book when no GPU price is in effect, else for each GPU model priced only from a later date."""
    gpus = book.model.gpus
    future = [(i, p) for i, p in enumerate(gpus) if _epoch(p.effective_from) > now]
    if not future:
        return []
    fix = "fix: give it an effective_from on or before today (or none), or add an entry that is in effect"
    if len(future) == len(gpus):
        i, first = min(future, key=lambda ip: ip[1].effective_from)
        return [
            f"{book.source_path}: no GPU price is in effect now: the earliest, gpus[{i}] (match "
            f"{first.match!r}), takes effect on {first.effective_from}, so every GPU is unpriced (its "
            f"cost absent) until then; {fix}"
        ]
    current = {name_tokens(p.match) for p in gpus if _epoch(p.effective_from) <= now}
    out, said = [], set()
    for i, p in sorted(future, key=lambda ip: ip[1].effective_from):
        words = name_tokens(p.match)
        if words in current or words in said:
            continue
        said.add(words)
        out.append(
            f"{book.source_path}: gpus[{i}] (match {p.match!r}) takes effect on {p.effective_from} and "
            f"no price for {p.match!r} is in effect now: until then those GPUs take a less specific "
            f"entry's price, or none; {fix}"
        )
    return out


def load_price_book(path: Path | None, now: float | None = None) -> PriceBook:
    """Load a book from a file, or the bundled example when ``path`` is None; a price that is not in
    effect yet at ``now`` (epoch seconds, default the wall clock) is logged (:func:`not_yet_priced`)."""
    if path is None:
        book = parse_price_book(load_yaml(EXAMPLE_BOOK), f"(bundled example) {EXAMPLE_BOOK}")
    else:
        book = parse_price_book(load_yaml(path), str(path))
    for warning in not_yet_priced(book, time.time() if now is None else now):
        logger.warning("%s", warning)
    return book
