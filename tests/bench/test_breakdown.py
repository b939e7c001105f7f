"""The latency breakdown's bookkeeping (docs/benchmarks.md): trace lines from several
processes joined into stage durations per call; tracing off unless asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumgate.bench.breakdown import Call, parse_traces, stage_table
from quorumgate.runtime.tracing import TRACE_DIR_ENV, Tracer

MS = 1_000_000


def write(directory: Path, name: str, lines: list[str]) -> None:
    (directory / f"{name}.trace").write_text("\n".join(lines) + "\n")


def test_stages_join_every_process_on_one_clock(tmp_path: Path) -> None:
    tx = "aa" * 8
    write(tmp_path, "replica-0", [
        f"{1 * MS} admitted {tx}", f"{3 * MS} stored 5", f"{6 * MS} qc 5",
        f"{10 * MS} committed 5 {tx}", f"{0 * MS} view 7", f"{20 * MS} view 8", f"{500} apply 1500",
    ])  # fmt: skip
    write(tmp_path, "replica-1", [f"{2 * MS} stored 5", f"{12 * MS} committed 5 {tx}"])
    # f = 1: the second sidecar to execute height 5 is the one that matters
    write(tmp_path, "sidecar-0", [f"{15 * MS} executed 5"])
    write(tmp_path, "sidecar-1", [f"{11 * MS} executed 5"])
    write(tmp_path, "sidecar-2", [f"{30 * MS} executed 5"])
    traces = parse_traces(tmp_path, f=1)
    rows = {r["stage"]: r["p50_ms"] for r in stage_table([Call(tx, 0, 21 * MS)], traces)}
    assert rows == {
        "submit -> admitted": 1.0,
        "admitted -> block stored": 1.0,  # the first replica to store it
        "stored -> QC": 4.0,
        "QC -> committed": 4.0,
        "committed -> executed by f+1 sidecars": 5.0,
        "executed -> certificate at the client": 6.0,
        "submit -> certificate (total)": 21.0,
        "time per view": 20.0,
        "store apply (with fsync)": 1.5,
    }


def test_a_call_missing_from_the_traces_is_left_out(tmp_path: Path) -> None:
    write(tmp_path, "replica-0", [f"{MS} admitted {'bb' * 8}"])
    rows = stage_table([Call("cc" * 8, 0, MS)], parse_traces(tmp_path, f=1))
    assert all(not r["stage"].startswith("submit ->") for r in rows)


def test_tracing_is_off_unless_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACE_DIR_ENV, raising=False)
    off = Tracer("replica-9")
    off.event("stored", 1)
    assert not off.enabled and not list(tmp_path.iterdir())
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    on = Tracer("replica-9")
    on.event("stored", 1)
    assert on.enabled
    assert (tmp_path / "replica-9.trace").read_text().split()[1:] == ["stored", "1"]
