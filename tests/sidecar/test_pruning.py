"""Pruning below a snapshot (docs/pruning.md): the bounds, the signed checkpoint, what
`ledger verify` says, and the space given back.

The bounds are attacked first: a retention of 0 or less, a point above the newest
snapshot, above what the auditors' copy acknowledged, or back below a checkpoint already
pruned at. The store is pruned at real executed heights of a governed log
(tests/sidecar/executed_log.py), and the replica's half is in tests/replica/test_pruning.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from quorumgate.replica.pruning import PruneFloor
from quorumgate.sidecar import operator
from quorumgate.sidecar.audit import audit_height
from quorumgate.sidecar.pruning import (
    ACKED_FILE,
    PruneBounds,
    Pruner,
    checkpoint_signed_by,
    prune_point,
    read_acked,
    sign_checkpoint,
)
from quorumgate.sidecar.snapshots import (
    OPTIONS_FILE,
    RETAIN_AGE_S_MIN,
    SnapshotDir,
    SnapshotOptions,
)
from quorumgate.sidecar.store import CheckpointSignature, SidecarStore, SidecarStoreError
from tests.engine.harness import CHAIN
from tests.sidecar.executed_log import (
    big_block_world,
    execute,
    receipt_key,
    receipt_public_keys,
)
from tests.sidecar.test_snapshots import OWN, Log, log, top  # noqa: F401 (a fixture)

NOW_MS = 1_700_000_000_000  # an executed height's block time
S = 1000  # milliseconds in a second

# ---------------------------------------------------------------- the bounds


def test_the_point_is_the_newest_snapshot_below_the_retention() -> None:
    bounds = PruneBounds(executed_height=1000, retain_heights=300, snapshot_heights=(200, 600, 900))
    assert prune_point(bounds) == 600  # 1000 - 300 = 700: the newest snapshot at or below


def test_never_above_the_newest_snapshot() -> None:
    """However much the retention would allow, the point is a snapshot held: history after
    the newest snapshot is what a wiped member replays."""
    bounds = PruneBounds(executed_height=10_000, retain_heights=1, snapshot_heights=(100, 200))
    assert prune_point(bounds) == 200
    assert prune_point(replace(bounds, snapshot_heights=())) is None


def test_never_above_what_the_auditors_copy_acknowledged() -> None:
    bounds = PruneBounds(1000, 100, (200, 400, 800), acked_height=450)
    assert prune_point(bounds) == 400
    assert prune_point(replace(bounds, acked_height=0)) is None  # nothing shipped yet
    assert prune_point(replace(bounds, acked_height=199)) is None
    assert prune_point(replace(bounds, acked_height=None)) == 800  # no copy configured


def test_never_back_below_a_checkpoint_already_pruned_at() -> None:
    bounds = PruneBounds(1000, 100, (200, 400), checkpoint_height=400)
    assert prune_point(bounds) is None
    assert prune_point(replace(bounds, checkpoint_height=200)) == 400


@pytest.mark.parametrize("retain", [0, -1, -10_000])
def test_a_retention_of_zero_or_less_is_refused(retain: int) -> None:
    with pytest.raises(ValueError, match="retain_heights must be >= 1"):
        prune_point(PruneBounds(1000, retain, (200, 999)))


# Snapshots 200, 600 and 900, taken 500 s, 100 s and 30 s of block time before the
# executed height's block time.
AGED = ((200, NOW_MS - 500 * S), (600, NOW_MS - 100 * S), (900, NOW_MS - 30 * S))


def aged(**fields: object) -> PruneBounds:
    bounds = PruneBounds(
        executed_height=1000,
        retain_heights=1,
        snapshot_heights=(200, 600, 900),
        retain_age_s=60,
        executed_time_ms=NOW_MS,
        snapshot_times_ms=AGED,
    )
    return replace(bounds, **fields)  # type: ignore[arg-type]


def test_never_drops_history_younger_than_the_age() -> None:
    """The retention by height alone would prune at 900, whose block is 30 s old: with
    `retain_age_s` 60 the point is 600, the newest snapshot at least 60 s old."""
    assert prune_point(aged(retain_age_s=None)) == 900
    assert prune_point(aged()) == 600
    assert prune_point(aged(retain_age_s=120)) == 200
    assert prune_point(aged(retain_age_s=501)) is None  # every snapshot is younger


def test_the_age_counts_in_block_time_to_the_millisecond() -> None:
    """A snapshot exactly the age old may go; one a millisecond younger may not. The
    clock is the executed height's block time, not the machine's."""
    exactly = ((200, NOW_MS - 500 * S), (600, NOW_MS - 60 * S), (900, NOW_MS - 30 * S))
    assert prune_point(aged(snapshot_times_ms=exactly)) == 600
    younger = ((200, NOW_MS - 500 * S), (600, NOW_MS - 60 * S + 1), (900, NOW_MS - 30 * S))
    assert prune_point(aged(snapshot_times_ms=younger)) == 200
    # a cluster idle for an hour: its executed height's block time has not moved
    assert prune_point(aged(executed_time_ms=NOW_MS - 45 * S)) == 200


def test_the_age_alone_prunes() -> None:
    assert prune_point(aged(retain_heights=None)) == 600
    assert prune_point(aged(retain_heights=None, retain_age_s=None)) is None  # no retention


def test_the_stricter_retention_wins() -> None:
    assert prune_point(aged(retain_heights=500)) == 200  # by height: 500 and below
    assert prune_point(aged(retain_heights=50)) == 600  # by age
    assert prune_point(aged(acked_height=450)) == 200  # and the copy's bound still holds
    assert prune_point(aged(checkpoint_height=600)) is None


def test_a_snapshot_without_a_block_time_does_not_set_the_age_point() -> None:
    unknown = ((200, NOW_MS - 500 * S),)  # 600's time not known
    assert prune_point(aged(snapshot_times_ms=unknown)) == 200
    assert prune_point(aged(snapshot_times_ms=())) is None
    # a time for a height that is not held is no snapshot to prune at
    assert prune_point(aged(snapshot_heights=(200, 900))) == 200


@pytest.mark.parametrize("age", [0, -60, RETAIN_AGE_S_MIN - 1])
def test_an_age_below_the_minimum_is_refused(age: int) -> None:
    with pytest.raises(ValueError, match=f"retain_age_s must be >= {RETAIN_AGE_S_MIN}"):
        prune_point(aged(retain_age_s=age))


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ({"interval_heights": 10, "retain_heights": 0}, "retain_heights must be >= 1"),
        ({"interval_heights": 10, "retain_heights": -5}, "retain_heights must be >= 1"),
        ({"interval_heights": 10, "retain_heights": "100"}, "whole number"),
        ({"interval_heights": 10, "retain_heights": True}, "whole number"),
        ({"interval_heights": 10, "retain_heights": 2.5}, "whole number"),
        ({"interval_heights": 0, "retain_heights": 100}, "needs snapshots"),
        ({"interval_heights": 10, "audit_copy": "yes"}, "audit_copy"),
        ({"interval_heights": 10, "retain_age_s": 0}, "retain_age_s must be >= 60"),
        ({"interval_heights": 10, "retain_age_s": 59}, "retain_age_s must be >= 60"),
        ({"interval_heights": 10, "retain_age_s": -3600}, "retain_age_s must be >= 60"),
        ({"interval_heights": 10, "retain_age_s": "3600"}, "whole number of seconds"),
        ({"interval_heights": 10, "retain_age_s": True}, "whole number of seconds"),
        ({"interval_heights": 10, "retain_age_s": 90.5}, "whole number of seconds"),
        ({"interval_heights": 0, "retain_age_s": 3600}, "retain_age_s needs snapshots"),
        (
            {"interval_heights": 10, "retain_heights": 100, "retain_age_s": 1},
            "retain_age_s must be >= 60",
        ),
    ],
)
def test_the_options_file_refuses_a_retention_it_cannot_honour(
    tmp_path: Path, doc: dict[str, object], why: str
) -> None:
    (tmp_path / OPTIONS_FILE).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=why) as refused:
        SnapshotOptions.read(tmp_path)
    assert str(tmp_path / OPTIONS_FILE) in str(refused.value)  # the file is named


def test_the_options_file_sets_the_retention(tmp_path: Path) -> None:
    assert SnapshotOptions.read(tmp_path).retain_heights is None  # off by default
    (tmp_path / OPTIONS_FILE).write_text(
        json.dumps({"interval_heights": 50, "retain_heights": 200, "audit_copy": True})
    )
    options = SnapshotOptions.read(tmp_path)
    assert (options.retain_heights, options.audit_copy) == (200, True)
    assert options.retain_age_s is None and options.prunes


def test_the_options_file_sets_the_age(tmp_path: Path) -> None:
    assert not SnapshotOptions.read(tmp_path).prunes
    (tmp_path / OPTIONS_FILE).write_text(
        json.dumps({"interval_heights": 50, "retain_age_s": 86400})
    )
    options = SnapshotOptions.read(tmp_path)
    assert (options.retain_heights, options.retain_age_s, options.prunes) == (None, 86400, True)
    both = {"interval_heights": 50, "retain_heights": 200, "retain_age_s": RETAIN_AGE_S_MIN}
    (tmp_path / OPTIONS_FILE).write_text(json.dumps(both))
    options = SnapshotOptions.read(tmp_path)
    assert (options.retain_heights, options.retain_age_s) == (200, RETAIN_AGE_S_MIN)


def test_the_acknowledged_height_is_read_from_its_file(tmp_path: Path) -> None:
    assert read_acked(tmp_path) == 0  # no file: nothing acknowledged, nothing pruned
    (tmp_path / ACKED_FILE).write_text('{"height": 420}')
    assert read_acked(tmp_path) == 420
    for bad in ('{"height": -1}', '{"height": "420"}', "[420]", "not json"):
        (tmp_path / ACKED_FILE).write_text(bad)
        with pytest.raises(ValueError):
            read_acked(tmp_path)


# ---------------------------------------------------------------- the store


async def _recorded(path: Path, log: Log) -> SidecarStore:  # noqa: F811
    store = await SidecarStore.open(path, CHAIN)
    for executed in log.by_signer[OWN]:
        await store.record(executed)
    return store


def _signature(log: Log, height: int) -> CheckpointSignature:  # noqa: F811
    return CheckpointSignature(OWN, sign_checkpoint(receipt_key(OWN), CHAIN, log.head(height)))


async def test_a_pruned_store_drops_below_the_point_and_still_verifies(
    tmp_path: Path,
    log: Log,  # noqa: F811
) -> None:
    height = top(log) - 3
    store = await _recorded(tmp_path / "s.db", log)
    try:
        full_head, full_entries = store.ledger_head, store.ledger_entries
        below = await store.receipts_at(height)
        assert await store.root_at(height) is not None  # recent: answered from memory
        result = await store.prune_to(log.head(height), _signature(log, height))
        # gone from memory with its statement, as from the file
        assert await store.root_at(height) is None and await store.root_at(1) is None
        assert await store.root_at(height + 1) == log.head(height + 1).state_root
        assert result.height == height and result.receipts >= len(below) > 0
        assert (store.history_from, store.checkpoint) == (height + 1, log.head(height))
        assert await store.receipts_at(height) == [] and await store.ledger_at(1) == []
        assert await store.signed_block(height) is None
        assert (store.ledger_head, store.ledger_entries) == (full_head, full_entries)
        assert await store.verify_ledger() is None
        public = receipt_public_keys()[OWN]
        for audited in range(store.history_from, top(log) + 1):
            assert await audit_height(store, CHAIN, public, audited) is None, audited
        attested = await store.attestation_at(top(log))  # what a fetching peer is told
        assert attested is not None and attested[1] == log.head(top(log))
        with pytest.raises(SidecarStoreError, match="cannot prune at height"):
            await store.prune_to(log.head(height - 1), _signature(log, height - 1))
    finally:
        await store.close()


async def test_a_checkpoint_that_is_not_where_the_store_stands_is_refused(
    tmp_path: Path,
    log: Log,  # noqa: F811
) -> None:
    height = top(log) - 3
    store = await _recorded(tmp_path / "s.db", log)
    try:
        for wrong in (
            replace(log.head(height), ledger_head=bytes(32)),
            replace(log.head(height), ledger_entries=log.head(height).ledger_entries + 1),
            replace(log.head(height), state_root=bytes(32)),
        ):
            with pytest.raises(SidecarStoreError, match="nothing pruned"):
                await store.prune_to(wrong, _signature(log, height))
        assert store.checkpoint is None and len(await store.ledger_at(1)) > 0
    finally:
        await store.close()


def test_ledger_verify_says_where_history_starts_and_checks_the_signature(
    tmp_path: Path,
    log: Log,  # noqa: F811
) -> None:
    height = top(log) - 2
    path = tmp_path / "s.db"

    async def build(signature: CheckpointSignature) -> None:
        store = await _recorded(path, log)
        try:
            await store.prune_to(log.head(height), signature)
        finally:
            await store.close()

    asyncio.run(build(_signature(log, height)))
    out = io.StringIO()
    keys = receipt_public_keys()
    assert operator.ledger_verify(path, CHAIN, out, receipt_keys=keys) == operator.EXIT_OK
    head = log.head(height)
    assert (
        f"history starts at height {height + 1} (pruned below, checkpoint at height {height}: "
        f"ledger head {head.ledger_head.hex()}, {head.ledger_entries} entries before it"
    ) in out.getvalue()
    assert f"signed by member {OWN}: signature good" in out.getvalue()
    # Signed by another member's key, or over other bytes: refused.
    for i, forged in enumerate(
        (
            CheckpointSignature(OWN, sign_checkpoint(receipt_key(0), CHAIN, head)),
            CheckpointSignature(OWN, bytes(64)),
            CheckpointSignature(99, sign_checkpoint(receipt_key(OWN), CHAIN, head)),
        )
    ):
        path = tmp_path / f"forged{i}.db"
        asyncio.run(build(forged))
        out = io.StringIO()
        assert operator.ledger_verify(path, CHAIN, out, receipt_keys=keys) == operator.EXIT_PROBLEM
        assert "does NOT verify" in out.getvalue()


def test_an_exported_pruned_ledger_verifies_from_its_signed_checkpoint(
    tmp_path: Path,
    log: Log,  # noqa: F811
) -> None:
    """`ledger export` of a pruned store starts with the signed checkpoint its history
    starts after; `ledger verify --file` walks the entries from its ledger head and checks
    its signature. Without it the first entry links to nothing the file holds, and the
    export of every pruned store failed verification."""
    height = top(log) - 2
    path = tmp_path / "s.db"

    async def build() -> None:
        store = await _recorded(path, log)
        try:
            await store.prune_to(log.head(height), _signature(log, height))
        finally:
            await store.close()

    asyncio.run(build())
    exported = tmp_path / "ledger.jsonl"
    with exported.open("w") as out:
        assert operator.ledger_export(path, CHAIN, out, err=io.StringIO()) == operator.EXIT_OK
    keys = receipt_public_keys()
    head = log.head(height)
    said = io.StringIO()
    code = operator.verify_ledger_file(exported, CHAIN, said, receipt_keys=keys)
    assert code == operator.EXIT_OK, said.getvalue()
    assert f"history starts at height {height + 1}" in said.getvalue()
    assert f"signed by member {OWN}: signature good" in said.getvalue()
    first, *entries = exported.read_text().splitlines()
    assert json.loads(first)["checkpoint"]["ledger_head"] == head.ledger_head.hex()

    def verify(lines: list[str]) -> tuple[int, str]:
        forged = tmp_path / "forged.jsonl"
        forged.write_text("".join(line + "\n" for line in lines))
        out = io.StringIO()
        code = operator.verify_ledger_file(forged, CHAIN, out, receipt_keys=keys)
        return code, out.getvalue()

    # The attacks: the checkpoint dropped, or one naming another head (to splice in
    # entries that chain to it), or signed by another member's key.
    assert verify(entries)[0] == operator.EXIT_PROBLEM
    doc = json.loads(first)
    doc["checkpoint"]["ledger_head"] = bytes(32).hex()
    code, text = verify([json.dumps(doc), *entries])
    assert code == operator.EXIT_PROBLEM and "does NOT verify" in text
    doc = json.loads(first)
    doc["checkpoint"]["signer"] = 0
    assert verify([json.dumps(doc), *entries])[0] == operator.EXIT_PROBLEM
    doc = json.loads(first)
    doc["checkpoint"]["height"] = "7"
    code, text = verify([json.dumps(doc), *entries])
    assert code == operator.EXIT_PROBLEM and "checkpoint" in text
    # Without the cluster's receipt keys a checkpoint cannot be trusted at all.
    out = io.StringIO()
    assert operator.verify_ledger_file(exported, CHAIN, out) == operator.EXIT_PROBLEM


def test_the_checkpoint_statement_binds_every_field(log: Log) -> None:  # noqa: F811
    head = log.head(2)
    signature = sign_checkpoint(receipt_key(OWN), CHAIN, head)
    public = receipt_public_keys()[OWN]
    assert checkpoint_signed_by(CHAIN, head, signature, public)
    assert not checkpoint_signed_by("another-chain", head, signature, public)
    for field, value in (("height", 3), ("ledger_entries", 0), ("block_time_ms", 1)):
        assert not checkpoint_signed_by(CHAIN, replace(head, **{field: value}), signature, public)


# ---------------------------------------------------------------- space given back


async def _big_store(path: Path) -> tuple[SidecarStore, int]:
    world = big_block_world(verdicts=300, agents=5)
    heights = execute(world, signer=OWN)
    store = await SidecarStore.open(path, CHAIN)
    for executed in heights:
        await store.record(executed)
    return store, len(heights)


async def test_pruning_gives_the_space_back_to_the_file_system(tmp_path: Path) -> None:
    """A new store is made with incremental vacuum: the file shrinks in place."""
    path = tmp_path / "s.db"
    store, count = await _big_store(path)
    try:
        head = (await store.attestation_at(count)) or pytest.fail("no statement")
        result = await store.prune_to(head[1], CheckpointSignature(OWN, bytes(64)))
        assert not result.vacuumed
        assert result.bytes_after < result.bytes_before * 0.5, result
        assert await store.verify_ledger() is None
    finally:
        await store.close()


async def test_a_store_made_before_incremental_vacuum_is_vacuumed_once(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store, count = await _big_store(path)
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("PRAGMA auto_vacuum=NONE; VACUUM;")  # as a file made before this build
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    conn.close()
    store = await SidecarStore.open(path, CHAIN)
    try:
        head = (await store.attestation_at(count)) or pytest.fail("no statement")
        result = await store.prune_to(head[1], CheckpointSignature(OWN, bytes(64)))
        assert result.vacuumed and result.bytes_after < result.bytes_before * 0.5, result
        assert await store.verify_ledger() is None
    finally:
        await store.close()


# ---------------------------------------------------------------- the sidecar's pruner


async def test_the_pruner_prunes_at_a_held_snapshot_and_tells_the_replica(
    tmp_path: Path,
    log: Log,  # noqa: F811
) -> None:
    snapshots = SnapshotDir(tmp_path / "snapshots", kept=2)
    for height in (2, 4):
        snapshots.write(log.head(height), log.state(height))
    options = SnapshotOptions(interval_heights=2, kept=2, retain_heights=1, audit_copy=True)
    pruner = Pruner(options, snapshots, tmp_path, receipt_key(OWN), OWN, CHAIN)
    store = await _recorded(tmp_path / "s.db", log)
    try:
        assert pruner.point(store, NOW_MS) is None  # a copy is configured and acknowledged nothing
        (tmp_path / ACKED_FILE).write_text('{"height": 3}')
        assert pruner.point(store, NOW_MS) == 2
        (tmp_path / ACKED_FILE).write_text(json.dumps({"height": top(log)}))
        assert pruner.point(store, NOW_MS) == 4
        await pruner.prune(store, 4)
        assert store.history_from == 5 and snapshots.pinned == 4
        assert PruneFloor.read(tmp_path) == PruneFloor(4)
        assert pruner.point(store, NOW_MS) is None  # nothing newer to prune at
    finally:
        await store.close()


async def test_the_pruner_keeps_the_heights_younger_than_the_age(
    tmp_path: Path,
    log: Log,  # noqa: F811
) -> None:
    """By age alone, with the block times the snapshots' manifests hold."""
    snapshots = SnapshotDir(tmp_path / "snapshots", kept=2)
    for height in (2, 4):
        snapshots.write(log.head(height), log.state(height))
    options = SnapshotOptions(interval_heights=2, kept=2, retain_age_s=RETAIN_AGE_S_MIN)
    pruner = Pruner(options, snapshots, tmp_path, receipt_key(OWN), OWN, CHAIN)
    age_ms = RETAIN_AGE_S_MIN * S
    two, four = log.head(2).block_time_ms, log.head(4).block_time_ms
    store = await _recorded(tmp_path / "s.db", log)
    try:
        assert pruner.point(store, two + age_ms - 1) is None  # nothing old enough yet
        assert pruner.point(store, two + age_ms) == 2
        assert pruner.point(store, four + age_ms - 1) == 2  # 4 is a millisecond too young
        assert pruner.point(store, four + age_ms) == 4
    finally:
        await store.close()
