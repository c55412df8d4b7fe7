"""Generates realistic vLLM ``/metrics`` pages: the benchmark input, the parser's oracle test input,
and a page a simulated engine can serve.

The shape follows vLLM V1 (0.10-0.11, ``vllm/v1/metrics/loggers.py``) as prometheus_client writes
it: every engine family with ``model_name`` and ``engine`` labels, ``_created`` gauges after each
counter and histogram, the real bucket layouts (``reference/ENGINE_METRICS.md`` §1.2), the
deprecated names still shown in 0.10 (``gpu_cache_usage_perc``, ``time_per_output_token_seconds``),
plus the ``http_*`` series of prometheus_fastapi_instrumentator and the ``process_*`` /
``python_*`` collectors. Values are random but consistent (cumulative buckets, count = +Inf
bucket) and depend only on the seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from prometheus_client.utils import floatToGoString

REQUEST_LATENCY = (
    0.3,
    0.5,
    0.8,
    1,
    1.5,
    2,
    2.5,
    5,
    10,
    15,
    20,
    30,
    40,
    50,
    60,
    120,
    240,
    480,
    960,
    1920,
    7680,
)
TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2.5,
    5,
    7.5,
    10,
    20,
    40,
    80,
    160,
    640,
    2560,
)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
PARAMS_N = (1, 2, 5, 10, 20)
NUM_PREEMPTIONS = (1, 2, 3, 4, 5, 10, 20)
HTTP_DURATION = (0.1, 0.5, 1)
HTTP_DURATION_HIGHR = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    1.5,
    2,
    2.5,
    3,
    3.5,
    4,
    4.5,
    5,
    7.5,
    10,
    30,
    60,
)
HTTP_SIZE = (1000, 10000, 100000)

_CREATED_BASE = 1_760_000_000.0  # seconds since the epoch: when the fake server "started"


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in pairs) + "}"


def _num(v: float) -> str:
    return floatToGoString(v)


class _Page:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lines: list[str] = []

    def head(self, name: str, typ: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {typ}")

    def gauge(
        self, name: str, help_text: str, series: Sequence[tuple[Sequence[tuple[str, str]], float]]
    ) -> None:
        self.head(name, "gauge", help_text)
        for labels, value in series:
            self.lines.append(f"{name}{_labels(labels)} {_num(value)}")

    def counter(
        self, base: str, help_text: str, series: Sequence[tuple[Sequence[tuple[str, str]], float]]
    ) -> None:
        self.head(base + "_total", "counter", help_text)
        for labels, value in series:
            self.lines.append(f"{base}_total{_labels(labels)} {_num(value)}")
        self.created(base, help_text, [labels for labels, _ in series])

    def created(self, base: str, help_text: str, label_sets: Sequence[Sequence[tuple[str, str]]]) -> None:
        self.head(base + "_created", "gauge", help_text)
        for labels in label_sets:
            ts = _CREATED_BASE + self.rng.random() * 100
            self.lines.append(f"{base}_created{_labels(labels)} {_num(ts)}")

    def histogram(
        self,
        base: str,
        help_text: str,
        bounds: Sequence[float],
        label_sets: Sequence[Sequence[tuple[str, str]]],
        scale: float,
        observations: int,
    ) -> None:
        """A histogram whose observations spread around ``scale`` (in the metric's unit)."""
        self.head(base, "histogram", help_text)
        for labels in label_sets:
            n = self.rng.randint(0, observations)
            values = [self.rng.lognormvariate(0.0, 1.0) * scale for _ in range(min(n, 200))]
            weight = n / len(values) if values else 0.0
            total = 0.0
            for le in bounds:
                total = round(sum(1 for v in values if v <= le) * weight)
                self.lines.append(f"{base}_bucket{_labels([*labels, ('le', _num(le))])} {_num(total)}")
            self.lines.append(f"{base}_bucket{_labels([*labels, ('le', '+Inf')])} {_num(n)}")
            self.lines.append(f"{base}_count{_labels(labels)} {_num(n)}")
            self.lines.append(f"{base}_sum{_labels(labels)} {_num(sum(values) * weight)}")
        self.created(base, help_text, label_sets)


def make_vllm_page(models: list[str], seed: int, engines: int = 1) -> str:
    """A vLLM V1 page serving ``models`` on ``engines`` data-parallel ranks each.

    Three models on one engine each make about 100 KB, the size of a busy real page.
    """
    p = _Page(seed)
    rng = p.rng
    sets = [[("model_name", m), ("engine", str(e))] for m in models for e in range(engines)]

    # prometheus_client's own collectors come first on a real page.
    for gen in range(3):
        gl = [("generation", str(gen))]
        p.lines.append("# HELP python_gc_objects_collected_total Objects collected during gc")
        p.lines.append("# TYPE python_gc_objects_collected_total counter")
        p.lines.append(f"python_gc_objects_collected_total{_labels(gl)} {_num(rng.randint(0, 99999))}")
    p.gauge(
        "python_info",
        "Python platform information",
        [
            (
                [
                    ("implementation", "CPython"),
                    ("major", "3"),
                    ("minor", "12"),
                    ("patchlevel", "3"),
                    ("version", "3.12.3"),
                ],
                1.0,
            )
        ],
    )
    p.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", [([], 5.4e10)])
    p.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", [([], 3.2e9)])
    p.gauge(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        [([], _CREATED_BASE)],
    )
    p.counter("process_cpu_seconds", "Total user and system CPU time spent in seconds.", [([], 812.34)])
    p.gauge("process_open_fds", "Number of open file descriptors.", [([], 91.0)])
    p.gauge("process_max_fds", "Maximum number of open file descriptors.", [([], 1048576.0)])

    running = [(s, float(rng.randint(0, 64))) for s in sets]
    p.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running)
    p.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        [(s, float(rng.randint(0, 20))) for s in sets],
    )
    kv = [(s, rng.random()) for s in sets]
    p.gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", kv)
    p.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv)
    p.counter(
        "vllm:gpu_prefix_cache_queries",
        "GPU prefix cache queries, in terms of number of queried tokens.",
        [(s, float(rng.randint(0, 10**8))) for s in sets],
    )
    p.counter(
        "vllm:gpu_prefix_cache_hits",
        "GPU prefix cache hits, in terms of number of cached tokens.",
        [(s, float(rng.randint(0, 10**7))) for s in sets],
    )
    p.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        [(s, float(rng.randint(0, 10**8))) for s in sets],
    )
    p.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        [(s, float(rng.randint(0, 10**7))) for s in sets],
    )
    p.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        [(s, float(rng.randint(0, 500))) for s in sets],
    )
    p.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        [(s, float(rng.randint(0, 10**9))) for s in sets],
    )
    p.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        [(s, float(rng.randint(0, 10**9))) for s in sets],
    )
    p.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [
            ([*s, ("finished_reason", r)], float(rng.randint(0, 10**6)))
            for s in sets
            for r in ("stop", "length", "abort")
        ],
    )
    p.histogram(
        "vllm:request_prompt_tokens", "Number of prefill tokens processed.", REQUEST_TOKENS, sets, 300, 10**6
    )
    p.histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        REQUEST_TOKENS,
        sets,
        200,
        10**6,
    )
    p.histogram(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        ITERATION_TOKENS,
        sets,
        64,
        10**7,
    )
    p.histogram(
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        REQUEST_TOKENS,
        sets,
        512,
        10**6,
    )
    p.histogram("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N, sets, 1, 10**6)
    p.histogram(
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        REQUEST_TOKENS,
        sets,
        512,
        10**6,
    )
    p.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        TTFT,
        sets,
        0.2,
        10**6,
    )
    p.histogram(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        ITL,
        sets,
        0.03,
        10**8,
    )
    p.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        ITL,
        sets,
        0.03,
        10**8,
    )
    p.histogram(
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        ITL,
        sets,
        0.03,
        10**6,
    )
    p.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        REQUEST_LATENCY,
        sets,
        6,
        10**6,
    )
    p.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        REQUEST_LATENCY,
        sets,
        0.5,
        10**6,
    )
    p.histogram(
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        REQUEST_LATENCY,
        sets,
        5,
        10**6,
    )
    p.histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        REQUEST_LATENCY,
        sets,
        0.3,
        10**6,
    )
    p.histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        REQUEST_LATENCY,
        sets,
        5,
        10**6,
    )
    p.histogram(
        "vllm:request_num_preemptions",
        "Number of preemptions per request.",
        NUM_PREEMPTIONS,
        sets,
        0.2,
        10**6,
    )
    for e in range(engines):
        p.gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [
                (
                    [
                        ("block_size", "16"),
                        ("cache_dtype", "auto"),
                        ("enable_prefix_caching", "True"),
                        ("engine", str(e)),
                        ("gpu_memory_utilization", "0.9"),
                        ("num_cpu_blocks", "None"),
                        ("num_gpu_blocks", "27000"),
                        ("prefix_caching_hash_algo", "builtin"),
                        ("swap_space", "4"),
                    ],
                    1.0,
                )
            ],
        )
    p.gauge(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        [
            (
                [("max_lora", "0"), ("running_lora_adapters", ""), ("waiting_lora_adapters", "")],
                _CREATED_BASE + 3600.5,
            )
        ],
    )

    handlers = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize"]
    http = [
        [("handler", h), ("method", "POST" if "models" not in h else "GET"), ("status", st)]
        for h in handlers
        for st in ("2xx", "4xx")
    ]
    p.counter(
        "http_requests",
        "Total number of requests by method, status and handler.",
        [(s, float(rng.randint(0, 10**6))) for s in http],
    )
    hm = [[("handler", h), ("method", "POST" if "models" not in h else "GET")] for h in handlers]
    p.histogram(
        "http_request_size_bytes",
        "Content length of incoming requests by handler.",
        HTTP_SIZE,
        hm,
        2000,
        10**6,
    )
    p.histogram(
        "http_response_size_bytes",
        "Content length of outgoing responses by handler.",
        HTTP_SIZE,
        hm,
        4000,
        10**6,
    )
    p.histogram(
        "http_request_duration_highr_seconds",
        "Latency with many buckets but no API specific labels.",
        HTTP_DURATION_HIGHR,
        [[]],
        3,
        10**6,
    )
    p.histogram(
        "http_request_duration_seconds",
        "Latency with only few buckets by handler.",
        HTTP_DURATION,
        hm,
        3,
        10**6,
    )
    return "\n".join(p.lines) + "\n"
