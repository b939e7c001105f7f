"""`quorumgate replay`: rebuild a sidecar's state from its replica's committed log (DESIGN §5).

Every committed block is read in height order (from the running replica's stream, or from
its database when it is stopped), its certificate checked — it extends the block before it
and its justify QC carries 2f+1 valid signatures for that block — and executed again by a
fresh engine. For each height the sidecar has already executed, everything is compared
with what it recorded: the state root, the signed verdict root, every receipt leaf, every
ledger entry (recomputed on the hash chain) and every rejection artifact. Same artifact
bytes re-confirm it; different bytes are a divergence naming the key. Heights the sidecar
has not executed yet (or all of them, after its store was wiped) are recorded, exactly as
the sidecar would have.

Replay is resumable: every `CHECKPOINT_HEIGHTS` heights it writes a checkpoint (the engine
state, the last block and the ledger head) beside the store, and a later run continues from
it. The sidecar must be stopped while replay writes its store.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.clusterfile import RECEIPT_KEY_FILE, ClusterSpec, read_seed
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.channels import Reader, aio_channel
from quorumgate.replica.crypto import Verifier
from quorumgate.replica.storage import ReplicaStore
from quorumgate.replica.types import Block, RemoteError, genesis_block
from quorumgate.replica.wire import decode_block
from quorumgate.sidecar.engine.core import Engine, config_for_cluster
from quorumgate.sidecar.execution import execute_block
from quorumgate.sidecar.ledger import LedgerEntry
from quorumgate.sidecar.store import DivergenceError, ExecutedHeight, SidecarStore

CHECKPOINT_HEIGHTS = 1_000
CHECKPOINT_FILE = "replay.checkpoint"
READ_BLOCKS_PER_PAGE = 256
MISMATCHES_KEPT_MAX = 1_000
VERIFIED_CACHE_MAX = 4_096
ZERO_HASH = bytes(32)


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
    key = SigningKey(read_seed(spec.node_dir(index) / RECEIPT_KEY_FILE))  # a member reads
    async with aio_channel(spec, index, reader=Reader.of(key)) as channel:
        stub = cpb_grpc.ReplicaStub(channel)
        stream = stub.CommittedBlocks(cpb.BlocksRequest(from_height=start))
        async for committed in stream:
            if committed.height > top:
                stream.cancel()
                return
            yield decode_block(spec.chain_id, committed.block.SerializeToString())
            if committed.height == top:
                stream.cancel()
                return


async def _blocks_from_store(store: ReplicaStore, start: int, top: int) -> AsyncIterator[Block]:
    height = start
    while height <= top:
        page = await store.committed_range(height, min(top, height + READ_BLOCKS_PER_PAGE - 1))
        if not page:
            raise ReplayError(f"the replica's log has no block at height {height}")
        for block in page:
            yield block
        height = page[-1].height + 1


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
    spec: ClusterSpec, index: int, block: Block, ledger_head: bytes, engine: Engine
) -> None:
    node_dir = spec.node_dir(index)
    state_name = f"{CHECKPOINT_FILE}.state"
    tmp_state = node_dir / f"{state_name}.tmp"
    tmp_state.write_bytes(engine.state_bytes())
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


# ------------------------------------------------------------------ replay


ProgressFn = Callable[[int, int, float], None]


async def replay(
    spec: ClusterSpec,
    index: int,
    *,
    from_height: int = 1,
    resume: bool = True,
    progress: ProgressFn | None = None,
) -> ReplayReport:
    node_dir = spec.node_dir(index)
    key = SigningKey(read_seed(node_dir / RECEIPT_KEY_FILE))
    config = config_for_cluster(spec)
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
        top = await _replica_top(spec, index)
        if top is None:
            try:
                replica_store = await ReplicaStore.open(node_dir / "replica.db", spec.chain_id)
            except Exception as err:
                raise ReplayError(f"replica {index} neither answers nor opens: {err}") from err
            top = replica_store.committed_height
        report.top_height = top

        engine = Engine(config)
        prev = genesis_block(spec.chain_id)
        prev_hash, prev_view, prev_height = prev.hash, prev.view, prev.height
        ledger_head = ZERO_HASH
        loaded = _load_checkpoint(spec, index) if resume else None
        if loaded is not None:
            checkpoint, state = loaded
            if checkpoint.height <= top:
                engine = Engine.from_state_bytes(config, state)
                prev_hash = bytes.fromhex(checkpoint.block_hash)
                prev_view, prev_height = checkpoint.block_view, checkpoint.height
                ledger_head = bytes.fromhex(checkpoint.ledger_head)
                report.resumed_from = checkpoint.height
        start = prev_height + 1
        checker = CertificateChecker(spec.membership(), Verifier(VERIFIED_CACHE_MAX))
        blocks = (
            _blocks_from_store(replica_store, start, top)
            if replica_store is not None
            else _blocks_from_replica(spec, index, start, top)
        )
        last_checkpoint = prev_height
        async for block in blocks:
            # The certificate: this block extends the one before it, and its justify QC
            # is a valid quorum certificate for that block.
            if block.height != prev_height + 1 or block.parent_hash != prev_hash:
                raise ReplayError(f"the replica's log breaks at height {block.height}")
            if block.justify.view != prev_view or block.justify.height != prev_height:
                raise ReplayError(f"block {block.height}'s certificate names another parent")
            try:
                checker.check_qc(block.justify)
            except RemoteError as err:
                report.mismatches.append(
                    {"height": block.height, "what": "certificate", "detail": str(err)}
                )
                break
            report.certificates_checked += 1
            executed = execute_block(engine, key, index, spec.chain_id, block)
            report.heights_replayed += 1
            report.verdicts += len(executed.result.verdicts)
            if block.height <= store.executed_height:
                # Recorded before: compare (the ledger entries are computed here only).
                entries = LedgerEntry.chain(
                    spec.chain_id, block.height, executed.result.verdicts, ledger_head
                )
                ledger_head = entries[-1].hash if entries else ledger_head
                if block.height >= report.from_height:
                    report.heights_compared += 1
                    await _compare(store, spec.chain_id, executed, entries, report)
            else:
                try:
                    await store.record(executed)
                except DivergenceError as err:
                    report.mismatches.append(
                        {"height": block.height, "what": "artifact", "detail": str(err)}
                    )
                    break
                report.heights_recorded += 1
                report.artifacts_written += len(executed.result.artifacts)
                ledger_head = store.ledger_head
            prev_hash, prev_view, prev_height = block.hash, block.view, block.height
            if block.height - last_checkpoint >= CHECKPOINT_HEIGHTS:
                _write_checkpoint(spec, index, block, ledger_head, engine)
                last_checkpoint = block.height
            if progress is not None:
                progress(block.height, top, time.perf_counter() - started)
        if prev_height == top and not report.mismatches:
            _clear_checkpoint(spec, index)
    finally:
        await store.close()
        if replica_store is not None:
            await replica_store.close()
    report.seconds = time.perf_counter() - started
    return report
