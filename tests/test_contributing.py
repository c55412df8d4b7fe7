"""docs/CONTRIBUTING.md's "add an engine" recipe, performed on a copy of the package.

The test copies ``agent/`` into a temporary directory, makes there exactly the edits the recipe
tells a contributor to make (a new module with a metric map, one line in the registry, one word in
the config's ``EngineKind``), and runs that copy's real daemon (``python -m agent.cli run``, fake
NVML) against a real aiohttp server on 127.0.0.1 serving the new engine's page. The new engine's
series must then appear on the daemon's ``/metrics``, for an engine configured with the new kind
and for one left to ``kind: auto``. When an edit point named in the recipe moves, the test fails
with the step to update, so the recipe cannot go stale silently.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from netutil import async_wait_until, free_port
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "docs" / "CONTRIBUTING.md"
# a real daemon in its own process and a real HTTP engine: the slow selection (.ci/run)
pytestmark = pytest.mark.slow
KIND = "toyserve"
MODEL = "toy-7b"

# Step 2 of the recipe: the engine as data, in the style of agent/sources/engines/vllm.py.
ENGINE_MODULE = '''"""toyserve: a made-up engine (``toyserve:*`` series, ``model`` label)."""

from __future__ import annotations

from agent.sources.engines.base import Adapter, Series

ADAPTER = Adapter(
    kind="toyserve",
    prefixes=("toyserve:",),
    model_label="model",
    scalars={
        "prompt_tokens_total": (Series("toyserve:prompt_tokens_total"),),
        "generation_tokens_total": (Series("toyserve:generation_tokens_total"),),
        "requests_running": (Series("toyserve:requests_running"),),
        "requests_waiting": (Series("toyserve:requests_waiting"),),
    },
    histograms={"ttft_seconds": (Series("toyserve:time_to_first_token_seconds"),)},
)
'''


def _page(n: int) -> str:
    """The engine's /metrics after ``n`` scrapes: counters that grow, gauges, one histogram."""
    first = 2 * n  # requests that have had their first token
    return (
        "# TYPE toyserve:prompt_tokens_total counter\n"
        f'toyserve:prompt_tokens_total{{model="{MODEL}"}} {300 * n}\n'
        "# TYPE toyserve:generation_tokens_total counter\n"
        f'toyserve:generation_tokens_total{{model="{MODEL}"}} {100 * n}\n'
        "# TYPE toyserve:requests_running gauge\n"
        f'toyserve:requests_running{{model="{MODEL}"}} 4\n'
        "# TYPE toyserve:requests_waiting gauge\n"
        f'toyserve:requests_waiting{{model="{MODEL}"}} 1\n'
        "# TYPE toyserve:time_to_first_token_seconds histogram\n"
        f'toyserve:time_to_first_token_seconds_bucket{{model="{MODEL}",le="0.1"}} {n}\n'
        f'toyserve:time_to_first_token_seconds_bucket{{model="{MODEL}",le="1.0"}} {first}\n'
        f'toyserve:time_to_first_token_seconds_bucket{{model="{MODEL}",le="+Inf"}} {first}\n'
        f'toyserve:time_to_first_token_seconds_sum{{model="{MODEL}"}} {0.3 * first}\n'
        f'toyserve:time_to_first_token_seconds_count{{model="{MODEL}"}} {first}\n'
    )


def _edit(path: Path, pattern: str, repl: str, step: str) -> None:
    """Apply one recipe edit; fail naming the recipe's step when its edit point is gone."""
    text = path.read_text()
    new, count = re.subn(pattern, repl, text, count=1, flags=re.MULTILINE)
    assert count == 1, (
        f"{RECIPE.name} step {step}: {path.relative_to(path.parents[3])} no longer matches "
        f"{pattern!r}; update the recipe and this test together"
    )
    path.write_text(new)


def _perform_recipe(dest: Path) -> Path:
    """A copy of agent/ with a new engine added as docs/CONTRIBUTING.md says; returns its root."""
    shutil.copytree(ROOT / "agent", dest / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    engines = dest / "agent" / "sources" / "engines"
    (engines / f"{KIND}.py").write_text(ENGINE_MODULE)  # step 2
    registry = engines / "registry.py"  # step 3
    _edit(registry, r"^(from agent\.sources\.engines import [\w, ]+)$", rf"\1, {KIND}", "3")
    _edit(registry, r"(for a in \((?:\w+\.ADAPTER, )*\w+\.ADAPTER)\)", rf"\1, {KIND}.ADAPTER)", "3")
    config = dest / "agent" / "config.py"  # step 4
    _edit(config, r"^(EngineKind = Literal\[)", rf'\1"{KIND}", ', "4")
    return dest


def _parse(text: str) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    out: dict[str, dict[frozenset[tuple[str, str]], float]] = defaultdict(dict)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name][frozenset(s.labels.items())] = s.value
    return out


def _by_engine(series: dict[frozenset[tuple[str, str]], float], **match: str) -> dict[str, float]:
    """One series' values by engine name, keeping the samples whose labels include ``match``."""
    out = {}
    for labels, value in series.items():
        d = dict(labels)
        if all(d.get(k) == v for k, v in match.items()):
            out[d["engine"]] = value
    return out


async def test_the_add_an_engine_recipe_gives_series_on_metrics(tmp_path: Path) -> None:
    assert "## Add an engine" in RECIPE.read_text(), "the recipe this test performs"
    src = _perform_recipe(tmp_path / "src")

    scrapes = 0

    async def metrics(_request: web.Request) -> web.Response:
        nonlocal scrapes
        scrapes += 1
        return web.Response(text=_page(scrapes), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    engine_port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{engine_port}/metrics"

    port = free_port()
    (tmp_path / "prices.yaml").write_text(
        'currency: USD\ngpus:\n  - {match: "H100", usd_per_hour: 2.0, effective_from: "2025-01-01"}\n'
    )
    (tmp_path / "node.yaml").write_text(
        f"""node: contrib-node
state_dir: {tmp_path / "state"}
intervals: {{nvml_seconds: 0.5, scrape_seconds: 0.5, window_seconds: 10}}
nvml: {{backend: fake, fake_count: 2}}
prices: {{book: {tmp_path / "prices.yaml"}}}
exporters: {{prometheus: {{host: 127.0.0.1, port: {port}}}}}
engines:
  - {{name: toy-explicit, kind: {KIND}, url: "{url}", gpus: [0], model_version: "v1"}}
  - {{name: toy-auto, kind: auto, url: "{url}", gpus: [1], model_version: "v1"}}
"""
    )
    # the copy, not the installed package, is what `-m agent.cli` imports
    env = {**os.environ, "PYTHONPATH": str(src)}
    # nothing from this shell's environment may point the daemon elsewhere (OTLP, config overrides)
    env = {k: v for k, v in env.items() if not k.startswith(("INFERCOST", "OTEL_", "KUBECONFIG"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent.cli",
        "run",
        "--config",
        str(tmp_path / "node.yaml"),
        cwd=src,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    page: dict[str, dict[frozenset[tuple[str, str]], float]] = {}

    async def both_engines_counted() -> bool:
        nonlocal page
        assert proc.returncode is None, "the daemon exited early"
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{port}/metrics") as r,
            ):
                page = _parse(await r.text())
        except aiohttp.ClientError:
            return False
        tokens = _by_engine(page.get("infercost_generation_tokens_total", {}), model=MODEL)
        return len(tokens) == 2 and min(tokens.values()) > 0

    try:
        await async_wait_until(both_engines_counted, timeout=60, what="for the new engine's tokens")
    finally:
        if proc.returncode is None:
            proc.terminate()
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        await runner.cleanup()
    log = out.decode(errors="replace")
    assert proc.returncode == 0, log

    # the engine is up under its own kind, whether configured or detected from the page
    up = _by_engine(page["infercost_engine_up"], kind=KIND)
    assert up == {"toy-explicit": 1.0, "toy-auto": 1.0}, log
    assert f"engine toy-auto: detected kind {KIND}" in log
    # its signals reach the common series, under the agent's labels
    labels = {"node": "contrib-node", "model": MODEL, "model_version": "v1"}
    for name in (
        "infercost_prompt_tokens_total",
        "infercost_requests_running",
        "infercost_cost_usd_total",
    ):
        assert set(_by_engine(page[name], **labels)) == {"toy-explicit", "toy-auto"}, name
    assert _by_engine(page["infercost_requests_running"], **labels) == {
        "toy-explicit": 4.0,
        "toy-auto": 4.0,
    }
    # prompt tokens grow three times as fast as output tokens on this page
    prompt = _by_engine(page["infercost_prompt_tokens_total"], **labels)
    output = _by_engine(page["infercost_generation_tokens_total"], **labels)
    for engine, tokens in output.items():
        assert tokens > 0 and prompt[engine] == pytest.approx(3 * tokens), engine
    # the histogram is re-exported with the engine's own bounds
    buckets = page.get("infercost_ttft_seconds_bucket", {})
    bounds = {dict(k)["le"] for k in buckets if dict(k).get("engine") == "toy-explicit"}
    assert bounds == {"0.1", "1.0", "+Inf"}
    # signals the map does not declare stay absent, never 0
    assert not _by_engine(page.get("infercost_kv_cache_usage_ratio", {}), model=MODEL)
