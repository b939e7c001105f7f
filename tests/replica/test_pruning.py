"""A replica's committed log pruned below its sidecar's snapshot (docs/pruning.md).

Asked for a pruned height, the store answers clearly — `PrunedError` naming where its
log starts for a reader, a catch-up answer with no blocks and `history_from` for a peer —
never a crash, nor a gap served as if it were the log. Heights it keeps are served as
before; the space is given back; the floor file the sidecar writes is read strictly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumgate.replica.config import Limits
from quorumgate.replica.pruning import PRUNE_FLOOR_FILE, PrunedError, PruneFloor
from quorumgate.replica.storage import ReplicaStore
from quorumgate.replica.types import Envelope, SyncRequest
from quorumgate.replica.wire import envelope_from_pb, envelope_to_pb
from tests.replica.test_storage import commit_of, synthetic_chain

CHAIN = "prune-test"
HEIGHTS = 300


async def _store(path: Path) -> ReplicaStore:
    store = await ReplicaStore.open(path, CHAIN)
    chain = synthetic_chain(CHAIN, HEIGHTS + 2)
    for start in range(0, HEIGHTS, 50):  # a proof every 50 heights, as commits come
        blocks = chain[start : start + 50]
        last = start + 50
        await store.apply([commit_of(blocks, chain[last], chain[last + 1])])
    assert store.committed_height == HEIGHTS
    return store


async def test_a_pruned_height_is_refused_by_name_and_kept_ones_served(tmp_path: Path) -> None:
    store = await _store(tmp_path / "replica.db")
    try:
        dropped, before, after = await store.prune_below(151)
        assert dropped == 150 and after < before
        assert store.history_from == 151
        with pytest.raises(PrunedError, match="starts at height 151") as raised:
            await store.committed_range(1, 10)
        assert (raised.value.asked, raised.value.history_from) == (1, 151)
        assert "--from-snapshot" in str(raised.value)
        kept = await store.committed_range(151, 160)
        assert [b.height for b in kept] == list(range(151, 161))
        assert (await store.committed_range(0, 0))[0].height == 0  # genesis stays
    finally:
        await store.close()
    store = await ReplicaStore.open(tmp_path / "replica.db", CHAIN)  # the floor is durable
    try:
        assert store.history_from == 151
        assert (await store.load()).committed.height == HEIGHTS
    finally:
        await store.close()


async def test_a_peer_asking_below_the_floor_gets_no_blocks_and_where_history_starts(
    tmp_path: Path,
) -> None:
    store = await _store(tmp_path / "replica.db")
    try:
        await store.prune_below(151)
        for start in (0, 1, 150):
            answer = await store.sync_response(SyncRequest(start, 64), None, Limits())
            assert answer.committed == () and answer.proof_qc is None
            assert (answer.history_from, answer.committed_height) == (151, HEIGHTS)
        answer = await store.sync_response(SyncRequest(151, 64), None, Limits())
        assert answer.committed and answer.committed[0].height == 151
        assert answer.history_from == 151
        # The field crosses the wire.
        wire = envelope_from_pb(envelope_to_pb(Envelope(CHAIN, 1, answer)))
        assert wire.message == answer
    finally:
        await store.close()


async def test_pruning_never_goes_back_nor_past_the_head(tmp_path: Path) -> None:
    store = await _store(tmp_path / "replica.db")
    try:
        assert await store.prune_below(HEIGHTS + 1) == (0, 0, 0)  # above the head
        assert store.history_from == 1
        await store.prune_below(100)
        assert await store.prune_below(50) == (0, 0, 0)  # never back
        assert store.history_from == 100
        await store.wipe_blocks()  # a wiped log starts again from height 1
        assert store.history_from == 1
    finally:
        await store.close()


def test_the_floor_file_is_read_strictly(tmp_path: Path) -> None:
    assert PruneFloor.read(tmp_path) is None
    PruneFloor(42).write(tmp_path)
    assert PruneFloor.read(tmp_path) == PruneFloor(42)
    for bad in (
        '{"keep_from_height": 0}',
        '{"keep_from_height": -3}',
        "{}",
        "[",
        '{"keep_from_height": "9"}',
    ):
        (tmp_path / PRUNE_FLOOR_FILE).write_text(bad)
        with pytest.raises(ValueError):
            PruneFloor.read(tmp_path)
