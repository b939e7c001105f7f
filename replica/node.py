"""The replica process: the consensus core inside its I/O shell.

    python -m quorumgate.replica.node --dir DIR --node I      (what `quorumgate up` starts)

This module is the consensus shell. One asyncio loop (uvloop when importable) runs:

- the core task: it drains pending events (peer messages, ticks, new transactions, new
  state roots) in batches, feeds each to the core, makes the durable part of all resulting
  actions durable in one SQLite transaction (replica/storage.py), and only then sends — the
  contract of replica/actions.py, checked by `check_send_allowed` on every send;
- a ticker, catch-up answers and the Prometheus endpoint;
- a gRPC server with the `Peer` service and the `Replica` client API.

Each other concern owns its state in a module of its own: the peers, their streams and
gossip (`peers.py`), the client API and admission (`client_api.py`), the link to this
replica's sidecar and the roots it reported (`sidecar_link.py`).

Log lines are `key=value` text and never carry transaction contents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import start_http_server

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto import consensus_pb2_grpc as pb_grpc
from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    JOIN_FILE,
    ClusterFileError,
    ClusterSpec,
    consensus_seed_for,
    held_consensus_seeds,
    held_tls_certificates,
    public_key_of,
    read_seed,
)
from quorumgate.proto.crypto import Ed25519Signer, Signer
from quorumgate.proto.membership import Membership, OwnerRecords
from quorumgate.proto.tx import ParsedTx, TxRejected, parse, raw_tx_id
from quorumgate.replica.actions import (
    Action,
    Commit,
    PersistSafety,
    ScheduleTimeout,
    Send,
    StoreBlock,
    check_send_allowed,
)
from quorumgate.replica.base import BaseAsks, ChainedBases
from quorumgate.replica.client_api import ClientApi, sidecar_refuses
from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core, Recovered
from quorumgate.replica.epochchain import EpochChainError
from quorumgate.replica.epochs import (
    EpochEnd,
    EpochProof,
    RestoreFence,
    check_epoch_proof,
    entries_after,
    epoch_page,
    epoch_proof_reach,
    epoch_safety_state,
    is_epoch_page,
    member_receipt_key,
    needs_pages,
    owner_after,
)
from quorumgate.replica.inbound import LOCAL, InboundQueue
from quorumgate.replica.mempool import (
    BAD_SIGNATURE,
    MALFORMED,
    WRONG_CHAIN,
    Admission,
    Mempool,
    MempoolLimits,
    RecordTx,
)
from quorumgate.replica.metrics import ReplicaMetrics
from quorumgate.replica.peers import GOSSIP_BATCH_TXS_MAX, PeerNetwork
from quorumgate.replica.pruning import PruneFloor
from quorumgate.replica.sidecar_link import ReportKeys, SidecarLink
from quorumgate.replica.storage import ReplicaStore, decode_epoch_row
from quorumgate.replica.sync import SyncRepeats
from quorumgate.replica.types import (
    HELLO_NONCE_BYTES,
    Block,
    CommitProof,
    Envelope,
    EpochLink,
    RemoteError,
    SyncRequest,
    SyncResponse,
)
from quorumgate.replica.validate import check_sync_response
from quorumgate.replica.wire import encode_epoch_end, envelope_from_pb, envelope_to_pb
from quorumgate.runtime.channels import (
    PEER_AUTH_SIGNATURES_MAX,
    Reader,
    ServedCertificate,
    add_server_port,
)
from quorumgate.runtime.grpcutil import add_service
from quorumgate.runtime.links import SERVER_OPTIONS
from quorumgate.runtime.process import FailStop, process_main
from quorumgate.runtime.tracing import Tracer, tx_prefix

# Admission refusals that only a faulty member's gossip can cause (they depend on the bytes
# alone, and an honest member gossips only what it admitted): the rest of its batch is dropped.
FORGED_GOSSIP_REASONS = frozenset({BAD_SIGNATURE, MALFORMED, WRONG_CHAIN})
# Events queued for the core loop, per source (each peer; the shell's own): a member that
# floods us fills only its own queue (replica/inbound.py).
INBOUND_EVENTS_PER_SOURCE_MAX = 5_000
INBOUND_BYTES_PER_SOURCE_MAX = 64 * 1024 * 1024  # as a send queue's: a few full blocks
EVENTS_PER_BATCH_MAX = 512
REGOSSIP_TICKS = 100
# Gossiped transactions of signers our sidecar has not accepted before go through its
# admission check first, at most this many batches of one peer at a time (more are
# dropped, counted `gossip_busy`: the origin gossips again).
GOSSIP_ADMISSIONS_PER_PEER_MAX = 2
# While the core needs no ticks (quiescent: replica/core.py), the ticker waits for the next
# event instead, or this long at most (gauges stay fresh to within it).
IDLE_TICK_S = 1.0
REGOSSIP_TXS_MAX = 256
SHUTDOWN_GRACE_S = 1.0
# Catch-up requests answered at once for one peer; more from it are dropped and counted. Per
# peer, so a flooding member cannot take the slots of another's (an honest member has one
# request out at a time); at most this many times n - 1 read the store at once.
SYNC_SERVING_PER_PEER_MAX = 2
DB_FILE = "replica.db"
# An operator who puts a backup of DB_FILE back creates this file beside it: the replica
# then starts as a restore (safety Rule 6; docs/consensus/fencing.md) and removes it once
# its fence is behind it.
RESTORE_MARKER_FILE = "restored-from-backup"
# Where that restore fenced, `epoch=E view=F`, written before the marker is removed: every
# later epoch the replica enters while it is there starts as a restore again, and it is
# removed once epoch E has committed a block of view F - 1 or later (replica/epochs.py
# `RestoreFence`: a restore across an epoch boundary).
RESTORE_FENCE_FILE = "restore-fence"
# The nonce a declared restore is named by, written into its marker (`_declare_restore`).
RESTORE_NONCE_BYTES = 16

log = logging.getLogger("quorumgate.replica")


@dataclass(frozen=True, slots=True)
class _Tick:
    pass


@dataclass(frozen=True, slots=True)
class _NewTransactions:
    pass


@dataclass(frozen=True, slots=True)
class _NewStateRoot:
    pass


@dataclass(frozen=True, slots=True)
class _EpochProofIn:
    """A peer's proof that our epoch ended (a sync answer of a later epoch)."""

    envelope: Envelope


@dataclass(frozen=True, slots=True)
class _BaseIn:
    """A peer's answer to our request for its committed base (replica/base.py)."""

    envelope: Envelope
    from_height: int


Event = Envelope | _Tick | _NewTransactions | _NewStateRoot | _EpochProofIn | _BaseIn

MEMPOOL_REBUILD_TXS_MAX = 200_000
MEMPOOL_REBUILD_BLOCKS_PER_READ = 256
# How often a replica reads the height its sidecar pruned at (docs/pruning.md): pruning
# follows snapshots, thousands of heights apart, so a few seconds late costs nothing.
PRUNE_POLL_S = 2.0


class ReplicaNode:
    def __init__(self, spec: ClusterSpec, index: int, signer: Ed25519Signer) -> None:
        self.spec = spec
        self.index = index
        self.signer = signer
        self._current_signer: Signer = signer  # our consensus key in the epoch we run
        self.member = spec.member(index)
        # The genesis member set (the cluster file's); the epoch's own is the core's.
        self.membership = spec.membership()
        # A new machine (`init --join`) holds the key a `replace` record gives member
        # `index` from a later epoch on, which its join.json names, not the cluster file's.
        expected = self.membership.key(index) if spec.joined is None else spec.joined.public_key
        if signer.public_key != expected:
            where = "the cluster file" if spec.joined is None else JOIN_FILE
            raise ClusterFileError(
                f"node {index}'s key file does not match its public key in {where}"
            )
        # A chain that runs epochs counts only records its owner signed (docs/consensus/
        # epochs.md, "Who may change the member set"): with the cluster file's key in
        # epoch 0, and in a later epoch with the key the owner records before it left
        # (`_epoch_reading`; "The record key"). The core of each epoch holds its own.
        self.owner_records = spec.record_reader() if spec.runs_epochs else None
        self._epoch_asked_ms = -1  # when we last asked a peer how our epoch ended
        self.limits = Limits(sync_blocks_max=spec.sync_blocks_max)
        self.metrics = ReplicaMetrics(index)
        self.tracer = Tracer(f"replica-{index}")  # off unless QG_TRACE_DIR is set
        self.mempool = Mempool(spec.chain_id, MempoolLimits())  # replaced in start()
        self.store: ReplicaStore | None = None
        self.core: Core | None = None
        # The cluster as it stands in the epoch we run: the cluster file's, with each member
        # a committed `replace` record described swapped in (`_epoch_reading`).
        self.epoch_spec = spec
        # The TLS certificate the epoch we run names for us, which our server presents
        # (`ServedCertificate`): cluster.json's until a `replace` record that keeps our
        # keys commits another (docs/consensus/epochs.md, "TLS keys").
        self.epoch_certificate = self.member.tls_cert
        self.served = ServedCertificate(
            spec.node_dir(index), self.member.tls_cert, lambda: self.epoch_certificate
        )
        self.sidecar = SidecarLink(
            spec,
            index,
            self.metrics,
            self._new_root,
            Reader.of_signer(signer),
            roots=lambda: held_tls_certificates(spec.node_dir(index), self.member.tls_cert),
        )
        self.peers = PeerNetwork(
            spec, index, self._stream_signers, self._key_of, self.metrics, self.on_peer_message
        )
        self._roots_queued = False
        self._events: InboundQueue[Event] = InboundQueue(
            INBOUND_EVENTS_PER_SOURCE_MAX, INBOUND_BYTES_PER_SOURCE_MAX
        )
        self._tick_queued = False
        self._ticks_wanted = asyncio.Event()  # the core needs ticks again: wakes the ticker
        self._txs_queued = False
        self._commit_cond = asyncio.Condition()
        self._stored_at: dict[bytes, float] = {}
        self._qc_seen = b""
        self._server: grpc.aio.Server | None = None
        self.failstop = FailStop()
        self._ticks = 0
        self._dropped_seen: dict[str, int] = {}
        self._refused_seen: dict[str, int] = {}
        self._signatures_seen: dict[str, int] = {}
        self._timeouts_seen = 0
        self._sync_serving: dict[int, int] = {}  # peer -> its catch-up answers running
        self._sync_repeats = SyncRepeats(self.limits.sync_retry_ticks * spec.tick_ms)
        self._pruned_peers: dict[int, int] = {}  # peer -> the history_from it last said
        self._base_asks = BaseAsks(
            self.limits.sync_retry_ticks * spec.tick_ms,
            self.limits.sync_blocks_max,
            self.membership.f + 1,
        )
        self._bases: ChainedBases | None = None  # the chain of epochs a base is checked in
        self._gossip_admitting: dict[int, int] = {}  # peer -> its batches our sidecar judges
        self._peer_tasks: set[asyncio.Task[None]] = set()  # those two kinds, running
        self._restore_marker: Path | None = None  # while a declared restore is fencing
        self._restore_fence: RestoreFence | None = None  # until discharged (RESTORE_FENCE_FILE)
        self._restore_nonce = ""  # the declared restore's, from its marker (_declare_restore)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        node_dir = self.spec.node_dir(self.index)
        self.store = await ReplicaStore.open(node_dir / DB_FILE, self.spec.chain_id)
        recovered = await self.store.load()
        marker = node_dir / RESTORE_MARKER_FILE
        if marker.exists():
            self._restore_marker = marker
            self._restore_nonce = _declare_restore(marker)
            log.warning("event=restore_declared node=%d marker=%s", self.index, marker.name)
        self._restore_fence = _read_restore_fence(node_dir / RESTORE_FENCE_FILE, marker)
        self.mempool = await self._rebuilt_mempool(recovered.committed.height)
        self.core = self._make_core(recovered, self._restore_declared())
        client_api = ClientApi(
            spec=self.spec,
            mempool=self.mempool,
            store=self.store,
            sidecar=self.sidecar,
            peers=self.peers,
            metrics=self.metrics,
            on_transactions=self._transactions_arrived,
            wait_committed=self.wait_committed,
            status=self.status,
            tracer=self.tracer,
        )
        server = grpc.aio.server(options=SERVER_OPTIONS)
        add_service(server, pb_grpc.add_PeerServicer_to_server, self.peers.servicer())
        add_service(server, cpb_grpc.add_ReplicaServicer_to_server, client_api)
        address = add_server_port(server, self.spec, self.index, "replica", self.served)
        await server.start()
        self._server = server
        self.sidecar.open()
        start_http_server(self.member.metrics_port, self.member.host, self.metrics.registry)
        self.peers.follow_now(self.epoch_spec)  # (a restart: where the members are now)
        self.peers.start()
        await self._execute(self.core.start())
        self.failstop.spawn(self._core_loop(), "core")
        self.failstop.spawn(self._ticker(), "ticker")
        self.failstop.spawn(self._follow_prune_floor(), "prune")
        self._update_gauges()
        log.info(
            "event=started node=%d address=%s height=%d view=%d",
            self.index,
            address,
            self.store.committed_height,
            self.core.view,
        )

    async def _follow_prune_floor(self) -> None:
        """Drop committed blocks below the height our sidecar pruned its history at
        (`DIR/node-I/pruned.json`, replica/pruning.py; docs/pruning.md), read every
        `PRUNE_POLL_S`. A file that does not hold a height is logged and left alone."""
        store = self.store
        assert store is not None
        node_dir = self.spec.node_dir(self.index)
        while True:
            await asyncio.sleep(PRUNE_POLL_S)
            try:
                floor = PruneFloor.read(node_dir)
            except (OSError, ValueError) as err:
                log.error("event=prune_floor_unreadable error=%s", err)
                continue
            if floor is None or floor.keep_from_height <= store.history_from:
                continue
            if floor.keep_from_height > store.committed_height:
                continue  # (a wiped log still catching up: nothing to drop yet)
            dropped, before, after = await store.prune_below(floor.keep_from_height)
            log.info(
                "event=pruned keep_from_height=%d blocks=%d bytes_before=%d bytes_after=%d",
                floor.keep_from_height, dropped, before, after,
            )  # fmt: skip

    def _make_core(self, recovered: Recovered, restored: bool) -> Core:
        """The core of the epoch the store is in, signing with that epoch's key of ours."""
        store = self.store
        assert store is not None
        stored = store.epoch
        membership = self.membership if stored is None else stored.membership(self.membership)
        owner_records, self.epoch_spec, report_keys = self._epoch_reading(membership.epoch)
        # Our sidecar's reports and the sidecars' reads follow the epoch's receipt keys
        # (docs/consensus/epochs.md, "Receipt keys"): a key rotated out keeps neither.
        readers = self.spec.receipt_keys if owner_records is None else owner_records.receipt_keys
        self.sidecar.follow_epochs(report_keys, readers)
        self.metrics.epoch.set(membership.epoch)
        self.mempool.enter_epoch(membership.epoch, owner_records)
        signer = self._epoch_signer(membership)
        follower = signer is None
        self._current_signer = self.signer if signer is None else signer
        # (A new machine following an epoch before its own serves its own certificate.)
        own = self.epoch_spec.members[self.index] if self.index < self.epoch_spec.n else None
        self.epoch_certificate = self.member.tls_cert if follower or own is None else own.tls_cert
        self.mempool.certificates = tuple(m.tls_cert for m in self.epoch_spec.members)
        if follower:
            log.info(
                "event=following node=%d epoch=%d hint=this machine is no member of the "
                "epoch: it takes its committed chain from the members and signs nothing "
                "until the epoch that makes it one",
                self.index, membership.epoch,
            )  # fmt: skip
        return Core(
            membership,
            self.index,
            self._current_signer,
            follower=follower,
            limits=self.limits,
            payload=self.mempool,
            execution=self.sidecar.roots,
            recovered=recovered,
            now_ms=self._now_ms(),
            restored=restored,
            hello_nonce=os.urandom(HELLO_NONCE_BYTES),  # fresh at every start (Rule 6)
            epochs=self.spec.runs_epochs,
            owner_records=owner_records,
        )

    def _epoch_reading(self, epoch: int) -> tuple[OwnerRecords | None, ClusterSpec, ReportKeys]:
        """The reader of epoch `epoch`'s records and the cluster as it stands in it: the
        cluster file's owner key and member entries carried through every stored change
        block up to that epoch's start, each handing over to the key its `owner` record
        names, and swapping the member a `replace` record describes (replica/epochs.py
        `owner_after`, `entries_after`). And which receipt key of our member signs our
        sidecar's state-root report of each height, epoch by epoch up to this one
        (`ReportKeys`). Derived from the committed change blocks alone, as every replica,
        sidecar and follower derives them; nothing of it is stored."""
        owner = self.owner_records
        spec = self.spec
        store = self.store
        assert store is not None
        committed = lambda: store.committed_height  # noqa: E731
        if owner is None:
            own = spec.member(self.index).receipt_public_key
            return None, spec, ReportKeys(((1, own),), committed)
        joined = spec.joined
        machine = None if joined is None else (joined.public_key, joined.receipt_public_key)
        before = self.membership
        starts = [(1, member_receipt_key(self.index, before, owner.receipt_keys, machine))]
        for number in range(1, epoch + 1):
            stored = store.started(number)
            if stored is None:
                raise ClusterFileError(
                    f"node {self.index}'s store holds epoch {epoch} but not epoch {number}: "
                    "the record key of its epochs cannot be derived"
                )
            after = stored.membership(self.membership)
            spec = spec.with_entries(entries_after(stored.boundary, before, owner), after.n)
            owner = owner_after(stored.boundary, before, owner)
            before = after
            own = member_receipt_key(self.index, after, owner.receipt_keys, machine)
            starts.append((stored.boundary.height + 1, own))
        return owner, spec, ReportKeys(tuple(starts), committed)

    def _key_of(self, member: int) -> bytes:
        """Member `member`'s consensus key in the epoch we run; no key (nothing checks
        with it) for an index the epoch lacks: one a `remove` took out, whose streams
        end at the boundary, or one an `add` brings later."""
        membership = self.membership if self.core is None else self.core.membership
        return membership.key(member) if membership.is_member(member) else b""

    def _stream_signers(self) -> tuple[Signer, ...]:
        """The consensus keys our peer streams open with: the current epoch's, then the
        other keys our node directory holds (the cluster file's, and keys a rotation
        wrote beside it), so that a peer on either side of a rotation's boundary finds
        the one it expects (runtime/channels.py `peer_auth_metadata`)."""
        held = [self._current_signer]  # (a follower's is its own key)
        for seed in held_consensus_seeds(self.spec.node_dir(self.index)):
            if len(held) == PEER_AUTH_SIGNATURES_MAX:
                break
            if all(s.public_key != public_key_of(seed) for s in held):
                held.append(Ed25519Signer(seed))
        return tuple(held)

    def _epoch_signer(self, membership: Membership) -> Signer | None:
        """Our consensus key in `membership`: the cluster file's, or the one a rotation
        left in our node directory (proto/clusterfile.py `consensus_seed_for`); None on a
        new machine (`init --join`) in an epoch it is no member of, which it follows
        (`Core(follower=True)`)."""
        if not membership.is_member(self.index):
            if self.spec.joined is None or self._was_member(membership.epoch):
                # A `remove` took us out (live, only the highest indexes): we stop for
                # good rather than follow a chain we have no part in.
                raise ClusterFileError(
                    f"node {self.index} is no member of epoch {membership.epoch}: a remove "
                    "record took it out, and it stops for good (docs/consensus/epochs.md, "
                    '"Growing and shrinking")'
                )
            return None  # (an `add` still to commit)
        key = membership.key(self.index)
        if key == self.signer.public_key:
            return self.signer
        seed = consensus_seed_for(self.spec.node_dir(self.index), key)
        if seed is None and self.spec.joined is not None:
            # A new machine in an epoch before the `replace` that makes it member
            # `index`: it only follows, and no member takes its streams there; it
            # catches up by the epoch proof and its pages once the members are past the
            # boundary.
            return None
        if seed is None:
            raise ClusterFileError(
                f"node {self.index} holds no key file for its consensus key of epoch "
                f"{membership.epoch} ({key.hex()[:16]}...)"
            )
        return Ed25519Signer(seed)

    def _was_member(self, epoch: int) -> bool:
        """Whether our key was member `index` of an epoch before `epoch` (a new machine
        that an `add` or `replace` made a member, and that has since been removed)."""
        store = self.store
        assert store is not None
        for number in range(1, epoch):
            stored = store.started(number)
            members = None if stored is None else stored.membership(self.membership)
            if members is not None and members.index_of(self.signer.public_key) == self.index:
                return True
        return False

    async def _rebuilt_mempool(self, committed_height: int) -> Mempool:
        """A mempool whose replay windows know the committed log, so that a restarted
        replica refuses replays of what committed before it stopped. It reads back at
        most `MEMPOOL_REBUILD_TXS_MAX` transactions; with a longer log the windows are
        partial (they refuse what they saw) and the engine stays the authority."""
        store = self.store
        assert store is not None
        blocks: list[Block] = []
        txs = 0
        end = committed_height
        floor = store.history_from  # nothing below it is held when pruned (docs/pruning.md)
        while end >= floor and txs < MEMPOOL_REBUILD_TXS_MAX:
            start = max(floor, end - MEMPOOL_REBUILD_BLOCKS_PER_READ + 1)
            page = await store.committed_range(start, end)
            blocks[:0] = page
            txs += sum(len(b.payload) for b in page)
            end = start - 1
        mempool = Mempool(
            self.spec.chain_id,
            MempoolLimits(),
            complete_history=end < 1,
            owner_records=self.owner_records,
        )
        mempool.on_commit(blocks)
        return mempool

    async def stop(self) -> None:
        await self.failstop.cancel_all()
        await self.peers.stop()
        for task in list(self._peer_tasks):  # catch-up answers and gossip being judged
            task.cancel()
        await asyncio.gather(*self._peer_tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(SHUTDOWN_GRACE_S)
        await self.sidecar.close()
        if self.store is not None:
            await self.store.close()
        log.info("event=stopped node=%d", self.index)

    @staticmethod
    def _now_ms() -> int:
        return int(time.time() * 1000)

    # ------------------------------------------------------------------ events in

    def enqueue(self, event: Event, source: int = LOCAL, size: int = 0) -> bool:
        """Queue an event for the core loop: a peer's message (of `size` bytes) under its
        sender, the shell's own events under LOCAL. False, counted, when that source's
        queue is full."""
        if not self._events.put(source, event, size):
            self.metrics.dropped.labels("inbound_full").inc()
            return False
        return True

    def _transactions_arrived(self) -> None:
        if not self._txs_queued and self.enqueue(_NewTransactions()):
            self._txs_queued = True

    def _new_root(self) -> None:
        if not self._roots_queued:
            self._roots_queued = self.enqueue(_NewStateRoot())

    async def _ticker(self) -> None:
        tick_s = self.spec.tick_ms / 1000
        while True:
            core = self.core
            if core is not None and not core.needs_ticks():
                # Quiescent: no timer runs, so ticks would only cost CPU (0.023 core per
                # replica at 100 a second). Wait until the core loop finds it needs them
                # again (one loop, no await between this check and the clear: no race).
                self._ticks_wanted.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ticks_wanted.wait(), IDLE_TICK_S)
            else:
                await asyncio.sleep(tick_s)
            if not self._tick_queued and self.enqueue(_Tick()):
                self._tick_queued = True

    async def _core_loop(self) -> None:
        while True:
            await self._events.wait()
            batch = self._events.take(EVENTS_PER_BATCH_MAX)
            actions: list[Action] = []
            ticked = False
            for event in batch:
                core = self.core
                assert core is not None
                if isinstance(event, _EpochProofIn):
                    await self._execute(actions)
                    actions = []
                    await self._take_epoch_proof(event.envelope)
                    continue
                if isinstance(event, _BaseIn):
                    await self._execute(actions)
                    actions = []
                    await self._take_base(event.envelope, event.from_height)
                    continue
                if isinstance(event, _Tick):
                    ticked = True
                    self._tick_queued = False
                    self._ticks += 1
                    actions += core.on_tick(self._now_ms())
                    if self._ticks % REGOSSIP_TICKS == 0:
                        self._regossip()
                elif isinstance(event, _NewTransactions):
                    self._txs_queued = False
                    actions += core.on_transactions(self._now_ms())
                elif isinstance(event, _NewStateRoot):
                    self._roots_queued = False
                    actions += core.on_state_root()
                else:
                    actions += core.on_message(event)
                if core.ended is not None:
                    # The change block committed: the next epoch is durable with it, and
                    # the rest of the batch goes to that epoch's core.
                    await self._execute(actions, core.ended)
                    actions = []
                    await self._next_epoch()
            await self._execute(actions)
            core = self.core
            assert core is not None
            if core.needs_ticks():
                self._ticks_wanted.set()
            self.peers.flush_gossip()
            if ticked:  # gauges lag by at most one tick; a busy loop turns far more often
                self._update_gauges()

    # ------------------------------------------------------------------ actions out

    async def _execute(self, actions: list[Action], ended: EpochEnd | None = None) -> None:
        """Perform one batch of the core's actions (replica/actions.py). `ended`: they
        commit the change block that ended the core's epoch; the next epoch's first safety
        state and member set are made durable in the same write."""
        store, core = self.store, self.core
        assert store is not None and core is not None
        durable = actions
        if ended is not None:
            start = epoch_safety_state(ended.boundary, core.safety.state)
            durable = [*actions, PersistSafety(start)]
        if any(not isinstance(a, Send | ScheduleTimeout) for a in durable):
            started = time.perf_counter()
            await store.apply(durable, ended)
            applied = time.perf_counter() - started
            self.metrics.store_apply_latency.observe(applied)
            self.tracer.event("apply", int(applied * 1e6))
        now = time.perf_counter()
        committed = False
        for action in actions:
            if isinstance(action, Send):
                check_send_allowed(action, store.durable_epoch)
                self._send(action)
            elif isinstance(action, StoreBlock):
                if len(self._stored_at) < self.limits.pending_blocks_max:
                    self._stored_at[action.block.hash] = now
                self.tracer.event("stored", action.block.height)
            elif isinstance(action, Commit):
                committed = True  # (the core has told the mempool already)
                self.metrics.blocks_committed.inc(len(action.blocks))
                txs = sum(len(b.payload) for b in action.blocks)
                self.metrics.txs_committed.inc(txs)
                for block in action.blocks:
                    started = self._stored_at.pop(block.hash, -1.0)
                    if started >= 0:
                        self.metrics.commit_latency.observe(now - started)
                    if self.tracer.enabled:
                        ids = [tx_prefix(_traced_id(tx)) for tx in block.payload]
                        self.tracer.event("committed", block.height, *ids)
                if action.blocks[-1].height % 1000 == 0:
                    log.info("event=committed height=%d", action.blocks[-1].height)
            elif isinstance(action, ScheduleTimeout):
                self.tracer.event("view", action.view)
                self.metrics.view.set(action.view)
                self.metrics.leader.set(action.leader)
        if self._restore_marker is not None or self._restore_fence is not None:
            # (`ended`: the epoch's change block is the highest block it commits, whether
            # the core committed it or an epoch proof did.)
            self._settle_restore(core, ended.boundary.view if ended else core.tree.root.view)
        if core.high_qc.block_hash != self._qc_seen:
            self._qc_seen = core.high_qc.block_hash
            self.tracer.event("qc", core.high_qc.height)
            qc_started = self._stored_at.get(self._qc_seen)
            if qc_started is not None:
                self.metrics.qc_latency.observe(now - qc_started)
        if committed:
            for block_hash in [h for h in self._stored_at if h not in core.tree]:
                del self._stored_at[block_hash]
            async with self._commit_cond:
                self._commit_cond.notify_all()

    def _send(self, send: Send, epoch: int | None = None) -> None:
        """`send` in an envelope naming `epoch`, or our core's (docs/consensus/epochs.md,
        "Signatures name their epoch")."""
        if epoch is None:
            assert self.core is not None
            epoch = self.core.epoch
        envelope = Envelope(self.spec.chain_id, self.index, send.message, epoch)
        message = envelope_to_pb(envelope)
        self.peers.send(send.to, message)
        if send.to is not None and isinstance(send.message, SyncRequest):
            self.metrics.sync_requests.inc()

    # ------------------------------------------------------------------ peer messages

    def on_peer_message(self, message: pb.ConsensusMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "tx_batch":
            if message.chain_id != self.spec.chain_id:
                self.metrics.dropped.labels("wrong_chain").inc()
                return
            self._on_gossip(message.sender, message.tx_batch.txs[:GOSSIP_BATCH_TXS_MAX])
            return
        try:
            envelope = envelope_from_pb(message)
        except RemoteError as err:
            self.metrics.dropped.labels(err.reason).inc()
            return
        sender = envelope.sender
        # (The members of the epoch we run: an `add` brings indexes epoch 0 lacks.)
        if not 0 <= sender < self.epoch_spec.n or sender == self.index:
            self.metrics.dropped.labels("non_member").inc()
            return
        core = self.core
        if isinstance(envelope.message, SyncResponse):
            self._note_pruned_peer(sender, envelope.message)
            if self._base_answer(envelope):
                return
        # (Our core's epoch ended and the next one's core is about to start: its messages
        # wait in the queue for it rather than be dropped.)
        switching = core is not None and core.ended is not None
        if core is not None and envelope.epoch > core.epoch + int(switching):
            self._from_later_epoch(envelope)
            return
        if isinstance(envelope.message, SyncRequest) and core and envelope.epoch < core.epoch:
            self._run_for_peer(
                self._sync_serving, SYNC_SERVING_PER_PEER_MAX, sender, "sync_busy",
                lambda: self._answer_with_epoch_proof(envelope),
            )  # fmt: skip
            return
        if isinstance(envelope.message, SyncRequest):
            # Catch-up answers read the store off the core loop, at most
            # SYNC_SERVING_PER_PEER_MAX at a time for each peer: a peer that floods
            # requests gets the rest dropped and counted (one unbounded task each
            # would not be), and cannot take another peer's turn (one bound for all would).
            self._run_for_peer(
                self._sync_serving, SYNC_SERVING_PER_PEER_MAX, sender, "sync_busy",
                lambda: self._answer_sync(envelope),
            )  # fmt: skip
            return
        self.enqueue(envelope, sender, message.ByteSize())

    def _note_pruned_peer(self, sender: int, response: SyncResponse) -> None:
        """A peer that pruned below the heights we asked answers with no blocks and its
        `history_from` (docs/pruning.md): say so once per peer and height, for the
        operator; once f+1 peers said so, ask one of them for its committed base
        (replica/base.py `BaseAsks`). The core goes on to ask the next peer as for any
        empty answer."""
        store = self.store
        if store is None or response.committed or not response.history_from:
            return
        height = store.committed_height
        if response.history_from <= height + 1:
            return
        # A peer of a later epoch sends the chain of epochs with its answer: the base is
        # asked for in the newest epoch that checks, above its change block (replica/
        # base.py `ChainedBases`).
        bases = self._chained_bases()
        self._learn_epochs(bases, sender, response)
        start = bases.base_from(response.history_from)
        asked = self._base_asks.ask(sender, start, height, _monotonic_ms())
        if asked is not None:
            self._send(Send(*asked))
        if self._pruned_peers.get(sender) == response.history_from:
            return
        self._pruned_peers[sender] = response.history_from
        log.warning(
            "event=sync_peer_pruned peer=%d history_from=%d committed_height=%d "
            "hint=the peer pruned the heights this replica lacks; it takes a peer's "
            "committed base from there (docs/pruning.md)",
            sender, response.history_from, height,
        )  # fmt: skip

    def _base_answer(self, envelope: Envelope) -> bool:
        """True if `envelope` answers our request for a base: it goes to the core loop
        (`_take_base`), not to the core, whose log it does not continue."""
        store, core = self.store, self.core
        response = envelope.message
        assert isinstance(response, SyncResponse)
        if store is None or core is None or envelope.epoch < core.epoch:
            return False
        start = self._base_asks.answered(envelope.sender, response, store.committed_height)
        if start is None:
            return False
        self.enqueue(_BaseIn(envelope, start), envelope.sender)
        return True

    def _on_gossip(self, sender: int, txs: Iterable[bytes]) -> None:
        """A peer's batch of transactions (its stream authenticated it). Each is checked
        here as a client's is: signature, then, unless our sidecar accepted its signer
        before, the sidecar's admission check. A member could otherwise fill every honest
        mempool with validly signed transactions of keys nobody registered (a fresh key
        per transaction), and honest clients' transactions were then refused as
        `mempool_full` everywhere."""
        known: list[tuple[bytes, ParsedTx | RecordTx]] = []
        unknown: list[tuple[bytes, ParsedTx]] = []
        for tx in txs:
            checked = self.mempool.precheck(tx)
            if isinstance(checked, Admission):
                if checked.reason in FORGED_GOSSIP_REASONS:
                    # An honest member gossips only what it admitted, and these checks
                    # depend on the bytes alone: the sender is faulty. The rest of its
                    # batch goes unchecked (a batch of forgeries cost 512 Ed25519 checks).
                    self.metrics.dropped.labels("forged_gossip").inc()
                    break
                continue  # already pending, or too large
            if isinstance(checked, RecordTx):  # the owner's, checked: no sidecar judges it
                known.append((bytes(tx), checked))
                continue
            signer_known = self.sidecar.accepted_before(checked.signer)
            (known if signer_known else unknown).append((bytes(tx), checked))
        self._take_gossip(known)
        if not unknown:
            return
        self._run_for_peer(
            self._gossip_admitting, GOSSIP_ADMISSIONS_PER_PEER_MAX, sender, "gossip_busy",
            lambda: self._admit_gossip(unknown),
        )  # fmt: skip

    async def _admit_gossip(self, checked: list[tuple[bytes, ParsedTx]]) -> None:
        answers = await self.sidecar.admission(
            [data for data, _ in checked], [parsed.signer for _, parsed in checked]
        )
        store = self.store
        assert store is not None
        behind = self.sidecar.executed_height < store.committed_height
        taken: list[tuple[bytes, ParsedTx]] = []
        for (data, parsed), (accepted, reason) in zip(checked, answers, strict=True):
            if sidecar_refuses(accepted, reason, behind):
                self.metrics.dropped.labels("gossip_refused").inc()
                continue
            taken.append((data, parsed))
        self._take_gossip(taken)

    def _take_gossip(self, checked: Sequence[tuple[bytes, ParsedTx | RecordTx]]) -> None:
        fresh = False
        for data, parsed in checked:
            fresh = self.mempool.admit_checked(data, parsed).accepted or fresh
        if fresh:
            self._transactions_arrived()

    def _run_for_peer(
        self,
        running: dict[int, int],
        limit: int,
        sender: int,
        busy: str,
        work: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        """Run `work` off the core loop unless `sender` already has `limit` such tasks
        running (then it is dropped and counted as `busy`): each peer has its own turns,
        so one that floods cannot take another's."""
        if running.get(sender, 0) >= limit:
            self.metrics.dropped.labels(busy).inc()
            return
        running[sender] = running.get(sender, 0) + 1

        def done(task: asyncio.Task[None]) -> None:
            running[sender] -= 1
            self._peer_tasks.discard(task)
            _log_task_error(task)

        task = asyncio.create_task(work())
        self._peer_tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(done)

    async def _answer_sync(self, envelope: Envelope) -> None:
        store, core = self.store, self.core
        assert store is not None and core is not None
        request = envelope.message
        assert isinstance(request, SyncRequest)
        if envelope.chain_id != self.spec.chain_id:
            self.metrics.dropped.labels("wrong_chain").inc()
            return
        if not self._sync_repeats.admit(envelope.sender, request, _monotonic_ms()):
            self.metrics.dropped.labels("sync_repeat").inc()
            return
        response = await store.sync_response(request, core, self.limits)
        self._send(Send(envelope.sender, response))

    # ------------------------------------------------------------------ epochs

    def _from_later_epoch(self, envelope: Envelope) -> None:
        """A message of an epoch after ours: our epoch ended without us. A sync answer
        from there is the proof of it (for the core loop to check); anything else makes
        us ask its sender for that proof, at most once per `sync_retry_ticks`
        (docs/consensus/epochs.md, "Catching up")."""
        if isinstance(envelope.message, SyncResponse):
            if not envelope.message.committed and envelope.message.history_from:
                return  # the peer pruned what we lack: noted (`_note_pruned_peer`)
            self.enqueue(_EpochProofIn(envelope), envelope.sender)
            return
        self.metrics.dropped.labels("future_epoch").inc()
        store = self.store
        now = _monotonic_ms()
        wait_ms = self.limits.sync_retry_ticks * self.spec.tick_ms
        if store is None or (self._epoch_asked_ms >= 0 and now - self._epoch_asked_ms < wait_ms):
            return
        self._epoch_asked_ms = now
        request = SyncRequest(store.committed_height + 1, self.limits.sync_blocks_max)
        # Once a peer said it pruned what we lack, every peer is asked at once: a base is
        # taken only when f+1 of them said so (replica/base.py `BaseAsks`).
        self._send(Send(None if self._pruned_peers else envelope.sender, request))

    async def _answer_with_epoch_proof(self, envelope: Envelope) -> None:
        """A peer still in an epoch we left asks for blocks: hand it the proof of how that
        epoch ended instead (replica/epochs.py `EpochProof`), as a sync answer our
        envelope's later epoch marks as such. Bounded by the sync limits the asker checks."""
        store = self.store
        request = envelope.message
        assert store is not None and isinstance(request, SyncRequest)
        stored = store.started(envelope.epoch + 1)
        if stored is None or envelope.chain_id != self.spec.chain_id:
            self.metrics.dropped.labels("epoch_unknown").inc()
            return
        if not self._sync_repeats.admit(envelope.sender, request, _monotonic_ms()):
            self.metrics.dropped.labels("sync_repeat").inc()
            return
        top = stored.boundary.height
        if request.from_height < store.history_from or request.from_height > top:
            # It lacks heights we pruned, or asks past its epoch's end (a base): answered
            # from our log as any catch-up request, with the chain of epochs it checks
            # before it takes a base of a later epoch (docs/pruning.md).
            response = await store.sync_response(request, self.core, self.limits)
            links = self._stored_links()
            self._send(Send(envelope.sender, replace(response, epoch_ends=links)))
            return
        reach = epoch_proof_reach(self.limits)
        end = EpochEnd(
            stored.boundary, stored.membership(self.membership), stored.suffix, stored.qc
        )
        if request.from_height >= 1 and needs_pages(request.from_height, end, reach):
            # Too far behind for the proof to chain from what it holds: a page of the
            # old epoch's committed chain below the change block, proven by the old
            # members' certificates; it asks for the next one when it has taken it.
            first = request.from_height
            last = min(top, first + self.limits.sync_blocks_max + 1)
            page = epoch_page(await store.committed_range(first, last), end, self.limits)
            if page is None:
                self.metrics.dropped.labels("epoch_page_unproven").inc()
                return
            self._send(Send(envelope.sender, page), stored.epoch)
            return
        start = max(1, min(request.from_height, top), top + 1 + len(stored.suffix) - reach)
        blocks = [*await store.committed_range(start, top), *stored.suffix]
        response = SyncResponse(tuple(blocks[:-1]), (blocks[-1],), stored.qc, (), top)
        self._send(Send(envelope.sender, response), stored.epoch)

    async def _take_epoch_proof(self, envelope: Envelope) -> None:
        """(On the core loop.) A proof that our epoch ended: if it holds, commit what it
        commits through the change block, with the next epoch in the same write, and go
        on in that epoch."""
        core, response = self.core, envelope.message
        assert core is not None and isinstance(response, SyncResponse)
        if core.ended is not None or envelope.epoch <= core.epoch:
            return
        try:
            check_sync_response(response, core.membership, self.limits)
            if is_epoch_page(response, core.membership, core.owner_records):
                # A page of our epoch's chain below its change block: the core takes it
                # as any sync answer, by its certificates (Core.catch_up_from).
                actions = core.catch_up_from(envelope.sender, response)
                await self._execute(actions, core.ended)
                if core.ended is not None:
                    await self._next_epoch()
                return
            if response.proof_qc is None:
                raise RemoteError("bad_epoch_proof", "no certificate")
            proof = EpochProof(
                core.epoch, (*response.committed, *response.proof), response.proof_qc
            )
            owner = core.owner_records
            blocks, nxt = check_epoch_proof(core.checker, core.tree.root, proof, owner)
        except RemoteError as err:
            self.metrics.dropped.labels(err.reason).inc()
            return
        boundary = blocks[-1]
        suffix = tuple(b for b in proof.blocks if b.height > boundary.height)
        end = EpochEnd(boundary, nxt, suffix, proof.qc)
        self.mempool.on_commit(blocks)
        # (The store keeps no proof row for a change block: the epoch row holds its QC.)
        commit = Commit(tuple(blocks), CommitProof.two_chain(suffix[-1], proof.qc))
        await self._execute([commit], end)
        await self._next_epoch()

    def _chained_bases(self) -> ChainedBases:
        """The chain of epochs a base is checked in: from the cluster file through the
        epoch ends our store holds (checked again, as a follower checks them), then
        extended by what peers send (`_learn_epochs`)."""
        store = self.store
        assert store is not None
        if self._bases is None:
            bases = ChainedBases(self.membership, self.owner_records)
            bases.learn(self._stored_links())
            self._bases = bases
        return self._bases

    def _stored_links(self) -> tuple[EpochLink, ...]:
        """Every epoch end our store holds, oldest first, as the wire carries them."""
        store = self.store
        assert store is not None
        return tuple(
            EpochLink(e.epoch, b"".join(e.keys), encode_epoch_end(e.boundary, e.suffix, e.qc))
            for e in store.epoch_ends
        )

    def _learn_epochs(self, bases: ChainedBases, sender: int, response: SyncResponse) -> bool:
        """Extend `bases` by the chain of epochs `sender` sent; False, logged and counted,
        if its links do not check (a forged or altered link changes nothing)."""
        try:
            grew = bases.learn(response.epoch_ends)
        except EpochChainError as err:
            self.metrics.dropped.labels("bad_epoch_chain").inc()
            log.warning(
                "event=epoch_chain_refused from_peer=%d epoch=%d reason=%s",
                sender, err.epoch, err.reason,
            )  # fmt: skip
            return False
        if grew:
            log.info(
                "event=epoch_chain_learned from_peer=%d epoch=%d boundary_height=%d",
                sender, bases.chain.current.epoch, bases.chain.current.boundary_height,
            )  # fmt: skip
        return True

    async def _take_base(self, envelope: Envelope, from_height: int) -> None:
        """(On the core loop.) A peer's committed base, asked for because every peer we
        asked pruned below what we lack: if its proof holds, it becomes our committed log
        (the store's history starts there, as a pruned store's), and a core started from
        it syncs forward as after a restart (docs/pruning.md). A base of a later epoch
        than ours is checked with that epoch's member set, learnt link by link from the
        cluster file (replica/base.py `ChainedBases`), and is installed with the epochs
        up to it; our core then starts in that epoch."""
        store, core, response = self.store, self.core, envelope.message
        assert store is not None and core is not None and isinstance(response, SyncResponse)
        if from_height <= store.committed_height + 1:
            return  # ordinary catch-up reached it meanwhile
        bases = self._chained_bases()
        ours = 0 if store.epoch is None else store.epoch.epoch
        try:
            if not self._learn_epochs(bases, envelope.sender, response):
                raise RemoteError("bad_base", "the chain of epochs sent with it does not check")
            check_sync_response(response, bases.epoch_of(from_height).membership, self.limits)
            base, epoch = bases.check(response, from_height)
            if epoch.epoch < ours:
                raise RemoteError("bad_base", f"a base of epoch {epoch.epoch} below ours")
        except RemoteError as err:
            self.metrics.dropped.labels(err.reason).inc()
            log.warning(
                "event=base_refused from_peer=%d height=%d reason=%s",
                envelope.sender, from_height, err.reason,
            )  # fmt: skip
            return
        where = f"the chain of epochs peer {envelope.sender} sent"
        rows = tuple(
            decode_epoch_row(where, self.spec.chain_id, int(e.epoch), e.keys, e.ended)
            for e in bases.links(ours)[: epoch.epoch - ours]
        )
        safety = None
        if rows:
            safety = epoch_safety_state(rows[-1].boundary, core.safety.state)
        await store.install_base(base.blocks, base.proof, rows, safety)
        self.mempool.forget_history()
        self.mempool.on_commit(base.blocks)
        log.warning(
            "event=installed_base height=%d top=%d from_peer=%d epoch=%d hint=this replica "
            "holds no blocks below height %d: catch its sidecar up with quorumgate replay "
            "--from-snapshot if it is behind (docs/pruning.md)",
            base.height, base.top, envelope.sender, epoch.epoch, base.height,
        )  # fmt: skip
        if rows:
            # Into the base's epoch, as at a boundary: its core, its peers' keys and
            # addresses (fenced as a restore while one is declared).
            await self._next_epoch()
        else:
            # A restart's core, from what the store now holds; still fenced (safety Rule 6).
            await self._restart_core(restored=self._restore_declared())
        self._update_gauges()
        async with self._commit_cond:
            self._commit_cond.notify_all()

    def _restore_declared(self) -> bool:
        """Whether a core started now fences as a restore: the marker is there, or a
        restore fenced in an earlier epoch and is not discharged (every epoch entered
        until then is fenced: docs/consensus/fencing.md, "Across an epoch boundary"); not
        if it fenced in the epoch the store is in."""
        store, fence = self.store, self._restore_fence
        assert store is not None
        epoch = 0 if store.epoch is None else store.epoch.epoch
        if fence is not None and fence.epoch == epoch:
            return False
        return self._restore_marker is not None or fence is not None

    def _settle_restore(self, core: Core, committed_view: int) -> None:
        """After a batch the store applied: once a declared restore is past its fence,
        write down where (`restore-fence`) and only then remove the marker; remove the
        fence file once the epoch it names has committed a block of the view before the
        fence (its change block included: `RestoreFence`). `committed_view`: the view of
        the highest block committed in the core's epoch."""
        node_dir = self.spec.node_dir(self.index)
        fence = self._restore_fence
        if core.restore_fence and (fence is None or fence.epoch != core.epoch):
            # The restore the fence answers for: the declared one (its marker's nonce), or,
            # once the marker is gone, the one the fence of an earlier epoch answered for.
            restore = self._restore_nonce or (fence.restore if fence is not None else "")
            fence = RestoreFence(core.epoch, core.restore_fence, restore)
            _write_restore_fence(node_dir / RESTORE_FENCE_FILE, fence)
            self._restore_fence = fence
        marker = self._restore_marker
        if marker is not None and fence is not None and fence.epoch == core.epoch:
            # The fence is durable (the store applied it above): later starts in this
            # epoch are plain.
            marker.unlink(missing_ok=True)
            self._restore_marker = None
            log.warning(
                "event=restore_fenced node=%d epoch=%d view=%d fence=%d",
                self.index, core.epoch, core.view, fence.view,
            )  # fmt: skip
        if fence is not None and fence.discharged(core.epoch, committed_view):
            (node_dir / RESTORE_FENCE_FILE).unlink(missing_ok=True)
            self._restore_fence = None
            log.warning(
                "event=restore_discharged node=%d epoch=%d committed_view=%d",
                self.index, core.epoch, committed_view,
            )  # fmt: skip

    async def _next_epoch(self) -> None:
        """The store holds a newer epoch than the core runs: start that epoch's core from
        what the store holds, exactly as a restart would (fenced as a restore while one is
        declared)."""
        store = self.store
        assert store is not None
        self._bases = None  # (rebuilt from the store's epochs when next needed)
        certificate = self.epoch_certificate
        core = await self._restart_core(restored=self._restore_declared())
        if self.epoch_certificate != certificate:
            # Our TLS key was rotated: new handshakes get the new certificate
            # (`ServedCertificate`), and the link to our sidecar, which moves to it when
            # it executes the change block, trusts both from here on.
            self.sidecar.reopen()
        # A stream a member opened with a key this epoch no longer gives it ends here: a
        # rotated-out key (perhaps stolen, the reason for the rotation) keeps no stream.
        ended = self.peers.end_streams_of_old_keys()
        # A member replaced (a new machine) is reached at its new address from here on.
        relinked = await self.peers.follow(self.epoch_spec)
        log.info(
            "event=epoch_started node=%d epoch=%d height=%d streams_ended=%d relinked=%s",
            self.index,
            core.epoch,
            store.committed_height,
            ended,
            ",".join(map(str, relinked)) or "none",
        )

    async def _restart_core(self, restored: bool) -> Core:
        """Replace the core by one started from what the store holds, exactly as a
        restart would (fenced: safety Rule 6, docs/consensus/fencing.md)."""
        store = self.store
        assert store is not None
        self._update_gauges()  # the old core's counts, before its successor's start at 0
        self._dropped_seen.clear()
        self._refused_seen.clear()
        self._timeouts_seen = 0
        core = self._make_core(await store.load(), restored=restored)
        self.core = core
        await self._execute(core.start())
        self._ticks_wanted.set()
        return core

    # ------------------------------------------------------------------ gossip

    def _regossip(self) -> None:
        """Pass on again what is still pending, in case a peer missed it (lost messages,
        a restart): each replica's mempool must hold what the next leader may propose."""
        self.peers.gossip(list(self.mempool.recent(REGOSSIP_TXS_MAX)))

    async def wait_committed(self, height: int) -> None:
        """Return once the committed height reaches `height`."""
        store = self.store
        assert store is not None
        async with self._commit_cond:
            await self._commit_cond.wait_for(lambda: store.committed_height >= height)

    # ------------------------------------------------------------------ gauges

    def _update_gauges(self) -> None:
        core, store, m = self.core, self.store, self.metrics
        assert core is not None and store is not None
        m.committed_height.set(store.committed_height)
        m.view.set(core.view)
        m.epoch.set(core.epoch)
        m.leader.set(core.leader)
        m.mempool_txs.set(self.mempool.size)
        m.mempool_bytes.set(self.mempool.bytes)
        m.peers_connected.set(len(self.peers.connected()))
        m.sync_target.set(core.stats.sync_target)
        for reason, count in core.dropped.items():
            seen = self._dropped_seen.get(reason, 0)
            if count > seen:
                m.dropped.labels(reason).inc(count - seen)
                self._dropped_seen[reason] = count
        for rule, count in core.stats.refused.items():
            seen = self._refused_seen.get(rule, 0)
            if count > seen:
                m.refused_signatures.labels(rule).inc(count - seen)
                self._refused_seen[rule] = count
        for how, count in (
            ("verified", self.mempool.signatures_verified),
            ("cached", self.mempool.signatures_cached),
        ):
            seen = self._signatures_seen.get(how, 0)
            if count > seen:
                m.tx_signatures.labels(how).inc(count - seen)
                self._signatures_seen[how] = count
        if core.stats.timeouts_sent > self._timeouts_seen:
            m.timeouts.inc(core.stats.timeouts_sent - self._timeouts_seen)
            self._timeouts_seen = core.stats.timeouts_sent

    def status(self) -> cpb.StatusReply:
        core, store = self.core, self.store
        assert core is not None and store is not None
        # Height and hash of one block, the durable head: the core's root moves at a commit
        # before the shell has made it durable.
        head = store.committed_head
        return cpb.StatusReply(
            chain_id=self.spec.chain_id,
            node=self.index,
            committed_height=head.height,
            committed_hash=head.hash,
            view=core.view,
            leader=core.leader,
            peers_connected=self.peers.connected(),
            mempool_txs=self.mempool.size,
            mempool_bytes=self.mempool.bytes,
            members=self.spec.n,
            f=self.spec.f,
            sync_target_height=core.stats.sync_target,
            epoch=core.epoch,
        )


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _declare_restore(marker: Path) -> str:
    """The nonce that names the restore `marker` declares: the one the marker holds, or,
    for a marker as the operator made it (empty, or holding anything else), a fresh one
    written into it whole (a temporary file renamed over it, synced) before anything is
    fenced. A restart of the same restore finds the same nonce; a new restore's marker,
    made afresh, gets a new one."""
    try:
        held = marker.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        held = ""
    name, _, nonce = held.partition("=")
    if name == "restore" and len(nonce) == RESTORE_NONCE_BYTES * 2 and _is_hex(nonce):
        return nonce
    nonce = secrets.token_hex(RESTORE_NONCE_BYTES)
    _write_whole(marker, f"restore={nonce}\n")
    return nonce


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _read_restore_fence(path: Path, marker: Path) -> RestoreFence | None:
    """The fence a declared restore noted, or None: none noted, unreadable, or noted by
    another restore than the one a marker that is there declares (a restore done by hand
    after it, which made the marker again and left the file: that copy has fenced
    nowhere). Told by content, the marker's nonce (`_declare_restore`); as a second
    guard, a file not newer than the marker is void too. A restore that fences again
    loses nothing but time."""
    try:
        if not path.exists():
            return None
        fence = RestoreFence.parse(path.read_text(encoding="ascii"))
        if fence is None or not marker.exists():
            return fence
        held = marker.read_text(encoding="ascii").strip()
        if not fence.restore or held != f"restore={fence.restore}":
            return None
        if path.stat().st_mtime_ns <= marker.stat().st_mtime_ns:
            return None
        return fence
    except (OSError, UnicodeDecodeError):
        return None


def _write_restore_fence(path: Path, fence: RestoreFence) -> None:
    _write_whole(path, fence.encode())


def _write_whole(path: Path, text: str) -> None:
    """Write the file whole or not at all (a temporary file renamed over it, synced)."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", encoding="ascii") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def _log_task_error(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("event=task_failed task=%s error=%r", task.get_name(), task.exception())


# ============================================================================ process


async def make_replica(spec: ClusterSpec, index: int) -> ReplicaNode:
    seed = read_seed(spec.node_dir(index) / CONSENSUS_KEY_FILE)
    return ReplicaNode(spec, index, Ed25519Signer(seed))


def main(argv: list[str] | None = None) -> int:
    return process_main(
        argv, kind="replica", description="Run one QuorumGate replica.", make=make_replica
    )


def _traced_id(tx: bytes) -> bytes:
    """A committed transaction's id for a trace line (tracing only: decoded again here)."""
    try:
        return parse(tx, verify=False).tx_id
    except TxRejected:
        return raw_tx_id(tx)


if __name__ == "__main__":
    sys.exit(main())
