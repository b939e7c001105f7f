"""A sidecar's CPU per block in `execute_block` (sidecar/execution.py: the engine, the
leaves and their Merkle paths, the signed statement, the ledger extras), before and after
a change, in one process per run and in interleaved runs.

    python scripts/bench_execute_ab.py BEFORE AFTER [--runs 6] [--blocks 60] [--txs 64]

Each revision is checked out and laid out as `scripts/bench_ab.py` does; each run starts
a process on one revision's code that fills a small state (cluster/bench/state.py at
`--scale`), then executes `--blocks` blocks of `--txs` allowed calls (about the blocks of
`quorumgate bench --inflight 256`) and reads its own CPU time (`time.process_time`, so
other work on the machine changes the figure little) around each. Runs alternate ABBA;
the ratio of each pair is taken before the median of the ratios (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


async def measure(blocks: int, txs: int, scale: float) -> dict[str, float]:
    """CPU ms per block of `execute_block`, on this process's `quorumgate`."""
    from bench_state import CHAIN, RECEIPT_KEY, Filler, fill  # scripts/, beside this file
    from nacl.signing import SigningKey

    from quorumgate.bench.state import STATE_CAPACITIES, STATE_TOOL_CALL, StateKeys
    from quorumgate.proto.model import Proposal
    from quorumgate.sidecar.engine.core import Engine, EngineConfig
    from quorumgate.sidecar.execution import execute_block
    from quorumgate.sidecar.store import SidecarStore

    owner = SigningKey(b"qg-bench-exec/owner".ljust(32, b"."))
    config = EngineConfig(
        chain_id=CHAIN,
        owner_public_key=bytes(owner.verify_key),
        **STATE_CAPACITIES,  # type: ignore[arg-type]
    )
    engine = Engine(config)
    filler = Filler(engine, owner)
    with tempfile.TemporaryDirectory() as tmp:
        store = await SidecarStore.open(Path(tmp) / "sidecar.db", CHAIN)
        try:
            await fill(filler, scale, store)
        finally:
            await store.close()
    callers = StateKeys.make(scale).children
    cpu_ms: list[float] = []
    for b in range(blocks):
        block = filler.block(
            [
                filler.tx(
                    callers[(b * txs + i) % len(callers)],
                    Proposal(run_id="bench", tool=STATE_TOOL_CALL, target=f"https://x/{b}/{i}"),
                )
                for i in range(txs)
            ]
        )
        start = time.process_time()
        execute_block(engine, RECEIPT_KEY, 0, CHAIN, block)
        cpu_ms.append((time.process_time() - start) * 1e3)
    # the low decile too: the blocks that ran while no other process took the core's
    # caches from it, the steadiest figure on a shared machine
    return {"cpu_ms_per_block_median": statistics.median(cpu_ms),
            "cpu_ms_per_block_p10": statistics.quantiles(cpu_ms, n=10)[0]}  # fmt: skip


def run(shim: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{HERE}"}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure", "--blocks",
         str(args.blocks), "--txs", str(args.txs), "--scale", str(args.scale)],
        env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    figures: dict[str, float] = json.loads(out.stdout)
    return figures


def compare(args: argparse.Namespace) -> int:
    from bench_ab import shim, worktree  # scripts/, beside this file

    work = Path(tempfile.mkdtemp(prefix="qg-exec-ab-"))
    sides = (("before", args.before), ("after", args.after))
    trees = {label: worktree(rev, work, label) for label, rev in sides}
    shims = {label: shim(tree, work) for label, tree in trees.items()}
    figures: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    try:
        for k in range(args.runs):
            for label in ("before", "after") if k % 2 == 0 else ("after", "before"):
                figures[label].append(run(shims[label], args))
                print(f"run {k + 1} {label}: {figures[label][-1]}", file=sys.stderr, flush=True)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(HERE.parent), "worktree", "remove", "--force",
                            str(tree)], check=False, capture_output=True)  # fmt: skip
    for name in figures["before"][0]:
        b = statistics.median(f[name] for f in figures["before"])
        a = statistics.median(f[name] for f in figures["after"])
        pairs = [fa[name] / fb[name] for fa, fb in zip(figures["after"], figures["before"],
                                                      strict=True)]  # fmt: skip
        print(f"{name:28s} before {b:8.3f}  after {a:8.3f}  after/before {a / b:.3f}x  "
              f"pairs {statistics.median(pairs):.3f}x (range {min(pairs):.3f} to "
              f"{max(pairs):.3f})")  # fmt: skip
    print(f"(medians of {args.runs} interleaved runs each)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", nargs="?")
    parser.add_argument("after", nargs="?")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--blocks", type=int, default=60)
    parser.add_argument("--txs", type=int, default=64, help="calls per block")
    parser.add_argument("--scale", type=float, default=0.02, help="of the large state")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(asyncio.run(measure(args.blocks, args.txs, args.scale))))
        return 0
    if not (args.before and args.after):
        parser.error("BEFORE and AFTER revisions")
    return compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
