"""`quorumgate bench`: closed-loop load against a running cluster.

Client processes (their own OS processes, so the load generator does not share an
interpreter with anything it measures) each keep `inflight / clients` signed proposals in
flight: submit on a `SubmitStream`, watch the replica's `CommittedBlocks` stream, and
submit a new proposal as soon as one commits. Reported: committed proposals per second over
the measured window (after a warm-up), and submit-to-commit latency p50/p99.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from cluster.clusterfile import ClusterSpec
from cluster.loadgen import BENCH_TOOL, LoadAgent
from qgpb import client_pb2 as cpb
from qgpb import client_pb2_grpc as cpb_grpc
from replica.transport import CHANNEL_OPTIONS
from sidecar.engine.tx import parse

WARMUP_S = 1.0
AGENTS_PER_CLIENT = 8
RESULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ClientJob:
    client: int
    address: str
    chain_id: str
    inflight: int
    warmup_s: float
    seconds: float
    agent_names: tuple[str, ...]


@dataclass(frozen=True)
class ClientResult:
    client: int
    committed: int  # committed inside the measured window
    latencies_ms: list[float]
    refused: dict[str, int]
    submitted: int


async def _client(job: ClientJob) -> ClientResult:
    agents = [LoadAgent.from_seed(job.chain_id, name) for name in job.agent_names]
    sent_at: dict[bytes, float] = {}
    latencies: list[float] = []
    refused: dict[str, int] = {}
    queue: asyncio.Queue[cpb.SubmitRequest | None] = asyncio.Queue()
    counter = 0
    committed_in_window = 0
    submitted = 0
    start = time.perf_counter()
    window_start = start + job.warmup_s
    window_end = window_start + job.seconds

    def submit_one() -> None:
        nonlocal counter, submitted
        agent = agents[counter % len(agents)]
        data, tid = agent.proposal()
        sent_at[tid] = time.perf_counter()
        counter += 1
        submitted += 1
        queue.put_nowait(cpb.SubmitRequest(tx=data, request_id=counter))

    async def requests():  # type: ignore[no-untyped-def]
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    async with grpc.aio.insecure_channel(job.address, options=CHANNEL_OPTIONS) as channel:
        stub = cpb_grpc.ReplicaStub(channel)
        status = await stub.Status(cpb.StatusRequest())
        blocks = stub.CommittedBlocks(cpb.BlocksRequest(from_height=status.committed_height + 1))
        replies = stub.SubmitStream(requests())

        async def read_replies() -> None:
            async for reply in replies:
                if not reply.accepted:
                    refused[reply.reason] = refused.get(reply.reason, 0) + 1
                    sent_at.pop(reply.proposal_id, None)
                    if time.perf_counter() < window_end:
                        submit_one()  # keep the window full (back-pressure: retry later)

        reader = asyncio.create_task(read_replies())
        for _ in range(job.inflight):
            submit_one()
        try:
            async for block in blocks:
                now = time.perf_counter()
                for tx in block.block.payload:
                    tid = parse(tx, verify=False).tx_id
                    started = sent_at.pop(tid, None)
                    if started is None:
                        continue
                    if window_start <= now <= window_end:
                        committed_in_window += 1
                        latencies.append((now - started) * 1000)
                    if now < window_end:
                        submit_one()
                if now > window_end:
                    break
        finally:
            queue.put_nowait(None)
            blocks.cancel()
            reader.cancel()
    return ClientResult(job.client, committed_in_window, latencies, refused, submitted)


def _client_process(job: ClientJob, out: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        out.put(asyncio.run(_client(job)))
    except Exception as err:  # report, never hang the parent
        out.put(err)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def register_bench_agents(spec: ClusterSpec, clients: int) -> list[tuple[str, ...]]:
    """Register the bench tool and one governed agent per load key (fresh names each run,
    so nonces start at 1), allowed exactly that tool."""
    from cluster.owner import OwnerSession, agent_ops, tool_op

    stamp = time.time_ns() % 10**12
    names = [
        tuple(f"bench-{stamp}-{c}-{i}" for i in range(AGENTS_PER_CLIENT)) for c in range(clients)
    ]
    ops = [tool_op(BENCH_TOOL)]
    for name in (n for group in names for n in group):
        ops += agent_ops(name, LoadAgent.from_seed(spec.chain_id, name).public_key, [BENCH_TOOL])
    OwnerSession(spec).submit(ops)
    return names


def run_bench(spec: ClusterSpec, seconds: float, inflight: int, clients: int) -> dict[str, object]:
    agent_names = register_bench_agents(spec, clients)
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    per_client = max(1, inflight // clients)
    procs = []
    for c in range(clients):
        member = spec.members[c % spec.n]
        job = ClientJob(
            c, member.replica_address, spec.chain_id, per_client, WARMUP_S, seconds, agent_names[c]
        )
        proc = ctx.Process(target=_client_process, args=(job, out), daemon=True)
        proc.start()
        procs.append(proc)
    results: list[ClientResult] = []
    for _ in procs:
        item = out.get(timeout=seconds + WARMUP_S + RESULT_TIMEOUT_S)
        if isinstance(item, Exception):
            raise RuntimeError(f"bench client failed: {item!r}")
        results.append(item)
    for proc in procs:
        proc.join(timeout=5)
    latencies = [ms for r in results for ms in r.latencies_ms]
    committed = sum(r.committed for r in results)
    refused: dict[str, int] = {}
    for r in results:
        for reason, count in r.refused.items():
            refused[reason] = refused.get(reason, 0) + count
    return {
        "nodes": spec.n,
        "clients": clients,
        "inflight": per_client * clients,
        "seconds": seconds,
        "committed": committed,
        "throughput_per_s": round(committed / seconds, 1),
        "p50_ms": round(percentile(latencies, 0.50), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
        "refused": refused,
    }


def bench_dir(directory: Path, seconds: float, inflight: int, clients: int) -> dict[str, object]:
    from cluster.clusterfile import load_cluster

    return run_bench(load_cluster(directory), seconds, inflight, clients)
