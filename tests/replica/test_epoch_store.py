"""The replica's store across an epoch boundary (replica/storage.py, docs/consensus/
epochs.md, "The live replica"): the next epoch is written in the same transaction as the
commit of its change block, a restart reads it back, a store of schema 1 opens, and the
mempool takes an owner-signed record in and refuses an unsigned one."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from quorumgate.proto.membership import sign_record
from quorumgate.replica.actions import Action, PersistSafety
from quorumgate.replica.core import Core
from quorumgate.replica.epochs import epoch_safety_state
from quorumgate.replica.mempool import BAD_SIGNATURE, MALFORMED, Mempool, RecordTx
from quorumgate.replica.storage import SCHEMA_VERSION, ReplicaStore, StorageError
from quorumgate.replica.types import Block, Vote, genesis_block
from tests.consensus.helpers import CHAIN, SIGNERS, envelope, make_block, membership, qc_for
from tests.consensus.helpers import signed_proposal as proposal_of
from tests.consensus.test_owner_records import NEW_KEY, OWNER, RECORDS, ROTATE, voter


def run_to_the_boundary() -> tuple[Core, list[list[Action]], Block]:
    """A voter's action batches from genesis to the commit of a rotation's change block."""
    core = voter()
    batches = [core.start()]
    signed = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    change = make_block(genesis_block(CHAIN), 1, payload=(signed,))
    suffix = make_block(change, 2, qc_for(change))
    after = make_block(suffix, 3, qc_for(suffix))
    for block in (change, suffix, after):
        batches.append(core.on_message(envelope(block.proposer, proposal_of(block))))
    assert core.ended is not None
    return core, batches, change


async def apply_all(store: ReplicaStore, core: Core, batches: list[list[Action]]) -> None:
    *before, last = batches
    for batch in before:
        await store.apply(batch)
    assert core.ended is not None
    start = epoch_safety_state(core.ended.boundary, core.safety.state)
    await store.apply([*last, PersistSafety(start)], core.ended)


def test_the_next_epoch_is_durable_with_the_change_blocks_commit(tmp_path: Path) -> None:
    core, batches, change = run_to_the_boundary()

    async def main() -> None:
        store = await ReplicaStore.open(tmp_path / "replica.db", CHAIN)
        await apply_all(store, core, batches)
        assert store.committed_height == change.height
        await store.close()
        again = await ReplicaStore.open(tmp_path / "replica.db", CHAIN)
        try:
            await check_reopened(again)
        finally:
            await again.close()

    async def check_reopened(again: ReplicaStore) -> None:
        stored = again.epoch
        assert stored is not None and stored.epoch == 1
        assert stored.boundary == change
        assert stored.membership(membership()).key(2) == NEW_KEY
        recovered = await again.load()
        assert recovered.boundary == change
        assert recovered.pending == ()  # the old epoch's suffix never commits
        assert recovered.safety.locked_qc.block_hash == change.hash
        # No proof row for the change block: its QC certifies a suffix block.
        assert await again.proof_at_or_before(change.height, 0) is None
        # A restarted core resumes in epoch 1 with the rotated key.
        nxt = stored.membership(membership())
        assert Core(nxt, 0, SIGNERS[0], recovered=recovered).epoch == 1

    asyncio.run(main())


def test_an_epoch_is_written_only_with_its_change_block(tmp_path: Path) -> None:
    core, batches, _ = run_to_the_boundary()

    async def main() -> None:
        store = await ReplicaStore.open(tmp_path / "replica.db", CHAIN)
        assert core.ended is not None
        start = epoch_safety_state(core.ended.boundary, core.safety.state)
        with pytest.raises(AssertionError, match="change block"):
            await store.apply([*batches[0], PersistSafety(start)], core.ended)
        assert store.epoch is None
        await store.close()

    asyncio.run(main())


def test_a_store_of_schema_1_opens_and_is_schema_2_after(tmp_path: Path) -> None:
    path = tmp_path / "replica.db"

    async def create() -> None:
        store = await ReplicaStore.open(path, CHAIN)
        await store.close()

    asyncio.run(create())
    with contextlib.closing(sqlite3.connect(path)) as conn:  # as a build before epochs
        for table in ("epochs", "epoch_votes", "epoch_timeouts"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        conn.commit()
    core, batches, _ = run_to_the_boundary()

    async def reopen() -> None:
        store = await ReplicaStore.open(path, CHAIN)
        assert store.epoch is None
        await apply_all(store, core, batches)
        await store.close()

    asyncio.run(reopen())
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version == str(SCHEMA_VERSION)
        assert conn.execute("SELECT count(*) FROM epochs").fetchone() == (1,)


def test_a_view_of_the_old_epochs_suffix_may_be_voted_again_in_the_new_epoch(
    tmp_path: Path,
) -> None:
    """The first views of epoch 1 repeat the suffix's views of epoch 0 (docs/consensus/
    epochs.md): a member that voted in the suffix votes at the same view number in epoch
    1 for another block, which is no equivocation; two votes in one view of one epoch
    still are."""
    core, batches, change = run_to_the_boundary()
    suffix_vote = core.safety.state.last_vote
    assert suffix_vote is not None and suffix_vote.view > change.view

    def vote_at(view: int, block_hash: bytes) -> Vote:
        return Vote(view, change.height + 1, block_hash, 0, bytes(64))

    async def main() -> None:
        store = await ReplicaStore.open(tmp_path / "replica.db", CHAIN)
        try:
            await apply_all(store, core, batches)
            state = (await store.load()).safety
            again = replace(
                state,
                epoch=state.epoch + 1,
                last_voted_view=suffix_vote.view,
                last_vote=vote_at(suffix_vote.view, b"\x01" * 32),
            )
            await store.apply([PersistSafety(again)])
            other = replace(
                again, epoch=again.epoch + 1, last_vote=vote_at(suffix_vote.view, b"\x02" * 32)
            )
            with pytest.raises(AssertionError, match="equivocation"):
                await store.apply([PersistSafety(other)])
        finally:
            await store.close()

    asyncio.run(main())


def test_a_store_past_epoch_0_is_not_wiped(tmp_path: Path) -> None:
    core, batches, _ = run_to_the_boundary()

    async def main() -> None:
        store = await ReplicaStore.open(tmp_path / "replica.db", CHAIN)
        await apply_all(store, core, batches)
        with pytest.raises(StorageError, match="past epoch 0"):
            await store.wipe_blocks()
        await store.close()

    asyncio.run(main())


# --------------------------------------------------------------------------- the mempool


def test_the_mempool_takes_an_owner_signed_record_and_spends_it_on_commit() -> None:
    mempool = Mempool(CHAIN, owner_records=RECORDS)
    signed = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    checked = mempool.precheck(signed)
    assert isinstance(checked, RecordTx)
    assert mempool.admit_checked(signed, checked).accepted
    assert mempool.take((), 10, 10_000) == (signed,)
    block = make_block(genesis_block(CHAIN), 1, payload=(signed,))
    assert mempool.check(block) is None
    mempool.on_commit([block])
    assert mempool.size == 0
    mempool.assert_invariants()


def test_the_mempool_refuses_an_unsigned_record() -> None:
    """The attack at the door: any client could submit the bare record."""
    mempool = Mempool(CHAIN, owner_records=RECORDS)
    refused = mempool.admit(ROTATE.encode())
    assert not refused.accepted and refused.reason == BAD_SIGNATURE
    block = make_block(genesis_block(CHAIN), 1, payload=(ROTATE.encode(),))
    assert mempool.check(block) == BAD_SIGNATURE


def test_a_chain_without_epochs_takes_no_record_at_all() -> None:
    mempool = Mempool(CHAIN)
    signed = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    assert mempool.admit(signed).reason == MALFORMED
    block = make_block(genesis_block(CHAIN), 1, payload=(signed,))
    assert mempool.check(block) == MALFORMED


def test_a_restore_refuses_a_copy_of_an_epoch_this_node_cannot_run(tmp_path: Path) -> None:
    """`quorumgate restore` (cluster/ops/backups.py) of a copy from past epoch 0: refused,
    with one clear line, when the copy's member set has another size than the node's
    cluster, or when the node's directory holds no key file for its key of that epoch
    (member 2's key was rotated in the copy, and its directory lacks the new key)."""
    from types import SimpleNamespace

    from quorumgate.ops.backups import _check_epoch, _facts
    from quorumgate.ops.nodes import OpsError

    core, batches, _ = run_to_the_boundary()

    async def build() -> None:
        store = await ReplicaStore.open(tmp_path / "copy.db", CHAIN)
        await apply_all(store, core, batches)
        await store.close()

    asyncio.run(build())
    facts, stored = asyncio.run(_facts(tmp_path / "copy.db", CHAIN))
    assert facts.epoch == 1 and stored is not None
    (tmp_path / "node-2").mkdir()
    four = SimpleNamespace(n=4, node_dir=lambda i: tmp_path / f"node-{i}")
    seven = SimpleNamespace(n=7, node_dir=four.node_dir)
    with pytest.raises(OpsError, match="has 4 members; this cluster has 7"):
        _check_epoch(seven, 2, stored)  # type: ignore[arg-type]
    with pytest.raises(OpsError, match="holds no key file for its consensus key of that epoch"):
        _check_epoch(four, 2, stored)  # type: ignore[arg-type]


def test_a_restore_fence_older_than_the_marker_is_ignored(tmp_path: Path) -> None:
    """A restore done by hand (the marker touched again) over one that noted its fence:
    the old `restore-fence` is no fence of the new copy, which fences again."""
    import os

    from quorumgate.replica.epochs import RestoreFence
    from quorumgate.replica.node import _declare_restore, _read_restore_fence, _write_restore_fence

    marker, path = tmp_path / "restored-from-backup", tmp_path / "restore-fence"
    marker.touch()
    nonce = _declare_restore(marker)
    os.utime(marker, ns=(1_000_000_000, 1_000_000_000))
    _write_restore_fence(path, RestoreFence(1, 12, nonce))
    assert _read_restore_fence(path, marker) == RestoreFence(1, 12, nonce)
    marker.touch()  # the restore by hand, the marker's nonce still in it
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert _read_restore_fence(path, marker) is None
    assert _read_restore_fence(tmp_path / "none", marker) is None
    # a fence that names no restore (or another) is no fence of a declared one
    _write_restore_fence(path, RestoreFence(1, 12))
    assert _read_restore_fence(path, marker) is None
    _write_restore_fence(path, RestoreFence(1, 12, nonce))
    marker.unlink()  # past its fence: the file alone says where it fenced
    assert _read_restore_fence(path, marker) == RestoreFence(1, 12, nonce)


def test_a_restore_fence_of_another_restore_is_ignored_whatever_the_clocks_say(
    tmp_path: Path,
) -> None:
    """The fence counts only for the restore that noted it, told by content, not by file
    times: a `restore-fence` left by an earlier restore and newer than the marker of a
    new one (copied with its times kept, or a clock stepped back) is no fence of the new
    copy. A restart of the same restore (a crash after the fence was noted, before the
    marker was removed) keeps it."""
    import os

    from quorumgate.replica.epochs import RestoreFence
    from quorumgate.replica.node import (
        _declare_restore,
        _read_restore_fence,
        _write_restore_fence,
    )

    marker, path = tmp_path / "restored-from-backup", tmp_path / "restore-fence"
    marker.touch()  # the first restore, declared
    first = _declare_restore(marker)
    assert first and _declare_restore(marker) == first  # a restart of the same restore
    _write_restore_fence(path, RestoreFence(1, 12, first))
    assert _read_restore_fence(path, marker) == RestoreFence(1, 12, first)
    marker.unlink()
    marker.touch()  # a second restore by hand; the first one's fence file left behind
    os.utime(marker, ns=(1_000_000_000, 1_000_000_000))  # and older than the fence file
    assert _read_restore_fence(path, marker) is None
    second = _declare_restore(marker)
    assert second != first
    assert _read_restore_fence(path, marker) is None
