"""Pruning a sidecar's history below a snapshot (docs/pruning.md).

With `retain_heights` or `retain_age_s` set in `DIR/node-I/snapshots.json`, a sidecar drops
the ledger rows, receipts, block statements and rejection artifacts of the heights at and
below a *pruning point*, and its replica the committed blocks and commit proofs below it.
The point is the newest snapshot height this sidecar holds that is at most

- its executed height less `retain_heights` (the history it is told to keep),
- with `retain_age_s`, the newest snapshot whose block time is at least that many seconds
  before its executed height's block time (the history younger than that is kept), and
- when an auditors' copy is configured (`audit_copy`), the height the copy acknowledged:
  the sidecar cannot read the copy, so `quorumgate ship` (cluster/audit/acked.py), or an
  operator, writes it to `DIR/node-I/audit-acked.json` as {"height": H}; without that
  file nothing is pruned.

It is never above the newest snapshot (a wiped sidecar then always has a snapshot and the
blocks after it) and never below the store's current checkpoint (pruning only moves
forward). The store keeps a *checkpoint* at the point (height, state root, ledger head and
entry count, block hash and time) signed with this sidecar's receipt key, so `ledger
verify` walks what is left from a hash it can check, and says where history starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from quorumgate.proto import domains
from quorumgate.proto.canonical import Encoder
from quorumgate.replica.pruning import PruneFloor
from quorumgate.sidecar.snapshots import (
    RETAIN_AGE_S_MIN,
    RETAIN_HEIGHTS_MIN,
    SnapshotDir,
    SnapshotOptions,
)
from quorumgate.sidecar.store import Checkpoint, CheckpointSignature, PruneResult, SidecarStore

ACKED_FILE = "audit-acked.json"  # in the node directory: {"height": H}, the copy's cursor
MS_PER_S = 1000


@dataclass(frozen=True)
class PruneBounds:
    """What bounds one pruning: the executed height, the heights to keep below it (None:
    no retention by height), the snapshot heights held, the height the auditors' copy
    acknowledged (None: no copy is configured), the store's current checkpoint height (0:
    none); and for a retention by age, the seconds of block time to keep (None: none),
    the executed height's block time and each held snapshot's (height, block time)."""

    executed_height: int
    retain_heights: int | None
    snapshot_heights: tuple[int, ...]
    acked_height: int | None = None
    checkpoint_height: int = 0
    retain_age_s: int | None = None
    executed_time_ms: int = 0
    snapshot_times_ms: tuple[tuple[int, int], ...] = ()


def prune_point(bounds: PruneBounds) -> int | None:
    """The height to prune at and below, or None when nothing may be pruned now (module
    doc). Raises ValueError for a retention below `RETAIN_HEIGHTS_MIN` or
    `RETAIN_AGE_S_MIN`: the options file refuses one, and this refuses it again rather
    than drop every height."""
    if bounds.retain_heights is None and bounds.retain_age_s is None:
        return None  # no retention: every height is kept
    limit = bounds.executed_height
    if bounds.retain_heights is not None:
        if bounds.retain_heights < RETAIN_HEIGHTS_MIN:
            raise ValueError(f"retain_heights must be >= {RETAIN_HEIGHTS_MIN}")
        limit = bounds.executed_height - bounds.retain_heights
    if bounds.retain_age_s is not None:
        limit = min(limit, age_limit(bounds))
    if bounds.acked_height is not None:
        limit = min(limit, bounds.acked_height)
    candidates = [h for h in bounds.snapshot_heights if 1 <= h <= limit]
    if not candidates:
        return None
    point = max(candidates)
    return point if point > bounds.checkpoint_height else None


def age_limit(bounds: PruneBounds) -> int:
    """The newest held snapshot height whose block time is at least `retain_age_s` before
    the executed height's (0: none). Block time grows with every height (a voter refuses
    a block not later than its parent: docs/consensus/messages.md, "Block time"), so every
    height at or below it is as old, and every height above it within the age is kept."""
    age_s = bounds.retain_age_s
    if age_s is None or age_s < RETAIN_AGE_S_MIN:
        raise ValueError(f"retain_age_s must be >= {RETAIN_AGE_S_MIN}")
    cutoff_ms = bounds.executed_time_ms - age_s * MS_PER_S
    old = [
        h for h, t in bounds.snapshot_times_ms if t <= cutoff_ms and h in bounds.snapshot_heights
    ]
    return max(old, default=0)


def read_acked(node_dir: Path) -> int:
    """The height the auditors' copy acknowledged, as the operator wrote it (0 when there
    is no file: then nothing is pruned). A file that does not hold a height is refused."""
    path = node_dir / ACKED_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not an acknowledged-height file: {err}") from err
    height = doc.get("height") if isinstance(doc, dict) else None
    if not isinstance(height, int) or isinstance(height, bool) or height < 0:
        raise ValueError(f"{path}: height must be a whole number >= 0")
    return height


def checkpoint_statement(chain_id: str, checkpoint: Checkpoint) -> bytes:
    """The bytes a sidecar signs for the checkpoint it pruned at."""
    c = checkpoint
    enc = Encoder(domains.LEDGER_CHECKPOINT).text(chain_id).u64(c.height).blob(c.state_root)
    enc.blob(c.ledger_head).u64(c.ledger_entries).blob(c.block_hash).u64(c.block_time_ms)
    return bytes(enc)


def sign_checkpoint(key: SigningKey, chain_id: str, checkpoint: Checkpoint) -> bytes:
    return bytes(key.sign(checkpoint_statement(chain_id, checkpoint)).signature)


def checkpoint_signed_by(
    chain_id: str, checkpoint: Checkpoint, signature: bytes, public_key: bytes
) -> bool:
    try:
        VerifyKey(public_key).verify(checkpoint_statement(chain_id, checkpoint), signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True


def snapshot_heights(heights: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(heights)))


@dataclass(frozen=True)
class Pruner:
    """One sidecar's pruning: its options, snapshots, node directory and receipt key."""

    options: SnapshotOptions
    snapshots: SnapshotDir
    node_dir: Path
    key: SigningKey
    index: int
    chain_id: str

    def point(self, store: SidecarStore, executed_time_ms: int) -> int | None:
        """Where `store` may be pruned now (None: nowhere, or pruning is off), its executed
        height's block time being `executed_time_ms`. Raises ValueError for an unreadable
        acknowledged-height file."""
        options = self.options
        if not options.prunes:
            return None
        acked = read_acked(self.node_dir) if options.audit_copy else None
        base = store.checkpoint.height if store.checkpoint is not None else 0
        manifests = self.snapshots.manifests()
        held = snapshot_heights(m.height for m in manifests)
        times = tuple(sorted((m.height, m.block_time_ms) for m in manifests))
        bounds = PruneBounds(
            store.executed_height, options.retain_heights, held, acked, base,
            options.retain_age_s, executed_time_ms, times,
        )  # fmt: skip
        return prune_point(bounds)

    async def prune(self, store: SidecarStore, point: int) -> PruneResult:
        """Prune `store` at the snapshot of `point`: sign the checkpoint, drop the rows,
        keep that snapshot (the base of local history now), and tell the replica where
        its log may start (replica/pruning.py)."""
        manifest = self.snapshots.manifest(point)
        if manifest is None:
            raise ValueError(f"no snapshot of height {point} held")
        checkpoint = manifest.head
        signature = sign_checkpoint(self.key, self.chain_id, checkpoint)
        result = await store.prune_to(checkpoint, CheckpointSignature(self.index, signature))
        self.snapshots.pinned = point
        PruneFloor(point).write(self.node_dir)
        return result
