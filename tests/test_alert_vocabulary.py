"""One alert vocabulary for both paths: the agent's rules (rules/agent/) and the fleet rules
(rules/prometheus/) name a condition they both raise alike, with the same identifying labels and
severity; the names table in rules/agent/README.md lists every name; the shipped Alertmanager
configuration groups and inhibits only on labels both paths carry.

Then both paths for real: the agent's rules, lifecycle and Alertmanager sink post the agent's
alerts, a real Prometheus evaluating the fleet rules over an exposition (with the target labels a
ServiceMonitor adds) posts the fleet's, into the real Alertmanager 0.25 with the shipped
configuration (only its timing shortened, receivers on a local server): one engine outage is one
Slack message and no page, and its end one resolved message; in one NVML outage the lost GPU is
inhibited on both paths (``status.inhibitedBy``).
"""

from __future__ import annotations

import asyncio
import math
import re
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily, Metric
from promstack import Alertmanager, Prometheus, binary, http_get_json, test_copy_of_rules
from receivers import ThreadedReceiver as Receiver
from test_fleet_alertmanager import _local_copy

from agent.catalog import CATALOG
from agent.clock import SystemClock
from agent.config import AlertmanagerConfig
from agent.detect.alerts import AlertManager
from agent.detect.evaluator import RuleEvaluator
from agent.detect.rules import RuleError, load_default_rules, load_rules
from agent.records import KIND_LABELS, AlertEvent, MinuteRecord, dedup_key
from agent.sinks.alertmanager import alertmanager_sink
from agent.sinks.notify import Notifier
from agent.sinks.outbox import Outbox

ROOT = Path(__file__).resolve().parent.parent
FLEET_RULES = ROOT / "rules" / "prometheus" / "infercost.rules.yml"
AGENT_README = ROOT / "rules" / "agent" / "README.md"
AM_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
# The conditions both paths raise. Pinned: a new shared name is a decision (and a changelog line).
SHARED = {"InfercostEngineDown", "InfercostNvmlDown", "InfercostGpuLost"}
# Labels Prometheus adds to the fleet path's alerts (target labels, external labels): the agent's
# alerts never carry them, so grouping or an inhibition's `equal` on them splits the two paths.
FLEET_ONLY = {"job", "instance", "pod", "namespace", "service", "container", "endpoint", "cluster"}
NAME = re.compile(r"^Infercost[A-Z][A-Za-z0-9]*$")


def fleet_alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(FLEET_RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def fleet_severities() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in fleet_alert_rules():
        out.setdefault(r["alert"], set()).add(r["labels"]["severity"])
    return out


def names_table() -> dict[str, dict[str, str]]:
    """The rows of rules/agent/README.md's "Alert names" table, by alert name."""
    text = AGENT_README.read_text()
    section = text.split("\n## Alert names\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    header = ["name", "raised_by", "agent_rule", "labels", "severity", "pages", "condition"]
    out = {}
    for line in rows:
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        row = dict(zip(header, cells, strict=True))
        assert row["name"] not in out, f"{row['name']} listed twice"
        out[row["name"]] = row
    return out


# ---------------------------------------------------------------------------------------------
# The vocabulary, as data
# ---------------------------------------------------------------------------------------------


def test_every_bundled_rule_has_one_name_of_the_vocabulary() -> None:
    rules = list(load_default_rules())
    names = [r.alert for r in rules]
    assert all(n is not None and NAME.match(n) for n in names), names
    assert len(set(names)) == len(names), "one name per condition"


def test_a_shared_name_is_the_same_condition_on_both_paths() -> None:
    agent = {r.alert: r for r in load_default_rules()}
    fleet = {r["alert"]: r for r in fleet_alert_rules()}
    assert set(agent) & set(fleet) == SHARED
    families = {m.full_name: m for m in CATALOG}
    for name in SHARED:
        rule, fleet_rule = agent[name], fleet[name]
        assert fleet_severities()[name] == {rule.severity}, name
        # the fleet rule reads the series the agent exports from the signal the agent's rule reads,
        # so the fleet alert carries the agent alert's identifying labels (and more: kind, targets)
        series = f"infercost_{rule.signal}"
        assert re.search(rf"\b{series}\b", str(fleet_rule["expr"])), (name, fleet_rule["expr"])
        assert set(rule.group_labels()) <= set(families[series].labels), name


def test_names_table_lists_every_name_with_its_path_rule_and_severity() -> None:
    table = names_table()
    agent = {r.alert: r for r in load_default_rules()}
    fleet = fleet_severities()
    assert set(table) == set(agent) | set(fleet)
    for name, row in table.items():
        path = {(True, True): "both", (True, False): "agent", (False, True): "fleet"}
        assert row["raised_by"] == path[(name in agent, name in fleet)], name
        severities = set(fleet.get(name, set()))
        if name in agent:
            rule = agent[name]
            assert row["agent_rule"] == rule.id, name
            assert [s.strip() for s in row["labels"].split(",")] == list(rule.group_labels()), name
            severities.add(rule.severity)
        else:
            assert row["agent_rule"] == "—", name
        assert {s.strip() for s in row["severity"].split(",")} == severities, name
        # the shipped routing pages on critical
        assert row["pages"].startswith("yes") == ("critical" in severities), name


def test_alertmanager_config_uses_the_vocabulary_and_labels_both_paths_carry() -> None:
    cfg = yaml.safe_load(AM_CONFIG.read_text())
    vocabulary = {r.alert for r in load_default_rules()} | set(fleet_severities())
    both = {"alertname"} | {lbl for labels in KIND_LABELS.values() for lbl in labels}
    route = cfg["route"]
    assert set(route["group_by"]) <= both and not set(route["group_by"]) & FLEET_ONLY
    for sub in route.get("routes", []):
        assert set(sub.get("group_by", route["group_by"])) <= both
    for rule in cfg["inhibit_rules"]:
        assert set(rule["equal"]) <= both and not set(rule["equal"]) & FLEET_ONLY, rule
        for m in rule.get("source_matchers", []) + rule.get("target_matchers", []):
            found = re.fullmatch(r'alertname(=~|=)"([^"]*)"', m)
            if found:
                named = set(found.group(2).split("|"))
                assert named <= vocabulary, f"{named - vocabulary} is no alert of either path"
    nvml = next(r for r in cfg["inhibit_rules"] if r["source_matchers"] == ['alertname="InfercostNvmlDown"'])
    assert nvml is cfg["inhibit_rules"][0], "first, so a lost GPU names NVML in status.inhibitedBy"


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["alertname=InfercostEngineDown", "rule_id=engine_down", "severity=warning", "node=n1"], "slack"),
        (["alertname=InfercostEngineDown", "severity=warning", "node=n1", "job=infercost"], "slack"),
        (["alertname=InfercostCostPerTokenRegression", "severity=critical", "model=m"], "pagerduty,slack"),
    ],
)
def test_routing_of_both_paths(labels: list[str], receivers: str) -> None:
    verify = [f"--verify.receivers={receivers}"]
    out = subprocess.run(
        [binary("amtool"), "config", "routes", "test", f"--config.file={AM_CONFIG}", *verify, *labels],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# ---------------------------------------------------------------------------------------------
# The agent's side: the labels an alert goes out with
# ---------------------------------------------------------------------------------------------

ENGINE = (("node", "n1"), ("engine", "vllm-0"))


def engine_record(minute: float, up: float, labels: tuple[tuple[str, str], ...] = ENGINE) -> MinuteRecord:
    """One minute of an engine's scrapes, ``up`` the share that succeeded."""
    return MinuteRecord("engine", labels, minute, {"up.s": up * 60.0, "up.w": 60.0})


def fire(records_by_minute: Mapping[float, list[MinuteRecord]]) -> list[AlertEvent]:
    """The bundled rules and the alert lifecycle over these minutes: the firing events."""
    rules = load_default_rules()
    ev, life = RuleEvaluator(rules), AlertManager(rules)
    out = []
    for minute, records in sorted(records_by_minute.items()):
        out += [e for e in life.step(ev.step(minute + 60, records), minute + 60) if e.kind == "firing"]
    return out


def test_agent_alert_is_named_by_the_vocabulary_and_keyed_by_the_rule_id() -> None:
    t0 = 1699833600.0
    [event] = fire({t0 + 60 * i: [engine_record(t0 + 60 * i, 0.0)] for i in range(6)})
    a = event.alert
    assert a.labels == {
        "node": "n1",
        "engine": "vllm-0",
        "alertname": "InfercostEngineDown",
        "severity": "warning",
        "rule_id": "engine_down",
    }
    # the id still keys the alert: dedup key (PagerDuty's dedup_key, the outbox), history, metrics
    assert a.rule_id == "engine_down" and a.dedup_key == dedup_key("engine_down", ENGINE)


def test_a_rule_without_a_name_is_named_by_its_id_and_a_bad_name_is_refused(tmp_path: Path) -> None:
    rule = {"id": "mine", "signal": "engine_up", "op": "<", "threshold": 0.5, "severity": "info"}
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump({"rules": [{**rule, "summary": "s"}]}))
    [r] = load_rules([tmp_path / "ok.yaml"])
    assert r.alert_labels() == {"alertname": "mine", "severity": "info"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"rules": [{**rule, "summary": "s", "alert": "Engine down"}]}))
    with pytest.raises(RuleError) as err:
        load_rules([bad])
    assert str(bad) in str(err.value) and "rule 'mine'" in str(err.value) and "key 'alert'" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Both paths into the real Alertmanager
# ---------------------------------------------------------------------------------------------

# The fault: engine vllm-0 on n1 is down (tgi-0 beside it is up); NVML is down on n2 and its GPU 3
# reads as lost. Both paths see the same.
UP = {
    "infercost_engine_up": [
        ({"node": "n1", "engine": "vllm-0", "kind": "vllm"}, 0.0),
        ({"node": "n1", "engine": "tgi-0", "kind": "tgi"}, 1.0),
    ],
    "infercost_nvml_up": [({"node": "n1"}, 1.0), ({"node": "n2"}, 0.0)],
    "infercost_gpu_up": [({"node": "n1", "gpu": "0"}, 1.0), ({"node": "n2", "gpu": "3"}, 0.0)],
}
# What a ServiceMonitor's scrape adds to every series (and so to every fleet alert).
TARGET_LABELS = {"namespace": "monitoring", "pod": "infercost-x7k2p"}
JOB = "serviceMonitor/monitoring/infercost/0"


class UpCollector:
    """The agent's three `up` families, with the values of :data:`UP` (``up`` a copy a test can
    change between scrapes)."""

    def __init__(self) -> None:
        self.up = {name: [(dict(labels), v) for labels, v in series] for name, series in UP.items()}

    def collect(self) -> Iterator[Metric]:
        """Build the families at scrape time."""
        specs = {m.full_name: m for m in CATALOG}
        for name, series in self.up.items():
            spec = specs[name]
            fam = GaugeMetricFamily(name, spec.help, labels=spec.labels)
            for labels, value in series:
                fam.add_metric([labels[k] for k in spec.labels], value)
            yield fam


def agent_records(minute: float) -> list[MinuteRecord]:
    """The same fault as the agent's minute records."""
    kind = {"infercost_engine_up": "engine", "infercost_nvml_up": "node", "infercost_gpu_up": "gpu"}
    short = {"engine": "up", "node": "nvml_up", "gpu": "up"}
    out = []
    for name, series in UP.items():
        k = kind[name]
        for labels, up in series:
            key = tuple((lbl, labels[lbl]) for lbl in KIND_LABELS[k])
            out.append(MinuteRecord(k, key, minute, {f"{short[k]}.s": up * 60.0, f"{short[k]}.w": 60.0}))
    return out


async def post_agent_alerts(am_url: str, events: list[AlertEvent], outbox: Path) -> None:
    """Deliver through the agent's real notifier, outbox and Alertmanager sink."""
    clock = SystemClock()
    n = Notifier(Outbox(outbox), [alertmanager_sink(AlertmanagerConfig(url=am_url), clock)], clock)
    try:
        n.enqueue(events)
        for _ in range(10):
            await n.deliver_once()
            if n.pending() == {"alertmanager": 0}:
                break
            await asyncio.sleep(0.2)
        assert n.pending() == {"alertmanager": 0}
    finally:
        await n.close()


def am_alerts(am: Alertmanager) -> list[dict[str, Any]]:
    return list(http_get_json(f"{am.url}/api/v2/alerts"))


def wait_for(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got or time.monotonic() > deadline:
            assert got, what
            return got
        time.sleep(0.2)


def agent_and_fleet(alerts: list[dict[str, Any]], name: str, **labels: str) -> tuple[Any, Any]:
    """(the agent's alert, the fleet's alert) of this name and series in Alertmanager's API."""
    found = [
        a
        for a in alerts
        if a["labels"]["alertname"] == name and all(a["labels"].get(k) == v for k, v in labels.items())
    ]
    agent = [a for a in found if "rule_id" in a["labels"]]
    fleet = [a for a in found if "rule_id" not in a["labels"]]
    assert len(agent) == 1 and len(fleet) == 1, found
    return agent[0], fleet[0]


@pytest.fixture(scope="module")
def both_paths(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The agent path posts first (it usually fires first: it scrapes the engine itself), then
    the fleet path's alerts arrive from Prometheus; returns what Alertmanager and the receiver saw
    once every alert of both paths had reached Alertmanager and a few group intervals passed."""
    tmp = tmp_path_factory.mktemp("vocabulary")
    receiver = Receiver()
    registry, collector = CollectorRegistry(), UpCollector()
    registry.register(collector)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    am = prom = None
    try:
        am = Alertmanager(tmp / "am", _local_copy(tmp, receiver))  # shipped config, 1 s grouping
        # The agent's path: minutes up to now, so its alerts' times are current.
        end = math.floor(time.time() / 60) * 60
        events = fire({m: agent_records(m) for m in (end - 60 * k for k in range(7, 0, -1))})
        assert {e.alert.labels["alertname"] for e in events} == SHARED
        asyncio.run(post_agent_alerts(am.url, events, tmp / "outbox.sqlite"))
        wait_for(lambda: receiver.bodies("/slack"), 20, "the agent's alerts reached Slack")
        # The fleet's path: Prometheus scraping the exposition, rules as shipped (`for: 0s`).
        rules = test_copy_of_rules(FLEET_RULES, tmp / "rules.yml", alert_for="0s")
        target = f"127.0.0.1:{server.server_address[1]}"
        job = {"job_name": JOB, "static_configs": [{"targets": [target], "labels": TARGET_LABELS}]}
        prom = Prometheus(
            tmp / "prom", [], [rules], alertmanager=f"127.0.0.1:{am.port}", scrape_configs=[job]
        )

        def fleet_arrived() -> list[dict[str, Any]]:
            alerts = am_alerts(am)
            fleet = {a["labels"]["alertname"] for a in alerts if a["labels"].get("job") == JOB}
            return alerts if fleet >= SHARED else []

        wait_for(fleet_arrived, 45, "the fleet's alerts reached Alertmanager")  # ~5 s discovery throttle
        time.sleep(3.5)  # three group intervals: an update or a lost-GPU message would be out by now
        yield {
            "alerts": am_alerts(am),  # what Alertmanager and Slack held then (later tests change it)
            "slack": receiver.bodies("/slack"),
            "receiver": receiver,
            "am": am,
            "collector": collector,
            "events": events,
            "tmp": tmp,
        }
    finally:
        for p in (prom, am):
            if p:
                p.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        receiver.close()


def messages(slack: list[Any], name: str) -> list[Any]:
    return [b for b in slack if name in b["attachments"][0]["fallback"]]


@pytest.mark.slow
def test_one_engine_outage_raised_by_both_paths_is_one_notification(both_paths: dict[str, Any]) -> None:
    alerts, slack = both_paths["alerts"], both_paths["slack"]
    agent, fleet = agent_and_fleet(alerts, "InfercostEngineDown", node="n1", engine="vllm-0")
    # the same condition under one name, severity and identifying labels; each path's extras
    assert agent["labels"] == {
        "alertname": "InfercostEngineDown",
        "severity": "warning",
        "rule_id": "engine_down",
        "node": "n1",
        "engine": "vllm-0",
    }
    assert fleet["labels"]["severity"] == "warning" and fleet["labels"]["kind"] == "vllm"
    assert fleet["labels"]["job"] == JOB and fleet["labels"]["pod"] == TARGET_LABELS["pod"]
    assert fleet["labels"]["instance"].startswith("127.0.0.1:")
    # one message: the fleet's copy joined the agent's group muted, so no update was sent
    msgs = messages(slack, "InfercostEngineDown")
    assert len(msgs) == 1, [m["attachments"][0]["title"] for m in msgs]
    msg = msgs[0]
    att = msg["attachments"][0]
    assert att["fallback"] == "[FIRING:1] InfercostEngineDown" and att["color"] == "danger"
    assert att["title"] == "[FIRING:1] Engine vllm-0 on n1 is down (up 0)"
    assert att["text"].count("*InfercostEngineDown*") == 1
    assert fleet["status"]["state"] == "suppressed"
    assert fleet["status"]["inhibitedBy"] == [agent["fingerprint"]]
    assert agent["status"] == {"state": "active", "silencedBy": [], "inhibitedBy": []}
    # the healthy engine beside it raised nothing on either path
    assert not [a for a in alerts if a["labels"].get("engine") == "tgi-0"]
    # warnings do not page
    assert both_paths["receiver"].bodies("/pagerduty") == []
    assert both_paths["receiver"].errors == []


@pytest.mark.slow
def test_one_nvml_outage_inhibits_the_lost_gpu_on_both_paths(both_paths: dict[str, Any]) -> None:
    alerts, slack = both_paths["alerts"], both_paths["slack"]
    nvml = agent_and_fleet(alerts, "InfercostNvmlDown", node="n2")
    gpu = agent_and_fleet(alerts, "InfercostGpuLost", node="n2", gpu="3")
    nvml_prints = {a["fingerprint"] for a in nvml}
    for lost in gpu:  # the agent's and the fleet's lost GPU: both held back by NVML down
        assert lost["status"]["state"] == "suppressed", lost
        assert set(lost["status"]["inhibitedBy"]) and set(lost["status"]["inhibitedBy"]) <= nvml_prints
    assert not messages(slack, "InfercostGpuLost")
    assert not any("lost or unreadable" in b["attachments"][0]["text"] for b in slack)
    # and NVML down itself: one message, from the agent's alert (the fleet's copy muted by it)
    msgs = messages(slack, "InfercostNvmlDown")
    assert len(msgs) == 1, [m["attachments"][0]["title"] for m in msgs]
    msg = msgs[0]
    assert msg["attachments"][0]["title"] == "[FIRING:1] NVML is unavailable on n2 (up 0)"
    agent_nvml, fleet_nvml = nvml
    assert fleet_nvml["status"]["inhibitedBy"] == [agent_nvml["fingerprint"]]
    assert both_paths["receiver"].bodies("/pagerduty") == []


@pytest.mark.slow
def test_the_outage_ends_in_one_resolved_notification(both_paths: dict[str, Any]) -> None:
    """The engine comes back: Prometheus resolves the fleet's copy at its next evaluation (muted, it
    sends nothing), then the agent resolves its alert (its window and keep_firing_for make it the
    later of the two): one resolved message, after the one firing message."""
    am, receiver = both_paths["am"], both_paths["receiver"]
    both_paths["collector"].up["infercost_engine_up"][0] = (UP["infercost_engine_up"][0][0], 1.0)

    def fleet_resolved() -> bool:
        return not [
            a
            for a in am_alerts(am)
            if a["labels"]["alertname"] == "InfercostEngineDown" and "rule_id" not in a["labels"]
        ]

    wait_for(fleet_resolved, 20, "Prometheus resolved the fleet's InfercostEngineDown")
    [firing] = [e for e in both_paths["events"] if e.alert.rule_id == "engine_down"]
    now = time.time()
    resolved = AlertEvent("resolved", replace(firing.alert, state="resolved", resolved_at=now), now)
    asyncio.run(post_agent_alerts(am.url, [resolved], both_paths["tmp"] / "outbox-resolve.sqlite"))

    def engine_messages() -> list[Any]:
        return messages(receiver.bodies("/slack"), "InfercostEngineDown")

    done = wait_for(lambda: [b for b in engine_messages() if "RESOLVED" in str(b)], 20, "resolved")
    time.sleep(2.5)  # two more group intervals: nothing else for this fault
    got = [b["attachments"][0]["fallback"] for b in engine_messages()]
    assert got == ["[FIRING:1] InfercostEngineDown", "[RESOLVED] InfercostEngineDown"], got
    assert done[0]["attachments"][0]["color"] == "good"
    assert receiver.bodies("/pagerduty") == [] and receiver.errors == []
