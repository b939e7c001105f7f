"""One trip to aiosqlite's thread (runtime/dbthread.py), against the installed aiosqlite: the
module reaches into its queue, so these are what would break if aiosqlite changed it."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import aiosqlite
import pytest

from quorumgate.runtime.dbthread import on_thread, transaction


@pytest.fixture
async def conn(tmp_path: Path) -> AsyncIterator[aiosqlite.Connection]:
    connection = await aiosqlite.connect(tmp_path / "t.db", isolation_level=None)
    await connection.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    try:
        yield connection
    finally:
        await connection.close()


async def rows(conn: aiosqlite.Connection) -> list[tuple[int, str]]:
    return [(int(k), str(v)) for k, v in await conn.execute_fetchall("SELECT k, v FROM t")]


async def test_work_runs_on_the_connections_thread_with_its_connection(
    conn: aiosqlite.Connection,
) -> None:
    seen: list[int] = []

    def work(c: sqlite3.Connection) -> int:
        seen.append(threading.get_ident())
        c.execute("INSERT INTO t VALUES (1, 'a')")
        return int(c.execute("SELECT count(*) FROM t").fetchone()[0])

    assert await on_thread(conn, work) == 1
    assert seen and seen[0] != threading.get_ident()
    assert await rows(conn) == [(1, "a")]  # the same connection aiosqlite's calls use


async def test_a_transaction_commits_all_its_statements(conn: aiosqlite.Connection) -> None:
    def work(c: sqlite3.Connection) -> str:
        assert c.in_transaction
        c.executemany("INSERT INTO t VALUES (?, ?)", [(1, "a"), (2, "b")])
        return "done"

    assert await transaction(conn, work, "BEGIN IMMEDIATE") == "done"
    assert not conn.in_transaction
    assert await rows(conn) == [(1, "a"), (2, "b")]


class Boom(Exception):
    pass


async def test_a_failing_transaction_writes_nothing_and_raises_here(
    conn: aiosqlite.Connection,
) -> None:
    await conn.execute("INSERT INTO t VALUES (1, 'kept')")

    def work(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO t VALUES (2, 'lost')")
        c.execute("UPDATE t SET v = 'changed' WHERE k = 1")
        raise Boom("after the writes")

    with pytest.raises(Boom, match="after the writes"):
        await transaction(conn, work)
    assert not conn.in_transaction
    assert await rows(conn) == [(1, "kept")]

    def constraint(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO t VALUES (3, 'x')")
        c.execute("INSERT INTO t VALUES (1, 'duplicate key')")

    with pytest.raises(sqlite3.IntegrityError):
        await transaction(conn, constraint)
    assert await rows(conn) == [(1, "kept")]
    await conn.execute("INSERT INTO t VALUES (2, 'after')")  # the connection goes on
    assert await rows(conn) == [(1, "kept"), (2, "after")]
