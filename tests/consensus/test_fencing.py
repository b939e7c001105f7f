"""Safety Rule 6 (replica/safety.py): a replica restored from an old copy of its data never
signs again in a view it already signed in (recovery drill `stale-restore`)."""

from __future__ import annotations

import dataclasses
from collections import Counter

from quorumgate.replica.actions import PersistSafety, Send
from quorumgate.replica.core import Core, Recovered
from quorumgate.replica.safety import SafetyError, SafetyState
from quorumgate.replica.sim import SimOptions, Simulation, SimulationFailure, scenario
from quorumgate.replica.types import (
    Hello,
    HelloReply,
    QuorumCert,
    Timeout,
    Vote,
    genesis_qc,
    hello_bytes,
    hello_reply_bytes,
)
from tests.consensus.helpers import (
    CHAIN,
    SIGNERS,
    START_MS,
    TEST_LIMITS,
    chain_of,
    envelope,
    make_block,
    membership,
    new_core,
    qc_for,
    sent_of,
    signed_proposal,
    signed_timeout,
    signed_vote,
    tc_from,
)

G, B1, B2, B3 = chain_of([1, 2, 3])


def reply(
    peer: int,
    to: Core,
    last_signed_view: int,
    view: int,
    high_qc: QuorumCert,
    *,
    nonce: bytes | None = None,
    signer: int | None = None,
) -> HelloReply:
    """A Rule 6 answer from `peer` to this start of `to`, signed by `signer` (the peer)."""
    asked = to.hello_nonce if nonce is None else nonce
    who = peer if signer is None else signer
    statement = hello_reply_bytes(CHAIN, peer, to.me, asked, last_signed_view, view)
    return HelloReply(
        last_signed_view, view, high_qc, None, to.me, asked, SIGNERS[who].sign(statement)
    )


def hello(sender: int, nonce: bytes = bytes(16)) -> Hello:
    return Hello(nonce, SIGNERS[sender].sign(hello_bytes(CHAIN, sender, nonce)))


def test_own_signature_in_a_certificate_fences_the_views_it_forgot() -> None:
    """Rule 6: a QC carrying our signature for view 2 while we remember voting only up to
    view 1 raises the last voted view to 2, persisted, before anything else is signed."""
    core = new_core(3)
    core.start()
    core.on_message(envelope(1, signed_proposal(B1)))
    assert core.safety.state.last_voted_view == 1
    forgotten = qc_for(B2, voters=(1, 2, 3))  # we signed it, then lost our disk
    actions = core.on_message(envelope(0, signed_timeout(0, 3, forgotten)))
    persisted = [a.state for a in actions if isinstance(a, PersistSafety)]
    assert persisted and persisted[0].last_voted_view >= 2
    assert core.stats.fenced == 1
    assert core.safety.state.last_voted_view >= 2


def test_a_timeout_certificate_with_our_signature_fences_too() -> None:
    core = new_core(3)
    core.start()
    timeouts = [signed_timeout(v, 4, genesis_qc(CHAIN)) for v in (1, 2, 3)]
    core.on_message(envelope(1, tc_from(timeouts)))
    assert core.safety.state.last_voted_view == 4
    assert core.stats.fenced == 1


def test_a_restarting_replica_signs_nothing_until_2f_plus_1_peers_answer() -> None:
    core = new_core(3, fence_on_start=True)
    started = core.start()
    (asked,) = sent_of(started, Hello)
    assert asked.nonce == core.hello_nonce
    assert SIGNERS[3].public_key  # the hello is signed by member 3's key:
    core.checker.check_hello(3, asked)
    assert [s.to for s in started if isinstance(s, Send) and isinstance(s.message, Hello)] == [None]
    votes = sent_of(core.on_message(envelope(1, signed_proposal(B1))), Vote)
    assert votes == [], "voted while it did not know which views it had signed in"
    # Peers saw us vote in view 1 before our disk was rolled back.
    for peer in (0, 1):
        core.on_message(envelope(peer, reply(peer, core, 1, 1, genesis_qc(CHAIN))))
    assert core._fencing, "two replies are f+1, not 2f+1: keep waiting"
    core.on_message(envelope(2, reply(2, core, 1, 1, genesis_qc(CHAIN))))
    assert not core._fencing
    assert core.safety.state.last_voted_view == 1  # view 1 is fenced: B1 gets no vote
    actions = core.on_message(envelope(2, signed_proposal(B2)))
    assert [v.block_hash for v in sent_of(actions, Vote)] == [B2.hash]


def test_with_peers_down_f_plus_1_answers_do_after_the_wait() -> None:
    core = new_core(3, fence_on_start=True)
    core.start()
    for peer in (0, 1):
        core.on_message(envelope(peer, reply(peer, core, 0, 1, genesis_qc(CHAIN))))
    for k in range(TEST_LIMITS.fence_wait_ticks - 1):
        core.on_tick(START_MS + k)
        assert core._fencing
    core.on_tick(START_MS + TEST_LIMITS.fence_wait_ticks)
    assert not core._fencing


def test_a_lying_peer_cannot_fence_us_beyond_the_certified_view_plus_two() -> None:
    core = new_core(3, fence_on_start=True)
    core.start()
    core.on_message(envelope(0, reply(0, core, 10**9, 10**9, qc_for(B1))))
    for peer in (1, 2):
        core.on_message(envelope(peer, reply(peer, core, 0, 2, qc_for(B1))))
    assert not core._fencing
    assert core.safety.state.last_voted_view == B1.view + 2


def test_a_hello_is_answered_with_the_last_view_we_saw_the_asker_sign() -> None:
    core = new_core(0)
    core.start()
    core.on_message(envelope(1, signed_proposal(B1)))  # proposer 1 signed in view 1
    core.on_message(envelope(3, signed_vote(3, B1)))  # member 3 voted in view 1
    replies = sent_of(core.on_message(envelope(3, hello(3, b"n" * 16))), HelloReply)
    assert [(r.last_signed_view, r.view) for r in replies] == [(1, core.view)]
    assert (replies[0].asker, replies[0].nonce) == (3, b"n" * 16)
    core.checker.check_hello_reply(0, replies[0])  # signed by us, for that start of 3
    replies = sent_of(core.on_message(envelope(2, hello(2))), HelloReply)
    assert [r.last_signed_view for r in replies] == [0]  # never saw member 2 sign


def test_forged_hello_replies_do_not_end_the_fencing() -> None:
    """Hello replies were once unsigned and their sender self-declared, so
    three forged replies claiming `last_signed_view = 0` ended the fencing of a replica
    restored from old data. Now a reply counts only if its sender signed it, for this
    start (the nonce) of this replica (the asker)."""
    core = new_core(3, fence_on_start=True)
    core.start()
    forged = [
        reply(0, core, 0, 1, genesis_qc(CHAIN), signer=1),  # member 1 posing as 0
        reply(1, core, 0, 1, genesis_qc(CHAIN), nonce=b"\x00" * 16),  # another start's
        reply(2, core, 0, 1, genesis_qc(CHAIN), signer=3),  # signed by the asker itself
    ]
    for peer, message in zip((0, 1, 2), forged, strict=True):
        core.on_message(envelope(peer, message))
    bent = dataclasses.replace(reply(2, core, 0, 1, genesis_qc(CHAIN)), last_signed_view=7)
    core.on_message(envelope(2, bent))  # a genuine reply with its view changed
    assert core._fencing
    assert core.dropped["bad_signature"] == 3 and core.dropped["stale_hello_reply"] == 1
    for peer in (0, 1, 2):  # the genuine answers end it
        core.on_message(envelope(peer, reply(peer, core, 1, 1, genesis_qc(CHAIN))))
    assert not core._fencing and core.safety.state.last_voted_view == 1


def test_a_forged_hello_gets_no_answer() -> None:
    core = new_core(0)
    core.start()
    forged = Hello(bytes(16), SIGNERS[1].sign(hello_bytes(CHAIN, 1, bytes(16))))
    assert sent_of(core.on_message(envelope(2, forged)), HelloReply) == []
    assert core.dropped["bad_signature"] == 1


def stale_options(seed: int, n: int) -> object:
    base = scenario(seed, n)
    return dataclasses.replace(
        base,
        byzantine=(),
        loss_permille=min(base.loss_permille, 50),
        crash_permille=5,
        crash_ticks_max=60,
        stale_restore_permille=600,
    )


def test_replicas_restored_from_old_data_never_equivocate_in_simulation() -> None:
    """The victim member crashes often and comes back from its oldest copy most times
    (the others crash too, and come back on their own data); no two different votes of
    it for one view ever reach the network."""
    restores, failures = 0, []
    for n, seeds in ((4, range(80)), (7, range(30))):
        for seed in seeds:
            sim = Simulation(stale_options(seed, n))  # type: ignore[arg-type]
            try:
                sim.run()
            except SimulationFailure as failure:
                failures.append(str(failure))
            restores += sim.stale_restores
    assert failures == []
    assert restores > 100, "the scenarios hardly restored anyone from old data"


def test_our_own_vote_sent_back_is_never_counted_and_fences_a_forgotten_view() -> None:
    """Found by the fuzzer: a copy of our own vote, sent back to us, was stored
    as a peer's, and our next vote in that view then raised out of the core. Now our own
    signatures are never taken from the network; one above our last voted view means we
    signed it and forgot (restored from old data), and Rule 6 fences that view."""
    core = new_core(3)
    core.start()
    echoed = signed_vote(3, B2)  # we signed it, then lost our disk
    core.on_message(envelope(1, echoed))
    assert core.dropped["own_echo"] == 1
    assert core.safety.state.last_voted_view == B2.view and core.stats.fenced == 1
    core.on_message(envelope(1, signed_proposal(B1)))  # view 1: still below the fence
    assert core.safety.state.last_voted_view == B2.view


# ------------------------------------------------------------------ restores from a backup
#
# Member 0 votes for B7 in view 7, led by member 3 (Byzantine); the vote is delayed, not
# lost. Member 0 is restored from a backup taken before view 7. Its three peers answer its
# hello before the delayed vote reaches them, so each reports it last signed in view 6.
# Member 3 then shows it B7', another block for view 7.

R_G, *R_CHAIN = chain_of([1, 2, 3, 4, 5, 6])
R6 = R_CHAIN[-1]
R7 = make_block(R6, 7)  # the block member 0 voted for, then forgot
R7_OTHER = make_block(R6, 7, timestamp_ms=START_MS + 70)  # the Byzantine leader's other one


def backup_before_view_7() -> Recovered:
    """Member 0's data as a backup taken in view 6, after its vote there."""
    qc5 = qc_for(R_CHAIN[-2])
    state = dataclasses.replace(
        SafetyState.initial(CHAIN),
        epoch=6,
        last_voted_view=6,
        locked_qc=qc5,
        high_qc=qc5,
        last_vote=Vote(6, R6.height, R6.hash, 0, b""),
    )
    return Recovered(state, R_G, tuple(R_CHAIN))


def restored_core(recovered: Recovered) -> Core:
    return Core(
        membership(4),
        0,
        SIGNERS[0],
        limits=TEST_LIMITS,
        now_ms=START_MS,
        recovered=recovered,
        restored=True,
    )


def answer_all(core: Core, last_signed_view: int, high_qc: QuorumCert) -> None:
    for peer in (1, 2, 3):
        core.on_message(envelope(peer, reply(peer, core, last_signed_view, 7, high_qc)))


def test_a_restored_replica_never_votes_again_in_a_view_whose_vote_is_still_in_flight() -> None:
    """Every peer answered before the delayed vote reached it, so their reports (view 6)
    cannot show it. Anything signed in view v needed a certificate of v-1, whose honest
    signers hold one of v-2 (Rule 6 in replica/safety.py): the fence is the highest
    certificate the answers show (QC(B6), view 6) + 2, so view 7 gets no second vote."""
    before = new_core(0, recovered=backup_before_view_7())
    before.start()
    forgotten = sent_of(before.on_message(envelope(3, signed_proposal(R7))), Vote)
    assert [v.block_hash for v in forgotten] == [R7.hash]  # in flight; then the restore
    core = restored_core(backup_before_view_7())
    core.start()
    answer_all(core, 6, qc_for(R6))
    assert not core.fencing
    votes = sent_of(core.on_message(envelope(3, signed_proposal(R7_OTHER))), Vote)
    assert votes == [], "a second vote in view 7: QC(B7) and QC(B7') can both form"
    assert core.safety.state.last_voted_view == R6.view + 2


def test_a_restored_replica_never_votes_in_a_view_whose_timeout_is_still_in_flight() -> None:
    """The same with a timeout: member 0 gave up on view 7 (Rule 4) and forgot. A vote
    in view 7 after that would let a TC of view 7 hide the QC it vouched for."""
    before = new_core(0, recovered=backup_before_view_7())
    before.start()
    before.on_message(envelope(2, signed_timeout(2, 7, qc_for(R6))))  # QC(B6): view 7
    assert before.view == 7
    timed_out = [t for t in _tick_until_timeout(before) if t.view == 7]
    assert timed_out, "member 0 did not time out in view 7"
    core = restored_core(backup_before_view_7())
    core.start()
    answer_all(core, 6, qc_for(R6))
    assert not core.fencing
    votes = sent_of(core.on_message(envelope(3, signed_proposal(R7))), Vote)
    assert votes == [], "voted in view 7 after timing out in it"


def _tick_until_timeout(core: Core) -> list[Timeout]:
    for k in range(TEST_LIMITS.view_timeout_ticks_max + 1):
        timeouts = sent_of(core.on_tick(START_MS + k), Timeout)
        if timeouts:
            return timeouts
    return []


def test_a_restored_replica_does_not_end_its_fencing_on_f_plus_1_answers() -> None:
    """After `fence_wait_ticks` the fencing of a plain start ends with f+1 answers. For a
    restore that is unsafe: member 3 (Byzantine) answers with genesis, member 1 honestly
    from view 5 (it lags), and member 2, which holds QC(B6) and saw the vote, is slow.
    The fence would be view 7 at most, from what those two show. Safety needs f+1 honest
    answers, which only 2f+1 answers guarantee, so the restore keeps waiting."""
    core = restored_core(backup_before_view_7())
    core.start()
    core.on_message(envelope(3, reply(3, core, 0, 1, genesis_qc(CHAIN))))
    core.on_message(envelope(1, reply(1, core, 5, 5, qc_for(R_CHAIN[-2]))))
    for k in range(3 * TEST_LIMITS.fence_wait_ticks):
        core.on_tick(START_MS + k)
    assert core.fencing
    core.on_message(envelope(3, signed_proposal(R7_OTHER)))
    assert core.safety.state.last_vote is not None
    assert core.safety.state.last_vote.view == 6, "signed while it could not know"


def test_a_timeout_in_a_fenced_view_carries_the_qc_of_the_view_before_it() -> None:
    """Rule 6 for timeouts. Fenced at view 8, member 0 may have voted in view 8 for a block
    justified by a QC of view 7 it no longer holds, and locked on it. A timeout there with
    an older QC (it entered view 8 by a TC) could be the one honest signature a TC of view
    8 shares with that block's QC, and the TC would hide the lock: refused. With the QC of
    view 7 it carries whatever such a vote could have locked."""
    state = backup_before_view_7().safety
    tc7 = tc_from([signed_timeout(v, 7, qc_for(R6)) for v in (1, 2, 3)])
    rules = new_core(0, recovered=backup_before_view_7()).safety
    rules.fence(8, 8)
    assert rules.state.last_voted_view == 8 and state.last_voted_view == 6
    try:
        rules.timeout(8, qc_for(R6), tc7)
    except SafetyError as err:
        assert err.rule == 6 and "view 7" in str(err)
    else:
        raise AssertionError("timed out in a fenced view with the qc of view 6")
    qc7 = qc_for(R7)
    signed = rules.timeout(8, qc7, tc7)
    assert signed.value.high_qc.view == 7 and rules.state.last_timeout is not None
    assert rules.state.last_timeout.view == 8


def test_a_restoring_replica_answers_no_hello_until_it_holds_the_view_before_its_fence() -> None:
    """Until then its certificates may be older than some it signed with and forgot, so
    its answer could let another restored member fence too low."""
    core = restored_core(backup_before_view_7())
    core.start()
    assert sent_of(core.on_message(envelope(2, hello(2))), HelloReply) == []
    answer_all(core, 6, qc_for(R6))
    assert core.restoring and core.safety.state.last_voted_view == 8
    assert sent_of(core.on_message(envelope(2, hello(2))), HelloReply) == []
    core.on_message(envelope(3, signed_proposal(R7)))  # QC(B6) only: the fence is 8
    qc7 = qc_for(R7, voters=(1, 2, 3))
    core.on_message(envelope(1, signed_timeout(1, 8, qc7)))
    assert not core.restoring
    assert len(sent_of(core.on_message(envelope(2, hello(2))), HelloReply)) == 1
    assert core.dropped["hello_while_restoring"] == 2


def test_a_timeout_carries_at_least_the_high_qc_of_the_tc_it_follows() -> None:
    """A TC learnt beside a lower QC (here carried by a proposal; a hello answer does the
    same) raised only the highest TC: the timeout signed after it carried the lower QC.
    For a restored replica past its fence, that QC is all its timeout vouches for (Rule
    6), and a leader entering by that TC would have extended the lower one."""
    core = new_core(0, recovered=backup_before_view_7())
    core.start()
    tc8 = tc_from([signed_timeout(v, 8, qc_for(R7)) for v in (1, 2, 3)])
    low = make_block(R6, 9, qc_for(R6))  # justify (view 6) below the TC's QC (view 7)
    core.on_message(envelope(1, signed_proposal(low, tc8)))
    assert core.view == 9 and core.stats.refused["rule2"] == 1
    timeouts = _tick_until_timeout(core)
    assert timeouts and timeouts[0].view == 9
    assert timeouts[0].high_qc.view == 7, "the timeout hid the QC its TC vouches for"


def aimed_options(seed: int, n: int) -> SimOptions:
    behaviour = ("equivocate", "twins")[seed % 2]
    return SimOptions(
        seed=seed,
        n=n,
        byzantine=(behaviour,) * ((n - 1) // 3),
        ticks=600,
        delay_ticks_max=2,
        restores_when_voting=3,
        restores_when_timing_out=2,
        restore_backup_views=seed % 3,
    )


def test_restores_right_after_voting_or_timing_out_never_sign_twice_in_simulation() -> None:
    """The victim is restored right after it voted in a Byzantine member's view, or timed
    out, from a backup of that view or up to two before, what it signed held in flight
    until its peers have answered; once its fencing ends it is handed that view's other
    proposals. Before the fence counted certificates, the equivocating or twin leaders'
    second block got its second vote (tests/consensus/test_tester.py keeps that fence as
    `reported_fence`, which these scenarios catch)."""
    aimed, failures = Counter[str](), []
    for n, seeds in ((4, range(24)), (7, range(10))):
        for seed in seeds:
            sim = Simulation(aimed_options(seed, n))
            try:
                sim.run()
            except SimulationFailure as failure:
                failures.append(str(failure))
            aimed += sim.aimed
    assert failures == []
    assert aimed["voting"] >= 60 and aimed["timing_out"] >= 40, aimed


def test_a_restore_that_crashes_before_its_fence_is_behind_it_starts_as_a_restore_again() -> None:
    """Found by the random seeds: a victim restored right after a vote crashed while still
    fencing and came back as a plain start on the same stale data; the peers' reports
    fenced it below the view it had voted in, and it voted there again ("restored node 2
    equivocated: two votes for view 11 reached peers" here, with the marker cleared at
    every restart). The marker (replica/node.py RESTORE_MARKER_FILE) stays until the fence
    is behind it. Seeds 717 and 748 are two that build the schedule: a schedule changes
    with the core, so the test checks that the crash while fencing happened."""
    for seed in (717, 748):
        opts = SimOptions(
            seed=seed,
            byzantine=("twins",),
            ticks=900,
            delay_ticks_max=6,
            loss_permille=50,
            partition_ticks=40,
            crash_permille=3,
            crash_ticks_max=30,
            restores_when_voting=2,
            restore_backup_views=2,
        )
        sim = Simulation(opts)
        sim.run()
        assert sim.aimed["voting"] == 2 and sim.restores_resumed >= 1, (seed, sim.aimed)


def test_a_plain_restart_after_proposing_can_still_time_out_in_that_view() -> None:
    """A plain start trusts its own disk. Member 3 timed out in view 2 (which ended by a TC,
    so it holds no QC of view 2), proposed in view 3 and crashed before voting. Its peers
    saw it sign in view 3: its own proposal, on its disk. That is no forgotten signature,
    so it must not fence view 3; fenced, safety Rule 6 (c) would let it time out there
    only with a QC of view 2 that nobody has, and with f silent members the cluster would
    never leave view 3, although an ordinary restart must rejoin with f members down."""
    qc1 = qc_for(B1)
    tc2 = tc_from([signed_timeout(v, 2, qc1) for v in (0, 1, 3)])
    state = dataclasses.replace(
        SafetyState.initial(CHAIN),
        epoch=3,
        last_voted_view=2,
        locked_qc=qc1,
        high_qc=qc1,
        high_tc=tc2,
        last_proposed_view=3,
        last_timeout=Timeout(2, qc1, 3, b""),
    )
    core = Core(
        membership(4),
        3,
        SIGNERS[3],
        limits=TEST_LIMITS,
        now_ms=START_MS,
        recovered=Recovered(state, G, (B1,)),
    )
    core.start()
    for peer in (0, 1, 2):  # each saw our proposal of view 3
        core.on_message(envelope(peer, reply(peer, core, 3, 3, qc1)))
    assert not core._fencing
    assert core.view == 3
    sent: list[Timeout] = []
    for k in range(TEST_LIMITS.view_timeout_ticks_base * 4):
        sent += sent_of(core.on_tick(START_MS + k), Timeout)
        if sent:
            break
    assert [t.view for t in sent] == [3], f"no timeout in view 3: {dict(core.stats.refused)}"


# Found by sweeping seeds beyond the suite's: a restore with f Byzantine members.
SEED_20759_N4 = SimOptions(
    seed=20759, byzantine=("malform",), ticks=900, delay_ticks_max=1, dup_permille=50,
    crash_permille=3, crash_ticks_max=30, tx_per_tick_permille=900,
    restores_when_leading=2, restores_when_voting=1,
)  # fmt: skip
TWINS_268_N4 = SimOptions(
    seed=268, byzantine=("twins",), ticks=500, delay_ticks_max=2, byzantine_members=(0,),
    partition_schedule=((0, 0, 1, 1, 1), (0, 1, 1, 0, 0), (0, 0, 1, 0, 0)),
    schedule_phase_ticks=100, restores_when_leading=3, restores_when_voting=3,
    restores_when_timing_out=3, restore_backup_views=1,
)  # fmt: skip
SEED_20482_N4 = SimOptions(
    seed=20482, byzantine=("malform",), ticks=600, delay_ticks_max=0, partition_ticks=200,
    crash_ticks_max=30, restores_when_leading=2, restores_when_voting=1,
    restores_when_timing_out=1, restore_backup_views=4,
)  # fmt: skip


def test_a_restore_with_f_byzantine_members_is_held_to_liveness_once_past_its_fence() -> None:
    """Seed 20759: the restored member was past its fence, and a plain restart of another
    had fenced the view it proposed in: the cluster was stuck for good, a real liveness
    bug, which the simulator must keep reporting."""
    result = Simulation(SEED_20759_N4).run()
    assert not result.liveness_excused
    assert result.views and min(result.views.values()) > 12


def test_a_restore_still_fencing_with_f_byzantine_members_is_one_fault_too_many() -> None:
    """docs/consensus/fencing.md: a restore counts as one of the f faults until it is past
    its fence. With f Byzantine members that do not help (twins that sit out a view while
    fencing, a malform member whose answers to the hello are lost), the restored member
    never gets there and the cluster owes no progress: the simulator still checks safety
    to the end, and says that liveness was excused and why, instead of failing."""
    for options in (TWINS_268_N4, SEED_20482_N4):
        result = Simulation(options).run()
        assert result.liveness_excused, options.seed
