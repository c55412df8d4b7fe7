"""SGLang: ``sglang:*`` series with ``model_name`` (plus rank / ``is_streaming`` labels, summed).

Source-verified names: ``reference/ENGINE_METRICS.md`` §2. ``sglang:token_usage`` is the KV pool
usage fraction. ITL was ``time_per_output_token_seconds`` before its rename. SGLang exposes no
finished-by-reason counter and no prefill/decode time totals: those signals stay absent.
"""

from __future__ import annotations

from agent.sources.engines.base import Adapter, Series

ADAPTER = Adapter(
    kind="sglang",
    prefixes=("sglang:",),
    model_label="model_name",
    scalars={
        "cached_prompt_tokens_total": (Series("sglang:cached_tokens_total"),),
        "prompt_tokens_total": (Series("sglang:prompt_tokens_total"),),
        "generation_tokens_total": (Series("sglang:generation_tokens_total"),),
        "requests_running": (Series("sglang:num_running_reqs"),),
        "requests_waiting": (Series("sglang:num_queue_reqs"),),
        "kv_cache_usage_ratio": (Series("sglang:token_usage"),),
    },
    histograms={
        "ttft_seconds": (Series("sglang:time_to_first_token_seconds"),),
        "itl_seconds": (
            Series("sglang:inter_token_latency_seconds"),
            Series("sglang:time_per_output_token_seconds"),
        ),
        "e2e_seconds": (Series("sglang:e2e_request_latency_seconds"),),
    },
)
