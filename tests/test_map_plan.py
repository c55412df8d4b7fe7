"""The two-phase map: a page structure seen again is mapped by a compiled plan that only
applies the new values; every check still applies (hostile values, decreasing buckets, DP-rank parts,
folded models), hand-computed, and the plan agrees with the slow map on perturbed pages."""

from __future__ import annotations

import math
import random
from pathlib import Path

from agent.samples import Histogram
from agent.sources.engines.base import _Mapping
from agent.sources.engines.registry import ADAPTERS
from agent.sources.engines.tgi import ADAPTER as TGI

FIXTURES = Path(__file__).parent / "fixtures" / "expositions"
TGI_PAGE = (FIXTURES / "tgi.txt").read_text()


def _with(text: str, **values: str) -> str:
    """``text`` with new values on the lines named (by their key in :data:`HEADS`)."""
    for head, value in values.items():
        line = next(ln for ln in text.splitlines() if ln.split(" ")[0] == HEADS[head])
        text = text.replace(line + "\n", f"{HEADS[head]} {value}\n")
    return text


HEADS = {
    "prompt": "tgi_request_input_length_sum",
    "generated": "tgi_request_generated_tokens_sum",
    "waiting": "tgi_queue_size",
    "e2e_5": 'tgi_request_duration_bucket{le="5.0"}',
    "e2e_2": 'tgi_request_duration_bucket{le="2.0"}',
    "itl_001": 'tgi_request_mean_time_per_token_duration_bucket{le="0.01"}',
    "decode": 'tgi_batch_forward_duration_sum{method="decode"}',
    "validation": 'tgi_request_failure{err="validation"}',
}


def _planned(adapter: object) -> int:
    """Compiled plans: for pages mapped as given, and for pages read through a parser layout."""
    by_page = sum(1 for entry in adapter.map_plans if entry[4] is not None)  # type: ignore[attr-defined]
    return by_page + sum(1 for entry in adapter.layout_plans if entry[3] is not None)  # type: ignore[attr-defined]


def _tgi(text: str) -> object:
    TGI.forget()
    for _ in range(2):  # first sighting remembered, second traced and compiled
        TGI.read(TGI_PAGE)
    assert _planned(TGI) == 1
    return TGI.read(text)


def test_new_values_are_applied_through_the_plan() -> None:
    text = _with(TGI_PAGE, prompt="90000", waiting="7", e2e_5="990", decode="2000.5", validation="26")
    reading = _tgi(text)
    (m,) = reading.models  # type: ignore[attr-defined]
    assert _planned(TGI) == 1  # the same structure: no second plan
    assert m.model == "default"
    assert m.prompt_tokens_total == 90000.0 and m.generation_tokens_total == 250321.0
    assert m.requests_waiting == 7.0 and m.requests_running == 14.0
    assert m.prefill_seconds_total == 40.5 and m.decode_seconds_total == 2000.5
    assert m.requests_finished_total == {"overloaded": 5.0, "success": 1000.0, "validation": 26.0}
    assert m.e2e_seconds == Histogram(
        ((0.5, 10.0), (1.0, 400.0), (2.0, 950.0), (5.0, 990.0), (math.inf, 1000.0)), 1502.5, 1000.0
    )
    assert m.itl_seconds == Histogram(
        ((0.005, 50.0), (0.01, 900.0), (0.02, 1000.0), (math.inf, 1000.0)), 9.75, 1000.0
    )
    assert reading.invalid_series == ()  # type: ignore[attr-defined]


def test_a_decreasing_bucket_after_the_plan_makes_that_histogram_absent() -> None:
    text = _with(TGI_PAGE, e2e_2="1950")
    (m,) = _tgi(text).models  # type: ignore[attr-defined]
    assert m.e2e_seconds is None
    assert m.itl_seconds is not None and m.itl_seconds.count == 1000.0
    assert m.prompt_tokens_total == 81234.0


def test_hostile_values_after_the_plan_make_only_their_signal_absent() -> None:
    text = _with(TGI_PAGE, prompt="-5", waiting="NaN", generated="1e300", itl_001="+Inf")
    reading = _tgi(text)
    (m,) = reading.models  # type: ignore[attr-defined]
    assert m.prompt_tokens_total is None and m.generation_tokens_total is None
    assert m.requests_waiting is None  # a NaN gauge: no reading
    assert m.itl_seconds is None
    assert m.requests_running == 14.0 and m.decode_seconds_total == 1800.25
    assert m.e2e_seconds is not None and m.e2e_seconds.sum == 1502.5
    assert len(reading.invalid_series) == 3  # type: ignore[attr-defined]


def _perturbed(page: dict, rnd: random.Random) -> dict:  # type: ignore[type-arg]
    out = {}
    for name, samples in page.items():
        new = []
        for s in samples:
            r, v = rnd.random(), s.value
            if r < 0.02:
                v = math.nan
            elif r < 0.04:
                v = -v - 1.0
            elif r < 0.06:
                v = math.inf
            elif r < 0.08:
                v = 2e15
            elif r < 0.14:
                v = v * rnd.uniform(0.5, 1.5)
            elif r < 0.5:
                v = v + rnd.randint(0, 3)
            new.append(s._replace(value=v))
        out[name] = new
    return out


def test_the_plan_agrees_with_the_slow_map_on_perturbed_pages() -> None:
    rnd = random.Random(14)
    for fixture, kind in (("tgi.txt", "tgi"), ("vllm_v1_dp2.txt", "vllm"), ("ref_sglang.txt", "sglang")):
        a = ADAPTERS[kind]
        a.forget()
        text = (FIXTURES / fixture).read_text()
        text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("$") and ln.strip() != "...")
        page = a.parser.parse(text)
        for default_model, max_models in ((None, 64), ("cfg", 1)):  # max_models 1: models folded
            a.map(page, default_model, max_models)
            a.map(page, default_model, max_models)
            assert _planned(a) >= 1, fixture
            for _ in range(60):
                p = _perturbed(page, rnd)
                fast = a.map(p, default_model, max_models)
                slow = _Mapping(a, p, default_model, max_models).run()
                assert repr(fast) == repr(slow), fixture  # repr: NaN-safe and exact


def test_dp_rank_histogram_parts_through_the_plan() -> None:
    a = ADAPTERS["vllm"]
    a.forget()
    text = (FIXTURES / "vllm_v1_dp2.txt").read_text()
    first = a.read(text)
    a.read(text)
    assert _planned(a) == 1
    again = a.read(text)
    assert again == first
    assert any(m.histogram_parts for m in again.models)


def _perturbed_text(text: str, rnd: random.Random) -> str:
    out = []
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if line.startswith("#") or not head:
            out.append(line)
            continue
        try:
            v = float(value)
        except ValueError:
            out.append(line)
            continue
        r = rnd.random()
        new = value
        if r < 0.02:
            new = "NaN"
        elif r < 0.04:
            new = repr(-v - 1.0)
        elif r < 0.06:
            new = "+Inf"
        elif r < 0.08:
            new = "2e15"
        elif r < 0.14:
            new = repr(v * rnd.uniform(0.5, 1.5))
        elif r < 0.5:
            new = repr(v + rnd.randint(0, 3))
        out.append(f"{head} {new}")
    return "\n".join(out) + "\n"


def test_pages_read_through_a_layout_plan_agree_with_the_slow_map() -> None:
    rnd = random.Random(8)
    for fixture, kind in (("tgi.txt", "tgi"), ("vllm_v1_dp2.txt", "vllm"), ("trtllm_serve.txt", "trtllm")):
        a = ADAPTERS[kind]
        a.forget()
        text = (FIXTURES / fixture).read_text()
        text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("$") and ln.strip() != "...")
        for default_model, max_models in ((None, 64), ("cfg", 1)):
            for _ in range(3):  # read line by line, then its layout known, then its layout's map compiled
                a.read(text, default_model, max_models=max_models)
            assert _planned(a) >= 1, fixture
            for _ in range(60):
                t = _perturbed_text(text, rnd)
                fast = a.read(t, default_model, max_models=max_models)
                slow = _Mapping(a, a.parser.parse(t), default_model, max_models).run()
                assert repr(fast) == repr(slow), fixture


def test_a_sum_over_hundreds_of_series_is_mapped_the_slow_way() -> None:
    # 300 series of one gauge: the traced sum nests deeper than Python's parser takes, so no plan
    a = ADAPTERS["tgi"]
    a.forget()
    text = "".join(f'tgi_queue_size{{shard="{i}"}} 2\n' for i in range(300))
    for _ in range(3):
        (m,) = a.read(text).models
        assert m.requests_waiting == 600.0
    assert _planned(a) == 0
