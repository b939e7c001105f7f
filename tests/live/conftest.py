"""Live clusters: real replica processes on loopback (issue 3, item 8).

`LiveCluster` wraps one cluster directory made by `quorumgate.proto.clusterfile.init_cluster`
and the processes `quorumgate.ops.nodes.start_nodes` started for it (loopback, the free ports
`init` picked). It reads Status and `/metrics`, follows `CommittedBlocks`, kills and
restarts members, and audits each replica's SQLite store once its process is gone. `Load`
submits signed ~256-byte proposals from `LoadAgent`s in background threads, streamed or unary.

Every wait is a loop with a deadline (`wait_until`) that fails with what it was waiting
for and the state it saw; nothing sleeps in the hope that a condition has become true. The
`live_cluster` fixture's finalizer stops every process it started — SIGTERM, then SIGKILL
after a bound — whether the test passed or failed, and prints the nodes' log tails when it
failed.

These tests start real processes and take minutes; deselect them with `-m "not live"`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from quorumgate.ops.loadgen import BENCH_TOOL, LoadAgent
from quorumgate.ops.nodes import log_tail, start_nodes, wait_serving, wait_sidecars_serving
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import consensus_pb2_grpc as pb_grpc
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from quorumgate.proto.tx import parse
from quorumgate.replica.storage import RANGE_BLOCKS_MAX, ReplicaStore
from quorumgate.replica.types import Block
from quorumgate.replica.wire import decode_block
from quorumgate.runtime.channels import sync_channel
from quorumgate.sdk.owner import OwnerSession, agent_ops, owner_reader, tool_op
from tests import polling

T = TypeVar("T")

# One wait on a live cluster (a height, a commit, a catch-up). Generous for a loaded
# 2-core CI machine running up to 7 replicas and the load generator.
WAIT_S = 45.0
POLL_S = 0.05
RPC_TIMEOUT_S = 5.0
STREAM_TIMEOUT_S = 60.0
METRICS_TIMEOUT_S = 5.0
# SIGTERM, then SIGKILL if a process has not exited after this long.
STOP_GRACE_S = 8.0
# Submitting one batch: attempts on other live replicas when one is unreachable.
DELIVERY_ATTEMPTS_MAX = 8
# The mempool's nonce window (quorumgate.proto.limits.NONCE_WINDOW) refuses a nonce more
# than 1024 above an agent's low-water mark; an agent that never submits more than this
# can never be refused for running ahead of the commits.
AGENT_PROPOSALS_MAX = 1000
TRANSPORT_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
)
DB_FILES = ("replica.db", "replica.db-wal", "replica.db-shm")

# Client channels: large messages (a block may carry up to 4 MiB of payload) and quick
# redials, since the tests kill and restart replicas under the same address.
CLIENT_OPTIONS = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "live: starts real replica processes (minutes)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.live)


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember whether a test's body failed, so its fixture can print the logs."""
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


# ============================================================================ waiting


def wait_until(
    what: str,
    check: Callable[[], T | None],
    timeout_s: float = WAIT_S,
    describe: Callable[[], str] | None = None,
) -> T:
    """`tests.polling.wait_until` with this suite's deadline and step."""
    return polling.wait_until(what, check, timeout_s, POLL_S, describe)


# ============================================================================ metrics


@dataclass(frozen=True)
class Metrics:
    """One scrape of a replica's `/metrics`: sample name and labels -> value."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    @staticmethod
    def parse(text: str) -> Metrics:
        samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
        return Metrics(samples)

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 for a labelled counter that was never incremented (the
        client library creates a label set only at its first increment)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def has(self, name: str) -> bool:
        return any(sample_name == name for sample_name, _ in self.samples)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        return {
            dict(labels)[label]: value
            for (sample_name, labels), value in self.samples.items()
            if sample_name == name and label in dict(labels)
        }


DROPPED = "qg_replica_messages_dropped_total"
EQUIVOCATION_REASONS = ("equivocating_vote", "equivocating_timeout", "equivocating_proposal")


# ============================================================================ chains


def tx_ids_of(blocks: Iterable[Block]) -> list[bytes]:
    """Transaction ids of every payload entry, in chain order (duplicates kept)."""
    return [parse(tx, verify=False).tx_id for block in blocks for tx in block.payload]


def assert_each_committed_once(acked: Iterable[bytes], blocks: Sequence[Block]) -> None:
    """No transaction id appears twice in the chain, and each acknowledged one appears."""
    counts = Counter(tx_ids_of(blocks))
    twice: dict[str, list[int]] = {}
    for block in blocks:
        for tx in block.payload:
            tx_id = parse(tx, verify=False).tx_id
            if counts[tx_id] > 1:
                twice.setdefault(tx_id.hex()[:16], []).append(block.height)
    by_height = {block.height: block for block in blocks}
    proposers = {
        h: (by_height[h].view, by_height[h].proposer) for heights in twice.values() for h in heights
    }
    assert not twice, (
        f"{len(twice)} transactions committed more than once, "
        f"e.g. (id prefix -> heights): {dict(list(twice.items())[:4])}; "
        f"(view, proposer) of those heights: {proposers}"
    )
    acked = set(acked)
    missing = acked - set(counts)
    assert not missing, (
        f"{len(missing)} of {len(acked)} acknowledged proposals never committed "
        f"(chain up to height {blocks[-1].height if blocks else 0} holds {len(counts)} txs)"
    )


# ============================================================================ the cluster


class LiveCluster:
    """One cluster directory and the replica processes this test started for it."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.started: list[subprocess.Popen[bytes]] = []
        self._channels: dict[int, grpc.Channel] = {}
        self._chains: dict[int, dict[int, Block]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def create(directory: Path, n: int) -> LiveCluster:
        return LiveCluster(init_cluster(directory, n))

    @property
    def n(self) -> int:
        return self.spec.n

    @property
    def chain_id(self) -> str:
        return self.spec.chain_id

    # ------------------------------------------------------------------ processes

    def start(self, indexes: Sequence[int] | None = None) -> None:
        """Start members (all by default) and return once each answers Status."""
        wanted = list(range(self.n)) if indexes is None else list(indexes)
        procs = start_nodes(self.spec, wanted)
        with self._lock:
            self.procs.update(procs)
            self.started.extend(procs.values())
        wait_serving(self.spec, wanted, procs, timeout_s=WAIT_S)

    def start_sidecars(self) -> None:
        """Start every member's execution sidecar beside its replica, as `quorumgate up`
        does, and return once each answers. (Only the agreement test runs them: the rest
        test the replicas' own contract, which must hold without them.)"""
        wanted = list(range(self.n))
        procs = start_nodes(self.spec, wanted, "sidecar")
        with self._lock:
            self.started.extend(procs.values())
        wait_sidecars_serving(self.spec, wanted, procs, timeout_s=WAIT_S)

    def register(self, agents: Iterable[LoadAgent]) -> None:
        """Register agents with the cluster's owner key, each allowed the load tool (with
        sidecars running, an unregistered agent is refused `unknown_signer`)."""
        ops = [tool_op(BENCH_TOOL)]
        for agent in agents:
            ops += agent_ops(f"agent-{agent.public_key.hex()[:16]}", agent.public_key, [BENCH_TOOL])
        OwnerSession(self.spec).submit(ops)

    def alive(self) -> list[int]:
        with self._lock:
            return sorted(i for i, p in self.procs.items() if p.poll() is None)

    def pid(self, index: int) -> int:
        return self.procs[index].pid

    def kill(self, index: int, sig: signal.Signals = signal.SIGKILL) -> int:
        """Signal one member and wait until its process is gone; return its exit status."""
        with self._lock:
            proc = self.procs.pop(index)
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_GRACE_S)
            raise AssertionError(
                f"node {index} did not exit within {STOP_GRACE_S} s of {sig.name}"
            ) from None

    def restart(self, index: int) -> None:
        """Start a stopped member again; its committed chain is read afresh afterwards."""
        self._chains.pop(index, None)
        self.start([index])

    def wipe(self, index: int) -> None:
        """Delete a stopped member's database (and its WAL), and forget its chain."""
        assert index not in self.procs, f"node {index} must be stopped before a wipe"
        for name in DB_FILES:
            (self.spec.node_dir(index) / name).unlink(missing_ok=True)
        self._chains.pop(index, None)

    def stop_all(self) -> None:
        """SIGTERM every running member (and any sidecar) at once, then wait for each
        (SIGKILL past a bound); every replica must have exited cleanly."""
        with self._lock:
            procs, self.procs = dict(self.procs), {}
            others = [p for p in self.started if p not in procs.values()]
        for proc in [*procs.values(), *others]:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        _reap([*procs.values(), *others])
        stuck = [i for i, p in procs.items() if p.returncode not in (0, -signal.SIGTERM)]
        assert not stuck, f"nodes {stuck} did not stop cleanly on SIGTERM: " + ", ".join(
            f"{i}: {procs[i].returncode}" for i in stuck
        )

    def close(self) -> None:
        """The finalizer: no process this cluster started survives it."""
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        _reap(self.started)
        # Anything else still running for this directory (started through the CLI, or
        # before its Popen was recorded) goes too.
        for pid in cluster_pids(self.spec.directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def log_tails(self, lines: int = 20) -> str:
        return "\n".join(
            f"--- node {i} ---\n{log_tail(self.spec, i, lines)}" for i in range(self.n)
        )

    # ------------------------------------------------------------------ gRPC

    def channel(self, index: int) -> grpc.Channel:
        with self._lock:
            if index not in self._channels:
                # the owner reads (CommittedBlocks answers only owner, members, auditors)
                self._channels[index] = sync_channel(
                    self.spec, index, reader=owner_reader(self.spec)
                )
            return self._channels[index]

    def replica(self, index: int) -> cpb_grpc.ReplicaStub:
        return cpb_grpc.ReplicaStub(self.channel(index))

    def peer(self, index: int) -> pb_grpc.PeerStub:
        return pb_grpc.PeerStub(self.channel(index))

    def status(self, index: int) -> cpb.StatusReply:
        reply: cpb.StatusReply = self.replica(index).Status(
            cpb.StatusRequest(), timeout=RPC_TIMEOUT_S
        )
        return reply

    def statuses(self, indexes: Iterable[int] | None = None) -> dict[int, cpb.StatusReply]:
        return {i: self.status(i) for i in (self.alive() if indexes is None else indexes)}

    def heights(self, indexes: Iterable[int] | None = None) -> dict[int, int]:
        return {i: st.committed_height for i, st in self.statuses(indexes).items()}

    def describe(self, indexes: Iterable[int] | None = None) -> str:
        parts = []
        for i in self.alive() if indexes is None else indexes:
            try:
                st = self.status(i)
            except grpc.RpcError as err:
                parts.append(f"node {i}: {err.code().name}")
                continue
            parts.append(
                f"node {i}: height {st.committed_height} view {st.view} leader {st.leader} "
                f"peers {list(st.peers_connected)} mempool {st.mempool_txs} "
                f"sync target {st.sync_target_height}"
            )
        return "; ".join(parts)

    def wait_height(
        self, height: int, indexes: Iterable[int] | None = None, timeout_s: float = WAIT_S
    ) -> dict[int, int]:
        """Wait until each listed member (the live ones by default) committed `height`."""
        nodes = self.alive() if indexes is None else list(indexes)

        def reached() -> dict[int, int] | None:
            heights = self.heights(nodes)
            return heights if min(heights.values()) >= height else None

        return wait_until(
            f"nodes {nodes} to commit height {height}",
            reached,
            timeout_s,
            lambda: self.describe(nodes),
        )

    def wait_progress(
        self, heights: int, indexes: Iterable[int] | None = None, timeout_s: float = WAIT_S
    ) -> dict[int, int]:
        """Wait until the listed members commit `heights` more blocks than the highest now."""
        nodes = self.alive() if indexes is None else list(indexes)
        return self.wait_height(max(self.heights(nodes).values()) + heights, nodes, timeout_s)

    # ------------------------------------------------------------------ metrics

    def metrics(self, index: int) -> Metrics:
        m = self.spec.member(index)
        url = f"http://{m.host}:{m.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as response:
            return Metrics.parse(response.read().decode())

    def assert_no_equivocation_seen(self, indexes: Iterable[int] | None = None) -> None:
        """No live replica counted an equivocating vote, timeout or proposal."""
        seen = {}
        for i in self.alive() if indexes is None else indexes:
            metrics = self.metrics(i)
            assert metrics.has("qg_replica_committed_height"), f"node {i}: no metrics"
            for reason in EQUIVOCATION_REASONS:
                count = metrics.value(DROPPED, reason=reason)
                if count:
                    seen[(i, reason)] = count
        assert not seen, f"equivocations counted (node, reason) -> count: {seen}"

    # ------------------------------------------------------------------ the committed chain

    def committed_blocks(
        self, index: int, from_height: int, to_height: int, timeout_s: float = WAIT_S
    ) -> list[cpb.CommittedBlock]:
        """`CommittedBlocks` from `from_height` until `to_height` (waiting for it to commit),
        then cancel the stream."""
        out: list[cpb.CommittedBlock] = []
        if to_height < from_height:
            return out
        call = self.replica(index).CommittedBlocks(
            cpb.BlocksRequest(from_height=from_height), timeout=timeout_s
        )
        try:
            for reply in call:
                expected = from_height + len(out)
                assert reply.height == expected, (
                    f"node {index}: CommittedBlocks sent height {reply.height}, expected {expected}"
                )
                out.append(reply)
                if reply.height >= to_height:
                    break
        except grpc.RpcError as err:
            raise AssertionError(
                f"node {index}: CommittedBlocks from {from_height} ended with "
                f"{err.code().name} after {len(out)} blocks, before height {to_height}"
            ) from None
        finally:
            call.cancel()
        return out

    def chain(self, index: int, to_height: int, timeout_s: float = WAIT_S) -> list[Block]:
        """Member `index`'s committed blocks 1..to_height, each decoded (its hash recomputed
        and compared with the hash the replica sent) and linked to its parent."""
        cache = self._chains.setdefault(index, {})
        start = len(cache) + 1
        for reply in self.committed_blocks(index, start, to_height, timeout_s):
            block = decode_block(self.chain_id, reply.block.SerializeToString())
            assert block.hash == reply.hash, (
                f"node {index}: height {reply.height} sent hash {reply.hash.hex()[:16]} "
                f"but its block hashes to {block.hash.hex()[:16]}"
            )
            assert block.height == reply.height, f"node {index}: height {reply.height} mislabelled"
            parent = cache.get(block.height - 1)
            if parent is not None:
                assert block.parent_hash == parent.hash, (
                    f"node {index}: block at height {block.height} does not extend "
                    f"the block at height {block.height - 1}"
                )
            cache[block.height] = block
        return [cache[h] for h in range(1, to_height + 1)]

    def hashes(self, index: int, to_height: int) -> dict[int, bytes]:
        """Height -> block hash of member `index`'s committed chain, 1..to_height."""
        return {block.height: block.hash for block in self.chain(index, to_height)}

    def assert_same_chain(self, indexes: Sequence[int], to_height: int) -> list[Block]:
        """Every listed member committed the same block hash at every height 1..to_height;
        return that chain."""
        reference = self.chain(indexes[0], to_height)
        for i in indexes[1:]:
            other = self.chain(i, to_height)
            for mine, theirs in zip(reference, other, strict=True):
                assert mine.hash == theirs.hash, (
                    f"nodes {indexes[0]} and {i} committed different blocks at height "
                    f"{mine.height}: {mine.hash.hex()[:16]} (view {mine.view}) vs "
                    f"{theirs.hash.hex()[:16]} (view {theirs.view})"
                )
        return reference

    def wait_committed(
        self, tx_ids: Iterable[bytes], index: int, timeout_s: float = WAIT_S
    ) -> dict[bytes, int]:
        """Wait until member `index` committed every id; return id -> height."""
        wanted = set(tx_ids)
        found: dict[bytes, int] = {}
        scanned = 0

        def scan() -> bool:
            nonlocal scanned
            top = self.status(index).committed_height
            for block in self.chain(index, top)[scanned:]:
                for tx in block.payload:
                    tx_id = parse(tx, verify=False).tx_id
                    if tx_id in wanted:
                        found.setdefault(tx_id, block.height)
                scanned = block.height
            return len(found) == len(wanted)

        wait_until(
            f"node {index} to commit {len(wanted)} proposals",
            scan,
            timeout_s,
            lambda: f"{len(wanted) - len(found)} missing; {self.describe()}",
        )
        return found

    # ------------------------------------------------------------------ submitting

    def submit(self, index: int, tx: bytes) -> cpb.SubmitReply:
        reply: cpb.SubmitReply = self.replica(index).Submit(
            cpb.SubmitRequest(tx=tx), timeout=RPC_TIMEOUT_S
        )
        return reply

    def submit_stream(
        self, index: int, txs: Sequence[bytes], batch: int | None = None
    ) -> list[cpb.SubmitReply]:
        """`txs` on one SubmitStream, `batch` per message (all in one by default); each
        reply batch must answer its request batch, request ids in order."""
        requests = [cpb.SubmitRequest(tx=tx, request_id=k) for k, tx in enumerate(txs, 1)]
        size = batch or max(1, len(requests))
        batches = [
            cpb.SubmitBatch(requests=requests[i : i + size]) for i in range(0, len(requests), size)
        ]
        reply_batches = list(
            self.replica(index).SubmitStream(iter(batches), timeout=STREAM_TIMEOUT_S)
        )
        assert [len(r.replies) for r in reply_batches] == [len(b.requests) for b in batches], (
            f"node {index}: SubmitStream reply batches do not match the request batches"
        )
        replies = [reply for r in reply_batches for reply in r.replies]
        assert [r.request_id for r in replies] == list(range(1, len(txs) + 1)), (
            f"node {index}: SubmitStream replies out of order or missing"
        )
        return replies

    def agent(self, name: str) -> LoadAgent:
        return LoadAgent.from_seed(self.chain_id, name)

    # ------------------------------------------------------------------ stores (stopped)

    def read_store(self, index: int) -> StoreAudit:
        """What member `index`'s database holds; its process must be stopped (the store
        holds its file with locking_mode=EXCLUSIVE)."""
        assert index not in self.procs, f"node {index} is running; stop it before reading"
        return asyncio.run(_read_store(self.spec.node_dir(index) / "replica.db", self.chain_id))


@dataclass(frozen=True)
class StoreAudit:
    signed_votes: dict[int, bytes]
    signed_timeouts: dict[int, int]
    committed: list[Block]


async def _read_store(path: Path, chain_id: str) -> StoreAudit:
    store = await ReplicaStore.open(path, chain_id)
    try:
        votes = await store.signed_votes()
        timeouts = await store.signed_timeouts()
        committed: list[Block] = []
        top = store.committed_height
        for start in range(1, top + 1, RANGE_BLOCKS_MAX):
            committed += await store.committed_range(start, min(top, start + RANGE_BLOCKS_MAX - 1))
    finally:
        await store.close()
    return StoreAudit(votes, timeouts, committed)


def _reap(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """Wait for processes already signalled; SIGKILL whatever outlives STOP_GRACE_S."""
    procs = list(procs)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_GRACE_S)


# ============================================================================ load


class Load:
    """Agents submitting signed proposals from background threads.

    Each agent sends `per_agent` proposals in batches of `batch`, streamed through
    `SubmitStream` (every `unary_every`-th batch one `Submit` at a time instead), to the
    live members of `targets` not passed to `avoid`, batch after batch in turn, paced at
    `rate_per_s` per agent if given.
    A batch cut off by an unreachable replica goes again, unanswered proposals only, to
    another member (identical bytes: the same transaction). `acked` maps each acknowledged
    proposal id to the member that acknowledged it; refusals and transport errors are kept
    for the test to judge.
    """

    def __init__(
        self,
        cluster: LiveCluster,
        name: str,
        *,
        agents: int,
        per_agent: int,
        batch: int = 50,
        rate_per_s: float | None = None,
        unary_every: int = 0,
        targets: Sequence[int] | None = None,
    ) -> None:
        assert per_agent <= AGENT_PROPOSALS_MAX, "more than the nonce window allows in flight"
        self.cluster = cluster
        self.agents = [cluster.agent(f"{name}-{k}") for k in range(agents)]
        self.per_agent = per_agent
        self.batch = batch
        self.rate_per_s = rate_per_s
        self.unary_every = unary_every
        self.targets = list(range(cluster.n)) if targets is None else list(targets)
        self._avoid: set[int] = set()
        self.acked: dict[bytes, int] = {}
        self.refused: list[tuple[int, str]] = []
        self.transport_errors: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._turns = itertools.count()
        self._in_flight: Counter[int] = Counter()

    def start(self) -> Load:
        for agent in self.agents:
            thread = threading.Thread(target=self._run, args=(agent,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.join()

    def join(self, timeout_s: float = WAIT_S * 2) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        running = sum(t.is_alive() for t in self._threads)
        assert not running, f"{running} load threads still running after {timeout_s:.0f} s"

    def wait_done(self, timeout_s: float = WAIT_S * 2) -> None:
        """Every agent has sent all its proposals."""
        self.join(timeout_s)
        assert not self.failures, f"load failures: {self.failures[:5]}"

    @property
    def sent(self) -> int:
        with self._lock:
            return len(self.acked) + len(self.refused)

    def wait_acked(self, count: int, timeout_s: float = WAIT_S) -> None:
        wait_until(
            f"{count} acknowledged proposals",
            lambda: len(self.acked) >= count,
            timeout_s,
            lambda: (
                f"{len(self.acked)} acked, {len(self.refused)} refused, "
                f"errors {self.transport_errors[-3:]}"
            ),
        )

    def avoid(self, nodes: Iterable[int]) -> None:
        """Send no further batch to these members (and again to all others)."""
        with self._lock:
            self._avoid = set(nodes)

    def drain(self, node: int, timeout_s: float = WAIT_S) -> None:
        """Wait until no batch is on its way to `node` (`avoid` it first)."""
        with self._lock:
            assert node in self._avoid, f"node {node} would keep receiving batches"

        def idle() -> bool:
            with self._lock:
                return self._in_flight[node] == 0

        wait_until(f"submissions to node {node} to finish", idle, timeout_s)

    def assert_clean(self) -> None:
        """Nothing valid was refused and no batch was given up."""
        assert not self.failures, f"load failures: {self.failures[:5]}"
        reasons = Counter(reason for _, reason in self.refused)
        assert not self.refused, f"valid proposals refused, by reason: {dict(reasons)}"

    def _targets(self) -> list[int]:
        alive = set(self.cluster.alive())
        return [i for i in self.targets if i in alive and i not in self._avoid]

    def _run(self, agent: LoadAgent) -> None:
        try:
            self._submit_all(agent)
        except BaseException as err:  # a thread's exception would otherwise go unseen
            with self._lock:
                self.failures.append(f"load thread crashed: {err!r}")

    def _submit_all(self, agent: LoadAgent) -> None:
        started = time.monotonic()
        sent = 0
        batches = 0
        while sent < self.per_agent and not self._stop.is_set():
            size = min(self.batch, self.per_agent - sent)
            txs = [agent.proposal() for _ in range(size)]
            unary = bool(self.unary_every) and batches % self.unary_every == self.unary_every - 1
            with self._lock:
                turn = next(self._turns)
            self._deliver(turn, txs, unary)
            sent += size
            batches += 1
            if self.rate_per_s is not None:
                # Pacing the offered load, not waiting for a condition.
                self._stop.wait(max(0.0, started + sent / self.rate_per_s - time.monotonic()))

    def _deliver(self, turn: int, txs: list[tuple[bytes, bytes]], unary: bool) -> None:
        remaining = txs
        for attempt in range(DELIVERY_ATTEMPTS_MAX):
            with self._lock:
                targets = self._targets()
                node = targets[(turn + attempt) % len(targets)] if targets else None
                if node is not None:
                    self._in_flight[node] += 1
            if node is None:
                self._stop.wait(0.2)  # back-off between attempts
                continue
            try:
                if unary:
                    while remaining:
                        self._one(node, *remaining[0])
                        remaining = remaining[1:]
                else:
                    requests = [
                        cpb.SubmitRequest(tx=tx, request_id=j)
                        for j, (tx, _) in enumerate(remaining, 1)
                    ]
                    call = self.cluster.replica(node).SubmitStream(
                        iter([cpb.SubmitBatch(requests=requests)]), timeout=STREAM_TIMEOUT_S
                    )
                    answered = 0
                    for reply in (r for batch in call for r in batch.replies):
                        answered += 1
                        assert reply.request_id == answered, (
                            f"node {node}: SubmitStream reply {reply.request_id} in place "
                            f"of {answered}"
                        )
                        tx_id = remaining[answered - 1][1]
                        self._record(node, tx_id, reply.accepted, reply.reason, reply.proposal_id)
                    remaining = remaining[answered:]
                if not remaining:
                    return
            except grpc.RpcError as err:
                with self._lock:
                    self.transport_errors.append(f"node {node}: {err.code().name}")
                if err.code() not in TRANSPORT_CODES:
                    self.failures.append(f"node {node}: {err.code().name} {err.details()}")
                    return
                self._stop.wait(0.1)  # back-off before the next member
            finally:
                with self._lock:
                    self._in_flight[node] -= 1
        self.failures.append(f"{len(remaining)} proposals undelivered after {attempt + 1} tries")

    def _one(self, node: int, tx: bytes, tx_id: bytes) -> None:
        try:
            reply = self.cluster.replica(node).Submit(
                cpb.SubmitRequest(tx=tx), timeout=RPC_TIMEOUT_S
            )
        except grpc.RpcError as err:
            if err.code() in TRANSPORT_CODES:
                raise
            reason = dict(err.trailing_metadata() or ()).get("qg-reason", err.code().name)
            self._record(node, tx_id, False, str(reason), b"")
            return
        self._record(node, tx_id, reply.accepted, reply.reason, reply.proposal_id)

    def _record(
        self, node: int, tx_id: bytes, accepted: bool, reason: str, proposal_id: bytes
    ) -> None:
        with self._lock:
            if accepted:
                if proposal_id != tx_id:
                    self.failures.append(
                        f"node {node}: proposal id {proposal_id.hex()[:16]} is not the tx id"
                    )
                self.acked[tx_id] = node
            else:
                self.refused.append((node, reason))


# ============================================================================ fixtures


@pytest.fixture
def live_cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., LiveCluster]]:
    """`live_cluster(n)` makes a cluster of n members under tmp_path and starts it
    (`start=False` to start it yourself); every process is stopped at teardown."""
    clusters: list[LiveCluster] = []

    def make(n: int, *, start: bool = True, name: str = "") -> LiveCluster:
        cluster = LiveCluster.create(tmp_path / (name or f"cluster-{len(clusters)}"), n)
        clusters.append(cluster)
        if start:
            cluster.start()
        return cluster

    try:
        yield make
    finally:
        failed = request.node.stash.get(_FAILED, False)
        for cluster in clusters:
            if failed:
                print(f"\n=== {cluster.spec.directory} at failure: {cluster.describe()}")
                print(cluster.log_tails())
            cluster.close()


def proc_cmdlines() -> dict[int, list[str]]:
    """Every process's command line (pid -> argv), from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
                out[int(entry)] = [p.decode(errors="replace") for p in raw.split(b"\0") if p]
    return out


SERVER_MODULES = ("quorumgate.replica.node", "quorumgate.sidecar.node")


def cluster_pids(directory: Path, modules: Sequence[str] = SERVER_MODULES) -> list[int]:
    """Pids of the server processes (replicas and sidecars by default) running for this
    cluster directory, whoever started them."""
    want = str(directory.resolve())
    return sorted(
        pid
        for pid, argv in proc_cmdlines().items()
        if any(module in argv for module in modules) and "--dir" in argv and want in argv
    )
