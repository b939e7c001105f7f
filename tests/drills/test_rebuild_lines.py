"""The wipe drill's report prints the time of each rebuild of the wiped sidecar: from
height 1 and from a snapshot (docs/drills.md, "From height 1 and from a snapshot")."""

from __future__ import annotations

from quorumgate.ops.drills.report import Fault, rebuild_line


def test_each_rebuild_is_printed_with_its_time_and_heights() -> None:
    from_one = Fault(
        "wipe", 2, 10.0,
        details={"rebuilt_by": "replay", "sidecar_rebuilt_s": 21.1,
                 "replay": {"heights_replayed": 1112, "history_from": 0}},
    )  # fmt: skip
    from_snapshot = Fault(
        "wipe", 1, 50.0,
        details={"rebuilt_by": "snapshot", "sidecar_rebuilt_s": 4.5,
                 "replay": {"heights_replayed": 12, "history_from": 1100}},
    )  # fmt: skip
    assert rebuild_line(from_one) == (
        "  rebuilt member 2 by replay from height 1: 21.1 s (1112 heights replayed)"
    )
    assert rebuild_line(from_snapshot) == (
        "  rebuilt member 1 by replay from a snapshot: 4.5 s (12 heights replayed after the "
        "snapshot of height 1100)"
    )
    itself = Fault("wipe", 0, 5.0, details={"rebuilt_by": "sidecar"})
    assert rebuild_line(itself) == (
        "  rebuilt member 0 by the sidecar re-executing from height 1: did not come back"
    )
    assert rebuild_line(Fault("kill", 0, 1.0)) == ""
