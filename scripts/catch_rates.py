#!/usr/bin/env python3
"""How often the simulator catches each deliberately broken rule, by population.

    python scripts/catch_rates.py --twins 20 --seeds 300 --nodes 4 7
    python scripts/catch_rates.py --twins 20 --seeds 0 --variants no_fence

For each variant of `tests/consensus/variants.py` and each cluster size it runs
two populations, one after the other in this process: `--twins K` scenarios per
behaviour of the enumerated adversary (`twins_scenarios(n, per_behaviour=K)`) and the
random scenarios `scenario(seed, n)` of seeds 0..`--seeds`-1. A scenario catches the
variant when it fails a *safety* check (a stall does not count). It prints one markdown
row per variant and cluster size, with the share caught in each population, which
behaviours caught it, and the seconds each population took.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from quorumgate.replica.sim import (
    SimOptions,
    Simulation,
    SimulationFailure,
    scenario,
    twins_scenarios,
)

# The broken variants live with the tests, which the wheel does not install (it ships honest
# rules only): put the repository root on the path so that `tests` imports from a checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.consensus.variants import UNSAFE_VARIANTS, VARIANTS


def caught(options: SimOptions) -> bool:
    try:
        Simulation(options).run()
    except SimulationFailure as failure:
        return str(failure).startswith("SAFETY")
    return False


def rate(population: Sequence[SimOptions], variant: str) -> tuple[int, Counter[str], float]:
    """How many of `population` catch `variant`, by the scenario's Byzantine behaviours
    (and whether it restores a member from a backup), and the seconds that took."""
    started = time.perf_counter()
    hits = 0
    by: Counter[str] = Counter()
    for base in population:
        if caught(dataclasses.replace(base, unsafe=VARIANTS[variant])):
            hits += 1
            by[label(base)] += 1
    return hits, by, time.perf_counter() - started


def label(options: SimOptions) -> str:
    name = "+".join(sorted(set(options.byzantine))) or "honest"
    return f"{name} (restored)" if getattr(options, "aimed_restores", 0) else name


def share(hits: int, total: int) -> str:
    return f"{hits}/{total} ({hits / total:.1%})" if total else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--twins", type=int, default=20, help="Twins scenarios per behaviour")
    parser.add_argument("--seeds", type=int, default=300, help="random seeds per size")
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 7])
    parser.add_argument("--variants", nargs="+", choices=UNSAFE_VARIANTS, default=UNSAFE_VARIANTS)
    args = parser.parse_args()
    started = time.perf_counter()
    print("| variant | n | Twins caught | random seeds caught | caught by |")
    print("| --- | --- | --- | --- | --- |")
    for variant in args.variants:
        for n in args.nodes:
            twins = twins_scenarios(n, per_behaviour=args.twins) if args.twins else []
            seeds = [scenario(seed, n) for seed in range(args.seeds)]
            t_hits, t_by, t_s = rate(twins, variant)
            s_hits, s_by, s_s = rate(seeds, variant)
            by = ", ".join(f"{k} {v}" for k, v in (t_by + s_by).most_common())
            print(
                f"| `{variant}` | {n} | {share(t_hits, len(twins))} | "
                f"{share(s_hits, len(seeds))} | {by} | ({t_s:.0f} s + {s_s:.0f} s)",
                flush=True,
            )
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
