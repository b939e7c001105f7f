"""The main job: a real local cluster, signed proposals through it, and a live status.

Starts every replica of the cluster as its own process, submits signed proposals from a few
agents (streamed, to different replicas), waits until every one is committed, shows that
every replica holds the same chain, then keeps a live status table until Ctrl-C (or stops
at once with `--once`).
"""

from __future__ import annotations

import sys
import time

import grpc

from cluster.clusterfile import ClusterSpec
from cluster.loadgen import BENCH_TOOL, LoadAgent
from cluster.ops import query_status, start_cluster, stop_nodes
from cluster.owner import OwnerSession, agent_ops, tool_op
from qgpb import client_pb2 as cpb
from qgpb import client_pb2_grpc as cpb_grpc
from sidecar.engine.tx import parse

COMMIT_WAIT_S = 60.0
DEMO_AGENTS = 3


def _status_lines(spec: ClusterSpec) -> str:
    from cluster.cli import _status_table

    return _status_table([query_status(spec, i) for i in range(spec.n)])


def run_demo(spec: ClusterSpec, proposals: int, *, once: bool, refresh_s: float) -> int:
    indexes = list(range(spec.n))
    procs = start_cluster(spec, indexes)
    try:
        print(
            f"{spec.n} replicas serving on loopback (f={spec.f}); logs in {spec.directory}/node-*/"
        )
        stamp = time.time_ns() % 10**12
        names = [f"demo-{stamp}-{i}" for i in range(DEMO_AGENTS)]
        agents = [LoadAgent.from_seed(spec.chain_id, name) for name in names]
        ops = [tool_op(BENCH_TOOL)]
        for name, agent in zip(names, agents, strict=True):
            ops += agent_ops(name, agent.public_key, [BENCH_TOOL])
        OwnerSession(spec).submit(ops)
        print(f"registered tool {BENCH_TOOL} and {DEMO_AGENTS} agents allowed to use it")
        wanted: dict[bytes, int] = {}
        batches: dict[int, list[cpb.SubmitRequest]] = {i: [] for i in indexes}
        for k in range(proposals):
            data, tid = agents[k % DEMO_AGENTS].proposal()
            wanted[tid] = k
            batches[k % spec.n].append(cpb.SubmitRequest(tx=data, request_id=k))
        start_height = query_status(spec, 0).height or 0
        accepted = 0
        for i, batch in batches.items():
            with grpc.insecure_channel(spec.member(i).replica_address) as channel:
                stub = cpb_grpc.ReplicaStub(channel)
                accepted += sum(1 for r in stub.SubmitStream(iter(batch)) if r.accepted)
        print(
            f"submitted {proposals} signed proposals from {DEMO_AGENTS} agents "
            f"to all replicas; {accepted} accepted"
        )
        started = time.perf_counter()
        heights: dict[bytes, int] = {}
        with grpc.insecure_channel(spec.member(0).replica_address) as channel:
            stub = cpb_grpc.ReplicaStub(channel)
            stream = stub.CommittedBlocks(
                cpb.BlocksRequest(from_height=start_height + 1), timeout=COMMIT_WAIT_S
            )
            for block in stream:
                for tx in block.block.payload:
                    tid = parse(tx, verify=False).tx_id
                    if tid in wanted:
                        heights[tid] = block.height
                if len(heights) >= accepted:
                    stream.cancel()
                    break
        elapsed = time.perf_counter() - started
        top = max(heights.values(), default=start_height)
        print(f"all {len(heights)} committed by height {top} in {elapsed:.2f} s")
        hashes = set()
        for i in indexes:
            with grpc.insecure_channel(spec.member(i).replica_address) as channel:
                stub = cpb_grpc.ReplicaStub(channel)
                for block in stub.CommittedBlocks(cpb.BlocksRequest(from_height=top), timeout=5):
                    hashes.add(block.hash)
                    break
        verdict = "the same block" if len(hashes) == 1 else f"{len(hashes)} DIFFERENT blocks"
        print(f"at height {top} every replica holds {verdict}")
        print(_status_lines(spec))
        if once:
            return 0 if len(hashes) == 1 else 1
        print("Live status below; Ctrl-C stops the cluster.")
        while True:
            time.sleep(refresh_s)
            if sys.stdout.isatty():
                print("\x1b[2J\x1b[H" + f"QuorumGate {spec.chain_id} (Ctrl-C stops)")
            print(_status_lines(spec), flush=True)
    except KeyboardInterrupt:
        print("\nstopping...")
        return 0
    finally:
        stop_nodes(spec, indexes)
        for proc in procs:
            proc.wait()
