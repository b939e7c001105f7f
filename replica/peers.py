"""The replica's peers: one outbound link to each other member, the inbound streams they
open to us, and mempool gossip.

`PeerNetwork` owns all of it: the links (`quorumgate.replica.transport.PeerLink`, one
bounded queue and stream each), how many inbound streams each member holds open, and the
batch of transactions waiting to be gossiped. The consensus shell hands it messages to send
and receives, through `on_message`, every message a peer streams to us.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto import consensus_pb2_grpc as pb_grpc
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.replica.metrics import ReplicaMetrics
from quorumgate.replica.transport import PeerLink

GOSSIP_BATCH_TXS_MAX = 512


class PeerNetwork:
    def __init__(
        self,
        spec: ClusterSpec,
        index: int,
        metrics: ReplicaMetrics,
        on_message: Callable[[pb.ConsensusMessage], None],
    ) -> None:
        self.spec = spec
        self.index = index
        self.metrics = metrics
        self.on_message = on_message
        self._links: dict[int, PeerLink] = {}
        self._inbound: dict[int, int] = {}  # member -> inbound streams open now
        self._gossip: list[bytes] = []

    def start(self) -> None:
        for m in self.spec.members:
            if m.index != self.index:
                link = PeerLink(m.index, m.replica_address, self.metrics.send_queue_drops.inc)
                link.start()
                self._links[m.index] = link

    async def stop(self) -> None:
        for link in self._links.values():
            await link.stop()

    def servicer(self) -> PeerService:
        return PeerService(self)

    # ------------------------------------------------------------------ sending

    def send(self, to: int | None, message: pb.ConsensusMessage) -> None:
        """To one member, or to every other member when `to` is None."""
        if to is None:
            for link in self._links.values():
                link.send(message)
        elif to in self._links:
            self._links[to].send(message)

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

    def stream_opened(self, member: int) -> None:
        self._inbound[member] = self._inbound.get(member, 0) + 1

    def stream_closed(self, member: int) -> None:
        self._inbound[member] -= 1


class PeerService(pb_grpc.PeerServicer):  # type: ignore[misc]
    """The `Peer` gRPC service: each member streams its messages to us."""

    def __init__(self, network: PeerNetwork) -> None:
        self.network = network

    async def Stream(
        self,
        request_iterator: AsyncIterator[pb.ConsensusMessage],
        context: grpc.aio.ServicerContext,
    ) -> pb.StreamAck:
        network = self.network
        received = 0
        sender: int | None = None
        try:
            async for message in request_iterator:
                if sender is None and 0 <= message.sender < network.spec.n:
                    sender = message.sender
                    network.stream_opened(sender)
                received += 1
                network.on_message(message)
        finally:
            if sender is not None:
                network.stream_closed(sender)
        return pb.StreamAck(received=received)
