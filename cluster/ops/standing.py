"""The cluster as it stands, for `quorumgate status` and the table `quorumgate up` prints
(docs/operating.md, "Status after a reconfiguration"): the current epoch's members, their
addresses and key fingerprints, and which were replaced, added, removed or had a key
rotated, in which epoch. It is read from the chain of epochs `Client.epochs` checks link
by link from cluster.json (docs/consensus/epochs.md, "Followers: the chain of epochs"),
never from what one replica says; when the chain cannot be followed it says why, and the
members shown are cluster.json's."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import OWNER_KEY_FILE, ClusterFileError, ClusterSpec, read_seed
from quorumgate.sdk.epochs import CheckedEpoch, Epochs, key_fingerprint

CHAIN_READ_TIMEOUT_S = 3.0  # one replica's answer to EpochEnds, for a status line


@dataclass(frozen=True, slots=True)
class MemberNow:
    """One member as it stands: where its replica listens, its keys' fingerprints, and
    what changed it, as (epoch, change), oldest first."""

    index: int
    address: str
    key: str
    receipt_key: str
    changes: tuple[tuple[int, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "address": self.address,
            "key": self.key,
            "receipt_key": self.receipt_key,
            "changes": [{"epoch": e, "change": c} for e, c in self.changes],
        }


@dataclass(frozen=True, slots=True)
class Standing:
    """`spec`: the cluster as it stands (cluster.json's when the chain was not followed).
    `epoch`: the checked chain's current epoch (None when not followed). `removed`:
    (index, epoch) of members a `remove` took out and no `add` brought back. `problem`:
    why the chain could not be followed ('' when it was, or on a chain that runs none)."""

    spec: ClusterSpec
    followed: bool
    epoch: int | None
    members: tuple[MemberNow, ...]
    removed: tuple[tuple[int, int], ...] = ()
    checked_by: tuple[int, ...] = ()
    problem: str = ""

    @property
    def source(self) -> str:
        return "chain of epochs" if self.followed else "cluster.json"

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "followed": self.followed,
            "epoch": self.epoch,
            "checked_by": list(self.checked_by),
            "problem": self.problem or None,
            "members": [m.as_dict() for m in self.members],
            "removed": [{"index": i, "epoch": e} for i, e in self.removed],
        }


def _fingerprint(keys: Sequence[bytes], index: int) -> str:
    return key_fingerprint(keys[index]) if index < len(keys) else "-"


def from_cluster_file(spec: ClusterSpec, problem: str = "") -> Standing:
    """cluster.json's members, as a chain that never reconfigured has them."""
    members = tuple(
        MemberNow(
            m.index,
            m.replica_address,
            key_fingerprint(m.public_key),
            key_fingerprint(m.receipt_public_key),
        )
        for m in spec.members
    )
    return Standing(spec, False, None, members, problem=problem)


def _changes(
    epochs: Sequence[CheckedEpoch],
) -> tuple[dict[int, list[tuple[int, str]]], dict[int, int]]:
    """What each epoch changed, by member index, and where each member absent from the
    last epoch was removed."""
    changes: dict[int, list[tuple[int, str]]] = {}
    removed: dict[int, int] = {}
    for prev, cur in pairwise(epochs):
        moved_before, moved_now = dict(prev.moved), dict(cur.moved)
        for i in range(cur.members):
            said = changes.setdefault(i, [])
            if i >= prev.members:
                said.append((cur.epoch, "added"))
                removed.pop(i, None)
            elif moved_now.get(i) != moved_before.get(i):
                said.append((cur.epoch, f"replaced by a new machine at {moved_now.get(i)}"))
            else:
                if cur.keys[i] != prev.keys[i]:
                    said.append((cur.epoch, "consensus key rotated"))
                if _fingerprint(cur.receipt_keys, i) != _fingerprint(prev.receipt_keys, i):
                    said.append((cur.epoch, "receipt key rotated"))
        for i in range(cur.members, prev.members):
            removed[i] = cur.epoch
            changes.pop(i, None)
    return changes, removed


def from_chain(spec: ClusterSpec, found: Epochs) -> Standing:
    """The cluster of `found`'s current epoch: cluster.json with the member entries the
    checked records carried (`Epochs.cluster`), and each member's changes."""
    now = found.cluster(spec)
    current = found.current
    changes, removed = _changes(found.epochs)
    members = tuple(
        MemberNow(
            m.index,
            m.replica_address,
            _fingerprint(current.keys, m.index),
            _fingerprint(current.receipt_keys, m.index),
            tuple(changes.get(m.index, ())),
        )
        for m in now.members
    )
    return Standing(
        now,
        True,
        current.epoch,
        members,
        tuple(sorted(removed.items())),
        current.checked_by,
    )


def read_standing(spec: ClusterSpec, key_path: Path | None = None) -> Standing:
    """The cluster as it stands, the chain read with `key_path` (default DIR/owner.key:
    the epoch ends answer the owner, auditors and members only). On a chain that runs no
    epochs, cluster.json's members; when the chain cannot be followed, cluster.json's
    members and `problem` saying why."""
    if not spec.runs_epochs:
        return from_cluster_file(spec)
    path = key_path if key_path is not None else spec.directory / OWNER_KEY_FILE
    try:
        key = SigningKey(read_seed(path))
    except (ClusterFileError, OSError, ValueError):
        return from_cluster_file(
            spec, f"no key to read it with ({path} cannot be read; give --key FILE)"
        )
    from quorumgate.sdk.client import Client
    from quorumgate.sdk.errors import ClusterUnavailable, EpochsUnverified, ReadNotAuthorized

    async def ask() -> Epochs:
        async with Client(spec, key, rpc_timeout_s=CHAIN_READ_TIMEOUT_S) as client:
            return await client.epochs()

    try:
        found = asyncio.run(ask())
    except EpochsUnverified as err:
        why = "; ".join(f"replica {i}: {w}" for i, w in sorted(err.refused.items()))
        return from_cluster_file(spec, f"no replica's chain of epochs checks ({why})")
    except ReadNotAuthorized:
        return from_cluster_file(spec, f"the replicas refused the read to the key in {path}")
    except ClusterUnavailable:
        return from_cluster_file(spec, f"fewer than f+1 = {spec.f + 1} replicas answered")
    return from_chain(spec, found)


def standing_text(standing: Standing) -> str:
    """The lines under the status table: whose members are shown, each member's keys and
    changes, the members removed, or why the chain could not be followed."""
    from quorumgate.ops.output import table

    if standing.followed:
        by = ",".join(str(i) for i in standing.checked_by) or "none this time"
        head = (
            f"members of epoch {standing.epoch} ({len(standing.members)}, f={standing.spec.f}),"
            f" from the chain of epochs checked from cluster.json (replicas {by}):"
        )
    elif standing.problem:
        head = (
            "could not follow the chain of epochs: "
            f"{standing.problem}. The members shown are cluster.json's (epoch 0), which "
            "may no longer be the cluster's:"
        )
    else:
        head = "members (cluster.json; this chain's member set is fixed):"
    rows = [
        [
            m.index,
            m.address,
            m.key,
            m.receipt_key,
            "; ".join(f"{c} in epoch {e}" for e, c in m.changes) or "-",
        ]
        for m in standing.members
    ]
    lines = [head, table(["member", "address", "key", "receipt key", "changed"], rows)]
    for index, epoch in standing.removed:
        lines.append(f"member {index}: removed in epoch {epoch}")
    return "\n".join(lines)
