"""What a trip to aiosqlite's thread costs (runtime/dbthread.py): CPU per statement when
each statement is its own `await conn.execute`, against ten statements per trip through
`on_thread`. Prints medians over --runs; process CPU (both threads), not wall time.

    python scripts/bench_dbthread.py --statements 3000 --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import time

import aiosqlite

from quorumgate.runtime.dbthread import on_thread

PER_TRIP = 10


async def measure(statements: int, runs: int) -> tuple[list[float], list[float]]:
    conn = await aiosqlite.connect(":memory:", isolation_level=None)
    await conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
    sql = "INSERT OR REPLACE INTO t VALUES (?, ?)"

    def ten(c: sqlite3.Connection, first: int) -> None:
        for k in range(first, first + PER_TRIP):
            c.execute(sql, (k, b"x"))

    each: list[float] = []
    batched: list[float] = []
    try:
        for _ in range(runs):
            started = time.process_time()
            for k in range(statements):
                await conn.execute(sql, (k, b"x"))
            each.append((time.process_time() - started) / statements)
            started = time.process_time()
            for first in range(0, statements, PER_TRIP):
                await on_thread(conn, lambda c, first=first: ten(c, first))
            batched.append((time.process_time() - started) / statements)
    finally:
        await conn.close()
    return each, batched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a core dependency
        run = asyncio.run
    each, batched = run(measure(args.statements, args.runs))
    a, b = statistics.median(each) * 1e6, statistics.median(batched) * 1e6
    print(f"one trip per statement: {a:.1f} us CPU per statement (median of {args.runs})")
    print(f"{PER_TRIP} statements per trip: {b:.1f} us CPU per statement ({b / a:.2f}x)")


if __name__ == "__main__":
    main()
