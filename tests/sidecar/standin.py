"""A real sidecar in the test's own process, fed committed blocks by a stand-in for its
replica: a gRPC server on the replica's address that streams the blocks a test commits
(tests/sidecar/test_sidecar_limits.py, test_sidecar_reads.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto import tx
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from quorumgate.proto.model import Proposal
from quorumgate.replica.types import Block, QuorumCert, genesis_block
from quorumgate.replica.wire import block_to_pb
from quorumgate.runtime.channels import add_server_port, aio_channel
from quorumgate.runtime.grpcutil import add_service
from quorumgate.runtime.readauth import read_auth_metadata
from quorumgate.sidecar.node import Sidecar, make_sidecar
from tests.polling import until

POLL_S = 30.0  # the bound on every wait for the sidecar to do something
RPC_S = 20.0
CALLS_PER_CHANNEL = 50  # one HTTP/2 connection carries this many of the test's calls


async def poll(check: Callable[[], bool], what: str) -> None:
    """Wait, bounded, for `check()`; the assertion names what never happened."""
    await until(what, check, POLL_S)


class StandInReplica(cpb_grpc.ReplicaServicer):  # type: ignore[misc]
    """Streams the blocks the test commits; takes state-root reports and drops them."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.blocks: list[Block] = [genesis_block(spec.chain_id)]
        self._new = asyncio.Condition()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        add_service(server, cpb_grpc.add_ReplicaServicer_to_server, self)
        add_server_port(server, self.spec, 0, "replica")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)

    async def EpochEnds(
        self, request: cpb.EpochEndsRequest, context: grpc.aio.ServicerContext
    ) -> cpb.EpochEndsReply:
        """None stored: the stand-in's chain never leaves epoch 0 (the sidecar asks once,
        to know the epoch of the next block it signs)."""
        return cpb.EpochEndsReply()

    async def commit(self, *payloads: tuple[bytes, ...]) -> int:
        """One block per payload on top of the last; returns the new top height."""
        for payload in payloads:
            parent = self.blocks[-1]
            justify = QuorumCert(parent.view, parent.height, parent.hash)
            self.blocks.append(
                Block.create(
                    self.spec.chain_id,
                    parent.hash,
                    parent.view + 1,
                    parent.height + 1,
                    justify,
                    1_000 * (parent.height + 1),
                    0,
                    payload,
                )
            )
        async with self._new:
            self._new.notify_all()
        return self.blocks[-1].height

    async def CommittedBlocks(
        self, request: cpb.BlocksRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cpb.CommittedBlock]:
        height = max(1, request.from_height)
        while True:
            async with self._new:
                await self._new.wait_for(lambda h=height: len(self.blocks) > h)
            while height < len(self.blocks):
                block = self.blocks[height]
                out = cpb.CommittedBlock(height=block.height, hash=block.hash)
                block_to_pb(block, out.block)
                yield out
                height += 1

    async def ReportStateRoots(
        self, request_iterator: AsyncIterator[spb.StateRootReport], context: Any
    ) -> pb.StreamAck:
        received = 0
        async for _ in request_iterator:
            received += 1
        return pb.StreamAck(received=received)


@dataclass
class World:
    spec: ClusterSpec
    sidecar: Sidecar
    replica: StandInReplica
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    calls: int = 0

    def stub(self) -> spb_grpc.SidecarStub:
        """A stub on a channel with room for another call (one connection holds a
        bounded number of streams at once)."""
        if self.calls % CALLS_PER_CHANNEL == 0:
            self.channels.append(aio_channel(self.spec, 0, "sidecar"))
        self.calls += 1
        return spb_grpc.SidecarStub(self.channels[-1])

    def waiting(self) -> int:
        """Reads the sidecar holds waiting for a height (each waits on this condition)."""
        return len(self.sidecar._executed._waiters or ())

    @property
    def executed(self) -> int:
        store = self.sidecar.store
        assert store is not None
        return store.executed_height


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    spec = init_cluster(tmp_path / "c", 4)
    replica = StandInReplica(spec)
    await replica.start()
    sidecar = await make_sidecar(spec, 0)
    await sidecar.start()
    w = World(spec, sidecar, replica)
    try:
        yield w
    finally:
        for channel in w.channels:
            await channel.close()
        await sidecar.stop()
        await replica.stop()


def auth(spec: ClusterSpec, key: SigningKey, method: str) -> tuple[tuple[str, str], ...]:
    return read_auth_metadata(
        spec.chain_id, method, bytes(key.verify_key), lambda m: key.sign(m).signature,
        int(time.time() * 1000),
    )  # fmt: skip


def signed_call(spec: ClusterSpec, key: SigningKey, nonce: int = 1) -> bytes:
    """A transaction `key` signed: the sidecar judges it (a stranger's is rejected), and
    its signer may read that verdict."""
    payload = Proposal(run_id="r", tool="kb.search", target="https://example.com/")
    return tx.build(spec.chain_id, nonce, payload, key)


def own(key: SigningKey, nonce: int = 1) -> spb.OwnTx:
    return spb.OwnTx(tx_id=tx.tx_id(bytes(key.verify_key), nonce), nonce=nonce)
