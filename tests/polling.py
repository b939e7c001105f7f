"""Bounded polling for the tests that wait on live processes.

No test sleeps for a condition: it polls `check` with a deadline and, past it, fails
naming what it waited for (and, given `describe`, what it saw last). The live suites wrap
these with their own deadline and polling step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_for(check: Callable[[], T | None], timeout_s: float, every_s: float) -> T | None:
    """Call `check` every `every_s` until it returns something truthy, which is returned;
    at the deadline, return its last answer (falsy)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() >= deadline:
            return result
        time.sleep(every_s)


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
