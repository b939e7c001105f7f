"""A sidecar's store keeps a run's provenance (docs/provenance.md) entry by entry: the
heights that expose runs, name their targets and raise an owner's floor are recorded as
deltas, and the state the store gives back is the engine's, byte for byte, with the same
root, so a sidecar that restarts from it (or replays the log) decides alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumgate.proto.model import Admin, SetRunTargets
from quorumgate.sidecar.engine import provenance
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.state import SECTIONS
from quorumgate.sidecar.store import SidecarStore
from tests.engine.harness import CHAIN
from tests.engine.test_provenance import ATTACKER_PAGE, BOB, TASK_PAGE, _call, _world
from tests.sidecar.executed_log import execute, read_around_the_store


async def test_provenance_entries_round_trip_through_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(provenance, "RUN_RECORDS_MAX", 2)
    w = _world()
    for run in ("run-1", "run-2", "run-3"):  # the third evicts the first: a floor
        _call(w, "web.fetch", ATTACKER_PAGE, run=run)
    op = SetRunTargets("assistant", w.run_of("assistant", "run-3"), (TASK_PAGE, BOB))
    w.one(w.owner, Admin(op=op))
    assert w.engine.state.run_floors and len(w.engine.state.runs) == 2
    heights = execute(w)
    path = tmp_path / "sidecar.db"
    store = await SidecarStore.open(path, CHAIN)
    for h in heights:
        await store.record(h)
        assert await store.engine_state() == h.engine_state, h.height
    restored = Engine.from_state_bytes(w.config, await store.engine_state())
    await store.close()
    assert restored.state_root() == heights[-1].result.state_root
    assert restored.state.runs == w.engine.state.runs
    assert restored.state.run_floors == w.engine.state.run_floors
    for name in ("runs", "run_floors"):
        rows = read_around_the_store(
            path, f"SELECT COUNT(*) FROM state_entries WHERE section = {SECTIONS.index(name)}"
        )
        assert rows == [(len(getattr(w.engine.state, name)),)]
