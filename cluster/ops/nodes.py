"""Starting, watching and stopping a cluster's processes on this machine.

`up` starts each member as its own OS process (`python -m quorumgate.replica.node`), in its own
session so a Ctrl-C in the terminal reaches only the CLI, which then stops them in order.
Every process writes its pid file; `down` signals only processes whose pid file and command
line both say they are that node of that cluster directory, so a recycled pid is never hit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.runtime.channels import sync_channel

PID_FILE = "replica.pid"  # the replica's; the sidecar's is sidecar.pid
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
STATUS_RPC_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.05


class OpsError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class NodeStatus:
    index: int
    address: str
    alive: bool
    pid: int | None
    height: int | None = None
    view: int | None = None
    leader: int | None = None
    peers: int | None = None
    mempool: int | None = None
    epoch: int | None = None  # consensus epoch (docs/consensus/epochs.md)
    error: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.index,
            "address": self.address,
            "alive": self.alive,
            "pid": self.pid,
            "height": self.height,
            "view": self.view,
            "leader": self.leader,
            "peers_connected": self.peers,
            "mempool_txs": self.mempool,
            "epoch": self.epoch,
            "error": self.error or None,
        }


MODULES = {"replica": "quorumgate.replica.node", "sidecar": "quorumgate.sidecar.node"}


def node_command(
    spec: ClusterSpec, index: int, kind: str = "replica", module: str | None = None
) -> list[str]:
    """The command line of a member's `kind` process (`module`: another program in its
    place, such as the drills' Byzantine replica)."""
    directory = str(spec.directory.resolve())
    program = module or MODULES[kind]
    return [sys.executable, "-m", program, "--dir", directory, "--node", str(index)]


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def running_pid(spec: ClusterSpec, index: int, kind: str = "replica") -> int | None:
    """The pid of the `kind` process of node `index` of this cluster if it runs, else None."""
    pid_path = spec.node_dir(index) / f"{kind}.pid"
    try:
        pid = int(pid_path.read_text().strip())
    except (OSError, ValueError):
        return None
    cmd = _cmdline(pid)
    if cmd is None:
        return None
    want = node_command(spec, index, kind)[1:]
    return pid if cmd[1:] == want else None


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ports(spec: ClusterSpec, index: int, kind: str) -> list[tuple[str, int]]:
    m = spec.member(index)
    if kind == "replica":
        return [("replica", m.replica_port), ("replica metrics", m.metrics_port)]
    return [("sidecar", m.sidecar_port), ("sidecar metrics", m.sidecar_metrics_port)]


def start_nodes(
    spec: ClusterSpec,
    indexes: list[int],
    kind: str = "replica",
    *,
    module: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[int, subprocess.Popen[bytes]]:
    """Start the `kind` process of the given members; refuse, starting nothing, if one is
    running already or one of its ports is taken. `module` and `env` (added to this
    process's environment) replace the program, for drills."""
    for i in indexes:
        pid = running_pid(spec, i, kind)
        if pid is not None:
            raise OpsError(f"{kind} {i} is already running (pid {pid}); `quorumgate down` first")
        host = spec.member(i).host
        for name, port in _ports(spec, i, kind):
            if not _port_free(host, port):
                raise OpsError(f"port {port} ({name} of node {i}) on {host} is in use")
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for i in indexes:
        node_dir = spec.node_dir(i)
        node_dir.mkdir(mode=0o700, exist_ok=True)
        with open(node_dir / f"{kind}.out", "ab") as out:
            procs[i] = launch_node(
                node_command(spec, i, kind, module),
                None if env is None else {**os.environ, **env},
                out,
            )
    return procs


def popen_node(
    command: list[str], env: Mapping[str, str] | None, out: IO[bytes]
) -> subprocess.Popen[bytes]:
    """Start a node's process afresh: `command` with `env` (None: this process's), its
    output and errors to `out`, in a session of its own."""
    return subprocess.Popen(
        command,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


# How `start_nodes` starts a node's process. The tests replace it with one that forks the
# node from a process that imported it already (tests/support/nodefork.py, and
# docs/development.md on process start); everything else starts each node afresh.
launch_node: Callable[[list[str], Mapping[str, str] | None, IO[bytes]], subprocess.Popen[bytes]]
launch_node = popen_node


def start_sidecars(spec: ClusterSpec, indexes: list[int]) -> dict[int, subprocess.Popen[bytes]]:
    return start_nodes(spec, indexes, "sidecar")


def sidecar_status(
    spec: ClusterSpec, index: int, timeout_s: float = STATUS_RPC_TIMEOUT_S
) -> spb.SidecarStatusReply | None:
    with sync_channel(spec, index, "sidecar") as channel:
        stub = spb_grpc.SidecarStub(channel)
        try:
            reply: spb.SidecarStatusReply = stub.Status(
                spb.SidecarStatusRequest(), timeout=timeout_s
            )
        except grpc.RpcError:
            return None
    return reply


def query_status(
    spec: ClusterSpec, index: int, timeout_s: float = STATUS_RPC_TIMEOUT_S
) -> NodeStatus:
    m = spec.member(index)
    pid = running_pid(spec, index)
    with sync_channel(spec, index) as channel:
        stub = cpb_grpc.ReplicaStub(channel)
        try:
            reply = stub.Status(cpb.StatusRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            return NodeStatus(index, m.replica_address, False, pid, error=err.code().name)
    return NodeStatus(
        index,
        m.replica_address,
        True,
        pid,
        height=reply.committed_height,
        view=reply.view,
        leader=reply.leader,
        peers=len(reply.peers_connected),
        mempool=reply.mempool_txs,
        epoch=reply.epoch,
    )


def _wait_ready(
    spec: ClusterSpec,
    indexes: list[int],
    procs: dict[int, subprocess.Popen[bytes]] | None,
    timeout_s: float,
    kind: str,
) -> None:
    """Return once every listed member's `kind` answers Status; raise with its log tail if
    one died, or naming the stragglers at the deadline."""
    deadline = time.monotonic() + timeout_s
    waiting = set(indexes)
    while waiting:
        for i in sorted(waiting):
            proc = (procs or {}).get(i)
            if proc is not None and proc.poll() is not None:
                raise OpsError(
                    f"{kind} {i} exited with status {proc.returncode}: {last_words(spec, i, kind)}"
                    f" (all of it in {output_path(spec, i, kind)})"
                )
            if kind == "replica":
                ready = query_status(spec, i, timeout_s=0.5).alive
            else:
                ready = sidecar_status(spec, i, timeout_s=0.5) is not None
            if ready:
                waiting.discard(i)
        if waiting and time.monotonic() > deadline:
            first = min(waiting)
            raise OpsError(
                f"{kind}s {sorted(waiting)} did not start serving in {timeout_s:.0f} s; "
                f"{kind} {first} last wrote: {last_words(spec, first, kind)} "
                f"(see {output_path(spec, first, kind)})"
            )
        if waiting:
            time.sleep(POLL_INTERVAL_S)


def wait_serving(
    spec: ClusterSpec,
    indexes: list[int],
    procs: dict[int, subprocess.Popen[bytes]] | None = None,
    timeout_s: float = READY_TIMEOUT_S,
) -> None:
    _wait_ready(spec, indexes, procs, timeout_s, "replica")


def wait_sidecars_serving(
    spec: ClusterSpec,
    indexes: list[int],
    procs: dict[int, subprocess.Popen[bytes]] | None = None,
    timeout_s: float = READY_TIMEOUT_S,
) -> None:
    _wait_ready(spec, indexes, procs, timeout_s, "sidecar")


def output_path(spec: ClusterSpec, index: int, kind: str = "replica") -> Path:
    """Where a node process's own stdout and stderr go (`up` redirects them there)."""
    return spec.node_dir(index) / f"{kind}.out"


def last_words(spec: ClusterSpec, index: int, kind: str = "replica") -> str:
    """The last line a node process wrote to its output: on a fatal start, the reason."""
    try:
        lines = output_path(spec, index, kind).read_text(errors="replace").splitlines()
    except OSError:
        return "(no output)"
    said = [line.strip() for line in lines if line.strip()]
    return said[-1] if said else "(no output)"


def log_tail(spec: ClusterSpec, index: int, lines: int = 15, kind: str = "replica") -> str:
    node_dir = spec.node_dir(index)
    text = ""
    for name in (f"{kind}.out", f"{kind}.log"):
        with contextlib.suppress(OSError):
            text += (node_dir / name).read_text(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def stop_nodes(
    spec: ClusterSpec, indexes: list[int] | None = None, *, kill: bool = False
) -> list[int]:
    """Stop what `up` started for this directory (SIGTERM, then SIGKILL after a bound):
    each member's sidecar, then its replica. Returns the members that had something."""
    with _interrupts_held():
        stopped = set(_stop_kind(spec, indexes, kill, "sidecar"))
        stopped.update(_stop_kind(spec, indexes, kill, "replica"))
    return sorted(stopped)


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM are ignored while the nodes are being stopped: a second one
    (pressed twice, or sent to the whole process group by a supervisor that also signals
    the command: `timeout` does) used to cut the stop short and leave them running. The
    stop is bounded (SIGKILL after `STOP_TIMEOUT_S`), so nothing waits on it for long."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals (and may set their handlers)
        return
    held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def _stop_kind(spec: ClusterSpec, indexes: list[int] | None, kill: bool, kind: str) -> list[int]:
    targets: dict[int, int] = {}
    for i in indexes if indexes is not None else range(spec.n):
        pid = running_pid(spec, i, kind)
        if pid is not None:
            targets[i] = pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
    signalled = sorted(targets)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while targets and time.monotonic() < deadline:
        for i, pid in list(targets.items()):
            if _cmdline(pid) is None or _zombie(pid):
                del targets[i]
        if targets:
            time.sleep(POLL_INTERVAL_S)
    for pid in targets.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for i in signalled:
        # A SIGKILLed process leaves its pid file behind.
        (spec.node_dir(i) / f"{kind}.pid").unlink(missing_ok=True)
    return signalled


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def start_cluster(
    spec: ClusterSpec, indexes: list[int], timeout_s: float = READY_TIMEOUT_S
) -> list[subprocess.Popen[bytes]]:
    """Start each member's replica, then its sidecar, and return once all serve; on any
    failure stop whatever this call started and raise."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        replicas = start_nodes(spec, indexes, "replica")
        procs += replicas.values()
        wait_serving(spec, indexes, replicas, timeout_s)
        sidecars = start_nodes(spec, indexes, "sidecar")
        procs += sidecars.values()
        wait_sidecars_serving(spec, indexes, sidecars, timeout_s)
    except BaseException:
        # Only what this call started: a refused `up` never touches what was running.
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise
    return procs
