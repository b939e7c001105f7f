"""What the shipper writes, and how it decides what to write (docs/audit.md). Pure: no I/O.

A shipped verdict is a ledger entry (sidecar/ledger.py) with the certificate that f+1
distinct sidecars signed for it (sidecar/receipts.py). The shipper trusts no single
replica: an entry is taken only when f+1 sidecars return it byte for byte (at least one of
them is honest, and honest sidecars hold identical ledgers), only when it links to the
head already shipped, and only with a certificate whose leaf says what the entry says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from quorumgate.sidecar.ledger import ChainVerifier, LedgerEntry
from quorumgate.sidecar.receipts import Certificate, ReceiptLeaf

# The most verdicts one batch (one PostgreSQL transaction) carries.
SHIP_BATCH_VERDICTS_MAX = 200


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the copy ends: the last shipped entry's place and hash ((0, 0) and the genesis
    value before the first), and how many entries were shipped."""

    height: int
    index: int
    head: bytes
    entries: int

    @property
    def started(self) -> bool:
        return self.entries > 0


@dataclass(frozen=True, slots=True)
class ShippedVerdict:
    entry: LedgerEntry
    certificate: Certificate


@dataclass(frozen=True, slots=True)
class Batch:
    chain_id: str
    verdicts: tuple[ShippedVerdict, ...]

    @property
    def key(self) -> str:
        """The same entries always make the same key, so that a batch sent again after a
        crash or a timeout is recognised as the one already written."""
        first, last = self.verdicts[0].entry, self.verdicts[-1].entry
        return f"{self.chain_id}:{first.height}.{first.index}-{last.height}.{last.index}"

    def after(self, cursor: Cursor) -> Cursor:
        last = self.verdicts[-1].entry
        return Cursor(last.height, last.index, last.hash, cursor.entries + len(self.verdicts))


def agreed_entries(answers: Mapping[int, Sequence[LedgerEntry]], needed: int) -> list[LedgerEntry]:
    """The longest run of entries, from the first position on, that at least `needed`
    sidecars returned identically at every position. A lying sidecar's entry differs and
    is not counted; a lagging one's answer is shorter and stops counting where it ends."""
    agreed: list[LedgerEntry] = []
    position = 0
    while True:
        votes: dict[LedgerEntry, int] = {}
        for entries in answers.values():
            if position < len(entries):
                votes[entries[position]] = votes.get(entries[position], 0) + 1
        winner = next((e for e, count in votes.items() if count >= needed), None)
        if winner is None:
            return agreed
        agreed.append(winner)
        position += 1


def linked_prefix(
    chain_id: str, cursor: Cursor, entries: Sequence[LedgerEntry]
) -> tuple[list[LedgerEntry], str]:
    """The entries that continue the chain after `cursor` (each hash recomputed, each place
    following the last, each prev_hash the previous hash), and why the rest does not ('' when
    all do)."""
    verifier = ChainVerifier(chain_id)
    verifier.head = cursor.head
    verifier.last = (cursor.height, cursor.index) if cursor.started else None
    good: list[LedgerEntry] = []
    for entry in entries:
        problem = verifier.feed(entry)
        if problem is not None:
            return good, str(problem)
        good.append(entry)
    return good, ""


def leaf_matches(entry: LedgerEntry, leaf: ReceiptLeaf) -> bool:
    """Whether a certified leaf says what the ledger entry says: every field both carry (a
    leaf names a transaction that answers no proposal by its own id, as
    sidecar/receipts.py `leaf_from_verdict` builds it)."""
    return (
        leaf.height == entry.height
        and leaf.index == entry.index
        and leaf.tx_id == entry.tx_id
        and leaf.proposal_id == (entry.proposal_id or entry.tx_id)
        and leaf.kind == entry.kind
        and leaf.outcome == entry.outcome
        and leaf.reason == entry.reason
        and leaf.target_digest == entry.target_digest
        and leaf.card_digest == entry.card_digest
        and leaf.mandate_version == entry.mandate_version
    )
