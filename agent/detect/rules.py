"""Threshold rules over 1-minute records: the schema and the loader (the evaluator is
:mod:`agent.detect.evaluator`).

API (pure: no clock, no I/O except reading rule files in :func:`load_rules`)::

    rules = load_rules([Path("rules/agent")])     # files or folders of *.yaml; raises RuleError
    rules = load_default_rules()                  # the bundled set (agent/data/rules/agent/)
    ev = RuleEvaluator(rules)                     # agent.detect.evaluator
    for minute in minutes:                        # epoch seconds, start of each minute, ascending
        findings = ev.step(minute + 60, records_of_that_minute)   # list[Finding]
    # then the lifecycle: agent.detect.alerts.AlertManager(rules).step(findings, now)

A :class:`MinuteRecord` is one minute of one series, as *sums* (seconds, tokens, dollars, and
value × seconds / seconds pairs for gauges), so that any window's value is a ratio of sums.
Build one from a priced window with :func:`record_from_cost_window`, or directly (benchmarks).
Kinds and their labels: ``model`` (node, engine, model, model_version), ``engine`` (node, engine),
``gpu`` (node, gpu), ``node`` (node).

A rule (YAML, ``rules:`` list; the full schema is in ``rules/agent/README.md``)::

    - id: cost_per_token_regression          # [a-z][a-z0-9_]*, unique across files
      alert: InfercostEngineCostPerTokenRegression   # optional: the alertname (default: the id)
      signal: usd_per_1m_output_tokens       # one of SIGNALS (the catalogue's names, no prefix)
      over: 5m                               # the current value is the signal over this window
      op: ">"                                # > >= < <=
      threshold: 50                          # either an absolute threshold ...
      baseline:                              # ... or factor × a trailing baseline
        window: 7d
        stat: mean                           # mean (ratio of sums) | median | p90 | p99 ...
        like_load: {band_ratio: 2.0, min_tokens_per_second: 5}
        same_hour_of_week: false
        across_versions: true                # the model's history across versions (deploys)
        min_minutes: 60
      factor: 1.5
      where: [{signal: generation_tokens_per_second, op: ">=", value: 5}]
      match: {model: "llama-.*"}             # optional: only series whose labels fully match
      group_by: [node]                       # optional: sum the records of these labels first
      for: 15m
      keep_firing_for: 10m
      severity: warning                      # critical | error | warning | info
      summary: "$/1M output tokens of {model} {model_version} is {value} ({change_pct} vs baseline)"
      description: "..."
      runbook_url: https://...

A finding is emitted for each series whose condition holds at that minute; the alert lifecycle
(``for``, ``keep_firing_for``) lives in :mod:`agent.detect.alerts`. Evaluating one minute costs
O(rules × series): weeks of minutes evaluate in seconds.
"""

from __future__ import annotations

import logging
import math
import operator
import re
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from agent.config import MAX_RETENTION_DAYS
from agent.records import KIND_LABELS, MINUTE, SIGNALS, Kind
from agent.safe_regex import UnsafeRegexError, compile_safe

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# Why the store's longest retention: a window, `for` or baseline longer than the history the store
# can ever hold is never evaluated (a `for` never elapses, a baseline never fills), so the rule
# would look armed while it can never fire.
MAX_DURATION_SECONDS = MAX_RETENTION_DAYS * 86400.0
Op = Literal[">", ">=", "<", "<="]
OPS: Mapping[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


class RuleError(Exception):
    """A rule file is unusable; the message names the file, the rule id and the fix."""


def _bounded(seconds: float, v: Any) -> float:
    """``seconds`` when it is at most :data:`MAX_DURATION_SECONDS`, else the error saying why."""
    if seconds > MAX_DURATION_SECONDS:
        raise PydanticCustomError(
            "duration_too_long",
            "{value} is longer than the store can ever hold ({max_days}d, store.retention_days at its "
            "maximum): it could never be evaluated",
            {"value": repr(v), "max_days": MAX_RETENTION_DAYS},
        )
    return seconds


def parse_duration(v: Any) -> float:
    """Seconds from "90s", "15m", "1h", "7d", "1w" or a number of seconds (at most the store's
    longest retention, :data:`MAX_DURATION_SECONDS`)."""
    if isinstance(v, bool):
        raise ValueError("a duration like 15m, 1h or 7d")
    if isinstance(v, int | float):
        if not math.isfinite(v):
            raise ValueError(f"{v!r} is not a duration; write it like 30s, 15m, 1h or 7d")
        if v < 0:
            raise ValueError("a duration must be ≥ 0")
        return _bounded(float(v), v)
    if isinstance(v, str):
        m = _DURATION.match(v)
        if m:
            return _bounded(float(m.group(1)) * _UNIT_SECONDS[m.group(2)], v)
    raise ValueError(f"{v!r} is not a duration; write it like 30s, 15m, 1h or 7d")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Guard(_Frozen):
    """A condition that must also hold over the rule's window (e.g. a minimum traffic)."""

    signal: str
    op: Op
    value: float


class LikeLoad(_Frozen):
    """Compare like with like: only baseline minutes at a similar generation load count."""

    # Why bands of ×2: cost per token falls steeply with batch size, so a night at a tenth of the
    # day's load is not comparable, while a factor of two keeps enough minutes in each band.
    band_ratio: float | None = Field(2.0, gt=1.0)  # width of a load band (ratio); None = no bands
    min_tokens_per_second: float | None = Field(None, ge=0)  # tokens/s, both now and in the baseline
    # What "load" is for the bands. Tokens/s is an output: a build that got slower makes fewer
    # tokens/s at the same demand and would be compared with quieter hours. Requests in flight
    # (concurrency) is the demand the engine is asked to carry and does not fall when it slows.
    signal: Literal["generation_tokens_per_second", "requests_running"] = "generation_tokens_per_second"
    # When the current band has too little history (a regression that holds more requests in flight
    # moves into a band the week never reached), compare with the next band down: a lower load, whose
    # cost per token is higher and tokens per GPU-second lower, so the comparison stays conservative
    # for those signals. Not for signals that rise with load (TTFT): leave it "none" there.
    fallback: Literal["none", "lower"] = "none"
    # Read the baseline at the window's own load, between the two nearest bands' baselines
    # (geometric, by where the load sits between their centres), not the band's one figure: cost
    # per token moves ~1.5× across a ×1.5 band at low load, so a window at the band's low edge was
    # compared with minutes mostly near its high edge (an evening's fall in load read as +20 %).
    # Where the nearer neighbour has no baseline, the slope from the band on the other side is
    # carried on; with neither, the band's own figure. Where the window's own band has too little
    # history but both neighbours have, the baseline is read between the two of them at the
    # window's load (with `fallback: lower` and only the band below, that band's figure).
    between_bands: bool = False
    # Read every minute of the window against its own band's baseline (at its own load and mix),
    # and compare the window with the mean of those, weighted by each minute's share of the
    # signal's denominator, instead of reading the window's mean load in one band. Why: on a
    # bursty node the load hops between bands from minute to minute (batches filling to their cap
    # and draining), so a window's mean load lands in a band few of its minutes were in, often
    # one with little or no history of its own: the window was compared with the wrong band, or
    # with none. Only for signals that are a ratio over their last input (cost per token, rates,
    # gauge means).
    per_minute: bool = False


class LikeMix(_Frozen):
    """Compare like with like: only baseline minutes with a similar prompt/output token ratio count."""

    # Why bands of ×1.5: a request mix wanders ±10–25 % over a day, which stays within one or two
    # bands, while a shift to RAG-like long prompts and short answers (ratio ×2 or more) lands in
    # another band; $/1M output tokens rises with that ratio without anything getting less efficient.
    band_ratio: float = Field(1.5, gt=1.0)  # width of a mix band (ratio of prompt/output ratios)


class BaselineSpec(_Frozen):
    """Which trailing baseline a rule compares against."""

    window: float = 7 * 86400.0  # seconds (write 7d, 1d, 28d ...)
    stat: str = "mean"  # mean | median | pNN
    like_load: LikeLoad | None = None
    like_mix: LikeMix | None = None  # a mix never seen in the window has no baseline: no alert
    same_hour_of_week: bool = False
    across_versions: bool = True  # the model's history across versions, so a deploy shows up
    # Why 60: fewer than an hour of comparable minutes is noise, not a baseline.
    min_minutes: int = Field(60, ge=1)
    # Minutes younger than this do not join the baseline yet (None: the rule's over + for), so a
    # regression is not averaged into its own baseline while its `for` runs.
    exclude_recent: float | None = None  # seconds (write 30m, 1h ...)
    # A bucket's oldest minute must be at least this old (seconds; write 1d): a like-for-like baseline
    # made only of today's minutes of a new load or mix is today's traffic compared with itself.
    min_age: float = 0.0

    @field_validator("window", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return parse_duration(v)

    @field_validator("exclude_recent", mode="before")
    @classmethod
    def _dur_opt(cls, v: Any) -> float | None:
        return None if v is None else parse_duration(v)

    @field_validator("min_age", mode="before")
    @classmethod
    def _age(cls, v: Any) -> float:
        return parse_duration(v)

    @field_validator("stat")
    @classmethod
    def _stat(cls, v: str) -> str:
        if v in ("mean", "median") or re.fullmatch(r"p\d{1,2}(\.\d+)?", v):
            return v
        raise ValueError("stat must be mean, median or a percentile like p90")

    @property
    def quantile(self) -> float | None:
        """The quantile (0–1) for median / pNN, None for mean."""
        if self.stat == "mean":
            return None
        if self.stat == "median":
            return 0.5
        return float(self.stat[1:]) / 100.0


TEMPLATE_FIELDS = frozenset(
    {"value", "baseline", "threshold", "change_pct", "since", "deploy", "price_change", "rule_id"}
    | {"severity", "unit"}
    | {lbl for labels in KIND_LABELS.values() for lbl in labels}
)


class Rule(_Frozen):
    """One threshold rule (see the module docstring and rules/agent/README.md)."""

    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    # The alert's name (the `alertname` label), shared with the fleet rules where both raise the
    # same condition (rules/agent/README.md#alert-names); unset: the id. The id stays the rule's
    # key (store, outbox, dedup keys, benchmarks) and goes out as the `rule_id` label.
    alert: str | None = Field(None, pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    signal: str
    over: float = 300.0  # seconds
    op: Op
    threshold: float | None = None
    baseline: BaselineSpec | None = None
    factor: float | None = Field(None, gt=0)
    where: tuple[Guard, ...] = ()
    match: dict[str, str] = Field(default_factory=dict)  # label -> regex (full match), e.g. model: "llama-.*"
    group_by: tuple[str, ...] | None = None
    for_: float = Field(0.0, alias="for")  # seconds
    keep_firing_for: float = 0.0  # seconds
    severity: Literal["critical", "error", "warning", "info"]
    summary: str
    description: str = ""
    runbook_url: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("over", "for_", "keep_firing_for", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return parse_duration(v)

    @property
    def kind(self) -> Kind:
        """The kind of records the rule reads (from its signal)."""
        return SIGNALS[self.signal].kind

    @model_validator(mode="after")
    def _check(self) -> Rule:
        if self.signal not in SIGNALS:
            raise ValueError(f"unknown signal {self.signal!r}; use one of: {', '.join(sorted(SIGNALS))}")
        kind = SIGNALS[self.signal].kind
        if self.over < MINUTE:
            raise ValueError("'over' must be at least 1m (records are 1-minute rollups)")
        self._check_where(kind)
        if (self.threshold is None) == (self.baseline is None):
            raise ValueError("give exactly one of 'threshold' (absolute) or 'baseline' (with 'factor')")
        if self.baseline is not None:
            self._check_baseline(kind)
        elif self.factor is not None:
            raise ValueError("'factor' only applies with 'baseline'; remove it or add a baseline")
        self._check_labels(kind)
        for name, text in (("summary", self.summary), ("description", self.description)):
            _check_template(name, text)
        return self

    def _check_where(self, kind: Kind) -> None:
        """Every 'where' guard reads a known signal of the rule's own kind."""
        for g in self.where:
            if g.signal not in SIGNALS:
                raise ValueError(
                    f"unknown signal {g.signal!r} in 'where'; use one of: {', '.join(sorted(SIGNALS))}"
                )
            if SIGNALS[g.signal].kind != kind:
                raise ValueError(
                    f"'where' signal {g.signal!r} is per {SIGNALS[g.signal].kind}, but {self.signal!r} is "
                    f"per {kind}; use signals of the same kind"
                )

    def _check_baseline(self, kind: Kind) -> None:
        """A baseline rule has a factor, and like-load / like-mix only on signals that allow them."""
        assert self.baseline is not None
        if self.factor is None:
            raise ValueError("a 'baseline' rule needs 'factor' (e.g. 1.5 for 50 % above the baseline)")
        like_load, like_mix = self.baseline.like_load, self.baseline.like_mix
        if like_load is not None and kind != "model":
            raise ValueError("'like_load' needs a per-model signal (it reads tokens/s)")
        if like_load is not None and like_load.per_minute and not SIGNALS[self.signal].over_last_input:
            raise ValueError(
                f"'like_load.per_minute' needs a signal that is a ratio over its last input; "
                f"{self.signal!r} is not: remove per_minute"
            )
        if like_mix is not None and kind != "model":
            raise ValueError("'like_mix' needs a per-model signal (it reads prompt and output tokens)")

    def _check_labels(self, kind: Kind) -> None:
        """'match' and 'group_by' name labels the kind's series have; match patterns are safe."""
        for lbl, rx in self.match.items():
            if lbl not in KIND_LABELS[kind]:
                raise ValueError(
                    f"match label {lbl!r} is not a label of {kind} series; use some of {KIND_LABELS[kind]}"
                )
            try:
                compile_safe(rx)
            except UnsafeRegexError as err:
                raise ValueError(f"match.{lbl}: {err}") from None
        if self.group_by is not None:
            bad = [g for g in self.group_by if g not in KIND_LABELS[kind]]
            if bad:
                raise ValueError(
                    f"group_by {bad} are not labels of {kind} series; use some of {KIND_LABELS[kind]}"
                )

    def alert_labels(self) -> dict[str, str]:
        """The labels naming the alert: ``alertname`` (``alert``, else the id) and ``severity``,
        and ``rule_id`` when the name is not the id."""
        if self.alert is None:
            return {"alertname": self.id, "severity": self.severity}
        return {"alertname": self.alert, "severity": self.severity, "rule_id": self.id}

    def group_labels(self) -> tuple[str, ...]:
        """The labels that identify one series of this rule."""
        return self.group_by if self.group_by is not None else KIND_LABELS[self.kind]


def _check_template(name: str, text: str) -> None:
    """Refuse a summary/description template that could do more than paste a known field as text:
    format specs (``{value:>99999999999}`` allocates gigabytes), conversions (``{value!r}``),
    attribute or index access (``{labels.__class__}``, ``{labels[0]}``) and unknown fields."""
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as err:
        raise ValueError(f"{name}: bad template ({err}); escape braces as {{{{ }}}}") from None
    for _, field_name, spec, conversion in parts:
        if field_name is None:
            continue
        if spec or conversion:
            raise ValueError(
                f"{name}: placeholder {{{field_name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} has a conversion or format spec; "
                f"placeholders take none, write {{{field_name}}}"
            )
        if not field_name.isidentifier():
            raise ValueError(
                f"{name}: placeholder {{{field_name}}} uses attribute or index access (or is empty); "
                f"write a plain field such as {{value}}: one of {sorted(TEMPLATE_FIELDS)}"
            )
        if field_name not in TEMPLATE_FIELDS:
            raise ValueError(
                f"{name} uses unknown placeholders {[field_name]}; use some of {sorted(TEMPLATE_FIELDS)}"
            )


@dataclass(frozen=True, slots=True)
class RuleSet:
    """Validated rules in load order, with the file each came from."""

    rules: tuple[Rule, ...]
    sources: Mapping[str, str] = field(default_factory=dict)  # rule id -> file

    def __iter__(self) -> Any:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def get(self, rule_id: str) -> Rule | None:
        """The rule with this id, if any."""
        for r in self.rules:
            if r.id == rule_id:
                return r
        return None


_FIXES = {
    "extra_forbidden": "remove it or check its spelling (see rules/agent/README.md)",
    "missing": "add it",
    "literal_error": "use one of the allowed values",
    "duration_too_long": f"write a duration of at most {MAX_RETENTION_DAYS}d, such as 15m, 1h or 7d",
}


def _rule_error(source: str, rule_id: str, err: ValidationError) -> RuleError:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(rule)"
        key = key.replace("for_", "for")
        msg = e["msg"].removeprefix("Value error, ")
        fix = _FIXES.get(e["type"], "correct the value")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"{source}: rule '{rule_id}': key '{key}': {msg}; fix: {fix}")
    return RuleError("\n".join(lines))


def parse_rules(raw: Any, source: str) -> list[Rule]:
    """Validate the parsed YAML of one rule file; raise RuleError naming file, rule and fix."""
    if raw is None:
        return []
    if not isinstance(raw, dict) or set(raw) - {"rules"} or not isinstance(raw.get("rules", []), list):
        raise RuleError(
            f"{source}: the top level must be a mapping with one key 'rules:' holding a list of rules"
        )
    out: list[Rule] = []
    for i, item in enumerate(raw.get("rules") or []):
        rule_id = item.get("id", f"#{i + 1}") if isinstance(item, dict) else f"#{i + 1}"
        if not isinstance(item, dict):
            raise RuleError(
                f"{source}: rule '{rule_id}': a rule must be a mapping; fix: see rules/agent/README.md"
            )
        try:
            out.append(Rule.model_validate(item))
        except ValidationError as err:
            raise _rule_error(source, str(rule_id), err) from None
    return out


def _rule_files(paths: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(f for f in p.iterdir() if f.suffix in (".yaml", ".yml") and f.is_file()))
        elif p.exists():
            files.append(p)
        else:
            raise RuleError(f"{p}: no such rule file or folder; fix: check alerts.rules_dirs")
    return files


def load_rules(paths: Iterable[Path]) -> RuleSet:
    """Load and validate rule files (folders: their *.yaml / *.yml). Ids must be unique."""
    rules: list[Rule] = []
    sources: dict[str, str] = {}
    for f in _rule_files(paths):
        try:
            raw = yaml.safe_load(f.read_text(encoding="utf-8"))
        except OSError as err:
            raise RuleError(f"{f}: cannot read: {err.strerror}; fix: check the path") from None
        except UnicodeDecodeError as err:
            raise RuleError(
                f"{f}: not UTF-8 text (offset {err.start}); fix: save the file as UTF-8"
            ) from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise RuleError(f"{f}: not valid YAML{where}: {getattr(err, 'problem', err)}") from None
        for r in parse_rules(raw, str(f)):
            if r.id in sources:
                raise RuleError(
                    f"{f}: rule '{r.id}': the id is already used in {sources[r.id]}; "
                    "fix: give each rule a unique id"
                )
            sources[r.id] = str(f)
            rules.append(r)
    return RuleSet(tuple(rules), sources)


def default_rules_dir() -> Path:
    """The bundled default rule set (agent/data/rules/agent → rules/agent in a checkout)."""
    return Path(__file__).resolve().parent.parent / "data" / "rules" / "agent"


def load_default_rules() -> RuleSet:
    """The bundled default rules."""
    return load_rules([default_rules_dir()])
