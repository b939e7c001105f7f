"""`quorumgate bench`: the benchmark harness (issue 8).

Load. Client processes (their own OS processes, so the load generator shares no interpreter
with what it measures) submit signed ~256-byte proposals (`quorumgate.ops.loadgen`) on one
`SubmitStream` each, either closed-loop (W proposals in flight in all: a new one as soon as
one completes) or open-loop (a fixed offered rate: proposal k of a client is *due* at
`start + k / rate`, and its latency is counted from that due time, so a client that falls
behind cannot hide the queueing it causes, i.e. no coordinated omission). Proposals are
signed before the clock starts where the expected count is known, so that the clients'
Ed25519 signing does not compete with the cluster for this machine's cores.

Completion. One observer process follows replica 0's `CommittedBlocks` stream (commit
time of each proposal) and, in full mode, every sidecar's `Receipts` stream. A block is
certified once f+1 sidecars have sent all their receipts of that block and agree on its
signed statement: one `verify_certificate` over one leaf checks the f+1 signatures and that
leaf's path, and recomputing the Merkle root over all the block's leaves puts every other
leaf under the same signed root; that is the certificate of every proposal in the block
(`BlockCertifier`). The observer tells each client which of its proposals completed, with
both times. Times are `time.monotonic()` (CLOCK_MONOTONIC, one clock for all processes).

Figures, over a measured window after a warm-up: committed and certified proposals per
second (a proposal counts in the window its commit / certificate falls in), submit-to-commit
and submit-to-certificate latency p50/p99, cluster CPU seconds per proposal (utime+stime of
every replica and sidecar process, read from /proc at the window's edges), and peak RSS per
process (VmHWM at the end: the peak over the process's whole life). `--ordering-only`
starts replicas only (with `--start`) and counts committed proposals.

Full mode uses a pool of governed agents (`bench-pool-I`, registered once per cluster with
the bench tool allowed); their next nonces come from the sidecars. The engine's quota (120
proposals per agent per minute of block time, DESIGN §4.7) turns proposals over it into
certified *denials*: still a certified verdict, reported under `outcomes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any, TypeVar

import grpc

from quorumgate.ops.loadgen import BENCH_TOOL, LoadAgent
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
from quorumgate.sidecar.receipts import (
    Certificate,
    CertificateError,
    merkle_root,
    verify_certificate,
)
from quorumgate.sidecar.wire import leaf_from_pb, receipt_from_pb

# ---------------------------------------------------------------------------- limits

WARMUP_S_DEFAULT = 2.0
START_DELAY_S = 0.3  # between "every client is ready" and the first submission
DRAIN_S_MAX = 10.0  # after the window, wait this long at most for what is in flight
READY_TIMEOUT_S = 120.0  # client pre-signing and observer streams
RESULT_TIMEOUT_S = 60.0
AGENT_POOL_DEFAULT = 256  # see `prepare_agent_pool` on the quota and the state size
AGENTS_PER_CLIENT_MIN = 4
REGISTER_OPS_PER_SUBMIT_MAX = 500  # the owner's nonce window is 1024
ACCOUNT_CALLS_IN_FLIGHT_MAX = 256
RPC_TIMEOUT_S = 5.0
PRESIGN_RATE_GUESS_PER_S = 3000.0  # first run of an invocation; later runs use the rate seen
PRESIGN_HEADROOM = 1.3
PRESIGN_PER_CLIENT_MAX = 200_000
OPEN_LOOP_OUTSTANDING_MAX = 100_000  # per client: past it a due proposal is shed, counted
OPEN_LOOP_BURST_MAX = 512  # due proposals sent per wake-up; the rest on the next
RETRY_BACKOFF_S = 0.01
RETRYABLE_REFUSALS = frozenset({"mempool_full", "signer_full"})
CLOSED_LOOP_POLL_S = 0.05
HEIGHTS_PENDING_MAX = 4096  # blocks waiting for receipts, in the certifier
EARLY_CERTS_MAX = 200_000  # certified before the commit stream showed them (observer)
COMMITS_PENDING_MAX = 1_000_000  # committed, waiting for a certificate (observer)
OBSERVER_SEND_BATCH_MAX = 4096

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class BenchError(Exception):
    pass


class BenchInterrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwind (stopping what the harness started) and exit."""


# Signals seen by `bench_command`'s handlers. The harness polls this flag itself rather
# than relying on KeyboardInterrupt, which a blocking gRPC call turns into a cancelled RPC.
_signals_seen: list[int] = []


def _on_stop_signal(signum: int, frame: object) -> None:
    _signals_seen.append(signum)


def check_interrupted() -> None:
    if _signals_seen:
        raise BenchInterrupted(f"signal {_signals_seen[0]}")


def sleep_until(deadline: float) -> None:
    """Sleep until `deadline` (monotonic seconds), in steps, raising on a stop signal."""
    while True:
        check_interrupted()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.2))


@contextlib.contextmanager
def stop_signals_handled() -> Iterator[None]:
    """SIGINT and SIGTERM set a flag the harness checks (main thread only)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _signals_seen.clear()
    previous = {sig: signal.signal(sig, _on_stop_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------------------- /proc


def parse_stat_cpu_ticks(text: str) -> int:
    """utime + stime, in clock ticks, from the text of /proc/PID/stat (proc(5): fields 14
    and 15, counted after the parenthesised command name, which may hold spaces and
    parentheses itself, hence the split at the last ')')."""
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state), so field N is fields[N - 3].
    return int(fields[14 - 3]) + int(fields[15 - 3])


def parse_status_hwm_kib(text: str) -> int | None:
    """VmHWM (peak resident set size), in KiB, from the text of /proc/PID/status."""
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` in seconds; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return parse_stat_cpu_ticks(text) / CLOCK_TICKS_PER_S


def rss_peak_mb(pid: int) -> float | None:
    """Peak resident set size of `pid` in MiB; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = parse_status_hwm_kib(text)
    return None if kib is None else round(kib / 1024, 1)


def cluster_pids(spec: ClusterSpec) -> dict[str, int]:
    """`replica-I` / `sidecar-I` -> pid, for those running now."""
    from quorumgate.ops.nodes import running_pid

    pids: dict[str, int] = {}
    for kind in ("replica", "sidecar"):
        for i in range(spec.n):
            pid = running_pid(spec, i, kind)
            if pid is not None:
                pids[f"{kind}-{i}"] = pid
    return pids


def _sample(pids: dict[str, int], read: Callable[[int], float | None]) -> dict[str, float]:
    """`read(pid)` for each named process still there to read."""
    values = {name: read(pid) for name, pid in pids.items()}
    return {name: value for name, value in values.items() if value is not None}


Q = TypeVar("Q")  # a request message


async def queued_requests(queue: asyncio.Queue[Q | None]) -> AsyncIterator[Q]:
    """A request stream fed by `queue`; None ends it."""
    while True:
        item = await queue.get()
        if item is None:
            return
        yield item


async def queued_batches(queue: asyncio.Queue[Q | None], items_max: int) -> AsyncIterator[list[Q]]:
    """As `queued_requests`, but each message is everything queued by then (at least one
    item, at most `items_max`): under load, few stream messages carry many requests."""
    while True:
        item = await queue.get()
        if item is None:
            return
        batch = [item]
        while len(batch) < items_max and not queue.empty():
            item = queue.get_nowait()
            if item is None:
                yield batch
                return
            batch.append(item)
        yield batch


def sample_cpu(pids: dict[str, int]) -> dict[str, float]:
    return _sample(pids, cpu_seconds)


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in before if name in after}


def sample_rss(pids: dict[str, int]) -> dict[str, float]:
    return _sample(pids, rss_peak_mb)


# ---------------------------------------------------------------------------- figures


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (NaN for no values)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def _r(value: float | None, digits: int = 2) -> float | None:
    if value is None or math.isnan(value):
        return None
    return round(value, digits)


def median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# ---------------------------------------------------------------------------- load shape


@dataclass(frozen=True, slots=True)
class LoadShape:
    """One client's load: closed loop (`inflight` > 0) or open loop (`rate_per_s` > 0)."""

    inflight: int
    rate_per_s: float
    warmup_s: float
    seconds: float

    def __post_init__(self) -> None:
        if (self.inflight > 0) == (self.rate_per_s > 0):
            raise ValueError("a load is closed (inflight > 0) or open (rate > 0), not both")
        if self.inflight < 0 or self.rate_per_s < 0:
            raise ValueError("inflight and rate are not negative")
        if self.warmup_s < 0 or self.seconds <= 0:
            raise ValueError("warm-up >= 0 and a measured window > 0 seconds")

    @property
    def open_loop(self) -> bool:
        return self.rate_per_s > 0


@dataclass
class LoadResult:
    """What one client measured; latencies in ms of the completions inside the window."""

    completed: int = 0  # done (certified / committed / replied) inside the window
    committed: int = 0  # committed inside the window
    commit_ms: list[float] = field(default_factory=list)
    done_ms: list[float] = field(default_factory=list)
    submitted: int = 0
    retries: int = 0
    shed: int = 0  # open loop: due but not sent (client over its outstanding bound)
    unfinished: int = 0  # still in flight when the drain ended
    failed: dict[str, int] = field(default_factory=dict)
    next_nonces: dict[str, int] = field(default_factory=dict)  # agent name -> next nonce
    error: str = ""


class LoadLoop:
    """The client-side bookkeeping every load in this harness shares (QuorumGate's clients
    and the baselines'): which requests are due, what is in flight since when, and which
    completions fall in the measured window. No I/O and no clock: callers pass `now`."""

    def __init__(self, shape: LoadShape, t_start: float) -> None:
        self.shape = shape
        self.t_start = t_start
        self.window_start = t_start + shape.warmup_s
        self.window_end = self.window_start + shape.seconds
        self.outstanding: dict[Any, float] = {}  # key -> start (due) time
        self.result = LoadResult()
        self._scheduled = 0  # open loop: proposals whose due time has been handed out

    def due(self, now: float) -> list[float]:
        """Start times of the requests to send now."""
        if now >= self.window_end:
            return []
        if not self.shape.open_loop:
            free = self.shape.inflight - len(self.outstanding)
            return [now] * max(0, free)
        rate = self.shape.rate_per_s
        due_count = int((now - self.t_start) * rate) + 1 - self._scheduled
        starts: list[float] = []
        for _ in range(max(0, min(due_count, OPEN_LOOP_BURST_MAX))):
            start = self.t_start + self._scheduled / rate
            self._scheduled += 1
            if len(self.outstanding) + len(starts) >= OPEN_LOOP_OUTSTANDING_MAX:
                self.result.shed += 1
                continue
            starts.append(start)
        return starts

    def next_due(self) -> float | None:
        """Open loop: when the next request is due (None: closed loop)."""
        if not self.shape.open_loop:
            return None
        return self.t_start + self._scheduled / self.shape.rate_per_s

    def sent(self, key: Any, start: float) -> None:
        self.outstanding[key] = start
        self.result.submitted += 1

    def done(self, key: Any, t_commit: float, t_done: float) -> bool:
        """A request completed (`t_commit`: ordered; `t_done`: its completion, the
        certificate in full mode). False if it was not ours / not in flight."""
        start = self.outstanding.pop(key, None)
        if start is None:
            return False
        r = self.result
        if self.window_start <= t_commit < self.window_end:
            r.committed += 1
        if self.window_start <= t_done < self.window_end:
            r.completed += 1
            r.commit_ms.append((t_commit - start) * 1000)
            r.done_ms.append((t_done - start) * 1000)
        return True

    def failed(self, key: Any, reason: str) -> None:
        if self.outstanding.pop(key, None) is not None:
            self.result.failed[reason] = self.result.failed.get(reason, 0) + 1

    def finished(self, now: float) -> bool:
        return now >= self.window_end and (
            not self.outstanding or now >= self.window_end + DRAIN_S_MAX
        )


async def drive(loop: LoadLoop, send: Callable[[float], None], wake: asyncio.Event) -> None:
    """Send what `loop` says is due until it is finished. `send(start)` sends one request
    (and calls `loop.sent`); whoever completes one sets `wake`."""
    while True:
        now = time.monotonic()
        for start in loop.due(now):
            send(start)
        if loop.finished(now):
            break
        nxt = loop.next_due()
        timeout = CLOSED_LOOP_POLL_S if nxt is None else max(0.0, min(nxt - now, 0.05))
        wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout)
    loop.result.unfinished = len(loop.outstanding)


async def wait_start(start_at: Synchronized) -> float:  # type: ignore[type-arg]
    """Wait until the driver publishes the common start time; return it."""
    while True:
        t = float(start_at.value)
        if t > 0:
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(max(0.0, t - time.monotonic()))
    return t


# ---------------------------------------------------------------------------- certificates


@dataclass
class _Height:
    # signer -> receipts of this block, in arrival (= index) order
    receipts: dict[int, list[spb.Receipt]] = field(default_factory=dict)
    bad: set[int] = field(default_factory=set)


@dataclass
class CertifierCounts:
    certified_blocks: int = 0
    certified_leaves: int = 0
    failures: int = 0  # statements or leaf sets that did not verify
    dropped_heights: int = 0  # over HEIGHTS_PENDING_MAX, oldest dropped


class BlockCertifier:
    """Per-block certificates from the sidecars' `Receipts` streams (one receipt per leaf
    per sidecar; each carries its sidecar's signed block statement).

    A block is certified once f+1 distinct sidecars have sent *all* their receipts of it
    and agree on the statement (verdict root, state root, leaf count): `verify_certificate`
    on the first leaf checks the f+1 signatures and its path, and the Merkle root of all
    the leaves (RFC 6962, `quorumgate.sidecar.receipts.merkle_root`) must equal the signed verdict
    root, which puts every leaf of the block under signatures already checked. So a block
    costs f+1 Ed25519 verifications and one pass of hashing, whatever its size. Receipts of
    sidecars outside the chosen group are never decoded beyond their statement.
    """

    def __init__(
        self, chain_id: str, receipt_keys: Sequence[bytes], *, receipts_expire: bool
    ) -> None:
        self.chain_id = chain_id
        self.receipt_keys = tuple(receipt_keys)
        self.receipts_expire = receipts_expire  # the chain's: statements sign a window
        self.n = len(self.receipt_keys)
        self.f = (self.n - 1) // 3
        self.heights: dict[int, _Height] = {}
        self.done_below = 0  # every height below this is certified or given up
        self.done: set[int] = set()
        self.counts = CertifierCounts()

    def add(self, signer: int, receipt: spb.Receipt) -> list[tuple[bytes, str]] | None:
        """Take one receipt from sidecar `signer`'s stream; when it completes a certified
        block, return that block's leaves as (tx id, "outcome/reason")."""
        height = receipt.leaf.height
        if not 0 <= signer < self.n or height < self.done_below or height in self.done:
            return None
        h = self.heights.get(height)
        if h is None:
            h = self.heights[height] = _Height()
            self._bound()
        mine = h.receipts.setdefault(signer, [])
        if len(mine) >= receipt.leaf_count or signer in h.bad:
            return None
        mine.append(receipt)
        if len(mine) < receipt.leaf_count:
            return None
        return self._try_certify(height, h)

    def _statement(self, receipts: list[spb.Receipt]) -> tuple[bytes, bytes, int, bytes]:
        first = receipts[0]
        window = first.validity.SerializeToString() if first.HasField("validity") else b""
        return (first.verdict_root, first.state_root, first.leaf_count, window)

    def _try_certify(self, height: int, h: _Height) -> list[tuple[bytes, str]] | None:
        complete = [
            s
            for s, rs in h.receipts.items()
            if s not in h.bad and rs and len(rs) == rs[0].leaf_count
        ]
        groups: dict[tuple[bytes, bytes, int, bytes], list[int]] = {}
        for s in complete:
            groups.setdefault(self._statement(h.receipts[s]), []).append(s)
        for (verdict_root, state_root, leaf_count, _), signers in groups.items():
            if len(signers) < self.f + 1:
                continue
            chosen = sorted(signers)[: self.f + 1]
            receipts = h.receipts[chosen[0]]
            leaves = [leaf_from_pb(r.leaf) for r in receipts]
            ok = all(leaf.height == height and leaf.index == i for i, leaf in enumerate(leaves))
            try:
                validity = receipt_from_pb(receipts[0]).block.validity
            except CertificateError:
                validity, ok = None, False
            cert = Certificate(
                chain_id=self.chain_id,
                leaf=leaves[0],
                path=tuple(receipts[0].path),
                leaf_count=leaf_count,
                verdict_root=verdict_root,
                state_root=state_root,
                signatures=tuple((s, h.receipts[s][0].signature) for s in chosen),
                validity=validity,
            )
            try:
                if not ok:
                    raise CertificateError("bad_leaf", "leaves out of order")
                verify_certificate(
                    cert, self.chain_id, self.receipt_keys, receipts_expire=self.receipts_expire
                )
                root = merkle_root([leaf.hash(self.chain_id) for leaf in leaves])
                if root != verdict_root:
                    raise CertificateError("bad_path", "leaves do not hash to the verdict root")
            except CertificateError:
                self.counts.failures += 1
                self._exclude_bad(h, chosen, height)
                continue
            self._finish(height)
            self.counts.certified_blocks += 1
            self.counts.certified_leaves += len(leaves)
            return [(leaf.tx_id, f"{leaf.outcome}/{leaf.reason}") for leaf in leaves]
        return None

    def _exclude_bad(self, h: _Height, chosen: list[int], height: int) -> None:
        """A group failed: find which members' statements or leaves are bad (the rare
        path: one signature each) and stop counting them for this height."""
        for s in chosen:
            rs = h.receipts[s]
            first = rs[0]
            try:
                block = receipt_from_pb(first).block
                if (block.validity is not None) != self.receipts_expire:
                    raise ValueError("validity")
                message = block.statement(self.chain_id)
                from nacl.signing import VerifyKey

                VerifyKey(self.receipt_keys[s]).verify(message, first.signature)
                leaves = [leaf_from_pb(r.leaf) for r in rs]
                root = merkle_root([leaf.hash(self.chain_id) for leaf in leaves])
                if root != first.verdict_root or first.signer != s:
                    raise ValueError("leaves")
            except Exception:
                h.bad.add(s)
                h.receipts[s] = []

    def _finish(self, height: int) -> None:
        del self.heights[height]
        self.done.add(height)
        while self.done_below in self.done or self.done_below == 0:
            self.done.discard(self.done_below)
            self.done_below += 1
        # `done` holds certified heights above a gap (an empty block has no receipts, so
        # gaps are normal): keep it bounded by forgetting far-below heights.
        if len(self.done) > HEIGHTS_PENDING_MAX:
            floor = max(self.done) - HEIGHTS_PENDING_MAX
            self.done = {x for x in self.done if x > floor}
            self.done_below = max(self.done_below, floor + 1)

    def _bound(self) -> None:
        while len(self.heights) > HEIGHTS_PENDING_MAX:
            del self.heights[min(self.heights)]
            self.counts.dropped_heights += 1


# ---------------------------------------------------------------------------- jobs


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


def _client_process(
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


async def _observe(
    job: ObserverJob,
    outboxes: list[Connection],
    stop: Any,
    ready: Callable[[], None],
) -> ObserverResult:
    result = ObserverResult()
    full = job.full
    certifier = BlockCertifier(
        job.chain_id, job.receipt_keys, receipts_expire=job.spec.receipts_expire
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


def _observer_process(
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


# ---------------------------------------------------------------------------- agents


async def _accounts(spec: ClusterSpec, signers: Sequence[bytes]) -> list[tuple[bool, int]]:
    """Per signer: (known to f+1 sidecars, highest next nonce any sidecar reports)."""
    known = [0] * len(signers)
    nonce = [1] * len(signers)
    answered = 0
    semaphore = asyncio.Semaphore(ACCOUNT_CALLS_IN_FLIGHT_MAX)
    reader = owner_reader(spec)  # an account answers its own key and the cluster's roles
    for m in spec.members:
        async with aio_channel(spec, m.index, "sidecar", reader=reader) as ch:
            stub = spb_grpc.SidecarStub(ch)

            async def one(i: int, stub: spb_grpc.SidecarStub = stub) -> spb.AccountReply:
                async with semaphore:
                    reply: spb.AccountReply = await stub.Account(
                        spb.AccountRequest(signer=signers[i]), timeout=RPC_TIMEOUT_S
                    )
                    return reply

            try:
                replies = await asyncio.gather(*(one(i) for i in range(len(signers))))
            except grpc.aio.AioRpcError:
                continue
        answered += 1
        for i, reply in enumerate(replies):
            if reply.known:
                known[i] += 1
                nonce[i] = max(nonce[i], reply.next_nonce)
    if answered < spec.f + 1:
        raise BenchError(f"only {answered} sidecars answered Account; {spec.f + 1} needed")
    return [(k >= spec.f + 1, n) for k, n in zip(known, nonce, strict=True)]


def prepare_agent_pool(spec: ClusterSpec, count: int) -> dict[str, int]:
    """The bench agents `bench-pool-0..count-1`, registered (with the bench tool allowed)
    where missing; returns name -> next nonce.

    How many is a trade-off the figures depend on: the engine's quota allows each agent 120
    proposals per minute of block time (more become certified `quota_exceeded` denials,
    see `outcomes`), while every registered agent is part of the state the sidecars
    serialize for each block's state root. `--agents` sets it (default 256)."""
    from quorumgate.sdk.owner import OwnerSession, agent_ops, tool_op

    names = [f"bench-pool-{i}" for i in range(count)]
    keys = [LoadAgent.from_seed(spec.chain_id, name).public_key for name in names]
    accounts = asyncio.run(_accounts(spec, keys))
    missing = [i for i, (known, _) in enumerate(accounts) if not known]
    if missing:
        session = OwnerSession(spec)
        ops = [tool_op(BENCH_TOOL)]
        for i in missing:
            ops += agent_ops(names[i], keys[i], [BENCH_TOOL])
        for k in range(0, len(ops), REGISTER_OPS_PER_SUBMIT_MAX):
            session.submit(ops[k : k + REGISTER_OPS_PER_SUBMIT_MAX])
    return {name: (1 if i in missing else accounts[i][1]) for i, name in enumerate(names)}


def fresh_agents(spec: ClusterSpec, count: int) -> dict[str, int]:
    """Ordering only: unregistered agents with fresh names (nonces start at 1)."""
    stamp = time.time_ns() % 10**12
    return {f"bench-{stamp}-{i}": 1 for i in range(count)}


# ---------------------------------------------------------------------------- one run


@dataclass(frozen=True, slots=True)
class RunOptions:
    seconds: float = 10.0
    warmup_s: float = WARMUP_S_DEFAULT
    inflight: int = 256  # in all (closed loop)
    rate_per_s: float = 0.0  # in all (open loop)
    clients: int = 2
    ordering_only: bool = False

    def shape(self) -> LoadShape:
        return LoadShape(
            inflight=max(1, self.inflight // self.clients) if self.rate_per_s <= 0 else 0,
            rate_per_s=self.rate_per_s / self.clients if self.rate_per_s > 0 else 0.0,
            warmup_s=self.warmup_s,
            seconds=self.seconds,
        )


def _merge_counts(into: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def _split_agents(nonces: dict[str, int], clients: int) -> list[tuple[tuple[str, int], ...]]:
    names = sorted(nonces, key=lambda n: (len(n), n))
    groups: list[list[tuple[str, int]]] = [[] for _ in range(clients)]
    for i, name in enumerate(names):
        groups[i % clients].append((name, nonces[name]))
    return [tuple(g) for g in groups]


def _presign_count(options: RunOptions, rate_guess_per_s: float) -> int:
    total_s = options.warmup_s + options.seconds
    if options.rate_per_s > 0:
        expected = options.rate_per_s * total_s
    else:
        expected = rate_guess_per_s * PRESIGN_HEADROOM * total_s
    per_client = int(expected / options.clients) + 64
    return min(PRESIGN_PER_CLIENT_MAX, per_client)


def run_once(
    spec: ClusterSpec,
    options: RunOptions,
    nonces: dict[str, int],
    *,
    rate_guess_per_s: float = PRESIGN_RATE_GUESS_PER_S,
) -> dict[str, Any]:
    """One measured run against a serving cluster. `nonces` (agent name -> next nonce) is
    updated with what this run used."""
    from quorumgate.ops.nodes import query_status

    full = not options.ordering_only
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    start_at = ctx.Value("d", 0.0)
    stop = ctx.Event()
    groups = _split_agents(nonces, options.clients)
    client_of_signer = {
        LoadAgent.from_seed(spec.chain_id, name).public_key: c
        for c, group in enumerate(groups)
        for name, _ in group
    }
    heights = [
        st.height
        for st in (query_status(spec, i) for i in range(spec.n))
        if st.alive and st.height is not None
    ]
    from_height = max(heights, default=0) + 1
    pipes = [ctx.Pipe(duplex=False) for _ in range(options.clients)]
    observer_job = ObserverJob(
        chain_id=spec.chain_id,
        spec=spec,
        full=full,
        receipt_keys=spec.receipt_keys,
        client_of_signer=client_of_signer,
        from_height=from_height,
    )
    observer = ctx.Process(
        target=_observer_process,
        args=(observer_job, [w for _, w in pipes], stop, out),
        daemon=True,
    )
    shape = options.shape()
    presign = _presign_count(options, rate_guess_per_s)
    procs = []
    try:
        observer.start()
        _expect(out, "ready", 1, READY_TIMEOUT_S, [observer])
        for c in range(options.clients):
            job = ClientJob(
                client=c,
                spec=spec,
                replica=c % spec.n,
                chain_id=spec.chain_id,
                shape=shape,
                agents=groups[c],
                presign=presign,
            )
            proc = ctx.Process(
                target=_client_process, args=(job, pipes[c][0], start_at, out), daemon=True
            )
            proc.start()
            procs.append(proc)
        _expect(out, "ready", options.clients, READY_TIMEOUT_S, [observer, *procs])
        pids = cluster_pids(spec)
        load_pids = {f"client-{i}": p.pid for i, p in enumerate(procs) if p.pid}
        if observer.pid:
            load_pids["observer"] = observer.pid
        t_start = time.monotonic() + START_DELAY_S
        start_at.value = t_start
        window_start = t_start + options.warmup_s
        window_end = window_start + options.seconds
        sleep_until(window_start)
        cpu_before, load_before = sample_cpu(pids), sample_cpu(load_pids)
        sleep_until(window_end)
        cpu_after, load_after = sample_cpu(pids), sample_cpu(load_pids)
        rss = sample_rss(pids)
        results = _expect(
            out,
            "result",
            options.clients,
            DRAIN_S_MAX + options.seconds + RESULT_TIMEOUT_S,
            [observer, *procs],
        )
        stop.set()
        observed = _expect(out, "observer", 1, RESULT_TIMEOUT_S, [observer])[0]
    finally:
        stop.set()
        reap([*procs, observer])
    errors = [r.error for r in results if r.error]
    if errors:
        raise BenchError(f"bench client failed: {errors[0]}")
    assert isinstance(observed, ObserverResult)
    if observed.error:
        raise BenchError(f"bench observer failed: {observed.error}")
    for r in results:
        for name, nxt in r.next_nonces.items():
            nonces[name] = max(nonces.get(name, 1), nxt)
    return _report(
        spec,
        options,
        results,
        observed,
        cpu_before,
        cpu_after,
        rss,
        cpu_delta(load_before, load_after),
    )


def reap(procs: Sequence[BaseProcess]) -> None:
    """Join the bench's own processes; after a failure or a stop signal, kill them at once
    (they would otherwise go on to the end of their window)."""
    failing = sys.exc_info()[0] is not None
    for proc in procs:
        if proc.pid is None:
            continue
        proc.join(timeout=0.1 if failing else 5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _expect(
    out: mp.Queue,  # type: ignore[type-arg]
    kind: str,
    count: int,
    timeout_s: float,
    watch: Sequence[BaseProcess] = (),
) -> list[Any]:
    """`count` messages of `kind` from the bench processes; raise at the deadline, on a
    process's reported error, or as soon as a watched process died without a word."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        check_interrupted()
        left = deadline - time.monotonic()
        if left <= 0:
            raise BenchError(f"timed out waiting for {count - len(got)} bench {kind} message(s)")
        try:
            what, _, payload = out.get(timeout=min(left, 0.5))
        except queue.Empty:
            dead = [p for p in watch if p.exitcode not in (None, 0)]
            if dead:
                raise BenchError(
                    f"bench process {dead[0].name} exited {dead[0].exitcode}"
                ) from None
            continue
        if what == kind:
            got.append(payload)
        elif isinstance(payload, LoadResult | ObserverResult) and payload.error:
            raise BenchError(f"bench {what} failed: {payload.error}")
    return got


def _report(
    spec: ClusterSpec,
    options: RunOptions,
    results: list[LoadResult],
    observed: ObserverResult,
    cpu_before: dict[str, float],
    cpu_after: dict[str, float],
    rss: dict[str, float],
    load_cpu: dict[str, float],
) -> dict[str, Any]:
    full = not options.ordering_only
    seconds = options.seconds
    committed = sum(r.committed for r in results)
    completed = sum(r.completed for r in results)
    commit_ms = [x for r in results for x in r.commit_ms]
    done_ms = [x for r in results for x in r.done_ms]
    if not full:  # ordering only: every commit is a completion
        commit_ms = done_ms
    refused: dict[str, int] = {}
    for r in results:
        _merge_counts(refused, r.failed)
    deltas = cpu_delta(cpu_before, cpu_after)
    by_kind: dict[str, float] = {}
    for name, d in deltas.items():
        kind = name.split("-")[0]
        by_kind[kind] = by_kind.get(kind, 0.0) + d
    basis = completed if completed else 0
    cpu_total = sum(deltas.values())
    shape = options.shape()
    return {
        "mode": "full" if full else "ordering-only",
        "load": "open" if shape.open_loop else "closed",
        "nodes": spec.n,
        "clients": options.clients,
        "inflight": shape.inflight * options.clients if not shape.open_loop else None,
        "rate_offered_per_s": options.rate_per_s if shape.open_loop else None,
        "seconds": seconds,
        "committed": committed,
        "throughput_per_s": round(committed / seconds, 1),
        "p50_ms": _r(percentile(commit_ms, 0.50)),
        "p99_ms": _r(percentile(commit_ms, 0.99)),
        "mean_ms": _r(statistics.fmean(commit_ms)) if commit_ms else None,
        "certified": completed if full else None,
        "certified_per_s": round(completed / seconds, 1) if full else None,
        "cert_p50_ms": _r(percentile(done_ms, 0.50)) if full else None,
        "cert_p99_ms": _r(percentile(done_ms, 0.99)) if full else None,
        "cpu_s_per_proposal": _r(cpu_total / basis, 6) if basis else None,
        "cpu_s_per_proposal_by_kind": {
            k: _r(v / basis, 6) if basis else None for k, v in sorted(by_kind.items())
        },
        "cpu_cores_busy": _r(cpu_total / seconds, 2),
        "load_cpu_s_per_proposal": _r(sum(load_cpu.values()) / basis, 6) if basis else None,
        "rss_peak_mb": {
            "per_process": dict(sorted(rss.items())),
            "max": max(rss.values(), default=None),
        },
        "block_txs_mean": _r(observed.block_txs / observed.blocks, 1) if observed.blocks else None,
        "outcomes": dict(sorted(observed.outcomes.items())),
        "certificate_failures": observed.certifier.failures if full else None,
        "refused": refused,
        "retries": sum(r.retries for r in results),
        "shed": sum(r.shed for r in results),
        "unfinished": sum(r.unfinished for r in results),
        "submitted": sum(r.submitted for r in results),
    }


# ---------------------------------------------------------------------------- many runs

# Figures whose median over runs is reported (the others come from the median run).
MEDIAN_KEYS = (
    "throughput_per_s",
    "p50_ms",
    "p99_ms",
    "mean_ms",
    "certified_per_s",
    "cert_p50_ms",
    "cert_p99_ms",
    "cpu_s_per_proposal",
    "cpu_cores_busy",
    "load_cpu_s_per_proposal",
    "block_txs_mean",
)


def median_report(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Numbers are medians over the runs; counts and maps come from the run whose headline
    throughput is the median one; `runs` lists every run's headline figures."""
    assert runs, "at least one run"
    headline = (
        "certified_per_s" if runs[0].get("certified_per_s") is not None else "throughput_per_s"
    )
    ordered = sorted(runs, key=lambda r: r[headline] or 0.0)
    report = dict(ordered[len(ordered) // 2])
    for key in MEDIAN_KEYS:
        report[key] = _r(median_or_none([r.get(key) for r in runs]), 6 if "cpu_s" in key else 2)
    rss_max: dict[str, float] = {}
    for r in runs:
        for name, mb in r["rss_peak_mb"]["per_process"].items():
            rss_max[name] = max(rss_max.get(name, 0.0), mb)
    report["rss_peak_mb"] = {
        "per_process": dict(sorted(rss_max.items())),
        "max": max(rss_max.values(), default=None),
    }
    report["runs"] = len(runs)
    report["per_run"] = [
        {
            k: r.get(k)
            for k in (
                "throughput_per_s",
                "p50_ms",
                "p99_ms",
                "certified_per_s",
                "cert_p50_ms",
                "cert_p99_ms",
                "cpu_s_per_proposal",
            )
        }
        for r in runs
    ]
    return report


@dataclass
class Cluster:
    """A cluster the harness measures: one the caller runs (`--dir`) or one it started
    (`--start`), which `close` stops and removes."""

    spec: ClusterSpec
    started: bool
    workdir: Path | None = None

    def close(self, keep: bool = False) -> None:
        if not self.started:
            return
        from quorumgate.ops.nodes import stop_nodes

        stop_nodes(self.spec)
        if self.workdir is not None and not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_temporary_cluster(nodes: int, ordering_only: bool, parent: Path | None) -> Cluster:
    """Init a cluster in a fresh temporary directory and start it (replicas only for
    ordering-only); on failure, stop what started and remove the directory."""
    from quorumgate.ops.nodes import start_cluster, start_nodes, stop_nodes, wait_serving
    from quorumgate.proto.clusterfile import init_cluster

    workdir = Path(tempfile.mkdtemp(prefix=f"qg-bench-{nodes}-", dir=parent))
    spec = init_cluster(workdir / "cluster", nodes)
    try:
        if ordering_only:
            procs = start_nodes(spec, list(range(nodes)), "replica")
            wait_serving(spec, list(range(nodes)), procs)
        else:
            start_cluster(spec, list(range(nodes)))
    except BaseException:
        stop_nodes(spec)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return Cluster(spec, True, workdir)


@contextlib.contextmanager
def open_cluster(
    directory: Path | None, start_nodes_count: int | None, ordering_only: bool, keep: bool = False
) -> Iterator[Cluster]:
    from quorumgate.proto.clusterfile import load_cluster

    if start_nodes_count is not None:
        cluster = start_temporary_cluster(start_nodes_count, ordering_only, None)
    else:
        assert directory is not None
        cluster = Cluster(load_cluster(directory), False)
    try:
        yield cluster
    finally:
        cluster.close(keep)


def check_serving(spec: ClusterSpec, full: bool) -> None:
    from quorumgate.ops.nodes import query_status, sidecar_status

    down = [i for i in range(spec.n) if not query_status(spec, i).alive]
    if len(down) > spec.f:
        raise BenchError(f"replicas {down} are not serving; start the cluster with `quorumgate up`")
    if full:
        missing = [i for i in range(spec.n) if sidecar_status(spec, i) is None]
        if len(missing) > spec.f:
            raise BenchError(
                f"sidecars {missing} are not serving: full mode needs f+1 of them "
                "(or use --ordering-only)"
            )


def agent_nonces(spec: ClusterSpec, options: RunOptions, agents: int) -> dict[str, int]:
    count = max(agents, AGENTS_PER_CLIENT_MIN * options.clients)
    if options.ordering_only:
        return fresh_agents(spec, count)
    return prepare_agent_pool(spec, count)


def run_bench(
    spec: ClusterSpec,
    seconds: float,
    inflight: int,
    clients: int,
    *,
    rate_per_s: float = 0.0,
    warmup_s: float = WARMUP_S_DEFAULT,
    ordering_only: bool = False,
    runs: int = 1,
    agents: int = AGENT_POOL_DEFAULT,
) -> dict[str, Any]:
    """Median report of `runs` runs of one load against a serving cluster."""
    options = RunOptions(seconds, warmup_s, inflight, rate_per_s, clients, ordering_only)
    check_serving(spec, not ordering_only)
    nonces = agent_nonces(spec, options, agents)
    reports = []
    guess = PRESIGN_RATE_GUESS_PER_S
    for _ in range(runs):
        report = run_once(spec, options, nonces, rate_guess_per_s=guess)
        guess = max(100.0, report["throughput_per_s"])
        reports.append(report)
    return median_report(reports)


def sweep_options(base: RunOptions, values: Sequence[float]) -> list[RunOptions]:
    """One RunOptions per sweep value: rates when `base` is open loop, else inflight."""
    if base.rate_per_s > 0:
        return [replace(base, rate_per_s=float(v)) for v in values]
    return [
        replace(base, inflight=max(1, int(v)), clients=min(base.clients, max(1, int(v))))
        for v in values
    ]


def machine_info() -> dict[str, Any]:
    """What the figures were measured on: CPU model, cores, memory, Python."""
    import platform

    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        mem_gib = round(int(first.split()[1]) / 1024 / 1024, 1)
    load = None
    with contextlib.suppress(OSError):
        load = os.getloadavg()[0]
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "load_average_1m_at_start": _r(load),
    }


def proposal_bytes(chain_id: str) -> int:
    """Serialized size of a bench proposal (the report states it)."""
    return len(LoadAgent.from_seed(chain_id, "size-probe").proposal(10**6)[0])


__all__ = [
    "BenchError",
    "BlockCertifier",
    "LoadLoop",
    "LoadShape",
    "RunOptions",
    "cpu_seconds",
    "rss_peak_mb",
    "run_bench",
    "run_once",
]
