"""The record key is a property of the epoch (docs/consensus/epochs.md, "The record key"):
an `owner` record, signed by the key in force and carrying the new key's proof of
possession, ends the epoch with the same members and hands the next epoch the new key.
From then on a record signed by the old key is no change: whoever kept a copy of an owner
key the operator rotated because it may have leaked cannot hand members' seats to keys
of their own, one epoch at a time, until they hold a quorum."""

from __future__ import annotations

import pytest

from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import (
    OwnerRecords,
    Reconfiguration,
    owner_key_statement,
    owner_record,
    sign_record,
)
from quorumgate.replica.core import Core, NoPayload, Recovered
from quorumgate.replica.epochchain import (
    EpochChain,
    EpochChainError,
    PlainEpochEnd,
    extend_epoch_chain,
)
from quorumgate.replica.epochs import change_in, epoch_safety_state, owner_after, start_qc
from quorumgate.replica.mempool import Mempool
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.types import (
    Block,
    Envelope,
    Proposal,
    QuorumCert,
    Vote,
    genesis_block,
    proposal_bytes,
    vote_bytes,
)
from quorumgate.replica.wire import encode_epoch_end
from tests.consensus.helpers import (
    CHAIN,
    SIGNERS,
    START_MS,
    TEST_LIMITS,
    chain_of,
    key_seed,
    make_block,
    membership,
    qc_for,
    sent_of,
)

OLD = Ed25519Signer(key_seed(0, "owner"))  # the cluster file's owner key, perhaps leaked
NEW = Ed25519Signer(key_seed(1, "new-owner"))
THIEF_KEY = Ed25519Signer(key_seed(2, "thief")).public_key  # a consensus key the thief holds
RECORDS = OwnerRecords(CHAIN, OLD.public_key)
KEYS_0 = tuple(s.public_key for s in SIGNERS[:4])


def _owner_tx(epoch: int = 0, old: Ed25519Signer = OLD, new: Ed25519Signer = NEW) -> bytes:
    record = owner_record(CHAIN, epoch, old.public_key, new.public_key, new.sign)
    return sign_record(record, CHAIN, epoch, old.sign)


def _rotate_tx(epoch: int, owner: Ed25519Signer, member: int = 2) -> bytes:
    return sign_record(Reconfiguration("rotate", (member,), (THIEF_KEY,)), CHAIN, epoch, owner.sign)


def _rotated() -> tuple[object, OwnerRecords]:
    step = RECORDS.step(_owner_tx(), membership())
    assert step is not None
    return step


def test_an_owner_record_keeps_the_members_and_hands_over_the_record_key() -> None:
    epoch_0 = membership()
    step = RECORDS.step(_owner_tx(), epoch_0)
    assert step is not None
    epoch_1, records_1 = step
    assert epoch_1.epoch == 1
    assert [m.public_key for m in epoch_1.members] == list(KEYS_0)
    assert records_1.owner_key == NEW.public_key
    assert records_1.chain_id == CHAIN


def test_after_the_owner_rotation_the_old_key_changes_no_member() -> None:
    """The attack: the old owner key signs a rotation of member 2 to a key its holder
    controls, for the epoch after the owner rotation. It must change nothing; the same
    record signed by the new key must."""
    epoch_1, records_1 = _rotated()
    assert records_1.change(_rotate_tx(1, OLD), epoch_1) is None
    assert records_1.read(_rotate_tx(1, OLD)) is None  # refused as unsigned by voters
    nxt = records_1.change(_rotate_tx(1, NEW), epoch_1)
    assert nxt is not None and nxt.key(2) == THIEF_KEY and nxt.epoch == 2


def test_the_old_key_cannot_rotate_the_owner_key_again() -> None:
    epoch_1, records_1 = _rotated()
    thief = Ed25519Signer(key_seed(3, "thief-owner"))
    assert records_1.step(_owner_tx(1, OLD, thief), epoch_1) is None
    assert records_1.step(_owner_tx(1, NEW, thief), epoch_1) is not None


def test_the_record_key_follows_the_change_block() -> None:
    block = make_block(chain_of(range(1, 2))[-1], 2, payload=(b"other", _owner_tx()))
    epoch_1 = change_in(block, membership(), RECORDS)
    assert epoch_1 is not None and epoch_1.epoch == 1
    assert owner_after(block, membership(), RECORDS).owner_key == NEW.public_key
    rotate = make_block(chain_of(range(1, 2))[-1], 2, payload=(_rotate_tx(0, OLD),))
    assert owner_after(rotate, membership(), RECORDS) == RECORDS
    with pytest.raises(ValueError):
        owner_after(make_block(chain_of(range(1, 2))[-1], 2), membership(), RECORDS)


def test_an_owner_record_without_the_new_keys_proof_changes_nothing() -> None:
    wrong_statement = NEW.sign(owner_key_statement(CHAIN, 1, OLD.public_key, NEW.public_key))
    other_signer = Ed25519Signer(key_seed(4, "other")).sign(
        owner_key_statement(CHAIN, 0, OLD.public_key, NEW.public_key)
    )
    for proof in (bytes(64), wrong_statement, other_signer):
        record = Reconfiguration("owner", (), (NEW.public_key,), proof)
        tx = sign_record(record, CHAIN, 0, OLD.sign)
        assert RECORDS.read(tx) is not None
        assert RECORDS.step(tx, membership()) is None


def test_an_owner_record_naming_the_same_or_a_members_key_changes_nothing() -> None:
    member = SIGNERS[1]
    same = owner_record(CHAIN, 0, OLD.public_key, OLD.public_key, OLD.sign)
    members = owner_record(CHAIN, 0, OLD.public_key, member.public_key, member.sign)
    for record in (same, members):
        assert RECORDS.step(sign_record(record, CHAIN, 0, OLD.sign), membership()) is None


def test_the_owner_record_encodes_and_parses_whole() -> None:
    record = owner_record(CHAIN, 0, OLD.public_key, NEW.public_key, NEW.sign)
    data = record.encode()
    assert Reconfiguration.parse(data) == record
    assert Reconfiguration.parse(data[:-1]) is None
    assert Reconfiguration.parse(data + b"\x00") is None
    # Without its proof it is no record; a bare one (the simulator's) changes nothing.
    assert Reconfiguration.parse(Reconfiguration("owner", (), (NEW.public_key,)).encode()) is None
    assert record.apply(membership()) is None


def test_earlier_kinds_keep_their_encoding() -> None:
    """Kinds are appended: a `rotate` record encodes as it always did."""
    data = Reconfiguration("rotate", (2,), (THIEF_KEY,)).encode()
    assert data[len(b"qg/reconfig/v1\x00")] == 1
    assert data.endswith(THIEF_KEY)


def _core_of_epoch_1(records: OwnerRecords) -> tuple[Core, Block]:
    """Member 0's core of epoch 1, started as the shell starts it after the owner
    rotation committed at a change block, with `records` for the epoch's records."""
    change = make_block(genesis_block(CHAIN), 1, payload=(_owner_tx(),))
    nxt = RECORDS.change(_owner_tx(), membership())
    assert nxt is not None
    safety = epoch_safety_state(change, SafetyState.initial(CHAIN))
    core = Core(
        nxt, 0, SIGNERS[0], limits=TEST_LIMITS, now_ms=START_MS,
        recovered=Recovered(safety, change, boundary=change), fence_on_start=False,
        epochs=True, owner_records=records, payload=AnyPayload(),
    )  # fmt: skip
    core.start()
    return core, change


class AnyPayload(NoPayload):
    """A payload source that takes any transaction: what the core itself refuses."""

    def check(self, block: Block) -> str | None:
        return None


def _qc1(block: Block) -> QuorumCert:
    statement = vote_bytes(f"{CHAIN}#epoch=1", block.view, block.height, block.hash)
    return QuorumCert(
        block.view,
        block.height,
        block.hash,
        tuple((v, SIGNERS[v].sign(statement)) for v in (0, 1, 2)),
    )


def _end(number: int, boundary: Block, suffix: Block, qc: QuorumCert) -> PlainEpochEnd:
    return PlainEpochEnd(number, b"".join(KEYS_0), encode_epoch_end(boundary, (suffix,), qc))


def _follower_chain(second_owner: Ed25519Signer) -> list[PlainEpochEnd]:
    """Epoch 0 ends with the owner rotation; epoch 1 with a rotation of member 2 signed
    by `second_owner`. (The stored keys of epoch 2 claim the record's members.)"""
    blocks = chain_of(range(1, 4))
    boundary_1 = make_block(blocks[-1], 4, payload=(_owner_tx(),))
    suffix_1 = make_block(boundary_1, 5)
    end_1 = _end(1, boundary_1, suffix_1, qc_for(suffix_1))
    first = make_block(boundary_1, 5, start_qc(CHAIN, boundary_1))
    boundary_2 = make_block(first, 6, _qc1(first), payload=(_rotate_tx(1, second_owner),))
    suffix_2 = make_block(boundary_2, 7, _qc1(boundary_2))
    keys_2 = (KEYS_0[0], KEYS_0[1], THIEF_KEY, KEYS_0[3])
    encoded = encode_epoch_end(boundary_2, (suffix_2,), _qc1(suffix_2))
    return [end_1, PlainEpochEnd(2, b"".join(keys_2), encoded)]


def test_a_follower_checks_each_record_with_the_key_of_its_epoch() -> None:
    genesis = EpochChain.genesis(membership())
    chain = extend_epoch_chain(genesis, _follower_chain(NEW), RECORDS)
    # (None: the cluster file's key, as the reader given holds it.)
    assert [e.owner_key for e in chain.epochs] == [None, NEW.public_key, NEW.public_key]
    assert chain.current.keys[2] == THIEF_KEY
    # Checked again from a trusted chain that holds epoch 1, the key carries on.
    trusted = extend_epoch_chain(genesis, _follower_chain(NEW)[:1], RECORDS)
    assert extend_epoch_chain(trusted, _follower_chain(NEW), RECORDS) == chain


def test_a_follower_refuses_a_change_signed_by_a_rotated_out_owner_key() -> None:
    with pytest.raises(EpochChainError) as raised:
        extend_epoch_chain(EpochChain.genesis(membership()), _follower_chain(OLD), RECORDS)
    assert raised.value.epoch == 2
    assert raised.value.reason == "no_change"


def test_the_mempool_takes_records_signed_with_the_key_in_force() -> None:
    _, records_1 = _rotated()
    pool = Mempool(CHAIN, owner_records=RECORDS)
    early = _rotate_tx(1, OLD, member=1)  # taken in epoch 0, where its key was in force
    assert pool.admit(early).accepted
    pool.enter_epoch(1, records_1)
    assert not pool.admit(_rotate_tx(1, OLD)).accepted
    assert pool.admit(_rotate_tx(1, NEW)).accepted
    assert early not in pool.take((), 10, 1 << 20)


def test_a_voter_of_the_next_epoch_refuses_a_record_signed_by_the_old_key() -> None:
    _, records_1 = _rotated()
    core, boundary = _core_of_epoch_1(records_1)
    view = boundary.view + 1
    for owner, voted in ((OLD, False), (NEW, True)):
        block = make_block(
            boundary, view, start_qc(CHAIN, boundary), payload=(_rotate_tx(1, owner),)
        )
        leader = block.proposer
        statement = proposal_bytes(core.membership.signing_id, block.view, block.hash)
        proposal = Proposal(block, SIGNERS[leader].sign(statement))
        votes = sent_of(core.on_message(Envelope(CHAIN, leader, proposal, 1)), Vote)
        assert bool(votes) is voted
    assert core.dropped["unsigned_change"] == 1


def test_the_signed_statements_keep_the_documented_bytes() -> None:
    """Both statements share one framing (`epoch_statement`); a chain's existing
    signatures stay valid only if the bytes are those docs/consensus/epochs.md gives."""
    from quorumgate.proto.membership import record_statement

    record = Reconfiguration("rotate", (2,), (b"\x09" * 32,)).encode()
    epoch = (7).to_bytes(8, "big")
    assert record_statement(CHAIN, 7, record) == (
        b"qg/reconfig-owner/v1\x00" + CHAIN.encode() + b"\x00" + epoch + record
    )
    old, new = b"\x01" * 32, b"\x02" * 32
    assert owner_key_statement(CHAIN, 7, old, new) == (
        b"qg/reconfig-owner-key/v1\x00" + CHAIN.encode() + b"\x00" + epoch + old + new
    )
