"""Reconfiguration in the simulator: the owner's member-set changes, committed at random
ticks, and what a node's shell does around an epoch boundary (docs/consensus/epochs.md):
make the next epoch durable with the change block's commit, start that epoch's core,
and hand a node still in an old epoch the proof that it ended."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from quorumgate.proto.crypto import Ed25519Signer, Signer, Verifier
from quorumgate.proto.membership import (
    RECONFIG_KINDS,
    Membership,
    OwnerRecords,
    Reconfiguration,
    owner_record,
    sign_record,
)
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.core import Core
from quorumgate.replica.epochs import (
    EpochEnd,
    EpochProof,
    check_epoch_page,
    check_epoch_proof,
    epoch_page,
    epoch_proof,
    epoch_proof_reach,
    epoch_safety_state,
    needs_pages,
    start_qc,
)
from quorumgate.replica.sim.node import SimNode
from quorumgate.replica.sim.options import SIM_LIMITS, SimOptions, SimulationFailure
from quorumgate.replica.types import Block, RemoteError, SyncResponse
from quorumgate.replica.validate import check_sync_response

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

    def fail(self, message: str) -> SimulationFailure: ...


def owner_signer(chain_id: str, generation: int) -> Ed25519Signer:
    """The owner's record key after `generation` owner records (0: the cluster file's).
    Real Ed25519 even with the fast stand-in for consensus keys: `OwnerRecords` checks
    records and proofs of possession with Ed25519."""
    return Ed25519Signer(hashlib.sha256(f"{chain_id}/owner/{generation}".encode()).digest())


def first_records(options: SimOptions, chain_id: str) -> OwnerRecords | None:
    """The reader of epoch 0's records of a run whose records are signed, else None (the
    owner is trusted and a bare record counts). Every kind counts: the simulator carries
    out the kinds the live replica does not yet (docs/consensus/epochs.md)."""
    if not options.signed_records:
        return None
    owner_key = owner_signer(chain_id, 0).public_key
    return OwnerRecords(chain_id, owner_key, kinds=RECONFIG_KINDS, general=True)


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
        blocks, nxt = check_epoch_proof(
            checker_of(node), node.disk.committed[-1], proof, node.owner_records()
        )
    except RemoteError as err:
        if node.active:
            node.core.dropped[err.reason] += 1
        return None
    boundary = blocks[-1]
    suffix = tuple(b for b in proof.blocks if b.height > boundary.height)
    return blocks, EpochEnd(boundary, nxt, suffix, proof.qc)


def follow_page(node: SimNode, page: SyncResponse) -> list[Block] | None:
    """The blocks a page of an ended epoch's chain commits on `node`, a node that is no
    member of the epoch it is in and only follows (a member's core takes pages itself:
    `Core.catch_up_from`), or None if it does not hold. Checked as the core checks one,
    with the epoch's keys: its shape, every block extending the one before from what
    `node` committed with a justify that certifies it, and the proof block, in the view
    right after the page's last block, certified by the page's QC: a 2-chain, so the
    page's blocks are committed. Without it a node added after a long epoch it did not
    belong to could never reach the epoch that makes it a member."""
    membership = node.disk.membership
    checker = checker_of(node)
    tip = node.disk.committed[-1]
    blocks = [*page.committed, *page.proof]
    try:
        check_sync_response(page, membership, node.sim.options.limits)
        check_epoch_page(membership, page, node.owner_records())
        assert page.proof_qc is not None, "check_epoch_page"
        parent = tip
        for block in blocks:
            if block.chain_id != membership.chain_id or block.parent_hash != parent.hash:
                raise RemoteError("sync_gap", f"block at height {block.height} does not chain")
            if (block.justify.height, block.justify.view) != (parent.height, parent.view):
                raise RemoteError("malformed", "sync block justify does not match its parent")
            if block.height > 1 + tip.height:
                checker.check_qc(block.justify)
            parent = block
        if blocks[-1].view != blocks[-2].view + 1:
            raise RemoteError("bad_epoch_page", "the proof block is not in the next view")
        checker.check_block_certified(blocks[-1], page.proof_qc)
    except RemoteError:
        return None
    return list(page.committed)


class Reconfigurer:
    """The owner: commits the scenario's member-set changes, each at a tick drawn from the
    seed, as transactions every member's mempool holds. Where records are signed
    (`SimOptions.signed_records`), change k is signed for epoch k with the record key in
    force then, and an `owner` change hands that key to a new one. A thief then holds the
    key it retired: it offers, for every later epoch, a record signed with that key that
    would give member 0's seat to a key of its own. None of them may change anything
    (docs/consensus/epochs.md, "The record key"); `check_epoch` and `check_core` say so."""

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
        chain = world.membership.chain_id
        self._signed = options.signed_records
        # The member set each epoch must have, as the owner's records give it, epoch 0's
        # first; and per epoch the record key in force (signed runs only).
        self.expected: list[Membership] = [world.membership]
        self.owner_keys: list[Ed25519Signer] = [owner_signer(chain, 0)]
        # (the first epoch it is retired in, the key) for every key an owner record retired
        self.retired: list[tuple[int, Ed25519Signer]] = []
        self.thief_key = hashlib.sha256(f"{chain}/thief".encode()).digest()
        self._probes: dict[tuple[int, bytes], bytes] = {}

    def on_tick(self) -> None:
        while self._due and self._due[0][0] <= self._world.tick:
            _, kind = self._due.pop(0)
            change = len(self.sent)
            record = self._record(kind, change)
            self.sent.append(record)
            previous = self.expected[-1]
            nxt = (
                replace(previous, epoch=previous.epoch + 1)
                if kind == "owner"
                else record.apply(previous)
            )
            assert nxt is not None, "the owner's changes fit the member sets they meet"
            self.expected.append(nxt)
            if not self._signed:
                self._world.add_transaction(record.encode())
                continue
            owner = self.owner_keys[change]
            chain = self._world.membership.chain_id
            self._world.add_transaction(sign_record(record, chain, change, owner.sign))
            if kind == "owner":
                self.owner_keys.append(owner_signer(chain, change + 1))
                self.retired.append((change + 1, owner))
                for epoch in range(change + 1, len(self._world.options.reconfigure) + 1):
                    self._world.add_transaction(self._thief_record(epoch, owner))
            else:
                self.owner_keys.append(owner)

    def _thief_record(self, epoch: int, key: Ed25519Signer) -> bytes:
        """Member 0's seat handed to the thief's key, for `epoch`, signed with `key`."""
        found = self._probes.get((epoch, key.public_key))
        if found is None:
            record = Reconfiguration("rotate", (0,), (self.thief_key,))
            chain = self._world.membership.chain_id
            found = sign_record(record, chain, epoch, key.sign)
            self._probes[(epoch, key.public_key)] = found
        return found

    def check_epoch(self, index: int, membership: Membership) -> None:
        """A node entered an epoch: its member set must be the one the owner's records
        give, in order (a record signed with a retired key, committed, would show here)."""
        epoch = membership.epoch
        if epoch >= len(self.expected) or self.expected[epoch] != membership:
            raise self._world.fail(
                f"SAFETY: node {index} entered epoch {epoch} with members the owner's "
                "records do not give (a record the owner did not sign with the key in "
                "force changed them)"
            )

    def check_core(self, core: Core) -> None:
        """A core started in a later epoch (signed runs): a record signed with any key an
        owner record retired before its epoch is no change there, and the same record
        signed with the epoch's key applies (docs/consensus/epochs.md, "The record key")."""
        records = core.owner_records
        if not self._signed or records is None:
            return
        epoch, members = core.epoch, core.membership
        for since, key in self.retired:
            if since > epoch:
                continue
            stale = self._thief_record(epoch, key)
            if records.read(stale) is not None or records.change(stale, members) is not None:
                raise self._world.fail(
                    f"SAFETY: node {core.me}'s core of epoch {epoch} takes a record signed "
                    f"with the owner key retired at the end of epoch {since - 1}"
                )
        in_force = self._thief_record(epoch, self.owner_keys[epoch])
        if records.change(in_force, members) is None:
            raise self._world.fail(
                f"OWNER: node {core.me}'s core of epoch {epoch} refuses a record signed with "
                "the record key in force"
            )

    def _key(self, slot: int, change: int) -> bytes:
        chain = self._world.membership.chain_id
        signer = self._make_signer(hashlib.sha256(f"{chain}/{slot}/{change}".encode()).digest())
        self._world.key_signers[signer.public_key] = signer
        return signer.public_key

    def _record(self, kind: str, change: int) -> Reconfiguration:
        """The change, against the member set the changes before it leave. An `owner`
        record names the next record key, with that key's proof of possession."""
        size = self._size
        if kind == "owner":
            chain = self._world.membership.chain_id
            old, new = self.owner_keys[change], owner_signer(chain, change + 1)
            return owner_record(chain, change, old.public_key, new.public_key, new.sign)
        if kind in ("replace", "rotate"):
            index = self._rng.randrange(size)
            return Reconfiguration(kind, (index,), (self._key(index, change),))
        if kind == "add":
            self._size = size + 3
            keys = tuple(self._key(slot, change) for slot in range(size, size + 3))
            return Reconfiguration(kind, (), keys)
        self._size = size - 3
        return Reconfiguration(kind, tuple(range(size - 3, size)))
