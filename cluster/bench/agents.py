"""The governed agents the load is signed by: a pool registered once per cluster (full mode)
or fresh unregistered names (ordering only), with their next nonces.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import grpc

from quorumgate.bench.stopping import BenchError
from quorumgate.ops.loadgen import BENCH_TOOL, LoadAgent
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.runtime.channels import aio_channel
from quorumgate.sdk.owner import owner_reader

AGENT_POOL_DEFAULT = 256  # see `prepare_agent_pool` on the quota and the state size
REGISTER_OPS_PER_SUBMIT_MAX = 500  # the owner's nonce window is 1024
ACCOUNT_CALLS_IN_FLIGHT_MAX = 256
RPC_TIMEOUT_S = 5.0


async def _accounts(spec: ClusterSpec, signers: Sequence[bytes]) -> list[tuple[bool, int]]:
    """Per signer: (known to f+1 sidecars, highest next nonce any sidecar reports)."""
    known = [0] * len(signers)
    nonce = [1] * len(signers)
    answered = 0
    semaphore = asyncio.Semaphore(ACCOUNT_CALLS_IN_FLIGHT_MAX)
    reader = owner_reader(spec)  # an account answers its own key and the cluster's roles
    for m in spec.members:
        async with aio_channel(spec, m.index, "sidecar", reader=reader) as ch:
            stub = spb_grpc.SidecarStub(ch)

            async def one(i: int, stub: spb_grpc.SidecarStub = stub) -> spb.AccountReply:
                async with semaphore:
                    reply: spb.AccountReply = await stub.Account(
                        spb.AccountRequest(signer=signers[i]), timeout=RPC_TIMEOUT_S
                    )
                    return reply

            try:
                replies = await asyncio.gather(*(one(i) for i in range(len(signers))))
            except grpc.aio.AioRpcError:
                continue
        answered += 1
        for i, reply in enumerate(replies):
            if reply.known:
                known[i] += 1
                nonce[i] = max(nonce[i], reply.next_nonce)
    if answered < spec.f + 1:
        raise BenchError(f"only {answered} sidecars answered Account; {spec.f + 1} needed")
    return [(k >= spec.f + 1, n) for k, n in zip(known, nonce, strict=True)]


def prepare_agent_pool(spec: ClusterSpec, count: int) -> dict[str, int]:
    """The bench agents `bench-pool-0..count-1`, registered (with the bench tool allowed)
    where missing; returns name -> next nonce.

    How many is a trade-off the figures depend on: the engine's quota allows each agent 120
    proposals per minute of block time (more become certified `quota_exceeded` denials,
    see `outcomes`), while every registered agent is part of the state the sidecars
    serialize for each block's state root. `--agents` sets it (default 256)."""
    from quorumgate.sdk.owner import OwnerSession, agent_ops, tool_op

    names = [f"bench-pool-{i}" for i in range(count)]
    keys = [LoadAgent.from_seed(spec.chain_id, name).public_key for name in names]
    accounts = asyncio.run(_accounts(spec, keys))
    missing = [i for i, (known, _) in enumerate(accounts) if not known]
    if missing:
        session = OwnerSession(spec)
        ops = [tool_op(BENCH_TOOL)]
        for i in missing:
            ops += agent_ops(names[i], keys[i], [BENCH_TOOL])
        for k in range(0, len(ops), REGISTER_OPS_PER_SUBMIT_MAX):
            session.submit(ops[k : k + REGISTER_OPS_PER_SUBMIT_MAX])
    return {name: (1 if i in missing else accounts[i][1]) for i, name in enumerate(names)}


def fresh_agents(spec: ClusterSpec, count: int) -> dict[str, int]:
    """Ordering only: unregistered agents with fresh names (nonces start at 1)."""
    stamp = time.time_ns() % 10**12
    return {f"bench-{stamp}-{i}": 1 for i in range(count)}
