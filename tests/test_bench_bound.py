"""`infercost bench bound` on the committed real H200 capture (scripts/h200-2026-11-30): the figures
the README quotes. Kept out of the mutation-test selection (mutmut's copy holds no scripts/)."""

from __future__ import annotations

import pytest


def test_bench_bound_splits_the_real_h200_capture() -> None:
    """`infercost bench bound` on the committed capture: the figures the README quotes."""
    from infercost_bench.bound import run

    out = run()
    assert out["idle"] == {"compute": 0.0, "memory": 0.0, "communication": 0.0, "idle": 1.0}
    matmul, copy = out["matmul"], out["copy"]
    assert matmul is not None and copy is not None
    assert matmul["compute"] == pytest.approx(0.693, abs=5e-4)
    assert matmul["memory"] == pytest.approx(0.128, abs=5e-4)
    assert matmul["idle"] == pytest.approx(0.179, abs=5e-4)
    assert copy["memory"] == pytest.approx(0.995, abs=5e-4)
    assert copy["compute"] == 0.0
