"""The `stale-restore-epoch` drill (docs/drills.md): a stale restore across an epoch
boundary, under load, done with the operator's own commands' code. Each cycle backs up one
member (`quorumgate backup`, the replica stopped) in epoch e, rotates another member's key
(`quorumgate admin rotate-key`, which ends e), lets the backed-up member vote in epoch e+1,
SIGKILLs it and puts the backup back declared (`quorumgate restore`). Its store is then in
epoch e and has forgotten every vote it signed since the backup, in both epochs: it must
learn that e ended, cross the boundary again fenced as a restore (docs/consensus/fencing.md,
"Across an epoch boundary"), and rejoin. The drill's usual checks then say that nothing
acknowledged was lost, that nothing diverged and that every certificate verifies; the vote
check reads every epoch's votes and the restored member's forgotten ones, by epoch and view.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from pathlib import Path

from quorumgate.ops.backups import backup_replica, restore_replica
from quorumgate.ops.drills.audit import ReplicaAudit, read_replica, started_height
from quorumgate.ops.drills.bounds import RECOVERY_TIMEOUT_S, VOTING_HEIGHTS, poll
from quorumgate.ops.drills.context import Drill, StaleRun
from quorumgate.ops.drills.report import Abort, Fault
from quorumgate.ops.drills.rotation import epoch_now, rotate_once
from quorumgate.ops.nodes import OpsError
from quorumgate.replica.node import RESTORE_MARKER_FILE

BACKUP_FILE = "drill-epoch-backup.db"  # in the victim's node directory, removed after use
REPLICA_LOG = "replica.log"
# The replica's log line once a declared restore has fenced (replica/node.py).
FENCED = re.compile(r"event=restore_fenced node=\d+ epoch=(\d+) view=(\d+) fence=(\d+)")


def stale_restore_epoch(d: Drill) -> None:
    """Cycle k: member (k+1) mod n is backed up and restored, member (k+2) mod n's key is
    rotated in between, so every cycle crosses one more boundary."""
    d.after_stop.append(lambda _target: check_rejoined(d))
    for k in d.cycles():
        victim, rotated = (k + 1) % d.n, (k + 2) % d.n
        epoch = epoch_now(d)
        backup, stale = _back_up(d, victim)
        d.say(
            f"cycle {k + 1}: backed up replica {victim} in epoch {epoch} (height "
            f"{stale.committed_height}, last voted view {stale.last_voted_view}); rotating "
            f"member {rotated}'s key ends epoch {epoch}"
        )
        rotate_once(d, k, rotated)
        goal = d.top() + VOTING_HEIGHTS
        if not poll(functools.partial(d.reached, victim, goal), RECOVERY_TIMEOUT_S):
            raise Abort(f"replica {victim} did not reach height {goal}: {d.heights()}")
        _restore(d, victim, backup, stale, epoch)


def _back_up(d: Drill, victim: int) -> tuple[Path, ReplicaAudit]:
    """Stop `victim`, take its backup as `quorumgate backup` does, restart it; the backup
    file and what the copy holds."""
    backup = d.spec.node_dir(victim) / BACKUP_FILE
    backup.unlink(missing_ok=True)
    d.scrape_equivocations([victim])
    d.cluster.stop([("replica", victim)])
    try:
        backup_replica(d.spec, victim, backup)
    except OpsError as err:
        raise Abort(f"backup of replica {victim}: {err}") from err
    stale = asyncio.run(read_replica(d.spec, victim))
    d.start("replica", [victim])
    return backup, stale


def _restore(d: Drill, victim: int, backup: Path, stale: ReplicaAudit, epoch: int) -> None:
    """SIGKILL `victim`, put `backup` back declared, restart it and wait until it has
    fenced in the later epoch and is back at the cluster's height."""
    d.scrape_equivocations([victim])
    pid = d.kill("replica", victim)
    rolled_back = asyncio.run(read_replica(d.spec, victim))
    forgotten = {k: h for k, h in rolled_back.votes.items() if k not in stale.votes}
    if not any(e > epoch for e, _ in forgotten):
        raise Abort(f"replica {victim} signed no vote after epoch {epoch} ended")
    try:
        restore_replica(d.spec, victim, backup)
    except OpsError as err:
        raise Abort(f"restore of replica {victim}: {err}") from err
    backup.unlink(missing_ok=True)
    log = d.spec.node_dir(victim) / REPLICA_LOG
    log_from = log.stat().st_size if log.exists() else 0
    height = d.top(d.others(victim))
    restored_at = time.monotonic()
    d.start("replica", [victim])
    later = sorted(e for e, _ in forgotten if e > epoch)
    fault = d.fault(
        Fault(
            "stale-restore-epoch",
            victim,
            restored_at - d.t0,
            "SIGKILL",
            {"replica": pid},
            d.cluster.pids(["replica"], [victim]),
            height,
            details={
                "backup_epoch": epoch,
                "epoch_at_restore": later[-1],
                "stale_committed_height": stale.committed_height,
                "stale_last_voted_view": stale.last_voted_view,
                "committed_height_before_rollback": rolled_back.committed_height,
                "forgotten_votes": len(forgotten),
                "forgotten_votes_by_epoch": {
                    str(e): sum(1 for f, _ in forgotten if f == e)
                    for e in sorted({f for f, _ in forgotten})
                },
                "restarted_at_height": started_height(d.spec, victim, "replica"),
            },
        )
    )
    d.stale_runs.append(
        StaleRun(victim, {}, {}, fault, stale_by_epoch=stale.votes, forgotten_by_epoch=forgotten)
    )
    d.say(
        f"SIGKILLed replica {victim} in epoch {later[-1]} ({len(forgotten)} votes since the "
        f"backup of epoch {epoch}); restored the backup, declared; restarted it"
    )
    _await_rejoined(d, fault, log, log_from, later[-1], restored_at)


def _fenced_epochs(log: Path, start: int) -> list[tuple[int, int]]:
    """(epoch, fence view) of every `restore_fenced` line the replica logged after `start`."""
    try:
        with log.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [(int(m.group(1)), int(m.group(3))) for m in FENCED.finditer(text)]


def _await_rejoined(
    d: Drill, fault: Fault, log: Path, log_from: int, epoch: int, restored_at: float
) -> None:
    """The restored member fences in `epoch` (the one it signed in and forgot), its marker
    goes, and it is back in that epoch at the cluster's height."""
    victim = fault.node
    assert victim is not None
    marker = d.spec.node_dir(victim) / RESTORE_MARKER_FILE

    def fenced() -> float | None:
        done = any(e >= epoch for e, _ in _fenced_epochs(log, log_from))
        return time.monotonic() if done and not marker.exists() else None

    at = poll(fenced, RECOVERY_TIMEOUT_S)
    fault.details["fenced"] = [
        {"epoch": e, "fence_view": v} for e, v in _fenced_epochs(log, log_from)
    ]
    if at is None:
        raise Abort(f"restored replica {victim} did not fence in epoch {epoch}: {d.heights()}")
    fault.details["fenced_s"] = round(at - restored_at, 3)
    back = d.wait_replica_back(victim)
    if back is None:
        raise Abort(f"restored replica {victim} did not catch up: {d.heights()}")
    status = d.cluster.probe(victim)
    fault.details["epoch_after"] = None if status is None else status.epoch
    fault.details["restore_marker_removed"] = not marker.exists()
    fault.recovery_s = back - restored_at
    d.say(
        f"replica {victim} fenced in epoch {epoch} after {at - restored_at:.2f} s and was "
        f"back at the cluster's height after {fault.recovery_s:.2f} s"
    )


def check_rejoined(d: Drill) -> None:
    """Each restored member fenced in the epoch it had signed in and forgotten, and ended
    in the cluster's epoch."""
    problems = []
    for fault in d.report.faults:
        if fault.kind != "stale-restore-epoch":
            continue
        epoch = fault.details.get("epoch_at_restore")
        fenced = fault.details.get("fenced") or []
        assert isinstance(fenced, list)
        if not any(isinstance(f, dict) and f.get("epoch") == epoch for f in fenced):
            problems.append(f"replica {fault.node} did not fence in epoch {epoch}: {fenced}")
        after = fault.details.get("epoch_after")
        if not isinstance(after, int) or not isinstance(epoch, int) or after < epoch:
            problems.append(f"replica {fault.node} in epoch {after} after its restore")
    restores = sum(f.kind == "stale-restore-epoch" for f in d.report.faults)
    d.check(
        "restored_across_the_boundary",
        problems if restores else ["no restore was carried out"],
        f"{restores} restore{'' if restores == 1 else 's'} from a backup of an earlier "
        "epoch, each fenced in the epoch it had signed in and forgotten, and back in the "
        "cluster's epoch",
    )
