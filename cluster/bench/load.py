"""The load a client offers and what it measured: closed loop (W in flight) or open loop
(a fixed rate, latency counted from each request's due time, so no coordinated omission),
the window bookkeeping every client shares (QuorumGate's and the baselines'), and the
queue-fed request streams they send on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from typing import Any, TypeVar

WARMUP_S_DEFAULT = 2.0
DRAIN_S_MAX = 10.0  # after the window, wait this long at most for what is in flight
OPEN_LOOP_OUTSTANDING_MAX = 100_000  # per client: past it a due proposal is shed, counted
OPEN_LOOP_BURST_MAX = 512  # due proposals sent per wake-up; the rest on the next
CLOSED_LOOP_POLL_S = 0.05


Q = TypeVar("Q")  # a request message


async def queued_requests(queue: asyncio.Queue[Q | None]) -> AsyncIterator[Q]:
    """A request stream fed by `queue`; None ends it."""
    while True:
        item = await queue.get()
        if item is None:
            return
        yield item


async def queued_batches(queue: asyncio.Queue[Q | None], items_max: int) -> AsyncIterator[list[Q]]:
    """As `queued_requests`, but each message is everything queued by then (at least one
    item, at most `items_max`): under load, few stream messages carry many requests."""
    while True:
        item = await queue.get()
        if item is None:
            return
        batch = [item]
        while len(batch) < items_max and not queue.empty():
            item = queue.get_nowait()
            if item is None:
                yield batch
                return
            batch.append(item)
        yield batch


@dataclass(frozen=True, slots=True)
class LoadShape:
    """One client's load: closed loop (`inflight` > 0) or open loop (`rate_per_s` > 0)."""

    inflight: int
    rate_per_s: float
    warmup_s: float
    seconds: float

    def __post_init__(self) -> None:
        if (self.inflight > 0) == (self.rate_per_s > 0):
            raise ValueError("a load is closed (inflight > 0) or open (rate > 0), not both")
        if self.inflight < 0 or self.rate_per_s < 0:
            raise ValueError("inflight and rate are not negative")
        if self.warmup_s < 0 or self.seconds <= 0:
            raise ValueError("warm-up >= 0 and a measured window > 0 seconds")

    @property
    def open_loop(self) -> bool:
        return self.rate_per_s > 0


@dataclass
class LoadResult:
    """What one client measured; latencies in ms of the completions inside the window."""

    completed: int = 0  # done (certified / committed / replied) inside the window
    committed: int = 0  # committed inside the window
    commit_ms: list[float] = field(default_factory=list)
    done_ms: list[float] = field(default_factory=list)
    submitted: int = 0
    retries: int = 0
    shed: int = 0  # open loop: due but not sent (client over its outstanding bound)
    unfinished: int = 0  # still in flight when the drain ended
    failed: dict[str, int] = field(default_factory=dict)
    next_nonces: dict[str, int] = field(default_factory=dict)  # agent name -> next nonce
    error: str = ""


class LoadLoop:
    """The client-side bookkeeping every load in this harness shares (QuorumGate's clients
    and the baselines'): which requests are due, what is in flight since when, and which
    completions fall in the measured window. No I/O and no clock: callers pass `now`."""

    def __init__(self, shape: LoadShape, t_start: float) -> None:
        self.shape = shape
        self.t_start = t_start
        self.window_start = t_start + shape.warmup_s
        self.window_end = self.window_start + shape.seconds
        self.outstanding: dict[Any, float] = {}  # key -> start (due) time
        self.result = LoadResult()
        self._scheduled = 0  # open loop: proposals whose due time has been handed out

    def due(self, now: float) -> list[float]:
        """Start times of the requests to send now."""
        if now >= self.window_end:
            return []
        if not self.shape.open_loop:
            free = self.shape.inflight - len(self.outstanding)
            return [now] * max(0, free)
        rate = self.shape.rate_per_s
        due_count = int((now - self.t_start) * rate) + 1 - self._scheduled
        starts: list[float] = []
        for _ in range(max(0, min(due_count, OPEN_LOOP_BURST_MAX))):
            start = self.t_start + self._scheduled / rate
            self._scheduled += 1
            if len(self.outstanding) + len(starts) >= OPEN_LOOP_OUTSTANDING_MAX:
                self.result.shed += 1
                continue
            starts.append(start)
        return starts

    def next_due(self) -> float | None:
        """Open loop: when the next request is due (None: closed loop)."""
        if not self.shape.open_loop:
            return None
        return self.t_start + self._scheduled / self.shape.rate_per_s

    def sent(self, key: Any, start: float) -> None:
        self.outstanding[key] = start
        self.result.submitted += 1

    def done(self, key: Any, t_commit: float, t_done: float) -> bool:
        """A request completed (`t_commit`: ordered; `t_done`: its completion, the
        certificate in full mode). False if it was not ours / not in flight."""
        start = self.outstanding.pop(key, None)
        if start is None:
            return False
        r = self.result
        if self.window_start <= t_commit < self.window_end:
            r.committed += 1
        if self.window_start <= t_done < self.window_end:
            r.completed += 1
            r.commit_ms.append((t_commit - start) * 1000)
            r.done_ms.append((t_done - start) * 1000)
        return True

    def failed(self, key: Any, reason: str) -> None:
        if self.outstanding.pop(key, None) is not None:
            self.result.failed[reason] = self.result.failed.get(reason, 0) + 1

    def finished(self, now: float) -> bool:
        return now >= self.window_end and (
            not self.outstanding or now >= self.window_end + DRAIN_S_MAX
        )


async def drive(loop: LoadLoop, send: Callable[[float], None], wake: asyncio.Event) -> None:
    """Send what `loop` says is due until it is finished. `send(start)` sends one request
    (and calls `loop.sent`); whoever completes one sets `wake`."""
    while True:
        now = time.monotonic()
        for start in loop.due(now):
            send(start)
        if loop.finished(now):
            break
        nxt = loop.next_due()
        timeout = CLOSED_LOOP_POLL_S if nxt is None else max(0.0, min(nxt - now, 0.05))
        wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout)
    loop.result.unfinished = len(loop.outstanding)


async def wait_start(start_at: Synchronized) -> float:  # type: ignore[type-arg]
    """Wait until the driver publishes the common start time; return it."""
    while True:
        t = float(start_at.value)
        if t > 0:
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(max(0.0, t - time.monotonic()))
    return t


@dataclass(frozen=True, slots=True)
class RunOptions:
    seconds: float = 10.0
    warmup_s: float = WARMUP_S_DEFAULT
    inflight: int = 256  # in all (closed loop)
    rate_per_s: float = 0.0  # in all (open loop)
    clients: int = 2
    ordering_only: bool = False

    def shape(self) -> LoadShape:
        return LoadShape(
            inflight=max(1, self.inflight // self.clients) if self.rate_per_s <= 0 else 0,
            rate_per_s=self.rate_per_s / self.clients if self.rate_per_s > 0 else 0.0,
            warmup_s=self.warmup_s,
            seconds=self.seconds,
        )
