"""A sidecar's self-audit of one height (sidecar/audit.py), against stores edited around the
store API: a clean height passes, and an edited receipt field, an edited or swapped path,
a missing receipt or an edited ledger entry is named at its height."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumgate.sidecar.audit import audit_height
from quorumgate.sidecar.store import ExecutedHeight, SidecarStore
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
