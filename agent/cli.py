"""The command line: the only place that parses argv, sets up logging and exits.

infercost demo                       a simulated 8×H100 node, the real pipeline, a live view
infercost run [--config node.yaml]   the daemon
infercost check --config node.yaml   validate config, price book and rules (exit 2 when bad)
infercost bench overhead|detection|parse|exposition
infercost report --state-dir DIR | --prometheus URL [--format md|html|csv|json|slack]
infercost explain --state-dir DIR | --prometheus URL --model M (--version V --against V0 | --from T0 --to T1)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agent import __version__
from agent.config import Config, ConfigError, load_config
from agent.detect.rules import RuleError
from agent.logs import setup_logging
from agent.sources.nvml.backend import NvmlUnavailable
from agent.sources.prices import load_price_book
from agent.store import StoreError
from agent.supervisor import StartupError

logger = logging.getLogger("agent")

EXIT_OK = 0
EXIT_USER_ERROR = 2  # bad config, busy port, state dir held or unusable: the operator fixes it
EXIT_BAD_CONFIG = EXIT_USER_ERROR

USER_ERRORS = (ConfigError, StartupError, NvmlUnavailable, RuleError, StoreError)


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


def check_port(host: str, port: int) -> None:
    """Raise StartupError when ``host:port`` cannot be bound now (port 0 always can)."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise StartupError(
            f"exporters.prometheus.host {host!r} does not resolve ({err.strerror}); fix: use an address "
            "such as 127.0.0.1 or 0.0.0.0"
        ) from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as err:
            raise StartupError(
                f"cannot listen on {host}:{port}: {err.strerror}; fix: stop what uses that port or set "
                "exporters.prometheus.port to a free one"
            ) from None


# ---------------------------------------------------------------------------------------- check
def cmd_check(args: argparse.Namespace) -> int:
    """Validate the config, its price book, its rules, the state dir and the port; print what was found."""
    from agent.detect.rules import load_default_rules, load_rules

    cfg = load_config(args.config)
    book = load_price_book(cfg.prices.book)
    print(f"config {args.config or '(defaults)'}: ok — node {cfg.node}, {len(cfg.engines)} engine(s)")
    print(
        f"price book {book.source_path}: ok — {len(book.model.gpus)} GPU price(s), as of {book.model.as_of}"
    )
    rules = load_rules(cfg.alerts.rules_dirs) if cfg.alerts.rules_dirs else load_default_rules()
    print(f"rules: ok — {len(rules)} rule(s)")
    from agent.sinks.registry import check_links, configured, runbooks_into_a_dashboard

    problems = check_links(cfg.alerts, [(r.id, r.runbook_url) for r in rules], rules.sources)
    if problems:
        raise ConfigError("\n".join(problems))
    if configured(cfg.alerts) and (warning := runbooks_into_a_dashboard(cfg.alerts)):
        print(f"warning: {warning}")
    print(f"alerts: ok — {', '.join(configured(cfg.alerts)) or 'no destination (log and /metrics only)'}")
    if cfg.report.enabled:
        r = cfg.report
        where = (
            "to Slack (alerts.slack)" if cfg.alerts.slack else "to state_dir/reports only (no alerts.slack)"
        )
        print(f"weekly report: ok — {r.weekday}s {r.hour:02d}:00 {r.timezone}, {where}")
    if cfg.kubernetes.enabled:
        from agent.sources.kube.source import describe as describe_kubernetes

        print(describe_kubernetes(cfg))
    _check_state_dir(cfg)
    if _check_exporter(cfg):
        print(f"port {cfg.exporters.prometheus.host}:{cfg.exporters.prometheus.port}: ok — free")
    return EXIT_OK


def _check_state_dir(cfg: Config) -> None:
    """Exit-2 problems with the state dir (cannot be created); a read-only one is a warning."""
    from agent.app import write_problem

    p = cfg.state_dir
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing != p and not existing.is_dir():
        raise StartupError(f"state_dir {p}: {existing} is not a directory; fix: point state_dir at a folder")
    if p.exists() and not p.is_dir():
        raise StartupError(f"state_dir {p} is not a directory; fix: point state_dir at a folder")
    problem = write_problem(existing)
    if problem is not None and existing != p:
        raise StartupError(
            f"state_dir {p}: cannot create it ({problem.strerror}); fix: create it, writable by the "
            "agent's user, or set state_dir (or INFERCOST_STATE_DIR) to a writable folder"
        )
    if problem is not None:
        print(
            f"state_dir {p}: WARNING — takes no writes ({problem.strerror}); the agent would run without "
            "history (baselines absent, absolute rules only)"
        )
    else:
        print(f"state_dir {p}: ok — writable")


# ---------------------------------------------------------------------------------------- run
async def _run(cfg: Config) -> int:
    from agent.app import build_agent

    agent = await build_agent(cfg)
    stop = asyncio.Event()
    _install_signal_handlers(stop)
    await agent.run(stop)
    return EXIT_OK


def _check_exporter(cfg: Config) -> bool:
    """Load the /metrics web config (TLS, auth) and check the port is free; False when disabled."""
    if not cfg.exporters.prometheus.enabled:
        return False
    wc = cfg.exporters.prometheus.web_config_file
    if wc is not None:
        from agent.sinks.webconfig import load_web_config

        web = load_web_config(wc)
        tls = "TLS" if web.ssl_context else "no TLS"
        auth = "basic" if web.basic_auth_users else "bearer" if web.bearer_tokens else "no auth"
        print(f"web config {wc}: ok — {tls}, {auth}")
    check_port(cfg.exporters.prometheus.host, cfg.exporters.prometheus.port)
    return True


def cmd_run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM."""
    cfg = load_config(args.config)
    _check_exporter(cfg)
    return asyncio.run(_run(cfg))


# ---------------------------------------------------------------------------------------- demo
def _absent(package: str, command: str) -> bool:
    """True (after one line saying what to install) when ``package`` is not installed: the node image
    ships the runtime alone, and the simulator and benchmarks come with the full distribution."""
    if importlib.util.find_spec(package) is not None:
        return False
    print(
        f"infercost {command}: this install is the agent's runtime only (as in the node image); "
        "the simulator and benchmarks come with the full distribution: pip install infercost",
        file=sys.stderr,
    )
    return True


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the simulated node with the real pipeline and a live terminal view."""
    if _absent("infercost_sim", "demo"):
        return EXIT_USER_ERROR
    from rich.console import Console
    from rich.logging import RichHandler

    from infercost_sim.demo import run_demo

    check_port("127.0.0.1", args.port)
    console = Console()
    if args.log_format == "text" and console.is_terminal:
        # log lines go through the live view's console: printed above the view, never between frames
        setup_logging(args.log_level, "text", RichHandler(console=console, show_path=False))
    return asyncio.run(
        run_demo(
            seconds=args.seconds,
            speed=args.speed,
            port=args.port,
            live=not args.no_view,
            state_dir=args.state_dir,
            history_hours=args.history_hours,
            console=console,
        )
    )


# ---------------------------------------------------------------------------------------- bench
# the benchmarks `infercost bench` runs (each in infercost_bench/, dispatched by _run_bench)
BENCHMARKS = (
    "overhead",
    "parse",
    "detection",
    "exposition",
    "report",
    "soak",
    "startup",
    "bound",
    "efficiency",
    "explain",
    "hostile",
)


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmarks: print figures, compared against a baseline measured in the same run; with
    ``--write-results`` the run also replaces its own section of ``benchmarks/RESULTS.md``."""
    if _absent("infercost_bench", "bench") or _absent("infercost_sim", "bench"):
        return EXIT_USER_ERROR
    if not args.write_results:
        return _run_bench(args)
    from infercost_bench import results

    options = _bench_options(getattr(args, "argv", []), args.what)
    started = dt.datetime.now(dt.UTC)
    where = results.machine()
    t0 = time.monotonic()
    with results.recorded() as tee:
        rc = _run_bench(args)
    if rc != EXIT_OK:
        logger.warning("bench %s exited %d: its results section left as it was", args.what, rc)
        return rc
    run = results.Run(
        key=results.section_key(args.what, options, args.quick),
        command=" ".join(["infercost bench", args.what, *(["--quick"] if args.quick else []), *options]),
        started=started,
        seconds=time.monotonic() - t0,
        machine=where,
        output=results.clean(tee.copy.getvalue()),
    )
    path = args.results or results.default_path()
    results.write(path, run)
    print(f"wrote section '{run.key}' of {path}")
    return rc


# options that say where a run's figures go or how it logs, not what it measures
_NOT_FIGURES = {
    "--write-results": 0,
    "--results": 1,
    "--log-level": 1,
    "--log-format": 1,
    "--quick": 0,
    "--store": 1,
}


def _bench_options(argv: Sequence[str], what: str) -> list[str]:
    """The options given after ``bench <what>`` that change its figures, as typed."""
    tokens = list(argv)
    if what in tokens:
        tokens = tokens[tokens.index(what) + 1 :]
    kept: list[str] = []
    skip = 0
    for token in tokens:
        if skip:
            skip -= 1
            continue
        name = token.split("=", 1)[0]
        if name in _NOT_FIGURES:
            skip = 0 if "=" in token else _NOT_FIGURES[name]
            continue
        kept.append(token)
    return kept


def _run_bench(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.what`` names."""
    if args.what == "overhead":
        from infercost_bench.overhead import run as run_overhead

        run_overhead(seconds=args.seconds)
    elif args.what == "parse":
        from infercost_bench.parse import run as run_parse

        run_parse()
    elif args.what == "detection":
        from infercost_bench.detection import DEFAULT_WEEKS, HELD_OUT_SEED, QUICK_SEED, QUICK_WEEKS
        from infercost_bench.detection import run as run_detection

        seeds = 1 if args.quick else args.seeds
        weeks = args.weeks if args.weeks is not None else QUICK_WEEKS if args.quick else DEFAULT_WEEKS
        first = args.seed if args.seed is not None else QUICK_SEED if args.quick else HELD_OUT_SEED
        run_detection(
            seeds=seeds, first_seed=first, weeks=weeks, workers=args.workers, fine_scrape=not args.quick
        )
    elif args.what == "soak":
        from infercost_bench.soak import run as run_soak

        seed = {} if args.seed is None else {"seed": args.seed}  # else the soak's own default
        return run_soak(hours=args.hours, speed=args.speed, **seed)
    elif args.what == "startup":
        from infercost_bench.startup import run as run_startup

        run_startup(days=args.days, store=args.store)
    elif args.what == "exposition":
        from infercost_bench.exposition import run as run_exposition

        run_exposition()
    elif args.what == "report":
        from infercost_bench.report import run as run_report_bench

        run_report_bench(series=args.series, days=args.days, store=args.store)
    elif args.what == "bound":
        from infercost_bench.bound import run as run_bound

        run_bound()
    elif args.what == "efficiency":
        from infercost_bench.efficiency import run as run_efficiency

        run_efficiency(quick=args.quick)
    elif args.what == "hostile":
        from infercost_bench.hostile import run as run_hostile

        return run_hostile(quick=args.quick)
    elif args.what == "explain":
        from infercost_bench.explain import run as run_explain_bench
        from infercost_bench.explain import run_quick as run_explain_quick

        if args.quick:
            run_explain_quick()
        else:
            run_explain_bench(workers=args.workers)
    return EXIT_OK


# ---------------------------------------------------------------------------------------- report
def cmd_report(args: argparse.Namespace) -> int:
    """Weekly cost report from the local store or from Prometheus."""
    from agent.report.cli import run_report

    return int(run_report(args))


def parse_when(text: str) -> float:
    """A time given as a date (2026-11-30, midnight UTC), an ISO 8601 time (2026-11-30T12:00Z or with
    an offset; no zone means UTC) or epoch seconds; returns epoch seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time; write a date (2026-11-30), an ISO time (2026-11-30T12:00Z) "
            "or epoch seconds"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _zone(text: str) -> str:
    """An IANA time zone name (Europe/Berlin, UTC), checked."""
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise argparse.ArgumentTypeError(
            f"unknown time zone {text!r}; use an IANA name such as Europe/Berlin"
        ) from None
    return text


class _HelpFormatter(argparse.HelpFormatter):
    """Help that shows each option's default, unless the text already says it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if "default" in text or d in (None, False, [], argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: {d})"


def _common() -> argparse.ArgumentParser:
    """Options accepted before or after the subcommand (after: the subcommand's value wins)."""
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument(
        "--log-level",
        default=argparse.SUPPRESS,
        choices=["debug", "info", "warning", "error"],
        help="least severe log lines written (default: info)",
    )
    c.add_argument(
        "--log-format",
        default=argparse.SUPPRESS,
        choices=["text", "json"],
        help="text lines, or JSON lines with RFC 3339 time and structured fields (default: text)",
    )
    return c


_Add = Callable[[str, str], argparse.ArgumentParser]  # adds one subcommand: name, help


def build_parser() -> argparse.ArgumentParser:
    """The argument parser."""
    # two copies of the common options: set_defaults on the top parser rewrites its actions' defaults,
    # and shared actions would make every subcommand overwrite a --log-format given before it
    common = _common()
    p = argparse.ArgumentParser(
        prog="infercost",
        description="What every token costs.",
        parents=[_common()],
        formatter_class=_HelpFormatter,
    )
    p.set_defaults(log_level="info", log_format="text")
    p.add_argument("--version", action="version", version=f"infercost {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    fmt = _HelpFormatter

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, parents=[common], formatter_class=fmt)

    for add_command in (_add_demo, _add_run_and_check, _add_bench, _add_report, _add_explain, _add_query):
        add_command(add)
    return p


def _add_demo(add: _Add) -> None:
    """``infercost demo``."""
    d = add("demo", "simulated 8×H100 node, real pipeline, live view")
    d.add_argument("--seconds", type=float, default=45.0, help="real seconds to run (0 = until Ctrl-C)")
    d.add_argument("--speed", type=float, default=120.0, help="simulated seconds per real second")
    d.add_argument("--port", type=int, default=9464, help="Prometheus endpoint port on 127.0.0.1 (0 = any)")
    d.add_argument(
        "--state-dir", type=Path, default=None, help="keep the demo's history here (for infercost report)"
    )
    d.add_argument(
        "--history-hours",
        type=float,
        default=None,
        help="hours of simulated history prepared first (default 27)",
    )
    d.add_argument(
        "--no-view", action="store_true", help="print a summary table at the end instead of a live view"
    )
    d.set_defaults(func=cmd_demo)


def _add_run_and_check(add: _Add) -> None:
    """``infercost run`` and ``infercost check``."""
    r = add("run", "run the agent until SIGTERM")
    r.add_argument(
        "--config", type=Path, default=None, help="node.yaml (default: built-in defaults + INFERCOST_* env)"
    )
    r.set_defaults(func=cmd_run)

    c = add("check", "validate config, price book, rules, state dir and port (exit 2 when bad)")
    c.add_argument(
        "--config", type=Path, default=None, help="node.yaml (default: built-in defaults + INFERCOST_* env)"
    )
    c.set_defaults(func=cmd_check)


def _add_bench(add: _Add) -> None:
    """``infercost bench``."""
    b = add("bench", "benchmarks (print figures)")
    b.add_argument(
        "what",
        choices=BENCHMARKS,
        help="which benchmark",
    )
    b.add_argument("--seconds", type=float, default=60.0, help="overhead: wall seconds measured")
    b.add_argument(
        "--seed",
        type=int,
        default=None,
        help="detection: first random seed (default 111: seeds no default was tuned on; --quick: 7); "
        "soak: random seed (default 7)",
    )
    b.add_argument(
        "--weeks", type=int, default=None, help="detection: weeks of history (default 2, --quick too)"
    )
    b.add_argument("--seeds", type=int, default=5, help="detection: seeds per traffic model")
    b.add_argument(
        "--quick",
        action="store_true",
        help="detection: one seed per traffic model (CI); hostile: 2 minutes of hostile pages, not 10",
    )
    b.add_argument("--workers", type=int, default=2, help="detection: worker processes")
    b.add_argument("--series", type=int, default=24, help="report: model-version series in the store")
    b.add_argument("--days", type=float, default=35.0, help="report, startup: days of history in the store")
    b.add_argument(
        "--store", type=Path, default=None, help="report, startup: reuse (or create) this store file"
    )
    b.add_argument("--hours", type=float, default=6.0, help="soak: simulated hours to run")
    b.add_argument("--speed", type=float, default=240.0, help="soak: simulated seconds per real second")
    b.add_argument(
        "--write-results",
        action="store_true",
        help="also replace this run's section of the results file with what it printed",
    )
    b.add_argument(
        "--results",
        type=Path,
        default=None,
        help="the results file --write-results writes (default: benchmarks/RESULTS.md of the checkout "
        "the agent runs from, else of the current directory)",
    )
    b.set_defaults(func=cmd_bench)


def _add_report(add: _Add) -> None:
    """``infercost report``."""
    rep = add("report", "weekly cost report")
    src = rep.add_mutually_exclusive_group(required=True)
    src.add_argument("--state-dir", type=Path, help="read the local store in this state directory")
    src.add_argument("--prometheus", help="read the fleet from this Prometheus base URL")
    rep.add_argument(
        "--format", default="md", choices=["md", "html", "csv", "json", "slack"], help="output format"
    )
    rep.add_argument("--bearer-token-file", type=Path, help="Prometheus: Authorization: Bearer <file>")
    rep.add_argument(
        "--basic-auth-user", help="Prometheus: basic-auth user (with --basic-auth-password-file)"
    )
    rep.add_argument("--basic-auth-password-file", type=Path, help="Prometheus: basic-auth password file")
    rep.add_argument("--ca-file", type=Path, help="Prometheus: PEM CA bundle for https")
    rep.add_argument(
        "--header", action="append", default=[], help="Prometheus: extra header 'Name: value' (repeatable)"
    )
    rep.add_argument(
        "--end",
        type=parse_when,
        default=None,
        help="when the week ends: a date (2026-11-30), an ISO time (2026-11-30T12:00Z) or epoch "
        "seconds (default: now)",
    )
    rep.add_argument(
        "--output",
        type=Path,
        default=None,
        help="write to this file (default: stdout); strftime fields take the week's end "
        "(fleet-%%Y-%%m-%%d.html)",
    )
    rep.add_argument(
        "--group-by",
        default=None,
        help="also show cost by this property: namespace, team or another cost label key",
    )
    rep.add_argument("--share-idle", action="store_true", help="--group-by: share idle dollars among groups")
    rep.add_argument(
        "--timezone", type=_zone, default="UTC", help="IANA zone whose calendar days the daily figures are"
    )
    rep.add_argument(
        "--slack-webhook-env",
        default=None,
        help="also post the summary to the Slack webhook URL in this variable",
    )
    rep.set_defaults(func=cmd_report)


def _add_explain(add: _Add) -> None:
    """``infercost explain`` (agent/explain.py)."""
    from agent.detect.rules import parse_duration

    e = add("explain", "why cost per token changed: the change in $/1M split by factor")
    src = e.add_mutually_exclusive_group(required=True)
    src.add_argument("--state-dir", type=Path, help="read the local store in this state directory")
    src.add_argument("--prometheus", help="read the fleet from this Prometheus base URL")
    e.add_argument("--engine", help="the engine (default: every engine serving the model)")
    e.add_argument("--model", required=True, help="the served model name")
    e.add_argument("--node", help="one node only (default: every node)")
    e.add_argument("--version", help="the model version to explain (with --against)")
    e.add_argument("--against", help="the version to compare it with, at like load")
    e.add_argument("--since", type=parse_when, help="--version: minutes from this time on")
    e.add_argument("--until", type=parse_when, help="--version: minutes before this time")
    e.add_argument("--from", dest="from_", metavar="T0", type=parse_when, help="the first window starts here")
    e.add_argument("--to", metavar="T1", type=parse_when, help="the second window starts here")
    e.add_argument("--window", type=parse_duration, default=3600.0, help="--from/--to: each window (1h)")
    e.add_argument("--format", default="text", choices=["text", "json"], help="output format")
    e.add_argument("--bearer-token-file", type=Path, help="Prometheus: Authorization: Bearer <file>")
    e.add_argument("--ca-file", type=Path, help="Prometheus: PEM CA bundle for https")
    e.set_defaults(func=cmd_explain)


def _add_query(add: _Add) -> None:
    """``infercost query`` (agent/query.py)."""
    from agent.query import add_arguments, run_query

    q = add("query", "cost by namespace, team, model…: the cost API's answer from a store or Prometheus")
    add_arguments(q)
    q.set_defaults(func=run_query)


def cmd_explain(args: argparse.Namespace) -> int:
    """The change in $/1M between two versions or two windows, split by factor."""
    from agent.explain import run_explain

    return run_explain(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``infercost`` command. Exit codes: 0 ok, 2 a user error (named, with the
    fix; no traceback), 1 a failure of the agent itself."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # numpy's BLAS starts a thread per core (with its buffers) on first use; the forest's matrices are
    # a few hundred rows, and on a 128-core GPU node those threads would cost more memory than the
    # daemon. Set before anything imports numpy; an operator's own setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    args = build_parser().parse_args(argv)
    args.argv = argv
    setup_logging(args.log_level, args.log_format)
    t0 = time.monotonic()
    try:
        rc = int(args.func(args))
    except USER_ERRORS as err:
        print(f"infercost: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return EXIT_OK
    logger.debug("%s finished in %.1fs", args.cmd, time.monotonic() - t0)
    return rc


if __name__ == "__main__":
    sys.exit(main())
