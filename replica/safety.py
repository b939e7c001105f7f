"""Safety rules: the only holder of the consensus key.

Modelled on Aptos/Diem `safety-rules`: every signing path runs the same sequence

    verify input -> load safety state -> if already signed in this view, return the same
    statement -> check the rule -> update -> persist -> sign

and nothing else in the process can produce a consensus signature. "Persist" hands the
new `SafetyState` to the `persist` callback *before* the signature exists; the core turns
that into a `PersistSafety` action and stamps every message carrying the signature with
the state's `epoch`, which the shell must have made durable before sending (see
replica/actions.py). A replica that crashes at any point and restarts from its last
durable state can therefore never sign two conflicting statements.

The voting rules (numbered; errors name the rule and the views involved):

Rule 1 — increasing view (HotStuff, PODC'19, §4.3 and Alg. 4 `vheight`; LibraBFT v3 §5.3
  "increasing-round"): vote for a block only if its view is above every view this replica
  has voted or timed out in. One vote per view, ever.

Rule 2 — locking (HotStuff §4.3 `safeNode`; LibraBFT v3 §5.3 "locked-round", which states
  safeNode's two branches as one comparison): vote only if the block's justify QC is at
  least as new as the locked QC. If the block extends the locked block its justify
  certifies the locked block or a descendant, so its view is >= the lock's; if it does not,
  a newer justify is the liveness branch.

Rule 3 — lock update (HotStuff Alg. 4 `update`; LibraBFT v3 "preferred round"): when
  voting for block B whose justify certifies parent P, lock on P's justify (the 2-chain
  head B <- P <- G locks G). The lock only grows and is persisted with the vote.

Rule 4 — timeouts (LibraBFT v3 §6 pacemaker): sign a timeout for view v only if v is at
  least the last voted view; afterwards the last voted view is v, so Rule 1 forbids voting
  in a view this replica has given up on.

Rule 5 — proposals: lead each view at most once (`last_proposed_view` grows), so an honest
  leader never equivocates, even across a crash.

Rule 6 — fencing (recovery drills, `stale-restore`): a replica restarted from an old copy of
  its data directory has forgotten signatures it made. When a verified certificate shows
  its own signature for a view above its last voted (or proposed) view, it raises those
  views to the certificate's, persisted before it signs anything else, so it never signs
  again in a view it already signed in.

Safety argument (HotStuff Theorem 2; LibraBFT v3 Theorem 1): if B0 is committed through a
direct 3-chain B0 <- B1 <- B2 with QC(B2) in consecutive views, then 2f+1 members voted for
B2, at least f+1 of them honest, and each locked on B0's certificate or newer (Rule 3).
Any conflicting block proposed later has a justify older than B0's... unless it extends
B0; by Rule 2 those f+1 honest members refuse it, so no conflicting block gathers a QC of
2f+1 and no conflicting block at B0's height can be committed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.crypto import Signer
from quorumgate.replica.types import (
    Block,
    Hello,
    HelloReply,
    Proposal,
    QuorumCert,
    Timeout,
    TimeoutCert,
    Vote,
    genesis_qc,
    hello_bytes,
    hello_reply_bytes,
    proposal_bytes,
    timeout_bytes,
    vote_bytes,
)


class SafetyError(Exception):
    """This replica refuses to sign: the statement would break a numbered rule."""

    def __init__(self, rule: int, detail: str) -> None:
        super().__init__(f"safety rule {rule} refused: {detail}")
        self.rule = rule


class SafetyMisuse(RuntimeError):
    """The caller broke the signing contract (our own bug, never a peer's input): asked to
    sign another member's block, a vote with the wrong parent... It is not caught: the
    process stops (fail-stop). These are explicit checks, not `assert`s, so that they hold
    under `python -O` too (issue 14)."""


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise SafetyMisuse(what)


@dataclass(frozen=True, slots=True)
class SafetyState:
    """What must be on disk before any signature made from it leaves the process.

    `last_vote` and `last_timeout` are the statements signed last, kept unsigned: the
    signature is recomputed from them (Ed25519 is deterministic) when asked again.
    """

    epoch: int
    last_voted_view: int
    locked_qc: QuorumCert
    high_qc: QuorumCert
    last_proposed_view: int
    last_vote: Vote | None
    last_timeout: Timeout | None
    # The highest TC known when last signing. With `high_qc` it justifies being in
    # `last_voted_view`, so a restarted replica can show its peers why it is there.
    high_tc: TimeoutCert | None = None

    @staticmethod
    def initial(chain_id: str) -> SafetyState:
        gqc = genesis_qc(chain_id)
        return SafetyState(0, 0, gqc, gqc, 0, None, None, None)

    def with_certs(self, high_qc: QuorumCert, high_tc: TimeoutCert | None) -> SafetyState:
        """This state, with the highest certificates raised to include the given ones."""
        qc = high_qc if high_qc.view > self.high_qc.view else self.high_qc
        tc = self.high_tc
        if high_tc is not None and (tc is None or high_tc.view > tc.view):
            tc = high_tc
        return replace(self, high_qc=qc, high_tc=tc)

    def __post_init__(self) -> None:
        _require(self.locked_qc.view <= self.high_qc.view, "lock newer than highest qc")
        _require(
            self.last_vote is None or self.last_vote.view <= self.last_voted_view,
            "last vote above the last voted view",
        )
        _require(
            self.last_timeout is None or self.last_timeout.view <= self.last_voted_view,
            "last timeout above the last voted view",
        )


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Signed(Generic[T]):
    """A signed statement and the safety epoch that must be durable before it is sent."""

    value: T
    epoch: int


class SafetyRules:
    __slots__ = ("_checker", "_me", "_persist", "_signer", "_state")

    def __init__(
        self,
        me: int,
        signer: Signer,
        state: SafetyState,
        checker: CertificateChecker,
        persist: Callable[[SafetyState], None],
    ) -> None:
        _require(checker.membership.key(me) == signer.public_key, "signer is not this member")
        self._me = me
        self._signer = signer
        self._state = state
        self._checker = checker
        self._persist = persist

    @property
    def state(self) -> SafetyState:
        return self._state

    def _commit(self, new_state: SafetyState) -> SafetyState:
        state = replace(new_state, epoch=self._state.epoch + 1)
        self._persist(state)
        self._state = state
        return state

    # ------------------------------------------------------------------ proposals

    def sign_proposal(self, block: Block, high_tc: TimeoutCert | None) -> Signed[Proposal]:
        """Sign `block` as its view's leader; `high_tc` is the TC it carries, if any."""
        # verify input
        _require(block.proposer == self._me, "asked to sign another member's block")
        _require(self._checker.membership.leader(block.view) == self._me, "not the leader")
        self._checker.check_qc(block.justify)
        # load
        state = self._state
        # Rule 5
        if block.view <= state.last_proposed_view:
            raise SafetyError(
                5, f"view {block.view} <= last proposed view {state.last_proposed_view}"
            )
        new = self._commit(
            replace(state, last_proposed_view=block.view).with_certs(block.justify, high_tc)
        )
        sig = self._signer.sign(proposal_bytes(block.chain_id, block.view, block.hash))
        return Signed(Proposal(block, sig, high_tc), new.epoch)

    # ------------------------------------------------------------------ fencing

    def fence(self, voted_view: int = 0, proposed_view: int = 0) -> bool:
        """Rule 6: raise the last voted / proposed views to ones this replica's own
        signatures were seen at. True (and persisted) if anything changed."""
        state = self._state
        if voted_view <= state.last_voted_view and proposed_view <= state.last_proposed_view:
            return False
        self._commit(
            replace(
                state,
                last_voted_view=max(state.last_voted_view, voted_view),
                last_proposed_view=max(state.last_proposed_view, proposed_view),
            )
        )
        return True

    # ------------------------------------------------------------------ votes

    def vote(
        self,
        block: Block,
        parent: Block,
        high_qc: QuorumCert | None = None,
        high_tc: TimeoutCert | None = None,
    ) -> Signed[Vote]:
        """Vote for `block`; `high_qc`/`high_tc` are the voter's highest certificates,
        recorded with the vote."""
        # verify input
        _require(parent.hash == block.parent_hash, "parent does not match block")
        self._checker.check_qc(block.justify)
        # load
        state = self._state
        # already voted in this view: the same vote again, or nothing
        last = state.last_vote
        if last is not None and last.view == block.view:
            if last.block_hash == block.hash:
                return Signed(self._sign_vote(last), state.epoch)
            raise SafetyError(
                1, f"already voted for another block in view {block.view} (equivocation)"
            )
        # Rule 1
        if block.view <= state.last_voted_view:
            raise SafetyError(
                1, f"block view {block.view} <= last voted view {state.last_voted_view}"
            )
        # Rule 2
        if block.justify.view < state.locked_qc.view:
            raise SafetyError(
                2,
                f"block view {block.view}: justify view {block.justify.view} "
                f"< locked view {state.locked_qc.view}",
            )
        # update (Rule 3), persist, sign
        locked = parent.justify if parent.justify.view > state.locked_qc.view else state.locked_qc
        statement = Vote(block.view, block.height, block.hash, self._me, b"")
        updated = state.with_certs(block.justify, high_tc)
        if high_qc is not None:
            updated = updated.with_certs(high_qc, None)
        updated = replace(
            updated, last_voted_view=block.view, locked_qc=locked, last_vote=statement
        )
        new = self._commit(updated)
        return Signed(self._sign_vote(statement), new.epoch)

    def _sign_vote(self, statement: Vote) -> Vote:
        # Safety state records what was voted for, unsigned; Ed25519 is deterministic, so
        # signing the recorded statement again after a restart yields the same bytes.
        chain = self._checker.membership.chain_id
        sig = self._signer.sign(vote_bytes(chain, statement.view, statement.block_hash))
        return replace(statement, signature=sig)

    # ------------------------------------------------------------------ Rule 6 handshake

    def sign_hello(self, nonce: bytes) -> Hello:
        """The start-up question of Rule 6, signed so that no one else can ask for us.
        It changes no safety state: it asks, it promises nothing."""
        chain = self._checker.membership.chain_id
        return Hello(nonce, self._signer.sign(hello_bytes(chain, self._me, nonce)))

    def sign_hello_reply(
        self,
        asker: int,
        nonce: bytes,
        last_signed_view: int,
        view: int,
        high_qc: QuorumCert,
        high_tc: TimeoutCert | None,
    ) -> HelloReply:
        """Our answer to one start of `asker` (its nonce): the last view we saw it sign in.
        Signed, so that a forger cannot end a restored replica's fencing (issue 14)."""
        chain = self._checker.membership.chain_id
        statement = hello_reply_bytes(chain, self._me, asker, nonce, last_signed_view, view)
        return HelloReply(
            last_signed_view, view, high_qc, high_tc, asker, nonce, self._signer.sign(statement)
        )

    # ------------------------------------------------------------------ timeouts

    def timeout(
        self, view: int, high_qc: QuorumCert, high_tc: TimeoutCert | None
    ) -> Signed[Timeout]:
        # verify input
        self._checker.check_qc(high_qc)
        _require(high_qc.view < view, "timeout high qc must be below its view")
        # load
        state = self._state
        last = state.last_timeout
        if last is not None and last.view == view:
            return Signed(self._sign_timeout(last), state.epoch)
        # Rule 4
        if view < state.last_voted_view:
            raise SafetyError(4, f"timeout view {view} < last voted view {state.last_voted_view}")
        updated = state.with_certs(high_qc, high_tc)
        statement = Timeout(view, updated.high_qc, self._me, b"", updated.high_tc)
        new = self._commit(replace(updated, last_voted_view=view, last_timeout=statement))
        return Signed(self._sign_timeout(statement), new.epoch)

    def _sign_timeout(self, statement: Timeout) -> Timeout:
        chain = self._checker.membership.chain_id
        sig = self._signer.sign(timeout_bytes(chain, statement.view, statement.high_qc.view))
        return replace(statement, signature=sig)
