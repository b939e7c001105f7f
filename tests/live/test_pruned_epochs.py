"""A replica that lost its store rejoins a pruned cluster past an epoch boundary
(docs/pruning.md, "A wiped replica behind pruned peers"; docs/consensus/epochs.md,
"Catching up"): 4 members with pruning on, member 1's consensus key rotated (epoch 1),
every other member pruned above the change block, then member 3's replica and sidecar
stores lost. Its replica learns the chain of epochs from its peers, checks it link by link
from the cluster file, takes a committed base of epoch 1 checked with epoch 1's keys and
syncs forward; its sidecar is caught up from a snapshot its peers attest and signs what
they sign. And a new machine replacing member 3, started only after the others pruned
above the change block that makes it a member, takes a base of that epoch.

Each test waits for a rotation or replacement and then for the pruning past it: 30 to 60 s
on an idle 2-core machine, longer under other load (docs/pruning.md has the runs)."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from quorumgate.proto.clusterfile import load_cluster
from quorumgate.replica.node import RESTORE_MARKER_FILE
from quorumgate.sidecar.snapshots import SNAPSHOT_DIR
from tests.live.test_base_catch_up import _all_pruned, _history_from, _sidecar_from_snapshot
from tests.live.test_pruning import ask_height_one, start_pruning
from tests.live.test_replace import quorumgate
from tests.live.test_snapshot_catch_up import SIDECAR_FILES
from tests.support.live import DB_FILES, WAIT_S, LiveCluster, wait_until

N = 4
WIPED = 3  # (the helpers of tests/live/test_base_catch_up.py replay member 3)
OTHERS = [i for i in range(N) if i != WIPED]
ROTATED = 1  # whose consensus key the owner rotates: the epoch boundary
HEIGHTS_AFTER_RESTART = 6
CLI_TIMEOUT_S = 120.0
INSTALLED = re.compile(r"event=installed_base height=(\d+) top=(\d+) from_peer=(\d+) epoch=(\d+)")


def _rotate(cluster: LiveCluster) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "quorumgate", "admin", "rotate-key", "--dir",
         str(cluster.spec.directory), "--member", str(ROTATED), "--json",
         "--deadline", str(WAIT_S)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_lost_member_catches_up_from_a_base_past_the_epoch_boundary(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    cluster, load = start_pruning(live_cluster, "epochbase")
    spec = cluster.spec
    cluster.wait_height(4, range(N))
    _rotate(cluster)
    wait_until(
        "every member in epoch 1",
        lambda: all(s.epoch == 1 for s in cluster.statuses(range(N)).values()),
    )
    # The change block lies at or below what every member committed once in epoch 1.
    boundary = max(cluster.heights(range(N)).values())
    starts = wait_until(
        f"every other replica pruned above height {boundary}",
        lambda: (s := _all_pruned(spec, OTHERS)) and min(s.values()) > boundary + 1 and s,
        timeout_s=WAIT_S * 3,
        describe=cluster.describe,
    )
    # The whole member is lost: a new replica store (declared restored, fenced), no
    # sidecar store, no snapshots.
    assert cluster.kill(WIPED, signal.SIGTERM, kind="sidecar") == 0
    assert cluster.kill(WIPED, signal.SIGTERM) == 0
    node_dir = spec.node_dir(WIPED)
    for name in (*DB_FILES, *SIDECAR_FILES):
        (node_dir / name).unlink(missing_ok=True)
    shutil.rmtree(node_dir / SNAPSHOT_DIR, ignore_errors=True)
    (node_dir / RESTORE_MARKER_FILE).touch()

    restarted = time.monotonic()
    cluster.restart(WIPED)
    goal = max(cluster.heights(OTHERS).values()) + HEIGHTS_AFTER_RESTART
    cluster.wait_height(goal, [WIPED], timeout_s=WAIT_S * 2)
    caught_up_s = time.monotonic() - restarted
    assert cluster.status(WIPED).epoch == 1
    marker = node_dir / RESTORE_MARKER_FILE
    wait_until("the restored replica's fence behind it", lambda: not marker.exists())

    log = (node_dir / "replica.log").read_text()
    installed = INSTALLED.search(log)
    assert installed is not None, "the lost replica logged no installed base"
    base, peer, epoch = int(installed.group(1)), int(installed.group(3)), int(installed.group(4))
    assert epoch == 1 and peer in OTHERS and base > boundary, (base, boundary, starts)
    assert "event=epoch_chain_learned" in log
    said = asyncio.run(ask_height_one(spec, WIPED))
    assert said is not None and f"starts at height {base} " in said, said
    top = min(cluster.heights(range(N)).values())
    mine = {b.height: b.hash for b in cluster.committed_blocks(WIPED, base, top)}
    for other in OTHERS:
        low = max(base, _history_from(spec, other))
        theirs = cluster.committed_blocks(other, low, top)
        assert theirs and all(mine[b.height] == b.hash for b in theirs), f"node {other} differs"
    print(f"base {base} (epoch 1, change block at or below {boundary}), height {goal} "
          f"{caught_up_s:.1f} s after the replica's restart")  # fmt: skip
    _sidecar_from_snapshot(cluster, base)
    load.stop()
    cluster.assert_no_equivocation_seen()


def test_a_new_machine_takes_a_base_of_the_epoch_that_makes_it_a_member(
    live_cluster: Callable[..., LiveCluster], tmp_path: Path
) -> None:
    """Member 3's host is gone for good; the owner replaces it by a new machine (`init
    --join`, `admin replace-member`) while that machine is still off, and every other
    member prunes above the change block. Started then, the new machine's replica follows
    epoch 0, learns the chain of epochs, takes a base of epoch 1 (where its key is member
    3's) and commits and votes there. Its sidecar is not started: the members' sidecars
    answer snapshot reads for the cluster file's receipt keys only (docs/pruning.md,
    Limits)."""
    cluster, load = start_pruning(live_cluster, "joinbase")
    spec = cluster.spec
    cluster.wait_height(4, range(N))
    assert cluster.kill(WIPED, signal.SIGTERM, kind="sidecar") == 0
    assert cluster.kill(WIPED, signal.SIGTERM) == 0
    join_dir = tmp_path / "new-machine"
    made = quorumgate(
        "init", "--join", "--cluster", str(spec.directory / "cluster.json"),
        "--index", str(WIPED), "--dir", str(join_dir),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    entry_file = tmp_path / "entry.json"
    entry_file.write_text(made.stdout)
    done = quorumgate(
        "admin", "replace-member", "--dir", str(spec.directory), "--member", str(WIPED),
        "--entry", str(entry_file), "--json", "--deadline", str(WAIT_S),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait_until(
        "the others in epoch 1",
        lambda: all(s.epoch == 1 for s in cluster.statuses(OTHERS).values()),
    )
    boundary = max(cluster.heights(OTHERS).values())
    wait_until(
        f"every other replica pruned above height {boundary}",
        lambda: (s := _all_pruned(spec, OTHERS)) and min(s.values()) > boundary + 1 and s,
        timeout_s=WAIT_S * 3,
        describe=cluster.describe,
    )
    joined = LiveCluster(load_cluster(join_dir))  # starts and stops the new machine
    view = LiveCluster(replace(spec, joined=joined.spec.member(WIPED)))  # reads it
    try:
        started = time.monotonic()
        joined.start([WIPED])
        goal = max(cluster.heights(OTHERS).values()) + HEIGHTS_AFTER_RESTART
        view.wait_height(goal, [WIPED], timeout_s=WAIT_S * 2)
        caught_up_s = time.monotonic() - started
        assert view.status(WIPED).epoch == 1
        log = (join_dir / f"node-{WIPED}" / "replica.log").read_text()
        installed = INSTALLED.search(log)
        assert installed is not None, "the new machine logged no installed base"
        base, epoch = int(installed.group(1)), int(installed.group(4))
        assert epoch == 1 and base > boundary, (base, boundary)
        top = min([*cluster.heights(OTHERS).values(), view.status(WIPED).committed_height])
        mine = {b.height: b.hash for b in view.committed_blocks(WIPED, base, top)}
        for other in OTHERS:
            low = max(base, _history_from(spec, other))
            theirs = cluster.committed_blocks(other, low, top)
            assert theirs and all(mine[b.height] == b.hash for b in theirs), other
        print(f"new machine: base {base} (epoch 1, change block at or below {boundary}), "
              f"height {goal} {caught_up_s:.1f} s after its start")  # fmt: skip
        load.stop()
        cluster.assert_no_equivocation_seen(OTHERS)
    finally:
        view.forget_channel(WIPED)
        joined.close()
