"""The `ship` drill (docs/drills.md, docs/audit.md "The ship drill"): `quorumgate ship` runs
as its own process beside the cluster under load while the drill SIGKILLs it, stops and
starts the PostgreSQL server the operator named, and SIGKILLs a replica, in turn; then the
copy must hold every verdict of the ledger, in ledger order, none twice, and pass
`quorumgate audit verify`.

The database is the operator's: the drill reaches it through `--dsn` and controls it with
two commands the operator gives (`--db-stop-cmd`, `--db-start-cmd`, e.g. `pg_ctl stop` and
`pg_ctl start` for the server's data directory, or `systemctl stop postgresql`), run
without a shell. The DSN is never printed: it may carry a password.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quorumgate.ops.drills.bounds import (
    DB_COMMAND_TIMEOUT_S,
    DB_DOWN_S,
    LAG_SAMPLE_S,
    METRICS_TIMEOUT_S,
    RECOVERY_TIMEOUT_S,
    RESUME_TIMEOUT_S,
    SHIP_CATCH_UP_TIMEOUT_S,
    SIDECAR_DB_FILE,
    STOP_GRACE_S,
    poll,
)
from quorumgate.ops.drills.context import Drill
from quorumgate.ops.drills.database import ShipTarget
from quorumgate.ops.drills.report import Abort, Fault, short
from quorumgate.ops.live import Metrics
from quorumgate.ops.nodes import sidecar_status
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sidecar.store import LEDGER_PAGE_ROWS_MAX, SidecarStore

SHIP_FAULTS = ("sigkill-shipper", "restart-database", "sigkill-replica")
SHIPPER_LOG = "shipper.log"
EPOCHS_FILE = "ship-epochs.json"  # the chain of epochs `audit verify` checks the copy with


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ShipperProcess:
    """`python -m quorumgate ship` for the drill's cluster, its log in the cluster
    directory, its metrics on a loopback port the drill scrapes."""

    def __init__(self, spec: ClusterSpec, dsn: str) -> None:
        self.spec = spec
        self.dsn = dsn
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        argv = [sys.executable, "-m", "quorumgate", "ship", "--dir", str(self.spec.directory),
                "--dsn", self.dsn, "--metrics-port", str(self.port)]  # fmt: skip
        with (self.spec.directory / SHIPPER_LOG).open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        return self.proc.pid

    @property
    def pid(self) -> int | None:
        return None if self.proc is None or self.proc.poll() is not None else self.proc.pid

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> int | None:
        """Signal it and reap it; its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(STOP_GRACE_S)

    def metrics(self) -> Metrics | None:
        url = f"http://127.0.0.1:{self.port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as response:
                return Metrics.parse(response.read().decode())
        except OSError:
            return None


class LagSampler:
    """The shipper's `qg_ship_lag_heights`, scraped every LAG_SAMPLE_S from a thread while
    the drill runs: the report's lag figures."""

    def __init__(self, shipper: ShipperProcess) -> None:
        self.shipper = shipper
        self.samples: list[float] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ship-lag", daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(LAG_SAMPLE_S):
            metrics = self.shipper.metrics()
            if metrics is not None and metrics.has("qg_ship_lag_heights"):
                self.samples.append(metrics.value("qg_ship_lag_heights"))

    def stop(self) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(LAG_SAMPLE_S + METRICS_TIMEOUT_S)


def copy_cursor(dsn: str, chain_id: str) -> tuple[int, int, bytes] | None:
    """(height, entries, head) of the copy's cursor; None while the database is down."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=int(METRICS_TIMEOUT_S)) as conn:
            row = conn.execute(
                "SELECT height, entries, head FROM qg_ship_cursor WHERE chain_id = %s",
                (chain_id,),
            ).fetchone()
    except psycopg.Error:
        return None
    return (0, 0, b"") if row is None else (int(row[0]), int(row[1]), bytes(row[2]))


def copy_rows(dsn: str, chain_id: str) -> list[tuple[Any, ...]]:
    """(height, idx, hash, tx_id, batch_key) of every row of the copy, in key order."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT height, idx, hash, tx_id, batch_key FROM qg_verdicts WHERE chain_id = %s"
            " ORDER BY height, idx",
            (chain_id,),
        ).fetchall()


def copy_batches(dsn: str, chain_id: str) -> list[tuple[Any, ...]]:
    """(batch_key, first_height, first_idx, last_height, last_idx, verdicts) by first place."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT batch_key, first_height, first_idx, last_height, last_idx, verdicts"
            " FROM qg_batches WHERE chain_id = %s ORDER BY first_height, first_idx",
            (chain_id,),
        ).fetchall()


async def ledger_places(spec: ClusterSpec, index: int, top: int) -> list[tuple[int, int, bytes]]:
    """(height, index, hash) of every entry of stopped sidecar `index`'s ledger up to `top`."""
    store = await SidecarStore.open(spec.node_dir(index) / SIDECAR_DB_FILE, spec.chain_id,
                                    create=False)  # fmt: skip
    out: list[tuple[int, int, bytes]] = []
    try:
        height, at = 1, 0
        while True:
            page = await store.ledger(height, LEDGER_PAGE_ROWS_MAX, at)
            out += [(e.height, e.index, e.hash) for e in page if e.height <= top]
            if len(page) < LEDGER_PAGE_ROWS_MAX or page[-1].height > top:
                return out
            height, at = page[-1].height, page[-1].index + 1
    finally:
        await store.close()


def certified_height(d: Drill) -> int:
    """The height f+1 sidecars executed, as the shipper counts it."""
    heights = sorted(
        (s.executed_height for i in range(d.n) if (s := sidecar_status(d.spec, i)) is not None),
        reverse=True,
    )
    return heights[d.spec.f] if len(heights) > d.spec.f else 0


def run_db(d: Drill, argv: Sequence[str], what: str) -> None:
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=DB_COMMAND_TIMEOUT_S,
                              check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        raise Abort(f"the database's {what} command failed: {type(err).__name__}") from err
    if done.returncode != 0:
        raise Abort(f"the database's {what} command exited {done.returncode}")


@dataclass
class ShipRun:
    """The ship drill's own state: the target, the shipper process, the lag samples."""

    target: ShipTarget
    shipper: ShipperProcess
    sampler: LagSampler
    db_down: bool = False

    def close(self, d: Drill) -> None:
        self.sampler.stop()
        self.shipper.kill(signal.SIGKILL)
        if self.db_down:  # an aborted drill still leaves the operator's database running
            try:
                run_db(d, self.target.db_start, "start")
                self.db_down = False
            except Abort as err:
                d.say(f"could not start the database again: {err}")


def _caught_up_to(d: Drill, run: ShipRun, height: int) -> float | None:
    cursor = copy_cursor(run.target.dsn, d.spec.chain_id)
    return time.monotonic() if cursor is not None and cursor[0] >= height else None


def _recovered(d: Drill, run: ShipRun, fault: Fault, since: float) -> None:
    """The copy reaches the certified height read now: the shipper is back at work."""
    goal = certified_height(d)
    fault.details["copy_goal_height"] = goal
    at = poll(lambda: _caught_up_to(d, run, goal), RECOVERY_TIMEOUT_S)
    fault.recovery_s = None if at is None else at - since
    d.say(f"{fault.kind}: copy at height {goal} after "
          f"{'-' if at is None else f'{at - since:.2f} s'}")  # fmt: skip


def kill_shipper(d: Drill, run: ShipRun, k: int) -> None:
    before = run.shipper.pid
    fault = d.fault(Fault("sigkill-shipper", None, time.monotonic() - d.t0, "SIGKILL",
                          height_at_fault=d.top()))  # fmt: skip
    run.shipper.kill(signal.SIGKILL)
    after = run.shipper.start()
    fault.pids_before = {"shipper": before or 0}
    fault.pids_after = {"shipper": after}
    _recovered(d, run, fault, time.monotonic())


def restart_database(d: Drill, run: ShipRun, k: int) -> None:
    fault = d.fault(Fault("restart-database", None, time.monotonic() - d.t0, "stop",
                          height_at_fault=d.top()))  # fmt: skip
    run_db(d, run.target.db_stop, "stop")
    run.db_down = True
    time.sleep(DB_DOWN_S)  # how long the database stays down, not a wait for a state
    fault.details["cluster_heights_while_down"] = d.top() - fault.height_at_fault
    run_db(d, run.target.db_start, "start")
    run.db_down = False
    _recovered(d, run, fault, time.monotonic())
    fault.details["shipper_pid_kept"] = run.shipper.pid is not None


def kill_replica(d: Drill, run: ShipRun, k: int) -> None:
    victim = (k // len(SHIP_FAULTS)) % d.n
    d.scrape_equivocations([victim])
    height = d.top()
    fault = d.fault(Fault("sigkill-replica", victim, time.monotonic() - d.t0, "SIGKILL",
                          height_at_fault=height))  # fmt: skip
    fault.pids_before = {"replica": d.kill("replica", victim)}
    if d.wait_commits(height, d.others(victim), RESUME_TIMEOUT_S) is None:
        raise Abort(f"commits did not resume without replica {victim}")
    # The shipper reads f+1 of the other sidecars meanwhile: the copy goes on growing.
    goal = certified_height(d)
    shipped = poll(lambda: _caught_up_to(d, run, goal), RECOVERY_TIMEOUT_S)
    fault.details["copy_height_while_down"] = goal if shipped is not None else None
    d.start("replica", [victim])
    restarted = time.monotonic()
    fault.pids_after = {"replica": d.cluster.pid(victim, "replica") or 0}
    back = d.wait_replica_back(victim)
    fault.recovery_s = None if back is None else back - restarted
    d.say(f"sigkill-replica {victim}: the copy reached height {goal} without it; back after "
          f"{'-' if back is None else f'{back - restarted:.2f} s'}")  # fmt: skip


def ship_drill(d: Drill) -> None:
    """FAULTS["ship"]: start the shipper beside the loaded cluster, then its faults in turn."""
    target = d.ship
    if target is None:
        raise Abort("the ship drill has no database (--dsn)")
    shipper = ShipperProcess(d.spec, target.dsn)
    run = ShipRun(target, shipper, LagSampler(shipper))
    d.closers.append(lambda: run.close(d))
    d.before_stop.append(lambda top: settle_copy(d, run, top))
    d.after_stop.append(lambda top: check_copy(d, run, top))
    pid = shipper.start()
    run.sampler.thread.start()
    d.say(f"shipper started (pid {pid}), metrics on 127.0.0.1:{shipper.port}")
    if not poll(lambda: _caught_up_to(d, run, 1), RESUME_TIMEOUT_S):
        raise Abort(f"the shipper wrote nothing (see {SHIPPER_LOG} in the cluster directory)")
    steps = (kill_shipper, restart_database, kill_replica)
    for k in d.cycles():
        steps[k % len(steps)](d, run, k)


def settle_copy(d: Drill, run: ShipRun, top: int) -> None:
    """Once every sidecar executed `top`: the copy reaches sidecar 0's ledger (entries and
    head), then the shipper stops and `quorumgate audit verify` checks the copy."""

    def caught_up() -> float | None:
        status, cursor = sidecar_status(d.spec, 0), copy_cursor(run.target.dsn, d.spec.chain_id)
        if status is None or cursor is None:
            return None
        same = cursor[1] == status.ledger_entries and cursor[2] == status.ledger_head
        return time.monotonic() if same else None

    d.say("waiting for the copy to reach the ledger")
    reached = poll(caught_up, SHIP_CATCH_UP_TIMEOUT_S)
    cursor = copy_cursor(run.target.dsn, d.spec.chain_id)
    d.check("copy_caught_up", [] if reached else [f"the copy's cursor is at {cursor}"],
            "the copy's cursor reached sidecar 0's ledger head")  # fmt: skip
    _shipper_figures(d, run)
    run.sampler.stop()
    run.shipper.kill(signal.SIGTERM)
    verify = subprocess.run(
        [sys.executable, "-m", "quorumgate", "audit", "verify", "--dir", str(d.spec.directory),
         "--dsn", run.target.dsn, *_epochs_argument(d)],
        capture_output=True, text=True, timeout=SHIP_CATCH_UP_TIMEOUT_S, check=False,
    )  # fmt: skip
    lines = verify.stdout.strip().splitlines()
    d.report.details["audit_verify"] = {"exit": verify.returncode, "last": lines[-1:]}
    d.check("audit_verify", [] if verify.returncode == 0 else lines[-5:] or [verify.stderr],
            lines[0] if lines else "audit verify ok")  # fmt: skip


def _epochs_argument(d: Drill) -> list[str]:
    """`--epochs FILE` for `audit verify` on a chain that runs epochs: the chain of epochs
    as `quorumgate epochs --json` checks it now, so that the copy's certificates are
    checked with each epoch's receipt keys and heights, as the shipper checked them
    (docs/consensus/epochs.md, "Receipt keys"); nothing on a chain that runs none."""
    if not d.spec.runs_epochs:
        return []
    path = d.spec.directory / EPOCHS_FILE
    found = subprocess.run(
        [sys.executable, "-m", "quorumgate", "epochs", "--dir", str(d.spec.directory), "--json"],
        capture_output=True, text=True, timeout=SHIP_CATCH_UP_TIMEOUT_S, check=False,
    )  # fmt: skip
    if found.returncode != 0:
        raise Abort(f"the chain of epochs could not be read: {found.stderr.strip()[-300:]}")
    path.write_text(found.stdout)
    return ["--epochs", str(path)]


def _shipper_figures(d: Drill, run: ShipRun) -> None:
    samples = sorted(run.sampler.samples)
    metrics = run.shipper.metrics()
    figures: dict[str, object] = {
        "lag_samples": len(samples),
        "lag_p50_heights": samples[len(samples) // 2] if samples else None,
        "lag_p99_heights": samples[min(len(samples) - 1, len(samples) * 99 // 100)]
        if samples
        else None,
        "lag_max_heights": samples[-1] if samples else None,
    }
    if metrics is not None:  # the last process's counters: each restart starts them at 0
        figures["last_process"] = {
            "batches": metrics.by_label("qg_ship_batches_total", "result"),
            "retries": metrics.value("qg_ship_retries_total"),
            "database_errors": metrics.value("qg_ship_database_errors_total"),
            "refusals": metrics.by_label("qg_ship_refusals_total", "reason"),
        }
    d.report.details["shipper"] = figures


def check_copy(d: Drill, run: ShipRun, top: int) -> None:
    """With the cluster stopped: the copy against sidecar 0's ledger and the acknowledged
    proposals: complete, in order, none twice."""
    chain = d.spec.chain_id
    ledger = asyncio.run(ledger_places(d.spec, 0, top))
    rows = copy_rows(run.target.dsn, chain)
    copied = [(int(r[0]), int(r[1]), bytes(r[2])) for r in rows if int(r[0]) <= top]
    d.report.details["copy"] = {"rows": len(rows), "ledger_entries": len(ledger)}
    missing = sorted(set(ledger) - set(copied))
    missing_heights = sorted({h for h, _, _ in ledger} - {h for h, _, _ in copied})
    d.check(
        "copy_complete",
        [f"height {h} index {i} ({short(x)}) not in the copy" for h, i, x in missing]
        + [f"height {h} has no row" for h in missing_heights],
        f"all {len(ledger)} ledger entries, at {len({h for h, _, _ in ledger})} heights, "
        "are in the copy",
    )
    d.check("copy_in_order", order_problems(ledger, copied, copy_batches(run.target.dsn, chain)),
            "the copy's rows are the ledger's sequence; batches follow one another")  # fmt: skip
    acked = d.load.snapshot() if d.load is not None else []
    in_copy: dict[bytes, int] = {}
    for row in rows:
        in_copy[bytes(row[3])] = in_copy.get(bytes(row[3]), 0) + 1
    d.check(
        "copy_no_duplicates",
        [f"tx {short(t)} in {c} rows" for t, c in in_copy.items() if c > 1]
        + [f"acknowledged {short(p)} in {in_copy.get(p, 0)} rows" for p in acked
           if in_copy.get(p, 0) != 1],
        f"no transaction twice; each of {len(acked)} acknowledged proposals in one row",
    )  # fmt: skip


def order_problems(
    ledger: list[tuple[int, int, bytes]],
    copied: list[tuple[int, int, bytes]],
    batches: list[tuple[Any, ...]],
) -> list[str]:
    problems = [
        f"row {k}: the copy has height {c[0]} index {c[1]}, the ledger height {e[0]} index {e[1]}"
        for k, (c, e) in enumerate(zip(copied, ledger, strict=False))
        if c != e
    ][:5]
    if len(copied) != len(ledger):
        problems.append(f"the copy has {len(copied)} rows to {top_of(ledger)}, the ledger "
                        f"{len(ledger)}")  # fmt: skip
    place: tuple[int, int] | None = None
    for key, fh, fi, lh, li, _ in batches:
        first = (int(fh), int(fi))
        if place is not None and first <= place:
            problems.append(f"batch {key} starts at or before the previous one's end {place}")
        place = (int(lh), int(li))
    total = sum(int(b[5]) for b in batches)
    if total != len(copied):
        problems.append(f"batches hold {total} verdicts, the copy {len(copied)} rows")
    return problems


def top_of(places: list[tuple[int, int, bytes]]) -> str:
    return f"height {places[-1][0]}" if places else "the start"
