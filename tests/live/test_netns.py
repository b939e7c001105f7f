"""Several hosts for real (docs/operating.md, "Several hosts"): the four members of a
cluster in four Linux network namespaces, each with its own address on one bridge,
`cluster.json` naming those addresses (`init_cluster(hosts=...)`, as `quorumgate init
--hosts` writes it), TLS on.

Cutting one member's link stalls nothing; cutting a second stops commits (two of four
cannot form a quorum); healing both resumes them; a member whose key is rotated while its
host is cut off follows the others into the new epoch once healed; and every member ends
with the same chain, its sidecar with the same state root. The bridge lives in a
namespace of its own (the "hub"); the test reaches the members through one more link from
its own namespace.

Needs root and `ip` (CI runs as root); skipped, saying so, without them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from quorumgate.ops.nodes import (
    MODULES,
    node_command,
    sidecar_status,
)
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from tests.support.live import LiveCluster, Load, wait_until

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
IP = shutil.which("ip")

pytestmark = pytest.mark.skipif(
    IP is None or os.geteuid() != 0, reason="network namespaces need root and iproute2"
)


def _ip(*args: str) -> None:
    assert IP is not None
    done = subprocess.run([IP, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Hosts:
    """Namespaces `ns[i]` on a bridge in `hub`; `hub_side[i]` is member i's cable."""

    tag: str
    hub: str
    ns: list[str]
    hub_side: list[str]
    addresses: list[str]

    def cut(self, member: int) -> None:
        _ip("-n", self.hub, "link", "set", self.hub_side[member], "down")

    def heal(self, member: int) -> None:
        _ip("-n", self.hub, "link", "set", self.hub_side[member], "up")


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    tag = secrets.token_hex(2)
    subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
    hub = f"qg{tag}hub"
    made: list[str] = []
    root_link = f"vq{tag}r"
    try:
        _ip("netns", "add", hub)
        made.append(hub)
        _ip("-n", hub, "link", "set", "lo", "up")
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "link", "set", "br0", "up")
        namespaces, hub_side, addresses = [], [], []
        for i in range(NODES):
            ns, inner, outer = f"qg{tag}n{i}", f"vq{tag}{i}a", f"vq{tag}{i}b"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "netns", hub)
            address = f"{subnet}.{i + 1}"
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", hub, "link", "set", outer, "master", "br0")
            _ip("-n", hub, "link", "set", outer, "up")
            namespaces.append(ns)
            hub_side.append(outer)
            addresses.append(address)
        # The test's own way in.
        _ip("link", "add", root_link, "type", "veth", "peer", "name", f"vq{tag}h")
        _ip("link", "set", f"vq{tag}h", "netns", hub)
        _ip("-n", hub, "link", "set", f"vq{tag}h", "master", "br0")
        _ip("-n", hub, "link", "set", f"vq{tag}h", "up")
        _ip("addr", "add", f"{subnet}.254/24", "dev", root_link)
        _ip("link", "set", root_link, "up")
        yield Hosts(tag, hub, namespaces, hub_side, addresses)
    finally:
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", root_link)
        for ns in reversed(made):
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", ns)


class NamespacedCluster(LiveCluster):
    """LiveCluster whose member I runs in namespace `hosts.ns[I]`."""

    def __init__(self, spec: ClusterSpec, hosts: Hosts) -> None:
        super().__init__(spec)
        self.hosts = hosts

    def spawn(
        self,
        kind: str,
        indexes: list[int],
        module: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> dict[int, subprocess.Popen[bytes]]:
        assert module is None and env is None, "a namespaced member runs its own program"
        return {i: self._popen(i, kind) for i in indexes}

    def _popen(self, index: int, kind: str) -> subprocess.Popen[bytes]:
        assert IP is not None
        node_dir = self.spec.node_dir(index)
        with open(node_dir / f"{kind}.out", "ab") as out:
            return subprocess.Popen(
                [IP, "netns", "exec", self.hosts.ns[index], *node_command(self.spec, index, kind)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def heights(self, indexes: Iterable[int] | None = None) -> dict[int, int]:
        """As LiveCluster's, but a member that does not answer (its link was cut, its
        channel's connection died with it) counts as height -1, and its channel is
        dialled afresh next time."""
        out = {}
        for i in self.alive() if indexes is None else indexes:
            try:
                out[i] = self.status(i).committed_height
            except grpc.RpcError:
                self.forget_channel(i)
                out[i] = -1
        return out

    def timeouts(self, index: int) -> float:
        return self.metrics(index).value(TIMEOUT_METRIC)


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
    first = {i: cluster.timeouts(i) for i in pair}
    wait_until(
        "the remaining pair to time out (stuck)",
        lambda: all(cluster.timeouts(i) > first[i] for i in pair) or None,
    )
    stuck_at = cluster.heights(pair)
    counted = {i: cluster.timeouts(i) for i in pair}
    wait_until(
        f"{STUCK_TIMEOUTS} more timeouts from each of the pair",
        lambda: all(cluster.timeouts(i) >= counted[i] + STUCK_TIMEOUTS for i in pair) or None,
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
