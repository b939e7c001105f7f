"""The scenario a seed stands for: faults and Byzantine members drawn from the seed."""

from __future__ import annotations

import random
from dataclasses import replace

from quorumgate.replica.sim.options import (
    BEHAVIOURS,
    BOUNDARY_BEHAVIOURS,
    WITHHOLDING_BEHAVIOURS,
    SimOptions,
)


def scenario(seed: int, n: int) -> SimOptions:
    """The scenario a seed stands for: faults and Byzantine members drawn from the seed.
    About half the seeds also restore the victim from a backup (the restore counts drawn
    last, so the draws before them stay what they were for every seed); not while f
    Byzantine members withhold what the honest ones need to leave a view, because a
    restored replica sits out the views it fences, which makes one fault more than
    liveness tolerates (docs/consensus/fencing.md)."""
    rng = random.Random(seed * 7919 + n)
    f = (n - 1) // 3
    k = rng.randint(0, f)
    byzantine = tuple(rng.choice(BEHAVIOURS) for _ in range(k))
    options = SimOptions(
        seed=seed,
        n=n,
        byzantine=byzantine,
        ticks=rng.choice((300, 600, 900)),
        delay_ticks_max=rng.choice((0, 1, 3, 6)),
        loss_permille=rng.choice((0, 0, 50, 200)),
        dup_permille=rng.choice((0, 50, 200)),
        partition_ticks=rng.choice((0, 0, 10, 40, 200)),
        victim_delay_ticks=rng.choice((0, 30, 60)) if "fork_leader" in byzantine else 0,
        crash_permille=rng.choice((0, 0, 1, 3)),
        crash_ticks_max=rng.choice((30, 150)),
        tx_per_tick_permille=rng.choice((100, 500, 900)),
    )
    restores = replace(
        options,
        restores_when_leading=rng.choice((0, 1, 2)),
        restores_when_voting=rng.choice((0, 1, 2)),
        restores_when_timing_out=rng.choice((0, 1)),
        restore_backup_views=rng.choice((0, 1, 2, 4)),
    )
    withholding = sum(b in WITHHOLDING_BEHAVIOURS for b in byzantine)
    return restores if rng.randrange(2) and withholding < f else options


# The member-set changes a reconfiguration scenario draws from, by starting size.
RECONFIGURATIONS: dict[int, tuple[tuple[str, ...], ...]] = {
    4: (("replace",), ("rotate",), ("add",), ("add", "remove"), ("rotate", "add")),
    7: (("replace",), ("rotate",), ("remove",), ("remove", "add"), ("replace", "remove")),
}


OWNER_RECORD_SALT = 9_973  # whether and where an `owner` record comes: its own generator


def with_owner_record(seed: int, n: int, changes: tuple[str, ...]) -> tuple[str, ...]:
    """`changes` with, in half the seeds, an `owner` record before one of them (never
    last, so that a record the new key signs must apply after it). Drawn from a generator
    of its own: a seed that draws none keeps its changes, and its run, as before."""
    rng = random.Random(seed * OWNER_RECORD_SALT + n)
    if not changes or rng.randrange(2):
        return changes
    at = rng.randrange(len(changes))
    return (*changes[:at], "owner", *changes[at:])


def reconfiguration_scenario(seed: int, n: int) -> SimOptions:
    """The scenario a seed stands for with the member set changing (docs/consensus/
    epochs.md): one or two owner changes committed at ticks drawn from the seed, and in
    half the seeds an `owner` record before one of them (then every record is signed),
    under the network's faults and crashes (no Byzantine member, no restore: see
    `SimOptions`)."""
    rng = random.Random(seed * 6007 + n)
    options = SimOptions(
        seed=seed,
        n=n,
        ticks=rng.choice((300, 600, 900)),
        delay_ticks_max=rng.choice((0, 1, 3, 6)),
        loss_permille=rng.choice((0, 0, 50, 200)),
        dup_permille=rng.choice((0, 50, 200)),
        partition_ticks=rng.choice((0, 0, 10, 40, 200)),
        crash_permille=rng.choice((0, 0, 1, 3)),
        crash_ticks_max=rng.choice((30, 150)),
        tx_per_tick_permille=rng.choice((100, 500, 900)),
        reconfigure=rng.choice(RECONFIGURATIONS[n]),
    )
    return replace(options, reconfigure=with_owner_record(seed, n, options.reconfigure))


FAR_BEHIND_SALT = 3_571  # the far-behind draws use their own generator
# The sync page of a far-behind run: small, so that the others get many pages past the
# held member in a few hundred ticks (the cluster file's smallest page is 4 blocks).
FAR_BEHIND_PAGE_BLOCKS = 8


def far_behind_scenario(seed: int, n: int) -> SimOptions:
    """A member held down from the first ticks until the heal while the others commit
    pages of blocks, then rotate a key and commit more in the new epoch: the member comes
    back several sync pages (`FAR_BEHIND_PAGE_BLOCKS`) short of the change block
    and must reach the new epoch by itself (docs/consensus/epochs.md, "Catching up").
    Mild network faults, no other crash: the others must get far."""
    rng = random.Random(seed * FAR_BEHIND_SALT + n)
    return SimOptions(
        seed=seed,
        n=n,
        ticks=rng.choice((600, 900)),
        delay_ticks_max=rng.choice((0, 1, 3)),
        loss_permille=rng.choice((0, 0, 20)),
        dup_permille=rng.choice((0, 50)),
        tx_per_tick_permille=rng.choice((500, 900)),
        reconfigure=("rotate",),
        held_member=rng.randrange(n),
        held_from_tick=rng.randint(1, 20),
        changes_from_percent=50,
        sync_blocks_max=FAR_BEHIND_PAGE_BLOCKS,
    )


BYZANTINE_RECONFIG_SALT = 7_307  # the Byzantine draws use their own generator


def byzantine_reconfiguration_scenario(seed: int, n: int) -> SimOptions:
    """`reconfiguration_scenario(seed, n)` with Byzantine members acting across the
    boundaries (docs/consensus/epochs.md, "What the simulator checks"): as many as every
    epoch's f allows, in slots drawn from the seed (a member added may be one if the new
    epoch's f has room, and a remove leaves at most f of the rest), each with a behaviour
    of `BOUNDARY_BEHAVIOURS`. The network's faults and the changes are those of the
    honest scenario of the same seed."""
    base = reconfiguration_scenario(seed, n)
    rng = random.Random(seed * BYZANTINE_RECONFIG_SALT + n)
    slots = list(range(base.slots))
    rng.shuffle(slots)
    chosen: list[int] = []
    for slot in slots:
        trial = [*chosen, slot]
        if all(sum(m < size for m in trial) <= (size - 1) // 3 for size in base.epoch_sizes):
            chosen = trial
    behaviours = tuple(rng.choice(BOUNDARY_BEHAVIOURS) for _ in chosen)
    delay = rng.choice((0, 30, 60)) if "fork_leader" in behaviours else 0
    return replace(
        base, byzantine=behaviours, byzantine_members=tuple(chosen), victim_delay_ticks=delay
    )
