"""What a drill reads from the cluster to judge it: committed blocks through
`CommittedBlocks` (each decoded and its hash recomputed), stopped members' stores (a
sidecar's state root, ledger and artifacts; a replica's signed-vote audit), certificates
through the client SDK, and the height a process logged when it started.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from nacl.signing import SigningKey

from quorumgate.ops.drills.bounds import (
    CERTIFICATE_CONCURRENCY,
    CERTIFICATE_DEADLINE_S,
    POLL_S,
    SIDECAR_DB_FILE,
    STREAM_RETRIES_MAX,
    STREAM_TIMEOUT_S,
)
from quorumgate.ops.drills.report import Abort, short
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterSpec, read_seed
from quorumgate.replica.storage import ReplicaStore
from quorumgate.replica.types import Block
from quorumgate.replica.wire import decode_block
from quorumgate.runtime.channels import sync_channel
from quorumgate.sdk.client import Client, QuorumGateError
from quorumgate.sdk.owner import owner_reader
from quorumgate.sidecar.ledger import GENESIS_PREV_HASH
from quorumgate.sidecar.receipts import Certificate
from quorumgate.sidecar.store import LEDGER_PAGE_ROWS_MAX, SidecarStore, SidecarStoreError

_STARTED_RE = re.compile(r"event=started .*?\b(?:height|executed_height)=(\d+)")


def started_height(spec: ClusterSpec, index: int, kind: str) -> int | None:
    """The height the `kind` process of member `index` logged at its last start."""
    try:
        text = (spec.node_dir(index) / f"{kind}.log").read_text(errors="replace")
    except OSError:
        return None
    found = _STARTED_RE.findall(text)
    return int(found[-1]) if found else None


def committed_blocks(spec: ClusterSpec, index: int, start: int, end: int) -> list[Block]:
    """Member `index`'s committed blocks start..end through `CommittedBlocks`, each decoded
    (its hash recomputed and compared with the one sent); `Abort` after STREAM_RETRIES_MAX
    broken streams."""
    out: list[Block] = []
    failures = 0
    with sync_channel(spec, index, reader=owner_reader(spec)) as channel:
        stub = cpb_grpc.ReplicaStub(channel)
        while start + len(out) <= end:
            call = stub.CommittedBlocks(
                cpb.BlocksRequest(from_height=start + len(out)), timeout=STREAM_TIMEOUT_S
            )
            try:
                for reply in call:
                    expected = start + len(out)
                    block = decode_block(spec.chain_id, reply.block.SerializeToString())
                    if reply.height != expected or block.height != expected:
                        raise Abort(f"replica {index} sent height {reply.height} for {expected}")
                    if block.hash != reply.hash:
                        raise Abort(
                            f"replica {index}: the block at height {expected} hashes to "
                            f"{short(block.hash)}, sent as {short(reply.hash)}"
                        )
                    out.append(block)
                    if block.height >= end:
                        break
            except grpc.RpcError as err:
                failures += 1
                if failures >= STREAM_RETRIES_MAX:
                    raise Abort(
                        f"replica {index}: CommittedBlocks from height {start + len(out)} "
                        f"failed {failures} times ({err.code().name})"
                    ) from None
                time.sleep(POLL_S)  # a pause before asking again, not a wait for a state
            finally:
                call.cancel()
    return out


@dataclass(frozen=True)
class SidecarView:
    """What one sidecar's store holds up to `height`."""

    node: int
    height: int
    executed_height: int
    state_root: bytes | None
    ledger_head: bytes
    ledger_entries: int
    verdicts_by_tx: dict[bytes, int]
    artifacts: dict[tuple[int, str], bytes]  # (height, canonical target) -> sha256 of bytes
    ledger_problem: str
    # The first height the store holds: 1, or after the checkpoint of a store installed
    # from a snapshot (docs/snapshots.md), whose ledger head and count it starts from.
    history_from: int = 1


async def read_sidecar(spec: ClusterSpec, index: int, height: int | None = None) -> SidecarView:
    """Read sidecar `index`'s store (read-only) up to `height` (its executed height if
    None): state root, ledger head and verdicts, artifacts, and its ledger's verification."""
    path = spec.node_dir(index) / SIDECAR_DB_FILE
    try:
        store = await SidecarStore.open(path, spec.chain_id, create=False, read_only=True)
    except SidecarStoreError:
        # A read-only open needs the WAL index file, which a stopped store may lack.
        store = await SidecarStore.open(path, spec.chain_id, create=False)
    try:
        top = store.executed_height if height is None else height
        root = await store.root_at(top)
        head, entries = GENESIS_PREV_HASH, 0
        base = store.checkpoint
        if base is not None and base.height <= top:
            head, entries = base.ledger_head, base.ledger_entries
            root = base.state_root if base.height == top else root
        verdicts: Counter[bytes] = Counter()
        from_height, from_index = 1, 0
        while True:
            page = await store.ledger(from_height, LEDGER_PAGE_ROWS_MAX, from_index)
            kept = [e for e in page if e.height <= top]
            for entry in kept:
                head = entry.hash
                entries += 1
                verdicts[entry.tx_id] += 1
            if len(kept) < len(page) or len(page) < LEDGER_PAGE_ROWS_MAX:
                break
            from_height, from_index = page[-1].height, page[-1].index + 1
        artifacts: dict[tuple[int, str], bytes] = {}
        offset = 0
        while True:
            rows = await store.artifacts(LEDGER_PAGE_ROWS_MAX, offset)
            for h, target, data in rows:
                if h <= top:
                    artifacts[(h, target)] = hashlib.sha256(data).digest()
            if len(rows) < LEDGER_PAGE_ROWS_MAX:
                break
            offset += len(rows)
        problem = await store.verify_ledger()
        return SidecarView(
            node=index,
            height=top,
            executed_height=store.executed_height,
            state_root=root,
            ledger_head=head,
            ledger_entries=entries,
            verdicts_by_tx=dict(verdicts),
            artifacts=artifacts,
            ledger_problem="" if problem is None else str(problem),
            history_from=store.history_from,
        )
    finally:
        await store.close()


@dataclass(frozen=True)
class ReplicaAudit:
    """What a stopped replica's store says about its own signatures."""

    committed_height: int
    last_voted_view: int
    last_proposed_view: int
    signed_votes: dict[int, bytes]  # epoch 0: view -> block hash
    signed_timeouts: dict[int, int]
    votes: dict[tuple[int, int], bytes]  # every epoch: (epoch, view) -> block hash


async def read_replica(spec: ClusterSpec, index: int) -> ReplicaAudit:
    """Audit replica `index`'s store; the replica must be stopped (it holds the file with
    locking_mode=EXCLUSIVE while it runs)."""
    store = await ReplicaStore.open(spec.node_dir(index) / "replica.db", spec.chain_id)
    try:
        safety = (await store.load()).safety
        return ReplicaAudit(
            store.committed_height,
            safety.last_voted_view,
            safety.last_proposed_view,
            await store.signed_votes(),
            await store.signed_timeouts(),
            await store.votes_of_every_epoch(),
        )
    finally:
        await store.close()


async def certify(
    spec: ClusterSpec,
    proposal_ids: Sequence[bytes],
    kept: dict[bytes, Certificate] | None = None,
) -> dict[bytes, tuple[int, str, str] | str]:
    """Through the client SDK: proposal id -> (height, outcome, reason) of its verified
    certificate, or the error that kept it from one. With `kept`, each certificate goes
    into it too, for a drill that checks them again offline (grow.py)."""
    # the drill is the operator: it reads every verdict as the owner
    owner_key = SigningKey(read_seed(spec.directory / OWNER_KEY_FILE))
    client = Client(spec, owner_key, certificate_deadline_s=CERTIFICATE_DEADLINE_S)
    gate = asyncio.Semaphore(CERTIFICATE_CONCURRENCY)

    async def one(pid: bytes) -> tuple[bytes, tuple[int, str, str] | str]:
        async with gate:
            try:
                decision = await client.await_certificate(pid)
            except QuorumGateError as err:
                return pid, f"{type(err).__name__}({err.reason})"
        if decision.proposal_id != pid or decision.tx_id != pid:
            return pid, f"a certificate for {short(decision.tx_id)}"
        if kept is not None:
            kept[pid] = decision.certificate
        return pid, (decision.height, decision.outcome.value, decision.reason)

    try:
        return dict(await asyncio.gather(*(one(p) for p in proposal_ids)))
    finally:
        await client.close()
