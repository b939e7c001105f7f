"""Input hygiene of the core (docs/consensus/protocol.md, "Byzantine peers": dropped and counted,
never trusted) and the persist-before-send contract (replica/actions.py; etcd-io/raft's Ready).

A core for member 0 of a 4-member cluster is driven directly with hand-built, really
signed messages. Every bad message must be dropped, counted under its exact reason in
`core.dropped`, produce no action, raise nothing, and leave the core's state as it was.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import pytest

from quorumgate.replica.actions import PersistSafety, Send, UnpersistedSend, check_send_allowed
from quorumgate.replica.core import Core
from quorumgate.replica.types import (
    Envelope,
    Message,
    Proposal,
    QuorumCert,
    RemoteError,
    SyncRequest,
    SyncResponse,
    Timeout,
    TimeoutCert,
    Vote,
    genesis_block,
    genesis_qc,
    timeout_bytes,
    vote_bytes,
)
from tests.consensus.helpers import (
    CHAIN,
    OUTSIDER,
    SIGNERS,
    TEST_LIMITS,
    Net,
    chain_of,
    envelope,
    make_block,
    new_core,
    qc_for,
    sent_of,
    signed_proposal,
    signed_timeout,
    signed_vote,
    tc_from,
)

G, B1, B2, B3 = chain_of([1, 2, 3])
GQC = genesis_qc(CHAIN)
FAR_VIEW = 1 + TEST_LIMITS.vote_views_max + 1  # the core starts in view 1


def snapshot(core: Core) -> tuple[object, ...]:
    return (
        core.view,
        core.high_qc,
        core.high_tc,
        core.committed_height,
        core.safety.state,
        len(core.tree),
    )


def started_core(me: int = 0) -> Core:
    core = new_core(me)
    core.start()
    assert core.view == 1
    return core


def junk_signatures(qc: QuorumCert, keep: int) -> QuorumCert:
    """`qc` with all but the first `keep` signatures replaced by zeros."""
    sigs = tuple((s, sig if k < keep else bytes(64)) for k, (s, sig) in enumerate(qc.signatures))
    return replace(qc, signatures=sigs)


def with_justify(qc: QuorumCert, view: int = 2) -> Proposal:
    """A proposal from view `view`'s leader extending B1, justified by `qc`."""
    return signed_proposal(make_block(B1, view, justify=qc))


def outsider_qc() -> QuorumCert:
    """Two genuine member signatures and one from a key outside the cluster (index 5)."""
    statement = vote_bytes(CHAIN, B1.view, B1.height, B1.hash)
    sigs = ((0, SIGNERS[0].sign(statement)), (1, SIGNERS[1].sign(statement)))
    return QuorumCert(B1.view, B1.height, B1.hash, (*sigs, (5, OUTSIDER.sign(statement))))


def forged_tc() -> TimeoutCert:
    real = signed_timeout(1, 1, GQC)
    sigs = ((1, 0, real.signature), (2, 0, bytes(64)), (3, 0, bytes(64)))
    return TimeoutCert(1, GQC, sigs)


def under_signed_tc() -> TimeoutCert:
    return tc_from([signed_timeout(v, 1, GQC) for v in (1, 2)])


def outsider_tc() -> TimeoutCert:
    sigs = [(v, 0, signed_timeout(v, 1, GQC).signature) for v in (1, 2)]
    sigs.append((5, 0, OUTSIDER.sign(timeout_bytes(CHAIN, 1, 0))))
    return TimeoutCert(1, GQC, tuple(sigs))


def vote_by_outsider() -> Vote:
    return Vote(1, 1, B1.hash, 5, OUTSIDER.sign(vote_bytes(CHAIN, 1, 1, B1.hash)))


def vote_signed_by_another_member() -> Vote:
    return replace(signed_vote(2, B1), voter=3)


def foreign_block_proposal() -> Proposal:
    other = genesis_block("other-chain")
    block = make_block(other, 1, chain="other-chain")
    return signed_proposal(block)


def far_future_vote() -> Vote:
    block = make_block(B1, FAR_VIEW, justify=qc_for(B1))
    return signed_vote(2, block)


Case = tuple[str, Callable[[], Envelope], str]

CASES: list[Case] = [
    ("sender_not_a_member", lambda: envelope(7, signed_vote(2, B1)), "non_member"),
    ("sender_claims_to_be_us", lambda: envelope(0, signed_vote(2, B1)), "non_member"),
    ("voter_not_a_member", lambda: envelope(2, vote_by_outsider()), "non_member"),
    (
        "vote_with_a_zeroed_signature",
        lambda: envelope(2, replace(signed_vote(2, B1), signature=bytes(64))),
        "bad_signature",
    ),
    (
        "vote_signed_by_another_member",
        lambda: envelope(3, vote_signed_by_another_member()),
        "bad_signature",
    ),
    (
        "vote_signed_for_another_chain",
        lambda: envelope(2, signed_vote(2, B1, chain="other-chain")),
        "bad_signature",
    ),
    (
        "envelope_for_another_chain",
        lambda: envelope(2, signed_vote(2, B1), chain="other-chain"),
        "wrong_chain",
    ),
    ("block_for_another_chain", lambda: envelope(1, foreign_block_proposal()), "wrong_chain"),
    (
        "proposal_with_a_zeroed_signature",
        lambda: envelope(1, replace(signed_proposal(B1), signature=bytes(64))),
        "bad_signature",
    ),
    (
        "qc_with_too_few_signatures",
        lambda: envelope(2, with_justify(qc_for(B1, voters=(0, 1)))),
        "bad_certificate",
    ),
    (
        "qc_with_forged_signatures",
        lambda: envelope(2, with_justify(junk_signatures(qc_for(B1), keep=1))),
        "bad_certificate",
    ),
    (
        "qc_whose_signatures_are_for_another_block",
        lambda: envelope(
            2, with_justify(replace(qc_for(B2), view=1, height=1, block_hash=B1.hash))
        ),
        "bad_certificate",
    ),
    ("qc_with_a_non_member_signer", lambda: envelope(2, with_justify(outsider_qc())), "non_member"),
    (
        "unsigned_qc_that_is_not_genesis",
        lambda: envelope(2, with_justify(QuorumCert(1, 1, B1.hash))),
        "bad_certificate",
    ),
    ("forged_tc", lambda: envelope(3, forged_tc()), "bad_certificate"),
    ("tc_with_too_few_signatures", lambda: envelope(3, under_signed_tc()), "bad_certificate"),
    ("tc_with_a_non_member_signer", lambda: envelope(3, outsider_tc()), "non_member"),
    (
        "timeout_with_a_forged_high_qc",
        lambda: envelope(3, signed_timeout(3, 2, junk_signatures(qc_for(B1), keep=2))),
        "bad_certificate",
    ),
    (
        "timeout_with_a_zeroed_signature",
        lambda: envelope(3, replace(signed_timeout(3, 1, GQC), signature=bytes(64))),
        "bad_signature",
    ),
    (
        "timeout_carrying_a_forged_tc",
        lambda: envelope(3, signed_timeout(3, 2, GQC, high_tc=forged_tc())),
        "bad_certificate",
    ),
    (
        "proposal_from_a_non_leader",
        lambda: envelope(2, signed_proposal(make_block(G, 1, proposer=2))),
        "not_leader",
    ),
    ("proposal_relayed_by_another_member", lambda: envelope(3, signed_proposal(B1)), "not_leader"),
    (
        "proposal_for_a_view_nothing_justifies",
        lambda: envelope(1, signed_proposal(make_block(G, 5))),
        "view_not_justified",
    ),
    ("vote_too_far_in_the_future", lambda: envelope(2, far_future_vote()), "future_view"),
    (
        "timeout_too_far_in_the_future",
        lambda: envelope(3, signed_timeout(3, FAR_VIEW, GQC)),
        "future_view",
    ),
    (
        "unsolicited_sync_response",
        lambda: envelope(1, SyncResponse((B1,), (B2, B3), qc_for(B3), (), 1)),
        "unsolicited",
    ),
    ("sync_request_reaching_the_core", lambda: envelope(1, SyncRequest(1, 8)), "unexpected"),
]


@pytest.mark.parametrize(("build", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_dropped_counted_by_reason_and_changes_nothing(
    build: Callable[[], Envelope], reason: str
) -> None:
    core = started_core()
    before = snapshot(core)
    actions = core.on_message(build())  # must not raise
    assert core.dropped == Counter({reason: 1})
    assert actions == []
    assert snapshot(core) == before


def test_the_valid_counterparts_of_the_bad_inputs_are_accepted() -> None:
    """The drops above are for the flaw, not the shape: the honest versions get through."""
    core = started_core()
    actions = core.on_message(envelope(1, signed_proposal(B1)))
    assert sent_of(actions, Vote) and not core.dropped
    actions = core.on_message(envelope(2, with_justify(qc_for(B1))))
    assert core.view == 2 and sent_of(actions, Vote) and not core.dropped
    core.on_message(envelope(3, tc_from([signed_timeout(v, 2, qc_for(B1)) for v in (1, 2, 3)])))
    assert core.view == 3 and not core.dropped


def test_a_qc_with_repeated_or_unsorted_signers_cannot_even_be_built() -> None:
    """Such a QC never reaches the core: building it (as the wire codec does) raises the
    RemoteError the shell counts. The core's own checks assume distinct sorted signers."""
    sigs = qc_for(B1).signatures
    for bad in ((sigs[0], sigs[0], sigs[1]), (sigs[1], sigs[0], sigs[2])):
        with pytest.raises(RemoteError) as info:
            QuorumCert(1, 1, B1.hash, bad)
        assert info.value.reason == "bad_certificate"
    tsigs = under_signed_tc().signatures
    with pytest.raises(RemoteError) as info:
        TimeoutCert(1, GQC, (tsigs[0], tsigs[0], tsigs[1]))
    assert info.value.reason == "bad_certificate"


def test_an_equivocating_leader_gets_one_vote_and_its_second_block_is_counted() -> None:
    core = started_core()
    first = core.on_message(envelope(1, signed_proposal(B1)))
    assert [v.block_hash for v in sent_of(first, Vote)] == [B1.hash]
    twin = make_block(G, 1, timestamp_ms=B1.timestamp_ms + 1)
    before = snapshot(core)
    assert core.on_message(envelope(1, signed_proposal(twin))) == []
    assert core.on_message(envelope(1, signed_proposal(B1))) == []
    assert core.dropped == Counter({"equivocating_proposal": 1, "duplicate": 1})
    assert snapshot(core) == before


def test_a_member_voting_twice_in_a_view_is_counted_and_its_second_vote_ignored() -> None:
    core = started_core()
    core.on_message(envelope(2, signed_vote(2, B1)))
    twin = make_block(G, 1, timestamp_ms=B1.timestamp_ms + 1)
    core.on_message(envelope(2, signed_vote(2, twin)))
    core.on_message(envelope(2, signed_vote(2, B1)))
    assert core.dropped == Counter({"equivocating_vote": 1, "duplicate": 1})
    # Two more votes for the twin would make a quorum only if member 2 counted twice.
    core.on_message(envelope(3, signed_vote(3, twin)))
    core.on_message(envelope(1, signed_vote(1, twin)))
    assert core.high_qc == GQC and core.view == 1


# --------------------------------------------------------------------------- a Byzantine
# member relays a genuine certificate with its `height` changed (signed since qg/vote/v2).


def test_a_genuine_qc_relayed_with_a_falsified_height_never_raises_out_of_the_core() -> None:
    """Any member can relay a real QC with another height inside its own, validly signed
    Timeout. Every vote signs its height (docs/consensus/messages.md), so the QC no longer
    verifies: the timeout is dropped and counted, the tick loop goes on, and the genuine QC
    still lets the core lead its view on the block at its true height."""
    core = started_core(me=2)  # leads view 2
    core.on_message(envelope(1, signed_proposal(B1)))  # knows B1; votes not yet delivered
    poisoned = replace(qc_for(B1), height=B1.height + 4)
    core.on_message(envelope(3, signed_timeout(3, 2, poisoned)))
    assert core.dropped["bad_certificate"] == 1
    assert core.high_qc.block_hash != B1.hash
    for k in range(1, TEST_LIMITS.idle_propose_ticks + 2):
        assert sent_of(core.on_tick(1_000_000 + 10 * k), Proposal) == []  # must not raise
    core.on_message(envelope(3, signed_timeout(3, 2, qc_for(B1))))
    proposals: list[Proposal] = []
    for k in range(1, TEST_LIMITS.idle_propose_ticks + 2):
        proposals += sent_of(core.on_tick(1_000_100 + 10 * k), Proposal)
    assert core.high_qc.height == B1.height
    assert len(proposals) == 1
    assert proposals[0].block.parent_hash == B1.hash
    assert proposals[0].block.justify.height == B1.height


def test_a_qc_formed_from_votes_with_a_falsified_height_never_raises_out_of_the_core() -> None:
    """Member 3 puts a false height on its vote for B1, under the signature it made over
    the true one, and sends it after two honest votes to the leader of view 2, which learns
    B1 itself only afterwards. The vote does not verify, so no QC carries the false height;
    member 3's genuine vote completes the quorum at the true one."""
    core = started_core(me=2)
    core.on_message(envelope(0, signed_vote(0, B1)))
    core.on_message(envelope(1, signed_vote(1, B1)))
    core.on_message(envelope(3, replace(signed_vote(3, B1), height=9)))
    assert core.view == 1 and core.dropped["bad_signature"] == 1
    core.on_message(envelope(3, signed_vote(3, B1)))
    assert core.view == 2 and core.high_qc.height == B1.height
    core.on_message(envelope(1, signed_proposal(B1)))  # late proposal: B1 enters the tree
    proposals: list[Proposal] = []
    for k in range(1, TEST_LIMITS.idle_propose_ticks + 2):
        proposals += sent_of(core.on_tick(1_000_000 + 10 * k), Proposal)  # must not raise
    assert len(proposals) == 1
    assert proposals[0].block.justify.height == B1.height


# --------------------------------------------------------------------------- persist, then send


def test_check_send_allowed_refuses_a_send_whose_safety_epoch_is_not_durable() -> None:
    send = Send(None, signed_vote(0, B1), safety_epoch=3)
    with pytest.raises(UnpersistedSend) as info:
        check_send_allowed(send, durable_epoch=2)
    assert "epoch 3" in str(info.value)
    check_send_allowed(send, durable_epoch=3)
    check_send_allowed(send, durable_epoch=4)


def _statement_recorded(state_action: PersistSafety, message: Message) -> bool:
    state = state_action.state
    if isinstance(message, Vote):
        return state.last_vote == replace(message, signature=b"")
    if isinstance(message, Timeout):
        return state.last_timeout == replace(message, signature=b"")
    assert isinstance(message, Proposal)
    return state.last_proposed_view == message.block.view


def test_every_signed_send_is_preceded_by_the_persist_of_its_epoch() -> None:
    """actions.py contract 2-3: a vote, timeout or proposal first leaves in the same action
    list as, and after, the PersistSafety whose epoch it carries (and which records it); a
    later re-send of the same signature carries an epoch that is already durable."""
    net = Net()
    # Member 3's proposals are lost, so its views end in timeouts and TCs.
    net.drop = lambda src, dst, msg: src == 3 and isinstance(msg, Proposal)
    net.start()
    net.tick(60)
    # Without a quorum the view is stuck: 0 and 1 time out and keep re-sending the same
    # timeout; then 1 restarts from its disk and re-announces it.
    net.down = {2, 3}
    net.tick(3 * TEST_LIMITS.view_timeout_ticks_max)
    net.restart(1)
    net.down = set()
    net.tick(80)
    seen: set[tuple[int, bytes]] = set()
    checked = {Vote: 0, Timeout: 0, Proposal: 0}
    resent = 0
    for node, actions in net.log:
        persisted: dict[int, PersistSafety] = {}
        for action in actions:
            if isinstance(action, PersistSafety):
                persisted[action.state.epoch] = action
            if not isinstance(action, Send):
                continue
            message = action.message
            if not isinstance(message, Vote | Timeout | Proposal):
                continue
            assert action.safety_epoch >= 1, f"signed {message!r} sent with epoch 0"
            key = (node, message.signature)
            if key in seen:
                resent += 1
                continue
            seen.add(key)
            persist = persisted.get(action.safety_epoch)
            assert persist is not None, f"node {node}: {message!r} without its persist"
            assert _statement_recorded(persist, message)
            checked[type(message)] += 1
    assert min(checked.values()) > 10, checked
    assert resent > 0  # the re-send path (stuck views, restart) was exercised too
    assert min(net.committed_heights()) > 10
    net.assert_committed_prefixes()


# --------------------------------------------------------------------------- a Byzantine
# leader floods a past view it led with late, validly signed sibling blocks.


def test_late_proposals_for_a_past_view_cannot_fill_the_tree_and_stall_the_replica() -> None:
    """A leader may propose once per view (Rule 5); a late second block for a view is
    equivocation, not a block to keep. If every late sibling is kept, one Byzantine member
    fills the tree to `pending_blocks_max`, after which the replica refuses every new block
    (`tree_full`) and, since only commits prune the tree, never votes again."""
    g, b1, b2, b3 = chain_of([1, 2, 3])
    core = started_core()
    for block in (b1, b2):
        core.on_message(envelope(block.proposer, signed_proposal(block)))
    assert core.view == 2
    for k in range(TEST_LIMITS.pending_blocks_max + 1):
        sibling = make_block(g, 1, timestamp_ms=b1.timestamp_ms + 1 + k)  # member 1 led view 1
        core.on_message(envelope(1, signed_proposal(sibling)))  # must not raise
    assert not core.tree.full, f"{len(core.tree)} blocks held after one view's late siblings"
    votes = sent_of(core.on_message(envelope(3, signed_proposal(b3))), Vote)
    assert [v.block_hash for v in votes] == [b3.hash]
