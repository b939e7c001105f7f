"""Catch-up (docs/consensus/protocol.md): a replica that is behind or wiped fetches committed blocks
with their certificates and verifies every QC before applying; sync never commits anything on its
own say, only through the commit rule (the 2-chain, replica/blocktree.py) on verified certificates.

Responses are built by `quorumgate.replica.sync.build_sync_response` over the simulator's `Disk`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from quorumgate.replica.actions import Action, Commit
from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.sim import Disk
from quorumgate.replica.sync import build_sync_response
from quorumgate.replica.types import (
    Block,
    CommitProof,
    Envelope,
    QuorumCert,
    SyncRequest,
    SyncResponse,
    Vote,
    genesis_block,
)
from tests.consensus.helpers import (
    CHAIN,
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
    tc_from,
)

BLOCKS = chain_of(range(1, 9))  # genesis, B1..B8 in views 1..8
G = BLOCKS[0]
SERVER = 3  # leads view 7, whose proposal makes the asker ask it


def server_disk(committed_top: int, *, three_chain: bool = False) -> Disk:
    """A server that committed B1..B<top> and kept the 2-chain proof of its top block (or
    the 3-chain proof an earlier release stored)."""
    disk = Disk(SafetyState.initial(CHAIN), list(BLOCKS[: committed_top + 1]))
    b1, b2 = BLOCKS[committed_top + 1], BLOCKS[committed_top + 2]
    if three_chain:
        disk.proofs[committed_top] = CommitProof(b1, b2, qc_for(b2))
    else:
        disk.proofs[committed_top] = CommitProof.two_chain(b1, qc_for(b1))
    return disk


def asking_core(me: int = 0, limits: Limits = TEST_LIMITS) -> tuple[Core, SyncRequest]:
    """A fresh core that hears B7 (justified by QC(B6)) from its leader and asks it for
    what it lacks."""
    core = new_core(me, limits=limits)
    core.start()
    b7 = BLOCKS[7]
    assert b7.proposer == SERVER
    actions = core.on_message(envelope(SERVER, signed_proposal(b7)))
    requests = sent_of(actions, SyncRequest)
    assert len(requests) == 1 and core.view == 7
    assert requests[0].from_height == 1 and requests[0].target_hash == BLOCKS[6].hash
    return core, requests[0]


def answer(core: Core, response: SyncResponse) -> list[Action]:
    return core.on_message(Envelope(CHAIN, SERVER, response))


def commits(actions: list[Action]) -> list[Block]:
    return [b for a in actions if isinstance(a, Commit) for b in a.blocks]


# --------------------------------------------------------------------------- honest catch-up


def test_an_honest_response_commits_through_the_proof_and_unblocks_the_waiting_vote() -> None:
    core, request = asking_core()
    response = build_sync_response(request, server_disk(5), None, TEST_LIMITS)
    assert [b.height for b in response.committed] == [1, 2, 3, 4, 5]
    assert response.proof == (BLOCKS[6],) and response.proof_qc == qc_for(BLOCKS[6])
    actions = answer(core, response)
    assert not core.dropped
    assert commits(actions) == BLOCKS[1:6]
    assert core.committed_height == 5
    # the proposal that was waiting for B6 gets its vote now
    assert [v.block_hash for v in sent_of(actions, Vote)] == [BLOCKS[7].hash]


def test_a_three_chain_proof_kept_by_an_earlier_release_still_proves_its_commit() -> None:
    """A data directory from the 3-chain release keeps 3-chain proofs: two blocks, the QC
    certifying the second. They prove the same commit under the 2-chain rule (and one
    height more: the second block's justify certifies the first, of the next view)."""
    core, request = asking_core()
    response = build_sync_response(request, server_disk(4, three_chain=True), None, TEST_LIMITS)
    assert response.proof == (BLOCKS[5], BLOCKS[6]) and response.proof_qc == qc_for(BLOCKS[6])
    actions = answer(core, response)
    assert not core.dropped
    assert commits(actions) == BLOCKS[1:6]
    assert [v.block_hash for v in sent_of(actions, Vote)] == [BLOCKS[7].hash]


def test_a_replica_restarted_from_an_empty_disk_catches_up_through_sync() -> None:
    net = Net()
    net.start()
    net.tick(30)
    net.down = {3}
    net.tick(120)  # the others go on committing (views led by 3 time out)
    behind = net.committed_heights()
    assert behind[3] < 20 < min(behind[:3])
    net.wipe(3)  # back with genesis and nothing else: it must fetch everything
    mark = len(net.log)
    net.tick(40)
    heights = net.committed_heights()
    assert heights[3] >= min(behind[:3])
    assert max(heights) - heights[3] <= 3
    net.assert_committed_prefixes()
    requests = [m for i, acts in net.log[mark:] if i == 3 for m in sent_of(acts, SyncRequest)]
    # sync_blocks_max = 16 per response, so catching up took several requests
    assert len(requests) >= min(behind[:3]) // TEST_LIMITS.sync_blocks_max
    assert [r.from_height for r in requests] == sorted(r.from_height for r in requests)
    assert net.cores[3].stats.blocks_committed >= min(behind[:3])


# --------------------------------------------------------------------------- bad responses


def assert_dropped_and_nothing_committed(core: Core, actions: list[Action], reason: str) -> None:
    assert core.dropped == Counter({reason: 1})
    assert core.committed_height == 0 and commits(actions) == []
    assert sent_of(actions, Vote) == []


def test_a_response_with_a_broken_hash_chain_is_dropped_and_commits_nothing() -> None:
    core, request = asking_core()
    honest = build_sync_response(request, server_disk(4), None, TEST_LIMITS)
    b1, _b2, b3, b4 = honest.committed
    gap = replace(honest, committed=(b1, b3, b4))  # B2 left out
    actions = answer(core, gap)
    assert_dropped_and_nothing_committed(core, actions, "sync_gap")


def test_a_response_whose_block_points_at_a_foreign_parent_is_dropped() -> None:
    core, request = asking_core()
    honest = build_sync_response(request, server_disk(4), None, TEST_LIMITS)
    stranger = make_block(G, 2, timestamp_ms=BLOCKS[2].timestamp_ms + 1)  # not in the response
    grafted = make_block(stranger, 3)
    b1 = honest.committed[0]
    actions = answer(core, replace(honest, committed=(b1, grafted, *honest.committed[3:])))
    assert_dropped_and_nothing_committed(core, actions, "sync_gap")


def test_a_forged_proof_qc_is_dropped_and_commits_nothing() -> None:
    core, request = asking_core()
    honest = build_sync_response(request, server_disk(1), None, TEST_LIMITS)
    assert [b.height for b in honest.committed] == [1] and honest.proof_qc is not None
    real = honest.proof_qc
    forged = replace(real, signatures=tuple((s, bytes(64)) for s, _ in real.signatures))
    actions = answer(core, replace(honest, proof_qc=forged))
    assert_dropped_and_nothing_committed(core, actions, "bad_certificate")


def test_a_forged_proof_qc_drops_the_whole_response_and_the_next_peer_is_asked() -> None:
    """A response is checked whole before any of it is kept: its committed blocks and proof
    form one chain, certified link by link and, at the end, by the proof QC. A forged
    proof QC marks the server as lying, so nothing of its answer enters the tree (not
    even blocks its genuine inner QCs certify) and the next request goes to another peer.
    Safety needs only that nothing uncertified commits; dropping everything also keeps a
    liar's blocks out of the bounded tree."""
    core, request = asking_core()
    honest = build_sync_response(request, server_disk(5), None, TEST_LIMITS)
    assert honest.proof == (BLOCKS[6],)
    real = honest.proof_qc
    assert real is not None
    forged = replace(real, signatures=tuple((s, bytes(64)) for s, _ in real.signatures))
    tree_before = len(core.tree)
    actions = answer(core, replace(honest, proof_qc=forged))
    assert core.dropped == Counter({"bad_certificate": 1})
    assert commits(actions) == [] and core.committed_height == 0
    assert len(core.tree) == tree_before
    # After the retry interval it asks again, another peer this time.
    asked_again = sent_of(core.on_tick(1_000_000), SyncRequest)
    for _ in range(TEST_LIMITS.sync_retry_ticks + 1):
        asked_again += sent_of(core.on_tick(1_000_000), SyncRequest)
    assert asked_again, "the replica never asked again after the forged answer"


def test_a_response_carrying_a_block_with_a_forged_justify_is_dropped() -> None:
    core, _request = asking_core()
    b1 = BLOCKS[1]
    real = qc_for(b1)
    forged = QuorumCert(1, 1, b1.hash, ((0, real.signatures[0][1]), (1, bytes(64)), (2, bytes(64))))
    b2 = make_block(b1, 2, justify=forged)
    b3 = make_block(b2, 3)
    b4 = make_block(b3, 4)
    response = SyncResponse((b1, b2), (b3, b4), qc_for(b4), (), 2)
    actions = answer(core, response)
    assert_dropped_and_nothing_committed(core, actions, "bad_certificate")
    assert b2.hash not in core.tree


def test_blocks_of_another_chain_are_dropped_and_commit_nothing() -> None:
    other = chain_of(range(1, 6), chain="other-chain")
    core, _ = asking_core()
    response = SyncResponse(tuple(other[1:3]), tuple(other[3:5]), qc_for(other[4]), (), 2)
    actions = answer(core, response)
    # (they do not even chain onto our genesis, but the whole-message check sees their
    # chain id first: every decoded message is validated before the core acts on it)
    assert_dropped_and_nothing_committed(core, actions, "wrong_chain")
    assert all(b.hash not in core.tree for b in other[1:])


def test_a_block_of_another_chain_grafted_onto_our_genesis_is_dropped_as_wrong_chain() -> None:
    core, _ = asking_core()
    ours = genesis_block(CHAIN)
    foreign = Block.create(
        "other-chain", ours.hash, 1, 1, QuorumCert(0, 0, ours.hash), 5, 1, (), 0, b""
    )
    actions = answer(core, SyncResponse((foreign,), (), None, (), 1))
    assert_dropped_and_nothing_committed(core, actions, "wrong_chain")


def test_an_oversized_response_is_dropped_before_anything_is_inserted() -> None:
    long_chain = chain_of(range(1, 2 * TEST_LIMITS.sync_blocks_max + 4))
    core, _ = asking_core()
    response = SyncResponse(tuple(long_chain[1:]), (), None, (), len(long_chain) - 1)
    actions = answer(core, response)
    assert_dropped_and_nothing_committed(core, actions, "oversized_sync")
    assert len(core.tree) == 1


def test_only_the_asked_peer_may_answer_and_only_once() -> None:
    core, request = asking_core()
    honest = build_sync_response(request, server_disk(4), None, TEST_LIMITS)
    core.on_message(Envelope(CHAIN, 1, honest))
    assert core.dropped == Counter({"unsolicited": 1}) and core.committed_height == 0
    answer(core, honest)
    assert core.committed_height == 4
    answer(core, honest)
    assert core.dropped == Counter({"unsolicited": 2})


# --------------------------------------------------------------------------- planted blocks


def test_a_sync_response_cannot_plant_uncertified_blocks_that_stall_the_replica() -> None:
    """Every block an honest server sends is certified: committed ones by their successors'
    justify or the proof QC, pending ones up to the asked-for target, which the waiting
    proposal's justify certifies. A Byzantine server can add any number of siblings that
    carry a genuine justify (QC(B6) is public) but that nobody proposed or certified. If
    they are kept, the tree reaches `pending_blocks_max` and the replica refuses every
    later block (`tree_full`): only commits prune the tree, and it can no longer vote."""
    limits = Limits(
        view_timeout_ticks_base=10,
        view_timeout_ticks_max=40,
        idle_propose_ticks=2,
        sync_blocks_max=16,
        pending_blocks_max=16,
    )
    core, request = asking_core(me=1, limits=limits)
    honest = build_sync_response(request, server_disk(5), None, limits)
    b6 = BLOCKS[6]
    planted = tuple(
        make_block(b6, 7, timestamp_ms=BLOCKS[7].timestamp_ms + 1 + k, proposer=SERVER)
        for k in range(limits.pending_blocks_max)
    )
    answer(core, replace(honest, pending=planted))
    assert core.committed_height == 5  # the genuine part is applied
    # View 7 (led by the server) times out; member 0 proposes B8 on QC(B6) with the TC.
    tc = tc_from([signed_timeout(v, 7, qc_for(b6)) for v in (0, 2, 3)])
    b8 = make_block(b6, 8, justify=qc_for(b6))
    actions = core.on_message(envelope(0, signed_proposal(b8, tc)))
    assert core.view == 8
    assert [v.block_hash for v in sent_of(actions, Vote)] == [b8.hash], core.dropped
