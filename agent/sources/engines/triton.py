"""NVIDIA Triton Inference Server: ``nv_inference_*`` series, and ``nv_trt_llm_*`` / ``nv_llm_*`` with
the TensorRT-LLM (or vLLM) backend.

Source-verified names: ``reference/ENGINE_METRICS.md`` §4.2–4.3; the plain-Triton part is checked
against a real ``tritonserver`` in ``tests/test_triton_real.py``. The model is the ``model`` label;
the ``version`` label (Triton's model-repository version) is summed over, because the deployed
version comes from deployment metadata like every other engine's. Any Triton gives finished
requests (``nv_inference_request_success``, and ``nv_inference_request_failure`` summed over its
``reason`` label where the release has one, so the reasons read the same across releases) and
waiting requests (``nv_inference_pending_request_count``, after the TensorRT-LLM batcher's own
count). Only the LLM backends give tokens (the ``nv_llm_{input,output}_token_len`` histogram
``_sum``s), the running batch and KV usage (the ``fraction`` block metric). TTFT is the opt-in
``nv_inference_first_response_histogram_ms`` (``--metrics-config histogram_latencies=true``;
decoupled models only, in releases after 2.51; milliseconds, scaled to seconds, bounds included).
Triton's cumulative queue and compute ``*_duration_us`` counters (compute = input + infer +
output) become the mean queue and compute time per successful request; the request duration
counter and the opt-in ``*_summary_us`` summaries have no matching signal. An ensemble shows each
of its steps as its own model.
"""

from __future__ import annotations

from agent.sources.engines.base import Adapter, Finished, Series

_MS = 1e-3  # milliseconds → seconds
_US = 1e-6  # microseconds → seconds
# A request's compute: its inputs copied in, the model run, its outputs copied out (summed).
_COMPUTE = (
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_output_duration_us",
)

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
        # cumulative microseconds over the successful requests (Triton's metric reporter adds the
        # durations on success only; a failure adds to its count alone): the per-request means are
        # these over the successes, as ratios of sums
        "queue_seconds_total": (Series("nv_inference_queue_duration_us", scale=_US),),
        "compute_seconds_total": (
            Series(_COMPUTE, scale=_US),
            Series("nv_inference_compute_duration_us", scale=_US),  # one counter before the split
        ),
        "timed_requests_total": (Series("nv_inference_request_success"),),
    },
    histograms={
        "ttft_seconds": (Series("nv_inference_first_response_histogram_ms", scale=_MS),),
    },
    finished=(
        Finished("nv_inference_request_success", reason="success"),
        Finished("nv_inference_request_failure", reason="failure"),
    ),
)
