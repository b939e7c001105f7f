"""The member set of every epoch, as a client learns and checks it (`Client.epochs`;
docs/consensus/epochs.md, "Followers: the chain of epochs").

A client knows epoch 0's members from the cluster file. It asks the replicas for the
epoch ends they stored (`EpochEnds`) and checks every answer link by link from what it
already trusts (replica/epochchain.py `extend_epoch_chain`): each change is taken only if
a quorum of the previous member set certified its commit and the owner signed its record.
Of the answers that check it keeps the longest, so a replica that withholds newer epochs
cannot hold the client back; one whose answer does not check is named with the reason.
`EpochFollower` keeps the chain it checked, so the next call checks only the new links.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.membership import MemberEntry, Membership, OwnerRecords
from quorumgate.replica.epochchain import (
    EPOCH_CHAIN_BYTES_MAX,
    EPOCH_CHAIN_EPOCHS_MAX,
    ChainedEpoch,
    EpochChain,
    EpochChainError,
    RawEpochEnd,
    extend_epoch_chain,
)
from quorumgate.sdk.errors import EpochsUnverified
from quorumgate.sidecar.receipts import ReceiptEpoch, ReceiptEpochs

__all__ = [
    "CheckedEpoch",
    "EpochFollower",
    "Epochs",
    "key_fingerprint",
    "load_receipt_epochs",
    "receipt_epochs_from_json",
    "receipt_epochs_of",
]

KEY_FINGERPRINT_HEX_CHARS = 16  # of a public key, in what is shown (never a private key)


def key_fingerprint(public_key: bytes) -> str:
    """A member's public key as shown: its first 8 bytes in hex."""
    return public_key.hex()[:KEY_FINGERPRINT_HEX_CHARS]


@dataclass(frozen=True, slots=True)
class CheckedEpoch:
    """One epoch of the checked chain: its number, the height of the change block that
    ended the epoch before (0 for epoch 0), its members' consensus keys in member order,
    and the replicas whose answer this call proved it (their chain reached it and checked).
    `record_key`: the owner key its member-set records are checked with (docs/consensus/
    epochs.md, "The record key"; empty on a chain that runs no epochs). `receipt_keys`:
    its members' receipt keys, what its certificates are checked with ("Receipt keys")."""

    epoch: int
    boundary_height: int
    boundary_hash: bytes
    keys: tuple[bytes, ...]
    checked_by: tuple[int, ...]
    record_key: bytes = b""
    # Members at new machines by this epoch (`replace` records): index -> replica address.
    moved: tuple[tuple[int, str], ...] = ()
    receipt_keys: tuple[bytes, ...] = ()

    @property
    def members(self) -> int:
        return len(self.keys)

    def as_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "change_height": self.boundary_height,
            "change_block": self.boundary_hash.hex(),
            "members": self.members,
            "keys": [key_fingerprint(k) for k in self.keys],
            "checked_by": list(self.checked_by),
            "record_key": key_fingerprint(self.record_key) if self.record_key else None,
            "moved": {str(i): address for i, address in self.moved},
            # whole public keys: an offline verifier checks certificates with them
            "receipt_keys": [k.hex() for k in self.receipt_keys],
        }


@dataclass(frozen=True, slots=True)
class Epochs:
    """What one `Client.epochs` call found: every epoch from 0, the replicas whose answer
    did not check (with why) and those that did not answer."""

    epochs: tuple[CheckedEpoch, ...]
    refused: Mapping[int, str]
    unanswered: tuple[int, ...]
    chain: EpochChain

    @property
    def current(self) -> CheckedEpoch:
        return self.epochs[-1]

    @property
    def membership(self) -> Membership:
        """The current epoch's member set (the one its consensus signatures name)."""
        return self.chain.current.membership

    @property
    def entries(self) -> tuple[MemberEntry, ...]:
        """The member entries `replace` records carried up to the current epoch (new
        machines: address, receipt key, TLS certificate), checked with the chain."""
        return self.chain.current.entries

    def cluster(self, spec: ClusterSpec) -> ClusterSpec:
        """`spec` (the cluster file's) as the cluster stands in the current epoch: each
        member replaced or added at the address, with the keys and certificate, its record
        gave, and as many members as the epoch has (a `remove` drops the highest)."""
        return spec.with_entries(self.entries, self.membership.n)

    @property
    def receipt_epochs(self) -> ReceiptEpochs:
        """Each epoch's heights and receipt keys: what certificates are checked against
        (sidecar/receipts.py `verify_certificate`)."""
        return ReceiptEpochs(
            tuple(
                ReceiptEpoch(
                    e.epoch,
                    e.boundary_height + 1,
                    nxt.boundary_height if nxt is not None else None,
                    e.receipt_keys,
                )
                for e, nxt in zip(self.epochs, (*self.epochs[1:], None), strict=True)
            )
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.current.epoch,
            "epochs": [e.as_dict() for e in self.epochs],
            "refused": {str(i): why for i, why in sorted(self.refused.items())},
            "unanswered": list(self.unanswered),
        }


def _same(a: ChainedEpoch, b: ChainedEpoch) -> bool:
    ha = a.boundary.hash if a.boundary is not None else b""
    hb = b.boundary.hash if b.boundary is not None else b""
    return a.epoch == b.epoch and ha == hb and a.keys == b.keys


class EpochFollower:
    """The chain of epochs one client checked, from the cluster file's epoch 0. Not shared
    between event loops; `take` is synchronous, so concurrent calls in one loop each
    extend whatever the other left."""

    def __init__(
        self,
        genesis: Membership,
        owner: OwnerRecords | None,
        *,
        receipt_keys: tuple[bytes, ...] = (),
        epochs_max: int = EPOCH_CHAIN_EPOCHS_MAX,
        bytes_max: int = EPOCH_CHAIN_BYTES_MAX,
    ) -> None:
        """`owner`: the records' signer on a chain that runs epochs; None on a chain that
        does not, where any epoch end is refused. `receipt_keys`: epoch 0's (the cluster
        file's), where `owner` does not hold them."""
        self.chain = EpochChain.genesis(genesis)
        self.owner = owner
        # epoch 0's receipt keys, the cluster file's (the reader's, on a chain of epochs)
        self.genesis_receipt_keys = receipt_keys or (
            owner.receipt_keys if owner is not None else ()
        )
        self.epochs_max = epochs_max
        self.bytes_max = bytes_max

    def take(
        self, answers: Mapping[int, Sequence[RawEpochEnd]], unanswered: Sequence[int] = ()
    ) -> Epochs:
        """Check each replica's answer from the chain checked so far, keep the longest that
        checks, and say which replicas proved which epoch. Raises `EpochsUnverified` when
        no answer checks, or when two that check disagree on an epoch."""
        checked: dict[int, EpochChain] = {}
        reach: dict[int, int] = {}  # replica -> the newest epoch its answer vouches for
        refused: dict[int, str] = {}
        for replica, ends in sorted(answers.items()):
            if self.owner is None and ends:
                refused[replica] = "epoch 1: this chain runs no epochs (no_epochs)"
                continue
            try:
                checked[replica] = extend_epoch_chain(
                    self.chain,
                    ends,
                    self.owner,
                    epochs_max=self.epochs_max,
                    bytes_max=self.bytes_max,
                )
            except EpochChainError as err:
                refused[replica] = str(err)
                continue
            reach[replica] = len(ends)
        if not checked:
            raise EpochsUnverified("none_checked", refused)
        longest = max(checked.values(), key=len)
        for replica, chain in checked.items():
            if not all(_same(a, b) for a, b in zip(chain.epochs, longest.epochs, strict=False)):
                raise EpochsUnverified(
                    "fork", {**refused, replica: "two answers that check disagree on an epoch"}
                )
        self.chain = longest
        epochs = tuple(
            CheckedEpoch(
                e.epoch,
                e.boundary_height,
                e.boundary.hash if e.boundary is not None else b"",
                e.keys,
                tuple(r for r in sorted(reach) if reach[r] >= e.epoch),
                e.owner_key or (self.owner.owner_key if self.owner is not None else b""),
                tuple((m.index, f"{m.host}:{m.replica_port}") for m in e.entries),
                e.receipt_keys or self.genesis_receipt_keys,
            )
            for e in longest.epochs
        )
        return Epochs(epochs, refused, tuple(sorted(unanswered)), longest)


def receipt_epochs_of(chain: EpochChain, cluster_keys: Sequence[bytes]) -> ReceiptEpochs:
    """Each epoch of a checked chain with its heights and receipt keys (`cluster_keys`,
    the cluster file's, where no `receipt` record changed them)."""
    epochs = chain.epochs
    return ReceiptEpochs(
        tuple(
            ReceiptEpoch(
                e.epoch,
                e.boundary_height + 1,
                nxt.boundary_height if nxt is not None else None,
                e.receipt_keys or tuple(cluster_keys),
            )
            for e, nxt in zip(epochs, (*epochs[1:], None), strict=True)
        )
    )


def receipt_epochs_from_json(
    doc: Mapping[str, Any], cluster_keys: Sequence[bytes]
) -> ReceiptEpochs:
    """The receipt epochs of a chain-of-epochs file (`quorumgate epochs --json` output,
    which checked the chain when it was written: an offline verifier trusts the file as it
    trusts cluster.json). Raises `ValueError` for a file that is not one."""
    raw = doc.get("epochs")
    if not isinstance(raw, list) or not raw:
        raise ValueError("a chain-of-epochs file holds a non-empty list 'epochs'")
    starts: list[int] = []
    keys: list[tuple[bytes, ...]] = []
    for position, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or entry.get("epoch") != position:
            raise ValueError(f"epochs[{position}] is not epoch {position}")
        height = entry.get("change_height")
        if not isinstance(height, int) or height < 0 or (starts and height <= starts[-1]):
            raise ValueError(f"epoch {position}: change_height must grow")
        hexes = entry.get("receipt_keys") or []
        if not isinstance(hexes, list) or not all(isinstance(h, str) for h in hexes):
            raise ValueError(f"epoch {position}: receipt_keys must be hex strings")
        found = tuple(bytes.fromhex(h) for h in hexes)
        if any(len(k) != 32 for k in found):
            raise ValueError(f"epoch {position}: a receipt key is not 32 bytes")
        starts.append(height)
        keys.append(found or tuple(cluster_keys))
    ends: list[int | None] = [*starts[1:], None]
    return ReceiptEpochs(
        tuple(ReceiptEpoch(i, starts[i] + 1, ends[i], keys[i]) for i in range(len(starts)))
    )


def load_receipt_epochs(path: str | Path, cluster_keys: Sequence[bytes]) -> ReceiptEpochs:
    """`receipt_epochs_from_json` of the file at `path`; `ValueError` for one that is not a
    chain-of-epochs file (or not JSON)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read the epochs file {path}: {err}") from err
    if not isinstance(doc, Mapping):
        raise ValueError(f"the epochs file {path} is not a JSON object")
    return receipt_epochs_from_json(doc, cluster_keys)
