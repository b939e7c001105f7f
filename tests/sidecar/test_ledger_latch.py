"""Repeat counts and halts in the ledger (docs/audit.md, "Repeat counts and halts"): on a
chain that commits arguments, each proposal's entry says how many refusals of its tool the
latch had counted in the run before it, and whether the run was or became halted; the
values come from the engine's side output, so replay rebuilds the same entries, and an
edited count breaks the entry's hash."""

from __future__ import annotations

import dataclasses
import json

from quorumgate.proto.model import Reason
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.execution import ledger_extras
from quorumgate.sidecar.ledger import (
    EXTENSION_FIELDS,
    GENESIS_PREV_HASH,
    VERSION_COMMITTED,
    ChainVerifier,
    Committed,
    LedgerEntry,
    SealedSalt,
    extra_from_column,
    extra_to_json,
)
from tests.engine.harness import CHAIN, World


def _world(**overrides: int) -> World:
    world = World(overrides=dict(overrides))
    for tool in ("kb.search", "wire.transfer"):
        world.add_tool(tool)
    world.add_agent("alice", ["kb.search"])
    return world


def _entries(engine: Engine, world: World) -> list[LedgerEntry]:
    """The ledger as a sidecar writes it: each height's verdicts with the extras
    sidecar/execution.py builds from the block's payload and the engine's side output."""
    entries: list[LedgerEntry] = []
    head = GENESIS_PREV_HASH
    for (height, time_ms, _txs), result in zip(world.log, _results(engine, world), strict=True):
        assert result.height == height and result.block_time_ms == time_ms
        extras = ledger_extras(engine, result)
        chained = LedgerEntry.chain(CHAIN, height, result.verdicts, head, extras)
        entries.extend(chained)
        head = chained[-1].hash if chained else head
    return entries


def _results(engine: Engine, world: World) -> list:  # type: ignore[type-arg]
    if engine is world.engine:
        return world.results
    return [engine.execute_block(h, t, txs, world.verify) for h, t, txs in world.log]


def _refuse_three_times_then_call_again() -> tuple[World, list[Reason]]:
    world = _world()
    reasons = [world.propose("alice", "wire.transfer").reason for _ in range(3)]
    reasons.append(world.propose("alice", "kb.search").reason)  # the halted run
    reasons.append(world.propose("alice", "wire.transfer").reason)
    return world, reasons


def _proposal_entries(world: World) -> list[LedgerEntry]:
    return [e for e in _entries(world.engine, world) if e.kind == "proposal"]


def test_three_refusals_then_the_halt_read_off_the_entries() -> None:
    world, reasons = _refuse_three_times_then_call_again()
    assert reasons == [
        Reason.OUT_OF_SCOPE,
        Reason.REPEAT_DENIED,
        Reason.RUN_HALTED,
        Reason.RUN_HALTED,
        Reason.RUN_HALTED,
    ]
    entries = _proposal_entries(world)
    assert all(e.version == VERSION_COMMITTED for e in entries)
    assert [(e.reason, e.repeat, e.halted) for e in entries] == [
        ("out_of_scope", 0, False),
        ("repeat_denied", 1, False),
        ("run_halted", 2, True),  # the verdict that trips the latch
        ("run_halted", 0, True),  # another tool of the halted run: no refusals of it
        ("run_halted", 3, True),  # the refused tool again: three refusals counted
    ]


def test_an_allowed_call_and_other_transactions_carry_zero_and_false() -> None:
    world = _world()
    assert world.propose("alice", "kb.search").reason is Reason.OK
    entries = _entries(world.engine, world)
    assert entries and all((e.repeat, e.halted) == (0, False) for e in entries)


def test_replay_rebuilds_byte_identical_entries() -> None:
    world, _ = _refuse_three_times_then_call_again()
    live = _entries(world.engine, world)
    replayed = _entries(Engine(world.config), world)
    assert [e.to_json() for e in replayed] == [e.to_json() for e in live]
    assert [e.canonical_bytes(CHAIN) for e in replayed] == [e.canonical_bytes(CHAIN) for e in live]


def test_the_side_output_changes_no_state_byte() -> None:
    world, _ = _refuse_three_times_then_call_again()
    fresh = Engine(world.config)
    for height, time_ms, txs in world.log:
        fresh.execute_block(height, time_ms, txs, world.verify)
    assert fresh.state_bytes() == world.engine.state_bytes()


def test_an_edited_repeat_count_or_halt_breaks_the_hash() -> None:
    world, _ = _refuse_three_times_then_call_again()
    entries = _entries(world.engine, world)
    tripping = next(i for i, e in enumerate(entries) if e.halted)
    for edit in ({"repeat": 0}, {"halted": False}):
        obj = json.loads(entries[tripping].to_json())
        obj.update(edit)
        edited = [*entries[:tripping], LedgerEntry.from_json(json.dumps(obj))]
        verifier = ChainVerifier(CHAIN)
        problems = [verifier.feed(e) for e in edited]
        assert problems[:-1] == [None] * tripping
        assert problems[-1] is not None and problems[-1].kind.value == "hash_mismatch"


def test_the_audit_column_round_trips_the_fields() -> None:
    world, _ = _refuse_three_times_then_call_again()
    for entry in _entries(world.engine, world):
        column = extra_to_json(entry)
        assert json.loads(column)["repeat"] == entry.repeat
        rebuilt = dataclasses.replace(entry, **extra_from_column(column))
        assert rebuilt == entry


def test_the_audit_column_is_the_lines_version_2_fields_exactly() -> None:
    """The column is built from the entry's fields; it must be, byte for byte, the
    version-2 fields cut from the entry's JSON line, which is what it was defined as
    (and what copies already written hold): names outside ASCII, no commitments, several
    sealed salts, a repeat count and a halt included."""
    world, _ = _refuse_three_times_then_call_again()
    written = [e for e in _entries(world.engine, world) if e.version == 2]
    assert written and any(e.halted for e in written)
    salts = (SealedSalt(b"\x06" * 32, b"\x07" * 80), SealedSalt(b"\x09" * 32, b"\x01" * 80))
    varied = [
        dataclasses.replace(written[0], commitments=(Committed("mont\u00e9\u2603", b"\x05" * 32),)),
        dataclasses.replace(written[0], commitments=(), sealed_salts=salts, repeat=7, halted=True),
    ]
    for entry in [*written, *varied]:
        line = json.loads(entry.to_json())
        cut = json.dumps(
            {k: line[k] for k in EXTENSION_FIELDS}, separators=(",", ":"), ensure_ascii=True
        )
        assert extra_to_json(entry) == cut


def test_old_chains_keep_version_1_entries() -> None:
    world = _world(receipt_version=2)
    for _ in range(3):
        world.propose("alice", "wire.transfer")
    [result] = world.results[-1:]
    assert ledger_extras(world.engine, result) is None


def test_audit_verify_counts_halts_and_names_a_halt_that_disagrees_with_its_reason() -> None:
    from quorumgate.audit.verify import Report, _count_commitments

    world, _ = _refuse_three_times_then_call_again()
    entries = _entries(world.engine, world)
    report = Report()
    for entry in entries:
        _count_commitments(entry, report)
    assert (report.halted, report.repeat_max, report.problems) == (3, 3, [])
    # a row whose flag and reason disagree, hash and all recomputed by whoever forged it
    refused = next(e for e in entries if e.reason == "out_of_scope")
    forged = dataclasses.replace(refused, halted=True)
    _count_commitments(dataclasses.replace(forged, hash=forged.computed_hash(CHAIN)), report)
    assert len(report.problems) == 1 and "halted=True" in report.problems[0]
