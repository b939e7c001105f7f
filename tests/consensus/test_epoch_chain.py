"""The chain of epochs a follower checks from the cluster file (replica/epochchain.py;
docs/consensus/epochs.md, "Followers: the chain of epochs"): each stored epoch end is
taken only if the change block carries the owner's record for that epoch and chain, its
commit is certified by a quorum of the epoch it ends, and the keys the replica claims are
the record's. Real Ed25519 signatures over a built chain of three epochs (member 2's key
rotated, then member 1's)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import OwnerRecords, Reconfiguration, sign_record
from quorumgate.replica.epochchain import (
    EpochChain,
    EpochChainError,
    PlainEpochEnd,
    extend_epoch_chain,
)
from quorumgate.replica.epochs import start_qc
from quorumgate.replica.types import Block, QuorumCert, genesis_block, vote_bytes
from quorumgate.replica.wire import encode_epoch_end
from tests.consensus.helpers import (
    CHAIN,
    OUTSIDER,
    SIGNERS,
    chain_of,
    key_seed,
    make_block,
    membership,
    qc_for,
)
from tests.consensus.test_member_entries import entry as member_entry

OWNER = Ed25519Signer(key_seed(0, "owner"))
STRANGER = Ed25519Signer(key_seed(1, "stranger"))
RECORDS = OwnerRecords(CHAIN, OWNER.public_key)
ROTATED_2 = Ed25519Signer(key_seed(2, "rotated"))  # member 2 from epoch 1 on
ROTATED_1 = Ed25519Signer(key_seed(1, "rotated"))  # member 1 from epoch 2 on
KEYS_0 = tuple(s.public_key for s in SIGNERS[:4])
SIGNERS_1 = (SIGNERS[0], SIGNERS[1], ROTATED_2, SIGNERS[3])
KEYS_1 = tuple(s.public_key for s in SIGNERS_1)
KEYS_2 = (KEYS_1[0], ROTATED_1.public_key, KEYS_1[2], KEYS_1[3])
FLIPS = 200  # one-byte flips tried, about 4 ms each


def _qc(
    block: Block,
    epoch: int,
    signers: tuple[Ed25519Signer, ...],
    voters: tuple[int, ...] = (0, 1, 2),
    chain: str = CHAIN,
) -> QuorumCert:
    """A QC of `epoch` for `block`, each voter signing with its key in `signers`."""
    name = chain if epoch == 0 else f"{chain}#epoch={epoch}"
    statement = vote_bytes(name, block.view, block.height, block.hash)
    return QuorumCert(
        block.view,
        block.height,
        block.hash,
        tuple((v, signers[v].sign(statement)) for v in sorted(voters)),
    )


@dataclasses.dataclass(frozen=True)
class Built:
    boundary_1: Block  # height 4: rotates member 2, signed for epoch 0
    boundary_2: Block  # height 6: rotates member 1, signed for epoch 1
    end_1: PlainEpochEnd  # what a replica stores for epoch 1
    end_2: PlainEpochEnd  # ... and for epoch 2


def _build(
    chain: str = CHAIN,
    owner: Ed25519Signer = OWNER,
    qc_1: QuorumCert | None = None,
    keys_2: tuple[bytes, ...] = KEYS_2,
) -> Built:
    """Epoch 0 to 2 as the replicas commit them. `qc_1`: the QC stored as committing
    epoch 0's change block (default: a genuine one, of epoch 0's members)."""
    blocks = chain_of(range(1, 4), chain=chain)
    rotate_2 = Reconfiguration("rotate", (2,), (ROTATED_2.public_key,))
    record_1 = sign_record(rotate_2, chain, 0, owner.sign)
    boundary_1 = make_block(blocks[-1], 4, chain=chain, payload=(record_1,))
    suffix_1 = make_block(boundary_1, 5, chain=chain)
    end_qc_1 = qc_for(suffix_1, chain=chain) if qc_1 is None else qc_1
    end_1 = PlainEpochEnd(1, b"".join(KEYS_1), encode_epoch_end(boundary_1, (suffix_1,), end_qc_1))
    # Epoch 1: its first block extends the change block with the start certificate.
    first = make_block(boundary_1, 5, start_qc(chain, boundary_1), chain=chain)
    rotate_1 = Reconfiguration("rotate", (1,), (ROTATED_1.public_key,))
    record_2 = sign_record(rotate_1, chain, 1, owner.sign)
    boundary_2 = make_block(
        first, 6, _qc(first, 1, SIGNERS_1, chain=chain), chain=chain, payload=(record_2,)
    )
    suffix_2 = make_block(boundary_2, 7, _qc(boundary_2, 1, SIGNERS_1, chain=chain), chain=chain)
    end_qc_2 = _qc(suffix_2, 1, SIGNERS_1, (0, 2, 3), chain=chain)
    end_2 = PlainEpochEnd(2, b"".join(keys_2), encode_epoch_end(boundary_2, (suffix_2,), end_qc_2))
    return Built(boundary_1, boundary_2, end_1, end_2)


GENESIS = EpochChain.genesis(membership())


def _refused(
    ends: list[PlainEpochEnd], trusted: EpochChain = GENESIS, **bounds: int
) -> EpochChainError:
    with pytest.raises(EpochChainError) as raised:
        extend_epoch_chain(trusted, ends, RECORDS, **bounds)
    return raised.value


def test_an_honest_chain_gives_every_epochs_member_set() -> None:
    built = _build()
    chain = extend_epoch_chain(GENESIS, [built.end_1, built.end_2], RECORDS)
    assert [e.epoch for e in chain.epochs] == [0, 1, 2]
    assert [e.keys for e in chain.epochs] == [KEYS_0, KEYS_1, KEYS_2]
    assert [e.boundary_height for e in chain.epochs] == [0, 4, 6]
    assert chain.current.boundary == built.boundary_2
    assert chain.current.membership.signing_id == f"{CHAIN}#epoch=2"


def test_no_ends_is_epoch_zero() -> None:
    assert extend_epoch_chain(GENESIS, [], RECORDS) == GENESIS


def test_a_trusted_chain_checks_only_the_new_links() -> None:
    """A client that checked epoch 1 earlier and comes back after epoch 2 started checks
    the one new link; an answer that stops at epoch 1 (a replica behind) leaves it as is."""
    built = _build()
    known = extend_epoch_chain(GENESIS, [built.end_1], RECORDS)
    assert known.current.epoch == 1
    assert extend_epoch_chain(known, [built.end_1], RECORDS) == known
    assert extend_epoch_chain(known, [], RECORDS) == known
    later = extend_epoch_chain(known, [built.end_1, built.end_2], RECORDS)
    assert later == extend_epoch_chain(GENESIS, [built.end_1, built.end_2], RECORDS)


def test_an_answer_that_rewrites_a_checked_epoch_is_refused() -> None:
    """Against a chain already checked, an answer whose epoch 1 starts elsewhere (keys
    or change block) is a conflict, whatever its signatures."""
    built = _build()
    known = extend_epoch_chain(GENESIS, [built.end_1], RECORDS)
    other_keys = dataclasses.replace(built.end_1, keys=b"".join(KEYS_0))
    err = _refused([other_keys], known)
    assert (err.epoch, err.reason) == (1, "conflict")
    other_block = dataclasses.replace(built.end_1, ended=built.end_2.ended)
    err = _refused([other_block], known)
    assert (err.epoch, err.reason) == (1, "conflict")


def test_a_forged_qc_is_refused() -> None:
    """The attack: a liar claims epoch 1 with a commit QC that is not a quorum of epoch 0:
    two members and an outsider signing as member 2."""
    built = _build()
    suffix = make_block(built.boundary_1, 5)
    statement = vote_bytes(CHAIN, suffix.view, suffix.height, suffix.hash)
    forged = QuorumCert(
        suffix.view,
        suffix.height,
        suffix.hash,
        (
            (0, SIGNERS[0].sign(statement)),
            (1, SIGNERS[1].sign(statement)),
            (2, OUTSIDER.sign(statement)),
        ),
    )
    err = _refused([_build(qc_1=forged).end_1])
    assert (err.epoch, err.reason) == (1, "not_certified")
    assert "bad signature" in str(err)
    short = QuorumCert(suffix.view, suffix.height, suffix.hash, forged.signatures[:2])
    err = _refused([_build(qc_1=short).end_1])
    assert (err.epoch, err.reason) == (1, "not_certified")
    assert "quorum is 3" in str(err)


def test_epoch_ones_end_signed_with_a_rotated_out_key_is_refused() -> None:
    """Epoch 2 claimed with a QC in which member 2 signs with its retired epoch-0 key:
    whoever holds the old key (the reason for the rotation) cannot certify epoch 1's end."""
    built = _build()
    suffix_2 = make_block(built.boundary_2, 7, _qc(built.boundary_2, 1, SIGNERS_1))
    old_keys = (SIGNERS[0], SIGNERS[1], SIGNERS[2], SIGNERS[3])
    retired = _qc(suffix_2, 1, old_keys, (0, 1, 2))
    end_2 = dataclasses.replace(
        built.end_2, ended=encode_epoch_end(built.boundary_2, (suffix_2,), retired)
    )
    err = _refused([built.end_1, end_2])
    assert (err.epoch, err.reason) == (2, "not_certified")


def test_a_change_block_of_another_chain_is_refused() -> None:
    """Another chain with the same members and owner: its change block's record is signed
    for its own chain id, and its certificates name it."""
    other = _build(chain="qg-other")
    err = _refused([other.end_1])
    assert (err.epoch, err.reason) == (1, "no_change")
    assert repr(CHAIN) in str(err)


def test_a_record_the_owner_did_not_sign_is_refused() -> None:
    err = _refused([_build(owner=STRANGER).end_1])
    assert (err.epoch, err.reason) == (1, "no_change")


def test_claimed_keys_that_are_not_the_records_are_refused() -> None:
    """The replica's stored keys for epoch 2 name an outsider for member 1: the change
    block (certified, owner-signed) says ROTATED_1."""
    tampered = (KEYS_2[0], OUTSIDER.public_key, KEYS_2[2], KEYS_2[3])
    built = _build(keys_2=tampered)
    err = _refused([built.end_1, built.end_2])
    assert (err.epoch, err.reason) == (2, "keys_differ")
    damaged = dataclasses.replace(built.end_1, keys=b"".join(KEYS_1)[:-1])
    err = _refused([damaged])
    assert (err.epoch, err.reason) == (1, "undecodable")


def test_a_gap_a_repeat_and_a_reorder_are_refused() -> None:
    built = _build()
    err = _refused([built.end_2])
    assert (err.epoch, err.reason) == (2, "gap")
    err = _refused([built.end_1, built.end_1])
    assert (err.epoch, err.reason) == (1, "repeat")
    err = _refused([built.end_2, built.end_1])
    assert (err.epoch, err.reason) == (2, "gap")
    err = _refused([built.end_1, dataclasses.replace(built.end_2, epoch=3)])
    assert (err.epoch, err.reason) == (3, "gap")


def test_an_oversized_answer_is_refused_before_any_check() -> None:
    built = _build()
    ends = [built.end_1, built.end_2]
    size_1 = len(built.end_1.keys) + len(built.end_1.ended)
    err = _refused(ends, bytes_max=size_1 + 10)
    assert (err.epoch, err.reason) == (2, "too_large")
    err = _refused(ends, epochs_max=1)
    assert err.reason == "too_many"
    assert extend_epoch_chain(GENESIS, ends, RECORDS, epochs_max=2).current.epoch == 2


def test_undecodable_bytes_are_refused() -> None:
    built = _build()
    err = _refused([dataclasses.replace(built.end_1, ended=b"\xff\x00garbage")])
    assert (err.epoch, err.reason) == (1, "undecodable")


def test_a_change_block_not_above_the_previous_start_is_refused() -> None:
    """Epoch 2 claimed at the very block that started epoch 1."""
    built = _build()
    again = dataclasses.replace(built.end_1, epoch=2)
    err = _refused([built.end_1, again])
    assert (err.epoch, err.reason) == (2, "not_after")


def test_genesis_must_be_epoch_zero() -> None:
    with pytest.raises(ValueError):
        EpochChain.genesis(dataclasses.replace(membership(), epoch=1))
    assert genesis_block(CHAIN).height == 0


def test_no_single_flipped_byte_yields_another_chain() -> None:
    """Any one byte of the answer flipped (keys or encoded ends, positions drawn from a
    fixed seed): the answer is refused, or it proves the very same chain (a flip in a
    part nothing depends on). Never another member set."""
    built = _build()
    honest = extend_epoch_chain(GENESIS, [built.end_1, built.end_2], RECORDS)
    rng = random.Random(7)
    refused = 0
    for _ in range(FLIPS):
        which = rng.randrange(2)
        end = (built.end_1, built.end_2)[which]
        field = rng.choice(("keys", "ended"))
        data = bytearray(getattr(end, field))
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        ends = [built.end_1, built.end_2]
        ends[which] = dataclasses.replace(end, **{field: bytes(data)})
        try:
            got = extend_epoch_chain(GENESIS, ends, RECORDS)
        except EpochChainError:
            refused += 1
            continue
        assert [(e.keys, e.boundary_height) for e in got.epochs] == [
            (e.keys, e.boundary_height) for e in honest.epochs
        ]
    assert refused > FLIPS * 9 // 10


def test_a_follower_carries_the_new_machines_entry() -> None:
    """A `replace` record's member entry comes with the checked link: a client learns
    where the new machine listens, and its receipt key, from the chain of epochs."""
    new = member_entry()
    record = Reconfiguration("replace", (3,), (new.public_key,), entries=(new.encode(),))
    blocks = chain_of(range(1, 4))
    boundary = make_block(blocks[-1], 4, payload=(sign_record(record, CHAIN, 0, OWNER.sign),))
    suffix = make_block(boundary, 5)
    keys = (*KEYS_0[:3], new.public_key)
    end = PlainEpochEnd(1, b"".join(keys), encode_epoch_end(boundary, (suffix,), qc_for(suffix)))
    chain = extend_epoch_chain(GENESIS, [end], RECORDS)
    assert chain.current.keys == keys
    assert chain.current.entries == (new,)
    assert chain.epochs[0].entries == ()
