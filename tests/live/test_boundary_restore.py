"""A member restored from a backup taken before an epoch boundary, after it had voted in
the later epoch (docs/consensus/fencing.md, "Across an epoch boundary"): it catches up,
crosses the boundary again fenced as a restore, and rejoins without signing a second
vote in any (epoch, view) it had voted in before the backup was put back."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from quorumgate.replica.node import DB_FILE, RESTORE_FENCE_FILE, RESTORE_MARKER_FILE
from tests import polling
from tests.live.test_cli import cli_dirs, init, quorumgate

__all__ = ["cli_dirs"]  # the fixture, used by name

pytestmark = pytest.mark.live

WAIT_S = 60.0
RESTORED = 1  # the member backed up in epoch 0 and restored in epoch 1
ROTATED = 2  # whose key the owner rotates: the boundary


def _ok(*args: str | Path | int) -> str:
    result = quorumgate(*args)
    assert result.returncode == 0, f"{args}: {result.stderr}"
    return result.stdout


def _rows(directory: Path) -> dict[int, tuple[int, int]]:
    """node -> (epoch, height) as `quorumgate status` reports the live ones."""
    result = quorumgate("status", "--dir", directory, "--json")
    if result.returncode != 0:
        return {}
    rows = json.loads(result.stdout)["nodes"]
    return {row["id"]: (row.get("epoch", 0), row["height"]) for row in rows if row.get("alive")}


def _past(row: tuple[int, int] | None, height: int) -> bool:
    """In epoch 1 and above `height`."""
    return row is not None and row[0] == 1 and row[1] > height


def _commit_something(directory: Path, name: str) -> None:
    _ok("admin", "register-tool", name, "--mode", "direct", "--scheme", "https", "--dir", directory)


def _votes(store: Path) -> set[tuple[int, int, bytes]]:
    """(epoch, view, block hash) of every vote a stopped replica's store recorded."""
    db = sqlite3.connect(store)
    try:
        first = {(0, v, h) for v, h in db.execute("SELECT view, block_hash FROM signed_votes")}
        later = set(db.execute("SELECT epoch, view, block_hash FROM epoch_votes"))
    finally:
        db.close()
    return first | {(e, v, bytes(h)) for e, v, h in later}


def test_a_member_restored_across_a_boundary_rejoins_without_signing_twice(
    cli_dirs: Callable[[str], Path],
) -> None:
    directory = cli_dirs("c4")
    init(directory)
    _ok("up", "--dir", directory, "--detach")
    node_dir = directory / f"node-{RESTORED}"
    _ok("down", "--dir", directory, "--node", RESTORED)
    backup = directory / "epoch-0.backup.db"
    _ok("backup", "--dir", directory, "--node", RESTORED, "--to", backup)
    _ok("up", "--dir", directory, "--node", RESTORED, "--detach")

    # The boundary: the owner rotates member 2's key; then the member votes in epoch 1.
    _ok("admin", "rotate-key", "--dir", directory, "--member", ROTATED, "--deadline", int(WAIT_S))
    _commit_something(directory, "kb.one")
    polling.wait_until(
        "the member in epoch 1 and at the cluster's height",
        lambda: _rows(directory).get(RESTORED, (0, 0))[0] == 1,
        WAIT_S,
        0.2,
    )
    _ok("down", "--dir", directory, "--node", RESTORED)
    before = _votes(node_dir / DB_FILE)
    assert any(epoch == 1 for epoch, _, _ in before), "it voted in epoch 1 before the restore"
    top = max(height for _, height in _rows(directory).values())

    # Put back the copy of epoch 0: it crosses the boundary again, fenced there as well.
    out = _ok("restore", "--dir", directory, "--node", RESTORED, "--from", backup)
    assert "declared" in out
    _ok("up", "--dir", directory, "--node", RESTORED, "--detach")
    _commit_something(directory, "kb.two")
    log = node_dir / "replica.log"

    def fenced_in_epoch_1() -> bool:
        lines = [line for line in log.read_text().splitlines() if "event=restore_fenced" in line]
        return bool(lines) and " epoch=1 " in lines[-1]

    polling.wait_until(
        "the restored member fenced in epoch 1, its marker removed",
        lambda: fenced_in_epoch_1() and not (node_dir / RESTORE_MARKER_FILE).exists(),
        WAIT_S,
        0.2,
    )
    # A commit in epoch 1 of the view before its fence or later discharges the restore.
    _commit_something(directory, "kb.three")
    polling.wait_until(
        "the restore discharged, and the member past the cluster's height",
        lambda: (
            not (node_dir / RESTORE_FENCE_FILE).exists()
            and "event=restore_discharged" in log.read_text()
            and _past(_rows(directory).get(RESTORED), top)
        ),
        WAIT_S,
        0.2,
        lambda: f"node {RESTORED} at {_rows(directory).get(RESTORED)}, was {top}",
    )
    _ok("down", "--dir", directory)
    after = _votes(node_dir / DB_FILE)
    voted: dict[tuple[int, int], bytes] = {}
    for epoch, view, block_hash in sorted(before | after):
        known = voted.setdefault((epoch, view), block_hash)
        assert known == block_hash, f"two votes of member {RESTORED} in view {view} of {epoch}"
