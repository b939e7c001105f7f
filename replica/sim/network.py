"""The simulated network's schedule: messages in flight, each due at a tick, and the
partitions that decide which node instances can reach which."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from quorumgate.replica.epochs import EpochProof
from quorumgate.replica.sim.options import SimOptions
from quorumgate.replica.types import Envelope, SyncResponse

Instance = tuple[int, int]  # (member, instance): twins are two instances of one member


@dataclass(frozen=True)
class EpochDelivery:
    """An epoch proof on its way from `sender` to a node still in the proof's epoch (the
    shell's business, not the core's: docs/consensus/epochs.md, "Catching up")."""

    sender: int
    proof: EpochProof | None
    # Or, for a node too far behind for the proof, one page of the ended epoch's committed
    # chain below the change block (replica/epochs.py `epoch_page`).
    page: SyncResponse | None = None


@dataclass(order=True)
class InFlight:
    deliver_tick: int
    order: int
    to: int = field(compare=False)
    instance: int | None = field(compare=False)  # None: every instance of `to`
    envelope: Envelope | EpochDelivery = field(compare=False)


class Network:
    """What is in flight, in the order it was sent, and the current partition. Delays,
    loss and duplication are drawn by the simulation as it sends (`Simulation._enqueue`)."""

    def __init__(self) -> None:
        self.queue: list[InFlight] = []
        self.order = 0
        # (member, instance) -> side; None when the network is whole
        self.partition: dict[Instance, int] | None = None
        self.next_partition_tick = 0

    def push(
        self, deliver_tick: int, to: int, instance: int | None, envelope: Envelope | EpochDelivery
    ) -> None:
        self.order += 1
        self.queue.append(InFlight(deliver_tick, self.order, to, instance, envelope))

    def take_due(self, tick: int) -> list[InFlight]:
        """What is due by `tick`, taken off the queue, in the order it was sent."""
        due = [m for m in self.queue if m.deliver_tick <= tick]
        if due:
            self.queue = [m for m in self.queue if m.deliver_tick > tick]
        return due

    def connected(self, src: int, src_instance: int, dst: int, dst_instance: int) -> bool:
        if self.partition is None:
            return True
        return self.partition[(src, src_instance)] == self.partition[(dst, dst_instance)]

    def repartition(
        self, tick: int, instances: Sequence[Instance], opts: SimOptions, rng: random.Random
    ) -> None:
        """Twins-style: every so often the instances (twins are two) split anew, or heal;
        with a `partition_schedule`, exactly the enumerated splits, phase by phase."""
        if opts.partition_schedule:
            phase = tick // opts.schedule_phase_ticks
            if phase < len(opts.partition_schedule):
                sides = opts.partition_schedule[phase]
                self.partition = dict(zip(sorted(instances), sides, strict=True))
            else:
                self.partition = None
            return
        if opts.partition_ticks == 0 or tick < self.next_partition_tick:
            return
        span = opts.partition_ticks
        self.next_partition_tick = tick + span // 2 + rng.randrange(span + 1)
        if rng.randrange(3) == 0:
            self.partition = None
            return
        shuffled = list(instances)
        rng.shuffle(shuffled)
        cut = 1 + rng.randrange(len(shuffled) - 1)
        self.partition = {inst: (0 if k < cut else 1) for k, inst in enumerate(shuffled)}
