"""The fleet alerting chain end to end, all real: the catalogue exporter → Prometheus evaluating
rules/prometheus/infercost.rules.yml → Alertmanager with deploy/alertmanager/alertmanager.yml →
Slack / PagerDuty receivers (local). ``for:`` is set to 0 s in the test copy of the rules."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from promstack import Alertmanager, CatalogueExporter, Prometheus, test_copy_of_rules
from receivers import ThreadedReceiver as Receiver
from test_fleet_alertmanager import _local_copy

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "prometheus" / "infercost.rules.yml"


def title_has(text: str) -> Callable[[Any], bool]:
    return lambda b: text in b["attachments"][0]["title"]


def _titles(receiver: Receiver) -> list[str]:
    return [b["attachments"][0]["title"] for b in receiver.bodies("/slack")]


def test_engine_and_nvml_down_reach_slack_and_inhibit_gpu_lost(tmp_path: Path) -> None:
    # node-a and node-b: every engine down, NVML down, every GPU lost.
    exporter = CatalogueExporter(
        {"infercost_engine_up": 0.0, "infercost_nvml_up": 0.0, "infercost_gpu_up": 0.0}
    )
    receiver = Receiver()
    am = prom = None
    try:
        am = Alertmanager(tmp_path / "am", _local_copy(tmp_path, receiver))
        rules = test_copy_of_rules(RULES, tmp_path / "rules.yml", alert_for="0s")
        prom = Prometheus(tmp_path / "prom", [exporter.target], [rules], alertmanager=f"127.0.0.1:{am.port}")
        # Cold start: ~5 s discovery throttle, then scrape, evaluate, group_wait 1 s.
        engine = receiver.wait("/slack", title_has("InfercostEngineDown on"), 40)
        nvml = receiver.wait("/slack", title_has("NVML unavailable on"), 20)
        assert engine and nvml, _titles(receiver)
        # Three engines down on one node: one notification, no common summary, every summary listed.
        assert engine[0]["attachments"][0]["title"] in {
            "[FIRING:3] InfercostEngineDown on node-a",
            "[FIRING:3] InfercostEngineDown on node-b",
        }
        text = engine[0]["attachments"][0]["text"]
        assert text.count("*InfercostEngineDown* (warning): engine ") == 3
        assert "sglang-0 (sglang) on node-" in text and "is not answering /metrics" in text
        assert {t.split(" on ")[-1] for t in _titles(receiver) if "NVML" in t} == {"node-a", "node-b"}
        time.sleep(2)  # a further flush: a lost-GPU notification would have arrived by now
        assert not [t for t in _titles(receiver) if "lost or unreadable" in t], "NvmlDown inhibits GpuLost"
        # Warnings do not page. The one page: the catalogue's synthetic TTFT (p95 ≈ 2 s) puts the
        # realtime class over its 0.5 s SLO, a critical alert.
        paged = [b["payload"]["summary"] for b in receiver.bodies("/pagerduty")]
        assert all(s.startswith("realtime class p95 TTFT") for s in paged), paged
        firing = prom.query('ALERTS{alertstate="firing", alertname="InfercostGpuLost"}')
        assert len(firing) == 4, "GpuLost fires in Prometheus; only Alertmanager holds it back"
        assert receiver.errors == [], "what Alertmanager posted has the vendors' documented shape"
    finally:
        for p in (prom, am):
            if p:
                p.close()
        receiver.close()
        exporter.close()
