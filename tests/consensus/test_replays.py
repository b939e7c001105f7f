"""A replayed message costs no signature check and is never answered twice.

The attack: 1,000 copies of a member's timeout cost 1,000 Ed25519 checks (votes were
recognised as copies before their check; timeouts were not), and once the view had its
TC, each copy made us send the whole TC to the member who signed it. The same pattern in
the other kinds: a proposal re-sent, a hello repeated. Each test counts the signature
checks (`Verifier.checks`) and the answers sent.
"""

from __future__ import annotations

from quorumgate.replica.core import Core
from quorumgate.replica.types import (
    Hello,
    HelloReply,
    Message,
    SyncRequest,
    TimeoutCert,
    genesis_qc,
    hello_bytes,
)
from tests.consensus.helpers import (
    CHAIN,
    SIGNERS,
    chain_of,
    envelope,
    new_core,
    sends,
    signed_proposal,
    signed_timeout,
    tc_from,
)

COPIES = 1_000
HELLO_REPLIES_PER_START_MAX = 8  # replica/core.py's bound, as this test expects it


def replay(core: Core, sender: int, message: Message, copies: int = COPIES) -> tuple[int, int]:
    """Deliver `copies` copies of `message`; return the signature checks they cost and the
    messages they made `core` send."""
    checks = core.verifier.checks
    sent = 0
    for _ in range(copies):
        sent += len(sends(core.on_message(envelope(sender, message))))
    return core.verifier.checks - checks, sent


def core_in_view_1() -> Core:
    core = new_core(0)
    core.start()
    assert core.view == 1
    return core


def test_copies_of_a_timeout_relayed_by_another_member_cost_no_check() -> None:
    core = core_in_view_1()
    timeout = signed_timeout(3, 1, genesis_qc(CHAIN))
    checks, sent = replay(core, 2, timeout)
    assert checks == 0 and sent == 0
    assert core.dropped["relayed_timeout"] == COPIES


def test_copies_of_a_timeout_from_its_signer_cost_one_check() -> None:
    core = core_in_view_1()
    timeout = signed_timeout(3, 1, genesis_qc(CHAIN))
    checks, _ = replay(core, 3, timeout)
    assert checks == 1
    assert core.dropped["duplicate"] == COPIES - 1


def test_a_late_timeout_is_answered_with_the_tc_once() -> None:
    """After view 1's TC, member 3 (which missed it) re-sends its timeout for view 1: it
    gets the TC once, and the copies cost nothing."""
    core = core_in_view_1()
    for voter in (1, 2):
        core.on_message(envelope(voter, signed_timeout(voter, 1, genesis_qc(CHAIN))))
    assert core.view == 2 and core.high_tc is not None and core.high_tc.view == 1
    checks = core.verifier.checks
    late = signed_timeout(3, 1, genesis_qc(CHAIN))
    answers: list[Message] = []
    for _ in range(COPIES):
        answers += [s.message for s in sends(core.on_message(envelope(3, late)))]
    assert [type(m) for m in answers] == [TimeoutCert]
    assert core.verifier.checks - checks <= 1
    assert core.dropped["duplicate"] == COPIES - 1


def test_copies_of_a_proposal_cost_one_check() -> None:
    core = core_in_view_1()
    proposal = signed_proposal(chain_of([1])[1])
    checks, sent = replay(core, 1, proposal)
    assert checks <= 1 and sent == 1  # (its one vote)
    assert core.dropped["duplicate"] == COPIES - 1


def test_copies_of_a_proposal_waiting_for_its_parent_cost_one_check() -> None:
    """...and do not make the wait start again (each other member is asked once)."""
    core = core_in_view_1()
    blocks = chain_of([1, 2, 3])
    proposal = signed_proposal(blocks[3])  # its justify moves us to view 3
    first = sends(core.on_message(envelope(3, proposal)))
    assert core.view == 3 and [type(s.message) for s in first] == [SyncRequest]
    checks, sent = replay(core, 3, proposal)
    assert checks == 0 and sent == 0
    assert core.dropped["duplicate"] == COPIES


def test_copies_of_a_hello_are_answered_a_bounded_number_of_times() -> None:
    """A restarted member asks again while its fencing lasts (each retry may have lost
    its answers); copies beyond that cost neither a check nor a signed reply."""
    core = core_in_view_1()
    nonce = bytes(16)
    hello = Hello(nonce, SIGNERS[2].sign(hello_bytes(CHAIN, 2, nonce)))
    checks, sent = replay(core, 2, hello)
    assert checks <= 1
    assert 1 <= sent <= HELLO_REPLIES_PER_START_MAX, sent
    assert core.dropped["duplicate"] == COPIES - sent
    # A new start (a new nonce) is answered at once.
    again = Hello(bytes([1] * 16), SIGNERS[2].sign(hello_bytes(CHAIN, 2, bytes([1] * 16))))
    answers = [s.message for s in sends(core.on_message(envelope(2, again)))]
    assert [type(m) for m in answers] == [HelloReply]


def test_a_tc_of_timeouts_already_checked_costs_no_check() -> None:
    """The next leader is sent the TC of a view by every member that formed it; each is
    made of timeouts whose signatures it checked one by one already, as a QC is of votes."""
    core = core_in_view_1()
    timeouts = [signed_timeout(voter, 1, genesis_qc(CHAIN)) for voter in (1, 2, 3)]
    for timeout in timeouts:
        core.on_message(envelope(timeout.voter, timeout))
    assert core.view == 2
    checks, sent = replay(core, 3, tc_from(timeouts), copies=10)
    assert checks == 0 and sent == 0
