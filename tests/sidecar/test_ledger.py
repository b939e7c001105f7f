"""The verdict ledger (sidecar/ledger.py): entries, the hash chain, its verifier, JSON lines.

Entries come from real verdicts of the engine (tests/sidecar/executed_log.py's busy log:
allows, flags, denials, pending, confirmations, rejections, administration).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json

import pytest

from quorumgate.proto.canonical import Encoder
from quorumgate.proto.commitments import Committed, SealedSalt
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.ledger import (
    GENESIS_PREV_HASH,
    TAG_LEDGER,
    ChainVerifier,
    LedgerEntry,
    ProblemKind,
    chain_head,
    verify_chain,
)
from tests.engine.harness import CHAIN, World
from tests.sidecar.executed_log import ARGUMENT_SECRET, SEALED_SECRET, busy_world


def chain_of(world: World, chain_id: str = CHAIN) -> list[LedgerEntry]:
    entries: list[LedgerEntry] = []
    head = GENESIS_PREV_HASH
    for result in world.results:
        for index, verdict in enumerate(result.verdicts):
            entry = LedgerEntry.from_verdict(chain_id, result.height, index, verdict, head)
            entries.append(entry)
            head = entry.hash
    return entries


@pytest.fixture(scope="module")
def entries() -> list[LedgerEntry]:
    return chain_of(busy_world().world)


def reseal(entry: LedgerEntry, **changes: object) -> LedgerEntry:
    """`entry` with `changes`, and a hash that is right for them (a careful forger)."""
    changed = dataclasses.replace(entry, **changes)  # type: ignore[arg-type]
    return dataclasses.replace(changed, hash=changed.computed_hash(CHAIN))


# ============================================================================ entries


def test_hash_is_sha256_of_tagged_canonical_bytes_of_every_field_but_the_hash(
    entries: list[LedgerEntry],
) -> None:
    entry = next(e for e in entries if e.argument_names and e.proposal_id)
    data = entry.canonical_bytes(CHAIN)
    assert data.startswith(TAG_LEDGER)
    assert entry.hash == hashlib.sha256(data).digest()
    expected = Encoder(TAG_LEDGER).text(CHAIN).u64(entry.height).u32(entry.index)
    expected.blob(entry.tx_id).blob(entry.proposal_id).text(entry.kind).text(entry.outcome)
    expected.text(entry.reason).u64(entry.mandate_version).text(entry.principal)
    expected.text(entry.canonical_target).blob(entry.target_digest).blob(entry.card_digest)
    expected.texts(entry.argument_names).raw(entry.prev_hash)
    assert data == bytes(expected)
    assert entry.hash not in data


def test_every_field_and_the_chain_id_change_the_hash(entries: list[LedgerEntry]) -> None:
    entry = next(e for e in entries if e.argument_names and e.card_digest == b"")
    variants = {
        "height": entry.height + 1,
        "index": entry.index + 1,
        "tx_id": bytes(32),
        "proposal_id": b"",
        "kind": "admin",
        "outcome": "allow" if entry.outcome != "allow" else "deny",
        "reason": "ok!",
        "mandate_version": entry.mandate_version + 1,
        "principal": entry.principal + "x",
        "canonical_target": entry.canonical_target + "/",
        "target_digest": bytes(32),
        "card_digest": b"\x01",
        "argument_names": (*entry.argument_names, "more"),
        "prev_hash": b"\x01" * 32,
    }
    # the fields of version 2 are varied in the test below, on a version-2 entry
    committed = {"version", "commitments", "sealed_salts", "repeat", "halted"}
    assert set(variants) | {"hash"} | committed == {f.name for f in dataclasses.fields(LedgerEntry)}
    hashes = {entry.computed_hash(CHAIN), entry.computed_hash("another-chain")}
    for name, value in variants.items():
        hashes.add(dataclasses.replace(entry, **{name: value}).computed_hash(CHAIN))  # type: ignore[arg-type]
    assert len(hashes) == len(variants) + 2
    # the same entry of version 2 (docs/audit.md, "Argument commitments"): its own hash,
    # and each commitment and sealed salt in it changes the hash
    salt = Committed("amount", b"\x05" * 32)
    sealed = SealedSalt(b"\x06" * 32, b"\x07" * 80)
    v2 = dataclasses.replace(entry, version=2, commitments=(salt,), sealed_salts=(sealed,))
    more = {
        "v1": entry,
        "v2": v2,
        "empty": dataclasses.replace(v2, commitments=(), sealed_salts=()),
        "name": dataclasses.replace(v2, commitments=(Committed("amounts", salt.commitment),)),
        "digest": dataclasses.replace(v2, commitments=(Committed("amount", b"\x08" * 32),)),
        "key": dataclasses.replace(v2, sealed_salts=(SealedSalt(b"\x09" * 32, sealed.sealed),)),
        "seal": dataclasses.replace(
            v2, sealed_salts=(SealedSalt(sealed.auditor_key, b"\x01" * 80),)
        ),
        # the latch's facts (docs/audit.md, "Repeat counts and halts")
        "repeat": dataclasses.replace(v2, repeat=1),
        "halted": dataclasses.replace(v2, halted=True),
    }
    assert len({e.computed_hash(CHAIN) for e in more.values()}) == len(more)


def test_the_first_entry_chains_from_32_zero_bytes_and_each_from_the_one_before(
    entries: list[LedgerEntry],
) -> None:
    assert entries[0].prev_hash == GENESIS_PREV_HASH == bytes(32)
    for before, after in itertools.pairwise(entries):
        assert after.prev_hash == before.hash
    assert chain_head(entries) == entries[-1].hash
    assert chain_head([]) == GENESIS_PREV_HASH


def test_entries_carry_argument_names_and_never_values() -> None:
    story = busy_world()
    entries = chain_of(story.world)
    assert ("user_id",) in {e.argument_names for e in entries}
    assert ("memo",) in {e.argument_names for e in entries}
    for entry in entries:
        for blob in (entry.to_json().encode(), entry.canonical_bytes(CHAIN), repr(entry).encode()):
            for secret in (SEALED_SECRET, ARGUMENT_SECRET.encode()):
                assert secret not in blob and secret.hex().encode() not in blob


def test_two_engines_executing_one_log_build_identical_ledgers() -> None:
    world = busy_world().world
    replayed = Engine(world.config)
    results = [replayed.execute_block(h, t, txs) for h, t, txs in world.log]
    again = World()
    again.results = results
    assert chain_of(again) == chain_of(world)
    assert chain_of(again, "another-chain")[-1].hash != chain_of(world)[-1].hash


def test_entries_refuse_values_out_of_range(entries: list[LedgerEntry]) -> None:
    entry = entries[0]
    for name, value in [
        ("height", -1),
        ("index", 2**32),
        ("mandate_version", True),
        ("hash", b"\x00" * 31),
        ("prev_hash", "00" * 32),
        ("kind", b"admin"),
        ("argument_names", ["q"]),
        ("tx_id", b"\x00" * 2000),
    ]:
        with pytest.raises(ValueError, match=name):
            dataclasses.replace(entry, **{name: value})  # type: ignore[arg-type]


# ============================================================================ verification


def test_an_honest_chain_verifies(entries: list[LedgerEntry]) -> None:
    assert len(entries) > 20
    assert verify_chain(entries, CHAIN) is None
    assert verify_chain([], CHAIN) is None


@pytest.mark.parametrize("position", [0, 7, -1])
def test_an_edited_field_is_named_at_its_entry_as_a_hash_mismatch(
    entries: list[LedgerEntry], position: int
) -> None:
    at = position % len(entries)
    for name, value in [("reason", "tampered"), ("outcome", "allow!"), ("principal", "eve")]:
        edited = list(entries)
        edited[at] = dataclasses.replace(entries[at], **{name: value})  # type: ignore[arg-type]
        problem = verify_chain(edited, CHAIN)
        assert problem is not None
        assert problem.kind is ProblemKind.HASH_MISMATCH
        assert (problem.position, problem.height, problem.index) == (
            at, entries[at].height, entries[at].index,
        )  # fmt: skip
        assert str(problem).startswith(
            f"entry #{at} (height {entries[at].height}, index {entries[at].index}): "
            "hash_mismatch: stored hash"
        )


def test_a_resealed_edit_breaks_the_link_of_the_next_entry(entries: list[LedgerEntry]) -> None:
    edited = list(entries)
    edited[5] = reseal(entries[5], outcome="allow", reason="tampered")
    problem = verify_chain(edited, CHAIN)
    assert problem is not None and problem.kind is ProblemKind.BROKEN_LINK
    assert (problem.position, problem.height, problem.index) == (
        6, entries[6].height, entries[6].index,
    )  # fmt: skip
    # a forger who reseals every later entry too is caught only by the head: the head is
    # what honest sidecars compare (and what the store records)
    head = GENESIS_PREV_HASH
    forged: list[LedgerEntry] = []
    for i, entry in enumerate(entries):
        resealed = reseal(entry, prev_hash=head, **({"reason": "tampered"} if i == 5 else {}))
        forged.append(resealed)
        head = resealed.hash
    assert verify_chain(forged, CHAIN) is None
    verifier = ChainVerifier(CHAIN)
    for entry in forged:
        assert verifier.feed(entry) is None
    problem = verifier.finish(expected_head=entries[-1].hash)
    assert problem is not None and problem.kind is ProblemKind.HEAD_MISMATCH


def test_missing_repeated_and_swapped_entries_are_out_of_order(
    entries: list[LedgerEntry],
) -> None:
    cases = {
        "missing": ([*entries[:4], *entries[5:]], 4),
        "repeated": ([*entries[:5], entries[4], *entries[5:]], 5),
        "swapped": ([*entries[:4], entries[5], entries[4], *entries[6:]], 4),
        "first missing": (entries[1:], 0),
    }
    for label, (edited, position) in cases.items():
        problem = verify_chain(edited, CHAIN)
        assert problem is not None, label
        assert problem.position == position, (label, problem)
        assert problem.kind in (ProblemKind.OUT_OF_ORDER, ProblemKind.BROKEN_LINK), label
        assert (problem.height, problem.index) == (
            edited[position].height, edited[position].index,
        ), label  # fmt: skip
    # an entry that keeps its place but jumps a height's index is out of order, even
    # resealed onto the right link
    moved = reseal(entries[1], index=entries[1].index + 1, prev_hash=entries[0].hash)
    problem = verify_chain([entries[0], moved], CHAIN)
    assert problem is not None and problem.kind is ProblemKind.OUT_OF_ORDER


def test_a_ledger_of_another_chain_fails_at_its_first_entry_with_a_hint(
    entries: list[LedgerEntry],
) -> None:
    problem = verify_chain(entries, "another-chain")
    assert problem is not None and problem.position == 0
    assert problem.kind is ProblemKind.HASH_MISMATCH
    assert "another chain" in problem.detail


def test_the_verifier_stops_at_the_first_problem_and_keeps_it(
    entries: list[LedgerEntry],
) -> None:
    verifier = ChainVerifier(CHAIN)
    bad = dataclasses.replace(entries[2], reason="tampered")
    fed = [entries[0], entries[1], bad, dataclasses.replace(entries[3], reason="tampered")]
    problems = [verifier.feed(e) for e in fed]
    assert problems[:2] == [None, None]
    assert problems[2] is not None and problems[3] == problems[2]
    assert verifier.finish() == problems[2]
    assert verifier.count == 2 and verifier.head == entries[1].hash


def test_finish_names_a_chain_cut_short(entries: list[LedgerEntry]) -> None:
    verifier = ChainVerifier(CHAIN)
    for entry in entries[:-3]:
        assert verifier.feed(entry) is None
    problem = verifier.finish(expected_head=entries[-1].hash, expected_count=len(entries))
    assert problem is not None and problem.kind is ProblemKind.HEAD_MISMATCH
    assert (problem.height, problem.index) == (entries[-4].height, entries[-4].index)
    assert f"{len(entries) - 3} entries but {len(entries)}" in problem.detail


# ============================================================================ JSON lines


def test_json_lines_round_trip_exactly(entries: list[LedgerEntry]) -> None:
    for entry in entries:
        line = entry.to_json()
        assert "\n" not in line and line.isascii()
        assert LedgerEntry.from_json(line) == entry
    obj = json.loads(entries[-1].to_json())
    assert obj["hash"] == entries[-1].hash.hex()
    assert list(obj) == [
        "height", "index", "tx_id", "proposal_id", "kind", "outcome", "reason",
        "mandate_version", "principal", "canonical_target", "target_digest", "card_digest",
        "argument_names", "prev_hash", "hash",
    ]  # fmt: skip
    exported = [LedgerEntry.from_json(e.to_json()) for e in entries]
    assert verify_chain(exported, CHAIN) is None


def test_json_lines_refuse_anything_but_an_entry(entries: list[LedgerEntry]) -> None:
    good = json.loads(entries[3].to_json())

    def line(**changes: object) -> str:
        return json.dumps({**good, **changes})

    extra = {**good, "note": 1}
    missing = {k: v for k, v in good.items() if k != "reason"}
    cases = {
        "not JSON": "{not json",
        "not a JSON object": "[1, 2]",
        "wrong fields": json.dumps(extra),
        "wrong fields (missing ['reason']": json.dumps(missing),
        "height must be an integer": line(height="1"),
        "index must be an integer": line(index=True),
        "tx_id is not hex": line(tx_id="zz"),
        "lower-case hex": line(hash=good["hash"].upper()),
        "hash must be 32 bytes": line(hash="00"),
        "kind must be text": line(kind=3),
        "argument_names must be a list of text": line(argument_names=["q", 1]),
        "height out of range": line(height=-1),
        "longer than": " " * (300 * 1024),
    }
    for message, text in cases.items():
        with pytest.raises(ValueError) as caught:
            LedgerEntry.from_json(text)
        assert message in str(caught.value), (message, str(caught.value))
