"""A member far behind an epoch boundary catches up by itself (docs/consensus/epochs.md,
"Catching up"): peers already in the next epoch hand it the old epoch's committed chain a
sync page at a time, each page proven by the old members' certificates and ending below
the change block, until the epoch proof fits in one answer."""

from __future__ import annotations

import os

import pytest

from quorumgate.replica.sim import Simulation, far_behind_scenario

FAR_BEHIND_SEEDS = range(200) if os.environ.get("QG_SIM_SWEEP") == "full" else range(3)


# --------------------------------------------------------------------------- the simulator


@pytest.mark.parametrize("n", [4, 7])
@pytest.mark.parametrize("seed", FAR_BEHIND_SEEDS)
def test_a_member_held_down_past_the_boundary_reaches_the_new_epoch(seed: int, n: int) -> None:
    options = far_behind_scenario(seed, n)
    result = Simulation(options).run()
    heights = set(result.committed_heights.values())
    assert len(heights) == 1, result.committed_heights
