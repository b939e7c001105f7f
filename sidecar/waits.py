"""Whose verdicts a recently executed height holds (a pure core; sidecar/node.py keeps one
per recent height), so that a reader waiting at the sidecar is answered, or left waiting,
without a store read per height (the bounds on waiting reads: replica/readwaits.py)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from quorumgate.sidecar.receipts import ReceiptLeaf


@dataclass(frozen=True)
class HeightIndex:
    """Whose verdicts one recently executed height holds, kept in memory so that a
    waiting reader is answered, or left waiting, without a store read per height."""

    proposal_ids: frozenset[bytes]  # what `GetReceipt` looks a verdict up by
    by_tx: dict[bytes, int]  # transaction id -> leaf index
    by_principal: dict[str, tuple[int, ...]]  # principal -> leaf indexes

    @staticmethod
    def of(leaves: Sequence[ReceiptLeaf], principals: Sequence[str]) -> HeightIndex:
        by_principal: dict[str, list[int]] = {}
        for leaf, principal in zip(leaves, principals, strict=True):
            by_principal.setdefault(principal, []).append(leaf.index)
        return HeightIndex(
            proposal_ids=frozenset(leaf.proposal_id for leaf in leaves),
            by_tx={leaf.tx_id: leaf.index for leaf in leaves},
            by_principal={p: tuple(ix) for p, ix in by_principal.items()},
        )

    def mine(self, agent: str | None, own: Collection[bytes]) -> set[int]:
        """The leaf indexes whose principal is `agent` or whose transaction is in `own`."""
        found = set(self.by_principal.get(agent, ())) if agent is not None else set()
        found.update(self.by_tx[t] for t in own if t in self.by_tx)
        return found
