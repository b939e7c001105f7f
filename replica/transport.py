"""Replica-to-replica transport: one long-lived gRPC stream to each peer.

Each replica dials every peer once and pushes its messages down a client stream
(`Peer.Stream`); the peer's server reads them. Per peer there is one send queue, bounded in
messages and in bytes; when either bound is reached the oldest messages go (consensus
tolerates loss: timeouts are re-sent and certificates travel in later messages) and the drop
is counted. A broken stream is redialled with exponential back-off.

What is queued when the stream takes its next message leaves as one `MessageBatch` (a
leader's proposal and its own vote, a round's votes under load), up to `BATCH_BYTES_MAX`:
each stream message costs both processes a wake-up of gRPC's threads and of the event loop
whatever its size (docs/benchmarks.md, "What a block costs each process"). A message that
is alone in the queue leaves as itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import grpc

from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto import consensus_pb2_grpc as pb_grpc
from quorumgate.runtime.links import ENVELOPE_BYTES_MAX, StreamTurns

SEND_QUEUE_MESSAGES_MAX = 8_192
SEND_QUEUE_BYTES_MAX = 64 * 1024 * 1024  # a few full blocks; a slow peer costs no more
# A batch's messages and their framing stay within one envelope's bound, so a batch fits
# every gRPC message limit a single message fits; one message larger than what is left
# waits for the next batch (alone if need be).
BATCH_BYTES_MAX = ENVELOPE_BYTES_MAX
BATCH_FRAMING_BYTES = 16  # a repeated field's tag and length, with room to spare
RECONNECT_DELAY_S_MIN = 0.05
RECONNECT_DELAY_S_MAX = 2.0
log = logging.getLogger("quorumgate.transport")

T = TypeVar("T")


class PeerLink:
    """The send side of one peer: a bounded queue drained into one gRPC stream."""

    def __init__(
        self,
        peer: int,
        connect: Callable[[], grpc.aio.Channel],
        on_drop: Callable[[], None],
        metadata: Callable[[], tuple[tuple[str, str], ...]] = tuple,
    ) -> None:
        """`connect` opens a channel to the peer (TLS or not: runtime/channels.py);
        `metadata` is sent with each new stream (the signed statement of who we are)."""
        self.peer = peer
        self._connect = connect
        self._metadata = metadata
        self._queue: deque[tuple[pb.ConsensusMessage, int]] = deque()
        self.queued_bytes = 0
        self._turns = StreamTurns()
        self._on_drop = on_drop
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.sent = 0

    def send(self, message: pb.ConsensusMessage) -> None:
        size = message.ByteSize()
        while self._queue and (
            len(self._queue) >= SEND_QUEUE_MESSAGES_MAX
            or self.queued_bytes + size > SEND_QUEUE_BYTES_MAX
        ):
            _, dropped = self._queue.popleft()
            self.queued_bytes -= dropped
            self._on_drop()
        self._queue.append((message, size))
        self.queued_bytes += size
        self._turns.notify()

    def start(self) -> None:
        assert self._task is None, "peer link started twice"
        self._task = asyncio.create_task(self._run(), name=f"peer-{self.peer}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _outgoing(self, turn: int) -> AsyncIterator[pb.ConsensusMessage]:
        """The queued messages, each stream message all that was queued (`take_batch`),
        for as long as this stream is the link's (StreamTurns)."""
        async for _ in self._turns.drain_when_ready(turn, self._queue):
            yield self.take_batch()

    def take_batch(self) -> pb.ConsensusMessage:
        """The queue's oldest message, or its oldest messages in one batch, popped."""
        message, size = self._queue.popleft()
        taken, total = [message], size + BATCH_FRAMING_BYTES
        while self._queue and total + self._queue[0][1] + BATCH_FRAMING_BYTES <= BATCH_BYTES_MAX:
            more, more_size = self._queue.popleft()
            taken.append(more)
            size += more_size
            total += more_size + BATCH_FRAMING_BYTES
        self.sent += len(taken)
        self.queued_bytes -= size
        if len(taken) == 1:
            return message
        # The batch's own fields stay empty: the receiver reads only the messages in it,
        # each checked against the stream's sender (replica/peers.py).
        batch = pb.ConsensusMessage()
        batch.batch.messages.extend(taken)
        return batch

    async def _run(self) -> None:
        delay = RECONNECT_DELAY_S_MIN
        while True:
            async with self._connect() as channel:
                stub = pb_grpc.PeerStub(channel)
                try:
                    await channel.channel_ready()
                    self.connected = True
                    delay = RECONNECT_DELAY_S_MIN
                    log.info("event=peer_connected peer=%d", self.peer)
                    outgoing = self._outgoing(self._turns.begin())
                    await stub.Stream(outgoing, metadata=self._metadata())
                except grpc.aio.AioRpcError as err:
                    log.info("event=peer_stream_closed peer=%d code=%s", self.peer, err.code().name)
                finally:
                    self.connected = False
                    self._turns.end()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_S_MAX)
