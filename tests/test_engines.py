"""Every engine adapter over recorded and source-shaped expositions: golden ModelSignals.

Run with ``UPDATE_GOLDEN=1`` to rewrite ``tests/fixtures/golden/*.json`` after a deliberate
change, then review the diff. Targeted tests below check the mapping rules by hand-computed
values (sums over data-parallel ranks, absent signals, unit scaling, placeholder model names).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.samples import Histogram, ModelSignals
from agent.sources.engines import ADAPTERS, detect_kind
from agent.sources.engines.base import clean_label
from infercost_sim.pagegen import make_vllm_page

FIXTURES = Path(__file__).parent / "fixtures"
PAGES = sorted((FIXTURES / "expositions").glob("*.txt"))
GOLDEN = FIXTURES / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _render(kind: str, models: tuple[ModelSignals, ...]) -> str:
    doc = {"kind": kind, "models": [_jsonable(dataclasses.asdict(m)) for m in models]}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_golden_model_signals(path: Path) -> None:
    text = path.read_text()
    kind = detect_kind(text)
    assert kind is not None, "every fixture is some engine's page"
    got = _render(kind, ADAPTERS[kind].parse(text, None))
    golden = GOLDEN / (path.stem + ".json")
    if UPDATE or not golden.exists():
        if not UPDATE:
            pytest.fail(f"no golden file {golden.name}; run with UPDATE_GOLDEN=1 and review it")
        golden.write_text(got)
    assert got == golden.read_text()


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ref_vllm.txt", "vllm"),
        ("vllm_v1_dp2.txt", "vllm"),
        ("ref_sglang.txt", "sglang"),
        ("sglang_v05.txt", "sglang"),
        ("tgi.txt", "tgi"),
        ("ref_triton_trtllm.txt", "triton"),
        ("triton_trtllm_full.txt", "triton"),
        ("trtllm_serve.txt", "trtllm"),
        ("ref_llamacpp_real.txt", "llamacpp"),
    ],
)
def test_detect_kind(name: str, kind: str) -> None:
    assert detect_kind((FIXTURES / "expositions" / name).read_text()) == kind


def test_detect_kind_ignores_comments_and_unknown_pages() -> None:
    assert detect_kind("# HELP vllm:x y\n# TYPE vllm:x gauge\nprocess_cpu_seconds_total 1\n") is None
    assert detect_kind('{"json": true}') is None
    assert detect_kind("process_open_fds 3\nvllm:num_requests_running 1\n") == "vllm"


def _signals(name: str, model: str | None = None) -> dict[str, ModelSignals]:
    text = (FIXTURES / "expositions" / name).read_text()
    kind = detect_kind(text)
    assert kind
    return {m.model: m for m in ADAPTERS[kind].parse(text, model)}


def test_vllm_sums_data_parallel_engines_and_averages_kv_usage() -> None:
    m = _signals("vllm_v1_dp2.txt")["meta-llama/Llama-3.1-8B-Instruct"]
    assert m.prompt_tokens_total == 1_234_567 + 765_433
    assert m.generation_tokens_total == 400_000 + 350_000
    assert m.requests_running == 12 + 9
    assert m.requests_waiting == 2
    assert m.kv_cache_usage_ratio == pytest.approx((0.5 + 0.25) / 2)
    assert m.preemptions_total == 4
    assert m.requests_finished_total == {"stop": 1750, "length": 140, "abort": 8, "error": 1}
    assert m.prefill_seconds_total == pytest.approx(61.5 * 1.5)
    assert m.decode_seconds_total == pytest.approx(2300.75 * 1.5)
    assert m.ttft_seconds is not None and m.ttft_seconds.count == 986 + 913
    assert m.ttft_seconds.buckets[-1] == (math.inf, 1899.0)
    assert m.itl_seconds is not None and m.itl_seconds.count == 399_000 + 349_000


def test_vllm_generated_page_sums_match_prometheus_client() -> None:
    """On a generated multi-model DP page, our per-model sums equal sums over the oracle's samples."""
    models = ["a/one", "b/two", "c/three"]
    text = make_vllm_page(models, seed=11, engines=3)
    ours = {m.model: m for m in ADAPTERS["vllm"].parse(text)}
    assert sorted(ours) == sorted(models)
    want: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in {"vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count"}:
                key = (s.labels["model_name"], s.name)
                want[key] = want.get(key, 0.0) + s.value
    for model in models:
        assert ours[model].generation_tokens_total == want[(model, "vllm:generation_tokens_total")]
        ttft = ours[model].ttft_seconds
        assert ttft is not None and ttft.count == want[(model, "vllm:time_to_first_token_seconds_count")]
        assert ours[model].kv_cache_usage_ratio is not None  # V1 name preferred, legacy also present


def test_vllm_legacy_names_are_used_when_new_ones_are_missing() -> None:
    page = (
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.7\n'
        'vllm:time_per_output_token_seconds_bucket{model_name="m",le="0.1"} 3\n'
        'vllm:time_per_output_token_seconds_bucket{model_name="m",le="+Inf"} 4\n'
        'vllm:time_per_output_token_seconds_sum{model_name="m"} 0.5\n'
        'vllm:time_per_output_token_seconds_count{model_name="m"} 4\n'
    )
    (m,) = ADAPTERS["vllm"].parse(page)
    assert m.kv_cache_usage_ratio == 0.7
    assert m.itl_seconds == Histogram(buckets=((0.1, 3.0), (math.inf, 4.0)), sum=0.5, count=4.0)


def test_absent_signals_are_none_never_zero() -> None:
    m = _signals("ref_llamacpp_real.txt")["default"]
    assert m.kv_cache_usage_ratio is None and m.ttft_seconds is None and m.preemptions_total is None
    assert m.requests_finished_total == {}
    tgi = _signals("tgi.txt")["default"]
    assert tgi.ttft_seconds is None and tgi.kv_cache_usage_ratio is None
    sg = _signals("sglang_v05.txt")["Qwen/Qwen2.5-7B-Instruct"]
    assert sg.prefill_seconds_total is None and sg.e2e_seconds is None


def test_llamacpp_counters_only_and_prompt_includes_cached() -> None:
    m = _signals("ref_llamacpp_real.txt", model="tiny-llama")["tiny-llama"]
    assert m.prompt_tokens_total == 283 + 91
    assert m.generation_tokens_total == 1950
    assert m.prefill_seconds_total == 0.023081 and m.decode_seconds_total == 1.16288
    assert m.requests_running == 0 and m.requests_waiting == 0


def test_tgi_tokens_from_histogram_sums_and_model_from_config() -> None:
    m = _signals("tgi.txt", model="bigcode/starcoder2")["bigcode/starcoder2"]
    assert m.prompt_tokens_total == 81234
    assert m.generation_tokens_total == 250321
    assert m.requests_running == 14 and m.requests_waiting == 3
    assert m.requests_finished_total == {"success": 1000, "validation": 25, "overloaded": 5}
    assert m.prefill_seconds_total == 40.5 and m.decode_seconds_total == 1800.25


def test_triton_ms_histogram_scaled_to_seconds_and_versions_summed() -> None:
    sig = _signals("triton_trtllm_full.txt")
    trt = sig["tensorrt_llm"]
    assert trt.prompt_tokens_total == 41000 and trt.generation_tokens_total == 38000
    assert trt.requests_running == 6 and trt.requests_waiting == 1
    assert trt.kv_cache_usage_ratio == 0.4875
    assert trt.ttft_seconds is not None
    assert [le for le, _ in trt.ttft_seconds.buckets] == [0.1, 0.5, 2.0, 5.0, math.inf]
    assert trt.ttft_seconds.sum == pytest.approx(61.0)
    ensemble = sig["ensemble"]
    assert ensemble.requests_waiting == 4  # falls back to nv_inference_pending_request_count
    assert ensemble.prompt_tokens_total is None


def test_trtllm_undefined_model_label_becomes_configured_model() -> None:
    assert list(_signals("trtllm_serve.txt", model="llama-3-70b")) == ["llama-3-70b"]
    m = _signals("trtllm_serve.txt")["default"]
    assert m.requests_finished_total == {"stop": 95, "length": 5}
    assert m.itl_seconds is not None and m.itl_seconds.count == 100


def test_adapters_reject_unknown_fields() -> None:
    from agent.sources.engines.base import Adapter, Series

    with pytest.raises(ValueError, match="unknown ModelSignals fields"):
        Adapter(kind="x", prefixes=("x_",), model_label=None, scalars={"tokens": (Series("x_t"),)})


def test_pure_layers_import_no_io_libraries() -> None:
    """The parser, adapters and counter arithmetic stay free of aiohttp (only scraper.py does I/O)."""
    import subprocess
    import sys

    code = (
        "import sys, agent.sources.engines, agent.sources.engines.parser, agent.cost.quantiles;"
        "bad = {'aiohttp', 'pynvml', 'sklearn'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_parse_benchmark_reports_its_figures() -> None:
    from infercost_bench.parse import DENSE_MODELS, PageFigures, run

    lines: list[str] = []
    results = run(print_fn=lines.append, runs=1)
    assert all(isinstance(r, PageFigures) and r.ours_ms > 0 and r.prometheus_client_ms > 0 for r in results)
    names = [r.page for r in results]
    assert {p.name for p in PAGES} <= set(names)  # every fixture page is timed
    dense = next(r for r in results if f"{DENSE_MODELS} models" in r.page)
    assert 800_000 < dense.page_bytes < 1_600_000  # the ~1 MB dense page
    assert len(lines) == len(results) + 3
    assert lines[-2].startswith("parse+map per 100 kB: ") and "target <= 1 ms: " in lines[-2]
    assert lines[-1].startswith("daemon CPU: ") and "target <= 2 %: " in lines[-1]
    assert all({line.split()[-4], line.split()[-2]} <= {"met", "missed"} for line in lines[1:-2])


def test_parse_benchmark_figures_follow_the_formulas() -> None:
    from infercost_bench.parse import figures

    r = figures("p", 50_000, 0.0004, 0.004)  # 0.4 ms for 50 kB
    assert r.ms_per_100kb == pytest.approx(0.8) and r.speed_met
    # 4 engines x 0.4 ms every 5 s = 0.032 % of one core; the daemon's CPU is 1 % of one core
    assert r.core_share == pytest.approx(0.00032) and r.daemon_share == pytest.approx(0.032)
    assert not r.share_met
    assert figures("p", 50_000, 0.0006, 0.0).ms_per_100kb == pytest.approx(1.2)
    assert not figures("p", 50_000, 0.0006, 0.0).speed_met
    assert figures("p", 100_000, 0.0002, 0.0).share_met  # 1.6 % of the daemon's CPU


def test_underscore_escaped_names_from_newer_prometheus_client_map_the_same() -> None:
    """prometheus_client ≥ 0.2x answers an OpenMetrics Accept header with ``vllm_x`` for
    ``vllm:x``; the adapter reads both spellings to the same signals."""
    from prometheus_client import CollectorRegistry, Counter
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    from agent.sources.engines import ADAPTERS, detect_kind

    reg = CollectorRegistry()
    c = Counter("vllm:generation_tokens", "tokens", ["model_name", "engine"], registry=reg)
    c.labels("m", "0").inc(42)
    escaped = om_latest(reg).decode()
    samples = [line for line in escaped.splitlines() if not line.startswith("#")]
    assert samples[0].startswith("vllm_generation_tokens_total{")  # only HELP/TYPE keep the colon
    assert detect_kind(escaped) == "vllm"
    (sig,) = ADAPTERS["vllm"].parse(escaped)
    assert sig.model == "m" and sig.generation_tokens_total == 42


# ---- the adapter boundary ------------------------------------------------------------------


def _read(page: str, kind: str = "vllm", **kw: Any) -> tuple[dict[str, ModelSignals], Any]:
    reading = ADAPTERS[kind].read(page, **kw)
    return {m.model: m for m in reading.models}, reading


def test_a_series_written_twice_counts_once_and_with_two_values_not_at_all() -> None:
    page = (
        'vllm:num_requests_running{model_name="m"} 8\n'
        'vllm:generation_tokens_total{model_name="m"} 100\n'
        'vllm:num_requests_running{model_name="m"} 5\n'
        'vllm:generation_tokens_total{model_name="m"} 100\n'
    )
    for _ in range(3):  # line by line each time: no layout or map plan hides the repeat
        models, reading = _read(page)
        assert models["m"].generation_tokens_total == 100  # the same value twice: once
        assert models["m"].requests_running is None  # 8 or 5? neither
        assert reading.invalid_series == (
            "requests_running: vllm:num_requests_running{model_name=m} (written twice with different values)",
        )


def test_both_spellings_of_a_family_are_read_once() -> None:
    page = (
        'vllm:generation_tokens_total{model_name="m"} 100\n'
        'vllm_generation_tokens_total{model_name="m"} 100\n'
        'vllm_prompt_tokens_total{model_name="m"} 40\n'
    )
    (m,) = ADAPTERS["vllm"].parse(page)
    assert m.generation_tokens_total == 100  # not 200
    assert m.prompt_tokens_total == 40  # only the escaped spelling: read as the canonical one


def test_exemplars_native_histograms_and_quoted_names_are_read() -> None:
    page = (
        'vllm:generation_tokens_total{model_name="m"} 7 # {trace_id="abc"} 1.0\n'
        'vllm:time_to_first_token_seconds{model_name="m"} {count:3,sum:1.5,schema:0,zero_threshold:0,'
        "zero_count:0,positive_spans:[0:1],positive_deltas:[3]}\n"
        'vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.5"} 2 # {trace_id="x"} 0.4\n'
        'vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} 3\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 1.5\n'
        'vllm:time_to_first_token_seconds_count{model_name="m"} 3\n'
        '{"vllm:prompt_tokens_total", model_name="m"} 11\n'
        "# EOF\n"
    )
    (m,) = ADAPTERS["vllm"].parse(page, openmetrics=True)
    assert m.generation_tokens_total == 7 and m.prompt_tokens_total == 11
    assert m.ttft_seconds == Histogram(buckets=((0.5, 2.0), (math.inf, 3.0)), sum=1.5, count=3.0)


@pytest.mark.parametrize("bad", ["+Inf", "-Inf", "1e308", "NaN", "-5", "2e15"])
def test_a_hostile_counter_makes_only_its_signal_absent(bad: str) -> None:
    page = (
        f'vllm:generation_tokens_total{{model_name="a",engine="0"}} {bad}\n'
        'vllm:generation_tokens_total{model_name="a",engine="1"} 50\n'
        'vllm:prompt_tokens_total{model_name="a"} 20\n'
        'vllm:generation_tokens_total{model_name="b"} 10\n'
    )
    models, reading = _read(page)
    assert models["a"].generation_tokens_total is None  # not 50 (a partial sum), not Inf
    assert "generation_tokens_total" not in models["a"].counter_parts  # no part of the refused sum
    assert models["a"].prompt_tokens_total == 20  # other signals of the model unaffected
    assert models["b"].generation_tokens_total == 10  # other models unaffected
    (why,) = reading.invalid_series
    assert why.startswith("generation_tokens_total: vllm:generation_tokens_total{engine=0,model_name=a}")


@pytest.mark.parametrize("bad", ["+Inf", "-1", "NaN", "1.5"])
def test_a_hostile_gauge_is_refused_and_a_ratio_stays_in_0_1(bad: str) -> None:
    page = (
        f'vllm:kv_cache_usage_perc{{model_name="a"}} {bad}\nvllm:num_requests_running{{model_name="a"}} 3\n'
    )
    models, reading = _read(page)
    assert models["a"].kv_cache_usage_ratio is None and models["a"].requests_running == 3
    assert len(reading.invalid_series) == (0 if bad == "NaN" else 1)  # a NaN gauge: no reading


def _ttft(model: str, buckets: list[tuple[str, str]], count: str) -> str:
    lines = [
        f'vllm:time_to_first_token_seconds_bucket{{model_name="{model}",le="{le}"}} {v}' for le, v in buckets
    ]
    lines.append(f'vllm:time_to_first_token_seconds_sum{{model_name="{model}"}} 1')
    lines.append(f'vllm:time_to_first_token_seconds_count{{model_name="{model}"}} {count}')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("buckets", "count"),
    [
        ([("0.1", "5"), ("1", "3"), ("+Inf", "5")], "5"),  # decreasing
        ([("0.1", "NaN"), ("1", "3"), ("+Inf", "5")], "5"),
        ([("0.1", "1"), ("1", "3"), ("+Inf", "NaN")], "5"),  # +Inf bucket NaN
        ([("0.1", "1"), ("1", "3"), ("+Inf", "5")], "NaN"),
        ([("0.1", "1"), ("1", "-3"), ("+Inf", "5")], "5"),
    ],
)
def test_a_broken_histogram_is_absent_never_a_made_up_quantile(
    buckets: list[tuple[str, str]], count: str
) -> None:
    page = _ttft("a", buckets, count) + _ttft("b", [("0.1", "1"), ("1", "3"), ("+Inf", "4")], "4")
    models, reading = _read(page)
    assert "a" not in models or models["a"].ttft_seconds is None
    assert models["b"].ttft_seconds == Histogram(
        buckets=((0.1, 1.0), (1.0, 3.0), (math.inf, 4.0)), sum=1.0, count=4.0
    )
    assert len(reading.invalid_series) == 1 and reading.invalid_series[0].startswith("ttft_seconds: ")


def test_label_values_are_bounded_and_cleaned() -> None:
    long_a, long_b = "m" * 1000 + "a", "m" * 1000 + "b"
    page = "".join(
        f'vllm:generation_tokens_total{{model_name="{name}"}} {i}\n'
        for i, name in enumerate([long_a, long_b, "bell\x07and\x1bescape", "ok/model"], start=1)
    )
    models, _ = _read(page)
    names = sorted(models)
    assert "bellandescape" in names and "ok/model" in names
    longs = [n for n in names if n.startswith("mmm")]
    assert len(longs) == 2 and all(len(n) == 128 and n[119] == "~" for n in longs)  # 119 kept + "~" + 8 hex
    assert longs[0] != longs[1]  # distinct long names stay distinct
    assert clean_label("x" * 128) == "x" * 128 and clean_label("tab\there") == "tabhere"


def test_models_beyond_max_models_fold_into_other_with_a_dropped_count() -> None:
    page = "".join(
        f'vllm:generation_tokens_total{{model_name="m{i:02d}",engine="{e}"}} {i}\n'
        for i in range(70)
        for e in (0, 1)
    )
    models, reading = _read(page, max_models=64)
    assert len(models) == 65 and "m63" in models and "m64" not in models
    assert models["other"].generation_tokens_total == 2 * sum(range(64, 70))  # 2 ranks each
    assert reading.dropped_series == 6 * 2
    small, reading = _read(page)  # the default is 64 too
    assert len(small) == 65 and reading.dropped_series == 12
    _, none_dropped = _read(page, max_models=100)
    assert none_dropped.dropped_series == 0
