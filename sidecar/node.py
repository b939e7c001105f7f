"""The execution sidecar process: committed log in; verdicts, receipts, artifacts, ledger and
state roots out (docs/sidecar.md).

    python -m quorumgate.sidecar.node --dir DIR --node I      (what `quorumgate up` starts)

It follows its replica's committed-block stream strictly in height order and runs the
governance engine over each block. Everything a height produces — ledger entries, receipts,
artifacts, the signed block statement, the engine state — is written in one SQLite
transaction (sidecar/store.py), so a restart resumes exactly after the last executed
height: none twice, none skipped. After each height it reports the state root to its
replica, signed with its receipt key; leaders carry such roots into later blocks. Every
snapshot interval it writes its state to disk and serves it to the other members
(`ListSnapshots`, `SnapshotChunk`: docs/snapshots.md).

Divergence alarm: when a committed block carries the state root of a height this sidecar
has executed and the two differ, this sidecar is the faulty one (a committed root had the
votes of 2f+1 replicas, each checking it against its own sidecar). It raises the alarm —
the `qg_sidecar_divergence` metric, an ERROR log line, `diverged` in its status — and stops
executing until an operator acts (`quorumgate replay`, or wiping its state). It keeps
serving what it executed before.

Signatures in committed blocks were verified by the replicas before they voted (2f+1 of
them, so at least f+1 honest), so the engine runs with `verify_signatures=False`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import Counter as Tally
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import NamedTuple

import grpc
from nacl.signing import SigningKey
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import (
    RECEIPT_KEY_FILE,
    ClusterFileError,
    ClusterSpec,
    held_receipt_seeds,
    held_tls_certificates,
    read_seed,
)
from quorumgate.proto.model import Outcome, TxKind
from quorumgate.proto.reports import root_report_statement
from quorumgate.proto.tx import TxRejected, parse, tx_id
from quorumgate.replica.types import Block, RemoteError
from quorumgate.replica.wire import decode_block, decode_epoch_end
from quorumgate.runtime.channels import ServedCertificate, add_server_port, aio_channel
from quorumgate.runtime.grpcutil import add_service
from quorumgate.runtime.links import SERVER_OPTIONS, StreamTurns
from quorumgate.runtime.process import FailStop, process_main
from quorumgate.runtime.readauth import (
    METHOD_ACCOUNT,
    METHOD_ADMIT,
    METHOD_ADMIT_BATCH,
    METHOD_GET_RECEIPT,
    METHOD_LEDGER,
    METHOD_LIST_SNAPSHOTS,
    METHOD_PENDING,
    METHOD_RECEIPTS,
    METHOD_REGISTRY,
    METHOD_SNAPSHOT_CHUNK,
    Role,
    caller_key,
    may_call,
    role_of,
)
from quorumgate.runtime.readwaits import CallerKind, WaitSlots
from quorumgate.runtime.tracing import Tracer
from quorumgate.sidecar.audit import (
    STARTUP_AUDIT_HEIGHTS,
    AuditCursor,
    audit_rows,
)
from quorumgate.sidecar.engine.core import Engine, StateCacheError, config_for_cluster
from quorumgate.sidecar.engine.statements import ConfirmationCard
from quorumgate.sidecar.execution import execute_block
from quorumgate.sidecar.pruning import Pruner
from quorumgate.sidecar.receiptkeys import ReadKeys, ReceiptKeys
from quorumgate.sidecar.receipts import Receipt
from quorumgate.sidecar.snapshots import (
    SNAPSHOT_ATTEST_HEIGHTS_MAX,
    SNAPSHOT_DIR,
    SNAPSHOTS_LISTED_MAX,
    Attestation,
    SnapshotDir,
    SnapshotOptions,
)
from quorumgate.sidecar.store import (
    LEDGER_PAGE_ROWS_MAX,
    Checkpoint,
    DivergenceError,
    ExecutedHeight,
    HeightRows,
    SidecarStore,
    SidecarStoreError,
)
from quorumgate.sidecar.waits import HeightIndex
from quorumgate.sidecar.wire import receipt_to_pb, registry_content, registry_scope

RECONNECT_DELAY_S_MIN = 0.05
RECONNECT_DELAY_S_MAX = 2.0
ADMIT_BATCH_TXS_MAX = 4_096
ROOTS_RESENT_ON_CONNECT = 256
OWN_TXS_MAX = 64  # transactions a Receipts request may name as its own
RECEIPT_WAIT_MS_MAX = 1000  # how long one GetReceipt long poll may wait (a client asks again)
READ_REFUSAL_DETAIL = "a verdict answers the owner, members, auditors and the agent it is about"
REGISTRY_REFUSAL_DETAIL = (
    "the registry answers the owner, members and auditors, and an agent or a principal its "
    "own part (docs/security/reads-and-certificates.md)"
)
WAITS_FULL_DETAIL = (
    "this key, or every key of its kind together, holds as many waiting reads (Receipts "
    "streams, long polls) as a server allows (runtime/readwaits.py); close one and ask again"
)
# Signed proposals of open cards kept in memory (filled as blocks execute; after a restart
# read again from the replica's committed blocks): what `Pending` shows values from.
PENDING_TXS_KEPT_MAX = 8192
PENDING_FETCH_TIMEOUT_S = 5.0
PENDING_FETCHES_MAX = 2  # Pending's reads of the replica's log at once (each one a stream)
RECEIPT_BATCH_LEAVES_MAX = 4_096  # receipts per stream message (~2 MB)
# Executed heights whose Receipts stream messages stay in memory, built once and sent to
# every subscriber; older heights are read from the store.
RECENT_RECEIPT_HEIGHTS = 64
# Older heights an agent's Receipts stream passes are searched for its verdicts this many
# at a time, in one store read (sidecar/store.py, `heights_holding`).
RECEIPTS_SCAN_HEIGHTS = 4_096
DB_FILE = "sidecar.db"
REGISTRY_WAIT_S = 2.0  # a Registry request for a height not executed yet waits this long
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

log = logging.getLogger("quorumgate.sidecar")


class SidecarMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.executed_height = Gauge(
            "qg_sidecar_executed_height", "Last executed height", registry=r
        )
        self.replica_height = Gauge(
            "qg_sidecar_replica_committed_height", "Replica's committed height seen", registry=r
        )
        self.lag = Gauge(
            "qg_sidecar_execution_lag_blocks",
            "Committed heights not yet executed",
            registry=r,
        )
        self.verdicts = Counter(
            "qg_sidecar_verdicts",
            "Verdicts by outcome and reason",
            ["outcome", "reason"],
            registry=r,
        )
        self.artifacts = Counter(
            "qg_sidecar_artifacts_written", "Rejection artifacts written", registry=r
        )
        self.latch_halts = Counter(
            "qg_sidecar_latch_halts", "Runs halted by the denial latch", registry=r
        )
        self.pending = Gauge(
            "qg_sidecar_pending_confirmations", "Calls waiting for a confirmation", registry=r
        )
        self.audited = Counter(
            "qg_sidecar_heights_audited",
            "Executed heights checked against this sidecar's own signed statements",
            registry=r,
        )
        self.divergence = Gauge(
            "qg_sidecar_divergence",
            "1 when this sidecar's state root differs from a committed one (stopped)",
            registry=r,
        )
        self.read_waits = Gauge(
            "qg_sidecar_read_waits",
            "Reads held waiting for a height (long polls, Receipts streams, Registry), "
            "by kind of caller",
            ["caller"],
            registry=r,
        )
        self.read_waits_refused = Counter(
            "qg_sidecar_read_waits_refused",
            "Reads refused a wait: the caller's key or kind held all it may (runtime/readwaits.py)",
            ["caller", "method"],
            registry=r,
        )
        self.execute_latency = Histogram(
            "qg_sidecar_block_seconds",
            "Executing and durably recording one block",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.admissions = Counter(
            "qg_sidecar_admissions", "Admission checks by result", ["result"], registry=r
        )


class _RecentHeight(NamedTuple):
    batches: list[spb.ReceiptBatch]  # its Receipts stream messages
    index: HeightIndex  # whose verdicts it holds


class Sidecar:
    def __init__(self, spec: ClusterSpec, index: int, receipt_key: SigningKey) -> None:
        self.spec = spec
        self.index = index
        self.member = spec.member(index)
        if bytes(receipt_key.verify_key) != self.member.receipt_public_key:
            raise ClusterFileError(
                f"node {index}'s receipt key does not match its receipt public key"
            )
        self.key = receipt_key
        # The receipt key of the epoch of the next block executed (docs/consensus/
        # epochs.md, "Receipt keys"): started from the replica's stored epoch ends before
        # the first block, then moved on at each change block executed.
        self.receipt_keys = ReceiptKeys(
            spec, index, spec.node_dir(index), receipt_key, self.member.tls_cert
        )
        self._receipt_epoch_known = not spec.runs_epochs
        # Set once the epoch of the next block is known: the state-root reports wait for
        # it, each signed with the receipt key of its height's epoch.
        self._receipt_epoch_ready = asyncio.Event()
        if self._receipt_epoch_known:
            self._receipt_epoch_ready.set()
        # The key our reads of our replica are signed with: its receipt key of the epoch
        # the replica runs, found by trying the ones the node directory holds.
        self.read_keys = ReadKeys(spec.node_dir(index), receipt_key)
        self.config = config_for_cluster(spec)
        self.metrics = SidecarMetrics()
        self.tracer = Tracer(f"sidecar-{index}")  # off unless QG_TRACE_DIR is set
        self.store: SidecarStore | None = None
        # The same file read through a connection of its own: what readers ask (receipts,
        # ledger rows, cards, roots) never queues behind, or delays, `record` on the
        # writer's connection (WAL: readers see every committed height).
        self.reads: SidecarStore | None = None
        self.engine: Engine | None = None
        self.diverged = ""
        self.store_damaged = ""  # set when the store fails its audit: receipts are refused
        self._audit_cursor = AuditCursor()
        self.replica_height = 0
        # The height of the last applied owner transaction: the registry served for any
        # height from it on is the engine's current one. Unknown after a restart, so it
        # starts at the executed height (set in start()).
        self.registry_since = 0
        self._executed = asyncio.Condition()
        self._roots: deque[tuple[int, bytes]] = deque()  # executed, not yet reported
        self._root_turns = StreamTurns()
        # The last RECENT_RECEIPT_HEIGHTS executed heights: their Receipts stream messages,
        # built once for every subscriber, and whose verdicts each holds, so a waiting
        # reader is answered, or left waiting, without a store read per height.
        self._recent: OrderedDict[int, _RecentHeight] = OrderedDict()
        self.waits = WaitSlots()
        for kind in CallerKind:
            self.metrics.read_waits.labels(kind.value).set_function(
                lambda kind=kind: self.waits.held(kind)
            )
        self._pending_txs: OrderedDict[bytes, bytes] = OrderedDict()
        # Pending's reads of the replica's log, each a stream under our receipt key: a
        # bounded number at once, so a caller asking again and again cannot hold the
        # streams the replica allows that key (runtime/readwaits.py), our log stream's too
        self._pending_fetches = asyncio.Semaphore(PENDING_FETCHES_MAX)
        self._server: grpc.aio.Server | None = None
        self.failstop = FailStop()
        # Snapshots of the state every `interval_heights` (docs/snapshots.md), written off
        # the event loop one at a time: a write still running when the next is due skips it.
        node_dir = spec.node_dir(index)
        self.snapshot_options = SnapshotOptions.read(node_dir)
        self.snapshots = SnapshotDir(node_dir / SNAPSHOT_DIR, self.snapshot_options.kept)
        self._snapshot_write: asyncio.Task[None] | None = None
        # Pruning below a snapshot when a retention is set (docs/pruning.md): tried
        # after each snapshot written, between two heights, so no audit reads a height
        # while its rows go.
        self.pruner = Pruner(
            self.snapshot_options, self.snapshots, node_dir, receipt_key, index, spec.chain_id
        )
        self._prune_due = False

    async def start(self) -> None:
        path = self.spec.node_dir(self.index) / DB_FILE
        try:
            self.store = await SidecarStore.open(path, self.spec.chain_id)
        except SidecarStoreError as err:
            raise SidecarStoreError(
                f"{err}; keep it for the investigation, move it aside and rebuild it from "
                f"the committed log: "
                f"`quorumgate replay --dir {self.spec.directory} --node {self.index}`"
            ) from err
        loaded = await self.store.loaded_state()  # checked against our signed root
        self.engine = Engine(self.config, None if loaded is None else loaded[1])
        self.registry_since = self.store.executed_height
        # A store installed from a snapshot holds nothing below its checkpoint: the audit
        # starts after it, and the snapshot it came from is never pruned.
        first = self.store.history_from
        self._audit_cursor = AuditCursor(first, first)
        if self.store.checkpoint is not None:
            self.snapshots.pinned = self.store.checkpoint.height
        # Before serving or executing anything: does our store still say what we signed?
        # (A failed audit raises the alarm; the sidecar then serves Status, no receipts.)
        top = self.store.executed_height
        for height in range(max(first, top - STARTUP_AUDIT_HEIGHTS + 1), top + 1):
            self._audit(height, await self._audit_read(height))
        self.reads = await SidecarStore.open(path, self.spec.chain_id, create=False, read_only=True)
        log.info(
            "event=started node=%d address=%s executed_height=%d",
            self.index,
            self.member.sidecar_address,
            top,
        )
        server = grpc.aio.server(options=SERVER_OPTIONS)
        add_service(server, spb_grpc.add_SidecarServicer_to_server, _SidecarService(self))
        # The certificate of the epoch of the block executed last (a TLS rotation's
        # change block moves it on: sidecar/receiptkeys.py), served from then on.
        served = ServedCertificate(
            self.spec.node_dir(self.index),
            self.member.tls_cert,
            lambda: self.receipt_keys.tls_cert,
        )
        add_server_port(server, self.spec, self.index, "sidecar", served)
        await server.start()
        self._server = server
        start_http_server(self.member.sidecar_metrics_port, self.member.host, self.metrics.registry)
        self.metrics.executed_height.set(top)
        self.failstop.spawn(self._follow(), "follow")
        self.failstop.spawn(self._report_roots(), "roots")

    async def stop(self) -> None:
        await self.failstop.cancel_all()
        if self._snapshot_write is not None:
            await asyncio.gather(self._snapshot_write, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(0.5)
        if self.reads is not None:
            await self.reads.close()
        if self.store is not None:
            await self.store.close()
        log.info("event=stopped node=%d", self.index)

    # ------------------------------------------------------------------ execution

    async def _follow(self) -> None:
        """Follow the replica's committed blocks from the next height to execute. After a
        divergence alarm it executes nothing more but keeps running (the sidecar still
        answers Status), so fail-stop does not take a deliberate halt for a crash."""
        await self._execute_until_alarm()
        await asyncio.Event().wait()  # halted on purpose: wait for stop()

    async def _execute_until_alarm(self) -> None:
        delay = RECONNECT_DELAY_S_MIN
        store = self.store
        assert store is not None
        while not self.diverged:
            try:
                reader = self.read_keys.reader  # a member: its sidecar's receipt key
                async with aio_channel(
                    self.spec, self.index, "replica", reader=reader, roots=self._trusted_own()
                ) as channel:
                    stub = cpb_grpc.ReplicaStub(channel)
                    if not self._receipt_epoch_known:
                        await self._start_receipt_epoch(stub, store.executed_height)
                    request = cpb.BlocksRequest(from_height=store.executed_height + 1)
                    async for committed in stub.CommittedBlocks(request):
                        delay = RECONNECT_DELAY_S_MIN
                        self.replica_height = max(self.replica_height, committed.height)
                        await self._execute(committed)
                        if self.diverged:
                            return
            except grpc.aio.AioRpcError as err:
                if err.code() is grpc.StatusCode.OUT_OF_RANGE:
                    # Our replica pruned the heights we lack (docs/pruning.md): its answer
                    # names where its log starts and the way out (replay --from-snapshot).
                    log.error("event=replica_pruned detail=%s", err.details())
                elif self.read_keys.refused(err):
                    # Our replica runs an epoch in which the key we read with is not our
                    # member's (a boundary passed): the next key we hold is tried.
                    log.info("event=read_key_refused code=%s", err.code().name)
                else:
                    log.info("event=replica_stream_closed code=%s", err.code().name)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_S_MAX)

    def _trusted_own(self) -> bytes | None:
        """What our links to our own replica trust: the certificates our node directory
        holds keys for (proto/clusterfile.py `held_tls_certificates`), since our replica
        moves to a rotated one at its boundary and we at our execution of the change
        block, in either order."""
        if self.spec.insecure:
            return None
        return held_tls_certificates(self.spec.node_dir(self.index), self.member.tls_cert)

    @property
    def receipt_epoch_known(self) -> bool:
        """Whether the epoch of the next block is known (from our replica's stored epoch
        ends, once per process; at once on a chain that runs no epochs)."""
        return self._receipt_epoch_known

    async def _start_receipt_epoch(self, stub: cpb_grpc.ReplicaStub, executed: int) -> None:
        """The epoch of the next height to execute, from our replica's stored epoch ends
        (the change blocks of the committed log; sidecar/receiptkeys.py). Once per
        process: from then on each executed change block moves it on."""
        reply = await stub.EpochEnds(cpb.EpochEndsRequest(), timeout=RECONNECT_DELAY_S_MAX)
        boundaries = [decode_epoch_end(self.spec.chain_id, end.ended)[0] for end in reply.ends]
        keys = ReceiptKeys(
            self.spec, self.index, self.spec.node_dir(self.index), self.key, self.member.tls_cert
        )
        keys.start_at(boundaries, executed)
        self.receipt_keys = keys
        self._receipt_epoch_known = True
        self._receipt_epoch_ready.set()
        log.info("event=receipt_epoch epoch=%d executed_height=%d", keys.epoch, executed)
        store = self.store
        assert store is not None
        for height in range(
            max(store.history_from, executed - STARTUP_AUDIT_HEIGHTS + 1), executed + 1
        ):
            self._audit(height, await self._audit_read(height))  # each with its epoch's key

    async def _execute(self, committed: cpb.CommittedBlock) -> None:
        store, engine = self.store, self.engine
        assert store is not None and engine is not None
        height = committed.height
        if height <= store.executed_height:
            return  # a replay of what we executed (reconnect): exactly once
        block = self._committed_block(committed, store.executed_height)
        started = time.perf_counter()
        if block.state_root_height > 0:
            mine = await store.root_at(block.state_root_height)
            if mine is not None and mine != block.state_root:
                self._alarm(
                    f"committed block {height} carries state root "
                    f"{block.state_root.hex()[:16]} for height {block.state_root_height}; "
                    f"ours is {mine.hex()[:16]}"
                )
                return
        keys = self.receipt_keys
        try:
            signing = keys.key()
        except ClusterFileError as err:  # the epoch's key file is missing: sign nothing
            self._alarm(str(err))
            return
        try:
            executed = execute_block(
                engine, signing, self.index, self.spec.chain_id, block, keys.epoch
            )
        except StateCacheError as err:  # nothing recorded: the height is not executed
            self._alarm(str(err))
            return
        result = executed.result
        for index, verdict in enumerate(result.verdicts):
            if verdict.card is not None:  # a new card: keep the proposal it binds
                self._remember_pending_tx(verdict.proposal_id, block.payload[index])
        # The self-audit's next older height is read in the record's own trip to the store.
        audited = self._audit_cursor.take(height - 1)
        try:
            audit_rows_read = await store.record(executed, then_read=audited)
        except DivergenceError as err:
            self._alarm(str(err))
            return
        if keys.after(block):
            log.info("event=receipt_epoch epoch=%d from_height=%d", keys.epoch, height + 1)
            self.read_keys.prefer(keys.public_key)
        self.metrics.execute_latency.observe(time.perf_counter() - started)
        self.tracer.event("executed", height)
        self._keep_recent_receipts(executed)
        self._count_executed(executed, engine)
        if any(v.kind is TxKind.ADMIN and v.outcome is Outcome.APPLIED for v in result.verdicts):
            self.registry_since = height
        self._snapshot_if_due(executed, engine)
        if self._prune_due:
            await self._prune(executed.block_time_ms)
        self._roots.append((height, result.state_root))
        self._root_turns.notify()
        async with self._executed:
            self._executed.notify_all()
        if audited is not None and audit_rows_read is not None:
            self._audit(audited, audit_rows_read)

    def _snapshot_if_due(self, executed: ExecutedHeight, engine: Engine) -> None:
        """After a height that is a multiple of the snapshot interval, write a snapshot of
        the state (docs/snapshots.md) in a thread; the state bytes are taken now, before
        the next height changes the state."""
        interval, height = self.snapshot_options.interval_heights, executed.height
        store = self.store
        assert store is not None
        if not interval or height % interval:
            return
        if self._snapshot_write is not None and not self._snapshot_write.done():
            log.warning("event=snapshot_skipped height=%d cause=previous_write_running", height)
            return
        head = Checkpoint(
            height, executed.result.state_root, store.ledger_head, store.ledger_entries,
            executed.block_hash, executed.block_time_ms,
        )  # fmt: skip
        data = engine.state_bytes()

        async def write() -> None:
            try:
                written = await asyncio.to_thread(self.snapshots.write, head, data)
            except OSError as err:
                log.error("event=snapshot_failed height=%d error=%s", height, err)
                return
            if written is not None:
                log.info("event=snapshot_written height=%d bytes=%d", height, len(data))
                self._prune_due = self.snapshot_options.prunes

        self._snapshot_write = asyncio.create_task(write())

    async def _prune(self, executed_time_ms: int) -> None:
        """Prune the store below the newest snapshot the bounds allow (sidecar/pruning.py),
        the executed height's block time being `executed_time_ms`; the audit then walks
        from the new start of local history."""
        if self._snapshot_write is not None and not self._snapshot_write.done():
            return  # the snapshot directory is being written in a thread: after it
        self._prune_due = False
        store = self.store
        assert store is not None
        try:
            point = self.pruner.point(store, executed_time_ms)
            if point is None:
                return
            result = await self.pruner.prune(store, point)
        except (ValueError, OSError, SidecarStoreError) as err:
            log.error("event=prune_failed error=%s", err)
            return
        self._audit_cursor = AuditCursor(point + 1, point + 1)
        log.info(
            "event=pruned height=%d ledger_rows=%d receipts=%d artifacts=%d bytes_before=%d "
            "bytes_after=%d vacuumed=%s",
            point, result.ledger_rows, result.receipts, result.artifacts,
            result.bytes_before, result.bytes_after, result.vacuumed,
        )  # fmt: skip

    def _committed_block(self, committed: cpb.CommittedBlock, executed_height: int) -> Block:
        """Decode the next committed block from our own replica; anything else is a bug."""
        height = committed.height
        if height != executed_height + 1:
            raise AssertionError(f"replica skipped from {executed_height} to {height}")
        try:
            block = decode_block(self.spec.chain_id, committed.block.SerializeToString())
        except RemoteError as err:
            raise AssertionError(f"own replica sent an undecodable block: {err}") from err
        if block.hash != committed.hash or block.height != height:
            raise AssertionError("own replica sent a block whose hash or height does not match")
        return block

    def _keep_recent_receipts(self, executed: ExecutedHeight) -> None:
        """Keep the receipts of the newest heights, bounded, for reads and waits."""
        height = executed.height
        self._recent[height] = _RecentHeight(
            receipt_batches(
                height,
                [
                    Receipt(leaf, path, executed.signed)
                    for leaf, path in zip(executed.leaves, executed.paths, strict=True)
                ],
            ),
            HeightIndex.of(executed.leaves, [v.principal for v in executed.result.verdicts]),
        )
        while len(self._recent) > RECENT_RECEIPT_HEIGHTS:
            self._recent.popitem(last=False)

    def _count_executed(self, executed: ExecutedHeight, engine: Engine) -> None:
        """Update the height, lag and verdict metrics for one executed height."""
        height, result = executed.height, executed.result
        m = self.metrics
        m.executed_height.set(height)
        m.replica_height.set(self.replica_height)
        m.lag.set(max(0, self.replica_height - height))
        kinds = Tally((v.outcome.value, v.reason.value) for v in result.verdicts)
        for (outcome, reason), count in kinds.items():
            m.verdicts.labels(outcome, reason).inc(count)
            if reason == "run_halted":
                m.latch_halts.inc(count)
        m.artifacts.inc(len(result.artifacts))
        m.pending.set(len(engine.state.pending))

    def _remember_pending_tx(self, proposal_id: bytes, data: bytes) -> None:
        kept = self._pending_txs
        kept[proposal_id] = data
        kept.move_to_end(proposal_id)
        while len(kept) > PENDING_TXS_KEPT_MAX:
            kept.popitem(last=False)

    async def proposal_transactions(self, cards: Sequence[ConfirmationCard]) -> dict[bytes, bytes]:
        """The signed proposal each card binds, by proposal id: from memory, else from the
        replica's committed block at the card's height (one stream per height, at most
        `PENDING_FETCHES_MAX` fetches at once). A card whose block cannot be read now, or
        whose turn does not come within `PENDING_FETCH_TIMEOUT_S`, is left out (the caller
        asks again)."""
        found = {c.proposal_id: self._pending_txs[c.proposal_id] for c in cards
                 if c.proposal_id in self._pending_txs}  # fmt: skip
        heights = sorted({c.created_height for c in cards if c.proposal_id not in found})
        if not heights:
            return found
        wanted = {c.proposal_id for c in cards} - set(found)
        try:
            reader = self.read_keys.reader
            async with (
                asyncio.timeout(PENDING_FETCH_TIMEOUT_S),
                self._pending_fetches,
                aio_channel(
                    self.spec, self.index, "replica", reader=reader, roots=self._trusted_own()
                ) as channel,
            ):
                stub = cpb_grpc.ReplicaStub(channel)
                for height in heights:
                    stream = stub.CommittedBlocks(cpb.BlocksRequest(from_height=height))
                    async for committed in stream:
                        raw = committed.block.SerializeToString()
                        block = decode_block(self.spec.chain_id, raw)
                        for data in block.payload:
                            tx_key = _tx_id_of(data)
                            if tx_key in wanted:
                                found[tx_key] = data
                                self._remember_pending_tx(tx_key, data)
                        break
                    stream.cancel()
        except (TimeoutError, grpc.aio.AioRpcError, RemoteError) as err:
            log.info("event=pending_fetch_failed cause=%s", type(err).__name__)
        return found

    async def _audit_read(self, height: int) -> HeightRows | SidecarStoreError:
        """One height's rows for the self-audit, or the store's refusal to read them."""
        store = self.store
        assert store is not None
        try:
            return await store.height_rows(height)
        except SidecarStoreError as err:
            return err

    def _audit(self, height: int, rows: HeightRows | SidecarStoreError) -> None:
        """Check one executed height's rows against our own signed statement
        (sidecar/audit.py); a mismatch raises the divergence alarm and stops serving
        receipts."""
        if isinstance(rows, SidecarStoreError):
            problem = str(rows)
        else:
            problem = audit_rows(
                rows, self.spec.chain_id, self.member.receipt_public_key, height, self._audit_keys
            )
        self.metrics.audited.inc()
        if problem is not None:
            self.store_damaged = problem
            self._alarm(f"the store does not match our signed statements: {problem}")

    def _audit_keys(self, epoch: int, height: int) -> tuple[bytes, ...]:
        """Our receipt keys that may have signed a statement naming `epoch` at `height`:
        the one the blocks followed give (sidecar/receiptkeys.py `key_at`). Before our
        replica's epoch ends are read (the startup audit), epoch 0's key for epoch 0 and
        any rotated key the node directory holds for a later one; those heights are
        audited again once the epochs are known (`_start_receipt_epoch`)."""
        if self._receipt_epoch_known:
            key = self.receipt_keys.key_at(epoch, height)
            return () if key is None else (key,)
        if epoch == 0:
            return (self.member.receipt_public_key,)
        held = held_receipt_seeds(self.spec.node_dir(self.index))
        return tuple(bytes(SigningKey(seed).verify_key) for seed in held)

    def _alarm(self, what: str) -> None:
        self.diverged = what
        self.metrics.divergence.set(1)
        log.error(
            "event=divergence_alarm node=%d detail=%s action=stopped_executing", self.index, what
        )

    async def receipt_batches(self, height: int) -> list[spb.ReceiptBatch]:
        """The Receipts stream messages of an executed height (none for an empty one)."""
        cached = self._recent.get(height)
        if cached is not None:
            return cached.batches
        reads = self.reads
        assert reads is not None
        return receipt_batches(height, await reads.receipts_at(height))

    async def own_receipt_batches(
        self, height: int, agent_id: str | None, own: set[bytes]
    ) -> list[spb.ReceiptBatch]:
        """The Receipts stream messages of one height, holding only the verdicts whose
        principal is `agent_id` or whose transaction is in `own` (what an agent may read
        of the stream)."""
        reads = self.reads
        assert reads is not None
        recent = self._recent.get(height)
        if recent is not None and not recent.index.mine(agent_id, own):
            return []  # nothing of theirs at this height: no store read
        entries = await reads.ledger_at(height)
        mine = {e.index for e in entries if e.principal == agent_id or e.tx_id in own}
        if not mine:
            return []
        receipts = [r for r in await reads.receipts_at(height) if r.leaf.index in mine]
        return receipt_batches(height, receipts)

    async def own_heights_from(
        self, height: int, agent_id: str | None, own: set[bytes]
    ) -> tuple[list[int], int]:
        """The heights from `height` (executed) on that may hold verdicts of this agent or
        of its own transactions, and the height to go on from: a recent height, indexed
        in memory, alone; older ones found by one range read per `RECEIPTS_SCAN_HEIGHTS`
        (a stream from height 1 read every height's ledger, one store trip each)."""
        store, reads = self.store, self.reads
        assert store is not None and reads is not None
        first_indexed = next(iter(self._recent), store.executed_height + 1)
        if height >= first_indexed:
            return [height], height + 1
        top = min(first_indexed - 1, height + RECEIPTS_SCAN_HEIGHTS - 1, store.executed_height)
        return await reads.heights_holding(height, top, agent_id, own), top + 1

    def may_answer(self, proposal_id: bytes, after: int, upto: int) -> bool:
        """Whether a verdict for `proposal_id` may be among heights `after`+1 .. `upto`:
        False only when each of them is a recent height known not to hold one."""
        for height in range(after + 1, upto + 1):
            recent = self._recent.get(height)
            if recent is None or proposal_id in recent.index.proposal_ids:
                return True
        return False

    @contextlib.contextmanager
    def holding_wait(self, key: bytes, kind: CallerKind, method: str) -> Iterator[bool]:
        """A wait slot for `key` while the block runs (True), or False if it or its kind
        holds all it may (runtime/readwaits.py; a refusal is counted)."""
        with self.waits.hold(key, kind) as held:
            if not held:
                self.metrics.read_waits_refused.labels(kind.value, method).inc()
            yield held

    async def wait_executed(self, height: int) -> None:
        store = self.store
        assert store is not None
        async with self._executed:
            await self._executed.wait_for(lambda: store.executed_height >= height)

    # ------------------------------------------------------------------ state roots

    async def _report_roots(self) -> None:
        """Push signed state roots to the replica; reconnect when the stream breaks. Each
        (re)connection first sends the last `ROOTS_RESENT_ON_CONNECT` executed heights
        again, so reports lost with a broken stream leave no gap in the replica's view
        (a voter needs the root of exactly the height a block carries)."""
        delay = RECONNECT_DELAY_S_MIN
        store = self.store
        assert store is not None
        await self._receipt_epoch_ready.wait()  # each report is signed in its height's epoch

        turns = self._root_turns

        async def reports(turn: int) -> AsyncIterator[spb.StateRootReport]:
            top = store.executed_height
            for height in range(max(1, top - ROOTS_RESENT_ON_CONNECT + 1), top + 1):
                root = await store.root_at(height)
                report = None if root is None else self._report(height, root)
                if report is not None:
                    yield report
            # Only while this stream is the current one: a dead stream's iterator, still
            # read by gRPC, took and lost the first root after every reconnect (StreamTurns).
            async for height, root in turns.drain(turn, self._roots):
                report = self._report(height, root) if height > top else None
                if report is not None:
                    yield report

        while True:
            try:
                async with aio_channel(
                    self.spec, self.index, "replica", roots=self._trusted_own()
                ) as channel:
                    stub = cpb_grpc.ReplicaStub(channel)
                    await stub.ReportStateRoots(reports(turns.begin()))
            except grpc.aio.AioRpcError as err:
                log.info("event=root_stream_closed code=%s", err.code().name)
            finally:
                turns.end()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_S_MAX)

    def _report(self, height: int, root: bytes) -> spb.StateRootReport | None:
        """`height`'s root, and the owner key our state holds now if the owner rotated
        it: the replica learns from us which key reads its blocks as the owner
        (docs/security/reads-and-certificates.md). Signed with our member's receipt key of
        the epoch `height` belongs to, the one our replica checks it with (replica/
        sidecar_link.py `ReportKeys`; docs/consensus/epochs.md, "Receipt keys"); None when
        the node directory lacks that key (the divergence alarm names it)."""
        engine = self.engine
        rotated = engine is not None and engine.state.owner_key is not None
        owner = engine.owner_key() if engine is not None and rotated else b""
        message = root_report_statement(self.spec.chain_id, height, root, owner)
        try:
            key = self.receipt_keys.key_for_height(height)
        except ClusterFileError as err:
            log.error("event=root_report_unsigned height=%d detail=%s", height, err)
            return None
        signature = bytes(key.sign(message).signature)
        return spb.StateRootReport(
            height=height, state_root=root, signature=signature, owner_key=owner
        )


def _tx_id_of(data: bytes) -> bytes | None:
    try:
        return parse(data, verify=False).tx_id
    except TxRejected as err:
        return err.tx_id or None


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Visible:
    """What of a proposal's verdicts one `GetReceipt` caller may read. `scope` None: every
    verdict (a role, or the proposal's signer); else (agent id, own transaction ids): a
    verdict whose principal is that agent, or that one of its own transactions produced
    (the Confirm that answers the proposal)."""

    def __init__(self, sidecar: Sidecar, scope: tuple[str | None, set[bytes]] | None) -> None:
        self._sidecar = sidecar
        self._scope = scope

    @property
    def everything(self) -> bool:
        return self._scope is None

    async def __call__(self, receipt: Receipt | None) -> Receipt | None:
        if receipt is None or self._scope is None:
            return receipt
        agent, own = self._scope
        if receipt.leaf.tx_id in own:
            return receipt
        reads = self._sidecar.reads
        assert reads is not None
        if agent is not None:
            principal = await reads.principal_at(receipt.leaf.height, receipt.leaf.index)
            if principal == agent:
                return receipt
        return None


class _SidecarService(spb_grpc.SidecarServicer):  # type: ignore[misc]
    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar

    async def _caller(
        self, context: grpc.aio.ServicerContext, method: str
    ) -> tuple[bytes, Role | None, str | None]:
        """Who signed this read (runtime/readauth.py): its key, its role in the cluster,
        the agent id it is registered under; UNAUTHENTICATED without a valid statement."""
        spec = self.sidecar.spec
        key = caller_key(spec.chain_id, method, context.invocation_metadata(), _now_ms())
        if key is None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, f"{method} needs a signed read statement"
            )
        assert key is not None
        engine = self.sidecar.engine
        agent = engine.state.agent_by_key.get(key) if engine is not None else None
        return key, self._role(key), agent

    def _role(self, key: bytes) -> Role | None:
        """`key`'s role here now (runtime/readauth.py)."""
        spec = self.sidecar.spec
        engine = self.sidecar.engine
        # A sidecar does not follow the replicas' consensus keys, so none reads as a
        # member here: none needs to (its replica's admission calls are checked by key,
        # `_refuse_unless_own_replica`), and one rotated out would read every verdict.
        # The members' receipt keys that read here are those of the epoch we execute in
        # (docs/consensus/epochs.md, "Receipt keys"): one rotated out, or a replaced
        # machine's, reads nothing; before that epoch is known, none reads.
        sidecar = self.sidecar
        readers = sidecar.receipt_keys.readers if sidecar.receipt_epoch_known else ()
        role = role_of(spec, key, consensus_keys=(), receipt_keys=readers)
        if engine is not None and engine.state.owner_key is not None:
            # the owner rotated its key in the log (docs/engine.md, "Rotating keys"): the
            # state's key reads as the owner, cluster.json's no longer does
            if key == engine.owner_key():
                role = Role.OWNER
            elif role is Role.OWNER:
                role = None
        return role

    @staticmethod
    def _kind(role: Role | None, agent: str | None) -> CallerKind:
        if role is not None:
            return CallerKind.ROLE
        return CallerKind.STRANGER if agent is None else CallerKind.AGENT

    async def _refuse_if_damaged(self, context: grpc.aio.ServicerContext) -> None:
        if self.sidecar.store_damaged:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this sidecar's store failed its audit: it serves no receipts until rebuilt",
            )

    async def GetReceipt(
        self, request: spb.ReceiptRequest, context: grpc.aio.ServicerContext
    ) -> spb.ReceiptReply:
        store = self.sidecar.store
        assert store is not None
        if len(request.proposal_id) != 32:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "proposal id must be 32 bytes")
        await self._refuse_if_damaged(context)
        key, role, agent = await self._caller(context, METHOD_GET_RECEIPT)
        # An agent reads its own verdicts: the proposal's signer proves it with the nonce
        # (a proposal id is sha256(signer || nonce)), and an agent may read a verdict whose
        # principal it is (a confirmation it made).
        signed_it = request.nonce > 0 and tx_id(key, request.nonce) == request.proposal_id
        own = {
            o.tx_id for o in request.own[:OWN_TXS_MAX] if o.nonce and tx_id(key, o.nonce) == o.tx_id
        }
        if role is None and agent is None and not signed_it and not own:
            # no verdict could ever answer this caller: refused now, not after a wait
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, READ_REFUSAL_DETAIL)
        # A caller that is neither a role nor the proposal's signer sees only the verdicts
        # it may read, and waits past the others as if there were none: otherwise when its
        # refusal came would tell it whether a proposal id it named exists (an id is
        # sha256(signer || nonce): how many transactions a key it knows has made).
        visible = _Visible(self.sidecar, None if role is not None or signed_it else (agent, own))
        seen = store.executed_height  # before the read: nothing recorded after it is missed
        reads = self.sidecar.reads
        assert reads is not None
        receipt = await visible(await reads.receipt(request.proposal_id))
        if request.wait_ms and (receipt is None or receipt.leaf.height <= request.newer_than):
            # a long poll: answer as soon as this sidecar has executed the (newer) verdict,
            # instead of the client asking again and again; past the caller's share of
            # waits, answered now, as a poll is
            with self.sidecar.holding_wait(key, self._kind(role, agent), "GetReceipt") as held:
                if held:
                    receipt = await self._wait_for_receipt(request, receipt, seen, visible)
        if receipt is None and not visible.everything:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, READ_REFUSAL_DETAIL)
        reply = spb.ReceiptReply(found=receipt is not None, executed_height=store.executed_height)
        if receipt is not None:
            reply.receipt.CopyFrom(receipt_to_pb(receipt))
            card = await reads.card(request.proposal_id)
            if card is not None:
                reply.card = card
        return reply

    async def _wait_for_receipt(
        self,
        request: spb.ReceiptRequest,
        receipt: Receipt | None,
        seen: int,
        visible: _Visible,
    ) -> Receipt | None:
        """Wait, at most `wait_ms` (capped), for a verdict answering the request above
        `newer_than` that the caller may read; the store is read again only after a height
        that may hold one."""
        sidecar = self.sidecar
        store = sidecar.store
        assert store is not None
        loop = asyncio.get_running_loop()
        until = loop.time() + min(request.wait_ms, RECEIPT_WAIT_MS_MAX) / 1000
        while receipt is None or receipt.leaf.height <= request.newer_than:
            remaining = until - loop.time()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(sidecar.wait_executed(seen + 1), remaining)
            except TimeoutError:
                break
            now = store.executed_height
            if sidecar.may_answer(request.proposal_id, seen, now):
                assert sidecar.reads is not None
                receipt = await visible(await sidecar.reads.receipt(request.proposal_id))
            seen = now
        return receipt

    async def Receipts(
        self, request: spb.ReceiptsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[spb.ReceiptBatch]:
        """One message per executed height (a stream message costs far more CPU than the
        bytes of a receipt), split only past RECEIPT_BATCH_LEAVES_MAX leaves."""
        sidecar = self.sidecar
        store = sidecar.store
        assert store is not None
        await self._refuse_if_damaged(context)
        key, role, agent = await self._caller(context, METHOD_RECEIPTS)
        own = {
            o.tx_id for o in request.own[:OWN_TXS_MAX] if o.nonce and tx_id(key, o.nonce) == o.tx_id
        }
        if role is None and agent is None and not own:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "verdicts answer the owner, members, auditors, and an agent its own",
            )
        with sidecar.holding_wait(key, self._kind(role, agent), "Receipts") as held:
            if not held:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, WAITS_FULL_DETAIL)
            height = max(1, request.from_height)
            epoch = sidecar.receipt_keys.epoch
            while True:
                if height > store.executed_height:
                    await sidecar.wait_executed(height)
                    continue
                if role is not None and sidecar.receipt_keys.epoch != epoch:
                    # A boundary passed: a receipt key rotated out there (or a replaced
                    # machine's) reads no more (docs/consensus/epochs.md, "Receipt keys").
                    epoch = sidecar.receipt_keys.epoch
                    if self._role(key) is None:
                        await context.abort(
                            grpc.StatusCode.PERMISSION_DENIED,
                            "this key reads no more verdicts: the epoch executed now gives "
                            "it no role",
                        )
                if role is not None:
                    for batch in await sidecar.receipt_batches(height):
                        yield batch
                    height += 1
                    continue
                # an agent or a stranger: its own verdicts, nobody else's
                heights, height = await sidecar.own_heights_from(height, agent, own)
                for at in heights:
                    for batch in await sidecar.own_receipt_batches(at, agent, own):
                        yield batch

    async def _refuse_unless_own_replica(
        self, context: grpc.aio.ServicerContext, method: str
    ) -> None:
        """Admission answers this node's replica only: it tells whether a key is a
        registered agent and which of its nonces are used, and `AdmitBatch` takes the
        caller's word that the signatures were checked."""
        key, _, _ = await self._caller(context, method)
        if key != self.sidecar.member.public_key:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, "admission answers this node's replica only"
            )

    async def Admit(
        self, request: spb.AdmitRequest, context: grpc.aio.ServicerContext
    ) -> spb.AdmitReply:
        engine = self.sidecar.engine
        assert engine is not None
        await self._refuse_unless_own_replica(context, METHOD_ADMIT)
        if self.sidecar.diverged:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "sidecar diverged")
        result = engine.admission_check(request.tx)
        self.sidecar.metrics.admissions.labels("accepted" if result.accepted else "refused").inc()
        return spb.AdmitReply(
            accepted=result.accepted, reason=result.reason.value, tx_id=result.tx_id
        )

    async def AdmitBatch(
        self, request: spb.AdmitBatchRequest, context: grpc.aio.ServicerContext
    ) -> spb.AdmitBatchReply:
        engine = self.sidecar.engine
        assert engine is not None
        await self._refuse_unless_own_replica(context, METHOD_ADMIT_BATCH)
        if self.sidecar.diverged:
            # A diverged sidecar's state is not the cluster's: it answers no admission.
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "sidecar diverged")
        if len(request.txs) > ADMIT_BATCH_TXS_MAX:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"at most {ADMIT_BATCH_TXS_MAX} per batch"
            )
        verify = not request.signatures_verified
        reply = spb.AdmitBatchReply()
        for tx in request.txs:
            result = engine.admission_check(tx, verify_signature=verify)
            self.sidecar.metrics.admissions.labels(
                "accepted" if result.accepted else "refused"
            ).inc()
            reply.replies.add(
                accepted=result.accepted, reason=result.reason.value, tx_id=result.tx_id
            )
        return reply

    async def Account(
        self, request: spb.AccountRequest, context: grpc.aio.ServicerContext
    ) -> spb.AccountReply:
        sidecar = self.sidecar
        engine, store = sidecar.engine, sidecar.store
        assert engine is not None and store is not None
        key, role, _ = await self._caller(context, METHOD_ACCOUNT)
        if role is None and key != request.signer:
            # whether a key is registered, and how many transactions it made, is the
            # registry's to tell: its own key, the owner, members and auditors
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "an account answers its own key, the owner, members and auditors",
            )
        nxt = engine.next_nonce(request.signer)
        return spb.AccountReply(
            known=nxt is not None, next_nonce=nxt or 0, executed_height=store.executed_height
        )

    async def Registry(
        self, request: spb.RegistryRequest, context: grpc.aio.ServicerContext
    ) -> spb.RegistryReply:
        sidecar = self.sidecar
        engine, store = sidecar.engine, sidecar.store
        assert engine is not None and store is not None
        key, role, agent = await self._caller(context, METHOD_REGISTRY)
        if registry_scope(engine.state, key, role is not None) is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, REGISTRY_REFUSAL_DETAIL)
        height = request.height or store.executed_height
        if height > store.executed_height:
            with sidecar.holding_wait(key, self._kind(role, agent), "Registry") as held:
                if not held:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, WAITS_FULL_DETAIL)
                try:
                    async with asyncio.timeout(REGISTRY_WAIT_S):
                        await sidecar.wait_executed(height)
                except TimeoutError:
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        f"height {height} not executed here yet (executed {store.executed_height})",
                    )
        assert sidecar.reads is not None
        root = await sidecar.reads.root_at(height) if height else b""
        # No await from here on: the content is the engine's state at this moment, and
        # so is the scope (a registration executed during the wait counts).
        scope = registry_scope(engine.state, key, role is not None)
        if scope is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, REGISTRY_REFUSAL_DETAIL)
        assert scope is not None
        if sidecar.registry_since > height or root is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the registry here is valid from height {sidecar.registry_since} on; "
                f"ask for a height at or above it",
            )
        return spb.RegistryReply(
            height=height,
            state_root=root,
            registry_since=sidecar.registry_since,
            content=registry_content(engine.state, scope),
            scope=scope.label,
        )

    async def Pending(
        self, request: spb.PendingRequest, context: grpc.aio.ServicerContext
    ) -> spb.PendingReply:
        """The open cards the caller alone may answer (docs/security/approvals.md), with the
        signed proposal each binds; any other key gets an empty list, which tells it
        nothing."""
        sidecar = self.sidecar
        engine, store = sidecar.engine, sidecar.store
        assert engine is not None and store is not None
        await self._refuse_if_damaged(context)
        key, _, _ = await self._caller(context, METHOD_PENDING)
        # no await between these two lines: the cards are the state at this height
        cards = engine.cards_for(key)
        reply = spb.PendingReply(executed_height=store.executed_height)
        txs = await sidecar.proposal_transactions(cards)
        for card in cards:
            data = txs.get(card.proposal_id)
            if data is not None:
                reply.cards.add(card=card.to_bytes(), transaction=data)
        return reply

    async def Ledger(
        self, request: spb.LedgerRequest, context: grpc.aio.ServicerContext
    ) -> spb.LedgerReply:
        """A page of the verdict ledger for the audit shipper (docs/audit.md): every verdict,
        so only the roles that read every verdict may ask (as `Receipts` answers them)."""
        store = self.sidecar.store
        assert store is not None
        await self._refuse_if_damaged(context)
        _, role, _ = await self._caller(context, METHOD_LEDGER)
        if role is None:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "the ledger answers the owner, members and auditors",
            )
        executed = store.executed_height
        limit = min(request.limit or LEDGER_PAGE_ROWS_MAX, LEDGER_PAGE_ROWS_MAX)
        try:
            entries = await store.ledger(request.from_height, limit, request.from_index)
        except SidecarStoreError:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this sidecar's ledger holds a row that is not an entry",
            )
        reply = spb.LedgerReply(executed_height=executed)
        reply.entries.extend(e.to_json() for e in entries if e.height <= executed)
        return reply

    async def _refuse_unless_member(self, context: grpc.aio.ServicerContext, method: str) -> None:
        _, role, _ = await self._caller(context, method)
        if not may_call(method, role):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "snapshots answer the members only (docs/snapshots.md)",
            )

    async def ListSnapshots(
        self, request: spb.SnapshotListRequest, context: grpc.aio.ServicerContext
    ) -> spb.SnapshotListReply:
        """The snapshots held, newest first, with our attestation of each one's height and
        of the heights asked (docs/snapshots.md)."""
        await self._refuse_unless_member(context, METHOD_LIST_SNAPSHOTS)
        await self._refuse_if_damaged(context)
        sidecar = self.sidecar
        reads, store = sidecar.reads, sidecar.store
        assert reads is not None and store is not None
        manifests = sidecar.snapshots.manifests()[:SNAPSHOTS_LISTED_MAX]
        heights = sorted(
            {m.height for m in manifests}
            | set(request.attest_heights[:SNAPSHOT_ATTEST_HEIGHTS_MAX])
        )
        reply = spb.SnapshotListReply(executed_height=store.executed_height)
        reply.snapshots.extend(m.to_pb() for m in manifests)
        for height in heights:
            found = await reads.attestation_at(height)
            if found is not None:
                reply.attestations.append(Attestation(*found).to_pb())
        return reply

    async def SnapshotChunk(
        self, request: spb.SnapshotChunkRequest, context: grpc.aio.ServicerContext
    ) -> spb.SnapshotChunkReply:
        await self._refuse_unless_member(context, METHOD_SNAPSHOT_CHUNK)
        await self._refuse_if_damaged(context)
        data = await asyncio.to_thread(self.sidecar.snapshots.chunk, request.height, request.index)
        if data is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such snapshot chunk held")
        return spb.SnapshotChunkReply(height=request.height, index=request.index, data=data)

    async def Status(
        self, request: spb.SidecarStatusRequest, context: grpc.aio.ServicerContext
    ) -> spb.SidecarStatusReply:
        sidecar = self.sidecar
        store = sidecar.store
        assert store is not None
        reads = sidecar.reads
        assert reads is not None
        root = await reads.root_at(store.executed_height) if store.executed_height else b""
        return spb.SidecarStatusReply(
            chain_id=sidecar.spec.chain_id,
            node=sidecar.index,
            executed_height=store.executed_height,
            state_root=root or b"",
            ledger_head=store.ledger_head,
            ledger_entries=store.ledger_entries,
            artifacts=store.artifact_count,
            diverged=bool(sidecar.diverged),
            divergence=sidecar.diverged,
            replica_committed_height=sidecar.replica_height,
        )


def receipt_batches(height: int, receipts: Sequence[Receipt]) -> list[spb.ReceiptBatch]:
    """A height's receipts as Receipts stream messages of at most RECEIPT_BATCH_LEAVES_MAX."""
    pbs = [receipt_to_pb(r) for r in receipts]
    return [
        spb.ReceiptBatch(height=height, receipts=pbs[start : start + RECEIPT_BATCH_LEAVES_MAX])
        for start in range(0, len(pbs), RECEIPT_BATCH_LEAVES_MAX)
    ]


# ============================================================================ process


async def make_sidecar(spec: ClusterSpec, index: int) -> Sidecar:
    seed = read_seed(spec.node_dir(index) / RECEIPT_KEY_FILE)
    return Sidecar(spec, index, SigningKey(seed))


def main(argv: list[str] | None = None) -> int:
    return process_main(
        argv,
        kind="sidecar",
        description="Run one QuorumGate execution sidecar.",
        make=make_sidecar,
    )


if __name__ == "__main__":
    sys.exit(main())
