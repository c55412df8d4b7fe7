"""NVIDIA Triton with the TensorRT-LLM backend: ``nv_inference_*`` and ``nv_trt_llm_*`` series.

Source-verified names: ``reference/ENGINE_METRICS.md`` §4.2–4.3. The model is the ``model`` label;
the ``version`` label (Triton's model-repository version) is summed over, because the deployed
version comes from deployment metadata like every other engine's. Tokens come from the
``nv_llm_{input,output}_token_len`` histogram ``_sum``s; KV usage from the ``fraction`` block
metric; TTFT from the opt-in ``nv_inference_first_response_histogram_ms`` (milliseconds, scaled to
seconds, bounds included). Triton's cumulative ``*_duration_us`` counters have no matching signal.
An ensemble shows each of its steps as its own model.
"""

from __future__ import annotations

from agent.sources.engines.base import Adapter, Finished, Series

_MS = 1e-3  # milliseconds → seconds

ADAPTER = Adapter(
    kind="triton",
    prefixes=("nv_inference_", "nv_trt_llm_"),
    model_label="model",
    scalars={
        "prompt_tokens_total": (Series("nv_llm_input_token_len_sum"),),
        "generation_tokens_total": (Series("nv_llm_output_token_len_sum"),),
        "requests_running": (Series("nv_trt_llm_request_metrics", where={"request_type": "active"}),),
        "requests_waiting": (
            Series("nv_trt_llm_request_metrics", where={"request_type": "waiting"}),
            Series("nv_inference_pending_request_count"),
        ),
        "kv_cache_usage_ratio": (
            Series("nv_trt_llm_kv_cache_block_metrics", where={"kv_cache_block_type": "fraction"}),
        ),
    },
    histograms={
        "ttft_seconds": (Series("nv_inference_first_response_histogram_ms", scale=_MS),),
    },
    finished=(
        Finished("nv_inference_request_success", reason="success"),
        Finished("nv_inference_request_failure", reason="failure"),
    ),
)
