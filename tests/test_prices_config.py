"""Config and price book: valid files load, bad files name the file, the key and the fix."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from agent.config import ConfigError, load_config
from agent.sources.prices import load_price_book

T_2026_07 = dt.datetime(2026, 7, 1, tzinfo=dt.UTC).timestamp()
T_2025_07 = dt.datetime(2025, 7, 1, tzinfo=dt.UTC).timestamp()


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_bundled_book_prices_the_example_gpus_with_effective_dates() -> None:
    book = load_price_book(None)
    assert book.gpu_usd_per_hour("NVIDIA H100 80GB HBM3", "n1", T_2025_07) == 3.00
    assert book.gpu_usd_per_hour("NVIDIA H100 80GB HBM3", "n1", T_2026_07) == 2.49
    assert book.gpu_usd_per_hour("NVIDIA A100-SXM4-80GB", "n1", T_2026_07) == 1.79  # longest match wins
    assert book.gpu_usd_per_hour("NVIDIA A100-PCIE-40GB", "n1", T_2026_07) == 1.60
    assert book.gpu_usd_per_hour("NVIDIA H200", "n1", T_2026_07) == 3.50
    assert book.gpu_usd_per_hour("Tesla T4", "n1", T_2026_07) is None


def test_node_override_and_cpu_engine_and_power(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "book.yaml",
        """
gpus: [{match: H100, usd_per_hour: 2.0}]
nodes: {reserved-1: {usd_per_gpu_hour: 1.1}}
engines: {llama-cpu: {usd_per_hour: 0.25}}
power: {usd_per_kwh: 0.1, pue: 1.4}
""",
    )
    book = load_price_book(p)
    assert book.gpu_usd_per_hour("NVIDIA H100 80GB HBM3", "reserved-1", T_2026_07) == 1.1
    assert book.gpu_usd_per_hour("NVIDIA H100 80GB HBM3", "other", T_2026_07) == 2.0
    assert book.engine_usd_per_hour("llama-cpu") == 0.25
    assert book.power is not None and book.power.pue == 1.4


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("gpus: [{match: H100, usd_per_hour: -1}]", ["gpus.0.usd_per_hour", "greater than or equal"]),
        ("gpus: [{match: H100, price: 2}]", ["gpus.0.price", "unknown key", "fix:"]),
        ("power: {usd_per_kwh: 0.1, pue: 9}", ["power.pue"]),
        ("- just a list", ["must be a mapping"]),
    ],
)
def test_bad_price_book_names_file_key_and_fix(tmp_path: Path, text: str, needles: list[str]) -> None:
    p = _write(tmp_path, "bad-book.yaml", text)
    with pytest.raises(ConfigError) as exc:
        load_price_book(p)
    msg = str(exc.value)
    assert "bad-book.yaml" in msg
    for n in needles:
        assert n in msg


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("engines: [{name: a, url: 'localhost:8000'}]", ["engines.0.url", "http://"]),
        ("engines: [{name: a, url: 'http://x/metrics', kind: vllm2}]", ["engines.0.kind"]),
        ("intervals: {nvml_second: 1}", ["intervals.nvml_second", "unknown key"]),
        ("engines: [{name: a, url: 'http://x/m'}, {name: a, url: 'http://y/m'}]", ["used twice"]),
        ("node: [unclosed", ["not valid YAML", "line 1"]),
    ],
)
def test_bad_config_names_file_key_and_fix(tmp_path: Path, text: str, needles: list[str]) -> None:
    p = _write(tmp_path, "node.yaml", text)
    with pytest.raises(ConfigError) as exc:
        load_config(p, environ={})
    msg = str(exc.value)
    assert "node.yaml" in msg
    for n in needles:
        assert n in msg


def test_environment_overrides(tmp_path: Path) -> None:
    p = _write(tmp_path, "node.yaml", "node: from-file\nintervals: {scrape_seconds: 10}\n")
    cfg = load_config(
        p, environ={"INFERCOST_NODE": "from-env", "INFERCOST__INTERVALS__SCRAPE_SECONDS": "2.5"}
    )
    assert cfg.node == "from-env"
    assert cfg.intervals.scrape_seconds == 2.5


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_a_secret_pasted_into_the_config_is_not_echoed(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "node.yaml",
        "alerts: {slack: {webhook_url: 'https://hooks.slack.com/services/T0/B0/SECRET'}}",
    )
    with pytest.raises(ConfigError) as exc:
        load_config(p, environ={})
    assert "alerts.slack.webhook_url" in str(exc.value)
    assert "SECRET" not in str(exc.value)
