"""Run by tests/test_measures_synthetic.py in a fresh interpreter: the package's table of measures plus
three synthetic per-model rows, one of each aggregation, with nothing else added — then every path
that reads the table, printed as JSON for the test to check.

The rows name existing window attributes as their adapter entry (``window``): the widgets are the
window's prompt tokens, the level its KV-cache usage. argv: a work folder, the previous release's
store file.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import urllib.request
from pathlib import Path

import agent.measures as measures

ROWS = """\
synthetic_widgets_total,counter,{widget},model,,,sum,synthetic_widgets,@,usage.prompt_tokens,widgets,infercost.synthetic.widgets,{widget},A synthetic counter sum.
synthetic_level_ratio,gauge,1,model,,,mean,synthetic_level,@,usage.kv_cache_usage_ratio,ratio,infercost.synthetic.level,1,A synthetic time-weighted gauge.
synthetic_usd_per_widget,gauge,USD,model,,,ratio,cost_usd / synthetic_widgets,,,USD,infercost.synthetic.cost_per_widget,{USD},A synthetic ratio of sums.
"""  # noqa: E501

T0 = 1_780_000_020.0 // 60 * 60  # a minute's start
NAMES = ("synthetic_widgets_total", "synthetic_level_ratio", "synthetic_usd_per_widget")


def main() -> None:
    work, previous = Path(sys.argv[1]), Path(sys.argv[2])
    base = measures.load()
    schema = max(m.since or 0 for m in base) + 1  # the version after this release's
    text = (measures.resources.files("agent") / "data/measures.csv").read_text(encoding="utf-8")
    measures.MEASURES = measures.parse(text + ROWS.replace("@", str(schema)), "synthetic")

    # everything below derives from the table at import
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import metrics_doc
    from prometheus_client.parser import text_string_to_metric_families

    from agent.records import SIGNALS, MinuteRecord
    from agent.samples import CostWindow, UsageWindow
    from agent.sinks.otlp import metric_table
    from agent.sinks.prometheus import PrometheusServer
    from agent.snapshot import Ledger
    from agent.store import SCHEMA_VERSION, Store

    def window(start: float, prompt: float, kv: float, usd: float) -> CostWindow:
        u = UsageWindow(
            "n1", "vllm-a", "llama", "v1", start, start + 60, prompt_tokens=prompt,
            generation_tokens=2 * prompt, gpu_seconds=60.0, energy_joules=None, kv_cache_usage_ratio=kv,
        )  # fmt: skip
        return CostWindow(
            u, gpu_time_usd=usd, energy_usd=0.0, usd_per_1m_output=None, usd_per_1m_total=None, idle_usd=0.0
        )

    from agent.cost.window import TickResult

    a, b = window(T0, 3000.0, 0.4, 0.04), window(T0 + 60, 1000.0, 0.8, 0.02)
    led = Ledger("n1", "0.1.0", trailing_seconds=60.0)
    led.apply(TickResult(T0, T0 + 60, (a,)))
    led.apply(TickResult(T0 + 60, T0 + 120, (b,)))
    snap = led.snapshot()

    out: dict[str, object] = {"schema": [SCHEMA_VERSION, schema]}
    out["metrics"] = asyncio.run(_scrape(PrometheusServer, snap, text_string_to_metric_families))

    otlp: dict[str, object] = {}
    for m in metric_table():
        if m.name.startswith("infercost.synthetic."):
            otlp[m.name] = [m.instrument, m.unit, [v for _, v in m.points(snap)]]
    out["otlp"] = otlp

    st = Store(work / "new.sqlite", retention_days=36500)
    st.write_windows([a, b])
    recs = st.records(T0, T0 + 120, ("model",))
    out["store"] = [{k: v for k, v in r.sums.items() if k.startswith("synthetic")} for r in recs]
    total: dict[str, float] = {}
    for r in recs:
        for k, v in r.sums.items():
            total[k] = total.get(k, 0.0) + v
    rec = MinuteRecord("model", recs[0].labels, T0, total)
    out["signals"] = {
        n: SIGNALS[n].fn([rec.sums.get(i, 0.0) for i in SIGNALS[n].inputs])
        for n in ("synthetic_widgets", "synthetic_level_ratio", "synthetic_usd_per_widget")
    }
    st.close()

    old = work / "previous.sqlite"
    shutil.copy(previous, old)
    st = Store(old, retention_days=36500)
    out["previous"] = [
        st.schema_version(),
        [r.sums.get("synthetic_widgets") for r in st.records(0, 2e9, ("model",))],
    ]
    st.close()

    page = metrics_doc.render()
    out["docs"] = [line for line in page.splitlines() if "synthetic" in line]
    print(json.dumps(out))


async def _scrape(server_cls: type, snap: object, parse: object) -> dict[str, float]:
    server = server_cls(lambda: snap, lambda: True, "127.0.0.1", 0)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    finally:
        await server.stop()
    found: dict[str, float] = {}
    for fam in parse(text):  # type: ignore[operator]
        for s in fam.samples:
            if s.name.startswith("infercost_synthetic"):
                found[s.name] = s.value
    return found


if __name__ == "__main__":
    main()
