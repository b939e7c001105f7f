"""Deterministic building blocks for the consensus tests: keys derived from names, signed
blocks, certificates and timeouts, and a tiny in-test network of cores (no simulator).

Everything is real Ed25519 (PyNaCl) and derived from fixed seeds: no randomness, no clock.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import Member, Membership
from quorumgate.replica.actions import (
    Action,
    Commit,
    PersistSafety,
    ScheduleTimeout,
    Send,
    StoreBlock,
    check_send_allowed,
)
from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core, Recovered
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.sim import Disk
from quorumgate.replica.sync import build_sync_response
from quorumgate.replica.types import (
    Block,
    Envelope,
    Message,
    Proposal,
    QuorumCert,
    SyncRequest,
    SyncResponse,
    Timeout,
    TimeoutCert,
    Vote,
    genesis_block,
    genesis_qc,
    proposal_bytes,
    timeout_bytes,
    vote_bytes,
)

CHAIN = "qg-test"
START_MS = 1_000_000
TICK_MS = 10

# Small timers so a test reaches many views in few ticks; everything else is the default.
TEST_LIMITS = Limits(
    view_timeout_ticks_base=10,
    view_timeout_ticks_max=40,
    idle_propose_ticks=2,
    sync_blocks_max=16,
    sync_retry_ticks=8,
    quiesce=False,  # these tests drive views with empty heartbeat blocks (no sidecar)
)


def key_seed(index: int, tag: str = "member") -> bytes:
    return hashlib.sha256(f"qg-test/{tag}/{index}".encode()).digest()


SIGNERS: tuple[Ed25519Signer, ...] = tuple(Ed25519Signer(key_seed(i)) for i in range(7))
OUTSIDER = Ed25519Signer(key_seed(0, "outsider"))


def membership(n: int = 4, chain: str = CHAIN) -> Membership:
    return Membership(chain, tuple(Member(i, SIGNERS[i].public_key) for i in range(n)))


# --------------------------------------------------------------------------- signed things


def signed_vote(voter: int, block: Block, chain: str = CHAIN) -> Vote:
    sig = SIGNERS[voter].sign(vote_bytes(chain, block.view, block.height, block.hash))
    return Vote(block.view, block.height, block.hash, voter, sig)


def qc_for(block: Block, voters: Iterable[int] = (0, 1, 2), chain: str = CHAIN) -> QuorumCert:
    """A genuine QC for `block`, signed by `voters` (sorted, distinct)."""
    sigs = tuple(
        (v, SIGNERS[v].sign(vote_bytes(chain, block.view, block.height, block.hash)))
        for v in sorted(voters)
    )
    return QuorumCert(block.view, block.height, block.hash, sigs)


def make_block(
    parent: Block,
    view: int,
    justify: QuorumCert | None = None,
    *,
    n: int = 4,
    proposer: int | None = None,
    timestamp_ms: int | None = None,
    chain: str = CHAIN,
    payload: tuple[bytes, ...] = (),
) -> Block:
    """A child of `parent` in `view`; `justify` defaults to a genuine QC of the parent."""
    if justify is None:
        justify = genesis_qc(chain) if parent.height == 0 else qc_for(parent, chain=chain)
    return Block.create(
        chain,
        parent.hash,
        view,
        parent.height + 1,
        justify,
        START_MS + view if timestamp_ms is None else timestamp_ms,
        view % n if proposer is None else proposer,
        payload,
        parent.state_root_height,
        parent.state_root,
    )


def chain_of(views: Sequence[int], *, n: int = 4, chain: str = CHAIN) -> list[Block]:
    """Genesis followed by one block per view, each extending the previous with its QC."""
    blocks = [genesis_block(chain)]
    for view in views:
        blocks.append(make_block(blocks[-1], view, n=n, chain=chain))
    return blocks


def signed_proposal(
    block: Block, high_tc: TimeoutCert | None = None, *, signer: int | None = None
) -> Proposal:
    who = block.proposer if signer is None else signer
    sig = SIGNERS[who].sign(proposal_bytes(block.chain_id, block.view, block.hash))
    return Proposal(block, sig, high_tc)


def signed_timeout(
    voter: int,
    view: int,
    high_qc: QuorumCert,
    high_tc: TimeoutCert | None = None,
    chain: str = CHAIN,
) -> Timeout:
    sig = SIGNERS[voter].sign(timeout_bytes(chain, view, high_qc.view))
    return Timeout(view, high_qc, voter, sig, high_tc)


def tc_from(timeouts: Iterable[Timeout]) -> TimeoutCert:
    signers = sorted(timeouts, key=lambda t: t.voter)
    high = max((t.high_qc for t in signers), key=lambda qc: qc.view)
    return TimeoutCert(
        signers[0].view, high, tuple((t.voter, t.high_qc.view, t.signature) for t in signers)
    )


def envelope(sender: int, message: Message, chain: str = CHAIN) -> Envelope:
    return Envelope(chain, sender, message)


def new_core(
    me: int,
    *,
    n: int = 4,
    limits: Limits = TEST_LIMITS,
    now_ms: int = START_MS,
    recovered: Recovered | None = None,
    fence_on_start: bool = False,
) -> Core:
    """A core for unit tests of the other rules: it starts unfenced (safety Rule 6's
    start-up handshake has tests of its own, in test_fencing.py)."""
    return Core(
        membership(n),
        me,
        SIGNERS[me],
        limits=limits,
        now_ms=now_ms,
        recovered=recovered,
        fence_on_start=fence_on_start,
    )


def sends(actions: Iterable[Action]) -> list[Send]:
    return [a for a in actions if isinstance(a, Send)]


M = TypeVar("M", Proposal, Vote, Timeout, TimeoutCert, SyncRequest, SyncResponse)


def sent_of(actions: Iterable[Action], kind: type[M]) -> list[M]:
    """The messages of type `kind` that `actions` send, in order."""
    return [a.message for a in actions if isinstance(a, Send) and isinstance(a.message, kind)]


# --------------------------------------------------------------------------- a tiny network


@dataclass
class Net:
    """n cores wired by a FIFO queue. Deterministic: every tick all up cores tick in index
    order, then messages are delivered until none is left. The shell contract is checked on
    every action list: a Send leaves only once its safety epoch is durable, commits extend
    the node's own committed chain, and no node signs two votes in one view."""

    n: int = 4
    limits: Limits = TEST_LIMITS
    now_ms: int = START_MS
    cores: list[Core] = field(default_factory=list)
    disks: list[Disk] = field(default_factory=list)
    durable: list[int] = field(default_factory=list)
    down: set[int] = field(default_factory=set)
    # (src, dst, message) -> True to lose the message
    drop: Callable[[int, int, Message], bool] | None = None
    log: list[tuple[int, list[Action]]] = field(default_factory=list)
    votes: dict[tuple[int, int], bytes] = field(default_factory=dict)
    delivered: int = 0
    _queue: deque[tuple[int, int, Message]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        for i in range(self.n):
            self.disks.append(Disk(SafetyState.initial(CHAIN), [genesis_block(CHAIN)]))
            self.durable.append(0)
            self.cores.append(new_core(i, n=self.n, limits=self.limits, now_ms=self.now_ms))

    def start(self) -> None:
        for i, core in enumerate(self.cores):
            self.apply(i, core.start())
        self.deliver_all()

    def wipe(self, i: int) -> None:
        """Member `i` comes back from an empty disk (genesis), with the same key."""
        self.disks[i] = Disk(SafetyState.initial(CHAIN), [genesis_block(CHAIN)])
        self.durable[i] = 0
        self.cores[i] = new_core(i, n=self.n, limits=self.limits, now_ms=self.now_ms)
        self.down.discard(i)
        self.apply(i, self.cores[i].start())

    def restart(self, i: int) -> None:
        """Member `i` crashes and comes back from what its disk holds."""
        disk = self.disks[i]
        committed = disk.committed[-1]
        pending = tuple(b for b in disk.blocks.values() if b.height > committed.height)
        recovered = Recovered(disk.safety, committed, pending)
        self.durable[i] = disk.safety.epoch
        self.cores[i] = new_core(
            i, n=self.n, limits=self.limits, now_ms=self.now_ms, recovered=recovered
        )
        self.down.discard(i)
        self.apply(i, self.cores[i].start())

    def apply(self, i: int, actions: list[Action]) -> None:
        self.log.append((i, actions))
        disk = self.disks[i]
        for action in actions:
            if isinstance(action, PersistSafety):
                assert action.state.epoch > self.durable[i], "safety epoch must grow"
                disk.safety = action.state
                self.durable[i] = action.state.epoch
            elif isinstance(action, StoreBlock):
                disk.blocks[action.block.hash] = action.block
            elif isinstance(action, Send):
                check_send_allowed(action, self.durable[i])
                msg = action.message
                if isinstance(msg, Vote):
                    prior = self.votes.setdefault((i, msg.view), msg.block_hash)
                    assert prior == msg.block_hash, f"node {i} voted twice in view {msg.view}"
                targets = [action.to] if action.to is not None else range(self.n)
                for to in targets:
                    if to != i:
                        self._queue.append((i, to, msg))
            elif isinstance(action, Commit):
                for block in action.blocks:
                    assert block.height == len(disk.committed), "commit skipped a height"
                    assert block.parent_hash == disk.committed[-1].hash, "commit off chain"
                    disk.committed.append(block)
                disk.proofs[action.blocks[-1].height] = action.proof

    def deliver_all(self, steps_max: int = 200_000) -> None:
        for _ in range(steps_max):
            if not self._queue:
                return
            src, to, msg = self._queue.popleft()
            if src in self.down or to in self.down:
                continue
            if self.drop is not None and self.drop(src, to, msg):
                continue
            self.delivered += 1
            if isinstance(msg, SyncRequest):
                response = build_sync_response(msg, self.disks[to], self.cores[to], self.limits)
                self._queue.append((to, src, response))
                continue
            self.apply(to, self.cores[to].on_message(Envelope(CHAIN, src, msg)))
        raise AssertionError("network did not quiesce")

    def tick(self, ticks: int = 1) -> None:
        for _ in range(ticks):
            self.now_ms += TICK_MS
            for i, core in enumerate(self.cores):
                if i not in self.down:
                    self.apply(i, core.on_tick(self.now_ms))
            self.deliver_all()

    def committed_heights(self) -> list[int]:
        return [len(d.committed) - 1 for d in self.disks]

    def assert_committed_prefixes(self) -> None:
        """Honest committed chains are prefixes of one another (HotStuff Theorem 2)."""
        longest = max(self.disks, key=lambda d: len(d.committed)).committed
        for i, disk in enumerate(self.disks):
            mine = [b.hash for b in disk.committed]
            assert mine == [b.hash for b in longest[: len(mine)]], f"node {i} forked"

    def scheduled(self, i: int) -> list[ScheduleTimeout]:
        return [a for j, acts in self.log if j == i for a in acts if isinstance(a, ScheduleTimeout)]
