"""Bounded polling: ask again until there is an answer or a deadline passes.

Whatever waits on another process (a drill on a replica, the owner on its transactions
executing, a test on a live cluster) asks with a deadline and a step, and never sleeps for
a condition it could have checked.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_for(check: Callable[[], T | None], timeout_s: float, every_s: float) -> T | None:
    """Call `check` every `every_s` until it returns something truthy, which is returned;
    None once `timeout_s` has passed without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            return None
        time.sleep(every_s)
