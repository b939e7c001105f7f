"""Epochs: where one member set's consensus ends and the next one's starts.

Pure and deterministic, like the core it serves (docs/consensus/epochs.md has the design
and the safety argument). An epoch ends at its change block: the first committed block
carrying a reconfiguration record (proto/membership.py `Reconfiguration`) that applies to
the epoch's member set. Blocks the old epoch certified after it carry no transactions and
are never committed; the next epoch's tree starts at the change block, with an unsigned
start certificate naming it in place of the genesis QC, at the view after the change
block's. Votes, timeouts and certificates name their epoch in what they sign
(`Membership.signing_id`), so none of them counts in another epoch.

`EpochEnd` is what a core that ended its epoch hands its shell; `EpochProof` is what a
member that moved on hands one that did not: the old epoch's blocks up to and past the
change block with the certificate that commits it, checked with the old members' keys
(as Aptos' epoch-change proofs carry ledger info signed by the previous validator set).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from quorumgate.proto.membership import (
    ENTRY_KINDS,
    MemberEntry,
    Membership,
    OwnerRecords,
    Reconfiguration,
    is_record,
    record_entries,
)
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.config import Limits
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.types import Block, QuorumCert, RemoteError, SyncResponse, genesis_qc

# Blocks one epoch proof may carry: the asker's missing part of the old epoch, the change
# block, and its suffix and proof. A member further behind than this (or than its sync
# page, `epoch_proof_reach`) is handed the old epoch's committed chain a page at a time
# first (`epoch_page`; docs/consensus/epochs.md, "Catching up").
EPOCH_PROOF_BLOCKS_MAX = 4096


def member_receipt_key(
    index: int,
    membership: Membership,
    epoch_keys: Sequence[bytes],
    machine: tuple[bytes, bytes] | None = None,
) -> bytes:
    """The receipt key member `index`'s sidecar signs with in `membership`'s epoch, whose
    members' receipt keys are `epoch_keys` (`OwnerRecords.receipt_keys`, as the committed
    change blocks leave them): the member's, or b"" where the epoch has no member `index`.
    `machine`: a new machine's own (consensus key, receipt key), from its join.json; in an
    epoch before the one whose `replace` or `add` makes it member `index` (the epoch's
    consensus key for `index` is not the machine's) it holds no other key, and signs with
    its own (docs/consensus/epochs.md, "Receipt keys"). The sidecar signs with this key
    and its replica checks its state-root reports with it, both from the same committed
    blocks."""
    if machine is not None and (
        not membership.is_member(index) or membership.key(index) != machine[0]
    ):
        return machine[1]
    return epoch_keys[index] if index < len(epoch_keys) else b""


def start_qc(chain_id: str, boundary: Block | None) -> QuorumCert:
    """The certificate an epoch starts from: the genesis QC for epoch 0, else an unsigned
    one naming the previous epoch's change block (its commit is what proves it)."""
    if boundary is None:
        return genesis_qc(chain_id)
    return QuorumCert(boundary.view, boundary.height, boundary.hash)


def epoch_safety_state(boundary: Block, before: SafetyState) -> SafetyState:
    """A member's safety state as a new epoch starts at `boundary`: locked on and highest at
    the start certificate, nothing signed in the new epoch yet. The persist counter goes on
    from `before`, so that a send is never stamped below what is already durable."""
    qc = start_qc(boundary.chain_id, boundary)
    return SafetyState(before.epoch + 1, boundary.view, qc, qc, boundary.view, None, None, None)


def change_in(
    block: Block, membership: Membership, owner: OwnerRecords | None = None
) -> Membership | None:
    """The member set of the next epoch if `block` carries a reconfiguration record that
    applies to `membership` (the first such record in the block), else None. With
    `owner` (the live replica: docs/consensus/epochs.md, "Who may change the member
    set"), only a record the owner signed for `membership`'s epoch counts."""
    for tx in block.payload:
        if owner is not None:
            nxt = owner.change(tx, membership)
        else:
            record = Reconfiguration.parse(tx)
            nxt = None if record is None else record.apply(membership)
        if nxt is not None:
            return nxt
    return None


def owner_after(block: Block, membership: Membership, owner: OwnerRecords) -> OwnerRecords:
    """The reader of the next epoch's records, `block` being the change block that ends
    `membership`'s epoch (`change_in` found it): its record is the first that changes
    `membership` with `owner`'s key, and an `owner` record hands the next epoch the key it
    names (docs/consensus/epochs.md, "The record key"). Every replica, sidecar and
    follower derives it from the committed change block alone, so all agree on the key
    each epoch's records are checked with."""
    for tx in block.payload:
        step = owner.step(tx, membership)
        if step is not None:
            return step[1]
    raise ValueError(f"the block at height {block.height} does not end epoch {membership.epoch}")


def entries_after(
    block: Block, membership: Membership, owner: OwnerRecords
) -> tuple[MemberEntry, ...]:
    """The member descriptions the change block `block` hands the next epoch (`change_in`
    found it ending `membership`'s epoch): a `replace` record's entries, nothing for the
    other kinds. As `owner_after`, from the committed change block alone, so every replica
    and follower agrees on where each member of an epoch listens and which receipt key and
    TLS certificate it has (docs/consensus/epochs.md, "The live replica")."""
    for tx in block.payload:
        if owner.step(tx, membership) is None:
            continue
        read = owner.read(tx)
        assert read is not None, "step read it"
        return record_entries(read[0]) if read[0].kind in ENTRY_KINDS else ()
    raise ValueError(f"the block at height {block.height} does not end epoch {membership.epoch}")


def one_record_at_most(
    txs: tuple[bytes, ...], owner: OwnerRecords | None = None
) -> tuple[bytes, ...]:
    """`txs` up to (not with) a second reconfiguration record: a leader's batch carries one
    at most, so that no owner change is void for sharing a block with another; the rest
    stay in the mempool for the next block, or the next epoch. With `owner`, anything
    that claims to be a record counts (an unsigned one is refused anyway)."""
    if owner is not None:
        records = [i for i, tx in enumerate(txs) if is_record(tx)]
    else:
        records = [i for i, tx in enumerate(txs) if Reconfiguration.parse(tx) is not None]
    return txs if len(records) < 2 else txs[: records[1]]


def unsigned_record_in(txs: tuple[bytes, ...], owner: OwnerRecords) -> bool:
    """Whether `txs` holds something that claims to be a record without the owner's
    signature: voters refuse such a block (docs/consensus/epochs.md)."""
    return any(is_record(tx) and owner.read(tx) is None for tx in txs)


def record_of_another_epoch(txs: tuple[bytes, ...], owner: OwnerRecords, epoch: int) -> bool:
    """Whether `txs` holds an owner-signed record for an epoch other than `epoch`. Voters
    of `epoch` refuse such a block: a record ends only the epoch it names, so one of
    another epoch would be committed for nothing, and a record offered again after its
    epoch ended (a client retrying a lost acknowledgement) would be committed twice
    (docs/consensus/epochs.md, "Who may change the member set")."""
    for tx in txs:
        read = owner.read(tx) if is_record(tx) else None
        if read is not None and read[1] != epoch:
            return True
    return False


def boundary_index(
    blocks: Sequence[Block], membership: Membership, owner: OwnerRecords | None = None
) -> int | None:
    """The index in `blocks` of the first one that changes `membership`, if any."""
    return next(
        (i for i, b in enumerate(blocks) if change_in(b, membership, owner) is not None), None
    )


@dataclass(frozen=True, slots=True)
class EpochEnd:
    """An epoch ended at its change block `boundary`: the next member set, and the blocks
    past the boundary, oldest first, whose last one `qc` certifies (the 2-chain that
    committed the boundary)."""

    boundary: Block
    membership: Membership
    suffix: tuple[Block, ...]
    qc: QuorumCert


@dataclass(frozen=True, slots=True)
class EpochProof:
    """For a member still in epoch `epoch`: that epoch's committed blocks from some height
    through its change block, then the change block's suffix, whose last block `qc`
    certifies. `check_epoch_proof` says whether it proves the change."""

    epoch: int
    blocks: tuple[Block, ...]
    qc: QuorumCert


def epoch_proof_reach(limits: Limits) -> int:
    """Blocks one epoch proof may carry under `limits`: it travels as a sync answer, which
    the asker bounds by its page (`Limits.sync_blocks_max`)."""
    return min(EPOCH_PROOF_BLOCKS_MAX, limits.sync_blocks_max)


def epoch_proof(
    epoch: int,
    committed: Sequence[Block],
    end: EpochEnd,
    from_height: int,
    reach: int = EPOCH_PROOF_BLOCKS_MAX,
) -> EpochProof:
    """The proof a member that ended epoch `epoch` at `end` gives one whose committed
    chain stops below `from_height`, `reach` blocks at most. `committed` is the whole
    chain it committed."""
    start = max(1, min(from_height, end.boundary.height))
    start = max(start, end.boundary.height + 1 + len(end.suffix) - reach)
    blocks = (*committed[start : end.boundary.height + 1], *end.suffix)
    return EpochProof(epoch, blocks, end.qc)


def needs_pages(from_height: int, end: EpochEnd, reach: int) -> bool:
    """Whether an asker whose first missing height is `from_height` is too far below the
    change block for an epoch proof of `reach` blocks to chain from what it holds."""
    return from_height < end.boundary.height + 1 + len(end.suffix) - reach


def epoch_page(blocks: Sequence[Block], end: EpochEnd, limits: Limits) -> SyncResponse | None:
    """One sync page of an ended epoch's committed chain for a member still in it and too
    far behind for the epoch proof (`needs_pages`): `blocks` are the committed blocks from
    its first missing height on, oldest first, up to the change block at most. The page
    commits at most `limits.sync_blocks_max` blocks (and `sync_bytes_max` payload bytes),
    all below the change block, and proves them as any sync answer does: its proof block
    is the next committed block, in the view after the page's last one, with the QC that
    certifies it (the justify of the block after, or for the change block, of its
    suffix's first block). Nothing but the old members' certificates is asked of the
    asker's trust. None if no block of the window has such a child (every one of them
    was followed by a timeout): then no page can be proven from here."""
    top = end.boundary.height
    chain = [b for b in blocks if b.height <= top]
    if not chain:
        return None
    if chain[-1].height == top:
        chain += end.suffix
    budget, fit = limits.sync_bytes_max, 0
    for block in chain[: limits.sync_blocks_max]:
        budget -= block.payload_bytes
        if budget < 0 and fit > 0:
            break
        fit += 1
    for last in range(fit - 1, -1, -1):
        if chain[last].height >= top or last + 1 >= len(chain):
            continue
        child = chain[last + 1]
        if child.view != chain[last].view + 1:
            continue
        qc = chain[last + 2].justify if last + 2 < len(chain) else end.qc
        if qc.block_hash != child.hash:
            continue
        return SyncResponse(tuple(chain[: last + 1]), (child,), qc, (), top)
    return None


def check_epoch_page(
    membership: Membership, response: SyncResponse, owner: OwnerRecords | None = None
) -> None:
    """Raises `RemoteError` unless `response` is shaped as a page of `membership`'s epoch
    (`epoch_page`): some committed blocks, one proof block and its QC, and no change
    block among what it would commit (the change block may only be its proof block: the
    commit of the change block comes with the epoch proof, `check_epoch_proof`). Its
    certificates are checked by the core, as any sync answer's (`Core.catch_up_from`)."""
    if not response.committed or len(response.proof) != 1 or response.proof_qc is None:
        raise RemoteError("bad_epoch_page", "not one page and its proof")
    if response.pending:
        raise RemoteError("bad_epoch_page", "pending blocks")
    if boundary_index(response.committed, membership, owner) is not None:
        raise RemoteError("bad_epoch_page", "commits the change block")


def is_epoch_page(
    response: SyncResponse, membership: Membership, owner: OwnerRecords | None = None
) -> bool:
    """Whether an answer from a later epoch is a page (`epoch_page`) rather than the epoch
    proof: a proof commits the change block, a page never does."""
    return boundary_index(response.committed, membership, owner) is None


def check_epoch_end(
    checker: CertificateChecker,
    blocks: Sequence[Block],
    qc: QuorumCert,
    owner: OwnerRecords | None = None,
) -> tuple[int, Membership]:
    """The index in `blocks` of the change block they commit, and the next member set.
    `checker` holds the ending epoch's members. Raises `RemoteError` unless `blocks`
    chain, oldest first, the last two form the 2-chain the commit rule asks for
    (consecutive views, each certified by those members: replica/blocktree.py; the last
    by `qc`) and a change block for those members lies before the last. What an epoch
    proof and a stored epoch end (replica/storage.py `epochs`) both prove."""
    membership = checker.membership
    if len(blocks) < 2:
        raise RemoteError("bad_epoch_proof", "fewer than two blocks")
    for prev, block in itertools.pairwise(blocks):
        if block.parent_hash != prev.hash:
            raise RemoteError("bad_epoch_proof", f"gap at height {block.height}")
    b0, b1 = blocks[-2], blocks[-1]
    if b1.view != b0.view + 1:
        raise RemoteError("bad_epoch_proof", "the last two blocks are not a 2-chain")
    checker.check_block_certified(b0, b1.justify)
    checker.check_block_certified(b1, qc)
    cut = boundary_index(blocks[:-1], membership, owner)
    if cut is None:
        raise RemoteError("bad_epoch_proof", "no change block in the committed part")
    nxt = change_in(blocks[cut], membership, owner)
    assert nxt is not None, "boundary_index found it"
    return cut, nxt


def check_epoch_proof(
    checker: CertificateChecker, tip: Block, proof: EpochProof, owner: OwnerRecords | None = None
) -> tuple[list[Block], Membership]:
    """The blocks above `tip` that `proof` commits, up to and with the change block, and
    the next member set. `checker` holds the current (old) epoch's members. Raises
    `RemoteError` unless the proof's blocks chain from `tip` and prove the change
    (`check_epoch_end`)."""
    membership = checker.membership
    if proof.epoch != membership.epoch or len(proof.blocks) < 2:
        raise RemoteError("bad_epoch_proof", f"proof for epoch {proof.epoch}")
    fresh = [b for b in proof.blocks if b.height > tip.height]
    if not fresh or fresh[0].parent_hash != tip.hash:
        raise RemoteError("bad_epoch_proof", "does not chain from our committed block")
    cut, nxt = check_epoch_end(checker, fresh, proof.qc, owner)
    return fresh[: cut + 1], nxt


@dataclass(frozen=True)
class RestoreFence:
    """Where a declared restore fenced: in `epoch`, at view `view` (safety Rule 6). The
    shell keeps it beside the store (`restore-fence`, one line `epoch=E view=F restore=N`)
    with the restore marker, until the restore is discharged (docs/consensus/fencing.md,
    "Across an epoch boundary"). `restore` names the declared restore that fenced (the
    marker's nonce, the shell's): a fence answers for that restore and no other.

    Why a fence in epoch E answers for the epochs after E only if E's change block B has
    a view of at least F - 1: the restored member signed in E+1 before its backup was put
    back only if B was committed before then, by a certificate of E (of a view above B's)
    whose 2f+1 signers each persisted a certificate of B's view or later before signing
    it. Among the 2f+1 answers its fence counted, made after the restore, is one of those
    signers (the argument of Rule 6), so the fence's highest certificate was of B's view
    or later: F - 2 >= B.view. A change block of view F - 1 or later was therefore
    committed after the restore, and the member signed nothing in a later epoch before
    it; a change block of view F - 2 or earlier may have been, and the next epoch must be
    fenced again. Once E has committed a block of view F - 1 or later, its change block,
    whenever it comes, is of a later view still: the restore is discharged."""

    epoch: int
    view: int
    restore: str = ""

    def encode(self) -> str:
        tail = f" restore={self.restore}" if self.restore else ""
        return f"epoch={self.epoch} view={self.view}{tail}\n"

    @staticmethod
    def parse(text: str) -> RestoreFence | None:
        """The fence a file holds, or None if it does not hold exactly one."""
        fields = dict(part.partition("=")[::2] for part in text.split())
        restore = fields.pop("restore", "")
        if set(fields) != {"epoch", "view"} or not all(v.isdigit() for v in fields.values()):
            return None
        if restore and not (len(restore) <= 64 and restore.isalnum() and restore.isascii()):
            return None
        return RestoreFence(int(fields["epoch"]), int(fields["view"]), restore)

    def discharged(self, epoch: int, committed_view: int) -> bool:
        """Whether the restore needs no more fencing: `committed_view` is the view of the
        highest block committed in `epoch` (for an ended epoch, its change block)."""
        return epoch == self.epoch and committed_view >= self.view - 1
