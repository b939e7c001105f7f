"""ReplicaStore (replica/storage.py) against its in-memory model, quorumgate.replica.sim.Disk.

Most tests replay what one honest simulated node applied — every action list it carried
out, cut where the simulator crashed it — through `ReplicaStore.apply`, and compare the
store with the node's `Disk`: the two must hold the same safety state, committed log,
proofs and pending blocks, and answer catch-up requests identically. The rest check the
store's own promises: an equivocating vote is refused and rolled back, the safety record
survives a wipe and a reopen, a foreign or damaged file is refused, and a process killed
with SIGKILL at random points leaves exactly a prefix of what it applied, including
everything `apply` had returned for.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import random
import re
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from quorumgate.proto.crypto import Verifier
from quorumgate.replica.actions import (
    Action,
    Commit,
    PersistSafety,
    ScheduleTimeout,
    Send,
    StoreBlock,
)
from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core, Recovered
from quorumgate.replica.safety import SafetyError, SafetyState
from quorumgate.replica.sim import SIM_LIMITS, Disk, SimNode, SimOptions, Simulation
from quorumgate.replica.storage import (
    RANGE_BLOCKS_MAX,
    RECENT_COMMITTED_MAX,
    ReplicaStore,
    StorageError,
)
from quorumgate.replica.sync import build_sync_response
from quorumgate.replica.types import (
    Block,
    CommitProof,
    QuorumCert,
    SyncRequest,
    Timeout,
    Vote,
    genesis_block,
)
from quorumgate.replica.wire import encode_block

REPO_ROOT = Path(__file__).resolve().parents[2]

# Seed 2: the recorded node is crashed three times mid-step, and 14 of its 38 committed
# heights have no proof of their own (multi-block commits), which exercises the sync
# window's reach. Seed 4: no crash, a longer chain.
# A seed whose run crashes the recorded node and leaves heights without proofs that a sync
# request must reach past its window for (the fixture and the sync test check both: a
# change to the core or the simulator moves each run's crashes and proofs, as the
# catch-up rules and the quiet last phase did to seeds 2 and 3; seed 0 crashes it 4 times).
CRASHY = SimOptions(seed=0, ticks=400, crash_permille=2, crash_ticks_max=40, loss_permille=50)
STEADY = SimOptions(seed=4, ticks=400, crash_permille=2, crash_ticks_max=40, loss_permille=50)

Fingerprint = tuple[int, bytes, frozenset[bytes]]


def is_durable(action: Action) -> bool:
    return isinstance(action, PersistSafety | StoreBlock | Commit)


def disk_fingerprint(disk: Disk) -> Fingerprint:
    """What a restart would read back from a Disk: epoch, committed head, pending set."""
    top = disk.committed_height()
    pending = frozenset(h for h, b in disk.blocks.items() if b.height > top)
    return disk.safety.epoch, disk.committed[-1].hash, pending


def recovered_fingerprint(recovered: Recovered) -> Fingerprint:
    pending = frozenset(b.hash for b in recovered.pending)
    return recovered.safety.epoch, recovered.committed.hash, pending


@dataclass
class Recording:
    """One honest node's durable action lists, as it applied them, and its disk after each."""

    sim: Simulation
    node: SimNode
    applies: list[list[Action]] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)  # node.durable_epoch after each
    states: list[Fingerprint] = field(default_factory=list)  # states[p]: after p applies
    crashes: int = 0

    @property
    def chain_id(self) -> str:
        return self.sim.membership.chain_id

    @property
    def disk(self) -> Disk:
        return self.node.disk


def record(options: SimOptions) -> Recording:
    sim = Simulation(options)
    recorded = sim.nodes[sim.honest[0]][0]
    rec = Recording(sim, recorded, states=[disk_fingerprint(recorded.disk)])
    original = sim._apply

    def recording_apply(node: SimNode, actions: list[Action], crash_cut: int | None = None) -> None:
        original(node, actions, crash_cut)
        if node is not recorded:
            return
        done = actions if crash_cut is None else actions[:crash_cut]
        rec.crashes += crash_cut is not None
        if any(is_durable(a) for a in done):
            rec.applies.append(list(done))
            rec.epochs.append(node.durable_epoch)
            rec.states.append(disk_fingerprint(node.disk))

    sim._apply = recording_apply  # type: ignore[method-assign]
    sim.run()
    return rec


@pytest.fixture(scope="module")
def crashy() -> Recording:
    rec = record(CRASHY)
    assert rec.crashes >= 1, "the scenario should crash the recorded node"
    disk = rec.disk
    assert 0 < len(disk.proofs) < disk.committed_height(), "want heights without proofs"
    return rec


@pytest.fixture(scope="module")
def steady() -> Recording:
    return record(STEADY)


async def replay(rec: Recording, path: Path) -> tuple[ReplicaStore, list[int]]:
    store = await ReplicaStore.open(path, rec.chain_id)
    returned = [await store.apply(actions) for actions in rec.applies]
    return store, returned


@pytest.fixture
async def replayed(crashy: Recording, tmp_path: Path) -> AsyncIterator[ReplicaStore]:
    store, _ = await replay(crashy, tmp_path / "replica.db")
    yield store
    await store.close()


async def assert_matches_disk(store: ReplicaStore, disk: Disk) -> None:
    recovered = await store.load()
    assert recovered.safety == disk.safety
    assert recovered.committed == disk.committed[-1]
    assert recovered.committed.hash == disk.committed[-1].hash
    top = disk.committed_height()
    want = {h: b for h, b in disk.blocks.items() if b.height > top}
    assert {b.hash: b for b in recovered.pending} == want
    assert [b.height for b in recovered.pending] == sorted(b.height for b in recovered.pending)
    assert store.committed_height == top
    assert store.durable_epoch == disk.safety.epoch
    # The last height with transactions, as quiescence sees it: the same, or both at or
    # below the state-root height the committed head carries.
    carried = disk.committed[-1].state_root_height
    loaded, wanted = recovered.payload_height, disk.payload_height()
    assert loaded == wanted or (loaded is not None and max(loaded, wanted) <= carried)


def write_around_the_store(path: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    """Change the file as an outside tool would (the store must be closed: it holds the
    file's lock while open, and so would any connection left open here)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(sql, params)
    finally:
        conn.close()


async def stored_block_heights(store: ReplicaStore) -> list[int]:
    """Heights of every row in the `blocks` table, read around the store's API (to see
    what it keeps on disk, not what it chooses to load), on its own connection: the store
    holds the file's lock exclusively."""
    rows = await store._conn.execute_fetchall("SELECT height FROM blocks ORDER BY height")
    return [int(h) for (h,) in rows]


def synthetic_chain(chain_id: str, count: int, parent: Block | None = None) -> list[Block]:
    """`count` blocks in consecutive views above `parent` (genesis by default); their
    certificates are unsigned, which the store neither needs nor checks."""
    parent = parent or genesis_block(chain_id)
    blocks: list[Block] = []
    for _ in range(count):
        qc = QuorumCert(parent.view, parent.height, parent.hash)
        block = Block.create(
            chain_id, parent.hash, parent.view + 1, parent.height + 1, qc,
            parent.timestamp_ms + 1, 0, (),
        )  # fmt: skip
        blocks.append(block)
        parent = block
    return blocks


def commit_of(blocks: Sequence[Block], b1: Block, b2: Block) -> Commit:
    return Commit(tuple(blocks), CommitProof(b1, b2, QuorumCert(b2.view, b2.height, b2.hash)))


def voted_state(chain_id: str, epoch: int, view: int, block_hash: bytes) -> SafetyState:
    state = SafetyState.initial(chain_id)
    vote = Vote(view, view, block_hash, 0, b"")
    return replace(state, epoch=epoch, last_voted_view=view, last_vote=vote)


# ============================================================================ replay vs Disk


async def test_replayed_node_actions_load_back_as_its_disk_state(
    crashy: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "replica.db"
    store, returned = await replay(crashy, path)
    try:
        await assert_matches_disk(store, crashy.disk)
        # What apply returned after each list is exactly the sim node's durable epoch.
        assert returned == crashy.epochs
        # Forks at or below the committed height are gone from disk, not merely unloaded.
        recovered = await store.load()
        assert await stored_block_heights(store) == [b.height for b in recovered.pending]
    finally:
        await store.close()


async def test_replay_matches_disk_after_every_apply_not_only_at_the_end(
    steady: Recording, tmp_path: Path
) -> None:
    store = await ReplicaStore.open(tmp_path / "replica.db", steady.chain_id)
    try:
        assert recovered_fingerprint(await store.load()) == steady.states[0]
        for p, actions in enumerate(steady.applies, start=1):
            await store.apply(actions)
            assert recovered_fingerprint(await store.load()) == steady.states[p], p
        await assert_matches_disk(store, steady.disk)
    finally:
        await store.close()


async def test_committed_log_and_proofs_equal_the_sim_disk(
    crashy: Recording, replayed: ReplicaStore
) -> None:
    disk = crashy.disk
    top = disk.committed_height()
    assert await replayed.committed_range(0, top + 10) == disk.committed
    for height in range(top + 2):
        block = await replayed.committed_block(height)
        want = disk.committed[height] if height <= top else None
        assert block == want
        assert (block.hash if block else None) == (want.hash if want else None)
    assert await replayed.committed_range(5, 9) == disk.committed_range(5, 9)
    assert await replayed.committed_range(9, 5) == []
    for height in range(top + 3):
        for span in (0, 1, 3, 40):
            before = await replayed.proof_at_or_before(height, height - span)
            assert before == disk.proof_at_or_before(height, height - span), (height, span)
            after = await replayed.proof_at_or_after(height, height + span)
            assert after == disk.proof_at_or_after(height, height + span), (height, span)


async def test_sync_responses_equal_build_sync_response_on_the_sim_disk(
    crashy: Recording, replayed: ReplicaStore
) -> None:
    disk, core = crashy.disk, crashy.node.core
    top = disk.committed_height()
    pending = [b for b in disk.blocks.values() if b.height > top and b.hash in core.tree]
    assert pending, "the recorded node should end with pending blocks"
    requests = [
        SyncRequest(0, 64),
        SyncRequest(1, 1),
        SyncRequest(1, 5),
        SyncRequest(2, 0),
        SyncRequest(top // 2, 3),
        SyncRequest(top - 2, 1_000),
        SyncRequest(top, 64),
        SyncRequest(top + 1, 64),
        SyncRequest(top + 1, 64, pending[-1].hash),
        SyncRequest(top - 1, 64, pending[0].hash),
        SyncRequest(3, 2, pending[0].hash),
    ]
    limits_list = [SIM_LIMITS, Limits(sync_blocks_max=1), Limits(sync_blocks_max=4), Limits()]
    reached_past_window = False
    for limits in limits_list:
        for request in requests:
            for with_core in (None, core):
                want = build_sync_response(request, disk, with_core, limits)
                got = await replayed.sync_response(request, with_core, limits)
                assert got == want, (request, limits.sync_blocks_max, with_core is not None)
                assert [b.hash for b in got.committed] == [b.hash for b in want.committed]
                assert [b.hash for b in got.pending] == [b.hash for b in want.pending]
                if got.committed:
                    wanted_end = max(request.from_height, 1) + limits.sync_blocks_max - 1
                    reached_past_window |= got.committed[-1].height > wanted_end
    assert reached_past_window, "no request needed a proof beyond its window"


async def test_reopened_store_returns_the_same_state(crashy: Recording, tmp_path: Path) -> None:
    path = tmp_path / "replica.db"
    store, _ = await replay(crashy, path)
    votes = await store.signed_votes()
    timeouts = await store.signed_timeouts()
    await store.close()
    reopened = await ReplicaStore.open(path, crashy.chain_id)
    try:
        await assert_matches_disk(reopened, crashy.disk)
        assert await reopened.signed_votes() == votes
        assert await reopened.signed_timeouts() == timeouts
        top = crashy.disk.committed_height()
        assert await reopened.committed_range(0, top) == crashy.disk.committed
    finally:
        await reopened.close()


async def test_audit_table_holds_every_vote_the_node_sent(
    crashy: Recording, replayed: ReplicaStore
) -> None:
    me = crashy.node.index
    sent = {view: h for (voter, view), h in crashy.sim.honest_votes.items() if voter == me}
    audit = await replayed.signed_votes()
    assert sent, "the recorded node should have voted"
    # Every vote that left is recorded; the audit may hold more (a vote persisted but cut
    # by a crash before its Send), never a different one.
    assert sent.items() <= audit.items()
    timeouts = await replayed.signed_timeouts()
    last_timeout = crashy.disk.safety.last_timeout
    assert last_timeout is not None
    assert timeouts[last_timeout.view] == last_timeout.high_qc.view


# ============================================================================ restart safety


async def test_core_restarted_from_the_store_refuses_a_second_vote_in_its_last_view(
    crashy: Recording, replayed: ReplicaStore
) -> None:
    sim, me = crashy.sim, crashy.node.index
    recovered = await replayed.load()
    core = Core(
        sim.membership,
        me,
        sim.signers[me],
        limits=SIM_LIMITS,
        verifier=Verifier(SIM_LIMITS.verified_cache_max, sim.verify_fn),
        recovered=recovered,
    )
    state = core.safety.state
    assert state == crashy.disk.safety
    vote = state.last_vote
    assert vote is not None
    known = {b.hash: b for b in (*recovered.pending, *await replayed.committed_range(0, 10**6))}
    voted = known[vote.block_hash]
    parent = known[voted.parent_hash]
    conflicting = replace_block_timestamp(voted, voted.timestamp_ms + 1)
    assert conflicting.hash != voted.hash and conflicting.view == vote.view
    with pytest.raises(SafetyError) as refused:
        core.safety.vote(conflicting, parent)
    assert refused.value.rule == 1
    # Asked about the block it did vote for, it repeats that vote and persists nothing new.
    again = core.safety.vote(voted, parent)
    assert again.value.block_hash == vote.block_hash
    assert again.epoch == state.epoch == replayed.durable_epoch
    # Started, the core sends no vote for any view at or below the one it last voted in.
    for action in core.start():
        if isinstance(action, Send) and isinstance(action.message, Vote):
            assert action.message.view > state.last_voted_view


def replace_block_timestamp(block: Block, timestamp_ms: int) -> Block:
    return Block.create(
        block.chain_id, block.parent_hash, block.view, block.height, block.justify,
        timestamp_ms, block.proposer, block.payload, block.state_root_height, block.state_root,
    )  # fmt: skip


async def test_equivocating_vote_raises_and_rolls_back_the_whole_transaction(
    crashy: Recording, replayed: ReplicaStore
) -> None:
    before = await replayed.load()
    votes_before = await replayed.signed_votes()
    timeouts_before = await replayed.signed_timeouts()
    epoch_before = replayed.durable_epoch
    state = before.safety
    assert state.last_vote is not None
    # An older recorded view than the last vote's, so only the audit table knows of it.
    view, block_hash = max(v for v in votes_before.items() if v[0] < state.last_vote.view)
    other_hash = bytes(32 - 1) + b"\x01"
    assert other_hash != block_hash
    new_view = max(state.last_voted_view, view) + 10
    timed_out = replace(
        state,
        epoch=state.epoch + 1,
        last_voted_view=new_view,
        last_timeout=Timeout(new_view, state.high_qc, crashy.node.index, b""),
    )
    equivocating = replace(
        timed_out,
        epoch=state.epoch + 2,
        last_vote=Vote(view, 0, other_hash, crashy.node.index, b""),
    )
    head = before.pending[-1] if before.pending else before.committed
    fresh_block = synthetic_chain(crashy.chain_id, 1, head)[0]
    top = before.committed
    actions: list[Action] = [
        StoreBlock(fresh_block),
        PersistSafety(timed_out),
        PersistSafety(equivocating),
        Send(None, Vote(view, 0, other_hash, crashy.node.index, b"")),
    ]
    with pytest.raises(AssertionError, match=f"equivocation.*view {view}"):
        await replayed.apply(actions)
    after = await replayed.load()
    assert after == before
    assert fresh_block.hash not in {b.hash for b in after.pending}
    assert await replayed.signed_votes() == votes_before
    assert await replayed.signed_timeouts() == timeouts_before
    assert replayed.durable_epoch == epoch_before
    assert replayed.committed_height == top.height
    # The same vote recorded again is no equivocation: it goes through.
    same = replace(state, epoch=state.epoch + 1)
    assert await replayed.apply([PersistSafety(same)]) == state.epoch + 1


async def test_two_different_votes_for_one_view_in_one_batch_are_refused(
    tmp_path: Path,
) -> None:
    store = await ReplicaStore.open(tmp_path / "replica.db", "qg-test")
    try:
        first = voted_state("qg-test", 1, 5, bytes(31) + b"\x01")
        second = voted_state("qg-test", 2, 5, bytes(31) + b"\x02")
        with pytest.raises(AssertionError, match="equivocation: two different votes for view 5"):
            await store.apply([PersistSafety(first), PersistSafety(second)])
        assert await store.signed_votes() == {}
        assert store.durable_epoch == 0
    finally:
        await store.close()


async def test_durable_epoch_only_moves_forward(tmp_path: Path) -> None:
    chain = "qg-test"
    path = tmp_path / "replica.db"
    store = await ReplicaStore.open(path, chain)
    try:
        assert store.durable_epoch == 0
        assert (await store.load()).safety == SafetyState.initial(chain)
        one = voted_state(chain, 1, 1, bytes(31) + b"\x01")
        two = voted_state(chain, 2, 2, bytes(31) + b"\x02")
        assert await store.apply([PersistSafety(one), PersistSafety(two)]) == 2
        # The last state of a list wins.
        assert (await store.load()).safety == two
        # Nothing durable in the list: the epoch is unchanged.
        assert await store.apply([ScheduleTimeout(3, 20, 3), Send(None, SyncRequest(1, 1))]) == 2
        for stale in (one, two):
            with pytest.raises(AssertionError, match="safety epoch must grow"):
                await store.apply([PersistSafety(stale)])
            assert store.durable_epoch == 2
        assert (await store.load()).safety == two
    finally:
        await store.close()
    reopened = await ReplicaStore.open(path, chain)
    try:
        assert reopened.durable_epoch == 2
        assert await reopened.signed_votes() == {1: bytes(31) + b"\x01", 2: bytes(31) + b"\x02"}
    finally:
        await reopened.close()


async def test_commit_that_does_not_extend_the_committed_head_is_refused(
    tmp_path: Path,
) -> None:
    chain = "qg-test"
    path = tmp_path / "replica.db"
    store = await ReplicaStore.open(path, chain)
    try:
        blocks = synthetic_chain(chain, 8)
        safety = voted_state(chain, 1, 7, blocks[6].hash)
        gap = commit_of(blocks[1:3], blocks[3], blocks[4])  # starts at height 2
        with pytest.raises(AssertionError, match="does not extend the committed head"):
            await store.apply([PersistSafety(safety), StoreBlock(blocks[5]), gap])
        assert store.committed_height == 0 and store.durable_epoch == 0
        assert (await store.load()).pending == ()
        sibling = replace_block_timestamp(blocks[0], blocks[0].timestamp_ms + 5)
        off_chain = commit_of([blocks[0], synthetic_chain(chain, 1, sibling)[0]], *blocks[2:4])
        with pytest.raises(AssertionError, match=r"height 2 .* does not extend"):
            await store.apply([off_chain])
        wrong_height = commit_of(blocks[:2], blocks[3], blocks[4])  # proves height 3, not 2
        with pytest.raises(AssertionError, match="commit proof is for height 3"):
            await store.apply([wrong_height])
        fork = replace_block_timestamp(blocks[1], blocks[1].timestamp_ms + 5)
        wrong_branch = commit_of([blocks[0], fork], blocks[2], blocks[3])  # proves blocks[1]
        with pytest.raises(AssertionError, match="commit proof does not extend"):
            await store.apply([wrong_branch])
        assert await store.committed_range(0, 10) == [genesis_block(chain)]
        # The right commit goes through, and removes the fork below the new head.
        right = commit_of(blocks[:2], blocks[2], blocks[3])
        await store.apply([StoreBlock(fork), StoreBlock(blocks[2]), right])
        assert store.committed_height == 2
        assert [b.hash for b in (await store.load()).pending] == [blocks[2].hash]
        assert await stored_block_heights(store) == [3]
    finally:
        await store.close()


# ============================================================================ operations


async def test_wipe_blocks_keeps_the_safety_record_and_audit_rows(
    crashy: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "replica.db"
    store, _ = await replay(crashy, path)
    chain = crashy.chain_id
    safety = (await store.load()).safety
    votes = await store.signed_votes()
    timeouts = await store.signed_timeouts()
    epoch = store.durable_epoch
    await store.wipe_blocks()
    await store.close()
    store = await ReplicaStore.open(path, chain)
    try:
        recovered = await store.load()
        assert recovered.safety == safety
        assert recovered.committed.hash == genesis_block(chain).hash
        assert recovered.pending == ()
        assert store.committed_height == 0
        assert store.durable_epoch == epoch
        assert await store.signed_votes() == votes
        assert await store.signed_timeouts() == timeouts
        assert await store.committed_range(0, 100) == [genesis_block(chain)]
        assert await store.proof_at_or_after(0, 10**6) is None
        # It still refuses to equivocate, and to go back to an older safety state.
        view, block_hash = max(votes.items())
        other = replace(safety, epoch=epoch + 1, last_vote=Vote(view, 0, bytes(32), 0, b""))
        assert block_hash != bytes(32)
        with pytest.raises(AssertionError, match="equivocation"):
            await store.apply([PersistSafety(other)])
        with pytest.raises(AssertionError, match="safety epoch must grow"):
            await store.apply([PersistSafety(safety)])
        # Catch-up refills the log from height 1.
        disk = crashy.disk
        height = min(disk.proofs)
        await store.apply([Commit(tuple(disk.committed[1 : height + 1]), disk.proofs[height])])
        assert store.committed_height == height
        assert await store.committed_range(0, height) == disk.committed[: height + 1]
    finally:
        await store.close()


async def test_committed_range_reads_at_most_range_blocks_max(tmp_path: Path) -> None:
    chain = "qg-test"
    store = await ReplicaStore.open(tmp_path / "replica.db", chain)
    try:
        count = RANGE_BLOCKS_MAX + 40
        blocks = synthetic_chain(chain, count + 2)
        await store.apply([commit_of(blocks[:count], blocks[count], blocks[count + 1])])
        assert store.committed_height == count
        first = await store.committed_range(0, count)
        assert len(first) == RANGE_BLOCKS_MAX
        assert [b.height for b in first] == list(range(RANGE_BLOCKS_MAX))
        rest = await store.committed_range(RANGE_BLOCKS_MAX, count)
        assert [b.hash for b in rest] == [b.hash for b in blocks[RANGE_BLOCKS_MAX - 1 : count]]
    finally:
        await store.close()


async def test_connection_uses_wal_with_fsync_on_every_commit(tmp_path: Path) -> None:
    store = await ReplicaStore.open(tmp_path / "replica.db", "qg-test")
    try:
        conn = store._conn  # the store's own connection: pragmas are per connection
        assert (await conn.execute_fetchall("PRAGMA journal_mode"))[0][0] == "wal"
        assert (await conn.execute_fetchall("PRAGMA synchronous"))[0][0] == 2  # FULL
        assert (await conn.execute_fetchall("PRAGMA foreign_keys"))[0][0] == 1
    finally:
        await store.close()


# ============================================================================ refused files


async def test_store_of_another_chain_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "replica.db"
    await (await ReplicaStore.open(path, "chain-a")).close()
    with pytest.raises(StorageError, match="belongs to chain 'chain-a', not 'chain-b'"):
        await ReplicaStore.open(path, "chain-b")
    await (await ReplicaStore.open(path, "chain-a")).close()


async def test_store_in_use_by_another_connection_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "replica.db"
    first = await ReplicaStore.open(path, "qg-test")
    try:
        with pytest.raises(StorageError, match="in use by another process"):
            await ReplicaStore.open(path, "qg-test")
        assert await first.apply([PersistSafety(voted_state("qg-test", 1, 1, bytes(32)))]) == 1
    finally:
        await first.close()
    second = await ReplicaStore.open(path, "qg-test")
    assert second.durable_epoch == 1
    await second.close()


async def test_garbage_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "replica.db"
    path.write_bytes(b"this is not an sqlite database, only bytes\n" * 200)
    with pytest.raises(StorageError, match="not a readable replica store"):
        await ReplicaStore.open(path, "qg-test")


async def test_other_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    write_around_the_store(path, "CREATE TABLE notes (body TEXT)")
    with pytest.raises(StorageError, match="not a replica store"):
        await ReplicaStore.open(path, "qg-test")


async def test_other_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "replica.db"
    await (await ReplicaStore.open(path, "qg-test")).close()
    write_around_the_store(path, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StorageError, match="schema version '99'"):
        await ReplicaStore.open(path, "qg-test")


async def test_a_store_of_votes_that_did_not_sign_the_height_is_refused(tmp_path: Path) -> None:
    """A store written before votes signed their block's height (`qg/vote/v1`) holds
    certificates no member of this build can verify: served, each catch-up answer from it
    would be refused by every asker. It is refused at open, saying why."""
    path = tmp_path / "replica.db"
    await (await ReplicaStore.open(path, "qg-test")).close()
    write_around_the_store(path, "DELETE FROM meta WHERE key = 'vote_statement'")
    try:
        store = await ReplicaStore.open(path, "qg-test")
    except StorageError as err:
        assert re.search("qg/vote/v1 .* this build verifies qg/vote/v2", str(err)), err
    else:
        await store.close()  # (an open store holds its connection's thread: close it)
        pytest.fail("a store of qg/vote/v1 certificates was opened")


async def test_damaged_block_row_is_reported_not_served(tmp_path: Path) -> None:
    chain = "qg-test"
    path = tmp_path / "replica.db"
    blocks = synthetic_chain(chain, 3)
    store = await ReplicaStore.open(path, chain)
    await store.apply([StoreBlock(b) for b in blocks])
    await store.close()
    # Block 2's row now holds block 3's bytes.
    write_around_the_store(
        path, "UPDATE blocks SET data = ? WHERE hash = ?", (encode_block(blocks[2]), blocks[1].hash)
    )
    store = await ReplicaStore.open(path, chain)
    try:
        with pytest.raises(StorageError, match="hashes to"):
            await store.load()
    finally:
        await store.close()


async def test_audit_rows_cannot_be_updated_or_deleted(tmp_path: Path) -> None:
    path = tmp_path / "replica.db"
    store = await ReplicaStore.open(path, "qg-test")
    await store.apply([PersistSafety(voted_state("qg-test", 1, 1, bytes(31) + b"\x01"))])
    await store.close()
    for sql in ("DELETE FROM signed_votes", "UPDATE signed_votes SET block_hash = x'00'"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            write_around_the_store(path, sql)
    store = await ReplicaStore.open(path, "qg-test")
    try:
        assert await store.signed_votes() == {1: bytes(31) + b"\x01"}
    finally:
        await store.close()


# ============================================================================ SIGKILL


CHILD = """
import asyncio, os, pickle, sys
from pathlib import Path
from quorumgate.replica.storage import ReplicaStore

async def main() -> None:
    db, recording, chain = sys.argv[1:4]
    with open(recording, "rb") as f:
        applies = pickle.load(f)
    store = await ReplicaStore.open(Path(db), chain)
    os.write(1, b"open\\n")
    for i, actions in enumerate(applies):
        epoch = await store.apply(actions)
        os.write(1, f"{i} {epoch} {store.committed_height}\\n".encode())
    os.write(1, b"done\\n")
    sys.stdin.read()  # stay alive until killed

asyncio.run(main())
"""

KILL_ITERATIONS = 30
KILL_SEED = 20_240_601


async def test_sigkill_at_random_points_leaves_every_returned_apply_durable(
    crashy: Recording, tmp_path: Path
) -> None:
    """A child applies the recorded lists and reports each `apply` that returned; it is
    killed with SIGKILL after a random number of reports. Afterwards the store opens, and
    what it loads is the node's disk after some prefix of the lists at least as long as
    the reported one: nothing returned was lost, nothing half-applied is visible."""
    recording = tmp_path / "applies.pickle"
    recording.write_bytes(pickle.dumps(crashy.applies))
    rng = random.Random(KILL_SEED)
    total = len(crashy.applies)
    for iteration in range(KILL_ITERATIONS):
        db = tmp_path / f"killed-{iteration}.db"
        reports = rng.randrange(total + 2)  # "open" + one line per apply
        where = f"seed {KILL_SEED}, iteration {iteration}, killed after {reports} reports"
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, str(db), str(recording), crashy.chain_id,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT,
        )  # fmt: skip
        assert child.stdout is not None and child.stderr is not None
        last = b""
        for _ in range(reports):
            line = await child.stdout.readline()
            if not line:
                err = (await child.stderr.read()).decode()
                pytest.fail(f"child died early ({where}): {err}")
            last = line
        if last:  # the child has the store open: nobody else may use it meanwhile
            with pytest.raises(StorageError, match="in use by another process"):
                await ReplicaStore.open(db, crashy.chain_id)
        os.kill(child.pid, signal.SIGKILL)
        assert await child.wait() == -signal.SIGKILL, where
        applied, epoch, height = 0, 0, 0
        if last and last != b"open\n":
            index, epoch, height = map(int, last.split())
            applied = index + 1
            assert epoch == crashy.epochs[index], where

        store = await ReplicaStore.open(db, crashy.chain_id)
        try:
            recovered = await store.load()
            assert store.durable_epoch >= epoch, where
            assert store.committed_height >= height, where
            found = recovered_fingerprint(recovered)
            assert found in crashy.states[applied:], f"{where}: not a prefix of the applies"
            vote = recovered.safety.last_vote
            if vote is not None:
                assert (await store.signed_votes())[vote.view] == vote.block_hash, where
        finally:
            await store.close()


async def test_every_transaction_is_fsynced_commits_too(crashy: Recording, tmp_path: Path) -> None:
    """Transactions with only blocks and commits once ran under synchronous=NORMAL,
    though a Commit is reported only once durable (replica/actions.py). Every apply of the
    recorded run — those without a safety record included — leaves the connection FULL."""
    store = await ReplicaStore.open(tmp_path / "replica.db", crashy.chain_id)
    try:
        commit_only = 0
        for actions in crashy.applies:
            await store.apply(actions)
            if not any(isinstance(a, PersistSafety) for a in actions) and any(
                isinstance(a, Commit) for a in actions
            ):
                commit_only += 1
            assert await store._scalar("PRAGMA synchronous") == 2  # 2 = FULL
        assert commit_only > 0, "the recording has no commit-only transaction to check"
    finally:
        await store.close()


async def test_recently_committed_blocks_are_served_from_memory_as_disk_has_them(
    tmp_path: Path,
) -> None:
    """The newest committed blocks come from memory (no SQLite read for a
    follower's stream); every range equals what a reopened store reads from disk."""
    chain = "qg-test"
    path = tmp_path / "replica.db"
    count = RECENT_COMMITTED_MAX + 30
    blocks = synthetic_chain(chain, count + 2)
    store = await ReplicaStore.open(path, chain)
    try:
        for k in range(0, count, 10):  # commits arrive a few blocks at a time
            upto = min(k + 10, count)
            await store.apply([commit_of(blocks[k:upto], blocks[upto], blocks[upto + 1])])
        top = store.committed_height
        ranges = [(top - 5, top), (top - RECENT_COMMITTED_MAX + 1, top), (1, 40), (top, top + 9)]
        from_memory = [await store.committed_range(a, b) for a, b in ranges]
    finally:
        await store.close()
    reopened = await ReplicaStore.open(path, chain)
    try:
        from_disk = [await reopened.committed_range(a, b) for a, b in ranges]
    finally:
        await reopened.close()
    assert [[b.hash for b in r] for r in from_memory] == [[b.hash for b in r] for r in from_disk]
    assert [len(r) for r in from_memory] == [6, RECENT_COMMITTED_MAX, 40, 1]
