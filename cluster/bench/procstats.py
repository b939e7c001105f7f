"""What the benchmarked processes cost, read from /proc (proc(5)): CPU seconds (utime +
stime) and peak resident set size (VmHWM), by process name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from quorumgate.proto.clusterfile import ClusterSpec

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_stat_cpu_ticks(text: str) -> int:
    """utime + stime, in clock ticks, from the text of /proc/PID/stat (proc(5): fields 14
    and 15, counted after the parenthesised command name, which may hold spaces and
    parentheses itself, hence the split at the last ')')."""
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state), so field N is fields[N - 3].
    return int(fields[14 - 3]) + int(fields[15 - 3])


def parse_status_hwm_kib(text: str) -> int | None:
    """VmHWM (peak resident set size), in KiB, from the text of /proc/PID/status."""
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` in seconds; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return parse_stat_cpu_ticks(text) / CLOCK_TICKS_PER_S


def rss_peak_mb(pid: int) -> float | None:
    """Peak resident set size of `pid` in MiB; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = parse_status_hwm_kib(text)
    return None if kib is None else round(kib / 1024, 1)


def cluster_pids(spec: ClusterSpec) -> dict[str, int]:
    """`replica-I` / `sidecar-I` -> pid, for those running now."""
    from quorumgate.ops.nodes import running_pid

    pids: dict[str, int] = {}
    for kind in ("replica", "sidecar"):
        for i in range(spec.n):
            pid = running_pid(spec, i, kind)
            if pid is not None:
                pids[f"{kind}-{i}"] = pid
    return pids


def _sample(pids: dict[str, int], read: Callable[[int], float | None]) -> dict[str, float]:
    """`read(pid)` for each named process still there to read."""
    values = {name: read(pid) for name, pid in pids.items()}
    return {name: value for name, value in values.items() if value is not None}


def sample_cpu(pids: dict[str, int]) -> dict[str, float]:
    return _sample(pids, cpu_seconds)


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in before if name in after}


def sample_rss(pids: dict[str, int]) -> dict[str, float]:
    return _sample(pids, rss_peak_mb)
