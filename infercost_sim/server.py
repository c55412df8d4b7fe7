"""One HTTP server per simulated engine, serving ``GET /metrics`` exactly as vLLM does.

The page is written by prometheus_client itself from a per-engine ``CollectorRegistry``: the
vLLM V1 engine families with their wire names, labels (``model_name``, ``engine="0"``) and bucket
lists (reference/ENGINE_METRICS.md §1.2–1.3), the ``_created`` series, the ``http_*`` families of
prometheus_fastapi_instrumentator, and the real ``process_*`` / ``python_*`` collectors. A real
vLLM page is around 100 KB, mostly ``http_*`` series over the server's routes; ``target_page_bytes``
instruments as many of vLLM's routes as it takes to reach that size.

The engine's state advances lazily from the injected clock when the page is scraped, and the
page is rendered only when scraped (and only again once the engine has moved). Content
negotiation and gzip are prometheus_client's own (``choose_encoder``, ``gzip_accepted``), as in
vLLM's ``make_asgi_app`` mount: a plain request gets ``text/plain; version=0.0.4``, and a request
that lists ``application/openmetrics-text`` at all gets OpenMetrics, whatever its q-value. With
prometheus_client ≥ 0.22 that OpenMetrics page renames ``vllm:x`` samples to ``vllm_x`` but keeps
``vllm:x`` in ``# HELP``/``# TYPE`` (prometheus/client_python#1177, open): a scraper should ask
for ``text/plain;version=0.0.4`` only. ``openmetrics=False`` serves text whatever is asked.
"""

from __future__ import annotations

import gzip
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder, generate_latest, gzip_accepted
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from agent.clock import Clock
from infercost_sim.engine import EngineState, SimEngine

logger = logging.getLogger(__name__)

ENGINE_INDEX = "0"  # vLLM's data-parallel engine index label

# vLLM V1 engine families: wire base name → help text (vllm/v1/metrics/loggers.py).
_GAUGES: tuple[tuple[str, str, Callable[[EngineState], float]], ...] = (
    ("num_requests_running", "Number of requests in model execution batches.", lambda s: s.requests_running),
    ("num_requests_waiting", "Number of requests waiting to be processed.", lambda s: s.requests_waiting),
    ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lambda s: s.kv_cache_usage_ratio),
)
_DEPRECATED_GAUGES: tuple[tuple[str, str, Callable[[EngineState], float]], ...] = (
    (
        "gpu_cache_usage_perc",
        "GPU KV-cache usage. 1 means 100 percent usage.",
        lambda s: s.kv_cache_usage_ratio,
    ),
)
_COUNTERS: tuple[tuple[str, str, Callable[[EngineState], float]], ...] = (
    (
        "prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        lambda s: s.prefix_cache_queries_total,
    ),
    (
        "prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        lambda s: s.prefix_cache_hits_total,
    ),
    ("num_preemptions", "Cumulative number of preemption from the engine.", lambda s: s.preemptions_total),
    ("prompt_tokens", "Number of prefill tokens processed.", lambda s: s.prompt_tokens_total),
    ("generation_tokens", "Number of generation tokens processed.", lambda s: s.generation_tokens_total),
)
_HISTOGRAM_HELP: dict[str, str] = {
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "request_max_num_generation_tokens": "Histogram of maximum number of requested generation tokens.",
    "request_params_n": "Histogram of the n request parameter.",
    "request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "request_prefill_kv_computed_tokens": "Histogram of new KV tokens computed during prefill "
    "(excluding cached tokens).",
    "request_num_preemptions": "Number of preemptions per request.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
}
_CACHE_CONFIG_LABELS = (
    "block_size", "cache_dtype", "enable_prefix_caching", "engine", "gpu_memory_utilization",
    "num_gpu_blocks", "swap_space_bytes",
)  # fmt: skip
# Deprecated names vLLM 0.10–0.11 still emits next to their replacements (ENGINE_METRICS.md §1.4).
_DEPRECATED_HISTOGRAMS = {"time_per_output_token_seconds": "inter_token_latency_seconds"}

# Routes of vLLM's OpenAI-compatible server (plus FastAPI's own), in the order a page grows.
VLLM_ROUTES = (
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize", "/detokenize", "/v1/embeddings",
    "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
    "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/responses", "/v1/responses/{response_id}",
    "/v1/responses/{response_id}/cancel", "/invocations", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
    "/reset_prefix_cache", "/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/start_profile",
    "/stop_profile", "/scale_elastic_ep", "/is_scaling_elastic_ep", "/docs", "/docs/oauth2-redirect",
    "/redoc", "/openapi.json", "/reset_mm_cache", "/get_tokenizer_info", "/pause", "/resume", "/is_paused",
)  # fmt: skip
_HTTP_DURATION_BUCKETS = (0.1, 0.5, 1.0)  # seconds, the instrumentator's default
_HTTP_HIGHR_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0,
    30.0, 60.0,
)  # fmt: skip
# Cumulative share of generation requests finished within each highr bucket (streamed responses
# are timed to the end of the stream); a fixed profile keeps every bucket monotonic.
_HIGHR_PROFILE = (
    0.0, 0.0, 0.0, 0.001, 0.002, 0.01, 0.03, 0.06, 0.1, 0.18, 0.27, 0.36, 0.44, 0.51, 0.57, 0.62, 0.66, 0.8,
    0.9, 0.995, 0.999,
)  # fmt: skip
_HTTP_DURATION_PROFILE = (0.002, 0.03, 0.1)  # share within 0.1, 0.5, 1 s
_MIN_ROUTES = 3  # the two generation routes and /v1/models: what any serving vLLM has seen
_SERVER_ERROR_SHARE = 0.001  # why: an order of magnitude for streams cut by 5xx under load
_CHAT_SHARE = 0.8  # why: chat completions dominate generation traffic; the rest is /v1/completions


@dataclass(frozen=True, slots=True)
class _Route:
    """A non-generation route's static traffic (its counters stay constant: still monotonic)."""

    handler: str
    method: str
    ok: int  # requests answered 2xx
    client_errors: int  # requests answered 4xx
    request_bytes: float  # bytes per request
    response_bytes: float  # bytes per response


def _static_route(handler: str, index: int) -> _Route:
    method = (
        "GET" if handler in {"/v1/models", "/docs", "/redoc", "/openapi.json", "/is_sleeping"} else "POST"
    )
    ok = (index * 37) % 90 + 3
    return _Route(handler, method, ok, index % 3, 180.0 + 13 * index, 420.0 + 29 * index)


def _histogram(
    name: str, help_text: str, labels: dict[str, str], buckets: Sequence[tuple[float, float]], total: float
) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, help_text, labels=list(labels))
    fam.add_metric(list(labels.values()), [(floatToGoString(le), float(c)) for le, c in buckets], total)
    return fam


class VllmCollector:
    """Builds one simulated vLLM engine's families at scrape time from the engine's state."""

    def __init__(self, engine: SimEngine, routes: int = _MIN_ROUTES) -> None:
        self.engine = engine
        self.routes = routes  # how many of VLLM_ROUTES are instrumented (page size)

    def collect(self) -> Iterator[Metric]:
        """The engine's families, then the HTTP families, as vLLM's page lists them."""
        s = self.engine.state()
        yield from self._engine_families(s)
        yield from self._http_families(s)

    def _engine_families(self, s: EngineState) -> Iterator[Metric]:
        labels = {"model_name": s.model_name, "engine": ENGINE_INDEX}
        names, values = list(labels), list(labels.values())
        for name, help_text, get in _GAUGES + _DEPRECATED_GAUGES:
            g = GaugeMetricFamily(f"vllm:{name}", help_text, labels=names)
            g.add_metric(values, float(get(s)))
            yield g
        for name, help_text, get in _COUNTERS:
            c = CounterMetricFamily(f"vllm:{name}", help_text, labels=names)
            c.add_metric(values, float(get(s)), created=s.created)
            yield c
        fin = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*names, "finished_reason"],
        )
        for reason, count in s.finished_total.items():
            fin.add_metric([*values, reason], float(count), created=s.created)
        yield fin
        for name, help_text in _HISTOGRAM_HELP.items():
            fam = _histogram(f"vllm:{name}", help_text, labels, s.histograms[name], s.histogram_sums[name])
            fam.samples.append(Sample(f"vllm:{name}_created", labels, s.created))
            yield fam
        for old, new in _DEPRECATED_HISTOGRAMS.items():
            fam = _histogram(
                f"vllm:{old}", _HISTOGRAM_HELP[new], labels, s.histograms[new], s.histogram_sums[new]
            )
            fam.samples.append(Sample(f"vllm:{old}_created", labels, s.created))
            yield fam
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(_CACHE_CONFIG_LABELS),
        )
        dep = self.engine.deployment
        dtype = "fp8" if dep.model.kv_bytes_per_element == 1.0 else "auto"
        info.add_metric(
            ["16", dtype, "True", ENGINE_INDEX, str(dep.gpu_memory_utilization), str(s.num_gpu_blocks), "0"],
            1.0,
        )
        yield info

    def _http_families(self, s: EngineState) -> Iterator[Metric]:
        finished = sum(s.finished_total.values()) + s.requests_running
        live = {
            "/v1/chat/completions": math.floor(finished * _CHAT_SHARE),
            "/v1/completions": finished - math.floor(finished * _CHAT_SHARE),
        }
        server_errors = {h: math.floor(n * _SERVER_ERROR_SHARE) for h, n in live.items()}
        routes = [_static_route(h, i) for i, h in enumerate(VLLM_ROUTES[: self.routes])]
        total = CounterMetricFamily(
            "http_requests", "Total number of requests by method, status and handler.",
            labels=["handler", "method", "status"],
        )  # fmt: skip
        req_size = SummaryMetricFamily(
            "http_request_size_bytes",
            "Content length of incoming requests by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            labels=["handler"],
        )
        resp_size = SummaryMetricFamily(
            "http_response_size_bytes",
            "Content length of outgoing responses by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            labels=["handler"],
        )
        duration = HistogramMetricFamily(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by handler is "
            "important. ",
            labels=["handler", "method"],
        )
        created = s.created
        for r in routes:
            ok = live.get(r.handler, r.ok)
            count = ok + r.client_errors
            total.add_metric([r.handler, r.method, "2xx"], float(ok), created=created)
            if r.client_errors:
                total.add_metric([r.handler, r.method, "4xx"], float(r.client_errors), created=created)
            if r.handler in server_errors:
                total.add_metric(
                    [r.handler, r.method, "5xx"], float(server_errors[r.handler]), created=created
                )
            req_size.add_metric([r.handler], count, count * r.request_bytes)
            req_size.samples.append(
                Sample("http_request_size_bytes_created", {"handler": r.handler}, created)
            )
            resp_size.add_metric([r.handler], count, count * r.response_bytes)
            resp_size.samples.append(
                Sample("http_response_size_bytes_created", {"handler": r.handler}, created)
            )
            generation = r.handler in live
            profile = _HTTP_DURATION_PROFILE if generation else (0.97, 1.0, 1.0)
            buckets = [(floatToGoString(b), float(math.floor(p * count))) for b, p in
                       zip(_HTTP_DURATION_BUCKETS, profile, strict=True)]  # fmt: skip
            buckets.append(("+Inf", float(count)))
            duration.add_metric([r.handler, r.method], buckets, count * (20.0 if generation else 0.004))
            duration.samples.append(
                Sample(
                    "http_request_duration_seconds_created",
                    {"handler": r.handler, "method": r.method},
                    created,
                )
            )
        yield total
        yield req_size
        yield resp_size
        yield duration
        gen_count = sum(live.values())
        highr = [
            (b, math.floor(p * gen_count)) for b, p in zip(_HTTP_HIGHR_BUCKETS, _HIGHR_PROFILE, strict=True)
        ]
        highr.append((math.inf, gen_count))
        fam = _histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate percentile "
            "calculations. ",
            {},
            highr,
            gen_count * 20.0,
        )
        fam.samples.append(Sample("http_request_duration_highr_seconds_created", {}, created))
        yield fam


def build_registry(engine: SimEngine, routes: int) -> CollectorRegistry:
    """A registry like vLLM's: the engine collector plus prometheus_client's process/platform/GC ones."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VllmCollector(engine, routes))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def routes_for_size(engine: SimEngine, target_page_bytes: int | None) -> int:
    """How many of vLLM's routes to instrument for the page to reach ``target_page_bytes``
    (all of them when even that falls short)."""
    if target_page_bytes is None:
        return _MIN_ROUTES
    low = len(generate_latest(build_registry(engine, _MIN_ROUTES)))
    high = len(generate_latest(build_registry(engine, len(VLLM_ROUTES))))
    if high <= target_page_bytes:
        return len(VLLM_ROUTES)
    per_route = (high - low) / (len(VLLM_ROUTES) - _MIN_ROUTES)
    routes = _MIN_ROUTES + max(0, math.ceil((target_page_bytes - low) / per_route))
    return min(len(VLLM_ROUTES), routes)


class SimEngineServer:
    """Serves one simulated engine's ``/metrics`` on 127.0.0.1 (port 0 = a free port)."""

    def __init__(
        self,
        engine: SimEngine,
        clock: Clock,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        target_page_bytes: int | None = 100_000,  # bytes; None = a minimal page
        openmetrics: bool = True,  # negotiate as prometheus_client does; False: always text 0.0.4
    ) -> None:
        self.engine = engine
        self.openmetrics = openmetrics
        self.clock = clock
        self.host = host
        self._port = port
        self._registry = build_registry(engine, routes_for_size(engine, target_page_bytes))
        self._runner: web.AppRunner | None = None
        self._cache_key: tuple[float, str] | None = None  # (engine time, content type) of the cached page
        self._cache: bytes = b""
        self._cache_gz: bytes | None = None
        self.scrapes = 0  # pages served

    @property
    def port(self) -> int:
        """The bound port (after ``start``)."""
        return self._port

    @property
    def url(self) -> str:
        """The full URL of the metrics page."""
        return f"http://{self.host}:{self._port}/metrics"

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """Advance the engine to the clock's now and render the page in the format ``accept`` asks
        for, negotiated as prometheus_client (hence vLLM) does; returns (body, content type).
        Cached while the engine stays put."""
        self.engine.advance_to(self.clock.now())
        encoder, content_type = choose_encoder(accept if self.openmetrics else "")
        key = (self.engine.t, content_type)
        if key != self._cache_key:
            self._cache = encoder(self._registry)
            self._cache_gz = None
            self._cache_key = key
        return self._cache, content_type

    async def _metrics(self, request: web.Request) -> web.Response:
        body, content_type = self.render(request.headers.get("Accept", ""))
        self.scrapes += 1
        headers = {"Content-Type": content_type}
        if gzip_accepted(request.headers.get("Accept-Encoding", "")):  # as prometheus_client's ASGI app
            if self._cache_gz is None:
                self._cache_gz = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
            body = self._cache_gz
        return web.Response(body=body, headers=headers)

    async def start(self) -> None:
        """Bind and serve; ``port``/``url`` then name the bound address."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._port)
        await site.start()
        self._runner = runner
        for addr in runner.addresses:
            if isinstance(addr, tuple) and len(addr) >= 2:
                self._port = int(addr[1])
                break
        logger.debug("simulated engine %s serving %s", self.engine.model_name, self.url)

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
