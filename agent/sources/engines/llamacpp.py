"""llama.cpp server (``--metrics``): ``llamacpp:*`` series, no labels, one model per server.

Source-verified names: ``reference/ENGINE_METRICS.md`` §5. Only the ``_total`` counters are read:
the ``*_tokens_seconds`` throughput gauges are averaged since the *previous scrape*, so two
scrapers (the agent and a Prometheus) would corrupt each other's readings. Prompt tokens are the
processed plus the cache-reused ones (``prompt_tokens_total`` excludes cached tokens), matching
vLLM's meaning and the ``usage.prompt_tokens`` a client sees. No histograms, no KV-usage series.
"""

from __future__ import annotations

from agent.sources.engines.base import Adapter, Series

ADAPTER = Adapter(
    kind="llamacpp",
    prefixes=("llamacpp:",),
    model_label=None,
    scalars={
        "prompt_tokens_total": (
            Series(("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")),
        ),
        "generation_tokens_total": (Series("llamacpp:tokens_predicted_total"),),
        "requests_running": (Series("llamacpp:requests_processing"),),
        "requests_waiting": (Series("llamacpp:requests_deferred"),),
        "prefill_seconds_total": (Series("llamacpp:prompt_seconds_total"),),
        "decode_seconds_total": (Series("llamacpp:tokens_predicted_seconds_total"),),
        "cached_prompt_tokens_total": (Series("llamacpp:prompt_tokens_cached_total"),),
    },
)
