"""The chart's optional fleet-report CronJob, rendered by the real Helm engine and validated with
``kubernetes-validate --strict``; its command line is parsed by the real ``infercost`` parser."""

from __future__ import annotations

from typing import Any

import pytest

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from test_helm import CHART, K8S, NAMESPACE, RELEASE, render  # noqa: E402

from agent.cli import build_parser  # noqa: E402

REPORT: dict[str, Any] = {
    "fleetReport": {
        "enabled": True,
        "schedule": "0 9 * * 1",
        "timeZone": "Europe/Berlin",
        "prometheusUrl": "https://mimir.example/prometheus",
        "headers": ["X-Scope-OrgID: team-a"],
        "persistentVolumeClaim": "cost-reports",
        "bearerTokenSecret": {"existingSecret": "mimir-token", "key": "token"},
        "caSecret": {"existingSecret": "mimir-ca", "key": "ca.crt"},
        "slackSecret": {"existingSecret": "cost-slack", "key": "webhook-url"},
    }
}


def test_off_by_default() -> None:
    assert "CronJob" not in render({})[0]


def test_cronjob_renders_valid_and_runs_the_report() -> None:
    objs = render(REPORT)[0]
    cron = objs["CronJob"]
    kubernetes_validate.validate(cron, K8S, strict=True)
    assert cron["metadata"]["namespace"] == NAMESPACE
    assert cron["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert cron["spec"]["schedule"] == "0 9 * * 1" and cron["spec"]["timeZone"] == "Europe/Berlin"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["infercost"]
    args = build_parser().parse_args(c["args"])  # the real CLI accepts the job's command line
    assert args.cmd == "report" and args.prometheus == "https://mimir.example/prometheus"
    assert args.header == ["X-Scope-OrgID: team-a"] and args.format == "html"
    assert str(args.output) == "/reports/infercost-fleet-%Y-%m-%d.html"
    assert str(args.bearer_token_file) == "/etc/infercost/prometheus/token"
    assert str(args.ca_file) == "/etc/infercost/prometheus-ca/ca.crt"
    assert args.slack_webhook_env == "INFERCOST_REPORT_SLACK_WEBHOOK_URL"
    (env,) = c["env"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "cost-slack", "key": "webhook-url"}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/etc/infercost/prometheus", "/etc/infercost/prometheus-ca", "/reports", "/tmp"} <= mounts
    # non-root, nothing extra: the same container restrictions as the agent
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_basic_auth_and_log_output() -> None:
    values = {
        "fleetReport": {
            "enabled": True,
            "prometheusUrl": "http://prometheus-operated.monitoring:9090",
            "format": "md",
            "basicAuth": {"user": "report", "passwordSecret": {"existingSecret": "prom-basic", "key": "pw"}},
        }
    }
    cron = render(values)[0]["CronJob"]
    kubernetes_validate.validate(cron, K8S, strict=True)
    (c,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(c["args"])
    assert args.output is None  # no PVC: the Markdown goes to the job's log
    assert args.basic_auth_user == "report"
    assert str(args.basic_auth_password_file) == "/etc/infercost/prometheus/password"


def test_schema_refuses_bad_report_values() -> None:
    bad = [
        ({"fleetReport": {"format": "pdf"}}, "format"),
        ({"fleetReport": {"prometheusUrl": "prometheus:9090"}}, "prometheusUrl"),
        ({"fleetReport": {"headers": ["X-Evil: a\r\nInjected: b"]}}, "headers"),
        ({"fleetReport": {"shedule": "x"}}, "shedule"),
    ]
    with helm.Chart.load(CHART) as chart:
        for values, key in bad:
            with pytest.raises(helm.HelmValuesError, match=key):
                chart.validate_schema(values)


def test_helm_lint_strict_with_the_report() -> None:
    report = helm.lint(CHART, REPORT, strict=True, namespace=NAMESPACE, kube_version=f"v{K8S}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
