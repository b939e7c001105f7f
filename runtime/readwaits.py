"""How many reads a caller may hold waiting at a replica or a sidecar (a pure core; the
servers take and give back the slots).

Some reads wait for heights not committed or executed yet: a replica's `CommittedBlocks`
stream, and a sidecar's `GetReceipt` long poll (up to a second), `Receipts` stream (for its
whole life) and `Registry` request for a future height (up to two seconds). Each one held
is a coroutine woken at every new height. They used to be unbounded, and at a sidecar a key
the cluster does not know may hold them too (an agent reads its own verdicts by proving it
signed them, and anyone can sign a transaction): a stranger opening thousands of them made
the sidecar do thousands of wakes, and as many store reads, per height. Now:

- every key holds at most `READ_WAITS_PER_KEY_MAX` at once;
- registered agents hold at most `READ_WAITS_AGENTS_MAX` together, and keys the cluster
  does not know at most `READ_WAITS_STRANGERS_MAX` together, so neither crowd can take
  the other's share, and neither takes any of the owner's, the members' or the auditors'
  (a bounded set of keys, each within the per-key bound).

A read refused a slot does not wait: a long poll is answered at once with what the
sidecar has (the SDK then asks again after a growing pause, as it polls), a stream is
refused with `RESOURCE_EXHAUSTED`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum

READ_WAITS_PER_KEY_MAX = 256  # one orchestrator's agent key: its calls' long polls
READ_WAITS_AGENTS_MAX = 4_096  # all registered agents together
READ_WAITS_STRANGERS_MAX = 256  # all keys the cluster does not know, together


class CallerKind(StrEnum):
    ROLE = "role"  # the owner, a member's key, an auditor
    AGENT = "agent"  # a key registered as an agent
    STRANGER = "stranger"  # any other key


@dataclass
class WaitSlots:
    per_key_max: int = READ_WAITS_PER_KEY_MAX
    kind_max: dict[CallerKind, int] = field(
        default_factory=lambda: {
            CallerKind.AGENT: READ_WAITS_AGENTS_MAX,
            CallerKind.STRANGER: READ_WAITS_STRANGERS_MAX,
        }
    )
    _by_key: Counter[bytes] = field(default_factory=Counter)
    _by_kind: Counter[CallerKind] = field(default_factory=Counter)

    def take(self, key: bytes, kind: CallerKind) -> bool:
        """A slot for `key`, or False if it or its kind holds all it may."""
        if self._by_key[key] >= self.per_key_max:
            return False
        bound = self.kind_max.get(kind)
        if bound is not None and self._by_kind[kind] >= bound:
            return False
        self._by_key[key] += 1
        self._by_kind[kind] += 1
        return True

    def give_back(self, key: bytes, kind: CallerKind) -> None:
        assert self._by_key[key] > 0 and self._by_kind[kind] > 0, "a slot given back twice"
        self._by_key[key] -= 1
        if not self._by_key[key]:
            del self._by_key[key]  # a key holding nothing costs no memory
        self._by_kind[kind] -= 1

    def held(self, kind: CallerKind) -> int:
        return self._by_kind[kind]

    def keys_holding(self) -> int:
        return len(self._by_key)

    @contextmanager
    def hold(self, key: bytes, kind: CallerKind) -> Iterator[bool]:
        """A slot for `key` while the block runs (True), or False (nothing taken)."""
        if not self.take(key, kind):
            yield False
            return
        try:
            yield True
        finally:
            self.give_back(key, kind)
