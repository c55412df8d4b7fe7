"""A drawn request population: what an engine's gauges and counters read, scrape by scrape.

A real vLLM, SGLang or TGI exposes ``num_requests_running`` and KV-cache usage as one instant at
scrape time, and its per-request counters move when requests finish. The traffic models decide, per
minute, how many requests a node serves and how long each stays in the engine (Little's law:
``running = served × lifetime``); this module draws the requests themselves, per data-parallel rank:
arrivals are Poisson at the minute's rate, lifetimes exponential with the minute's mean (an
M/M/∞ population, which a continuously batched engine below its cap is). Its state is advanced by
the exact transition over one step of ``step`` seconds — each request present survives it with
``exp(−step/L)``, each arrival of the step (uniform in it) is still present at its end with
``L·(1 − exp(−step/L))/step`` — so the instants at scrape times have the population's real law
(Poisson with mean ``rate × L`` in steady state) and consecutive readings are correlated over the
requests' lifetimes, not drawn afresh.

Counters: generation tokens move with every step the engine runs (``tokens = ∫ running dt ×
tokens per sequence-second``, the integral per step its expectation given the step's start),
request counts and request-seconds of decode when requests finish. Each finished request adds the
seconds it was present: departures are memoryless, so the requests that leave in a step are a random subset of
those present and carry, together, their share of the request-seconds the present requests have
accrued (a pool: ``∫ present dt`` flows in, each step's leavers take ``finished ÷ present`` of it
out). Request-seconds are conserved: over any span, what the finished requests add plus what those
still present have accrued is ``∫ present dt``, whatever the lifetimes do meanwhile (a burst's
batch drains at the lifetime it was admitted with, not at the minute's mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Population:
    """One drawn population, per step (rows) and rank (columns)."""

    step_seconds: float  # seconds per row
    present: np.ndarray  # requests in the engine at the end of each step (int)
    arrived: np.ndarray  # requests that arrived during each step (int)
    finished: np.ndarray  # requests that left during each step (int)
    lifetime_seconds: np.ndarray  # Σ seconds present of the requests that left during each step
    occupancy_seconds: np.ndarray  # ∫ present dt over each step (request-seconds, expected given its start)


def draw(rate: np.ndarray, lifetime: np.ndarray, step: float, rng: np.random.Generator) -> Population:
    """Draw independent populations over ``len(rate)`` steps of ``step`` seconds, one per column.

    ``rate``: arrivals per second in each step and population (steps × populations); ``lifetime``:
    mean seconds a request stays (0 or less: none arrive). The first step starts from the steady
    state of the first rates."""
    if step <= 0:
        raise ValueError("step must be > 0 seconds")
    n = rate.shape[0]
    life = np.where(lifetime > 0, lifetime, 0.0)
    lam = np.where(life > 0, np.maximum(rate, 0.0), 0.0)
    alive = life > 0
    stay = np.where(alive, np.exp(-step / np.where(alive, life, 1.0)), 0.0)
    still = np.where(alive, life * (1.0 - stay) / step, 0.0)
    arrived = rng.poisson(lam * step)
    kept = rng.binomial(arrived, still)
    present = np.empty(arrived.shape, dtype=np.int64)
    survived = np.empty(arrived.shape, dtype=np.int64)
    state = rng.poisson(lam[0] * life[0]) if n else np.zeros(rate.shape[1:], dtype=np.int64)
    start = state.copy()
    binomial = rng.binomial
    for k in range(n):
        s = binomial(state, stay[k])
        survived[k] = s
        state = s + kept[k]
        present[k] = state
    before = np.concatenate((start[None], present[:-1])) if n else present
    finished = before - survived + arrived - kept
    # ∫ present dt over the step, its expectation given the requests present at its start: each of
    # those stays ``L·(1 − exp(−step/L))`` of it on average, each arrival ``step − L·(1 − exp(−step/L))``
    # ÷ step × L. Why not the trapezoid ``step·(before + present)/2``: requests living seconds are
    # counted half a step at each end, so the population a minute's rate left behind was charged
    # 7.5 s of the next minute at that minute's tokens per second (+4 % tokens on the Azure model,
    # whose rate and step time jump minute to minute; 1.0002 on the core model)
    decay = life * (1.0 - stay)  # seconds
    occupancy = before * decay + lam * life * (step - decay)
    lifetime_s = np.empty(occupancy.shape)
    # the starting population's seconds so far: in steady state a request present has been there
    # for the mean lifetime (the exponential's age law is the lifetime's)
    pool = start * life[0] if n else np.zeros(rate.shape[1:])
    for k in range(n):
        pool = pool + occupancy[k]
        seen = before[k] + arrived[k]  # every request present at some time in the step
        out = np.where(seen > 0, pool * finished[k] / np.maximum(seen, 1), 0.0)
        lifetime_s[k] = out
        pool = pool - out
    return Population(step, present, arrived, finished, lifetime_s, occupancy)
