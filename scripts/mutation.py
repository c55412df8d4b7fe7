"""Mutation testing of the cost core, the baselines and the parser, scored per file.

    python scripts/mutation.py            # mutmut run (config: [tool.mutmut] in pyproject.toml), then score
    python scripts/mutation.py --no-run   # score the results already in mutants/

Each mutated file must kill at least ``--target`` percent (default 90) of its mutants that are
not listed as equivalent in ``tests/mutation_equivalents.toml`` (each with a one-line reason, so
the score is reproducible). Timeouts and mutants the type check rejects count as killed; survivors,
mutants no test reaches and suspicious ones do not; mutants not checked (an interrupted or partial
run) are left out of the score and fail the check. Exit status: 0 when every file meets the
target and every mutant was checked, 1 otherwise, 2 when mutmut itself failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENTS = ROOT / "tests" / "mutation_equivalents.toml"
KILLED = {1, 3, 36, -24, 24, 152, 255, 37}  # killed, pytest error, timeouts, caught by the type check
SKIPPED = {34}  # mutmut's "skipped" (pragma): not a mutant to score


def load_equivalents(path: Path = EQUIVALENTS) -> dict[str, str]:
    """Mutant name → the reason it cannot change behaviour."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    return {e["mutant"]: e["reason"] for e in data.get("equivalent", [])}


def load_results(mutants: Path) -> dict[str, dict[str, int | None]]:
    """Source file → mutant name → mutmut's exit code (None: not checked)."""
    out: dict[str, dict[str, int | None]] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        out[str(meta.relative_to(mutants))[: -len(".meta")]] = data.get("exit_code_by_key", {})
    return out


def score(
    results: dict[str, dict[str, int | None]], equivalents: dict[str, str], target: float
) -> tuple[list[str], list[str], bool]:
    """(table lines, surviving mutant names, every file meets the target)."""
    lines = [f"{'file':40} {'mutants':>7} {'equiv':>5} {'killed':>6} {'alive':>5} {'score':>7}"]
    alive: list[str] = []
    ok = True
    for path, codes in results.items():
        c: Counter[str] = Counter()
        for name, code in codes.items():
            if code in SKIPPED:
                continue
            c["mutants"] += 1
            if code is None:
                c["unchecked"] += 1
                ok = False
            elif name in equivalents:
                c["equiv"] += 1
            elif code in KILLED:
                c["killed"] += 1
            else:
                c["alive"] += 1
                alive.append(name)
        scored = c["killed"] + c["alive"]
        pct = 100.0 * c["killed"] / scored if scored else 100.0
        ok &= pct >= target
        mark = "" if pct >= target else f"  < {target:.0f} %"
        if c["unchecked"]:
            mark += f"  ({c['unchecked']} not checked)"
        lines.append(
            f"{path:40} {c['mutants']:7} {c['equiv']:5} {c['killed']:6} {c['alive']:5} {pct:6.1f}%{mark}"
        )
    return lines, alive, ok


def main(argv: list[str] | None = None) -> int:
    """Run mutmut (unless ``--no-run``), print the per-file table and check the target."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-run", action="store_true", help="score the results already in mutants/")
    ap.add_argument("--target", type=float, default=90.0, help="percent of non-equivalent mutants to kill")
    ap.add_argument("--children", type=int, default=os.cpu_count() or 2, help="mutants tested at once")
    args = ap.parse_args(argv)
    if not args.no_run:
        run = subprocess.run(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.children)],
            cwd=ROOT,
            check=False,
        )
        if run.returncode != 0:
            print(f"mutmut run failed (exit {run.returncode})", file=sys.stderr)
            return 2
    results = load_results(ROOT / "mutants")
    if not results:
        print("no mutmut results in mutants/: run without --no-run first", file=sys.stderr)
        return 2
    equivalents = load_equivalents()
    known = {name for codes in results.values() for name in codes}
    stale = sorted(set(equivalents) - known)
    lines, alive, ok = score(results, equivalents, args.target)
    print("\n".join(lines))
    if alive:
        print(f"\n{len(alive)} mutants survived (see one with: mutmut show NAME):")
        print("\n".join(f"  {n}" for n in alive))
    if stale:
        print(
            f"\n{len(stale)} listed equivalents no longer exist (the code moved): update {EQUIVALENTS.name}"
        )
        print("\n".join(f"  {n}" for n in stale))
    print(f"\nmutation score target {args.target:.0f} % per file: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
