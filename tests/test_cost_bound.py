"""Where GPU time goes (agent.cost.bound): shares checked against hand-computed numbers, including
the real H200 capture (scripts/h200-2026-11-30/nvml_raw_summary.json)."""

from __future__ import annotations

import pytest

from agent.cost.bound import (
    BOUNDS,
    GpmActivity,
    bound_shares,
    communication_ratio,
    link_ratio,
    split_charges,
)

GB = 1e9
PCIE5 = 64e9  # bytes/s one direction
NVLINK4 = 450e9  # bytes/s one direction
MIB = 1024 * 1024


def gpm(
    sm: float | None = 0.8,
    tensor: float | None = 0.3,
    dram: float | None = 0.5,
    prx: float | None = 0.0,
    ptx: float | None = 0.0,
    nrx: float | None = None,
    ntx: float | None = None,
) -> GpmActivity:
    return GpmActivity(sm, tensor, dram, prx, ptx, nrx, ntx)


# -- link ratios ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rx", "tx", "peak", "expected"),
    [
        (16e9, 8e9, 64e9, 0.25),  # the busier direction: 16 / 64
        (8e9, 16e9, 64e9, 0.25),
        (None, 32e9, 64e9, 0.5),  # one direction known
        (32e9, None, 64e9, 0.5),
        (None, None, 64e9, None),  # neither measured
        (1e9, 1e9, None, None),  # no peak known
        (1e9, 1e9, 0.0, None),  # a zero peak is no peak
        (1e9, 1e9, -5.0, None),
        (128e9, 0.0, 64e9, 1.0),  # above the peak (bursts, rounding): clamped
        (0.0, 0.0, 64e9, 0.0),
        (0.25, 0.0, 0.5, 0.5),  # any positive peak is a peak, however small
    ],
)
def test_link_ratio(rx: float | None, tx: float | None, peak: float | None, expected: float | None) -> None:
    assert link_ratio(rx, tx, peak) == expected


def test_communication_is_the_busier_link() -> None:
    # PCIe 16/64 = 0.25; NVLink 90/450 = 0.2 → 0.25; NVLink 225/450 = 0.5 → 0.5
    assert communication_ratio(gpm(prx=16e9, nrx=90e9, ntx=0.0), PCIE5, NVLINK4) == 0.25
    assert communication_ratio(gpm(prx=16e9, nrx=0.0, ntx=225e9), PCIE5, NVLINK4) == 0.5


def test_both_directions_of_the_host_link_count() -> None:
    # PCIe tx 32 GB/s (rx idle) = 0.5 of 64 GB/s; rx 16 GB/s (tx idle) = 0.25
    assert communication_ratio(gpm(prx=0.0, ptx=32e9), PCIE5, None) == 0.5
    assert communication_ratio(gpm(prx=16e9, ptx=None), PCIE5, None) == 0.25
    assert communication_ratio(gpm(prx=None, ptx=16e9), PCIE5, None) == 0.25


def test_communication_needs_every_link_the_gpu_has() -> None:
    # a GPU without NVLink: the host link alone
    assert communication_ratio(gpm(prx=16e9), PCIE5, None) == 0.25
    # NVLink in the table but not measured: unknown, not "no traffic"
    assert communication_ratio(gpm(prx=16e9), PCIE5, NVLINK4) is None
    # the host link not measured: unknown even when NVLink is
    assert communication_ratio(gpm(prx=None, ptx=None, nrx=1e9), PCIE5, NVLINK4) is None
    # no host-link peak (a GPU not in the table)
    assert communication_ratio(gpm(prx=16e9), None, None) is None


# -- shares ---------------------------------------------------------------------------------------


def test_shares_hand_computed() -> None:
    # busy 0.8; pressures compute 0.3, memory 0.5, communication 12.8/64 = 0.2 → total 1.0
    s = bound_shares(gpm(sm=0.8, tensor=0.3, dram=0.5, prx=12.8e9), PCIE5, None)
    assert s == pytest.approx({"compute": 0.24, "memory": 0.40, "communication": 0.16, "idle": 0.2})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("field", ["sm", "tensor", "dram"])
def test_a_non_finite_reading_makes_the_split_absent(field: str, bad: float) -> None:
    values = {"sm": 0.8, "tensor": 0.3, "dram": 0.5, field: bad}
    assert bound_shares(gpm(prx=12.8e9, **values), PCIE5, None) is None


def test_shares_scale_by_the_sum_of_pressures() -> None:
    # busy 0.6; pressures 0.2, 0.6, 0.0 (total 0.8) → compute 0.6·0.25 = 0.15, memory 0.45
    s = bound_shares(gpm(sm=0.6, tensor=0.2, dram=0.6), PCIE5, None)
    assert s == pytest.approx({"compute": 0.15, "memory": 0.45, "communication": 0.0, "idle": 0.4})


def test_nvlink_pressure_counts_as_communication() -> None:
    # busy 1.0; compute 0.1, memory 0.3, NVLink 270/450 = 0.6 (PCIe 0) → total 1.0
    s = bound_shares(gpm(sm=1.0, tensor=0.1, dram=0.3, nrx=270e9, ntx=0.0), PCIE5, NVLINK4)
    assert s == pytest.approx({"compute": 0.1, "memory": 0.3, "communication": 0.6, "idle": 0.0})


def test_busy_without_any_pressure_is_compute() -> None:
    # SMs 70 % active, no tensor, DRAM or link traffic: only the SMs were busy
    s = bound_shares(gpm(sm=0.7, tensor=0.0, dram=0.0), PCIE5, None)
    assert s == pytest.approx({"compute": 0.7, "memory": 0.0, "communication": 0.0, "idle": 0.3})


def test_an_idle_gpu_is_all_idle() -> None:
    assert bound_shares(gpm(sm=0.0, tensor=0.0, dram=0.0), PCIE5, None) == {
        "compute": 0.0,
        "memory": 0.0,
        "communication": 0.0,
        "idle": 1.0,
    }
    # traffic without SM activity (a copy engine moving weights): still no SM time to split
    assert bound_shares(gpm(sm=0.0, tensor=0.0, dram=0.2, prx=32e9), PCIE5, None) == {
        "compute": 0.0,
        "memory": 0.0,
        "communication": 0.0,
        "idle": 1.0,
    }


def test_out_of_range_ratios_are_clamped() -> None:
    # SM 1.2 → 1; tensor 1.5 → 1; DRAM −0.1 → 0: all busy time is compute
    s = bound_shares(gpm(sm=1.2, tensor=1.5, dram=-0.1), PCIE5, None)
    assert s == {"compute": 1.0, "memory": 0.0, "communication": 0.0, "idle": 0.0}
    # SM −0.5 → 0: all idle
    s = bound_shares(gpm(sm=-0.5, tensor=0.5, dram=0.5), PCIE5, None)
    assert s == {"compute": 0.0, "memory": 0.0, "communication": 0.0, "idle": 1.0}


@pytest.mark.parametrize(
    ("activity", "pcie", "nvlink"),
    [
        (gpm(sm=None), PCIE5, None),  # GPM did not answer (pre-Hopper, NotSupported)
        (gpm(tensor=None), PCIE5, None),
        (gpm(dram=None), PCIE5, None),
        (gpm(prx=None, ptx=None), PCIE5, None),  # host link not measured
        (gpm(), None, None),  # GPU not in the hardware table
        (gpm(), PCIE5, NVLINK4),  # NVLink in the table, not measured
    ],
)
def test_absent_not_guessed(activity: GpmActivity, pcie: float | None, nvlink: float | None) -> None:
    assert bound_shares(activity, pcie, nvlink) is None


def test_real_h200_phases() -> None:
    """Per-phase GPM means the real H200 reported (nvml_raw_summary.json), hand-split."""
    # matmul: SM 82.11 %, tensor 79.67 %, DRAM 14.71 %, PCIe rx 11.59 MiB/s (≈ 0 of 64 GB/s)
    rx = 11.594 * MIB
    s = bound_shares(gpm(sm=0.8211, tensor=0.7967, dram=0.1471, prx=rx, ptx=4.675 * MIB), PCIE5, NVLINK4)
    assert s is None  # NVLink is in the table for an H200 SXM: it must be measured
    nv = {"nrx": 0.0, "ntx": 0.0}
    s = bound_shares(
        gpm(sm=0.8211, tensor=0.7967, dram=0.1471, prx=rx, ptx=4.675 * MIB, **nv), PCIE5, NVLINK4
    )
    assert s is not None
    comm = rx / PCIE5  # ≈ 1.9e-4
    total = 0.7967 + 0.1471 + comm
    assert s["compute"] == pytest.approx(0.8211 * 0.7967 / total)  # ≈ 0.693
    assert s["memory"] == pytest.approx(0.8211 * 0.1471 / total)  # ≈ 0.128
    assert s["compute"] == pytest.approx(0.693, abs=1e-3)
    assert s["memory"] == pytest.approx(0.128, abs=1e-3)
    assert s["idle"] == pytest.approx(0.1789)
    # copy: SM 99.55 %, tensor 0, DRAM 88.99 %, PCIe rx 26.8 MiB/s: memory-bound
    s = bound_shares(
        gpm(sm=0.9955, tensor=0.0, dram=0.8899, prx=26.83 * MIB, ptx=9.83 * MIB, **nv), PCIE5, NVLINK4
    )
    assert s is not None
    assert s["memory"] == pytest.approx(0.9955, abs=1e-3)
    assert s["compute"] == 0.0
    assert s["idle"] == pytest.approx(0.0045)


# -- spreading a charge ---------------------------------------------------------------------------


def test_split_charges_sums_each_gpus_part_by_its_own_shares() -> None:
    half = {"compute": 0.5, "memory": 0.25, "communication": 0.0, "idle": 0.25}
    mem = {"memory": 1.0}  # a bound missing from the shares is 0
    got = split_charges([(8.0, 0.04, half), (2.0, 0.01, mem)])
    assert got is not None
    secs, usd = got
    assert secs == {"compute": 4.0, "memory": 2.0 + 2.0, "communication": 0.0, "idle": 2.0}
    assert usd == pytest.approx({"compute": 0.02, "memory": 0.02, "communication": 0.0, "idle": 0.01})
    assert tuple(secs) == BOUNDS and tuple(usd) == BOUNDS


def test_split_charges_is_absent_without_gpus_or_with_one_unmeasured() -> None:
    half = {"compute": 0.5, "idle": 0.5}
    assert split_charges([]) is None
    assert split_charges([(8.0, 0.04, half), (2.0, 0.01, None)]) is None
    assert split_charges([(2.0, 0.01, None), (8.0, 0.04, half)]) is None
