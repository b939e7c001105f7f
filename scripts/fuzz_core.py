#!/usr/bin/env python3
"""Fuzz the consensus core with generated messages of every kind (replica/fuzz.py).

    python scripts/fuzz_core.py --per-kind 100000 --seeds 3

Prints, per kind and seed, how many messages reached the core, how many the codec would
have refused, the drop reasons, and any message that escaped `Core.on_message` with the
seed that reproduces it. Exit 1 if any did.
"""

from __future__ import annotations

import argparse
import sys
import time

from quorumgate.replica.fuzz import KINDS, FuzzFailure, fuzz_kind


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-kind", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--kind", choices=KINDS, action="append")
    args = parser.parse_args()
    failures = 0
    for kind in args.kind or KINDS:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            started = time.perf_counter()
            try:
                report = fuzz_kind(kind, seed, args.per_kind)
            except FuzzFailure as failure:
                failures += 1
                print(f"FAIL {kind} seed={seed}: {failure}", flush=True)
                continue
            top = ", ".join(f"{r} {c}" for r, c in report.dropped.most_common(4))
            print(
                f"{kind:14} seed={seed}: {report.messages} reached the core "
                f"({report.acted_on} acted on, {report.replayed} copies), "
                f"{report.refused_on_arrival} refused by the codec; drops: {top}; "
                f"{time.perf_counter() - started:.1f} s",
                flush=True,
            )
    print(f"{failures} failing seeds" if failures else "no message escaped the core")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
