"""scripts/gpu_probe.py as a dry run on the fake NVML: phases, JSON lines and the summary."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_probe.py"


def load_probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_probe", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_probe_dry_run_on_the_fake(tmp_path: Path) -> None:
    probe = load_probe()
    argv = ["--fake", "H200", "--idle-seconds", "0.3", "--phase-seconds", "0.6", "--interval", "0.1"]
    assert probe.main([*argv, "--out", str(tmp_path)]) == 0
    lines = [json.loads(x) for x in (tmp_path / "nvml_samples.jsonl").read_text().splitlines()]
    phases = list(dict.fromkeys(x["phase"] for x in lines))
    assert phases == ["idle0", "matmul", "idle1", "copy", "idle2"]
    assert all(x["name"] == "NVIDIA H200" and x["up"] for x in lines)
    summary = json.loads((tmp_path / "nvml_summary.json").read_text())
    by = {p["phase"]: p for p in summary["phases"]}
    assert by["matmul"]["dram_bw_ratio"] == pytest.approx(0.3)
    assert by["copy"]["dram_bw_ratio"] == pytest.approx(0.9)
    assert by["copy"]["util_gpu_ratio"] == pytest.approx(1.0)
    # the fake's tensor model where the load gives none: util × (1 − DRAM) = 1 × 0.7 and 1 × 0.1
    assert by["matmul"]["tensor_active_ratio"] == pytest.approx(0.7)
    assert by["copy"]["tensor_active_ratio"] == pytest.approx(0.1)
    assert by["copy"]["pcie_rx_bytes_per_s"] == 0.0 and by["copy"]["nvlink_tx_bytes_per_s"] == 0.0
    assert by["idle1"]["power_watts"] == pytest.approx(70.0)  # 0.1 × 700 W TDP
    # The energy counter agrees with the mean power over the phase.
    assert by["copy"]["energy_mean_watts"] == pytest.approx(by["copy"]["power_watts"], rel=0.05)
    assert summary["torch"] is None and summary["driver_version"] == "550.54.15"
