"""A replica that is no member of the epoch it is in only follows it (docs/consensus/
epochs.md, "Followers"): a new machine before the record that makes it a member, whose
index the epoch may not even have (an `add`), or has under another key (a `replace`). Its
core signs, votes, proposes and times out nothing, and takes the old epoch's committed
chain from pages and the epoch proof, exactly as a member far behind does."""

from __future__ import annotations

import pytest

from quorumgate.proto.crypto import Ed25519Signer, Verifier
from quorumgate.proto.membership import Membership
from quorumgate.replica.actions import Action, Commit, Send
from quorumgate.replica.core import Core
from quorumgate.replica.epochs import check_epoch_proof
from quorumgate.replica.sim import Simulation, far_behind_scenario
from quorumgate.replica.sim.epochs import page_for, proof_for
from quorumgate.replica.types import Envelope, Proposal, SyncRequest

SERVER = 2


@pytest.fixture(scope="module")
def ended() -> Simulation:
    options = far_behind_scenario(0, 4)
    sim = Simulation(options)
    sim.run()
    return sim


def _follower(sim: Simulation, me: int) -> Core:
    server = sim.nodes[SERVER][0]
    first: Membership = server.disk.starts[0][0]
    limits = sim.options.limits
    core = Core(
        first,
        me,
        Ed25519Signer(bytes(range(32))),  # a key of no member of this epoch
        limits=limits,
        verifier=Verifier(limits.verified_cache_max, sim.verify_fn),
        epochs=True,
        follower=True,
    )
    assert not _signed(core.start())
    return core


def _signed(actions: list[Action]) -> list[Action]:
    """Everything but a sync request (unsigned: the stream authenticates it) is signed."""
    return [
        a for a in actions if isinstance(a, Send) and not isinstance(a.message, SyncRequest)
    ]


@pytest.mark.parametrize("me", [4, 6, 1])  # an index the epoch lacks (add), or holds (replace)
def test_a_follower_takes_the_old_chain_and_the_proof_and_signs_nothing(
    ended: Simulation, me: int
) -> None:
    server = ended.nodes[SERVER][0]
    end = server.disk.ends[0]
    core = _follower(ended, me)
    for tick in range(200):  # far past any view timeout: it times out nothing
        assert not _signed(core.on_tick(tick * 10))
    assert not _signed(core.on_transactions(2000))
    pages = 0
    while (page := page_for(server, 0, core.committed_height + 1)) is not None:
        before = core.committed_height
        actions = core.catch_up_from(SERVER, page)
        assert not _signed(actions)
        assert [a for a in actions if isinstance(a, Commit)] and core.committed_height > before
        pages += 1
    assert pages >= 1 and not core.dropped
    proof = proof_for(server, 0, core.committed_height + 1)
    assert proof is not None
    blocks, nxt = check_epoch_proof(core.checker, core.tree.root, proof)
    assert blocks[-1] == end.boundary and nxt == end.membership


def test_a_follower_takes_no_member_message(ended: Simulation) -> None:
    """Proposals, votes, timeouts and hellos go to members: a follower counts each dropped
    and answers none (it would have to sign to answer)."""
    server = ended.nodes[SERVER][0]
    core = _follower(ended, 1)
    sent = 0
    for block in server.disk.committed[1:6]:
        proposal = Proposal(block, b"")
        actions = core.on_message(Envelope(block.chain_id, block.proposer, proposal, 0))
        assert not _signed(actions)
        sent += 1
    assert core.dropped["follower"] == sent and core.committed_height == 0
