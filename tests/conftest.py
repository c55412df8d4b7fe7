"""Shared test setup: the ``slow`` marker for tests that start real servers or run long simulations,
and the ``read_only_dir`` fixture (a real read-only directory) of the fault tests.

``pytest -m "not slow"`` is the quick loop (see the README); ``.ci/run`` runs everything. A test is
slow when it is marked ``@pytest.mark.slow`` itself, lives in one of ``SLOW_MODULES``: whole files
whose every test starts a real server (Prometheus, Alertmanager, llama.cpp, Chromium, the demo) or
replays weeks of simulated traffic, or is one of ``SLOW_TESTS``: single tests of that kind in files
that are otherwise quick (``pytest --durations=0`` shows which).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

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

# module::test → why it is slow
SLOW_TESTS = {
    "test_report::test_html_renders_in_chromium": "headless Chromium",
    "test_report_like_load::test_html_screenshot_of_the_canary_week": "headless Chromium",
    "test_sim_workload::test_simulation_is_deterministic_and_labels_incidents_after_the_warm_up": (
        "8 simulated node-weeks"
    ),
    "test_scoring::test_the_daemon_scores_with_numpy_after_a_short_lived_fitting_process": (
        "a real fitting process importing scikit-learn"
    ),
}


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A real read-only directory: a read-only tmpfs mount as root (chmod does not bind root), else
    mode 0555."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() == 0:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {r.stderr.decode().strip()}")
        try:
            yield d
        finally:
            subprocess.run(["umount", str(d)], check=False)
    else:
        d.chmod(0o555)
        try:
            yield d
        finally:
            d.chmod(0o755)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of a slow module, and every one of ``SLOW_TESTS``, ``slow``."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        name = getattr(item, "originalname", item.name)
        if module in SLOW_MODULES or f"{module}::{name}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
