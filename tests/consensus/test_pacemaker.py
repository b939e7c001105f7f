"""The pacemaker (docs/consensus/protocol.md; replica/core.py; LibraBFT v3 / DiemBFT §6 timeouts and
TCs).

Cores are driven either directly or on the tiny deterministic network of helpers.Net: one
tick at a time, every core ticks, then every message is delivered. No simulator, no clock.
"""

from __future__ import annotations

from collections import Counter

from quorumgate.replica.actions import ScheduleTimeout, Send
from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core
from quorumgate.replica.types import Block, Proposal, Timeout, TimeoutCert, Vote, genesis_qc
from tests.consensus.helpers import (
    CHAIN,
    START_MS,
    TEST_LIMITS,
    TICK_MS,
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

GQC = genesis_qc(CHAIN)
BASE = TEST_LIMITS.view_timeout_ticks_base
CAP = TEST_LIMITS.view_timeout_ticks_max


def no_proposals(src: int, dst: int, msg: object) -> bool:
    return isinstance(msg, Proposal)


def test_view_timeouts_double_after_each_tc_up_to_the_cap_and_reset_after_a_qc() -> None:
    """Exponential back-off in ticks (the pacemaker), read from ScheduleTimeout."""
    net = Net(drop=no_proposals)
    net.start()
    # Tick one at a time and note when member 0 enters views and sends its own timeouts.
    entered: dict[int, int] = {1: 0}
    timed_out: dict[int, int] = {}
    for tick in range(1, 260):
        mark = len(net.log)
        net.tick()
        for node, actions in net.log[mark:]:
            if node != 0:
                continue
            for action in actions:
                if isinstance(action, ScheduleTimeout):
                    entered[action.view] = tick
                if isinstance(action, Send) and isinstance(action.message, Timeout):
                    timed_out.setdefault(action.message.view, tick)
    schedule = net.scheduled(0)
    ticks = [s.ticks for s in schedule]
    assert ticks[:6] == [BASE, 2 * BASE, 4 * BASE, CAP, CAP, CAP]
    assert CAP == 4 * BASE  # the cap is what stops the doubling above
    assert all(t == CAP for t in ticks[3:])
    assert [s.view for s in schedule] == list(range(1, len(schedule) + 1))
    assert [s.leader for s in schedule[:5]] == [1, 2, 3, 0, 1]
    # The timer counts ticks: each view's timeout leaves exactly its scheduled ticks in.
    for s in schedule[:-1]:
        assert timed_out[s.view] - entered[s.view] == s.ticks, s
    # Let proposals through: the next QC resets the timeout to the base.
    net.drop = None
    view_before = net.cores[0].view
    net.tick(CAP + 4 * BASE)
    after = [s for s in net.scheduled(0) if s.view > view_before]
    via_qc = [s for s in after if s.ticks == BASE]
    assert via_qc, after
    assert net.committed_heights()[0] > 0
    # ... and later TCs double from the base again, not from the cap.
    net.drop = no_proposals
    last = net.cores[0].view
    assert net.scheduled(0)[-1] == ScheduleTimeout(last, BASE, last % 4)
    net.tick(BASE + 2 * BASE + 2)
    again = [s.ticks for s in net.scheduled(0) if s.view > last]
    assert again[:2] == [2 * BASE, 4 * BASE], again


def test_2f_plus_1_timeouts_form_a_tc_that_moves_everyone_to_the_next_view() -> None:
    net = Net(drop=no_proposals)
    net.start()
    net.tick(BASE)
    for core in net.cores:
        assert core.view == 2
        assert core.high_tc is not None and core.high_tc.view == 1
        assert len(core.high_tc.signatures) >= core.membership.quorum
        assert core.stats.tcs_formed == 1
    assert net.committed_heights() == [0, 0, 0, 0]


def test_a_tc_needs_a_quorum_and_f_plus_1_timeouts_make_a_replica_join() -> None:
    """n = 7, f = 2, quorum 5: 2 foreign timeouts do nothing, the 3rd (f+1) makes the
    replica sign its own before its timer fires, and the 5th signature forms the TC."""
    core = new_core(0, n=7)
    core.start()
    timeouts = [signed_timeout(v, 1, GQC) for v in (1, 2, 3, 4)]
    for t in timeouts[:2]:
        assert sent_of(core.on_message(envelope(t.voter, t)), Timeout) == []
    assert core.view == 1
    joined = core.on_message(envelope(3, timeouts[2]))
    mine = sent_of(joined, Timeout)
    assert [(t.view, t.voter) for t in mine] == [(1, 0)]
    assert core.view == 1 and core.high_tc is None  # 4 signatures: not yet a TC
    formed = core.on_message(envelope(4, timeouts[3]))
    assert core.view == 2
    tc = core.high_tc
    assert tc is not None and tc.view == 1
    assert [s for s, _, _ in tc.signatures] == [0, 1, 2, 3, 4]
    # the TC goes to the next leader (member 2 leads view 2)
    assert [(a.to, a.message) for a in formed if isinstance(a, Send)] == [(2, tc)]


def test_without_f_plus_1_timeouts_a_replica_waits_for_its_own_timer() -> None:
    core = new_core(0, n=7)
    core.start()
    for v in (1, 2):
        core.on_message(envelope(v, signed_timeout(v, 1, GQC)))
    for k in range(1, BASE):
        assert sent_of(core.on_tick(START_MS + k), Timeout) == []
    assert [t.view for t in sent_of(core.on_tick(START_MS + BASE), Timeout)] == [1]


def _proposals_over(core: Core, ticks: int) -> list[Proposal]:
    out: list[Proposal] = []
    for k in range(1, ticks + 1):
        out += sent_of(core.on_tick(START_MS + k * TICK_MS), Proposal)
    return out


def test_a_new_leader_extends_the_highest_qc_it_learned_only_from_a_tc() -> None:
    """HotStuff §4.4 / LibraBFT v3 §6: a TC carries its signers' highest QC, and the leader
    after it extends the highest QC it knows, showing the TC that lets it lead."""
    _g, b1 = chain_of([1])
    core = new_core(3)  # leads view 3
    core.start()
    core.on_message(envelope(1, signed_proposal(b1)))  # has B1, but never saw its votes
    assert core.high_qc == GQC
    timeouts = [signed_timeout(0, 2, qc_for(b1))] + [signed_timeout(v, 2, GQC) for v in (1, 2)]
    tc = tc_from(timeouts)
    core.on_message(envelope(1, tc))
    assert core.view == 3 and core.high_qc == qc_for(b1)
    proposals = _proposals_over(core, TEST_LIMITS.idle_propose_ticks)
    assert len(proposals) == 1
    block = proposals[0].block
    assert (block.view, block.parent_hash, block.justify) == (3, b1.hash, qc_for(b1))
    assert proposals[0].high_tc == tc


def test_a_new_leader_keeps_its_own_higher_qc_over_a_tcs_lower_one() -> None:
    _g, b1, b2, b3 = chain_of([1, 2, 3])
    core = new_core(0)  # leads view 4
    core.start()
    for block in (b1, b2, b3):
        core.on_message(envelope(block.proposer, signed_proposal(block)))
    assert core.view == 3 and core.high_qc == qc_for(b2)
    tc = tc_from([signed_timeout(v, 3, qc_for(b1)) for v in (1, 2, 3)])
    core.on_message(envelope(1, tc))
    assert core.view == 4
    proposals = _proposals_over(core, TEST_LIMITS.idle_propose_ticks)
    assert [p.block.parent_hash for p in proposals] == [b2.hash]
    assert proposals[0].block.justify == qc_for(b2)


def test_block_timestamps_are_later_than_the_parents_even_when_the_leaders_clock_is_behind() -> (
    None
):
    g, _b1 = chain_of([1])
    # Ahead of our clock, but within what voters allow (docs/consensus/messages.md).
    ahead = make_block(g, 1, timestamp_ms=START_MS + TEST_LIMITS.timestamp_ahead_ms_max - 1)
    core = new_core(2)  # leads view 2; its clock reads START_MS
    core.start()
    core.on_message(envelope(1, signed_proposal(ahead)))
    for voter in (0, 1, 3):
        core.on_message(envelope(voter, signed_vote(voter, ahead)))
    assert core.view == 2
    proposals: list[Proposal] = []
    for _ in range(TEST_LIMITS.idle_propose_ticks):
        proposals += sent_of(core.on_tick(START_MS), Proposal)
    assert [p.block.timestamp_ms for p in proposals] == [ahead.timestamp_ms + 1]


def test_every_proposed_block_is_later_than_its_parent_on_a_running_network() -> None:
    net = Net()
    net.start()
    net.tick(40)
    blocks: dict[bytes, Block] = {}
    for disk in net.disks:
        blocks.update({b.hash: b for b in disk.committed})
        blocks.update(disk.blocks)
    proposals = [
        a.message
        for _, acts in net.log
        for a in acts
        if isinstance(a, Send) and isinstance(a.message, Proposal)
    ]
    assert len(proposals) > 10
    for proposal in proposals:
        block = proposal.block
        assert block.timestamp_ms > blocks[block.parent_hash].timestamp_ms


def test_a_block_beyond_the_timestamp_skew_gets_no_vote() -> None:
    """Block time: within `timestamp_ahead_ms_max` ahead of the voter's own clock and
    `timestamp_behind_ms_max` behind it (docs/consensus/messages.md, "Block time")."""
    ahead, behind = 500, 2_000
    limits = Limits(
        view_timeout_ticks_base=BASE,
        view_timeout_ticks_max=CAP,
        idle_propose_ticks=2,
        timestamp_ahead_ms_max=ahead,
        timestamp_behind_ms_max=behind,
    )
    g = chain_of([])[0]
    for ts, reason in (
        (START_MS + ahead + 1, "bad_timestamp"),
        (START_MS - behind - 1, "bad_timestamp"),
        (START_MS + ahead, None),
        (START_MS - behind, None),
    ):
        core = new_core(0, limits=limits)  # its clock reads START_MS
        core.start()
        block = make_block(g, 1, timestamp_ms=ts)
        actions = core.on_message(envelope(1, signed_proposal(block)))
        if reason is None:
            assert len(sent_of(actions, Vote)) == 1 and not core.dropped, ts
        else:
            assert sent_of(actions, Vote) == [] and actions == [], ts
            assert core.dropped == Counter({reason: 1})
            assert core.safety.state.last_voted_view == 0 and block.hash not in core.tree


def test_a_block_not_later_than_its_parent_gets_no_vote() -> None:
    _g, b1 = chain_of([1])
    same_time = make_block(b1, 2, timestamp_ms=b1.timestamp_ms)
    core = new_core(0)
    core.start()
    core.on_message(envelope(1, signed_proposal(b1)))
    actions = core.on_message(envelope(2, signed_proposal(same_time)))
    assert core.view == 2  # its justify (QC(B1)) still counts
    assert sent_of(actions, Vote) == []
    assert core.dropped == Counter({"bad_timestamp": 1})
    assert core.safety.state.last_voted_view == 1


def test_a_tc_message_alone_moves_a_lagging_replica_forward() -> None:
    core = new_core(0)
    core.start()
    tc = tc_from([signed_timeout(v, 5, GQC) for v in (1, 2, 3)])
    actions = core.on_message(envelope(2, tc))
    assert core.view == 6 and core.high_tc == tc
    assert [a for a in actions if isinstance(a, ScheduleTimeout)] == [
        ScheduleTimeout(6, 2 * BASE, 2)
    ]
    assert isinstance(core.high_tc, TimeoutCert)
