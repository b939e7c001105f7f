"""Replica-to-replica transport: one long-lived gRPC stream to each peer.

Each replica dials every peer once and pushes its messages down a client stream
(`Peer.Stream`); the peer's server reads them. Per peer there is one send queue, bounded in
messages and in bytes; when either bound is reached the oldest messages go (consensus
tolerates loss: timeouts are re-sent and certificates travel in later messages) and the drop
is counted. A broken stream is redialled with exponential back-off.
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
from quorumgate.replica.wire import ENVELOPE_BYTES_MAX

SEND_QUEUE_MESSAGES_MAX = 8_192
SEND_QUEUE_BYTES_MAX = 64 * 1024 * 1024  # a few full blocks; a slow peer costs no more
RECONNECT_DELAY_S_MIN = 0.05
RECONNECT_DELAY_S_MAX = 2.0
GRPC_MESSAGE_BYTES_MAX = ENVELOPE_BYTES_MAX + 1024

KEEPALIVE_TIME_MS = 10_000  # an idle connection is pinged this often (a dead peer is noticed)
KEEPALIVE_TIMEOUT_MS = 5_000

GrpcOptions = tuple[tuple[str, int], ...]


def channel_options(keepalive_ms: int = KEEPALIVE_TIME_MS) -> GrpcOptions:
    """Options of every channel to a member (peers, sidecars, clients)."""
    return (
        ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
        ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Reconnects are ours to pace (exponential back-off below).
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    )


def server_options(keepalive_ms: int = KEEPALIVE_TIME_MS) -> GrpcOptions:
    """Options of a member's gRPC server (replica or sidecar): its channels' own, and a
    ping policy that accepts what those channels send. By default a gRPC server takes at
    most one ping per 5 minutes on a connection that carries no data and answers the third
    too soon with GOAWAY `too_many_pings`: an idle cluster (quiescent, issue 19) had every
    peer stream and client channel torn down and redialled about once a minute, each redial
    losing the next message queued (see StreamTurns). Pings faster than half our interval
    are still refused (the server's ping-flood defence stays)."""
    return (
        *channel_options(keepalive_ms),
        ("grpc.http2.min_ping_interval_without_data_ms", keepalive_ms // 2),
    )


CHANNEL_OPTIONS = channel_options()
SERVER_OPTIONS = server_options()

log = logging.getLogger("quorumgate.transport")

T = TypeVar("T")


class StreamTurns:
    """Which of a link's successive client streams may take items from its queue.

    gRPC keeps reading a client stream's request iterator after the call has ended (the
    peer's GOAWAY, a restart) until the iterator yields once more, and drops what it
    yielded: a link that redialled lost the next item it queued to each dead stream. Each
    stream's iterator holds a turn (`begin`), and takes items only while `current(turn)`;
    `end` ends the turn and wakes the old iterator so it stops, taking nothing."""

    __slots__ = ("_ready", "_turn")

    def __init__(self) -> None:
        self._turn = 0
        self._ready = asyncio.Event()

    def begin(self) -> int:
        self._turn += 1
        return self._turn

    def end(self) -> None:
        self._turn += 1
        self._ready.set()

    def current(self, turn: int) -> bool:
        return turn == self._turn

    def notify(self) -> None:
        """Something was queued."""
        self._ready.set()

    async def wait(self) -> None:
        """Until something is queued or the turn ends (the caller checks which)."""
        self._ready.clear()
        await self._ready.wait()

    async def drain(self, turn: int, queue: deque[T]) -> AsyncIterator[T]:
        """Items popped from `queue`, oldest first, for as long as `turn` is current (a
        stream's request iterator; `notify` after each append to `queue`)."""
        while self.current(turn):
            while queue and self.current(turn):
                yield queue.popleft()
            await self.wait()


class PeerLink:
    """The send side of one peer: a bounded queue drained into one gRPC stream."""

    def __init__(
        self,
        peer: int,
        connect: Callable[[], grpc.aio.Channel],
        on_drop: Callable[[], None],
        metadata: Callable[[], tuple[tuple[str, str], ...]] = tuple,
    ) -> None:
        """`connect` opens a channel to the peer (TLS or not: replica/channels.py);
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
        """The queued messages, for as long as this stream is the link's (StreamTurns)."""
        async for message, size in self._turns.drain(turn, self._queue):
            self.sent += 1
            self.queued_bytes -= size
            yield message

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
