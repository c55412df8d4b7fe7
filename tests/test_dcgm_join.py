"""The documented joins of infercost and dcgm-exporter series (docs/kubernetes.md) evaluated by
Prometheus' own rule engine: promtool runs each expression, read from the page itself, over series
labelled as dcgm-exporter labels them (its real capture) and as infercost exports them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "kubernetes.md"
DCGM = Path(__file__).resolve().parents[2] / "shared" / "reference" / "expositions" / "dcgm_exporter.txt"
UUID = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"  # the GPU of the real dcgm-exporter capture


def _expressions() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    found = re.findall(r"<!-- dcgm-join: (\w+) -->\n```promql\n(.*?)```", text, re.DOTALL)
    return {name: " ".join(expr.split()) for name, expr in found}


def test_the_real_capture_labels_its_gpu_by_uuid_and_index() -> None:
    text = DCGM.read_text()
    assert f'gpu="0", UUID="{UUID}"' in text  # the label names the join relies on


def test_the_documented_joins_give_dcgm_series_infercost_labels_and_dollars(tmp_path: Path) -> None:
    exprs = _expressions()
    assert set(exprs) == {"utilisation", "cost"}, exprs
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: apt-get install prometheus (CI's .ci/run does)"
    rules = {
        "groups": [
            {
                "name": "dcgm-join",
                "rules": [{"record": f"doc:dcgm_join:{name}", "expr": expr} for name, expr in exprs.items()],
            }
        ]
    }
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    info = f'infercost_gpu_info{{node="node-a",gpu="0",uuid="{UUID}",gpu_model="NVIDIA H100",mig_parent=""}}'
    other = 'infercost_gpu_info{node="node-a",gpu="1",uuid="GPU-other",gpu_model="NVIDIA H100",mig_parent=""}'
    dcgm_labels = (
        f'gpu="0",UUID="{UUID}",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-pod"'
    )
    series = [
        # dcgm-exporter's own label set (Hostname, gpu, UUID, modelName, device)
        {"series": f"DCGM_FI_DEV_GPU_UTIL{{{dcgm_labels}}}", "values": "87x10"},
        {"series": info, "values": "1x10"},
        {"series": other, "values": "1x10"},
        # $3.60 per hour: 0.001 dollars a second, sampled every minute
        {"series": 'infercost_gpu_cost_usd_total{node="node-a",gpu="0"}', "values": "0+0.06x10"},
    ]
    cost_labels = f'node="node-a",gpu="0",uuid="{UUID}",UUID="{UUID}"'
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": "doc:dcgm_join:utilisation",
                        "eval_time": "5m",
                        "exp_samples": [
                            {
                                "labels": f'doc:dcgm_join:utilisation{{{dcgm_labels},node="node-a"}}',
                                "value": 87,
                            }
                        ],
                    },
                    {
                        "expr": "doc:dcgm_join:cost",
                        "eval_time": "5m",
                        "exp_samples": [{"labels": f"doc:dcgm_join:cost{{{cost_labels}}}", "value": 3.6}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    run = subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
