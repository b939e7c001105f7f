"""`quorumgate bench --start --idle SECONDS`: what an idle cluster costs, and how fast it
wakes (docs/benchmarks.md).

A temporary cluster is started; it first serves `calls` governed calls at W = 1 (so that
there is a last transaction whose state root the chain must carry, as after real work),
then is left alone for `settle_s`, and the CPU time of its replicas and sidecars is read
from /proc over `seconds`. The figure is cores: CPU seconds per wall second, summed.
Then the agent, whose client stayed open all along as an orchestrator's would, makes
`WAKE_CALLS` more calls one at a time: the first is the idle cluster's wake-up (it must
not wait for a view timeout), the others are the cluster awake again.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from quorumgate.bench.breakdown import WARMUP_CALLS, register_bench_agent, timed_calls
from quorumgate.bench.procstats import cluster_pids, cpu_delta, sample_cpu
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster

IDLE_SETTLE_S = 5.0  # after the last call: the heartbeats that carry its root, and more
WAKE_CALLS = 3  # after the idle window: the first wakes the cluster, the rest compare


async def _calls_idle_wake(
    spec: ClusterSpec, calls: int, settle_s: float, seconds: float, progress: Any
) -> tuple[dict[str, float], dict[str, float], float, list[float]]:
    """CPU samples around the idle window, its length, and the wake calls' latencies (ms)."""
    from nacl.signing import SigningKey

    from quorumgate.sdk.client import Client

    key = SigningKey.generate()
    await register_bench_agent(spec, key)
    async with Client(spec, key) as agent:
        if calls:
            progress(f"{calls} calls at W = 1, then {settle_s:.0f} s to settle")
            await timed_calls(agent, calls, WARMUP_CALLS)
        await asyncio.sleep(settle_s)
        pids = cluster_pids(spec)
        progress(f"measuring {len(pids)} processes for {seconds:.0f} s")
        before = sample_cpu(pids)
        t0 = time.monotonic()
        await asyncio.sleep(seconds)  # the idle window itself, not a wait for a condition
        after = sample_cpu(pids)
        wall = time.monotonic() - t0
        wake = await timed_calls(agent, WAKE_CALLS, warmup=0)
    return before, after, wall, [(c.cert - c.t0) / 1e6 for c in wake]


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
            before, after, wall, wake_ms = asyncio.run(
                _calls_idle_wake(spec, calls, settle_s, seconds, progress)
            )
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
        "wake_ms": [round(ms, 2) for ms in wake_ms],
    }


def median_idle(reports: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(reports[0]["per_process"])
    return {
        **{k: reports[0][k] for k in ("nodes", "calls_before", "state", "seconds")},
        "runs": len(reports),
        "cores": round(statistics.median(r["cores"] for r in reports), 4),
        "wake_ms": [
            round(statistics.median(r["wake_ms"][k] for r in reports), 2)
            for k in range(len(reports[0]["wake_ms"]))
        ],
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
    first, *rest = report["wake_ms"]
    lines.append(
        f"then, one call at a time: the first (waking the cluster) {first:.1f} ms, "
        + ", ".join(f"{ms:.1f}" for ms in rest)
        + " ms for the next"
    )
    return "\n".join(lines)
