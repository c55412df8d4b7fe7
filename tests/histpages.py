"""Test helper: an engine's real /metrics page moved on as the engine would move it.

:func:`advance` adds observations to one histogram family of a page (every ``_bucket`` at or
above each observation's bucket, ``_count`` and ``_sum``), for the series whose labels match;
:func:`restart` sets a family back to zero, as a restarted engine would. Everything else on the
page stays as captured. Observations are given as {bucket upper bound: how many fall in it}.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PAGES = ROOT / "fixtures" / "expositions"

_LINE = re.compile(r"^(?P<name>[^{\s]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _labels(text: str) -> dict[str, str]:
    return dict(_LABEL.findall(text))


def _fmt(v: float) -> str:
    return repr(float(v))


def _edit(
    page: str,
    family: str,
    where: Mapping[str, str],
    bucket: object,
    count: object,
    total: object,
) -> str:
    out = []
    for line in page.splitlines():
        m = _LINE.match(line)
        if m is None or not m["name"].startswith(family + "_"):
            out.append(line)
            continue
        labels = _labels(m["labels"])
        if any(labels.get(k) != v for k, v in where.items()):
            out.append(line)
            continue
        value = float(m["value"])
        suffix = m["name"][len(family) :]
        if suffix == "_bucket":
            le = labels["le"]
            value = bucket(value, math.inf if le == "+Inf" else float(le))  # type: ignore[operator]
        elif suffix == "_count":
            value = count(value)  # type: ignore[operator]
        elif suffix == "_sum":
            value = total(value)  # type: ignore[operator]
        out.append(f"{m['name']}{{{m['labels']}}} {_fmt(value)}")
    return "\n".join(out) + "\n"


def advance(
    page: str,
    family: str,
    where: Mapping[str, str],
    observations: Mapping[float, int],
    seconds: float,
) -> str:
    """The page after ``observations`` ({bucket bound: n}) of ``seconds`` in total were recorded."""
    n = sum(observations.values())
    return _edit(
        page,
        family,
        where,
        lambda v, le: v + sum(k for b, k in observations.items() if b <= le),
        lambda v: v + n,
        lambda v: v + seconds,
    )


def restart(page: str, family: str, where: Mapping[str, str]) -> str:
    """The page of a restarted engine: the family's buckets, count and sum back at zero."""
    return _edit(page, family, where, lambda v, le: 0.0, lambda v: 0.0, lambda v: 0.0)
