"""Replay memory for one signer (docs/engine.md, "Transactions"): shared by the replica's
mempool, which refuses a replayed transaction at admission, and the engine, whose state holds one
window per signer and whose verdict is the authority.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NonceWindow:
    """Replay memory for one signer: a low-water mark plus the executed nonces above it.

    A nonce at or below `low_water`, or above `low_water + window`, is refused; so is one
    already in `executed`. Contiguous nonces fold into the low-water mark, so `executed`
    never holds more than `window` entries.
    """

    low_water: int = 0
    executed: set[int] = field(default_factory=set)

    def is_fresh(self, nonce: int, window: int) -> bool:
        return self.low_water < nonce <= self.low_water + window and nonce not in self.executed

    def record(self, nonce: int, window: int) -> None:
        assert self.is_fresh(nonce, window), nonce
        self.executed.add(nonce)
        while self.low_water + 1 in self.executed:
            self.low_water += 1
            self.executed.remove(self.low_water)
        assert len(self.executed) <= window
