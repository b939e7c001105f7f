"""`init` on one host picks its ports where no client socket can take them before `up`."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from pathlib import Path

from quorumgate.proto.clusterfile import (
    EPHEMERAL_LOW_DEFAULT,
    LOCAL_PORTS_LOW,
    PORT_FIELDS,
    ephemeral_low,
    free_loopback_ports,
    init_cluster,
)


def _ports(spec) -> list[int]:  # type: ignore[no-untyped-def]
    return [getattr(m, field) for m in spec.members for field in PORT_FIELDS]


def test_ports_lie_below_the_range_the_kernel_gives_client_sockets(tmp_path: Path) -> None:
    """Sockets bound to port 0 (as every outgoing connection is) never get a port that a
    fresh cluster file names, however many there are."""
    spec = init_cluster(tmp_path / "c", 7)
    ports = _ports(spec)
    assert len(set(ports)) == len(ports) == 28
    assert ports == list(range(ports[0], ports[0] + 28))  # one block, member by member
    assert min(ports) >= LOCAL_PORTS_LOW and max(ports) < ephemeral_low()
    with ExitStack() as stack:
        taken = set()
        for _ in range(200):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            taken.add(sock.getsockname()[1])
    assert not taken & set(ports)


def test_a_port_in_use_is_never_picked() -> None:
    with ExitStack() as stack:
        held = []
        for port in range(LOCAL_PORTS_LOW, LOCAL_PORTS_LOW + 40):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use already: just as good for this test
            held.append(port)
        # a range that only fits blocks overlapping the held ports, or the one just after
        ports = free_loopback_ports(4, high=LOCAL_PORTS_LOW + 48)
        assert not set(ports) & set(held)


def test_a_range_too_small_falls_back_to_ports_the_kernel_hands_out() -> None:
    ports = free_loopback_ports(8, high=LOCAL_PORTS_LOW + 4)
    assert len(set(ports)) == 8


def test_the_ephemeral_range_is_read_and_defaults_when_unknown(tmp_path: Path) -> None:
    path = tmp_path / "range"
    path.write_text("40000\t60999\n")
    assert ephemeral_low(path) == 40000
    path.write_text("garbage")
    assert ephemeral_low(path) == EPHEMERAL_LOW_DEFAULT
    assert ephemeral_low(tmp_path / "absent") == EPHEMERAL_LOW_DEFAULT
