"""Start a Python program for a test without paying for its imports each time.

Some tests start the same Python program many times: the gateway's attack tests start a
fresh gateway for every test, and each starts its upstream MCP servers as subprocesses
over stdio (a server on the official SDK spends about a second of CPU importing it); the
command-line tests run `quorumgate` dozens of times, and each run imports the CLI and the
gRPC stack before it reads its first argument. So a fork server imports those modules
once, and the program's command becomes a small launcher that needs only the standard
library (`python -I -S forkserver.py connect ...`): it hands its working directory,
environment, standard input, output and error to the fork server (the descriptors with
SCM_RIGHTS, unix(7)), which forks a child that runs the program's script on them as
`__main__`, from its first line, in a process of its own.

The launcher stays until the program exits and then exits with its status, so whoever
started it sees the same lifetime: a signal the launcher gets is passed on to the
program, and if the launcher is killed outright (SIGKILL, as `subprocess.run` does at its
timeout) the fork server kills the program too. What a fork server cannot give is a
process started afresh by the kernel: its pid is not the launcher's and its command line
is the fork server's. Tests that signal a program by pid, find it by its command line,
or test how it starts run the program itself.

    python forkserver.py serve SOCKET MODULE...              # import MODULEs, then serve
    python -I -S forkserver.py connect SOCKET SCRIPT ARG...  # run SCRIPT through it
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
from pathlib import Path
from typing import Any

MESSAGE_BYTES_MAX = 1 << 20  # the launcher's environment and arguments
PARENT_CHECK_S = 0.5  # how often the server looks whether the tests that started it are gone
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
HANDED = (0, 1, 2)  # the launcher's standard input, output and error


class ForkServer:
    """A fork server with `preload` imported, for the tests of one process (one pytest
    worker); `stop()` ends it (the servers' programs still running are killed)."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="qg-fork-")  # short: a unix path
        self.socket = str(Path(self._dir.name) / "fork.sock")  # is at most 107 bytes
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "serve", self.socket, *preload],
            stdin=subprocess.DEVNULL,
        )
        from tests.polling import wait_until  # not in the launcher: it has no site-packages

        try:  # the socket appears once the server accepts
            wait_until(
                "the fork server listening",
                lambda: os.path.exists(self.socket) or self._proc.poll() is not None,
                START_TIMEOUT_S,
                0.02,
            )
            assert self._proc.poll() is None, f"the fork server exited: {self._proc.returncode}"
        except BaseException:
            self.stop()
            raise

    def command(self, script: str | Path, *args: str) -> list[str]:
        """The command line that runs `script` with `args` through this server."""
        launcher = [sys.executable, "-I", "-S", __file__, "connect", self.socket]
        return [*launcher, str(script), *args]

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._dir.cleanup()


_shared: dict[tuple[str, ...], ForkServer] = {}


def shared(preload: tuple[str, ...]) -> ForkServer:
    """This process's fork server with `preload` imported, started on first use; the
    suite's conftest stops them all at the session's end (`stop_shared`)."""
    if preload not in _shared:
        _shared[preload] = ForkServer(preload)
    return _shared[preload]


def stop_shared() -> None:
    while _shared:
        _shared.popitem()[1].stop()


# What a `quorumgate` command imports before it reads its arguments, and what the commands
# the tests run most import on top.
CLI_PRELOAD = (
    "quorumgate.cli",
    "quorumgate.ops.nodes",
    "quorumgate.ops.clientcli",
    "quorumgate.ops.backups",
    "quorumgate.sdk.client",
)


def quorumgate(*args: str) -> list[str]:
    """The command line of `quorumgate ARGS...`: the installed script, forked from this
    process's CLI fork server; `python -m quorumgate.cli` where no script is installed."""
    script = Path(sys.executable).parent / "quorumgate"
    if not script.exists():
        return [sys.executable, "-m", "quorumgate.cli", *args]
    return shared(CLI_PRELOAD).command(script, *args)


# ------------------------------------------------------------------ the launcher


def connect(path: str, script: str, args: list[str]) -> int:
    """The launcher. Exits with the program's status."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    request = {"script": script, "args": args, "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(sock, [json.dumps(request).encode()], list(HANDED))
    # The program holds the pipes now: end-of-file on them follows it alone.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in HANDED:
        os.dup2(null, fd)
    pid = int(sock.recv(64))

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    status = sock.recv(64)
    return int(status) if status else 1


# ------------------------------------------------------------------ the server


def run_child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: the script as `__main__` on the launcher's descriptors."""
    import runpy
    import traceback

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in zip(HANDED, fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))  # as for a script
    code = 0
    try:
        runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    os._exit(code & 0xFF)


def serve(path: str, modules: list[str]) -> None:
    """Import `modules`, then fork a child for each launcher that connects."""
    import importlib

    for module in modules:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # the socket appears once it accepts
    running: dict[int, socket.socket] = {}  # child pid -> its launcher's connection
    parent = os.getppid()
    # A child's exit wakes the loop at once (SIGCHLD through the wakeup pipe), so its
    # launcher exits as soon as the program did.
    woken, wake = os.pipe()
    for fd in (woken, wake):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    def stop(*_: Any) -> None:
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        if os.getppid() != parent:  # the tests that started it are gone
            stop()
        launchers = {conn: pid for pid, conn in running.items()}
        ready, _, _ = select.select([listener, woken, *launchers], [], [], PARENT_CHECK_S)
        if woken in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(woken, 512):
                    pass
        for conn in ready:
            if conn in launchers:  # a launcher never writes after its request: it died
                with contextlib.suppress(ProcessLookupError):
                    os.kill(launchers[conn], signal.SIGKILL)
        if listener in ready:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES_MAX, len(HANDED))
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                os.close(woken)
                os.close(wake)
                for other in running.values():
                    other.close()
                run_child(json.loads(message), fds)
            for fd in fds:
                os.close(fd)
            conn.send(str(pid).encode())
            running[pid] = conn
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = running.pop(pid)
            with contextlib.suppress(OSError):  # a launcher killed: nobody to tell
                conn.send(str(os.waitstatus_to_exitcode(status) & 0xFF).encode())
            conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "connect":
        sys.exit(connect(sys.argv[2], sys.argv[3], sys.argv[4:]))
    serve(sys.argv[2], sys.argv[3:])
