"""SidecarStore (sidecar/store.py) against real engine output.

Every height here was executed by the real governance engine from real signed
transactions (tests/sidecar/executed_log.py). The tests check the store's promises: a
reopened store serves exactly what was recorded; each height is recorded exactly once and
whole (a re-record, a gap, a failure inside the transaction and a SIGKILL at random points
all leave the previous height intact); artifacts are idempotent and a divergent one stops
the height with its key named; an edit to any column of any ledger row is named at that
row; two sidecars fed one log agree byte for byte; no planted secret reaches the file.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import pickle
import random
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from quorumgate.proto.commitments import Committed, SealedSalt
from quorumgate.proto.model import DelegationPolicy, Outcome, Reason, ToolMode
from quorumgate.sidecar import node as sidecar_node
from quorumgate.sidecar import store as store_module
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.state import SECTIONS
from quorumgate.sidecar.engine.statements import ArtifactDenial, RejectionArtifact
from quorumgate.sidecar.engine.statetree import key_bytes
from quorumgate.sidecar.ledger import (
    GENESIS_PREV_HASH,
    LedgerEntry,
    LedgerExtra,
    ProblemKind,
    verify_chain,
)
from quorumgate.sidecar.receipts import Receipt, assemble_certificate, verify_certificate
from quorumgate.sidecar.store import (
    DivergenceError,
    ExecutedHeight,
    SidecarStore,
    SidecarStoreError,
)
from tests.engine.harness import CHAIN, World
from tests.sidecar.executed_log import (
    ARGUMENT_SECRET,
    SEALED_SECRET,
    Story,
    busy_world,
    execute,
    executed_height,
    read_around_the_store,
    receipt_public_keys,
    record_all,
    recorded_file,
    write_around_the_store,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def story() -> Story:
    return busy_world()


@pytest.fixture(scope="module")
def heights(story: Story) -> list[ExecutedHeight]:
    return execute(story.world, signer=0)


@pytest.fixture(autouse=True)
async def close_every_store() -> AsyncIterator[None]:
    """Close every store a test opened, even when an assertion stopped it early: an open
    aiosqlite connection's thread would keep the test process from exiting."""
    opened: list[SidecarStore] = []
    real_open = SidecarStore.open

    async def tracking_open(
        path: Path, chain_id: str, *, create: bool = True, read_only: bool = False
    ) -> SidecarStore:
        store = await real_open(path, chain_id, create=create, read_only=read_only)
        opened.append(store)
        return store

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SidecarStore, "open", tracking_open)
        yield
    for store in opened:
        await store.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SidecarStore]:
    opened = await SidecarStore.open(tmp_path / "sidecar.db", CHAIN)
    try:
        yield opened
    finally:
        await opened.close()


async def everything(store: SidecarStore, story: Story) -> dict[str, Any]:
    """All a store serves, read through its API."""
    top = store.executed_height
    proposal_ids = sorted(
        {v.proposal_id or v.tx_id for r in story.world.results for v in r.verdicts}
    )
    return {
        "executed_height": top,
        "ledger_head": store.ledger_head,
        "ledger_entries": store.ledger_entries,
        "artifact_count": store.artifact_count,
        "engine_state": await store.engine_state(),
        "roots": [await store.root_at(h) for h in range(top + 2)],
        "signed": [await store.signed_block(h) for h in range(top + 2)],
        "receipts": await store.receipts_from(0, store_module.RECEIPTS_PAGE_MAX),
        "by_proposal": [await store.receipt(p) for p in proposal_ids],
        "cards": [await store.card(p) for p in proposal_ids],
        "artifacts": await store.artifacts(store_module.ARTIFACTS_PAGE_MAX),
        "ledger": await store.ledger(0, store_module.LEDGER_PAGE_ROWS_MAX),
    }


def expected_artifacts(heights: list[ExecutedHeight]) -> list[tuple[int, str, bytes]]:
    """Every artifact of `heights` in key order: (height, canonical target)."""
    return sorted(
        (a.height, a.canonical_target, a.to_bytes()) for h in heights for a in h.result.artifacts
    )


def expected_ledger(heights: list[ExecutedHeight]) -> list[LedgerEntry]:
    entries: list[LedgerEntry] = []
    head = GENESIS_PREV_HASH
    for h in heights:
        for index, verdict in enumerate(h.result.verdicts):
            entries.append(LedgerEntry.from_verdict(CHAIN, h.height, index, verdict, head))
            head = entries[-1].hash
    return entries


# ============================================================================ round trip


async def test_reopen_restores_everything_recorded(
    story: Story, heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    path = tmp_path / "sidecar.db"
    store = await SidecarStore.open(path, CHAIN)
    assert (store.executed_height, store.ledger_entries, store.artifact_count) == (0, 0, 0)
    assert store.ledger_head == GENESIS_PREV_HASH
    assert await store.engine_state() is None
    await record_all(store, heights)
    before = await everything(store, story)
    await store.close()

    store = await SidecarStore.open(path, CHAIN)
    try:
        after = await everything(store, story)
        assert after == before
        ledger = expected_ledger(heights)
        assert after["ledger"] == ledger
        assert after["ledger_head"] == ledger[-1].hash
        assert after["executed_height"] == heights[-1].height
        assert after["ledger_entries"] == sum(len(h.result.verdicts) for h in heights)
        assert after["artifacts"] == expected_artifacts(heights)
        assert after["roots"][1:-1] == [h.result.state_root for h in heights]
        assert after["roots"][0] is None and after["roots"][-1] is None
        # the engine continues from the stored state exactly where the original stopped
        state = after["engine_state"]
        assert state == heights[-1].engine_state
        resumed = Engine.from_state_bytes(story.world.config, state)
        assert resumed.state_root() == heights[-1].result.state_root
        assert resumed.last_height == heights[-1].height
    finally:
        await store.close()


async def test_stored_receipts_assemble_into_certificates_that_verify_offline(
    story: Story, tmp_path: Path
) -> None:
    """Two sidecars (f + 1 of four) record the same log with their own receipt keys; their
    stored receipts for every transaction combine into a certificate that verifies."""
    stores = [await SidecarStore.open(tmp_path / f"s{i}.db", CHAIN) for i in (0, 1)]
    try:
        for signer, s in enumerate(stores):
            await record_all(s, execute(story.world, signer=signer))
        keys = receipt_public_keys()
        checked = 0
        for result in story.world.results:
            receipts = [await s.receipts_at(result.height) for s in stores]
            following = await stores[0].receipts_from(result.height, 1 << 16)
            assert receipts[0] == [r for r in following if r.leaf.height == result.height]
            count = len(result.verdicts)
            for index, verdict in enumerate(result.verdicts):
                pair = [rs[index] for rs in receipts]
                assert all(r.leaf.height == result.height for r in pair)
                cert = assemble_certificate(CHAIN, pair)
                leaf = verify_certificate(cert, CHAIN, keys, receipts_expire=True)
                assert cert.validity is not None  # the world's chain: receipts expire
                assert (leaf.outcome, leaf.index, cert.leaf_count) == (
                    verdict.outcome.value, index, count,
                )  # fmt: skip
                checked += 1
        assert checked == sum(len(r.verdicts) for r in story.world.results)
    finally:
        for s in stores:
            await s.close()


async def test_receipt_returns_the_latest_answer_and_no_rejection_masks_it(
    story: Story, heights: list[ExecutedHeight], store: SidecarStore
) -> None:
    pending = story.pending_id
    await record_all(store, heights[: story.bogus_height])
    # mallory's Confirm naming the pending proposal was rejected: it does not answer it
    answer = await store.receipt(pending)
    assert answer is not None
    assert (answer.leaf.outcome, answer.leaf.kind) == ("pending", "proposal")
    card = await store.card(pending)
    verdict = next(v for r in story.world.results for v in r.verdicts if v.card is not None)
    assert verdict.card is not None and card == verdict.card.to_bytes()

    await record_all(store, heights[story.bogus_height :])
    answer = await store.receipt(pending)
    assert answer is not None
    assert (answer.leaf.outcome, answer.leaf.kind) == ("allow", "confirm")
    assert answer.leaf.height == story.confirmed_height
    assert await store.card(pending) == card  # what was approved stays readable
    # a rejected transaction's own receipt is served when it is all there is
    late = story.world.results[story.confirmed_height].verdicts[0]
    assert late.reason is Reason.UNKNOWN_PROPOSAL
    own = await store.receipt(late.tx_id)
    assert own is not None and own.leaf.outcome == "rejected"
    assert await store.receipt(bytes(32)) is None
    assert await store.card(late.tx_id) is None


async def test_heights_holding_finds_the_heights_of_a_principal_or_of_transactions(
    heights: list[ExecutedHeight], store: SidecarStore
) -> None:
    """The one range read an agent's Receipts stream makes over old heights finds exactly
    the heights a per-height read of the ledger would."""
    await record_all(store, heights)
    top = store.executed_height
    ledger = {h: await store.ledger_at(h) for h in range(1, top + 1)}
    principals = sorted({e.principal for es in ledger.values() for e in es if e.principal})
    assert len(principals) >= 2
    for principal in principals:
        expected = [h for h, es in ledger.items() if any(e.principal == principal for e in es)]
        assert await store.heights_holding(1, top, principal, ()) == expected
    some = [es[0].tx_id for es in ledger.values() if es][:3]
    expected = [h for h, es in ledger.items() if any(e.tx_id in some for e in es)]
    assert await store.heights_holding(1, top, None, some) == expected
    low = expected[-1]  # the range bounds hold
    assert await store.heights_holding(low + 1, top, None, some) == []
    assert await store.heights_holding(1, top, None, ()) == []


async def test_reads_are_bounded_by_their_page_sizes(
    heights: list[ExecutedHeight], store: SidecarStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await record_all(store, heights)
    all_artifacts = await store.artifacts(store_module.ARTIFACTS_PAGE_MAX)
    monkeypatch.setattr(store_module, "LEDGER_PAGE_ROWS_MAX", 4)
    monkeypatch.setattr(store_module, "ARTIFACTS_PAGE_MAX", 3)
    monkeypatch.setattr(store_module, "RECEIPTS_PAGE_MAX", 5)
    assert len(await store.ledger(0, 1000)) == 4
    assert len(await store.artifacts(1000)) == 3
    assert len(await store.receipts_from(0, 1000)) == 5
    # paging by cursor walks the whole ledger, inside one height too
    ledger = expected_ledger(heights)
    walked: list[LedgerEntry] = []
    cursor = (0, 0)
    while page := await store.ledger(cursor[0], 4, cursor[1]):
        walked.extend(page)
        cursor = (page[-1].height, page[-1].index + 1)
    assert walked == ledger
    paged = [a for off in range(0, len(all_artifacts), 3) for a in await store.artifacts(3, off)]
    assert paged == all_artifacts
    with pytest.raises(ValueError, match="negative"):
        await store.ledger(0, -1)


# ============================================================================ exactly once


async def test_a_height_already_recorded_or_one_that_skips_raises_and_changes_nothing(
    heights: list[ExecutedHeight], store: SidecarStore
) -> None:
    await record_all(store, heights[:5])
    head, entries = store.ledger_head, store.ledger_entries
    with pytest.raises(AssertionError, match=r"height 5 is already recorded \(executed height 5\)"):
        await store.record(heights[4])
    with pytest.raises(AssertionError, match="height 3 is already recorded"):
        await store.record(heights[2])
    with pytest.raises(AssertionError, match="height 7 does not follow executed height 5"):
        await store.record(heights[6])
    assert (store.executed_height, store.ledger_head, store.ledger_entries) == (5, head, entries)
    assert await store.root_at(6) is None and await store.root_at(7) is None
    await store.record(heights[5])
    assert store.executed_height == 6


async def test_inconsistent_executed_height_is_refused_before_any_write(
    heights: list[ExecutedHeight], store: SidecarStore
) -> None:
    h = heights[0]
    wrong_leaves = dataclasses.replace(h, leaves=())
    with pytest.raises(AssertionError, match="1 verdicts, 0 leaves"):
        await store.record(wrong_leaves)
    wrong_root = dataclasses.replace(h, signed=dataclasses.replace(h.signed, state_root=bytes(32)))
    with pytest.raises(AssertionError, match="signed state root"):
        await store.record(wrong_root)
    assert store.executed_height == 0
    await store.record(h)


class Boom(Exception):
    pass


@pytest.mark.parametrize("step", ["_check_artifacts", "_insert_rows", "_update_head"])
async def test_failure_inside_the_transaction_leaves_the_previous_height(
    story: Story,
    heights: list[ExecutedHeight],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
) -> None:
    """A failure at any step after BEGIN — here after the step has run, so its rows are
    written but not committed — leaves nothing of the height, on disk or in memory."""
    path = tmp_path / "sidecar.db"
    target = heights[story.denial_heights[0] - 1]  # a height with ledger rows and artifacts
    store = await SidecarStore.open(path, CHAIN)
    await record_all(store, heights[: target.height - 1])
    before = await everything(store, story)
    original = getattr(SidecarStore, step)

    def fail_after(*args: Any) -> Any:  # runs on the connection's thread, in the transaction
        original(*args)
        raise Boom(step)

    monkeypatch.setattr(SidecarStore, step, fail_after)
    with pytest.raises(Boom):
        await store.record(target)
    monkeypatch.undo()
    assert await everything(store, story) == before
    await store.close()
    store = await SidecarStore.open(path, CHAIN)
    try:
        assert await everything(store, story) == before
        assert await store.verify_ledger() is None
        await store.record(target)  # and the same height records fine afterwards
        assert store.executed_height == target.height
    finally:
        await store.close()


async def test_root_at_answers_recent_heights_from_memory_as_the_file_holds_them(
    heights: list[ExecutedHeight], store: SidecarStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The divergence check of every block asks `root_at` for a recent height: the newest
    `RECENT_ROOTS_MAX` come from memory, read back from the file by `record` itself, and
    older ones from the file, with the same bytes."""
    keep = 3
    monkeypatch.setattr(store_module, "RECENT_ROOTS_MAX", keep)
    await record_all(store, heights)
    top = len(heights)
    assert top > keep + 1
    with sqlite3.connect(store.path) as c:
        in_file = {int(h): bytes(r) for h, r in c.execute("SELECT height, state_root FROM blocks")}
    assert in_file == {x.height: x.result.state_root for x in heights}

    async def no_trip(*args: object) -> None:
        raise AssertionError("root_at went to the store's thread for a recent height")

    with monkeypatch.context() as m:
        m.setattr(store, "_scalar", no_trip)
        for height in range(top - keep + 1, top + 1):
            assert await store.root_at(height) == in_file[height]
        with pytest.raises(AssertionError, match="went to the store's thread"):
            await store.root_at(top - keep)  # older: not held in memory
    for height in range(1, top + 1):
        assert await store.root_at(height) == in_file[height]
    assert await store.root_at(top + 1) is None and await store.root_at(0) is None


async def test_cancelled_record_still_ends_its_transaction(
    heights: list[ExecutedHeight], store: SidecarStore
) -> None:
    task = asyncio.ensure_future(store.record(heights[0]))
    await asyncio.sleep(0)  # let it start: no wall clock involved, one loop turn
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # shielded: the record runs to its end under the store's lock (FIFO), so the next
    # reader waits for it, and then memory agrees with the disk
    assert await store.engine_state() == heights[0].engine_state
    assert store.executed_height == 1
    assert await store.root_at(1) == heights[0].result.state_root
    await store.record(heights[1])


CHILD = """
import asyncio, os, pickle, sys
from pathlib import Path
from quorumgate.sidecar.store import SidecarStore

async def main() -> None:
    db, recording, chain = sys.argv[1:4]
    with open(recording, "rb") as f:
        heights = pickle.load(f)
    store = await SidecarStore.open(Path(db), chain)
    os.write(1, f"open {store.executed_height}\\n".encode())
    for h in heights[store.executed_height:]:
        await store.record(h)
        os.write(1, f"{h.height}\\n".encode())
    os.write(1, b"done\\n")
    sys.stdin.read()  # stay alive until killed

asyncio.run(main())
"""

KILL_ITERATIONS = 8
KILL_SEED = 20_260_501


async def test_sigkill_at_random_points_resumes_without_a_height_twice_or_skipped(
    story: Story, heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    """A child records heights and reports each `record` that returned, resuming from the
    store's executed height; it is SIGKILLed after a random number of reports, several
    times over ONE file. Afterwards the store holds exactly a prefix of the log at least as
    long as reported — ledger, receipts, artifacts and roots of that prefix and nothing
    else — and at the end exactly the whole log, as one uninterrupted run would."""
    recording = tmp_path / "heights.pickle"
    recording.write_bytes(pickle.dumps(heights))
    db = tmp_path / "killed.db"
    rng = random.Random(KILL_SEED)
    ledger = expected_ledger(heights)
    entries_at = [0]
    for h in heights:
        entries_at.append(entries_at[-1] + len(h.result.verdicts))
    reported = 0
    for iteration in range(KILL_ITERATIONS + 1):
        last_round = iteration == KILL_ITERATIONS
        reports = len(heights) + 2 if last_round else rng.randrange(1, 6)
        where = f"seed {KILL_SEED}, iteration {iteration}, killed after {reports} reports"
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, str(db), str(recording), CHAIN,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT,
        )  # fmt: skip
        assert child.stdout is not None and child.stderr is not None
        for _ in range(reports):
            line = await child.stdout.readline()
            if not line:
                err = (await child.stderr.read()).decode()
                pytest.fail(f"child died early ({where}): {err}")
            if line.startswith(b"open "):
                # resumes exactly after what it had recorded: never below what it reported
                assert int(line.split()[1]) >= reported, where
            elif line != b"done\n":
                reported = int(line)
            else:
                break
        os.kill(child.pid, signal.SIGKILL)
        assert await child.wait() == -signal.SIGKILL, where

        store = await SidecarStore.open(db, CHAIN)
        try:
            top = store.executed_height
            assert top >= reported, where
            assert store.ledger_entries == entries_at[top], where
            assert await store.ledger(0, 1024) == ledger[: entries_at[top]], where
            assert store.ledger_head == (
                ledger[entries_at[top] - 1].hash if top else GENESIS_PREV_HASH
            )
            assert await store.root_at(top + 1) is None, where
            if top:
                assert await store.root_at(top) == heights[top - 1].result.state_root, where
                assert await store.engine_state() == heights[top - 1].engine_state, where
            assert await store.artifacts(1024) == expected_artifacts(heights[:top]), where
            assert await store.verify_ledger() is None, where
        finally:
            await store.close()
        reported = top
    assert reported == heights[-1].height


# ============================================================================ artifacts


async def test_replay_over_kept_artifacts_moves_on_when_the_bytes_are_the_same(
    story: Story, heights: list[ExecutedHeight], store: SidecarStore
) -> None:
    await record_all(store, heights)
    first = await everything(store, story)
    count = store.artifact_count
    assert count == sum(len(h.result.artifacts) for h in heights) > 3
    await store.wipe(keep_artifacts=True)
    assert (store.executed_height, store.ledger_entries, store.artifact_count) == (0, 0, count)
    # the replay drill: a fresh engine re-executes the log (another sidecar's key even)
    await record_all(store, execute(story.world, signer=2))
    again = await everything(store, story)
    for key in ("ledger_head", "ledger", "artifacts", "roots", "engine_state", "artifact_count"):
        assert again[key] == first[key], key


async def test_divergent_artifact_bytes_raise_naming_the_key_and_write_nothing(
    story: Story, heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    path = await recorded_file(tmp_path / "sidecar.db", heights)
    denied = heights[story.denial_heights[0] - 1]
    key = denied.result.artifacts[1].key
    # what an earlier, different execution left behind for that key
    ((stored,),) = read_around_the_store(
        path, "SELECT data FROM artifacts WHERE height = ? AND canonical_target = ?", key
    )
    sql = "UPDATE artifacts SET data = ? WHERE height = ? AND canonical_target = ?"
    assert write_around_the_store(path, sql, (stored + b"\x00", *key)) == 1
    store = await SidecarStore.open(path, CHAIN)
    try:
        await store.wipe(keep_artifacts=True)
        await record_all(store, heights[: denied.height - 1])
        before = await everything(store, story)
        with pytest.raises(DivergenceError) as caught:
            await store.record(denied)
        assert caught.value.key == key
        assert str(caught.value).startswith(
            f"artifact (height {key[0]}, {key[1]!r}) exists with different bytes"
        )
        assert await everything(store, story) == before  # nothing of the height
        assert await store.root_at(denied.height) is None
        assert store.executed_height == denied.height - 1
    finally:
        await store.close()
    # on disk too; the artifact without the difference was not written either
    rows = read_around_the_store(
        path, "SELECT canonical_target FROM artifacts WHERE height = ?", (key[0],)
    )
    assert sorted(t for (t,) in rows) == sorted(a.canonical_target for a in denied.result.artifacts)
    assert read_around_the_store(
        path, "SELECT COUNT(*) FROM ledger WHERE height >= ?", (key[0],)
    ) == [(0,)]


async def test_a_different_log_producing_other_artifact_bytes_is_a_divergence(
    heights: list[ExecutedHeight], story: Story, store: SidecarStore
) -> None:
    await record_all(store, heights)
    await store.wipe(keep_artifacts=True)
    target = heights[story.denial_heights[1] - 1]
    artifact = target.result.artifacts[0]
    denial = artifact.denials[0]
    other = RejectionArtifact(
        CHAIN,
        artifact.height,
        artifact.canonical_target,
        (ArtifactDenial(denial.proposal_id, "bob", denial.reason, 1, ()),),
    )
    forged = dataclasses.replace(
        target, result=dataclasses.replace(target.result, artifacts=(other,))
    )
    await record_all(store, heights[: target.height - 1])
    with pytest.raises(DivergenceError, match=r"artifact \(height \d+, 'kb.search "):
        await store.record(forged)
    assert store.executed_height == target.height - 1
    await store.record(target)


async def test_wipe_forgets_every_height_and_artifact_but_keeps_the_chain(
    story: Story, heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    path = tmp_path / "sidecar.db"
    store = await SidecarStore.open(path, CHAIN)
    await record_all(store, heights)
    head = store.ledger_head
    await store.wipe()
    assert (store.executed_height, store.ledger_entries, store.artifact_count) == (0, 0, 0)
    assert store.ledger_head == GENESIS_PREV_HASH
    assert await store.engine_state() is None
    await store.close()
    for table in ("ledger", "receipts", "blocks", "cards", "artifacts"):
        assert read_around_the_store(path, f"SELECT COUNT(*) FROM {table}") == [(0,)], table
    with pytest.raises(SidecarStoreError, match="belongs to chain"):
        await SidecarStore.open(path, "another-chain")
    store = await SidecarStore.open(path, CHAIN)
    try:
        await record_all(store, heights)
        assert store.ledger_head == head
    finally:
        await store.close()


# ============================================================================ ledger tampering


LEDGER_COLUMNS = [c.strip() for c in store_module._LEDGER_COLUMNS.split(",")]


def tampered(column: str, value: object) -> object:
    """Another value for one column, of the same type (STRICT tables refuse others), that
    never collides with another row's (height, idx)."""
    if column == "height":
        assert isinstance(value, int)
        return value + 1_000_000
    if isinstance(value, int):
        return value + 1
    if column == "argument_names":
        return '["q"]' if value == "[]" else "[]"
    if column == "extension":  # a version-2 entry made version 1, or the other way round
        v2 = '{"version":2,"commitments":[],"sealed_salts":[],"repeat":0,"halted":false}'
        return v2 if value == "" else ""
    if isinstance(value, str):
        return value + "x"
    assert isinstance(value, bytes)
    if not value:
        return b"\x01"
    return bytes([value[0] ^ 1]) + value[1:]  # same length: hashes stay 32 bytes


async def test_editing_any_column_of_any_row_names_exactly_that_entry(
    heights: list[ExecutedHeight], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each column of the first, a middle and the last ledger row, edited with sqlite3
    after the store is closed (and pages of 7 rows, so the walk crosses page ends)."""
    monkeypatch.setattr(store_module, "LEDGER_PAGE_ROWS_MAX", 7)
    pristine = tmp_path / "pristine.db"
    store = await SidecarStore.open(pristine, CHAIN)
    await record_all(store, heights)
    assert await store.verify_ledger() is None
    total = store.ledger_entries
    await store.close()
    rows = read_around_the_store(pristine, "SELECT rowid, height, idx FROM ledger ORDER BY rowid")
    assert len(rows) == total > 20
    chosen = [0, total // 2, total - 1]
    checked = 0
    for column in LEDGER_COLUMNS:
        for position in chosen:
            rowid = rows[position][0]
            path = tmp_path / f"{column}-{position}.db"
            path.write_bytes(pristine.read_bytes())
            ((value,),) = read_around_the_store(
                path, f"SELECT {column} FROM ledger WHERE rowid = ?", (rowid,)
            )
            new = tampered(column, value)
            assert new != value
            sql = f"UPDATE ledger SET {column} = ? WHERE rowid = ?"
            assert write_around_the_store(path, sql, (new, rowid)) == 1
            (height, index), = read_around_the_store(
                path, "SELECT height, idx FROM ledger WHERE rowid = ?", (rowid,)
            )  # fmt: skip
            store = await SidecarStore.open(path, CHAIN)
            try:
                problem = await store.verify_ledger()
            finally:
                await store.close()
            label = f"column {column}, entry #{position}"
            assert problem is not None, label
            assert (problem.position, problem.height, problem.index) == (position, height, index), (
                f"{label}: {problem}"
            )
            expected = ProblemKind.HASH_MISMATCH
            assert problem.kind is expected, f"{label}: {problem}"
            assert str(problem).startswith(f"entry #{position} (height {height}, index {index})")
            checked += 1
    assert checked == 3 * len(LEDGER_COLUMNS) == 48


async def test_deleted_or_unreadable_ledger_rows_are_named(
    heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    pristine = tmp_path / "pristine.db"
    store = await SidecarStore.open(pristine, CHAIN)
    await record_all(store, heights)
    total = store.ledger_entries
    await store.close()
    rows = read_around_the_store(pristine, "SELECT rowid, height, idx FROM ledger ORDER BY rowid")

    async def verify(sql: str, params: tuple[object, ...]) -> Any:
        path = tmp_path / "edited.db"
        path.write_bytes(pristine.read_bytes())
        assert write_around_the_store(path, sql, params) == 1
        store = await SidecarStore.open(path, CHAIN)
        try:
            return await store.verify_ledger()
        finally:
            await store.close()

    # a middle row deleted: the entry after the gap is the first that no longer fits
    middle = total // 2
    problem = await verify("DELETE FROM ledger WHERE rowid = ?", (rows[middle][0],))
    assert problem is not None
    assert (problem.position, problem.height, problem.index) == (middle, *rows[middle + 1][1:])
    # the last row deleted: the chain is whole but ends before the recorded head
    problem = await verify("DELETE FROM ledger WHERE rowid = ?", (rows[-1][0],))
    assert problem is not None and problem.kind is ProblemKind.HEAD_MISMATCH
    assert "entries are missing" in problem.detail
    # a row no longer an entry at all (argument names not JSON)
    problem = await verify(
        "UPDATE ledger SET argument_names = 'not json' WHERE rowid = ?", (rows[3][0],)
    )
    assert problem is not None and problem.kind is ProblemKind.UNREADABLE
    assert (problem.position, problem.height, problem.index) == (3, *rows[3][1:])
    # the recorded head edited: the rows hold, the head does not
    path = tmp_path / "edited.db"
    path.write_bytes(pristine.read_bytes())
    write_around_the_store(path, "UPDATE head SET ledger_head = ?", (bytes(32),))
    store = await SidecarStore.open(path, CHAIN)
    try:
        problem = await store.verify_ledger()
    finally:
        await store.close()
    assert problem is not None and problem.kind is ProblemKind.HEAD_MISMATCH


# ============================================================================ agreement


async def test_two_sidecars_fed_the_same_heights_agree_byte_for_byte(
    story: Story, tmp_path: Path
) -> None:
    """Sidecar 0 records the original engine's log, sidecar 3 a fresh engine's replay of
    it with its own receipt key: everything but the signatures is identical."""
    a = await SidecarStore.open(tmp_path / "a.db", CHAIN)
    b = await SidecarStore.open(tmp_path / "b.db", CHAIN)
    try:
        await record_all(a, execute(story.world, signer=0))
        await record_all(b, execute(story.world, signer=3))
        ea, eb = await everything(a, story), await everything(b, story)
        for key in ("ledger_head", "ledger", "artifacts", "roots", "engine_state", "cards"):
            assert ea[key] == eb[key], key
        assert [r.leaf for r in ea["receipts"]] == [r.leaf for r in eb["receipts"]]
        sa, sb = ea["signed"][1], eb["signed"][1]
        assert (sa.signer, sb.signer) == (0, 3)
        assert sa.verdict_root == sb.verdict_root and sa.signature != sb.signature
        assert verify_chain(ea["ledger"], CHAIN) is None
    finally:
        await a.close()
        await b.close()


# ============================================================================ confidentiality


def secret_forms() -> list[bytes]:
    forms: list[bytes] = []
    for secret in (SEALED_SECRET, ARGUMENT_SECRET.encode()):
        forms += [secret, secret.hex().encode(), base64.b64encode(secret), secret.lower()]
        forms.append(secret.decode().encode("utf-16-le"))
    return forms


async def test_no_planted_secret_reaches_the_database_file(
    story: Story, heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    # the planted values really are in the committed log the store was fed from
    log = b"".join(tx for _, _, txs in story.world.log for tx in txs)
    assert ARGUMENT_SECRET.encode() in log
    assert any(v.argument_names for r in story.world.results for v in r.verdicts)
    path = tmp_path / "sidecar.db"
    store = await SidecarStore.open(path, CHAIN)
    await record_all(store, heights)
    # while open (the WAL holds the recent pages) and after close (checkpointed)
    snapshots = [p.read_bytes() for p in tmp_path.iterdir()]
    await store.close()
    snapshots += [p.read_bytes() for p in tmp_path.iterdir()]
    assert sum(len(s) for s in snapshots) > 50_000
    for data in snapshots:
        for form in secret_forms():
            assert form not in data
    # the names made it in: the check above can fail
    assert any(b"user_id" in data for data in snapshots)


# ============================================================================ refused files


async def test_connection_uses_wal_with_fsync_on_every_commit(store: SidecarStore) -> None:
    conn = store._conn  # the store's own connection: pragmas are per connection
    assert (await conn.execute_fetchall("PRAGMA journal_mode"))[0][0] == "wal"
    assert (await conn.execute_fetchall("PRAGMA synchronous"))[0][0] == 2  # FULL


async def test_a_second_writer_is_refused_but_readers_see_committed_heights(
    heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    """One writer per store (a sidecar started twice must not write one ledger twice);
    operators read a running sidecar's store read-only, and see only what is committed."""
    path = tmp_path / "sidecar.db"
    first = await SidecarStore.open(path, CHAIN)
    try:
        with pytest.raises(
            SidecarStoreError, match=r"in use by another process \(a running sidecar writes"
        ):
            await SidecarStore.open(path, CHAIN)
        await first.record(heights[0])
        reader = await SidecarStore.open(path, CHAIN, create=False, read_only=True)
        try:
            assert reader.executed_height == 1
            assert await reader.verify_ledger() is None
            with pytest.raises(sqlite3.OperationalError, match=r"readonly|read-only"):
                await reader.record(heights[1])
        finally:
            await reader.close()
    finally:
        await first.close()
    second = await SidecarStore.open(path, CHAIN, create=False)
    assert second.executed_height == 1
    await second.close()


async def test_foreign_missing_and_damaged_files_are_refused(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(SidecarStoreError, match="cannot open"):
        await SidecarStore.open(missing, CHAIN, create=False)
    assert not missing.exists()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not an sqlite database, only bytes\n" * 200)
    with pytest.raises(SidecarStoreError, match="not a readable sidecar store"):
        await SidecarStore.open(garbage, CHAIN)
    other = tmp_path / "other.db"
    write_around_the_store(other, "CREATE TABLE notes (body TEXT)")
    with pytest.raises(SidecarStoreError, match="not a sidecar store"):
        await SidecarStore.open(other, CHAIN)
    path = tmp_path / "sidecar.db"
    await (await SidecarStore.open(path, CHAIN)).close()
    with pytest.raises(SidecarStoreError, match="belongs to chain 'qg-test', not 'chain-b'"):
        await SidecarStore.open(path, "chain-b")
    write_around_the_store(path, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(SidecarStoreError, match="schema version '99'"):
        await SidecarStore.open(path, CHAIN)


# ============================================================================ state in parts


async def test_each_height_writes_only_the_entries_it_changed(
    story: Story, heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    path = tmp_path / "sidecar.db"
    store = await SidecarStore.open(path, CHAIN)
    state = story.world.engine.state
    entries = sum(len(getattr(state, name)) for name in SECTIONS)
    assert len(state.agents) >= 3
    changed_after_first = []
    for h in heights:
        await store.record(h)
        assert h.state_delta is not None
        assert h.state_delta.full == (h.height == heights[0].height)
        if not h.state_delta.full:
            changed_after_first.append(len(h.state_delta.changes))
        # what the store serves is what the engine held, height by height
        assert await store.engine_state() == h.engine_state, h.height
    await store.close()
    # a height wrote what it changed, never the whole state
    assert max(changed_after_first) < entries // 2
    rows = read_around_the_store(path, "SELECT COUNT(*) FROM state_entries")
    assert rows == [(entries,)]
    assert read_around_the_store(path, "SELECT engine_state IS NULL FROM head") == [(1,)]


async def test_removed_entries_leave_the_store(tmp_path: Path) -> None:
    """A grant that expires out of the state is deleted from the store, not left behind."""
    world = World()
    world.add_tool("t.read", ToolMode.READ)
    world.add_agent("ann", ["t.read"], policy=DelegationPolicy.ATTENUATED)
    world.add_agent("ben", ["t.read"])
    verdict = world.delegate("ann", "ben", tools=["t.read"], expires_in_ms=2_000)
    assert verdict.outcome is Outcome.APPLIED
    grants = world.engine.state.grants
    assert len(grants) == 1
    world.advance(world.config.expired_retention_ms + 10_000)
    assert not grants
    store = await SidecarStore.open(tmp_path / "sidecar.db", CHAIN)
    await record_all(store, execute(world))
    await store.close()
    rows = read_around_the_store(
        tmp_path / "sidecar.db",
        f"SELECT COUNT(*) FROM state_entries WHERE section = {SECTIONS.index('grants')}",
    )
    assert rows == [(0,)]


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE state_entries SET data = CAST(data || x'00' AS BLOB) WHERE {row}",
        "DELETE FROM state_entries WHERE {row}",
    ],
    ids=["edited", "deleted"],
)
async def test_a_damaged_or_missing_state_entry_is_refused_on_read(
    heights: list[ExecutedHeight], tmp_path: Path, damage: str
) -> None:
    path = await recorded_file(tmp_path / "sidecar.db", heights)
    row = f"section = {SECTIONS.index('agents')} AND key = x'{key_bytes('bob').hex()}'"
    write_around_the_store(path, damage.format(row=row))
    store = await SidecarStore.open(path, CHAIN)
    top = heights[-1].height
    with pytest.raises(SidecarStoreError, match=f"state root signed for height {top}"):
        await store.engine_state()


async def test_whole_state_heights_and_a_switch_to_entries_round_trip(
    story: Story, heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    """A height recorded with the whole state clears the entry rows; the next height from
    an engine reloaded from the store gives a full delta, which writes every entry again."""
    whole = [dataclasses.replace(h, state_delta=None) for h in heights]
    store = await SidecarStore.open(tmp_path / "sidecar.db", CHAIN)
    half = len(heights) // 2
    await record_all(store, whole[:half])
    state = await store.engine_state()
    assert state == heights[half - 1].engine_state
    engine = Engine.from_state_bytes(story.world.config, state)  # type: ignore[arg-type]
    for height, time_ms, txs in story.world.log[half:]:
        result = engine.execute_block(height, time_ms, txs, story.world.verify)
        await store.record(executed_height(result, engine.state_bytes(), 0, engine.state_delta()))
        assert await store.engine_state() == engine.state_bytes()
    assert store.executed_height == heights[-1].height


async def test_a_partial_delta_for_a_store_without_the_entries_is_refused(
    heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    """An engine that handed its entries to someone else (it executed heights that were
    not recorded here) cannot record only its changes: nothing of the height is written."""
    store = await SidecarStore.open(tmp_path / "sidecar.db", CHAIN)
    whole = [dataclasses.replace(h, state_delta=None) for h in heights]
    half = len(heights) // 2
    await record_all(store, whole[:half])
    late = heights[half]  # from the engine that ran all along: only its changes
    assert late.state_delta is not None and not late.state_delta.full
    with pytest.raises(AssertionError, match="partial state delta"):
        await store.record(late)
    assert store.executed_height == heights[half - 1].height
    assert await store.engine_state() == heights[half - 1].engine_state


async def _older_schema(
    path: Path, heights: list[ExecutedHeight], version: int
) -> list[ExecutedHeight]:
    """A file as schema `version` left it, holding the first half of `heights` whole."""
    store = await SidecarStore.open(path, CHAIN)
    whole = [dataclasses.replace(h, state_delta=None) for h in heights]
    half = len(heights) // 2
    await record_all(store, whole[:half])
    await store.close()
    steps = ["ALTER TABLE blocks DROP COLUMN epoch"]
    if version <= 5:
        steps += ["ALTER TABLE ledger DROP COLUMN extension"]
    if version <= 4:
        steps += ["ALTER TABLE blocks DROP COLUMN valid_until_ms"]
    if version <= 3:
        steps += ["ALTER TABLE head DROP COLUMN state_header", "DROP TABLE state_entries"]
    if version == 2:
        steps += [
            "ALTER TABLE head DROP COLUMN state_prefix",
            "ALTER TABLE head DROP COLUMN state_suffix",
            "DROP TABLE state_agents",
        ]
    steps.append(f"UPDATE meta SET value = '{version}' WHERE key = 'schema_version'")
    for sql in steps:
        write_around_the_store(path, sql)
    return whole[:half]


@pytest.mark.parametrize("version", [2, 3, 4, 5, 6])
async def test_an_older_store_is_upgraded_in_place_by_its_writer(
    story: Story, heights: list[ExecutedHeight], tmp_path: Path, version: int
) -> None:
    path = tmp_path / "sidecar.db"
    kept = await _older_schema(path, heights, version)
    with pytest.raises(SidecarStoreError, match="start the sidecar once"):
        await SidecarStore.open(path, CHAIN, read_only=True)
    store = await SidecarStore.open(path, CHAIN)
    assert read_around_the_store(path, "SELECT value FROM meta WHERE key = 'schema_version'") == [
        (str(store_module.SCHEMA_VERSION),)
    ]
    state = await store.engine_state()
    assert state == kept[-1].engine_state
    assert store.executed_height == kept[-1].height
    # statements recorded before schema 5 read back as what they signed then: no window
    signed = await store.signed_block(kept[-1].height)
    assert signed is not None
    if version <= 4:
        assert signed.validity is None
    # ledger rows recorded before schema 6 read back as the version-1 entries they were
    assert await store.verify_ledger() is None
    # the sidecar goes on from it: the first height writes every entry
    engine = Engine.from_state_bytes(story.world.config, state)  # type: ignore[arg-type]
    for height, time_ms, txs in story.world.log[len(kept) :]:
        result = engine.execute_block(height, time_ms, txs, story.world.verify)
        await store.record(executed_height(result, engine.state_bytes(), 0, engine.state_delta()))
    assert await store.engine_state() == heights[-1].engine_state


async def test_strict_tables_refuse_a_value_of_the_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.db"
    await (await SidecarStore.open(path, CHAIN)).close()
    with pytest.raises(sqlite3.IntegrityError):
        write_around_the_store(path, "UPDATE head SET ledger_head = 'text, not a blob'")


def test_executed_heights_pickle_for_the_kill_test(heights: list[ExecutedHeight]) -> None:
    assert pickle.loads(pickle.dumps(heights)) == heights
    assert {v.outcome for h in heights for v in h.result.verdicts} >= {
        Outcome.ALLOW, Outcome.DENY, Outcome.PENDING, Outcome.REJECTED, Outcome.APPLIED,
    }  # fmt: skip


async def test_receipt_stream_messages_from_memory_equal_those_from_the_store(
    heights: list[ExecutedHeight], store: SidecarStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sidecar sends a recent height's `Receipts` messages from memory (built from the
    executed height) and older ones from its store: both must be the same messages, and a
    height is split into messages of at most RECEIPT_BATCH_LEAVES_MAX in leaf order."""
    await record_all(store, heights)
    monkeypatch.setattr(sidecar_node, "RECEIPT_BATCH_LEAVES_MAX", 1)
    split = 0
    for h in heights:
        fresh = [
            Receipt(leaf, path, h.signed) for leaf, path in zip(h.leaves, h.paths, strict=True)
        ]
        from_memory = sidecar_node.receipt_batches(h.height, fresh)
        from_store = sidecar_node.receipt_batches(h.height, await store.receipts_at(h.height))
        assert from_memory == from_store, f"height {h.height}"
        assert all(b.height == h.height and len(b.receipts) == 1 for b in from_memory)
        indices = [r.leaf.index for b in from_memory for r in b.receipts]
        assert indices == list(range(len(h.leaves)))
        split += len(from_memory) > 1
    assert split, "no height had receipts enough to be split"


async def test_the_loaded_state_is_the_checked_bytes_decoded_once(
    heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    """What a sidecar starts from: the stored state checked against its signed root and
    decoded, ready for an engine whose first delta rewrites every entry."""
    path = await recorded_file(tmp_path / "sidecar.db", heights)
    store = await SidecarStore.open(path, CHAIN)
    loaded = await store.loaded_state()
    assert loaded is not None
    data, state = loaded
    assert data == heights[-1].engine_state == state.to_bytes()
    assert state.tree_root() == heights[-1].result.state_root
    assert state.take_delta().full
    await store.close()


async def test_version_two_entries_keep_their_commitments_through_the_store(
    heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    """A chain that commits arguments: each entry's commitments and sealed salts are
    stored in `extension`, read back whole, and hashed (docs/audit.md)."""
    digest = Committed("q", b"\x05" * 32)
    sealed = SealedSalt(b"\x06" * 32, b"\x07" * 80)
    committed = [
        dataclasses.replace(
            h,
            ledger_extras=tuple(
                LedgerExtra((digest,), (sealed,)) if i % 2 else LedgerExtra()
                for i in range(len(h.result.verdicts))
            ),
        )
        for h in heights
    ]
    store = await SidecarStore.open(tmp_path / "sidecar.db", CHAIN)
    await record_all(store, committed)
    assert await store.verify_ledger() is None
    entries = await store.ledger(1, store_module.LEDGER_PAGE_ROWS_MAX)
    assert entries and all(e.version == 2 for e in entries)
    assert [e.commitments for e in entries if e.index % 2] == [
        (digest,) for e in entries if e.index % 2
    ]
    assert all(e.sealed_salts == () for e in entries if e.index % 2 == 0)
    assert all(LedgerEntry.from_json(e.to_json()) == e for e in entries)
