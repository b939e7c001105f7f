"""Start the tests' replicas and sidecars forked from a warm process.

A replica or a sidecar spends about 0.6 s of CPU importing its modules before it serves
(docs/development.md, on process start); the live tests and drills start a few hundred.
So in tests (never for `quorumgate up`), `cluster/ops/nodes.py`'s `launch_node` is this
module's `launch`: a warm process per pytest worker imports `quorumgate.replica.node`,
`quorumgate.sidecar.node` and the drills' Byzantine replica once, starts nothing (no
thread, no event loop, no gRPC channel or server: gRPC is not fork-safe once its threads
run, and it starts none on import; the warm process checks that it has one thread), and
forks each node from there. What the test gets back reads as the node started afresh:

- `pid` is the node's own: a signal to it reaches exactly that node.
- The node's command line (`/proc/PID/cmdline`, what `running_pid`, `down` and
  `LiveCluster` recognise a node by) is its own `python -m MODULE --dir D --node N`: the
  warm process is started with a long padding argument, and the child writes its command
  over that argument memory (what setproctitle(3) does, done here with ctypes; the
  kernel's `/proc/PID/stat` gives the area's bounds, proc(5) fields 48 and 49).
- The handle is a `subprocess.Popen` whose `poll`, `wait` and `returncode` report the
  node's exit status, sent by the warm process, which is the node's parent. It observes
  the exit with `waitid(..., WNOWAIT)` and reaps the node only once the handle read the
  status (or was dropped), so, as with a `Popen`, the pid cannot be recycled while the
  handle may still signal it.
- The node runs in a session of its own, on the test's standard input, output and error
  (the descriptors go over a unix socket, unix(7) SCM_RIGHTS), with every other
  descriptor closed, in the test's working directory and environment, signal handlers as
  Python sets them, `sys.argv` and `sys.path[0]` as `python -m` sets them, and its module
  run as `__main__` from its first line (`runpy`, as `-m` does). `random` reseeds in a
  forked child (CPython registers it with `os.register_at_fork`); `secrets`, PyNaCl
  (libsodium's default randombytes reads the kernel's) and OpenSSL (which reseeds on a
  new pid) keep no state a fork could share.
- The warm process kills the nodes it forked when the test process is gone (its parent
  changed: it looks twice a second) and when it is stopped (the suite's conftest stops it
  at the session's end). A handle dropped unread leaves its node running, as a dropped
  `Popen` does: the tests may still stop it by its pid file.

What it cannot give, and why tests stay meaningful: the node's parent is the warm
process, not the test; `/proc/PID/environ` is the warm process's (the node's `os.environ`
is the test's); and what the preloaded modules read at import (gRPC's `GRPC_*`, protobuf's
`PROTOCOL_BUFFERS_*`) was read in the warm process, so a start whose environment differs
there, or a command that is not `python -m MODULE ...`, is started afresh. Tests that
watch how a node starts or what it imports start it themselves (`QG_TEST_FORK_NODES=0`
starts every node afresh).

    python nodefork.py serve SOCKET PADDING MODULE...   # the warm process
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from quorumgate.ops import nodes

MESSAGE_BYTES_MAX = 1 << 20  # a request: the environment and the command
PARENT_CHECK_S = 0.5  # how often the warm process looks whether the tests are gone
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
TITLE_BYTES = 8192  # room for a node's command line over the warm process's arguments
PRELOAD = ("quorumgate.replica.node", "quorumgate.sidecar.node", "quorumgate.ops.byzantine")
SWITCH_ENV = "QG_TEST_FORK_NODES"  # "0": every node is started afresh
# Read by modules the warm process imports, at import: a start that sets them differently
# from the warm process is started afresh.
IMPORT_TIME_ENV_PREFIXES = ("GRPC_", "PROTOCOL_BUFFERS_", "PYTHON")


class ForkedNode(subprocess.Popen[bytes]):
    """A node forked by the warm process: `Popen`'s interface on its real pid; the exit
    status comes over `conn` from the warm process."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket) -> None:
        # Popen.__init__ would start a process; only the attributes its methods read.
        self.args = args
        self.pid = pid
        self.returncode = None
        self.stdin = self.stdout = self.stderr = None
        self._child_created = False  # Popen.__del__: nothing of ours to reap
        self._conn = conn
        self._status_lock = threading.Lock()

    def _read_status(self, timeout: float | None) -> None:
        with self._status_lock:
            if self.returncode is not None:
                return
            ready, _, _ = select.select([self._conn], [], [], timeout)
            if not ready:
                return
            data = self._conn.recv(64)
            # No status: the warm process ended, and killed its nodes as it did.
            self.returncode = int(data) if data else -signal.SIGKILL
            self._conn.close()  # the warm process reaps the node now

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_status(timeout)
        if self.returncode is None:
            assert timeout is not None
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped until the status is read: the pid is its
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class WarmProcess:
    """The warm process of this pytest worker."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="qg-nodes-")  # short: a unix path
        self.socket = str(Path(self._dir.name) / "warm.sock")
        self.env = dict(os.environ)
        with open(Path(self._dir.name) / "warm.out", "wb") as out:
            self._proc = subprocess.Popen(
                [sys.executable, __file__, "serve", self.socket, "-" * TITLE_BYTES, *preload],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal reaches the tests only
            )
        from tests.polling import wait_until

        try:
            wait_until(
                "the warm process listening",
                lambda: os.path.exists(self.socket) or self._proc.poll() is not None,
                START_TIMEOUT_S,
                0.02,
            )
            if self._proc.poll() is not None:
                said = (Path(self._dir.name) / "warm.out").read_text(errors="replace")
                raise RuntimeError(f"the warm process exited: {said[-2000:]}")
        except BaseException:
            self.stop()
            raise

    def fork(self, command: list[str], env: Mapping[str, str], out: IO[bytes]) -> ForkedNode:
        module, args = command[2], command[3:]
        request = {"module": module, "args": args, "env": dict(env), "cwd": os.getcwd()}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(self.socket)
            with open(os.devnull, "rb") as null:
                socket.send_fds(conn, [json.dumps(request).encode()], [null.fileno(), out.fileno()])
            reply = conn.recv(64)
            if not reply:
                raise RuntimeError("the warm process did not fork the node")
        except BaseException:
            conn.close()
            raise
        return ForkedNode(command, int(reply), conn)

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._dir.cleanup()


_warm: list[WarmProcess] = []
_warm_lock = threading.Lock()


def forkable(command: list[str], env: Mapping[str, str]) -> bool:
    """Whether a forked node would be the same as this command started afresh."""
    if os.environ.get(SWITCH_ENV) == "0":
        return False
    if len(command) < 3 or command[0] != sys.executable or command[1] != "-m":
        return False
    warm = _warm[0].env if _warm else dict(os.environ)
    return all(
        env.get(name) == warm.get(name)
        for name in {*env, *warm}
        if name.startswith(IMPORT_TIME_ENV_PREFIXES)
    )


def _process_environment() -> dict[str, str]:
    """What a program this process starts inherits: the C library's `environ`, which
    libraries may have changed behind `os.environ`'s back (curses sets COLUMNS and LINES)."""
    import ctypes

    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    env = {}
    i = 0
    while (entry := environ[i]) is not None:
        name, _, value = os.fsdecode(entry).partition("=")
        env[name] = value
        i += 1
    return env


def launch(
    command: list[str], env: Mapping[str, str] | None, out: IO[bytes]
) -> subprocess.Popen[bytes]:
    """`nodes.launch_node` in tests: fork the node from this worker's warm process."""
    env = _process_environment() if env is None else env
    if not forkable(command, env):
        return nodes.popen_node(command, env, out)
    with _warm_lock:
        if not _warm:
            _warm.append(WarmProcess())
    return _warm[0].fork(command, env, out)


def install() -> None:
    nodes.launch_node = launch


def uninstall() -> None:
    nodes.launch_node = nodes.popen_node
    while _warm:
        _warm.pop().stop()


# ------------------------------------------------------------------ the warm process


def _exit_code(info: Any) -> int:
    if info.si_code == os.CLD_EXITED:
        return int(info.si_status)
    return -int(info.si_status)  # killed or dumped: by that signal, as Popen says


def serve(path: str, modules: list[str]) -> tuple[dict[str, Any], list[int]]:
    """Import `modules`, then fork a node for each request. Returns only in a forked
    child: its request and descriptors."""
    import importlib

    for module in modules:
        importlib.import_module(module)
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        sys.exit(f"a thread runs after importing {modules}: forking it is not safe")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # the socket appears once it accepts
    # Node pid -> its handle's connection; None once the handle is dropped (a dropped
    # `Popen` leaves its process running too: the tests may still stop it by its pid
    # file), and the node is then reaped when it exits.
    running: dict[int, socket.socket | None] = {}
    told: set[int] = set()  # nodes that exited and whose status was sent
    parent = os.getppid()
    woken, wake = os.pipe()  # a node's exit wakes the loop (SIGCHLD through this pipe)
    for fd in (woken, wake):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    def reap(pid: int) -> None:
        os.waitpid(pid, 0)
        conn = running.pop(pid)
        if conn is not None:
            conn.close()
        told.discard(pid)

    def stop(*_: Any) -> None:
        for pid in list(running):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            reap(pid)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        if os.getppid() != parent:  # the tests that started it are gone
            stop()
        handles = {conn: pid for pid, conn in running.items() if conn is not None}
        ready, _, _ = select.select([listener, woken, *handles], [], [], PARENT_CHECK_S)
        if woken in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(woken, 512):
                    pass
        for conn in ready:
            # A handle writes nothing: it closed (status read, or the handle dropped).
            if conn in handles:
                pid = handles[conn]
                if pid in told:
                    reap(pid)
                else:
                    conn.close()
                    running[pid] = None
        for pid in [p for p in running if p not in told]:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is None:
                continue
            handle = running[pid]
            try:  # a zombie until its handle read this
                if handle is None:
                    raise OSError("no handle")
                handle.send(str(_exit_code(info)).encode())
                told.add(pid)
            except OSError:  # nobody to tell
                reap(pid)
        if listener in ready:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES_MAX, 2)
            started, start = os.pipe()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                for sock in (listener, conn, *running.values()):
                    if sock is not None:
                        sock.close()
                for fd in (woken, wake, started):
                    os.close(fd)
                return json.loads(message), [*fds, start]
            for fd in (*fds, start):
                os.close(fd)
            # As `Popen` returns once the program is exec'd: the pid goes back once the
            # node reads as itself (its command line, session, descriptors); end of file
            # if it failed before.
            os.read(started, 1)
            os.close(started)
            conn.send(str(pid).encode())
            running[pid] = conn


def _set_title(argv: list[str]) -> None:
    """Write `argv` over this process's argument memory, so that `/proc/self/cmdline`
    reads as `argv` (proc(5): `arg_start` and `arg_end`, fields 48 and 49 of `stat`)."""
    import ctypes

    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # fields[0] is field 3
    title = b"".join(part.encode() + b"\0" for part in argv)
    if len(title) > end - start:
        sys.exit(f"a node's command line is longer than {end - start} bytes")
    ctypes.memmove(start, title.ljust(end - start, b"\0"), end - start)


def run_node(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: the node's module as `__main__`, as `python -m` runs it."""
    import runpy

    for signum in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    os.setsid()
    os.dup2(fds[0], 0)
    os.dup2(fds[1], 1)
    os.dup2(fds[1], 2)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    module = request["module"]
    _set_title([sys.executable, "-m", module, *request["args"]])
    os.write(fds[2], b"s")  # started: the warm process may hand out the pid
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as Popen's close_fds
    sys.argv = ["-m", *request["args"]]  # runpy puts the module's path first, as -m does
    sys.path[0] = os.getcwd()  # as -m does
    sys.modules.pop(module, None)  # run afresh as __main__, not the imported copy
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    # Only the warm process runs this; a forked node returns from `serve` and runs its
    # module, then exits as any Python program does (threads joined, atexit, flush).
    run_node(*serve(sys.argv[2], sys.argv[4:]))
