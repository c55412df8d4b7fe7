"""`infercost demo` end to end, as a user runs it: the live numbers and the whole alert story.

The demo runs the real daemon against the simulated node on an accelerated clock: the canary of
Llama-3.1-70B gets a slower build, its cost per token rises, the regression rule fires and the
alert, naming the deploy, reaches the demo's local Slack-like receiver, whose messages it prints.
"""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_shows_costs_per_model_version_and_the_regression_alert_naming_the_deploy() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli",
            "demo",
            "--seconds",
            "55",
            "--speed",
            "120",
            "--no-view",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    # one row per model version with tokens/s and $ per 1M output and total tokens
    for engine, version in [
        ("llama-70b ", "2024-07"),
        ("llama-70b-canary", "2024-10"),
        ("mistral-7b", "v0.3"),
    ]:
        row = next(line for line in out.splitlines() if engine in line and version in line)
        numbers = re.findall(r"\d[\d,]*\.\d+|\d[\d,]*", row.split(version, 1)[1])
        assert len(numbers) >= 6, row
    assert re.search(r"GPU spend so far \$[\d,]+\.\d\d", out)
    # the story: the regression alert for the canary's new version, naming the deploy
    flat = " ".join(line.strip("│ ") for line in out.splitlines())
    assert "[FIRING] cost_per_token_regression (demo-node llama-70b-canary" in flat
    assert "2024-09 → 2024-10" in flat
    assert "cost_per_token_regression (demo-node llama-70b " not in flat  # the unchanged engine stays quiet
