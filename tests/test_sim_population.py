"""The simulators sample like real engines: one drawn request population per rank, gauges one
instant at scrape time, request counters moving as requests finish (infercost_sim.population and
infercost_sim.samples)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from infercost_sim import population
from infercost_sim.samples import draw_readings, ticks
from infercost_sim.workload import MINUTE, simulate_node


def _constant(rate: float, life: float, steps: int, step: float, seed: int = 0) -> population.Population:
    rng = np.random.default_rng(seed)
    return population.draw(np.full((steps, 1), rate), np.full((steps, 1), life), step, rng)


def test_the_mean_of_many_instants_is_the_decode_request_seconds_per_second() -> None:
    # 0.2 requests/s living 20 s: 4 in the engine on average (Little), Poisson-distributed
    pop = _constant(0.2, 20.0, 200_000, 5.0)
    instants = pop.present[:, 0]
    seconds = 200_000 * 5.0
    assert instants.mean() == pytest.approx(pop.lifetime_seconds.sum() / seconds, rel=0.02)
    assert instants.mean() == pytest.approx(4.0, rel=0.02)
    assert instants.var() == pytest.approx(4.0, rel=0.05)  # a Poisson count: ±50 % at 4 sequences
    assert pop.finished.sum() == pytest.approx(0.2 * seconds, rel=0.01)


def test_consecutive_5s_readings_are_correlated_over_the_requests_lifetimes() -> None:
    pop = _constant(1.0, 30.0, 100_000, 5.0, seed=1)
    x = pop.present[:, 0].astype(float)
    x -= x.mean()

    def corr(lag: int) -> float:
        return float((x[:-lag] * x[lag:]).mean() / x.var())

    # an M/M/∞ population's autocorrelation is exp(−lag / lifetime): 0.85 at 5 s, 0.37 at 30 s
    assert corr(1) == pytest.approx(np.exp(-5.0 / 30.0), abs=0.02)
    assert corr(6) == pytest.approx(np.exp(-1.0), abs=0.03)
    assert abs(corr(60)) < 0.03  # five minutes later: other requests
    # not fresh noise on a mean: independent draws would read 0 at every lag
    assert corr(1) > 0.8


def test_request_counters_move_only_when_requests_finish() -> None:
    pop = _constant(0.05, 60.0, 5000, 5.0, seed=2)
    none_left = pop.finished[:, 0] == 0
    assert none_left.any() and (~none_left).any()
    assert (pop.lifetime_seconds[none_left, 0] == 0).all()
    assert (pop.lifetime_seconds[~none_left, 0] > 0).all()
    # the population is conserved: arrivals − departures = the change in the instant
    change = np.diff(pop.present[:, 0])
    assert (change == pop.arrived[1:, 0] - pop.finished[1:, 0]).all()


def test_request_seconds_are_conserved_when_the_lifetimes_jump() -> None:
    # a burst's batch admitted at 60 s lifetimes, then the lifetimes drop to 5 s, then the traffic
    # stops and everything drains: the finished requests' seconds add up to every second a request
    # was present (the starting population's mean age, L, included), not to the minute means'
    step, rate = 5.0, 10.0
    life = np.concatenate([np.full(120, 60.0), np.full(120, 5.0), np.full(400, 5.0)])[:, None]
    rates = np.concatenate([np.full(240, rate), np.zeros(400)])[:, None]
    pop = population.draw(rates, life, step, np.random.default_rng(3))
    assert pop.present[-1, 0] == 0  # drained
    start = pop.present[0, 0] - pop.arrived[0, 0] + pop.finished[0, 0]
    present = start * 60.0 + pop.occupancy_seconds.sum()
    assert pop.lifetime_seconds.sum() == pytest.approx(present, rel=1e-12)
    # the minute after the drop finishes the requests admitted at 60 s: each with far more than 5 s
    after = slice(120, 132)
    assert pop.lifetime_seconds[after].sum() / pop.finished[after].sum() > 3 * 5.0


def test_a_node_reads_instants_of_its_drawn_requests_per_rank() -> None:
    sim = simulate_node("core", seed=3, weeks=1)
    rd = draw_readings(sim, 5.0)
    seconds = sim.minutes * MINUTE
    instants = rd.running.sum(axis=1)
    # the mean of the instants is the decode request-seconds per second and the traffic model's batch
    assert instants.mean() == pytest.approx(rd.decode_seconds[-1] / seconds, rel=0.01)
    assert instants.mean() == pytest.approx(sim.trace.running.mean(), rel=0.01)
    # tokens as the model served them, in total; minute by minute, drawn
    assert rd.generation[-1].sum() == pytest.approx(sim.trace.generation_tokens.sum(), rel=0.01)
    # the ranks are separate populations (not one figure split eight ways)
    assert rd.running.shape[1] == sim.physics.replicas
    assert not (rd.running[:, 0] == rd.running[:, 1]).all()


def test_the_scrapes_carry_instants_counters_per_rank_and_the_cached_prompt_counter() -> None:
    sim = dataclasses.replace(simulate_node("azure", seed=4, weeks=1), tick_seconds=15.0)
    read = [t for _, t in zip(range(4 * 60 * 24), ticks(sim), strict=False) if t.scrape.up]
    assert read[1].t - read[0].t == 15.0
    running = np.array([t.scrape.models[0].requests_running for t in read])
    assert (running == np.round(running)).all()  # an instant count of requests, never a mean
    s = read[-1].scrape.models[0]
    parts = s.counter_parts["generation_tokens_total"]
    assert len(parts) == sim.physics.replicas and sum(parts.values()) == s.generation_tokens_total
    assert s.cached_prompt_tokens_total is not None
    assert s.cached_prompt_tokens_total == pytest.approx(
        s.prompt_tokens_total * sim.physics.prefix_cache_hit_ratio, abs=1
    )
    # a 15 s scrape's instant differs from the next one's (drawn requests come and go)
    assert len(set(running.tolist())) > 10


def test_the_demo_engines_gauges_are_instants_of_drawn_requests() -> None:
    from agent.hardware import H100_SXM
    from infercost_sim.engine import LLAMA_8B, Deployment, SimEngine, Traffic

    t0 = 1_700_006_400.0
    # long answers (≈ 17 s in the engine each) at 0.2 requests/s: a few sequences at a time
    flat = Traffic(
        peak_rps=0.2, trough_ratio=1.0, weekend_ratio=1.0, noise_sigma=0.0, output_mean_tokens=3000.0,
        max_output_tokens=8192,
    )  # fmt: skip
    engine = SimEngine(Deployment(LLAMA_8B, H100_SXM), flat, start=t0, seed=9)
    engine.advance_to(t0 + 600)  # past the start-up transient
    instants, fluid = [], []
    for k in range(1, 2 * 720 + 1):  # two hours of 5 s scrapes
        engine.advance_to(t0 + 600 + 5.0 * k)
        instants.append(engine.state().requests_running)
        fluid.append(engine.running)
    x = np.array(instants, dtype=float)
    # a count of requests, not a mean; its mean is the fluid's (Little's law), its spread Poisson's
    assert (x == np.round(x)).all()
    assert x.mean() == pytest.approx(np.mean(fluid), rel=0.1)
    assert x.var() == pytest.approx(x.mean(), rel=0.3)
    d = x - x.mean()
    assert float((d[:-1] * d[1:]).mean() / d.var()) > 0.3  # consecutive 5 s readings: the same requests


def test_drawn_tokens_add_up_to_the_traffic_models_tokens_at_the_fine_step() -> None:
    """The token counter read off the drawn population is the traffic model's own tokens: on the
    Azure model (rates and step times jump minute to minute, requests live seconds) the trapezoid
    integral charged the population one minute left behind half a step of the next: +4 %."""
    for generator in ("azure", "core"):
        sim = simulate_node(generator, seed=1, weeks=1 / 7, node=f"{generator}-1")
        rd = draw_readings(sim)
        assert rd.generation[-1].sum() / sim.trace.generation_tokens.sum() == pytest.approx(1.0, abs=0.005)
