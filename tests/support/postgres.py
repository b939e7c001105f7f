"""A real PostgreSQL server for the audit tests (docs/audit.md): Debian's binaries,
initialised in a temporary directory and listening on a free loopback port, run as an
unprivileged user when the tests run as root (initdb refuses root), and stopped in a
finalizer whether the tests passed or not."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from quorumgate.proto.clusterfile import free_loopback_ports

PG_START_S = 30  # pg_ctl -w waits at most this long for the server
PG_USER_WHEN_ROOT = "nobody"


def pg_binary(name: str) -> str:
    """`initdb` or `pg_ctl` from PATH, or from Debian's /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not candidates:
        pytest.fail(f"no {name}: install PostgreSQL (apt-get install -y postgresql)")
    return candidates[-1]


def _free_port() -> int:
    return free_loopback_ports(1)[0]  # outside the range client sockets take


def _as_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", PG_USER_WHEN_ROOT, "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass(frozen=True)
class PgServer:
    """A running test server: its DSN, and the commands that stop it and start it again
    (the `ship` drill's --db-stop-cmd and --db-start-cmd, docs/drills.md)."""

    dsn: str
    stop_cmd: tuple[str, ...]
    start_cmd: tuple[str, ...]


@contextlib.contextmanager
def running_postgres() -> Iterator[PgServer]:
    root = Path(tempfile.mkdtemp(prefix="qg-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, PG_USER_WHEN_ROOT)
    data, port = root / "data", _free_port()
    subprocess.run(
        _as_user([pg_binary("initdb"), "-D", str(data), "-U", "qg", "--auth=trust", "-E", "UTF8"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"
    pg_ctl = pg_binary("pg_ctl")
    start = _as_user([pg_ctl, "-D", str(data), "-o", options, "-w", "-t", str(PG_START_S),
                      "-l", str(root / "log"), "start"])  # fmt: skip
    try:
        subprocess.run(start, check=True, stdout=subprocess.DEVNULL)
        yield PgServer(
            f"postgresql://qg@127.0.0.1:{port}/postgres",
            tuple(_as_user([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"])),
            tuple(start),
        )
    finally:
        subprocess.run(
            _as_user([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres_dsn() -> Iterator[str]:
    with running_postgres() as server:
        yield server.dsn


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[PgServer]:
    with running_postgres() as server:
        yield server
