"""The drills' fault injectors, one per drill (docs/drills.md has what each proves). Each
repeats its fault while `--seconds` last (at least `FAULT_CYCLES_MIN[drill]` times),
records every fault in the report, and waits, polling with a deadline, until the cluster
is back: a step that cannot be carried out raises `Abort`, and the drill still runs its
checks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from quorumgate.ops.drills.audit import (
    ReplicaAudit,
    read_replica,
    read_sidecar,
    started_height,
)
from quorumgate.ops.drills.boundary import stale_restore_epoch
from quorumgate.ops.drills.bounds import (
    ATTACK_HEIGHTS,
    BYZANTINE_CYCLES,
    BYZANTINE_MODULE,
    DRILL_SNAPSHOT_INTERVAL_HEIGHTS,
    LAG_WAIT_S,
    LEADER_POLL_S,
    LEADER_WAIT_S,
    METRICS_TIMEOUT_S,
    RECOVERY_TIMEOUT_S,
    REPLICA_DB_FILES,
    RESUME_TIMEOUT_S,
    SIDECAR_STORE_FILES,
    SNAPSHOT_WAIT_S,
    STALE_COPY_DIR,
    VOTING_HEIGHTS,
    poll,
)
from quorumgate.ops.drills.checker import rebuild_problems, refusals_since
from quorumgate.ops.drills.context import Drill, StaleRun, Wiped
from quorumgate.ops.drills.grow import grow_shrink, prepare_grow
from quorumgate.ops.drills.replace import prepare_replace, replace_members
from quorumgate.ops.drills.report import Abort, Fault, listed
from quorumgate.ops.drills.rotation import rotate_members
from quorumgate.ops.drills.ship import ship_drill
from quorumgate.ops.nodes import sidecar_status
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.replica.node import RESTORE_MARKER_FILE
from quorumgate.replica.storage import ReplicaStore
from quorumgate.sidecar.replay import ReplayError, ReplayReport, replay
from quorumgate.sidecar.snapshots import MANIFEST_FILE, OPTIONS_FILE, SNAPSHOT_DIR

# How `wipe-replica` rebuilds the wiped sidecar, cycle after cycle: `quorumgate replay`
# from height 1, the sidecar re-executing from height 1 itself, and `quorumgate replay
# --from-snapshot` (docs/snapshots.md), each timed.
REBUILDS = ("replay", "sidecar", "snapshot")


async def wipe_replica_blocks(spec: ClusterSpec, index: int) -> tuple[int, int]:
    """`ReplicaStore.wipe_blocks()` on a stopped replica: (height before, height after)."""
    store = await ReplicaStore.open(spec.node_dir(index) / "replica.db", spec.chain_id)
    try:
        before = store.committed_height
        await store.wipe_blocks()
        return before, store.committed_height
    finally:
        await store.close()


def leader_kill(d: Drill) -> None:
    for k in d.cycles():
        found = poll(functools.partial(_current_leader, d), LEADER_WAIT_S)
        if found is None:
            raise Abort(f"no view with every replica up and a leader: {d.heights()}")
        victim, view = found
        survivors = d.others(victim)
        d.scrape_equivocations()
        height = d.top(survivors)
        killed_at = time.monotonic()
        pid = d.kill("replica", victim)
        fault = d.fault(
            Fault(
                "sigkill-replica",
                victim,
                killed_at - d.t0,
                "SIGKILL",
                {"replica": pid},
                height_at_fault=height,
                view_at_fault=view,
            )
        )
        d.say(f"kill {k + 1}: SIGKILL replica {victim} (pid {pid}), leader of view {view}")
        resumed = d.wait_commits(height, survivors, RESUME_TIMEOUT_S)
        if resumed is None:
            raise Abort(f"commits did not resume without replica {victim}: {d.heights()}")
        fault.details["commits_resumed_s"] = round(resumed - killed_at, 3)
        fault.details["survivor_view_at_resume"] = max(
            s.view for s in d.statuses(survivors).values()
        )
        d.start("replica", [victim])
        fault.pids_after = d.cluster.pids(["replica"], [victim])
        back = d.wait_replica_back(victim)
        if back is None:
            raise Abort(f"replica {victim} did not catch up: {d.heights()}")
        fault.recovery_s = back - killed_at
        d.say(
            f"commits resumed after {resumed - killed_at:.2f} s; replica {victim} back at "
            f"the cluster's height {fault.recovery_s:.2f} s after the kill"
        )


def _current_leader(d: Drill) -> tuple[int, int] | None:
    """(leader, view) of the highest view, once every replica answers."""
    statuses = d.statuses()
    if len(statuses) < d.n:
        return None
    top = max(statuses.values(), key=lambda s: s.view)
    return top.leader, top.view


def sidecar_crash(d: Drill) -> None:
    for k in d.cycles():
        victim = (k + 1) % d.n
        lag = poll(functools.partial(d.sidecar_lag, victim), LAG_WAIT_S) or 0
        status = sidecar_status(d.spec, victim)
        executed = 0 if status is None else status.executed_height
        killed_at = time.monotonic()
        pid = d.kill("sidecar", victim)
        fault = d.fault(
            Fault(
                "sigkill-sidecar",
                victim,
                killed_at - d.t0,
                "SIGKILL",
                {"sidecar": pid},
                height_at_fault=executed,
                details={"lag_blocks_at_kill": lag},
            )
        )
        d.say(
            f"crash {k + 1}: SIGKILL sidecar {victim} (pid {pid}) at executed height "
            f"{executed}, {lag} committed blocks behind its replica"
        )
        d.start("sidecar", [victim])
        fault.pids_after = d.cluster.pids(["sidecar"], [victim])
        fault.details["executed_height_at_restart"] = started_height(d.spec, victim, "sidecar")
        back = d.wait_sidecar_back(victim)
        if back is None:
            raise Abort(f"sidecar {victim} did not catch up")
        fault.recovery_s = back - killed_at
        d.say(f"sidecar {victim} back at the cluster's height after {fault.recovery_s:.2f} s")


def full_restart(d: Drill) -> None:
    everything = [(kind, i) for kind in ("sidecar", "replica") for i in range(d.n)]
    for k in d.cycles():
        sig = signal.SIGKILL if k % 2 == 0 else signal.SIGTERM
        d.scrape_equivocations()
        statuses = d.statuses()
        height = max((s.committed_height for s in statuses.values()), default=0)
        view = max((s.view for s in statuses.values()), default=0)
        before = d.cluster.pids(["replica", "sidecar"], range(d.n))
        stopped_at = time.monotonic()
        codes = d.cluster.stop(everything, sig)
        fault = d.fault(
            Fault(
                "stop-all",
                None,
                stopped_at - d.t0,
                sig.name,
                before,
                height_at_fault=height,
                view_at_fault=view,
                details={"exit_codes": codes},
            )
        )
        d.say(f"restart {k + 1}: {sig.name} to all {len(everything)} processes at height {height}")
        d.start("replica", range(d.n))
        d.start("sidecar", range(d.n))
        fault.pids_after = d.cluster.pids(["replica", "sidecar"], range(d.n))
        resumed = d.wait_commits(height, list(range(d.n)), RESUME_TIMEOUT_S)
        if resumed is None:
            raise Abort(f"commits did not resume after the restart: {d.heights()}")
        fault.recovery_s = resumed - stopped_at
        quorum = 2 * d.spec.f + 1
        executing = poll(functools.partial(d.sidecars_at, height + 1, quorum), RECOVERY_TIMEOUT_S)
        if executing is None:
            raise Abort(f"sidecars did not execute past height {height} after the restart")
        fault.details["sidecars_resumed_s"] = round(executing - stopped_at, 3)
        d.say(
            f"commits resumed {fault.recovery_s:.2f} s after the stop, sidecars executing "
            f"past height {height} after {executing - stopped_at:.2f} s"
        )


def prepare_wipe_replica(d: Drill) -> None:
    """Before the nodes start: every sidecar snapshots its state every
    `DRILL_SNAPSHOT_INTERVAL_HEIGHTS` heights, so the snapshot cycle has one to fetch."""
    options = json.dumps({"interval_heights": DRILL_SNAPSHOT_INTERVAL_HEIGHTS})
    for i in range(d.n):
        (d.spec.node_dir(i) / OPTIONS_FILE).write_text(options)


def wipe_replica(d: Drill) -> None:
    for k in d.cycles():
        _wipe_once(d, k, victim=(k + 1) % d.n, rebuild=REBUILDS[k % len(REBUILDS)])


def _wipe_once(d: Drill, k: int, victim: int, rebuild: str) -> None:
    """Stop member `victim`, drop its replica's blocks (its safety record and signed-vote
    audit stay) and delete its sidecar's store and snapshots; restart the replica, which
    fetches the chain from its peers from height 0, and rebuild the sidecar (`rebuild`,
    one of REBUILDS)."""
    node_dir = d.spec.node_dir(victim)
    d.scrape_equivocations()
    before = d.cluster.pids(["replica", "sidecar"], [victim])
    d.cluster.stop([("sidecar", victim), ("replica", victim)])
    sidecar_before = asyncio.run(read_sidecar(d.spec, victim))
    for i, earlier in enumerate(d.wiped):  # its earlier rebuild, checked before it goes
        if earlier.node == victim and earlier.problems is None:
            d.wiped[i] = dataclasses.replace(earlier, problems=tuple(rebuild_problems(d, earlier)))
    votes_before = asyncio.run(read_replica(d.spec, victim))
    height_before, height_after = asyncio.run(wipe_replica_blocks(d.spec, victim))
    kept = asyncio.run(read_replica(d.spec, victim))
    for name in SIDECAR_STORE_FILES:
        (node_dir / name).unlink(missing_ok=True)
    shutil.rmtree(node_dir / SNAPSHOT_DIR, ignore_errors=True)
    d.say(
        f"wipe {k + 1}: member {victim} stopped at height {height_before}; replica "
        f"blocks wiped ({len(kept.signed_votes)} signed votes kept), sidecar store "
        f"(executed {sidecar_before.executed_height}) and snapshots deleted"
    )
    restarted_at = time.monotonic()
    d.start("replica", [victim])
    started = started_height(d.spec, victim, "replica")
    if rebuild == "sidecar":
        d.start("sidecar", [victim])
    fault = d.fault(
        Fault(
            "wipe",
            victim,
            restarted_at - d.t0,
            "SIGTERM",
            before,
            height_at_fault=height_before,
            details={
                "rebuilt_by": rebuild,
                "height_after_wipe": height_after,
                "replica_started_at_height": started,
                "signed_votes_before": len(votes_before.signed_votes),
                "signed_votes_kept": len(kept.signed_votes),
                "last_voted_view_kept": kept.last_voted_view,
                "sidecar_executed_before": sidecar_before.executed_height,
            },
        )
    )
    caught = d.wait_replica_back(victim)
    if caught is None:
        raise Abort(f"wiped replica {victim} did not catch up: {d.heights()}")
    fault.details["replica_caught_up_s"] = round(caught - restarted_at, 3)
    d.say(
        f"replica {victim} started at height {started}, caught up after "
        f"{caught - restarted_at:.2f} s"
    )
    replayed = _rebuild_sidecar(d, victim, fault, rebuild)
    fault.pids_after = d.cluster.pids(["replica", "sidecar"], [victim])
    back = d.wait_sidecar_back(victim)
    if back is None:
        raise Abort(f"rebuilt sidecar {victim} did not catch up")
    fault.recovery_s = back - restarted_at
    # The sidecar's own part, comparable across the rebuilds: from its replica back at
    # the cluster's height to the sidecar back at it (docs/drills.md).
    fault.details["sidecar_rebuilt_s"] = round(back - caught, 3)
    d.wiped.append(Wiped(victim, sidecar_before, replayed))
    d.say(
        f"member {victim} back at the cluster's height {fault.recovery_s:.2f} s after its "
        f"restart; its sidecar rebuilt by {rebuild} in {back - caught:.2f} s"
    )


def _peer_holds_snapshot(d: Drill, victim: int) -> bool | None:
    return (
        any(
            any((d.spec.node_dir(i) / SNAPSHOT_DIR).glob(f"*/{MANIFEST_FILE}"))
            for i in d.others(victim)
        )
        or None
    )


def _rebuild_sidecar(d: Drill, victim: int, fault: Fault, rebuild: str) -> ReplayReport | None:
    """`replay`: rebuild the sidecar's store with `quorumgate.sidecar.replay` from height 1
    (every certificate checked) before starting it; `snapshot`: the same from the newest
    snapshot its peers attest; `sidecar`: it was started at once and re-executes from
    height 1."""
    if rebuild == "sidecar":
        fault.details["sidecar_started_at_height"] = started_height(d.spec, victim, "sidecar")
        return None
    if (
        rebuild == "snapshot"
        and poll(lambda: _peer_holds_snapshot(d, victim), SNAPSHOT_WAIT_S) is None
    ):
        raise Abort(f"no peer of member {victim} wrote a snapshot in {SNAPSHOT_WAIT_S:g} s")
    try:
        replayed = asyncio.run(
            replay(d.spec, victim, resume=False, from_snapshot=rebuild == "snapshot")
        )
    except ReplayError as err:
        raise Abort(f"replay of member {victim} failed: {err}") from err
    fault.details["replay"] = replayed.as_dict()
    d.say(
        f"replay ({rebuild}): {replayed.heights_replayed} heights, "
        f"{replayed.certificates_checked} certificates checked, "
        f"{len(replayed.mismatches)} mismatches in {replayed.seconds:.2f} s"
        + (
            f", from the snapshot of height {replayed.history_from}"
            if replayed.history_from
            else ""
        )
    )
    d.start("sidecar", [victim])
    return replayed


def stale_restore(d: Drill) -> None:
    """Rule 6 only matters if the restored replica comes back while views it signed in
    are still live. So f other members ("bystanders") are stopped first: with exactly
    2f+1 replicas up the cluster cannot leave a view without the victim. The victim is
    SIGKILLed while it leads the current view, which holds the cluster in the views it
    signed in, and restarted on its stale copy at once, declared a restore; it signs
    nothing until 2f+1 others answer, so the bystanders are started right after it,
    and commits resume once it has fenced. Without Rule 6 it could propose again in a
    view it led, or sign a statement it had forgotten."""
    for k in d.cycles():
        victim = (k + 1) % d.n
        bystanders = [(victim + 1 + j) % d.n for j in range(d.spec.f)]
        up = d.others(*bystanders)
        stale, copied = _copy_stopped(d, k, victim)
        view = _hold_in_views_of(d, victim, bystanders, up)
        d.scrape_equivocations(up)
        pid = d.kill("replica", victim)
        rolled_back = _put_back(d, victim, copied)
        forgotten = {
            v: h for v, h in rolled_back.signed_votes.items() if v not in stale.signed_votes
        }
        survivors = d.statuses(d.others(victim, *bystanders))
        cluster_view = max((s.view for s in survivors.values()), default=0)
        height = max((s.committed_height for s in survivors.values()), default=0)
        restored_at = time.monotonic()
        d.start("replica", [victim])
        fault = d.fault(
            Fault(
                "stale-restore",
                victim,
                restored_at - d.t0,
                "SIGKILL",
                {"replica": pid},
                d.cluster.pids(["replica"], [victim]),
                height,
                view,
                details={
                    "bystanders_stopped": bystanders,
                    **_rollback_details(stale, rolled_back, forgotten),
                    "cluster_view_at_restore": cluster_view,
                    "restarted_at_height": started_height(d.spec, victim, "replica"),
                },
            )
        )
        d.stale_runs.append(StaleRun(victim, stale.signed_votes, forgotten, fault))
        d.say(
            f"SIGKILLed replica {victim} leading view {view} ({len(forgotten)} votes since "
            f"the copy, up to view {max(forgotten, default=0)}); the cluster holds in view "
            f"{cluster_view} with {bystanders} down; restarted {victim} on the copy (last "
            f"voted view {stale.last_voted_view}), declared a restore; restarting "
            f"{bystanders}: a restore fences only once 2f+1 others have answered"
        )
        d.start("replica", bystanders)
        _await_restored(d, fault, bystanders, up, restored_at)


def _copy_stopped(d: Drill, k: int, victim: int) -> tuple[ReplicaAudit, list[str]]:
    """Stop replica `victim` and copy its database files; what the copy holds, and the
    names of the files copied."""
    node_dir = d.spec.node_dir(victim)
    copy_dir = node_dir / STALE_COPY_DIR
    d.scrape_equivocations([victim])
    d.cluster.stop([("replica", victim)])
    stale = asyncio.run(read_replica(d.spec, victim))
    shutil.rmtree(copy_dir, ignore_errors=True)
    copy_dir.mkdir(mode=0o700)
    copied = [name for name in REPLICA_DB_FILES if (node_dir / name).exists()]
    for name in copied:
        shutil.copy2(node_dir / name, copy_dir / name)
    d.say(
        f"stale-restore {k + 1}: copied replica {victim}'s {', '.join(copied)} while "
        f"stopped (height {stale.committed_height}, last voted view "
        f"{stale.last_voted_view})"
    )
    return stale, copied


def _hold_in_views_of(d: Drill, victim: int, bystanders: list[int], up: list[int]) -> int:
    """Restart `victim`, let it vote for VOTING_HEIGHTS heights, stop the bystanders and
    wait until it leads the current view, which it returns."""
    d.start("replica", [victim])
    goal = d.top() + VOTING_HEIGHTS
    if not poll(functools.partial(d.reached, victim, goal), RECOVERY_TIMEOUT_S):
        raise Abort(f"replica {victim} did not reach height {goal}: {d.heights()}")
    d.scrape_equivocations(bystanders)
    d.cluster.stop([("replica", b) for b in bystanders])
    if d.wait_commits(d.top(up), up, RESUME_TIMEOUT_S) is None:
        raise Abort(f"no commits with replicas {bystanders} stopped: {d.heights()}")
    view = poll(functools.partial(d.leading, victim), LEADER_WAIT_S, LEADER_POLL_S)
    if view is None:
        raise Abort(f"replica {victim} did not lead a view: {d.heights()}")
    return view


def _put_back(d: Drill, victim: int, copied: list[str]) -> ReplicaAudit:
    """Put the stopped replica's old copy back and declare the restore; what its store
    held just before (the votes it is about to forget)."""
    node_dir = d.spec.node_dir(victim)
    copy_dir = node_dir / STALE_COPY_DIR
    rolled_back = asyncio.run(read_replica(d.spec, victim))
    for name in REPLICA_DB_FILES:
        (node_dir / name).unlink(missing_ok=True)
    for name in copied:
        shutil.copy2(copy_dir / name, node_dir / name)
    shutil.rmtree(copy_dir, ignore_errors=True)
    (node_dir / RESTORE_MARKER_FILE).write_bytes(b"")  # declared afresh, as a restore must be
    return rolled_back


def _rollback_details(
    stale: ReplicaAudit, rolled_back: ReplicaAudit, forgotten: Mapping[int, bytes]
) -> dict[str, object]:
    return {
        "stale_committed_height": stale.committed_height,
        "stale_last_voted_view": stale.last_voted_view,
        "stale_last_proposed_view": stale.last_proposed_view,
        "last_voted_view_before_rollback": rolled_back.last_voted_view,
        "last_proposed_view_before_rollback": rolled_back.last_proposed_view,
        "forgotten_votes": len(forgotten),
        "forgotten_timeouts": len(set(rolled_back.signed_timeouts) - set(stale.signed_timeouts)),
        "forgotten_views": [min(forgotten, default=0), max(forgotten, default=0)],
    }


def _await_restored(
    d: Drill, fault: Fault, bystanders: list[int], up: list[int], restored_at: float
) -> None:
    """Commits resume once the restored replica has fenced; it and the bystanders catch up."""
    victim = fault.node
    assert victim is not None
    node_dir = d.spec.node_dir(victim)
    resumed = d.wait_commits(fault.height_at_fault, up, RECOVERY_TIMEOUT_S)
    if resumed is None:
        raise Abort(f"no commits after replica {victim}'s restore: {d.heights()}")
    fault.details["commits_resumed_s"] = round(resumed - restored_at, 3)
    back = d.wait_replica_back(victim)
    if back is None:
        raise Abort(f"restored replica {victim} did not catch up: {d.heights()}")
    fault.recovery_s = back - restored_at
    fault.details["restore_marker_removed"] = not (node_dir / RESTORE_MARKER_FILE).exists()
    d.say(f"commits resumed {resumed - restored_at:.2f} s after the restore")
    for b in bystanders:
        if d.wait_replica_back(b, among=up) is None:
            raise Abort(f"replica {b} did not catch up: {d.heights()}")


def byzantine(d: Drill) -> None:
    """One member turns Byzantine (quorumgate.ops.byzantine), restarted with the next
    attack of BYZANTINE_CYCLES each cycle; the honest members must stay up, refuse
    every attack message, and keep committing."""
    byz = d.n - 1
    honest = d.others(byz)
    started: dict[int, int] = {}  # honest member -> pid, as the drill last started it
    refused_total: Counter[str] = Counter()
    problems: list[str] = []
    for k in d.cycles():
        name, attacks, mode = BYZANTINE_CYCLES[k % len(BYZANTINE_CYCLES)]
        victim = honest[k % len(honest)]
        for i in honest:
            started[i] = d.cluster.pid(i, "replica") or started.get(i, 0)
        d.scrape_equivocations()
        d.cluster.stop([("replica", byz)])
        d.start(
            "replica",
            [byz],
            module=BYZANTINE_MODULE,
            env={"QUORUMGATE_BYZANTINE": ",".join(attacks)},
        )
        before = _honest_refusals(d, honest)
        oversized_before = _oversized_refused(d, byz)
        height = d.top(honest)
        at = time.monotonic()
        fault = d.fault(
            Fault(
                f"byzantine-{name}",
                byz,
                at - d.t0,
                pids_after=d.cluster.pids(["replica"], [byz]),
                height_at_fault=height,
                details={"attacks": list(attacks), "honest_action": mode},
            )
        )
        d.say(f"attack {k + 1}: replica {byz} runs {', '.join(attacks)} ({mode})")
        done = _honest_action(d, mode, victim, honest, height, started)
        if done is None:
            raise Abort(f"{name}: the honest members did not go on: {d.heights()}")
        fault.recovery_s = done - at

        seen = functools.partial(_attack_refused, d, name, byz, honest, before, oversized_before)
        refused = poll(seen, RESUME_TIMEOUT_S) or Counter()
        refused_total.update(refused)
        fault.details["refused_by_honest"] = dict(sorted(refused.items()))
        if not refused:
            problems.append(f"{name}: no honest member refused anything")
        for i in honest:
            pid = d.cluster.pid(i, "replica")
            if pid is None or pid != started[i]:
                problems.append(f"{name}: honest replica {i} exited (was pid {started[i]})")
        d.say(
            f"{name}: honest members at {d.heights(honest)} after {fault.recovery_s:.2f} s; "
            f"refused {dict(refused)}"
        )
    d.report.details["refused_by_honest"] = dict(sorted(refused_total.items()))
    d.check(
        "byzantine_contained",
        problems,
        "every honest replica stayed up and refused every attack: "
        + listed(f"{r} x{int(c)}" for r, c in sorted(refused_total.items())),
    )


def _honest_action(
    d: Drill, mode: str, victim: int, honest: list[int], height: int, started: dict[int, int]
) -> float | None:
    """What the honest members do under an attack (BYZANTINE_CYCLES); when they went on.
    `started` learns the pid of an honest member the drill restarted."""
    if mode == "commit":
        return d.wait_commits(height + ATTACK_HEIGHTS, honest, RESUME_TIMEOUT_S)
    elif mode == "restart":
        d.cluster.stop([("replica", victim)])
        d.start("replica", [victim])
        started[victim] = d.cluster.pid(victim, "replica") or 0
        return d.wait_commits(height + ATTACK_HEIGHTS, honest, RESUME_TIMEOUT_S)
    else:
        d.cluster.stop([("replica", victim)])
        others = [i for i in range(d.n) if i != victim]
        if d.wait_commits(height + ATTACK_HEIGHTS, others, RESUME_TIMEOUT_S) is None:
            raise Abort(f"no commits without replica {victim}: {d.heights()}")
        d.start("replica", [victim])
        started[victim] = d.cluster.pid(victim, "replica") or 0
        return d.wait_replica_back(victim)


def _attack_refused(
    d: Drill,
    name: str,
    byz: int,
    honest: Sequence[int],
    before: Mapping[int, tuple[int, Counter[str]]],
    oversized_before: int,
) -> Counter[str] | None:
    """What the honest members refused since `before`, once it shows the attack."""
    found = refusals_since(before, _honest_refusals(d, honest))
    # A message over the transport's limit never reaches the replica: the honest
    # side's gRPC resets the stream, as the attacker's log shows.
    oversized = _oversized_refused(d, byz) - oversized_before
    if oversized:
        found["transport_resource_exhausted"] = oversized
    wanted = "oversized" not in name or oversized > 0
    return found if found and wanted else None


def _oversized_refused(d: Drill, byz: int) -> int:
    try:
        text = (d.spec.node_dir(byz) / "replica.log").read_text(errors="replace")
    except OSError:
        return 0
    return text.count("code=RESOURCE_EXHAUSTED")


def _honest_refusals(d: Drill, honest: Sequence[int]) -> dict[int, tuple[int, Counter[str]]]:
    """Each honest replica's pid and its counts of peer messages dropped, by reason."""
    out: dict[int, tuple[int, Counter[str]]] = {}
    for i in honest:
        pid = d.cluster.pid(i, "replica")
        counters = d.cluster.dropped(i, METRICS_TIMEOUT_S) if pid is not None else None
        if pid is not None and counters is not None:
            out[i] = (pid, Counter(counters))
    return out


FAULTS: dict[str, Callable[[Drill], None]] = {
    "leader-kill": leader_kill,
    "wipe-replica": wipe_replica,
    "full-restart": full_restart,
    "sidecar-crash": sidecar_crash,
    "stale-restore": stale_restore,
    "byzantine": byzantine,
    "ship": ship_drill,
    "rotate-members": rotate_members,
    "stale-restore-epoch": stale_restore_epoch,
    "replace-member": replace_members,
    "grow-shrink": grow_shrink,
}
# What a drill sets up in the cluster directory before its nodes start.
PREPARE: dict[str, Callable[[Drill], None]] = {
    "wipe-replica": prepare_wipe_replica,
    "replace-member": prepare_replace,
    "grow-shrink": prepare_grow,
}
