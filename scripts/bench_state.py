#!/usr/bin/env python3
"""Per-block cost of the sidecar's state, in one process: engine and store, no network.

Builds the large state of `quorumgate bench --state large` (cluster/bench/state.py:
10,100 agents, 10,000 grants, 5,000 pending cards) directly in an engine, records it in a
sidecar store, then times blocks of one allowed call each — what a sidecar does per block
at W = 1 — split into executing the block (with the state root) and recording the height
(one SQLite transaction with fsync). The same run times the same blocks on a fresh engine,
so the figures read as ratios, and does both under state version 1 (SHA-256 over the whole
state bytes, the chains of earlier releases) and 2 (the hash tree over the entries).

    python scripts/bench_state.py [--blocks 200] [--runs 3] [--scale 1.0] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from nacl.signing import SigningKey

from quorumgate.bench.state import (
    STATE_CAPACITIES,
    STATE_TOOL_CALL,
    StateKeys,
    agent_payloads,
    mandate_payloads,
    parent_payloads,
    setup_payloads,
)
from quorumgate.proto import tx
from quorumgate.proto.model import (
    Delegate,
    Proposal,
    TxPayload,
)
from quorumgate.proto.runs import RunLabels
from quorumgate.sidecar.engine.core import Engine, EngineConfig
from quorumgate.sidecar.execution import execute_block
from quorumgate.sidecar.store import SidecarStore

CHAIN = "qg-bench-state"
FILL_BLOCK_TXS = 1_000
RECEIPT_KEY = SigningKey(bytes(32))
BLOCK_STEP_MS = 10


@dataclass(frozen=True)
class FakeBlock:
    """What `execute_block` reads of a committed replica block."""

    height: int
    timestamp_ms: int
    payload: tuple[bytes, ...]
    hash: bytes


class Filler:
    """Signs transactions as clients would (nonces, run labels) for one engine."""

    def __init__(self, engine: Engine, owner: SigningKey) -> None:
        self.engine = engine
        self.owner = owner
        self.nonces: dict[bytes, int] = {}
        self.labels: dict[bytes, RunLabels] = {}
        self.height = 0
        self.time_ms = int(time.time() * 1000)

    def tx(self, key: SigningKey, payload: TxPayload) -> bytes:
        signer = bytes(key.verify_key)
        nonce = self.nonces.get(signer, 0) + 1
        self.nonces[signer] = nonce
        if isinstance(payload, Proposal | Delegate):
            run = self.labels.setdefault(signer, RunLabels()).bind(payload.run_id, nonce)
            payload = (
                Proposal(run_id=run, tool=payload.tool, target=payload.target)
                if isinstance(payload, Proposal)
                else Delegate(
                    child=payload.child,
                    run_id=run,
                    tools=payload.tools,
                    expires_at_ms=payload.expires_at_ms,
                )
            )
        return tx.build(CHAIN, nonce, payload, key)

    def block(self, txs: list[bytes]) -> FakeBlock:
        self.height += 1
        self.time_ms += BLOCK_STEP_MS
        return FakeBlock(self.height, self.time_ms, tuple(txs), bytes(32))

    async def run(self, txs: list[bytes], store: SidecarStore) -> None:
        for start in range(0, len(txs), FILL_BLOCK_TXS):
            block = self.block(txs[start : start + FILL_BLOCK_TXS])
            executed = execute_block(self.engine, RECEIPT_KEY, 0, CHAIN, block)
            refused = [
                v for v in executed.result.verdicts if v.outcome.value in ("deny", "rejected")
            ]
            if refused:
                raise SystemExit(f"fill refused: {refused[0].reason}")
            await store.record(executed)


async def fill(filler: Filler, scale: float, store: SidecarStore) -> None:
    """The preset's stages (cluster/bench/state.py), signed here and executed in order."""
    keys = StateKeys.make(scale)
    owner = filler.owner
    ops = setup_payloads(keys) + agent_payloads(keys) + mandate_payloads(keys)
    txs = [filler.tx(owner, op) for op in ops]
    expires = filler.time_ms + 3_600_000
    for i, parent in enumerate(keys.parents):
        txs += [filler.tx(parent, p) for p in parent_payloads(keys, i, expires)]
    await filler.run(txs, store)


async def measure(state_version: int, scale: float, blocks: int) -> dict[str, float]:
    owner = SigningKey(b"qg-bench-state/owner".ljust(32, b"."))
    config = EngineConfig(
        chain_id=CHAIN,
        owner_public_key=bytes(owner.verify_key),
        state_version=state_version,
        **STATE_CAPACITIES,  # type: ignore[arg-type]
    )
    engine = Engine(config)
    filler = Filler(engine, owner)
    with tempfile.TemporaryDirectory() as tmp:
        store = await SidecarStore.open(Path(tmp) / "sidecar.db", CHAIN)
        try:
            await fill(filler, scale, store)
            caller = StateKeys.make(scale).children[0]
            exec_ms, record_ms = [], []
            for b in range(blocks):
                call = Proposal(run_id="bench", tool=STATE_TOOL_CALL, target=f"https://x/{b}")
                block = filler.block([filler.tx(caller, call)])
                start = time.perf_counter()
                executed = execute_block(engine, RECEIPT_KEY, 0, CHAIN, block)
                middle = time.perf_counter()
                await store.record(executed)
                end = time.perf_counter()
                exec_ms.append((middle - start) * 1e3)
                record_ms.append((end - middle) * 1e3)
        finally:
            await store.close()
    return {
        "execute_ms": statistics.median(exec_ms),
        "record_ms": statistics.median(record_ms),
        "entries": sum(
            len(getattr(engine.state, name)) for name in ("agents", "grants", "pending")
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=200, help="timed blocks per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="of the large state")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for version in (1, 2):
        for scale in (0.0, args.scale):
            runs = [asyncio.run(measure(version, scale, args.blocks)) for _ in range(args.runs)]
            rows.append(
                {
                    "state_version": version,
                    "scale": scale,
                    "entries": runs[0]["entries"],
                    "execute_ms": round(statistics.median(r["execute_ms"] for r in runs), 3),
                    "record_ms": round(statistics.median(r["record_ms"] for r in runs), 3),
                }
            )
    if args.json:
        print(json.dumps(rows))
        return 0
    print("version  entries  execute+root ms  record ms  (medians over runs of per-block medians)")
    for row in rows:
        print(
            f"{row['state_version']:>7}  {row['entries']:>7}  {row['execute_ms']:>15.3f}  "
            f"{row['record_ms']:>9.3f}"
        )
    for version in (1, 2):
        fresh, large = [r for r in rows if r["state_version"] == version]
        total = (large["execute_ms"] + large["record_ms"]) / (
            fresh["execute_ms"] + fresh["record_ms"]
        )
        print(f"version {version}: large / fresh per block = {total:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
