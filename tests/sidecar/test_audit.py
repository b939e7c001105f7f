"""A sidecar's self-audit of one height (sidecar/audit.py), against stores edited around the
store API: a clean height passes, and an edited receipt field, an edited or swapped path,
a missing receipt or an edited ledger entry is named at its height."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumgate.sidecar.audit import audit_height, audit_rows
from quorumgate.sidecar.store import ExecutedHeight, SidecarStore, SidecarStoreError
from tests.engine.harness import CHAIN
from tests.sidecar.executed_log import (
    busy_world,
    execute,
    read_around_the_store,
    receipt_public_keys,
    recorded_file,
    write_around_the_store,
)


@pytest.fixture(scope="module")
def heights() -> list[ExecutedHeight]:
    return execute(busy_world().world)


def _audit(path: Path, height: int) -> str | None:
    async def run() -> str | None:
        store = await SidecarStore.open(path, CHAIN, read_only=True)
        try:
            return await audit_height(store, CHAIN, receipt_public_keys()[0], height)
        finally:
            await store.close()

    return asyncio.run(run())


@pytest.fixture
def recorded(heights: list[ExecutedHeight], tmp_path: Path) -> tuple[Path, int]:
    """A store holding every height, and the height with the most verdicts."""
    path = asyncio.run(recorded_file(tmp_path / "sidecar.db", heights))
    busiest = max(heights, key=lambda h: len(h.leaves))
    assert len(busiest.leaves) >= 3, "the story needs a height of several verdicts"
    return path, busiest.height


def test_every_recorded_height_passes(
    recorded: tuple[Path, int], heights: list[ExecutedHeight]
) -> None:
    path, _ = recorded
    assert [_audit(path, h.height) for h in heights] == [None] * len(heights)


def test_an_edited_receipt_outcome_breaks_the_root(recorded: tuple[Path, int]) -> None:
    path, height = recorded
    write_around_the_store(
        path,
        "UPDATE receipts SET outcome = CASE outcome WHEN 'allow' THEN 'deny' ELSE 'allow' END "
        "WHERE height = ? AND idx = 1",
        (height,),
    )
    problem = _audit(path, height)
    assert problem is not None and f"height {height}" in problem and "verdict root" in problem


def test_two_swapped_paths_are_each_not_the_leafs_own(recorded: tuple[Path, int]) -> None:
    """The leaves still make the signed root; only the stored paths are wrong."""
    path, height = recorded
    [(first,), (second,)] = read_around_the_store(
        path, "SELECT path FROM receipts WHERE height = ? AND idx IN (0, 1) ORDER BY idx", (height,)
    )
    assert first != second
    write_around_the_store(
        path, "UPDATE receipts SET path = ? WHERE height = ? AND idx = 0", (second, height)
    )
    write_around_the_store(
        path, "UPDATE receipts SET path = ? WHERE height = ? AND idx = 1", (first, height)
    )
    assert _audit(path, height) == f"height {height}, leaf 0: not under the signed verdict root"


def test_a_missing_receipt_and_an_edited_ledger_entry_are_named(
    recorded: tuple[Path, int],
) -> None:
    path, height = recorded
    write_around_the_store(
        path, "UPDATE ledger SET reason = reason || '!' WHERE height = ? AND idx = 0", (height,)
    )
    problem = _audit(path, height)
    assert problem is not None and problem.startswith(f"height {height}, ledger entry 0")
    write_around_the_store(path, "DELETE FROM receipts WHERE height = ? AND idx = 2", (height,))
    problem = _audit(path, height)
    assert problem is not None and "receipts for" in problem


def test_a_height_recorded_with_the_audits_read_gives_what_a_read_of_its_own_gives(
    heights: list[ExecutedHeight], tmp_path: Path
) -> None:
    """`record(h, then_read=k)` reads height k in the record's own trip to the store, once
    h is committed (the sidecar's self-audit of its next older height, sidecar/node.py):
    the rows are those `height_rows(k)` reads afterwards, and they audit the same."""

    async def run() -> None:
        store = await SidecarStore.open(tmp_path / "sidecar.db", CHAIN)
        try:
            for i, executed in enumerate(heights):
                older = heights[i // 2].height  # a walk behind the executed height
                read_then = await store.record(executed, then_read=older)
                assert store.executed_height == executed.height
                assert read_then is not None and not isinstance(read_then, SidecarStoreError)
                assert read_then == await store.height_rows(older)
                assert audit_rows(read_then, CHAIN, receipt_public_keys()[0], older) is None
        finally:
            await store.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("edit", "found"),
    [
        ("UPDATE ledger SET reason = 'edited' WHERE height = ? AND idx = 0", "audit"),
        ("UPDATE ledger SET extension = '{' WHERE height = ? AND idx = 0", "unreadable"),
    ],
)
def test_an_edited_older_height_read_with_a_record_is_named_and_the_record_stands(
    heights: list[ExecutedHeight], recorded: tuple[Path, int], tmp_path: Path, edit: str, found: str
) -> None:
    """An older height edited on disk is found by the audit of the rows a record read,
    and a ledger row that is no entry comes back as the store's error; either way the new
    height is recorded (the audit raises the alarm, not the record)."""
    busiest = recorded[1]
    cut = next(i for i, h in enumerate(heights) if h.height > busiest)
    path = asyncio.run(recorded_file(tmp_path / "part.db", heights[:cut]))
    assert write_around_the_store(path, edit, (busiest,)) == 1

    async def record_next() -> object:
        store = await SidecarStore.open(path, CHAIN)
        try:
            rows = await store.record(heights[cut], then_read=busiest)
            assert store.executed_height == heights[cut].height
            return rows
        finally:
            await store.close()

    rows = asyncio.run(record_next())
    if found == "unreadable":
        assert isinstance(rows, SidecarStoreError) and f"height {busiest}" in str(rows)
    else:
        assert rows is not None and not isinstance(rows, SidecarStoreError)
        problem = audit_rows(rows, CHAIN, receipt_public_keys()[0], busiest)  # type: ignore[arg-type]
        assert problem is not None and f"height {busiest}" in problem
