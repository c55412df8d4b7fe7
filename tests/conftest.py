"""Shared test setup: the ``slow`` marker for tests that start real servers or run long simulations.

``pytest -m "not slow"`` is the quick loop (see the README); ``.ci/run`` runs everything. A test is
slow when it is marked ``@pytest.mark.slow`` itself or lives in one of ``SLOW_MODULES``: whole files
whose every test starts a real server (Prometheus, Alertmanager, llama.cpp, Chromium, the demo) or
replays weeks of simulated traffic. Measured with ``pytest --durations=0`` on the 2-core box.
"""

from __future__ import annotations

import pytest

SLOW_MODULES = frozenset(
    {
        "test_llamacpp_real",  # a real llama.cpp server
        "test_fleet_e2e",  # real Prometheus scraping a running agent
        "test_fleet_alertmanager",  # real Prometheus + Alertmanager
        "test_fleet_rules",  # promtool test rules
        "test_dashboards",  # every dashboard query against a real Prometheus
        "test_demo",  # the whole demo, end to end
        "test_detection_bench",  # weeks of simulated traffic through the detectors
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of a slow module ``slow``."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
