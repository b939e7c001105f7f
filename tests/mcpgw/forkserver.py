"""Start a Python MCP server for a test without paying for its imports each time.

The gateway's attack tests start a fresh gateway for every test, and each gateway starts
its upstreams as subprocesses over stdio; a server written on the official SDK spends
about a second of CPU importing it (pydantic models of every protocol era) before it
answers. So a fork server imports those modules once, and an upstream's command becomes
a small standard-library-only launcher (`python -I -S forkserver.py connect ...`) that
hands its standard input, output and error to the fork server (SCM_RIGHTS, unix(7)),
which forks a child that runs the server script on them as `__main__`. The gateway still
speaks MCP over the pipes the SDK made for the process it started, and the server is the
same script, run afresh from its first line in a process of its own.

The launcher stays until the server exits and then exits with its status, so the SDK's
shutdown (close stdin, wait, then signal) sees the same lifetime: a signal the launcher
gets is passed on to the server. When the fork server goes, the servers it forked run on
until their standard input ends, as they would have.

    python forkserver.py serve SOCKET MODULE...            # import MODULEs, then serve
    python -I -S forkserver.py connect SOCKET SCRIPT ARG...  # run SCRIPT as a server
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
from typing import Any

MESSAGE_BYTES_MAX = 1 << 20  # the launcher's environment and arguments
REAP_EVERY_S = 0.05


def connect(path: str, script: str, args: list[str]) -> int:
    """The launcher: the upstream's command. Exits with the server's status."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    request = {"script": script, "args": args, "env": dict(os.environ)}
    socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
    # The server holds the pipes now: end-of-file on them follows it alone.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    pid = int(sock.recv(64))

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    status = sock.recv(64)
    return int(status) if status else 1


def run_child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: the server script as `__main__` on the launcher's stdio."""
    import runpy
    import traceback

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
    code = 0
    try:
        runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    os._exit(code)


def serve(path: str, modules: list[str]) -> None:
    """The fork server: import `modules`, then fork a server for each launcher."""
    import importlib

    for module in modules:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # the socket appears once it accepts
    waiting: dict[int, socket.socket] = {}  # server pid -> its launcher's connection
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        ready, _, _ = select.select([listener], [], [], REAP_EVERY_S)
        if ready:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES_MAX, 3)
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for other in waiting.values():
                    other.close()
                run_child(json.loads(message), fds)
            for fd in fds:
                os.close(fd)
            conn.send(str(pid).encode())
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            with contextlib.suppress(OSError):  # a launcher killed: nobody to tell
                conn.send(str(os.waitstatus_to_exitcode(status) & 0xFF).encode())
            conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "connect":
        sys.exit(connect(sys.argv[2], sys.argv[3], sys.argv[4:]))
    serve(sys.argv[2], sys.argv[3:])
