"""Regenerate the README's pictures with headless Chromium: the demo's view and the weekly report.

``python scripts/screenshots.py`` runs the real demo (``infercost demo``, recorded instead of drawn
live), renders its last screen as SVG and the weekly report of the history it kept as HTML, and
photographs both: ``docs/images/demo.png`` and ``docs/images/report.png``. Needs Debian's
``chromium``. Nothing leaves the machine: the demo's engines and receiver listen on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from agent.report.cli import report_from_store
from agent.report.render import render_html
from infercost_sim.demo import run_demo

IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--hide-scrollbars",
)
DEMO_COLUMNS = 150  # the width the demo's table needs for every column


def photograph(page: Path, png: Path, size: tuple[int, int], profile: Path) -> None:
    """A PNG of ``page`` (HTML or SVG) at ``size`` pixels, by headless Chromium."""
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium not found: apt-get install chromium")
    subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={png}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the demo, then write both pictures."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=40.0, help="real seconds the demo runs")
    p.add_argument("--out", type=Path, default=IMAGES, help="folder the PNGs go to")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="infercost-shots-") as tmp:
        work = Path(tmp)
        console = Console(record=True, width=DEMO_COLUMNS, force_terminal=True, color_system="truecolor")
        rc = asyncio.run(
            run_demo(seconds=args.seconds, port=0, live=False, state_dir=work / "state", console=console)
        )
        if rc != 0:
            return rc
        svg = work / "demo.svg"
        svg.write_text(console.export_svg(title="infercost demo"), encoding="utf-8")
        photograph(svg, args.out / "demo.png", (1400, 1000), work / "profile")
        report = report_from_store(work / "state", dt.datetime.now(dt.UTC).timestamp())
        html = work / "report.html"
        html.write_text(render_html(report), encoding="utf-8")
        photograph(html, args.out / "report.png", (1100, 1400), work / "profile")
    print(f"wrote {args.out / 'demo.png'} and {args.out / 'report.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
