"""The replica's inbound events: one bounded queue per source, drained in turns.

Every peer's messages and the shell's own events (ticks, new transactions, new state
roots) wait here for the core loop. One queue for all of them would let a member
that floods us fill it, so every other member's votes and proposals, and our own pacemaker
ticks, would be dropped as `inbound_full`: one faulty member could stall every honest one. Each
source now has its own bounds, in events and in bytes, and the core loop takes events from
the sources in turn, so a flood costs the flooder its own messages and delays the others'
by at most one turn. Each source's events keep their order; the core never relied on an
order across sources.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

E = TypeVar("E")

LOCAL = -1  # the source of the shell's own events


class InboundQueue(Generic[E]):
    """Per-source FIFO queues, each holding at most `per_source_max` events and
    `bytes_per_source_max` bytes (as the caller sizes them; a source's first event is
    always taken, so one message as large as the transport allows still gets through)."""

    def __init__(self, per_source_max: int, bytes_per_source_max: int) -> None:
        assert per_source_max > 0, "a source must be able to queue something"
        self.per_source_max = per_source_max
        self.bytes_per_source_max = bytes_per_source_max
        self._queues: dict[int, deque[tuple[E, int]]] = {}
        self._bytes: dict[int, int] = {}
        self._ready: deque[int] = deque()  # sources with events, in turn order
        self._size = 0
        self._nonempty = asyncio.Event()

    def __len__(self) -> int:
        return self._size

    def queued_bytes(self, source: int) -> int:
        return self._bytes.get(source, 0)

    def put(self, source: int, event: E, size: int = 0) -> bool:
        """Queue `event` of `size` bytes; False (and nothing queued) if `source` is at a
        bound."""
        queue = self._queues.get(source)
        if queue is None:
            queue = self._queues[source] = deque()
            self._bytes[source] = 0
        if len(queue) >= self.per_source_max or (
            queue and self._bytes[source] + size > self.bytes_per_source_max
        ):
            return False
        if not queue:
            self._ready.append(source)
        queue.append((event, size))
        self._bytes[source] += size
        self._size += 1
        self._nonempty.set()
        return True

    def take(self, limit: int) -> list[E]:
        """Up to `limit` events, one per source in turn (a source with more goes to the
        back of the line after each), so no source takes more than its share of a batch
        while others wait."""
        out: list[E] = []
        ready = self._ready
        while ready and len(out) < limit:
            source = ready.popleft()
            queue = self._queues[source]
            event, size = queue.popleft()
            self._bytes[source] -= size
            out.append(event)
            if queue:
                ready.append(source)
        self._size -= len(out)
        if not self._size:
            self._nonempty.clear()
        return out

    async def wait(self) -> None:
        """Until at least one event is queued."""
        await self._nonempty.wait()
