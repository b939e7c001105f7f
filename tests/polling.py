"""Bounded polling for the tests that wait on live processes.

No test sleeps for a condition: it polls `check` with a deadline (`quorumgate.sdk.polling`, which
the drills and the owner use too) and, past it, fails naming what it waited for (and,
given `describe`, what it saw last). The live suites wrap these with their own deadline
and polling step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from quorumgate.sdk.polling import poll_for

__all__ = ["poll_for", "until", "wait_until"]

T = TypeVar("T")


def wait_until(
    what: str,
    check: Callable[[], T | None],
    timeout_s: float,
    every_s: float,
    describe: Callable[[], str] | None = None,
) -> T:
    """As `poll_for`, but past the deadline fail with an AssertionError naming `what`."""
    result = poll_for(check, timeout_s, every_s)
    if result:
        return result
    seen = f"; last seen: {describe()}" if describe is not None else ""
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{seen}")


async def until(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """In an event loop whose own tasks must run meanwhile (an in-process server): yield
    to them until `check()` holds, `timeout_s` at most, else fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.01)
