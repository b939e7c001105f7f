"""Which nonces a client may sign with next: pure bookkeeping, no I/O.

The engine accepts a signer's nonce only inside its window: above the low-water mark of
nonces it executed and at most `NONCE_WINDOW` beyond it (docs/engine.md, `proto/nonces.py`).
A client learns the low-water mark from the sidecars (`Account.next_nonce`, the `floor`
here) and counts up in memory. Three things can happen to a nonce it took:

- it reached a replica, or may have (`delivered`): it is spent;
- it certainly reached none, because a replica refused its bytes on arrival or none could
  be reached (`refused`): it is not spent, and may be signed again;
- a replica answered that another transaction holds it (`held_elsewhere`), which is only
  possible inside the window: it is spent (another client of the same key took it).

The counter is the first nonce above the floor, every spent nonce and every nonce still
in flight. So a run of refused nonces at the end — the tail of a batch that went past the
window — is given back, and the client does not keep signing nonces the engine can never
accept (otherwise, after a `submit_many` longer than the window, the client would answer
`Replayed` for good: its counter would have moved past the window, and syncing never moves
it back).

A refused nonce below the counter is a gap, and gaps must be filled: the engine's
low-water mark rises only over contiguous executed nonces, so a nonce skipped for good
would stop the window `NONCE_WINDOW` nonces later. `take` hands out the lowest gap first.
"""

from __future__ import annotations

from quorumgate.proto.limits import NONCE_WINDOW


class NonceLedger:
    def __init__(self, window: int = NONCE_WINDOW) -> None:
        if window < 1:
            raise ValueError("the nonce window holds at least one nonce")
        self.window = window
        self.floor = 1  # the sidecars' next nonce, the largest answer seen
        self.spent_max = 0  # the highest nonce that reached, or may have reached, a replica
        self.in_flight: set[int] = set()
        self.gaps: set[int] = set()  # refused nonces below the counter, to be used again
        self.synced = False

    @property
    def next(self) -> int:
        return max(self.floor, self.spent_max + 1, max(self.in_flight, default=0) + 1)

    @property
    def window_max(self) -> int:
        """The highest nonce the engine would accept now (from what the sidecars said)."""
        return self.floor - 1 + self.window

    def room(self) -> int:
        """How many more nonces fit in the window before the sidecars report progress."""
        gaps = sum(1 for n in self.gaps if self.floor <= n <= self.window_max)
        return gaps + max(0, self.window_max - self.next + 1)

    def sync(self, next_nonce: int) -> None:
        """The sidecars report `next_nonce`; the floor never goes back."""
        self.floor = max(self.floor, next_nonce, 1)
        self.gaps = {n for n in self.gaps if n >= self.floor}
        self.synced = True

    def take(self) -> int:
        usable = [n for n in self.gaps if n >= self.floor]
        if usable:
            nonce = min(usable)
            self.gaps.discard(nonce)
        else:
            nonce = self.next
        self.in_flight.add(nonce)
        return nonce

    def delivered(self, nonce: int) -> None:
        self.in_flight.discard(nonce)
        self.gaps.discard(nonce)
        self.spent_max = max(self.spent_max, nonce)

    def refused(self, nonce: int) -> None:
        self.in_flight.discard(nonce)
        if nonce < self.next:
            self.gaps.add(nonce)
        self.gaps = {n for n in self.gaps if n < self.next}

    def held_elsewhere(self, nonce: int) -> None:
        """A `replayed` or `conflicting_nonce` answer for bytes this client never sent
        before: inside the window, another transaction holds the nonce; beyond it, the
        nonce is merely too far ahead and is not spent."""
        if nonce <= self.window_max:
            self.delivered(nonce)
        else:
            self.refused(nonce)
