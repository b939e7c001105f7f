#!/usr/bin/env python3
"""Run seeded consensus simulations and print every failing seed.

    python scripts/simulate.py --seeds 10000 --nodes 4 7
    python scripts/simulate.py --start 5000 --seeds 200 --nodes 7 --unsafe no_safe_to_vote
    python scripts/simulate.py --twins 300 --nodes 4 --unsafe double_vote
    python scripts/simulate.py --reconfigure --seeds 300 --nodes 4 7
    python scripts/simulate.py --reconfigure --byzantine --seeds 300 --nodes 4 7
    python scripts/simulate.py --reconfigure --twins 20 --nodes 4 7
    python scripts/simulate.py --reconfigure --far-behind --seeds 50 --nodes 4 7
    python scripts/simulate.py --restore-across-boundary --seeds 100 --nodes 4 7

Each scenario is `quorumgate.replica.sim.scenario(seed, n)`: faults and Byzantine members drawn from
the seed; with --twins K, K scenarios per behaviour of the enumerated Twins adversary
(`twins_scenarios`, 0: all of them); with --reconfigure, `reconfiguration_scenario(seed, n)`:
the member set changes during the run, and in half the seeds the owner hands its record
key over (docs/consensus/epochs.md); with --far-behind too,
`far_behind_scenario`: a member held down until the others are pages past the change
block must catch up by itself; with --byzantine too,
`byzantine_reconfiguration_scenario`: f Byzantine members per epoch act across the
boundaries; with --twins K too, `twins_epoch_scenarios`: Twins schedules that cross them;
with --restore-across-boundary, `restore_across_boundary_scenario(seed, n)`: a member
restored from a backup of an earlier epoch (docs/consensus/fencing.md).
A failure prints the SimOptions that reproduce it, and the run ends with the share of
scenarios that failed, by behaviour. Exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import Counter
from pathlib import Path

from quorumgate.replica.sim import (
    SimOptions,
    Simulation,
    SimulationFailure,
    byzantine_reconfiguration_scenario,
    far_behind_scenario,
    reconfiguration_scenario,
    restore_across_boundary_scenario,
    scenario,
    twins_epoch_scenarios,
    twins_scenarios,
)

# The broken variants live with the tests, which the wheel does not install (it ships honest
# rules only): put the repository root on the path so that `tests` imports from a checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.consensus.variants import (
    BOUNDARY_RESTORE_VARIANTS,
    EPOCH_VARIANTS,
    OWNER_VARIANTS,
    VARIANTS,
)

ALL_VARIANTS = {**VARIANTS, **EPOCH_VARIANTS, **BOUNDARY_RESTORE_VARIANTS, **OWNER_VARIANTS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1000, help="scenarios per cluster size")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 7])
    parser.add_argument("--unsafe", choices=tuple(ALL_VARIANTS), help="run a broken variant")
    parser.add_argument(
        "--twins", type=int, metavar="K", help="the enumerated Twins adversary, K per behaviour"
    )
    parser.add_argument(
        "--reconfigure", action="store_true", help="scenarios that change the member set"
    )
    parser.add_argument(
        "--byzantine",
        action="store_true",
        help="with --reconfigure: Byzantine members act across the epoch boundaries",
    )
    parser.add_argument(
        "--far-behind",
        action="store_true",
        help="with --reconfigure: a member held down until the others are pages past the change",
    )
    parser.add_argument(
        "--restore-across-boundary",
        action="store_true",
        help="a member restored from a backup taken before an epoch boundary",
    )
    parser.add_argument("--real-crypto", action="store_true", help="Ed25519, not the stand-in")
    args = parser.parse_args()
    if args.byzantine and (not args.reconfigure or args.twins is not None):
        parser.error("--byzantine goes with --reconfigure (Twins schedules are Byzantine already)")
    if args.far_behind and (not args.reconfigure or args.byzantine or args.twins is not None):
        parser.error("--far-behind goes with --reconfigure alone")
    started = time.perf_counter()
    runs: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    unsafe: Counter[str] = Counter()  # failures of a safety check (the rest: liveness)
    excused = 0  # passed safety; liveness not owed (more than f faults at the end)
    for n in args.nodes:
        seeds = range(args.start, args.start + args.seeds)
        if args.twins is not None and args.reconfigure:
            scenarios = twins_epoch_scenarios(n, per_behaviour=args.twins or None)
        elif args.twins is not None:
            scenarios = twins_scenarios(n, per_behaviour=args.twins or None)
        elif args.far_behind:
            scenarios = [far_behind_scenario(seed, n) for seed in seeds]
        elif args.restore_across_boundary:
            scenarios = [restore_across_boundary_scenario(seed, n) for seed in seeds]
        elif args.reconfigure and args.byzantine:
            scenarios = [byzantine_reconfiguration_scenario(seed, n) for seed in seeds]
        elif args.reconfigure:
            scenarios = [reconfiguration_scenario(seed, n) for seed in seeds]
        else:
            scenarios = [scenario(seed, n) for seed in seeds]
        for base in scenarios:
            variant = ALL_VARIANTS[args.unsafe] if args.unsafe else None
            options = dataclasses.replace(base, unsafe=variant, fast_crypto=not args.real_crypto)
            faults = [*sorted(set(options.byzantine)), "+".join(options.reconfigure)]
            family = f"n={n} " + "+".join([f for f in faults if f] or ["honest"])
            runs[family] += 1
            outcome = run(options)
            excused += outcome == EXCUSED
            if outcome not in (None, EXCUSED):
                failed[family] += 1
                unsafe[family] += outcome.startswith("SAFETY")
        print(f"n={n}: {len(scenarios)} scenarios done", flush=True)
    for family in sorted(runs):
        share = failed[family] / runs[family]
        print(
            f"  {family}: {failed[family]}/{runs[family]} failed ({share:.1%}), "
            f"{unsafe[family]} of them a safety check"
        )
    total, failures = sum(runs.values()), sum(failed.values())
    elapsed = time.perf_counter() - started
    print(
        f"{total - failures}/{total} scenarios passed in {elapsed:.1f} s "
        f"({failures / max(total, 1):.1%} failed); {excused} of the passed owed no liveness "
        "(f Byzantine members and a restore short of its fence)"
    )
    return 1 if failures else 0


EXCUSED = "excused"


def run(options: SimOptions) -> str | None:
    """None if the scenario passed, EXCUSED if it passed every safety check but owed no
    liveness (`Simulation.faults_beyond_f`), else what failed (printed)."""
    try:
        result = Simulation(options).run()
    except SimulationFailure as failure:
        print(f"FAIL seed={options.seed} n={options.n}: {failure}", flush=True)
        return str(failure)
    return EXCUSED if result.liveness_excused else None


if __name__ == "__main__":
    sys.exit(main())
