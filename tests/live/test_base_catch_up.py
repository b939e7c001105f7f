"""A member whose replica blocks and sidecar store were wiped rejoins a cluster whose every
other member pruned below the heights it lacks (docs/pruning.md, "A wiped replica behind
pruned peers"): its replica takes a peer's committed base with its commit proof and syncs
forward from there to the same blocks as the others; its sidecar then catches up from a
snapshot (`quorumgate replay --from-snapshot`) and signs what its peers sign."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import time
from collections.abc import Callable

import pytest

from quorumgate.ops.drills.nemesis import wipe_replica_blocks
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.replica.node import RESTORE_MARKER_FILE
from quorumgate.sidecar.snapshots import SNAPSHOT_DIR
from tests.live.test_pruning import ask_height_one, cli_replay, ledger_verify, start_pruning
from tests.live.test_snapshot_catch_up import HEIGHTS_AFTER, SIDECAR_FILES, _heights, executed
from tests.support.live import DB_FILES, WAIT_S, LiveCluster, wait_until

N = 4
WIPED = 3  # (cli_replay of tests/live/test_pruning.py replays member 3)
OTHERS = [i for i in range(N) if i != WIPED]
# Heights the others commit after the wiped replica restarts, which it must reach.
HEIGHTS_AFTER_RESTART = 6
HISTORY_FROM = re.compile(r"its committed log starts at height (\d+)")
INSTALLED = re.compile(r"event=installed_base height=(\d+) top=(\d+) from_peer=(\d+)")


# How the replica's store is lost: its blocks wiped, its safety record kept
# (`ReplicaStore.wipe_blocks`), or the whole file gone and a new one started as a
# declared restore, fenced (docs/consensus/fencing.md), as docs/pruning.md tells.
LOSSES = ("wipe_blocks", "new_store")


@pytest.mark.parametrize("loss", LOSSES)
def test_a_wiped_replica_catches_up_from_its_pruned_peers_base(
    live_cluster: Callable[..., LiveCluster], loss: str
) -> None:
    cluster, load = start_pruning(live_cluster, "base")
    spec = cluster.spec
    # Every other replica pruned its log above height 1: none can hand out height 1.
    starts = wait_until(
        "every other replica to have pruned its committed log",
        lambda: _all_pruned(spec, OTHERS),
        timeout_s=WAIT_S * 3,
        describe=cluster.describe,
    )
    # The whole member is lost: its replica's blocks, its sidecar's store and snapshots.
    assert cluster.kill(WIPED, signal.SIGTERM, kind="sidecar") == 0
    assert cluster.kill(WIPED, signal.SIGTERM) == 0
    before, after = asyncio.run(wipe_replica_blocks(spec, WIPED))
    assert before > max(starts.values()) and after == 0, (before, after)
    if loss == "new_store":
        for name in DB_FILES:
            (spec.node_dir(WIPED) / name).unlink(missing_ok=True)
        (spec.node_dir(WIPED) / RESTORE_MARKER_FILE).touch()
    for name in SIDECAR_FILES:
        (spec.node_dir(WIPED) / name).unlink(missing_ok=True)
    shutil.rmtree(spec.node_dir(WIPED) / SNAPSHOT_DIR, ignore_errors=True)

    restarted = time.monotonic()
    cluster.restart(WIPED)
    goal = max(cluster.heights(OTHERS).values()) + HEIGHTS_AFTER_RESTART
    cluster.wait_height(goal, [WIPED], timeout_s=WAIT_S * 2)
    caught_up_s = time.monotonic() - restarted
    marker = spec.node_dir(WIPED) / RESTORE_MARKER_FILE
    wait_until("the restored replica's fence to be behind it", lambda: not marker.exists())

    log = (spec.node_dir(WIPED) / "replica.log").read_text()
    installed = INSTALLED.search(log)
    assert installed is not None, "the wiped replica logged no installed base"
    base, peer = int(installed.group(1)), int(installed.group(3))
    assert peer in OTHERS and base >= min(starts.values()), (base, starts)
    # Its log starts at the base, as a pruned one does.
    said = asyncio.run(ask_height_one(spec, WIPED))
    assert said is not None and f"starts at height {base} " in said, said
    # Above the base, the same blocks as each other member still holds.
    top = min(cluster.heights(range(N)).values())
    mine = {b.height: b.hash for b in cluster.committed_blocks(WIPED, base, top)}
    for other in OTHERS:
        low = max(base, _history_from(spec, other))
        theirs = cluster.committed_blocks(other, low, top)
        assert theirs and all(mine[b.height] == b.hash for b in theirs), f"node {other} differs"
    print(f"{loss}: base {base}, height {goal} {caught_up_s:.1f} s after the replica's restart")
    _sidecar_from_snapshot(cluster, base)
    load.stop()
    cluster.assert_no_equivocation_seen()


def _sidecar_from_snapshot(cluster: LiveCluster, base: int) -> None:
    """The operator's step for the sidecar (docs/pruning.md): its replica holds nothing
    below the base, so it starts from the newest snapshot its peers attest."""
    spec = cluster.spec
    result = cli_replay(spec, "--from-snapshot", "--json", "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    snapshot = report["snapshot"]
    assert snapshot is not None and snapshot["height"] >= base, snapshot
    assert report["mismatches"] == []
    cluster.start_sidecars([WIPED])
    goal = max(executed(spec, i) for i in OTHERS) + HEIGHTS_AFTER
    wait_until(
        f"every sidecar past height {goal}",
        lambda: min(executed(spec, i) for i in range(N)) >= goal,
        timeout_s=WAIT_S * 2,
        describe=lambda: f"executed {[executed(spec, i) for i in range(N)]}",
    )
    low = max(snapshot["height"] + 1, goal - 2)
    mine = asyncio.run(_heights(spec, WIPED, low, goal))
    for peer in OTHERS:
        theirs = asyncio.run(_heights(spec, peer, low, goal))
        assert mine == theirs, f"sidecars {WIPED} and {peer} signed differently"
    verified = ledger_verify(spec, WIPED)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _all_pruned(spec: ClusterSpec, indexes: list[int]) -> dict[int, int] | None:
    starts = {i: _history_from(spec, i) for i in indexes}
    return starts if min(starts.values()) > 1 else None


def _history_from(spec: ClusterSpec, index: int) -> int:
    said = asyncio.run(ask_height_one(spec, index))
    found = HISTORY_FROM.search(said or "")
    return int(found.group(1)) if found else 1
