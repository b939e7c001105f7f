#!/usr/bin/env python3
"""Shipping to PostgreSQL under load (docs/benchmarks.md, "Shipping to PostgreSQL"): the
rate at which `quorumgate ship` copies verdicts against the rate the cluster certifies
them, at W in flight (the closed-loop load of `quorumgate bench`), and the shipper's lag
behind the certified head, sampled from its `qg_ship_lag_heights` while the load runs.

The shipper runs as its own process (`python -m quorumgate ship`) beside a temporary
cluster this script starts (or the one in --dir); the database is the one --dsn names.
Each run: wait until the copy has caught up with the ledger, then run the load, sampling
sidecar 0's ledger entries, the copy's cursor and the shipper's lag every 0.2 s. Both rates
are counted over the same interval, the stretch of samples in which the ledger grew (the
agents' setup and the tail without load left out); `catch_up_s` is how long after the
load (the ledger's last growth) the copy held the whole ledger again.

    python scripts/bench_ship.py --dsn postgresql://qg@127.0.0.1:5432/postgres \
        [--nodes 4 | --dir D] [--seconds 10] [--runs 3] [--inflight 256] [--json]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quorumgate.bench.agents import AGENT_POOL_DEFAULT
from quorumgate.bench.harness import agent_nonces, check_serving, open_cluster, run_once
from quorumgate.bench.load import RunOptions
from quorumgate.bench.report import machine_info
from quorumgate.ops.drills.ship import ShipperProcess, copy_cursor
from quorumgate.ops.nodes import sidecar_status
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sdk.polling import poll_for

CATCH_UP_TIMEOUT_S = 120.0  # the copy reaching the ledger before a run, or after one
CATCH_UP_POLL_S = 0.05
SHIPPER_READY_TIMEOUT_S = 60.0  # the shipper process serving its metrics
SAMPLE_S = 0.2  # between two samples of the ledger, the copy and the lag
IDLE_SAMPLES_MAX = 3  # samples without ledger growth that end a stretch of load


@dataclass(frozen=True)
class ShipRun:
    """One run's figures. Rates in verdicts per second over the load's interval; lag in
    heights, the quantiles over the samples taken during the load."""

    seconds: float  # the interval the ledger grew
    certified: int  # verdicts the ledger gained during the load
    shipped: int  # verdicts the copy gained during the load
    certified_per_s: float
    shipped_per_s: float
    bench_certified_per_s: float | None  # `quorumgate bench`'s own figure for the window
    lag_samples: int
    lag_p50_heights: float | None
    lag_p99_heights: float | None
    lag_max_heights: float | None
    # verdicts certified and not yet copied (sidecar 0's ledger less the copy's cursor):
    # a height holds a block's verdicts, many under load
    backlog_p50_verdicts: float | None
    backlog_p99_verdicts: float | None
    catch_up_s: float | None  # from the load's end until the copy holds the whole ledger


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ledger_entries(spec: ClusterSpec) -> int | None:
    status = sidecar_status(spec, 0)
    return None if status is None else int(status.ledger_entries)


def copy_entries(spec: ClusterSpec, dsn: str) -> int | None:
    cursor = copy_cursor(dsn, spec.chain_id)
    return None if cursor is None else cursor[1]


def caught_up(spec: ClusterSpec, dsn: str) -> Callable[[], float | None]:
    def done() -> float | None:
        ledger, copied = ledger_entries(spec), copy_entries(spec, dsn)
        ok = ledger is not None and copied is not None and copied >= ledger
        return time.monotonic() if ok else None

    return done


@dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    ledger: int  # sidecar 0's ledger entries
    copied: int  # the copy's entries (its cursor)
    lag: float | None  # the shipper's qg_ship_lag_heights


class Sampler:
    """The ledger, the copy and the shipper's lag, every SAMPLE_S from a thread."""

    def __init__(self, spec: ClusterSpec, dsn: str, shipper: ShipperProcess) -> None:
        self.spec, self.dsn, self.shipper = spec, dsn, shipper
        self.samples: list[Sample] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ship-bench", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(SAMPLE_S):
            ledger, copied = ledger_entries(self.spec), copy_entries(self.spec, self.dsn)
            metrics = self.shipper.metrics()
            lag = metrics.value("qg_ship_lag_heights") if metrics is not None else None
            if ledger is not None and copied is not None:
                self.samples.append(Sample(time.monotonic(), ledger, copied, lag))

    def stop(self) -> list[Sample]:
        self.stopped.set()
        self.thread.join()
        return self.samples


def loaded(samples: list[Sample]) -> list[Sample]:
    """The stretch of samples in which the ledger grew the most, cut where it stood still
    for IDLE_SAMPLES_MAX samples in a row: the load's interval, without the agents' setup
    before it (a few owner transactions, then a pause while clients start and presign) or
    the tail after it."""
    best: list[Sample] = []
    start, still = 0, 0
    for k in range(1, len(samples) + 1):
        grew = k < len(samples) and samples[k].ledger > samples[k - 1].ledger
        still = 0 if grew else still + 1
        if k == len(samples) or still >= IDLE_SAMPLES_MAX:
            stretch = samples[start : k - still + 1]
            gain = stretch[-1].ledger - stretch[0].ledger if stretch else 0
            if gain > (best[-1].ledger - best[0].ledger if best else 0):
                best = stretch
            start = k
    return best


def one_run(
    spec: ClusterSpec, options: RunOptions, nonces: dict[str, int], dsn: str,
    shipper: ShipperProcess,
) -> ShipRun:  # fmt: skip
    """One load, the agents already registered (their owner transactions are verdicts too,
    a burst that is not the load's)."""
    if poll_for(caught_up(spec, dsn), CATCH_UP_TIMEOUT_S, CATCH_UP_POLL_S) is None:
        raise SystemExit("the copy did not catch up with the ledger before the run")
    sampler = Sampler(spec, dsn, shipper)
    report = run_once(spec, options, nonces)
    back = poll_for(caught_up(spec, dsn), CATCH_UP_TIMEOUT_S, CATCH_UP_POLL_S)
    samples = sampler.stop()
    window = loaded(samples)
    if len(window) < 2:
        raise SystemExit("the ledger did not grow during the run")
    first, last = window[0], window[-1]
    # from the load's last growth of the ledger until the copy held the whole ledger
    caught = next((x.at for x in samples if x.at >= last.at and x.copied >= x.ledger), back)
    span = last.at - first.at
    lags = [s.lag for s in window if s.lag is not None]
    backlog = [float(s.ledger - s.copied) for s in window]
    return ShipRun(
        seconds=round(span, 3),
        certified=last.ledger - first.ledger,
        shipped=last.copied - first.copied,
        certified_per_s=round((last.ledger - first.ledger) / span, 1),
        shipped_per_s=round((last.copied - first.copied) / span, 1),
        bench_certified_per_s=report.get("certified_per_s"),
        lag_samples=len(lags),
        lag_p50_heights=quantile(lags, 0.5),
        lag_p99_heights=quantile(lags, 0.99),
        lag_max_heights=max(lags, default=None),
        backlog_p50_verdicts=quantile(backlog, 0.5),
        backlog_p99_verdicts=quantile(backlog, 0.99),
        catch_up_s=None if caught is None else round(caught - last.at, 2),
    )


def median(runs: list[ShipRun], key: str) -> float | None:
    values = [v for r in runs if (v := getattr(r, key)) is not None]
    return statistics.median(values) if values else None


def summary(runs: list[ShipRun], args: argparse.Namespace) -> dict[str, Any]:
    keys = ("certified_per_s", "shipped_per_s", "bench_certified_per_s", "lag_p50_heights",
            "lag_p99_heights", "lag_max_heights", "backlog_p50_verdicts",
            "backlog_p99_verdicts", "catch_up_s")  # fmt: skip
    medians = {k: median(runs, k) for k in keys}
    ratio = (
        medians["shipped_per_s"] / medians["certified_per_s"]
        if medians["shipped_per_s"] is not None and medians["certified_per_s"]
        else None
    )
    return {
        "inflight": args.inflight,
        "seconds": args.seconds,
        "runs": [asdict(r) for r in runs],
        "median": {**medians, "shipped_to_certified": None if ratio is None else round(ratio, 3)},
        "machine": machine_info(),
    }


TABLE = (
    ("certified/s", "certified_per_s"), ("shipped/s", "shipped_per_s"),
    ("lag p50", "lag_p50_heights"), ("lag p99", "lag_p99_heights"),
    ("lag max", "lag_max_heights"), ("backlog p50", "backlog_p50_verdicts"),
    ("backlog p99", "backlog_p99_verdicts"), ("catch-up s", "catch_up_s"),
)  # fmt: skip


def print_table(result: dict[str, Any]) -> None:
    print(f"shipping at W = {result['inflight']}, {result['seconds']:g} s per run "
          "(lag in heights, backlog in verdicts)")  # fmt: skip
    print(f"{'run':>4} " + " ".join(f"{title:>11}" for title, _ in TABLE))
    rows = [(str(k + 1), r) for k, r in enumerate(result["runs"])] + [("med", result["median"])]
    for name, r in rows:
        cells = ["-" if r[key] is None else f"{r[key]:g}" for _, key in TABLE]
        print(f"{name:>4} " + " ".join(f"{c:>11}" for c in cells))
    print(f"shipped/certified (medians): {result['median']['shipped_to_certified']}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="postgresql://... of the copy")
    parser.add_argument("--dir", help="a running cluster's directory (default: start one)")
    parser.add_argument("--nodes", type=int, default=4, help="the cluster started (3f+1)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before the window")
    parser.add_argument("--runs", type=int, default=3, help="runs (medians reported)")
    parser.add_argument("--inflight", type=int, default=256, help="closed loop: in flight")
    parser.add_argument("--clients", type=int, default=2, help="load client processes")
    parser.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    directory = Path(args.dir) if args.dir else None
    with open_cluster(directory, None if directory else args.nodes, False) as cluster:
        shipper = ShipperProcess(cluster.spec, args.dsn)
        shipper.start()
        try:
            if poll_for(shipper.metrics, SHIPPER_READY_TIMEOUT_S, CATCH_UP_POLL_S) is None:
                raise SystemExit("the shipper did not serve its metrics")
            options = RunOptions(args.seconds, args.warmup, args.inflight, 0.0, args.clients,
                                 False)  # fmt: skip
            check_serving(cluster.spec, True)
            nonces = agent_nonces(cluster.spec, options, AGENT_POOL_DEFAULT)
            runs = [one_run(cluster.spec, options, nonces, args.dsn, shipper)
                    for _ in range(args.runs)]  # fmt: skip
        finally:
            shipper.kill(signal.SIGTERM)
    result = summary(runs, args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
