#!/usr/bin/env python3
"""Run seeded consensus simulations and print every failing seed.

    python scripts/simulate.py --seeds 10000 --nodes 4 7
    python scripts/simulate.py --start 5000 --seeds 200 --nodes 7 --unsafe no_lock

Each scenario is `quorumgate.replica.sim.scenario(seed, n)`: faults and Byzantine members drawn from
the seed. A failure prints the SimOptions that reproduce it. Exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from quorumgate.replica.sim import UNSAFE_VARIANTS, Simulation, SimulationFailure, scenario


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1000, help="scenarios per cluster size")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 7])
    parser.add_argument("--unsafe", choices=UNSAFE_VARIANTS, help="run a broken variant")
    parser.add_argument("--real-crypto", action="store_true", help="Ed25519, not the stand-in")
    args = parser.parse_args()
    failures = 0
    started = time.perf_counter()
    for n in args.nodes:
        for seed in range(args.start, args.start + args.seeds):
            options = dataclasses.replace(
                scenario(seed, n), unsafe=args.unsafe, fast_crypto=not args.real_crypto
            )
            try:
                Simulation(options).run()
            except SimulationFailure as failure:
                failures += 1
                print(f"FAIL seed={seed} n={n}: {failure}", flush=True)
        print(f"n={n}: {args.seeds} scenarios done", flush=True)
    total = args.seeds * len(args.nodes)
    elapsed = time.perf_counter() - started
    print(f"{total - failures}/{total} scenarios passed in {elapsed:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
