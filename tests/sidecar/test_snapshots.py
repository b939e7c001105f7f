"""Snapshots (docs/snapshots.md): a fetched snapshot is checked, never trusted.

Real executed heights of a governed log (tests/sidecar/executed_log.py), each sidecar's
block statements signed by its own receipt key; peers are stand-ins answering the two
snapshot calls as a sidecar would, some of them lying. A chunk that does not hash to its
digest is refused, a root f+1 members did not sign is refused, a lying peer is outvoted,
and the state a snapshot carries decodes to exactly the state (the same bytes and root).
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.runtime.readauth import (
    METHOD_LEDGER,
    METHOD_LIST_SNAPSHOTS,
    METHOD_SNAPSHOT_CHUNK,
    Role,
    may_call,
)
from quorumgate.sidecar import operator
from quorumgate.sidecar.audit import audit_height
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.state import EngineState
from quorumgate.sidecar.ledger import GENESIS_PREV_HASH, LedgerEntry
from quorumgate.sidecar.receipts import ReceiptEpoch, ReceiptEpochs, sign_block
from quorumgate.sidecar.snapshots import (
    OPTIONS_FILE,
    Attestation,
    Head,
    Manifest,
    Peer,
    SnapshotDir,
    SnapshotError,
    SnapshotOptions,
    check_state,
    fetch_snapshot,
)
from quorumgate.sidecar.store import ExecutedHeight, SidecarStore
from tests.engine.harness import CHAIN
from tests.sidecar.executed_log import (
    SIDECARS,
    block_hash,
    busy_world,
    execute,
    receipt_key,
    receipt_public_keys,
)

CHUNK_BYTES = 256  # small chunks, so a snapshot of the test state has many
OWN = 3  # the sidecar fetching: members 0, 1 and 2 are its peers


@dataclass(frozen=True)
class _Member:
    receipt_public_key: bytes


@dataclass(frozen=True)
class _Spec:
    """What the fetch reads of a cluster: its chain, f and the members' receipt keys."""

    chain_id: str
    f: int
    members: tuple[_Member, ...]

    def member(self, index: int) -> _Member:
        return self.members[index]


SPEC = _Spec(CHAIN, 1, tuple(_Member(k) for k in receipt_public_keys()))


@dataclass
class Log:
    """Every sidecar's executed heights of one log, and the engine config."""

    story_config: object
    by_signer: list[list[ExecutedHeight]]
    blocks: list[tuple[int, int, list[bytes]]]  # (height, block time, transactions)

    def head(self, height: int) -> Head:
        ledger_head, entries = GENESIS_PREV_HASH, 0
        for executed in self.by_signer[0][:height]:
            chained = LedgerEntry.chain(
                CHAIN, executed.height, executed.result.verdicts, ledger_head
            )
            ledger_head = chained[-1].hash if chained else ledger_head
            entries += len(chained)
        at = self.by_signer[0][height - 1]
        return Head(
            height, at.result.state_root, ledger_head, entries, block_hash(height), at.block_time_ms
        )

    def state(self, height: int) -> bytes:
        data = self.by_signer[0][height - 1].engine_state
        assert data is not None
        return data

    def attestation(self, signer: int, height: int) -> Attestation:
        return Attestation(self.by_signer[signer][height - 1].signed, self.head(height))


@pytest.fixture(scope="module")
def log() -> Log:
    world = busy_world().world
    return Log(world.config, [execute(world, signer=i) for i in range(SIDECARS)], world.log)


class StandIn:
    """One peer: the snapshots it holds (manifest, state bytes), the heights it attests,
    and optionally chunks it alters on the way out."""

    def __init__(self, index: int, log: Log) -> None:
        self.index = index
        self.log = log
        self.held: dict[int, tuple[Manifest, bytes]] = {}
        self.attests: dict[int, Attestation] = {}
        self.altered_chunks: set[int] = set()
        self.chunks_served = 0

    def hold(self, height: int, data: bytes | None = None, head: Head | None = None) -> None:
        data = self.log.state(height) if data is None else data
        head = self.log.head(height) if head is None else head
        self.held[height] = (Manifest.of(head, data, CHUNK_BYTES), data)
        self.attests.setdefault(height, self.log.attestation(self.index, height))

    def attest(self, height: int) -> None:
        self.attests[height] = self.log.attestation(self.index, height)

    async def list(self, heights: Sequence[int]) -> spb.SnapshotListReply:
        reply = spb.SnapshotListReply()
        for height in sorted(self.held, reverse=True):
            reply.snapshots.append(self.held[height][0].to_pb())
        for height in sorted(set(self.held) | set(heights)):
            if height in self.attests:
                reply.attestations.append(self.attests[height].to_pb())
        return reply

    async def chunk(self, height: int, index: int) -> bytes:
        manifest, data = self.held[height]
        self.chunks_served += 1
        part = data[index * manifest.chunk_bytes : (index + 1) * manifest.chunk_bytes]
        if index in self.altered_chunks:
            part = bytes([part[0] ^ 1]) + part[1:]
        return part

    @property
    def peer(self) -> Peer:
        return Peer(self.index, self.list, self.chunk)


def peers(log: Log) -> list[StandIn]:
    return [StandIn(i, log) for i in range(SIDECARS) if i != OWN]


async def fetch(  # type: ignore[no-untyped-def]
    log: Log, stand_ins: Sequence[StandIn], epochs: ReceiptEpochs | None = None
):
    return await fetch_snapshot(
        SPEC,  # type: ignore[arg-type]
        log.story_config,  # type: ignore[arg-type]
        OWN,
        [s.peer for s in stand_ins],
        epochs=epochs,
    )


def top(log: Log) -> int:
    return len(log.by_signer[0])


# ---------------------------------------------------------------- the honest case


async def test_the_newest_snapshot_f_plus_1_attest_is_fetched_whole(log: Log) -> None:
    older, newest = top(log) - 3, top(log) - 1
    stand_ins = peers(log)
    for s in stand_ins:
        s.hold(older)
        s.hold(newest)
    fetched = await fetch(log, stand_ins)
    assert fetched.manifest.height == newest
    assert fetched.data == log.state(newest)
    assert fetched.manifest.head == log.head(newest)
    assert len(fetched.manifest.chunk_digests) > 3
    assert len(fetched.attested_by) >= SPEC.f + 1 and OWN not in fetched.attested_by
    assert fetched.chunks_refused == 0


def test_a_snapshot_state_decodes_to_exactly_the_state(log: Log) -> None:
    """Determinism: the bytes decode to a state that encodes back to the same bytes and
    has the root the sidecars signed, both the cached and the from-scratch root."""
    for height in range(1, top(log) + 1):
        data = log.state(height)
        state = EngineState.from_bytes(data)
        assert state.to_bytes() == data == state.fresh_bytes()
        engine = Engine(log.story_config, state)  # type: ignore[arg-type]
        assert engine.state_root() == log.head(height).state_root
        manifest = Manifest.of(log.head(height), data)
        assert check_state(log.story_config, manifest, data) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------- tampered chunks


async def test_a_tampered_chunk_is_refused(log: Log) -> None:
    """The only holder alters one chunk: it does not hash to its digest, nothing is
    installed."""
    height = top(log) - 1
    holder, *others = peers(log)
    holder.hold(height)
    holder.altered_chunks = {2}
    for s in others:
        s.attest(height)
    with pytest.raises(SnapshotError, match="does not hash to its digest"):
        await fetch(log, [holder, *others])


async def test_a_tampered_chunk_is_taken_from_another_holder(log: Log) -> None:
    height = top(log) - 1
    liar, *honest = peers(log)
    for s in (liar, *honest):
        s.hold(height)
    liar.altered_chunks = {0, 1}
    fetched = await fetch(log, [liar, *honest])
    assert fetched.data == log.state(height)
    assert fetched.chunks_refused == 2


async def test_a_manifest_that_matches_its_own_forged_chunks_is_refused_by_the_root(
    log: Log,
) -> None:
    """A holder whose digests describe other bytes (say, a state with one agent more)
    passes the chunk check and fails the root: the snapshot is taken from another."""
    height = top(log) - 1
    liar, *honest = peers(log)
    forged = log.state(height - 1)  # a real state, of another height
    liar.hold(height, data=forged)  # the attested head, other bytes
    for s in honest:
        s.hold(height)
    fetched = await fetch(log, [liar, *honest])
    assert fetched.data == log.state(height)
    with pytest.raises(SnapshotError, match="not "):
        await fetch(log, [liar, *(replace_held(s) for s in honest)])


def replace_held(stand_in: StandIn) -> StandIn:
    """The same peer attesting what it holds, but holding nothing."""
    copy = StandIn(stand_in.index, stand_in.log)
    copy.attests = dict(stand_in.attests)
    return copy


# ---------------------------------------------------------------- roots nobody signed


async def test_a_root_fewer_than_f_plus_1_signed_is_refused(log: Log) -> None:
    """One peer holds and attests a snapshot; no other attests its height: refused."""
    height = top(log) - 1
    holder, *others = peers(log)
    holder.hold(height)
    with pytest.raises(SnapshotError, match="no state root that f\\+1 members signed"):
        await fetch(log, [holder, *others])


async def test_an_attestation_relayed_for_another_member_counts_for_nothing(log: Log) -> None:
    """Peer 1 answers with peer 0's signed statement as its own: a statement counts for
    the member that answered only if that member signed it."""
    height = top(log) - 1
    first, second, third = peers(log)
    first.hold(height)
    second.attests[height] = log.attestation(0, height)
    with pytest.raises(SnapshotError, match="f\\+1"):
        await fetch(log, [first, second, third])


async def test_an_attestation_whose_signature_does_not_verify_counts_for_nothing(
    log: Log,
) -> None:
    height = top(log) - 1
    first, second, third = peers(log)
    first.hold(height)
    good = log.attestation(second.index, height)
    bad_signature = bytes(64)
    second.attests[height] = Attestation(replace(good.signed, signature=bad_signature), good.head)
    with pytest.raises(SnapshotError, match="f\\+1"):
        await fetch(log, [first, second, third])


# ---------------------------------------------------------------- a lying peer


def _forged_attestation(log: Log, signer: int, height: int, head: Head) -> Attestation:
    """What a lying member can make: its own valid signature over a root it invented."""
    honest = log.by_signer[signer][height - 1].signed
    signed = sign_block(
        receipt_key(signer), signer, CHAIN, height, honest.verdict_root, head.state_root,
        honest.leaf_count, honest.validity,
    )  # fmt: skip
    return Attestation(signed, head)


async def test_a_lying_peer_among_honest_ones_is_outvoted(log: Log) -> None:
    """The liar offers a newer snapshot of a state it made up, signed by itself, and
    attests another ledger head at the honest height: the newest height f+1 attest is
    taken, with the honest members' head."""
    height = top(log) - 2
    liar, *honest = peers(log)
    for s in honest:
        s.hold(height)
    fake_height = top(log)
    fake_data = log.state(height)
    fake_head = replace(log.head(height), height=fake_height)
    liar.hold(fake_height, data=fake_data, head=fake_head)
    liar.attests[fake_height] = _forged_attestation(log, liar.index, fake_height, fake_head)
    lying_head = replace(log.head(height), ledger_head=bytes(32), ledger_entries=1)
    liar.hold(height, head=lying_head)
    liar.attests[height] = _forged_attestation(log, liar.index, height, lying_head)
    fetched = await fetch(log, [liar, *honest])
    assert fetched.manifest.height == height
    assert fetched.manifest.head == log.head(height)
    assert liar.index not in fetched.attested_by
    assert fetched.data == log.state(height)
    assert liar.chunks_served == 0  # its manifest disagrees with the attested head


async def test_two_liars_of_three_peers_cannot_get_their_state_installed(log: Log) -> None:
    """More than f liars is outside the model; still, with f = 1 and two of them agreeing
    on a forged head, the forged state's root must hash: a made-up root without a state
    that hashes to it installs nothing."""
    height = top(log) - 1
    first, second, third = peers(log)
    forged_head = replace(log.head(height), state_root=bytes(32))
    for liar in (first, second):
        liar.hold(height, head=forged_head)
        liar.attests[height] = _forged_attestation(log, liar.index, height, forged_head)
    with pytest.raises(SnapshotError, match="does not hash to the attested state root"):
        await fetch(log, [first, second, third])


# ---------------------------------------------------------------- receipt keys by epoch

ROTATED = 1  # the member whose receipt key a `receipt` record (or a `replace`) changed
NEW_KEY = SigningKey(bytes([0x77]) * 32)


def _rotated_at(boundary: int) -> ReceiptEpochs:
    """Epoch 0 up to the change block at `boundary`, epoch 1 after it, with member 1's
    receipt key replaced (by a `receipt` record, or a `replace` naming a new machine's)."""
    keys = tuple(receipt_public_keys())
    after = tuple(bytes(NEW_KEY.verify_key) if i == ROTATED else k for i, k in enumerate(keys))
    return ReceiptEpochs(
        (ReceiptEpoch(0, 1, boundary, keys), ReceiptEpoch(1, boundary + 1, None, after))
    )


def _attested_in(log: Log, signer: int, height: int, epoch: int, key: SigningKey) -> Attestation:
    """`signer`'s honest statement for `height`, signed for `epoch` with `key`."""
    honest = log.by_signer[signer][height - 1].signed
    signed = sign_block(
        key, signer, CHAIN, height, honest.verdict_root, honest.state_root,
        honest.leaf_count, honest.validity, epoch,
    )  # fmt: skip
    return Attestation(signed, log.head(height))


async def test_a_rotated_out_receipt_key_attests_nothing_past_its_epoch(log: Log) -> None:
    """The attack: member 1's receipt key was rotated at the end of epoch 0 (it may have
    leaked). Whoever holds the old key signs an epoch-0 attestation for a height of epoch
    1; with one other member's it made f+1, so the fetcher installed whatever head the two
    named. Checked against the chain of epochs it counts for nothing; member 1's new key,
    signing for epoch 1, counts."""
    height = top(log) - 1
    epochs = _rotated_at(height - 2)
    holder, rotated, silent = peers(log)
    assert rotated.index == ROTATED
    holder.hold(height)
    holder.attests[height] = _attested_in(log, holder.index, height, 1, receipt_key(holder.index))
    rotated.attests[height] = _attested_in(log, ROTATED, height, 0, receipt_key(ROTATED))
    with pytest.raises(SnapshotError, match="f\\+1"):
        await fetch(log, [holder, rotated, silent], epochs)
    # The same old key for a height of its own epoch still counts; the new key, for
    # epoch 1, counts past the boundary.
    early = _rotated_at(height + 1)
    holder.attests[height] = _attested_in(log, holder.index, height, 0, receipt_key(holder.index))
    fetched = await fetch(log, [holder, rotated, silent], early)
    assert fetched.attested_by == (holder.index, ROTATED)
    holder.attests[height] = _attested_in(log, holder.index, height, 1, receipt_key(holder.index))
    rotated.attests[height] = _attested_in(log, ROTATED, height, 1, NEW_KEY)
    fetched = await fetch(log, [holder, rotated, silent], epochs)
    assert fetched.attested_by == (holder.index, ROTATED)
    # Claiming epoch 1 with the old key, or epoch 0 with the new one, counts neither.
    for epoch, key in ((1, receipt_key(ROTATED)), (0, NEW_KEY)):
        rotated.attests[height] = _attested_in(log, ROTATED, height, epoch, key)
        with pytest.raises(SnapshotError, match="f\\+1"):
            await fetch(log, [holder, rotated, silent], epochs)


# ---------------------------------------------------------------- manifests and disk


async def test_a_manifest_of_another_format_or_beyond_the_bounds_is_not_offered(
    log: Log,
) -> None:
    height = top(log) - 1
    manifest = Manifest.of(log.head(height), log.state(height), CHUNK_BYTES)
    assert manifest.problem() is None
    assert "format version" in (replace(manifest, format_version=2).problem() or "")
    assert "chunk digests" in (replace(manifest, chunk_digests=()).problem() or "")
    assert "at most" in (replace(manifest, total_bytes=(1 << 30) + 1).problem() or "")
    assert Manifest.from_pb(manifest.to_pb()) == manifest
    assert Manifest.from_json(manifest.to_json()) == manifest


def test_a_snapshot_directory_keeps_the_newest_and_the_pinned(tmp_path: Path, log: Log) -> None:
    snapshots = SnapshotDir(tmp_path / "snapshots", kept=2)
    snapshots.pinned = 1
    for height in range(1, 6):
        assert snapshots.write(log.head(height), log.state(height)) is not None
    assert [m.height for m in snapshots.manifests()] == [5, 4, 1]
    again = SnapshotDir(tmp_path / "snapshots", kept=2)
    assert [m.height for m in again.manifests()] == [5, 4, 1]
    assert again.state(5) == log.state(5)
    manifest = again.manifest(5)
    assert manifest is not None
    chunks = [again.chunk(5, i) for i in range(len(manifest.chunk_digests))]
    assert b"".join(c or b"" for c in chunks) == log.state(5)
    assert again.chunk(5, len(manifest.chunk_digests)) is None
    assert again.chunk(3, 0) is None
    (tmp_path / "snapshots" / "5" / "state").write_bytes(b"x" + log.state(5)[1:])
    assert SnapshotDir(tmp_path / "snapshots").state(5) is None  # digests checked on read


def test_the_options_file_sets_interval_and_count(tmp_path: Path) -> None:
    assert SnapshotOptions.read(tmp_path) == SnapshotOptions()
    (tmp_path / OPTIONS_FILE).write_text(json.dumps({"interval_heights": 20, "kept": 3}))
    assert SnapshotOptions.read(tmp_path) == SnapshotOptions(20, 3)
    (tmp_path / OPTIONS_FILE).write_text(json.dumps({"kept": 0}))
    with pytest.raises(ValueError, match="kept"):
        SnapshotOptions.read(tmp_path)


def test_snapshots_answer_the_members_only() -> None:
    for method in (METHOD_LIST_SNAPSHOTS, METHOD_SNAPSHOT_CHUNK):
        assert may_call(method, Role.SIDECAR) and may_call(method, Role.REPLICA)
        for role in (Role.OWNER, Role.AUDITOR, None):
            assert not may_call(method, role)
    assert may_call(METHOD_LEDGER, Role.AUDITOR)


# ---------------------------------------------------------------- a store from a checkpoint


async def test_a_store_installed_at_a_checkpoint_goes_on_and_verifies(
    tmp_path: Path, log: Log
) -> None:
    """Installed at height H, the store records H+1.. as a sidecar would, its ledger
    verifies from the checkpoint, and its head equals a store that recorded every height."""
    height = top(log) - 4
    head = log.head(height)
    full = await SidecarStore.open(tmp_path / "full.db", CHAIN)
    part = await SidecarStore.open(tmp_path / "part.db", CHAIN)
    try:
        for executed in log.by_signer[OWN]:
            await full.record(executed)
        await part.install_checkpoint(head, EngineState.from_bytes(log.state(height)))
        assert (part.executed_height, part.history_from) == (height, height + 1)
        loaded = await part.loaded_state()
        assert loaded is not None and loaded[0] == log.state(height)
        engine = Engine(log.story_config, loaded[1])  # type: ignore[arg-type]
        for executed in log.by_signer[OWN][height:]:
            result = engine.execute_block(
                executed.height, executed.block_time_ms, log.blocks[executed.height - 1][2], True
            )
            assert result.state_root == executed.result.state_root
            await part.record(replace(executed, state_delta=engine.state_delta()))
        assert (part.ledger_head, part.ledger_entries) == (full.ledger_head, full.ledger_entries)
        assert await part.verify_ledger() is None
        assert await part.ledger_hash_before(height + 1) == head.ledger_head
        public = receipt_public_keys()[OWN]
        for audited in range(part.history_from, top(log) + 1):  # the self-audit's walk
            assert await audit_height(part, CHAIN, public, audited) is None, audited
        reloaded = await part.loaded_state()
        assert reloaded is not None and reloaded[0] == (await full.loaded_state() or (b"",))[0]
        attested = await part.attestation_at(top(log))
        assert attested is not None and attested[1] == log.head(top(log))
        assert await part.attestation_at(height) is None  # it signed nothing there
        with pytest.raises(Exception, match="empty store only"):
            await part.install_checkpoint(head, EngineState.from_bytes(log.state(height)))
    finally:
        await full.close()
        await part.close()


async def test_a_checkpoint_whose_state_does_not_hash_to_its_root_is_refused_at_load(
    tmp_path: Path, log: Log
) -> None:
    height = top(log) - 1
    wrong = replace(log.head(height), state_root=bytes(32))
    store = await SidecarStore.open(tmp_path / "s.db", CHAIN)
    try:
        await store.install_checkpoint(wrong, EngineState.from_bytes(log.state(height)))
        with pytest.raises(Exception, match="does not hash to the state root"):
            await store.loaded_state()
    finally:
        await store.close()


def test_ledger_verify_of_a_store_from_a_checkpoint_says_where_local_history_starts(
    tmp_path: Path, log: Log
) -> None:
    """Not a failure for the entries below the checkpoint: the walk starts there, and the
    command names the checkpoint (height, ledger head, entries before it)."""
    height = top(log) - 3
    path = tmp_path / "part.db"

    async def build() -> None:
        store = await SidecarStore.open(path, CHAIN)
        try:
            state = EngineState.from_bytes(log.state(height))
            await store.install_checkpoint(log.head(height), state)
            engine = Engine(log.story_config, state)  # type: ignore[arg-type]
            for executed in log.by_signer[OWN][height:]:
                engine.execute_block(
                    executed.height, executed.block_time_ms, log.blocks[executed.height - 1][2]
                )
                await store.record(replace(executed, state_delta=engine.state_delta()))
        finally:
            await store.close()

    asyncio.run(build())
    out = io.StringIO()
    assert operator.ledger_verify(path, CHAIN, out) == operator.EXIT_OK, out.getvalue()
    head = log.head(height)
    assert (
        f"local history starts after the checkpoint at height {height} (ledger head "
        f"{head.ledger_head.hex()}, {head.ledger_entries} entries before it"
    ) in out.getvalue()
