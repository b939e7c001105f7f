"""A replica restored from a backup taken before an epoch boundary, after it had signed in
the later epoch (docs/consensus/fencing.md, "Across an epoch boundary"): the seeded
scenario `restore_across_boundary_scenario` with the honest core, which must pass every
safety check, and with `fence_ignores_epochs` (a restore fenced only in the epoch its
store is in), which the scenario must catch. `QG_SIM_SWEEP=full` runs bigger ranges."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from quorumgate.replica.epochs import RestoreFence
from quorumgate.replica.sim import (
    Simulation,
    SimulationFailure,
    restore_across_boundary_scenario,
)
from tests.consensus.variants import BOUNDARY_RESTORE_VARIANTS

FULL = os.environ.get("QG_SIM_SWEEP") == "full"
# A run takes about a quarter of a second at n = 4 and twice that at n = 7.
HONEST_SEEDS = {4: range(200 if FULL else 30), 7: range(100 if FULL else 10)}
VARIANT_SEEDS = range(200 if FULL else 30)  # at n = 4


@pytest.mark.parametrize("n", [4, 7])
def test_a_restore_across_a_boundary_never_signs_twice(n: int) -> None:
    restored = 0
    for seed in HONEST_SEEDS[n]:
        sim = Simulation(restore_across_boundary_scenario(seed, n))
        sim.run()  # raises SimulationFailure on any safety (or owed liveness) failure
        restored += sum(sim.restores.aimed.values()) > 0
    # The scenario is about restores: most seeds must reach one after a boundary.
    assert restored >= len(HONEST_SEEDS[n]) // 2


def test_a_fence_that_ignores_epochs_is_caught() -> None:
    variant = BOUNDARY_RESTORE_VARIANTS["fence_ignores_epochs"]
    unsafe = 0
    for seed in VARIANT_SEEDS:
        options = replace(restore_across_boundary_scenario(seed, 4), unsafe=variant)
        try:
            Simulation(options).run()
        except SimulationFailure as failure:
            unsafe += str(failure).startswith("SAFETY")
    assert unsafe >= len(VARIANT_SEEDS) // 5


def test_a_restore_fence_reads_back_and_is_discharged_by_a_commit_of_the_view_before() -> None:
    """`restore-fence` (replica/node.py): one line; a damaged file reads as no fence (the
    restore fences again). A fence at view 10 of epoch 1 answers for the epochs after it
    once epoch 1 committed a block of view 9 or later (its change block included); a
    change block of view 8 or earlier may have been committed before the restore."""
    fence = RestoreFence(1, 10)
    assert RestoreFence.parse(fence.encode()) == fence
    for damaged in ("", "epoch=1", "epoch=1 view=x", "epoch=1 view=10 extra=2", "garbage"):
        assert RestoreFence.parse(damaged) is None
    assert fence.discharged(1, 9) and fence.discharged(1, 40)
    assert not fence.discharged(1, 8)
    assert not fence.discharged(2, 40)  # a commit of another epoch says nothing
