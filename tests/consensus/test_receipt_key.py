"""A member's receipt key is a property of the epoch (docs/consensus/epochs.md, "Receipt
keys"): a `receipt` record, signed by the record key in force and carrying the new key's
proof of possession, ends the epoch with the same members and gives one member's sidecar
a new receipt key from the next epoch on. Refused (the record changes nothing): a bad
proof, or a key already in use as a receipt key, a consensus key or the record key."""

from __future__ import annotations

from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import (
    RECONFIG_KINDS,
    OwnerRecords,
    Reconfiguration,
    receipt_key_statement,
    receipt_record,
    sign_record,
)
from quorumgate.replica.epochchain import EpochChain, PlainEpochEnd, extend_epoch_chain
from quorumgate.replica.epochs import change_in, owner_after, start_qc
from quorumgate.replica.types import QuorumCert, vote_bytes
from quorumgate.replica.wire import encode_epoch_end
from tests.consensus.helpers import (
    CHAIN,
    SIGNERS,
    chain_of,
    key_seed,
    make_block,
    membership,
    qc_for,
)

OWNER = Ed25519Signer(key_seed(0, "owner"))
RECEIPT_SIGNERS = tuple(Ed25519Signer(key_seed(i, "receipt")) for i in range(4))
RECEIPT_KEYS = tuple(s.public_key for s in RECEIPT_SIGNERS)
NEW = Ed25519Signer(key_seed(1, "new-receipt"))
RECORDS = OwnerRecords(CHAIN, OWNER.public_key, RECEIPT_KEYS)
KEYS_0 = tuple(s.public_key for s in SIGNERS[:4])


def receipt_tx(
    epoch: int = 0,
    index: int = 1,
    new: Ed25519Signer = NEW,
    old_key: bytes | None = None,
    owner: Ed25519Signer = OWNER,
) -> bytes:
    old = RECEIPT_KEYS[index] if old_key is None else old_key
    record = receipt_record(CHAIN, epoch, index, old, new.public_key, new.sign)
    return sign_record(record, CHAIN, epoch, owner.sign)


def test_a_receipt_record_keeps_the_members_and_changes_one_receipt_key() -> None:
    step = RECORDS.step(receipt_tx(), membership())
    assert step is not None
    epoch_1, records_1 = step
    assert epoch_1.epoch == 1
    assert tuple(m.public_key for m in epoch_1.members) == KEYS_0
    assert records_1.receipt_keys == (
        RECEIPT_KEYS[0], NEW.public_key, RECEIPT_KEYS[2], RECEIPT_KEYS[3],
    )  # fmt: skip
    assert records_1.owner_key == OWNER.public_key


def test_the_kind_is_appended() -> None:
    assert RECONFIG_KINDS.index("receipt") == 5
    assert RECONFIG_KINDS[:5] == ("replace", "rotate", "add", "remove", "owner")
    record = receipt_record(CHAIN, 0, 1, RECEIPT_KEYS[1], NEW.public_key, NEW.sign)
    data = record.encode()
    assert data[len(b"qg/reconfig/v1\x00")] == 5
    assert Reconfiguration.parse(data) == record
    assert Reconfiguration.parse(data[:-1]) is None
    assert record.apply(membership()) is None  # a bare one (the simulator's) is no change


def test_a_bad_proof_changes_nothing() -> None:
    other = Ed25519Signer(key_seed(5, "other"))
    cases = {
        # signed by another key than the one it names
        "other_signer": Reconfiguration(
            "receipt", (1,), (NEW.public_key,),
            other.sign(receipt_key_statement(CHAIN, 0, 1, RECEIPT_KEYS[1], NEW.public_key)),
        ),
        # for another epoch, another index, another old key
        "other_epoch": Reconfiguration(
            "receipt", (1,), (NEW.public_key,),
            NEW.sign(receipt_key_statement(CHAIN, 1, 1, RECEIPT_KEYS[1], NEW.public_key)),
        ),
        "other_index": Reconfiguration(
            "receipt", (1,), (NEW.public_key,),
            NEW.sign(receipt_key_statement(CHAIN, 0, 2, RECEIPT_KEYS[1], NEW.public_key)),
        ),
        "other_old_key": Reconfiguration(
            "receipt", (1,), (NEW.public_key,),
            NEW.sign(receipt_key_statement(CHAIN, 0, 1, RECEIPT_KEYS[2], NEW.public_key)),
        ),
        "other_chain": Reconfiguration(
            "receipt", (1,), (NEW.public_key,),
            NEW.sign(receipt_key_statement("qg-other", 0, 1, RECEIPT_KEYS[1], NEW.public_key)),
        ),
    }  # fmt: skip
    for name, record in cases.items():
        tx = sign_record(record, CHAIN, 0, OWNER.sign)
        assert RECORDS.step(tx, membership()) is None, name


def test_a_key_in_use_changes_nothing() -> None:
    in_use = {
        "its_own_receipt_key": RECEIPT_SIGNERS[1],
        "another_members_receipt_key": RECEIPT_SIGNERS[2],
        "a_consensus_key": SIGNERS[3],
        "the_record_key": OWNER,
    }
    for name, signer in in_use.items():
        assert RECORDS.step(receipt_tx(new=signer), membership()) is None, name


def test_no_member_unsigned_or_another_epoch_changes_nothing() -> None:
    assert RECORDS.step(receipt_tx(index=4, old_key=RECEIPT_KEYS[0]), membership()) is None
    other = Ed25519Signer(key_seed(6, "not-owner"))
    assert RECORDS.step(receipt_tx(owner=other), membership()) is None
    assert RECORDS.step(receipt_tx(epoch=1), membership()) is None
    # A reader that was not given the epoch's receipt keys cannot check one: no change.
    assert OwnerRecords(CHAIN, OWNER.public_key).step(receipt_tx(), membership()) is None


def test_the_receipt_keys_follow_the_change_block() -> None:
    block = make_block(chain_of(range(1, 2))[-1], 2, payload=(b"other", receipt_tx()))
    epoch_1 = change_in(block, membership(), RECORDS)
    assert epoch_1 is not None and epoch_1.epoch == 1
    assert owner_after(block, membership(), RECORDS).receipt_keys[1] == NEW.public_key


def _qc1(block: object) -> QuorumCert:
    from quorumgate.replica.types import Block

    assert isinstance(block, Block)
    statement = vote_bytes(f"{CHAIN}#epoch=1", block.view, block.height, block.hash)
    return QuorumCert(
        block.view,
        block.height,
        block.hash,
        tuple((v, SIGNERS[v].sign(statement)) for v in (0, 1, 2)),
    )


def follower_ends() -> tuple[list[PlainEpochEnd], int]:
    """Epoch 0 ends with the rotation of member 1's receipt key at height 4; epoch 1 with
    a second one, of member 2's, at height 6. Returns the ends and epoch 1's change height."""
    blocks = chain_of(range(1, 4))
    boundary_1 = make_block(blocks[-1], 4, payload=(receipt_tx(),))
    suffix_1 = make_block(boundary_1, 5)
    end_1 = PlainEpochEnd(
        1, b"".join(KEYS_0), encode_epoch_end(boundary_1, (suffix_1,), qc_for(suffix_1))
    )
    second = Ed25519Signer(key_seed(7, "second-receipt"))
    first = make_block(boundary_1, 5, start_qc(CHAIN, boundary_1))
    tx = sign_record(
        receipt_record(CHAIN, 1, 2, RECEIPT_KEYS[2], second.public_key, second.sign),
        CHAIN, 1, OWNER.sign,
    )  # fmt: skip
    boundary_2 = make_block(first, 6, _qc1(first), payload=(tx,))
    suffix_2 = make_block(boundary_2, 7, _qc1(boundary_2))
    end_2 = PlainEpochEnd(
        2, b"".join(KEYS_0), encode_epoch_end(boundary_2, (suffix_2,), _qc1(suffix_2))
    )
    return [end_1, end_2], boundary_1.height


def test_a_follower_carries_the_receipt_keys_link_by_link() -> None:
    ends, _ = follower_ends()
    chain = extend_epoch_chain(EpochChain.genesis(membership()), ends, RECORDS)
    assert [e.epoch for e in chain.epochs] == [0, 1, 2]
    assert chain.epochs[0].receipt_keys == ()  # the reader's own: the cluster file's
    assert chain.epochs[1].receipt_keys[1] == NEW.public_key
    assert chain.epochs[1].receipt_keys[2] == RECEIPT_KEYS[2]
    assert chain.epochs[2].receipt_keys[1] == NEW.public_key
    assert (
        chain.epochs[2].receipt_keys[2] == Ed25519Signer(key_seed(7, "second-receipt")).public_key
    )
    # Checked again from a trusted chain that holds epoch 1, the keys carry on.
    trusted = extend_epoch_chain(EpochChain.genesis(membership()), ends[:1], RECORDS)
    assert extend_epoch_chain(trusted, ends, RECORDS) == chain
