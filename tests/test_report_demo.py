"""`infercost demo --state-dir DIR` keeps its history, and `infercost report` makes the week's
report from it (as the README says a user does)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_report_from_the_demos_kept_history(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    demo = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--seconds", "10", "--speed", "120", "--no-view",
         "--port", "0", "--state-dir", str(state), "--history-hours", "1"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert (state / "history.sqlite").exists()
    m = re.search(r"infercost report --state-dir (\S+) --end (\S+)", demo.stdout)
    assert m and m.group(1) == str(state), demo.stdout[-2000:]
    rep = subprocess.run(
        [sys.executable, "-m", "agent.cli", "report", "--state-dir", str(state), "--end", m.group(2),
         "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr[-3000:]
    data = json.loads(rep.stdout)
    versions = {(x["model"].split("/")[-1], x["model_version"]) for x in data["models"]}
    assert {("Llama-3.1-70B-Instruct", "2024-07"), ("Llama-3.1-70B-Instruct", "2024-09")} <= versions
    assert ("Llama-3.1-70B-Instruct", "2024-10") in versions  # the demo's rollout, five minutes in
    (deploy,) = data["deploys"]
    assert (deploy["engine"], deploy["from_version"], deploy["to_version"]) == (
        "llama-70b-canary",
        "2024-09",
        "2024-10",
    )
    assert data["total_usd"] > 0
    # a day of data in a week: the other days are absent (null), not $0
    assert data["daily_usd"].count(None) >= 5
    # where the dollars went, through the real join of the simulated vLLM pages (prefill and decode
    # time, a busy ratio, model sizes): prompt + output = the week's dollars, waste and a floor below
    # what was paid
    d = data["dollars"]
    assert d["prompt_usd"] > 0
    assert d["prompt_usd"] + d["output_usd"] + d["idle_usd"] == pytest.approx(data["total_usd"])
    assert d["waste_usd"] is not None and 0 < d["waste_usd"] < data["total_usd"]
    assert 0 < d["floor_max_batch_usd_per_1m"] < d["floor_usd_per_1m"] < data["usd_per_1m_output"]
    assert 0 < d["floor_saving_usd"] < data["total_usd"]
    # where GPU time went, through the real join of the fake NVML's GPM model: the live minutes have
    # a split (the backfilled hour before them has none), each set of shares adds up to 1 and the
    # bound dollars are the covered share of the week's dollars
    g = data["gpu_time"]
    assert 0 < g["usd_coverage"] < 1
    assert sum(g["time_share"].values()) == pytest.approx(1.0)
    assert sum(g["usd_share"].values()) == pytest.approx(1.0)
    assert sum(g["usd"].values()) == pytest.approx(g["usd_coverage"] * data["total_usd"])
