"""The height below which a replica drops its committed blocks and commit proofs
(docs/pruning.md).

The replica does not choose it: its sidecar does, after it has pruned its own store to a
snapshot it holds (sidecar/pruning.py), and writes it to `DIR/node-I/pruned.json`. The
replica keeps the block at that height (the sidecar's replay links the next block to it)
and drops those below. The file is written to a temporary name, fsynced and renamed, so a
reader sees a whole file or the previous one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

PRUNE_FLOOR_FILE = "pruned.json"  # in the node directory: {"keep_from_height": H}


class PrunedError(Exception):
    """A read of committed heights below what this replica keeps (docs/pruning.md)."""

    def __init__(self, asked: int, history_from: int) -> None:
        self.asked = asked
        self.history_from = history_from
        super().__init__(pruned_message(asked, history_from))


def pruned_message(asked: int, history_from: int) -> str:
    """What a reader asking for a pruned height is told: where history starts, and where
    to go instead."""
    return (
        f"height {asked} is pruned on this replica: its committed log starts at height "
        f"{history_from} (retain_heights or retain_age_s in snapshots.json, docs/pruning.md); "
        "catch a sidecar up from a snapshot (`quorumgate replay --from-snapshot`) and take "
        "older verdicts from the auditors' copy"
    )


@dataclass(frozen=True)
class PruneFloor:
    """Keep committed heights from `keep_from_height` on; drop those below."""

    keep_from_height: int

    @staticmethod
    def read(node_dir: Path) -> PruneFloor | None:
        """The floor the sidecar wrote, or None (no file: nothing is pruned). A file that
        does not hold a positive height is refused, never guessed around."""
        path = node_dir / PRUNE_FLOOR_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            height = json.loads(text)["keep_from_height"]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a prune floor file: {err}") from err
        if not isinstance(height, int) or isinstance(height, bool) or height < 1:
            raise ValueError(f"{path}: keep_from_height must be a height >= 1")
        return PruneFloor(height)

    def write(self, node_dir: Path) -> None:
        path = node_dir / PRUNE_FLOOR_FILE
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as out:
            out.write(json.dumps({"keep_from_height": self.keep_from_height}))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
