"""The chain of epochs, checked link by link from the cluster file: what a follower that
holds no blocks (a client, a tool built on the SDK) learns of each epoch's member set.

Pure: no I/O, no clock. From epoch 0's member set (the cluster file's) and the epoch ends
a replica stored (replica/storage.py `epochs`, as its `EpochEnds` call returns them),
`extend_epoch_chain` checks each end with the member keys of the epoch it ends: the change
block carries a record the owner signed for that epoch, and its commit is proved by the
2-chain the old quorum certified (replica/epochs.py `check_epoch_end`). The next member
set is taken from the change block's record, never from the keys the replica claims;
those must equal it. This is a light client in the sense of CometBFT's (a header is taken
only if signed by enough of the validator set the client already trusts) and of Aptos'
epoch-change proofs (ledger info naming the next validator set, signed by a quorum of the
previous one). docs/consensus/epochs.md, "Followers: the chain of epochs", has what is
checked, what is trusted and the bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from quorumgate.proto.crypto import Verifier
from quorumgate.proto.membership import PUBLIC_KEY_BYTES, MemberEntry, Membership, OwnerRecords
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.epochs import (
    change_in,
    check_epoch_end,
    entries_after,
    owner_after,
    start_qc,
)
from quorumgate.replica.types import Block, RemoteError
from quorumgate.replica.wire import decode_epoch_end

# Epoch ends one answer may carry. A live chain changes its member set by an owner's
# command, a handful of times in its life; a thousand is far past any honest answer and
# keeps a liar from making a client check signatures without end.
EPOCH_CHAIN_EPOCHS_MAX = 1_024
# Bytes of one answer's epoch ends (keys and encoded ends together). A change block is
# one committed block with its transactions; a few of them fit many times over.
EPOCH_CHAIN_BYTES_MAX = 64 * 1024 * 1024
# Signatures found valid, remembered per epoch: a QC's signers, once each.
_VERIFIED_CACHE_MAX = 256


class RawEpochEnd(Protocol):
    """One stored epoch end as the wire carries it (`qgpb.StoredEpochEnd`): the epoch it
    started, its members' keys (32 bytes each, in member order), and how the epoch before
    ended (replica/wire.py `encode_epoch_end`)."""

    @property
    def epoch(self) -> int: ...

    @property
    def keys(self) -> bytes: ...

    @property
    def ended(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class PlainEpochEnd:
    """A `RawEpochEnd` built by hand (tests, a store read directly)."""

    epoch: int
    keys: bytes
    ended: bytes


class EpochChainError(ValueError):
    """An answer that does not check: `epoch` is the epoch whose start (the end of the one
    before) is at fault, `reason` a machine-readable word, the message a sentence."""

    def __init__(self, epoch: int, reason: str, detail: str) -> None:
        super().__init__(f"epoch {epoch}: {detail} ({reason})")
        self.epoch = epoch
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class ChainedEpoch:
    """One epoch of a checked chain: its member set (`membership.epoch` is its number),
    the change block that ended the epoch before it (None for epoch 0), and the owner key
    its records are checked with where an earlier record handed it over (docs/consensus/
    epochs.md, "The record key"; None: the reader's own key, the cluster file's, as in
    epoch 0 and every epoch before an owner record, or bare records in the simulator).
    `receipt_keys`: the members' receipt keys in this epoch where a `receipt` record
    before it changed one ("Receipt keys"; empty: the reader's own, the cluster file's)."""

    membership: Membership
    boundary: Block | None
    owner_key: bytes | None = None
    # The member entries `replace` records carried up to this epoch, the newest for each
    # member replaced, by index (docs/consensus/epochs.md, "Replacing a member"): where
    # each new machine listens, its receipt key and TLS certificate. The others are the
    # cluster file's.
    entries: tuple[MemberEntry, ...] = ()
    receipt_keys: tuple[bytes, ...] = ()

    @property
    def epoch(self) -> int:
        return self.membership.epoch

    @property
    def boundary_height(self) -> int:
        """The height of the change block this epoch starts after (0 for epoch 0)."""
        return 0 if self.boundary is None else self.boundary.height

    @property
    def keys(self) -> tuple[bytes, ...]:
        return tuple(m.public_key for m in self.membership.members)


@dataclass(frozen=True, slots=True)
class EpochChain:
    """Epochs 0..k, each checked with the one before, from the cluster file's epoch 0."""

    epochs: tuple[ChainedEpoch, ...]

    @staticmethod
    def genesis(membership: Membership) -> EpochChain:
        """The trusted start: epoch 0's member set, as the cluster file names it."""
        if membership.epoch != 0:
            raise ValueError("a chain of epochs starts at epoch 0")
        return EpochChain((ChainedEpoch(membership, None),))

    @property
    def current(self) -> ChainedEpoch:
        return self.epochs[-1]

    def __len__(self) -> int:
        return len(self.epochs)


def extend_epoch_chain(
    trusted: EpochChain,
    ends: Sequence[RawEpochEnd],
    owner: OwnerRecords | None,
    *,
    epochs_max: int = EPOCH_CHAIN_EPOCHS_MAX,
    bytes_max: int = EPOCH_CHAIN_BYTES_MAX,
) -> EpochChain:
    """`trusted` extended by the epoch ends of one answer (every epoch after 0 the replica
    started, oldest first), each new one checked with the member set before it; raises
    `EpochChainError` naming the first epoch that does not check. Ends of epochs `trusted`
    already holds are not checked again, only compared with it: one that differs is
    refused (`conflict`). An answer that stops short of `trusted` is not refused (a
    replica behind): `trusted` comes back. `owner`: only records the owner signed count,
    as on a chain that runs epochs (None: the simulator's bare records); its key is
    epoch 0's, the cluster file's, and each link carries the record key on as its change
    block's record leaves it (an `owner` record hands over to the key it names), so that
    every record is checked with the key in force in its epoch."""
    if len(ends) > epochs_max:
        raise EpochChainError(
            epochs_max + 1,
            "too_many",
            f"the answer holds {len(ends)} epoch ends, over {epochs_max}",
        )
    total = 0
    for end in ends:
        total += len(end.keys) + len(end.ended)
        if total > bytes_max:
            raise EpochChainError(
                int(end.epoch), "too_large", f"the answer's epoch ends exceed {bytes_max} bytes"
            )
    epochs = list(trusted.epochs)
    for position, end in enumerate(ends, start=1):
        number = int(end.epoch)
        if number != position:
            reason = "gap" if number > position else "repeat"
            raise EpochChainError(
                number,
                reason,
                f"the answer's epoch ends must be epochs 1, 2, ... in order; "
                f"found epoch {number} where epoch {position} belongs",
            )
        if number < len(epochs):
            _same_as_trusted(epochs[number], end)
            continue
        epochs.append(check_link(epochs[-1], end, owner))
    return EpochChain(tuple(epochs))


def check_link(
    previous: ChainedEpoch, end: RawEpochEnd, owner: OwnerRecords | None
) -> ChainedEpoch:
    """The epoch after `previous`, from the stored end of `previous`, checked with
    `previous`'s member keys and its record key (`owner` with `previous.owner_key`);
    raises `EpochChainError` naming the new epoch."""
    owner = reader_of(previous, owner)
    old = previous.membership
    number = old.epoch + 1
    if int(end.epoch) != number:
        raise EpochChainError(int(end.epoch), "gap", f"does not follow epoch {old.epoch}")
    claimed = _split_keys(number, end.keys)
    try:
        boundary, suffix, qc = decode_epoch_end(old.chain_id, end.ended)
    except (RemoteError, ValueError) as err:
        raise EpochChainError(
            number, "undecodable", f"the end of epoch {old.epoch}: {err}"
        ) from err
    if boundary.height <= previous.boundary_height:
        raise EpochChainError(
            number,
            "not_after",
            f"the change block at height {boundary.height} is not above epoch {old.epoch}'s "
            f"start at height {previous.boundary_height}",
        )
    # The record first, for the clearer reason: a change block of another chain (or a
    # forged one) carries no record the owner signed for this chain and epoch.
    nxt = change_in(boundary, old, owner)
    if nxt is None:
        raise EpochChainError(
            number,
            "no_change",
            f"the change block at height {boundary.height} carries no record "
            f"{'the owner signed ' if owner is not None else ''}for chain {old.chain_id!r}, "
            f"epoch {old.epoch}, that applies to its members",
        )
    checker = CertificateChecker(
        old, Verifier(_VERIFIED_CACHE_MAX), start_qc(old.chain_id, previous.boundary)
    )
    try:
        cut, proved = check_epoch_end(checker, (boundary, *suffix), qc, owner)
    except RemoteError as err:
        raise EpochChainError(
            number,
            "not_certified",
            f"the commit of the change block at height {boundary.height} is not proved by a "
            f"quorum of epoch {old.epoch}'s {old.n} members: {err}",
        ) from err
    if cut != 0 or proved != nxt:
        raise EpochChainError(
            number, "not_certified", "the stored suffix carries a change of its own"
        )
    keys = tuple(m.public_key for m in nxt.members)
    if claimed != keys:
        raise EpochChainError(
            number,
            "keys_differ",
            f"the replica's keys for epoch {number} are not those the change block's record gives",
        )
    owner_key, receipt_keys = previous.owner_key, previous.receipt_keys
    entries = previous.entries
    if owner is not None:
        moved = {e.index: e for e in (*entries, *entries_after(boundary, old, owner))}
        entries = tuple(moved[i] for i in sorted(moved))
        if (handed := owner_after(boundary, old, owner)) != owner:
            if handed.owner_key != owner.owner_key:
                owner_key = handed.owner_key
            if handed.receipt_keys != owner.receipt_keys:
                receipt_keys = handed.receipt_keys
    return ChainedEpoch(nxt, boundary, owner_key, entries, receipt_keys)


def reader_of(epoch: ChainedEpoch, owner: OwnerRecords | None) -> OwnerRecords | None:
    """The reader of `epoch`'s records: `owner` (the cluster file's, epoch 0's) with the
    record key and receipt keys the change blocks before `epoch` left (docs/consensus/
    epochs.md, "The record key", "Receipt keys"); None stays None."""
    if owner is not None and epoch.owner_key is not None:
        owner = replace(owner, owner_key=epoch.owner_key)
    if owner is not None and epoch.receipt_keys:
        owner = replace(owner, receipt_keys=epoch.receipt_keys)
    return owner


def _split_keys(number: int, keys: bytes) -> tuple[bytes, ...]:
    if not keys or len(keys) % PUBLIC_KEY_BYTES:
        raise EpochChainError(number, "undecodable", f"the keys of epoch {number} are damaged")
    return tuple(keys[i : i + PUBLIC_KEY_BYTES] for i in range(0, len(keys), PUBLIC_KEY_BYTES))


def _same_as_trusted(known: ChainedEpoch, end: RawEpochEnd) -> None:
    """An end of an epoch already checked must be the one checked: the same change block
    and the same keys (two different ends of one epoch, each certified, would need more
    than f faulty members in it)."""
    number = known.epoch
    assert known.boundary is not None, "epoch 0 has no stored end"
    try:
        boundary, _, _ = decode_epoch_end(known.membership.chain_id, end.ended)
    except (RemoteError, ValueError) as err:
        raise EpochChainError(
            number, "undecodable", f"the end of epoch {number - 1}: {err}"
        ) from err
    if boundary.hash != known.boundary.hash or _split_keys(number, end.keys) != known.keys:
        raise EpochChainError(
            number,
            "conflict",
            f"the answer's start of epoch {number} differs from the one already checked "
            f"(change block at height {known.boundary.height})",
        )
