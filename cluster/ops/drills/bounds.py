"""The drills' names and bounds: how many faults each injects, and how long every wait of
a drill may last (each wait is a poll with one of these deadlines, docs/drills.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from quorumgate.proto.limits import QUOTA_PROPOSALS_MAX_DEFAULT, QUOTA_WINDOW_MS_DEFAULT
from quorumgate.sdk.polling import poll_for

T = TypeVar("T")

DRILLS = (
    "leader-kill",
    "wipe-replica",
    "full-restart",
    "sidecar-crash",
    "stale-restore",
    "byzantine",
    "ship",
    "rotate-members",
    "stale-restore-epoch",
    "replace-member",
    "grow-shrink",
)
# Faults a drill injects however short `--seconds` is: enough to repeat what repeats,
# and the three rebuild paths of `wipe-replica` (replay from height 1, the sidecar's own
# re-execution from height 1, a snapshot).
FAULT_CYCLES_MIN = {
    "leader-kill": 2,
    "wipe-replica": 3,
    "full-restart": 1,
    "sidecar-crash": 2,
    "stale-restore": 1,
    "byzantine": 4,  # each attack of BYZANTINE_CYCLES once
    "ship": 3,  # the shipper, the database and a replica, each once
    "rotate-members": 4,  # every member of a 4-node cluster once (of 7: all 7, see the drill)
    "stale-restore-epoch": 1,  # one backup, one boundary, one restore
    "replace-member": 1,  # one host gone, one new machine
    "grow-shrink": 1,  # 4 -> 7 -> 4 once, three new machines
}
FAULT_CYCLES_MAX = 64
SECONDS_DEFAULT = 20.0
SECONDS_MIN = 1.0

# ---------------------------------------------------------------------------- limits

POLL_S = 0.05
STREAM_TIMEOUT_S = 60.0
STREAM_RETRIES_MAX = 5
METRICS_TIMEOUT_S = 3.0
READY_TIMEOUT_S = 45.0  # a started process answering
RECOVERY_TIMEOUT_S = 120.0  # a faulted member back at the cluster's height (see stale-restore)
RESUME_TIMEOUT_S = 45.0  # commits resuming after a fault
SETTLE_TIMEOUT_S = 90.0  # every acknowledged proposal committed once the load stopped
CATCH_UP_TIMEOUT_S = 60.0  # every replica and sidecar at the final height
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL
LEADER_WAIT_S = 10.0  # the victim leading the current view
LEADER_POLL_S = 0.005  # a view lasts tens of milliseconds under load
LAG_WAIT_S = 2.0  # a sidecar with committed blocks left to execute
WARMUP_ACKS_MIN = 20  # acknowledged proposals before the first fault
WARMUP_HEIGHTS = 3  # heights committed before the first fault
VOTING_HEIGHTS = 8  # heights a stale-restore victim commits (and votes in) before its kill
SHIP_CATCH_UP_TIMEOUT_S = 60.0  # the audit copy reaching the ledger once the load stopped
DB_COMMAND_TIMEOUT_S = 60.0  # the operator's command that stops or starts the database
DB_DOWN_S = 1.0  # how long the ship drill keeps the database stopped under load
LAG_SAMPLE_S = 0.2  # between two scrapes of the shipper's lag
ATTACK_HEIGHTS = 5  # heights the honest members commit under each attack
# The byzantine drill's cycles: the attacks its member runs (quorumgate.ops.byzantine) and
# what the honest members do meanwhile — commit on their own ("commit"), restart one of
# them into forged hello replies ("restart"), or stop one, commit without it (the
# Byzantine member votes in this cycle) and let it catch up from peers that include the
# poisoner ("catch-up").
BYZANTINE_CYCLES = (
    ("poison-sync", ("poison-sync",), "catch-up"),
    ("forged-hello", ("forged-hello", "silent"), "restart"),
    ("oversized-sync", ("oversized-sync", "silent"), "commit"),
    ("spoofed", ("spoofed", "silent"), "commit"),
)
BYZANTINE_MODULE = "quorumgate.ops.byzantine"

# The load (quorumgate.ops.load): batches of BATCH_TXS, paced per sender thread.
RATE_PER_S_DEFAULT = {4: 50.0, 7: 30.0}
RATE_PER_S_OTHER = 30.0
BATCH_TXS = 10
SENDER_THREADS = 2
DENY_EVERY = 10
# The engine's quota (docs/engine.md) allows QUOTA_PROPOSALS_MAX_DEFAULT proposals per agent
# per window of block time; a drill keeps each agent at three quarters of that, so that no
# verdict of a drill is a quota denial.
AGENT_RATE_PER_S_MAX = 0.75 * QUOTA_PROPOSALS_MAX_DEFAULT / (QUOTA_WINDOW_MS_DEFAULT / 1000)
AGENTS_MIN = 8
DELIVERY_BACKOFF_S_MIN = 0.05
DELIVERY_BACKOFF_S_MAX = 0.5
NODE_DOWN_HOLD_S = 0.3  # a member that failed a delivery is skipped this long

# Settling: an acknowledged proposal the chain does not show after this many more heights
# is offered again, the same signed bytes, as a client does when no certificate comes.
REOFFER_AFTER_HEIGHTS = 8
CERTIFICATE_DEADLINE_S = 15.0
CERTIFICATE_CONCURRENCY = 32

EXPECTED_ALLOWED = ("allow", "ok")
EXPECTED_DENIED = ("deny", "target_scheme_not_allowed")
REPLICA_DB_FILES = ("replica.db", "replica.db-wal", "replica.db-shm")
SIDECAR_DB_FILE = "sidecar.db"
# `wipe-replica`'s sidecars snapshot their state this often (docs/snapshots.md), so its
# snapshot cycle has one to start from within a short drill; that cycle waits at most
# SNAPSHOT_WAIT_S for a peer to hold one.
DRILL_SNAPSHOT_INTERVAL_HEIGHTS = 20
SNAPSHOT_WAIT_S = 60.0
SIDECAR_STORE_FILES = (
    "sidecar.db",
    "sidecar.db-wal",
    "sidecar.db-shm",
    "sidecar.db.lock",
    "replay.checkpoint",
    "replay.checkpoint.state",
)
STALE_COPY_DIR = "drill-stale-copy"

ProgressFn = Callable[[str], None]


def poll(check: Callable[[], T | None], timeout_s: float, every_s: float = POLL_S) -> T | None:
    """`quorumgate.sdk.polling.poll_for` with the drill's step."""
    return poll_for(check, timeout_s, every_s)
