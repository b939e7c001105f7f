"""`quorumgate audit verify`: the PostgreSQL copy checked on its own (docs/audit.md), with
nothing but the cluster file: hash-chain continuity from a trusted head, every certificate
against the members' receipt keys and the entry it certifies, no entry missing (a gap is
named with its range), and what the copy holds: counts by outcome and reason, and the
mandate versions each principal's verdicts were decided under (a change is reported as
drift, a finding that is not an error)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO

import psycopg

from quorumgate.audit.records import leaf_matches
from quorumgate.audit.store import certificate_of, entry_of, read_rows
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sdk.certificates import certified_leaf
from quorumgate.sidecar.ledger import GENESIS_PREV_HASH, VERSION_COMMITTED, LedgerEntry
from quorumgate.sidecar.receipts import CertificateError, ReceiptEpochs

EXIT_OK = 0
EXIT_PROBLEM = 1
PROBLEMS_SHOWN_MAX = 50  # problems printed; all are counted


@dataclass(frozen=True, slots=True)
class TrustedHead:
    """Where the check starts: entries above `height` must chain from `hash` (the genesis
    value at height 0: the whole chain)."""

    height: int = 0
    hash: bytes = GENESIS_PREV_HASH

    @classmethod
    def parse(cls, text: str) -> TrustedHead:
        height, _, digest = text.partition(":")
        value = bytes.fromhex(digest)
        if not height.isdigit() or len(value) != len(GENESIS_PREV_HASH):
            raise ValueError("--head is HEIGHT:HASH, the hash as 64 hex digits")
        return cls(int(height), value)


@dataclass
class Report:
    rows: int = 0
    problems: list[str] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    reasons: Counter[tuple[str, str]] = field(default_factory=Counter)
    mandates: dict[str, set[int]] = field(default_factory=dict)
    head: bytes = GENESIS_PREV_HASH
    # Version-2 entries (docs/audit.md, "Argument commitments"): verdicts whose record
    # commits to their call's arguments, and calls with arguments whose record does not
    # (the proposer sent no salt: nobody can check their values later).
    committed: int = 0
    uncommitted_calls: int = 0
    # The latch's facts in version-2 entries (docs/audit.md, "Repeat counts and halts"):
    # verdicts that halted a run or came to a halted one, and the highest repeat count.
    halted: int = 0
    repeat_max: int = 0


class _Walk:
    """The chain walked row by row, resynchronised after a problem so that every problem
    of the copy is named, not only the first."""

    def __init__(self, spec: ClusterSpec, trusted: TrustedHead, report: Report) -> None:
        self.spec = spec
        self.report = report
        self.head = trusted.hash
        self.last: tuple[int, int] | None = None if trusted.height == 0 else (trusted.height, -1)

    def problem(self, where: tuple[int, int], text: str) -> None:
        self.report.problems.append(f"height {where[0]} index {where[1]}: {text}")

    def _after(self) -> str:
        if self.last is None:
            return "the chain's start"
        return f"height {self.last[0]} index {self.last[1]}"

    def place(self, entry: LedgerEntry) -> None:
        where = (entry.height, entry.index)
        if self.last is None:
            if entry.height < 1 or entry.index != 0:
                self.problem(where, "the first entry is not index 0 of a height")
            return
        height, index = self.last
        if where == (height, index + 1) or (entry.height > height and entry.index == 0):
            return
        self.problem(
            where,
            f"gap or reorder: after height {height} index {index} comes this entry; the "
            f"entries between (height {height} index {index + 1} up to this one) are missing "
            "or moved",
        )

    def feed(self, entry: LedgerEntry) -> None:
        where = (entry.height, entry.index)
        if entry.computed_hash(self.spec.chain_id) != entry.hash:
            self.problem(where, "its fields do not hash to its stored hash (edited)")
        self.place(entry)
        if entry.prev_hash != self.head:
            self.problem(
                where,
                "its prev_hash is not the previous entry's hash: an entry between "
                f"{self._after()} and this one is missing, or this one was moved",
            )
        self.head, self.last = entry.hash, where


def _certificate(
    spec: ClusterSpec,
    entry: LedgerEntry,
    row: tuple[Any, ...],
    epochs: ReceiptEpochs | None = None,
) -> str:
    try:
        cert = certificate_of(row)
        leaf = certified_leaf(spec, cert, None, epochs)
    except CertificateError as err:
        return f"certificate does not verify ({err.reason})"
    if not leaf_matches(entry, leaf):
        return "certificate certifies another verdict than this row says"
    return ""


def check_copy(
    conn: psycopg.Connection[Any],
    spec: ClusterSpec,
    trusted: TrustedHead,
    epochs: ReceiptEpochs | None = None,
) -> Report:
    """`epochs`: each epoch's heights and receipt keys (`audit verify --epochs FILE`, a
    `quorumgate epochs --json` file); without it, cluster.json's receipt keys in every
    epoch (docs/consensus/epochs.md, "Receipt keys")."""
    report = Report()
    walk = _Walk(spec, trusted, report)
    for row in read_rows(conn, spec.chain_id):
        if int(row[0]) <= trusted.height:
            continue
        report.rows += 1
        try:
            entry = entry_of(row)
        except (ValueError, TypeError) as err:
            walk.problem((int(row[0]), int(row[1])), f"not a ledger entry ({err})")
            continue
        walk.feed(entry)
        bad = _certificate(spec, entry, row, epochs)
        if bad:
            walk.problem((entry.height, entry.index), bad)
        report.outcomes[entry.outcome] += 1
        report.reasons[(entry.outcome, entry.reason)] += 1
        if entry.principal and entry.mandate_version:  # 0: decided under no mandate
            report.mandates.setdefault(entry.principal, set()).add(entry.mandate_version)
        _count_commitments(entry, report)
    report.head = walk.head
    _check_cursor(conn, spec, walk, report)
    return report


def _count_commitments(entry: LedgerEntry, report: Report) -> None:
    if entry.version != VERSION_COMMITTED:
        return
    report.halted += entry.halted
    report.repeat_max = max(report.repeat_max, entry.repeat)
    # a proposal is refused `run_halted` exactly when the latch halted its run
    said = entry.reason == "run_halted"
    if entry.halted != said and (entry.halted or entry.kind == "proposal"):
        report.problems.append(
            f"entry ({entry.height}, {entry.index}) says halted={entry.halted} but its "
            f"reason is {entry.reason!r}"
        )
    if entry.commitments:
        report.committed += 1
    elif entry.kind == "proposal" and entry.argument_names:
        report.uncommitted_calls += 1


def _check_cursor(
    conn: psycopg.Connection[Any], spec: ClusterSpec, walk: _Walk, report: Report
) -> None:
    """Rows cut off the end: the shipper's cursor says where the copy ends and its head."""
    row = conn.execute(
        "SELECT height, idx, head FROM qg_ship_cursor WHERE chain_id = %s", (spec.chain_id,)
    ).fetchone()
    if row is None:
        return
    end = (int(row[0]), int(row[1]))
    if walk.last != end or bytes(row[2]) != walk.head:
        report.problems.append(
            f"the copy ends at {walk.last} but the shipper's cursor says height {end[0]} "
            f"index {end[1]}: entries after the last row are missing"
        )


def print_report(report: Report, out: TextIO) -> int:
    out.write(f"rows checked: {report.rows}; head {report.head.hex()}\n")
    for outcome, count in sorted(report.outcomes.items()):
        out.write(f"outcome {outcome}: {count}\n")
    for (outcome, reason), count in sorted(report.reasons.items()):
        out.write(f"reason {outcome}/{reason or '-'}: {count}\n")
    for principal, versions in sorted(report.mandates.items()):
        if len(versions) > 1:
            out.write(f"finding: mandate drift: {principal} decided under versions "
                      f"{sorted(versions)}\n")  # fmt: skip
    if report.committed or report.uncommitted_calls:
        out.write(f"verdicts committing their arguments: {report.committed}\n")
    if report.halted or report.repeat_max:
        out.write(f"verdicts in a halted run: {report.halted}; "
                  f"highest repeat count: {report.repeat_max}\n")  # fmt: skip
    if report.uncommitted_calls:
        out.write(f"finding: {report.uncommitted_calls} calls with arguments carried no salt "
                  "(their values cannot be checked)\n")  # fmt: skip
    for problem in report.problems[:PROBLEMS_SHOWN_MAX]:
        out.write(f"PROBLEM: {problem}\n")
    if report.problems:
        out.write(f"audit verify FAILED: {len(report.problems)} problems\n")
        return EXIT_PROBLEM
    out.write("audit verify ok\n")
    return EXIT_OK
