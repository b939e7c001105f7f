"""The replica shell's bounds against a peer that floods it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto import tx
from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    OWNER_KEY_FILE,
    RECEIPT_KEY_FILE,
    init_cluster,
    read_seed,
)
from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.model import Proposal
from quorumgate.replica import transport
from quorumgate.replica.actions import Send
from quorumgate.replica.node import (
    EVENTS_PER_BATCH_MAX,
    GOSSIP_ADMISSIONS_PER_PEER_MAX,
    INBOUND_EVENTS_PER_SOURCE_MAX,
    SYNC_SERVING_PER_PEER_MAX,
    ReplicaNode,
    _Tick,
)
from quorumgate.replica.transport import (
    SEND_QUEUE_BYTES_MAX,
    SEND_QUEUE_MESSAGES_MAX,
    PeerLink,
)
from quorumgate.replica.types import Envelope, SyncRequest, Vote
from quorumgate.replica.wire import envelope_to_pb
from quorumgate.runtime.channels import Reader, aio_channel
from quorumgate.runtime.readwaits import READ_WAITS_PER_KEY_MAX
from quorumgate.sidecar.node import Sidecar, make_sidecar
from tests.polling import until


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[ReplicaNode]:
    """Member 0 of a fresh 4-member cluster, started (it has no peers up), stopped after."""
    spec = init_cluster(tmp_path / "c", 4)
    started = ReplicaNode(spec, 0, Ed25519Signer(read_seed(spec.node_dir(0) / CONSENSUS_KEY_FILE)))
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


def test_a_send_queue_is_bounded_in_bytes_not_only_in_messages() -> None:
    """A slow peer used to cost up to 8,192 queued messages of any size: with full blocks
    that is gigabytes. The queue now keeps at most SEND_QUEUE_BYTES_MAX bytes, dropping the
    oldest, and counts what it drops."""
    drops: list[int] = []
    link = PeerLink(1, "127.0.0.1:1", lambda: drops.append(1))  # never started: no I/O
    big = pb.ConsensusMessage(chain_id="qg-test", sender=0)
    big.tx_batch.txs.extend([b"x" * 65_536] * 64)  # about 4 MiB
    size = big.ByteSize()
    sent = 3 * SEND_QUEUE_BYTES_MAX // size
    assert sent < SEND_QUEUE_MESSAGES_MAX  # the message bound alone would keep them all
    for _ in range(sent):
        link.send(big)
    assert link.queued_bytes <= SEND_QUEUE_BYTES_MAX
    assert link.queued_bytes == len(link._queue) * size
    assert len(drops) == sent - len(link._queue) > 0


def test_what_is_queued_for_a_peer_leaves_as_one_batch_in_order_within_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each stream message costs both ends a wake-up whatever its size, so what is queued
    when the stream takes its next message leaves together (replica/transport.py), in
    order, and a batch never outgrows BATCH_BYTES_MAX: what does not fit waits."""
    link = PeerLink(1, "127.0.0.1:1", lambda: None)  # never started: no I/O

    def gossip(i: int) -> pb.ConsensusMessage:
        msg = pb.ConsensusMessage(chain_id="qg-test", sender=0)
        msg.tx_batch.txs.append(bytes([i]) * 1_000)
        return msg

    alone = gossip(0)
    link.send(alone)
    assert link.take_batch() == alone and link.queued_bytes == 0

    queued = [gossip(i) for i in range(1, 4)]
    for msg in queued:
        link.send(msg)
    batch = link.take_batch()
    assert list(batch.batch.messages) == queued and (batch.chain_id, batch.sender) == ("", 0)
    assert link.queued_bytes == 0 and link.sent == 4 and not link._queue

    size = queued[0].ByteSize()
    monkeypatch.setattr(transport, "BATCH_BYTES_MAX", 2 * (size + transport.BATCH_FRAMING_BYTES))
    for msg in queued:
        link.send(msg)
    first = link.take_batch()
    assert list(first.batch.messages) == queued[:2]
    assert first.ByteSize() <= transport.BATCH_BYTES_MAX
    assert link.take_batch() == queued[2] and link.queued_bytes == 0 and link.sent == 7


async def test_sync_requests_are_answered_a_bounded_number_at_a_time(node: ReplicaNode) -> None:
    """One task per SyncRequest, unbounded, was a peer's way to make us read the store as
    often as it liked; now at most SYNC_SERVING_PER_PEER_MAX run per peer, the rest are
    dropped and counted."""
    spec = node.spec
    request = envelope_to_pb(Envelope(spec.chain_id, 1, SyncRequest(1, 16)))
    for _ in range(100):
        node.on_peer_message(request)  # no await between them: none can finish
    busy = node.metrics.dropped.labels("sync_busy")._value.get()
    assert busy == 100 - SYNC_SERVING_PER_PEER_MAX


async def test_a_peer_flooding_sync_requests_cannot_starve_another_peers_catch_up(
    node: ReplicaNode,
) -> None:
    """The bound above was one for all peers: a Byzantine member that kept it full (a
    flood of requests, each holding a slot while the store is read) had every honest
    member's catch-up request dropped as `sync_busy`, at every replica it flooded, and a
    replica left behind could then never catch up. Each member now has slots of its own."""
    spec = node.spec
    flood = envelope_to_pb(Envelope(spec.chain_id, 1, SyncRequest(1, 16)))
    for _ in range(100):
        node.on_peer_message(flood)
    dropped = node.metrics.dropped.labels("sync_busy")
    flooded = dropped._value.get()
    assert flooded == 100 - SYNC_SERVING_PER_PEER_MAX
    honest = envelope_to_pb(Envelope(spec.chain_id, 2, SyncRequest(1, 16)))
    node.on_peer_message(honest)  # still no await: the flood's answers still run
    assert dropped._value.get() == flooded, "the honest member's request was dropped"


async def test_a_repeated_sync_request_is_answered_once(
    node: ReplicaNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same catch-up request, sent again as soon as its answer leaves, was read from
    the store and answered every time (a 60-byte request for up to 16 MiB). An honest
    member asks a peer the same thing again only after `sync_retry_ticks` without an
    answer, so a repeat sooner is dropped (`sync_repeat`), not answered twice."""
    answers: list[Send] = []
    monkeypatch.setattr(node, "_send", answers.append)
    request = envelope_to_pb(Envelope(node.spec.chain_id, 1, SyncRequest(1, 16)))
    for _ in range(10):
        node.on_peer_message(request)
        await until("the answer is sent", lambda: node._sync_serving.get(1, 0) == 0)
    assert len(answers) == 1
    assert node.metrics.dropped.labels("sync_repeat")._value.get() == 9
    other = envelope_to_pb(Envelope(node.spec.chain_id, 1, SyncRequest(1, 8)))
    node.on_peer_message(other)  # another question is answered at once
    await until("the answer is sent", lambda: node._sync_serving.get(1, 0) == 0)
    assert len(answers) == 2


async def test_a_peer_flooding_messages_cannot_crowd_out_another_peers_or_our_ticks(
    node: ReplicaNode,
) -> None:
    """The core loop's inbound queue was one for all: a member streaming messages faster
    than the core judged them (each vote costs an Ed25519 check) filled it, and then every
    other member's votes and proposals, and this replica's own pacemaker ticks, were
    dropped as `inbound_full` — one faulty member could stall every honest one. Each
    source now has its own bound, and the core loop takes from the sources in turn."""
    spec = node.spec

    def vote(sender: int, view: int) -> pb.ConsensusMessage:
        junk = Vote(view, 1, bytes(32), sender, bytes(64))
        return envelope_to_pb(Envelope(spec.chain_id, sender, junk))

    flood = INBOUND_EVENTS_PER_SOURCE_MAX + 1_000
    for view in range(flood):  # no await between them: the core loop takes none
        node.on_peer_message(vote(1, view + 10))
    full = node.metrics.dropped.labels("inbound_full")
    assert full._value.get() == flood - INBOUND_EVENTS_PER_SOURCE_MAX
    node.on_peer_message(vote(2, 10))
    assert full._value.get() == flood - INBOUND_EVENTS_PER_SOURCE_MAX, "peer 2's dropped"
    assert node.enqueue(_Tick()), "our own tick was dropped"
    # The next batch the core loop takes holds peer 2's vote and the tick, whatever is
    # still queued behind them from peer 1.
    batch = node._events.take(EVENTS_PER_BATCH_MAX)
    senders = [e.sender for e in batch if isinstance(e, Envelope)]
    assert 2 in senders and any(isinstance(e, _Tick) for e in batch)


async def test_a_gossiped_batch_with_a_forged_signature_is_dropped_at_the_first_one(
    node: ReplicaNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gossip is checked inline, one Ed25519 check per transaction: a member sending
    batches of 512 forged transactions cost every replica 512 checks per message. An honest
    member gossips only what it admitted, so a signature that does not verify (or bytes
    that do not parse, or another chain) proves the sender faulty: the rest of its batch is
    dropped unchecked and the batch counted as `forged_gossip`."""
    spec = node.spec
    key = SigningKey(bytes(range(32)))
    payload = Proposal(run_id="r", tool="kb.search", target="https://example.com/")
    good = [tx.build(spec.chain_id, nonce, payload, key) for nonce in range(1, 513)]

    def forged(data: bytes) -> bytes:
        signed = tx.parse(data, verify=False).signed
        flipped = bytes([signed.signature[0] ^ 1]) + signed.signature[1:]
        return tx.encode_signed(replace(signed, signature=flipped))

    batch = pb.ConsensusMessage(chain_id=spec.chain_id, sender=1)
    batch.tx_batch.txs.extend(forged(t) for t in good)
    checks = []
    real = tx.verify_signature
    monkeypatch.setattr(tx, "verify_signature", lambda s: checks.append(1) or real(s))
    node.on_peer_message(batch)
    assert len(checks) == 1, f"{len(checks)} signatures checked"
    assert node.metrics.dropped.labels("forged_gossip")._value.get() == 1
    assert node.mempool.size == 0
    # An honest batch after it is taken whole (the check is per batch, not a ban).
    honest = pb.ConsensusMessage(chain_id=spec.chain_id, sender=2)
    honest.tx_batch.txs.extend(good[:8])
    node.on_peer_message(honest)
    # (no sidecar runs here to judge unknown signers: unchecked, they go on to the mempool)
    await until("the honest batch taken", lambda: node.mempool.size == 8)


@pytest.fixture
async def node_and_sidecar(node: ReplicaNode) -> AsyncIterator[tuple[ReplicaNode, Sidecar]]:
    """Member 0 as above, with its own sidecar running beside it."""
    sidecar = await make_sidecar(node.spec, 0)
    await sidecar.start()
    try:
        yield node, sidecar
    finally:
        await sidecar.stop()


async def test_a_member_cannot_fill_our_mempool_with_keys_nobody_registered(
    node_and_sidecar: tuple[ReplicaNode, Sidecar],
) -> None:
    """A client's transaction reaches the mempool only if our sidecar's admission check
    lets it (an unknown signer is refused), but a gossiped one went straight in. A faulty
    member gossiping validly signed transactions of fresh keys (one key each: the
    per-signer bound does not hold them) filled every honest mempool, and honest clients'
    transactions were then refused as `mempool_full`. Gossip now goes through the same
    check; signers the sidecar accepted before skip it."""
    node, _ = node_and_sidecar
    spec = node.spec
    payload = Proposal(run_id="r", tool="kb.search", target="https://example.com/")
    junk = [tx.build(spec.chain_id, 1, payload, SigningKey.generate()) for _ in range(64)]
    refused = node.metrics.dropped.labels("gossip_refused")
    for start in (0, 32):
        batch = pb.ConsensusMessage(chain_id=spec.chain_id, sender=1)
        batch.tx_batch.txs.extend(junk[start : start + 32])
        node.on_peer_message(batch)
    await until("64 refused by the sidecar", lambda: refused._value.get() == 64)
    assert node.mempool.size == 0
    await until("both judgements over", lambda: not node._gossip_admitting.get(1))
    # a third batch while none is judged any more: one peer's batches wait their turn
    # (at most GOSSIP_ADMISSIONS_PER_PEER_MAX at once), none is taken unchecked
    busy = node.metrics.dropped.labels("gossip_busy")
    for _ in range(GOSSIP_ADMISSIONS_PER_PEER_MAX + 3):
        batch = pb.ConsensusMessage(chain_id=spec.chain_id, sender=1)
        batch.tx_batch.txs.extend(junk[:8])
        node.on_peer_message(batch)
    assert busy._value.get() == 3
    await until("the rest refused", lambda: refused._value.get() == 64 + 8 * 2)
    assert node.mempool.size == 0


async def test_a_key_holds_a_bounded_number_of_committed_block_streams(node: ReplicaNode) -> None:
    """Each CommittedBlocks stream waits for the next commit and then reads the store: a
    role's key (an auditor's, say, on a tool executor's host) opening thousands of them
    made every commit cost thousands of store reads. A key now holds at most
    READ_WAITS_PER_KEY_MAX streams open; another key still gets its own."""
    spec = node.spec
    owner = Reader.of(SigningKey(read_seed(spec.directory / OWNER_KEY_FILE)))
    sidecar = Reader.of(SigningKey(read_seed(spec.node_dir(0) / RECEIPT_KEY_FILE)))
    ended: list[grpc.StatusCode] = []
    channels = [aio_channel(spec, 0, reader=owner) for _ in range(6)]
    channels.append(aio_channel(spec, 0, reader=sidecar))

    async def follow(channel: grpc.aio.Channel) -> None:
        try:
            async for _ in cpb_grpc.ReplicaStub(channel).CommittedBlocks(cpb.BlocksRequest()):
                pass
        except grpc.aio.AioRpcError as err:
            ended.append(err.code())

    def waiting() -> int:
        return len(node._commit_cond._waiters or ())

    streams = [
        asyncio.create_task(follow(channels[i % 6])) for i in range(READ_WAITS_PER_KEY_MAX + 4)
    ]
    try:
        await until("4 streams refused", lambda: ended == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 4)
        await until("the others held", lambda: waiting() == READ_WAITS_PER_KEY_MAX)
        streams.append(asyncio.create_task(follow(channels[6])))
        await until("another key's held", lambda: waiting() == READ_WAITS_PER_KEY_MAX + 1)
        assert len(ended) == 4
    finally:
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        for channel in channels:
            await channel.close()
