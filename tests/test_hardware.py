"""The GPU table: every real NVML name finds its own figures, and a name that is only a prefix of
another (L4 / L40 / L40S, A10 / A10G / A100, H20 / H200) never takes its neighbour's."""

from __future__ import annotations

import pytest

from agent import hardware as hw

MIB = 1024 * 1024

# (NVML name as nvidia-smi / nvmlDeviceGetName print it, expected entry)
NAMES = [
    ("NVIDIA A10G", hw.A10G),
    ("NVIDIA A10", hw.A10),
    ("NVIDIA L4", hw.L4),
    ("NVIDIA L40", hw.L40),
    ("NVIDIA L40S", hw.L40S),
    ("NVIDIA A100-SXM4-40GB", hw.A100_40GB),
    ("NVIDIA A100-PCIE-40GB", hw.A100_PCIE_40GB),
    ("NVIDIA A100-SXM4-80GB", hw.A100_SXM_80GB),
    ("NVIDIA A100-SXM-80GB", hw.A100_SXM_80GB),
    ("NVIDIA A100 80GB PCIe", hw.A100_PCIE_80GB),
    ("NVIDIA H100 80GB HBM3", hw.H100_SXM),
    ("NVIDIA H100 PCIe", hw.H100_PCIE),
    ("NVIDIA H100 NVL", hw.H100_NVL),
    ("NVIDIA H20", hw.H20),
    ("NVIDIA H200", hw.H200),
    ("NVIDIA B200", hw.B200),
    # older drivers drop the vendor prefix; MIG instances add their profile
    ("A100-SXM4-40GB", hw.A100_40GB),
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", hw.H100_SXM),
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", hw.A100_SXM_80GB),
    ("nvidia l40s", hw.L40S),
]


@pytest.mark.parametrize(("name", "spec"), NAMES)
def test_every_nvml_name_finds_its_own_entry(name: str, spec: hw.GpuSpec) -> None:
    assert hw.gpu_spec(name) is spec


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA GH200 480GB",  # not an H200: "h200" is not a token of it
        "NVIDIA H800",
        "NVIDIA A800-SXM4-80GB",
        "Tesla T4",
        "NVIDIA A30",
        "NVIDIA L20",
        "NVIDIA H100",  # no variant named: absent rather than a guess between SXM, PCIe and NVL
        "NVIDIA A100",
        "NVIDIA A100 80GB",  # neither SXM nor PCIe named
        "NVIDIA H200 NVL",  # a board variant the H200 (SXM) entry does not name
        "NVIDIA L40S PCIe",
        "NVIDIA L4X",
        "",
    ],
)
def test_unknown_names_are_absent(name: str) -> None:
    assert hw.gpu_spec(name) is None


def test_every_entry_is_found_by_its_own_name() -> None:
    for spec in {id(s): s for s in hw.GPUS.values()}.values():
        assert hw.gpu_spec(spec.name) is spec, spec.name


@pytest.mark.parametrize(
    ("spec", "bw_tb_s", "tflops", "mib", "watts"),
    [
        (hw.A10G, 0.6, 70, 23028, 300),
        (hw.A10, 0.6, 125, 23028, 150),
        (hw.L4, 0.3, 121, 23034, 72),
        (hw.L40, 0.864, 181, 46068, 300),
        (hw.L40S, 0.864, 362, 46068, 350),
        (hw.A100_40GB, 1.555, 312, 40960, 400),
        (hw.A100_PCIE_40GB, 1.555, 312, 40960, 250),
        (hw.A100_SXM_80GB, 2.039, 312, 81920, 400),
        (hw.A100_PCIE_80GB, 1.935, 312, 81920, 300),
        (hw.H100_SXM, 3.35, 989, 81559, 700),
        (hw.H100_PCIE, 2.0, 756, 81559, 350),
        (hw.H100_NVL, 3.9, 835, 95830, 400),
        (hw.H20, 4.0, 148, 97871, 400),
        (hw.H200, 4.8, 989, 143771, 700),
        (hw.B200, 8.0, 2250, 183359, 1000),
    ],
)
def test_figures_are_the_data_sheets(
    spec: hw.GpuSpec, bw_tb_s: float, tflops: float, mib: int, watts: float
) -> None:
    assert spec.hbm_bandwidth_bytes_per_s == pytest.approx(bw_tb_s * 1e12)
    assert spec.peak_flops == pytest.approx(tflops * 1e12)
    assert spec.memory_bytes == mib * MIB
    assert spec.tdp_watts == watts


def test_h200_memory_is_what_the_real_h200_reported() -> None:
    # scripts/h200-2026-11-30/nvml_raw_summary.json: memory.total = 150754820096 bytes
    assert hw.H200.memory_bytes == 150_754_820_096


@pytest.mark.parametrize(
    ("spec", "pcie_gb_s", "nvlink_gb_s"),
    [
        (hw.L4, 32, None),  # Gen4 x16: 64 GB/s both ways; no NVLink
        (hw.A10G, 32, None),
        (hw.L40S, 32, None),
        (hw.A100_SXM_80GB, 32, 300),  # NVLink 3: 600 GB/s both ways
        (hw.H100_SXM, 64, 450),  # Gen5: 128 GB/s; NVLink 4: 900 GB/s
        (hw.H100_NVL, 64, 300),
        (hw.H200, 64, 450),
        (hw.B200, 64, 900),  # NVLink 5: 1.8 TB/s
    ],
)
def test_links_are_one_direction(spec: hw.GpuSpec, pcie_gb_s: float, nvlink_gb_s: float | None) -> None:
    assert spec.pcie_bytes_per_s == pcie_gb_s * 1e9
    assert spec.nvlink_bytes_per_s == (None if nvlink_gb_s is None else nvlink_gb_s * 1e9)
