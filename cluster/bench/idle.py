"""`quorumgate bench --start --idle SECONDS` (issue 19, item 3): what an idle cluster costs.

A temporary cluster is started; it first serves `calls` governed calls at W = 1 (so that
there is a last transaction whose state root the chain must carry, as after real work),
then is left alone for `settle_s`, and the CPU time of its replicas and sidecars is read
from /proc over `seconds`. The figure is cores: CPU seconds per wall second, summed.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from quorumgate.bench.breakdown import w1_calls
from quorumgate.bench.harness import cluster_pids, cpu_delta, sample_cpu
from quorumgate.proto.clusterfile import init_cluster

IDLE_SETTLE_S = 5.0  # after the last call: the heartbeats that carry its root, and more


def run_idle(
    nodes: int,
    seconds: float,
    calls: int,
    progress: Any = print,
    settle_s: float = IDLE_SETTLE_S,
    *,
    state: bool = False,
) -> dict[str, Any]:
    """`state`: filled with the large state first (bench/state.py)."""
    from quorumgate.bench.state import STATE_CAPACITIES, fill_large_state
    from quorumgate.ops.nodes import start_cluster, stop_nodes

    with tempfile.TemporaryDirectory(prefix="qg-idle-") as tmp:
        capacities = STATE_CAPACITIES if state else None
        spec = init_cluster(Path(tmp) / "cluster", nodes, capacities=capacities)
        progress(f"starting {nodes} replicas and sidecars")
        procs = start_cluster(spec, list(range(nodes)))
        try:
            if state:
                asyncio.run(fill_large_state(spec, progress))
            if calls:
                progress(f"{calls} calls at W = 1, then {settle_s:.0f} s to settle")
                asyncio.run(w1_calls(spec, calls))
            time.sleep(settle_s)
            pids = cluster_pids(spec)
            progress(f"measuring {len(pids)} processes for {seconds:.0f} s")
            before = sample_cpu(pids)
            t0 = time.monotonic()
            time.sleep(seconds)
            after = sample_cpu(pids)
            wall = time.monotonic() - t0
        finally:
            stop_nodes(spec, list(range(nodes)))
            for proc in procs:
                proc.wait()
    per_process = {name: round(s / wall, 4) for name, s in cpu_delta(before, after).items()}
    return {
        "nodes": nodes,
        "calls_before": calls,
        "state": "large" if state else "fresh",
        "seconds": round(wall, 1),
        "cores": round(sum(per_process.values()), 4),
        "per_process": per_process,
    }


def median_idle(reports: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(reports[0]["per_process"])
    return {
        **{k: reports[0][k] for k in ("nodes", "calls_before", "state", "seconds")},
        "runs": len(reports),
        "cores": round(statistics.median(r["cores"] for r in reports), 4),
        "per_process": {
            n: round(statistics.median(r["per_process"].get(n, 0.0) for r in reports), 4)
            for n in names
        },
    }


def format_idle(report: dict[str, Any]) -> str:
    lines = [
        f"idle cluster ({report['state']} state), {report['nodes']} nodes, "
        f"after {report['calls_before']} calls: "
        f"{report['cores']:.4f} cores over {report['seconds']:.0f} s "
        f"(median of {report.get('runs', 1)})"
    ]
    lines += [f"  {name:12s} {cores:.4f}" for name, cores in report["per_process"].items()]
    return "\n".join(lines)
