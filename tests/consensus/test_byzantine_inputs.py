"""One Byzantine replica must never stop, crash or fool the others.

Each test is an attack that succeeded on an earlier version of the code (a measured
hole), driven straight into the sans-I/O core with really signed messages.
"""

from __future__ import annotations

from dataclasses import replace

from quorumgate.replica.core import Core
from quorumgate.replica.types import (
    Block,
    Proposal,
    SyncRequest,
    SyncResponse,
    Vote,
)
from tests.consensus.helpers import (
    TEST_LIMITS,
    Net,
    chain_of,
    envelope,
    new_core,
    qc_for,
    sent_of,
    signed_proposal,
    signed_vote,
)


def _waiting_for_sync_from(sender: int) -> tuple[Core, list[Block]]:
    """Member 0, shown a valid proposal of view 3 whose parent it does not hold: it asks
    the proposer for the missing blocks (`SyncRequest` to `sender`)."""
    core = new_core(0)
    core.start()
    blocks = chain_of([1, 2, 3])
    assert blocks[3].proposer == sender
    actions = core.on_message(envelope(sender, signed_proposal(blocks[3])))
    requests = [a for a in actions if isinstance(getattr(a, "message", None), SyncRequest)]
    assert [a.to for a in requests] == [sender], "the core should ask the proposer"
    return core, blocks


def test_a_sync_response_with_a_proof_qc_and_no_proof_blocks_is_dropped_not_raised() -> None:
    """Empty `committed`, empty `proof`, any `proof_qc` passed the wire
    codec and raised IndexError out of `Core.on_message` (`response.proof[-1]`): the core
    task died silently, and a Byzantine leader could do it to every honest replica."""
    core, blocks = _waiting_for_sync_from(3)
    poison = SyncResponse(
        committed=(), proof=(), proof_qc=qc_for(blocks[2]), pending=(), committed_height=9
    )
    actions = core.on_message(envelope(3, poison))  # must not raise
    assert core.dropped["bad_sync_proof"] == 1
    assert not sent_of(actions, Vote) and core.committed_height == 0
    # the core is still alive and answers the next honest message
    core.on_tick(core.now_ms + 10)


def test_a_poisoned_sync_never_raises_whatever_its_parts() -> None:
    """Every combination of present and absent parts, each with a QC for a block it does
    not carry: dropped and counted, never raised."""
    blocks = chain_of([1, 2, 3])
    qc = qc_for(blocks[2])
    shapes = [
        dict(committed=(), proof=(), proof_qc=qc, pending=()),
        dict(committed=(), proof=(), proof_qc=None, pending=(blocks[3],)),
        dict(committed=(blocks[1],), proof=(), proof_qc=qc, pending=()),
        dict(committed=(), proof=(blocks[1], blocks[2], blocks[3]), proof_qc=qc, pending=()),
        dict(committed=(), proof=(blocks[2],), proof_qc=None, pending=()),
        dict(committed=(blocks[1],), proof=(blocks[2],), proof_qc=None, pending=(blocks[3],)),
    ]
    for shape in shapes:
        core, _ = _waiting_for_sync_from(3)
        response = SyncResponse(committed_height=5, **shape)  # type: ignore[arg-type]
        core.on_message(envelope(3, response))
        assert sum(core.dropped.values()) >= 1, shape


def test_a_full_block_tree_does_not_deadlock_the_cluster() -> None:
    """With `pending_blocks_max = 8`, views that end by timeout while no
    QC forms each add an uncertified block; once the tree was full every proposal was
    refused and nothing pruned it: 2,000 ticks of a perfect network later, every height
    was still 0. Uncertified blocks of past views are evicted now."""
    limits = replace(TEST_LIMITS, pending_blocks_max=8)
    net = Net(limits=limits)
    lost_views = 7
    net.drop = lambda src, dst, msg: isinstance(msg, Vote) and msg.view <= lost_views
    net.start()
    for _ in range(4000):
        net.tick()
        if min(c.view for c in net.cores) > lost_views + 1:
            break
    assert max(len(c.tree) - 1 for c in net.cores) <= limits.pending_blocks_max  # - the root
    net.drop = None
    for _ in range(2000):
        net.tick()
        if min(net.committed_heights()) >= 3:
            break
    assert min(net.committed_heights()) >= 3, (
        f"heights {net.committed_heights()}, views {[c.view for c in net.cores]}"
    )
    net.assert_committed_prefixes()


def test_a_restart_honours_the_tree_bound_and_evicts_stale_blocks() -> None:
    """`Core.__init__` re-inserted every recovered pending block, ignoring the bound."""
    blocks = chain_of(list(range(1, 13)))
    net = Net()
    net.start()
    from quorumgate.replica.core import Recovered
    from quorumgate.replica.safety import SafetyState

    limits = replace(TEST_LIMITS, pending_blocks_max=8)
    recovered = Recovered(SafetyState.initial(blocks[0].chain_id), blocks[0], tuple(blocks[1:]))
    core = new_core(1, limits=limits, recovered=recovered)
    assert len(core.tree) - 1 <= limits.pending_blocks_max  # the root is not pending


def test_proposals_for_unknown_parents_still_ask_for_them() -> None:
    """The ordinary catch-up path keeps working with the new validation."""
    core, blocks = _waiting_for_sync_from(3)
    assert isinstance(core, Core) and isinstance(signed_proposal(blocks[3]), Proposal)


def test_a_replayed_vote_costs_no_signature_check() -> None:
    """A replayed vote was once verified before it was found to be a duplicate, so a
    peer could make us verify the same signature again and again."""
    core = new_core(0)
    core.start()
    blocks = chain_of([1])
    core.on_message(envelope(1, signed_proposal(blocks[1])))
    vote = signed_vote(2, blocks[1])
    core.on_message(envelope(2, vote))
    calls: list[Vote] = []
    real = core.checker

    class Counting:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def check_vote(self, v: Vote) -> None:
            calls.append(v)
            real.check_vote(v)

    core.checker = Counting()  # type: ignore[assignment]
    for _ in range(50):
        core.on_message(envelope(2, vote))
    assert calls == [] and core.dropped["duplicate"] == 50


def _fat_net(payload_bytes: int, sync_bytes_max: int) -> Net:
    limits = replace(TEST_LIMITS, sync_bytes_max=sync_bytes_max)
    net = Net(limits=limits)
    tx = b"x" * payload_bytes
    for core in net.cores:
        core.payload = FatPayload(tx)
    return net


class FatPayload:
    """Every block carries one transaction of a fixed size: blocks big enough that a
    count-bounded catch-up answer would not fit the byte bound."""

    def __init__(self, tx: bytes) -> None:
        self.tx = tx

    def pending(self) -> bool:
        return True

    def take(self, chain: object, txs_max: int, bytes_max: int) -> tuple[bytes, ...]:
        return (self.tx,)

    def check(self, block: Block) -> str | None:
        return None

    def on_commit(self, blocks: object) -> None:
        return None


def test_catch_up_answers_are_bounded_in_bytes_and_a_wiped_replica_still_catches_up() -> None:
    """The committed part of a sync answer was once bounded in blocks only (256
    blocks of 160 KiB made a 40 MiB envelope, over the 32 MiB transport limit, and the
    asker asked for the same count again). Now each answer ends at the last proof within
    `sync_bytes_max`, and the asker goes on from there."""
    net = _fat_net(payload_bytes=60_000, sync_bytes_max=250_000)
    net.start()
    net.tick(60)
    assert min(net.committed_heights()) >= 12
    request = SyncRequest(1, 16)
    from quorumgate.replica.sync import build_sync_response

    answer = build_sync_response(request, net.disks[0], None, net.limits)
    committed_bytes = sum(b.payload_bytes for b in answer.committed)
    assert answer.committed and committed_bytes <= net.limits.sync_bytes_max
    net.wipe(3)
    target = min(net.committed_heights()[:3])
    for _ in range(400):
        net.tick()
        if net.committed_heights()[3] >= target:
            break
    assert net.committed_heights()[3] >= target
    net.assert_committed_prefixes()
    assert net.cores[3].dropped["oversized_sync"] == 0
