"""Which receipt key signs a block: the one the sidecar's member holds in the block's epoch
(docs/consensus/epochs.md, "Receipt keys").

The sidecar executes every committed block, so it sees each change block: it moves the
member set and the record reader on exactly as the replicas do (replica/epochs.py
`change_in`, `owner_after`), and a `receipt` record leaves the next epoch's receipt keys
in the reader. A block is signed in the epoch it belongs to, the change block in the epoch
it ends; the next block in the epoch after. Nothing of this comes from a clock or from the
sidecar's timing: replay, following the same committed blocks, signs every height in the
same epoch with the same key. After a restart the sidecar starts from its replica's stored
epoch ends (`start_at`), the change blocks of the same committed log.

The key of an epoch is the cluster file's `receipt.key` or a rotated one beside it,
`receipt-<first 16 hex of its public key>.key` (`admin rotate-key --receipt` writes it).

A new machine (`init --join`, docs/consensus/epochs.md "Replacing a member") executes the
whole log from height 1, but holds no key of the member it replaces: the blocks of the
epochs before the one its `replace` starts it signs with its own receipt key
(`signing_receipt_key`). No verifier counts those statements (they are not signed with
that epoch's key), so they certify nothing, and its self-audit checks them with the key
they were signed with.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import (
    ClusterFileError,
    ClusterSpec,
    MemberSpec,
    held_receipt_seeds,
    receipt_seed_for,
    tls_key_for,
)
from quorumgate.proto.membership import Membership, OwnerRecords
from quorumgate.replica.epochs import change_in, entries_after, owner_after
from quorumgate.replica.types import Block
from quorumgate.runtime.channels import Reader


def signing_receipt_key(
    joined: MemberSpec | None, index: int, membership: Membership, epoch_key: bytes
) -> bytes:
    """The receipt key member `index`'s sidecar signs a block of `membership`'s epoch
    with: `epoch_key`, the member's receipt key of that epoch; on a new machine (`joined`,
    its join.json) in an epoch before the one whose `replace` makes it the member (the
    epoch's consensus key for `index` is not the machine's), the machine's own, since it
    holds no other. A missing key of an epoch in which the machine is the member stays an
    error: the operator did not put a rotated key file there. Its replica checks the
    state-root reports by the same rule (replica/epochs.py `member_receipt_key`)."""
    if joined is not None and (
        not membership.is_member(index) or membership.key(index) != joined.public_key
    ):
        return joined.receipt_public_key  # (also before the `add` that brings `index`)
    return epoch_key


class ReceiptKeys:
    """The epoch of the next block a sidecar (or replay) executes, and its receipt key.
    On a chain that runs no epochs (`reader` None) every block is epoch 0's, signed with
    `receipt.key`."""

    def __init__(
        self,
        spec: ClusterSpec,
        index: int,
        node_dir: Path,
        first: SigningKey | None = None,
        own_certificate: bytes = b"",
    ) -> None:
        """`own_certificate`: the TLS certificate of `tls.key` (the sidecar's: cluster.json's
        or join.json's), from which `tls_cert` follows the epochs; empty where nothing is
        served (replay)."""
        self.index = index
        self.node_dir = node_dir
        self.membership: Membership = spec.membership()
        self.reader: OwnerRecords | None = spec.record_reader() if spec.runs_epochs else None
        self._members = spec.members
        self.joined = spec.joined
        # epoch 0's key of the member (the cluster file's), or a new machine's own
        self.genesis_key = signing_receipt_key(
            spec.joined, index, self.membership, spec.member(index).receipt_public_key
        )
        # (epoch, its first height, this member's receipt key in it), oldest first: what
        # the sidecar's self-audit checks each stored statement with (`key_at`)
        self.history: list[tuple[int, int, bytes]] = [(0, 1, self.genesis_key)]
        # The TLS certificate the current epoch names for this member, which the sidecar
        # serves (runtime/channels.py `ServedCertificate`): the cluster file's (or
        # join.json's) until a `replace` record for this index carries another
        # (docs/consensus/epochs.md, "TLS keys").
        self.own_certificate = own_certificate
        self.tls_cert = own_certificate
        self._held: dict[bytes, SigningKey] = {}
        if first is not None:
            self._held[bytes(first.verify_key)] = first

    @property
    def epoch(self) -> int:
        return self.membership.epoch

    @property
    def public_key(self) -> bytes:
        """The receipt key this sidecar signs the current epoch's blocks with: this
        member's in the epoch (`signing_receipt_key`)."""
        keys = () if self.reader is None else self.reader.receipt_keys
        if not keys:
            return self.genesis_key
        if self.index >= len(keys):  # (no member of this epoch: before an `add`, after a
            return self.genesis_key  # `remove`; it signs nothing any member counts)
        epoch_key = keys[self.index]
        return signing_receipt_key(self.joined, self.index, self.membership, epoch_key)

    def key(self) -> SigningKey:
        """The signing key of the current epoch, read from the node directory once;
        `ClusterFileError` if the directory does not hold it (the operator has not put the
        rotated key file there)."""
        return self.signing(self.public_key, self.epoch)

    def signing(self, public: bytes, epoch: int) -> SigningKey:
        """The signing half of `public`, this member's receipt key of `epoch`, read from
        the node directory once; `ClusterFileError` if the directory does not hold it."""
        found = self._held.get(public)
        if found is None:
            seed = receipt_seed_for(self.node_dir, public)
            if seed is None:
                raise ClusterFileError(
                    f"{self.node_dir} holds no receipt key {public.hex()[:16]}, this "
                    f"member's in epoch {epoch}"
                )
            found = self._held[public] = SigningKey(seed)
        return found

    def key_for_height(self, height: int) -> SigningKey:
        """The key that signs what this sidecar states about `height` besides its block
        statement (its state-root report to its replica: replica/sidecar_link.py
        `ReportKeys`), by the same rule: this member's receipt key of the epoch `height`
        belongs to, as far as the blocks followed tell (heights past the last change block
        followed are the current epoch's)."""
        epoch, public = self.history[0][0], self.history[0][2]
        for number, first, key in self.history:
            if first > height:
                break
            epoch, public = number, key
        return self.signing(public, epoch)

    @property
    def readers(self) -> tuple[bytes, ...]:
        """The members' receipt keys of the current epoch: the ones that read this
        sidecar as a member's sidecar (runtime/readauth.py `role_of`). On a chain that
        runs no epochs, the cluster file's."""
        if self.reader is None or not self.reader.receipt_keys:
            return tuple(m.receipt_public_key for m in self._members)
        return self.reader.receipt_keys

    def after(self, block: Block) -> bool:
        """Move on past `block`, executed in the current epoch: True when it is a change
        block, the next block being the next epoch's."""
        if self.reader is None:
            return False
        nxt = change_in(block, self.membership, self.reader)
        if nxt is None:
            return False
        for entry in entries_after(block, self.membership, self.reader):
            if (
                self.own_certificate
                and entry.index == self.index
                and self._holds_tls_key(entry.tls_cert)
            ):
                self.tls_cert = entry.tls_cert
        self.reader = owner_after(block, self.membership, self.reader)
        self.membership = nxt
        self.history.append((nxt.epoch, block.height + 1, self.public_key))
        return True

    def _holds_tls_key(self, cert: bytes) -> bool:
        """Whether this machine holds the key of `cert`: a `replace` of this index that
        describes another machine (before a new machine's own) is not this one's."""
        if not cert:
            return False
        try:
            return tls_key_for(self.node_dir, cert, self.own_certificate) is not None
        except ClusterFileError:
            return True  # (it is there; `ServedCertificate` says what is wrong with it)

    def key_at(self, epoch: int, height: int) -> bytes | None:
        """This member's receipt key of `epoch` if `height` lies in it, as far as the blocks
        followed so far tell (the current epoch has no end yet); None otherwise."""
        for position, (number, first, key) in enumerate(self.history):
            if number != epoch:
                continue
            after = self.history[position + 1][1] if position + 1 < len(self.history) else None
            return key if first <= height and (after is None or height < after) else None
        return None

    def start_at(self, boundaries: Sequence[Block], executed_height: int) -> None:
        """Start after `executed_height`: move on at each change block at or below it,
        oldest first (the replica's stored epoch ends, whose commit the replica proved).
        `ValueError` for one that changes nothing here (the store and the blocks disagree)."""
        for boundary in boundaries:
            if boundary.height > executed_height:
                break
            if not self.after(boundary):
                raise ValueError(
                    f"the stored end of epoch {self.epoch} at height {boundary.height} "
                    "changes nothing"
                )


class ReadKeys:
    """The receipt keys a sidecar (or replay, or a snapshot fetch) opens its reads with:
    a server answers a member's sidecar only to that member's receipt key of the epoch the
    server runs (docs/consensus/epochs.md, "Receipt keys"), which may be ahead of or
    behind the epoch this process knows. So every receipt key the node directory holds is
    a candidate, `first` first; a refusal (`refused`) moves on to the next, round the
    list. A handful of keys at most: one per rotation."""

    def __init__(self, node_dir: Path, first: SigningKey | None = None) -> None:
        self.node_dir = node_dir
        self.keys: list[SigningKey] = [] if first is None else [first]
        self._read()
        if not self.keys:
            raise ClusterFileError(f"{node_dir} holds no receipt key")
        self._at = 0

    def _read(self) -> None:
        """Add the keys the node directory holds now (a rotation writes one beside the
        others while the process runs)."""
        for seed in held_receipt_seeds(self.node_dir):
            key = SigningKey(seed)
            if all(bytes(k.verify_key) != bytes(key.verify_key) for k in self.keys):
                self.keys.append(key)

    @property
    def key(self) -> SigningKey:
        return self.keys[self._at]

    @property
    def reader(self) -> Reader:
        return Reader.of(self.key)

    def prefer(self, public: bytes) -> None:
        """Try `public` next, if held (the key of the epoch this process moved into)."""
        for position, key in enumerate(self.keys):
            if bytes(key.verify_key) == public:
                self._at = position

    def refused(self, err: grpc.aio.AioRpcError | grpc.RpcError) -> bool:
        """After a call failed with `err`: True (and the next key is current) when the
        server refused the key, False for any other failure."""
        if err.code() not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            return False
        self._read()
        self._at = (self._at + 1) % len(self.keys)
        return True
