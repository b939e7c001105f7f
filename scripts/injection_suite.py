#!/usr/bin/env python3
"""The prompt-injection suite on a live 4-node cluster (docs/injection.md).

    python scripts/injection_suite.py [--suite banking ...] [--seed 0] [--json]

Starts a fresh cluster in a temporary directory (or uses `--dir`), registers the suites'
tools and principals, runs every user task alone and with every injection task of its
suite (a fresh agent per run), stops what it started, and prints the tables: per suite
and overall, then per attack kind. `--json` prints every figure and every run instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from quorumgate.bench.injection.harness import Harness
from quorumgate.bench.injection.report import report, text
from quorumgate.bench.injection.suites import SUITES
from quorumgate.ops.nodes import start_cluster, stop_nodes
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster, load_cluster
from quorumgate.sdk.sync import SyncClient

NODES = 4


def measure(spec: ClusterSpec, suites: list[str], seed: int) -> dict[str, object]:
    with SyncClient.as_owner(spec.directory) as owner:
        harness = Harness(spec, owner, seed)
        harness.register_tools()
        results = list(harness.runs([SUITES[name] for name in suites]))
    return report(results, seed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", nargs="+", choices=sorted(SUITES), default=sorted(SUITES))
    parser.add_argument("--seed", type=int, default=0, help="keys and the order of the runs")
    parser.add_argument("--json", action="store_true", help="every figure and run as JSON")
    parser.add_argument("--dir", type=Path, help="a running cluster's directory")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.dir is not None:
        data = measure(load_cluster(args.dir), args.suite, args.seed)
    else:
        with tempfile.TemporaryDirectory(prefix="qg-injection-") as tmp:
            spec = init_cluster(Path(tmp), NODES)
            start_cluster(spec, list(range(NODES)))
            try:
                data = measure(spec, args.suite, args.seed)
            finally:
                stop_nodes(spec)
    data["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        json.dump(data, sys.stdout, indent=1, sort_keys=True)
        print()
    else:
        print(text(data))
        print(f"\n{len(data['runs'])} runs, seed {args.seed}, {data['seconds']} s")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
