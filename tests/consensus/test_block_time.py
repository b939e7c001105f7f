"""Committed block time never runs ahead of honest clocks by more than a written bound.

The attack: a Byzantine leader proposing at its clock + 5,000 ms was voted for (the
voters allowed 5 s of skew either way), and since every block must be later than its
parent, each honest leader after it proposed its parent's time + 1 ms: committed block
time stayed about 5 s ahead of every honest clock for as long as the Byzantine member
led every n-th view, and confirmation TTLs, grant expiry and quota windows, all in block
time, ran 5 s early. Voters now refuse a block more than `timestamp_ahead_ms_max` ahead
of their own clock (docs/consensus/messages.md, "Block time").
"""

from __future__ import annotations

import pytest

from quorumgate.replica.actions import Action
from quorumgate.replica.core import Core
from quorumgate.replica.types import Proposal
from tests.consensus.helpers import (
    SIGNERS,
    START_MS,
    TEST_LIMITS,
    Net,
    chain_of,
    envelope,
    make_block,
    membership,
    new_core,
    sent_of,
    signed_proposal,
    signed_vote,
)

BYZANTINE = 1
AHEAD_MS = 5_000
RUN_TICKS = 400
WARMUP_TICKS = 40


class ClockAheadCore(Core):
    """A member whose every timestamp is its clock + `shift_ms` (its votes and checks too:
    a leader that lies about time and otherwise follows the protocol)."""

    shift_ms = AHEAD_MS

    def on_tick(self, now_ms: int) -> list[Action]:
        return super().on_tick(now_ms + self.shift_ms)

    def on_transactions(self, now_ms: int | None = None) -> list[Action]:
        return super().on_transactions(None if now_ms is None else now_ms + self.shift_ms)


def lead_of_committed_time(shift_ms: int) -> tuple[int, int]:
    """Run a 4-member cluster whose member 1 stamps its blocks `shift_ms` ahead; return
    the largest lead of honest member 0's committed block time over the shared clock, and
    how many blocks it committed."""
    net = Net(limits=TEST_LIMITS)
    core = ClockAheadCore(
        membership(4), BYZANTINE, SIGNERS[BYZANTINE], limits=TEST_LIMITS, now_ms=net.now_ms,
        fence_on_start=False,
    )  # fmt: skip
    core.shift_ms = shift_ms
    net.cores[BYZANTINE] = core
    net.start()
    lead = 0
    for tick in range(RUN_TICKS):
        net.tick()
        if tick >= WARMUP_TICKS:
            lead = max(lead, net.cores[0].tree.root.timestamp_ms - net.now_ms)
    net.assert_committed_prefixes()
    return lead, net.committed_heights()[0]


def test_a_leader_five_seconds_ahead_does_not_move_committed_time() -> None:
    lead, committed = lead_of_committed_time(AHEAD_MS)
    assert committed > 20
    assert lead <= TEST_LIMITS.timestamp_ahead_ms_max, f"committed time {lead} ms ahead"


@pytest.mark.parametrize("margin_ms", [0, -1])
def test_a_leader_just_within_the_bound_moves_it_no_further(margin_ms: int) -> None:
    """The most a faulty leader can do: stamp its blocks right at the bound. Honest
    leaders after it propose their parent's time + 1 ms and stay within it."""
    lead, committed = lead_of_committed_time(TEST_LIMITS.timestamp_ahead_ms_max + margin_ms)
    assert committed > 20
    assert lead <= TEST_LIMITS.timestamp_ahead_ms_max, f"committed time {lead} ms ahead"


def test_a_leader_whose_clock_is_behind_its_parent_waits_rather_than_propose_too_far_ahead() -> (
    None
):
    """The neighbour, for honest leaders: a block must be later than its parent, so a
    leader whose clock reads more than `timestamp_ahead_ms_max` before its parent's time
    (its clock was set back; a faster one stamped the parent) would propose a block that
    voters with clocks like its own refuse, and lose its view. It waits for its clock."""
    g, _ = chain_of([1])
    parent = make_block(g, 1, timestamp_ms=START_MS)
    core = new_core(2)  # leads view 2; its clock reads START_MS
    core.start()
    core.on_message(envelope(1, signed_proposal(parent)))
    for voter in (0, 1, 3):
        core.on_message(envelope(voter, signed_vote(voter, parent)))
    assert core.view == 2
    ahead = TEST_LIMITS.timestamp_ahead_ms_max
    behind = START_MS - ahead - 50  # its clock stepped back
    waited = [sent_of(core.on_tick(behind + 10 * k), Proposal) for k in range(5)]
    assert waited == [[]] * 5
    proposals: list[Proposal] = []
    now = behind
    while not proposals and now < START_MS:
        now += 10
        proposals = sent_of(core.on_tick(now), Proposal)
    assert len(proposals) == 1
    block = proposals[0].block
    assert block.timestamp_ms == parent.timestamp_ms + 1 <= now + ahead
