"""How much time each process spends in the garbage collector (docs/benchmarks.md).

Put this folder first on PYTHONPATH and name an output folder: every Python process
started with that environment (the bench's replicas, sidecars and clients, replay's
executing process) counts its collections by generation and their time, and writes one
line at exit to `$QG_GC_PROBE_DIR/<pid>`:

    mkdir -p /tmp/gc && QG_GC_PROBE_DIR=/tmp/gc PYTHONPATH=scripts/gcprobe \\
        quorumgate bench --start --seconds 10 --warmup 2 --inflight 256 --runs 1
    cat /tmp/gc/*

A measuring aid for benchmarks, never imported by QuorumGate itself."""

from __future__ import annotations

import atexit
import gc
import os
import resource
import sys
import time
from typing import Any

_OUT = os.environ.get("QG_GC_PROBE_DIR")
_counts = [0, 0, 0]
_seconds = [0.0, 0.0, 0.0]
_started = [0.0]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    generation = int(info["generation"])
    _counts[generation] += 1
    _seconds[generation] += time.perf_counter() - _started[0]


def _write() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    line = (
        f"{' '.join(sys.argv)[-70:]} collections={_counts} "
        f"gc_s={[round(s, 3) for s in _seconds]} gc_total_s={sum(_seconds):.3f} "
        f"cpu_s={cpu:.2f} threshold={gc.get_threshold()}\n"
    )
    with open(os.path.join(_OUT or ".", str(os.getpid())), "w") as out:
        out.write(line)


if _OUT:
    gc.callbacks.append(_on_gc)
    atexit.register(_write)
