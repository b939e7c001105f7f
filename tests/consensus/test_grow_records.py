"""`add` and `remove` on a live chain (docs/consensus/epochs.md, "Growing and shrinking").
An `add` carries one member entry per new key, naming the indexes n, n+1 and n+2 in the
order of the keys; the next epoch's reader carries the new members' receipt keys. A live
`remove` changes the member set only if it names the three highest indexes: any other
would renumber a running member. The simulator's reader keeps the general rule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import MemberEntry, OwnerRecords, Reconfiguration, sign_record
from tests.consensus.helpers import CHAIN, SIGNERS, key_seed, membership
from tests.replica.test_epoch_spec import cluster

OWNER = Ed25519Signer(key_seed(0, "owner"))
RECEIPTS = tuple(Ed25519Signer(key_seed(i, "receipt")).public_key for i in range(7))
LIVE = OwnerRecords(CHAIN, OWNER.public_key, RECEIPTS[:4])


def entry(index: int, key_index: int | None = None) -> MemberEntry:
    k = index if key_index is None else key_index
    port = 7400 + 10 * index
    return MemberEntry(
        index, "127.0.0.1", port, port + 1, port + 2, port + 3,
        SIGNERS[k].public_key, RECEIPTS[k],
    )  # fmt: skip


def add_record(entries: tuple[MemberEntry, ...]) -> Reconfiguration:
    return Reconfiguration(
        "add", (), tuple(e.public_key for e in entries), entries=tuple(e.encode() for e in entries)
    )


def signed(record: Reconfiguration, epoch: int = 0) -> bytes:
    return sign_record(record, CHAIN, epoch, OWNER.sign)


def test_an_add_grows_the_members_and_the_receipt_keys() -> None:
    step = LIVE.step(signed(add_record((entry(4), entry(5), entry(6)))), membership(4))
    assert step is not None
    nxt, reader = step
    assert nxt.n == 7 and nxt.f == 2 and nxt.epoch == 1
    assert [nxt.key(i) for i in range(7)] == [s.public_key for s in SIGNERS]
    assert reader.receipt_keys == RECEIPTS


def test_an_add_whose_entries_name_wrong_indexes_changes_nothing() -> None:
    """The attack: the owner's record brings three keys, but their entries name members
    that exist (or skip one), so that peers would reach a running member's index at a new
    machine's address, or leave an index nobody serves."""
    for indexes in ((3, 4, 5), (4, 6, 5), (5, 6, 7), (4, 5, 5), (0, 1, 2)):
        entries = tuple(entry(i, k) for i, k in zip(indexes, (4, 5, 6), strict=True))
        assert LIVE.step(signed(add_record(entries)), membership(4)) is None, indexes


def test_an_add_without_entries_changes_nothing_live() -> None:
    bare = Reconfiguration("add", (), tuple(SIGNERS[i].public_key for i in (4, 5, 6)))
    assert LIVE.read(signed(bare)) is not None  # the owner signed it
    assert LIVE.step(signed(bare), membership(4)) is None
    assert replace(LIVE, general=True).step(signed(bare), membership(4)) is not None


def test_a_remove_of_the_three_highest_shrinks_and_keeps_every_index() -> None:
    reader = OwnerRecords(CHAIN, OWNER.public_key, RECEIPTS)
    step = reader.step(signed(Reconfiguration("remove", (4, 5, 6))), membership(7))
    assert step is not None
    nxt, after = step
    assert [nxt.key(i) for i in range(4)] == [s.public_key for s in SIGNERS[:4]]
    assert nxt.n == 4 and after.receipt_keys == RECEIPTS[:4]


def test_a_live_remove_of_a_middle_member_changes_nothing() -> None:
    """The attack: a `remove` naming members below the highest would move member 5 to index
    2, under whose index its processes, node directory and every peer's links run."""
    reader = OwnerRecords(CHAIN, OWNER.public_key, RECEIPTS)
    for gone in ((0, 1, 2), (2, 5, 6), (1, 4, 6)):
        record = signed(Reconfiguration("remove", gone))
        assert reader.step(record, membership(7)) is None, gone
        # the simulator's reader keeps the general rule
        assert replace(reader, general=True).step(record, membership(7)) is not None


def test_the_cluster_per_epoch_grows_and_shrinks(tmp_path: Path) -> None:
    spec = cluster(tmp_path)[0]  # a 4-member cluster file
    grown = spec.with_entries((entry(4), entry(5), entry(6)), 7)
    assert grown.n == 7 and grown.member(5).replica_port == 7450
    assert grown.with_entries((), 4).members == spec.members
