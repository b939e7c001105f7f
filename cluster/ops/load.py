"""The load generator the recovery drills and the live tests share: agents submitting
signed proposals to a live cluster (`quorumgate.ops.live.LiveCluster`) from background
threads, and a record of what became of each.

Each sender thread takes its agents in turn and sends a batch of `batch` proposals from
one, streamed through `SubmitStream` (or, every `unary_every`-th batch, one `Submit` at a
time), to the next member in turn that runs, is among `targets`, is not avoided, and has
not just failed; then it waits for the batch's turn. The pacing is an open loop: a batch
is due one interval after the one before, and time a fault cost is not made up in a
burst. A batch cut off by a failing member goes again, unanswered proposals only and the
same bytes (the same transactions), to another member. What else is tried again, and for
how long, is the `Delivery`: a drill keeps at it until the load stops (`PERSISTENT`); a
test gives up after a few members and counts any refusal against the cluster (`STRICT`).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import grpc

from quorumgate.ops.live import LiveCluster
from quorumgate.ops.loadgen import LoadAgent
from quorumgate.proto import client_pb2 as cpb
from quorumgate.replica.wire import SUBMIT_BATCH_TXS_MAX

STREAM_TIMEOUT_S = 60.0
RPC_TIMEOUT_S = 5.0
STOP_GRACE_S = 10.0  # a sender thread finishing its stream once the load stops
NODE_DOWN_HOLD_S = 0.3  # a member that failed a delivery is skipped this long
NO_MEMBER_WAIT_S = 0.2  # every member is down, avoided or refused the batch
REOFFER_BATCH_MAX = 512
TRANSPORT_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
)
# Back-pressure: the same bytes again after a pause.
RETRYABLE_REFUSALS = ("mempool_full", "signer_full")
# Refusals by the answering replica's own sidecar, which may be behind (being rebuilt)
# while the rest of the cluster knows the agent: counted, and offered to another member.
LOCAL_VIEW_REFUSALS = ("unknown_signer", "unknown_tool", "not_an_agent")


@dataclass(frozen=True)
class Delivery:
    """How hard a batch is pushed into the cluster."""

    attempts_max: int | None  # offers of one batch to a member; None: until the load stops
    retried: tuple[str, ...]  # refusals offered again, the same bytes, after a pause
    elsewhere: tuple[str, ...]  # refusals offered to another member
    # `replayed` for bytes offered before means an earlier offer, whose answer was lost,
    # landed: the same proposal, acknowledged.
    replayed_is_ack: bool
    transport_codes: tuple[grpc.StatusCode, ...]
    backoff_s_min: float
    backoff_s_max: float


# A drill: nothing is given up while the load runs, and a member that restarts or is
# rebuilt under it may answer anything a live member can.
PERSISTENT = Delivery(
    attempts_max=None,
    retried=RETRYABLE_REFUSALS,
    elsewhere=LOCAL_VIEW_REFUSALS,
    replayed_is_ack=True,
    transport_codes=(*TRANSPORT_CODES, grpc.StatusCode.UNKNOWN),
    backoff_s_min=0.05,
    backoff_s_max=0.5,
)
# A test: a few members are tried, and any refusal of a valid proposal is kept for the
# test to judge.
STRICT = Delivery(
    attempts_max=8,
    retried=(),
    elsewhere=(),
    replayed_is_ack=False,
    transport_codes=TRANSPORT_CODES,
    backoff_s_min=0.1,
    backoff_s_max=0.1,
)


@dataclass(frozen=True)
class Ack:
    """An acknowledged proposal: its bytes, the member that acknowledged it, whether its
    target is one the tool refuses, and when (time.monotonic())."""

    tx: bytes
    node: int
    denied: bool
    at: float


@dataclass(frozen=True)
class _Proposal:
    tx: bytes
    tx_id: bytes
    denied: bool


class Load:
    """Agents submitting signed proposals from background threads (module docstring).

    `rate_per_s` is the load offered by all agents together (None: unpaced);
    `per_agent` bounds the proposals of each agent (None: until `stop`); one proposal in
    `deny_every` (0: none) names a target the tool refuses. `acked` maps each acknowledged
    proposal's id to its `Ack`; `refused` holds (member, reason) of each valid proposal
    finally refused, `redirected` the refusals offered elsewhere, `transport_errors` and
    `failures` what went wrong on the way.
    """

    def __init__(
        self,
        cluster: LiveCluster,
        agents: Sequence[LoadAgent],
        *,
        delivery: Delivery,
        batch: int,
        rate_per_s: float | None = None,
        per_agent: int | None = None,
        threads: int | None = None,
        deny_every: int = 0,
        unary_every: int = 0,
        targets: Sequence[int] | None = None,
    ) -> None:
        self.cluster = cluster
        self.agents = list(agents)
        self.delivery = delivery
        self.batch = batch
        self.rate_per_s = rate_per_s
        self.per_agent = per_agent
        self.threads = len(self.agents) if threads is None else threads
        self.deny_every = deny_every
        self.unary_every = unary_every
        self.targets = list(range(cluster.n)) if targets is None else list(targets)
        self.acked: dict[bytes, Ack] = {}
        self.refused: list[tuple[int, str]] = []
        self.redirected: Counter[str] = Counter()
        self.transport_errors: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._sequence = itertools.count(1)
        self._cursor = itertools.count()
        self._avoid: set[int] = set()
        self._down_until: dict[int, float] = {}
        self._in_flight: Counter[int] = Counter()

    # ------------------------------------------------------------------ control

    def start(self) -> Load:
        for k in range(self.threads):
            agents = self.agents[k :: self.threads]
            thread = threading.Thread(target=self._run, args=(k, agents), name=f"load-{k}")
            thread.daemon = True
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop sending; a thread still running past its stream's bound is a failure."""
        self._stop.set()
        if self.join(STOP_GRACE_S + STREAM_TIMEOUT_S):
            with self._lock:
                self.failures.append("load threads did not stop")

    def join(self, timeout_s: float) -> int:
        """Wait for the sender threads, `timeout_s` at most; how many still run."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(t.is_alive() for t in self._threads)

    def close(self) -> None:
        self.stop()

    def avoid(self, nodes: Iterable[int]) -> None:
        """Send no further batch to these members (and again to all others)."""
        with self._lock:
            self._avoid = set(nodes)

    def in_flight(self, node: int) -> int:
        """Batches on their way to `node` now."""
        with self._lock:
            return self._in_flight[node]

    @property
    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    @property
    def sent(self) -> int:
        with self._lock:
            return len(self.acked) + len(self.refused)

    def snapshot(self) -> dict[bytes, Ack]:
        with self._lock:
            return dict(self.acked)

    def refusals(self) -> Counter[str]:
        """Valid proposals finally refused, by reason."""
        with self._lock:
            return Counter(reason for _, reason in self.refused)

    # ------------------------------------------------------------------ sending

    def _run(self, k: int, agents: list[LoadAgent]) -> None:
        try:
            self._send_paced(agents)
        except Exception as err:  # a thread's exception would go unseen otherwise
            with self._lock:
                self.failures.append(f"load thread {k} crashed: {err!r}")

    def _send_paced(self, agents: list[LoadAgent]) -> None:
        sent = dict.fromkeys(range(len(agents)), 0)
        next_at = time.monotonic()
        batches = 0
        for turn in itertools.cycle(range(len(agents))):
            if self._stop.is_set() or not sent:
                return
            if turn not in sent:
                continue
            size = self.batch
            if self.per_agent is not None:
                size = min(size, self.per_agent - sent[turn])
            unary = bool(self.unary_every) and batches % self.unary_every == self.unary_every - 1
            self._deliver([self._proposal(agents[turn]) for _ in range(size)], unary)
            sent[turn] += size
            batches += 1
            if self.per_agent is not None and sent[turn] >= self.per_agent:
                del sent[turn]
            if self.rate_per_s is not None:
                interval_s = size * self.threads / self.rate_per_s
                next_at = max(next_at + interval_s, time.monotonic() - interval_s)
                self._stop.wait(max(0.0, next_at - time.monotonic()))  # pacing, not a wait

    def _proposal(self, agent: LoadAgent) -> _Proposal:
        seq = next(self._sequence)
        denied = bool(self.deny_every) and seq % self.deny_every == 0
        tx, tid = agent.proposal(seq, denied=denied)
        return _Proposal(tx, tid, denied)

    def _next_node(self, refused_by: set[int]) -> int | None:
        """The next member in turn to offer a batch to, if any may take it now."""
        now = time.monotonic()
        alive = set(self.cluster.alive())
        with self._lock:
            candidates = [
                i
                for i in self.targets
                if i in alive
                and i not in self._avoid
                and i not in refused_by
                and self._down_until.get(i, 0.0) <= now
            ]
            if not candidates:
                return None
            node = candidates[next(self._cursor) % len(candidates)]
            self._in_flight[node] += 1
            return node

    def _deliver(self, batch: list[_Proposal], unary: bool) -> None:
        """Until every proposal of `batch` is acknowledged or finally refused, the load
        stops, or the delivery's attempts are spent: offer the unanswered ones to the next
        member."""
        remaining = batch
        backoff_s = self.delivery.backoff_s_min
        refused_by: dict[bytes, set[int]] = {}
        attempts = itertools.count(1)
        while remaining and not self._stop.is_set():
            attempt = next(attempts)
            if self.delivery.attempts_max is not None and attempt > self.delivery.attempts_max:
                with self._lock:
                    self.failures.append(
                        f"{len(remaining)} proposals undelivered after {attempt - 1} tries"
                    )
                return
            avoid = set.intersection(*(refused_by.get(p.tx_id, set()) for p in remaining))
            node = self._next_node(avoid)
            if node is None:
                self._stop.wait(NO_MEMBER_WAIT_S)  # back-off until a member may take it
                continue
            again: list[_Proposal] = []
            answered = 0
            try:
                for reply in self._replies(node, [p.tx for p in remaining], unary):
                    item = remaining[answered]
                    answered += 1
                    outcome = self._record(node, reply, item)
                    if outcome == "elsewhere":
                        refused_by.setdefault(item.tx_id, set()).add(node)
                    if outcome != "done":
                        again.append(item)
            except grpc.RpcError as err:
                if not self._transport_failed(node, err):
                    return
            finally:
                with self._lock:
                    self._in_flight[node] -= 1
            remaining = again + remaining[answered:]
            if remaining:
                self._stop.wait(backoff_s)  # back-off between offers
                backoff_s = min(backoff_s * 2, self.delivery.backoff_s_max)

    def _replies(self, node: int, txs: Sequence[bytes], unary: bool) -> Iterator[cpb.SubmitReply]:
        """The replies of `node` to `txs`, in order: one stream, or one call each."""
        if not unary:
            yield from self._stream(node, txs)
            return
        for tx in txs:
            yield self._submit_one(node, tx)

    def _transport_failed(self, node: int, err: grpc.RpcError) -> bool:
        """Record a failed offer; True when another member may be tried."""
        with self._lock:
            self.transport_errors.append(f"node {node}: {err.code().name}")
            if err.code() not in self.delivery.transport_codes:
                self.failures.append(f"node {node}: {err.code().name} {err.details()}")
                return False
            self._down_until[node] = time.monotonic() + NODE_DOWN_HOLD_S
        return True

    def _stream(self, node: int, txs: Sequence[bytes]) -> Iterator[cpb.SubmitReply]:
        """`txs` on one SubmitStream, in request batches the replica takes; each reply in
        request order (request ids checked)."""
        requests = [cpb.SubmitRequest(tx=tx, request_id=j) for j, tx in enumerate(txs, 1)]
        batches = [
            cpb.SubmitBatch(requests=requests[i : i + SUBMIT_BATCH_TXS_MAX])
            for i in range(0, len(requests), SUBMIT_BATCH_TXS_MAX)
        ]
        call = self.cluster.replica(node).SubmitStream(iter(batches), timeout=STREAM_TIMEOUT_S)
        expected = 0
        for reply_batch in call:
            for reply in reply_batch.replies:
                expected += 1
                if reply.request_id != expected:
                    with self._lock:
                        self.failures.append(
                            f"node {node}: SubmitStream reply {reply.request_id} in place "
                            f"of {expected}"
                        )
                yield reply

    def _submit_one(self, node: int, tx: bytes) -> cpb.SubmitReply:
        """One `Submit`; a refusal sent as a gRPC error comes back as a refusing reply."""
        try:
            reply: cpb.SubmitReply = self.cluster.replica(node).Submit(
                cpb.SubmitRequest(tx=tx), timeout=RPC_TIMEOUT_S
            )
        except grpc.RpcError as err:
            if err.code() in self.delivery.transport_codes:
                raise
            reason = dict(err.trailing_metadata() or ()).get("qg-reason", err.code().name)
            return cpb.SubmitReply(accepted=False, reason=str(reason))
        return reply

    def _record(self, node: int, reply: cpb.SubmitReply, item: _Proposal) -> str:
        """One reply: "done", "retry" (back-pressure) or "elsewhere" (a local refusal)."""
        with self._lock:
            if reply.accepted or (reply.reason == "replayed" and self.delivery.replayed_is_ack):
                if reply.accepted and reply.proposal_id != item.tx_id:
                    self.failures.append(
                        f"node {node} acknowledged {item.tx_id.hex()[:16]} "
                        f"as {reply.proposal_id.hex()[:16]}"
                    )
                self.acked.setdefault(item.tx_id, Ack(item.tx, node, item.denied, time.monotonic()))
                return "done"
            if reply.reason in self.delivery.retried:
                return "retry"
            if reply.reason in self.delivery.elsewhere:
                self.redirected[reply.reason] += 1
                return "elsewhere"
            self.refused.append((node, reply.reason or "unknown"))
            return "done"

    # ------------------------------------------------------------------ settling

    def reoffer(self, proposals: Sequence[bytes]) -> tuple[int, list[bytes]]:
        """Offer acknowledged proposals again, the same bytes, to a live member; return
        how many were offered and those taken as new: proposals the cluster had lost."""
        offered = 0
        taken: list[bytes] = []
        for start in range(0, len(proposals), REOFFER_BATCH_MAX):
            chunk = list(proposals[start : start + REOFFER_BATCH_MAX])
            for _attempt in range(self.cluster.n):
                node = self._next_node(set())
                if node is None:
                    break
                try:
                    replies = list(self._stream(node, [self.acked[p].tx for p in chunk]))
                except grpc.RpcError:
                    with self._lock:
                        self._down_until[node] = time.monotonic() + NODE_DOWN_HOLD_S
                    continue
                finally:
                    with self._lock:
                        self._in_flight[node] -= 1
                offered += len(replies)
                taken += [
                    p
                    for p, r in zip(chunk, replies, strict=False)
                    if r.accepted and r.detail != "already pending"
                ]
                break
        return offered, taken
