"""`quorumgate backup` and `quorumgate restore`: a replica's store copied out, and put back
declared, so that the safe way to restore is the one command there is.

A replica restored from a backup has forgotten what it signed after the backup was taken.
It must start fenced as a *declared* restore (docs/consensus/fencing.md): the marker file
beside its store tells it to sign nothing until 2f+1 other members have answered, and then
nothing in a view they could have seen it sign in. Putting a copy back by hand and
forgetting the marker is the one restore that fencing does not cover; `restore` never puts
a store back without it.

Both work on a stopped replica only: a running replica holds its store under an exclusive
lock (replica/storage.py), and a copy taken around it could be torn. `backup` copies with
SQLite's backup API (the write-ahead log included, one consistent database file);
`restore` checks the copy is a replica store of this chain before it replaces anything,
then replaces the store whole (a temporary file renamed over it) and writes the marker.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

from quorumgate.ops.nodes import OpsError, running_pid
from quorumgate.proto.clusterfile import ClusterFileError, ClusterSpec, consensus_seed_for
from quorumgate.replica.node import DB_FILE, RESTORE_FENCE_FILE, RESTORE_MARKER_FILE
from quorumgate.replica.storage import ReplicaStore, StorageError, StoredEpoch

# The write-ahead log and shared-memory files SQLite keeps beside a store in WAL mode.
SIDE_FILE_SUFFIXES = ("-wal", "-shm")
COPY_PAGES_PER_STEP = 1024  # SQLite backup pages per step (4 MiB at the default page size)


@dataclass(frozen=True)
class StoreFacts:
    """What a store copy says about itself, for the operator's record."""

    committed_height: int
    last_voted_view: int
    epoch: int = 0  # the epoch the copy's store is in


def _stopped(spec: ClusterSpec, index: int, what: str) -> None:
    if not 0 <= index < spec.n:
        raise OpsError(f"there is no node {index}: this cluster has nodes 0..{spec.n - 1}")
    pid = running_pid(spec, index, "replica")
    if pid is not None:
        raise OpsError(
            f"replica {index} is running (pid {pid}): stop it first "
            f"(quorumgate down --dir DIR), then {what}"
        )


def _copy_database(source: Path, dest: Path) -> None:
    """One consistent database file at `dest` from the store at `source` (its WAL folded
    in), written beside `dest` and renamed over it, so `dest` is never half written."""
    tmp = dest.with_name(dest.name + ".copying")
    tmp.unlink(missing_ok=True)
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    except sqlite3.Error as err:
        raise OpsError(f"{source}: cannot be read as a store: {err}") from err
    try:
        out = sqlite3.connect(tmp)
        try:
            src.backup(out, pages=COPY_PAGES_PER_STEP)
            out.execute("PRAGMA journal_mode=DELETE")  # one file, no WAL beside it
        finally:
            out.close()
    except sqlite3.Error as err:
        tmp.unlink(missing_ok=True)
        raise OpsError(f"{source}: cannot be copied: {err}") from err
    finally:
        src.close()
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dest)


async def _facts(path: Path, chain_id: str) -> tuple[StoreFacts, StoredEpoch | None]:
    """What a store copy says about itself, and the newest epoch after 0 it started."""
    try:
        store = await ReplicaStore.open(path, chain_id)
    except StorageError as err:
        raise OpsError(str(err)) from err
    try:
        recovered = await store.load()
        stored = store.epoch
        facts = StoreFacts(
            recovered.committed.height,
            recovered.safety.last_voted_view,
            0 if stored is None else stored.epoch,
        )
        return facts, stored
    finally:
        await store.close()


def _check_epoch(spec: ClusterSpec, index: int, stored: StoredEpoch | None) -> None:
    """A copy from past epoch 0 must fit this node: its epoch's member set the size of
    this cluster, and this node's consensus key of that epoch in its node directory (the
    cluster file's key, or one a rotation wrote); else the replica could not start on it."""
    if stored is None:
        return
    if len(stored.keys) != spec.n:
        raise OpsError(
            f"the copy is in epoch {stored.epoch}, whose member set has {len(stored.keys)} "
            f"members; this cluster has {spec.n}: not a copy of this cluster's node {index}"
        )
    try:
        seed = consensus_seed_for(spec.node_dir(index), stored.keys[index])
    except ClusterFileError as err:
        raise OpsError(str(err)) from err
    if seed is None:
        raise OpsError(
            f"the copy is in epoch {stored.epoch}, and node {index}'s directory holds no key "
            f"file for its consensus key of that epoch ({stored.keys[index].hex()[:16]}...): "
            "put back the key file the rotation wrote, or restore another copy"
        )


def backup_replica(spec: ClusterSpec, index: int, dest: Path) -> StoreFacts:
    """Copy replica `index`'s store (stopped) to `dest`, a file that must not exist."""
    _stopped(spec, index, "take the backup")
    source = spec.node_dir(index) / DB_FILE
    if not source.exists():
        raise OpsError(f"{source}: no replica store to back up")
    if dest.exists():
        raise OpsError(f"{dest}: already exists; a backup never overwrites a file")
    _copy_database(source, dest)
    with tempfile.TemporaryDirectory() as tmp:  # opening a store writes beside it
        probe = Path(tmp) / DB_FILE
        shutil.copyfile(dest, probe)
        return asyncio.run(_facts(probe, spec.chain_id))[0]


def restore_replica(spec: ClusterSpec, index: int, source: Path) -> StoreFacts:
    """Put the backup `source` back as replica `index`'s store (stopped), declared.

    The copy is checked first — a replica store, of this chain — in a file beside the
    store; only then is the marker written and the store replaced, in that order, so that
    a crash in between leaves the old store declared (fenced for nothing), never the copy
    undeclared. A copy from past epoch 0 is refused, with nothing changed, if its member
    set has another size than this cluster or this node's directory lacks its consensus
    key of that epoch."""
    _stopped(spec, index, "restore it")
    if not source.is_file():
        raise OpsError(f"{source}: no such backup file")
    node_dir = spec.node_dir(index)
    node_dir.mkdir(parents=True, exist_ok=True)
    store = node_dir / DB_FILE
    staged = node_dir / (DB_FILE + ".restoring")
    staged.unlink(missing_ok=True)
    _copy_database(source, staged)
    try:
        facts, stored = asyncio.run(_facts(staged, spec.chain_id))
        _check_epoch(spec, index, stored)
    except OpsError:
        staged.unlink(missing_ok=True)
        raise
    for suffix in SIDE_FILE_SUFFIXES:  # the old store's log must not replay into the copy
        (node_dir / (DB_FILE + suffix)).unlink(missing_ok=True)
        (node_dir / (staged.name + suffix)).unlink(missing_ok=True)
    # Made afresh, empty: a marker an unfinished restore left holds that restore's nonce,
    # which this one must not inherit (docs/consensus/fencing.md).
    (node_dir / RESTORE_MARKER_FILE).write_bytes(b"")
    # A fence an earlier restore noted is void: this copy fences afresh in every epoch.
    (node_dir / RESTORE_FENCE_FILE).unlink(missing_ok=True)
    os.replace(staged, store)
    return facts
