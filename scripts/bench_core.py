#!/usr/bin/env python3
"""Micro-benchmark of the consensus core in the simulator (no network, no disk).

Prints, for n = 4 and n = 7, simulated committed blocks per second and the core CPU per
committed block (summed over all replicas, and per replica), each the median of several
runs, with real Ed25519 signatures. The same run measures one Ed25519 verification as a
baseline, so the figures read as "so many signature checks' worth" on any machine.

    python scripts/bench_core.py [--runs 5] [--ticks 3000] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from nacl.signing import SigningKey

from quorumgate.replica.sim import SimNode, SimOptions, Simulation


def verify_cost_us(samples: int = 2000) -> float:
    key = SigningKey(bytes(32))
    signed = key.sign(b"qg/bench" * 8)
    vk = key.verify_key
    start = time.perf_counter()
    for _ in range(samples):
        vk.verify(signed)
    return (time.perf_counter() - start) / samples * 1e6


def one_run(n: int, ticks: int, seed: int) -> tuple[float, float, int]:
    """(blocks per wall second, core CPU seconds in total, blocks committed)."""
    options = SimOptions(
        seed=seed,
        n=n,
        ticks=ticks,
        delay_ticks_max=0,
        fast_crypto=False,
        tx_per_tick_permille=1000,
    )
    sim = Simulation(options)
    core_seconds = 0.0
    original = sim._step_node

    def timed(node: SimNode, kind: str, envelope: object) -> None:
        nonlocal core_seconds
        start = time.process_time()
        original(node, kind, envelope)  # type: ignore[arg-type]
        core_seconds += time.process_time() - start

    sim._step_node = timed  # type: ignore[method-assign]
    start = time.perf_counter()
    result = sim.run()
    wall = time.perf_counter() - start
    blocks = min(result.committed_heights.values())
    return blocks / wall, core_seconds, blocks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ticks", type=int, default=3000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    verify_us = verify_cost_us()
    report: dict[str, object] = {"ed25519_verify_us": round(verify_us, 1), "runs": args.runs}
    for n in (4, 7):
        rates, per_block, per_replica = [], [], []
        for run in range(args.runs):
            rate, core_s, blocks = one_run(n, args.ticks, seed=100 + run)
            rates.append(rate)
            per_block.append(core_s / blocks * 1e6)
            per_replica.append(core_s / blocks / n * 1e6)
        report[f"n{n}"] = {
            "blocks_per_s": round(statistics.median(rates)),
            "core_cpu_us_per_block": round(statistics.median(per_block)),
            "core_cpu_us_per_block_per_replica": round(statistics.median(per_replica)),
            "per_replica_in_verifications": round(statistics.median(per_replica) / verify_us, 1),
        }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"Ed25519 verify: {verify_us:.1f} µs (baseline, same run)")
        for n in (4, 7):
            r = report[f"n{n}"]
            assert isinstance(r, dict)
            print(
                f"n={n}: {r['blocks_per_s']} simulated blocks/s, core CPU "
                f"{r['core_cpu_us_per_block']} µs/block in all, "
                f"{r['core_cpu_us_per_block_per_replica']} µs/block per replica "
                f"(= {r['per_replica_in_verifications']} signature checks)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
