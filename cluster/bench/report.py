"""The figures of a run, the median report over runs, and what they were measured on."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quorumgate.bench.load import LoadResult, RunOptions
from quorumgate.bench.procstats import cpu_delta
from quorumgate.bench.workers import ObserverResult
from quorumgate.ops.loadgen import LoadAgent
from quorumgate.proto.clusterfile import ClusterSpec


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (NaN for no values)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def _r(value: float | None, digits: int = 2) -> float | None:
    if value is None or math.isnan(value):
        return None
    return round(value, digits)


def median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _merge_counts(into: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def run_report(
    spec: ClusterSpec,
    options: RunOptions,
    results: list[LoadResult],
    observed: ObserverResult,
    cpu_before: dict[str, float],
    cpu_after: dict[str, float],
    rss: dict[str, float],
    load_cpu: dict[str, float],
) -> dict[str, Any]:
    full = not options.ordering_only
    seconds = options.seconds
    committed = sum(r.committed for r in results)
    completed = sum(r.completed for r in results)
    commit_ms = [x for r in results for x in r.commit_ms]
    done_ms = [x for r in results for x in r.done_ms]
    if not full:  # ordering only: every commit is a completion
        commit_ms = done_ms
    refused: dict[str, int] = {}
    for r in results:
        _merge_counts(refused, r.failed)
    deltas = cpu_delta(cpu_before, cpu_after)
    by_kind: dict[str, float] = {}
    for name, d in deltas.items():
        kind = name.split("-")[0]
        by_kind[kind] = by_kind.get(kind, 0.0) + d
    basis = completed if completed else 0
    cpu_total = sum(deltas.values())
    shape = options.shape()
    return {
        "mode": "full" if full else "ordering-only",
        "load": "open" if shape.open_loop else "closed",
        "nodes": spec.n,
        "clients": options.clients,
        "inflight": shape.inflight * options.clients if not shape.open_loop else None,
        "rate_offered_per_s": options.rate_per_s if shape.open_loop else None,
        "seconds": seconds,
        "committed": committed,
        "throughput_per_s": round(committed / seconds, 1),
        "p50_ms": _r(percentile(commit_ms, 0.50)),
        "p99_ms": _r(percentile(commit_ms, 0.99)),
        "mean_ms": _r(statistics.fmean(commit_ms)) if commit_ms else None,
        "certified": completed if full else None,
        "certified_per_s": round(completed / seconds, 1) if full else None,
        "cert_p50_ms": _r(percentile(done_ms, 0.50)) if full else None,
        "cert_p99_ms": _r(percentile(done_ms, 0.99)) if full else None,
        "cpu_s_per_proposal": _r(cpu_total / basis, 6) if basis else None,
        "cpu_s_per_proposal_by_kind": {
            k: _r(v / basis, 6) if basis else None for k, v in sorted(by_kind.items())
        },
        "cpu_cores_busy": _r(cpu_total / seconds, 2),
        "load_cpu_s_per_proposal": _r(sum(load_cpu.values()) / basis, 6) if basis else None,
        "rss_peak_mb": {
            "per_process": dict(sorted(rss.items())),
            "max": max(rss.values(), default=None),
        },
        "block_txs_mean": _r(observed.block_txs / observed.blocks, 1) if observed.blocks else None,
        "outcomes": dict(sorted(observed.outcomes.items())),
        "certificate_failures": observed.certifier.failures if full else None,
        "refused": refused,
        "retries": sum(r.retries for r in results),
        "shed": sum(r.shed for r in results),
        "unfinished": sum(r.unfinished for r in results),
        "submitted": sum(r.submitted for r in results),
    }


# Figures whose median over runs is reported (the others come from the median run).
MEDIAN_KEYS = (
    "throughput_per_s",
    "p50_ms",
    "p99_ms",
    "mean_ms",
    "certified_per_s",
    "cert_p50_ms",
    "cert_p99_ms",
    "cpu_s_per_proposal",
    "cpu_cores_busy",
    "load_cpu_s_per_proposal",
    "block_txs_mean",
)


def median_report(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Numbers are medians over the runs; counts and maps come from the run whose headline
    throughput is the median one; `runs` lists every run's headline figures."""
    assert runs, "at least one run"
    headline = (
        "certified_per_s" if runs[0].get("certified_per_s") is not None else "throughput_per_s"
    )
    ordered = sorted(runs, key=lambda r: r[headline] or 0.0)
    report = dict(ordered[len(ordered) // 2])
    for key in MEDIAN_KEYS:
        report[key] = _r(median_or_none([r.get(key) for r in runs]), 6 if "cpu_s" in key else 2)
    rss_max: dict[str, float] = {}
    for r in runs:
        for name, mb in r["rss_peak_mb"]["per_process"].items():
            rss_max[name] = max(rss_max.get(name, 0.0), mb)
    report["rss_peak_mb"] = {
        "per_process": dict(sorted(rss_max.items())),
        "max": max(rss_max.values(), default=None),
    }
    report["runs"] = len(runs)
    report["per_run"] = [
        {
            k: r.get(k)
            for k in (
                "throughput_per_s",
                "p50_ms",
                "p99_ms",
                "certified_per_s",
                "cert_p50_ms",
                "cert_p99_ms",
                "cpu_s_per_proposal",
            )
        }
        for r in runs
    ]
    return report


def machine_info() -> dict[str, Any]:
    """What the figures were measured on: CPU model, cores, memory, Python."""
    import platform

    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        mem_gib = round(int(first.split()[1]) / 1024 / 1024, 1)
    load = None
    with contextlib.suppress(OSError):
        load = os.getloadavg()[0]
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "load_average_1m_at_start": _r(load),
    }


def proposal_bytes(chain_id: str) -> int:
    """Serialized size of a bench proposal (the report states it)."""
    return len(LoadAgent.from_seed(chain_id, "size-probe").proposal(10**6)[0])
