"""A member far behind an epoch boundary catches up by itself (docs/consensus/epochs.md,
"Catching up"): peers already in the next epoch hand it the old epoch's committed chain a
sync page at a time, each page proven by the old members' certificates and ending below
the change block, until the epoch proof fits in one answer."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from quorumgate.proto.crypto import Verifier
from quorumgate.proto.membership import Membership
from quorumgate.replica.actions import Commit, Send
from quorumgate.replica.core import Core
from quorumgate.replica.epochs import (
    check_epoch_proof,
    epoch_page,
    epoch_proof_reach,
    is_epoch_page,
    needs_pages,
)
from quorumgate.replica.sim import Simulation, far_behind_scenario
from quorumgate.replica.sim.epochs import page_for, proof_for
from quorumgate.replica.types import Block, SyncRequest, SyncResponse

FAR_BEHIND_SEEDS = range(200) if os.environ.get("QG_SIM_SWEEP") == "full" else range(3)
SERVER = 2  # a member of both epochs that is not the held one in the run below


# --------------------------------------------------------------------------- the simulator


@pytest.mark.parametrize("n", [4, 7])
@pytest.mark.parametrize("seed", FAR_BEHIND_SEEDS)
def test_a_member_held_down_past_the_boundary_reaches_the_new_epoch(seed: int, n: int) -> None:
    options = far_behind_scenario(seed, n)
    sim = Simulation(options)
    result = sim.run()
    assert len(set(result.committed_heights.values())) == 1, result.committed_heights
    assert sim.nodes[options.held_member][0].epoch == 1
    assert sim.epoch_pages > 0  # it came back more than one proof short of the change


# --------------------------------------------------------------------------- pages


@pytest.fixture(scope="module")
def ended() -> Simulation:
    """A far-behind run that ended with every member in epoch 1: the server's disk holds
    the old epoch's chain and how it ended."""
    options = far_behind_scenario(0, 4)
    assert options.held_member != SERVER
    sim = Simulation(options)
    sim.run()
    return sim


def _behind(sim: Simulation) -> Core:
    """A fresh core of epoch 0 at genesis, as the held member was."""
    server = sim.nodes[SERVER][0]
    first: Membership = server.disk.starts[0][0]
    me = sim.options.held_member
    limits = sim.options.limits
    core = Core(
        first,
        me,
        sim.signers[me],
        limits=limits,
        verifier=Verifier(limits.verified_cache_max, sim.verify_fn),
        fence_on_start=False,
        epochs=True,
    )
    core.start()
    return core


def _page(sim: Simulation, core: Core) -> SyncResponse | None:
    return page_for(sim.nodes[SERVER][0], 0, core.committed_height + 1)


def test_pages_commit_the_old_chain_below_the_change_block_then_the_proof_takes_over(
    ended: Simulation,
) -> None:
    end = ended.nodes[SERVER][0].disk.ends[0]
    limits = ended.options.limits
    core = _behind(ended)
    pages = 0
    while (page := _page(ended, core)) is not None:
        before = core.committed_height
        actions = core.catch_up_from(SERVER, page)
        commits = [a for a in actions if isinstance(a, Commit)]
        assert commits and core.committed_height > before, core.dropped
        assert core.committed_height < end.boundary.height  # never the change block
        assert len(page.committed) <= limits.sync_blocks_max
        # ... and the next page is asked of the same member at once
        asks = [a for a in actions if isinstance(a, Send) and isinstance(a.message, SyncRequest)]
        assert [a.to for a in asks] == [SERVER]
        pages += 1
    assert pages >= 2
    assert core.ended is None and not core.dropped
    assert not needs_pages(core.committed_height + 1, end, epoch_proof_reach(limits))
    proof = proof_for(ended.nodes[SERVER][0], 0, core.committed_height + 1)
    assert proof is not None
    blocks, nxt = check_epoch_proof(core.checker, core.tree.root, proof)
    assert blocks[-1] == end.boundary and nxt == end.membership


def test_a_page_never_commits_the_change_block(ended: Simulation) -> None:
    disk = ended.nodes[SERVER][0].disk
    end = disk.ends[0]
    for start in range(1, end.boundary.height + 1):
        page = epoch_page(
            disk.committed[start : end.boundary.height + 1], end, ended.options.limits
        )
        if page is None:
            continue
        assert page.committed[0].height == start
        assert page.committed[-1].height < end.boundary.height
        assert is_epoch_page(page, disk.starts[0][0])


def test_a_lying_page_is_refused_and_commits_nothing(ended: Simulation) -> None:
    page = _page(ended, _behind(ended))
    assert page is not None and len(page.committed) >= 2
    b = page.committed[-1]  # the same block with another payload: its proof no longer fits
    forged = Block.create(
        b.chain_id, b.parent_hash, b.view, b.height, b.justify, b.timestamp_ms, b.proposer,
        (b"forged".ljust(48, b"."),), b.state_root_height, b.state_root,
    )  # fmt: skip
    lies = [
        replace(page, committed=(*page.committed[:-1], forged)),
        replace(page, committed=page.committed[1:]),  # does not chain from genesis
        replace(page, proof_qc=page.committed[-1].justify),  # certifies another block
        replace(page, proof=(), proof_qc=None),
    ]
    for lie in lies:
        core = _behind(ended)
        actions = core.catch_up_from(SERVER, lie)
        assert not [a for a in actions if isinstance(a, Commit)]
        assert core.committed_height == 0 and sum(core.dropped.values()) == 1


def test_a_page_that_reaches_past_the_change_block_is_refused(ended: Simulation) -> None:
    disk = ended.nodes[SERVER][0].disk
    end = disk.ends[0]
    core = _behind(ended)
    while (page := _page(ended, core)) is not None:
        core.catch_up_from(SERVER, page)
    top = end.boundary.height
    # the change block and its suffix, passed off as a page: it would commit B with no
    # epoch proof, through the ordinary commit rule
    past = SyncResponse(
        tuple(disk.committed[core.committed_height + 1 : top + 1]) + end.suffix[:-1],
        (end.suffix[-1],),
        end.qc,
        (),
        top,
    )
    height = core.committed_height
    core.catch_up_from(SERVER, past)
    assert core.committed_height == height and core.ended is None
    assert core.dropped["bad_epoch_page"] == 1
    assert not is_epoch_page(past, disk.starts[0][0])
