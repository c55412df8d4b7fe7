"""One list of engine kinds: the adapter registry. The config's ``kind`` values, the engine table in
docs/engines.md and the adapters must name the same engines, so a new adapter cannot be half-added."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from agent.config import EngineKind
from agent.sources.engines.registry import ADAPTERS

ENGINES_DOC = Path(__file__).resolve().parent.parent / "docs" / "engines.md"


def test_config_kinds_are_the_registry_plus_auto() -> None:
    assert set(get_args(EngineKind)) == set(ADAPTERS) | {"auto"}


def test_every_adapter_is_registered_under_its_own_kind() -> None:
    for kind, adapter in ADAPTERS.items():
        assert adapter.kind == kind


def test_the_engines_page_table_lists_exactly_the_registry() -> None:
    text = ENGINES_DOC.read_text()
    section = text[: text.index("\n## ")]  # the table of what each engine exposes, before the details
    rows = re.findall(r"^\| (\w+) \|", section, re.M)
    kinds = [r for r in rows if r != "engine"]
    assert sorted(kinds) == sorted(ADAPTERS), "docs/engines.md's table and the adapter registry differ"
