"""The replica process: the consensus core inside its I/O shell.

    python -m quorumgate.replica.node --dir DIR --node I      (what `quorumgate up` starts)

One asyncio loop (uvloop when importable) runs:

- a gRPC server with the `Peer` service (inbound consensus streams) and the `Replica`
  client API (submit, status, committed blocks);
- one `PeerLink` per peer (outbound stream, bounded queue, reconnects);
- the core task: it drains pending events (peer messages, ticks, new transactions) in
  batches, feeds each to the core, makes the durable part of all resulting actions durable
  in one SQLite transaction (replica/storage.py), and only then sends — the contract of
  replica/actions.py, checked by `check_send_allowed` on every send;
- a ticker, catch-up answers, mempool gossip, and the Prometheus endpoint.

Log lines are `key=value` text and never carry transaction contents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from prometheus_client import start_http_server

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto import consensus_pb2_grpc as pb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import (
    CONSENSUS_KEY_FILE,
    ClusterFileError,
    ClusterSpec,
    read_seed,
)
from quorumgate.proto.reports import root_report_statement
from quorumgate.proto.tx import ParsedTx
from quorumgate.replica.actions import (
    Action,
    Commit,
    ScheduleTimeout,
    Send,
    StoreBlock,
    check_send_allowed,
)
from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core
from quorumgate.replica.crypto import Ed25519Signer, ed25519_verify
from quorumgate.replica.grpcutil import add_service
from quorumgate.replica.mempool import Admission, Mempool, MempoolLimits
from quorumgate.replica.metrics import ReplicaMetrics
from quorumgate.replica.process import process_main
from quorumgate.replica.storage import ReplicaStore
from quorumgate.replica.transport import CHANNEL_OPTIONS, PeerLink
from quorumgate.replica.types import Block, Envelope, RemoteError, SyncRequest, SyncResponse
from quorumgate.replica.wire import (
    SUBMIT_BATCH_TXS_MAX,
    block_to_pb,
    envelope_from_pb,
    envelope_to_pb,
)

INBOUND_EVENTS_MAX = 20_000
EVENTS_PER_BATCH_MAX = 512
GOSSIP_BATCH_TXS_MAX = 512
REGOSSIP_TICKS = 100
REGOSSIP_TXS_MAX = 256
STREAM_BLOCKS_PER_READ = 128
SHUTDOWN_GRACE_S = 1.0
DB_FILE = "replica.db"

log = logging.getLogger("quorumgate.replica")

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
}
SIDECAR_REFUSALS_WHILE_BEHIND = frozenset({"unknown_signer", "unknown_tool"})
SIDECAR_REFUSAL_DETAIL = "refused before ordering by the execution sidecar's admission check"

STATUS_CODES = {
    "OK": grpc.StatusCode.OK,
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,
    "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "RESOURCE_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@dataclass(frozen=True, slots=True)
class _Tick:
    pass


@dataclass(frozen=True, slots=True)
class _NewTransactions:
    pass


@dataclass(frozen=True, slots=True)
class _NewStateRoot:
    pass


Event = Envelope | _Tick | _NewTransactions | _NewStateRoot

STATE_ROOTS_KEPT = 4_096
MEMPOOL_REBUILD_TXS_MAX = 200_000
MEMPOOL_REBUILD_BLOCKS_PER_READ = 256
SUBMIT_INBOX_BATCHES_MAX = 64
ADMIT_RPC_TIMEOUT_S = 2.0


class SidecarRoots:
    """The core's ExecutionView: state roots this replica's own sidecar reported (signed
    with its receipt key), the most recent `STATE_ROOTS_KEPT` of them."""

    def __init__(self) -> None:
        self._roots: dict[int, bytes] = {}
        self._latest = (0, b"")

    def add(self, height: int, root: bytes) -> bool:
        if height in self._roots or height <= self._latest[0] - STATE_ROOTS_KEPT:
            return False
        self._roots[height] = root
        if height > self._latest[0]:
            self._latest = (height, root)
        if len(self._roots) > STATE_ROOTS_KEPT:
            del self._roots[min(self._roots)]
        return True

    def forget(self) -> None:
        """The sidecar restarted from scratch (a replay): its old reports no longer hold."""
        self._roots.clear()
        self._latest = (0, b"")

    def latest_root(self) -> tuple[int, bytes]:
        return self._latest

    def root_at(self, height: int) -> bytes | None:
        if height == 0:
            return b""
        return self._roots.get(height)


class ReplicaNode:
    def __init__(self, spec: ClusterSpec, index: int, signer: Ed25519Signer) -> None:
        self.spec = spec
        self.index = index
        self.signer = signer
        self.member = spec.member(index)
        self.membership = spec.membership()
        if self.membership.key(index) != signer.public_key:
            raise ClusterFileError(
                f"node {index}'s key file does not match its public key in the cluster file"
            )
        self.limits = Limits()
        self.metrics = ReplicaMetrics(index)
        self.mempool = Mempool(spec.chain_id, MempoolLimits())  # replaced in start()
        self.mempool_tx_bytes_max = MempoolLimits().tx_bytes_max
        self.store: ReplicaStore | None = None
        self.core: Core | None = None
        self.roots = SidecarRoots()
        self._sidecar_channel: grpc.aio.Channel | None = None
        self._sidecar: spb_grpc.SidecarStub | None = None
        self._roots_queued = False
        self._events: asyncio.Queue[Event] = asyncio.Queue(maxsize=INBOUND_EVENTS_MAX)
        self._tick_queued = False
        self._txs_queued = False
        self._links: dict[int, PeerLink] = {}
        self._inbound_peers: dict[int, int] = {}
        self._gossip: list[bytes] = []
        self._commit_cond = asyncio.Condition()
        self._stored_at: dict[bytes, float] = {}
        self._qc_seen = b""
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ticks = 0
        self._submissions: Counter[tuple[str, str]] = Counter()  # counted once per batch
        self._dropped_seen: dict[str, int] = {}
        self._refused_seen: dict[str, int] = {}
        self._timeouts_seen = 0
        self._sync_seen = 0
        self.sync_target = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        node_dir = self.spec.node_dir(self.index)
        self.store = await ReplicaStore.open(node_dir / DB_FILE, self.spec.chain_id)
        recovered = await self.store.load()
        self.mempool = await self._rebuilt_mempool(recovered.committed.height)
        self.core = Core(
            self.membership,
            self.index,
            self.signer,
            limits=self.limits,
            payload=self.mempool,
            execution=self.roots,
            recovered=recovered,
            now_ms=self._now_ms(),
        )
        server = grpc.aio.server(options=CHANNEL_OPTIONS)
        add_service(server, pb_grpc.add_PeerServicer_to_server, _PeerService(self))
        add_service(server, cpb_grpc.add_ReplicaServicer_to_server, _ClientService(self))
        address = self.member.replica_address
        try:
            server.add_insecure_port(address)
        except RuntimeError as err:
            raise OSError(f"cannot listen on {address} (port in use?)") from err
        await server.start()
        self._server = server
        self._sidecar_channel = grpc.aio.insecure_channel(
            self.member.sidecar_address, options=CHANNEL_OPTIONS
        )
        self._sidecar = spb_grpc.SidecarStub(self._sidecar_channel)
        start_http_server(self.member.metrics_port, self.member.host, self.metrics.registry)
        for m in self.spec.members:
            if m.index != self.index:
                link = PeerLink(m.index, m.replica_address, self.metrics.send_queue_drops.inc)
                link.start()
                self._links[m.index] = link
        await self._execute(self.core.start())
        self._tasks = [
            asyncio.create_task(self._core_loop(), name="core"),
            asyncio.create_task(self._ticker(), name="ticker"),
        ]
        self._update_gauges()
        log.info(
            "event=started node=%d address=%s height=%d view=%d",
            self.index,
            address,
            self.store.committed_height,
            self.core.view,
        )

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
        while end >= 1 and txs < MEMPOOL_REBUILD_TXS_MAX:
            start = max(1, end - MEMPOOL_REBUILD_BLOCKS_PER_READ + 1)
            page = await store.committed_range(start, end)
            blocks[:0] = page
            txs += sum(len(b.payload) for b in page)
            end = start - 1
        mempool = Mempool(self.spec.chain_id, MempoolLimits(), complete_history=end < 1)
        mempool.on_commit(blocks)
        return mempool

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for link in self._links.values():
            await link.stop()
        if self._server is not None:
            await self._server.stop(SHUTDOWN_GRACE_S)
        if self._sidecar_channel is not None:
            await self._sidecar_channel.close()
        if self.store is not None:
            await self.store.close()
        log.info("event=stopped node=%d", self.index)

    @staticmethod
    def _now_ms() -> int:
        return int(time.time() * 1000)

    # ------------------------------------------------------------------ events in

    def enqueue(self, event: Event) -> bool:
        try:
            self._events.put_nowait(event)
        except asyncio.QueueFull:
            self.metrics.dropped.labels("inbound_full").inc()
            return False
        return True

    def _transactions_arrived(self) -> None:
        if not self._txs_queued and self.enqueue(_NewTransactions()):
            self._txs_queued = True

    async def _ticker(self) -> None:
        tick_s = self.spec.tick_ms / 1000
        while True:
            await asyncio.sleep(tick_s)
            if not self._tick_queued and self.enqueue(_Tick()):
                self._tick_queued = True

    async def _core_loop(self) -> None:
        core = self.core
        assert core is not None
        while True:
            batch = [await self._events.get()]
            while len(batch) < EVENTS_PER_BATCH_MAX and not self._events.empty():
                batch.append(self._events.get_nowait())
            actions: list[Action] = []
            ticked = False
            for event in batch:
                if isinstance(event, _Tick):
                    ticked = True
                    self._tick_queued = False
                    self._ticks += 1
                    actions += core.on_tick(self._now_ms())
                    if self._ticks % REGOSSIP_TICKS == 0:
                        self._regossip()
                elif isinstance(event, _NewTransactions):
                    self._txs_queued = False
                    actions += core.on_transactions()
                elif isinstance(event, _NewStateRoot):
                    self._roots_queued = False
                    actions += core.on_state_root()
                else:
                    actions += core.on_message(event)
            await self._execute(actions)
            self._flush_gossip()
            if ticked:  # gauges lag by at most one tick; a busy loop turns far more often
                self._update_gauges()

    # ------------------------------------------------------------------ actions out

    async def _execute(self, actions: list[Action]) -> None:
        store = self.store
        assert store is not None
        if any(not isinstance(a, Send | ScheduleTimeout) for a in actions):
            started = time.perf_counter()
            await store.apply(actions)
            self.metrics.store_apply_latency.observe(time.perf_counter() - started)
        now = time.perf_counter()
        committed = False
        for action in actions:
            if isinstance(action, Send):
                check_send_allowed(action, store.durable_epoch)
                self._send(action)
            elif isinstance(action, StoreBlock):
                if len(self._stored_at) < self.limits.pending_blocks_max:
                    self._stored_at[action.block.hash] = now
            elif isinstance(action, Commit):
                committed = True  # (the core has told the mempool already)
                self.metrics.blocks_committed.inc(len(action.blocks))
                txs = sum(len(b.payload) for b in action.blocks)
                self.metrics.txs_committed.inc(txs)
                for block in action.blocks:
                    started = self._stored_at.pop(block.hash, -1.0)
                    if started >= 0:
                        self.metrics.commit_latency.observe(now - started)
                if action.blocks[-1].height % 1000 == 0:
                    log.info("event=committed height=%d", action.blocks[-1].height)
            elif isinstance(action, ScheduleTimeout):
                self.metrics.view.set(action.view)
                self.metrics.leader.set(action.leader)
        core = self.core
        assert core is not None
        if core.high_qc.block_hash != self._qc_seen:
            self._qc_seen = core.high_qc.block_hash
            qc_started = self._stored_at.get(self._qc_seen)
            if qc_started is not None:
                self.metrics.qc_latency.observe(now - qc_started)
        if committed:
            for block_hash in [h for h in self._stored_at if h not in core.tree]:
                del self._stored_at[block_hash]
            async with self._commit_cond:
                self._commit_cond.notify_all()

    def _send(self, send: Send) -> None:
        message = envelope_to_pb(Envelope(self.spec.chain_id, self.index, send.message))
        if send.to is None:
            for link in self._links.values():
                link.send(message)
        elif send.to in self._links:
            link = self._links[send.to]
            link.send(message)
            if isinstance(send.message, SyncRequest):
                self.metrics.sync_requests.inc()

    # ------------------------------------------------------------------ peer messages

    def on_peer_message(self, message: pb.ConsensusMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "tx_batch":
            if message.chain_id != self.spec.chain_id:
                self.metrics.dropped.labels("wrong_chain").inc()
                return
            fresh = False
            for tx in message.tx_batch.txs[:GOSSIP_BATCH_TXS_MAX]:
                admission = self.mempool.admit(tx)
                fresh = fresh or admission.accepted
            if fresh:
                self._transactions_arrived()
            return
        try:
            envelope = envelope_from_pb(message)
        except RemoteError as err:
            self.metrics.dropped.labels(err.reason).inc()
            return
        if isinstance(envelope.message, SyncRequest):
            task = asyncio.create_task(self._answer_sync(envelope))
            task.add_done_callback(_log_task_error)
            return
        if isinstance(envelope.message, SyncResponse):
            self.sync_target = max(self.sync_target, envelope.message.committed_height)
        self.enqueue(envelope)

    async def _answer_sync(self, envelope: Envelope) -> None:
        store, core = self.store, self.core
        assert store is not None and core is not None
        request = envelope.message
        assert isinstance(request, SyncRequest)
        if not self.membership.is_member(envelope.sender) or envelope.sender == self.index:
            self.metrics.dropped.labels("non_member").inc()
            return
        if envelope.chain_id != self.spec.chain_id:
            self.metrics.dropped.labels("wrong_chain").inc()
            return
        response = await store.sync_response(request, core, self.limits)
        self._send(Send(envelope.sender, response))

    # ------------------------------------------------------------------ the sidecar

    def on_state_root(self, height: int, root: bytes, signature: bytes) -> bool:
        """A report from our sidecar; False (and nothing kept) if not signed by its key."""
        message = root_report_statement(self.spec.chain_id, height, root)
        if not ed25519_verify(self.member.receipt_public_key, message, signature):
            self.metrics.dropped.labels("bad_root_report").inc()
            return False
        if height < self.roots.latest_root()[0] - STATE_ROOTS_KEPT // 2:
            self.roots.forget()  # our sidecar started over (replay): heights went back
        if self.roots.add(height, root) and not self._roots_queued:
            self._roots_queued = self.enqueue(_NewStateRoot())
        return True

    async def sidecar_admission(self, txs: list[bytes]) -> list[tuple[bool, str]]:
        """Ask our sidecar, in one call, whether the engine would refuse each of `txs`
        early (unknown agent or tool, replay...); their signatures were verified here. The
        verdict at execution stays the authority, so when the sidecar cannot answer the
        transactions go on to the mempool and to execution."""
        stub = self._sidecar
        if stub is None or not txs:
            return [(True, "")] * len(txs)
        request = spb.AdmitBatchRequest(txs=txs, signatures_verified=True)
        try:
            reply = await stub.AdmitBatch(request, timeout=ADMIT_RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError:
            self.metrics.submissions.labels("unchecked", "sidecar_unavailable").inc(len(txs))
            return [(True, "")] * len(txs)
        if len(reply.replies) != len(txs):
            return [(True, "")] * len(txs)
        return [(r.accepted, r.reason) for r in reply.replies]

    async def admit_batch(self, requests: list[cpb.SubmitRequest]) -> list[cpb.SubmitReply]:
        """Client transactions, in order: the signature checked once (mempool precheck),
        the sidecar asked once for the whole batch, then the mempool takes them in."""
        replies: list[cpb.SubmitReply | None] = [None] * len(requests)
        pending: list[tuple[int, ParsedTx]] = []
        for i, request in enumerate(requests):
            checked = self.mempool.precheck(request.tx)
            if isinstance(checked, Admission):
                replies[i] = self._reply(request, checked)
            else:
                pending.append((i, checked))
        answers = await self.sidecar_admission([requests[i].tx for i, _ in pending])
        store = self.store
        assert store is not None
        # A refusal that only a sidecar behind the committed log would give (an agent or
        # tool registered in a block it has not executed yet) is not taken as final.
        behind = self.roots.latest_root()[0] < store.committed_height
        fresh = False
        for (i, parsed), (accepted, reason) in zip(pending, answers, strict=True):
            request = requests[i]
            stale = behind and reason in SIDECAR_REFUSALS_WHILE_BEHIND
            if not accepted and reason in SIDECAR_REFUSALS and not stale:
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
                self.gossip(request.tx)
                fresh = True
            replies[i] = self._reply(request, admission)
        if fresh:
            self._transactions_arrived()
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

    # ------------------------------------------------------------------ gossip

    def gossip(self, tx: bytes) -> None:
        self._gossip.append(tx)
        if len(self._gossip) >= GOSSIP_BATCH_TXS_MAX:
            self._flush_gossip()

    def _flush_gossip(self) -> None:
        if not self._gossip:
            return
        batch, self._gossip = self._gossip, []
        for start in range(0, len(batch), GOSSIP_BATCH_TXS_MAX):
            msg = pb.ConsensusMessage(chain_id=self.spec.chain_id, sender=self.index)
            msg.tx_batch.txs.extend(batch[start : start + GOSSIP_BATCH_TXS_MAX])
            for link in self._links.values():
                link.send(msg)

    def _regossip(self) -> None:
        """Pass on again what is still pending, in case a peer missed it (lost messages,
        a restart): each replica's mempool must hold what the next leader may propose."""
        for tx in self.mempool.recent(REGOSSIP_TXS_MAX):
            self._gossip.append(tx)

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
        m.leader.set(core.leader)
        m.mempool_txs.set(self.mempool.size)
        m.mempool_bytes.set(self.mempool.bytes)
        m.peers_connected.set(sum(1 for c in self._inbound_peers.values() if c > 0))
        m.sync_target.set(self.sync_target)
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
        if core.stats.timeouts_sent > self._timeouts_seen:
            m.timeouts.inc(core.stats.timeouts_sent - self._timeouts_seen)
            self._timeouts_seen = core.stats.timeouts_sent

    def status(self) -> cpb.StatusReply:
        core, store = self.core, self.store
        assert core is not None and store is not None
        connected = sorted(p for p, c in self._inbound_peers.items() if c > 0)
        return cpb.StatusReply(
            chain_id=self.spec.chain_id,
            node=self.index,
            committed_height=store.committed_height,
            committed_hash=core.tree.root.hash,
            view=core.view,
            leader=core.leader,
            peers_connected=connected,
            mempool_txs=self.mempool.size,
            mempool_bytes=self.mempool.bytes,
            members=self.spec.n,
            f=self.spec.f,
            sync_target_height=self.sync_target,
        )


def _log_task_error(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("event=task_failed task=%s error=%r", task.get_name(), task.exception())


# ============================================================================ services


class _PeerService(pb_grpc.PeerServicer):  # type: ignore[misc]
    def __init__(self, node: ReplicaNode) -> None:
        self.node = node

    async def Stream(
        self,
        request_iterator: AsyncIterator[pb.ConsensusMessage],
        context: grpc.aio.ServicerContext,
    ) -> pb.StreamAck:
        node = self.node
        received = 0
        sender: int | None = None
        try:
            async for message in request_iterator:
                if sender is None and node.membership.is_member(message.sender):
                    sender = message.sender
                    node._inbound_peers[sender] = node._inbound_peers.get(sender, 0) + 1
                received += 1
                node.on_peer_message(message)
        finally:
            if sender is not None:
                node._inbound_peers[sender] -= 1
        return pb.StreamAck(received=received)


class _ClientService(cpb_grpc.ReplicaServicer):  # type: ignore[misc]
    def __init__(self, node: ReplicaNode) -> None:
        self.node = node

    async def Submit(
        self, request: cpb.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> cpb.SubmitReply:
        (reply,) = await self.node.admit_batch([request])
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
                replies = await self.node.admit_batch([r for b in batches for r in b.requests])
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
        return self.node.status()

    async def ReportStateRoots(
        self,
        request_iterator: AsyncIterator[spb.StateRootReport],
        context: grpc.aio.ServicerContext,
    ) -> pb.StreamAck:
        received = 0
        async for report in request_iterator:
            if not self.node.on_state_root(report.height, report.state_root, report.signature):
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED, "state roots are taken from our sidecar only"
                )
            received += 1
        return pb.StreamAck(received=received)

    async def CommittedBlocks(
        self, request: cpb.BlocksRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cpb.CommittedBlock]:
        node = self.node
        store = node.store
        assert store is not None
        next_height = max(request.from_height, 1)
        while True:
            top = store.committed_height
            if next_height > top:
                await node.wait_committed(next_height)
                continue
            end = min(top, next_height + STREAM_BLOCKS_PER_READ - 1)
            for block in await store.committed_range(next_height, end):
                out = cpb.CommittedBlock(height=block.height, hash=block.hash)
                block_to_pb(block, out.block)
                yield out
                next_height = block.height + 1


# ============================================================================ process


async def make_replica(spec: ClusterSpec, index: int) -> ReplicaNode:
    seed = read_seed(spec.node_dir(index) / CONSENSUS_KEY_FILE)
    return ReplicaNode(spec, index, Ed25519Signer(seed))


def main(argv: list[str] | None = None) -> int:
    return process_main(
        argv, kind="replica", description="Run one QuorumGate replica.", make=make_replica
    )


if __name__ == "__main__":
    sys.exit(main())
