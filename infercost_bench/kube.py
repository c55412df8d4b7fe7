"""What Kubernetes discovery costs the agent: memory of its client libraries and CPU per pod event.

``python -m infercost_bench.kube`` prints
- the resident memory that importing the Kubernetes client (lightkube) and gRPC (pod-resources)
  adds to a process that already holds the agent's other libraries (fresh subprocesses, peak RSS);
- the time to turn one pod into an engine target (annotations, SSRF checks, versions), over a
  node's worth of pods, which is what every watch event costs.
Figures go with the machine they ran on; nothing here is asserted by tests.
"""

from __future__ import annotations

import subprocess
import sys
import time

from agent.config import KubernetesConfig
from agent.sources.kube.pods import engine_pod, is_selected

_BASE = "import aiohttp, pydantic, yaml, prometheus_client"
_PROBE = """
import resource
{base}
{extra}
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _peak_kib(extra: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(base=_BASE, extra=extra)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def _pod(i: int) -> dict[str, object]:
    return {
        "metadata": {
            "name": f"engine-{i}",
            "namespace": "llm",
            "labels": {"app.kubernetes.io/version": "2024-09", "pod-template-hash": "7d9f"},
            "annotations": {
                "infercost.io/scrape": "true",
                "infercost.io/port": "8000",
                "infercost.io/engine": "vllm",
            },
            "ownerReferences": [{"kind": "ReplicaSet", "name": f"engine-{i}-7d9f"}],
        },
        "spec": {
            "containers": [
                {"name": "vllm", "image": "vllm/vllm-openai:v0.9.0", "ports": [{"containerPort": 8000}]}
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.244.{i // 250}.{i % 250 + 1}",
            "containerStatuses": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.9.0",
                    "imageID": "vllm/vllm-openai@sha256:" + "a" * 64,
                }
            ],
        },
    }


def run(pods: int = 1000, rounds: int = 20) -> None:
    """Print the figures (see the module docstring)."""
    base = _peak_kib("")
    kube = _peak_kib("import lightkube; from lightkube.resources.core_v1 import Pod")
    grpc_ = _peak_kib("import grpc; from agent.sources.kube import podresources_pb2")
    print(f"peak RSS, agent libraries only:          {base / 1024:7.1f} MB")
    print(f"  + lightkube (Kubernetes client, Pod):  {(kube - base) / 1024:+7.1f} MB")
    print(f"  + grpcio + pod-resources messages:     {(grpc_ - base) / 1024:+7.1f} MB")
    cfg = KubernetesConfig(enabled=True)
    items = [_pod(i) for i in range(pods)]
    t0 = time.perf_counter()
    for _ in range(rounds):
        for p in items:
            if is_selected(p, cfg):
                engine_pod(p, cfg)
    per_pod = (time.perf_counter() - t0) / (rounds * pods)
    print(f"pod → engine target: {per_pod * 1e6:.1f} µs per pod ({pods} pods × {rounds} rounds)")


if __name__ == "__main__":
    run()
