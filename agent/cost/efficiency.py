"""Decode efficiency against the memory-bandwidth roofline (pure: no clock, no I/O, no config).

Decode is bandwidth bound: one step of a replica reads its weights once and every resident
sequence's KV cache once, so the fastest a step can be is

    step_min = (weights_bytes + resident_kv_tokens × kv_bytes_per_token) / replica_bandwidth

and every running sequence gains one token per step. The efficiency is ``step_min`` over the step
the engine actually took, measured from the engine's own step timing, never from wall-clock
time: wall-clock tokens/s moves with the share of time spent in prefill (the prompt mix, the hour
of the day) and with how full the batch is (load). The measured step, best first:

- the **inter-token latency** histogram (vLLM, trtllm-serve): each running sequence observes one
  interval per step *as the step happens*, so the window's ΔITL_sum ÷ ΔITL_count is the mean step
  of exactly the steps the window holds;
- ``request`` decode seconds (vLLM ``request_decode_time_seconds_sum``, trtllm-serve's, llama.cpp
  ``tokens_predicted_seconds_total``), summed over requests: ``step = decode_seconds /
  generation_tokens`` (one token per sequence per step). These are added when a request finishes,
  so over a short window they are lumpier than the tokens;
- ``batch`` seconds (TGI ``tgi_batch_forward_duration{method="decode"}``): engine time in decode
  forward passes, each producing ``batch`` tokens: ``step = decode_seconds × batch / generation_tokens``.

The prefill share. With chunked prefill a decode step also carries other requests' prompt chunks,
and both timings see the whole step, so the step as run is longer than the pure-decode step by the
time those chunks took: ``step_pure = step × (1 − s)``, ``s`` the share of the replicas' seconds
that prefill work took. ``s`` comes from the engine's own request phase times where the engine
defines them as vLLM does (:data:`PREFILL_HOLDS_FIRST_STEP`): a request's prefill time runs from its
scheduling to its first token, so it holds its prompt's compute *and* the step that made the first
token, as that step ran (the other sequences' decode tokens and prompt chunks in it), which is no
prefill work of its own. The phase times are observed when a request *finishes*, its first token
when it is made (vLLM observes TTFT at that step), so a window's finished requests are not the
requests it prefilled: in the minute after a burst the batch the burst admitted drains, and its
requests, prefilled before the window, finish in it; during a burst the window prefills more than
finish. The window's prefills are therefore counted by its first tokens (``m``, the TTFT
histogram's count), each at the mean prefill time of the requests it finished. Over a window
whose counters hold ``n`` finished requests (the e2e histogram's count, which vLLM observes in the
same call as the phase times) with ``Σ prefill`` request-seconds, and ``m`` first tokens, on ``R``
replicas over ``T`` seconds, for steps of ``step`` seconds as run::

    s = m · (Σ prefill ÷ n − step) ÷ (R·T)

Where the page has no TTFT count, ``m = n`` (``s = (Σ prefill − n·step) ÷ (R·T)``): after a burst
that over-reads the share, often to a figure above 1 (absent). The per-request mean still lags by
the finished requests' lifetimes: where the prompt mix moves within them, ``s`` follows a little
late.

Its bias, stated: where the scheduler packs several prompts into one step, each of them counts that
step's prompt work, so ``s`` over-reads and the figure reads high (above 1 it is absent); a prompt
chunked over ``k`` steps holds ``k − 1`` steps more than is taken out, the same direction; where the
step that made a first token is longer than the window's mean step (it carried that prompt's last
chunk) ``s`` over-reads by the difference, and where nearly every step carries one prompt's chunk
the mean step already holds them and ``s`` under-reads by up to the share of steps that do. An
engine whose prefill time holds no step (the first token timed in decode time) has ``s`` read low
by ``n·step ÷ (R·T)``. The phase times are added when a request finishes, so over a short window
they are lumpier than the tokens (their median over windows is not).

Physics bounds ``s`` from below: the window's prefilled tokens (prompt tokens not served from the
prefix cache) times the model's FLOPs per token, at the GPUs' dense peak, is the least time prefill
can have kept the replicas busy (:func:`prefill_share_floor`). Where the phase times are absent (no
e2e count, no prefill seconds, or an engine whose prefill time is defined otherwise) that floor is
the share taken out, and the figure under-reads by ``1 − prefill MFU`` of the prefill share. Where
the prompt counter, the model's FLOPs per token and the GPUs' peak are unknown too, nothing is
taken out and the figure is the efficiency of the steps as run: a lower bound by the whole prefill
share. A share of 1 or more, or a figure above 1, is impossible (the ceilings are peaks): it comes
from counters that do not line up within a window, and it is absent, not clamped.

Speculative decoding yields more than one token per sequence per step, which neither timing
counts; a window in which the engine accepted draft tokens (vLLM ``spec_decode_num_accepted_tokens``)
gets no figure.

Engines without a decode-time series (SGLang, Triton) get no efficiency: absent, not guessed.

Ceilings are per data-parallel replica: a vLLM engine with ``n`` DP ranks over ``g`` GPUs has
``g / n`` GPUs' bandwidth per replica, and each replica holds its own weights and KV cache. The
KV cache's size comes from the engine where it says (vLLM ``cache_config_info``: ``num_gpu_blocks ×
block_size``), else from the configured ``kv_capacity_tokens``; a deploy that shrinks the cache
is then read as what it is. Reference: 70B fp16 (140 GB) on one H100 (3.35 TB/s), one sequence ≈
24 tok/s, so a measured step of 1/12 s is an efficiency of 0.5.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

DecodeTime = Literal["request", "batch"]

# Which kind of decode time each engine kind reports (see the module docstring); a kind not
# listed has no decode-time series.
DECODE_TIME_KIND: Mapping[str, DecodeTime] = {
    "vllm": "request",
    "trtllm": "request",
    "llamacpp": "request",
    "tgi": "batch",
}


@dataclass(frozen=True, slots=True)
class ModelFigures:
    """What the efficiency needs to know about a served model (from the engine's config)."""

    weights_bytes: float | None  # bytes of weights one replica reads per decode step
    kv_bytes_per_token: float | None  # bytes of KV cache per token
    kv_capacity_tokens: float | None  # tokens per replica's KV cache (config fallback)
    flops_per_token: float | None = None  # FLOPs of one token through the weights (2 × parameters)


@dataclass(frozen=True, slots=True)
class DecodeObservation:
    """One window's decode figures, as the engine reported them."""

    engine_kind: str  # vllm | tgi | trtllm | llamacpp | ...
    generation_tokens: float  # tokens in the window
    decode_seconds: float | None  # seconds of decode time in the window (request or batch seconds)
    requests_running: float | None  # running sequences over all replicas (the gauge, as read)
    kv_cache_usage_ratio: float | None  # 0–1, mean over replicas
    kv_capacity_tokens: float | None  # tokens per replica's cache as the engine reports it
    replicas: int  # data-parallel replicas (vLLM ``engine`` ranks); 1 when the page shows one
    bandwidth_bytes_per_s: float  # bytes/s, peak bandwidth summed over the engine's GPUs
    window_seconds: float = 0.0  # seconds the window covers
    itl_seconds: float | None = None  # Σ inter-token intervals observed in the window (seconds)
    itl_count: float | None = None  # inter-token intervals observed in the window
    prefill_tokens: float | None = (
        None  # tokens prefilled in the window (prompt tokens less prefix-cache hits)
    )
    peak_flops_per_s: float = 0.0  # FLOP/s, dense tensor-core peak summed over the engine's GPUs
    spec_accepted_tokens: float | None = None  # draft tokens accepted in the window (speculative decoding)
    prefill_seconds: float | None = None  # request-seconds of prefill of the requests finished in the window
    finished_requests: float | None = None  # requests whose phase times the window holds (e2e count)
    first_tokens: float | None = None  # requests whose first token the window made (TTFT count)


# Engine kinds whose request prefill time runs from scheduling to the first token (vLLM V1
# ``first_token_ts − scheduled_ts``), so it holds the step that made that token; for the others the
# prefill share is the FLOPs floor alone.
PREFILL_HOLDS_FIRST_STEP = frozenset({"vllm"})

# A window at least this long is coarse history (imported at 5-minute steps, say). Why 2 minutes:
# twice the longest live tick (60 s), so no live window counts as coarse, and under the 5-minute
# steps history is imported at.
COARSE_WINDOW_SECONDS = 120.0
# The batch of every window comes from the engine's counters of decode time (the whole window) where it
# has them, not from the running gauge (one instant: at night a few sequences, so one reading is ±50 %):
# the inter-token intervals the window observed (a request's intervals add up to its decode time, and
# each is observed as its step runs, so their sum is the request-seconds of decode the window itself
# accrued), else the request-seconds of decode (added when requests finish: after a burst the drained
# batch's whole lifetimes land in the next window, whose batch they over-read). The context per
# sequence still comes from the gauges (KV in use ÷ sequences running at the same instant). In a
# coarse window, when that instant's batch is more than 2× off the window's mean batch (a lull or a
# burst of arrivals), the instant says little of the window's context: no efficiency for it, not a
# guess. The price: on bursty traffic read at coarse steps, a share of the windows get no figure (the
# cost rules and the forest still judge them on their cost).
# Why 2×: an instant of a Poisson population of n sequences is off its mean by more than 2× with
# a probability that falls below a few percent from n ≈ 4; a live window's instant is close to its
# window's mean by construction (a tick long), so the check is for coarse windows only.
COARSE_BATCH_AGREEMENT = 2.0


def mean_decode_batch(
    engine_kind: str, decode_seconds: float | None, window_seconds: float, itl_seconds: float | None = None
) -> float | None:
    """Mean sequences in decode over a window: the inter-token intervals it observed (``itl_seconds``,
    the request-seconds of decode accrued as its steps ran), else the engine's request-seconds of
    decode (a counter added to as requests finish); None for an engine whose decode time is not per
    request, or none in the window."""
    if window_seconds <= 0 or DECODE_TIME_KIND.get(engine_kind) != "request":
        return None
    seconds = itl_seconds if itl_seconds is not None and itl_seconds > 0 else decode_seconds
    if seconds is None or seconds <= 0:
        return None
    return seconds / window_seconds


def min_step_seconds(
    weights_bytes: float, resident_kv_tokens: float, kv_bytes_per_token: float, bandwidth_bytes_per_s: float
) -> float:
    """Seconds of the fastest possible decode step: weights + resident KV read once at peak bandwidth."""
    return (weights_bytes + resident_kv_tokens * kv_bytes_per_token) / bandwidth_bytes_per_s


def prefill_share_floor(obs: DecodeObservation, model: ModelFigures) -> float:
    """Least share of the window's seconds that prefill kept the replicas busy: the prefilled tokens'
    FLOPs at the GPUs' peak over the window (0 when the tokens, the FLOPs or the peak are unknown)."""
    if (
        not obs.prefill_tokens
        or obs.prefill_tokens <= 0
        or not model.flops_per_token
        or obs.peak_flops_per_s <= 0
        or obs.window_seconds <= 0
    ):
        return 0.0
    return obs.prefill_tokens * model.flops_per_token / (obs.peak_flops_per_s * obs.window_seconds)


def prefill_share(obs: DecodeObservation, model: ModelFigures, step: float) -> float:
    """Share of the replicas' seconds that prefill work took in the window, for steps of ``step``
    seconds as run: the window's first tokens (the finished requests where the count is unknown),
    each at the finished requests' mean prefill time less the decode part of the step it holds,
    never under :func:`prefill_share_floor` (see the module docstring)."""
    floor = prefill_share_floor(obs, model)
    replica_seconds = obs.window_seconds * max(1, obs.replicas)
    n = obs.finished_requests
    if (
        obs.engine_kind not in PREFILL_HOLDS_FIRST_STEP
        or obs.prefill_seconds is None
        or obs.prefill_seconds <= 0
        or n is None
        or n <= 0
        or replica_seconds <= 0
    ):
        return floor
    prefills = n if obs.first_tokens is None else obs.first_tokens  # the window's own prefills
    # seconds of prompt work per request: its prefill time less the step that made its first token
    per_request = obs.prefill_seconds / n - step
    return max(floor, prefills * per_request / replica_seconds)


def decode_efficiency(obs: DecodeObservation, model: ModelFigures) -> float | None:
    """Fastest possible decode step ÷ the measured one less its prefill share
    (:func:`prefill_share`), per data-parallel replica, in (0, 1]; None as
    :func:`decode_efficiency_parts` says."""
    parts = decode_efficiency_parts(obs, model)
    return None if parts is None else parts[0]


def decode_efficiency_parts(obs: DecodeObservation, model: ModelFigures) -> tuple[float, float] | None:
    """The decode efficiency (:func:`decode_efficiency`) and the prefill share it took out of the
    step (0 for an engine whose decode time counts decode passes alone), in one computation.

    None when the engine has no decode-time series, the window decoded nothing or accepted draft
    tokens, the model's weights or the GPUs' bandwidth are unknown, a coarse window's gauge instant
    is more than :data:`COARSE_BATCH_AGREEMENT` off its mean batch, the prefill share reaches 1, or
    the ratio comes out above 1.
    """
    kind = DECODE_TIME_KIND.get(obs.engine_kind)
    if (
        kind is None
        or (obs.spec_accepted_tokens is not None and obs.spec_accepted_tokens > 0)
        or obs.decode_seconds is None
        or obs.decode_seconds <= 0
        or obs.generation_tokens <= 0
        or not model.weights_bytes
        or obs.bandwidth_bytes_per_s <= 0
    ):
        return None
    replicas = max(1, obs.replicas)
    capacity = obs.kv_capacity_tokens or model.kv_capacity_tokens
    resident = 0.0
    if obs.kv_cache_usage_ratio is not None and capacity and model.kv_bytes_per_token:
        resident = obs.kv_cache_usage_ratio * capacity
        batch = mean_decode_batch(obs.engine_kind, obs.decode_seconds, obs.window_seconds, obs.itl_seconds)
        if batch is not None and obs.requests_running:
            # context per sequence from the gauges (one instant), sequences from the counter (all of it)
            if obs.window_seconds >= COARSE_WINDOW_SECONDS and not (
                1.0 / COARSE_BATCH_AGREEMENT <= batch / obs.requests_running <= COARSE_BATCH_AGREEMENT
            ):
                return None
            resident = min(capacity, resident * batch / obs.requests_running)
        elif batch is not None and obs.window_seconds >= COARSE_WINDOW_SECONDS:
            return None
    step = measured_step_seconds(obs, kind, replicas)
    # batch seconds time decode forward passes alone; request-timed steps carry prompt chunks
    share = prefill_share(obs, model, step) if kind == "request" else 0.0
    if share >= 1.0:
        return None  # impossible: prompt and decode counters out of step
    ideal = min_step_seconds(
        model.weights_bytes, resident, model.kv_bytes_per_token or 0.0, obs.bandwidth_bytes_per_s / replicas
    )
    efficiency = ideal / (step * (1.0 - share))
    return (efficiency, share) if efficiency <= 1.0 else None  # above 1: counters out of step, no figure


def measured_step_seconds(obs: DecodeObservation, kind: DecodeTime, replicas: int) -> float:
    """Seconds of one decode step as the engine ran it: the mean inter-token latency where the
    window observed one, else from decode seconds (see the module docstring)."""
    if kind == "request" and obs.itl_count and obs.itl_count > 0 and obs.itl_seconds and obs.itl_seconds > 0:
        return obs.itl_seconds / obs.itl_count
    step = (obs.decode_seconds or 0.0) / obs.generation_tokens
    if kind == "batch":
        step *= max(1.0, (obs.requests_running or 1.0) / replicas)
    return step
