"""The core loop's inbound queue (replica/inbound.py): bounded per source, taken in turns."""

from __future__ import annotations

import asyncio

from quorumgate.replica.inbound import LOCAL, InboundQueue


def test_each_source_is_bounded_alone() -> None:
    q: InboundQueue[str] = InboundQueue(3, 1 << 20)
    assert all(q.put(1, f"a{i}") for i in range(3))
    assert not q.put(1, "a3")  # source 1 is full...
    assert q.put(2, "b0") and q.put(LOCAL, "tick")  # ...the others are not
    assert len(q) == 5


def test_sources_are_taken_in_turn_and_each_keeps_its_order() -> None:
    q: InboundQueue[str] = InboundQueue(100, 1 << 20)
    for i in range(5):
        q.put(1, f"a{i}")
    q.put(2, "b0")
    q.put(2, "b1")
    q.put(LOCAL, "tick")
    assert q.take(4) == ["a0", "b0", "tick", "a1"]
    assert q.take(100) == ["b1", "a2", "a3", "a4"]
    assert len(q) == 0 and q.take(10) == []


def test_a_source_that_comes_back_joins_the_end_of_the_line() -> None:
    q: InboundQueue[str] = InboundQueue(100, 1 << 20)
    q.put(1, "a0")
    q.put(2, "b0")
    assert q.take(1) == ["a0"]
    q.put(1, "a1")
    q.put(3, "c0")
    assert q.take(10) == ["b0", "a1", "c0"]


async def test_wait_returns_once_something_is_queued_and_blocks_when_empty() -> None:
    q: InboundQueue[str] = InboundQueue(10, 1 << 20)
    waiter = asyncio.create_task(q.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    q.put(4, "x")
    await asyncio.wait_for(waiter, 1.0)
    assert q.take(10) == ["x"]
    again = asyncio.create_task(q.wait())
    await asyncio.sleep(0)
    assert not again.done()  # emptied: waits again
    again.cancel()


def test_each_source_is_bounded_in_bytes_and_a_first_large_event_still_gets_in() -> None:
    q: InboundQueue[str] = InboundQueue(100, 1_000)
    assert q.put(1, "huge", 5_000)  # alone in its queue: taken, or it never could be
    assert not q.put(1, "small", 1)  # over the bound until the core takes the first
    assert q.put(2, "b", 900) and q.put(2, "c", 100) and not q.put(2, "d", 1)
    assert q.queued_bytes(2) == 1_000
    assert q.take(10) == ["huge", "b", "c"]
    assert q.queued_bytes(1) == q.queued_bytes(2) == 0
    assert q.put(1, "small", 1)
