"""Restores across an epoch boundary: the victim, after it signed in a later epoch, is put
back to a backup taken in an earlier one (docs/consensus/fencing.md, "Across an epoch
boundary"). The restored replica catches up, crosses the boundary again and starts the
later epoch's core with that epoch's fresh safety state: unless that start is fenced as a
restore, it signs a second time in a view it signed in before the backup was put back."""

from __future__ import annotations

import random
from dataclasses import replace

from quorumgate.replica.sim.options import SimOptions
from quorumgate.replica.sim.scenarios import reconfiguration_scenario

BOUNDARY_RESTORE_SALT = 8_191  # the draws of this scenario use their own generator
# The member-set changes of these runs: a key rotation keeps every member, so the victim
# is a member on both sides; two of them put the backup two epochs behind.
BOUNDARY_RESTORE_CHANGES: tuple[tuple[str, ...], ...] = (("rotate",), ("rotate", "rotate"))
BOUNDARY_RESTORE_TICKS_MIN = 600  # room after the change for the restores before the heal


def restore_across_boundary_scenario(seed: int, n: int) -> SimOptions:
    """`reconfiguration_scenario(seed, n)`'s network faults and crashes, with one or two key
    rotations and one equivocating Byzantine member (never the victim, the last member):
    after a boundary, the victim is restored from its last backup of an earlier epoch right
    after it voted in a view the Byzantine member leads (the leader's other block handed
    to it once its fencing ends) and, in half the seeds, once more right after it timed
    out; what it signed is held in flight past its peers' answers."""
    base = reconfiguration_scenario(seed, n)
    rng = random.Random(seed * BOUNDARY_RESTORE_SALT + n)
    return replace(
        base,
        ticks=max(base.ticks, BOUNDARY_RESTORE_TICKS_MIN),
        reconfigure=rng.choice(BOUNDARY_RESTORE_CHANGES),
        byzantine=("equivocate",),
        byzantine_members=(rng.randrange(n - 1),),
        restores_when_voting=1,
        restores_when_timing_out=rng.choice((0, 1)),
        restore_across_boundary=True,
    )
