"""A vote's height is part of what it signs, and a vote counts only from its signer.

The attack: a vote said which height it was for, but its signature covered only the view
and the block hash. A Byzantine leader withheld its block from member 0 and sent its own
vote last, with a height of 10^9: member 0 formed the QC from votes alone, with that
height, and kept it as its highest QC; when the block reached it by catch-up, the commit
proof it stored carried the false height, and every catch-up answer ending there was
refused by whoever asked (`bad_certificate`). Any member could do the same to another
member's vote by relaying it with a new height: nothing bound a vote to the member whose
stream delivered it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from quorumgate.replica.actions import Commit
from quorumgate.replica.core import Core
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.sim import Disk
from quorumgate.replica.sync import build_sync_response
from quorumgate.replica.types import (
    Block,
    SyncRequest,
    SyncResponse,
    Vote,
    genesis_block,
    vote_bytes,
)
from tests.consensus.helpers import (
    CHAIN,
    SIGNERS,
    TEST_LIMITS,
    chain_of,
    envelope,
    make_block,
    new_core,
    qc_for,
    sent_of,
    signed_proposal,
    signed_vote,
)

FALSE_HEIGHT = 10**9


def attacked_by_votes(core: Core, blocks: list[Block], last: Vote, sender: int) -> None:
    """`core` holds blocks[1] and its QC; blocks[2] (led by member 2) never reaches it,
    but members 1 and 3 vote for it, and `last` (from `sender`) would complete a quorum."""
    core.on_message(envelope(1, signed_proposal(blocks[1])))
    for voter in (1, 2):
        core.on_message(envelope(voter, signed_vote(voter, blocks[1])))
    assert core.high_qc.block_hash == blocks[1].hash
    core.on_message(envelope(3, signed_vote(3, blocks[2])))
    core.on_message(envelope(1, signed_vote(1, blocks[2])))
    core.on_message(envelope(sender, last))


def member_0_after_the_attack(last: Vote, sender: int) -> tuple[Core, Disk, list[Block]]:
    """The attack, then the next leader's proposal, which shows member 0 the genuine QC of
    blocks[2] (signed by 1, 2 and 3); member 0 fetches blocks[2] and commits blocks[1]."""
    blocks = chain_of([1, 2])
    core = new_core(0)
    core.start()
    attacked_by_votes(core, blocks, last, sender)
    assert core.high_qc.height != FALSE_HEIGHT, f"member 0 kept {core.high_qc!r}"
    block3 = make_block(blocks[2], 3, qc_for(blocks[2], voters=(1, 2, 3)))
    requests = sent_of(core.on_message(envelope(3, signed_proposal(block3))), SyncRequest)
    assert [r.target_hash for r in requests] == [blocks[2].hash] and core._sync_peer == 3
    actions = core.on_message(envelope(3, SyncResponse((), (), None, (blocks[2],), 0)))
    disk = Disk(SafetyState.initial(CHAIN), [genesis_block(CHAIN)])
    for action in actions:
        if isinstance(action, Commit):
            disk.committed.extend(action.blocks)
            disk.proofs[action.blocks[-1].height] = action.proof
    return core, disk, blocks


def catch_up_from(server: Core, disk: Disk, blocks: list[Block]) -> Core:
    """A fresh member 3 learns the QC of blocks[2] and asks member 0 for what it lacks."""
    asker = new_core(3)
    asker.start()
    sent: list[SyncRequest] = []
    for voter in (0, 1, 2):
        sent += sent_of(
            asker.on_message(envelope(voter, signed_vote(voter, blocks[2]))), SyncRequest
        )
    # It leads the next view, so it asks a signer of the QC (member 0) at once.
    assert len(sent) == 1 and asker._sync_peer == 0
    request = sent[0]
    answer = build_sync_response(request, disk, server, TEST_LIMITS)
    assert answer.committed, "member 0 has committed blocks[1] and serves it"
    asker.on_message(envelope(0, answer))
    return asker


def false_height_votes(block: Block) -> list[tuple[str, Vote]]:
    """Member 2's vote for `block` with a false height: rewritten under its signature, and
    signed as it is (a Byzantine member signs what it likes with its own key)."""
    chain = block.chain_id
    rewritten = replace(signed_vote(2, block), height=FALSE_HEIGHT)
    sig = SIGNERS[2].sign(vote_bytes(chain, block.view, FALSE_HEIGHT, block.hash))
    signed = Vote(block.view, FALSE_HEIGHT, block.hash, 2, sig)
    return [("bad_signature", rewritten), ("", signed)]


@pytest.mark.parametrize("case", [0, 1], ids=["rewritten", "signed"])
def test_a_leaders_last_vote_cannot_poison_the_commit_proofs_of_another_member(case: int) -> None:
    reason, vote = false_height_votes(chain_of([1, 2])[2])[case]
    core, disk, blocks = member_0_after_the_attack(vote, sender=2)
    if reason:
        assert core.dropped[reason] == 1
    assert core.committed_height == 1 and disk.proofs[1].qc.height == blocks[2].height
    asker = catch_up_from(core, disk, blocks)
    assert asker.dropped["bad_certificate"] == 0
    assert asker.committed_height == 1


def test_a_vote_relayed_by_another_member_is_dropped_and_counted() -> None:
    """Member 2 relays member 1's genuine vote with a new height: it counts for nothing,
    whatever its height, because member 1 did not send it."""
    blocks = chain_of([1, 2])
    relayed = replace(signed_vote(1, blocks[2]), height=FALSE_HEIGHT)
    core = new_core(0)
    core.start()
    core.on_message(envelope(1, signed_proposal(blocks[1])))
    for voter in (1, 2):
        core.on_message(envelope(voter, signed_vote(voter, blocks[1])))
    core.on_message(envelope(3, signed_vote(3, blocks[2])))
    core.on_message(envelope(2, signed_vote(2, blocks[2])))
    core.on_message(envelope(2, relayed))
    assert core.dropped["relayed_vote"] == 1
    assert core.high_qc.block_hash == blocks[1].hash, "no QC from a relayed vote"
    core.on_message(envelope(1, signed_vote(1, blocks[2])))
    assert core.high_qc.block_hash == blocks[2].hash
    assert core.high_qc.height == blocks[2].height
