"""Like-mix baselines: a shift to longer prompts and shorter answers is not a cost regression."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.detect.alerts import AlertManager
from agent.detect.evaluator import RuleEvaluator
from agent.detect.rules import RuleError, load_rules
from agent.records import MinuteRecord

MONDAY = 1699833600.0  # 2023-11-13 00:00 UTC, a Monday
LABELS = (("node", "n1"), ("engine", "vllm-a"), ("model", "llama"), ("model_version", "v1"))
PRICE_PER_MINUTE = 2.0 / 60.0  # dollars: a $2/h GPU


def _rule(rule_id: str, **baseline: Any) -> dict[str, Any]:
    return {
        "id": rule_id,
        "signal": "usd_per_1m_output_tokens",
        "over": "5m",
        "op": ">",
        "baseline": {"window": "1d", "min_minutes": 30, **baseline},
        "factor": 1.5,
        "for": "10m",
        "severity": "warning",
        "summary": "s {value}",
    }


def _minute(t: float, output_tps: float, prompt_per_output: float, cost_factor: float) -> MinuteRecord:
    sums = {
        "seconds": 60.0,
        "generation_tokens": output_tps * 60.0,
        "prompt_tokens": output_tps * prompt_per_output * 60.0,
        "cost_usd": PRICE_PER_MINUTE * cost_factor,
    }
    return MinuteRecord("model", LABELS, t, sums)


def _fired(tmp_path: Path, phases: list[tuple[int, float, float, float]]) -> dict[str, list[float]]:
    """Feed (minutes, output tokens/s, prompt/output ratio, cost factor) phases; firing times by rule."""
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"rules": [_rule("plain"), _rule("like_mix", like_mix={"band_ratio": 1.5})]}))
    rs = load_rules([p])
    ev, am = RuleEvaluator(rs), AlertManager(rs)
    fired: dict[str, list[float]] = {"plain": [], "like_mix": []}
    t = MONDAY
    for minutes, tps, mix, cost in phases:
        for _ in range(minutes):
            for e in am.step(ev.step(t + 60, [_minute(t, tps, mix, cost)]), t + 60):
                if e.kind == "firing":
                    fired[e.alert.rule_id].append(e.at - MONDAY)
            t += 60
    return fired


def test_mix_change_pages_only_without_like_mix(tmp_path: Path) -> None:
    # 2 h at 1,000 output tokens/s and 4 prompt tokens per output token; then answers halve
    # (500 tokens/s) and prompts grow (ratio 10) for the same GPU cost: $/1M output doubles.
    fired = _fired(tmp_path, [(120, 1000.0, 4.0, 1.0), (120, 500.0, 10.0, 1.0)])
    # The 5 m window passes 1.5× once 4 of its minutes have the new mix (5 / (5 − 4 × 0.5) > 1.5), then "for".
    assert fired["plain"] == [(120 + 4 + 10) * 60.0]
    assert fired["like_mix"] == []


def test_regression_at_the_same_mix_still_pages(tmp_path: Path) -> None:
    # Same traffic and mix; the GPU cost doubles (twice the replicas for the same tokens).
    fired = _fired(tmp_path, [(120, 1000.0, 4.0, 1.0), (60, 1000.0, 4.0, 2.0)])
    assert fired["like_mix"] == [(120 + 3 + 10) * 60.0]  # (5 + 3) / 5 > 1.5 after 3 minutes, then "for"
    assert fired["plain"] == fired["like_mix"]


def test_like_mix_needs_a_model_signal(tmp_path: Path) -> None:
    bad = _rule("bad", like_mix={})
    bad["signal"] = "engine_up"
    bad["op"] = "<"
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"rules": [bad]}))
    with pytest.raises(RuleError, match="like_mix"):
        load_rules([p])


def test_like_load_falls_back_to_the_next_band_down_when_the_band_has_no_history() -> None:
    """A week at 30 requests in flight, then a slower build that holds 40 (a band the week never
    reached) at twice the cost per token: without the fallback there is no baseline, with it the
    next band down (30 requests, the same cost basis) is the baseline and the rule fires."""
    from agent.detect.rules import parse_rules

    def rule(rule_id: str, fallback: str) -> dict[str, Any]:
        r = _rule(rule_id)
        r["baseline"] = {
            "window": "1d",
            "min_minutes": 30,
            "like_load": {"signal": "requests_running", "band_ratio": 1.5, "fallback": fallback},
        }
        return r

    rs = parse_rules({"rules": [rule("plain", "none"), rule("lower", "lower")]}, "t")
    ev, am = RuleEvaluator(rs), AlertManager(rs)
    fired: dict[str, list[float]] = {"plain": [], "lower": []}
    t = MONDAY
    for minutes, running, cost in ((240, 30.0, 1.0), (60, 40.0, 2.0)):  # bands 8 (25.6–38.4) then 9
        for _ in range(minutes):
            rec = _minute(t, 100.0, 3.0, cost)
            rec = MinuteRecord(
                rec.kind, rec.labels, rec.minute, {**rec.sums, "running.s": running * 60, "running.w": 60.0}
            )
            for e in am.step(ev.step(t + 60, [rec]), t + 60):
                if e.kind == "firing":
                    fired[e.alert.rule_id].append(e.at - MONDAY)
            t += 60
    assert fired["plain"] == []
    assert fired["lower"] and fired["lower"][0] > 240 * 60


def _band_fired(
    between: bool, phases: list[tuple[int, float, float]], *, fallback: str = "none", op: str = ">"
) -> list[float]:
    """Feed (minutes, requests running, cost factor) phases at a fixed mix through a ×2-band
    like-load rule (factor 1.2 for ">", 0.8 for "<"; no hold); the minutes it fired at from minute
    240 (the history's own change of load at minute 120 fires too: its first 5-minute windows mix
    both)."""
    from agent.detect.rules import parse_rules

    r = _rule("r")
    r["op"], r["factor"], r["for"] = op, 1.2 if op == ">" else 0.8, "0s"
    r["baseline"] = {
        "window": "1d",
        "min_minutes": 30,
        "like_load": {
            "signal": "requests_running",
            "band_ratio": 2.0,
            "between_bands": between,
            "fallback": fallback,
        },
    }
    rs = parse_rules({"rules": [r]}, "t")
    ev, am = RuleEvaluator(rs), AlertManager(rs)
    fired: list[float] = []
    t = MONDAY
    for minutes, running, cost in phases:
        for _ in range(minutes):
            if running == 0:  # a gap: no record this minute
                am.step(ev.step(t + 60, []), t + 60)
                t += 60
                continue
            rec = _minute(t, 100.0, 3.0, cost)
            rec = MinuteRecord(
                rec.kind, rec.labels, rec.minute, {**rec.sums, "running.s": running * 60, "running.w": 60.0}
            )
            events = am.step(ev.step(t + 60, [rec]), t + 60)
            fired += [(e.at - MONDAY) / 60 for e in events if e.kind == "firing"]
            t += 60
    return [m for m in fired if m >= 240]


# Two hours at 11.3 requests in flight (band 3 of ×2 bands, 8–16, at its centre) costing 1.0, two at
# 5.66 (band 2's centre) costing 1.6: the cost per token of the quieter band is 1.6× (smaller batches).
HISTORY = [(120, 11.3, 1.0), (120, 5.66, 1.6)]


def test_between_bands_reads_the_baseline_at_the_windows_own_load() -> None:
    # 8.2 in flight (band 3's low edge) costing 1.3: against band 3's 1.0 that is +30 % and fires;
    # between bands the baseline there is 1.0^0.54 × 1.6^0.46 ≈ 1.24 and 1.3 is +5 %: quiet.
    evening = [(60, 8.2, 1.3)]
    assert _band_fired(False, [*HISTORY, *evening])
    assert _band_fired(True, [*HISTORY, *evening]) == []
    # a real regression at that load (1.6 against ≈ 1.24) still fires, 4 minutes in (the 5-minute
    # window passes 1.2 × 1.24 once 4 of its minutes are 1.6: the first 1.6 minute is minute 240)
    assert _band_fired(True, [*HISTORY, (60, 8.2, 1.6)]) == [244.0]


def test_between_bands_keeps_the_bands_own_figure_without_a_neighbour_or_at_its_centre() -> None:
    # band 2 never seen: 8.2 in flight is compared with band 3's 1.0, as without the option
    only_band_3 = [(240, 11.3, 1.0), (60, 8.2, 1.3)]
    assert _band_fired(True, only_band_3) == _band_fired(False, only_band_3) != []
    # at band 3's centre the neighbour has no weight: 1.3 is +30 % either way
    centre = [*HISTORY, (60, 11.3, 1.3)]
    assert _band_fired(True, centre) == _band_fired(False, centre) != []


def test_between_bands_carries_the_slope_on_below_the_quietest_band_seen() -> None:
    # band 2 never seen, but band 4 (22.6 in flight) cost 0.625: the slope from band 4 to band 3
    # (×1.6 per band) carried on to 8.2 in flight gives ≈ 1.24 there, so 1.3 is quiet, 1.6 fires
    history = [(120, 22.6, 0.625), (120, 11.3, 1.0)]
    assert _band_fired(False, [*history, (60, 8.2, 1.3)])
    assert _band_fired(True, [*history, (60, 8.2, 1.3)]) == []
    (fired,) = _band_fired(True, [*history, (60, 8.2, 1.6)])
    assert 240 < fired <= 245


# Two hours at 5.66 requests in flight (band 2's centre) and two at 22.6 (band 4's): band 3 between
# them (8–16) has no history of its own. The signal falls with load, 1.6 → 0.625 (×1.6 per band).
AROUND = [(120, 5.66, 1.6), (120, 22.6, 0.625)]


def test_a_thin_band_between_two_seen_ones_is_read_between_them_not_from_the_band_below() -> None:
    # (after a 10-minute gap, so that no window mixes the history's minutes with the probe's)
    def probe(between: bool, value: float, op: str = ">") -> list[float]:
        return _band_fired(between, [*AROUND, (10, 0.0, 0.0), (60, 11.3, value)], fallback="lower", op=op)

    # At band 3's centre (11.3 in flight) the two neighbours give 1.6^0.5 × 0.625^0.5 = 1.0 there.
    # A drop rule ("<" 0.8 ×, as decode efficiency falls with load on a saturating engine): the band
    # below alone says 1.6, so a usual 1.0 read as −37 % and fired; read between the bands it is quiet,
    # and a real drop to 0.7 still fires.
    assert probe(False, 1.0, "<")
    assert probe(True, 1.0, "<") == []
    assert probe(True, 0.7, "<")
    # A rise rule (cost per token, "> 1.2 ×"): against the band below's 1.6, 1.3 went unseen; read
    # between the bands (1.0) it is +30 % and fires, the usual 1.0 does not.
    assert probe(False, 1.3) == []
    assert probe(True, 1.3)
    assert probe(True, 1.0) == []
    # with only the band below seen, that band's figure, as before
    below_only = [(240, 5.66, 1.6), (60, 11.3, 1.0)]
    assert (
        _band_fired(True, below_only, fallback="lower", op="<")
        == _band_fired(False, below_only, fallback="lower", op="<")
        != []
    )


def _bursty_fired(per_minute: bool, factor: float) -> list[float]:
    """Four hours of a bursty node whose minutes alternate between 5.66 requests in flight (band 2
    of ×2 bands, cost 1.6) and 22.6 (band 4, cost 0.625), then an hour of the same at ``factor`` ×
    the cost; the minutes a ×2-band like-load rule (factor 1.2, no hold) fired at in that hour."""
    from agent.detect.rules import parse_rules

    r = _rule("r")
    r["factor"], r["for"] = 1.2, "0s"
    r["baseline"] = {
        "window": "1d",
        "min_minutes": 30,
        "like_load": {"signal": "requests_running", "band_ratio": 2.0, "per_minute": per_minute},
    }
    rs = parse_rules({"rules": [r]}, "t")
    ev, am = RuleEvaluator(rs), AlertManager(rs)
    fired: list[float] = []
    for i in range(300):
        t = MONDAY + 60 * i
        quiet = i % 2 == 0
        running, cost = (5.66, 1.6) if quiet else (22.6, 0.625)
        rec = _minute(t, 40.0 if quiet else 160.0, 3.0, cost * (factor if i >= 240 else 1.0))
        rec = MinuteRecord(
            rec.kind, rec.labels, rec.minute, {**rec.sums, "running.s": running * 60, "running.w": 60.0}
        )
        events = am.step(ev.step(t + 60, [rec]), t + 60)
        fired += [(e.at - MONDAY) / 60 for e in events if e.kind == "firing" and e.at - MONDAY >= 240 * 60]
    return fired


def test_per_minute_reads_each_minute_of_a_bursty_window_against_its_own_band() -> None:
    # The window's mean load (≈ 12–15 in flight) is in band 3, which no minute was ever in: read by
    # the window's mean there is no baseline and a 1.3× regression goes unseen. Read minute by
    # minute, each against its own band (1.6 or 0.625, weighted by its tokens), it fires at once,
    # and the usual cost does not.
    assert _bursty_fired(False, 1.3) == []
    assert _bursty_fired(True, 1.3) and _bursty_fired(True, 1.3)[0] <= 246
    assert _bursty_fired(True, 1.0) == []


def test_per_minute_needs_a_ratio_signal() -> None:
    from agent.detect.rules import parse_rules

    r = _rule("r")
    r["signal"] = "cost_usd"
    r["baseline"]["like_load"] = {"per_minute": True}
    with pytest.raises(RuleError, match="per_minute"):
        parse_rules({"rules": [r]}, "t")


def _per_minute_findings(minutes: list[tuple[float, float, float]], floor: float | None = None) -> list[Any]:
    """Findings of a ×2-band per-minute cost rule (factor 1.2) over (requests running, output
    tokens/s, cost factor) minutes, after two hours at 5.66 in flight (40 tok/s, cost 1.6) and two
    at 22.6 (160 tok/s, cost 0.625) alternating minute by minute; only the 5-minute windows that
    hold none of those history minutes."""
    from agent.detect.rules import parse_rules

    r = _rule("r")
    r["factor"], r["for"] = 1.2, "0s"
    like: dict[str, Any] = {"signal": "requests_running", "band_ratio": 2.0, "per_minute": True}
    if floor is not None:
        like["min_tokens_per_second"] = floor
    r["baseline"] = {"window": "1d", "min_minutes": 30, "like_load": like}
    ev = RuleEvaluator(parse_rules({"rules": [r]}, "t"))
    history = [(5.66, 40.0, 1.6) if i % 2 == 0 else (22.6, 160.0, 0.625) for i in range(240)]
    found: list[Any] = []
    for i, (running, tps, cost) in enumerate([*history, *minutes]):
        t = MONDAY + 60 * i
        rec = _minute(t, tps, 3.0, cost)
        rec = MinuteRecord(
            rec.kind, rec.labels, rec.minute, {**rec.sums, "running.s": running * 60, "running.w": 60.0}
        )
        findings = ev.step(t + 60, [rec])
        if i >= 244:  # windows of the given minutes only
            found += findings
    return found


def test_a_per_minute_finding_names_the_load_band_most_of_its_weight_was_in() -> None:
    # the deploy comparison reads the previous version at the finding's band: the busy minutes carry
    # 4× the tokens of the quiet ones, so that is 22.6 in flight, not the window's mean (≈ 14)
    bursty = [(5.66, 40.0, 1.6 * 1.3) if i % 2 == 0 else (22.6, 160.0, 0.625 * 1.3) for i in range(10)]
    found = _per_minute_findings(bursty)
    assert found and all(f.band_load == pytest.approx(22.6) for f in found)


def test_a_per_minute_rule_keeps_the_windows_own_traffic_floor() -> None:
    # one minute at 2.2 tokens/s costing 2×, four at 0.2 (under the floor of 1): the window's 0.6
    # tokens/s is under the floor, so no finding, as without per_minute
    quiet = [*[(22.6, 0.2, 0.625)] * 4, (22.6, 2.2, 0.625 * 2.0)]
    assert _per_minute_findings(quiet, floor=1.0) == []
    # at 10× the traffic the window is over the floor and judged (each minute costs more per token
    # than its band's busy baseline, so it fires): the silence above is the floor's
    busy = [*[(22.6, 2.0, 0.625)] * 4, (22.6, 22.0, 0.625 * 2.0)]
    assert _per_minute_findings(busy, floor=1.0)
