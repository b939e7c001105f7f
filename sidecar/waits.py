"""Whose verdicts a recently executed height holds (a pure core; sidecar/node.py keeps one
per recent height), so that a reader waiting at the sidecar is answered, or left waiting,
without a store read per height (the bounds on waiting reads: runtime/readwaits.py)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cached_property

from quorumgate.sidecar.receipts import ReceiptLeaf


@dataclass(frozen=True)
class HeightIndex:
    """Whose verdicts one recently executed height holds, kept in memory so that a
    waiting reader is answered, or left waiting, without a store read per height. Its
    maps are built the first time a reader asks (a height nobody waits on costs none)."""

    leaves: Sequence[ReceiptLeaf]
    principals: Sequence[str]  # each leaf's verdict's principal

    @staticmethod
    def of(leaves: Sequence[ReceiptLeaf], principals: Sequence[str]) -> HeightIndex:
        if len(leaves) != len(principals):
            raise ValueError("one principal per leaf")
        return HeightIndex(leaves, principals)

    @cached_property
    def proposal_ids(self) -> frozenset[bytes]:
        """What `GetReceipt` looks a verdict up by."""
        return frozenset(leaf.proposal_id for leaf in self.leaves)

    @cached_property
    def _by_tx(self) -> dict[bytes, int]:
        return {leaf.tx_id: leaf.index for leaf in self.leaves}

    @cached_property
    def _by_principal(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for leaf, principal in zip(self.leaves, self.principals, strict=True):
            out.setdefault(principal, []).append(leaf.index)
        return out

    def mine(self, agent: str | None, own: Collection[bytes]) -> set[int]:
        """The leaf indexes whose principal is `agent` or whose transaction is in `own`."""
        found = set(self._by_principal.get(agent, ())) if agent is not None else set()
        by_tx = self._by_tx
        found.update(by_tx[t] for t in own if t in by_tx)
        return found
