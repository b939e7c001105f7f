"""What a simulation runs: its options, the bounds of its world, and how it fails."""

from __future__ import annotations

from dataclasses import dataclass, replace

from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core

BEHAVIOURS = (
    "equivocate",  # as leader, sends two conflicting blocks to two halves of the cluster
    "twins",  # two honest instances share one key, each seeing part of the network
    "double_vote",  # signs a vote for every block it sees, ignoring the safety rules
    "silent_leader",  # never sends its proposals
    "bad_signatures",  # corrupts the signature of everything it sends
    "forge_certs",  # sends forged QCs and TCs and proposals built on them
    "fork_leader",  # leads from a stale QC to fork the chain, votes for anything, and
    # sends its votes to one victim only, so commits diverge: what locks exist to stop
    "malform",  # sends every kind of message truncated, oversized, stale, far ahead, with
    # forged or repeated signatures, in another member's or a non-member's name, plus
    # catch-up answers and hello replies nobody asked for: what an unauthenticated
    # transport would let through (docs/security/threat-model.md)
)
# Behaviours that never help the honest members leave a view (their votes and timeouts
# are invalid or withheld): with f of them, liveness has no fault left for a restore.
WITHHOLDING_BEHAVIOURS = ("bad_signatures", "fork_leader")
MALFORM_COPIES = 2  # mutated copies of each message a `malform` member sends
FAR_AHEAD_VIEWS = 1_000_000
SIM_TICK_MS = 10
TX_BYTES = 48
RESTORE_BACKUP_VIEWS_MAX = 8  # the victim's backups kept, one per view it entered
RECONFIGURE_KINDS = ("replace", "rotate", "add", "remove", "owner")
# The behaviours a Byzantine member may have in a run that changes the member set: those
# that sign with the member's key of the epoch they run (docs/consensus/epochs.md, "What
# the simulator checks"); the others know one member set.
BOUNDARY_BEHAVIOURS = ("twins", "equivocate", "fork_leader")
# Proposals the network keeps, by view, to hand a restored victim again (the newest views).
SENT_PROPOSAL_VIEWS_MAX = 32


class SimulationFailure(AssertionError):
    pass


@dataclass(frozen=True)
class SimOptions:
    seed: int
    n: int = 4
    byzantine: tuple[str, ...] = ()  # one behaviour per Byzantine member, at most f
    ticks: int = 1_500  # ticks of adversarial network before the heal
    delay_ticks_max: int = 3
    loss_permille: int = 0
    dup_permille: int = 0
    partition_ticks: int = 0  # 0: none; else a new random partition about this often
    victim_delay_ticks: int = 0  # extra delay on everything one honest member sends
    crash_permille: int = 0  # per node per tick, before the heal
    crash_ticks_max: int = 200
    stale_restore_permille: int = 0  # a restart from an older copy of the disk (drill)
    tx_per_tick_permille: int = 500
    liveness_views_max: int = 40
    liveness_ticks_max: int = 6_000
    # The core honest members run instead of `Core`: a deliberately broken rule, to test the
    # tester (the variants live with the tests, tests/consensus/variants.py, and never ship).
    unsafe: type[Core] | None = None
    fast_crypto: bool = True
    # Twins-style enumerated schedules: which members are the Byzantine ones (their places
    # in the round-robin leader order; empty: drawn from the seed), and per phase of
    # `schedule_phase_ticks` a split of every node instance into side 0 or 1 (instances in
    # (member, instance) order); after the last phase the network is whole.
    byzantine_members: tuple[int, ...] = ()
    partition_schedule: tuple[tuple[int, ...], ...] = ()
    schedule_phase_ticks: int = 40
    # The stale-restore drill, aimed: this many times, right after the victim proposed in a
    # view it leads, it is killed, its data put back to what it held on entering that view,
    # and restarted at once — into the very view it signed in and forgot (safety Rule 6).
    restores_when_leading: int = 0
    # The same right after it voted (in a view a Byzantine member leads, if there is one)
    # or timed out: what it signed is delayed `restore_in_flight_ticks`, not lost, so its
    # peers answer its hello before they see it; once its fencing ends the network hands
    # it every other proposal of that view it had sent (after a timeout: every proposal).
    restores_when_voting: int = 0
    restores_when_timing_out: int = 0
    # The backup an aimed restore puts back: taken on entering the view it signed in (0)
    # or this many views before it (at most RESTORE_BACKUP_VIEWS_MAX).
    restore_backup_views: int = 0
    # Owner operations that change the member set, committed in this order at random ticks
    # before the heal (docs/consensus/epochs.md): "replace" (a member's machine and key),
    # "rotate" (a member's key), "add" (4 -> 7), "remove" (7 -> 4), "owner" (the record
    # key handed to a new key, the members kept). A run with an "owner" change signs every
    # record (`signed_records`); the others commit bare records, which the owner trusts.
    reconfigure: tuple[str, ...] = ()
    # A member held down from `held_from_tick` until the heal, so that it comes back far
    # behind (docs/consensus/epochs.md, "Catching up"); -1: none. With it, the changes are
    # committed no earlier than `changes_from_percent` of the adversarial ticks.
    held_member: int = -1
    held_from_tick: int = 0
    changes_from_percent: int = 0
    # The sync page in blocks (`Limits.sync_blocks_max`, a cluster-file setting on a live
    # chain); 0: SIM_LIMITS'. A small page puts a held member many pages behind quickly.
    sync_blocks_max: int = 0
    # The aimed restores fire only in an epoch after the first, and put back the victim's
    # last backup of an earlier epoch: a restore across a boundary (docs/consensus/
    # fencing.md, "Across an epoch boundary"). The only restores a reconfiguration run has.
    restore_across_boundary: bool = False

    def __post_init__(self) -> None:
        f = (max(self.epoch_sizes) - 1) // 3 if self.reconfigure else (self.n - 1) // 3
        if len(self.byzantine) > f:
            raise ValueError(f"{len(self.byzantine)} Byzantine members but f = {f}")
        for b in self.byzantine:
            if b not in BEHAVIOURS:
                raise ValueError(f"unknown behaviour {b!r}")
        if self.unsafe is not None and not issubclass(self.unsafe, Core):
            raise ValueError(f"unsafe variant {self.unsafe!r} is not a Core")
        if self.byzantine_members and len(self.byzantine_members) != len(self.byzantine):
            raise ValueError("one member index per Byzantine behaviour")
        if self.restore_across_boundary and not self.reconfigure:
            raise ValueError("a restore across a boundary needs a member-set change")
        if not 0 <= self.restore_backup_views <= RESTORE_BACKUP_VIEWS_MAX:
            raise ValueError(f"restore_backup_views above {RESTORE_BACKUP_VIEWS_MAX}")
        if self.held_member >= self.n or not 0 <= self.changes_from_percent <= 70:
            raise ValueError("the held member is one of the first epoch's members")
        self._check_reconfigure()

    def _check_reconfigure(self) -> None:
        """Each change must fit the size the ones before it leave. The only restores of
        these runs are the aimed ones across a boundary; Byzantine members are named, have a
        behaviour of `BOUNDARY_BEHAVIOURS`, and are at most f of every epoch's members."""
        size = self.n
        for kind in self.reconfigure:
            if kind not in RECONFIGURE_KINDS:
                raise ValueError(f"unknown reconfiguration {kind!r}")
            if (kind, size) in (("add", 7), ("remove", 4)) or size not in (4, 7):
                raise ValueError(f"{kind} does not fit a cluster of {size}")
            size += {"add": 3, "remove": -3}.get(kind, 0)
        if not self.reconfigure:
            return
        if self.stale_restore_permille or (
            self.aimed_restores and not self.restore_across_boundary
        ):
            raise ValueError("reconfiguration runs restore only across a boundary")
        if self.byzantine:
            self._check_epoch_faults()

    def _check_epoch_faults(self) -> None:
        """f per epoch: a member added may be Byzantine only if the new epoch's f allows
        it, and a remove must leave at most f of the rest Byzantine (members come and go
        at the top of the index range: proto/membership.py `Reconfiguration`)."""
        if len(self.byzantine_members) != len(self.byzantine):
            raise ValueError("a reconfiguration run names its Byzantine members")
        if any(b not in BOUNDARY_BEHAVIOURS for b in self.byzantine):
            raise ValueError(f"across an epoch boundary only {BOUNDARY_BEHAVIOURS} act")
        if len(set(self.byzantine_members)) != len(self.byzantine_members):
            raise ValueError("one behaviour per Byzantine member")
        for size in self.epoch_sizes:
            inside = sum(0 <= m < size for m in self.byzantine_members)
            if inside > (size - 1) // 3:
                raise ValueError(f"{inside} Byzantine members of an epoch of {size}")
        if any(not 0 <= m < self.slots for m in self.byzantine_members):
            raise ValueError("a Byzantine member outside every epoch")

    @property
    def limits(self) -> Limits:
        """The cores' limits: SIM_LIMITS with this run's sync page."""
        if not self.sync_blocks_max:
            return SIM_LIMITS
        return replace(SIM_LIMITS, sync_blocks_max=self.sync_blocks_max)

    @property
    def epoch_sizes(self) -> tuple[int, ...]:
        """The number of members of each epoch, the first one's first."""
        sizes = [self.n]
        for kind in self.reconfigure:
            sizes.append(sizes[-1] + {"add": 3, "remove": -3}.get(kind, 0))
        return tuple(sizes)

    @property
    def signed_records(self) -> bool:
        """Whether the run's records are signed by the owner's record key of their epoch
        and read as the live replica reads them (`OwnerRecords`, with real Ed25519 owner
        keys): a bare `owner` record changes nothing (docs/consensus/epochs.md, "The
        record key"), so a run that hands the record key over signs them all."""
        return "owner" in self.reconfigure

    @property
    def slots(self) -> int:
        """Node slots the run needs: the most members any of its epochs has."""
        return max(self.epoch_sizes)

    @property
    def aimed_restores(self) -> int:
        return (
            self.restores_when_leading + self.restores_when_voting + (self.restores_when_timing_out)
        )

    def reproduce(self) -> str:
        fields = ", ".join(
            f"{k}={_shown(getattr(self, k))}"
            for k in self.__dataclass_fields__
            if getattr(self, k) != SimOptions.__dataclass_fields__[k].default or k == "seed"
        )
        return f"SimOptions({fields})"


def _shown(value: object) -> str:
    """An option as it is written in Python: a class by the name it is imported as."""
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


SIM_LIMITS = Limits(
    view_timeout_ticks_base=20,
    view_timeout_ticks_max=160,
    idle_propose_ticks=4,
    timestamp_behind_ms_max=60_000,
    sync_blocks_max=64,
    sync_retry_ticks=15,
    fence_wait_ticks=40,
    pending_blocks_max=512,
    batch_txs_max=32,
)
