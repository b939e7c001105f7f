"""A stand-in for a node's program (`python -m tests.support.nodeprobe --dir D --node N`)
that reports what a test could observe of how it was started, so that
tests/live/test_nodefork.py can compare a forked start with a fresh one. With
`QG_PROBE=sleep` it waits instead, to be killed."""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import sys
import threading
import time
from pathlib import Path


def report() -> dict[str, object]:
    handlers = {}
    for signum in signal.valid_signals():
        with_handler = signal.getsignal(signum)
        handlers[int(signum)] = getattr(with_handler, "__name__", repr(with_handler))
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    from nacl.utils import random as nacl_random

    return {
        "name": __name__,
        "argv": sys.argv,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "cmdline": [p.decode() for p in Path("/proc/self/cmdline").read_bytes().split(b"\0") if p],
        "own_session": os.getsid(0) == os.getpid(),
        "fds": fds[:-1] if len(fds) > 3 else fds,  # the last one is listdir's own
        "fd_targets": [os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1)],
        "signals": handlers,
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "threads": threading.active_count(),
        "env": dict(os.environ),
        "line_buffering": [sys.stdout.line_buffering, sys.stderr.line_buffering],
        "random": [random.random(), secrets.token_hex(16), nacl_random(16).hex()],
    }


if __name__ == "__main__":
    if os.environ.get("QG_PROBE") == "sleep":
        print(os.getpid(), flush=True)
        time.sleep(120)
    print(json.dumps(report()), flush=True)
    sys.exit(3)
