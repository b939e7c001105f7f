"""What the auditors' copy acknowledged, written where pruning reads it (docs/pruning.md,
"Where a node prunes"; docs/audit.md, "The acknowledged height").

A sidecar with `audit_copy` prunes only below the height in `DIR/node-I/audit-acked.json`.
`quorumgate ship` writes that file into every node directory under its cluster directory
that exists on its host, after each batch the copy durably acknowledged: a PostgreSQL
transaction committed, or an OTLP export acknowledged and its cursor file replaced.

The height written is one through which *every* verdict is in the copy. A cursor names
the last shipped entry, and a batch may end inside a height: the entry's certificate
carries its height's leaf count (one leaf per verdict, sidecar/receipts.py), so the height
is whole when the entry is its last leaf, and otherwise only the heights below it are.
With several copies the lowest of their heights is written, once each has told one. The
file never goes back: a larger height already there stays.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from quorumgate.audit.records import Cursor
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sidecar.pruning import ACKED_FILE, read_acked

log = logging.getLogger("quorumgate.ship")

ACKED_FILE_MODE = 0o644  # the file holds a height only


def acked_height(cursor: Cursor, leaf_count: int | None) -> int:
    """The height through which every verdict is in a copy whose cursor is `cursor`;
    `leaf_count` is the number of verdicts of the cursor's height (None: not known, then
    that height counts as unfinished)."""
    if not cursor.started:
        return 0
    whole = leaf_count is not None and cursor.index == leaf_count - 1
    return cursor.height if whole else cursor.height - 1


def write_acked(node_dir: Path, height: int) -> bool:
    """Write `{"height": height}` into `node_dir`'s acknowledged-height file unless it
    already holds that height or a larger one; True when it wrote. Replaced whole: written
    beside, synced, renamed over, the directory synced, so that a crash leaves the old
    height or the new one and a sidecar never reads a part. The directory is locked
    meanwhile, so that two shippers on one host cannot lower it between the read and the
    rename."""
    directory = os.open(node_dir, os.O_RDONLY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)
        try:
            if read_acked(node_dir) >= height:
                return False
        except ValueError as err:
            log.warning("event=acked_unreadable replaced=true error=%s", err)
        path = node_dir / ACKED_FILE
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, ACKED_FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(fd, ACKED_FILE_MODE)  # whatever the umask: a sidecar of another user reads it
            json.dump({"height": height}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        os.fsync(directory)
        return True
    finally:
        os.close(directory)  # and the lock with it


def local_node_dirs(spec: ClusterSpec) -> tuple[Path, ...]:
    """The members' node directories that exist on this host."""
    found = (spec.node_dir(m.index) for m in spec.members)
    return tuple(d for d in found if d.is_dir())


class AckedFiles:
    """The acknowledged height of the copies named in `copies`, written into `node_dirs`
    once every copy has told its own (the lowest of them), and only when it grew."""

    def __init__(self, node_dirs: Iterable[Path], copies: Iterable[str]) -> None:
        self.node_dirs = tuple(node_dirs)
        self.copies = frozenset(copies)
        self.heights: dict[str, int] = {}
        self.written = 0  # the height last written (or found written everywhere)
        self.registry = CollectorRegistry()
        self.height_gauge = Gauge(
            "qg_ship_acked_height",
            "Height through which every verdict is in the copies, as written for pruning",
            registry=self.registry,
        )

    def report(self, copy: str, height: int) -> None:
        """Copy `copy` holds every verdict through `height` (durably): write the files when
        the lowest height of all copies grew. A file that cannot be written is logged and
        tried again at the next report: the copy goes on, its nodes prune later."""
        if copy not in self.copies:
            raise ValueError(f"unknown copy {copy!r}")
        self.heights[copy] = max(self.heights.get(copy, 0), height)
        if self.heights.keys() != self.copies:
            return
        low = min(self.heights.values())
        if low <= self.written:
            return
        try:
            changed = sum(write_acked(node_dir, low) for node_dir in self.node_dirs)
        except OSError as err:
            log.warning("event=acked_failed height=%d error=%s", low, type(err).__name__)
            return
        self.written = low
        self.height_gauge.set(low)
        if changed:
            log.info("event=acked_written height=%d nodes=%d", low, changed)
