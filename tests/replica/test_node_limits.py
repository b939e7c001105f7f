"""The replica shell's bounds against a peer that floods it (issue 14, item 5)."""

from __future__ import annotations

from pathlib import Path

from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto.clusterfile import CONSENSUS_KEY_FILE, init_cluster, read_seed
from quorumgate.replica.crypto import Ed25519Signer
from quorumgate.replica.node import SYNC_SERVING_MAX, ReplicaNode
from quorumgate.replica.transport import (
    SEND_QUEUE_BYTES_MAX,
    SEND_QUEUE_MESSAGES_MAX,
    PeerLink,
)
from quorumgate.replica.types import Envelope, SyncRequest
from quorumgate.replica.wire import envelope_to_pb


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


async def test_sync_requests_are_answered_a_bounded_number_at_a_time(tmp_path: Path) -> None:
    """One task per SyncRequest, unbounded, was a peer's way to make us read the store as
    often as it liked; now at most SYNC_SERVING_MAX run, the rest are dropped and counted."""
    spec = init_cluster(tmp_path / "c", 4)
    node = ReplicaNode(spec, 0, Ed25519Signer(read_seed(spec.node_dir(0) / CONSENSUS_KEY_FILE)))
    await node.start()
    try:
        request = envelope_to_pb(Envelope(spec.chain_id, 1, SyncRequest(1, 16)))
        for _ in range(100):
            node.on_peer_message(request)  # no await between them: none can finish
        busy = node.metrics.dropped.labels("sync_busy")._value.get()
        assert busy == 100 - SYNC_SERVING_MAX
    finally:
        await node.stop()
