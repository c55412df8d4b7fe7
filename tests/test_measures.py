"""The table of measures (agent/data/measures.csv) is the one declaration: a new per-model measure is
one row plus one adapter entry, and nothing that derives from the table names a measure itself.

The synthetic test runs tests/synthetic_measures.py in a fresh interpreter (the table is read at
import): three rows — a counter sum, a time-weighted gauge and a ratio of sums — appended to the
package's table and seen on a real /metrics page, in OTLP, in the store (a new file and the
previous release's, migrated), as rule signals and in the generated metrics reference.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.catalog import CATALOG, HISTOGRAMS
from agent.measures import MEASURES, MeasureError, parse
from agent.records import SIGNALS, model_sums
from agent.samples import CostWindow, UsageWindow
from agent.snapshot import check_sources
from agent.store import TABLES

ROOT = Path(__file__).resolve().parents[1]
PREVIOUS = ROOT / "tests" / "fixtures" / "stores" / "history-v8.sqlite"
HEADER = "name,kind,unit,source,labels,field,aggregation,store,since,window,signal_unit,otel,otel_unit,help\n"

# The modules that derive from the table: none of them may name a measure.
DERIVED = (
    "agent/catalog.py",
    "agent/records.py",
    "agent/store.py",
    "agent/snapshot.py",
    "agent/sinks/otlp.py",
    "agent/sinks/prometheus.py",
    "agent/report/data.py",
    "agent/report/render.py",
    "scripts/metrics_doc.py",
)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    work = tmp_path_factory.mktemp("synthetic")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "synthetic_measures.py"), str(work), str(PREVIOUS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return out


# Two one-minute windows: 3000 then 1000 prompt tokens (the widgets), KV cache 0.4 then 0.8,
# $0.04 then $0.02; the ledger's trailing window is the last minute, the store holds both.
def test_a_new_row_of_each_aggregation_is_on_metrics(synthetic: dict[str, object]) -> None:
    assert synthetic["metrics"] == {
        "infercost_synthetic_widgets_total": 4000.0,  # counter: 3000 + 1000 since start
        "infercost_synthetic_level_ratio": 0.8,  # gauge over the trailing minute
        "infercost_synthetic_usd_per_widget": pytest.approx(0.02 / 1000),  # Σ$ / Σwidgets, trailing
    }


def test_and_in_otlp(synthetic: dict[str, object]) -> None:
    assert synthetic["otlp"] == {
        "infercost.synthetic.widgets": ["counter", "{widget}", [4000.0]],
        "infercost.synthetic.level": ["gauge", "1", [0.8]],
        "infercost.synthetic.cost_per_widget": ["gauge", "{USD}", [pytest.approx(2e-5)]],
    }


def test_and_in_the_store_new_and_migrated(synthetic: dict[str, object]) -> None:
    schema, expected = synthetic["schema"]  # type: ignore[misc]
    assert schema == expected  # the rows' since made the next schema version
    assert synthetic["store"] == [
        {"synthetic_widgets": 3000.0, "synthetic_level.s": pytest.approx(24.0), "synthetic_level.w": 60.0},
        {"synthetic_widgets": 1000.0, "synthetic_level.s": pytest.approx(48.0), "synthetic_level.w": 60.0},
    ]
    # the previous release's file gains the column; its minutes read 0 (no widgets then)
    version, widgets = synthetic["previous"]  # type: ignore[misc]
    assert version == expected and widgets == [0.0, 0.0, 0.0]


def test_and_as_rule_signals(synthetic: dict[str, object]) -> None:
    assert synthetic["signals"] == {
        "synthetic_widgets": 4000.0,  # a counter's signal drops _total
        "synthetic_level_ratio": pytest.approx(0.6),  # (0.4 × 60 + 0.8 × 60) / 120
        "synthetic_usd_per_widget": pytest.approx(0.06 / 4000),
    }


def test_and_in_the_generated_docs(synthetic: dict[str, object]) -> None:
    docs = "\n".join(synthetic["docs"])  # type: ignore[arg-type]
    for name in ("synthetic_widgets_total", "synthetic_level_ratio", "synthetic_usd_per_widget"):
        assert f"`infercost_{name}`" in docs
    assert "| `synthetic_level_ratio` | model | time-weighted mean | `synthetic_level` |" in docs
    assert "| `synthetic_usd_per_widget` | model | ratio of sums | `cost_usd / synthetic_widgets` |" in docs


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_derived_module_names_a_measure() -> None:
    """The exported names and the rule-only signals appear in the table only: the catalogue, the
    records, the store, the snapshot, the exporters, the report's rows and the docs generator read
    them from it (their adapters are keyed by labels, window attributes and OTLP names)."""
    names = {m.name for m in MEASURES if m.exported} | {m.signal for m in MEASURES if m.kind == "signal"}
    names |= {f"infercost_{n}" for n in names}
    found = [
        f"{rel}:{line}: {text!r}" for rel in DERIVED for line, text in _literals(ROOT / rel) if text in names
    ]
    assert not found, "measure names outside the table:\n" + "\n".join(found)


def test_the_scan_sees_a_literal_when_there_is_one(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text('"""doc: kv_cache_usage_ratio"""\nX = {"kv_cache_usage_ratio": 1}\n', encoding="utf-8")
    assert _literals(p) == [(2, "kv_cache_usage_ratio")]


def test_every_exported_row_has_its_source_adapters() -> None:
    assert check_sources((*CATALOG, *HISTOGRAMS)) == []


def test_every_stored_model_column_is_written() -> None:
    """What model_sums gives for a window, plus what the store writes itself (the anomaly score,
    its anomalous seconds, the seconds spread from a longer window), is every model column."""
    u = UsageWindow(
        "n1", "e", "m", "v1", 0.0, 60.0, prompt_tokens=1.0, generation_tokens=2.0, gpu_seconds=60.0,
        energy_joules=1.0, preemptions=1.0, gpu_util_ratio=0.5, mem_bw_ratio=0.5, power_watts=300.0,
        requests_running=2.0, kv_cache_usage_ratio=0.5, ttft_p99_seconds=0.1, itl_p99_seconds=0.01,
    )  # fmt: skip
    w = CostWindow(
        u,
        0.01,
        0.0,
        None,
        None,
        0.0,
        roofline_ratio=0.5,
        prefill_share_ratio=0.2,
        prefill_share_floor_ratio=0.1,
    )
    written = {k.replace(".", "_") for k in model_sums(w)} | {
        "anomaly_s",
        "anomaly_w",
        "anomalous_seconds",
        "estimated_seconds",
    }
    assert written == set(TABLES["model"].cols)


def test_every_signal_reads_stored_sums() -> None:
    for kind, t in TABLES.items():
        sums = {c[:-2] + "." + c[-1] if c.endswith(("_s", "_w")) else c for c in t.cols}
        for s in SIGNALS.values():
            if s.kind == kind:
                assert set(s.inputs) <= sums, (s.name, set(s.inputs) - sums)


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ("x_total,counter,1,model,,f,sum,x,,,,,1,help", "OTLP name"),
        ("x,gauge,1,model,,f,median,x,,,,-,,help", "aggregation 'median'"),
        ("x,gauge,1,nowhere,,f,,,,,,-,,help", "source 'nowhere'"),
        ("x,signal,,model,,,ratio,cost_usd,,,,,,", "no ' / '"),
        ("x,signal,,model,,,ratio,cost_usd / nothing_stored,,,,,,", "no model row stores"),
        ("x,stored,,model,,,sum,a + b,9,,,,,", "one sum or one gauge"),
        ("x,signal,,deploy,,,sum,x,,,,,,", "has no history"),
        ("x,signal,,model,,,sum,Bad-Name,,,,,,", "not a sum name"),
    ],
)
def test_a_bad_row_names_its_line_and_what_to_write(row: str, says: str) -> None:
    text = (ROOT / "agent" / "data" / "measures.csv").read_text(encoding="utf-8")
    with pytest.raises(MeasureError, match=r"t\.csv:") as err:
        parse(text + row + "\n", "t.csv")
    assert says in str(err.value)


def test_a_measure_declared_twice_is_refused() -> None:
    row = "dup,signal,,model,,,sum,cost_usd,,,USD,,,\n"
    with pytest.raises(MeasureError, match="names declared twice"):
        parse(HEADER + "cost_usd,stored,,model,,,sum,cost_usd,1,cost_usd,,,,\n" + row + row, "t.csv")
