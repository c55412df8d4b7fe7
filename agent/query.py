"""``infercost query``: the cost API's answer (``/api/v1/cost``, agent/sinks/api.py) from a node's
store or, for the fleet, from Prometheus.

- ``--state-dir`` / ``--store``: the local history, exactly as the agent's API reads it (with the
  engines' cost identities as they were minute by minute).
- ``--prometheus``: every node at once. Each series' dollars and tokens are ``increase(…[window])``
  at the window's end; its engine's identity is the last ``infercost_engine_cost_info`` seen in the
  window (one identity per engine over the window: a relabel mid-window is the local store's
  strength). Idle dollars are the GPUs' dollars no model version was charged
  (``infercost_gpu_cost_usd_total`` − ``infercost_cost_usd_total`` per node).

Output: the API's JSON, or a table (``--format table``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.report.prom import PromApi
    from agent.sinks.api import CostQuery

EXIT_OK, EXIT_BAD = 0, 2


def add_arguments(q: argparse.ArgumentParser) -> None:
    """The options of ``infercost query``."""
    src = q.add_mutually_exclusive_group()
    src.add_argument(
        "--config", type=Path, help="node.yaml: its state_dir's store, retention and idle policy"
    )
    src.add_argument("--state-dir", type=Path, help="read the store in this state directory")
    src.add_argument("--prometheus", help="read the fleet from this Prometheus base URL")
    q.add_argument("--window", required=True, help="1h, 24h, 7d, or an RFC 3339 pair start,end")
    q.add_argument(
        "--aggregate",
        default="model_name,model_version",
        help="comma list: node, engine, pod, namespace, role, group, model_name, model_version, cost labels",
    )
    q.add_argument("--cost-basis", default="allocation", choices=["allocation", "usage"], help="cost basis")
    q.add_argument(
        "--share-idle",
        action="store_true",
        help="share idle dollars among the groups (else an __idle__ item)",
    )
    q.add_argument(
        "--retention-days", type=float, default=None, help="the store's retention (default: config)"
    )
    q.add_argument("--format", default="json", choices=["json", "table"], help="output format")
    q.add_argument("--bearer-token-file", type=Path, help="Prometheus: Authorization: Bearer <file>")
    q.add_argument("--ca-file", type=Path, help="Prometheus: PEM CA bundle for https")


def run_query(args: argparse.Namespace) -> int:
    """Answer one query and print it; exit 2 on a bad parameter or an unreadable source."""
    from agent.config import MAX_RETENTION_DAYS, ConfigError, load_config
    from agent.sinks.api import BadRequest, QueryTooLong, answer, oldest_minute, open_read_only, parse_query

    params = {"window": args.window, "aggregate": args.aggregate, "costBasis": args.cost_basis}
    try:
        cfg = load_config(args.config)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_BAD
    share = args.share_idle or cfg.allocation.idle_policy == "share"
    retention = (args.retention_days or cfg.store.retention_days) * 86400.0
    now = time.time()
    try:
        if args.prometheus:
            # Prometheus keeps its own retention: an empty stretch reads as no dollars, not clamped
            body = prometheus_answer(
                _prom_api(args), parse_query(params, now, MAX_RETENTION_DAYS * 86400.0, share)
            )
        else:
            state = args.state_dir or cfg.state_dir
            path = state / "history.sqlite"
            if not path.exists():
                print(
                    f"{path}: no history store here; fix: give --state-dir of a node's agent", file=sys.stderr
                )
                return EXIT_BAD
            db = open_read_only(path)
            try:
                body = answer(db, parse_query(params, now, retention, share, oldest_minute(db)))
            finally:
                db.close()
    except BadRequest as err:
        print(f"infercost query: {err}", file=sys.stderr)
        return EXIT_BAD
    except QueryTooLong:
        print("infercost query: the store scan took too long; ask for a shorter window", file=sys.stderr)
        return EXIT_BAD
    except OSError as err:
        print(f"infercost query: {err}", file=sys.stderr)
        return EXIT_BAD
    print(json.dumps(body, indent=2) if args.format == "json" else table(body))
    return EXIT_OK


def _prom_api(args: argparse.Namespace) -> PromApi:
    from agent.report.prom import PromApi, PromAuth, http_fetcher

    auth = PromAuth(bearer_token_file=args.bearer_token_file, ca_file=args.ca_file)
    return PromApi(args.prometheus, http_fetcher(auth))


def prometheus_answer(api: PromApi, q: CostQuery) -> dict[str, Any]:
    """The API's response body over the fleet's Prometheus."""
    from agent.report.groups import prometheus_rows
    from agent.sinks.api import allocate, body_of

    rows, idle = prometheus_rows(api, q.start, q.end)
    return body_of(q, allocate(rows, idle, q.aggregate, q.basis, q.share_idle))


def table(body: Mapping[str, Any]) -> str:
    """The response as a plain-text table: one line per item, dollars in cents."""
    agg = list(body.get("aggregate", []))
    head = [*agg, "cost", "idle", "prompt tok", "output tok", "$/1M in", "$/1M out"]
    rows = [head]
    for it in body["items"]:
        key = it["key"]
        rows.append(
            [
                *(str(key.get(a, "")) for a in agg),
                _money(it["costUsd"]),
                _money(it["idleUsd"]),
                _tokens(it["promptTokens"]),
                _tokens(it["outputTokens"]),
                _money(it["usdPer1MInputTokens"]),
                _money(it["usdPer1MOutputTokens"]),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"{body['costBasis']} basis, {body['window']['start']} to {body['window']['end']}"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [f"warning: {w}" for w in body.get("warnings", [])]
    return "\n".join(lines)


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}"


def _tokens(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"
