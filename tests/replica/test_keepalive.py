"""An idle link stays up, and a link that redials loses nothing queued after it
(replica/transport.py: `server_options`, `PeerLink`).

Every channel to a member pings its connection while idle (`KEEPALIVE_TIME_MS`), so a dead
peer is noticed. The members' gRPC servers used gRPC's default ping policy, which answers
the third ping on a connection without data with GOAWAY `too_many_pings`: a quiescent
cluster had every peer stream and client channel torn down and redialled about
once a minute, and each redial lost the next message queued.

Here a real `PeerLink` streams to a server built with the members' options, at a short
keepalive interval so the test takes seconds: the link stays idle for many intervals (the
idle time is what is tested, not a wait for a condition), then sends again, and the
message must arrive on the stream opened first. With the server's old options (the
channels' own) the stream is closed after about three pings and the link redials.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable

import grpc

from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto import consensus_pb2_grpc as pb_grpc
from quorumgate.replica.transport import PeerLink
from quorumgate.runtime.links import channel_options, server_options

KEEPALIVE_MS = 500
IDLE_INTERVALS = 10  # the old policy closed the stream after about three pings
DELIVERY_WAIT_S = 10.0
POLL_S = 0.02


class CountingPeer(pb_grpc.PeerServicer):  # type: ignore[misc]
    """Records which stream each message came on; ends its first `hang_up` streams after
    their first message, as a peer that restarts would."""

    def __init__(self, hang_up: int = 0) -> None:
        self.hang_up = hang_up
        self.streams = 0
        self.received: list[int] = []  # the stream (1, 2, ...) each message came on

    async def Stream(
        self, request_iterator: AsyncIterator[pb.ConsensusMessage], context: object
    ) -> pb.StreamAck:
        self.streams += 1
        stream = self.streams
        async for _ in request_iterator:
            self.received.append(stream)
            if stream <= self.hang_up:
                break
        return pb.StreamAck(received=0)


async def eventually(check: Callable[[], bool]) -> bool:
    """Poll `check` with a bound, yielding to the loop the server and the link run on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DELIVERY_WAIT_S
    while not check():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


def message() -> pb.ConsensusMessage:
    return pb.ConsensusMessage(chain_id="keepalive-test", sender=1)


async def test_an_idle_peer_stream_is_not_closed_for_its_keepalive_pings() -> None:
    peer = CountingPeer()
    server = grpc.aio.server(options=server_options(KEEPALIVE_MS))
    pb_grpc.add_PeerServicer_to_server(peer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    connect = functools.partial(
        grpc.aio.insecure_channel, f"127.0.0.1:{port}", options=channel_options(KEEPALIVE_MS)
    )
    link = PeerLink(1, connect, on_drop=lambda: None)
    link.start()
    try:
        link.send(message())
        assert await eventually(lambda: len(peer.received) == 1)
        await asyncio.sleep(IDLE_INTERVALS * KEEPALIVE_MS / 1000)  # idle: pings only
        link.send(message())
        delivered = await eventually(lambda: len(peer.received) == 2)
        assert delivered, f"the message after the idle time never arrived: {peer.received}"
        assert peer.received == [1, 1], (
            f"the link redialled while idle (streams opened: {peer.streams}): the server "
            "closed an idle stream for its keepalive pings"
        )
        assert link.connected
    finally:
        await link.stop()
        await server.stop(None)


async def test_a_link_that_redials_delivers_every_message_queued_after_it() -> None:
    """The peer ends the link's first two streams after one message each. gRPC went on
    reading each dead stream's iterator, which took the next message queued and lost it:
    one message per dead stream, after every peer restart or GOAWAY."""
    peer = CountingPeer(hang_up=2)
    server = grpc.aio.server(options=server_options())
    pb_grpc.add_PeerServicer_to_server(peer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    connect = functools.partial(
        grpc.aio.insecure_channel, f"127.0.0.1:{port}", options=channel_options()
    )
    link = PeerLink(1, connect, on_drop=lambda: None)
    link.start()
    try:
        for k in range(1, 6):
            streams = min(k, 3)  # the first two end after one message each

            def redialled(streams: int = streams) -> bool:
                return link.connected and peer.streams >= streams

            def arrived(k: int = k) -> bool:
                return len(peer.received) == k

            assert await eventually(redialled), f"stream {streams} never opened"
            link.send(message())
            assert await eventually(arrived), (
                f"message {k} was lost: {peer.received} ({peer.streams} streams)"
            )
        assert peer.received == [1, 2, 3, 3, 3]
    finally:
        await link.stop()
        await server.stop(None)


async def test_an_ended_turn_takes_nothing_and_the_current_one_takes_everything() -> None:
    """StreamTurns.drain alone, as the sidecar's root reports use it (a deque and one
    iterator per stream): the iterator of a stream whose turn ended, still waiting where gRPC left
    it, wakes, takes nothing and stops; the next stream's iterator gets every item."""
    from collections import deque

    from quorumgate.runtime.links import StreamTurns

    turns = StreamTurns()
    queue: deque[int] = deque()

    async def reader(turn: int, into: list[int]) -> None:
        async for item in turns.drain(turn, queue):
            into.append(item)

    old: list[int] = []
    old_reader = asyncio.create_task(reader(turns.begin(), old))
    queue.append(1)
    turns.notify()
    assert await eventually(lambda: old == [1])
    turns.end()  # the stream died; its iterator is still parked in wait()
    new: list[int] = []
    new_reader = asyncio.create_task(reader(turns.begin(), new))
    for item in (2, 3, 4):
        queue.append(item)
        turns.notify()
    assert await eventually(lambda: new == [2, 3, 4]), (old, new)
    assert old == [1] and old_reader.done()
    new_reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await new_reader
