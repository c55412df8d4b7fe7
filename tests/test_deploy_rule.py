"""The deploy decision (detect/) and the store that writes what it decides: a series showing another
version is a deploy, a late window of an earlier minute is not one back, an engine build is an
engine deploy; the store without a rule keeps versions and records none."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.clock import ManualClock
from agent.detect.deploys import deploy_of, record_deploy
from agent.records import DeployEvent
from agent.store import Store, VersionSeen

T0 = 1699833600.0  # Monday 00:00 UTC


def seen(version: str, minute: float, model: str = "llama") -> VersionSeen:
    return VersionSeen("n1", "vllm-a", model, version, minute)


@pytest.mark.parametrize(
    ("last", "now", "want"),
    [
        (None, seen("v1", T0), None),  # first sight
        (seen("v1", T0), seen("v1", T0 + 60), None),  # same version
        (seen("v1", T0), seen("v2", T0 + 60), DeployEvent("n1", "vllm-a", "llama", "v1", "v2", T0 + 60)),
        (seen("v1", T0), seen("v2", T0), DeployEvent("n1", "vllm-a", "llama", "v1", "v2", T0)),  # same minute
        (seen("v2", T0 + 60), seen("v1", T0), None),  # a late window of an earlier minute
        (
            seen("img@sha256:a", T0, model=""),
            seen("img@sha256:b", T0 + 120, model=""),
            DeployEvent("n1", "vllm-a", "", "img@sha256:a", "img@sha256:b", T0 + 120, kind="engine"),
        ),
    ],
)
def test_deploy_of(last: VersionSeen | None, now: VersionSeen, want: DeployEvent | None) -> None:
    assert deploy_of(last, now) == want


def test_record_deploy_logs_the_deploy(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="agent.detect.deploys"):
        assert record_deploy(seen("v1", T0), seen("v2", T0 + 60)) is not None
        assert record_deploy(seen("v2", T0 + 60), seen("v2", T0 + 120)) is None
    assert [r.getMessage() for r in caplog.records] == ["deploy recorded: llama on n1/vllm-a v1 -> v2"]


@pytest.mark.parametrize("rule", [record_deploy, None])
def test_engine_builds_through_the_store(tmp_path: Path, rule: object) -> None:
    st = Store(tmp_path / "h.sqlite", 35, ManualClock(T0), deploys=rule)  # type: ignore[arg-type]
    assert st.note_engine_version("n1", "vllm-a", "img@sha256:a", T0 + 5) is None  # first sight
    got = st.note_engine_version("n1", "vllm-a", "img@sha256:b", T0 + 65)
    assert st.note_engine_version("n1", "vllm-a", "img@sha256:b", T0 + 125) is None  # seen again
    if rule is None:
        assert got is None and st.deploys() == []
    else:
        want = DeployEvent("n1", "vllm-a", "", "img@sha256:a", "img@sha256:b", T0 + 60, kind="engine")
        assert got == want and st.deploys() == [want]
    assert st.current_versions() == [("n1", "vllm-a", "", "img@sha256:b", T0 + 120)]
    st.close()
