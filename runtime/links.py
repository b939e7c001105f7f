"""What every gRPC link of a member shares: the largest message, the keepalive policy, and
whose turn a redialled stream's iterator is.

Replicas, sidecars and clients all dial members, and replicas and sidecars serve them, so
these settle what every channel and server port of the cluster accepts
(docs/consensus/protocol.md, "Quiet links stay up").
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sized
from typing import TypeVar

# A consensus envelope larger than this is refused before parsing (replica/wire.py), and
# the gRPC message bound carries it with its framing. A full block of
# Limits.batch_bytes_max plus certificates fits.
ENVELOPE_BYTES_MAX = 32 * 1024 * 1024
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
    too soon with GOAWAY `too_many_pings`: an idle cluster (quiescent:
    docs/consensus/protocol.md) had every peer stream and client channel torn down and
    redialled about once a minute, each redial losing the next message queued (see
    StreamTurns). Pings faster than half our interval are still refused (the server's
    ping-flood defence stays)."""
    return (
        *channel_options(keepalive_ms),
        ("grpc.http2.min_ping_interval_without_data_ms", keepalive_ms // 2),
    )


CHANNEL_OPTIONS = channel_options()
SERVER_OPTIONS = server_options()

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
        async for _ in self.drain_when_ready(turn, queue):
            yield queue.popleft()

    async def drain_when_ready(self, turn: int, queue: Sized) -> AsyncIterator[None]:
        """`drain` for a caller that pops the items itself, several at a time if it likes:
        a step whenever `queue` holds something and `turn` is current. The caller pops at
        least one item in that step, before any await, so both still hold when it does."""
        while self.current(turn):
            while queue and self.current(turn):
                yield None
            await self.wait()
