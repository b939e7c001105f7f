"""The collector's settings of a replica or sidecar process (`tune_gc`), checked in a
child interpreter: freezing would otherwise change the test process itself."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc
from quorumgate.runtime.process import GC_GEN0_THRESHOLD, tune_gc
before = gc.get_threshold()
assert gc.get_freeze_count() == 0, gc.get_freeze_count()
kept = [[i] for i in range(1000)]
tune_gc()
after = gc.get_threshold()
assert after == (GC_GEN0_THRESHOLD, before[1], before[2]), (before, after)
assert gc.get_freeze_count() >= len(kept), gc.get_freeze_count()
assert gc.isenabled()
print("ok")
"""


def test_tune_gc_freezes_what_is_alive_and_raises_the_youngest_threshold() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
