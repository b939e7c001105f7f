"""A proposal at or below the committed height is refused, never awaited.

The attack: in a quiet cluster the Byzantine leader of the current view sends one
correctly signed proposal whose parent is an old committed block (pruned from every
block tree) and whose justify is a genuine old QC. Waiting for that parent made every
honest replica ask for a catch-up every `sync_retry_ticks`, for ever, until a client
transaction ended the view: no block at or below the committed height can be voted for
(it conflicts with the committed chain), so there is nothing to wait for. The simulator
found it (n = 7, seed 800647; the regression test below replays that seed).
"""

from __future__ import annotations

from quorumgate.replica.core import Core
from quorumgate.replica.sim import SimOptions, Simulation, SimulationFailure
from quorumgate.replica.types import Block, Proposal, SyncRequest
from tests.consensus.helpers import envelope, make_block, qc_for, signed_proposal
from tests.consensus.test_quiescence import BASE, QuietNet, quiet_after_one_transaction

QUIET_TICKS = 1_000


def stale_proposal(net: QuietNet, leader: int, parent_height: int) -> Proposal:
    """`leader`'s signed proposal for the current view on committed block `parent_height`,
    justified by the genuine QC of that block (its child's justify)."""
    committed = net.disks[0].committed
    parent = committed[parent_height]
    core = net.cores[(leader + 1) % net.n]
    block = Block.create(
        parent.chain_id,
        parent.hash,
        core.view,
        parent.height + 1,
        committed[parent_height + 1].justify,
        net.now_ms,
        leader,
        (),
        parent.state_root_height,
        parent.state_root,
    )
    return signed_proposal(block)


def sync_requests_during(net: QuietNet, members: list[int], ticks: int) -> int:
    mark = len(net.log)
    net.tick(ticks)
    return sum(
        1
        for i, actions in net.log[mark:]
        if i in members
        for a in actions
        if hasattr(a, "message") and isinstance(a.message, SyncRequest)
    )


def test_a_stale_proposal_does_not_keep_a_quiet_cluster_busy() -> None:
    net = quiet_after_one_transaction()
    net.tick(10 * BASE)
    leader = net.cores[0].leader
    assert all(core.leader == leader for core in net.cores)
    honest = [i for i in range(net.n) if i != leader]
    top = net.committed_heights()[0]
    assert top >= 3
    proposal = stale_proposal(net, leader, parent_height=1)
    for i in honest:
        net.apply(i, net.cores[i].on_message(envelope(leader, proposal)))
    net.deliver_all()
    # Copies cost no signature check (tests/consensus/test_replays.py has the others).
    checks = [net.cores[i].verifier.checks for i in honest]
    for i in honest:
        for _ in range(10):
            net.apply(i, net.cores[i].on_message(envelope(leader, proposal)))
    assert [net.cores[i].verifier.checks for i in honest] == checks
    requests = sync_requests_during(net, honest, QUIET_TICKS)
    assert requests == 0, f"{requests} catch-up requests in {QUIET_TICKS} ticks"
    for i in honest:
        core: Core = net.cores[i]
        assert core.dropped["stale_proposal"] == 1
        assert not core.needs_ticks()
    assert net.committed_heights() == [top] * net.n


def test_the_regression_seed_settles_quietly() -> None:
    """n = 7, twins + fork_leader: the forking leader's proposal on a stale QC reached a
    cluster gone quiet, and every honest member kept asking for its parent (QUIET)."""
    options = SimOptions(  # scenario(800647, 7), as it printed itself
        seed=800647,
        n=7,
        byzantine=("twins", "fork_leader"),
        ticks=900,
        delay_ticks_max=1,
        dup_permille=50,
        partition_ticks=200,
        victim_delay_ticks=60,
        crash_permille=1,
        crash_ticks_max=150,
        tx_per_tick_permille=100,
    )
    try:
        Simulation(options).run()
    except SimulationFailure as failure:
        raise AssertionError(str(failure)) from None


def test_a_parent_nobody_holds_is_asked_of_each_member_once_then_given_up() -> None:
    """The neighbour: a proposal above the committed height whose parent no member can
    supply (a certified block that was pruned everywhere; here one certified but never
    shown to anyone). Each other member is asked once; then the proposal is dropped,
    counted, and the quiet cluster stays quiet."""
    net = quiet_after_one_transaction()
    leader = net.cores[0].leader
    honest = [i for i in range(net.n) if i != leader]
    root = net.cores[honest[0]].tree.root
    view = net.cores[honest[0]].view
    assert view - 1 > root.view
    unseen = make_block(root, view - 1, qc_for(root), proposer=(view - 1) % net.n)
    block = make_block(unseen, view, qc_for(unseen), proposer=leader, timestamp_ms=net.now_ms)
    for i in honest:
        net.apply(i, net.cores[i].on_message(envelope(leader, signed_proposal(block))))
    net.deliver_all()
    requests = sync_requests_during(net, honest, QUIET_TICKS)
    assert requests <= len(honest) * (net.n - 1), requests
    for i in honest:
        assert net.cores[i].dropped["parent_unavailable"] == 1
        assert not net.cores[i].needs_ticks()
