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

What each signature covers (the bytes come from replica/types.py, built with
proto/canonical.py's encoder; docs/consensus/messages.md has the whole table):

- a vote: `qg/vote/v2 || chain id || view || height || block hash`. The height is signed
  so that a QC proves the height of the block it certifies even before that block is
  known; the `qg/vote/v1` statement of earlier releases left it out, and a relayed or
  Byzantine vote could make an honest replica keep a false one (in its highest QC and in
  the commit proofs it served);
- a timeout: `qg/timeout/v1 || chain id || view || view of the signer's highest QC` (that
  QC carries its own signed height);
- a proposal: `qg/proposal/v1 || chain id || view || block hash` (the hash covers every
  field of the block);
- a hello and a hello reply: `hello_bytes` and `hello_reply_bytes` (Rule 6 below).

The voting rules (numbered; errors name the rule and the views involved). The rules are
the 2-chain ones of Jolteon (Gelashvili et al., FC'22, §3) and DiemBFT v4 (§4, the
`safe_to_vote` / `safe_to_timeout` of its Safety module), as Aptos' `safety_rules_2chain`
states them; a block commits after one round fewer than under HotStuff's 3-chain:

Rule 1 — increasing view (HotStuff, PODC'19, §4.3 `vheight`; DiemBFT v4
  `increase_last_vote_round`): vote for a block only if its view is above every view this
  replica has voted or timed out in. One vote per view, ever.

Rule 2 — safe to vote (DiemBFT v4 `safe_to_vote`): vote for block B of view v only if its
  justify QC is of view v-1, or this replica holds a TC for view v-1 and B's justify is at
  least as high as the highest QC any of that TC's signers reported. (A TC signature
  covers the signer's high-QC view, so that "highest" cannot be lowered.)

Rule 3 — the one-chain lock (DiemBFT v4 `observe_qc`, "one-chain round"): voting for B, or
  timing out with QC q, raises the lock to B's justify (or q). The lock only grows and is
  persisted with the statement.

Rule 4 — safe to timeout (DiemBFT v4 `safe_to_timeout`): sign a timeout for view v only if
  v is at least the last voted view, v follows the QC it carries or the highest TC held
  (v = qc.view + 1 or tc.view + 1), and that QC is at least the lock (Rule 3): a timeout
  never hides a QC its signer vouched for. Afterwards the last voted view is v, so Rule 1
  forbids voting in a view this replica has given up on.

Rule 5 — proposals: lead each view at most once (`last_proposed_view` grows), so an honest
  leader never equivocates, even across a crash.

Rule 6 — fencing (recovery drill `stale-restore`; docs/consensus/fencing.md): a replica
  restored from an old copy of its data has forgotten signatures it made, so it must not
  sign again in any view it may have signed in.
  (a) A verified certificate showing its own signature for a view above its last voted (or
      proposed) view raises those views to the certificate's, persisted before it signs
      anything else.
  (b) A start the shell declares a restore signs nothing until 2f+1 other members have
      answered its signed hello (each answer signed for that start's fresh nonce, carrying
      the answerer's highest QC and TC); it then raises both views to F = c + 2, c being
      the highest view a verified certificate it holds ended, persisted with those
      certificates. Until it holds a certificate of view F - 1 it answers no hello itself.
  (c) In a fenced view (the last voted view, raised by (a) or (b), with neither a vote nor
      a timeout of its own on record there) a timeout must carry the QC of the view just
      before it.
  A plain start, from data the replica made durable itself, has forgotten nothing: it
  asks too, but its fence is best effort (replica/core.py `_try_end_fencing`).
  (b) is per epoch, as views and safety states are: the shell starts every epoch it
  enters while a restore is declared as a restore too, until the epoch it fenced in has
  committed a block of view F - 1 or later (replica/epochs.py `RestoreFence` has why).

Why (b) covers every forgotten view. Say the restored replica R signed in view u before its
restore. Whatever it signed needed a certificate of view u-1: a QC or TC of u-1 for a vote
(Rule 2), a timeout (Rule 4) or a proposal. That certificate has 2f+1 signers, f+1 of them
honest, so at least f honest ones besides R; "honest" means running on data it made
durable itself, and at most f members are not (Byzantine, or restored and not yet past the
view before their fence: they answer no hello). Each of those f signed in u-1 before R
signed in u, holding a certificate of u-2 that it persisted with its signature (persist
before send), so it holds one of u-2 or later ever after, across its own restarts. Of the
3f other members at most f-1 did not answer, so one of those f did; its answer repeats R's
fresh nonce, so it was made after the restore, and it carries its highest certificates:
c >= u-2 and F >= u. The other answers carry only verified certificates: a Byzantine one
can raise c to a view some certificate really ended (R then sits out two views more),
never lower it. Fewer answers guarantee nothing: the bound needs f+1 honest answers, and
only 2f+1 answers are sure to hold them (with f+1, f may be Byzantine and the honest one
may come from a member that signed none of the certificates that mattered). Nor do the
views the peers report having seen R sign: a signature still in flight is in no report.

Why (c). A vote R forgot in its fenced view t locked at most the QC of t-1, the highest its
block can be justified by; a timeout there with an older QC could be the one honest
signature a TC of view t shares with the QC of the block R voted for, and that TC would
hide R's lock. Below a fenced view R signs nothing (Rules 1, 4 and 5).

Safety argument (Jolteon Theorem 1; DiemBFT v4 §5). The commit rule (replica/blocktree.py):
B0 of view r commits when a QC certifies its child B1 of view r+1. By Rule 1 an honest
replica votes once per view, and by Rule 6 a restored one never votes again in a view it
voted in, so at most one block per view is certified. 2f+1 members voted for B1, f+1 of
them honest, each locked at r or above (Rule 3: B1's justify certifies B0). Claim: every
block certified in a view v > r extends B0, and every TC of a view t >= r+1 carries a QC
of view r or above. The TC's 2f+1 signers include an honest voter h for B1. If h voted and
then timed out in t from memory, the timeout carries a QC no lower than its lock (Rule 4),
hence >= r; it cannot have timed out in t before voting in r+1 (Rule 1). If h was restored
in between, its timeout in t is either in its fenced view, with the QC of t-1 >= r (Rule
6c), or above its fence F >= r+1, where it entered t by a certificate of view t-1 >= r+1:
by induction a QC of a block extending B0, or a TC carrying a QC >= r, and its timeout
carries its highest QC, never below one a TC it holds carries. Now a block certified in
v > r+1 got f+1 honest votes under Rule 2: either its justify is of view v-1 (> r: by
induction that block extends B0), or a TC for view v-1 admitted it with a justify no lower
than the TC's highest QC, >= r by the claim; the justify is then of a view in [r, v-1]:
B0 itself (one certified block per view), or by induction a block extending it. For v =
r+1 the block is B1. So no conflicting block is ever certified, let alone committed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from quorumgate.proto.crypto import Signer
from quorumgate.replica.certs import CertificateChecker
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
    under `python -O` too."""


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
        chain = self._checker.membership.signing_id
        sig = self._signer.sign(proposal_bytes(chain, block.view, block.hash))
        return Signed(Proposal(block, sig, high_tc), new.epoch)

    # ------------------------------------------------------------------ fencing

    def fence(
        self,
        voted_view: int = 0,
        proposed_view: int = 0,
        high_qc: QuorumCert | None = None,
        high_tc: TimeoutCert | None = None,
    ) -> bool:
        """Rule 6: raise the last voted / proposed views to ones this replica may have
        signed in and forgotten, with the (verified) certificates that showed it, so that
        what it answers after a crash is no older. True (and persisted) if the views
        changed."""
        state = self._state
        if voted_view <= state.last_voted_view and proposed_view <= state.last_proposed_view:
            return False
        updated = state.with_certs(high_qc, high_tc) if high_qc is not None else state
        self._commit(
            replace(
                updated,
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
        self._check_safe_to_vote(block, high_tc)
        # update (Rule 3), persist, sign
        locked = block.justify if block.justify.view > state.locked_qc.view else state.locked_qc
        statement = Vote(block.view, block.height, block.hash, self._me, b"")
        updated = state.with_certs(block.justify, high_tc)
        if high_qc is not None:
            updated = updated.with_certs(high_qc, None)
        updated = replace(
            updated, last_voted_view=block.view, locked_qc=locked, last_vote=statement
        )
        new = self._commit(updated)
        return Signed(self._sign_vote(statement), new.epoch)

    def _check_safe_to_vote(self, block: Block, tc: TimeoutCert | None) -> None:
        """Rule 2. `tc` is the highest TC the voter holds (verified); only one for the view
        just before the block's counts."""
        if block.justify.view + 1 == block.view:
            return
        if tc is not None and tc.view + 1 == block.view:
            self._checker.check_tc(tc)  # verified by the caller: this is a cache hit
            if block.justify.view >= tc.high_qc.view:
                return
            raise SafetyError(
                2,
                f"block view {block.view}: justify view {block.justify.view} "
                f"< the highest qc view {tc.high_qc.view} of the tc for view {tc.view}",
            )
        raise SafetyError(
            2,
            f"block view {block.view}: justify view {block.justify.view} is not the view "
            "before it and no tc for that view is held",
        )

    def _sign_vote(self, statement: Vote) -> Vote:
        # Safety state records what was voted for, unsigned; Ed25519 is deterministic, so
        # signing the recorded statement again after a restart yields the same bytes.
        chain = self._checker.membership.signing_id
        statement_bytes = vote_bytes(chain, statement.view, statement.height, statement.block_hash)
        sig = self._signer.sign(statement_bytes)
        return replace(statement, signature=sig)

    # ------------------------------------------------------------------ Rule 6 handshake

    def sign_hello(self, nonce: bytes) -> Hello:
        """The start-up question of Rule 6, signed so that no one else can ask for us.
        It changes no safety state: it asks, it promises nothing."""
        chain = self._checker.membership.signing_id
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
        Signed, so that a forger cannot end a restored replica's fencing
        (docs/consensus/fencing.md)."""
        chain = self._checker.membership.signing_id
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
        self._check_safe_to_timeout(view, high_qc, high_tc, state)
        updated = state.with_certs(high_qc, high_tc)
        statement = Timeout(view, updated.high_qc, self._me, b"", updated.high_tc)
        locked = high_qc if high_qc.view > state.locked_qc.view else state.locked_qc  # Rule 3
        new = self._commit(
            replace(updated, last_voted_view=view, locked_qc=locked, last_timeout=statement)
        )
        return Signed(self._sign_timeout(statement), new.epoch)

    def _check_safe_to_timeout(
        self, view: int, high_qc: QuorumCert, tc: TimeoutCert | None, state: SafetyState
    ) -> None:
        """Rule 4, beyond the view bound checked before it."""
        if view != high_qc.view + 1 and (tc is None or view != tc.view + 1):
            raise SafetyError(
                4,
                f"timeout view {view} follows neither its qc (view {high_qc.view}) nor the "
                f"highest tc (view {tc.view if tc is not None else 0})",
            )
        if high_qc.view < state.locked_qc.view:
            raise SafetyError(
                4, f"timeout qc view {high_qc.view} < locked view {state.locked_qc.view}"
            )
        if self._fenced(view, state) and high_qc.view + 1 != view:
            raise SafetyError(
                6,
                f"timeout view {view} was fenced: it needs the qc of view {view - 1}, "
                f"not of view {high_qc.view}",
            )

    @staticmethod
    def _fenced(view: int, state: SafetyState) -> bool:
        """`view` is the last voted view only by Rule 6: we may have signed in it and
        forgotten, and neither our vote nor our timeout there is on record."""
        return (
            view == state.last_voted_view
            and (state.last_vote is None or state.last_vote.view != view)
            and (state.last_timeout is None or state.last_timeout.view != view)
        )

    def _sign_timeout(self, statement: Timeout) -> Timeout:
        chain = self._checker.membership.signing_id
        sig = self._signer.sign(timeout_bytes(chain, statement.view, statement.high_qc.view))
        return replace(statement, signature=sig)
