"""Several hosts for real in one test (docs/operating.md, "Several hosts"): Linux network
namespaces on one bridge, each a machine with its own address, and a cluster controller
that starts each member's processes in its machine's namespace.

The bridge lives in a namespace of its own (the "hub"); the test reaches every machine
through one more link from its own namespace, as an operator's workstation would. A
machine can be added later (a new host for a replacement or a grown cluster), cut off and
healed (its cable in the hub down, then up), or taken away for good (its cable deleted).

Needs root and iproute2 (`ip`); `NEEDS_ROOT` is the skip mark the tests put on their
module.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import grpc
import pytest

from quorumgate.ops.nodes import node_command
from quorumgate.proto.clusterfile import ClusterSpec
from tests.support.live import LiveCluster

IP = shutil.which("ip")
NEEDS_ROOT = pytest.mark.skipif(
    IP is None or os.geteuid() != 0, reason="network namespaces need root and iproute2"
)
ROOT_ADDRESS_OCTET = 254  # the test's own address on the bridge: .254 of the subnet


def ip(*args: str) -> None:
    """One `ip` command; RuntimeError with its message when it fails."""
    assert IP is not None
    done = subprocess.run([IP, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Hosts:
    """Machines `ns[h]` at `addresses[h]` on a bridge in `hub`; `hub_side[h]` is machine
    h's cable. Machine h is member h's host unless a controller says otherwise."""

    tag: str
    subnet: str
    hub: str
    ns: list[str] = field(default_factory=list)
    hub_side: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    made: list[str] = field(default_factory=list)  # namespaces to delete, in order made

    def add(self) -> int:
        """A new machine on the bridge with the next address; its number."""
        h = len(self.ns)
        ns, inner, outer = f"qg{self.tag}n{h}", f"vq{self.tag}{h}a", f"vq{self.tag}{h}b"
        address = f"{self.subnet}.{h + 1}"
        assert h + 1 < ROOT_ADDRESS_OCTET
        ip("netns", "add", ns)
        self.made.append(ns)
        ip("link", "add", inner, "type", "veth", "peer", "name", outer)
        ip("link", "set", inner, "netns", ns)
        ip("link", "set", outer, "netns", self.hub)
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
        ip("-n", ns, "link", "set", inner, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", self.hub, "link", "set", outer, "master", "br0")
        ip("-n", self.hub, "link", "set", outer, "up")
        self.ns.append(ns)
        self.hub_side.append(outer)
        self.addresses.append(address)
        return h

    def cut(self, h: int) -> None:
        ip("-n", self.hub, "link", "set", self.hub_side[h], "down")

    def heal(self, h: int) -> None:
        ip("-n", self.hub, "link", "set", self.hub_side[h], "up")

    def remove(self, h: int) -> None:
        """Machine h is gone for good: its cable deleted (the veth pair with it)."""
        ip("-n", self.hub, "link", "del", self.hub_side[h])


@contextlib.contextmanager
def bridged_hosts(count: int) -> Iterator[Hosts]:
    """`count` machines on a fresh bridge, and the test's own link to it; every namespace
    and link made (also by `Hosts.add`) is deleted on the way out."""
    tag = secrets.token_hex(2)
    subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
    hosts = Hosts(tag, subnet, f"qg{tag}hub")
    root_link = f"vq{tag}r"
    try:
        ip("netns", "add", hosts.hub)
        hosts.made.append(hosts.hub)
        ip("-n", hosts.hub, "link", "set", "lo", "up")
        ip("-n", hosts.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", hosts.hub, "link", "set", "br0", "up")
        for _ in range(count):
            hosts.add()
        # The test's own way in.
        ip("link", "add", root_link, "type", "veth", "peer", "name", f"vq{tag}h")
        ip("link", "set", f"vq{tag}h", "netns", hosts.hub)
        ip("-n", hosts.hub, "link", "set", f"vq{tag}h", "master", "br0")
        ip("-n", hosts.hub, "link", "set", f"vq{tag}h", "up")
        ip("addr", "add", f"{subnet}.{ROOT_ADDRESS_OCTET}/24", "dev", root_link)
        ip("link", "set", root_link, "up")
        yield hosts
    finally:
        with contextlib.suppress(RuntimeError):
            ip("link", "del", root_link)
        for ns in reversed(hosts.made):
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", ns)


class NamespacedCluster(LiveCluster):
    """LiveCluster whose member I runs on machine `homes.get(I, I)` of `hosts`, in that
    machine's namespace, from `spec`'s directory (for a new machine: the directory
    `init --join` made there)."""

    def __init__(
        self, spec: ClusterSpec, hosts: Hosts, homes: Mapping[int, int] | None = None
    ) -> None:
        super().__init__(spec)
        self.hosts = hosts
        self.homes = dict(homes or {})

    def namespace(self, index: int) -> str:
        return self.hosts.ns[self.homes.get(index, index)]

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
                [IP, "netns", "exec", self.namespace(index), *node_command(self.spec, index, kind)],
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
