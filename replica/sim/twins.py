"""The enumerated adversary (Twins, Bano et al. 2020): every place of the Byzantine members
in the leader order times every partition schedule, per behaviour (docs/consensus/simulator.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from quorumgate.replica.sim.options import SimOptions

TWINS_PHASES = 3  # phases of enumerated partitions before the network heals
TWINS_PHASE_TICKS = 100  # about five views each
TWINS_BEHAVIOURS = ("twins", "equivocate", "fork_leader")


def twins_splits(instances: int) -> list[tuple[int, ...]]:
    """Every way to split `instances` node instances into two non-empty sides (each split
    once: the first instance is always on side 0)."""
    out = []
    for mask in range(1, 2 ** (instances - 1)):
        sides = (0, *((mask >> k) & 1 for k in range(instances - 1)))
        if any(sides):
            out.append(sides)
    return out


def _enumerated(
    n: int, instances: int, per_behaviour: int | None
) -> Iterator[tuple[int, int, int, tuple[tuple[int, ...], ...]]]:
    """(case, place, schedule index, schedule) for each (place in the leader order,
    partition schedule) pair of a behaviour, or `per_behaviour` of them evenly spaced."""
    splits = twins_splits(instances)
    total = n * len(splits) ** TWINS_PHASES  # (place, schedule) pairs, by index
    step = max(1, total // per_behaviour) if per_behaviour else 1
    for case in range(0, total, step)[:per_behaviour]:
        place, k = case % n, case // n
        schedule = tuple(
            splits[(k // len(splits) ** phase) % len(splits)] for phase in range(TWINS_PHASES)
        )
        yield case, place, k, schedule


def twins_scenarios(
    n: int = 4, *, per_behaviour: int | None = None, restores: int = 3
) -> list[SimOptions]:
    """The enumerated adversary (Twins, Bano et al. 2020). For each Byzantine behaviour
    (twin instances of each of f keys, f equivocating leaders, a team of f forking
    leaders, each time at f consecutive places of the round-robin leader order), every
    place in that order times every partition schedule of `TWINS_PHASES` phases (each
    phase a two-way split of the node instances); and, beside twins and equivocation, a
    victim restored from a backup (taken on entering the view, or one or two views
    before) up to `restores` times each just after it proposed, voted in a Byzantine
    member's view, or timed out, with what it signed still in flight. With
    `per_behaviour`, that many scenarios of each behaviour, evenly spaced through its
    enumeration, so that no behaviour outweighs the others by the number of its
    instances. Each scenario is a plain `SimOptions`: a failure prints what reproduces it.
    """
    f = (n - 1) // 3
    out = []
    for behaviour in TWINS_BEHAVIOURS:
        instances = n + f if behaviour == "twins" else n
        # The forking leader's victim is the restore drill's too: one at a time.
        victim_restores = 0 if behaviour == "fork_leader" else restores
        for case, place, k, schedule in _enumerated(n, instances, per_behaviour):
            out.append(
                _twins_options(
                    n,
                    behaviour,
                    place,
                    k,
                    schedule,
                    restores_when_leading=victim_restores,
                    restores_when_voting=victim_restores,
                    restores_when_timing_out=victim_restores,
                    restore_backup_views=case % 3,
                )
            )
    return out


def _twins_options(
    n: int,
    behaviour: str,
    place: int,
    seed: int,
    schedule: tuple[tuple[int, ...], ...],
    **extra: Any,
) -> SimOptions:
    """One Twins scenario: f members of `behaviour` from `place` in the leader order,
    under the partition `schedule`, then `extra` (restores, or reconfigurations)."""
    f = (n - 1) // 3
    return SimOptions(
        seed=seed,
        n=n,
        byzantine=(behaviour,) * f,
        byzantine_members=tuple((place + j) % n for j in range(f)),
        partition_schedule=schedule,
        schedule_phase_ticks=TWINS_PHASE_TICKS,
        ticks=(TWINS_PHASES + 2) * TWINS_PHASE_TICKS,
        delay_ticks_max=2,
        victim_delay_ticks=60 if behaviour == "fork_leader" else 0,
        **extra,
    )


# The member-set changes a Twins schedule crosses, by starting size: a member's key rotated
# (a twin's old machine keeps the old key) and, from 4, three members added.
TWINS_RECONFIGURATIONS: dict[int, tuple[str, ...]] = {4: ("rotate", "add"), 7: ("rotate",)}


def twins_epoch_scenarios(n: int = 4, *, per_behaviour: int | None = None) -> list[SimOptions]:
    """The enumerated adversary across epoch boundaries: as `twins_scenarios` (every
    place of the f Byzantine members in the first epoch's leader order times every
    partition schedule, per behaviour; no restores), while the owner commits
    `TWINS_RECONFIGURATIONS[n]` at ticks drawn from the scenario's seed, within the first
    70 % of the adversarial ticks: during the partition phases or between the last of
    them and the heal. The schedules split every node instance, those of members to come
    too. Which member a rotation picks is drawn from the seed: the Byzantine one (whose
    old machine, a twin, keeps its old key) or an honest one (whose old key the adversary
    then holds: docs/consensus/epochs.md, "What the simulator checks")."""
    f = (n - 1) // 3
    reconfigure = TWINS_RECONFIGURATIONS[n]
    slots = SimOptions(seed=0, n=n, reconfigure=reconfigure).slots
    out = []
    for behaviour in TWINS_BEHAVIOURS:
        instances = slots + f if behaviour == "twins" else slots
        for _, place, k, schedule in _enumerated(n, instances, per_behaviour):
            out.append(_twins_options(n, behaviour, place, k, schedule, reconfigure=reconfigure))
    return out
