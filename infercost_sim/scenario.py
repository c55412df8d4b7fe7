"""Scripted stories for the simulated node: timed rollouts of engine builds.

A scenario is data: events at offsets from the start of the demo. ``schedule`` hands them to a
:class:`~infercost_sim.node.SimNode`, which applies each when its clock passes the event's time
(on an accelerated clock too).
"""

from __future__ import annotations

from dataclasses import dataclass

from infercost_sim.node import SimNode


@dataclass(frozen=True, slots=True)
class Rollout:
    """Deploy ``version`` on ``engine`` ``offset_seconds`` after the scenario starts."""

    offset_seconds: float  # seconds after the scenario's start
    engine: str
    version: str
    throughput_factor: float = 1.0  # relative to the engine's original build; < 1 is slower


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named timeline of rollouts."""

    name: str
    description: str
    events: tuple[Rollout, ...] = ()

    def schedule(self, node: SimNode, start: float) -> None:
        """Queue every event on ``node``, ``start`` being the scenario's epoch second zero."""
        for e in self.events:
            node.rollout(e.engine, e.version, e.throughput_factor, at=start + e.offset_seconds)


STEADY = Scenario("steady", "No rollouts: the node's daily cycle only.")

REGRESSION = Scenario(
    "regression",
    "Two hours in, the canary of Llama-3.1-70B gets build 2024-10, which lost a fused kernel: "
    "about 35 % fewer tokens per GPU-second, so its cost per token rises by about half.",
    (Rollout(2 * 3600.0, "llama-70b-canary", "2024-10", 0.65),),
)

REGRESSION_AND_ROLLBACK = Scenario(
    "regression-rollback",
    "The regression above, rolled back to 2024-09 six hours after it shipped.",
    (
        Rollout(2 * 3600.0, "llama-70b-canary", "2024-10", 0.65),
        Rollout(8 * 3600.0, "llama-70b-canary", "2024-09", 1.0),
    ),
)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (STEADY, REGRESSION, REGRESSION_AND_ROLLBACK)}
