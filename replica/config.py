"""The named limits of the consensus core (membership is `quorumgate.proto.membership`)."""

from __future__ import annotations

from dataclasses import dataclass


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
    # A voter refuses a block whose time is more than this ahead of its own clock, or more
    # than this behind it. Ahead is tight: it bounds how far committed block time (and so
    # every TTL, grant expiry and quota window) can run ahead of honest clocks, whoever
    # leads; behind is loose, as an honest block may reach a voter late (a slow link, a
    # wait for its parent or its state root) and one cannot push later blocks back
    # (docs/consensus/messages.md, "Block time").
    timestamp_ahead_ms_max: int = 1_000
    timestamp_behind_ms_max: int = 5_000
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
    # every voter's sidecar has had time to execute it
    # (docs/architecture/0005-execution-beside-consensus.md).
    state_root_lag_blocks: int = 8
    # After a plain (re)start a replica signs nothing until 2f+1 peers have answered its
    # hello (safety Rule 6); with fewer peers up, after this many ticks f+1 do. A declared
    # restore waits for 2f+1 however long (docs/consensus/fencing.md).
    fence_wait_ticks: int = 200
    # Verified-certificate cache entries (a QC is checked once, not at every sighting).
    verified_cache_max: int = 4_096
    # Quiescence (replica/core.py): with nothing left to order, propose no heartbeats and
    # stop the view timer. Off only for unit tests that drive views with empty blocks.
    quiesce: bool = True

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not isinstance(value, bool) and value <= 0:
                raise ValueError(f"limit {name} must be positive")
        if self.idle_propose_ticks >= self.view_timeout_ticks_base:
            raise ValueError("idle_propose_ticks must be below view_timeout_ticks_base")
        if self.view_timeout_ticks_max < self.view_timeout_ticks_base:
            raise ValueError("view_timeout_ticks_max must be >= view_timeout_ticks_base")
