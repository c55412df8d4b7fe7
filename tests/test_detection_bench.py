"""The detection benchmark end to end on a small simulated history (1 node, 2 weeks)."""

from __future__ import annotations

import pytest

from agent.bench.detection import DETECTORS, run


@pytest.fixture(scope="module")
def result() -> tuple[dict, list[str]]:
    lines: list[str] = []
    return run(seed=7, weeks=2, nodes=1, print_fn=lines.append), lines


def test_prints_every_detector_side_by_side(result: tuple[dict, list[str]]) -> None:
    out, lines = result
    assert out["incidents"] > 0 and out["node_weeks"] == pytest.approx(1.0)
    header = next(i for i, line in enumerate(lines) if line.startswith("detector"))
    assert [line.split()[0] for line in lines[header + 1 : header + 1 + len(DETECTORS)]] == list(DETECTORS)
    for d in DETECTORS:
        fig = out["detectors"][d]
        assert set(fig) >= {
            "recall",
            "median_delay_minutes",
            "p90_delay_minutes",
            "false_alarms_per_node_week",
        }
        assert fig["usd_before_detection"] >= 0.0


def test_like_for_like_detectors_beat_the_literal_rule(result: tuple[dict, list[str]]) -> None:
    det = result[0]["detectors"]
    # The literal "1.5 × 7-day mean" pages on troughs and mix changes; the shipped rules do not.
    assert det["literal"]["false_alarms_per_node_week"] > 3 * det["defaults"]["false_alarms_per_node_week"]
    assert det["defaults"]["recall"] >= det["literal"]["recall"]
    # Combining can only add detections (events are merged, never removed).
    assert det["combined"]["recall"] >= max(det["defaults"]["recall"], det["forest"]["recall"])
    assert det["combined"]["usd_before_detection"] <= det["defaults"]["usd_before_detection"] + 1e-9
