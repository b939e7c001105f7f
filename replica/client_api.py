"""The client API every replica serves (`proto/client.proto`, service `Replica`).

`Submit` / `SubmitStream` take signed transactions in: each signature is checked once
(the mempool's precheck), the sidecar is asked once per batch whether the engine would
refuse any early, and the mempool takes the rest, which are gossiped to the other
replicas. `Status` reports where the replica is, `CommittedBlocks` streams the committed
chain, and `ReportStateRoots` is how this replica's own sidecar reports its state roots.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.tx import ParsedTx
from quorumgate.replica.mempool import Admission, Mempool, RecordTx
from quorumgate.replica.metrics import ReplicaMetrics
from quorumgate.replica.peers import PeerNetwork
from quorumgate.replica.pruning import PrunedError
from quorumgate.replica.sidecar_link import SidecarLink
from quorumgate.replica.storage import ReplicaStore
from quorumgate.replica.wire import SUBMIT_BATCH_TXS_MAX, block_to_pb, encode_epoch_end
from quorumgate.runtime.readauth import (
    METHOD_COMMITTED_BLOCKS,
    METHOD_EPOCH_ENDS,
    require_reader,
    role_of,
)
from quorumgate.runtime.readwaits import READ_WAITS_PER_KEY_MAX, CallerKind, WaitSlots
from quorumgate.runtime.tracing import Tracer, tx_prefix

STREAM_BLOCKS_PER_READ = 128
SUBMIT_INBOX_BATCHES_MAX = 64

# Refusals the sidecar's admission check may give early, and their status codes; anything
# else it says goes on to the mempool and to execution, which decides.
SIDECAR_REFUSALS = {
    "unknown_signer": grpc.StatusCode.PERMISSION_DENIED,
    "unknown_tool": grpc.StatusCode.NOT_FOUND,
    "not_owner": grpc.StatusCode.PERMISSION_DENIED,
    "not_an_agent": grpc.StatusCode.PERMISSION_DENIED,
    "malformed": grpc.StatusCode.INVALID_ARGUMENT,
    "bad_signature": grpc.StatusCode.INVALID_ARGUMENT,
    "wrong_chain": grpc.StatusCode.FAILED_PRECONDITION,
    "replayed": grpc.StatusCode.ALREADY_EXISTS,
    # a raw secret never enters a block (docs/security/threat-model.md): the sidecar refuses
    # it before ordering
    "secret_in_plaintext": grpc.StatusCode.INVALID_ARGUMENT,
    "envelope_required": grpc.StatusCode.INVALID_ARGUMENT,
}
SIDECAR_REFUSALS_WHILE_BEHIND = frozenset({"unknown_signer", "unknown_tool"})
# How long such a refusal waits for the sidecar to execute the committed log (it takes a
# few milliseconds) before the transactions are let through to be judged at execution.
ADMISSION_CATCH_UP_WAIT_S = 0.5
SIDECAR_REFUSAL_DETAIL = "refused before ordering by the execution sidecar's admission check"


def sidecar_refuses(accepted: bool, reason: str, behind: bool) -> bool:
    """Whether the sidecar's admission answer keeps a transaction (a client's or a
    peer's) out of the mempool: one of SIDECAR_REFUSALS, unless it is a refusal only a
    sidecar behind the committed log would give."""
    stale = behind and reason in SIDECAR_REFUSALS_WHILE_BEHIND
    return not accepted and reason in SIDECAR_REFUSALS and not stale


STATUS_CODES = {
    "OK": grpc.StatusCode.OK,
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,
    "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "RESOURCE_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class ClientApi(cpb_grpc.ReplicaServicer):  # type: ignore[misc]
    def __init__(
        self,
        *,
        spec: ClusterSpec,
        mempool: Mempool,
        store: ReplicaStore,
        sidecar: SidecarLink,
        peers: PeerNetwork,
        metrics: ReplicaMetrics,
        on_transactions: Callable[[], None],
        wait_committed: Callable[[int], Awaitable[None]],
        status: Callable[[], cpb.StatusReply],
        tracer: Tracer | None = None,
    ) -> None:
        self.spec = spec
        self.tracer = tracer or Tracer("client-api")
        self.mempool = mempool
        self.store = store
        self.sidecar = sidecar
        self.peers = peers
        self.metrics = metrics
        self._on_transactions = on_transactions
        self._wait_committed = wait_committed
        self._status = status
        self._submissions: Counter[tuple[str, str]] = Counter()  # counted once per batch
        # CommittedBlocks streams answer roles only, each key a bounded number at once
        self.waits = WaitSlots()
        metrics.read_waits.set_function(lambda: self.waits.held(CallerKind.ROLE))

    # ------------------------------------------------------------------ admission

    async def admit_batch(self, requests: list[cpb.SubmitRequest]) -> list[cpb.SubmitReply]:
        """Client transactions, in order: the signature checked once (mempool precheck),
        the sidecar asked once for the whole batch, then the mempool takes them in."""
        replies: list[cpb.SubmitReply | None] = [None] * len(requests)
        pending: list[tuple[int, ParsedTx]] = []
        records: list[bytes] = []
        for i, request in enumerate(requests):
            checked = self.mempool.precheck(request.tx)
            if isinstance(checked, Admission):
                replies[i] = self._reply(request, checked)
            elif isinstance(checked, RecordTx):
                # An owner-signed reconfiguration record: the consensus core's business,
                # which the sidecar's engine does not judge (docs/consensus/epochs.md).
                admission = self.mempool.admit_checked(request.tx, checked)
                if admission.accepted and admission.detail != "already pending":
                    records.append(request.tx)
                replies[i] = self._reply(request, admission)
            else:
                pending.append((i, checked))
        txs = [requests[i].tx for i, _ in pending]
        signers = [parsed.signer for _, parsed in pending]
        answers = await self.sidecar.admission(txs, signers)
        # A refusal that only a sidecar behind the committed log would give (an agent or
        # tool registered in a block it has not executed yet) is not taken as final: the
        # sidecar gets a moment to execute what is committed, then is asked again; if it
        # is still behind, the transactions go on to be ordered and judged at execution.
        committed = self.store.committed_height
        behind = self.sidecar.executed_height < committed
        if behind and any(
            not ok and reason in SIDECAR_REFUSALS_WHILE_BEHIND for ok, reason in answers
        ):
            if await self.sidecar.wait_executed(committed, ADMISSION_CATCH_UP_WAIT_S):
                answers = await self.sidecar.admission(txs, signers)
            behind = self.sidecar.executed_height < committed
        fresh: list[bytes] = records
        for (i, parsed), (accepted, reason) in zip(pending, answers, strict=True):
            request = requests[i]
            if sidecar_refuses(accepted, reason, behind):
                self.metrics.submissions.labels("refused", reason).inc()
                replies[i] = cpb.SubmitReply(
                    request_id=request.request_id,
                    accepted=False,
                    proposal_id=parsed.tx_id,
                    reason=reason,
                    detail=SIDECAR_REFUSAL_DETAIL,
                    code=SIDECAR_REFUSALS[reason].value[0],
                )
                continue
            admission = self.mempool.admit_checked(request.tx, parsed)
            if admission.accepted and admission.detail != "already pending":
                fresh.append(request.tx)
                if self.tracer.enabled:  # the admission path: nothing computed for a trace off
                    self.tracer.event("admitted", tx_prefix(parsed.tx_id))
            replies[i] = self._reply(request, admission)
        if fresh:
            self.peers.gossip(fresh)
            self._on_transactions()
        for (result, reason), count in self._submissions.items():
            self.metrics.submissions.labels(result, reason).inc(count)
        self._submissions.clear()
        assert all(r is not None for r in replies), "every request answered"
        return [r for r in replies if r is not None]

    def _reply(self, request: cpb.SubmitRequest, admission: Admission) -> cpb.SubmitReply:
        result = "accepted" if admission.accepted else "refused"
        self._submissions[(result, admission.reason or "ok")] += 1
        code = STATUS_CODES.get(admission.status, grpc.StatusCode.INVALID_ARGUMENT)
        return cpb.SubmitReply(
            request_id=request.request_id,
            accepted=admission.accepted,
            proposal_id=admission.tx_id or b"",
            reason="" if admission.accepted else admission.reason,
            detail=admission.detail,
            code=code.value[0],
        )

    # ------------------------------------------------------------------ the RPCs

    async def Submit(
        self, request: cpb.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> cpb.SubmitReply:
        (reply,) = await self.admit_batch([request])
        if not reply.accepted:
            code = next(c for c in grpc.StatusCode if c.value[0] == reply.code)
            await context.abort(
                code, f"{reply.reason}: {reply.detail}", (("qg-reason", reply.reason),)
            )
        return reply

    async def SubmitStream(
        self, request_iterator: AsyncIterator[cpb.SubmitBatch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cpb.SubmitBatchReply]:
        """Batches are read as they come; those that arrived while the previous ones were
        being admitted are admitted together (up to SUBMIT_BATCH_TXS_MAX requests, one
        sidecar call), and each is answered by its own reply batch, in order."""
        inbox: asyncio.Queue[cpb.SubmitBatch | None] = asyncio.Queue(SUBMIT_INBOX_BATCHES_MAX)

        async def read() -> None:
            try:
                async for batch in request_iterator:
                    await inbox.put(batch)
            finally:
                await inbox.put(None)

        reader = asyncio.create_task(read())
        try:
            held: list[cpb.SubmitBatch | None] = []  # taken from the inbox, not yet handled
            while True:
                first = held.pop() if held else await inbox.get()
                if first is None:
                    break
                if len(first.requests) > SUBMIT_BATCH_TXS_MAX:
                    # Every batch before it has been answered; this one and the rest are not.
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"a SubmitStream batch holds at most {SUBMIT_BATCH_TXS_MAX} "
                        f"requests; this one held {len(first.requests)}",
                    )
                batches = [first]
                total = len(first.requests)
                while total < SUBMIT_BATCH_TXS_MAX and not inbox.empty():
                    item = inbox.get_nowait()
                    if item is None or len(item.requests) > SUBMIT_BATCH_TXS_MAX:
                        held.append(item)  # handled after this merge is answered
                        break
                    batches.append(item)
                    total += len(item.requests)
                replies = await self.admit_batch([r for b in batches for r in b.requests])
                start = 0
                for batch in batches:
                    end = start + len(batch.requests)
                    yield cpb.SubmitBatchReply(replies=replies[start:end])
                    start = end
        finally:
            reader.cancel()

    async def Status(
        self, request: cpb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> cpb.StatusReply:
        return self._status()

    async def ReportStateRoots(
        self,
        request_iterator: AsyncIterator[spb.StateRootReport],
        context: grpc.aio.ServicerContext,
    ) -> pb.StreamAck:
        received = 0
        async for report in request_iterator:
            if not self.sidecar.on_state_root(
                report.height, report.state_root, report.signature, report.owner_key
            ):
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "state roots are taken from our sidecar only, each signed with its "
                    "receipt key of the height's epoch, for a height committed here",
                )
            received += 1
        return pb.StreamAck(received=received)

    async def _require_block_reader(self, context: grpc.aio.ServicerContext, method: str) -> bytes:
        """The key of a caller that may read committed blocks, or the call is aborted. A
        replica's consensus key reads as a member only in the epoch it signs for, and the
        owner is the key our sidecar's state holds after an owner rotation
        (docs/security/reads-and-certificates.md). A sidecar's receipt key reads as the
        cluster of our epoch has it: after a `replace`, the new machine's, not the old
        one's (docs/consensus/epochs.md, "Replacing a member")."""
        members = {self.peers.key_of(i) for i in range(self.spec.n)}
        key, _ = await require_reader(
            self.peers.spec,
            context,
            method,
            int(time.time() * 1000),
            consensus_keys=members,
            owner_key=self.sidecar.owner_key,
            receipt_keys=self.sidecar.readers,
        )
        return key

    def _still_reads(self, key: bytes) -> bool:
        """Whether `key` still reads committed blocks in the epoch we run now (a stream
        opened before a boundary by a key rotated out there ends at it)."""
        members = {self.peers.key_of(i) for i in range(self.spec.n)}
        role = role_of(
            self.peers.spec,
            key,
            consensus_keys=members,
            owner_key=self.sidecar.owner_key,
            receipt_keys=self.sidecar.readers,
        )
        return role is not None

    async def EpochEnds(
        self, request: cpb.EpochEndsRequest, context: grpc.aio.ServicerContext
    ) -> cpb.EpochEndsReply:
        """Every stored epoch end (a handful: one per epoch change). The change blocks
        carry committed transactions: the roles `CommittedBlocks` answers only."""
        await self._require_block_reader(context, METHOD_EPOCH_ENDS)
        return cpb.EpochEndsReply(
            ends=[
                cpb.StoredEpochEnd(
                    epoch=end.epoch,
                    keys=b"".join(end.keys),
                    ended=encode_epoch_end(end.boundary, end.suffix, end.qc),
                )
                for end in self.store.epoch_ends
            ]
        )

    async def CommittedBlocks(
        self, request: cpb.BlocksRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cpb.CommittedBlock]:
        """Every argument value of every call is in these blocks: they answer the owner,
        the members and auditors only (runtime/readauth.py), as the epoch we run has them:
        when the readers change (a boundary), the stream goes on only if its key still
        reads."""
        key = await self._require_block_reader(context, METHOD_COMMITTED_BLOCKS)
        followed = self.sidecar.epochs_followed
        with self.waits.hold(key, CallerKind.ROLE) as held:
            if not held:
                self.metrics.read_waits_refused.inc()
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"this key holds {READ_WAITS_PER_KEY_MAX} CommittedBlocks streams open, "
                    "as many as a replica allows (runtime/readwaits.py); close one and ask again",
                )
            store = self.store
            next_height = max(request.from_height, 1)
            while True:
                top = store.committed_height
                if next_height > top:
                    await self._wait_committed(next_height)
                    continue
                if self.sidecar.epochs_followed != followed:
                    followed = self.sidecar.epochs_followed
                    if not self._still_reads(key):
                        await context.abort(
                            grpc.StatusCode.PERMISSION_DENIED,
                            "this key reads no more committed blocks: the epoch we run "
                            "now gives it no role (docs/consensus/epochs.md)",
                        )
                end = min(top, next_height + STREAM_BLOCKS_PER_READ - 1)
                try:
                    blocks = await store.committed_range(next_height, end)
                except PrunedError as err:
                    # Pruned below a snapshot: said, never a crash (docs/pruning.md).
                    await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(err))
                for block in blocks:
                    out = cpb.CommittedBlock(height=block.height, hash=block.hash)
                    block_to_pb(block, out.block)
                    yield out
                    next_height = block.height + 1
