"""SafetyRules, the only holder of the consensus key (docs/consensus/protocol.md;
replica/safety.py).

Real Ed25519 keys, a 4-member membership, and blocks built by hand. Each test names the
numbered rule it checks; the rules cite HotStuff (PODC'19) §4.3 / Alg. 4 and the 2-chain
rules of Jolteon / DiemBFT v4 (`safe_to_vote`, `safe_to_timeout`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from quorumgate.proto.crypto import Ed25519Signer, Verifier, ed25519_verify
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.safety import SafetyError, SafetyRules, SafetyState
from quorumgate.replica.types import (
    Block,
    QuorumCert,
    RemoteError,
    TimeoutCert,
    genesis_block,
    genesis_qc,
)
from tests.consensus.helpers import (
    CHAIN,
    SIGNERS,
    chain_of,
    key_seed,
    make_block,
    membership,
    qc_for,
    signed_timeout,
    tc_from,
)

ME = 3  # never the proposer of the hand-built chain's first views


class RecordingSigner:
    """Wraps a real signer and writes every sign() call to a shared event log."""

    def __init__(self, inner: Ed25519Signer, events: list[tuple[str, object]]) -> None:
        self._inner = inner
        self._events = events

    @property
    def public_key(self) -> bytes:
        return self._inner.public_key

    def sign(self, message: bytes) -> bytes:
        self._events.append(("sign", message))
        return self._inner.sign(message)


class Harness:
    """SafetyRules for member `me` whose persist callback and signer log to `events`."""

    def __init__(self, me: int = ME, state: SafetyState | None = None) -> None:
        self.me = me
        self.events: list[tuple[str, object]] = []
        self.persisted: list[SafetyState] = []
        checker = CertificateChecker(membership(), Verifier(64))
        self.rules = SafetyRules(
            me,
            RecordingSigner(SIGNERS[me], self.events),
            state or SafetyState.initial(CHAIN),
            checker,
            self._persist,
        )

    def _persist(self, state: SafetyState) -> None:
        self.events.append(("persist", state))
        self.persisted.append(state)


@pytest.fixture
def chain() -> list[Block]:
    """genesis <- B1(v1) <- B2(v2) <- B3(v3) <- B4(v4), each justified by its parent's QC."""
    return chain_of([1, 2, 3, 4])


def refused(fn: Callable[..., object], *args: object, rule: int) -> str:
    with pytest.raises(SafetyError) as info:
        fn(*args)
    assert info.value.rule == rule, str(info.value)
    return str(info.value)


# --------------------------------------------------------------------------- Rule 1


def test_rule1_second_block_in_the_same_view_is_refused_naming_the_view(chain: list[Block]) -> None:
    """Rule 1 (HotStuff §4.3, Alg. 4 vheight): one vote per view, ever."""
    h = Harness()
    g, b1 = chain[0], chain[1]
    h.rules.vote(b1, g)
    other = make_block(g, 1, timestamp_ms=b1.timestamp_ms + 7)
    assert other.hash != b1.hash
    before = len(h.persisted)
    message = refused(h.rules.vote, other, g, rule=1)
    assert "rule 1" in message and "view 1" in message
    assert len(h.persisted) == before
    assert h.rules.state.last_vote is not None
    assert h.rules.state.last_vote.block_hash == b1.hash


def test_rule1_no_vote_at_or_below_the_last_voted_view(chain: list[Block]) -> None:
    h = Harness()
    g, b1, b2, b3 = chain[:4]
    h.rules.vote(b3, b2)
    # a lower view, and a different block in the same view, are both refused
    message = refused(h.rules.vote, b1, g, rule=1)
    assert "block view 1 <= last voted view 3" in message
    fork3 = make_block(b2, 3, timestamp_ms=b3.timestamp_ms + 1)
    assert "view 3" in refused(h.rules.vote, fork3, b2, rule=1)
    assert h.rules.state.last_voted_view == 3


def test_asking_again_for_the_same_block_returns_the_identical_vote_without_persisting(
    chain: list[Block],
) -> None:
    h = Harness()
    g, b1 = chain[0], chain[1]
    first = h.rules.vote(b1, g)
    persisted = len(h.persisted)
    again = h.rules.vote(b1, g)
    assert again.value == first.value
    assert again.value.signature == first.value.signature
    assert again.epoch == first.epoch
    assert len(h.persisted) == persisted


def test_a_vote_signs_the_domain_separated_statement(chain: list[Block]) -> None:
    """b"qg/vote/v2" || chain id || view || height || block hash, verifiable by anyone
    (docs/consensus/messages.md): the height is signed, so no relay can change it."""
    h = Harness()
    g, b1 = chain[0], chain[1]
    vote = h.rules.vote(b1, g).value
    checker = CertificateChecker(membership(), Verifier(8))
    checker.check_vote(vote)  # raises if the signature is not over the vote statement
    assert (vote.view, vote.height, vote.block_hash, vote.voter) == (1, 1, b1.hash, ME)
    statement = b"qg/vote/v2" + len(CHAIN).to_bytes(4, "big") + CHAIN.encode()
    statement += (1).to_bytes(8, "big") + (1).to_bytes(8, "big") + b1.hash
    assert ed25519_verify(SIGNERS[ME].public_key, statement, vote.signature)
    with pytest.raises(RemoteError, match="bad_signature"):
        checker.check_vote(replace(vote, height=2))


# --------------------------------------------------------------------------- Rule 2 and 3


def tc_for_view(view: int, high_qcs: dict[int, QuorumCert]) -> TimeoutCert:
    """A genuine TC for `view`: each signer reported the QC given for it."""
    return tc_from(signed_timeout(voter, view, qc) for voter, qc in high_qcs.items())


def test_rule3_voting_locks_on_the_blocks_justify(chain: list[Block]) -> None:
    """Rule 3 (DiemBFT v4 observe_qc): voting for B locks B.justify, the one-chain."""
    h = Harness()
    g, b1, b2, b3, b4 = chain
    h.rules.vote(b1, g)
    assert h.rules.state.locked_qc == genesis_qc(CHAIN)  # b1's justify is genesis
    h.rules.vote(b2, b1)
    assert h.rules.state.locked_qc == b2.justify
    assert h.rules.state.locked_qc.block_hash == b1.hash
    h.rules.vote(b4, b3)
    assert h.rules.state.locked_qc == b4.justify
    assert h.persisted[-1].locked_qc == b4.justify  # the lock is persisted with the vote


def test_rule3_the_lock_never_moves_backwards(chain: list[Block]) -> None:
    h = Harness()
    _g, b1, b2, b3, b4 = chain
    for block, parent in ((b2, b1), (b3, b2), (b4, b3)):
        h.rules.vote(block, parent)
    assert h.rules.state.locked_qc.view == 3
    # A TC for view 4 whose signers reported QC(b1) at best admits a block on QC(b1):
    # Rule 2 lets it through (the TC vouches that no later QC can have committed
    # anything), and voting for it must keep the lock at view 3.
    tc = tc_for_view(4, {0: qc_for(b1), 1: qc_for(b1), 2: qc_for(b1)})
    x = make_block(b1, 5, justify=qc_for(b1), timestamp_ms=b4.timestamp_ms + 1)
    h.rules.vote(x, b1, None, tc)
    assert h.rules.state.locked_qc.view == 3


def test_rule2_a_justify_of_the_view_before_is_voted_for(chain: list[Block]) -> None:
    """Rule 2's first branch (DiemBFT v4 safe_to_vote): the happy path, no TC needed."""
    h = Harness()
    _g, b1, b2 = chain[:3]
    assert h.rules.vote(b2, b1).value.block_hash == b2.hash


def test_rule2_a_gap_without_a_tc_for_the_view_before_is_refused_naming_the_views(
    chain: list[Block],
) -> None:
    h = Harness()
    _g, b1, b2, _b3, b4 = chain
    h.rules.vote(b2, b1)
    fork = make_block(b2, 5, timestamp_ms=b4.timestamp_ms + 1)  # justify view 2, view 5
    before = len(h.persisted)
    message = refused(h.rules.vote, fork, b2, rule=2)
    assert "block view 5" in message and "justify view 2" in message and "no tc" in message
    # a TC for another view than 4 does not admit it either
    tc3 = tc_for_view(3, {0: qc_for(b2), 1: qc_for(b2), 2: qc_for(b2)})
    assert "no tc" in refused(h.rules.vote, fork, b2, None, tc3, rule=2)
    assert len(h.persisted) == before
    assert h.rules.state.last_voted_view == 2  # a refusal changes nothing


def test_rule2_after_a_tc_a_justify_below_its_highest_qc_is_refused_naming_the_views(
    chain: list[Block],
) -> None:
    """The TC branch: the justify must be at least the highest QC the TC's signers
    reported. Without this check a leader could revive a fork below a QC that 2f+1
    members vouched for, and undo a commit (the simulator's `tc_ignores_high_qc`)."""
    h = Harness()
    _g, b1, b2, b3, b4 = chain
    tc = tc_for_view(4, {0: qc_for(b1), 1: qc_for(b3), 2: qc_for(b2)})
    assert tc.high_qc == qc_for(b3)
    low = make_block(b2, 5, timestamp_ms=b4.timestamp_ms + 1)  # justify QC(b2), view 2
    message = refused(h.rules.vote, low, b2, None, tc, rule=2)
    assert "justify view 2" in message and "highest qc view 3" in message
    assert "tc for view 4" in message
    high = make_block(b3, 5, timestamp_ms=b4.timestamp_ms + 1)  # justify QC(b3)
    assert h.rules.vote(high, b3, None, tc).value.block_hash == high.hash


# --------------------------------------------------------------------------- Rule 4


def test_rule4_timeout_below_the_last_voted_view_is_refused(chain: list[Block]) -> None:
    """Rule 4 (LibraBFT v3 §6): no timeout for a view this replica has voted past."""
    h = Harness()
    _g, b1, b2, b3 = chain[:4]
    h.rules.vote(b3, b2)
    message = refused(h.rules.timeout, 2, b1.justify, None, rule=4)
    assert "timeout view 2 < last voted view 3" in message
    # the view it voted in may still be timed out
    assert h.rules.timeout(3, qc_for(b2), None).value.view == 3


def test_rule4_after_a_timeout_in_view_v_no_vote_in_v(chain: list[Block]) -> None:
    h = Harness()
    g, b1, b2 = chain[:3]
    h.rules.vote(b1, g)
    h.rules.timeout(2, qc_for(b1), None)
    message = refused(h.rules.vote, b2, b1, rule=1)
    assert "view 2" in message
    assert h.rules.state.last_voted_view == 2


def test_rule4_a_timeout_must_follow_its_qc_or_the_highest_tc(chain: list[Block]) -> None:
    """Rule 4 (DiemBFT v4 safe_to_timeout): v = qc.view + 1 or v = tc.view + 1."""
    h = Harness()
    _g, b1, b2 = chain[:3]
    message = refused(h.rules.timeout, 4, qc_for(b1), None, rule=4)
    assert "timeout view 4 follows neither its qc (view 1) nor the highest tc" in message
    tc = tc_for_view(3, {0: qc_for(b2), 1: qc_for(b2), 2: qc_for(b1)})
    assert h.rules.timeout(4, qc_for(b2), tc).value.view == 4


def test_rule4_a_timeout_never_carries_a_qc_below_the_lock(chain: list[Block]) -> None:
    """Rule 4's lock check: a member that voted on QC(b3) cannot time out reporting QC(b1)
    (a TC built on such timeouts would hide the QC and admit a fork, Rule 2)."""
    h = Harness()
    _g, b1, _b2, b3, b4 = chain
    h.rules.vote(b4, b3)
    tc = tc_for_view(4, {0: qc_for(b1), 1: qc_for(b1), 2: qc_for(b1)})
    before = len(h.persisted)
    message = refused(h.rules.timeout, 5, qc_for(b1), tc, rule=4)
    assert "timeout qc view 1 < locked view 3" in message
    assert len(h.persisted) == before
    assert h.rules.timeout(5, qc_for(b3), tc).value.high_qc == qc_for(b3)


def test_rule3_a_timeout_raises_the_lock_to_its_qc(chain: list[Block]) -> None:
    h = Harness()
    _g, b1, b2 = chain[:3]
    h.rules.vote(b2, b1)
    assert h.rules.state.locked_qc.view == 1
    h.rules.timeout(3, qc_for(b2), None)
    assert h.rules.state.locked_qc == qc_for(b2) == h.persisted[-1].locked_qc


def test_timeout_twice_in_a_view_returns_the_identical_timeout(chain: list[Block]) -> None:
    h = Harness()
    b1 = chain[1]
    first = h.rules.timeout(2, qc_for(b1), None)
    persisted = len(h.persisted)
    again = h.rules.timeout(2, genesis_qc(CHAIN), None)  # even if asked with another QC
    assert again.value == first.value and again.epoch == first.epoch
    assert len(h.persisted) == persisted
    assert first.value.high_qc == qc_for(b1)


def test_timeout_records_the_highest_certificates_it_has_seen(chain: list[Block]) -> None:
    h = Harness()
    _g, b1, b2 = chain[:3]
    timeouts = [signed_timeout(v, 2, qc_for(b1)) for v in (0, 1, 2)]
    tc = tc_from(timeouts)
    signed = h.rules.timeout(3, qc_for(b2), tc)
    assert signed.value.high_qc == qc_for(b2)
    assert signed.value.high_tc == tc
    assert h.persisted[-1].high_tc == tc and h.persisted[-1].high_qc == qc_for(b2)


# --------------------------------------------------------------------------- Rule 5


def test_rule5_never_propose_twice_in_a_view() -> None:
    """Rule 5: an honest leader never equivocates, even when asked to."""
    h = Harness(me=1)
    g = genesis_block(CHAIN)
    b1 = make_block(g, 1)
    assert b1.proposer == 1
    signed = h.rules.sign_proposal(b1, None)
    assert signed.value.block == b1
    other = make_block(g, 1, timestamp_ms=b1.timestamp_ms + 1)
    before = len(h.persisted)
    message = refused(h.rules.sign_proposal, other, None, rule=5)
    assert "view 1 <= last proposed view 1" in message
    assert "view 1" in refused(h.rules.sign_proposal, b1, None, rule=5)  # not even the same
    assert len(h.persisted) == before
    # and never in a lower view either
    h.rules.sign_proposal(make_block(g, 5), None)
    assert "view 1 <= last proposed view 5" in refused(h.rules.sign_proposal, other, None, rule=5)


# --------------------------------------------------------------------------- input checks


def test_a_block_with_a_forged_justify_is_refused_before_anything_is_persisted(
    chain: list[Block],
) -> None:
    """Every signing path starts by verifying its input."""
    h = Harness()
    b1, b2 = chain[1], chain[2]
    good = b2.justify
    forged = QuorumCert(
        good.view,
        good.height,
        good.block_hash,
        good.signatures[:1] + tuple((s, bytes(64)) for s, _ in good.signatures[1:]),
    )
    bad = make_block(b1, 2, justify=forged)
    with pytest.raises(RemoteError) as info:
        h.rules.vote(bad, b1)
    assert info.value.reason == "bad_certificate"
    assert h.events == [] and h.rules.state == SafetyState.initial(CHAIN)


# --------------------------------------------------------------------------- persist, then sign


def test_persist_happens_before_sign_on_every_signing_path(chain: list[Block]) -> None:
    """safety-rules order: ... update -> persist -> sign; Signed.epoch is the persisted one."""
    h = Harness(me=1)
    g, b1 = chain[0], chain[1]
    signed_proposal = h.rules.sign_proposal(b1, None)
    signed_vote = h.rules.vote(b1, g)
    signed_timeout_ = h.rules.timeout(2, qc_for(b1), None)
    kinds = [kind for kind, _ in h.events]
    assert kinds == ["persist", "sign"] * 3
    persisted = h.persisted
    assert [s.epoch for s in persisted] == [1, 2, 3]
    assert signed_proposal.epoch == 1 and signed_vote.epoch == 2 and signed_timeout_.epoch == 3
    # what was persisted before each signature already holds the statement signed
    assert persisted[0].last_proposed_view == 1
    assert persisted[1].last_vote == replace(signed_vote.value, signature=b"")
    assert persisted[2].last_timeout == replace(signed_timeout_.value, signature=b"")
    assert h.rules.state == persisted[-1]


# --------------------------------------------------------------------------- restart


def test_restart_from_the_last_persisted_state_refuses_the_same_and_resigns_identically(
    chain: list[Block],
) -> None:
    h = Harness()
    g, b1, b2, b3, b4 = chain
    votes = {}
    for block, parent in ((b1, g), (b2, b1), (b3, b2), (b4, b3)):
        votes[block.view] = h.rules.vote(block, parent)
    timeout = h.rules.timeout(4, qc_for(b3), None)
    fork4 = make_block(b3, 4, timestamp_ms=b4.timestamp_ms + 1)
    fork5 = make_block(b1, 5, timestamp_ms=b4.timestamp_ms + 1)

    restarted = Harness(state=h.persisted[-1])
    assert restarted.rules.state == h.rules.state
    for rules in (h.rules, restarted.rules):
        assert refused(rules.vote, fork4, b3, rule=1)
        assert refused(rules.vote, b3, b2, rule=1)
        assert refused(rules.vote, fork5, b1, rule=2)
        assert refused(rules.timeout, 3, qc_for(b2), None, rule=4)
    again = restarted.rules.timeout(4, qc_for(b3), None)
    assert again.value == timeout.value and again.value.signature == timeout.value.signature
    # The last vote (view 4) is re-issued bit for bit: Ed25519 is deterministic.
    assert restarted.rules.vote(b4, b3).value == votes[4].value
    assert restarted.persisted == []  # nothing new had to be persisted


# --------------------------------------------------------------------------- the key


def test_the_private_key_never_appears_in_repr() -> None:
    seed = key_seed(ME)
    signer = Ed25519Signer(seed)
    h = Harness()
    texts = [repr(signer), str(signer), repr(h.rules), repr(h.rules.state)]
    secret_forms = [seed.hex(), repr(seed), seed[:8].hex()]
    for text in texts:
        for secret in secret_forms:
            assert secret not in text
    assert signer.public_key[:4].hex() in repr(signer)  # the repr is not simply empty


def test_the_signing_contract_holds_under_python_dash_o() -> None:
    """The safety rules once checked their inputs with `assert`, which `python -O`
    removes. Under -O a vote for a block with the wrong parent is still refused."""
    import subprocess
    import sys
    from pathlib import Path

    code = """
from quorumgate.replica.safety import SafetyMisuse
from tests.consensus.helpers import chain_of, new_core
blocks = chain_of([1, 2])
core = new_core(1)
try:
    core.safety.vote(blocks[2], blocks[0])  # blocks[0] is not blocks[2]'s parent
except SafetyMisuse:
    print("refused")
else:
    print("signed")
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, cwd=root, check=True
    )
    assert out.stdout.strip() == "refused", out.stdout + out.stderr
