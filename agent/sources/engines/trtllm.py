"""TensorRT-LLM's own server (``trtllm-serve``): ``trtllm_*`` series on ``/prometheus/metrics``.

Source-verified names: ``reference/ENGINE_METRICS.md`` §4.1. The server hard-codes
``model_name="undefined"``, so that value means "take the model from the config". Prefill and
decode seconds are the ``_sum`` of the per-request phase histograms.
"""

from __future__ import annotations

from agent.sources.engines.base import Adapter, Finished, Series

ADAPTER = Adapter(
    kind="trtllm",
    prefixes=("trtllm_",),
    model_label="model_name",
    placeholder_models=frozenset({"undefined"}),
    scalars={
        "cached_prompt_tokens_total": (Series("trtllm_prompt_cached_tokens_total"),),
        "prompt_tokens_total": (Series("trtllm_prompt_tokens_total"),),
        "generation_tokens_total": (Series("trtllm_generation_tokens_total"),),
        "requests_running": (Series("trtllm_num_requests_running"),),
        "requests_waiting": (Series("trtllm_num_requests_waiting"),),
        "kv_cache_usage_ratio": (Series("trtllm_kv_cache_utilization"),),
        "prefill_seconds_total": (Series("trtllm_request_prefill_time_seconds_sum"),),
        "decode_seconds_total": (Series("trtllm_request_decode_time_seconds_sum"),),
    },
    histograms={
        "ttft_seconds": (Series("trtllm_time_to_first_token_seconds"),),
        "itl_seconds": (Series("trtllm_time_per_output_token_seconds"),),
        "e2e_seconds": (Series("trtllm_e2e_request_latency_seconds"),),
    },
    finished=(Finished("trtllm_request_success_total", label="finished_reason"),),
)
