"""The benchmark's own processes: the clients that submit signed proposals, and the observer
that follows the commit and receipt streams and tells each client which of its proposals
completed, and when.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from typing import Any

import grpc

from quorumgate.bench.certifier import BlockCertifier, CertifierCounts
from quorumgate.bench.load import LoadLoop, LoadResult, LoadShape, drive, queued_batches, wait_start
from quorumgate.bench.stopping import BenchError
from quorumgate.ops.loadgen import LoadAgent
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto import tx_pb2
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.tx import tx_id
from quorumgate.replica.wire import SUBMIT_BATCH_TXS_MAX
from quorumgate.runtime.channels import aio_channel
from quorumgate.sdk.owner import owner_reader
from quorumgate.sidecar.receipts import ReceiptEpochs

RETRY_BACKOFF_S = 0.01
RETRYABLE_REFUSALS = frozenset({"mempool_full", "signer_full"})
EARLY_CERTS_MAX = 200_000  # certified before the commit stream showed them (observer)
COMMITS_PENDING_MAX = 1_000_000  # committed, waiting for a certificate (observer)
OBSERVER_SEND_BATCH_MAX = 4096


@dataclass(frozen=True, slots=True)
class ClientJob:
    client: int
    spec: ClusterSpec
    replica: int  # the member whose replica this client submits to
    chain_id: str
    shape: LoadShape
    agents: tuple[tuple[str, int], ...]  # (name, next nonce)
    presign: int


@dataclass(frozen=True, slots=True)
class ObserverJob:
    chain_id: str
    spec: ClusterSpec
    full: bool  # certificates too (False: ordering only)
    receipt_keys: tuple[bytes, ...]
    client_of_signer: dict[bytes, int]
    from_height: int
    # each epoch's heights and receipt keys, as `Client.epochs` checked them before the
    # run (None: a chain that runs no epochs, checked with the cluster file's keys)
    receipt_epochs: ReceiptEpochs | None = None


@dataclass
class ObserverResult:
    blocks: int = 0
    block_txs: int = 0
    bench_txs: int = 0
    certifier: CertifierCounts = field(default_factory=CertifierCounts)
    outcomes: dict[str, int] = field(default_factory=dict)
    error: str = ""


Completion = tuple[bytes, float, float]  # (tx id, commit time, done time)


# ---------------------------------------------------------------------------- client


# One coroutine on purpose: its callbacks (next proposal, send, the inbox reader, the reply
# reader) are closures over one client's state and its event loop; apart, they would pass
# all of it around.
async def _client(
    job: ClientJob,
    inbox: Connection,
    start_at: Synchronized,  # type: ignore[type-arg]
    ready: Callable[[], None],
) -> LoadResult:
    agents = [LoadAgent.from_seed(job.chain_id, name) for name, _ in job.agents]
    for agent, (_, nonce) in zip(agents, job.agents, strict=True):
        agent.next_nonce = nonce
    names = [name for name, _ in job.agents]
    submitted_next = {name: nonce for name, nonce in job.agents}
    presigned: list[tuple[bytes, bytes, int, int]] = []  # (tx, tx id, agent, nonce)
    for k in range(job.presign):
        a = k % len(agents)
        nonce = agents[a].next_nonce
        data, tid = agents[a].proposal()
        presigned.append((data, tid, a, nonce))
    presigned.reverse()  # pop() from the end, in order
    counter = 0

    def next_proposal() -> tuple[bytes, bytes, int, int]:
        nonlocal counter
        counter += 1
        if presigned:
            return presigned.pop()
        a = counter % len(agents)
        nonce = agents[a].next_nonce
        data, tid = agents[a].proposal()
        return data, tid, a, nonce

    queue: asyncio.Queue[cpb.SubmitRequest | None] = asyncio.Queue()
    pending: dict[int, tuple[bytes, bytes]] = {}  # request id -> (tx, tx id)
    request_ids = iter(range(1, 1 << 62))
    wake = asyncio.Event()
    ready()
    t_start = await wait_start(start_at)
    loop = LoadLoop(job.shape, t_start)
    aio = asyncio.get_running_loop()

    def submit(tx: bytes, tid: bytes) -> None:
        rid = next(request_ids)
        pending[rid] = (tx, tid)
        queue.put_nowait(cpb.SubmitRequest(tx=tx, request_id=rid))

    def send(start: float) -> None:
        data, tid, a, nonce = next_proposal()
        loop.sent(tid, start)
        submitted_next[names[a]] = max(submitted_next[names[a]], nonce + 1)
        submit(data, tid)

    def on_inbox() -> None:
        freed = False
        while inbox.poll():
            try:
                batch: list[Completion] = inbox.recv()
            except EOFError:
                aio.remove_reader(inbox.fileno())
                return
            for tid, t_commit, t_done in batch:
                freed |= loop.done(tid, t_commit, t_done)
        if freed:
            wake.set()

    aio.add_reader(inbox.fileno(), on_inbox)

    async with aio_channel(job.spec, job.replica) as channel:
        stub = cpb_grpc.ReplicaStub(channel)
        replies = stub.SubmitStream(
            cpb.SubmitBatch(requests=batch)
            async for batch in queued_batches(queue, SUBMIT_BATCH_TXS_MAX)
        )

        async def read_replies() -> None:
            async for reply_batch in replies:
                for reply in reply_batch.replies:
                    entry = pending.pop(reply.request_id, None)
                    if entry is None or reply.accepted:
                        continue
                    tx, tid = entry
                    if reply.reason in RETRYABLE_REFUSALS and time.monotonic() < loop.window_end:
                        loop.result.retries += 1
                        aio.call_later(RETRY_BACKOFF_S, submit, tx, tid)
                        continue
                    loop.failed(tid, reply.reason or "refused")
                    wake.set()

        reader = asyncio.create_task(read_replies())
        try:
            await drive(loop, send, wake)
        finally:
            aio.remove_reader(inbox.fileno())
            queue.put_nowait(None)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
    loop.result.next_nonces = submitted_next
    return loop.result


def client_process(
    job: ClientJob,
    inbox: Connection,
    start_at: Synchronized,  # type: ignore[type-arg]
    out: mp.Queue,  # type: ignore[type-arg]
) -> None:
    try:
        result = asyncio.run(
            _client(job, inbox, start_at, lambda: out.put(("ready", job.client, None)))
        )
        out.put(("result", job.client, result))
    except Exception as err:  # report, never hang the parent
        out.put(("result", job.client, LoadResult(error=f"{type(err).__name__}: {err}")))


# ---------------------------------------------------------------------------- observer


def _tx_owner(tx: bytes, client_of_signer: dict[bytes, int]) -> tuple[int, bytes] | None:
    """(client, tx id) of a bench transaction, None for anything else (owner txs)."""
    signed = tx_pb2.SignedTx.FromString(tx)
    client = client_of_signer.get(signed.signer)
    if client is None:
        return None
    nonce = tx_pb2.TxBody.FromString(signed.body).nonce
    return client, tx_id(signed.signer, nonce)


# One coroutine on purpose, as `_client`: both stream followers share the observer's maps
# (committed, certified early) and its per-client outgoing batches.
async def _observe(
    job: ObserverJob,
    outboxes: list[Connection],
    stop: Any,
    ready: Callable[[], None],
) -> ObserverResult:
    result = ObserverResult()
    full = job.full
    certifier = BlockCertifier(
        job.chain_id,
        job.receipt_keys,
        receipts_expire=job.spec.receipts_expire,
        epochs=job.receipt_epochs,
    )
    committed: dict[bytes, tuple[int, float]] = {}  # full mode: tx id -> (client, commit time)
    early: dict[bytes, tuple[float, str]] = {}  # certified before its commit was seen here
    outgoing: list[list[Completion]] = [[] for _ in outboxes]

    def flush() -> None:
        for c, items in enumerate(outgoing):
            if items:
                outboxes[c].send(items)
                outgoing[c] = []

    def complete(client: int, item: Completion) -> None:
        outgoing[client].append(item)
        if len(outgoing[client]) >= OBSERVER_SEND_BATCH_MAX:
            flush()

    async def follow_commits(channel: grpc.aio.Channel) -> None:
        stub = cpb_grpc.ReplicaStub(channel)
        stream = stub.CommittedBlocks(cpb.BlocksRequest(from_height=job.from_height))
        async for block in stream:
            now = time.monotonic()
            result.blocks += 1
            result.block_txs += len(block.block.payload)
            for tx in block.block.payload:
                owner = _tx_owner(tx, job.client_of_signer)
                if owner is None:
                    continue
                client, tid = owner
                result.bench_txs += 1
                if not full:
                    complete(client, (tid, now, now))
                elif tid in early:
                    t_cert, outcome = early.pop(tid)
                    result.outcomes[outcome] = result.outcomes.get(outcome, 0) + 1
                    complete(client, (tid, now, max(now, t_cert)))
                else:
                    committed[tid] = (client, now)
                    if len(committed) > COMMITS_PENDING_MAX:
                        committed.pop(next(iter(committed)))
            flush()

    async def follow_receipts(signer: int, channel: grpc.aio.Channel) -> None:
        stub = spb_grpc.SidecarStub(channel)
        stream = stub.Receipts(spb.ReceiptsRequest(from_height=job.from_height))
        async for batch in stream:
            for receipt in batch.receipts:
                leaves = certifier.add(signer, receipt)
                if leaves is None:
                    continue
                now = time.monotonic()
                for tid, outcome in leaves:
                    entry = committed.pop(tid, None)
                    if entry is None:
                        early[tid] = (now, outcome)
                        if len(early) > EARLY_CERTS_MAX:
                            early.pop(next(iter(early)))
                        continue
                    result.outcomes[outcome] = result.outcomes.get(outcome, 0) + 1
                    client, t_commit = entry
                    complete(client, (tid, t_commit, now))
            flush()

    spec = job.spec
    reader = owner_reader(spec)  # the bench runs as the cluster's owner
    channels = [aio_channel(spec, 0, reader=reader)]
    channels += (
        [aio_channel(spec, i, "sidecar", reader=reader) for i in range(spec.n)] if job.full else []
    )
    tasks = [asyncio.create_task(follow_commits(channels[0]))]
    tasks += [asyncio.create_task(follow_receipts(i, ch)) for i, ch in enumerate(channels[1:])]
    ready()
    try:
        while not stop.is_set():
            for task in tasks:
                if task.done() and task.exception() is not None:
                    raise BenchError(f"observer stream failed: {task.exception()!r}")
            await asyncio.sleep(0.05)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in channels:
            await ch.close()
    result.certifier = certifier.counts
    return result


def observer_process(
    job: ObserverJob,
    outboxes: list[Connection],
    stop: Any,
    out: mp.Queue,  # type: ignore[type-arg]
) -> None:
    try:
        result = asyncio.run(_observe(job, outboxes, stop, lambda: out.put(("ready", -1, None))))
        out.put(("observer", -1, result))
    except Exception as err:
        out.put(("observer", -1, ObserverResult(error=f"{type(err).__name__}: {err}")))
