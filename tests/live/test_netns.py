"""Several hosts for real (docs/operating.md, "Several hosts"): the four members of a
cluster in four Linux network namespaces, each with its own address on one bridge,
`cluster.json` naming those addresses (`init_cluster(hosts=...)`, as `quorumgate init
--hosts` writes it), TLS on.

Cutting one member's link stalls nothing; cutting a second stops commits (two of four
cannot form a quorum); healing both resumes them; a member whose key is rotated while its
host is cut off follows the others into the new epoch once healed; and every member ends
with the same chain, its sidecar with the same state root. The namespaces, the bridge and
the controller that starts members in them are `tests/support/netns.py`'s.

Needs root and `ip` (CI runs as root); skipped, saying so, without them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc

from quorumgate.ops.nodes import MODULES, node_command, sidecar_status
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from tests.support.live import Load, wait_until
from tests.support.netns import NEEDS_ROOT, Hosts, NamespacedCluster

NODES = 4
HEIGHTS = 4  # heights committed to show progress
# Proposals keep flowing through every phase: an idle cluster goes quiet
# (docs/consensus/protocol.md), so progress, and the timeouts of a stuck pair, are shown
# under load. 2 agents x 10/s last 100 s, longer than the test.
LOAD_AGENTS, LOAD_PER_AGENT, LOAD_RATE_PER_S = 2, 1000, 10.0
STUCK_TIMEOUTS = 3  # timeouts each remaining replica signs while it commits nothing
TIMEOUT_METRIC = "qg_replica_timeouts_total"
ROTATED = 3  # the member whose key is rotated while its host is cut off
ROTATE_TIMEOUT_S = 180.0  # the command's own wait for a quorum in the next epoch, and more
pytestmark = NEEDS_ROOT


def _timeouts(cluster: NamespacedCluster, index: int) -> float:
    return cluster.metrics(index).value(TIMEOUT_METRIC)


def test_four_hosts_cut_one_cut_two_heal_with_tls(hosts: Hosts, tmp_path: Path) -> None:
    spec = init_cluster(tmp_path / "cluster", NODES, hosts=hosts.addresses)
    # TLS: every channel the test, the replicas and the sidecars open trusts only the
    # member's pinned certificate (runtime/channels.py); a plaintext peer could not connect.
    assert spec.transport == "tls" and [m.host for m in spec.members] == hosts.addresses
    assert MODULES["replica"] in node_command(spec, 0)
    cluster = NamespacedCluster(spec, hosts)
    load: Load | None = None
    try:
        cluster.start()
        cluster.start_sidecars()
        load = Load(
            cluster,
            "netns",
            agents=LOAD_AGENTS,
            per_agent=LOAD_PER_AGENT,
            batch=10,
            rate_per_s=LOAD_RATE_PER_S,
        )
        cluster.register(load.agents)
        load.start()
        everyone = list(range(NODES))
        cluster.wait_height(HEIGHTS, everyone)
        wait_until(
            "every member to hold a stream from each of the others",
            lambda: (
                all(
                    len(s.peers_connected) == NODES - 1 for s in cluster.statuses(everyone).values()
                )
                or None
            ),
        )

        # One member cut off: the other three go on.
        hosts.cut(3)
        cluster.wait_progress(HEIGHTS, [0, 1, 2])

        # A second: two of four form no quorum, so nothing commits.
        hosts.cut(2)
        stuck_at = _assert_stuck(cluster, [0, 1])

        # Healed: all four commit again, on one chain.
        hosts.heal(2)
        hosts.heal(3)
        top = max(stuck_at.values()) + HEIGHTS
        cluster.wait_height(top, everyone)
        cluster.assert_same_chain(everyone, top)
        cluster.assert_no_equivocation_seen(everyone)

        # A member's consensus key rotated while its host is cut off: the three others
        # cross the epoch boundary; healed, it catches up through the epoch proof and its
        # peers take its streams under the new key (docs/consensus/epochs.md).
        hosts.cut(ROTATED)
        others = [i for i in everyone if i != ROTATED]
        done = _rotate(spec, ROTATED)
        assert done.returncode == 0, done.stderr
        epoch = lambda i: cluster.status(i).epoch  # noqa: E731

        def healed_epoch(i: int) -> int | None:
            """The epoch of a member whose host was just healed: our own channel to it may
            have timed out while the host was cut, and then fails its first call."""
            try:
                return epoch(i)
            except grpc.RpcError as err:
                if err.code() is not grpc.StatusCode.UNAVAILABLE:
                    raise
                return None

        wait_until("the others in epoch 1", lambda: all(epoch(i) == 1 for i in others) or None)
        hosts.heal(ROTATED)
        wait_until(f"member {ROTATED} in epoch 1", lambda: healed_epoch(ROTATED) == 1 or None)
        top = max(cluster.heights(others).values()) + HEIGHTS
        cluster.wait_height(top, everyone)
        cluster.assert_same_chain(everyone, top)
        cluster.assert_no_equivocation_seen(everyone)

        # Each sidecar executed that chain, and none saw its state root disagree with the
        # roots its peers signed (the divergence alarm).
        _assert_sidecars_executed(spec, everyone, top)
    except BaseException:
        print(cluster.log_tails(), file=sys.stderr)
        if load is not None:
            print(f"load: {load.failures[:5]} refused {load.refused[:5]}", file=sys.stderr)
        raise
    finally:
        if load is not None:
            load.stop()
        cluster.close()


def _rotate(spec: ClusterSpec, member: int) -> subprocess.CompletedProcess[str]:
    """`quorumgate admin rotate-key --member`, run as an operator runs it, from the test's
    own namespace, which reaches every member's host."""
    command = [sys.executable, "-m", "quorumgate", "admin", "rotate-key", "--dir"]
    return subprocess.run(
        [*command, str(spec.directory), "--member", str(member), "--json"],
        capture_output=True,
        text=True,
        timeout=ROTATE_TIMEOUT_S,
        check=False,
    )


def _assert_stuck(cluster: NamespacedCluster, pair: list[int]) -> dict[int, int]:
    """The pair times out again and again and commits nothing; the heights it holds."""
    first = {i: _timeouts(cluster, i) for i in pair}
    wait_until(
        "the remaining pair to time out (stuck)",
        lambda: all(_timeouts(cluster, i) > first[i] for i in pair) or None,
    )
    stuck_at = cluster.heights(pair)
    counted = {i: _timeouts(cluster, i) for i in pair}
    wait_until(
        f"{STUCK_TIMEOUTS} more timeouts from each of the pair",
        lambda: all(_timeouts(cluster, i) >= counted[i] + STUCK_TIMEOUTS for i in pair) or None,
    )
    assert cluster.heights(pair) == stuck_at, "two of four members committed"
    return stuck_at


def _assert_sidecars_executed(spec: ClusterSpec, everyone: list[int], top: int) -> None:
    def sidecars_at() -> bool | None:
        statuses = [sidecar_status(spec, i) for i in everyone]
        return all(s is not None and s.executed_height >= top for s in statuses) or None

    wait_until(f"every sidecar to execute height {top}", sidecars_at)
    executed = {i: sidecar_status(spec, i) for i in everyone}
    assert all(s is not None and not s.diverged for s in executed.values()), executed
