"""The table of measures (``agent/data/measures.csv``): every quantity infercost exports, stores or
lets a rule read, declared once, as data.

One row per measure; the columns (the file's header):

- ``name``: the Prometheus name without the ``infercost_`` namespace (counters end in ``_total``);
  for a rule signal or a stored sum that is not exported, its own name.
- ``kind``: ``gauge`` | ``counter`` | ``histogram`` (exported on ``/metrics`` and OTLP), ``signal``
  (a rule signal only) or ``stored`` (a column of the history only).
- ``unit`` (UCUM, as the catalogue states it), ``help``.
- ``source``: the snapshot collection an exported row reads (node, build, gpu, engine, model,
  deploy, alert, outbox, budget), which is also the record kind of its history (model, gpu, engine, node).
- ``labels``: labels beyond the source's own (:data:`BASE_LABELS`), space-separated.
- ``field``: the attribute read on each item of the source; empty for a measure the ledger derives
  from its aggregation (see :mod:`agent.snapshot`).
- ``aggregation`` and ``store``: how the measure combines over a window, in stored sums:
  ``sum`` — a counter's sum (``store`` one sum, or sums added and subtracted: ``a - b``);
  ``mean`` — a time-weighted gauge (``store`` the pair ``<name>.s`` value × seconds, ``<name>.w``
  seconds with a value); ``ratio`` — a ratio of sums, ``num / den`` or ``num / den * k`` with
  ``num`` and ``den`` one sum or a parenthesised ``(a + b - c)``. A row with an aggregation is a
  rule signal (a counter's signal drops ``_total``: ``preemptions``).
- ``since``: the history schema version that added the row's store column (``store`` then names
  one column, or one gauge pair); empty where the row reads columns declared by other rows.
- ``window``: the attribute of a priced window (:class:`agent.samples.CostWindow`, or of the GPU's
  NVML sample for a GPU column) that the stored sum is built from; empty where an adapter in the
  store or :mod:`agent.records` writes it.
- ``signal_unit``: the unit rule messages print (``USD``, ``ratio``, ``tokens/s``).
- ``otel`` and ``otel_unit``: the OTLP name (``-``: not sent as its own metric; ``name{k=v,…}``:
  several rows as one metric told apart by those attributes) and its UCUM unit.

Adding a measure is one row here plus, where its value is new, one adapter entry (a window
attribute, or a snapshot field); see docs/CONTRIBUTING.md.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Literal, cast

Kind = Literal["gauge", "counter", "histogram", "signal", "stored"]
Aggregation = Literal["sum", "mean", "ratio", ""]
COLUMNS = (
    "name",
    "kind",
    "unit",
    "source",
    "labels",
    "field",
    "aggregation",
    "store",
    "since",
    "window",
    "signal_unit",
    "otel",
    "otel_unit",
    "help",
)
EXPORTED: tuple[Kind, ...] = ("gauge", "counter", "histogram")
KINDS: tuple[Kind, ...] = (*EXPORTED, "signal", "stored")
AGGREGATIONS: tuple[Aggregation, ...] = ("sum", "mean", "ratio", "")
# The labels every row of a source carries, first and in this order.
BASE_LABELS: dict[str, tuple[str, ...]] = {
    "build": ("node",),
    "node": ("node",),
    "gpu": ("node", "gpu"),
    "engine": ("node", "engine"),
    "model": ("node", "engine", "model", "model_version"),
    "deploy": ("node", "engine", "model", "model_version"),
    "alert": ("node",),
    "outbox": ("node",),
    "budget": ("node",),
}
RECORD_KINDS = ("model", "engine", "gpu", "node")  # sources that have a history table
_NAME = re.compile(r"^[a-z_][a-z0-9_]*(\.[sw])?$")


class MeasureError(ValueError):
    """The table is malformed (a bad row: its line, column and what to write instead)."""


Term = tuple[int, str]  # (+1 or -1, sum name)


@dataclass(frozen=True, slots=True)
class Formula:
    """A measure's aggregation over stored sums: Σ ±num [/ Σ ±den × scale]."""

    num: tuple[Term, ...]
    den: tuple[Term, ...] = ()
    scale: float = 1.0

    @property
    def inputs(self) -> tuple[str, ...]:
        """The sums it reads, numerator first (a sum may appear in both)."""
        return tuple(n for _, n in (*self.num, *self.den))

    @property
    def over_last_input(self) -> bool:
        """A ratio whose denominator is one sum, the last input: a window's value is the mean of its
        minutes' values weighted by that sum."""
        return len(self.den) == 1 and self.den[0][0] == 1

    def function(self) -> Callable[[Sequence[float]], float | None]:
        """The formula over a vector of its inputs' values (None where the denominator is ≤ 0)."""
        signs = [s for s, _ in self.num]
        k = len(self.num)
        dsigns = [s for s, _ in self.den]
        scale = self.scale
        if not self.den:
            if signs == [1]:
                return lambda v: v[0]
            return lambda v: _signed(signs, v, 0)
        if signs == [1] and dsigns == [1]:
            if scale == 1.0:
                return lambda v: v[0] / v[1] if v[1] > 0 else None
            return lambda v: v[0] / v[1] * scale if v[1] > 0 else None

        def ratio(v: Sequence[float]) -> float | None:
            d = _signed(dsigns, v, k)
            if d <= 0:
                return None
            out = _signed(signs, v, 0) / d
            return out * scale if scale != 1.0 else out

        return ratio


def _signed(signs: Sequence[int], v: Sequence[float], at: int) -> float:
    total = 0.0
    for i, s in enumerate(signs):
        total = total + v[at + i] if s > 0 else total - v[at + i]
    return total


@dataclass(frozen=True, slots=True)
class Measure:
    """One row of the table (see the module docstring for the columns)."""

    name: str
    kind: Kind
    unit: str
    source: str
    labels: tuple[str, ...]  # all of them: the source's own, then the row's
    field: str
    aggregation: Aggregation
    store: str
    since: int | None
    window: str
    signal_unit: str
    otel: str
    otel_unit: str
    help: str
    formula: Formula | None = None

    @property
    def exported(self) -> bool:
        """On /metrics (and OTLP unless ``otel`` is ``-``)."""
        return self.kind in EXPORTED

    @property
    def signal(self) -> str | None:
        """The rule signal's name (a counter's without ``_total``), or None."""
        if not self.aggregation or self.kind == "stored":
            return None
        if self.kind == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name

    @property
    def columns(self) -> tuple[str, ...]:
        """The store columns this row adds (``since`` set): one sum, or a gauge's two."""
        if self.since is None:
            return ()
        if self.aggregation == "mean":
            return (f"{self.store}_s", f"{self.store}_w")
        return (self.store,)


def parse_formula(aggregation: str, text: str) -> Formula:
    """The formula of a ``store`` cell (see the module docstring)."""
    text = text.strip()
    if aggregation == "mean":
        _check_name(text)
        return Formula(((1, f"{text}.s"),), ((1, f"{text}.w"),))
    scale = 1.0
    if aggregation == "ratio":
        num, sep, rest = text.partition(" / ")
        if not sep:
            raise MeasureError(f"ratio {text!r} has no ' / '")
        den, star, k = rest.partition(" * ")
        if star:
            scale = float(k)
        return Formula(_terms(num), _terms(den), scale)
    return Formula(_terms(text))


def _terms(text: str) -> tuple[Term, ...]:
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    out: list[Term] = []
    sign = 1
    for tok in text.split():
        if tok in ("+", "-"):
            sign = 1 if tok == "+" else -1
            continue
        _check_name(tok)
        out.append((sign, tok))
        sign = 1
    if not out:
        raise MeasureError(f"no sum named in {text!r}")
    return tuple(out)


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise MeasureError(f"{name!r} is not a sum name (lower case, digits, _; a gauge's .s / .w)")


def parse(text: str, where: str = "measures.csv") -> tuple[Measure, ...]:
    """The rows of a table in CSV (header :data:`COLUMNS`)."""
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise MeasureError(f"{where}: header must be {','.join(COLUMNS)}")
    out = []
    lines: dict[str, int] = {}
    for row in reader:
        line = reader.line_num
        try:
            out.append(_measure(row))
        except (MeasureError, ValueError) as err:
            raise MeasureError(f"{where}:{line} ({row.get('name')}): {err}") from None
        lines.setdefault(out[-1].name, line)
    _check_table(out, where, lines)
    return tuple(out)


def _measure(row: dict[str, str]) -> Measure:
    kind, source, agg = row["kind"], row["source"], row["aggregation"]
    if kind not in KINDS:
        raise MeasureError(f"kind {kind!r}; fix: one of {', '.join(KINDS)}")
    if source not in BASE_LABELS:
        raise MeasureError(f"source {source!r}; fix: one of {', '.join(BASE_LABELS)}")
    if agg not in AGGREGATIONS:
        raise MeasureError(f"aggregation {agg!r}; fix: sum, mean, ratio or empty")
    if agg and source not in RECORD_KINDS:
        raise MeasureError(f"source {source!r} has no history; fix: leave aggregation empty")
    if kind in ("signal", "stored") and not agg:
        raise MeasureError(f"a {kind} row needs an aggregation")
    if kind in EXPORTED and not row["otel"]:
        raise MeasureError("an exported row needs an OTLP name (or '-')")
    since = int(row["since"]) if row["since"] else None
    formula = parse_formula(agg, row["store"]) if agg else None
    if since is not None and (formula is None or len(formula.num) != 1 or agg == "ratio"):
        raise MeasureError("a row that adds a store column (since) names one sum or one gauge")
    _check_name(row["name"])
    agg_value = cast(Aggregation, agg)  # checked above
    kind_value = cast(Kind, kind)
    return Measure(
        name=row["name"],
        kind=kind_value,
        unit=row["unit"],
        source=source,
        labels=(*BASE_LABELS[source], *row["labels"].split()),
        field=row["field"],
        aggregation=agg_value,
        store=row["store"].strip(),
        since=since,
        window=row["window"],
        signal_unit=row["signal_unit"],
        otel=row["otel"],
        otel_unit=row["otel_unit"],
        help=row["help"],
        formula=formula,
    )


def _check_table(rows: Sequence[Measure], where: str, lines: dict[str, int]) -> None:
    names = [m.name for m in rows]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise MeasureError(f"{where}: names declared twice: {sorted(dup)}")
    signals = [m.signal for m in rows if m.signal]
    dup_s = {s for s in signals if signals.count(s) > 1}
    if dup_s:
        raise MeasureError(f"{where}: rule signals declared twice: {sorted(dup_s)}")
    cols = [(m.source, c) for m in rows for c in m.columns]
    dup_c = {c for c in cols if cols.count(c) > 1}
    if dup_c:
        raise MeasureError(f"{where}: store columns declared twice: {sorted(dup_c)}")
    declared = {(m.source, n) for m in rows if m.since is not None and m.formula for n in m.formula.inputs}
    for m in rows:
        for n in m.formula.inputs if m.formula else ():
            if (m.source, n) not in declared:
                raise MeasureError(
                    f"{where}:{lines.get(m.name, 0)} ({m.name}): reads {n!r}, which no {m.source} row "
                    "stores; fix: add a row with since set that stores it"
                )


def load() -> tuple[Measure, ...]:
    """The package's table."""
    text = resources.files("agent").joinpath("data/measures.csv").read_text(encoding="utf-8")
    return parse(text, "agent/data/measures.csv")


MEASURES: tuple[Measure, ...] = load()


def exported(rows: Sequence[Measure] | None = None) -> tuple[Measure, ...]:
    """The rows on /metrics, in table order."""
    return tuple(m for m in (MEASURES if rows is None else rows) if m.exported)
