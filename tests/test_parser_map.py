"""The adapter's map of histograms and of whole recorded pages, scrape after scrape: new values are
read, and every check still applies (hostile values, decreasing buckets, ranks, folded models),
hand-computed."""

from __future__ import annotations

import math
from pathlib import Path

from agent.samples import Histogram
from agent.sources.engines.base import Adapter, Reading, Series
from agent.sources.engines.tgi import ADAPTER as TGI


def _adapter(**kw: object) -> Adapter:
    return Adapter(
        kind="test",
        prefixes=("t_",),
        model_label="model",
        histograms={"ttft_seconds": (Series("t_ttft_ms", scale=0.001),)},
        **kw,  # type: ignore[arg-type]
    )


def _page(model: str, counts: tuple[str, str, str], total: str = "30", extra: str = "") -> str:
    a, b, c = counts
    return (
        f't_ttft_ms_bucket{{model="{model}",le="10"}} {a}\n'
        f't_ttft_ms_bucket{{model="{model}",le="100"}} {b}\n'
        f't_ttft_ms_bucket{{model="{model}",le="+Inf"}} {c}\n'
        f't_ttft_ms_sum{{model="{model}"}} {total}\n'
        f't_ttft_ms_count{{model="{model}"}} {c}\n' + extra
    )


def test_scrape_after_scrape_the_new_counts_are_read() -> None:
    a = _adapter()
    for counts, total in (((1, 3, 4), 250.0), ((2, 5, 7), 900.0), ((2, 5, 7), 900.0)):
        text = _page("m", tuple(str(c) for c in counts), str(total))  # type: ignore[arg-type]
        (m,) = a.read(text).models
        assert m.ttft_seconds == Histogram(
            ((0.01, counts[0]), (0.1, counts[1]), (math.inf, counts[2])), total / 1000, counts[2]
        )


def test_a_bad_count_after_good_scrapes_is_still_refused() -> None:
    a = _adapter()
    assert a.read(_page("m", ("1", "2", "3"))).models[0].ttft_seconds is not None
    for bad, why in (
        ("NaN", "bucket count nan"),
        ("-1", "bucket count -1.0"),
        ("2e16", "bucket count 2e+16"),
    ):
        reading = a.read(_page("m", (bad, "2", "3")))
        assert reading.models == ()  # the histogram was the only signal: no model left
        assert reading.invalid_series == (f"ttft_seconds: t_ttft_ms_bucket{{le=10,model=m}} ({why})",)
    reading = a.read(_page("m", ("3", "2", "3")))  # decreasing
    assert reading.invalid_series == ("ttft_seconds: t_ttft_ms_bucket{model=m} (bucket counts decrease)",)
    (m,) = a.read(_page("m", ("1", "2", "4"))).models
    assert m.ttft_seconds == Histogram(((0.01, 1.0), (0.1, 2.0), (math.inf, 4.0)), 0.03, 4.0)


def test_ranks_of_one_model_are_summed_bound_by_bound() -> None:
    a = _adapter()
    two = _page("m", ("1", "2", "3"), "5").replace('model="m"', 'model="m",rank="0"') + _page(
        "m", ("10", "20", "30"), "7"
    ).replace('model="m"', 'model="m",rank="1"')
    for _ in range(2):
        (m,) = a.read(two).models
        assert m.ttft_seconds == Histogram(((0.01, 11.0), (0.1, 22.0), (math.inf, 33.0)), 0.012, 33.0)


def test_models_folded_into_other_are_summed() -> None:
    a = _adapter()
    text = (
        _page("a", ("1", "2", "3"), "5") + _page("b", ("4", "5", "6"), "7") + _page("c", ("1", "1", "1"), "1")
    )
    for _ in range(2):
        reading = a.read(text, max_models=1)
        assert [m.model for m in reading.models] == ["a", "other"]
        assert reading.models[1].ttft_seconds == Histogram(
            ((0.01, 5.0), (0.1, 6.0), (math.inf, 7.0)), 0.008, 7.0
        )
        assert reading.dropped_series == 10


def test_two_models_each_keep_their_histogram_and_one_without_inf_is_absent() -> None:
    a = _adapter()
    no_inf = 't_ttft_ms_bucket{model="z",le="10"} 1\n'
    text = _page("a", ("1", "2", "3"), "5") + _page("b", ("4", "5", "6"), "7") + no_inf
    for _ in range(2):
        reading = a.read(text)
        assert [(m.model, m.ttft_seconds) for m in reading.models] == [
            ("a", Histogram(((0.01, 1.0), (0.1, 2.0), (math.inf, 3.0)), 0.005, 3.0)),
            ("b", Histogram(((0.01, 4.0), (0.1, 5.0), (math.inf, 6.0)), 0.007, 6.0)),
        ]
        assert reading.invalid_series == ()


def test_an_le_that_is_not_a_number_is_refused_every_scrape() -> None:
    a = _adapter()
    text = _page("m", ("1", "2", "3")) + 't_ttft_ms_bucket{model="m",le="x"} 1\n'
    for _ in range(2):
        reading = a.read(text)
        assert reading.models == ()
        assert reading.invalid_series == (
            "ttft_seconds: t_ttft_ms_bucket{le=x,model=m} (le is not a number)",
        )


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


def _tgi(text: str) -> Reading:
    """``text`` read by the TGI adapter after two scrapes of the recorded page."""
    for _ in range(2):
        TGI.read(TGI_PAGE)
    return TGI.read(text)


def test_new_values_are_read_scrape_after_scrape() -> None:
    text = _with(TGI_PAGE, prompt="90000", waiting="7", e2e_5="990", decode="2000.5", validation="26")
    reading = _tgi(text)
    (m,) = reading.models
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
    assert reading.invalid_series == ()


def test_a_decreasing_bucket_after_good_scrapes_makes_that_histogram_absent() -> None:
    text = _with(TGI_PAGE, e2e_2="1950")
    (m,) = _tgi(text).models
    assert m.e2e_seconds is None
    assert m.itl_seconds is not None and m.itl_seconds.count == 1000.0
    assert m.prompt_tokens_total == 81234.0


def test_hostile_values_after_good_scrapes_make_only_their_signal_absent() -> None:
    text = _with(TGI_PAGE, prompt="-5", waiting="NaN", generated="1e300", itl_001="+Inf")
    reading = _tgi(text)
    (m,) = reading.models
    assert m.prompt_tokens_total is None and m.generation_tokens_total is None
    assert m.requests_waiting is None  # a NaN gauge: no reading
    assert m.itl_seconds is None
    assert m.requests_running == 14.0 and m.decode_seconds_total == 1800.25
    assert m.e2e_seconds is not None and m.e2e_seconds.sum == 1502.5
    assert len(reading.invalid_series) == 3


def test_a_sum_over_hundreds_of_series_is_read() -> None:
    text = "".join(f'tgi_queue_size{{shard="{i}"}} 2\n' for i in range(300))
    for _ in range(3):
        (m,) = TGI.read(text).models
        assert m.requests_waiting == 600.0
