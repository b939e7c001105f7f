"""`quorumgate replay`: rebuild a sidecar's state from its replica's committed log
(docs/drills.md).

Every committed block is read in height order (from the running replica's stream, or from
its database when it is stopped), its certificate checked — it extends the block before it
and its justify QC carries 2f+1 valid signatures for that block — and executed again by a
fresh engine. For each height the sidecar has already executed, everything is compared
with what it recorded: the state root, the signed verdict root (and, on a chain whose
receipts expire, the signed validity window), every receipt leaf, every ledger entry
(recomputed on the hash chain) and every rejection artifact. Same artifact
bytes re-confirm it; different bytes are a divergence naming the key. Heights the sidecar
has not executed yet (or all of them, after its store was wiped) are recorded, exactly as
the sidecar would have.

On a chain that runs epochs, replay follows the chain of epochs as the replicas do
(docs/drills.md, "Replay across epochs"): at a change block the replica's stored epoch end
proves its commit with the ending epoch's keys, and the blocks after it are checked with
the next member set (`_Epochs`).

Replay is resumable: every `CHECKPOINT_HEIGHTS` heights it writes a checkpoint (the engine
state, the last block and the ledger head) beside the store, and a later run continues from
it. The sidecar must be stopped while replay writes its store.

With `from_snapshot` (`quorumgate replay --from-snapshot`, docs/snapshots.md) an empty store
is first installed from the newest snapshot f+1 members attest (sidecar/snapshots.py), and
only the blocks after it are replayed. A store installed so starts its local history at
that checkpoint: a later replay starts there too (from the snapshot kept in
`DIR/node-I/snapshots/`, checked again against the checkpoint's root), and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.clusterfile import (
    RECEIPT_KEY_FILE,
    ClusterSpec,
    MemberSpec,
    held_receipt_seeds,
    read_seed,
)
from quorumgate.proto.crypto import Verifier
from quorumgate.proto.membership import Membership, OwnerRecords
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.epochchain import ChainedEpoch, EpochChainError, PlainEpochEnd, check_link
from quorumgate.replica.epochs import change_in, owner_after, start_qc
from quorumgate.replica.pruning import PrunedError
from quorumgate.replica.storage import ReplicaStore, StorageError, StoredEpoch, decode_epoch_row
from quorumgate.replica.types import Block, QuorumCert, RemoteError, genesis_block
from quorumgate.replica.wire import decode_block, encode_epoch_end
from quorumgate.runtime.channels import Reader, aio_channel
from quorumgate.runtime.process import tune_gc
from quorumgate.sidecar.engine.core import Engine, EngineConfig, config_for_cluster
from quorumgate.sidecar.engine.state import EngineState
from quorumgate.sidecar.execution import execute_block
from quorumgate.sidecar.ledger import LedgerEntry
from quorumgate.sidecar.receiptkeys import ReadKeys, signing_receipt_key
from quorumgate.sidecar.receipts import ReceiptEpoch, ReceiptEpochs
from quorumgate.sidecar.snapshots import (
    SNAPSHOT_DIR,
    SnapshotDir,
    SnapshotError,
    SnapshotOptions,
    check_state,
    fetch_snapshot,
    grpc_peers,
)
from quorumgate.sidecar.store import Checkpoint, DivergenceError, ExecutedHeight, SidecarStore

CHECKPOINT_HEIGHTS = 1_000  # a checkpoint after every height that is a multiple of it
REPLAY_WORKERS = 1  # processes executing beside the one reading the log and the store
REPLAY_BATCH_BLOCKS = 32  # blocks per job sent to the executing process
REPLAY_BATCHES_AHEAD = 2  # jobs in flight beyond the one being recorded
CHECKPOINT_FILE = "replay.checkpoint"
READ_BLOCKS_PER_PAGE = 256
MISMATCHES_KEPT_MAX = 1_000
VERIFIED_CACHE_MAX = 4_096
ZERO_HASH = bytes(32)
# A snapshot is fetched from peers, which may be ahead of this member's replica: how long
# a replay from a snapshot waits for the running replica's log to reach its height.
LOG_REACHES_SNAPSHOT_WAIT_S = 30.0
LOG_TOP_POLL_S = 0.2
EPOCH_ENDS_TIMEOUT_S = 10.0  # the running replica's answer with its stored epoch ends


class ReplayError(Exception):
    """Replay cannot run (a running sidecar, an unreadable store or log)."""


@dataclass
class ReplayReport:
    node: int
    from_height: int
    top_height: int = 0
    resumed_from: int = 0
    heights_replayed: int = 0
    heights_compared: int = 0
    heights_recorded: int = 0
    verdicts: int = 0
    artifacts_reconfirmed: int = 0
    artifacts_written: int = 0
    certificates_checked: int = 0
    mismatches: list[dict[str, object]] = field(default_factory=list)
    seconds: float = 0.0
    # Where the store's local history starts (0: height 1; else a checkpoint's height,
    # with its ledger head), and the snapshot fetched to install it, if this run did.
    history_from: int = 0
    history_ledger_head: str = ""
    # True when the store pruned its history at that checkpoint (docs/pruning.md), not
    # installed from a snapshot there.
    history_pruned: bool = False
    snapshot: dict[str, object] | None = None
    # The epoch the first replayed block was certified in (0 unless replay started past
    # an epoch change), and each epoch change it crossed: the epoch, the change block's
    # height, the first height of the epoch, the members whose key changed.
    start_epoch: int = 0
    epochs: list[dict[str, object]] = field(default_factory=list)

    @property
    def snapshot_height(self) -> int:
        """The height of the snapshot this run installed (0: none)."""
        height = (self.snapshot or {}).get("height", 0)
        assert isinstance(height, int), "a snapshot's height is an int"
        return height

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["rate_heights_per_s"] = (
            round(self.heights_replayed / self.seconds, 1) if self.seconds else None
        )
        out["rate_verdicts_per_s"] = (
            round(self.verdicts / self.seconds, 1) if self.seconds else None
        )
        out["seconds"] = round(self.seconds, 3)
        return out


@dataclass
class _Checkpoint:
    height: int
    block_hash: str
    block_view: int
    ledger_head: str
    engine_state_file: str


# ------------------------------------------------------------------ reading the log


async def _blocks_from_replica(
    spec: ClusterSpec, index: int, start: int, top: int
) -> AsyncIterator[Block]:
    if start > top:
        # Nothing to read (a snapshot or checkpoint at the top): the stream would wait
        # for the next commit, which an idle cluster does not make (docs/consensus/
        # protocol.md, "An idle cluster goes quiet").
        return
    reader = await _member_reader(spec, index)  # a member reads
    async with aio_channel(spec, index, reader=reader) as channel:
        stub = cpb_grpc.ReplicaStub(channel)
        stream = stub.CommittedBlocks(cpb.BlocksRequest(from_height=start))
        try:
            async for committed in stream:
                if committed.height > top:
                    stream.cancel()
                    return
                yield decode_block(spec.chain_id, committed.block.SerializeToString())
                if committed.height == top:
                    stream.cancel()
                    return
        except grpc.aio.AioRpcError as err:
            if err.code() is grpc.StatusCode.OUT_OF_RANGE:  # pruned (docs/pruning.md)
                raise ReplayError(f"replica {index}: {err.details()}") from err
            raise


async def _blocks_from_store(store: ReplicaStore, start: int, top: int) -> AsyncIterator[Block]:
    height = start
    while height <= top:
        try:
            page = await store.committed_range(height, min(top, height + READ_BLOCKS_PER_PAGE - 1))
        except PrunedError as err:  # pruned below a snapshot (docs/pruning.md)
            raise ReplayError(str(err)) from err
        if not page:
            raise ReplayError(f"the replica's log has no block at height {height}")
        for block in page:
            yield block
        height = page[-1].height + 1


async def log_reaching(
    top_of: Callable[[], Awaitable[int | None]],
    top: int,
    height: int,
    wait_s: float = LOG_REACHES_SNAPSHOT_WAIT_S,
) -> int:
    """The running replica's committed top once it reaches `height` (a snapshot fetched
    from peers ahead of it), or the last top read when `wait_s` passes first or it stops
    answering. Replaying from a snapshot above the log's top would replay nothing and
    report a top below the store's own height."""
    deadline = time.monotonic() + wait_s
    while top < height and time.monotonic() < deadline:
        await asyncio.sleep(LOG_TOP_POLL_S)
        now = await top_of()
        if now is None:
            break
        top = max(top, now)
    return top


async def _replica_top(spec: ClusterSpec, index: int) -> int | None:
    """The running replica's committed height, or None if it does not answer."""
    async with aio_channel(spec, index) as channel:
        stub = cpb_grpc.ReplicaStub(channel)
        try:
            status = await stub.Status(cpb.StatusRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            return None
    return int(status.committed_height)


# ------------------------------------------------------------------ checkpoints


def _checkpoint_path(spec: ClusterSpec, index: int) -> Path:
    return spec.node_dir(index) / CHECKPOINT_FILE


def _load_checkpoint(spec: ClusterSpec, index: int) -> tuple[_Checkpoint, bytes] | None:
    path = _checkpoint_path(spec, index)
    try:
        doc = json.loads(path.read_text())
        checkpoint = _Checkpoint(**doc)
        state = (path.parent / checkpoint.engine_state_file).read_bytes()
    except (OSError, ValueError, TypeError):
        return None
    return checkpoint, state


def _write_checkpoint(
    spec: ClusterSpec, index: int, block: Block, ledger_head: bytes, state: bytes
) -> None:
    node_dir = spec.node_dir(index)
    state_name = f"{CHECKPOINT_FILE}.state"
    tmp_state = node_dir / f"{state_name}.tmp"
    tmp_state.write_bytes(state)
    os.replace(tmp_state, node_dir / state_name)
    doc = _Checkpoint(block.height, block.hash.hex(), block.view, ledger_head.hex(), state_name)
    tmp = node_dir / f"{CHECKPOINT_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(doc)))
    os.replace(tmp, node_dir / CHECKPOINT_FILE)


def _clear_checkpoint(spec: ClusterSpec, index: int) -> None:
    node_dir = spec.node_dir(index)
    for name in (CHECKPOINT_FILE, f"{CHECKPOINT_FILE}.state"):
        (node_dir / name).unlink(missing_ok=True)


# ------------------------------------------------------------------ comparing one height


async def _compare(
    store: SidecarStore,
    chain_id: str,
    executed: ExecutedHeight,
    entries: list[LedgerEntry],
    report: ReplayReport,
) -> None:
    height = executed.height

    def mismatch(what: str, detail: str) -> None:
        if len(report.mismatches) < MISMATCHES_KEPT_MAX:
            report.mismatches.append({"height": height, "what": what, "detail": detail})

    root = await store.root_at(height)
    if root != executed.result.state_root:
        got = root.hex()[:16] if root else "none"
        mismatch("state_root", f"recorded {got}, replayed {executed.result.state_root.hex()[:16]}")
    signed = await store.signed_block(height)
    if signed is None or (signed.verdict_root, signed.leaf_count) != (
        executed.signed.verdict_root,
        executed.signed.leaf_count,
    ):
        mismatch("verdict_root", "the signed verdict root or leaf count differs")
    elif signed.validity != executed.signed.validity:
        mismatch("validity", "the signed validity window differs")
    elif signed.epoch != executed.signed.epoch:
        mismatch("epoch", "the epoch the block statement names differs")
    receipts = await store.receipts_at(height)
    if [r.leaf for r in receipts] != list(executed.leaves):
        mismatch(
            "receipts", f"{len(receipts)} recorded leaves, {len(executed.leaves)} replayed differ"
        )
    recorded = [e for e in await store.ledger(height, len(entries) + 1) if e.height == height]
    if recorded != entries:  # every field, not only the stored hash
        first = next(
            (i for i, (a, b) in enumerate(zip(recorded, entries, strict=False)) if a != b),
            min(len(recorded), len(entries)),
        )
        mismatch("ledger", f"ledger entry (height {height}, index {first}) differs from the replay")
    stored_artifacts = await store.artifacts_at(height)
    for artifact in executed.result.artifacts:
        _, target = artifact.key
        data = stored_artifacts.pop(target, None)
        if data is None:
            mismatch("artifact_missing", f"no artifact for ({height}, {target!r})")
        elif data != artifact.to_bytes():
            mismatch(
                "artifact",
                str(DivergenceError(artifact.key, data, artifact.to_bytes())),
            )
        else:
            report.artifacts_reconfirmed += 1
    for target in stored_artifacts:
        mismatch("artifact_extra", f"recorded artifact ({height}, {target!r}) not replayed")


# ------------------------------------------------------------------ the executing process


class _Epochs:
    """The member set that certifies the blocks replayed so far, moved on at each change
    block exactly as the replica core moves on (docs/consensus/epochs.md, "Where an epoch
    ends"). The change block's commit is proved by the epoch end the replica stored, taken
    only if it checks as a follower checks a link of the chain of epochs
    (replica/epochchain.py `check_link`: the record the owner signed, the suffix and its
    QC certified by the ending epoch's keys, the next keys those the record gives), so
    the rule lives in one place. The blocks after it are checked with the next member
    set, the first one from the unsigned start certificate naming the change block.
    `owner` moves on with it: the record key of the next epoch is the one the change
    block's record leaves (docs/consensus/epochs.md, "The record key"). On a chain that
    does not run epochs (`owner` None) the genesis member set certifies every block, as
    before."""

    def __init__(
        self,
        membership: Membership,
        start: QuorumCert | None,
        owner: OwnerRecords | None,
        ends: tuple[StoredEpoch, ...],
    ) -> None:
        self.owner = owner
        self.ends = {end.epoch: end for end in ends}
        self.membership = membership
        self.checker = self._checker(membership, start)
        started = self.ends.get(membership.epoch) if membership.epoch else None
        self.link = ChainedEpoch(
            membership,
            None if started is None else started.boundary,
            None if owner is None else owner.owner_key,
        )

    @staticmethod
    def _checker(membership: Membership, start: QuorumCert | None) -> CertificateChecker:
        # A cache of its own per epoch: a certificate found valid in one epoch proves
        # nothing in another (docs/consensus/epochs.md, "Signatures name their epoch").
        return CertificateChecker(membership, Verifier(VERIFIED_CACHE_MAX), start)

    def after(self, block: Block) -> bool:
        """Move on past `block` (whose certificate checked): True when it is a change
        block, whose stored epoch end proved its commit. Raises `RemoteError` for a change
        block without a valid stored end, or a stored end at a block that changes
        nothing (the store and the blocks disagree on where the epoch ended)."""
        if self.owner is None:
            return False
        epoch = self.membership.epoch
        end = self.ends.get(epoch + 1)
        if end is None or end.boundary.hash != block.hash:
            if change_in(block, self.membership, self.owner) is not None:
                raise RemoteError(
                    "bad_epoch_end",
                    f"no stored end of epoch {epoch} proves the commit of the change block "
                    f"at height {block.height}",
                )
            return False
        raw = PlainEpochEnd(
            end.epoch, b"".join(end.keys), encode_epoch_end(end.boundary, end.suffix, end.qc)
        )
        try:
            link = check_link(self.link, raw, self.owner)
        except EpochChainError as err:
            if err.reason == "no_change":
                detail = (
                    f"the replica stores the end of epoch {epoch} at height {block.height}, "
                    "whose block changes nothing"
                )
            else:
                detail = f"the stored end of epoch {epoch} does not check: {err}"
            raise RemoteError("bad_epoch_end", detail) from err
        self.link = link
        # The next epoch's reader, as the replica derives it: the record key and the
        # receipt keys the change block's record leaves.
        self.owner = owner_after(block, self.membership, self.owner)
        self.membership = link.membership
        self.checker = self._checker(link.membership, start_qc(block.chain_id, block))
        return True


@dataclass(frozen=True)
class _WorkerSetup:
    """What the executing process starts from (sent to it once, pickled; the receipt key's
    seed is never logged)."""

    config: EngineConfig
    receipt_seed: bytes = field(repr=False)  # the cluster file's: epoch 0's
    index: int
    membership: Membership  # the member set certifying the first block replayed
    state: bytes | None = field(repr=False)  # a checkpoint's engine state, or from height 1
    checkpoint_heights: int  # CHECKPOINT_HEIGHTS when replay started (tests lower it)
    # The store's executed height: the heights above it are recorded, the first of them
    # with the whole state (its delta full), whatever form the store held the state in.
    recorded_height: int = 0
    # The epoch's start certificate when `membership` is not the genesis set; the owner's
    # records on a chain that runs epochs; the replica's stored epoch ends (`_Epochs`).
    start: QuorumCert | None = None
    owner: OwnerRecords | None = None
    ends: tuple[StoredEpoch, ...] = ()
    # The receipt keys the node directory holds (docs/consensus/epochs.md,
    # "Receipt keys"): each block is signed with the member's key of the block's epoch.
    rotated_seeds: tuple[bytes, ...] = field(default=(), repr=False)
    # A new machine's own entry (join.json): the blocks of epochs before the one its
    # `replace` starts are signed with its own receipt key (`signing_receipt_key`).
    joined: MemberSpec | None = None


class _Worker:
    """The engine and the certificate checks, in whichever process executes."""

    def __init__(self, setup: _WorkerSetup) -> None:
        config = setup.config
        self.engine = (
            Engine(config) if setup.state is None else Engine.from_state_bytes(config, setup.state)
        )
        self.key = SigningKey(setup.receipt_seed)
        self.keys = {bytes(self.key.verify_key): self.key}
        for seed in setup.rotated_seeds:
            key = SigningKey(seed)
            self.keys.setdefault(bytes(key.verify_key), key)
        self.index = setup.index
        self.joined = setup.joined
        self.chain_id = config.chain_id
        self.epochs = _Epochs(setup.membership, setup.start, setup.owner, setup.ends)
        self.checkpoint_heights = setup.checkpoint_heights
        self.recorded_height = setup.recorded_height

    def run(self, blocks: list[Block]) -> list[_Outcome]:
        """Each block's certificate checked (and a change block's commit proof) and the
        block executed, in order; a block whose check fails ends the list with the
        reason (nothing after it runs)."""
        out: list[_Outcome] = []
        for block in blocks:
            # The block is signed in its own epoch: a change block in the one it ends.
            membership, reader = self.epochs.membership, self.epochs.owner
            epoch = membership.epoch
            try:
                self.epochs.checker.check_qc(block.justify)
                self.epochs.after(block)
            except RemoteError as err:
                out.append(str(err))
                break
            public = bytes(self.key.verify_key)
            if reader is not None and reader.receipt_keys:
                public = signing_receipt_key(
                    self.joined, self.index, membership, reader.receipt_keys[self.index]
                )
            key = self.keys.get(public)
            if key is None:
                out.append(
                    f"no_receipt_key: the node directory holds no receipt key "
                    f"{public.hex()[:16]}, this member's in epoch {epoch}"
                )
                break
            if block.height == self.recorded_height + 1:
                self.engine.state.restart_delta()  # the first height the store records
            executed = execute_block(self.engine, key, self.index, self.chain_id, block, epoch)
            due = block.height % self.checkpoint_heights == 0
            state = self.engine.state_bytes() if due else None
            out.append((executed, state))
        return out


# A block's outcome: (what it produced, the engine state when a checkpoint is due), or why
# its certificate failed.
_Outcome = tuple[ExecutedHeight, bytes | None] | str
_worker: _Worker | None = None  # in the executing process


def _worker_start(setup: _WorkerSetup) -> None:
    global _worker
    _worker = _Worker(setup)
    tune_gc()  # a process of its own: what it loaded stays, the blocks' garbage goes


def _worker_run(blocks: list[Block]) -> list[_Outcome]:
    assert _worker is not None, "the executing process was not started"
    return _worker.run(blocks)


def _spawnable() -> bool:
    """Whether a spawned process can start here: it re-imports the main module from its
    file, which a program read from stdin (`python -`) does not have."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    return main_file is None or os.path.exists(main_file)


async def _linked(
    blocks: AsyncIterator[Block], prev_hash: bytes, prev_view: int, prev_height: int
) -> AsyncIterator[Block]:
    """The log's blocks, each checked to extend the one before it and to carry a
    certificate naming it (the certificate's signatures are checked where it executes)."""
    async for block in blocks:
        if block.height != prev_height + 1 or block.parent_hash != prev_hash:
            raise ReplayError(f"the replica's log breaks at height {block.height}")
        if block.justify.view != prev_view or block.justify.height != prev_height:
            raise ReplayError(f"block {block.height}'s certificate names another parent")
        yield block
        prev_hash, prev_view, prev_height = block.hash, block.view, block.height


async def _executed(
    blocks: AsyncIterator[Block], setup: _WorkerSetup, workers: int
) -> AsyncIterator[tuple[Block, _Outcome]]:
    """Each block with its outcome, in order. With a worker, batches of
    `REPLAY_BATCH_BLOCKS` go to the executing process and up to `REPLAY_BATCHES_AHEAD` of
    them are in flight while the caller records the one before: the engine runs on one
    core while the log is read and the store written on the other."""
    if workers == 0 or not _spawnable():
        local = _Worker(setup)
        async for block in blocks:
            outcome = local.run([block])[0]
            yield block, outcome
            if isinstance(outcome, str):
                return
        return
    loop = asyncio.get_running_loop()
    pool = ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),  # no fork of a process with gRPC
        initializer=_worker_start,
        initargs=(setup,),
    )
    in_flight: deque[tuple[list[Block], asyncio.Future[list[_Outcome]]]] = deque()

    def send(batch: list[Block]) -> None:
        in_flight.append((batch, loop.run_in_executor(pool, _worker_run, batch)))

    try:
        source, exhausted, batch = aiter(blocks), False, []
        while True:
            if not exhausted:
                try:
                    batch.append(await anext(source))
                except StopAsyncIteration:
                    exhausted = True
                if batch and (exhausted or len(batch) == REPLAY_BATCH_BLOCKS):
                    send(batch)
                    batch = []
            if not exhausted and len(in_flight) <= REPLAY_BATCHES_AHEAD:
                continue  # read on while the worker has enough in hand
            if not in_flight:
                return  # everything read and yielded
            sent, future = in_flight.popleft()
            for item in zip(sent, await future, strict=False):
                yield item
                if isinstance(item[1], str):
                    return  # a failed certificate: nothing after it
    finally:
        for _, future in in_flight:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------ replay


ProgressFn = Callable[[int, int, float], None]


@dataclass
class _Position:
    """Where a replay stands: the last block it linked and the ledger head after it."""

    block_hash: bytes
    view: int
    height: int
    ledger_head: bytes
    state: bytes | None  # the engine state to start from (a checkpoint's), None from genesis


def _resume_position(
    spec: ClusterSpec,
    index: int,
    top: int,
    report: ReplayReport,
    *,
    resume: bool,
    base: _Position | None = None,
) -> _Position:
    """Genesis (or `base`, where the store's local history starts), or the checkpoint an
    interrupted replay left if it is above that and not above the log."""
    prev = genesis_block(spec.chain_id)
    position = base or _Position(prev.hash, prev.view, prev.height, ZERO_HASH, None)
    loaded = _load_checkpoint(spec, index) if resume else None
    if loaded is not None:
        checkpoint, checkpoint_state = loaded
        if position.height < checkpoint.height <= top:
            position = _Position(
                bytes.fromhex(checkpoint.block_hash),
                checkpoint.block_view,
                checkpoint.height,
                bytes.fromhex(checkpoint.ledger_head),
                checkpoint_state,
            )
            report.resumed_from = checkpoint.height
    return position


async def _install_snapshot(
    spec: ClusterSpec,
    index: int,
    store: SidecarStore,
    report: ReplayReport,
    epochs: ReceiptEpochs,
) -> None:
    """Fetch the newest snapshot f+1 members attest and install it into the empty store;
    it is kept, pinned, among this sidecar's snapshots (the base of its local history).
    The attestations are checked with each member's receipt key of the height's epoch
    (`epochs`, from the replica's stored epoch ends)."""
    if store.executed_height or store.checkpoint is not None:
        raise ReplayError(
            f"sidecar {index}'s store holds heights up to {store.executed_height}: a "
            "snapshot is installed into an empty store only (move the store aside first)"
        )
    started = time.perf_counter()
    node_dir = spec.node_dir(index)
    peers = grpc_peers(spec, index, ReadKeys(node_dir).keys)
    try:
        fetched = await fetch_snapshot(
            spec, config_for_cluster(spec), index, [peer for peer, _ in peers], epochs
        )
    except SnapshotError as err:
        raise ReplayError(f"no snapshot to start from: {err}") from err
    finally:
        for _, channel in peers:
            await channel.close()
    manifest = fetched.manifest
    snapshots = SnapshotDir(node_dir / SNAPSHOT_DIR, SnapshotOptions.read(node_dir).kept)
    snapshots.pinned = manifest.height
    await asyncio.to_thread(snapshots.write, manifest.head, fetched.data)
    await store.install_checkpoint(manifest.head, EngineState.from_bytes(fetched.data))
    report.snapshot = {
        "height": manifest.height,
        "bytes": manifest.total_bytes,
        "chunks": len(manifest.chunk_digests),
        "attested_by": list(fetched.attested_by),
        "served_by": list(fetched.served_by),
        "chunks_refused": fetched.chunks_refused,
        "seconds": round(time.perf_counter() - started, 3),
    }


async def _history_base(
    spec: ClusterSpec,
    index: int,
    checkpoint: Checkpoint,
    replica_store: ReplicaStore | None,
    report: ReplayReport,
) -> _Position:
    """Where replay starts in a store whose local history starts at `checkpoint`: its
    block (read from the log for its view, and checked to be the checkpoint's) and the
    snapshot state it was installed from, checked again against the checkpoint's root."""
    height = checkpoint.height
    report.history_from, report.history_ledger_head = height, checkpoint.ledger_head.hex()
    node_dir = spec.node_dir(index)
    where = (
        f"sidecar {index}'s local history starts at height {height} (ledger head "
        f"{checkpoint.ledger_head.hex()[:16]}…, "
        + ("pruned below it at a snapshot)" if report.history_pruned else "a snapshot)")
    )
    snapshots = SnapshotDir(node_dir / SNAPSHOT_DIR)
    state, manifest = snapshots.state(height), snapshots.manifest(height)
    if state is None or manifest is None or manifest.head != checkpoint:
        raise ReplayError(
            f"{where}, and the snapshot it was installed from is not in "
            f"{node_dir / SNAPSHOT_DIR}: move the store aside and run "
            f"`quorumgate replay --dir {spec.directory} --node {index} --from-snapshot`"
        )
    problem = check_state(config_for_cluster(spec), manifest, state)
    if problem is not None:
        raise ReplayError(f"{where}; its snapshot on disk: {problem}")
    source = (
        _blocks_from_store(replica_store, height, height)
        if replica_store is not None
        else _blocks_from_replica(spec, index, height, height)
    )
    async with contextlib.aclosing(source) as blocks:
        block = await anext(aiter(blocks), None)
    if block is None or block.hash != checkpoint.block_hash:
        raise ReplayError(f"{where}; the replica's block at that height is not the snapshot's")
    return _Position(block.hash, block.view, height, checkpoint.ledger_head, state)


async def _start_position(
    spec: ClusterSpec,
    index: int,
    store: SidecarStore,
    replica_store: ReplicaStore | None,
    top: int,
    report: ReplayReport,
    resume: bool,
) -> _Position:
    """Where this replay starts: where the store's local history starts (genesis, or its
    checkpoint: docs/snapshots.md), or a later checkpoint of an interrupted replay."""
    report.history_pruned = store.checkpoint_signature is not None
    base = (
        None
        if store.checkpoint is None
        else await _history_base(spec, index, store.checkpoint, replica_store, report)
    )
    return _resume_position(spec, index, top, report, resume=resume, base=base)


async def _open_log(spec: ClusterSpec, index: int) -> tuple[int, ReplicaStore | None]:
    """The committed top of the replica's log: asked of the running replica, or read from
    its store when it does not answer (then the open store is returned to read blocks)."""
    top = await _replica_top(spec, index)
    if top is not None:
        return top, None
    try:
        replica_store = await ReplicaStore.open(spec.node_dir(index) / "replica.db", spec.chain_id)
    except Exception as err:
        raise ReplayError(f"replica {index} neither answers nor opens: {err}") from err
    return replica_store.committed_height, replica_store


async def _epoch_rows(
    spec: ClusterSpec, index: int, replica_store: ReplicaStore | None
) -> tuple[StoredEpoch, ...]:
    """The epoch ends the replica stored (replica/storage.py `epochs`), oldest first: from
    its open store, or asked of the running replica. Empty on a chain without epochs."""
    if not spec.runs_epochs:
        return ()
    if replica_store is not None:
        return replica_store.epoch_ends
    try:
        reply = await _epoch_ends(spec, index, ReadKeys(spec.node_dir(index)))
    except grpc.aio.AioRpcError as err:
        raise ReplayError(
            f"replica {index} does not tell how its epochs ended: {err.details()}"
        ) from err
    where = f"replica {index}"
    try:
        return tuple(
            decode_epoch_row(where, spec.chain_id, end.epoch, end.keys, end.ended)
            for end in reply.ends
        )
    except StorageError as err:
        raise ReplayError(str(err)) from err


async def _epoch_ends(spec: ClusterSpec, index: int, keys: ReadKeys) -> cpb.EpochEndsReply:
    """The running replica's stored epoch ends, asked with the first receipt key of ours
    it takes: its member's of the epoch it runs (sidecar/receiptkeys.py `ReadKeys`; after a
    rotation the cluster file's key reads nothing there). `keys` is left at that key."""
    last: grpc.aio.AioRpcError | None = None
    for _ in keys.keys:
        async with aio_channel(spec, index, reader=keys.reader) as channel:
            stub = cpb_grpc.ReplicaStub(channel)
            try:
                reply: cpb.EpochEndsReply = await stub.EpochEnds(
                    cpb.EpochEndsRequest(), timeout=EPOCH_ENDS_TIMEOUT_S
                )
                return reply
            except grpc.aio.AioRpcError as err:
                if not keys.refused(err):
                    raise
                last = err
    assert last is not None, "a node directory holds one receipt key or more"
    raise last


async def _member_reader(spec: ClusterSpec, index: int) -> Reader:
    """A receipt key of ours that the running replica reads as its member's (found by
    asking for its epoch ends, which only members may read)."""
    keys = ReadKeys(spec.node_dir(index))
    try:
        await _epoch_ends(spec, index, keys)
    except grpc.aio.AioRpcError as err:
        raise ReplayError(
            f"replica {index} answers none of our receipt keys: {err.details()}"
        ) from err
    return keys.reader


def _receipt_epochs(
    spec: ClusterSpec, rows: tuple[StoredEpoch, ...], report: ReplayReport
) -> ReceiptEpochs:
    """The receipt keys of every epoch the replica's stored epoch ends prove (each checked
    as replay checks it, `_Epochs.after`), with the heights each epoch holds: what a
    snapshot's attestations are checked against (sidecar/snapshots.py). The last epoch
    has no end as far as this replica knows. On a chain that runs no epochs: the cluster
    file's keys, in any epoch."""
    owner = spec.record_reader() if spec.runs_epochs else None
    if owner is None:
        return ReceiptEpochs.genesis(spec.receipt_keys)
    epochs = _Epochs(spec.membership(), None, owner, rows)
    known: list[ReceiptEpoch] = []
    first, keys = 1, owner.receipt_keys
    for row in rows:
        _move_past(epochs, row, report)
        if epochs.owner is None:
            raise ReplayError(
                f"replica {report.node}'s stored end of epoch {row.epoch - 1} does not prove "
                "itself: it leaves no record key"
            )
        known.append(ReceiptEpoch(row.epoch - 1, first, row.boundary.height, keys))
        first, keys = row.boundary.height + 1, epochs.owner.receipt_keys
    known.append(ReceiptEpoch(len(known), first, None, keys))
    return ReceiptEpochs(tuple(known))


def _epochs_at(
    spec: ClusterSpec, rows: tuple[StoredEpoch, ...], height: int, report: ReplayReport
) -> tuple[Membership, QuorumCert | None]:
    """The member set certifying the block after `height`, and its epoch's start
    certificate: the genesis set moved on through every stored epoch end at or below
    `height`, each checked as the blocks' own would be (`_Epochs.after` on its change
    block), so a replay that starts past a boundary (a checkpoint, a snapshot) trusts no
    key the chain of epochs from genesis does not prove."""
    epochs, start = _epochs_through(spec, rows, height, report)
    return epochs.membership, start


def _epochs_through(
    spec: ClusterSpec, rows: tuple[StoredEpoch, ...], height: int, report: ReplayReport
) -> tuple[_Epochs, QuorumCert | None]:
    """`_epochs_at`, with the reader of the epoch's records (`_Epochs.owner`: the record
    key each change block's record leaves)."""
    owner = spec.record_reader() if spec.runs_epochs else None
    epochs = _Epochs(spec.membership(), None, owner, rows)
    start: QuorumCert | None = None
    for row in rows:
        if row.boundary.height > height:
            break
        _move_past(epochs, row, report)
        start = start_qc(spec.chain_id, row.boundary)
    report.start_epoch = epochs.membership.epoch
    return epochs, start


def _move_past(epochs: _Epochs, row: StoredEpoch, report: ReplayReport) -> None:
    """Move `epochs` past one stored epoch end, checked as the blocks' own would be
    (`_Epochs.after` on its change block); `ReplayError` when it does not prove itself."""
    problem = f"replica {report.node}'s stored end of epoch {row.epoch - 1} does not prove itself"
    try:
        moved = epochs.after(row.boundary)
    except RemoteError as err:
        raise ReplayError(f"{problem}: {err}") from err
    if not moved or epochs.membership.epoch != row.epoch:
        raise ReplayError(f"{problem}: its block changes nothing of the epoch before")


def _crossed(
    rows: tuple[StoredEpoch, ...], block: Block, report: ReplayReport, first: Membership
) -> None:
    """Count the epoch change at `block` in the report if it is the change block of the
    epoch replay is in (the executing process checked it: `_Epochs.after`). `first`: the
    member set replay started with (the genesis set when it started in epoch 0)."""
    if not rows:
        return  # no epoch ended (or the chain does not run epochs): the common case
    epoch = report.epochs[-1]["epoch"] if report.epochs else report.start_epoch
    assert isinstance(epoch, int)
    ends = {row.epoch: row for row in rows}
    end = ends.get(epoch + 1)
    if end is None or end.boundary.hash != block.hash:
        return
    before = ends[epoch].keys if epoch else tuple(m.public_key for m in first.members)
    rotated = [i for i, (a, b) in enumerate(zip(before, end.keys, strict=False)) if a != b]
    report.epochs.append(
        {
            "epoch": epoch + 1,
            "boundary_height": block.height,
            "from_height": block.height + 1,
            "rotated": rotated,
        }
    )


def _worker_setup(
    spec: ClusterSpec,
    index: int,
    rows: tuple[StoredEpoch, ...],
    at: _Position,
    recorded_height: int,
    report: ReplayReport,
) -> _WorkerSetup:
    """What the executing process starts from at `at`, in the epoch of the block after it."""
    epochs, epoch_start = _epochs_through(spec, rows, at.height, report)
    return _WorkerSetup(
        config_for_cluster(spec),
        read_seed(spec.node_dir(index) / RECEIPT_KEY_FILE),
        index,
        epochs.membership,
        at.state,
        CHECKPOINT_HEIGHTS,
        recorded_height,
        epoch_start,
        epochs.owner,
        rows,
        tuple(held_receipt_seeds(spec.node_dir(index))),
        spec.joined,
    )


async def _take(
    spec: ClusterSpec,
    store: SidecarStore,
    block: Block,
    executed: ExecutedHeight,
    position: _Position,
    report: ReplayReport,
) -> bool:
    """Compare a re-executed block with what the store recorded, or record it; False when
    it diverges from the store (the replay stops there)."""
    report.heights_replayed += 1
    report.verdicts += len(executed.result.verdicts)
    if block.height <= store.executed_height:
        # Recorded before: compare (the ledger entries are computed here only).
        entries = LedgerEntry.chain(
            spec.chain_id,
            block.height,
            executed.result.verdicts,
            position.ledger_head,
            executed.ledger_extras,
        )
        position.ledger_head = entries[-1].hash if entries else position.ledger_head
        if block.height >= report.from_height:
            report.heights_compared += 1
            await _compare(store, spec.chain_id, executed, entries, report)
        return True
    try:
        await store.record(executed)
    except DivergenceError as err:
        report.mismatches.append({"height": block.height, "what": "artifact", "detail": str(err)})
        return False
    report.heights_recorded += 1
    report.artifacts_written += len(executed.result.artifacts)
    position.ledger_head = store.ledger_head
    return True


async def replay(
    spec: ClusterSpec,
    index: int,
    *,
    from_height: int = 1,
    resume: bool = True,
    progress: ProgressFn | None = None,
    workers: int = REPLAY_WORKERS,
    from_snapshot: bool = False,
) -> ReplayReport:
    """`workers`: 1 runs the engine and the certificate checks in a second process while
    this one reads the log and writes the store (both cores work); 0 runs all of it here.
    `from_snapshot`: install the empty store from a snapshot first (module doc)."""
    if workers not in (0, 1):
        raise ValueError("workers must be 0 or 1")
    node_dir = spec.node_dir(index)
    report = ReplayReport(node=index, from_height=max(1, from_height))
    started = time.perf_counter()
    try:
        store = await SidecarStore.open(node_dir / "sidecar.db", spec.chain_id)
    except Exception as err:
        raise ReplayError(
            f"cannot open sidecar {index}'s store ({err}); stop the sidecar first"
        ) from err
    replica_store: ReplicaStore | None = None
    try:
        top, replica_store = await _open_log(spec, index)
        rows = await _epoch_rows(spec, index, replica_store)
        if from_snapshot:
            epochs = _receipt_epochs(spec, rows, report)
            await _install_snapshot(spec, index, store, report, epochs)
        if report.snapshot is not None and replica_store is None:
            top = await log_reaching(lambda: _replica_top(spec, index), top, report.snapshot_height)
        report.top_height = top
        at = await _start_position(spec, index, store, replica_store, top, report, resume)
        setup = _worker_setup(spec, index, rows, at, store.executed_height, report)
        start = at.height + 1
        blocks = (
            _blocks_from_store(replica_store, start, top)
            if replica_store is not None
            else _blocks_from_replica(spec, index, start, top)
        )
        linked = _linked(blocks, at.block_hash, at.view, at.height)
        async with contextlib.aclosing(_executed(linked, setup, workers)) as outcomes:
            async for block, outcome in outcomes:
                if isinstance(outcome, str):  # the block's certificate did not verify
                    report.mismatches.append(
                        {"height": block.height, "what": "certificate", "detail": outcome}
                    )
                    break
                report.certificates_checked += 1
                _crossed(rows, block, report, setup.membership)
                executed, checkpoint_state = outcome
                if not await _take(spec, store, block, executed, at, report):
                    break
                at.height = block.height
                if checkpoint_state is not None:
                    _write_checkpoint(spec, index, block, at.ledger_head, checkpoint_state)
                if progress is not None:
                    progress(block.height, top, time.perf_counter() - started)
        if at.height == top and not report.mismatches:
            _clear_checkpoint(spec, index)
    finally:
        await store.close()
        if replica_store is not None:
            await replica_store.close()
    report.seconds = time.perf_counter() - started
    return report
