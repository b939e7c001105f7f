"""Live clusters in tests: the package's controller (`quorumgate.ops.live.LiveCluster`)
and load generator (`quorumgate.ops.load.Load`) with what a test asserts on top.

Every wait is a loop with a deadline (`wait_until`) that fails with what it was waiting
for and the state it saw; nothing sleeps in the hope that a condition has become true.
A test's cluster must stop cleanly: a member that needs SIGKILL after SIGTERM fails it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from quorumgate.ops import live, load
from quorumgate.ops.live import DROPPED_METRIC, EQUIVOCATION_REASONS
from quorumgate.ops.nodes import sidecar_status
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.membership import is_record
from quorumgate.proto.tx import parse
from quorumgate.replica.storage import RANGE_BLOCKS_MAX, ReplicaStore
from quorumgate.replica.types import Block
from quorumgate.replica.wire import decode_block
from quorumgate.runtime.channels import Reader, sync_channel
from tests import polling

T = TypeVar("T")

# One wait on a live cluster (a height, a commit, a catch-up). Generous for a loaded
# 2-core CI machine running up to 7 replicas and the load generator.
WAIT_S = 45.0
POLL_S = 0.05
STREAM_TIMEOUT_S = 60.0
# SIGTERM, then SIGKILL if a process has not exited after this long.
STOP_GRACE_S = 8.0
# The mempool's nonce window (quorumgate.proto.limits.NONCE_WINDOW) refuses a nonce more
# than 1024 above an agent's low-water mark; an agent that never submits more than this
# can never be refused for running ahead of the commits.
AGENT_PROPOSALS_MAX = 1000
DB_FILES = ("replica.db", "replica.db-wal", "replica.db-shm")
DROPPED = DROPPED_METRIC


# ============================================================================ waiting


def wait_until(
    what: str,
    check: Callable[[], T | None],
    timeout_s: float = WAIT_S,
    describe: Callable[[], str] | None = None,
) -> T:
    """`tests.polling.wait_until` with this suite's deadline and step."""
    return polling.wait_until(what, check, timeout_s, POLL_S, describe)


# ============================================================================ chains


def tx_ids_of(blocks: Iterable[Block]) -> list[bytes]:
    """Transaction ids of every payload entry, in chain order (duplicates kept); an
    owner's reconfiguration record is the consensus core's, no transaction
    (docs/consensus/epochs.md)."""
    return [
        parse(tx, verify=False).tx_id
        for block in blocks
        for tx in block.payload
        if not is_record(tx)
    ]


def assert_each_committed_once(acked: Iterable[bytes], blocks: Sequence[Block]) -> None:
    """No transaction id appears twice in the chain, and each acknowledged one appears."""
    counts = Counter(tx_ids_of(blocks))
    twice: dict[str, list[int]] = {}
    for block in blocks:
        for tx_id in tx_ids_of([block]):
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


# ============================================================================ reads


def read_code(spec: ClusterSpec, index: int, kind: str, reader: Reader) -> grpc.StatusCode:
    """What member `index`'s replica answers `CommittedBlocks` (every argument value of
    every call), or its sidecar `Ledger` (every verdict), read as `reader`: members, the
    owner and auditors only (docs/security/reads-and-certificates.md)."""
    channel = sync_channel(spec, index, kind, reader=reader)
    try:
        if kind == "replica":
            blocks = cpb_grpc.ReplicaStub(channel).CommittedBlocks(
                cpb.BlocksRequest(from_height=1), timeout=live.RPC_TIMEOUT_S
            )
            next(iter(blocks))
        else:
            spb_grpc.SidecarStub(channel).Ledger(
                spb.LedgerRequest(from_height=1, limit=1), timeout=live.RPC_TIMEOUT_S
            )
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    finally:
        channel.close()
    return grpc.StatusCode.OK


# ============================================================================ the cluster


def wait_sidecars_settled(
    heights: Callable[[], dict[int, int]], homes: dict[int, ClusterSpec]
) -> dict[int, spb.SidecarStatusReply]:
    """Wait until each sidecar in `homes` (index -> the cluster file it is reached with)
    executed the highest height its replicas committed, both read afresh on every poll.
    A height read once can be passed: after a load stops the leader still commits the
    empty blocks that finish its last proposals' chain (docs/consensus/protocol.md, "An
    idle cluster goes quiet"), and a sidecar then never stands at the height read."""
    seen: dict[str, object] = {}

    def settled() -> dict[int, spb.SidecarStatusReply] | None:
        top = max(heights().values())
        statuses = {i: sidecar_status(home, i) for i, home in homes.items()}
        seen.update(top=top, executed={
            i: None if s is None else s.executed_height for i, s in statuses.items()
        })  # fmt: skip
        if all(s is not None and s.executed_height == top for s in statuses.values()):
            return statuses  # type: ignore[return-value]
        return None

    return wait_until(
        "every sidecar at its replicas' committed height",
        settled,
        describe=lambda: (
            f"replicas committed {seen.get('top')}, sidecars executed {seen.get('executed')}"
        ),
    )


class LiveCluster(live.LiveCluster):
    """The package's controller, with a test's deadlines, a test's strictness about
    stopping, and the assertions and waits tests make on a live cluster."""

    def __init__(self, spec: ClusterSpec) -> None:
        super().__init__(spec, ready_timeout_s=WAIT_S, stop_grace_s=STOP_GRACE_S)
        self._chains: dict[int, dict[int, Block]] = {}

    @property
    def procs(self) -> dict[int, subprocess.Popen[bytes]]:
        """The running replica processes, by member."""
        return {i: p for (kind, i), p in self.running.items() if kind == "replica"}

    # ------------------------------------------------------------------ processes

    def kill(self, index: int, sig: signal.Signals = signal.SIGKILL, kind: str = "replica") -> int:
        """Signal one member and wait until its process is gone; return its exit status.
        It must exit within STOP_GRACE_S."""
        forced = len(self.forced)
        code = super().kill(index, sig, kind)
        assert len(self.forced) == forced, (
            f"node {index} did not exit within {STOP_GRACE_S} s of {sig.name}"
        )
        return code

    def restart(self, index: int) -> None:
        """Start a stopped member again; its committed chain is read afresh afterwards."""
        self._chains.pop(index, None)
        super().restart(index)

    def wipe(self, index: int) -> None:
        """Delete a stopped member's database (and its WAL), and forget its chain."""
        assert index not in self.procs, f"node {index} must be stopped before a wipe"
        for name in DB_FILES:
            (self.spec.node_dir(index) / name).unlink(missing_ok=True)
        self._chains.pop(index, None)

    def stop_all(self) -> dict[str, int | None]:
        """SIGTERM every running sidecar, then every replica, and wait for each (SIGKILL
        past a bound); every replica must have exited cleanly."""
        codes = super().stop_all()
        stuck = {
            name: code
            for name, code in codes.items()
            if name.startswith("replica-") and code not in (0, -signal.SIGTERM)
        }
        assert not stuck, "nodes did not stop cleanly on SIGTERM: " + ", ".join(
            f"{name.removeprefix('replica-')}: {code}" for name, code in stuck.items()
        )
        return codes

    # ------------------------------------------------------------------ waits

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
                for tx_id in tx_ids_of([block]):
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


class Load(load.Load):
    """The package's load generator as tests drive it (`quorumgate.ops.load`, `STRICT`
    delivery): `agents` agents named after `name` each send `per_agent` proposals in
    batches of `batch`, paced at `rate_per_s` per agent if given, every `unary_every`-th
    batch one `Submit` at a time, to the live members of `targets`. Nothing valid may be
    refused and no batch given up (`assert_clean`)."""

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
        super().__init__(
            cluster,
            [cluster.agent(f"{name}-{k}") for k in range(agents)],
            delivery=load.STRICT,
            batch=batch,
            rate_per_s=None if rate_per_s is None else rate_per_s * agents,
            per_agent=per_agent,
            unary_every=unary_every,
            targets=targets,
        )

    def stop(self) -> None:
        self._stop.set()
        self.join()

    def join(self, timeout_s: float = WAIT_S * 2) -> int:
        running = super().join(timeout_s)
        assert not running, f"{running} load threads still running after {timeout_s:.0f} s"
        return running

    def wait_done(self, timeout_s: float = WAIT_S * 2) -> None:
        """Every agent has sent all its proposals."""
        self.join(timeout_s)
        assert not self.failures, f"load failures: {self.failures[:5]}"

    def wait_acked(self, count: int, timeout_s: float = WAIT_S) -> None:
        wait_until(
            f"{count} acknowledged proposals",
            lambda: self.acked_count >= count,
            timeout_s,
            lambda: (
                f"{self.acked_count} acked, {len(self.refused)} refused, "
                f"errors {self.transport_errors[-3:]}"
            ),
        )

    def drain(self, node: int, timeout_s: float = WAIT_S) -> None:
        """Wait until no batch is on its way to `node` (`avoid` it first)."""
        with self._lock:
            assert node in self._avoid, f"node {node} would keep receiving batches"
        wait_until(
            f"submissions to node {node} to finish", lambda: self.in_flight(node) == 0, timeout_s
        )

    def assert_clean(self) -> None:
        """Nothing valid was refused and no batch was given up."""
        assert not self.failures, f"load failures: {self.failures[:5]}"
        assert not self.refused, f"valid proposals refused, by reason: {dict(self.refusals())}"
