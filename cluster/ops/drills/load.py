"""A drill's load: an open loop of signed ~256-byte proposals from registered agents,
flowing into the replicas from background threads, recording the id of every proposal a
replica acknowledges. One proposal in `DENY_EVERY` names an `http://` target, which the
tool refuses, so the sidecars also write rejection artifacts (docs/drills.md).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc

from quorumgate.ops.drills.bounds import STOP_GRACE_S, STREAM_TIMEOUT_S
from quorumgate.ops.drills.report import short
from quorumgate.ops.live import LiveCluster
from quorumgate.ops.loadgen import BENCH_TOOL, TX_BYTES_TARGET, LoadAgent
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.limits import QUOTA_PROPOSALS_MAX_DEFAULT, QUOTA_WINDOW_MS_DEFAULT
from quorumgate.proto.model import Argument
from quorumgate.proto.model import Proposal as CallProposal
from quorumgate.proto.tx import build, tx_id
from quorumgate.replica.wire import SUBMIT_BATCH_TXS_MAX
from quorumgate.runtime.channels import sync_channel

# The load: batches of BATCH_TXS, paced per sender thread.
RATE_PER_S_DEFAULT = {4: 50.0, 7: 30.0}
RATE_PER_S_OTHER = 30.0
BATCH_TXS = 10
SENDER_THREADS = 2
DENY_EVERY = 10
# The engine's quota (docs/engine.md) allows QUOTA_PROPOSALS_MAX_DEFAULT proposals per agent
# per window of block time; a drill keeps each agent at three quarters of that, so that no
# verdict of a drill is a quota denial.
AGENT_RATE_PER_S_MAX = 0.75 * QUOTA_PROPOSALS_MAX_DEFAULT / (QUOTA_WINDOW_MS_DEFAULT / 1000)
AGENTS_MIN = 8
DELIVERY_BACKOFF_S_MIN = 0.05
DELIVERY_BACKOFF_S_MAX = 0.5
NODE_DOWN_HOLD_S = 0.3  # a member that failed a delivery is skipped this long
REOFFER_BATCH_MAX = 512

ALLOWED_TARGET = "https://bench.example/items/{label}"
DENIED_TARGET = "http://bench.example/items/{label}"  # the tool allows https only
# Back-pressure: the same bytes again after a pause.
RETRYABLE_REFUSALS = ("mempool_full", "signer_full")
# Refusals by the answering replica's own sidecar, which may be behind (being rebuilt)
# while the rest of the cluster knows the agent: counted, and offered to another member.
LOCAL_VIEW_REFUSALS = ("unknown_signer", "unknown_tool", "not_an_agent")
TRANSPORT_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
)


@dataclass(frozen=True)
class Ack:
    tx: bytes
    node: int
    denied: bool  # its target is one the tool refuses
    at: float  # time.monotonic() of the acknowledgment


class DrillLoad:
    """Signed proposals from registered agents, in batches of BATCH_TXS paced to
    `rate_per_s` over SENDER_THREADS threads, each batch streamed (`SubmitStream`) to the
    next member not known to be down. A batch cut off by a failing member goes again,
    unanswered proposals only and the same bytes, to another member; back-pressure is
    retried after a pause. The ids of acknowledged proposals are recorded."""

    def __init__(self, cluster: LiveCluster, agents: list[LoadAgent], rate_per_s: float) -> None:
        self.spec = cluster.spec
        self.agents = agents
        self.rate_per_s = rate_per_s
        self.acked: dict[bytes, Ack] = {}
        self.refused: Counter[str] = Counter()  # valid proposals finally refused
        self.redirected: Counter[str] = Counter()  # LOCAL_VIEW_REFUSALS, offered elsewhere
        self.failures: list[str] = []
        self._sequence = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._down_until: dict[int, float] = {}
        self._cursor = 0
        self._channels: dict[int, grpc.Channel] = {}

    def start(self) -> DrillLoad:
        for k in range(SENDER_THREADS):
            thread = threading.Thread(target=self._run, args=(k,), name=f"drill-load-{k}")
            thread.daemon = True
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + STOP_GRACE_S + STREAM_TIMEOUT_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            self.failures.append("load threads did not stop")
        self._threads = []

    def close(self) -> None:
        self.stop()
        with self._lock:
            channels, self._channels = self._channels, {}
        for channel in channels.values():
            channel.close()

    @property
    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def snapshot(self) -> dict[bytes, Ack]:
        with self._lock:
            return dict(self.acked)

    def _run(self, k: int) -> None:
        try:
            self._send_paced(self.agents[k::SENDER_THREADS])
        except Exception as err:  # a thread's exception would go unseen otherwise
            with self._lock:
                self.failures.append(f"load thread {k} crashed: {err!r}")

    def _send_paced(self, agents: list[LoadAgent]) -> None:
        interval_s = BATCH_TXS * SENDER_THREADS / self.rate_per_s
        next_at = time.monotonic()
        turn = 0
        while not self._stop.is_set():
            agent = agents[turn % len(agents)]
            turn += 1
            self._deliver([self._proposal(agent) for _ in range(BATCH_TXS)])
            # Open loop: the next batch is due one interval later; time a fault cost is
            # not made up in a burst.
            next_at = max(next_at + interval_s, time.monotonic() - interval_s)
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _proposal(self, agent: LoadAgent) -> tuple[bytes, bytes, bool]:
        with self._lock:
            self._sequence += 1
            seq = self._sequence
        denied = seq % DENY_EVERY == 0
        target = (DENIED_TARGET if denied else ALLOWED_TARGET).format(label=seq)
        pad = max(0, TX_BYTES_TARGET - 151 - len(target))  # as cluster/ops/loadgen.py pads
        nonce = agent.next_nonce
        agent.next_nonce += 1
        call = CallProposal(
            run_id=agent.run_for(nonce),  # the run its first proposal opened
            tool=BENCH_TOOL,
            target=target,
            arguments=(Argument("note", text="x" * pad),),
        )
        return (
            build(self.spec.chain_id, nonce, call, agent.key),
            tx_id(agent.public_key, nonce),
            denied,
        )

    def _channel(self, node: int) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(node)
            if channel is None:
                channel = self._channels[node] = sync_channel(self.spec, node)
            return channel

    def _next_node(self, avoid: set[int]) -> int | None:
        now = time.monotonic()
        with self._lock:
            for _ in range(self.spec.n):
                node = self._cursor % self.spec.n
                self._cursor += 1
                if node not in avoid and self._down_until.get(node, 0.0) <= now:
                    return node
        return None

    def _mark_down(self, node: int) -> None:
        with self._lock:
            self._down_until[node] = time.monotonic() + NODE_DOWN_HOLD_S

    def _stream(self, node: int, txs: Sequence[bytes]) -> Iterator[cpb.SubmitReply]:
        requests = [cpb.SubmitRequest(tx=tx, request_id=j) for j, tx in enumerate(txs)]
        batches = [
            cpb.SubmitBatch(requests=requests[i : i + SUBMIT_BATCH_TXS_MAX])
            for i in range(0, len(requests), SUBMIT_BATCH_TXS_MAX)
        ]
        stub = cpb_grpc.ReplicaStub(self._channel(node))
        for reply_batch in stub.SubmitStream(iter(batches), timeout=STREAM_TIMEOUT_S):
            yield from reply_batch.replies

    def _deliver(self, batch: list[tuple[bytes, bytes, bool]]) -> None:
        """Until every proposal of `batch` is acknowledged or finally refused, or the load
        stops: offer the unanswered ones to the next member."""
        remaining = batch
        backoff_s = DELIVERY_BACKOFF_S_MIN
        refused_by: dict[bytes, set[int]] = {}
        while remaining and not self._stop.is_set():
            avoid = set.intersection(*(refused_by.get(p, set()) for _, p, _ in remaining))
            node = self._next_node(avoid)
            again: list[tuple[bytes, bytes, bool]] = []
            answered = 0
            if node is not None:
                try:
                    for reply in self._stream(node, [data for data, _, _ in remaining]):
                        item = remaining[answered]
                        answered += 1
                        outcome = self._record(node, reply, *item)
                        if outcome == "elsewhere":
                            refused_by.setdefault(item[1], set()).add(node)
                        if outcome != "done":
                            again.append(item)
                except grpc.RpcError as err:
                    if err.code() not in TRANSPORT_CODES:
                        with self._lock:
                            self.failures.append(f"node {node}: {err.code().name} {err.details()}")
                        return
                    self._mark_down(node)
            remaining = again + remaining[answered:]
            if remaining:
                self._stop.wait(backoff_s)  # back-off between offers
                backoff_s = min(backoff_s * 2, DELIVERY_BACKOFF_S_MAX)

    def _record(
        self, node: int, reply: cpb.SubmitReply, data: bytes, proposal_id: bytes, denied: bool
    ) -> str:
        """One reply: "done", "retry" (back-pressure) or "elsewhere" (a local refusal)."""
        with self._lock:
            if reply.accepted or reply.reason == "replayed":
                # `replayed` for bytes this drill offered before means an earlier offer,
                # whose answer was lost, landed and committed: the same proposal.
                if reply.accepted and reply.proposal_id != proposal_id:
                    self.failures.append(
                        f"node {node} acknowledged {short(proposal_id)} "
                        f"as {short(reply.proposal_id)}"
                    )
                self.acked.setdefault(proposal_id, Ack(data, node, denied, time.monotonic()))
                return "done"
            if reply.reason in RETRYABLE_REFUSALS:
                return "retry"
            if reply.reason in LOCAL_VIEW_REFUSALS:
                self.redirected[reply.reason] += 1
                return "elsewhere"
            self.refused[reply.reason or "unknown"] += 1
            return "done"

    def reoffer(self, proposals: Sequence[bytes]) -> tuple[int, list[bytes]]:
        """Offer acknowledged proposals again, the same bytes, to a live member; return
        how many were offered and those taken as new: proposals the cluster had lost."""
        offered = 0
        taken: list[bytes] = []
        for start in range(0, len(proposals), REOFFER_BATCH_MAX):
            chunk = list(proposals[start : start + REOFFER_BATCH_MAX])
            for _attempt in range(self.spec.n):
                node = self._next_node(set())
                if node is None:
                    break
                try:
                    replies = list(self._stream(node, [self.acked[p].tx for p in chunk]))
                except grpc.RpcError:
                    self._mark_down(node)
                    continue
                offered += len(replies)
                taken += [
                    p
                    for p, r in zip(chunk, replies, strict=False)
                    if r.accepted and r.detail != "already pending"
                ]
                break
        return offered, taken
