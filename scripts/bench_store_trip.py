"""What one trip to a sidecar store's thread costs in CPU: `SidecarStore.root_at` (one
indexed read, handed to aiosqlite's thread and back) against reading the same root from
memory, in one process, alternating in rounds so the machine's drift falls on both.

    python scripts/bench_store_trip.py [--trips 2000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench_state import CHAIN, RECEIPT_KEY, Filler  # scripts/, beside this file
from nacl.signing import SigningKey

from quorumgate.sidecar.engine.core import Engine, EngineConfig
from quorumgate.sidecar.execution import execute_block
from quorumgate.sidecar.store import SidecarStore

HEIGHTS = 64  # recorded heights the reads go round


async def measure(trips: int, rounds: int) -> dict[str, float]:
    owner = SigningKey(b"qg-bench-trip/owner".ljust(32, b"."))
    engine = Engine(EngineConfig(chain_id=CHAIN, owner_public_key=bytes(owner.verify_key)))
    filler = Filler(engine, owner)
    roots: dict[int, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = await SidecarStore.open(Path(tmp) / "sidecar.db", CHAIN)
        try:
            for _ in range(HEIGHTS):
                executed = execute_block(engine, RECEIPT_KEY, 0, CHAIN, filler.block([]))
                await store.record(executed)
                roots[executed.height] = executed.signed.state_root
            trip_us, memory_us = [], []
            for _ in range(rounds):
                start = time.process_time()
                for k in range(trips):
                    assert await store.root_at(1 + k % HEIGHTS) is not None
                trip_us.append((time.process_time() - start) / trips * 1e6)
                start = time.process_time()
                for k in range(trips):
                    assert roots.get(1 + k % HEIGHTS) is not None
                memory_us.append((time.process_time() - start) / trips * 1e6)
        finally:
            await store.close()
    return {"store_trip_cpu_us": statistics.median(trip_us),
            "memory_read_cpu_us": statistics.median(memory_us)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    figures = asyncio.run(measure(args.trips, args.rounds))
    for name, value in figures.items():
        print(f"{name:24s} {value:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
