"""Per-block certificates from the sidecars' `Receipts` streams, as the observer builds them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.sidecar.receipts import (
    Certificate,
    CertificateError,
    ReceiptEpochs,
    merkle_root,
    receipt_keys_at,
    verify_certificate,
)
from quorumgate.sidecar.wire import leaf_from_pb, receipt_from_pb

HEIGHTS_PENDING_MAX = 4096  # blocks waiting for receipts, in the certifier


@dataclass
class _Height:
    # signer -> receipts of this block, in arrival (= index) order
    receipts: dict[int, list[spb.Receipt]] = field(default_factory=dict)
    bad: set[int] = field(default_factory=set)


@dataclass
class CertifierCounts:
    certified_blocks: int = 0
    certified_leaves: int = 0
    failures: int = 0  # statements or leaf sets that did not verify
    dropped_heights: int = 0  # over HEIGHTS_PENDING_MAX, oldest dropped


class BlockCertifier:
    """Per-block certificates from the sidecars' `Receipts` streams (one receipt per leaf
    per sidecar; each carries its sidecar's signed block statement).

    A block is certified once f+1 distinct sidecars have sent *all* their receipts of it
    and agree on the statement (verdict root, state root, leaf count): `verify_certificate`
    on the first leaf checks the f+1 signatures and its path, and the Merkle root of all
    the leaves (RFC 6962, `quorumgate.sidecar.receipts.merkle_root`) must equal the signed verdict
    root, which puts every leaf of the block under signatures already checked. So a block
    costs f+1 Ed25519 verifications and one pass of hashing, whatever its size. Receipts of
    sidecars outside the chosen group are never decoded beyond their statement.

    Each statement is checked against the epoch it names (`epochs`, the chain of epochs
    `Client.epochs` checked: that epoch's receipt keys, its f and its heights; docs/
    consensus/epochs.md, "Receipt keys"); without `epochs`, the cluster file's keys in
    every epoch, the guarantee of a verifier without the chain.
    """

    def __init__(
        self,
        chain_id: str,
        receipt_keys: Sequence[bytes],
        *,
        receipts_expire: bool,
        epochs: ReceiptEpochs | None = None,
    ) -> None:
        self.chain_id = chain_id
        self.receipt_keys = tuple(receipt_keys)
        self.receipts_expire = receipts_expire  # the chain's: statements sign a window
        self.epochs = epochs or ReceiptEpochs.genesis(self.receipt_keys)
        # the signer indexes some epoch has (a grow to 7 brings 4..6)
        self.n = max(len(e.keys) for e in self.epochs.epochs)
        self.heights: dict[int, _Height] = {}
        self.done_below = 0  # every height below this is certified or given up
        self.done: set[int] = set()
        self.counts = CertifierCounts()

    def add(self, signer: int, receipt: spb.Receipt) -> list[tuple[bytes, str]] | None:
        """Take one receipt from sidecar `signer`'s stream; when it completes a certified
        block, return that block's leaves as (tx id, "outcome/reason")."""
        height = receipt.leaf.height
        if not 0 <= signer < self.n or height < self.done_below or height in self.done:
            return None
        h = self.heights.get(height)
        if h is None:
            h = self.heights[height] = _Height()
            self._bound()
        mine = h.receipts.setdefault(signer, [])
        if len(mine) >= receipt.leaf_count or signer in h.bad:
            return None
        mine.append(receipt)
        if len(mine) < receipt.leaf_count:
            return None
        return self._try_certify(height, h)

    def _statement(self, receipts: list[spb.Receipt]) -> tuple[bytes, bytes, int, bytes, int]:
        first = receipts[0]
        window = first.validity.SerializeToString() if first.HasField("validity") else b""
        return (first.verdict_root, first.state_root, first.leaf_count, window, first.epoch)

    def _try_certify(self, height: int, h: _Height) -> list[tuple[bytes, str]] | None:
        complete = [
            s
            for s, rs in h.receipts.items()
            if s not in h.bad and rs and len(rs) == rs[0].leaf_count
        ]
        groups: dict[tuple[bytes, bytes, int, bytes, int], list[int]] = {}
        for s in complete:
            groups.setdefault(self._statement(h.receipts[s]), []).append(s)
        for (verdict_root, state_root, leaf_count, _, epoch), signers in groups.items():
            try:
                keys = receipt_keys_at(self.epochs, epoch, height)
            except CertificateError:
                continue  # an epoch, or a height, these epochs do not hold: nothing counts
            f = (len(keys) - 1) // 3
            if len(signers) < f + 1:
                continue
            chosen = sorted(signers)[: f + 1]
            receipts = h.receipts[chosen[0]]
            leaves = [leaf_from_pb(r.leaf) for r in receipts]
            ok = all(leaf.height == height and leaf.index == i for i, leaf in enumerate(leaves))
            try:
                validity = receipt_from_pb(receipts[0]).block.validity
            except CertificateError:
                validity, ok = None, False
            cert = Certificate(
                chain_id=self.chain_id,
                leaf=leaves[0],
                path=tuple(receipts[0].path),
                leaf_count=leaf_count,
                verdict_root=verdict_root,
                state_root=state_root,
                signatures=tuple((s, h.receipts[s][0].signature) for s in chosen),
                validity=validity,
                epoch=epoch,
            )
            try:
                if not ok:
                    raise CertificateError("bad_leaf", "leaves out of order")
                verify_certificate(
                    cert,
                    self.chain_id,
                    self.receipt_keys,
                    receipts_expire=self.receipts_expire,
                    epochs=self.epochs,
                )
                root = merkle_root([leaf.hash(self.chain_id) for leaf in leaves])
                if root != verdict_root:
                    raise CertificateError("bad_path", "leaves do not hash to the verdict root")
            except CertificateError:
                self.counts.failures += 1
                self._exclude_bad(h, chosen, keys)
                continue
            self._finish(height)
            self.counts.certified_blocks += 1
            self.counts.certified_leaves += len(leaves)
            return [(leaf.tx_id, f"{leaf.outcome}/{leaf.reason}") for leaf in leaves]
        return None

    def _exclude_bad(self, h: _Height, chosen: list[int], keys: Sequence[bytes]) -> None:
        """A group failed: find which members' statements or leaves are bad (the rare
        path: one signature each, with `keys`, the receipt keys of the epoch the group's
        statement names) and stop counting them for this height."""
        for s in chosen:
            rs = h.receipts[s]
            first = rs[0]
            try:
                block = receipt_from_pb(first).block
                if (block.validity is not None) != self.receipts_expire:
                    raise ValueError("validity")
                message = block.statement(self.chain_id)
                from nacl.signing import VerifyKey

                VerifyKey(keys[s]).verify(message, first.signature)
                leaves = [leaf_from_pb(r.leaf) for r in rs]
                root = merkle_root([leaf.hash(self.chain_id) for leaf in leaves])
                if root != first.verdict_root or first.signer != s:
                    raise ValueError("leaves")
            except Exception:
                h.bad.add(s)
                h.receipts[s] = []

    def _finish(self, height: int) -> None:
        del self.heights[height]
        self.done.add(height)
        while self.done_below in self.done or self.done_below == 0:
            self.done.discard(self.done_below)
            self.done_below += 1
        # `done` holds certified heights above a gap (an empty block has no receipts, so
        # gaps are normal): keep it bounded by forgetting far-below heights.
        if len(self.done) > HEIGHTS_PENDING_MAX:
            floor = max(self.done) - HEIGHTS_PENDING_MAX
            self.done = {x for x in self.done if x > floor}
            self.done_below = max(self.done_below, floor + 1)

    def _bound(self) -> None:
        while len(self.heights) > HEIGHTS_PENDING_MAX:
            del self.heights[min(self.heights)]
            self.counts.dropped_heights += 1
