"""Cluster membership: who the members are and their consensus keys.

n = 3f+1 members come from one cluster file (docs/operating.md). 4 and 7 are the supported sizes;
any n >= 4 works, with f = (n-1)//3 and a quorum of floor((n+f)/2)+1, which is 2f+1 when
n = 3f+1 (any two quorums then share at least f+1 members, so at least one honest one).

It lives in the bottom layer because every layer needs it: the consensus core checks
votes against it, the cluster file builds it, and replay checks QCs with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PUBLIC_KEY_BYTES = 32
CHAIN_ID_BYTES_MAX = 64
MEMBERS_MIN = 4
MEMBERS_MAX = 64


@dataclass(frozen=True, slots=True)
class Member:
    index: int
    public_key: bytes
    address: str = ""

    def __post_init__(self) -> None:
        if len(self.public_key) != PUBLIC_KEY_BYTES:
            raise ValueError(f"member {self.index}: public key must be {PUBLIC_KEY_BYTES} bytes")


@dataclass(frozen=True, slots=True)
class Membership:
    chain_id: str
    members: tuple[Member, ...]
    # Derived from `members` once: the core asks for them on every message (properties
    # were about a million calls per twenty simulated clusters).
    n: int = field(default=0, init=False, compare=False)
    f: int = field(default=0, init=False, compare=False)
    quorum: int = field(default=0, init=False, compare=False)

    def __post_init__(self) -> None:
        if not self.chain_id or len(self.chain_id.encode()) > CHAIN_ID_BYTES_MAX:
            raise ValueError(f"chain id must be 1..{CHAIN_ID_BYTES_MAX} bytes")
        n = len(self.members)
        if not MEMBERS_MIN <= n <= MEMBERS_MAX:
            raise ValueError(f"a cluster needs {MEMBERS_MIN}..{MEMBERS_MAX} members, got {n}")
        if [m.index for m in self.members] != list(range(n)):
            raise ValueError("member indexes must be 0..n-1 in order")
        if len({m.public_key for m in self.members}) != n:
            raise ValueError("two members share a public key")
        f = (n - 1) // 3
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "f", f)
        object.__setattr__(self, "quorum", (n + f) // 2 + 1)

    def leader(self, view: int) -> int:
        """Round-robin leader of a view: the pacemaker's rotation (docs/consensus/protocol.md)."""
        return view % self.n

    def key(self, index: int) -> bytes:
        return self.members[index].public_key

    def is_member(self, index: int) -> bool:
        return 0 <= index < self.n
