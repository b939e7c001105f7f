"""Replay across an owner rotation of the records' key (docs/consensus/epochs.md, "The
record key"): the executing process moves the record key on at each change block as the
replica does, so the record that ends the epoch after an `owner` record is checked with
the key that record named, and one signed by the rotated-out key proves no change."""

from __future__ import annotations

import pytest

from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import OwnerRecords, Reconfiguration, owner_record, sign_record
from quorumgate.replica.epochs import start_qc
from quorumgate.replica.storage import StoredEpoch
from quorumgate.replica.types import Block, QuorumCert, vote_bytes
from quorumgate.sidecar.replay import ReplayError, ReplayReport, _epochs_at, _epochs_through
from tests.consensus.helpers import CHAIN, SIGNERS, chain_of, key_seed, make_block, qc_for
from tests.consensus.test_owner_records import OWNER

NEW_OWNER = Ed25519Signer(key_seed(1, "new-owner"))
ROTATED = Ed25519Signer(key_seed(2, "rotated"))
KEYS_0 = tuple(s.public_key for s in SIGNERS[:4])
KEYS_2 = (KEYS_0[0], KEYS_0[1], ROTATED.public_key, KEYS_0[3])


class _SpecLike:
    chain_id = CHAIN
    owner_public_key = OWNER.public_key
    runs_epochs = True

    @staticmethod
    def membership() -> object:
        from tests.consensus.helpers import membership

        return membership()

    @staticmethod
    def record_reader() -> OwnerRecords:
        return OwnerRecords(CHAIN, OWNER.public_key)


def _qc_1(block: Block) -> QuorumCert:
    statement = vote_bytes(f"{CHAIN}#epoch=1", block.view, block.height, block.hash)
    signatures = tuple((v, SIGNERS[v].sign(statement)) for v in (0, 1, 2))
    return QuorumCert(block.view, block.height, block.hash, signatures)


def _rows(second_owner: Ed25519Signer) -> tuple[StoredEpoch, StoredEpoch]:
    """Epoch 0 ends at height 4 with the owner record; epoch 1 at height 6 with a rotation
    of member 2 signed by `second_owner`."""
    blocks = chain_of(range(1, 4))
    hand_over = owner_record(CHAIN, 0, OWNER.public_key, NEW_OWNER.public_key, NEW_OWNER.sign)
    boundary_1 = make_block(blocks[-1], 4, payload=(sign_record(hand_over, CHAIN, 0, OWNER.sign),))
    suffix_1 = make_block(boundary_1, 5)
    end_1 = StoredEpoch(1, KEYS_0, boundary_1, (suffix_1,), qc_for(suffix_1))
    first = make_block(boundary_1, 5, start_qc(CHAIN, boundary_1))
    rotate = Reconfiguration("rotate", (2,), (ROTATED.public_key,))
    record = sign_record(rotate, CHAIN, 1, second_owner.sign)
    boundary_2 = make_block(first, 6, _qc_1(first), payload=(record,))
    suffix_2 = make_block(boundary_2, 7, _qc_1(boundary_2))
    end_2 = StoredEpoch(2, KEYS_2, boundary_2, (suffix_2,), _qc_1(suffix_2))
    return end_1, end_2


def test_replay_checks_each_record_with_the_key_of_its_epoch() -> None:
    spec: object = _SpecLike()
    report = ReplayReport(node=1, from_height=1)
    epochs, start = _epochs_through(spec, _rows(NEW_OWNER), 10, report)  # type: ignore[arg-type]
    assert epochs.membership.epoch == 2 and report.start_epoch == 2
    assert tuple(m.public_key for m in epochs.membership.members) == KEYS_2
    assert epochs.owner is not None and epochs.owner.owner_key == NEW_OWNER.public_key
    assert start is not None and start.height == 6


def test_replay_refuses_a_change_signed_by_the_rotated_out_owner_key() -> None:
    spec: object = _SpecLike()
    with pytest.raises(ReplayError, match="changes nothing"):
        _epochs_at(spec, _rows(OWNER), 10, ReplayReport(node=1, from_height=1))  # type: ignore[arg-type]
