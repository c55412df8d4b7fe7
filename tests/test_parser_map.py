"""The adapter's map of histograms read through a remembered bucket layout (for speed): scrape
after scrape, the same histograms and refusals as reading every bucket, hand-computed."""

from __future__ import annotations

import math

from agent.samples import Histogram
from agent.sources.engines.base import BUCKET_PLANS, Adapter, Series


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


def test_bucket_layouts_are_bounded() -> None:
    assert BUCKET_PLANS == 256  # histograms per engine x engines of one kind (see the constant)
    a = _adapter()
    for i in range(BUCKET_PLANS + 1):
        a.read(_page(f"m{i}", ("1", "2", "3")))
    assert len(a.bucket_plans) == 1  # full at 256: emptied, then the last one kept
    (m,) = a.read(_page("m0", ("1", "2", "3"))).models
    assert m.model == "m0" and m.ttft_seconds is not None and len(a.bucket_plans) == 2
