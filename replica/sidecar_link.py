"""The replica's link to its own execution sidecar (docs/sidecar.md).

Two things cross it. The sidecar reports the state root of each height it executed, signed
with its member's receipt key of that height's epoch; the replica keeps the most recent ones
(`SidecarRoots`, the core's `ExecutionView`) and votes only for blocks whose carried root
matches. And before taking a client transaction into its mempool, the replica asks the
sidecar whether the engine would refuse it early (`admission`); the verdict at execution
stays the authority.

Which key signs the report of a height is decided from the committed change blocks alone
(`ReportKeys`): the member's receipt key of the epoch the height belongs to, and no key for
a height this replica has not committed (its epoch is not settled here yet). So a receipt
key rotated out at a boundary reports nothing above it, and replicas never disagree on
which report is valid (docs/consensus/epochs.md, "Receipt keys").
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.crypto import ed25519_verify
from quorumgate.proto.reports import root_report_statement
from quorumgate.replica.metrics import ReplicaMetrics
from quorumgate.runtime.channels import Reader, aio_channel

STATE_ROOTS_KEPT = 4_096
ADMIT_RPC_TIMEOUT_S = 2.0
EXECUTED_WAITERS_MAX = 256  # admission batches held waiting for the sidecar at once
REOPEN_GRACE_S = 5.0  # calls on a channel replaced after a TLS rotation may finish
ACCEPTED_SIGNERS_CACHED_MAX = 65_536  # signers remembered as accepted by our sidecar

log = logging.getLogger("quorumgate.replica")


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


@dataclass(frozen=True, slots=True)
class ReportKeys:
    """The receipt key our sidecar reports each height's root with: `starts` holds, oldest
    first, each epoch's first height and our member's receipt key in it (b"": none), as
    the committed change blocks leave them (replica/epochs.py `member_receipt_key`).
    `committed`: our committed height; a report above it names a height whose epoch this
    replica cannot tell yet (a change block may lie below it), so no key signs it."""

    starts: tuple[tuple[int, bytes], ...]
    committed: Callable[[], int] | None = None

    def at(self, height: int) -> bytes:
        if height < 1 or (self.committed is not None and height > self.committed()):
            return b""
        key = b""
        for first, epoch_key in self.starts:
            if first > height:
                break
            key = epoch_key
        return key


class SidecarLink:
    """The channel to this replica's sidecar, the roots it reported, and admission checks.

    `on_new_root` is called (from the event loop) each time a report adds a root, so that
    the consensus shell can wake its core.
    """

    def __init__(
        self,
        spec: ClusterSpec,
        index: int,
        metrics: ReplicaMetrics,
        on_new_root: Callable[[], None],
        reader: Reader,
        roots: Callable[[], bytes] | None = None,
    ) -> None:
        """`roots`: the certificates our sidecar may present, read when the channel is
        opened (the ones our node directory holds keys for: after a TLS rotation the
        sidecar moves to the new one when it executes the change block, which may be
        before or after we reach the boundary)."""
        self.spec = spec
        self._roots = roots
        self.index = index
        self.chain_id = spec.chain_id
        self.member = spec.member(index)
        self.metrics = metrics
        self.roots = SidecarRoots()
        # Until the shell says where its epochs start (`follow_epochs`): the cluster
        # file's key, for every height (a chain that runs no epochs keeps it).
        self.report_keys = ReportKeys(((1, self.member.receipt_public_key),))
        # The receipt keys that read as a sidecar's here: those of the epoch we run.
        self.readers: tuple[bytes, ...] = spec.receipt_keys
        self.epochs_followed = 0  # how many times the shell's epoch was handed over
        # The owner key our sidecar's state holds after an owner rotation, as of the
        # height of the report that carried it (None: the cluster file's still holds).
        self.owner_key: bytes | None = None
        self._owner_key_height = 0
        self._on_new_root = on_new_root
        self._reader = reader  # our consensus key: the sidecar answers admission to it only
        # Signers our sidecar accepted lately (LRU): their gossip skips the admission call.
        self._accepted_signers: OrderedDict[bytes, None] = OrderedDict()
        self._channel: grpc.aio.Channel | None = None
        self._closing: set[asyncio.Future[None]] = set()  # channels `reopen` replaced
        self._stub: spb_grpc.SidecarStub | None = None
        # Admission batches waiting for the sidecar to execute a height (bounded).
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def open(self) -> None:
        roots = None if self._roots is None or self.spec.insecure else self._roots()
        self._channel = aio_channel(
            self.spec, self.index, "sidecar", reader=self._reader, roots=roots
        )
        self._stub = spb_grpc.SidecarStub(self._channel)

    def reopen(self) -> None:
        """A new channel, trusting the certificates our node directory holds now; calls
        on the old one may finish within `REOPEN_GRACE_S` (closed in the background, so
        that the core loop does not wait)."""
        old = self._channel
        self.open()
        if old is not None:
            closing = asyncio.ensure_future(old.close(grace=REOPEN_GRACE_S))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    @property
    def executed_height(self) -> int:
        """The highest height the sidecar reported a root for (0 before any report)."""
        return self.roots.latest_root()[0]

    def follow_epochs(self, report_keys: ReportKeys, readers: tuple[bytes, ...]) -> None:
        """The shell's epochs, from its store's change blocks (at start and at each
        boundary): which key signs each height's report from here on, and the members'
        receipt keys of the epoch it runs, the ones that read as a sidecar's here."""
        self.report_keys = report_keys
        self.readers = readers
        self.epochs_followed += 1

    def on_state_root(
        self, height: int, root: bytes, signature: bytes, owner_key: bytes = b""
    ) -> bool:
        """A report from our sidecar; False (and nothing kept) if not signed by its
        member's receipt key of the height's epoch (`ReportKeys`): a key rotated out signs
        no report above the change block that ended its epoch. A rotated owner key it
        reports is the one our reads answer as the owner."""
        key = self.report_keys.at(height)
        message = root_report_statement(self.chain_id, height, root, owner_key)
        if not key or not ed25519_verify(key, message, signature):
            self.metrics.dropped.labels("bad_root_report").inc()
            return False
        if owner_key and height >= self._owner_key_height:
            self.owner_key, self._owner_key_height = owner_key, height
        if height < self.executed_height - STATE_ROOTS_KEPT // 2:
            self.roots.forget()  # our sidecar started over (replay): heights went back
        if self.roots.add(height, root):
            self._on_new_root()
            for wanted, waiter in self._waiters:
                if wanted <= height and not waiter.done():
                    waiter.set_result(None)
        return True

    async def wait_executed(self, height: int, timeout_s: float) -> bool:
        """Wait until the sidecar reported executing `height`, `timeout_s` at most; False
        if it did not (or `EXECUTED_WAITERS_MAX` batches already wait: no more are held)."""
        if self.executed_height >= height:
            return True
        if len(self._waiters) >= EXECUTED_WAITERS_MAX:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((height, waiter))
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            return False
        finally:
            self._waiters = [(h, w) for h, w in self._waiters if w is not waiter]
        return True

    async def admission(
        self, txs: list[bytes], signers: Sequence[bytes] = ()
    ) -> list[tuple[bool, str]]:
        """Ask our sidecar, in one call, whether the engine would refuse each of `txs`
        early (unknown agent or tool, replay...); their signatures were verified here. The
        verdict at execution stays the authority, so when the sidecar cannot answer the
        transactions go on to the mempool and to execution. `signers`, if given (one per
        transaction), are remembered where the sidecar accepted the transaction."""
        stub = self._stub
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
        answers = [(r.accepted, r.reason) for r in reply.replies]
        for signer, (accepted, _) in zip(signers, answers, strict=False):
            if accepted:
                self._remember_accepted(signer)
        return answers

    def accepted_before(self, signer: bytes) -> bool:
        """Whether our sidecar accepted a transaction of `signer` lately (a registered
        agent, principal or the owner, as far as admission goes): its gossiped
        transactions then skip the admission call."""
        return signer in self._accepted_signers

    def _remember_accepted(self, signer: bytes) -> None:
        cache = self._accepted_signers
        cache[signer] = None
        cache.move_to_end(signer)
        while len(cache) > ACCEPTED_SIGNERS_CACHED_MAX:
            cache.popitem(last=False)
