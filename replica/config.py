"""Cluster membership and the named limits of the consensus core.

n = 3f+1 members come from one cluster file (DESIGN §6). 4 and 7 are the supported sizes;
any n >= 4 works, with f = (n-1)//3 and a quorum of floor((n+f)/2)+1, which is 2f+1 when
n = 3f+1 (any two quorums then share at least f+1 members, so at least one honest one).
"""

from __future__ import annotations

from dataclasses import dataclass

from replica.types import PUBLIC_KEY_BYTES

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

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def f(self) -> int:
        return (self.n - 1) // 3

    @property
    def quorum(self) -> int:
        return (self.n + self.f) // 2 + 1

    def leader(self, view: int) -> int:
        """Round-robin leader of a view (DESIGN §3 pacemaker)."""
        return view % self.n

    def key(self, index: int) -> bytes:
        return self.members[index].public_key

    def is_member(self, index: int) -> bool:
        return 0 <= index < self.n


@dataclass(frozen=True, slots=True)
class Limits:
    """Every bound of the core, named (TIGER_STYLE: a limit on everything)."""

    # Batches: a block carries at most this many transactions and bytes of payload.
    batch_txs_max: int = 4096
    batch_bytes_max: int = 4 * 1024 * 1024
    tx_bytes_max: int = 64 * 1024
    # Pacemaker, in ticks: view timeout base, its cap under exponential back-off, how long
    # an idle leader waits before proposing an empty block, and the heartbeat of re-sent
    # timeouts while a view stays stuck.
    view_timeout_ticks_base: int = 100
    view_timeout_ticks_max: int = 1600
    idle_propose_ticks: int = 30
    # Block timestamps must be within this much of the voter's own clock.
    timestamp_skew_ms_max: int = 5_000
    # Uncommitted blocks held in the tree. Votes and timeouts are kept for views within
    # `vote_views_max` of the current one; those further ahead are dropped as future_view
    # (their certificates still count: they are how a lagging replica catches up).
    pending_blocks_max: int = 1_024
    vote_views_max: int = 16
    # Catch-up: blocks per sync response and ticks before asking another peer.
    sync_blocks_max: int = 256
    sync_bytes_max: int = 16 * 1024 * 1024
    sync_retry_ticks: int = 50
    # A leader carries the state root of a height at least this far below its block, so
    # every voter's sidecar has had time to execute it (DESIGN §4: "a fixed lag behind").
    state_root_lag_blocks: int = 8
    # After a (re)start a replica signs nothing until 2f+1 peers told it which views they
    # saw it sign in (safety Rule 6); with fewer peers up, after this many ticks f+1 do.
    fence_wait_ticks: int = 200
    # Verified-certificate cache entries (a QC is checked once, not at every sighting).
    verified_cache_max: int = 4_096

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if getattr(self, name) <= 0:
                raise ValueError(f"limit {name} must be positive")
        if self.idle_propose_ticks >= self.view_timeout_ticks_base:
            raise ValueError("idle_propose_ticks must be below view_timeout_ticks_base")
        if self.view_timeout_ticks_max < self.view_timeout_ticks_base:
            raise ValueError("view_timeout_ticks_max must be >= view_timeout_ticks_base")
