"""Two helpers around `quorumgate bench` (docs/benchmarks.md):

python scripts/bench_compare.py floor [--nodes 4 7]
    Measure Ed25519 verification (PyNaCl) on this machine and print the floor: every
    replica verifies each client signature once, so n replicas on C cores can admit at
    most C / (n * verify_s) proposals per second, whatever else they do.

python scripts/bench_compare.py compare BEFORE.json AFTER.json
    The headline figures of two `quorumgate bench --json` reports side by side, with the
    ratio AFTER / BEFORE (for an optimization's before/after figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

VERIFY_BATCHES = 7
VERIFY_PER_BATCH = 2000
MESSAGE_BYTES = 200  # about a TxBody of a 256-byte proposal

FIGURES = (
    ("certified_per_s", "certified proposals/s"),
    ("cert_p50_ms", "submit-to-certificate p50 ms"),
    ("cert_p99_ms", "submit-to-certificate p99 ms"),
    ("throughput_per_s", "committed proposals/s"),
    ("p50_ms", "submit-to-commit p50 ms"),
    ("p99_ms", "submit-to-commit p99 ms"),
    ("cpu_s_per_proposal", "cluster CPU s/proposal"),
    ("block_txs_mean", "proposals per block"),
)


def measure_verify_us() -> tuple[float, float]:
    """(median verify µs, median sign µs) over several batches, in CPU time of this
    process (`time.process_time`): on a shared machine, wall time would also count the
    moments another process held the core."""
    key = SigningKey(b"\x07" * 32)
    verify_key = key.verify_key
    message = os.urandom(MESSAGE_BYTES)
    signed = key.sign(message)
    verify_runs, sign_runs = [], []
    for _ in range(VERIFY_BATCHES):
        t = time.process_time()
        for _ in range(VERIFY_PER_BATCH):
            verify_key.verify(signed)
        verify_runs.append((time.process_time() - t) / VERIFY_PER_BATCH * 1e6)
        t = time.process_time()
        for _ in range(VERIFY_PER_BATCH):
            key.sign(message)
        sign_runs.append((time.process_time() - t) / VERIFY_PER_BATCH * 1e6)
    return statistics.median(verify_runs), statistics.median(sign_runs)


def cmd_floor(args: argparse.Namespace) -> int:
    verify_us, sign_us = measure_verify_us()
    cores = os.cpu_count() or 1
    print(f"Ed25519 (PyNaCl) on this machine: verify {verify_us:.1f} µs, sign {sign_us:.1f} µs")
    for n in args.nodes:
        floor = cores / (n * verify_us * 1e-6)
        print(
            f"n={n}: {n} verifications per proposal (one per replica) = "
            f"{n * verify_us:.0f} µs of CPU; {cores} cores -> at most {floor:,.0f} proposals/s"
        )
    if args.json:
        print(
            json.dumps(
                {
                    "verify_us": round(verify_us, 2),
                    "sign_us": round(sign_us, 2),
                    "cores": cores,
                    "floor_per_s": {
                        str(n): round(cores / (n * verify_us * 1e-6)) for n in args.nodes
                    },
                }
            )
        )
    return 0


def _load(path: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(Path(path).read_text())
    return report


def cmd_compare(args: argparse.Namespace) -> int:
    before, after = _load(args.before), _load(args.after)
    rows = []
    for key, label in FIGURES:
        a, b = before.get(key), after.get(key)
        if a is None and b is None:
            continue
        ratio = (
            f"{b / a:.2f}x"
            if isinstance(a, int | float) and isinstance(b, int | float) and a
            else "-"
        )
        rows.append((label, "-" if a is None else str(a), "-" if b is None else str(b), ratio))
    widths = [
        max(len(r[i]) for r in [("figure", "before", "after", "after/before"), *rows])
        for i in range(4)
    ]
    for row in [("figure", "before", "after", "after/before"), *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    floor = sub.add_parser("floor", help="Ed25519 verify cost here and the admission floor")
    floor.add_argument("--nodes", type=int, nargs="+", default=[4, 7])
    floor.add_argument("--json", action="store_true")
    floor.set_defaults(func=cmd_floor)
    compare = sub.add_parser("compare", help="two bench --json reports side by side")
    compare.add_argument("before")
    compare.add_argument("after")
    compare.set_defaults(func=cmd_compare)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
