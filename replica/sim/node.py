"""One simulated member: its core, the disk that survives its crashes, and the stand-ins
for its mempool and its execution sidecar."""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from quorumgate.proto.canonical import Encoder
from quorumgate.proto.crypto import Signer, Verifier, VerifyFn
from quorumgate.proto.domains import SIM_HELLO
from quorumgate.proto.membership import Membership, OwnerRecords, Reconfiguration, is_record
from quorumgate.replica.actions import Action
from quorumgate.replica.core import Core, Recovered
from quorumgate.replica.epochs import EpochEnd, RestoreFence, owner_after
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.sim.options import RESTORE_BACKUP_VIEWS_MAX, SIM_LIMITS, SimOptions
from quorumgate.replica.types import HELLO_NONCE_BYTES, Block, CommitProof, genesis_block


@dataclass
class Disk:
    """What survives a crash: exactly what the node's actions made durable."""

    safety: SafetyState
    committed: list[Block]
    proofs: dict[int, CommitProof] = field(default_factory=dict)
    blocks: dict[bytes, Block] = field(default_factory=dict)
    # Each epoch's member set and the change block it started after (None: genesis), and
    # how each ended epoch ended (docs/consensus/epochs.md): made durable with the commit
    # of the change block, in the same step.
    starts: list[tuple[Membership, Block | None]] = field(default_factory=list)
    ends: dict[int, EpochEnd] = field(default_factory=dict)

    def copy(self) -> Disk:
        return Disk(
            self.safety,
            list(self.committed),
            dict(self.proofs),
            dict(self.blocks),
            list(self.starts),
            dict(self.ends),
        )

    @property
    def membership(self) -> Membership:
        """The member set of the newest epoch this node knows of."""
        return self.starts[-1][0]

    def payload_height(self) -> int:
        """The highest committed height whose block carries transactions (0: none)."""
        return next((b.height for b in reversed(self.committed) if b.payload), 0)

    # CommittedStore, for serving sync requests
    def committed_height(self) -> int:
        return len(self.committed) - 1

    def committed_range(self, start: int, end: int) -> list[Block]:
        return self.committed[start : end + 1]

    def proof_at_or_after(self, height: int, limit: int) -> CommitProof | None:
        for h in range(height, limit + 1):
            if h in self.proofs:
                return self.proofs[h]
        return None

    def proof_at_or_before(self, height: int, floor: int) -> CommitProof | None:
        for h in range(height, floor - 1, -1):
            if h in self.proofs:
                return self.proofs[h]
        return None


class SimPool:
    """The transactions clients submitted, as every replica's mempool would hold them
    after gossip; each node tracks which it has seen committed."""

    def __init__(self) -> None:
        self.txs: list[bytes] = []
        self.valid: set[bytes] = set()
        # (reader, record) -> what the reader makes of it: a signed record is checked once
        # per record key, not once per proposal.
        self._reads: dict[tuple[OwnerRecords, bytes], tuple[Reconfiguration, int] | None] = {}

    def add(self, tx: bytes) -> None:
        self.txs.append(tx)
        self.valid.add(tx)

    def read(self, records: OwnerRecords, tx: bytes) -> tuple[Reconfiguration, int] | None:
        key = (records, tx)
        if key not in self._reads:
            self._reads[key] = records.read(tx)
        return self._reads[key]


class SimMempool:
    """One core's view of the pool. With `records` (a run whose records are signed), it
    proposes a record only if it is signed with the epoch's record key for `epoch`, as
    the replica's mempool admits and proposes only those (replica/mempool.py): a record
    of a later epoch waits for that epoch's core, and one signed with a retired key is
    never proposed. That is fixed for the core's life, so the cursor passes over both."""

    def __init__(
        self,
        pool: SimPool,
        committed: set[bytes],
        records: OwnerRecords | None = None,
        epoch: int = 0,
    ) -> None:
        self._pool = pool
        self._committed = committed
        self.records = records
        self._epoch = epoch
        self._cursor = 0

    def _proposable(self, tx: bytes) -> bool:
        if self.records is None or not is_record(tx):
            return True
        read = self._pool.read(self.records, tx)
        return read is not None and read[1] == self._epoch

    def _advance(self) -> None:
        txs = self._pool.txs
        while self._cursor < len(txs) and (
            txs[self._cursor] in self._committed or not self._proposable(txs[self._cursor])
        ):
            self._cursor += 1

    def pending(self) -> bool:
        self._advance()
        return self._cursor < len(self._pool.txs)

    def take(self, chain: Sequence[Block], txs_max: int, bytes_max: int) -> tuple[bytes, ...]:
        self._advance()
        in_chain = {tx for block in chain for tx in block.payload}
        out: list[bytes] = []
        size = 0
        for tx in self._pool.txs[self._cursor :]:
            if len(out) >= txs_max or size + len(tx) > bytes_max:
                break
            if tx not in self._committed and tx not in in_chain and self._proposable(tx):
                out.append(tx)
                size += len(tx)
        return tuple(out)

    def check(self, block: Block) -> str | None:
        if any(tx not in self._pool.valid for tx in block.payload):
            return "unknown transaction"
        return None

    def on_commit(self, blocks: Sequence[Block]) -> None:
        for block in blocks:
            self._committed.update(block.payload)


class SimExecution:
    """An instant 'sidecar': the state root after height h folds in the block hashes."""

    def __init__(self, disk: Disk) -> None:
        self._disk = disk
        self._roots: list[bytes] = [b""]

    def _catch_up(self) -> None:
        while len(self._roots) < len(self._disk.committed):
            block = self._disk.committed[len(self._roots)]
            self._roots.append(hashlib.sha256(self._roots[-1] + block.hash).digest())

    def latest_root(self) -> tuple[int, bytes]:
        self._catch_up()
        return len(self._roots) - 1, self._roots[-1]

    def root_at(self, height: int) -> bytes | None:
        self._catch_up()
        return self._roots[height] if 0 <= height < len(self._roots) else None


class NodeWorld(Protocol):
    """What a member sees of the simulation it runs in (`Simulation` implements it)."""

    options: SimOptions
    membership: Membership
    byzantine: dict[int, str]
    pool: SimPool
    verify_fn: VerifyFn
    key_signers: dict[bytes, Signer]
    restores_resumed: int
    stale_restores: int
    amnesiac: set[int]
    # The reader of epoch 0's records where they are signed (`SimOptions.signed_records`).
    first_records: OwnerRecords | None

    def now_ms(self, index: int) -> int: ...

    def core_started(self, node: SimNode, core: Core) -> None: ...


class SimNode:
    """One instance of a member: a core plus its disk. Twins are two of these, one index."""

    def __init__(self, sim: NodeWorld, index: int, signer: Signer, instance: int = 0) -> None:
        self.sim = sim
        self.index = index
        self.instance = instance
        self.signer = signer
        chain = sim.membership.chain_id
        self.disk = Disk(SafetyState.initial(chain), [genesis_block(chain)])
        self.disk.starts.append((sim.membership, None))
        self.durable_epoch = 0
        self.committed_txs: set[bytes] = set()
        self.up = True
        self.down_until = 0
        self.snapshots: list[Disk] = []
        self.force_stale = False  # the next restart is from `snapshots[0]`, whatever the draw
        # (view entered, the disk then): the aimed restores' backups, newest last
        self.backups: list[tuple[int, Disk]] = []
        # epoch -> (view entered, the disk then): the newest of those backups per epoch,
        # for a restore across a boundary (`SimOptions.restore_across_boundary`)
        self.epoch_backups: dict[int, tuple[int, Disk]] = {}
        # The restore marker (replica/node.py RESTORE_MARKER_FILE): set when a backup is
        # put back, cleared once the core is past its fence, so that a crash before then
        # restarts it as a restore again.
        self.restore_marker = False
        # Where the declared restore fenced (replica/node.py RESTORE_FENCE_FILE), kept
        # until the restore is discharged (`settle_restore`).
        self.restore_fence: RestoreFence | None = None
        self.starts = 0
        self.dropped_before: Counter[str] = Counter()  # by the cores of earlier starts
        self.asked_tick = -1  # when this node last asked a peer for an epoch proof
        self.first_key: bytes | None = None  # the key it held in its first epoch as a member
        self._core: Core | None = self._make_core(None)

    @property
    def core(self) -> Core:
        """The consensus core of this node's epoch; only members of it have one."""
        assert self._core is not None, f"node {self.index} is no member of its epoch"
        return self._core

    @property
    def active(self) -> bool:
        """A member of the newest epoch it knows of, running that epoch's core."""
        return self._core is not None

    @property
    def epoch(self) -> int:
        return self.disk.membership.epoch

    def left_epoch(self) -> bool:
        """Its core ended its epoch and the disk already holds the next one."""
        core = self._core
        return core is not None and core.ended is not None and self.epoch > core.epoch

    def _make_core(self, recovered: Recovered | None, restored: bool = False) -> Core | None:
        sim = self.sim
        membership, boundary = self.disk.starts[-1]
        if not membership.is_member(self.index):
            return None  # not (or no longer) a member: it only follows epoch changes
        self.signer = sim.key_signers[membership.key(self.index)]
        self.first_key = self.first_key or self.signer.public_key
        # Byzantine members wrap the honest core; only honest ones run a variant under test.
        cls = Core if self.index in sim.byzantine else (sim.options.unsafe or Core)
        records = self.owner_records()
        mempool = SimMempool(sim.pool, self.committed_txs, records, membership.epoch)
        self.starts += 1
        # A fresh nonce per start, as the replica shell draws one (the default is derived
        # from the safety epoch, which a restore from old data repeats).
        nonce = Encoder(SIM_HELLO).u64(sim.options.seed).u32(self.index).u32(self.starts)
        if recovered is None and boundary is not None:
            committed = self.disk.committed[-1]
            recovered = Recovered(self.disk.safety, committed, boundary=boundary)
        core = cls(
            membership,
            self.index,
            self.signer,
            limits=sim.options.limits,
            verifier=Verifier(SIM_LIMITS.verified_cache_max, sim.verify_fn),
            payload=mempool,
            execution=SimExecution(self.disk),
            recovered=recovered,
            now_ms=sim.now_ms(self.index),
            hello_nonce=nonce.digest()[:HELLO_NONCE_BYTES],
            # An operator who puts a backup back declares it (docs/consensus/fencing.md).
            restored=restored,
            epochs=True,
            owner_records=records,
        )
        # One reader for the core and its mempool, as the replica's shell hands them one.
        mempool.records = core.owner_records
        if membership.epoch > 0:
            sim.core_started(self, core)
        return core

    def owner_records(self) -> OwnerRecords | None:
        """The reader of the records of the newest epoch this node knows of, derived as the
        replica's shell derives it at every core start (docs/consensus/epochs.md, "The
        record key"): from epoch 0's, moved on at each stored change block; None where
        records are bare."""
        reader = self.sim.first_records
        if reader is None:
            return None
        starts = self.disk.starts
        for (before, _), (_, boundary) in itertools.pairwise(starts):
            assert boundary is not None, "an epoch after 0 starts at a change block"
            reader = owner_after(boundary, before, reader)
        return reader

    def start(self) -> list[Action]:
        return self.core.start() if self.active else []

    def next_epoch(self) -> list[Action]:
        """The disk holds a newer epoch than the core runs (or than it last knew of, if it
        runs none): start that epoch's core, if this node is a member of it."""
        if self._core is not None:
            self.dropped_before += self._core.dropped
        self._core = self._make_core(None, restored=self.restore_declared)
        return self.start()

    @property
    def restore_declared(self) -> bool:
        """Whether a core started now must fence as a restore: the marker is there, or a
        restore fenced in an earlier epoch and is not discharged; not if it fenced in the
        epoch the disk is in (docs/consensus/fencing.md, "Across an epoch boundary")."""
        fence = self.restore_fence
        if fence is not None and fence.epoch == self.epoch:
            return False
        return self.restore_marker or fence is not None

    def settle_restore(self) -> None:
        """The shell's part of a declared restore after a step (replica/node.py): once the
        core is past its fence, and that is durable, note where and clear the marker;
        forget the fence once the epoch it names committed a block of the view before it
        (`RestoreFence`)."""
        core, disk = self._core, self.disk
        if core is not None and core.restore_fence and core.epoch == self.epoch:
            fence = self.restore_fence
            durable = disk.safety.last_voted_view >= core.restore_fence
            if durable and (fence is None or fence.epoch != core.epoch):
                self.restore_fence = RestoreFence(core.epoch, core.restore_fence)
                self.restore_marker = False
        fence = self.restore_fence
        if fence is None:
            return
        end = disk.ends.get(fence.epoch)
        if end is not None:
            committed_view = end.boundary.view
        elif fence.epoch == self.epoch:
            committed_view = disk.committed[-1].view
        else:
            return
        if fence.discharged(fence.epoch, committed_view):
            self.restore_fence = None

    def crash(self, until_tick: int) -> None:
        self.up = False
        self.down_until = until_tick
        self.snapshots.append(self.disk.copy())

    def restart(self, stale: bool = False) -> list[Action]:
        if self.restore_marker:
            self.sim.restores_resumed += 1  # crashed while still fencing after a restore
        if stale and (len(self.snapshots) > 1 or self.force_stale):
            # Restored from an old copy of the data directory: it forgot what it signed since.
            self.disk = self.snapshots[0].copy()
            self.sim.stale_restores += 1
            self.sim.amnesiac.add(self.index)
            self.restore_marker = True
            self.restore_fence = None  # a new restore: whatever fenced before is void
        restored = self.restore_declared
        disk = self.disk
        committed = disk.committed[-1]
        pending = tuple(b for b in disk.blocks.values() if b.height > committed.height)
        self.durable_epoch = disk.safety.epoch
        if self._core is not None:
            self.dropped_before += self._core.dropped
        recovered = Recovered(
            disk.safety,
            committed,
            pending,
            payload_height=disk.payload_height(),
            boundary=disk.starts[-1][1],
        )
        self._core = self._make_core(recovered, restored=restored)
        self.up = True
        return self.start()

    def keep_backup(self) -> None:
        """The aimed restores' backups: the disk as it entered each of its last views."""
        view, epoch = self.core.view, self.core.epoch
        newest = self.epoch_backups.get(epoch)
        if newest is not None and newest[0] >= view:
            return
        disk = self.disk.copy()
        self.epoch_backups[epoch] = (view, disk)
        if self.backups and self.backups[-1][0] >= view:
            return  # (a view of an earlier epoch's suffix was higher)
        self.backups.append((view, disk))
        del self.backups[: -(RESTORE_BACKUP_VIEWS_MAX + 1)]

    def backup_before(self, view: int, views_back: int) -> Disk | None:
        """The newest backup taken at least `views_back` views before `view`."""
        older = [disk for entered, disk in self.backups if entered <= view - views_back]
        return older[-1].copy() if older else None

    def backup_of_earlier_epoch(self) -> Disk | None:
        """The newest backup taken in an epoch before the one this node is in."""
        earlier = [e for e in self.epoch_backups if e < self.epoch]
        return self.epoch_backups[max(earlier)][1].copy() if earlier else None

    @property
    def dropped(self) -> Counter[str]:
        """What this member dropped, by reason, over all its starts."""
        return self.dropped_before + (self._core.dropped if self._core else Counter())
