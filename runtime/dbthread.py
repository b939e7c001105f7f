"""A whole SQLite transaction in one hop to aiosqlite's thread.

aiosqlite runs every statement on the connection's own thread: each `await conn.execute`
is a queue put, a wake of that thread and a wake of the event loop back, about 40 µs of
CPU on this machine against about 5 µs per statement when ten go in one trip
(`python scripts/bench_dbthread.py`). A sidecar recording a height made about ten such
trips and a replica applying a block about eight, for every block, in every process. The
stores' hot paths instead hand one plain function to the thread, which runs all their
statements there: one trip.

aiosqlite has no public call for this. `Connection._execute(fn, *args)` is the entry point
of its queue, with `Connection._conn` the `sqlite3.Connection` (the same in 0.20, the
oldest release pyproject.toml admits, and 0.22, the newest; the upper bound keeps an
unchecked release out), and `tests/proto/test_dbthread.py` checks this module against the
installed version, so an aiosqlite that changes it fails the tests, not a cluster.

The function runs on another thread: it may touch only the `sqlite3.Connection` it is
given and values it was handed, never the event loop or the store's Python state.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

import aiosqlite

T = TypeVar("T")
U = TypeVar("U")


async def on_thread(conn: aiosqlite.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """`work(c)` on the connection's thread, with its `sqlite3.Connection`; its result, or
    its exception raised here."""
    raw: sqlite3.Connection = conn._conn  # private: see the module docstring

    def run() -> T:
        return work(raw)

    result: T = await conn._execute(run)
    return result


async def transaction(
    conn: aiosqlite.Connection, work: Callable[[sqlite3.Connection], T], begin: str = "BEGIN"
) -> T:
    """`work(c)` inside one transaction on the connection's thread: `begin` (plain or
    IMMEDIATE), then COMMIT; on any exception, ROLLBACK and the exception raised here.
    The connection must be in autocommit mode (`isolation_level=None`), as both stores'
    are, so `begin` is the only thing that opens a transaction."""

    return await on_thread(conn, lambda c: _in_transaction(c, work, begin))


async def transaction_then(
    conn: aiosqlite.Connection,
    work: Callable[[sqlite3.Connection], T],
    then: Callable[[sqlite3.Connection], U],
    begin: str = "BEGIN",
) -> tuple[T, U]:
    """`transaction(conn, work, begin)`, then `then(c)` once it committed, in the same
    trip to the connection's thread: both results. `then` does not run if the
    transaction raised."""

    def run(c: sqlite3.Connection) -> tuple[T, U]:
        done = _in_transaction(c, work, begin)
        return done, then(c)

    return await on_thread(conn, run)


def _in_transaction(
    c: sqlite3.Connection, work: Callable[[sqlite3.Connection], T], begin: str
) -> T:
    c.execute(begin)
    try:
        result = work(c)
        c.execute("COMMIT")
    except BaseException:
        if c.in_transaction:
            c.execute("ROLLBACK")
        raise
    return result
