"""`quorumgate backup` and `restore` on a real cluster: a restored replica always starts as a
declared restore (docs/consensus/fencing.md), and every command that cannot be carried out
safely refuses with one clear line and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from quorumgate.proto.clusterfile import load_cluster
from quorumgate.replica.node import DB_FILE, RESTORE_MARKER_FILE
from tests import polling
from tests.live.test_cli import assert_clean_failure, cli_dirs, init, quorumgate

__all__ = ["cli_dirs"]  # the fixture, used by name

pytestmark = pytest.mark.live

WAIT_S = 60.0


def _ok(*args: str | Path | int) -> str:
    result = quorumgate(*args)
    assert result.returncode == 0, f"{args}: {result.stderr}"
    return result.stdout


def _height(directory: Path, node: int) -> int | None:
    result = quorumgate("status", "--dir", directory, "--json")
    if result.returncode != 0:
        return None
    rows = {row["id"]: row for row in json.loads(result.stdout)["nodes"]}
    row = rows.get(node)
    return row["height"] if row and row.get("alive") else None


def _commit_something(directory: Path, name: str) -> None:
    _ok("admin", "register-tool", name, "--mode", "direct", "--scheme", "https", "--dir", directory)


def test_a_restored_replica_starts_declared_and_catches_up(
    cli_dirs: Callable[[str], Path],
) -> None:
    directory = cli_dirs("c4")
    init(directory)
    _ok("up", "--dir", directory, "--detach")
    _commit_something(directory, "kb.one")
    _ok("down", "--dir", directory, "--node", 1)
    backup = directory / "node-1.backup.db"
    out = _ok("backup", "--dir", directory, "--node", 1, "--to", backup)
    assert backup.is_file() and "committed height" in out
    assert not (directory / "node-1" / RESTORE_MARKER_FILE).exists()

    # the member votes on after its backup, then is put back to the backup
    _ok("up", "--dir", directory, "--node", 1, "--detach")
    _commit_something(directory, "kb.two")
    _commit_something(directory, "kb.three")
    top = polling.wait_until(
        "node 1 at the cluster's height", lambda: _height(directory, 1), WAIT_S, 0.2
    )
    _ok("down", "--dir", directory, "--node", 1)
    out = _ok("restore", "--dir", directory, "--node", 1, "--from", backup)
    assert "declared" in out
    node_dir = directory / "node-1"
    assert (node_dir / RESTORE_MARKER_FILE).exists()
    assert not (node_dir / (DB_FILE + ".restoring")).exists()

    _ok("up", "--dir", directory, "--node", 1, "--detach")
    log = node_dir / "replica.log"
    polling.wait_until(
        "the restore declared in the log",
        lambda: "event=restore_declared" in log.read_text(),
        WAIT_S,
        0.1,
    )
    _commit_something(directory, "kb.four")
    polling.wait_until(
        "the restored member past its fence and at the cluster's height",
        lambda: (
            "event=restore_fenced" in log.read_text()
            and (_height(directory, 1) or 0) > top
            and not (node_dir / RESTORE_MARKER_FILE).exists()
        ),
        WAIT_S,
        0.2,
        lambda: f"node 1 at {_height(directory, 1)}, cluster was at {top}",
    )
    _ok("down", "--dir", directory)


def test_backup_and_restore_refuse_what_they_cannot_do_safely(
    cli_dirs: Callable[[str], Path],
) -> None:
    directory, other = cli_dirs("c4"), cli_dirs("other")
    init(directory)
    init(other)
    _ok("up", "--dir", directory, "--detach")
    _ok("up", "--dir", other, "--detach")
    _commit_something(other, "kb.one")
    _ok("down", "--dir", other)
    foreign = other / "node-0.backup.db"
    _ok("backup", "--dir", other, "--node", 0, "--to", foreign)

    assert_clean_failure(
        quorumgate("backup", "--dir", directory, "--node", 0, "--to", directory / "b.db"),
        2,
        "replica 0 is running",
    )
    assert not (directory / "b.db").exists()
    assert_clean_failure(
        quorumgate("restore", "--dir", directory, "--node", 0, "--from", foreign),
        2,
        "replica 0 is running",
    )
    assert_clean_failure(
        quorumgate("backup", "--dir", directory, "--node", 9, "--to", directory / "b.db"),
        2,
        "there is no node 9",
    )

    _ok("down", "--dir", directory, "--node", 2)
    store = directory / "node-2" / DB_FILE
    before = store.read_bytes()
    assert_clean_failure(
        quorumgate("backup", "--dir", directory, "--node", 2, "--to", foreign), 2, "already exists"
    )
    # another chain's store, and a file that is no store at all, are refused and change
    # nothing: the member's own store stays, and no marker is written
    spec = load_cluster(other)
    assert_clean_failure(
        quorumgate("restore", "--dir", directory, "--node", 2, "--from", foreign), 2, spec.chain_id
    )
    junk = directory / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    assert_clean_failure(
        quorumgate("restore", "--dir", directory, "--node", 2, "--from", junk), 2, "junk.db"
    )
    assert_clean_failure(
        quorumgate("restore", "--dir", directory, "--node", 2, "--from", directory / "missing.db"),
        2,
        "no such backup file",
    )
    assert store.read_bytes() == before
    assert not (directory / "node-2" / RESTORE_MARKER_FILE).exists()
    assert not (directory / "node-2" / (DB_FILE + ".restoring")).exists()
    _ok("down", "--dir", directory)
