"""The two series the fleet's FinOps rules need beyond the per-model counters, hand-computed:

- ``infercost_engine_gpu_cost_usd_total``: an engine's share of its GPUs' dollars, whether or not it
  served a model (a multi-node engine's worker pod holds GPUs and counts no tokens; the fleet rules
  give those dollars to its leader's model version);
- ``infercost_budget_usd``: the config's monthly budgets, for the forecast rule.

An H100 at $3.60 per GPU-hour ($0.001 per second), ticks of 10 s: $0.01 per GPU per tick.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import ConfigError, load_config
from agent.cost.inputs import EngineSpec, GpuRate, PriceTable
from agent.cost.window import WindowJoiner
from agent.samples import EngineScrape, GpuSample, ModelSignals, NvmlRound
from agent.sinks.prometheus import render
from agent.snapshot import Ledger

T0 = 1_780_000_000.0
H100 = "NVIDIA H100 80GB HBM3"
BOOK = PriceTable(gpus=(GpuRate("H100", 3.6),))


def rnd(t: float, n: int = 4) -> NvmlRound:
    return NvmlRound(t, True, tuple(GpuSample(i, f"GPU-{i}", H100, t, util_gpu_ratio=0.5) for i in range(n)))


def scrape(engine: str, t: float, *models: ModelSignals) -> EngineScrape:
    return EngineScrape(engine, "vllm", t, True, 0.01, models)


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_a_worker_without_models_has_its_gpus_dollars_and_they_stay_node_unallocated() -> None:
    """Leader on GPUs 0–1 serving a model, worker on GPUs 2–3 serving none, GPU 1 shared equally with
    a third engine: the worker's $0.02 per tick is its own (and still unallocated to any model)."""
    engines = (
        EngineSpec("leader", gpus=(0, 1)),
        EngineSpec("worker", gpus=(2, 3)),
        EngineSpec("side", gpus=(1,)),
    )
    j = WindowJoiner("n1", engines, BOOK)
    ledger = Ledger("n1", "test")
    m0, m1 = ModelSignals("m", generation_tokens_total=0.0), ModelSignals("m", generation_tokens_total=500.0)
    m2 = replace(m1, generation_tokens_total=900.0)
    for k, (t, m) in enumerate(((T0, m0), (T0 + 10, m1), (T0 + 20, m2))):
        j.add_round(rnd(t))
        scrapes = {"leader": scrape("leader", t, m), "worker": scrape("worker", t)}
        scrapes["side"] = scrape("side", t, m0)
        tick = j.close_tick(t, scrapes)
        for sc in scrapes.values():
            ledger.observe_scrape(sc)
        ledger.apply(tick)
        if k:
            # GPU 0 whole + half of GPU 1; GPUs 2 and 3; half of GPU 1
            assert tick.engine_gpu_usd == pytest.approx({"leader": 0.015, "worker": 0.02, "side": 0.005})
            un = {g.sample.uuid: g.unallocated_usd for g in tick.gpus}
            assert un["GPU-2"] + un["GPU-3"] == pytest.approx(0.02)
            # every GPU dollar is some engine's
            assert sum(tick.engine_gpu_usd.values()) == pytest.approx(sum(g.cost_usd for g in tick.gpus))
    got = samples(render(ledger.snapshot(), process=False).decode(), "infercost_engine_gpu_cost_usd_total")
    assert got == pytest.approx(
        {
            (("engine", "leader"), ("node", "n1")): 0.03,
            (("engine", "side"), ("node", "n1")): 0.01,
            (("engine", "worker"), ("node", "n1")): 0.04,
        }
    )


def test_an_engine_whose_gpu_is_unpriced_has_no_gpu_dollars_not_zero() -> None:
    j = WindowJoiner("n1", (EngineSpec("t4", gpus=(0,)),), PriceTable(gpus=(GpuRate("H100", 3.6),)))
    t4 = (GpuSample(0, "GPU-0", "Tesla T4", T0, util_gpu_ratio=0.5),)
    j.add_round(NvmlRound(T0, True, t4))
    j.close_tick(T0, {"t4": scrape("t4", T0)})
    j.add_round(NvmlRound(T0 + 10, True, (replace(t4[0], timestamp=T0 + 10),)))
    tick = j.close_tick(T0 + 10, {"t4": scrape("t4", T0 + 10)})
    assert tick.engine_gpu_usd == {}
    ledger = Ledger("n1", "test")
    ledger.observe_scrape(scrape("t4", T0 + 10))
    ledger.apply(tick)
    text = render(ledger.snapshot(), process=False).decode()
    assert samples(text, "infercost_engine_gpu_cost_usd_total") == {}
    assert samples(text, "infercost_engine_up")  # the engine itself is there


def test_budgets_are_exported_one_series_each(tmp_path: Path) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        "node: n1\nbudgets:\n"
        "  - {scope: team, name: search, monthly_usd: 5000}\n"
        "  - {scope: namespace, name: chat, monthly_usd: 1250.5}\n"
        "  - {scope: model, name: llama-3-70b, monthly_usd: 20000}\n"
    )
    c = load_config(cfg)
    snap = replace(
        Ledger("n1", "test").snapshot(), budgets=tuple((b.scope, b.name, b.monthly_usd) for b in c.budgets)
    )
    got = samples(render(snap, process=False).decode(), "infercost_budget_usd")
    assert got == {
        (("name", "search"), ("node", "n1"), ("scope", "team")): 5000.0,
        (("name", "chat"), ("node", "n1"), ("scope", "namespace")): 1250.5,
        (("name", "llama-3-70b"), ("node", "n1"), ("scope", "model")): 20000.0,
    }


@pytest.mark.parametrize(
    ("budgets", "key"),
    [
        ("  - {scope: tenant, name: a, monthly_usd: 1}\n", "budgets.0.scope"),
        ("  - {scope: team, name: a, monthly_usd: 0}\n", "budgets.0.monthly_usd"),
        ("  - {scope: team, name: 'a b', monthly_usd: 1}\n", "budgets.0.name"),
        ("  - {scope: team, name: a, monthly_usd: 1}\n" * 2, "budgets"),
    ],
)
def test_a_bad_budget_names_the_file_and_key(tmp_path: Path, budgets: str, key: str) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text("node: n1\nbudgets:\n" + budgets)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert str(cfg) in str(err.value) and f"key '{key}'" in str(err.value)
