"""`quorumgate drill NAME`: recovery drills against a live cluster under load, ending in a
report a machine can check (issue 7, items 2-4; DESIGN §5).

A drill starts every replica and sidecar of the cluster in `--dir` (made with `init` if
there is none), registers a tool and fresh agents with the owner key, and keeps an
open-loop load of signed ~256-byte proposals flowing into the replicas from background
threads, recording the id of every proposal a replica acknowledges. One proposal in
`DENY_EVERY` names an `http://` target, which the tool refuses, so the sidecars also write
rejection artifacts. While the load runs the drill injects its fault, again and again
until `--seconds` have passed (at least `FAULT_CYCLES_MIN[drill]` times):

- `leader-kill`: SIGKILL the replica leading the current view; wait until the survivors
  commit again; restart it; wait until it is back at the cluster's height.
- `wipe-replica`: stop one member (replica and sidecar), drop its replica's blocks with
  `ReplicaStore.wipe_blocks()` (its safety record and signed-vote audit stay), delete its
  sidecar's store, restart the replica (it fetches the chain from its peers from height 0).
  Even cycles rebuild the sidecar's store with `quorumgate.sidecar.replay.replay` (every certificate
  checked) before starting it; odd ones start the sidecar at once and let it re-execute
  from height 1. Either way the rebuilt store must equal, byte for byte, what it held.
- `full-restart`: stop every replica and sidecar at once (SIGKILL on even cycles, SIGTERM
  on odd ones) and start them all again.
- `sidecar-crash`: SIGKILL a sidecar while it has committed blocks left to execute and
  restart it: it resumes after the last height it recorded, none twice, none skipped.
- `stale-restore`: copy one replica's database files while it is stopped, restart it and
  let it vote under load, stop f other members so that the cluster cannot leave a view
  without it, SIGKILL it while it leads the current view, put the old copy back, declare
  the restore (docs/consensus/fencing.md) and restart it at once, in the views it signed
  in and forgot, then the f others (a restore fences only once 2f+1 others answered):
  safety Rule 6 (fencing, replica/safety.py) must keep it from signing anything twice.

Then the load stops and the drill settles: it waits until every acknowledged proposal is
committed, offering again (the same signed bytes, as a client does when no certificate
comes) any the chain does not show after `REOFFER_AFTER_HEIGHTS` more heights; a replica
taking such an offer as new means the cluster had lost an acknowledged proposal
(`redelivered`). Then, each with a bounded deadline, it checks:

- every replica and every sidecar reaches the replicas' committed height T;
- every replica streams the same block hash at every height 1..T (`CommittedBlocks`, each
  block decoded and its hash recomputed);
- every acknowledged proposal is in exactly one committed block, has exactly one verdict
  in the ledger, and a certificate the client SDK verified (`await_certificate`: f+1
  agreeing receipts, `quorumgate.sidecar.receipts.verify_certificate`) at the height it committed,
  with the verdict its target calls for;
- every replica process's equivocation counters (`qg_replica_messages_dropped_total
  {reason=equivocating_vote|timeout|proposal}`) are 0, read before each kill and at the end;
- no sidecar raised its divergence alarm; and once the cluster is stopped, every sidecar's
  store has the same state root at T, the same ledger head at T (its hash chain verifying)
  and the same rejection artifacts up to T;
- across the replicas' signed-vote audit tables no view has votes for two blocks, and no
  vote a stale-restored replica signed after its restore contradicts one it forgot;
- every fault recovered within `RECOVERY_TIMEOUT_S`.

The report (`DrillReport.as_dict()`, printed by `--json`) holds the figures, one entry per
fault, and one entry per check (`name`, `ok`, `detail`, which names the node, height and
key where a check failed); `ok` is their conjunction and the command exits 1 unless it
holds. `recovery_s` is the time from the last fault until the faulted member was back at
the cluster's height (for `full-restart`: until 2f+1 replicas committed again), polled
every `POLL_S`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from nacl.signing import SigningKey

from quorumgate.ops.loadgen import BENCH_TOOL, TX_BYTES_TARGET, LoadAgent
from quorumgate.ops.nodes import (
    OpsError,
    log_tail,
    running_pid,
    sidecar_status,
    start_nodes,
    wait_serving,
    wait_sidecars_serving,
)
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.clusterfile import (
    CLUSTER_FILE,
    OWNER_KEY_FILE,
    ClusterFileError,
    ClusterSpec,
    init_cluster,
    load_cluster,
    read_seed,
)
from quorumgate.proto.limits import QUOTA_PROPOSALS_MAX_DEFAULT, QUOTA_WINDOW_MS_DEFAULT
from quorumgate.proto.model import Argument
from quorumgate.proto.model import Proposal as CallProposal
from quorumgate.proto.tx import build, parse, tx_id
from quorumgate.replica.node import RESTORE_MARKER_FILE
from quorumgate.replica.storage import ReplicaStore, StorageError
from quorumgate.replica.types import Block
from quorumgate.replica.wire import SUBMIT_BATCH_TXS_MAX, decode_block
from quorumgate.runtime.channels import sync_channel
from quorumgate.runtime.links import GRPC_MESSAGE_BYTES_MAX
from quorumgate.sdk.client import Client, QuorumGateError
from quorumgate.sdk.owner import OwnerError, OwnerSession, agent_ops, owner_reader, tool_op
from quorumgate.sdk.owner import next_nonce as owner_next_nonce
from quorumgate.sdk.polling import poll_for
from quorumgate.sidecar.ledger import GENESIS_PREV_HASH
from quorumgate.sidecar.replay import ReplayError, ReplayReport, replay
from quorumgate.sidecar.store import LEDGER_PAGE_ROWS_MAX, SidecarStore, SidecarStoreError

T = TypeVar("T")
V = TypeVar("V")

DRILLS = (
    "leader-kill",
    "wipe-replica",
    "full-restart",
    "sidecar-crash",
    "stale-restore",
    "byzantine",
)
# Faults a drill injects however short `--seconds` is: enough to repeat what repeats,
# and both rebuild paths of `wipe-replica`.
FAULT_CYCLES_MIN = {
    "leader-kill": 2,
    "wipe-replica": 2,
    "full-restart": 1,
    "sidecar-crash": 2,
    "stale-restore": 1,
    "byzantine": 4,  # each attack of BYZANTINE_CYCLES once
}
FAULT_CYCLES_MAX = 64
SECONDS_DEFAULT = 20.0
SECONDS_MIN = 1.0

# ---------------------------------------------------------------------------- limits

POLL_S = 0.05
STATUS_TIMEOUT_S = 1.0
STREAM_TIMEOUT_S = 60.0
STREAM_RETRIES_MAX = 5
METRICS_TIMEOUT_S = 3.0
READY_TIMEOUT_S = 45.0  # a started process answering
RECOVERY_TIMEOUT_S = 120.0  # a faulted member back at the cluster's height (see stale-restore)
RESUME_TIMEOUT_S = 45.0  # commits resuming after a fault
SETTLE_TIMEOUT_S = 90.0  # every acknowledged proposal committed once the load stopped
CATCH_UP_TIMEOUT_S = 60.0  # every replica and sidecar at the final height
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL
LEADER_WAIT_S = 10.0  # the victim leading the current view
LEADER_POLL_S = 0.005  # a view lasts tens of milliseconds under load
LAG_WAIT_S = 2.0  # a sidecar with committed blocks left to execute
WARMUP_ACKS_MIN = 20  # acknowledged proposals before the first fault
WARMUP_HEIGHTS = 3  # heights committed before the first fault
VOTING_HEIGHTS = 8  # heights a stale-restore victim commits (and votes in) before its kill
ATTACK_HEIGHTS = 5  # heights the honest members commit under each attack
# The byzantine drill's cycles: the attacks its member runs (quorumgate.ops.byzantine) and
# what the honest members do meanwhile — commit on their own ("commit"), restart one of
# them into forged hello replies ("restart"), or stop one, commit without it (the
# Byzantine member votes in this cycle) and let it catch up from peers that include the
# poisoner ("catch-up").
BYZANTINE_CYCLES = (
    ("poison-sync", ("poison-sync",), "catch-up"),
    ("forged-hello", ("forged-hello", "silent"), "restart"),
    ("oversized-sync", ("oversized-sync", "silent"), "commit"),
    ("spoofed", ("spoofed", "silent"), "commit"),
)
BYZANTINE_MODULE = "quorumgate.ops.byzantine"

# The load: batches of BATCH_TXS, paced per sender thread.
RATE_PER_S_DEFAULT = {4: 50.0, 7: 30.0}
RATE_PER_S_OTHER = 30.0
BATCH_TXS = 10
SENDER_THREADS = 2
DENY_EVERY = 10
# The engine's quota (DESIGN §4.7) allows QUOTA_PROPOSALS_MAX_DEFAULT proposals per agent
# per window of block time; a drill keeps each agent at three quarters of that, so that no
# verdict of a drill is a quota denial.
AGENT_RATE_PER_S_MAX = 0.75 * QUOTA_PROPOSALS_MAX_DEFAULT / (QUOTA_WINDOW_MS_DEFAULT / 1000)
AGENTS_MIN = 8
DELIVERY_BACKOFF_S_MIN = 0.05
DELIVERY_BACKOFF_S_MAX = 0.5
NODE_DOWN_HOLD_S = 0.3  # a member that failed a delivery is skipped this long
REOFFER_AFTER_HEIGHTS = 8
REOFFER_BATCH_MAX = 512
CERTIFICATE_DEADLINE_S = 15.0
CERTIFICATE_CONCURRENCY = 32
DETAIL_ITEMS_MAX = 5

ALLOWED_TARGET = "https://bench.example/items/{label}"
DENIED_TARGET = "http://bench.example/items/{label}"  # the tool allows https only
EXPECTED_ALLOWED = ("allow", "ok")
EXPECTED_DENIED = ("deny", "target_scheme_not_allowed")
EQUIVOCATION_REASONS = ("equivocating_vote", "equivocating_timeout", "equivocating_proposal")
DROPPED_METRIC = "qg_replica_messages_dropped_total"
REPLICA_DB_FILES = ("replica.db", "replica.db-wal", "replica.db-shm")
SIDECAR_DB_FILE = "sidecar.db"
SIDECAR_STORE_FILES = (
    "sidecar.db",
    "sidecar.db-wal",
    "sidecar.db-shm",
    "sidecar.db.lock",
    "replay.checkpoint",
    "replay.checkpoint.state",
)
STALE_COPY_DIR = "drill-stale-copy"
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
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
    # Members are killed and restarted under the same address: redial quickly.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 250),
)

ProgressFn = Callable[[str], None]


class DrillError(Exception):
    """The drill cannot run here: an unknown drill, a running cluster, another size."""


class _Abort(Exception):
    """A step of the drill could not be carried out (a process that would not start, a
    wait past its deadline). The drill still runs its checks, and fails `drill_completed`."""


# ---------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class Fault:
    """One injected fault and the way back from it. `at_s` counts from the drill's start;
    `recovery_s` is None when the member did not come back in time. `details` holds what
    the drill measured for this kind of fault."""

    kind: str
    node: int | None
    at_s: float
    signal: str = ""
    pids_before: dict[str, int] = field(default_factory=dict)
    pids_after: dict[str, int] = field(default_factory=dict)
    height_at_fault: int = 0
    view_at_fault: int = 0
    recovery_s: float | None = None
    details: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "node": self.node,
            "at_s": round(self.at_s, 3),
            "signal": self.signal,
            "pids_before": self.pids_before,
            "pids_after": self.pids_after,
            "height_at_fault": self.height_at_fault,
            "view_at_fault": self.view_at_fault,
            "recovery_s": _rounded(self.recovery_s),
            **self.details,
        }


@dataclass
class DrillReport:
    drill: str
    nodes: int
    f: int
    directory: str
    chain_id: str
    seconds: float
    rate_per_s: float
    agents: int = 0
    acknowledged: int = 0
    certified: int = 0
    lost: int = 0  # acknowledged, never committed
    duplicates: int = 0  # transaction ids in more than one committed block
    reoffered: int = 0
    redelivered: int = 0  # offered again and taken as new: the cluster had lost them
    refused: dict[str, int] = field(default_factory=dict)
    diverged: int = 0
    diverged_nodes: list[int] = field(default_factory=list)
    equivocations: int = 0
    recovery_s: float | None = None
    recovery_s_max: float | None = None
    final_height: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    details: dict[str, object] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r} in the report")

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def as_dict(self) -> dict[str, object]:
        return {
            "drill": self.drill,
            "nodes": self.nodes,
            "f": self.f,
            "directory": self.directory,
            "chain_id": self.chain_id,
            "seconds": self.seconds,
            "rate_per_s": self.rate_per_s,
            "agents": self.agents,
            "acknowledged": self.acknowledged,
            "certified": self.certified,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "reoffered": self.reoffered,
            "redelivered": self.redelivered,
            "refused": dict(sorted(self.refused.items())),
            "diverged": self.diverged,
            "diverged_nodes": self.diverged_nodes,
            "equivocations": self.equivocations,
            "recovery_s": _rounded(self.recovery_s),
            "recovery_s_max": _rounded(self.recovery_s_max),
            "final_height": self.final_height,
            "verdicts": dict(sorted(self.verdicts.items())),
            "faults": [fault.as_dict() for fault in self.faults],
            "details": self.details,
            "checks": [c.as_dict() for c in self.checks],
            "ok": self.ok,
            "duration_s": round(self.duration_s, 3),
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ---------------------------------------------------------------------------- pure checks


def majority(values: Mapping[int, V]) -> tuple[V | None, list[int]]:
    """The value most members hold, and the members (sorted) that hold another."""
    counts = Counter(values.values())
    if not counts:
        return None, []
    value = counts.most_common(1)[0][0]
    return value, sorted(i for i, v in values.items() if v != value)


def vote_splits(votes: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[bytes, list[int]]]:
    """From each member's signed-vote table (view -> block hash): the views in which votes
    went to more than one block, with the members behind each. With honest leaders, who
    propose one block per view (Rule 5), there are none."""
    by_view: dict[int, dict[bytes, list[int]]] = {}
    for node, table in sorted(votes.items()):
        for view, block_hash in table.items():
            by_view.setdefault(view, {}).setdefault(block_hash, []).append(node)
    return {view: hashes for view, hashes in sorted(by_view.items()) if len(hashes) > 1}


def rollback_conflicts(
    stale: Mapping[int, bytes], forgotten: Mapping[int, bytes], now: Mapping[int, bytes]
) -> list[tuple[int, bytes, bytes]]:
    """Votes a replica restored from an old copy (`stale`: the copy's votes) signed after
    the restore that contradict votes it had signed and forgotten (`forgotten`): (view,
    forgotten hash, new hash). `now` is its vote table at the end. Safety Rule 6 keeps this
    empty."""
    return [
        (view, block_hash, now[view])
        for view, block_hash in sorted(forgotten.items())
        if view not in stale and view in now and now[view] != block_hash
    ]


def refusals_since(
    before: Mapping[int, tuple[int, Counter[str]]], after: Mapping[int, tuple[int, Counter[str]]]
) -> Counter[str]:
    """Messages the honest replicas dropped between two readings, by reason (a process
    restarted in between counts from zero; equivocations are another check's)."""
    total: Counter[str] = Counter()
    for i, (pid, counters) in after.items():
        prior = before.get(i)
        total.update(counters - prior[1] if prior is not None and prior[0] == pid else counters)
    for reason in EQUIVOCATION_REASONS:
        total.pop(reason, None)
    return total


def placements(blocks: Iterable[Block]) -> dict[bytes, list[int]]:
    """Transaction id -> the heights of every committed block that carries it."""
    placed: dict[bytes, list[int]] = {}
    for block in blocks:
        for tx in block.payload:
            placed.setdefault(parse(tx, verify=False).tx_id, []).append(block.height)
    return placed


def _short(data: bytes | None) -> str:
    return "none" if data is None else data.hex()[:16]


def _listed(items: Iterable[object]) -> str:
    shown = list(items)
    more = len(shown) - DETAIL_ITEMS_MAX
    text = "; ".join(str(i) for i in shown[:DETAIL_ITEMS_MAX])
    return text + (f" (+{more} more)" if more > 0 else "")


# ---------------------------------------------------------------------------- probes


def _poll(check: Callable[[], T | None], timeout_s: float, every_s: float = POLL_S) -> T | None:
    """`quorumgate.sdk.polling.poll_for` with the drill's step."""
    return poll_for(check, timeout_s, every_s)


def _replica_status(spec: ClusterSpec, index: int) -> cpb.StatusReply | None:
    """One Status call on a fresh channel: a cached one may sit in reconnect back-off after
    a restart and make a recovery look slower than it was."""
    with sync_channel(spec, index) as channel:
        try:
            reply: cpb.StatusReply = cpb_grpc.ReplicaStub(channel).Status(
                cpb.StatusRequest(), timeout=STATUS_TIMEOUT_S
            )
        except grpc.RpcError:
            return None
    return reply


def _equivocation_counters(spec: ClusterSpec, index: int) -> dict[str, float] | None:
    """A replica's equivocation counters by reason, from its /metrics (None: no answer)."""
    dropped = _dropped_counters(spec, index)
    if dropped is None:
        return None
    return {reason: dropped.get(reason, 0.0) for reason in EQUIVOCATION_REASONS}


def _dropped_counters(spec: ClusterSpec, index: int) -> dict[str, float] | None:
    """A replica's counts of peer messages dropped, by reason (None: no answer)."""
    from prometheus_client.parser import text_string_to_metric_families

    m = spec.member(index)
    try:
        url = f"http://{m.host}:{m.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as response:
            text = response.read().decode()
    except OSError:
        return None
    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            reason = sample.labels.get("reason", "")
            if sample.name == DROPPED_METRIC and reason:
                counters[reason] = float(sample.value)
    return counters


_STARTED_RE = re.compile(r"event=started .*?\b(?:height|executed_height)=(\d+)")


def _started_height(spec: ClusterSpec, index: int, kind: str) -> int | None:
    """The height the `kind` process of member `index` logged at its last start."""
    try:
        text = (spec.node_dir(index) / f"{kind}.log").read_text(errors="replace")
    except OSError:
        return None
    found = _STARTED_RE.findall(text)
    return int(found[-1]) if found else None


def _committed_blocks(spec: ClusterSpec, index: int, start: int, end: int) -> list[Block]:
    """Member `index`'s committed blocks start..end through `CommittedBlocks`, each decoded
    (its hash recomputed and compared with the one sent); `_Abort` after STREAM_RETRIES_MAX
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
                        raise _Abort(f"replica {index} sent height {reply.height} for {expected}")
                    if block.hash != reply.hash:
                        raise _Abort(
                            f"replica {index}: the block at height {expected} hashes to "
                            f"{_short(block.hash)}, sent as {_short(reply.hash)}"
                        )
                    out.append(block)
                    if block.height >= end:
                        break
            except grpc.RpcError as err:
                failures += 1
                if failures >= STREAM_RETRIES_MAX:
                    raise _Abort(
                        f"replica {index}: CommittedBlocks from height {start + len(out)} "
                        f"failed {failures} times ({err.code().name})"
                    ) from None
                time.sleep(POLL_S)  # a pause before asking again, not a wait for a state
            finally:
                call.cancel()
    return out


# ---------------------------------------------------------------------------- stores


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
        )
    finally:
        await store.close()


@dataclass(frozen=True)
class ReplicaAudit:
    """What a stopped replica's store says about its own signatures."""

    committed_height: int
    last_voted_view: int
    last_proposed_view: int
    signed_votes: dict[int, bytes]
    signed_timeouts: dict[int, int]


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
        )
    finally:
        await store.close()


async def _wipe_replica_blocks(spec: ClusterSpec, index: int) -> tuple[int, int]:
    """`ReplicaStore.wipe_blocks()` on a stopped replica: (height before, height after)."""
    store = await ReplicaStore.open(spec.node_dir(index) / "replica.db", spec.chain_id)
    try:
        before = store.committed_height
        await store.wipe_blocks()
        return before, store.committed_height
    finally:
        await store.close()


async def _certify(
    spec: ClusterSpec, proposal_ids: Sequence[bytes]
) -> dict[bytes, tuple[int, str, str] | str]:
    """Through the client SDK: proposal id -> (height, outcome, reason) of its verified
    certificate, or the error that kept it from one."""
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
            return pid, f"a certificate for {_short(decision.tx_id)}"
        return pid, (decision.height, decision.outcome.value, decision.reason)

    try:
        return dict(await asyncio.gather(*(one(p) for p in proposal_ids)))
    finally:
        await client.close()


# ---------------------------------------------------------------------------- processes


class _Processes:
    """The replica and sidecar processes this drill started, by (kind, member)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.procs: dict[tuple[str, int], subprocess.Popen[bytes]] = {}

    def start(
        self,
        kind: str,
        indexes: Iterable[int],
        *,
        module: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start them and return once each answers; `_Abort` if one does not."""
        wanted = list(indexes)
        try:
            procs = start_nodes(self.spec, wanted, kind, module=module, env=env)
        except OpsError as err:
            raise _Abort(f"cannot start {kind}s {wanted}: {err}") from err
        for i, proc in procs.items():
            self.procs[(kind, i)] = proc
        wait = wait_serving if kind == "replica" else wait_sidecars_serving
        try:
            wait(self.spec, wanted, procs, READY_TIMEOUT_S)
        except OpsError as err:
            raise _Abort(str(err)) from err

    def pid(self, kind: str, index: int) -> int | None:
        proc = self.procs.get((kind, index))
        return proc.pid if proc is not None and proc.poll() is None else None

    def pids(self, kinds: Sequence[str], indexes: Iterable[int]) -> dict[str, int]:
        """Pids of the running processes: by kind for one member, by `kind-i` for several."""
        members = list(indexes)
        return {
            kind if len(members) == 1 else f"{kind}-{i}": pid
            for i in members
            for kind in kinds
            if (pid := self.pid(kind, i)) is not None
        }

    def kill(self, kind: str, index: int, sig: signal.Signals = signal.SIGKILL) -> int:
        """Signal one running process and reap it; return its pid."""
        proc = self.procs.get((kind, index))
        if proc is None or proc.poll() is not None:
            raise _Abort(f"{kind} {index} is not running")
        proc.send_signal(sig)
        self._reap(kind, index)
        return proc.pid

    def stop(
        self, targets: Iterable[tuple[str, int]], sig: signal.Signals = signal.SIGTERM
    ) -> dict[str, int | None]:
        """Signal every target at once, then reap each; exit statuses by `kind-i`."""
        wanted = list(targets)
        for kind, i in wanted:
            proc = self.procs.get((kind, i))
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
        return {f"{kind}-{i}": self._reap(kind, i) for kind, i in wanted}

    def stop_all(self) -> dict[str, int | None]:
        """SIGTERM every sidecar, then every replica, this drill started."""
        codes = self.stop([k for k in self.procs if k[0] == "sidecar"])
        codes.update(self.stop([k for k in self.procs if k[0] == "replica"]))
        return codes

    def close(self) -> None:
        """The finalizer: nothing this drill started outlives it."""
        self.stop_all()
        for key, proc in list(self.procs.items()):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=STOP_GRACE_S)
            del self.procs[key]

    def _reap(self, kind: str, index: int) -> int | None:
        """Wait for a signalled process (SIGKILL past STOP_GRACE_S); its exit status."""
        proc = self.procs.pop((kind, index), None)
        if proc is None:
            return None
        try:
            code = proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=STOP_GRACE_S)
        # A killed process leaves its pid file behind.
        (self.spec.node_dir(index) / f"{kind}.pid").unlink(missing_ok=True)
        return code


# ---------------------------------------------------------------------------- load


@dataclass(frozen=True)
class _Ack:
    tx: bytes
    node: int
    denied: bool  # its target is one the tool refuses
    at: float  # time.monotonic() of the acknowledgment


class _Load:
    """Signed proposals from registered agents, in batches of BATCH_TXS paced to
    `rate_per_s` over SENDER_THREADS threads, each batch streamed (`SubmitStream`) to the
    next member not known to be down. A batch cut off by a failing member goes again,
    unanswered proposals only and the same bytes, to another member; back-pressure is
    retried after a pause. The ids of acknowledged proposals are recorded."""

    def __init__(self, spec: ClusterSpec, agents: list[LoadAgent], rate_per_s: float) -> None:
        self.spec = spec
        self.agents = agents
        self.rate_per_s = rate_per_s
        self.acked: dict[bytes, _Ack] = {}
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

    def start(self) -> _Load:
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

    def snapshot(self) -> dict[bytes, _Ack]:
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
                        f"node {node} acknowledged {_short(proposal_id)} "
                        f"as {_short(reply.proposal_id)}"
                    )
                self.acked.setdefault(proposal_id, _Ack(data, node, denied, time.monotonic()))
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


class _ChainWatch:
    """The committed chain as far as read, from whichever member is highest: the heights
    at which each transaction id committed. Used while the drill settles."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.top = 0
        self.heights: dict[bytes, list[int]] = {}

    def advance(self) -> int:
        heights = {}
        for i in range(self.spec.n):
            status = _replica_status(self.spec, i)
            if status is not None:
                heights[i] = status.committed_height
        if not heights:
            return self.top
        index = max(heights, key=lambda i: heights[i])
        if heights[index] > self.top:
            with contextlib.suppress(_Abort):
                blocks = _committed_blocks(self.spec, index, self.top + 1, heights[index])
                for tid, hs in placements(blocks).items():
                    self.heights.setdefault(tid, []).extend(hs)
                self.top = blocks[-1].height if blocks else self.top
        return self.top


# ---------------------------------------------------------------------------- the drill


@dataclass(frozen=True)
class _StaleRun:
    node: int
    stale_votes: dict[int, bytes]  # in the old copy
    forgotten: dict[int, bytes]  # signed after the copy, lost by the rollback
    fault: Fault


@dataclass(frozen=True)
class _Wiped:
    node: int
    before: SidecarView  # its sidecar's store just before the wipe
    replayed: ReplayReport | None


class _Drill:
    def __init__(
        self,
        name: str,
        spec: ClusterSpec,
        seconds: float,
        rate_per_s: float,
        progress: ProgressFn | None,
    ) -> None:
        self.name = name
        self.spec = spec
        self.n = spec.n
        self.seconds = seconds
        self.progress = progress
        self.t0 = time.monotonic()
        self.procs = _Processes(spec)
        self.load: _Load | None = None
        self.report = DrillReport(
            drill=name,
            nodes=spec.n,
            f=spec.f,
            directory=str(spec.directory),
            chain_id=spec.chain_id,
            seconds=seconds,
            rate_per_s=rate_per_s,
        )
        # (node, pid) -> reason -> the highest equivocation counter that process showed
        self.equivocations_seen: dict[tuple[int, int], dict[str, float]] = {}
        self.stale_runs: list[_StaleRun] = []
        self.wiped: list[_Wiped] = []
        self.fault_deadline = math.inf
        self.aborted = ""

    # ------------------------------------------------------------------ plumbing

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(f"[drill {self.name} {time.monotonic() - self.t0:6.1f}s] {message}")

    def check(self, name: str, problems: Sequence[str], passed: str) -> None:
        """Record check `name`: it holds when there are no `problems` (each naming the
        node, height and key), and then says `passed`."""
        self.report.checks.append(
            Check(name, not problems, _listed(problems) if problems else passed)
        )
        if problems:
            self.say(f"CHECK FAILED {name}: {_listed(problems)}")

    def statuses(self, indexes: Iterable[int] | None = None) -> dict[int, cpb.StatusReply]:
        out = {}
        for i in range(self.n) if indexes is None else indexes:
            status = _replica_status(self.spec, i)
            if status is not None:
                out[i] = status
        return out

    def heights(self, indexes: Iterable[int] | None = None) -> dict[int, int]:
        return {i: s.committed_height for i, s in self.statuses(indexes).items()}

    def top(self, indexes: Iterable[int] | None = None) -> int:
        return max(self.heights(indexes).values(), default=0)

    def others(self, *nodes: int) -> list[int]:
        return [i for i in range(self.n) if i not in nodes]

    def scrape_equivocations(self, indexes: Iterable[int] | None = None) -> None:
        """Read live replicas' equivocation counters: before a kill, which resets them."""
        for i in range(self.n) if indexes is None else indexes:
            pid = self.procs.pid("replica", i)
            counters = _equivocation_counters(self.spec, i) if pid is not None else None
            if pid is None or counters is None:
                continue
            seen = self.equivocations_seen.setdefault((i, pid), {})
            for reason, value in counters.items():
                seen[reason] = max(seen.get(reason, 0.0), value)

    # ------------------------------------------------------------------ waits (polled)

    def wait_commits(self, above: int, among: Sequence[int], timeout_s: float) -> float | None:
        """When 2f+1 of `among` (all, if fewer) committed above height `above`."""
        need = min(len(among), 2 * self.spec.f + 1)

        def done() -> float | None:
            heights = self.heights(among).values()
            return time.monotonic() if sum(h > above for h in heights) >= need else None

        return _poll(done, timeout_s)

    def wait_replica_back(
        self,
        node: int,
        timeout_s: float = RECOVERY_TIMEOUT_S,
        among: Sequence[int] | None = None,
    ) -> float | None:
        """When replica `node` has committed the lowest height the other live replicas
        (or those `among`, leaving out others that are catching up too) have, read just
        before it: back at the cluster's height."""
        reference = self.others(node) if among is None else [i for i in among if i != node]

        def done() -> float | None:
            others = self.heights(reference)
            mine = _replica_status(self.spec, node)
            if not others or mine is None:
                return None
            return time.monotonic() if mine.committed_height >= min(others.values()) else None

        return _poll(done, timeout_s)

    def wait_sidecar_back(self, node: int, timeout_s: float = RECOVERY_TIMEOUT_S) -> float | None:
        """When sidecar `node` has executed the lowest height the other sidecars have."""

        def done() -> float | None:
            others = [sidecar_status(self.spec, i) for i in self.others(node)]
            heights = [s.executed_height for s in others if s is not None]
            mine = sidecar_status(self.spec, node)
            if not heights or mine is None:
                return None
            return time.monotonic() if mine.executed_height >= min(heights) else None

        return _poll(done, timeout_s)

    def _reached(self, node: int, height: int) -> bool:
        return self.heights([node]).get(node, 0) >= height

    def _all_at(self, height: int) -> bool:
        heights = self.heights()
        return len(heights) == self.n and min(heights.values()) >= height

    def _sidecars_at(self, height: int, count: int) -> float | None:
        statuses = [sidecar_status(self.spec, i) for i in range(self.n)]
        at = sum(1 for s in statuses if s is not None and s.executed_height >= height)
        return time.monotonic() if at >= count else None

    def _leading(self, node: int) -> int | None:
        """The view replica `node` is in, if it leads that view."""
        status = _replica_status(self.spec, node)
        return status.view if status is not None and status.leader == node else None

    def _sidecar_lag(self, node: int) -> int | None:
        status, replica = sidecar_status(self.spec, node), _replica_status(self.spec, node)
        lag = (
            0
            if status is None or replica is None
            else replica.committed_height - status.executed_height
        )
        return lag if lag > 0 else None

    # ------------------------------------------------------------------ the run

    def run(self) -> None:
        try:
            self.say(f"starting {self.n} replicas and {self.n} sidecars in {self.spec.directory}")
            self.procs.start("replica", range(self.n))
            self.procs.start("sidecar", range(self.n))
            agents = self.register_agents()
            self.load = _Load(self.spec, agents, self.report.rate_per_s).start()
            self.say(
                f"load: {self.report.rate_per_s:g} proposals/s from {len(agents)} agents, "
                f"1 in {DENY_EVERY} denied by the tool's schemes"
            )
            self.warm_up()
            FAULTS[self.name](self)
            remaining = self.fault_deadline - time.monotonic()
            if remaining > 0:
                self.say(f"load goes on for {remaining:.1f} s")
                time.sleep(remaining)  # pacing the drill's length, not waiting for a state
        except _Abort as err:
            self.aborted = str(err)
            self.say(f"ABORTED: {err}")
        finally:
            if self.load is not None:
                self.load.stop()
        if self.load is not None:
            # After an aborted step too: the checks say what state it left behind.
            try:
                self.settle_and_check(self.load)
            except _Abort as err:
                self.aborted = self.aborted or str(err)
                self.say(f"ABORTED: {err}")
        problems = [self.aborted] if self.aborted else []
        self.check("drill_completed", problems, "every step carried out")

    def register_agents(self) -> list[LoadAgent]:
        """The drill's agents: the same names every run, so that a directory drilled again
        and again does not fill the engine's agent registry. Those not registered yet are,
        with the owner key; then every agent's next nonce is asked of f+1 sidecars. That
        happens after the owner's transactions executed, so any block of an earlier run
        still pending at the restart has been committed (or dropped) by then, and no nonce
        of this run collides with one of it."""
        count = max(AGENTS_MIN, math.ceil(self.report.rate_per_s / AGENT_RATE_PER_S_MAX))
        names = [f"drill-agent-{k}" for k in range(count)]
        agents = [LoadAgent.from_seed(self.spec.chain_id, name) for name in names]
        ops = [tool_op(BENCH_TOOL)]
        try:
            for name, agent in zip(names, agents, strict=True):
                if not owner_next_nonce(self.spec, agent.public_key)[0]:
                    ops += agent_ops(name, agent.public_key, [BENCH_TOOL])
            OwnerSession(self.spec).submit(ops)
            for agent in agents:
                known, agent.next_nonce = owner_next_nonce(self.spec, agent.public_key)
                if not known:
                    raise _Abort(f"agent {agent.public_key.hex()[:16]} is still not registered")
        except OwnerError as err:
            raise _Abort(f"registering the drill's agents failed: {err}") from err
        self.report.agents = count
        return agents

    def warm_up(self) -> None:
        load = self.load
        assert load is not None
        goal = self.top() + WARMUP_HEIGHTS
        if not _poll(
            lambda: load.acked_count >= WARMUP_ACKS_MIN and self.top() >= goal, RESUME_TIMEOUT_S
        ):
            raise _Abort(
                f"warm-up: {load.acked_count} proposals acknowledged, heights {self.heights()}"
            )
        self.fault_deadline = time.monotonic() + self.seconds
        self.say(f"warmed up: {load.acked_count} acknowledged, heights {self.heights()}")

    def cycles(self) -> Iterable[int]:
        """Fault cycle numbers: the drill's minimum, then more while `--seconds` last."""
        for k in range(FAULT_CYCLES_MAX):
            if k >= FAULT_CYCLES_MIN[self.name] and time.monotonic() >= self.fault_deadline:
                return
            yield k

    def fault(self, fault: Fault) -> Fault:
        self.report.faults.append(fault)
        return fault

    # ------------------------------------------------------------------ faults

    def leader_kill(self) -> None:
        for k in self.cycles():
            found = _poll(self._current_leader, LEADER_WAIT_S)
            if found is None:
                raise _Abort(f"no view with every replica up and a leader: {self.heights()}")
            victim, view = found
            survivors = self.others(victim)
            self.scrape_equivocations()
            height = self.top(survivors)
            killed_at = time.monotonic()
            pid = self.procs.kill("replica", victim)
            fault = self.fault(
                Fault(
                    "sigkill-replica",
                    victim,
                    killed_at - self.t0,
                    "SIGKILL",
                    {"replica": pid},
                    height_at_fault=height,
                    view_at_fault=view,
                )
            )
            self.say(f"kill {k + 1}: SIGKILL replica {victim} (pid {pid}), leader of view {view}")
            resumed = self.wait_commits(height, survivors, RESUME_TIMEOUT_S)
            if resumed is None:
                raise _Abort(f"commits did not resume without replica {victim}: {self.heights()}")
            fault.details["commits_resumed_s"] = round(resumed - killed_at, 3)
            fault.details["survivor_view_at_resume"] = max(
                s.view for s in self.statuses(survivors).values()
            )
            self.procs.start("replica", [victim])
            fault.pids_after = self.procs.pids(["replica"], [victim])
            back = self.wait_replica_back(victim)
            if back is None:
                raise _Abort(f"replica {victim} did not catch up: {self.heights()}")
            fault.recovery_s = back - killed_at
            self.say(
                f"commits resumed after {resumed - killed_at:.2f} s; replica {victim} back at "
                f"the cluster's height {fault.recovery_s:.2f} s after the kill"
            )

    def _current_leader(self) -> tuple[int, int] | None:
        """(leader, view) of the highest view, once every replica answers."""
        statuses = self.statuses()
        if len(statuses) < self.n:
            return None
        top = max(statuses.values(), key=lambda s: s.view)
        return top.leader, top.view

    def sidecar_crash(self) -> None:
        for k in self.cycles():
            victim = (k + 1) % self.n
            lag = _poll(functools.partial(self._sidecar_lag, victim), LAG_WAIT_S) or 0
            status = sidecar_status(self.spec, victim)
            executed = 0 if status is None else status.executed_height
            killed_at = time.monotonic()
            pid = self.procs.kill("sidecar", victim)
            fault = self.fault(
                Fault(
                    "sigkill-sidecar",
                    victim,
                    killed_at - self.t0,
                    "SIGKILL",
                    {"sidecar": pid},
                    height_at_fault=executed,
                    details={"lag_blocks_at_kill": lag},
                )
            )
            self.say(
                f"crash {k + 1}: SIGKILL sidecar {victim} (pid {pid}) at executed height "
                f"{executed}, {lag} committed blocks behind its replica"
            )
            self.procs.start("sidecar", [victim])
            fault.pids_after = self.procs.pids(["sidecar"], [victim])
            fault.details["executed_height_at_restart"] = _started_height(
                self.spec, victim, "sidecar"
            )
            back = self.wait_sidecar_back(victim)
            if back is None:
                raise _Abort(f"sidecar {victim} did not catch up")
            fault.recovery_s = back - killed_at
            self.say(
                f"sidecar {victim} back at the cluster's height after {fault.recovery_s:.2f} s"
            )

    def full_restart(self) -> None:
        everything = [(kind, i) for kind in ("sidecar", "replica") for i in range(self.n)]
        for k in self.cycles():
            sig = signal.SIGKILL if k % 2 == 0 else signal.SIGTERM
            self.scrape_equivocations()
            statuses = self.statuses()
            height = max((s.committed_height for s in statuses.values()), default=0)
            view = max((s.view for s in statuses.values()), default=0)
            before = self.procs.pids(["replica", "sidecar"], range(self.n))
            stopped_at = time.monotonic()
            codes = self.procs.stop(everything, sig)
            fault = self.fault(
                Fault(
                    "stop-all",
                    None,
                    stopped_at - self.t0,
                    sig.name,
                    before,
                    height_at_fault=height,
                    view_at_fault=view,
                    details={"exit_codes": codes},
                )
            )
            self.say(
                f"restart {k + 1}: {sig.name} to all {len(everything)} processes at height {height}"
            )
            self.procs.start("replica", range(self.n))
            self.procs.start("sidecar", range(self.n))
            fault.pids_after = self.procs.pids(["replica", "sidecar"], range(self.n))
            resumed = self.wait_commits(height, list(range(self.n)), RESUME_TIMEOUT_S)
            if resumed is None:
                raise _Abort(f"commits did not resume after the restart: {self.heights()}")
            fault.recovery_s = resumed - stopped_at
            quorum = 2 * self.spec.f + 1
            executing = _poll(
                functools.partial(self._sidecars_at, height + 1, quorum), RECOVERY_TIMEOUT_S
            )
            if executing is None:
                raise _Abort(f"sidecars did not execute past height {height} after the restart")
            fault.details["sidecars_resumed_s"] = round(executing - stopped_at, 3)
            self.say(
                f"commits resumed {fault.recovery_s:.2f} s after the stop, sidecars executing "
                f"past height {height} after {executing - stopped_at:.2f} s"
            )

    def wipe_replica(self) -> None:
        for k in self.cycles():
            victim = (k + 1) % self.n
            with_replay = k % 2 == 0
            node_dir = self.spec.node_dir(victim)
            self.scrape_equivocations()
            before = self.procs.pids(["replica", "sidecar"], [victim])
            self.procs.stop([("sidecar", victim), ("replica", victim)])
            sidecar_before = asyncio.run(read_sidecar(self.spec, victim))
            votes_before = asyncio.run(read_replica(self.spec, victim))
            height_before, height_after = asyncio.run(_wipe_replica_blocks(self.spec, victim))
            kept = asyncio.run(read_replica(self.spec, victim))
            for name in SIDECAR_STORE_FILES:
                (node_dir / name).unlink(missing_ok=True)
            self.say(
                f"wipe {k + 1}: member {victim} stopped at height {height_before}; replica "
                f"blocks wiped ({len(kept.signed_votes)} signed votes kept), sidecar store "
                f"(executed {sidecar_before.executed_height}) deleted"
            )
            restarted_at = time.monotonic()
            self.procs.start("replica", [victim])
            started = _started_height(self.spec, victim, "replica")
            if not with_replay:
                self.procs.start("sidecar", [victim])
            fault = self.fault(
                Fault(
                    "wipe",
                    victim,
                    restarted_at - self.t0,
                    "SIGTERM",
                    before,
                    height_at_fault=height_before,
                    details={
                        "rebuilt_by": "replay" if with_replay else "sidecar",
                        "height_after_wipe": height_after,
                        "replica_started_at_height": started,
                        "signed_votes_before": len(votes_before.signed_votes),
                        "signed_votes_kept": len(kept.signed_votes),
                        "last_voted_view_kept": kept.last_voted_view,
                        "sidecar_executed_before": sidecar_before.executed_height,
                    },
                )
            )
            caught = self.wait_replica_back(victim)
            if caught is None:
                raise _Abort(f"wiped replica {victim} did not catch up: {self.heights()}")
            fault.details["replica_caught_up_s"] = round(caught - restarted_at, 3)
            self.say(
                f"replica {victim} started at height {started}, caught up after "
                f"{caught - restarted_at:.2f} s"
            )
            replayed = None
            if with_replay:
                try:
                    replayed = asyncio.run(replay(self.spec, victim, resume=False))
                except ReplayError as err:
                    raise _Abort(f"replay of member {victim} failed: {err}") from err
                fault.details["replay"] = replayed.as_dict()
                self.say(
                    f"replay: {replayed.heights_replayed} heights, "
                    f"{replayed.certificates_checked} certificates checked, "
                    f"{len(replayed.mismatches)} mismatches in {replayed.seconds:.2f} s"
                )
                self.procs.start("sidecar", [victim])
            else:
                fault.details["sidecar_started_at_height"] = _started_height(
                    self.spec, victim, "sidecar"
                )
            fault.pids_after = self.procs.pids(["replica", "sidecar"], [victim])
            back = self.wait_sidecar_back(victim)
            if back is None:
                raise _Abort(f"rebuilt sidecar {victim} did not catch up")
            fault.recovery_s = back - restarted_at
            self.wiped.append(_Wiped(victim, sidecar_before, replayed))
            self.say(
                f"member {victim} back at the cluster's height {fault.recovery_s:.2f} s "
                "after its restart"
            )

    def stale_restore(self) -> None:
        """Rule 6 only matters if the restored replica comes back while views it signed in
        are still live. So f other members ("bystanders") are stopped first: with exactly
        2f+1 replicas up the cluster cannot leave a view without the victim. The victim is
        SIGKILLed while it leads the current view, which holds the cluster in the views it
        signed in, and restarted on its stale copy at once, declared a restore; it signs
        nothing until 2f+1 others answer, so the bystanders are started right after it,
        and commits resume once it has fenced. Without Rule 6 it could propose again in a
        view it led, or sign a statement it had forgotten."""
        for k in self.cycles():
            victim = (k + 1) % self.n
            bystanders = [(victim + 1 + j) % self.n for j in range(self.spec.f)]
            up = self.others(*bystanders)
            node_dir = self.spec.node_dir(victim)
            copy_dir = node_dir / STALE_COPY_DIR
            self.scrape_equivocations([victim])
            self.procs.stop([("replica", victim)])
            stale = asyncio.run(read_replica(self.spec, victim))
            shutil.rmtree(copy_dir, ignore_errors=True)
            copy_dir.mkdir(mode=0o700)
            copied = [name for name in REPLICA_DB_FILES if (node_dir / name).exists()]
            for name in copied:
                shutil.copy2(node_dir / name, copy_dir / name)
            self.say(
                f"stale-restore {k + 1}: copied replica {victim}'s {', '.join(copied)} while "
                f"stopped (height {stale.committed_height}, last voted view "
                f"{stale.last_voted_view})"
            )
            self.procs.start("replica", [victim])
            goal = self.top() + VOTING_HEIGHTS
            if not _poll(functools.partial(self._reached, victim, goal), RECOVERY_TIMEOUT_S):
                raise _Abort(f"replica {victim} did not reach height {goal}: {self.heights()}")
            self.scrape_equivocations(bystanders)
            self.procs.stop([("replica", b) for b in bystanders])
            if self.wait_commits(self.top(up), up, RESUME_TIMEOUT_S) is None:
                raise _Abort(f"no commits with replicas {bystanders} stopped: {self.heights()}")
            view = _poll(functools.partial(self._leading, victim), LEADER_WAIT_S, LEADER_POLL_S)
            if view is None:
                raise _Abort(f"replica {victim} did not lead a view: {self.heights()}")
            self.scrape_equivocations(up)
            pid = self.procs.kill("replica", victim)
            rolled_back = asyncio.run(read_replica(self.spec, victim))
            forgotten = {
                v: h for v, h in rolled_back.signed_votes.items() if v not in stale.signed_votes
            }
            for name in REPLICA_DB_FILES:
                (node_dir / name).unlink(missing_ok=True)
            for name in copied:
                shutil.copy2(copy_dir / name, node_dir / name)
            shutil.rmtree(copy_dir, ignore_errors=True)
            (node_dir / RESTORE_MARKER_FILE).touch()  # declared, as a restore must be
            survivors = self.statuses(self.others(victim, *bystanders))
            cluster_view = max((s.view for s in survivors.values()), default=0)
            height = max((s.committed_height for s in survivors.values()), default=0)
            restored_at = time.monotonic()
            self.procs.start("replica", [victim])
            fault = self.fault(
                Fault(
                    "stale-restore",
                    victim,
                    restored_at - self.t0,
                    "SIGKILL",
                    {"replica": pid},
                    self.procs.pids(["replica"], [victim]),
                    height,
                    view,
                    details={
                        "bystanders_stopped": bystanders,
                        "stale_committed_height": stale.committed_height,
                        "stale_last_voted_view": stale.last_voted_view,
                        "stale_last_proposed_view": stale.last_proposed_view,
                        "last_voted_view_before_rollback": rolled_back.last_voted_view,
                        "last_proposed_view_before_rollback": rolled_back.last_proposed_view,
                        "forgotten_votes": len(forgotten),
                        "forgotten_timeouts": len(
                            set(rolled_back.signed_timeouts) - set(stale.signed_timeouts)
                        ),
                        "forgotten_views": [min(forgotten, default=0), max(forgotten, default=0)],
                        "cluster_view_at_restore": cluster_view,
                        "restarted_at_height": _started_height(self.spec, victim, "replica"),
                    },
                )
            )
            self.stale_runs.append(_StaleRun(victim, stale.signed_votes, forgotten, fault))
            self.say(
                f"SIGKILLed replica {victim} leading view {view} ({len(forgotten)} votes since "
                f"the copy, up to view {max(forgotten, default=0)}); the cluster holds in view "
                f"{cluster_view} with {bystanders} down; restarted {victim} on the copy (last "
                f"voted view {stale.last_voted_view}), declared a restore; restarting "
                f"{bystanders}: a restore fences only once 2f+1 others have answered"
            )
            self.procs.start("replica", bystanders)
            resumed = self.wait_commits(height, up, RECOVERY_TIMEOUT_S)
            if resumed is None:
                raise _Abort(f"no commits after replica {victim}'s restore: {self.heights()}")
            fault.details["commits_resumed_s"] = round(resumed - restored_at, 3)
            back = self.wait_replica_back(victim)
            if back is None:
                raise _Abort(f"restored replica {victim} did not catch up: {self.heights()}")
            fault.recovery_s = back - restored_at
            fault.details["restore_marker_removed"] = not (node_dir / RESTORE_MARKER_FILE).exists()
            self.say(f"commits resumed {resumed - restored_at:.2f} s after the restore")
            for b in bystanders:
                if self.wait_replica_back(b, among=up) is None:
                    raise _Abort(f"replica {b} did not catch up: {self.heights()}")

    # ------------------------------------------------------------------ settle and check

    def settle(self, load: _Load, acked: Mapping[bytes, _Ack]) -> None:
        """Wait until every acknowledged proposal is committed, offering again those the
        chain does not show after REOFFER_AFTER_HEIGHTS more heights."""
        report = self.report
        watch = _ChainWatch(self.spec)
        offered_at: dict[bytes, int] = {}
        lost_acks: list[_Ack] = []
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            top = watch.advance()
            missing = [p for p in acked if p not in watch.heights]
            if not missing or time.monotonic() >= deadline:
                break
            due = [
                p for p in missing if top - offered_at.setdefault(p, top) >= REOFFER_AFTER_HEIGHTS
            ]
            if due:
                offered, taken = load.reoffer(due)
                report.reoffered += offered
                report.redelivered += len(taken)
                lost_acks += [acked[p] for p in taken]
                offered_at.update(dict.fromkeys(due, top))
                self.say(f"offered {len(due)} uncommitted proposals again: {len(taken)} were lost")
            time.sleep(POLL_S)
        report.lost = len(missing)
        if lost_acks:
            # When and by whom the proposals the cluster lost had been acknowledged, to set
            # beside the faults' times.
            by_node = Counter(a.node for a in lost_acks)
            times = sorted(round(a.at - self.t0, 1) for a in lost_acks)
            report.details["redelivered_acknowledged_by"] = {
                str(k): v for k, v in sorted(by_node.items())
            }
            report.details["redelivered_acknowledged_at_s"] = sorted(set(times))
        self.check(
            "acknowledged_committed",
            [
                f"{_short(p)} (acknowledged by replica {acked[p].node}) never committed"
                for p in missing
            ],
            f"all {len(acked)} acknowledged proposals committed"
            + (f" ({report.redelivered} after being offered again)" if report.redelivered else ""),
        )

    def byzantine(self) -> None:
        """One member turns Byzantine (quorumgate.ops.byzantine), restarted with the next
        attack of BYZANTINE_CYCLES each cycle; the honest members must stay up, refuse
        every attack message, and keep committing."""
        byz = self.n - 1
        honest = self.others(byz)
        started: dict[int, int] = {}  # honest member -> pid, as the drill last started it
        refused_total: Counter[str] = Counter()
        problems: list[str] = []
        for k in self.cycles():
            name, attacks, mode = BYZANTINE_CYCLES[k % len(BYZANTINE_CYCLES)]
            victim = honest[k % len(honest)]
            for i in honest:
                started[i] = self.procs.pid("replica", i) or started.get(i, 0)
            self.scrape_equivocations()
            self.procs.stop([("replica", byz)])
            self.procs.start(
                "replica",
                [byz],
                module=BYZANTINE_MODULE,
                env={"QUORUMGATE_BYZANTINE": ",".join(attacks)},
            )
            before = self._honest_refusals(honest)
            oversized_before = self._oversized_refused(byz)
            height = self.top(honest)
            at = time.monotonic()
            fault = self.fault(
                Fault(
                    f"byzantine-{name}",
                    byz,
                    at - self.t0,
                    pids_after=self.procs.pids(["replica"], [byz]),
                    height_at_fault=height,
                    details={"attacks": list(attacks), "honest_action": mode},
                )
            )
            self.say(f"attack {k + 1}: replica {byz} runs {', '.join(attacks)} ({mode})")
            if mode == "commit":
                done = self.wait_commits(height + ATTACK_HEIGHTS, honest, RESUME_TIMEOUT_S)
            elif mode == "restart":
                self.procs.stop([("replica", victim)])
                self.procs.start("replica", [victim])
                started[victim] = self.procs.pid("replica", victim) or 0
                done = self.wait_commits(height + ATTACK_HEIGHTS, honest, RESUME_TIMEOUT_S)
            else:
                self.procs.stop([("replica", victim)])
                others = [i for i in range(self.n) if i != victim]
                if self.wait_commits(height + ATTACK_HEIGHTS, others, RESUME_TIMEOUT_S) is None:
                    raise _Abort(f"no commits without replica {victim}: {self.heights()}")
                self.procs.start("replica", [victim])
                started[victim] = self.procs.pid("replica", victim) or 0
                done = self.wait_replica_back(victim)
            if done is None:
                raise _Abort(f"{name}: the honest members did not go on: {self.heights()}")
            fault.recovery_s = done - at

            seen = functools.partial(
                self._attack_refused, name, byz, honest, before, oversized_before
            )
            refused = _poll(seen, RESUME_TIMEOUT_S) or Counter()
            refused_total.update(refused)
            fault.details["refused_by_honest"] = dict(sorted(refused.items()))
            if not refused:
                problems.append(f"{name}: no honest member refused anything")
            for i in honest:
                pid = self.procs.pid("replica", i)
                if pid is None or pid != started[i]:
                    problems.append(f"{name}: honest replica {i} exited (was pid {started[i]})")
            self.say(
                f"{name}: honest members at {self.heights(honest)} after {fault.recovery_s:.2f} s; "
                f"refused {dict(refused)}"
            )
        self.report.details["refused_by_honest"] = dict(sorted(refused_total.items()))
        self.check(
            "byzantine_contained",
            problems,
            "every honest replica stayed up and refused every attack: "
            + _listed(f"{r} x{int(c)}" for r, c in sorted(refused_total.items())),
        )

    def _attack_refused(
        self,
        name: str,
        byz: int,
        honest: Sequence[int],
        before: Mapping[int, tuple[int, Counter[str]]],
        oversized_before: int,
    ) -> Counter[str] | None:
        """What the honest members refused since `before`, once it shows the attack."""
        found = refusals_since(before, self._honest_refusals(honest))
        # A message over the transport's limit never reaches the replica: the honest
        # side's gRPC resets the stream, as the attacker's log shows.
        oversized = self._oversized_refused(byz) - oversized_before
        if oversized:
            found["transport_resource_exhausted"] = oversized
        wanted = "oversized" not in name or oversized > 0
        return found if found and wanted else None

    def _oversized_refused(self, byz: int) -> int:
        try:
            text = (self.spec.node_dir(byz) / "replica.log").read_text(errors="replace")
        except OSError:
            return 0
        return text.count("code=RESOURCE_EXHAUSTED")

    def _honest_refusals(self, honest: Sequence[int]) -> dict[int, tuple[int, Counter[str]]]:
        """Each honest replica's pid and its counts of peer messages dropped, by reason."""
        out: dict[int, tuple[int, Counter[str]]] = {}
        for i in honest:
            pid = self.procs.pid("replica", i)
            counters = _dropped_counters(self.spec, i) if pid is not None else None
            if pid is not None and counters is not None:
                out[i] = (pid, Counter(counters))
        return out

    def settle_and_check(self, load: _Load) -> None:
        report = self.report
        acked = load.snapshot()
        report.acknowledged = len(acked)
        report.refused = dict(load.refused + load.redirected)
        self.say(f"load stopped: {len(acked)} proposals acknowledged; settling")
        self.settle(load, acked)
        redirected = (
            f"; {dict(load.redirected)} refused by a member's own sidecar, taken by another"
        )
        self.check(
            "load_clean",
            [f"refused {reason} x{count}" for reason, count in load.refused.items()]
            + load.failures,
            "no valid proposal refused, no delivery failed"
            + (redirected if load.redirected else ""),
        )

        # Every replica and every sidecar at one height T.
        target = self.top()
        report.final_height = target
        self.say(f"waiting for every replica and sidecar to reach height {target}")
        replicas_at = _poll(functools.partial(self._all_at, target), CATCH_UP_TIMEOUT_S)
        self.check(
            "replicas_reached_height",
            []
            if replicas_at
            else [
                f"replica {i} at {'-' if h is None else h}"
                for i in range(self.n)
                if (h := self.heights([i]).get(i)) is None or h < target
            ],
            f"all {self.n} replicas committed height {target}",
        )
        sidecars_at = _poll(
            functools.partial(self._sidecars_at, target, self.n), CATCH_UP_TIMEOUT_S
        )
        self.check(
            "sidecars_reached_height",
            []
            if sidecars_at
            else [
                f"sidecar {i} at {'-' if s is None else s.executed_height}"
                for i in range(self.n)
                if (s := sidecar_status(self.spec, i)) is None or s.executed_height < target
            ],
            f"all {self.n} sidecars executed height {target}",
        )
        if not replicas_at:
            raise _Abort(f"replicas did not reach height {target}")
        self.check_chains(target, acked)
        self.check_certificates(acked)

        # While everything still runs: divergence alarms and equivocation counters.
        alarms = {}
        for i in range(self.n):
            status = sidecar_status(self.spec, i)
            if status is not None and status.diverged:
                alarms[i] = status.divergence
        self.scrape_equivocations()
        counted = {
            f"replica {i} (pid {pid}) {reason} = {int(value)}": int(value)
            for (i, pid), seen in sorted(self.equivocations_seen.items())
            for reason, value in seen.items()
            if value
        }
        unread = [
            i for i in range(self.n) if not any(key[0] == i for key in self.equivocations_seen)
        ]
        report.equivocations = sum(counted.values())
        self.check(
            "no_equivocation_counted",
            list(counted) + [f"replica {i}: metrics never read" for i in unread],
            f"0 on all {len(self.equivocations_seen)} replica processes (read before each "
            "kill and at the end)",
        )
        self.check(
            "no_divergence_alarm",
            [f"sidecar {i}: {what}" for i, what in alarms.items()],
            "no sidecar raised its divergence alarm",
        )

        self.say("stopping the cluster; auditing its stores")
        report.details["exit_codes_at_stop"] = self.procs.stop_all()
        self.check_sidecar_stores(target, acked, sorted(alarms))
        self.check_votes()
        self.check_rebuilt()
        recovered = [f.recovery_s for f in report.faults if f.recovery_s is not None]
        if report.faults:
            report.recovery_s = report.faults[-1].recovery_s
            report.recovery_s_max = max(recovered, default=None)
        self.check(
            "recovered",
            [
                f"{f.kind} of member {f.node} at {f.at_s:.1f} s did not recover"
                for f in report.faults
                if f.recovery_s is None
            ]
            or ([] if report.faults else ["no fault was injected"]),
            f"{len(report.faults)} faults, each recovered; the last in "
            f"{report.recovery_s or 0:.2f} s, the slowest in {report.recovery_s_max or 0:.2f} s",
        )

    def check_chains(self, target: int, acked: Mapping[bytes, _Ack]) -> None:
        """Identical block hashes at every height; each acknowledged proposal committed in
        exactly one block, no transaction in two."""
        self.say(f"comparing {self.n} committed chains, heights 1..{target}")
        chains = {i: _committed_blocks(self.spec, i, 1, target) for i in range(self.n)}
        forks = []
        for i in range(1, self.n):
            for mine, theirs in zip(chains[0], chains[i], strict=True):
                if mine.hash != theirs.hash:
                    forks.append(
                        f"replica {i} height {mine.height}: block {_short(theirs.hash)}, replica 0 "
                        f"{_short(mine.hash)}"
                    )
                    break
        self.check(
            "same_block_hashes",
            forks,
            f"{self.n} replicas, identical hashes at heights 1..{target}",
        )
        self.placed = placements(chains[0])
        twice = {p: hs for p, hs in self.placed.items() if len(hs) > 1}
        self.report.duplicates = len(twice)
        wrong = {p: self.placed.get(p, []) for p in acked if len(self.placed.get(p, [])) != 1}
        self.check(
            "committed_once",
            [f"transaction {_short(p)} at heights {hs}" for p, hs in {**twice, **wrong}.items()],
            f"each of {len(acked)} acknowledged proposals in exactly one block, no "
            "transaction in two",
        )

    def check_certificates(self, acked: Mapping[bytes, _Ack]) -> None:
        self.say(f"asking the sidecars for {len(acked)} certificates (client SDK)")
        certs = asyncio.run(_certify(self.spec, list(acked)))
        problems = []
        unexpected = []
        verdicts: Counter[str] = Counter()
        for p, cert in certs.items():
            if isinstance(cert, str):
                problems.append(f"{_short(p)}: {cert}")
                continue
            height, outcome, reason = cert
            if self.placed.get(p, [height])[0] != height:
                problems.append(
                    f"{_short(p)}: certified at height {height}, committed at {self.placed[p]}"
                )
            verdicts[outcome if reason == "ok" else f"{outcome}:{reason}"] += 1
            expected = EXPECTED_DENIED if acked[p].denied else EXPECTED_ALLOWED
            if (outcome, reason) != expected:
                unexpected.append(
                    f"{_short(p)} at height {height}: {outcome}/{reason}, expected {expected}"
                )
        self.report.certified = sum(not isinstance(c, str) for c in certs.values())
        self.report.verdicts = dict(verdicts)
        self.check(
            "acknowledged_certified",
            problems,
            f"{self.report.certified} certificates verified, each of f+1 = "
            f"{self.spec.f + 1} agreeing receipts",
        )
        self.check("verdicts_expected", unexpected, f"verdicts {dict(sorted(verdicts.items()))}")

    def check_sidecar_stores(
        self, target: int, acked: Mapping[bytes, _Ack], alarmed: list[int]
    ) -> None:
        """Once stopped: one state root at T, one ledger head at T, one artifact set up to T;
        every ledger verifies; each acknowledged proposal has one verdict."""
        views: dict[int, SidecarView] = {}
        unreadable = []
        for i in range(self.n):
            try:
                views[i] = asyncio.run(read_sidecar(self.spec, i, target))
            except (SidecarStoreError, OSError) as err:
                unreadable.append(f"sidecar {i}: {err}")
        self.check("sidecar_stores_readable", unreadable, f"{len(views)} sidecar stores read")
        root, odd_roots = majority({i: v.state_root for i, v in views.items()})
        head, odd_heads = majority({i: v.ledger_head for i, v in views.items()})
        arts, odd_arts = majority({i: tuple(sorted(v.artifacts.items())) for i, v in views.items()})
        self.report.diverged_nodes = sorted(set(odd_roots + odd_heads + odd_arts + alarmed))
        self.report.diverged = len(self.report.diverged_nodes)
        self.check(
            "same_state_roots",
            [
                f"sidecar {i} height {target}: state root {_short(views[i].state_root)}, "
                f"the others {_short(root)}"
                for i in odd_roots
            ]
            + ([] if root else [f"no state root at height {target}"]),
            f"state root {_short(root)} at height {target} on every sidecar",
        )
        self.check(
            "same_ledger_heads",
            [
                f"sidecar {i} height {target}: ledger head {_short(views[i].ledger_head)} after "
                f"{views[i].ledger_entries} entries, the others {_short(head)}"
                for i in odd_heads
            ],
            f"ledger head {_short(head)} at height {target} on every sidecar "
            f"({next(iter(views.values())).ledger_entries if views else 0} entries)",
        )
        reference = dict(arts or ())
        self.check(
            "same_artifacts",
            [self._artifact_difference(i, views[i].artifacts, reference) for i in odd_arts],
            f"{len(reference)} rejection artifacts up to height {target}, the same bytes on "
            "every sidecar",
        )
        self.check(
            "ledgers_verify",
            [f"sidecar {i}: {v.ledger_problem}" for i, v in views.items() if v.ledger_problem],
            "every sidecar's ledger hash chain verifies",
        )
        if views:
            first = views[min(views)]
            counts = {p: first.verdicts_by_tx.get(p, 0) for p in acked}
            self.check(
                "verdicts_once",
                [
                    f"{_short(p)}: {c} verdicts in sidecar {first.node}'s ledger"
                    for p, c in counts.items()
                    if c != 1
                ],
                "each acknowledged proposal has exactly one verdict in the ledger",
            )

    @staticmethod
    def _artifact_difference(
        node: int, mine: Mapping[tuple[int, str], bytes], reference: Mapping[tuple[int, str], bytes]
    ) -> str:
        for key in sorted(set(mine) | set(reference)):
            if mine.get(key) != reference.get(key):
                what = (
                    "missing"
                    if key not in mine
                    else "extra"
                    if key not in reference
                    else "different bytes"
                )
                return f"sidecar {node} artifact (height {key[0]}, {key[1]!r}): {what}"
        return f"sidecar {node}: artifacts differ"

    def check_votes(self) -> None:
        """One block per view across every replica's signed-vote table (Rule 5 for
        leaders, Rule 1 for voters); for stale-restore, no vote after a restore
        contradicting a forgotten one (Rule 6)."""
        audits: dict[int, ReplicaAudit] = {}
        problems = []
        for i in range(self.n):
            try:
                audits[i] = asyncio.run(read_replica(self.spec, i))
            except StorageError as err:
                problems.append(f"replica {i}: {err}")
        splits = vote_splits({i: a.signed_votes for i, a in audits.items()})
        problems += [
            f"view {view}: "
            + ", ".join(f"{_short(h)} by replicas {ns}" for h, ns in hashes.items())
            for view, hashes in splits.items()
        ]
        conflicts = 0
        for run in self.stale_runs:
            now = audits[run.node].signed_votes if run.node in audits else {}
            for view, old, new in rollback_conflicts(run.stale_votes, run.forgotten, now):
                conflicts += 1
                problems.append(
                    f"replica {run.node} view {view}: voted {_short(old)} before the rollback and "
                    f"{_short(new)} after it"
                )
            after = sorted(v for v in now if v not in run.stale_votes and v not in run.forgotten)
            run.fault.details["first_vote_view_after_restore"] = after[0] if after else None
            run.fault.details["votes_after_restore"] = len(after)
        self.report.equivocations += conflicts + len(splits)
        votes = sum(len(a.signed_votes) for a in audits.values())
        views = len({v for a in audits.values() for v in a.signed_votes})
        passed = f"{votes} recorded votes in {views} views, one block per view"
        if self.stale_runs:
            passed += (
                f"; no vote after {len(self.stale_runs)} stale restores contradicts a forgotten one"
            )
        self.check("votes_consistent", problems, passed)

    def check_rebuilt(self) -> None:
        """DESIGN §5: a sidecar rebuilt from the committed log holds, byte for byte, the
        state root, ledger and artifacts it held before its store was deleted."""
        if not self.wiped:
            return
        problems = []
        for wiped in self.wiped:
            node, before = wiped.node, wiped.before
            after = asyncio.run(read_sidecar(self.spec, node, before.height))
            where = f"sidecar {node} height {before.height}"
            if after.state_root != before.state_root:
                problems.append(
                    f"{where}: state root {_short(after.state_root)}, before "
                    f"{_short(before.state_root)}"
                )
            if after.ledger_head != before.ledger_head:
                problems.append(
                    f"{where}: ledger head {_short(after.ledger_head)}, before "
                    f"{_short(before.ledger_head)}"
                )
            if after.artifacts != before.artifacts:
                problems.append(self._artifact_difference(node, after.artifacts, before.artifacts))
            if wiped.replayed is not None and wiped.replayed.mismatches:
                problems += [f"sidecar {node} replay: {m}" for m in wiped.replayed.mismatches]
        rebuilt = ", ".join(
            f"sidecar {w.node} at height {w.before.height} ({w.before.ledger_entries} verdicts, "
            f"{len(w.before.artifacts)} artifacts; "
            f"{'replay' if w.replayed else 'its own re-execution'})"
            for w in self.wiped
        )
        self.check(
            "rebuilt_sidecar_identical", problems, f"identical to before the wipe: {rebuilt}"
        )

    def close(self) -> None:
        if self.load is not None:
            self.load.close()
        self.procs.close()


FAULTS: dict[str, Callable[[_Drill], None]] = {
    "leader-kill": _Drill.leader_kill,
    "wipe-replica": _Drill.wipe_replica,
    "full-restart": _Drill.full_restart,
    "sidecar-crash": _Drill.sidecar_crash,
    "stale-restore": _Drill.stale_restore,
    "byzantine": _Drill.byzantine,
}


# ---------------------------------------------------------------------------- entry points


def prepare_cluster(directory: Path, nodes: int) -> ClusterSpec:
    """The cluster in `directory`, made with `init_cluster` if it has no cluster file;
    `DrillError` for a cluster of another size or one with a process running."""
    if not (directory / CLUSTER_FILE).exists():
        try:
            return init_cluster(directory, nodes)
        except (ClusterFileError, OSError) as err:
            raise DrillError(str(err)) from err
    try:
        spec = load_cluster(directory)
    except ClusterFileError as err:
        raise DrillError(str(err)) from err
    if spec.n != nodes:
        raise DrillError(
            f"{directory} holds a {spec.n}-node cluster, not {nodes}: pass --nodes {spec.n} "
            "or use another --dir"
        )
    running = [
        f"{kind} {i} (pid {pid})"
        for i in range(spec.n)
        for kind in ("replica", "sidecar")
        if (pid := running_pid(spec, i, kind)) is not None
    ]
    if running:
        raise DrillError(
            f"the cluster in {directory} is running ({', '.join(running)}); a drill starts and "
            f"stops its own processes: `quorumgate down --dir {directory}` first"
        )
    return spec


def run_drill(
    name: str,
    directory: Path | str,
    *,
    nodes: int = 4,
    seconds: float = SECONDS_DEFAULT,
    rate_per_s: float | None = None,
    progress: ProgressFn | None = None,
) -> DrillReport:
    """Run drill `name` (one of DRILLS) against the cluster in `directory` and return its
    report. `DrillError` when it cannot run there. Every process it started is stopped
    before it returns or raises."""
    if name not in FAULTS:
        raise DrillError(f"unknown drill {name!r}; one of {', '.join(DRILLS)}")
    if seconds < SECONDS_MIN:
        raise DrillError(f"--seconds must be at least {SECONDS_MIN:g}")
    rate = RATE_PER_S_DEFAULT.get(nodes, RATE_PER_S_OTHER) if rate_per_s is None else rate_per_s
    if rate <= 0:
        raise DrillError("--rate must be positive")
    spec = prepare_cluster(Path(directory), nodes)
    drill = _Drill(name, spec, seconds, rate, progress)
    try:
        drill.run()
    finally:
        drill.close()
    report = drill.report
    report.duration_s = time.monotonic() - drill.t0
    if not report.ok:
        report.details["log_tails"] = {
            f"{kind}-{i}": log_tail(spec, i, 5, kind=kind)
            for i in range(spec.n)
            for kind in ("replica", "sidecar")
        }
    drill.say(f"done in {report.duration_s:.1f} s: {'ok' if report.ok else 'FAILED'}")
    return report


def _print_report(report: DrillReport) -> None:
    print(
        f"drill {report.drill}: {report.nodes} replicas (f={report.f}), {len(report.faults)} "
        f"faults in {report.seconds:g} s under {report.rate_per_s:g} proposals/s; "
        f"{report.duration_s:.1f} s in all"
    )
    print(
        f"acknowledged {report.acknowledged}, certified {report.certified}, lost {report.lost}, "
        f"duplicates {report.duplicates}, redelivered {report.redelivered}, diverged "
        f"{report.diverged}, equivocations {report.equivocations}"
    )
    last = "-" if report.recovery_s is None else f"{report.recovery_s:.2f} s"
    slowest = "-" if report.recovery_s_max is None else f"{report.recovery_s_max:.2f} s"
    print(f"recovery: last {last}, slowest {slowest}; final height {report.final_height}")
    for check in report.checks:
        print(f"  {'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}")
    print("OK" if report.ok else "FAILED: " + ", ".join(c.name for c in report.failed()))


def _cmd_drill(args: argparse.Namespace) -> int:
    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        report = run_drill(
            args.name,
            Path(args.dir),
            nodes=args.nodes,
            seconds=args.seconds,
            rate_per_s=args.rate,
            progress=None if args.quiet else progress,
        )
    except DrillError as err:
        print(f"quorumgate drill: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        _print_report(report)
    return 0 if report.ok else 1


def add_drill_command(sub: Any) -> None:
    """Register `quorumgate drill NAME --dir DIR [--nodes 4|7] [--seconds S] [--rate R]
    [--json] [--quiet]` on the CLI's subparsers (an `argparse._SubParsersAction`)."""
    drill = sub.add_parser(
        "drill",
        help="run a recovery drill against a live cluster under load, and check it",
        description="Run a recovery drill against a live cluster under load; exit 0 when "
        "every check holds, 1 when one fails, 2 when the drill cannot run in --dir.",
    )
    drill.add_argument("name", choices=DRILLS)
    drill.add_argument("--dir", required=True, help="cluster directory (made if it has none)")
    drill.add_argument("--nodes", type=int, default=4, help="4 or 7 (any 3f+1; default 4)")
    drill.add_argument(
        "--seconds",
        type=float,
        default=SECONDS_DEFAULT,
        help=f"how long faults keep coming under load (default {SECONDS_DEFAULT:g})",
    )
    drill.add_argument(
        "--rate",
        type=float,
        default=None,
        help="proposals offered per second (50 for 4 nodes, 30 for 7)",
    )
    drill.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    drill.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    drill.set_defaults(func=_cmd_drill)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m quorumgate.ops.drill NAME --dir DIR ...`, the same as `quorumgate drill`."""
    parser = argparse.ArgumentParser(prog="quorumgate")
    add_drill_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["drill", *(sys.argv[1:] if argv is None else argv)])
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
