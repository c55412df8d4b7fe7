"""HuggingFace text-generation-inference: ``tgi_*`` series, no model label, no ``_total`` suffix.

Source-verified names: ``reference/ENGINE_METRICS.md`` §3. TGI has no token counters: prompt and
generated tokens are the ``_sum`` of the per-request length histograms (they move when a request
completes). The model comes from the config (``model:``) or is ``"default"``. Prefill / decode
seconds are the batch forward time by ``method``, which is GPU time rather than request time.
ITL is the per-request mean time per token. TGI has no TTFT and no KV-usage series.
"""

from __future__ import annotations

from agent.sources.engines.base import Adapter, Finished, Series

ADAPTER = Adapter(
    kind="tgi",
    prefixes=("tgi_",),
    model_label=None,
    scalars={
        "prompt_tokens_total": (Series("tgi_request_input_length_sum"),),
        "generation_tokens_total": (Series("tgi_request_generated_tokens_sum"),),
        "requests_running": (Series("tgi_batch_current_size"),),
        "requests_waiting": (Series("tgi_queue_size"),),
        "prefill_seconds_total": (Series("tgi_batch_forward_duration_sum", where={"method": "prefill"}),),
        "decode_seconds_total": (Series("tgi_batch_forward_duration_sum", where={"method": "decode"}),),
    },
    histograms={
        "itl_seconds": (Series("tgi_request_mean_time_per_token_duration"),),
        "e2e_seconds": (Series("tgi_request_duration"),),
    },
    finished=(
        Finished("tgi_request_success", reason="success"),
        Finished("tgi_request_failure", label="err", reason="failure"),
    ),
)
