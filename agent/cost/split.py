"""Where a window's dollars went (pure): prompt vs output, allocation vs usage, prefix-cache savings.

- **Prompt vs output** by phase time: engines that report how long requests spent in prefill and
  in decode (vLLM ``request_prefill/decode_time_seconds``, llama.cpp ``prompt_seconds_total`` /
  ``tokens_predicted_seconds_total``, trtllm-serve's) get the window's dollars split by those
  times: ``prompt $ = cost × prefill s / (prefill s + decode s)``. Both are request-seconds, so the
  split is the share of request time each phase took; with continuous batching a decode step
  serves many requests at once, so this is an allocation, not a measurement of GPU cycles.
  Without both times (SGLang, Triton, TGI without durations) there is **no split** — the prompt
  figure is absent, never guessed — and the all-in ``$ per 1M output tokens`` stands.
  (Token-priced tools split by fixed per-token rates for prompt and completion tokens; here the
  split comes from what the engine measured on this hardware.)
- **Usage basis**: the allocation basis (today's figure) charges every GPU-second held; the usage
  basis weights each GPU's dollars by its measured busy ratio (NVML utilisation), so
  allocation − usage is what was paid for while kernels were not running.
- **Prefix-cache savings**: prompt tokens served from the prefix cache were not computed; at the
  window's prefill cost per computed prompt token they would have cost
  ``cached × prompt $ / (prompt tokens − cached)``.
"""

from __future__ import annotations


def prompt_cost(cost_usd: float, prefill_seconds: float | None, decode_seconds: float | None) -> float | None:
    """Dollars of ``cost_usd`` spent on prompts, by the phase times' shares; None without both."""
    if prefill_seconds is None or decode_seconds is None:
        return None
    phase = prefill_seconds + decode_seconds
    if phase <= 0:
        return None
    return cost_usd * prefill_seconds / phase


def prefix_cache_saved(
    prompt_usd: float | None, prompt_tokens: float, cached_tokens: float | None
) -> float | None:
    """Dollars the cached prompt tokens would have cost at the window's prefill price per computed
    prompt token (None without a prompt cost, a cache count, or any computed prompt token)."""
    if prompt_usd is None or cached_tokens is None:
        return None
    computed = prompt_tokens - cached_tokens
    if computed <= 0:
        return None
    return cached_tokens * prompt_usd / computed
