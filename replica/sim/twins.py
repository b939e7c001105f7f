"""The enumerated adversary (Twins, Bano et al. 2020): every place of the Byzantine members
in the leader order times every partition schedule, per behaviour (docs/consensus/simulator.md)."""

from __future__ import annotations

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
        splits = twins_splits(instances)
        total = n * len(splits) ** TWINS_PHASES  # (place, schedule) pairs, by index
        step = max(1, total // per_behaviour) if per_behaviour else 1
        for case in range(0, total, step)[:per_behaviour]:
            place, k = case % n, case // n
            schedule = tuple(
                splits[(k // len(splits) ** phase) % len(splits)] for phase in range(TWINS_PHASES)
            )
            out.append(
                SimOptions(
                    seed=k,
                    n=n,
                    byzantine=(behaviour,) * f,
                    byzantine_members=tuple((place + j) % n for j in range(f)),
                    partition_schedule=schedule,
                    schedule_phase_ticks=TWINS_PHASE_TICKS,
                    ticks=(TWINS_PHASES + 2) * TWINS_PHASE_TICKS,
                    delay_ticks_max=2,
                    victim_delay_ticks=60 if behaviour == "fork_leader" else 0,
                    # The forking leader's victim is the restore drill's too: one at a time.
                    restores_when_leading=0 if behaviour == "fork_leader" else restores,
                    restores_when_voting=0 if behaviour == "fork_leader" else restores,
                    restores_when_timing_out=0 if behaviour == "fork_leader" else restores,
                    restore_backup_views=case % 3,
                )
            )
    return out
