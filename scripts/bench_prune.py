#!/usr/bin/env python3
"""Disk and CPU with pruning on and off (docs/pruning.md, "Figures").

Each run starts a fresh 4-node cluster whose nodes snapshot every `--interval` heights,
with `retain_heights` set to `--retain` (pruning on, A) or left out (off, B), runs the
closed-loop load of `quorumgate bench` in `--points` stretches of `--seconds` each, and
after each stretch records the proposals the ledger holds and the bytes each node's
directory holds on disk (replica and sidecar stores with their write-ahead logs, and the
snapshots). The replicas' and sidecars' CPU seconds over the whole load, divided by the
proposals certified, give the CPU per proposal. Runs alternate A B A B so the machine's
drift falls on both; the medians of the CPU per proposal and the last point's disk are
printed side by side.

    python scripts/bench_prune.py [--runs 2] [--points 5] [--seconds 30] \
        [--interval 200] [--retain 200] [--only on|off] [--until N] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quorumgate.bench.agents import AGENT_POOL_DEFAULT
from quorumgate.bench.harness import agent_nonces, check_serving, run_once
from quorumgate.bench.load import RunOptions
from quorumgate.bench.procstats import cluster_pids, cpu_delta, sample_cpu
from quorumgate.bench.report import machine_info
from quorumgate.ops.nodes import sidecar_status, start_cluster, stop_nodes
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from quorumgate.sidecar.snapshots import OPTIONS_FILE

NODES = 4
SETTLE_S = 3.0  # after a stretch: the last snapshot written and pruned at before measuring


@dataclass(frozen=True)
class Point:
    """One measurement after a stretch of load."""

    proposals: int  # ledger entries of sidecar 0 (every verdict, owner setup included)
    height: int  # sidecar 0's executed height
    node_bytes: list[int]  # each node directory's bytes on disk


@dataclass(frozen=True)
class Run:
    pruning: bool
    points: list[Point]
    cpu_s: float  # replicas' and sidecars' CPU seconds over the load
    certified: int  # verdicts sidecar 0's ledger gained during the load
    cpu_ms_per_proposal: float


def dir_bytes(path: Path) -> int:
    """Bytes the files under `path` hold (st_size; the stores' pages given back shrink it)."""
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file():
                total += item.stat().st_size
        except OSError:
            continue
    return total


def measure(spec: ClusterSpec) -> Point:
    status = sidecar_status(spec, 0, timeout_s=5.0)
    entries = 0 if status is None else int(status.ledger_entries)
    height = 0 if status is None else int(status.executed_height)
    return Point(entries, height, [dir_bytes(spec.node_dir(i)) for i in range(NODES)])


def one_run(pruning: bool, args: argparse.Namespace) -> Run:
    workdir = Path(tempfile.mkdtemp(prefix="qg-prune-bench-"))
    spec = init_cluster(workdir / "cluster", NODES)
    options_doc: dict[str, int] = {"interval_heights": args.interval, "kept": 2}
    if pruning:
        options_doc["retain_heights"] = args.retain
    for i in range(NODES):
        (spec.node_dir(i) / OPTIONS_FILE).write_text(json.dumps(options_doc))
    points: list[Point] = []
    try:
        start_cluster(spec, list(range(NODES)))
        options = RunOptions(args.seconds, 1.0, args.inflight, 0.0, args.clients, False)
        check_serving(spec, True)
        nonces = agent_nonces(spec, options, AGENT_POOL_DEFAULT)
        pids = cluster_pids(spec)
        before, start = sample_cpu(pids), measure(spec)
        while len(points) < args.points or (
            args.until and (not points or points[-1].proposals < args.until)
        ):
            run_once(spec, options, nonces)
            time.sleep(SETTLE_S)  # a benchmark's pause, not a test's wait
            points.append(measure(spec))
            print(f"{'A on ' if pruning else 'B off'}: {points[-1]}", file=sys.stderr)
        cpu_s = round(sum(cpu_delta(before, sample_cpu(pids)).values()), 2)
    finally:
        stop_nodes(spec)
        shutil.rmtree(workdir, ignore_errors=True)
    certified = points[-1].proposals - start.proposals
    per = round(1000 * cpu_s / max(certified, 1), 3)
    return Run(pruning, points, cpu_s, certified, per)


def summary(runs: list[Run], args: argparse.Namespace) -> dict[str, Any]:
    def med(pruning: bool, pick: Any) -> float | None:
        values = [pick(r) for r in runs if r.pruning is pruning]
        return statistics.median(values) if values else None

    return {
        "interval_heights": args.interval,
        "retain_heights": args.retain,
        "seconds_per_point": args.seconds,
        "runs": [asdict(r) for r in runs],
        "median": {
            side: {
                "cpu_ms_per_proposal": med(on, lambda r: r.cpu_ms_per_proposal),
                "last_node_bytes_mean": med(on, lambda r: statistics.mean(r.points[-1].node_bytes)),
                "proposals": med(on, lambda r: r.points[-1].proposals),
            }
            for side, on in (("on", True), ("off", False))
        },
        "machine": machine_info(),
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"interval {result['interval_heights']} heights, retain {result['retain_heights']}")
    for r in result["runs"]:
        side = "on " if r["pruning"] else "off"
        print(f"pruning {side}: {r['cpu_ms_per_proposal']} ms CPU/proposal ({r['certified']})")
        for p in r["points"]:
            mib = " ".join(f"{b / 2**20:7.2f}" for b in p["node_bytes"])
            print(f"  {p['proposals']:>7} proposals, height {p['height']:>6}: MiB per node {mib}")
    for side in ("on", "off"):
        m = result["median"][side]
        mib = (m["last_node_bytes_mean"] or 0) / 2**20
        print(f"median, pruning {side}: {m['cpu_ms_per_proposal']} ms CPU/proposal, "
              f"{mib:.2f} MiB per node at the end")  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of each side, A B A B")
    parser.add_argument("--points", type=int, default=5, help="measurements per run")
    parser.add_argument("--seconds", type=float, default=30.0, help="load between two points")
    parser.add_argument("--interval", type=int, default=200, help="heights between snapshots")
    parser.add_argument("--retain", type=int, default=200, help="heights kept (pruning on)")
    parser.add_argument("--inflight", type=int, default=256, help="closed loop: in flight")
    parser.add_argument("--clients", type=int, default=2, help="load client processes")
    parser.add_argument(
        "--until",
        type=int,
        default=0,
        help="go on past --points until the ledger holds this many proposals",
    )
    parser.add_argument(
        "--only",
        choices=("on", "off"),
        help="run one side only, --runs times (a long run with pruning on, say)",
    )
    parser.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.only is not None:
        runs = [one_run(args.only == "on", args) for _ in range(args.runs)]
    else:
        runs = [one_run(k % 2 == 0, args) for k in range(2 * args.runs)]  # A B A B
    result = summary(runs, args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
