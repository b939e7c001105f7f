"""What a caller may hold waiting at a sidecar, and what each executed height costs the
sidecar for the callers waiting on it (sidecar/waits.py).

One real sidecar, in this process, fed committed blocks by a stand-in for its replica (a
gRPC server on the replica's address that streams the blocks the test gives it). The
attacker is a key the cluster does not know: it may read the verdicts of transactions it
signed, so it may open `Receipts` streams and `GetReceipt` long polls naming them.
"""

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
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterSpec, init_cluster, read_seed
from quorumgate.proto.model import Proposal
from quorumgate.replica.channels import add_server_port, aio_channel
from quorumgate.replica.grpcutil import add_service
from quorumgate.replica.readauth import read_auth_metadata
from quorumgate.replica.types import Block, QuorumCert, genesis_block
from quorumgate.replica.wire import block_to_pb
from quorumgate.sidecar import node as sidecar_node
from quorumgate.sidecar.node import METHOD_GET_RECEIPT, METHOD_RECEIPTS, Sidecar, make_sidecar
from quorumgate.sidecar.waits import READ_WAITS_PER_KEY_MAX, READ_WAITS_STRANGERS_MAX

POLL_S = 30.0  # the bound on every wait for the sidecar to do something
RPC_S = 20.0
LONG_WAIT_MS = 120_000  # long polls in these tests wait until the test ends them
CALLS_PER_CHANNEL = 50  # one HTTP/2 connection carries this many of the test's calls


async def poll(check: Callable[[], bool], what: str) -> None:
    """Wait, bounded, for `check()`; the assertion names what never happened."""
    deadline = time.monotonic() + POLL_S
    while not check():
        assert time.monotonic() < deadline, f"not within {POLL_S} s: {what}"
        await asyncio.sleep(0.01)


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


@dataclass
class Follower:
    """A Receipts stream read in the background: what it got, and how it ended."""

    task: asyncio.Task[None]
    got: list[spb.ReceiptBatch]
    ended: list[grpc.StatusCode]


def follow(w: World, key: SigningKey, request: spb.ReceiptsRequest) -> Follower:
    got: list[spb.ReceiptBatch] = []
    ended: list[grpc.StatusCode] = []
    stub = w.stub()

    async def read() -> None:
        try:
            async for batch in stub.Receipts(request, metadata=auth(w.spec, key, METHOD_RECEIPTS)):
                got.append(batch)
        except grpc.aio.AioRpcError as err:
            ended.append(err.code())

    return Follower(asyncio.create_task(read()), got, ended)


def long_poll(
    w: World, key: SigningKey, request: spb.ReceiptRequest
) -> asyncio.Task[spb.ReceiptReply]:
    stub = w.stub()
    metadata = auth(w.spec, key, METHOD_GET_RECEIPT)

    async def ask() -> spb.ReceiptReply:
        reply: spb.ReceiptReply = await stub.GetReceipt(request, timeout=RPC_S, metadata=metadata)
        return reply

    return asyncio.create_task(ask())


async def end(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_strangers_hold_a_bounded_number_of_receipt_streams_and_members_still_read(
    world: World,
) -> None:
    """Each stream a stranger opens (naming a transaction it signed) was held for as long
    as it stayed open, and woken, with a store read, at every executed height. Strangers
    now hold READ_WAITS_STRANGERS_MAX streams together; the rest are refused at once with
    RESOURCE_EXHAUSTED, and the owner's stream and a stranger's admitted one still get
    their verdicts."""
    w = world
    keys = [SigningKey.generate() for _ in range(READ_WAITS_STRANGERS_MAX + 8)]
    followers: list[Follower] = []
    tasks: list[asyncio.Task[None]] = []
    for key in keys:
        followers.append(follow(w, key, spb.ReceiptsRequest(from_height=1, own=[own(key)])))
        tasks.append(followers[-1].task)
        await asyncio.sleep(0)  # opened in order: the first ones are held
    try:
        await poll(
            lambda: sum(f.ended == [grpc.StatusCode.RESOURCE_EXHAUSTED] for f in followers) == 8,
            "8 of the strangers' streams refused with RESOURCE_EXHAUSTED",
        )
        await poll(lambda: w.waiting() == READ_WAITS_STRANGERS_MAX, "the rest held")
        owner = SigningKey(read_seed(w.spec.directory / OWNER_KEY_FILE))
        watcher = follow(w, owner, spb.ReceiptsRequest(from_height=1))
        tasks.append(watcher.task)
        await poll(lambda: w.waiting() == READ_WAITS_STRANGERS_MAX + 1, "the owner's held")
        await w.replica.commit((signed_call(w.spec, keys[0]),))
        await poll(lambda: bool(watcher.got) and bool(followers[0].got), "both answered")
        assert [len(b.receipts) for b in watcher.got] == [1]
        assert followers[0].got[0].receipts[0].leaf.tx_id == own(keys[0]).tx_id
        assert not followers[1].got, "a stranger read a verdict that is not its own"
    finally:
        await end(tasks)


async def test_a_long_poll_beyond_the_bound_is_answered_at_once_not_held(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One key's long polls were unbounded. A key now holds READ_WAITS_PER_KEY_MAX; a
    long poll past that is answered at once with what the sidecar has (here: nothing
    yet), as a poll is, so an honest client goes on by polling and loses nothing."""
    monkeypatch.setattr(sidecar_node, "RECEIPT_WAIT_MS_MAX", LONG_WAIT_MS)
    w = world
    key = SigningKey.generate()
    request = spb.ReceiptRequest(proposal_id=own(key).tx_id, nonce=1, wait_ms=LONG_WAIT_MS)
    polls = [long_poll(w, key, request) for _ in range(READ_WAITS_PER_KEY_MAX + 8)]
    try:
        await poll(lambda: sum(p.done() for p in polls) == 8, "8 long polls answered at once")
        answered = [p.result() for p in polls if p.done()]
        assert all(not r.found and r.executed_height == 0 for r in answered)
        await poll(lambda: w.waiting() == READ_WAITS_PER_KEY_MAX, "the rest held")
        # a held one is answered as soon as its verdict is executed
        await w.replica.commit((signed_call(w.spec, key),))
        await poll(lambda: all(p.done() for p in polls), "every held long poll answered")
        assert all(p.result().found for p in polls if p.result().executed_height >= 1)
        assert sum(p.result().found for p in polls) == READ_WAITS_PER_KEY_MAX
    finally:
        await end(polls)


async def test_a_long_poll_nobody_could_be_answered_is_refused_before_it_waits(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stranger naming a proposal it cannot prove it signed (no nonce, nothing of its
    own) is refused whatever gets executed; it used to be held for the whole wait first,
    then refused."""
    monkeypatch.setattr(sidecar_node, "RECEIPT_WAIT_MS_MAX", LONG_WAIT_MS)
    w = world
    stranger = SigningKey.generate()
    someone = SigningKey.generate()
    request = spb.ReceiptRequest(proposal_id=own(someone).tx_id, wait_ms=LONG_WAIT_MS)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await w.stub().GetReceipt(
            request, timeout=RPC_S, metadata=auth(w.spec, stranger, METHOD_GET_RECEIPT)
        )
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_an_executed_height_costs_no_store_read_per_waiting_caller(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At every executed height each waiting stream of an agent or stranger read that
    height's ledger from the store, and each waiting long poll read its receipt: a
    thousand waiting callers were two thousand store reads per height. The sidecar now
    keeps, for its recent heights, which transactions and principals each holds, and goes
    to the store only for a caller whose verdict is there."""
    monkeypatch.setattr(sidecar_node, "RECEIPT_WAIT_MS_MAX", LONG_WAIT_MS)
    w = world
    store = w.sidecar.store
    assert store is not None
    reads: dict[str, int] = {"ledger_at": 0, "receipt": 0, "receipts_at": 0}

    def counted(name: str) -> None:
        real = getattr(store, name)

        async def wrapper(*args: Any) -> Any:
            reads[name] += 1
            return await real(*args)

        monkeypatch.setattr(store, name, wrapper)

    for name in reads:
        counted(name)
    callers = 40
    keys = [SigningKey.generate() for _ in range(callers)]
    followers = [follow(w, k, spb.ReceiptsRequest(from_height=1, own=[own(k)])) for k in keys]
    polls = [
        long_poll(w, k, spb.ReceiptRequest(proposal_id=own(k).tx_id, nonce=1, wait_ms=LONG_WAIT_MS))
        for k in keys
    ]
    try:
        await poll(lambda: w.waiting() == 2 * callers, "every stream and long poll held")
        before = dict(reads)
        heights = 20
        top = await w.replica.commit(*([()] * (heights - 1)), (signed_call(w.spec, keys[0]),))
        await poll(lambda: w.executed == top, "the sidecar executed every height")
        await poll(lambda: polls[0].done() and bool(followers[0].got), "keys[0] answered")
        await poll(lambda: w.waiting() == 2 * callers - 1, "the others wait on")
        spent = {name: reads[name] - before[name] for name in reads}
        # keys[0]'s answer may read its height (a stream: ledger and receipts; the long
        # poll: its receipt); nobody else's wait reads anything
        assert spent["ledger_at"] <= 1 and spent["receipts_at"] <= 1, spent
        assert spent["receipt"] <= 1, spent
        assert polls[0].result().found
        assert followers[0].got[0].height == top
    finally:
        await end([f.task for f in followers] + polls)
