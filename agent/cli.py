"""The command line: the only place that parses argv, sets up logging and exits.

infercost demo                       a simulated 8×H100 node, the real pipeline, a live view
infercost run [--config node.yaml]   the daemon
infercost check --config node.yaml   validate config, price book and rules (exit 2 when bad)
infercost bench overhead|detection|parse
infercost report --state-dir DIR | --prometheus URL [--format md|html|csv|json|slack]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import __version__
from agent.clock import Clock
from agent.config import Config, ConfigError, load_config
from agent.detect.rules import RuleError
from agent.sources.nvml.backend import NvmlUnavailable
from agent.sources.prices import load_price_book
from agent.store import StoreError

if TYPE_CHECKING:
    from agent.supervisor import Hooks

logger = logging.getLogger("agent")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(level: str, fmt: str) -> None:
    """Configure the root logger once (text or JSON lines on stderr)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


# ---------------------------------------------------------------------------------------- check
def cmd_check(args: argparse.Namespace) -> int:
    """Validate the config, its price book and its rules; print what was found."""
    cfg = load_config(args.config)
    book = load_price_book(cfg.prices.book)
    print(f"config {args.config or '(defaults)'}: ok — node {cfg.node}, {len(cfg.engines)} engine(s)")
    print(
        f"price book {book.source_path}: ok — {len(book.model.gpus)} GPU price(s), as of {book.model.as_of}"
    )
    from agent.detect.rules import load_default_rules, load_rules

    rules = load_rules(cfg.alerts.rules_dirs) if cfg.alerts.rules_dirs else load_default_rules()
    print(f"rules: ok — {len(rules)} rule(s)")
    return EXIT_OK


# ---------------------------------------------------------------------------------------- run
async def _run(cfg: Config) -> int:
    from agent.clock import SystemClock
    from agent.sources.discovery import discover_local_engines
    from agent.sources.nvml.sampler import make_backend
    from agent.supervisor import Agent

    clock = SystemClock()
    book = load_price_book(cfg.prices.book)
    backend = make_backend(cfg.nvml)
    engines = list(cfg.engines)
    if not engines:
        engines = await discover_local_engines()
        if engines:
            logger.info(
                "found engines on default ports: %s", ", ".join(f"{e.name} at {e.url}" for e in engines)
            )
            if len(engines) == 1 and backend is not None:
                # one engine on a GPU node: assume it uses every GPU (say so; node.yaml can correct it)
                rnd = await asyncio.to_thread(backend.read_round, clock.now())
                gpus = tuple(sorted({g.index for g in rnd.gpus if g.mig_parent_uuid is None}))
                engines = [engines[0].model_copy(update={"gpus": gpus})]
                logger.info("assuming %s uses all %d GPUs of this node", engines[0].name, len(gpus))
            elif len(engines) > 1:
                logger.info(
                    "several engines: GPU cost is node idle cost until node.yaml lists each engine's GPUs"
                )
        else:
            logger.info("no engine answered on the default local ports; GPU cost is reported as idle")
    hooks = _build_hooks(cfg, clock)
    agent = Agent(cfg, clock, book, backend, engines, hooks)
    stop = asyncio.Event()
    _install_signal_handlers(stop)
    await agent.run(stop)
    return EXIT_OK


def _build_hooks(cfg: Config, clock: Clock) -> Hooks:
    """The history store, the detection pipeline (rules, alerts, outbox) and the forest scorer."""
    from agent.detect.pipeline import build_pipeline
    from agent.detect.scoring import AnomalyScorer
    from agent.store import Store
    from agent.supervisor import Hooks

    hooks = Hooks()
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    hooks.store = Store(cfg.state_dir / "history.sqlite", cfg.store.retention_days, clock)
    hooks.pipeline = build_pipeline(cfg, hooks.store, clock)
    hooks.scorer = AnomalyScorer(hooks.store.path, cfg.state_dir)
    return hooks


def cmd_run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM."""
    cfg = load_config(args.config)
    return asyncio.run(_run(cfg))


# ---------------------------------------------------------------------------------------- demo
def cmd_demo(args: argparse.Namespace) -> int:
    """Run the simulated node with the real pipeline and a live terminal view."""
    from agent.demo import run_demo

    return asyncio.run(
        run_demo(seconds=args.seconds, speed=args.speed, port=args.port, live=not args.no_view)
    )


# ---------------------------------------------------------------------------------------- bench
def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmarks: print figures, compared against a baseline measured in the same run."""
    if args.what == "overhead":
        from agent.bench.overhead import run as run_overhead

        run_overhead(seconds=args.seconds)
    elif args.what == "parse":
        from agent.bench.parse import run as run_parse

        run_parse()
    elif args.what == "detection":
        from agent.bench.detection import run as run_detection

        run_detection(seed=args.seed, weeks=args.weeks)
    return EXIT_OK


# ---------------------------------------------------------------------------------------- report
def cmd_report(args: argparse.Namespace) -> int:
    """Weekly cost report from the local store or from Prometheus."""
    from agent.report.cli import run_report

    return int(run_report(args))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser."""
    p = argparse.ArgumentParser(prog="infercost", description="What every token costs.")
    p.add_argument("--version", action="version", version=f"infercost {__version__}")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="text", choices=["text", "json"])
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="simulated 8×H100 node, real pipeline, live view")
    d.add_argument("--seconds", type=float, default=45.0, help="real seconds to run (0 = until Ctrl-C)")
    d.add_argument("--speed", type=float, default=120.0, help="simulated seconds per real second")
    d.add_argument("--port", type=int, default=9464, help="Prometheus endpoint port on 127.0.0.1 (0 = any)")
    d.add_argument(
        "--no-view", action="store_true", help="print a summary table at the end instead of a live view"
    )
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("run", help="run the agent")
    r.add_argument("--config", type=Path, default=None)
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("check", help="validate config, price book and rules")
    c.add_argument("--config", type=Path, default=None)
    c.set_defaults(func=cmd_check)

    b = sub.add_parser("bench", help="benchmarks")
    b.add_argument("what", choices=["overhead", "parse", "detection"])
    b.add_argument("--seconds", type=float, default=60.0)
    b.add_argument("--seed", type=int, default=7)
    b.add_argument("--weeks", type=int, default=4)
    b.set_defaults(func=cmd_bench)

    rep = sub.add_parser("report", help="weekly cost report")
    src = rep.add_mutually_exclusive_group(required=True)
    src.add_argument("--state-dir", type=Path, help="read the local store in this state directory")
    src.add_argument("--prometheus", help="read the fleet from this Prometheus base URL")
    rep.add_argument("--format", default="md", choices=["md", "html", "csv", "json", "slack"])
    rep.add_argument("--bearer-token-file", type=Path, help="Prometheus: Authorization: Bearer <file>")
    rep.add_argument(
        "--basic-auth-user", help="Prometheus: basic-auth user (with --basic-auth-password-file)"
    )
    rep.add_argument("--basic-auth-password-file", type=Path, help="Prometheus: basic-auth password file")
    rep.add_argument("--ca-file", type=Path, help="Prometheus: PEM CA bundle for https")
    rep.add_argument(
        "--header", action="append", default=[], help="Prometheus: extra header 'Name: value' (repeatable)"
    )
    rep.add_argument("--end", type=float, default=None, help="epoch seconds the week ends (default now)")
    rep.add_argument("--output", type=Path, default=None)
    rep.set_defaults(func=cmd_report)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``infercost`` command."""
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    t0 = time.monotonic()
    try:
        rc = int(args.func(args))
    except ConfigError as err:
        print(f"infercost: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except KeyboardInterrupt:
        return EXIT_OK
    except (NvmlUnavailable, RuleError, StoreError) as err:
        print(f"infercost: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    logger.debug("%s finished in %.1fs", args.cmd, time.monotonic() - t0)
    return rc


if __name__ == "__main__":
    sys.exit(main())
