"""scripts/bench_ship.py in a tiny configuration (docs/benchmarks.md, "Shipping to
PostgreSQL"): it starts a cluster and the shipper, runs the load, and reports both rates
and the shipper's lag sampled while the load ran. Its shape is asserted, never a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_ship.py"
SCRIPT_TIMEOUT_S = 400
RUN_KEYS = {
    "seconds", "certified", "shipped", "certified_per_s", "shipped_per_s",
    "bench_certified_per_s", "lag_samples", "lag_p50_heights", "lag_p99_heights",
    "lag_max_heights", "backlog_p50_verdicts", "backlog_p99_verdicts", "catch_up_s",
}  # fmt: skip


@pytest.mark.live
def test_bench_ship_reports_both_rates_and_the_lag_it_sampled(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS bench_ship")
        conn.execute("CREATE DATABASE bench_ship")
    dsn = postgres_dsn.rsplit("/", 1)[0] + "/bench_ship"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dsn", dsn, "--nodes", "4", "--seconds", "1",
         "--warmup", "0.5", "--runs", "1", "--inflight", "8", "--clients", "1", "--json"],
        capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["inflight"] == 8 and len(result["runs"]) == 1
    run = result["runs"][0]
    assert set(run) == RUN_KEYS
    assert run["certified"] > 0 and run["shipped"] >= 0
    assert run["lag_samples"] > 0 and run["lag_p50_heights"] is not None
    assert run["lag_p50_heights"] <= run["lag_p99_heights"] <= run["lag_max_heights"]
    assert run["catch_up_s"] is not None  # the copy held the whole ledger again
    assert set(result["median"]) >= {"certified_per_s", "shipped_per_s", "shipped_to_certified"}
