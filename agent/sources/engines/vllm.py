"""vLLM (V0 and V1): ``vllm:*`` series with ``model_name`` and, on V1, ``engine`` (DP rank) labels.

Source-verified names: ``reference/ENGINE_METRICS.md`` §1. Current names come first, the ones
renamed in 0.9–0.11 (``gpu_cache_usage_perc``, ``time_per_output_token_seconds``) second. Prefill
and decode seconds are the ``_sum`` of the per-request phase histograms.
"""

from __future__ import annotations

from agent.sources.engines.base import Adapter, Finished, InfoProduct, Series

ADAPTER = Adapter(
    kind="vllm",
    prefixes=("vllm:",),
    model_label="model_name",
    scalars={
        "prompt_tokens_total": (Series("vllm:prompt_tokens_total"),),
        "generation_tokens_total": (Series("vllm:generation_tokens_total"),),
        "requests_running": (Series("vllm:num_requests_running"),),
        "requests_waiting": (Series("vllm:num_requests_waiting"),),
        "kv_cache_usage_ratio": (Series("vllm:kv_cache_usage_perc"), Series("vllm:gpu_cache_usage_perc")),
        "preemptions_total": (Series("vllm:num_preemptions_total"),),
        "prefill_seconds_total": (Series("vllm:request_prefill_time_seconds_sum"),),
        "decode_seconds_total": (Series("vllm:request_decode_time_seconds_sum"),),
        "cached_prompt_tokens_total": (
            Series("vllm:prompt_tokens_cached_total"),
            Series("vllm:prefix_cache_hits_total"),
        ),
    },
    histograms={
        "ttft_seconds": (Series("vllm:time_to_first_token_seconds"),),
        "itl_seconds": (
            Series("vllm:inter_token_latency_seconds"),
            Series("vllm:time_per_output_token_seconds"),
        ),
        "e2e_seconds": (Series("vllm:e2e_request_latency_seconds"),),
    },
    finished=(Finished("vllm:request_success_total", label="finished_reason"),),
    # the KV cache's size per data-parallel rank, in tokens, for the decode-efficiency ceiling
    info={"kv_capacity_tokens": InfoProduct("vllm:cache_config_info", ("num_gpu_blocks", "block_size"))},
)
