"""Reconfiguration in the simulator: the owner's member-set changes, committed at random
ticks, and what a node's shell does around an epoch boundary (docs/consensus/epochs.md):
make the next epoch durable with the change block's commit, start that epoch's core,
and hand a node still in an old epoch the proof that it ended."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Protocol

from quorumgate.proto.crypto import Signer, Verifier
from quorumgate.proto.membership import Membership, Reconfiguration
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.epochs import (
    EpochEnd,
    EpochProof,
    check_epoch_proof,
    epoch_page,
    epoch_proof,
    epoch_proof_reach,
    epoch_safety_state,
    needs_pages,
    start_qc,
)
from quorumgate.replica.sim.node import SimNode
from quorumgate.replica.sim.options import SIM_LIMITS, SimOptions
from quorumgate.replica.types import Block, RemoteError, SyncResponse

# The share of the adversarial ticks within which the changes are committed (the rest lets
# the last epoch settle before the heal).
CHANGE_TICKS_SHARE_PERCENT = 70
RECONFIG_SEED_SALT = 104_729  # the draws of reconfiguration use their own generator


class EpochWorld(Protocol):
    """What the reconfiguration parts see of the simulation."""

    options: SimOptions
    membership: Membership
    key_signers: dict[bytes, Signer]
    tick: int

    def add_transaction(self, tx: bytes) -> None: ...


def enter_epoch(node: SimNode, end: EpochEnd) -> None:
    """Make the next epoch durable on `node`'s disk, as part of committing its change
    block: a crash after this restarts the node in the new epoch. Old-epoch blocks kept
    for a restart are dropped: none of them is ever committed."""
    disk = node.disk
    disk.ends[node.epoch] = end
    disk.starts.append((end.membership, end.boundary))
    disk.safety = epoch_safety_state(end.boundary, disk.safety)
    disk.blocks.clear()
    node.durable_epoch = disk.safety.epoch


def checker_of(node: SimNode) -> CertificateChecker:
    """A checker for the newest epoch `node` knows of (members or not, it can judge an
    epoch proof with the keys of that epoch)."""
    if node.active:
        return node.core.checker
    membership, boundary = node.disk.starts[-1]
    verifier = Verifier(SIM_LIMITS.verified_cache_max, node.sim.verify_fn)
    return CertificateChecker(membership, verifier, start_qc(membership.chain_id, boundary))


def proof_for(node: SimNode, epoch: int, from_height: int) -> EpochProof | None:
    """What `node` can prove to a node still in `epoch`: how that epoch ended."""
    end = node.disk.ends.get(epoch)
    if end is None:
        return None
    # As the replica's shell: the proof is a sync answer, bounded by the asker's page.
    reach = epoch_proof_reach(node.sim.options.limits)
    return epoch_proof(epoch, node.disk.committed, end, from_height, reach)


def page_for(node: SimNode, epoch: int, from_height: int) -> SyncResponse | None:
    """A page of `epoch`'s committed chain for a node still in it and too far behind for
    the proof of how it ended (replica/epochs.py `epoch_page`), else None."""
    end = node.disk.ends.get(epoch)
    limits = node.sim.options.limits
    if end is None or not needs_pages(from_height, end, epoch_proof_reach(limits)):
        return None
    start = max(1, from_height)
    top = min(end.boundary.height, start + limits.sync_blocks_max + 1)
    return epoch_page(node.disk.committed[start : top + 1], end, limits)


def take_proof(node: SimNode, proof: EpochProof) -> tuple[list[Block], EpochEnd] | None:
    """The blocks `proof` commits on `node` and how its epoch ended, or None if the proof
    is not for its epoch or does not hold (counted like any dropped message)."""
    if proof.epoch != node.epoch:
        return None
    try:
        blocks, nxt = check_epoch_proof(checker_of(node), node.disk.committed[-1], proof)
    except RemoteError as err:
        if node.active:
            node.core.dropped[err.reason] += 1
        return None
    boundary = blocks[-1]
    suffix = tuple(b for b in proof.blocks if b.height > boundary.height)
    return blocks, EpochEnd(boundary, nxt, suffix, proof.qc)


class Reconfigurer:
    """The owner: commits the scenario's member-set changes, each at a tick drawn from the
    seed, as transactions every member's mempool holds."""

    def __init__(self, world: EpochWorld, make_signer: Callable[[bytes], Signer]) -> None:
        self._world = world
        self._make_signer = make_signer
        options = world.options
        rng = random.Random(options.seed * RECONFIG_SEED_SALT + options.n)
        last = max(1, options.ticks * CHANGE_TICKS_SHARE_PERCENT // 100)
        first = max(1, options.ticks * options.changes_from_percent // 100)
        ticks = sorted(rng.randint(first, last) for _ in options.reconfigure)
        self._due = list(zip(ticks, options.reconfigure, strict=True))
        self._rng = rng
        self._size = options.n
        self.sent: list[Reconfiguration] = []

    def on_tick(self) -> None:
        while self._due and self._due[0][0] <= self._world.tick:
            _, kind = self._due.pop(0)
            record = self._record(kind, len(self.sent))
            self.sent.append(record)
            self._world.add_transaction(record.encode())

    def _key(self, slot: int, change: int) -> bytes:
        chain = self._world.membership.chain_id
        signer = self._make_signer(hashlib.sha256(f"{chain}/{slot}/{change}".encode()).digest())
        self._world.key_signers[signer.public_key] = signer
        return signer.public_key

    def _record(self, kind: str, change: int) -> Reconfiguration:
        """The change, against the member set the changes before it leave."""
        size = self._size
        if kind in ("replace", "rotate"):
            index = self._rng.randrange(size)
            return Reconfiguration(kind, (index,), (self._key(index, change),))
        if kind == "add":
            self._size = size + 3
            keys = tuple(self._key(slot, change) for slot in range(size, size + 3))
            return Reconfiguration(kind, (), keys)
        self._size = size - 3
        return Reconfiguration(kind, tuple(range(size - 3, size)))
