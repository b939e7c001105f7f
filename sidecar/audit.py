"""A sidecar checks its own store against its own signed statements (docs/operating.md,
"Self-audit").

An edited store — a stored `deny` receipt and its ledger entry both turned into `allow` —
used to be served as it was, with `diverged=false`; only `ledger verify` and `replay`
noticed. Each executed height has a block statement this sidecar signed with its receipt
key: (chain, height, verdict Merkle root, state root, leaf count). `audit_height` checks,
for one height, that

- the statement's signature is ours (the receipt key's public half is in cluster.json);
- exactly `leaf count` receipts are stored, at indexes 0..n-1, their leaves make the
  signed verdict root and each stored path is the leaf's path in that tree (RFC 6962);
- the ledger holds one entry per leaf, agreeing with it on every field they share, each
  entry's hash recomputes from its content and chains after the one before it.

The sidecar audits the newest `STARTUP_AUDIT_HEIGHTS` heights when it starts, and while it
runs one older height after every height it executes, walking the whole history in turn
(`AuditCursor`); a problem raises the divergence alarm. Someone who can also sign with the
receipt key can forge all of it consistently: that is what replay and the f+1 other
sidecars are for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from quorumgate.sidecar.ledger import LedgerEntry
from quorumgate.sidecar.receipts import ReceiptLeaf, root_and_paths
from quorumgate.sidecar.store import HeightRows, SidecarStore

STARTUP_AUDIT_HEIGHTS = 64  # the newest heights checked before a sidecar executes anything


async def audit_height(
    store: SidecarStore,
    chain_id: str,
    receipt_public_key: bytes,
    height: int,
    key_of: Callable[[int, int], Collection[bytes]] | None = None,
) -> str | None:
    """What does not add up at `height`, or None. Reads one height's rows. `key_of`: our
    receipt keys that may have signed a statement naming (epoch, height) (docs/consensus/
    epochs.md, "Receipt keys"); without it, `receipt_public_key` in every epoch."""
    rows = await store.height_rows(height)  # one read
    return audit_rows(rows, chain_id, receipt_public_key, height, key_of)


def audit_rows(
    rows: HeightRows,
    chain_id: str,
    receipt_public_key: bytes,
    height: int,
    key_of: Callable[[int, int], Collection[bytes]] | None = None,
) -> str | None:
    """`audit_height` of rows already read (`SidecarStore.record` reads them in its own
    trip to the store)."""
    signed, receipts, entries, previous = rows
    if signed is None:
        return f"height {height}: no signed block statement"
    keys = [receipt_public_key] if key_of is None else key_of(signed.epoch, height)
    if not any(signed.signed_by(chain_id, key) for key in keys):
        return (
            f"height {height}: the block statement (epoch {signed.epoch}) is not signed by "
            "our receipt key of that epoch"
        )
    if [r.leaf.index for r in receipts] != list(range(signed.leaf_count)):
        return f"height {height}: {len(receipts)} receipts for {signed.leaf_count} leaves"
    # The leaves' tree is built once (n - 1 node hashes) and every stored path must be the
    # tree's own: equivalent to walking each path up to the root (RFC 6962 paths are
    # unique), at a fraction of the hashing: walking every path costs n log n hashes a
    # height.
    root, paths = root_and_paths([r.leaf.hash(chain_id) for r in receipts])
    if root != signed.verdict_root:
        return f"height {height}: the receipts' leaves do not make the signed verdict root"
    for receipt, path in zip(receipts, paths, strict=True):
        if list(receipt.path) != path or receipt.block != signed:
            return f"height {height}, leaf {receipt.leaf.index}: not under the signed verdict root"
    if len(entries) != len(receipts):
        return f"height {height}: {len(entries)} ledger entries for {len(receipts)} receipts"
    for entry, receipt in zip(entries, receipts, strict=True):
        problem = _entry_disagrees(entry, receipt.leaf, chain_id)
        if problem:
            return f"height {height}, ledger entry {entry.index}: {problem}"
        if entry.prev_hash != previous:
            return f"height {height}, ledger entry {entry.index}: does not chain"
        previous = entry.hash
    return None


def _entry_disagrees(entry: LedgerEntry, leaf: ReceiptLeaf, chain_id: str) -> str:
    if entry.computed_hash(chain_id) != entry.hash:
        return "its hash does not match its content"
    # a leaf names the transaction itself when the verdict answers no proposal (as
    # receipts.leaf_from_verdict does); the ledger keeps the empty proposal id
    if (entry.proposal_id or entry.tx_id) != leaf.proposal_id:
        return "its proposal_id differs from the signed receipt's"
    fields = (
        "index",
        "tx_id",
        "kind",
        "outcome",
        "reason",
        "mandate_version",
        "target_digest",
        "card_digest",
    )
    for name in fields:
        if getattr(entry, name) != getattr(leaf, name):
            return f"its {name} differs from the signed receipt's"
    return ""


@dataclass
class AuditCursor:
    """Which older height to audit next: `first_height` (1, or the first height after the
    checkpoint of a store installed from a snapshot: nothing below it is held), then up to
    the executed height, then again from the first. Deterministic, and O(1) work per
    executed height."""

    next_height: int = 1
    first_height: int = 1

    def take(self, executed_height: int) -> int | None:
        if executed_height < self.first_height:
            return None
        if not self.first_height <= self.next_height <= executed_height:
            self.next_height = self.first_height
        height = self.next_height
        self.next_height += 1
        return height
