"""`quorumgate drill NAME`: recovery drills against a live cluster under load, ending in a
report a machine can check (docs/drills.md).

This module is the command: its arguments, and the report printed as text or JSON. The
drills themselves are the package `quorumgate.ops.drills`: the runner, the fault
injectors (nemesis), the load, the checks and the report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quorumgate.ops.drills import DRILLS, SECONDS_DEFAULT, DrillError, run_drill
from quorumgate.ops.drills.database import ShipTarget
from quorumgate.ops.drills.report import print_report


def _cmd_drill(args: argparse.Namespace) -> int:
    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        ship = (
            ShipTarget.parse(args.dsn, args.db_stop_cmd, args.db_start_cmd)
            if args.name == "ship" or args.dsn or args.db_stop_cmd or args.db_start_cmd
            else None
        )
        report = run_drill(
            args.name,
            Path(args.dir),
            nodes=args.nodes,
            seconds=args.seconds,
            rate_per_s=args.rate,
            progress=None if args.quiet else progress,
            ship=ship,
        )
    except DrillError as err:
        print(f"quorumgate drill: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print_report(report)
    return 0 if report.ok else 1


def add_drill_command(sub: Any) -> None:
    """Register `quorumgate drill NAME --dir DIR [--nodes 4|7] [--seconds S] [--rate R]
    [--json] [--quiet] [--dsn DSN --db-stop-cmd CMD --db-start-cmd CMD]` (the last three
    for `ship` only) on the CLI's subparsers (an `argparse._SubParsersAction`)."""
    drill = sub.add_parser(
        "drill",
        help="run a recovery drill against a live cluster under load, and check it",
        description="Run a recovery drill against a live cluster under load; exit 0 when "
        "every check holds, 1 when one fails, 2 when the drill cannot run in --dir.",
    )
    drill.add_argument("name", choices=DRILLS)
    drill.add_argument("--dir", required=True, help="cluster directory (made if it has none)")
    drill.add_argument("--nodes", type=int, default=4, help="4 or 7 (any 3f+1; default 4)")
    drill.add_argument(
        "--seconds",
        type=float,
        default=SECONDS_DEFAULT,
        help=f"how long faults keep coming under load (default {SECONDS_DEFAULT:g})",
    )
    drill.add_argument(
        "--rate",
        type=float,
        default=None,
        help="proposals offered per second (50 for 4 nodes, 30 for 7)",
    )
    drill.add_argument("--dsn", help="ship: postgresql://... of the audit copy (docs/audit.md)")
    drill.add_argument(
        "--db-stop-cmd", help="ship: the command that stops that database's server (no shell)"
    )
    drill.add_argument("--db-start-cmd", help="ship: the command that starts it again (no shell)")
    drill.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    drill.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    drill.set_defaults(func=_cmd_drill)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m quorumgate.ops.drill NAME --dir DIR ...`, the same as `quorumgate drill`."""
    parser = argparse.ArgumentParser(prog="quorumgate")
    add_drill_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["drill", *(sys.argv[1:] if argv is None else argv)])
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
