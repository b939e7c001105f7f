"""A replay from a snapshot reads the log's top after the snapshot is installed: the
snapshot comes from peers that may be ahead of this member's replica, so the replay waits
(bounded) for the running replica to reach the snapshot's height, and its report never
says it replayed up to a top below the store's own height."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

from quorumgate.sidecar.replay import ReplayReport, log_reaching


def tops(*answers: int | None) -> Callable[[], Awaitable[int | None]]:
    it: Iterator[int | None] = iter(answers)

    async def top() -> int | None:
        return next(it)

    return top


def test_the_replay_waits_for_the_replica_to_reach_the_snapshot() -> None:
    # The wipe drill saw it: the replica at 59 when its peers' snapshot was at 60.
    assert asyncio.run(log_reaching(tops(59, 60, 61), 59, 60)) == 60


def test_a_replica_that_stops_answering_ends_the_wait() -> None:
    assert asyncio.run(log_reaching(tops(59, None), 58, 60)) == 59


def test_the_wait_is_bounded() -> None:
    endless = tops(*([59] * 1_000))
    assert asyncio.run(log_reaching(endless, 59, 60, wait_s=0.3)) == 59


def test_a_log_already_past_the_snapshot_is_not_asked_again() -> None:
    assert asyncio.run(log_reaching(tops(), 70, 60)) == 70


def test_the_report_names_the_installed_snapshot_height() -> None:
    report = ReplayReport(node=1, from_height=1)
    assert report.snapshot_height == 0
    report.snapshot = {"height": 60}
    assert report.snapshot_height == 60
