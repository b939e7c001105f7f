"""A drill's report, which a machine can check: the figures, one entry per fault and one
per check (docs/drills.md shows it whole), and its one-screen text form.

`DrillReport.as_dict()` is what `quorumgate drill --json` prints; `ok` is the conjunction
of the checks, and the command exits 1 unless it holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

DETAIL_ITEMS_MAX = 5  # problems a check's detail names before "(+N more)"


class DrillError(Exception):
    """The drill cannot run here: an unknown drill, a running cluster, another size."""


class Abort(Exception):
    """A step of the drill could not be carried out (a process that would not start, a
    wait past its deadline). The drill still runs its checks, and fails `drill_completed`."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class Fault:
    """One injected fault and the way back from it. `at_s` counts from the drill's start;
    `recovery_s` is None when the member did not come back in time. `details` holds what
    the drill measured for this kind of fault."""

    kind: str
    node: int | None
    at_s: float
    signal: str = ""
    pids_before: dict[str, int] = field(default_factory=dict)
    pids_after: dict[str, int] = field(default_factory=dict)
    height_at_fault: int = 0
    view_at_fault: int = 0
    recovery_s: float | None = None
    details: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "node": self.node,
            "at_s": round(self.at_s, 3),
            "signal": self.signal,
            "pids_before": self.pids_before,
            "pids_after": self.pids_after,
            "height_at_fault": self.height_at_fault,
            "view_at_fault": self.view_at_fault,
            "recovery_s": rounded(self.recovery_s),
            **self.details,
        }


@dataclass
class DrillReport:
    drill: str
    nodes: int
    f: int
    directory: str
    chain_id: str
    seconds: float
    rate_per_s: float
    agents: int = 0
    acknowledged: int = 0
    certified: int = 0
    lost: int = 0  # acknowledged, never committed
    duplicates: int = 0  # transaction ids in more than one committed block
    reoffered: int = 0
    redelivered: int = 0  # offered again and taken as new: the cluster had lost them
    refused: dict[str, int] = field(default_factory=dict)
    diverged: int = 0
    diverged_nodes: list[int] = field(default_factory=list)
    equivocations: int = 0
    recovery_s: float | None = None
    recovery_s_max: float | None = None
    final_height: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    details: dict[str, object] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r} in the report")

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def as_dict(self) -> dict[str, object]:
        return {
            "drill": self.drill,
            "nodes": self.nodes,
            "f": self.f,
            "directory": self.directory,
            "chain_id": self.chain_id,
            "seconds": self.seconds,
            "rate_per_s": self.rate_per_s,
            "agents": self.agents,
            "acknowledged": self.acknowledged,
            "certified": self.certified,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "reoffered": self.reoffered,
            "redelivered": self.redelivered,
            "refused": dict(sorted(self.refused.items())),
            "diverged": self.diverged,
            "diverged_nodes": self.diverged_nodes,
            "equivocations": self.equivocations,
            "recovery_s": rounded(self.recovery_s),
            "recovery_s_max": rounded(self.recovery_s_max),
            "final_height": self.final_height,
            "verdicts": dict(sorted(self.verdicts.items())),
            "faults": [fault.as_dict() for fault in self.faults],
            "details": self.details,
            "checks": [c.as_dict() for c in self.checks],
            "ok": self.ok,
            "duration_s": round(self.duration_s, 3),
        }


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def short(data: bytes | None) -> str:
    return "none" if data is None else data.hex()[:16]


def listed(items: Iterable[object]) -> str:
    shown = list(items)
    more = len(shown) - DETAIL_ITEMS_MAX
    text = "; ".join(str(i) for i in shown[:DETAIL_ITEMS_MAX])
    return text + (f" (+{more} more)" if more > 0 else "")


# How each rebuild of a wiped sidecar is named in the report (docs/drills.md).
REBUILD_NAMES = {
    "replay": "replay from height 1",
    "sidecar": "the sidecar re-executing from height 1",
    "snapshot": "replay from a snapshot",
}


def rebuild_line(fault: Fault) -> str:
    """One line per wiped member: how its sidecar was rebuilt and how long it took (from
    its replica back at the cluster's height to its sidecar back too), with the heights
    replayed and the snapshot's height when it came from one; "" for other faults."""
    by = fault.details.get("rebuilt_by")
    if fault.kind != "wipe" or not isinstance(by, str):
        return ""
    took = fault.details.get("sidecar_rebuilt_s")
    took_text = "did not come back" if took is None else f"{took} s"
    line = f"  rebuilt member {fault.node} by {REBUILD_NAMES.get(by, by)}: {took_text}"
    replayed = fault.details.get("replay")
    if isinstance(replayed, dict):
        line += f" ({replayed.get('heights_replayed')} heights replayed"
        if replayed.get("history_from"):
            line += f" after the snapshot of height {replayed.get('history_from')}"
        line += ")"
    return line


def replace_line(fault: Fault) -> str:
    """One line per replaced member: its new machine, the change block, the new machine's
    catch-up (from its start to its first vote) and the recovery; "" for other faults."""
    if fault.kind != "replace-member":
        return ""
    d = fault.details
    recovery = "-" if fault.recovery_s is None else f"{fault.recovery_s:.2f} s"
    return (
        f"  replaced member {fault.node} by {d.get('new_machine')}: change block at height "
        f"{d.get('change_height')}, epoch {d.get('epoch_before')} -> {d.get('epoch_after')}, "
        f"first vote {d.get('catch_up_s')} s after the new machine started, commits going "
        f"on {recovery} after the host was gone"
    )


def grow_line(fault: Fault) -> str:
    """One line per grow and per shrink of `grow-shrink`: the change block, the epochs,
    the new machines' catch-up (from their start to their first vote) or the removed
    replicas' exit, and the recovery; "" for other faults."""
    d = fault.details
    recovery = "-" if fault.recovery_s is None else f"{fault.recovery_s:.2f} s"
    if fault.kind == "grow":
        return (
            f"  grew to 7 ({', '.join(map(str, d.get('new_machines') or []))}): change block "
            f"at height {d.get('change_height')}, epoch {d.get('epoch_before')} -> "
            f"{d.get('epoch_after')}, first votes {d.get('catch_up_s')} s after the new "
            f"machines started, commits going on {recovery} after add-member"
        )
    if fault.kind == "shrink":
        return (
            f"  shrank to 4: change block at height {d.get('change_height')}, epoch "
            f"{d.get('epoch_before')} -> {d.get('epoch_after')}, removed replicas exited "
            f"{d.get('exited_s')} s after remove-member, commits going on {recovery} after it"
        )
    return ""


def print_report(report: DrillReport) -> None:
    print(
        f"drill {report.drill}: {report.nodes} replicas (f={report.f}), {len(report.faults)} "
        f"faults in {report.seconds:g} s under {report.rate_per_s:g} proposals/s; "
        f"{report.duration_s:.1f} s in all"
    )
    print(
        f"acknowledged {report.acknowledged}, certified {report.certified}, lost {report.lost}, "
        f"duplicates {report.duplicates}, redelivered {report.redelivered}, diverged "
        f"{report.diverged}, equivocations {report.equivocations}"
    )
    last = "-" if report.recovery_s is None else f"{report.recovery_s:.2f} s"
    slowest = "-" if report.recovery_s_max is None else f"{report.recovery_s_max:.2f} s"
    print(f"recovery: last {last}, slowest {slowest}; final height {report.final_height}")
    for fault in report.faults:
        line = rebuild_line(fault) or replace_line(fault) or grow_line(fault)
        if line:
            print(line)
    for check in report.checks:
        print(f"  {'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}")
    print("OK" if report.ok else "FAILED: " + ", ".join(c.name for c in report.failed()))
