"""Every engine adapter by kind, and engine detection from a page (``kind: auto``)."""

from __future__ import annotations

import re

from agent.sources.engines import llamacpp, sglang, tgi, triton, trtllm, vllm
from agent.sources.engines.base import Adapter

ADAPTERS: dict[str, Adapter] = {
    a.kind: a
    for a in (vllm.ADAPTER, sglang.ADAPTER, tgi.ADAPTER, triton.ADAPTER, trtllm.ADAPTER, llamacpp.ADAPTER)
}

# Newer prometheus_client releases answer an OpenMetrics Accept header with names "escaped" to
# underscores (vllm:x → vllm_x): recognise both spellings.
_BY_PREFIX: dict[str, str] = {
    spelling: a.kind for a in ADAPTERS.values() for p in a.prefixes for spelling in {p, p.replace(":", "_")}
}
_DETECT_RE = re.compile(
    r"^[ \t]*(" + "|".join(re.escape(p) for p in sorted(_BY_PREFIX, key=len, reverse=True)) + ")",
    re.MULTILINE,
)


def detect_kind(text: str) -> str | None:
    """The engine kind of the first sample line with a known prefix, or None (comments don't count)."""
    m = _DETECT_RE.search(text)
    return _BY_PREFIX[m.group(1)] if m else None
