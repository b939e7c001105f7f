"""The replica's peers: one outbound link to each other member, the inbound streams they
open to us, and mempool gossip.

`PeerNetwork` owns all of it: the links (`quorumgate.replica.transport.PeerLink`, one
bounded queue and stream each), how many inbound streams each member holds open, and the
batch of transactions waiting to be gossiped. The consensus shell hands it messages to send
and receives, through `on_message`, every message a peer streams to us.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
from prometheus_client import Counter

from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto import consensus_pb2_grpc as pb_grpc
from quorumgate.proto.clusterfile import ClusterSpec, MemberSpec
from quorumgate.proto.crypto import Signer
from quorumgate.replica.metrics import ReplicaMetrics
from quorumgate.replica.transport import PeerLink
from quorumgate.runtime.channels import aio_channel, check_peer_auth, peer_auth_metadata

GOSSIP_BATCH_TXS_MAX = 512


class PeerNetwork:
    def __init__(
        self,
        spec: ClusterSpec,
        index: int,
        signers: Callable[[], Sequence[Signer]],
        key_of: Callable[[int], bytes],
        metrics: ReplicaMetrics,
        on_message: Callable[[pb.ConsensusMessage], None],
    ) -> None:
        """`signers`: the consensus keys we hold, the current epoch's first, to open our
        streams with; `key_of`: a member's consensus key in our current epoch, the one its
        streams to us must be signed with (docs/consensus/epochs.md, "The live replica")."""
        self.spec = spec
        self.index = index
        self.signers = signers
        self.key_of = key_of
        self.metrics = metrics
        self.on_message = on_message
        self._links: dict[int, PeerLink] = {}
        self._inbound: dict[int, int] = {}  # member -> inbound streams open now
        # Inbound streams open now: the task reading each, with the member and the key
        # that opened it, so a stream opened with a key rotated out can be ended.
        self._streams: dict[asyncio.Task[int], tuple[int, bytes]] = {}
        self._gossip: list[bytes] = []
        self._sent_by_kind: dict[str, Counter] = {}  # metric children, looked up once

    def start(self) -> None:
        for m in self.spec.members:
            if m.index != self.index:
                self._open_link(m.index)

    def _open_link(self, index: int) -> None:
        link = PeerLink(
            index,
            functools.partial(aio_channel, self.spec, index, "replica"),
            self.metrics.send_queue_drops.inc,
            functools.partial(self._stream_metadata, index),
        )
        link.start()
        self._links[index] = link

    def follow_now(self, spec: ClusterSpec) -> None:
        """Before `start`: the cluster as it stands in the epoch we start in."""
        assert not self._links, "before start"
        self.spec = spec

    async def follow(self, spec: ClusterSpec) -> list[int]:
        """At an epoch boundary: the cluster as it stands in the new epoch. Each member
        now at another address or with another TLS certificate (a `replace`: a new
        machine) gets a new link there; the link to where it was is closed, with what
        was queued on it (the new machine starts the new epoch afresh). Its streams to
        us are taken under its new key (`key_of` follows the epoch). Returns the members
        relinked."""
        old, self.spec = self.spec, spec
        moved = [
            m.index
            for m in spec.members
            if m.index != self.index
            and (m.index >= old.n or _reached(m) != _reached(old.member(m.index)))
        ]  # (an index the old epoch lacks: a member an `add` brought)
        # A member a `remove` took out: its link closes with what was queued on it.
        for index in [i for i in self._links if i >= spec.n]:
            await self._links.pop(index).stop()
        for index in moved:
            link = self._links.pop(index, None)
            if link is not None:
                await link.stop()
            self._open_link(index)
        return moved

    def _stream_metadata(self, receiver: int) -> tuple[tuple[str, str], ...]:
        now_ms = int(time.time() * 1000)
        signers = self.signers()
        return peer_auth_metadata(self.spec.chain_id, self.index, receiver, now_ms, *signers)

    async def stop(self) -> None:
        for link in self._links.values():
            await link.stop()

    def servicer(self) -> PeerService:
        return PeerService(self)

    # ------------------------------------------------------------------ sending

    def send(self, to: int | None, message: pb.ConsensusMessage) -> None:
        """To one member, or to every other member when `to` is None."""
        if to is None:
            links = list(self._links.values())
        elif to in self._links:
            links = [self._links[to]]
        else:
            return
        for link in links:
            link.send(message)
        kind = message.WhichOneof("body") or "empty"
        counter = self._sent_by_kind.get(kind)
        if counter is None:
            counter = self._sent_by_kind[kind] = self.metrics.peer_messages_sent.labels(kind)
        counter.inc(len(links))

    def gossip(self, txs: list[bytes]) -> None:
        """Queue transactions for every peer; a full batch leaves at once, the rest with
        `flush_gossip` (after each round of the core loop)."""
        self._gossip.extend(txs)
        if len(self._gossip) >= GOSSIP_BATCH_TXS_MAX:
            self.flush_gossip()

    def flush_gossip(self) -> None:
        if not self._gossip:
            return
        batch, self._gossip = self._gossip, []
        for start in range(0, len(batch), GOSSIP_BATCH_TXS_MAX):
            msg = pb.ConsensusMessage(chain_id=self.spec.chain_id, sender=self.index)
            msg.tx_batch.txs.extend(batch[start : start + GOSSIP_BATCH_TXS_MAX])
            self.send(None, msg)

    # ------------------------------------------------------------------ receiving

    def connected(self) -> list[int]:
        """Members holding at least one inbound stream open to us."""
        return sorted(p for p, count in self._inbound.items() if count > 0)

    def stream_opened(self, member: int, key: bytes, reading: asyncio.Task[int]) -> None:
        self._inbound[member] = self._inbound.get(member, 0) + 1
        self._streams[reading] = (member, key)

    def stream_closed(self, member: int, reading: asyncio.Task[int]) -> None:
        self._inbound[member] -= 1
        self._streams.pop(reading, None)

    def end_streams_of_old_keys(self) -> int:
        """After our epoch changed: end every inbound stream opened with a key its member
        no longer holds in it (a rotated-out key, which may be the reason for the
        rotation). The member's link opens a new stream, signed with its current key.
        Returns how many were ended."""
        stale = [t for t, (member, key) in self._streams.items() if self.key_of(member) != key]
        for reading in stale:
            reading.cancel()
        return len(stale)


def _reached(member: MemberSpec) -> tuple[str, int, bytes]:
    """Where and how a link reaches `member`: its address and the certificate it pins."""
    return member.host, member.replica_port, member.tls_cert


class PeerService(pb_grpc.PeerServicer):  # type: ignore[misc]
    """The `Peer` gRPC service: each member streams its messages to us."""

    def __init__(self, network: PeerNetwork) -> None:
        self.network = network

    async def Stream(
        self,
        request_iterator: AsyncIterator[pb.ConsensusMessage],
        context: grpc.aio.ServicerContext,
    ) -> pb.StreamAck:
        """A member's stream of messages to us. Who it is comes from the signed statement
        it opened the stream with, never from the messages: one naming another sender is
        dropped and counted as spoofed."""
        network = self.network
        now_ms = int(time.time() * 1000)
        metadata = context.invocation_metadata()
        sender = check_peer_auth(network.spec, network.index, metadata, now_ms, network.key_of)
        if sender is None:
            network.metrics.dropped.labels("unauthenticated_peer").inc()
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "a peer stream opens with a signed statement"
            )
        assert sender is not None
        # The messages are read in a task of their own, which the network cancels when
        # the key that opened the stream is rotated out; the stream then ends with
        # UNAUTHENTICATED, which grpc sends only from this handler (a cancelled handler
        # would leave the caller waiting for its deadline).
        reading = asyncio.ensure_future(self._read(sender, request_iterator))
        network.stream_opened(sender, network.key_of(sender), reading)
        try:
            received = await asyncio.shield(reading)
        except asyncio.CancelledError:
            if not reading.cancelled():
                reading.cancel()
                raise  # this handler itself was cancelled (the caller went away)
            network.metrics.dropped.labels("rotated_out_peer_key").inc()
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "the key that opened this stream was rotated out"
            )
            raise  # not reached: abort raises
        finally:
            network.stream_closed(sender, reading)
        return pb.StreamAck(received=received)

    async def _read(self, sender: int, request_iterator: AsyncIterator[pb.ConsensusMessage]) -> int:
        """Hand each message of `sender`'s stream to the network, each of a batch as if it
        came alone (replica/transport.py); the count read."""
        network = self.network
        received = 0
        async for message in request_iterator:
            batched = message.WhichOneof("body") == "batch"
            # A batch's own fields say nothing (replica/transport.py): each message in it
            # is checked as if it had come alone.
            for one in message.batch.messages if batched else (message,):
                received += 1
                if one.sender != sender:
                    network.metrics.dropped.labels("spoofed_sender").inc()
                elif batched and one.WhichOneof("body") == "batch":
                    network.metrics.dropped.labels("nested_batch").inc()
                else:
                    network.on_message(one)
        return received
