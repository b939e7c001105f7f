"""A replica whose database was deleted catches up from its peers."""

from __future__ import annotations

import signal
from collections.abc import Callable

from tests.support.live import WAIT_S, LiveCluster, Load, assert_each_committed_once, wait_until

N = 4
WIPED = 3
OTHERS = [i for i in range(N) if i != WIPED]
# Heights the others must commit while the wiped replica catches up: it rejoins a cluster
# that is moving, not one waiting for it.
HEIGHTS_DURING_CATCH_UP = 5


def test_wiped_replica_catches_up_to_the_same_hashes_while_the_others_keep_committing(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    """Node 3 is stopped, its replica.db (and -wal, -shm) deleted, and restarted empty,
    while proposals stream into the other three. It must fetch the committed chain from its
    peers (its catch-up requests are counted in its metrics), reach the others' height with
    the same hash at every height, and go on committing with them; the others must commit
    meanwhile, and every acknowledged proposal must commit exactly once.

    Safety of the wipe. Deleting the whole file also deletes the replica's safety record
    and its `signed_votes` audit table, so the restarted replica does not know which views
    it voted in. That is acceptable here only because the test first waits until the
    cluster's view is past every view the replica ever voted in (read from its stopped
    store): its core then votes only in views above them, so it cannot sign a second,
    different vote for a view it had voted in. The test checks that, too — every vote
    in its new audit table is for a view above its old ones. A wipe with no such wait, or
    one racing a cluster stuck in the same view, could equivocate; the operator's safe step
    is `ReplicaStore.wipe_blocks`, which keeps the safety record (the `wipe-replica` drill
    of docs/drills.md covers that stricter case).
    """
    cluster = live_cluster(N)
    load = Load(
        cluster, "wipe", agents=4, per_agent=1000, batch=20, rate_per_s=60, targets=OTHERS
    ).start()
    load.wait_acked(200)
    cluster.wait_progress(5)

    assert cluster.kill(WIPED, signal.SIGTERM) == 0, "node 3 did not exit cleanly on SIGTERM"
    old = cluster.read_store(WIPED)
    assert old.committed and old.signed_votes, "node 3 had committed and voted nothing"
    last_voted_view = max(old.signed_votes)
    cluster.wipe(WIPED)

    wait_until(
        f"the cluster to pass view {last_voted_view}, node 3's last vote",
        lambda: min(st.view for st in cluster.statuses(OTHERS).values()) > last_voted_view,
        describe=cluster.describe,
    )
    goal = max(cluster.heights(OTHERS).values())

    def others_past_goal() -> int | None:
        lowest = min(cluster.heights(OTHERS).values())
        return lowest if lowest > goal else None

    cluster.restart(WIPED)
    log = (cluster.spec.node_dir(WIPED) / "replica.log").read_text()
    started = [line for line in log.splitlines() if "event=started" in line]
    assert "height=0 " in started[-1], f"node 3 did not start empty: {started[-1]}"
    # The others go on committing without node 3 (3 of 4 make a quorum), and node 3 must
    # catch up to a height they reached after `goal`, taken as it was restarted: a target
    # that moved. (Asserting
    # that they moved on at the instant node 3 reached `goal` raced: while node 3 is away
    # every fourth view is its own and times out, and a catch-up of a few dozen heights
    # can fit inside one such pause.)
    moved_on = wait_until(
        f"the others to commit past height {goal} after node 3's restart",
        others_past_goal,
        describe=cluster.describe,
    )
    cluster.wait_height(moved_on, [WIPED])
    cluster.assert_same_chain([WIPED, *OTHERS], moved_on)
    cluster.wait_height(moved_on + HEIGHTS_DURING_CATCH_UP, range(N))
    assert cluster.metrics(WIPED).value("qg_replica_sync_requests_total") > 0, (
        "node 3 reached the others' height without a catch-up request"
    )

    load.stop()
    load.assert_clean()
    committed_at = cluster.wait_committed(load.acked, WIPED, timeout_s=WAIT_S)
    top = cluster.wait_height(max(committed_at.values()), range(N))
    chain = cluster.assert_same_chain([WIPED, *OTHERS], min(top.values()))
    assert_each_committed_once(load.acked, chain)
    cluster.assert_no_equivocation_seen()

    cluster.stop_all()
    new = cluster.read_store(WIPED)
    assert new.signed_votes, "node 3 voted nothing after its restart"
    assert min(new.signed_votes) > last_voted_view, (
        f"after the wipe node 3 voted at view {min(new.signed_votes)}, not above its last "
        f"vote before the wipe (view {last_voted_view})"
    )
    assert [b.hash for b in new.committed[: len(chain)]] == [b.hash for b in chain]
