"""`quorumgate bench --breakdown`: where one governed call's time goes (docs/benchmarks.md).

A temporary cluster is started with tracing on (`QG_TRACE_DIR`, runtime/tracing.py); one
agent makes W = 1 calls through the SDK, as an agent does: submit, then wait for the
verified f+1 certificate. Each call is followed through every process by its transaction
id and its block's height, on the one monotonic clock of the machine:

    submit -> admitted (replica accepted it) -> stored (its block, first replica)
           -> QC (first replica holding a QC for it) -> committed (first replica)
           -> executed by f+1 sidecars -> certificate verified at the client

plus the time per view (between view entries) and per store apply (the replica's SQLite
transaction with its fsync). Medians (p50) and p90 per stage, over the measured calls.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from quorumgate.proto.model import Proposal
from quorumgate.runtime.tracing import TRACE_DIR_ENV, tx_prefix
from quorumgate.sdk.client import RECEIPT_WAIT_S

STAGES = (
    ("submit -> admitted", "t0", "admitted"),
    ("admitted -> block stored", "admitted", "stored"),
    ("stored -> QC", "stored", "qc"),
    ("QC -> committed", "qc", "committed"),
    ("committed -> executed by f+1 sidecars", "committed", "executed"),
    ("executed -> certificate at the client", "executed", "cert"),
)
WARMUP_CALLS = 10


@dataclass
class Call:
    tx: str
    t0: int  # monotonic ns
    cert: int


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def parse_traces(directory: Path, f: int) -> dict[str, Any]:
    """The first time each event happened for each height (and transaction), from every
    process's trace file; `executed` is the (f+1)-th sidecar's."""
    admitted: dict[str, int] = {}
    height_of: dict[str, int] = {}
    first: dict[str, dict[int, int]] = {"stored": {}, "qc": {}, "committed": {}}
    executed: dict[int, list[int]] = defaultdict(list)
    views: dict[str, list[tuple[int, int]]] = defaultdict(list)
    applies: list[int] = []
    for path in sorted(directory.glob("*.trace")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            t, kind, fields = int(parts[0]), parts[1], parts[2:]
            if kind == "admitted":
                admitted[fields[0]] = min(t, admitted.get(fields[0], t))
            elif kind in first:
                height = int(fields[0])
                first[kind][height] = min(t, first[kind].get(height, t))
                if kind == "committed":
                    for tx in fields[1:]:
                        height_of[tx] = height
            elif kind == "executed":
                executed[int(fields[0])].append(t)
            elif kind == "view":
                views[path.stem].append((t, int(fields[0])))
            elif kind == "apply":
                applies.append(int(fields[0]))
    executed_f1 = {h: sorted(ts)[f] for h, ts in executed.items() if len(ts) > f}
    view_ms = []
    for entries in views.values():
        changes = [t for k, (t, v) in enumerate(entries) if k == 0 or v != entries[k - 1][1]]
        view_ms += [(b - a) / 1e6 for a, b in itertools.pairwise(changes)]
    return {
        "admitted": admitted,
        "height_of": height_of,
        "first": first,
        "executed": executed_f1,
        "view_ms": view_ms,
        "apply_ms": [a / 1000 for a in applies],
    }


def stage_table(calls: list[Call], traces: dict[str, Any]) -> list[dict[str, Any]]:
    rows: dict[str, list[float]] = {name: [] for name, _, _ in STAGES}
    total: list[float] = []
    for call in calls:
        height = traces["height_of"].get(call.tx)
        if height is None or call.tx not in traces["admitted"]:
            continue
        times = {
            "t0": call.t0,
            "admitted": traces["admitted"][call.tx],
            "stored": traces["first"]["stored"].get(height),
            "qc": traces["first"]["qc"].get(height),
            "committed": traces["first"]["committed"].get(height),
            "executed": traces["executed"].get(height),
            "cert": call.cert,
        }
        if any(v is None for v in times.values()):
            continue
        for name, a, b in STAGES:
            rows[name].append((times[b] - times[a]) / 1e6)
        total.append((call.cert - call.t0) / 1e6)
    out = [
        {
            "stage": name,
            "p50_ms": round(_quantile(v, 0.5), 2),
            "p90_ms": round(_quantile(v, 0.9), 2),
        }
        for name, v in rows.items()
        if v
    ]
    if total:
        out.append({"stage": "submit -> certificate (total)",
                    "p50_ms": round(_quantile(total, 0.5), 2),
                    "p90_ms": round(_quantile(total, 0.9), 2)})  # fmt: skip
    for name, key in (("time per view", "view_ms"), ("store apply (with fsync)", "apply_ms")):
        values = traces[key]
        if values:
            out.append({"stage": name, "p50_ms": round(_quantile(values, 0.5), 2),
                        "p90_ms": round(_quantile(values, 0.9), 2)})  # fmt: skip
    return out


async def w1_calls(spec: ClusterSpec, count: int, poll: bool = False) -> list[Call]:
    from nacl.signing import SigningKey

    from quorumgate.sdk import client as sdk_client
    from quorumgate.sdk.client import Client

    # `poll`: the client asks GetReceipt again and again, as it did before the long poll
    # (a sidecar asked with no wait answers at once): the A/B of the long poll's gain
    sdk_client.RECEIPT_WAIT_S = 0.0 if poll else RECEIPT_WAIT_S

    key = SigningKey.generate()
    await register_bench_agent(spec, key)
    async with Client(spec, key) as agent:
        return await timed_calls(agent, count, WARMUP_CALLS)


async def register_bench_agent(spec: ClusterSpec, key: Any) -> None:
    """`bench-agent` with `key`, allowed the one read tool `bench.call`, at full speed."""
    from quorumgate.sdk.builders import mandate, tool_spec
    from quorumgate.sdk.client import Client

    async with Client.as_owner(spec.directory) as owner:
        await owner.register_tool(tool_spec("bench.call", "read", schemes=["https"]))
        await owner.register_agent("bench-agent", bytes(key.verify_key))
        await owner.set_mandate("bench-agent", mandate(["bench.call"]))
        await owner.set_settings({"quota_agent_per_minute": 0})  # an agent at full speed


async def timed_calls(agent: Any, count: int, warmup: int) -> list[Call]:
    """`warmup` + `count` governed calls one at a time (W = 1), each timed from submit to
    its verified certificate; the last `count` are returned."""
    import time

    calls: list[Call] = []
    for k in range(count + warmup):
        payload = Proposal(run_id="breakdown", tool="bench.call", target="https://e.x/a")
        t0 = time.monotonic_ns()
        submitted = await agent.submit(payload)
        decision = await agent.await_certificate(submitted.proposal_id)
        t_cert = time.monotonic_ns()
        if not decision.allowed:
            raise RuntimeError(f"the bench call was not allowed ({decision.reason})")
        if k >= warmup:
            calls.append(Call(tx_prefix(submitted.proposal_id), t0, t_cert))
    return calls


def run_breakdown(
    nodes: int,
    calls: int,
    progress: Any = print,
    *,
    poll: bool = False,
    state: bool = False,
    sized_for_state: bool = False,
) -> dict[str, Any]:
    """`state`: the cluster is first filled with the large state (bench/state.py);
    `sized_for_state`: it has that state's capacities without the state, so that a fresh
    and a filled cluster differ only in what they hold. Otherwise the default capacities."""
    from quorumgate.bench.state import STATE_CAPACITIES, fill_large_state
    from quorumgate.ops.nodes import start_cluster, stop_nodes

    with tempfile.TemporaryDirectory(prefix="qg-breakdown-") as tmp:
        traces = Path(tmp) / "traces"
        traces.mkdir()
        sized = state or sized_for_state
        spec = init_cluster(
            Path(tmp) / "cluster", nodes, capacities=STATE_CAPACITIES if sized else None
        )
        previous = os.environ.get(TRACE_DIR_ENV)
        os.environ[TRACE_DIR_ENV] = str(traces)
        try:
            progress(f"starting {nodes} replicas and sidecars with tracing on")
            procs = start_cluster(spec, list(range(nodes)))
        finally:
            if previous is None:
                os.environ.pop(TRACE_DIR_ENV, None)
            else:
                os.environ[TRACE_DIR_ENV] = previous
        try:
            filled = asyncio.run(fill_large_state(spec, progress)) if state else {}
            progress(f"{calls} calls at W = 1 (after {WARMUP_CALLS} warm-up calls)")
            measured = asyncio.run(w1_calls(spec, calls, poll))
        finally:
            stop_nodes(spec, list(range(nodes)))
            for proc in procs:
                proc.wait()
        table = stage_table(measured, parse_traces(traces, spec.f))
    return {"nodes": nodes, "calls": len(measured), "stages": table, "state": filled}


def format_breakdown(report: dict[str, Any]) -> str:
    lines = [f"W = 1 latency breakdown, {report['nodes']} nodes, {report['calls']} calls",
             f"{'stage':45s} {'p50 ms':>8s} {'p90 ms':>8s}"]  # fmt: skip
    for row in report["stages"]:
        lines.append(f"{row['stage']:45s} {row['p50_ms']:8.2f} {row['p90_ms']:8.2f}")
    return "\n".join(lines)


def median_of_runs(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stage, the median over runs of each run's p50 and p90."""
    stages: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for report in reports:
        for row in report["stages"]:
            stages[row["stage"]].append(row)
    order = [row["stage"] for row in reports[0]["stages"]]
    return {
        "nodes": reports[0]["nodes"],
        "calls": sum(r["calls"] for r in reports),
        "runs": len(reports),
        "stages": [
            {
                "stage": name,
                "p50_ms": round(statistics.median(r["p50_ms"] for r in stages[name]), 2),
                "p90_ms": round(statistics.median(r["p90_ms"] for r in stages[name]), 2),
            }
            for name in order
        ],
    }
