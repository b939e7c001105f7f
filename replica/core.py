"""The sans-I/O consensus core: chained HotStuff with the 2-chain commit rule.

A deterministic object. Events go in — `on_message`, `on_tick`, `on_transactions` — and a
list of actions comes out (replica/actions.py): persist, store, send, commit, schedule. It
imports no asyncio, gRPC, SQLite, clock or randomness (a test checks); time arrives as the
`now_ms` of each tick and only feeds block timestamps, and every timer counts ticks.

Protocol (HotStuff, PODC'19, §5 "chained HotStuff", with the 2-chain rules, pacemaker and
timeout certificates of Jolteon / DiemBFT v4):

- Views have round-robin leaders. The leader of view v proposes a block extending the
  highest QC it knows, carrying that QC as `justify` (and the TC of view v-1 when it
  entered v through one).
- Replicas vote (replica/safety.py, Rules 1-3) and *broadcast* their votes. Every replica
  forms QCs itself, the next leader included, the moment the last vote arrives: no one
  waits for a leader to pass a QC on in its next proposal, so a commit never depends on
  one leader doing so, and two consecutive honest leaders are all a commit needs.
- A QC for view v moves a replica to view v+1; a local timeout signs and broadcasts a
  `Timeout` carrying the signer's highest QC; 2f+1 timeouts form a TC that moves
  everyone to v+1, and the new leader extends the highest QC among them. f+1 timeouts for
  the current view make a replica time out too (Bracha-style), so one slow timer is enough.
- View timeouts double after every view left by a TC, up to a cap, and reset after a QC.
- Commit rule: replica/blocktree.py (2-chain, consecutive views).
- Leaders batch adaptively: they propose as soon as they may if transactions are waiting
  or an uncommitted block still carries some (it needs successors to commit); with
  nothing to do they wait `idle_propose_ticks` and then propose an empty heartbeat block.
- Quiescence (docs/consensus/protocol.md, "An idle cluster goes quiet"): once nothing is left to
  order — no transaction waits, no uncommitted block carries any, and a committed block carries the
  state root of the last height that did — leaders propose nothing and the view timer stands still,
  so an idle cluster sends nothing. The next transaction wakes the leader (`on_transactions`) and
  restarts every replica's timer, so a dead leader is still timed out.

Remote garbage raises `RemoteError` inside and is counted in `dropped` by reason; it never
leaves `on_message`. Our own broken invariants are assertions.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from quorumgate.proto.canonical import Encoder
from quorumgate.proto.crypto import Signer, Verifier
from quorumgate.proto.domains import HELLO_NONCE_DEFAULT
from quorumgate.proto.membership import Membership, OwnerRecords
from quorumgate.replica.actions import (
    Action,
    Commit,
    PersistSafety,
    ScheduleTimeout,
    Send,
    StoreBlock,
)
from quorumgate.replica.blocktree import BlockTree
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.config import Limits
from quorumgate.replica.epochs import (
    EpochEnd,
    boundary_index,
    change_in,
    check_epoch_page,
    one_record_at_most,
    record_of_another_epoch,
    start_qc,
    unsigned_record_in,
)
from quorumgate.replica.safety import SafetyError, SafetyRules, SafetyState
from quorumgate.replica.types import (
    HELLO_NONCE_BYTES,
    Block,
    CommitProof,
    Envelope,
    Hello,
    HelloReply,
    Proposal,
    QuorumCert,
    RemoteError,
    SyncRequest,
    SyncResponse,
    Timeout,
    TimeoutCert,
    Vote,
    genesis_block,
)
from quorumgate.replica.validate import check_envelope, check_sync_response

BACKOFF_EXPONENT_MAX = 16
# Signed answers to one start (nonce) of a member's Rule 6 hello: enough for the retries of
# its fencing (`fence_wait_ticks` / `sync_retry_ticks`, 4 by default) with some lost.
HELLO_REPLIES_PER_START_MAX = 8
# Views our highest QC may run ahead of the block we last committed before on_tick asks a
# peer for what it committed (a busy cluster commits every view or two).
COMMIT_LAG_VIEWS_MAX = 8


class PayloadSource(Protocol):
    """Where a leader's batch comes from and how a voter judges one (the mempool)."""

    def pending(self) -> bool:
        """Transactions are waiting to be proposed."""
        ...

    def take(self, chain: Sequence[Block], txs_max: int, bytes_max: int) -> tuple[bytes, ...]:
        """A batch for a block extending `chain` (uncommitted ancestors, oldest first),
        leaving out transactions those blocks already carry."""
        ...

    def check(self, block: Block) -> str | None:
        """None if the payload may be voted for, else the reason it may not."""
        ...

    def on_commit(self, blocks: Sequence[Block]) -> None:
        """`blocks` just committed: their transactions must never be proposed again. Called
        by the core at once, before it may lead another block (the shell's `Commit` action
        comes later, after the batch is durable)."""
        ...


class ExecutionView(Protocol):
    """What the replica knows of its sidecar's state roots (docs/sidecar.md)."""

    def latest_root(self) -> tuple[int, bytes]:
        """The highest executed height and its state root."""
        ...

    def root_at(self, height: int) -> bytes | None:
        """The state root after `height`, or None if not executed (or forgotten)."""
        ...


class NoPayload:
    """A payload source with nothing to offer that accepts only empty blocks."""

    def pending(self) -> bool:
        return False

    def take(self, chain: Sequence[Block], txs_max: int, bytes_max: int) -> tuple[bytes, ...]:
        return ()

    def check(self, block: Block) -> str | None:
        return None if not block.payload else "unexpected_payload"

    def on_commit(self, blocks: Sequence[Block]) -> None:
        return None


class NoExecution:
    """No sidecar: every block carries the empty root at height 0."""

    def latest_root(self) -> tuple[int, bytes]:
        return 0, b""

    def root_at(self, height: int) -> bytes | None:
        return b"" if height == 0 else None


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a restarting replica read back from disk."""

    safety: SafetyState
    committed: Block
    pending: tuple[Block, ...] = ()
    high_tc: TimeoutCert | None = None
    # The highest committed height whose block carries transactions, or any height from
    # there up to the committed top's state-root height (quiescence compares it with the
    # roots the chain carries, so both give the same answer). None: not known, taken as
    # the committed height, and quiescence then waits for that height's root to be
    # carried once more, which an already quiet cluster never proposes.
    payload_height: int | None = None
    # The previous epoch's change block, where the membership's epoch started (None in
    # epoch 0: at genesis). docs/consensus/epochs.md.
    boundary: Block | None = None


@dataclass(slots=True)
class CoreStats:
    qcs_formed: int = 0
    tcs_formed: int = 0
    timeouts_sent: int = 0
    proposals_made: int = 0
    votes_sent: int = 0
    views_entered: int = 0
    blocks_committed: int = 0
    sync_requests: int = 0
    late_messages: int = 0
    fenced: int = 0  # safety Rule 6: own signatures seen above what we remembered
    evicted: int = 0  # uncertified blocks of past views dropped from a full tree
    sync_target: int = 0  # the highest height a verified sync response proved
    refused: Counter[str] = field(default_factory=Counter)


class FollowerSigner:
    """The signer of a follower's core (`Core(follower=True)`): it holds the key of a
    member of the epoch only so that the safety rules can be built, and refuses to sign.
    A follower's core reaches no signing path (each is gated on `Core.follower`); this
    makes a path that slipped through fail loudly instead of sending a signature."""

    __slots__ = ("_public",)

    def __init__(self, public_key: bytes) -> None:
        self._public = public_key

    @property
    def public_key(self) -> bytes:
        return self._public

    def sign(self, message: bytes) -> bytes:
        raise AssertionError("a follower signs nothing")


class Core:
    """One replica's consensus state machine."""

    # Components a test may swap for deliberately broken ones (tests/consensus/variants.py).
    safety_rules_cls: type[SafetyRules] = SafetyRules
    block_tree_cls: type[BlockTree] = BlockTree

    # Long: the core's whole state, one field at a time, each with why it exists; kept in
    # one place so that what a core holds reads as one list.
    def __init__(
        self,
        membership: Membership,
        me: int,
        signer: Signer,
        *,
        limits: Limits | None = None,
        verifier: Verifier | None = None,
        payload: PayloadSource | None = None,
        execution: ExecutionView | None = None,
        recovered: Recovered | None = None,
        now_ms: int = 0,
        fence_on_start: bool = True,
        restored: bool = False,
        hello_nonce: bytes | None = None,
        epochs: bool = False,
        owner_records: OwnerRecords | None = None,
        follower: bool = False,
    ) -> None:
        """`follower`: we are no member of this epoch (`me` may be an index it does not
        have, or a member's index under a key we do not hold): the core signs, votes,
        proposes, times out and answers nothing, drops every member message, and takes
        the epoch's committed chain only from pages and the shell's epoch proof, until the
        epoch that makes us a member (docs/consensus/epochs.md, "Followers").
        `epochs`: committed reconfiguration records end the epoch (docs/consensus/
        epochs.md). Off, records are transactions like any other, as on every chain so far.
        `owner_records`: only records the owner signed count, and a block carrying an
        unsigned one is refused (the live replica; the simulator's owner is trusted)."""
        assert follower or membership.is_member(me), "not a member"
        assert fence_on_start or not restored, "a restore is always fenced (safety Rule 6)"
        self.membership = membership
        self.follower = follower
        if follower:
            # (Rule 6 guards what a member signs; a follower signs nothing to guard.)
            fence_on_start = restored = False
            signer = FollowerSigner(membership.key(0))
        self.me = me
        self.limits = limits or Limits()
        self.verifier = verifier or Verifier(self.limits.verified_cache_max)
        chain = membership.chain_id
        boundary = recovered.boundary if recovered is not None else None
        assert (boundary is None) == (membership.epoch == 0), "an epoch after 0 has a start"
        self.epoch = membership.epoch
        self.epochs = epochs
        self.owner_records = owner_records
        self.ended: EpochEnd | None = None  # set once the epoch's change block committed
        self.checker = CertificateChecker(membership, self.verifier, start_qc(chain, boundary))
        self.payload: PayloadSource = payload or NoPayload()
        self.execution: ExecutionView = execution or NoExecution()
        self._out: list[Action] = []
        self.dropped: Counter[str] = Counter()
        self.stats = CoreStats()
        self.now_ms = now_ms

        if recovered is None:
            recovered = Recovered(SafetyState.initial(chain), genesis_block(chain))
        self.safety = self.safety_rules_cls(
            0 if follower else me, signer, recovered.safety, self.checker, self._persist
        )
        self.tree = self.block_tree_cls(recovered.committed, self.limits.pending_blocks_max)
        # Recovered blocks go back within the bound: the certified chain (the high QC's
        # block and its ancestors) first, then the rest by height until the tree is full.
        pending = sorted(recovered.pending, key=lambda b: b.height)
        by_hash = {b.hash: b for b in pending}
        certified: set[bytes] = set()
        tip = recovered.safety.high_qc.block_hash
        while tip in by_hash and tip not in certified:
            certified.add(tip)
            tip = by_hash[tip].parent_hash
        for block in [b for b in pending if b.hash in certified] + [
            b for b in pending if b.hash not in certified
        ]:
            if self.tree.full:
                break
            if block.parent_hash in self.tree and block.height > self.tree.committed_height:
                self.tree.insert(block)

        self.view = 0
        self._ticks_in_view = 0
        self._timeout_ticks = self.limits.view_timeout_ticks_base
        self._backoff = 0
        self._timeout_sent_tick: int | None = None
        # view -> voter -> vote; view -> voter -> timeout (bounded by the view window)
        self._votes: dict[int, dict[int, Vote]] = {}
        self._timeouts: dict[int, dict[int, Timeout]] = {}
        self._late_timeouts: dict[int, int] = {}  # member -> highest late view answered
        self._proposal_seen: dict[int, bytes] = {}
        self._waiting: Proposal | None = None
        self._waiting_asks = 0  # catch-up requests made for the waiting proposal's parent
        # The highest committed height with transactions, from what the shell read back.
        self._payload_height = (
            self.tree.committed_height
            if recovered.payload_height is None
            else min(recovered.payload_height, self.tree.committed_height)
        )
        self._sync_peer: int | None = None
        self._sync_target = b""
        self._sync_ticks = 0
        self._sync_blocks_ask = self.limits.sync_blocks_max
        self._lacking_ticks = 0  # ticks our highest QC's block has been missing
        self._next_sync_peer = (me + 1) % membership.n
        self._started = False
        # Rule 6 at start: sign nothing until peers have answered (_try_end_fencing). A
        # start the shell declares a restore (its data may be older than what this member
        # signed) waits for 2f+1 answers, however long, and fences at their highest
        # certificate + 2; it answers no hello itself until it holds a certificate of the
        # view before that fence (`restoring`): until then what it holds may be stale.
        self._fencing = fence_on_start
        self._restored = restored
        self._restore_fence = 0
        # Fresh at every start (the shell draws it: the core holds no randomness); a reply
        # counts only if it repeats it, so a reply to an earlier start cannot be replayed.
        # The default, derived from the start state, is for tests and the simulator only.
        default_nonce = Encoder(HELLO_NONCE_DEFAULT).u32(me).u64(recovered.safety.epoch)
        self.hello_nonce = hello_nonce or default_nonce.digest()[:HELLO_NONCE_BYTES]
        self._hello_replies: dict[int, int] = {}
        self._hello_ticks = 0
        self._last_signed_by: dict[int, int] = {}  # member -> highest view seen it sign
        self._hellos_answered: dict[int, tuple[bytes, bytes, int]] = {}  # (nonce, sig, count)
        self.high_qc: QuorumCert = recovered.safety.high_qc
        self.high_tc: TimeoutCert | None = recovered.high_tc or recovered.safety.high_tc
        for block in sorted(recovered.pending, key=lambda b: b.height):
            if block.hash in self.tree:
                self._raise_high_qc(block.justify)
        self._start_view = max(
            self.high_qc.view + 1,
            (self.high_tc.view + 1) if self.high_tc else 0,
            recovered.safety.last_voted_view,
            1,
        )

    # ================================================================== events

    def start(self) -> list[Action]:
        """First call after construction: enter the starting view."""
        assert not self._started, "start called twice"
        self._started = True
        if self._fencing:
            self._out.append(Send(None, self.safety.sign_hello(self.hello_nonce)))
        self._enter_view(self._start_view, via_qc=False, initial=True)
        last = self.safety.state.last_timeout
        if last is not None and last.view == self.view:
            self._local_timeout()  # re-announce the timeout we signed before a restart
        return self._flush()

    # Long on purpose: one tick's steps (pacemaker, fencing, retries, sync, propose) in the
    # order they run; apart, that order would be spread over helpers each reading half the state.
    def on_tick(self, now_ms: int) -> list[Action]:
        """One pacemaker tick; `now_ms` is the shell's clock, used only for timestamps."""
        assert self._started, "start() first"
        if self.ended is not None or self.follower:
            # (the shell starts the next epoch's core; a follower has no pacemaker: its
            # pages come asked for by itself, once a later epoch's message reached it)
            return self._flush()
        self.now_ms = now_ms
        if self.quiescent():
            self._ticks_in_view = 0  # nothing to wait for: no view can fail
        else:
            self._ticks_in_view += 1
        if self._timeout_sent_tick is None:
            if self._ticks_in_view >= self._timeout_ticks:
                self._local_timeout()
        elif self._ticks_in_view - self._timeout_sent_tick >= self.limits.view_timeout_ticks_base:
            self._local_timeout()  # re-broadcast the same timeout while the view is stuck
            # Still no TC: most of the cluster is down, or it moved on without us (we
            # missed the votes that ended this view, and a quiet cluster sends nothing
            # more). Ask a peer for what it committed; its proof QC moves us on.
            self._request_sync(-1, b"")
        if self._fencing:
            self._hello_ticks += 1
            if self._hello_ticks % self.limits.sync_retry_ticks == 0:
                self._out.append(Send(None, self.safety.sign_hello(self.hello_nonce)))
            self._try_end_fencing()
        self._retry_waiting()
        self._sync_ticks += 1
        if self._sync_peer is not None and self._sync_ticks >= self.limits.sync_retry_ticks:
            # No answer: the next request goes to another peer, and asks for half as many
            # blocks (an answer too large for the transport never arrives at all).
            self._sync_peer = None
            self._sync_blocks_ask = max(1, self._sync_blocks_ask // 2)
        waiting = self._waiting
        if (
            waiting is not None
            and self._sync_peer is None
            and self._sync_ticks >= self.limits.sync_retry_ticks
        ):
            # A proposal still waits for blocks (the last answer failed or was a lie).
            # Each other member is asked once at most: if none of them holds the parent,
            # no honest one does, and asking on would go on for as long as the view lasts,
            # which in a quiet cluster is for ever.
            if waiting.block.view != self.view:
                self._waiting = None
            elif self._waiting_asks >= self.membership.n - 1:
                self._waiting = None
                self.dropped["parent_unavailable"] += 1
            elif self._request_sync(-1, waiting.block.parent_hash):
                self._waiting_asks += 1
        self._lacking_ticks = self._lacking_ticks + 1 if self._lacks_certified_block() else 0
        if (
            self._lacking_ticks > self.limits.idle_propose_ticks
            and self._sync_peer is None
            and self._sync_ticks >= self.limits.sync_retry_ticks
        ):
            # We hold a QC for a block we never took in (its proposal missed us, or came
            # when our sidecar could not yet judge its state root). A busy cluster's next
            # proposal would make us fetch it, a heartbeat within idle_propose_ticks (so
            # votes that overtook a proposal cost no request); a quiet one sends none, so
            # ask a signer.
            self._request_sync(self._next_signer(self.high_qc), self.high_qc.block_hash)
        if (
            self.high_qc.view > self.tree.root.view + COMMIT_LAG_VIEWS_MAX
            and self._sync_peer is None
            and self._sync_ticks >= self.limits.sync_retry_ticks
            and not self.quiescent()
        ):
            # Blocks get certified far past the last one we committed, yet we commit none:
            # the 2-chain that committed our peers' next block formed without us (its QC
            # never reached us), and a quiet cluster's heartbeats, led every other view by a
            # replica with nothing to order, are never certified in consecutive views. Ask
            # a signer for what it committed (nothing, if the cluster committed nothing).
            self._request_sync(self._next_signer(self.high_qc), b"")
        self._maybe_propose()
        return self._flush()

    def on_transactions(self, now_ms: int | None = None) -> list[Action]:
        """The payload source has new transactions: a waiting leader may propose now.
        `now_ms`, if given, is the shell's clock (an idle shell ticks rarely: replica/node.py),
        so the block's timestamp is not the last tick's."""
        if now_ms is not None:
            self.now_ms = max(self.now_ms, now_ms)
        if self.ended is None and not self.follower:
            self._maybe_propose()
        return self._flush()

    def on_message(self, envelope: Envelope) -> list[Action]:
        """A peer's message. Whatever it holds, this either acts on a well-formed message
        or counts it in `dropped` by reason; it raises nothing (a malformed sync response
        once raised out of here and silently killed the replica's core task)."""
        try:
            if self.follower:
                raise RemoteError("follower", "no member message is for a follower")
            self._check_epoch(envelope.epoch)
            check_envelope(envelope, self.membership, self.limits)
            sender = envelope.sender
            if not self.membership.is_member(sender) or sender == self.me:
                raise RemoteError("non_member", f"sender {sender}")
            msg = envelope.message
            if isinstance(msg, Proposal):
                self._on_proposal(sender, msg)
            elif isinstance(msg, Vote):
                self._bound_to_sender(msg.voter, sender, "vote")
                self._on_vote(msg, local=False)
            elif isinstance(msg, Timeout):
                self._bound_to_sender(msg.voter, sender, "timeout")
                self._on_timeout(msg, local=False)
            elif isinstance(msg, TimeoutCert):
                self.checker.check_tc(msg)
                self._process_tc(msg)
            elif isinstance(msg, SyncResponse):
                self._on_sync_response(sender, msg)
            elif isinstance(msg, SyncRequest):
                raise RemoteError("unexpected", "sync requests are served by the shell")
            elif isinstance(msg, Hello):
                self._on_hello(sender, msg)
            elif isinstance(msg, HelloReply):
                self._on_hello_reply(sender, msg)
            else:  # pragma: no cover - the Message union is closed
                raise RemoteError("malformed", "unknown message type")
        except RemoteError as err:
            self.dropped[err.reason] += 1
        return self._flush()

    def _check_epoch(self, epoch: int) -> None:
        """A message of another epoch is judged by no one here: its signatures name that
        epoch and its members (docs/consensus/epochs.md). After our own epoch ended, every
        message waits for the next one's core."""
        if self.ended is not None:
            raise RemoteError("epoch_ended", f"epoch {self.epoch} ended")
        if epoch != self.epoch:
            reason = "stale_epoch" if epoch < self.epoch else "future_epoch"
            raise RemoteError(reason, f"message of epoch {epoch} in epoch {self.epoch}")

    # ================================================================== queries

    @property
    def leader(self) -> int:
        return self.membership.leader(self.view)

    @property
    def committed_height(self) -> int:
        return self.tree.committed_height

    @property
    def fencing(self) -> bool:
        """Safety Rule 6 at start: still waiting for peers' answers, signing nothing."""
        return self._fencing

    @property
    def restore_fence(self) -> int:
        """A declared restore's fence once it is past it (safety Rule 6: fenced, and holding
        a certificate of the view before), else 0. From then on a restart in this epoch
        may be a plain one; the shell keeps the restore declared for the epochs after it
        until this one has committed a block of the view before the fence
        (docs/consensus/fencing.md, "Across an epoch boundary")."""
        return self._restore_fence if self._restored and not self.restoring else 0

    @property
    def restoring(self) -> bool:
        """A declared restore that has not yet fenced, or whose highest certificate is
        still below the view before its fence: what it holds may be older than what it
        signed, so it answers no hello (another restore must not count it)."""
        if not self._restored:
            return False
        return self._fencing or self._certified_view() < self._restore_fence - 1

    def _certified_view(self) -> int:
        """The highest view a verified certificate we hold ended (a QC or a TC)."""
        return max(self.high_qc.view, self.high_tc.view if self.high_tc else 0)

    def quiescent(self) -> bool:
        """Nothing to order: no transaction waits, no uncommitted block carries any, and
        the committed chain carries the state root of the last height that did."""
        if not self.limits.quiesce:
            return False
        if self.tree.root.state_root_height < self._payload_height or self.payload.pending():
            return False
        return not any(block.payload for block in self.tree.blocks())

    def needs_ticks(self) -> bool:
        """False while ticks would change nothing: quiescent, not fencing, no catch-up
        under way and no proposal waiting. A shell may then stop ticking until the next
        event (a message, a transaction, a state root)."""
        idle = (
            self._sync_peer is None
            and self._waiting is None
            and not self._fencing
            and not self._lacks_certified_block()
        )
        return not (idle and self.quiescent())

    def _lacks_certified_block(self) -> bool:
        """Our highest QC certifies a block we do not hold (on_tick fetches it)."""
        return self.high_qc.block_hash not in self.tree

    def pending_chain(self, target_hash: bytes, blocks_max: int) -> list[Block]:
        """Uncommitted blocks from above the committed root up to `target_hash` (for sync)."""
        if target_hash and target_hash in self.tree:
            return self.tree.uncommitted_chain(target_hash)[:blocks_max]
        return []

    # ================================================================== internals

    def _flush(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    def _persist(self, state: SafetyState) -> None:
        self._out.append(PersistSafety(state))

    def _check_against_block(self, qc: QuorumCert) -> None:
        """A verified QC names its block's view and height (both signed by every vote): a
        block we hold that disagrees would take 2f+1 signers lying, more than the f faulty
        members there can be. Refused all the same, never corrected."""
        block = self.tree.get(qc.block_hash)
        if block is not None and (block.view, block.height) != (qc.view, qc.height):
            raise RemoteError("bad_certificate", f"{qc!r} does not match {block!r}")

    def _raise_high_qc(self, qc: QuorumCert) -> None:
        self._check_against_block(qc)
        if qc.view > self.high_qc.view:
            self.high_qc = qc
            for view in [v for v in self._votes if v <= qc.view]:
                del self._votes[view]

    # ------------------------------------------------------------------ views

    def _enter_view(self, view: int, *, via_qc: bool, initial: bool = False) -> None:
        assert view > self.view, f"view must grow: {self.view} -> {view}"
        self.view = view
        self.stats.views_entered += 1
        if via_qc:
            self._backoff = 0
        elif not initial:
            self._backoff = min(self._backoff + 1, BACKOFF_EXPONENT_MAX)
        self._timeout_ticks = min(
            self.limits.view_timeout_ticks_base << self._backoff,
            self.limits.view_timeout_ticks_max,
        )
        self._ticks_in_view = 0
        self._timeout_sent_tick = None
        for old in [v for v in self._timeouts if v < view]:
            del self._timeouts[old]
        for old in [v for v in self._proposal_seen if v < view]:
            del self._proposal_seen[old]
        for old in [v for v in self._votes if v < view - self.limits.vote_views_max]:
            del self._votes[old]
        self._out.append(ScheduleTimeout(view, self._timeout_ticks, self.leader))
        self._maybe_propose()
        waiting = self._waiting
        if waiting is not None and waiting.block.view < view:
            self._waiting = None
        # Timeouts already gathered for the new view may warrant joining them.
        self._check_timeout_amplification()

    def _try_commit(self, qc: QuorumCert) -> None:
        """Apply the commit rule to a verified QC (replica/blocktree.py)."""
        committed = self.tree.two_chain(qc)
        if committed is not None and self.ended is None:
            blocks, proof = committed
            assert proof.b1.parent_hash == blocks[-1].hash, "proof does not prove the commit"
            cut = (
                boundary_index(blocks, self.membership, self.owner_records) if self.epochs else None
            )
            if cut is not None:
                self._end_epoch(blocks, cut, (*blocks[cut + 1 :], *proof.blocks), proof.qc)
                return
            self.tree.commit(blocks[-1])
            self.payload.on_commit(blocks)
            for block in blocks:
                if block.payload:
                    self._payload_height = max(self._payload_height, block.height)
            self.stats.blocks_committed += len(blocks)
            self._out.append(Commit(tuple(blocks), proof))

    def _end_epoch(
        self, blocks: Sequence[Block], cut: int, suffix: tuple[Block, ...], qc: QuorumCert
    ) -> None:
        """The change block `blocks[cut]` committed: commit up to it and no further (the
        blocks after it are the old epoch's suffix, empty and never committed), and end
        the epoch (docs/consensus/epochs.md, "Where an epoch ends")."""
        boundary = blocks[cut]
        nxt = change_in(boundary, self.membership, self.owner_records)
        assert nxt is not None, "the cut is a change block"
        done = list(blocks[: cut + 1])
        self.tree.commit(boundary)
        self.payload.on_commit(done)
        self.stats.blocks_committed += len(done)
        # The proof that the shell stores beside a commit proves the last block; this one
        # proves a descendant of it, so the shell keeps `ended` instead.
        proof = CommitProof.two_chain(suffix[-1], qc)
        self.ended = EpochEnd(boundary, nxt, suffix, qc)
        self._out.append(Commit(tuple(done), proof))

    def _process_certs(self, qc: QuorumCert, tc: TimeoutCert | None = None) -> None:
        """Verified certificates: raise the highest QC and TC, commit, then enter the
        highest view they justify, once."""
        self._check_against_block(qc)
        self._fence_on_own_signatures(qc, tc)
        self._raise_high_qc(qc)
        if tc is not None:
            # Our timeouts carry our highest QC, never below one a TC we hold vouches for
            # (Rule 6's argument counts on it for a restored replica past its fence).
            self._raise_high_qc(tc.high_qc)
        self._try_commit(qc)
        if tc is not None and (self.high_tc is None or tc.view > self.high_tc.view):
            self.high_tc = tc
        if tc is not None and tc.view >= self.view and tc.view > qc.view:
            self._enter_view(tc.view + 1, via_qc=False)
        elif qc.view >= self.view:
            self._enter_view(qc.view + 1, via_qc=True)

    def _fence_on_own_signatures(self, qc: QuorumCert, tc: TimeoutCert | None) -> None:
        """Safety Rule 6: our own signature in a certificate above our last voted view
        means we were restored from an old copy of our data; never sign those views again.
        (A follower's index may be a member's it is not: their signatures are not ours.)"""
        if self.follower:
            return
        me = self.me
        voted = qc.view if any(s == me for s, _ in qc.signatures) else 0
        if tc is not None and any(s == me for s, _, _ in tc.signatures):
            voted = max(voted, tc.view)
        if voted > self.safety.state.last_voted_view:
            self.safety.fence(voted_view=voted)
            self.stats.fenced += 1

    def _on_hello(self, sender: int, hello: Hello) -> None:
        """Answer a (re)started member's Rule 6 question, for each of its starts (nonces)
        at most HELLO_REPLIES_PER_START_MAX times: it asks again every `sync_retry_ticks`
        while it fences, in case answers were lost, and copies beyond that cost neither a
        signature check nor a signed reply. The memory is one entry per member."""
        nonce, signature, answered = self._hellos_answered.get(sender, (b"", b"", 0))
        same = nonce == hello.nonce and signature == hello.signature
        if same and answered >= HELLO_REPLIES_PER_START_MAX:
            raise RemoteError("duplicate", f"hello of member {sender}, answered {answered} times")
        if not same:
            self.checker.check_hello(sender, hello)
            answered = 0
        if self.restoring:
            # Rule 6: until past its fence a restored replica vouches for no one's
            # (docs/consensus/fencing.md, "What a declared restore does").
            raise RemoteError("hello_while_restoring", f"from {sender}")
        self._hellos_answered[sender] = (hello.nonce, hello.signature, answered + 1)
        seen = self._last_signed_by.get(sender, 0)
        reply = self.safety.sign_hello_reply(
            sender, hello.nonce, seen, self.view, self.high_qc, self.high_tc
        )
        self._out.append(Send(sender, reply))

    def _on_hello_reply(self, sender: int, reply: HelloReply) -> None:
        if not self._fencing:
            return
        if reply.asker != self.me or reply.nonce != self.hello_nonce:
            raise RemoteError("stale_hello_reply", f"from {sender}, not for this start")
        self.checker.check_hello_reply(sender, reply)
        self.checker.check_qc(reply.high_qc)
        if reply.high_tc is not None:
            self.checker.check_tc(reply.high_tc)
        self._process_certs(reply.high_qc, reply.high_tc)
        self._hello_replies[sender] = reply.last_signed_view
        self._try_end_fencing()

    def _try_end_fencing(self) -> None:
        """Rule 6 at start (replica/safety.py has the argument).

        A restore (`restored`): once 2f+1 peers have answered, and never before, fence at
        the highest view a verified certificate we now hold ended, + 2. Each answer
        carries its sender's highest QC and TC; among 2f+1 answers is an honest signer of
        the certificate that let us sign in our highest forgotten view v, and it holds a
        certificate of v-2. A lying peer can only show a real certificate, so it makes us
        skip at most two views past one the cluster really reached.

        A plain start, from data this replica made durable itself, has forgotten nothing
        (persist before send): fencing there guards against a restore nobody declared,
        and is best effort. It fences at the highest view the answers saw it sign in,
        capped at the certified view + 2, and after `fence_wait_ticks` f+1 answers do.
        That misses a signature still in flight when the peers answered, and trusts f+1
        answers that may include f liars: docs/consensus/fencing.md."""
        replies = len(self._hello_replies)
        quorum_of_peers = self.membership.quorum
        certified = self._certified_view()
        if self._restored:
            if replies < quorum_of_peers:
                return
            fence = certified + 2
            self._restore_fence = fence
        else:
            waited = self._hello_ticks >= self.limits.fence_wait_ticks
            if replies < quorum_of_peers and not (waited and replies >= self.membership.f + 1):
                return
            reported = max(self._hello_replies.values())
            # A view the answers saw us sign in and our disk remembers signing in (a
            # proposal is a signature too) is no sign of a forgotten one: fencing it would
            # only keep us from timing out there (Rule 6 c) when the view before it ended
            # by a TC, and an ordinary restart must rejoin with f members silent.
            state = self.safety.state
            remembered = max(state.last_voted_view, state.last_proposed_view)
            fence = 0 if reported <= remembered else min(reported, certified + 2)
        if self.safety.fence(fence, fence, self.high_qc, self.high_tc):
            self.stats.fenced += 1
        self._fencing = False
        self._retry_waiting()
        self._maybe_propose()

    def _saw_signature(self, member: int, view: int) -> None:
        if view > self._last_signed_by.get(member, 0):
            self._last_signed_by[member] = view

    def _process_qc(self, qc: QuorumCert) -> None:
        self._process_certs(qc)

    def _process_tc(self, tc: TimeoutCert) -> None:
        self._raise_high_qc(tc.high_qc)
        self._process_certs(tc.high_qc, tc)

    def _inserted(self, block: Block) -> None:
        """A block entered the tree: a QC we already hold may now complete a 2-chain."""
        if block.proposer == self.me and block.view > self.safety.state.last_proposed_view:
            # Our own proposal, which we do not remember making (safety Rule 6).
            self.safety.fence(proposed_view=block.view)
            self.stats.fenced += 1
        self._out.append(StoreBlock(block))
        if self.high_qc.block_hash == block.hash:
            self._try_commit(self.high_qc)

    # ------------------------------------------------------------------ proposing

    def _entered_legitimately(self) -> TimeoutCert | bool:
        """The certificate that lets this view be led: True for a QC, the TC, or False."""
        if self.high_qc.view == self.view - 1:
            return True
        if self.high_tc is not None and self.high_tc.view == self.view - 1:
            return self.high_tc
        return False

    def _maybe_propose(self) -> None:
        if self.follower or self._fencing or self.ended is not None:
            return
        if self.leader != self.me or self.safety.state.last_proposed_view >= self.view:
            return
        entry = self._entered_legitimately()
        if entry is False:
            return
        parent = self.tree.get(self.high_qc.block_hash)
        if parent is None:
            signers = [s for s, _ in self.high_qc.signatures if s != self.me]
            if signers:
                self._request_sync(signers[0], self.high_qc.block_hash)
            return
        if self.tree.full:
            self._evict_stale()
        if self.tree.full:
            return
        if parent.timestamp_ms + 1 > self.now_ms + self.limits.timestamp_ahead_ms_max:
            # Our clock is behind our parent's time by more than voters allow ahead of
            # theirs (a faster clock stamped it, within the bound): a block now would be
            # refused by voters whose clocks read as ours. Wait for the clock.
            return
        chain = self.tree.uncommitted_chain(parent.hash)
        ready = (
            self.payload.pending()
            or any(block.payload for block in chain)
            or (self._ticks_in_view >= self.limits.idle_propose_ticks and not self.quiescent())
        )
        if not ready:
            return
        limits = self.limits
        txs = self.payload.take(chain, limits.batch_txs_max, limits.batch_bytes_max)
        if self.epochs and self._change_pending(chain):
            txs = ()  # the suffix of a change block carries nothing (docs/consensus/epochs.md)
        elif self.epochs:
            txs = one_record_at_most(txs, self.owner_records)
        assert len(txs) <= limits.batch_txs_max, "payload source broke the batch count limit"
        assert sum(map(len, txs)) <= limits.batch_bytes_max, "payload source broke byte limit"
        justify = self.high_qc
        if justify.height != parent.height:
            return  # (a QC whose signed height is not its block's: see _check_against_block)
        root_height, root = parent.state_root_height, parent.state_root
        latest_height, _ = self.execution.latest_root()
        carried = min(latest_height, parent.height + 1 - self.limits.state_root_lag_blocks)
        if carried > root_height:
            known = self.execution.root_at(carried)
            if known is not None:
                root_height, root = carried, known
        block = Block.create(
            self.membership.chain_id,
            parent.hash,
            self.view,
            parent.height + 1,
            justify,
            max(self.now_ms, parent.timestamp_ms + 1),
            self.me,
            txs,
            root_height,
            root,
        )
        high_tc = entry if isinstance(entry, TimeoutCert) else None
        try:
            signed = self.safety.sign_proposal(block, high_tc)
        except SafetyError as err:
            self.stats.refused[f"rule{err.rule}"] += 1
            return
        self.stats.proposals_made += 1
        self._out.append(Send(None, signed.value, signed.epoch))
        self._accept_proposal(block)

    # ------------------------------------------------------------------ receiving proposals

    def _on_proposal(self, sender: int, proposal: Proposal) -> None:
        block = proposal.block
        if sender != block.proposer:
            raise RemoteError("not_leader", f"proposal for view {block.view} relayed by {sender}")
        if self._took_in(block):
            raise RemoteError("duplicate", f"proposal for view {block.view}")  # unchecked
        self.checker.check_proposal(proposal)
        self._saw_signature(block.proposer, block.view)
        # Certificates first: they are how a replica learns that views moved on.
        self._process_certs(block.justify, proposal.high_tc)
        if self._conflicts_with_commit(block):
            # It can never be voted for, and waiting for its parent would never end
            # (docs/consensus/messages.md, "Stale proposals"). Its copies: _took_in.
            if block.view == self.view:
                self._proposal_seen.setdefault(block.view, block.hash)
            raise RemoteError("stale_proposal", f"height {block.height} of view {block.view}")
        if block.view < self.view:
            # Late (votes overtook it): keep the block, since a 2-chain may need it.
            # Only the block our highest QC certifies, though: a leader proposes once per view,
            # so any other late block for a past view is an equivocation, not one to keep.
            parent = self.tree.get(block.parent_hash)
            certified = block.hash == self.high_qc.block_hash
            if certified and parent is not None and block.hash not in self.tree:
                self._validate(block, parent)
                self.tree.insert(block)
                self._inserted(block)
            self.stats.late_messages += 1
            return
        if block.view > self.view:
            raise RemoteError("view_not_justified", f"proposal view {block.view}")
        seen = self._proposal_seen.get(block.view)
        if seen is not None:
            reason = "duplicate" if seen == block.hash else "equivocating_proposal"
            raise RemoteError(reason, f"second proposal for view {block.view}")
        # Without the parent, or without having committed the height whose state root the
        # block carries, this replica cannot judge the block: fetch what it lacks first.
        if (
            block.parent_hash not in self.tree
            or block.state_root_height > self.tree.committed_height
        ):
            self._waiting = proposal
            self._waiting_asks = int(self._request_sync(sender, block.parent_hash))
            return
        if self._root_pending(block):
            # Our own sidecar has not executed that height yet: wait for it (until the
            # view ends) rather than refuse; on_tick and on_state_root try again.
            self._waiting = proposal
            return
        self._accept_proposal(block)

    def _took_in(self, block: Block) -> bool:
        """We hold `block`, saw it proposed for the current view, or keep its proposal
        waiting: a copy is dropped before its signature is checked, and a waiting one
        does not start its wait again. (A copy of a late proposal we did not keep costs
        one check, as any message with a signature does; it makes us send nothing.)"""
        if block.hash in self.tree or self._proposal_seen.get(block.view) == block.hash:
            return True
        waiting = self._waiting
        return waiting is not None and waiting.block.hash == block.hash

    def _conflicts_with_commit(self, block: Block) -> bool:
        """`block` is at or below the committed height, or extends a block at that height
        other than the committed one: it conflicts with the committed chain, so no honest
        replica votes for it (HotStuff's safety: no conflicting block is ever certified)
        and no honest leader proposes it (one extends its highest QC, which is at least
        the lock of the QC that committed). Its parent, if pruned, is never fetched."""
        root = self.tree.root
        if block.height <= root.height:
            return True
        return block.height == root.height + 1 and block.parent_hash != root.hash

    def _root_pending(self, block: Block) -> bool:
        return (
            block.state_root_height > 0
            and self.execution.root_at(block.state_root_height) is None
            and block.state_root_height > self.execution.latest_root()[0]
        )

    def on_state_root(self) -> list[Action]:
        """The sidecar reported a new state root: a proposal waiting for it may go on."""
        self._retry_waiting()
        return self._flush()

    def _retry_waiting(self) -> None:
        waiting = self._waiting
        if waiting is None:
            return
        block = waiting.block
        if (
            block.view != self.view
            or block.view in self._proposal_seen
            or self._conflicts_with_commit(block)  # a commit since passed its height
        ):
            self._waiting = None
            return
        if block.parent_hash in self.tree and not self._root_pending(block):
            self._waiting = None
            try:
                self._accept_proposal(block)
            except RemoteError as err:
                self.dropped[err.reason] += 1

    def _validate(self, block: Block, parent: Block) -> None:
        limits = self.limits
        if parent.height != block.justify.height or parent.view != block.justify.view:
            raise RemoteError("malformed", "justify does not match the parent block")
        if len(block.payload) > limits.batch_txs_max or block.payload_bytes > (
            limits.batch_bytes_max
        ):
            raise RemoteError("oversized_batch", f"{len(block.payload)} transactions")
        if any(len(tx) > limits.tx_bytes_max for tx in block.payload):
            raise RemoteError("oversized_batch", "transaction over tx_bytes_max")
        if block.timestamp_ms <= parent.timestamp_ms:
            raise RemoteError("bad_timestamp", "block time not after its parent's")
        ahead_ms = block.timestamp_ms - self.now_ms
        if ahead_ms > limits.timestamp_ahead_ms_max:
            raise RemoteError("bad_timestamp", f"block time {ahead_ms} ms ahead of ours")
        if -ahead_ms > limits.timestamp_behind_ms_max:
            raise RemoteError("bad_timestamp", f"block time {-ahead_ms} ms behind ours")
        if block.state_root_height < parent.state_root_height:
            raise RemoteError("bad_state_root", "state root height went backwards")
        if block.state_root_height == parent.state_root_height:
            if block.state_root != parent.state_root:
                raise RemoteError("bad_state_root", "state root changed at the same height")
        else:
            mine = self.execution.root_at(block.state_root_height)
            if mine is None:
                raise RemoteError("state_root_unknown", f"height {block.state_root_height}")
            if mine != block.state_root:
                raise RemoteError("bad_state_root", f"height {block.state_root_height}")
        reason = self.payload.check(block)
        if reason is not None:
            raise RemoteError("invalid_payload", reason)
        if self.epochs and block.payload:
            self._check_changes(block, parent)

    def _check_changes(self, block: Block, parent: Block) -> None:
        """A block after an uncommitted change block carries nothing, and a block carries
        one reconfiguration record at most (docs/consensus/epochs.md, "The record"), and
        only one the owner signed where records must be signed ("Who may change the
        member set")."""
        owner = self.owner_records
        if owner is not None and unsigned_record_in(block.payload, owner):
            raise RemoteError("unsigned_change", f"block of view {block.view}")
        if owner is not None and record_of_another_epoch(block.payload, owner, self.epoch):
            raise RemoteError("stale_change", f"block of view {block.view}")
        if self._change_pending(self.tree.uncommitted_chain(parent.hash)):
            raise RemoteError("payload_after_change", f"block of view {block.view}")
        if one_record_at_most(block.payload, owner) != block.payload:
            raise RemoteError("two_changes", f"block of view {block.view}")

    def _change_pending(self, chain: Sequence[Block]) -> bool:
        """An uncommitted block of `chain` changes the member set: blocks after it are the
        epoch's suffix, which carries no transactions (they would never be committed)."""
        return boundary_index(chain, self.membership, self.owner_records) is not None

    def _accept_proposal(self, block: Block) -> None:
        parent = self.tree.get(block.parent_hash)
        assert parent is not None, "accept needs the parent"
        if block.proposer != self.me:
            self._validate(block, parent)
        if self.tree.full and block.hash not in self.tree:
            self._evict_stale()
        if self.tree.full and block.hash not in self.tree:
            raise RemoteError("tree_full", f"{len(self.tree)} pending blocks")
        if self.tree.insert(block):
            self._inserted(block)
        self._proposal_seen[block.view] = block.hash
        if self._fencing or self.ended is not None:
            return  # kept, but not voted for: we do not yet know which views we signed in
        try:
            signed = self.safety.vote(block, parent, self.high_qc, self.high_tc)
        except SafetyError as err:
            self.stats.refused[f"rule{err.rule}"] += 1
            return
        self.stats.votes_sent += 1
        self._out.append(Send(None, signed.value, signed.epoch))
        self._on_vote(signed.value, local=True)

    def _evict_stale(self) -> None:
        """Make room in a full tree (views that ended by timeout, each leaving an uncertified
        block, would otherwise fill it for good, and only a commit prunes). Kept: the chain
        the highest QC certifies, the locked block's chain, and every block of the current
        view or later with its ancestors. The rest are uncertified blocks of past views: no
        honest leader extends them (a new proposal extends the highest QC), and one that
        still gets certified later is fetched again like any block we lack."""
        tips = [self.high_qc.block_hash, self.safety.state.locked_qc.block_hash]
        tips += [b.hash for b in self.tree.blocks() if b.view >= self.view]
        evicted = self.tree.retain(tips)
        if evicted:
            self.stats.evicted += evicted

    # ------------------------------------------------------------------ votes

    def _echo_of_own(self, voter: int, view: int, kind: str) -> None:
        """A vote or timeout of ours, sent back to us (an echo, a replay). We keep our own
        signatures ourselves and never count a copy. One for a view above our last voted
        view means we signed it and forgot (restored from old data): Rule 6 fences it."""
        if voter != self.me:
            return
        if view > self.safety.state.last_voted_view and self.safety.fence(voted_view=view):
            self.stats.fenced += 1
        raise RemoteError("own_echo", f"our own {kind} for view {view}")

    def _bound_to_sender(self, signer: int, sender: int, kind: str) -> None:
        """Votes and timeouts travel only from their signer (each member broadcasts its
        own), and a stream's sender is authenticated: one that another member relays is
        dropped unchecked, whatever it says, so no member can replay, reorder or rewrite
        another's (docs/consensus/messages.md, "Sender binding"). Our own, sent back to
        us, goes on to Rule 6's check instead (`_echo_of_own`)."""
        if signer not in (sender, self.me):
            raise RemoteError(f"relayed_{kind}", f"{kind} of member {signer} sent by {sender}")

    def _on_vote(self, vote: Vote, *, local: bool) -> None:
        if not local and vote.voter == self.me:
            self.checker.check_vote(vote)  # genuinely ours, or it says nothing
            self._echo_of_own(vote.voter, vote.view, "vote")
        if vote.view <= self.high_qc.view:
            if not local and vote.view > self._last_signed_by.get(vote.voter, 0):
                self.checker.check_vote(vote)  # a late vote still says where its signer was
                self._saw_signature(vote.voter, vote.view)
            self.stats.late_messages += 0 if local else 1
            return  # its view is certified already: the usual fate of the last votes
        if vote.view > self.view + self.limits.vote_views_max:
            raise RemoteError("future_view", f"vote for view {vote.view}")
        block = self.tree.get(vote.block_hash)
        if block is not None and block.height != vote.height:
            # Signed, so never an honest member's: it cannot join a QC with the others.
            raise RemoteError("wrong_height", f"vote for view {vote.view} by {vote.voter}")
        by_voter = self._votes.setdefault(vote.view, {})
        previous = by_voter.get(vote.voter)
        if previous is not None and previous == vote:
            # A copy of a vote we hold (a replay, a re-broadcast): no signature check, which
            # is the expensive part: a flood of replays must not cost a verification each.
            raise RemoteError("duplicate", f"view {vote.view}")
        if not local:
            self.checker.check_vote(vote)  # before any equivocation is blamed on the voter
            self._saw_signature(vote.voter, vote.view)
        statement = (vote.block_hash, vote.height)
        if previous is not None:
            same = (previous.block_hash, previous.height) == statement
            raise RemoteError("duplicate" if same else "equivocating_vote", f"view {vote.view}")
        by_voter[vote.voter] = vote
        # Votes agree when they sign the same statement: the height is part of it, so the
        # QC's height is one that all its signers signed (docs/consensus/messages.md).
        agreeing = [v for v in by_voter.values() if (v.block_hash, v.height) == statement]
        if len(agreeing) < self.membership.quorum:
            return
        agreeing.sort(key=lambda v: v.voter)
        qc = QuorumCert(
            vote.view,
            vote.height,
            vote.block_hash,
            tuple((v.voter, v.signature) for v in agreeing),
        )
        self.verifier.remember(qc.digest())
        self.stats.qcs_formed += 1
        self._process_qc(qc)

    # ------------------------------------------------------------------ timeouts

    def _local_timeout(self) -> None:
        if self.follower or self._fencing or self.ended is not None:
            return
        try:
            signed = self.safety.timeout(self.view, self.high_qc, self.high_tc)
        except SafetyError as err:
            self.stats.refused[f"rule{err.rule}"] += 1
            return
        self._timeout_sent_tick = self._ticks_in_view
        self.stats.timeouts_sent += 1
        self._out.append(Send(None, signed.value, signed.epoch))
        self._record_timeout(signed.value)

    def _on_timeout(self, timeout: Timeout, *, local: bool) -> None:
        if timeout.view > self.view + self.limits.vote_views_max:
            raise RemoteError("future_view", f"timeout for view {timeout.view}")
        if not local:
            self._refuse_copy_of_timeout(timeout)
            self.checker.check_timeout(timeout)
            self._echo_of_own(timeout.voter, timeout.view, "timeout")
            self._saw_signature(timeout.voter, timeout.view)
        self._process_certs(timeout.high_qc, timeout.high_tc)
        if timeout.view < self.view:
            self.stats.late_messages += 1
            if not local:
                self._answer_late_timeout(timeout)
            return
        self._record_timeout(timeout)

    def _refuse_copy_of_timeout(self, timeout: Timeout) -> None:
        """A copy of a timeout we took in is dropped before its signature is checked (a
        check costs about 40 µs, a copy nothing to send), and a late one already answered
        is not answered again. What this remembers is bounded: the timeouts held for the
        views of the vote window (`Limits.vote_views_max`, one per member each) and, for
        views below ours, the highest one answered per member."""
        voter, view = timeout.voter, timeout.view
        held = self._timeouts.get(view, {}).get(voter)
        if held is not None and held.signature == timeout.signature:
            raise RemoteError("duplicate", f"timeout for view {view} by {voter}")
        if view < self.view and view <= self._late_timeouts.get(voter, 0):
            raise RemoteError("duplicate", f"late timeout for view {view} by {voter}")

    def _answer_late_timeout(self, timeout: Timeout) -> None:
        """Late: its certificates were worth reading. If we hold a TC that moves its
        signer past that view, hand it over, once (its copy may have been lost; the
        signer's own timer re-broadcasts its timeout, and other members answer too)."""
        voter = timeout.voter
        self._late_timeouts[voter] = max(timeout.view, self._late_timeouts.get(voter, 0))
        tc = self.high_tc
        if tc is not None and tc.view >= timeout.view:
            self._out.append(Send(voter, tc))

    def _record_timeout(self, timeout: Timeout) -> None:
        by_voter = self._timeouts.setdefault(timeout.view, {})
        previous = by_voter.get(timeout.voter)
        if previous is not None:
            if previous.high_qc.view != timeout.high_qc.view and timeout.voter != self.me:
                raise RemoteError("equivocating_timeout", f"view {timeout.view}")
            return
        by_voter[timeout.voter] = timeout
        if len(by_voter) >= self.membership.quorum:
            signers = sorted(by_voter.values(), key=lambda t: t.voter)
            high = max((t.high_qc for t in signers), key=lambda qc: qc.view)
            tc = TimeoutCert(
                timeout.view, high, tuple((t.voter, t.high_qc.view, t.signature) for t in signers)
            )
            self.stats.tcs_formed += 1
            self._process_tc(tc)
            nxt = self.membership.leader(tc.view + 1)
            if nxt != self.me:
                self._out.append(Send(nxt, tc))
        elif timeout.view == self.view:
            self._check_timeout_amplification()

    def _check_timeout_amplification(self) -> None:
        """f+1 timeouts for this view mean an honest member gave up on it: join them."""
        if self._timeout_sent_tick is not None:
            return
        if len(self._timeouts.get(self.view, ())) >= self.membership.f + 1:
            self._local_timeout()

    # ------------------------------------------------------------------ catch-up

    def _next_signer(self, qc: QuorumCert) -> int:
        """The first of the QC's other signers from the rotating sync cursor on: each
        retry asks another one, and at least one of any f+1 of them is honest."""
        signers = sorted(s for s, _ in qc.signatures if s != self.me)
        if not signers:
            return -1  # (the genesis QC: _request_sync then asks the next peer)
        return next((s for s in signers if s >= self._next_sync_peer), signers[0])

    def _request_sync(self, peer: int, target_hash: bytes) -> bool:
        """Ask `peer` (or the next one in turn) for what we lack; False if a request is
        already out (one at a time)."""
        if self._sync_peer is not None:
            return False
        if peer == self.me or not self.membership.is_member(peer):
            peer = self._next_sync_peer
        self._sync_peer = peer
        self._sync_target = target_hash
        self._sync_ticks = 0
        self._next_sync_peer = (self._next_sync_peer + 1) % self.membership.n
        if self._next_sync_peer == self.me:
            self._next_sync_peer = (self._next_sync_peer + 1) % self.membership.n
        self.stats.sync_requests += 1
        request = SyncRequest(self.tree.committed_height + 1, self._sync_blocks_ask, target_hash)
        self._out.append(Send(peer, request))
        return True

    def _check_chain(self, blocks: Sequence[Block]) -> None:
        """`blocks` is one chain for our chain id that continues what we hold, each block
        extending the one before it with a justify that certifies it. Cheap checks first,
        signatures last."""
        fresh = [
            b for b in blocks if b.height > self.tree.committed_height and b.hash not in self.tree
        ]
        if fresh and fresh[0].parent_hash not in self.tree:
            raise RemoteError("sync_gap", f"block at height {fresh[0].height} does not chain")
        for prev, block in itertools.pairwise(blocks):
            if block.parent_hash != prev.hash:
                raise RemoteError("sync_gap", f"block at height {block.height} does not chain")
        if any(block.chain_id != self.membership.chain_id for block in blocks):
            raise RemoteError("wrong_chain", "sync block for another chain")
        for block in fresh:
            parent = self.tree.get(block.parent_hash) or next(
                (b for b in blocks if b.hash == block.parent_hash), None
            )
            assert parent is not None, "checked above"
            if parent.height != block.justify.height or parent.view != block.justify.view:
                raise RemoteError("malformed", "sync block justify does not match its parent")
            self.checker.check_qc(block.justify)

    def _insert_chain(self, blocks: Sequence[Block]) -> list[Block]:
        """Insert a checked chain from where it first leaves what we hold."""
        inserted: list[Block] = []
        for block in blocks:
            if block.height <= self.tree.committed_height or block.hash in self.tree:
                continue
            if self.tree.full:
                self._evict_stale()
            if self.tree.full:
                break
            self.tree.insert(block)
            self._inserted(block)
            inserted.append(block)
        return inserted

    def catch_up_from(self, sender: int, response: SyncResponse) -> list[Action]:
        """A page of this epoch's committed chain from `sender`, which has left the epoch
        and found us too far behind for the proof of how it ended (replica/epochs.py
        `epoch_page`; docs/consensus/epochs.md, "Catching up"). It is checked as any sync
        answer is, with this epoch's members' certificates, and commits only through the
        commit rule those fire; a page that would commit the change block is refused
        (that commit comes with the epoch proof, which the shell takes). When it moves
        us forward, the next page is asked of the same member. Raises nothing: a page
        that does not hold is counted in `dropped`."""
        assert self._started, "start() first"
        if self.ended is not None:
            return self._flush()
        height_before = self.tree.committed_height
        certified = [*response.committed, *response.proof]
        try:
            check_sync_response(response, self.membership, self.limits)
            check_epoch_page(self.membership, response, self.owner_records)
            assert response.proof_qc is not None, "check_epoch_page"
            self._check_chain(certified)
            self.checker.check_block_certified(certified[-1], response.proof_qc)
        except RemoteError as err:
            self.dropped[err.reason] += 1
            return self._flush()
        for block in self._insert_chain(certified):
            self._process_qc(block.justify)
        if certified[-1].hash in self.tree:
            self._process_qc(response.proof_qc)
        if self.tree.committed_height > height_before and self.ended is None:
            self.stats.sync_target = max(self.stats.sync_target, certified[-1].height)
            self._sync_peer = None  # (an answer to our own request came as this page)
            self._request_sync(sender, b"")
        return self._flush()

    def _on_sync_response(self, sender: int, response: SyncResponse) -> None:
        if sender != self._sync_peer:
            raise RemoteError("unsolicited", f"sync response from {sender}")
        target = self._sync_target
        self._sync_peer = None
        height_before = self.tree.committed_height
        # (check_sync_response has checked its shape: a committed part comes with one or
        # two proof blocks and the proof QC, and the whole is bounded in blocks and bytes)
        # Only certified blocks enter the tree. The committed part and its proof form one
        # chain, each block certified by the next one's justify and the last by the proof
        # QC; all of it is checked before any of it is kept, and a lie anywhere drops the
        # whole response (we ask another peer next). The pending part is one chain ending
        # at the block we asked for, which a QC we hold names; it is judged separately.
        # Commits then happen through the normal commit rule, fired by the proof QC: sync
        # never commits anything on its own say.
        certified = [*response.committed, *response.proof]
        if certified:
            assert response.proof and response.proof_qc is not None, "checked on arrival"
            self._check_chain(certified)
            self.checker.check_block_certified(certified[-1], response.proof_qc)
            self.stats.sync_target = max(self.stats.sync_target, certified[-1].height)
        inserted = self._insert_chain(certified)
        if response.pending:
            try:
                if not target or response.pending[-1].hash != target:
                    raise RemoteError("sync_uncertified", "pending blocks do not end at the target")
                self._check_chain(response.pending)
            except RemoteError as err:
                self.dropped[err.reason] += 1
            else:
                inserted += self._insert_chain(response.pending)
        for block in inserted:
            self._process_qc(block.justify)
        if response.proof_qc is not None and certified[-1].hash in self.tree:
            self._process_qc(response.proof_qc)
        # More to fetch from the same peer, as long as each answer moves us forward (a
        # peer that claims more but proves nothing gets asked no further).
        advanced = self.tree.committed_height > height_before
        if advanced:
            self._sync_blocks_ask = min(self.limits.sync_blocks_max, self._sync_blocks_ask * 2)
        if advanced and response.committed_height > self.tree.committed_height:
            self._request_sync(sender, b"")
        self._retry_waiting()  # (it also waits for our sidecar's root, if the block needs it)
