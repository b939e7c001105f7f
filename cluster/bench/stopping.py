"""How a benchmark stops: its one error, and SIGINT or SIGTERM turned into a flag the
harness polls (a blocking gRPC call would turn KeyboardInterrupt into a cancelled RPC).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class BenchError(Exception):
    pass


class BenchInterrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwind (stopping what the harness started) and exit."""


# Signals seen by `bench_command`'s handlers. The harness polls this flag itself rather
# than relying on KeyboardInterrupt, which a blocking gRPC call turns into a cancelled RPC.
_signals_seen: list[int] = []


def _on_stop_signal(signum: int, frame: object) -> None:
    _signals_seen.append(signum)


def check_interrupted() -> None:
    if _signals_seen:
        raise BenchInterrupted(f"signal {_signals_seen[0]}")


def sleep_until(deadline: float) -> None:
    """Sleep until `deadline` (monotonic seconds), in steps, raising on a stop signal."""
    while True:
        check_interrupted()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.2))


@contextlib.contextmanager
def stop_signals_handled() -> Iterator[None]:
    """SIGINT and SIGTERM set a flag the harness checks (main thread only)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _signals_seen.clear()
    previous = {sig: signal.signal(sig, _on_stop_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
