"""The `ship` drill (docs/drills.md, docs/audit.md "The ship drill") against a live 4-node
cluster and a real PostgreSQL server (tests.support.postgres): under load, the shipper
(its own process) is SIGKILLed, the database server stopped and started again through
the commands the drill is given, and a replica SIGKILLed; the copy must end complete, in
ledger order, without duplicates, and pass `quorumgate audit verify`.

The drill starts and stops every process itself; the `drill_dir` finalizer kills, by pid,
anything left for the test's directory and the fixture's finalizer stops the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumgate.cli import main as quorumgate
from quorumgate.ops.drills import FAULT_CYCLES_MIN, DrillError, run_drill
from quorumgate.ops.drills.database import ShipTarget
from quorumgate.ops.drills.ship import SHIP_FAULTS, order_problems
from quorumgate.ops.live import cluster_pids, proc_cmdlines
from tests.support.postgres import PgServer

NODES = 4
SHORT_S = 2.0
SHIP_CHECKS = ("copy_caught_up", "audit_verify", "copy_complete", "copy_in_order",
               "copy_no_duplicates")  # fmt: skip


def _shippers(directory: Path) -> list[int]:
    """Pids of `quorumgate ship` processes for `directory`."""
    return [
        pid
        for pid, argv in proc_cmdlines().items()
        if "ship" in argv and str(directory) in argv and "quorumgate" in argv
    ]


@pytest.fixture
def drill_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:
        for pid in cluster_pids(directory) + _shippers(directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _target(server: PgServer) -> ShipTarget:
    return ShipTarget(server.dsn, server.stop_cmd, server.start_cmd)


@pytest.mark.live
def test_ship_drill_kills_the_shipper_the_database_and_a_replica_and_the_copy_holds(
    drill_dir: Path, postgres_server: PgServer
) -> None:
    report = run_drill(
        "ship", drill_dir, nodes=NODES, seconds=SHORT_S, progress=print,
        ship=_target(postgres_server),
    )  # fmt: skip
    failed = {c.name: c.detail for c in report.failed()}
    assert report.ok, failed
    for name in (*SHIP_CHECKS, "acknowledged_committed", "recovered", "drill_completed"):
        check = report.check(name)
        assert check.ok, f"{name}: {check.detail}"
    kinds = [f.kind for f in report.faults]
    assert len(kinds) >= FAULT_CYCLES_MIN["ship"]
    assert set(SHIP_FAULTS) <= set(kinds), kinds
    for fault in report.faults:
        assert fault.recovery_s is not None, fault.as_dict()
        if fault.kind == "sigkill-shipper":
            assert fault.pids_after["shipper"] != fault.pids_before["shipper"]
        if fault.kind == "sigkill-replica":
            assert fault.pids_after["replica"] != fault.pids_before["replica"]
        if fault.kind == "restart-database":
            assert fault.details["shipper_pid_kept"] is True
    document = report.as_dict()
    json.dumps(document)
    copy = report.details["copy"]
    assert isinstance(copy, dict) and copy["rows"] == copy["ledger_entries"] > 0
    shipper = report.details["shipper"]
    assert isinstance(shipper, dict) and shipper["lag_samples"] > 0
    assert report.acknowledged > 0
    assert not cluster_pids(drill_dir) and not _shippers(drill_dir)


def test_the_ship_drill_needs_its_database_and_no_other_drill_takes_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(tmp_path / "cluster")
    assert quorumgate(["drill", "ship", "--dir", directory, "--quiet"]) == 2
    assert "--dsn" in capsys.readouterr().err
    code = quorumgate(["drill", "leader-kill", "--dir", directory, "--dsn", "postgresql://x/y",
                       "--db-stop-cmd", "true", "--db-start-cmd", "true", "--quiet"])  # fmt: skip
    assert code == 2
    assert "for the ship drill" in capsys.readouterr().err
    with pytest.raises(DrillError):
        run_drill("ship", tmp_path / "other", nodes=NODES, seconds=SHORT_S)
    assert not (tmp_path / "other").exists()


# ---------------------------------------------------------------------------- the checks


LEDGER = [(1, 0, b"a"), (1, 1, b"b"), (3, 0, b"c"), (4, 0, b"d")]
BATCHES = [("k1", 1, 0, 1, 1, 2), ("k2", 3, 0, 4, 0, 2)]


def test_order_check_passes_the_ledger_and_names_a_gap_a_swap_and_overlapping_batches() -> None:
    assert order_problems(LEDGER, list(LEDGER), BATCHES) == []
    gap = order_problems(LEDGER, [LEDGER[0], LEDGER[1], LEDGER[3]], BATCHES)
    assert any("height 4 index 0, the ledger height 3" in p for p in gap), gap
    swapped = order_problems(LEDGER, [LEDGER[1], LEDGER[0], *LEDGER[2:]], BATCHES)
    assert swapped and "row 0" in swapped[0]
    overlap = [("k1", 1, 0, 3, 0, 3), ("k2", 3, 0, 4, 0, 2)]
    assert any("starts at or before" in p for p in order_problems(LEDGER, LEDGER, overlap))
    assert any("batches hold" in p for p in order_problems(LEDGER, LEDGER, BATCHES[:1]))
