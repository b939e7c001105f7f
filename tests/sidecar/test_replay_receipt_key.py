"""A sidecar signs each block with its member's receipt key of the block's epoch
(docs/consensus/epochs.md, "Receipt keys"), derived from the committed blocks alone: the
change block carrying the `receipt` record in the epoch it ends, the blocks after it in
the next epoch with the rotated key. Replay derives the same, and the live sidecar's
tracker (sidecar/receiptkeys.py) too, started from the stored change blocks."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import ClusterFileError, rotated_receipt_key_file, write_seed
from quorumgate.replica.epochs import start_qc
from quorumgate.replica.storage import StoredEpoch
from quorumgate.replica.types import Block
from quorumgate.sidecar.engine.core import EngineConfig
from quorumgate.sidecar.receiptkeys import ReceiptKeys
from quorumgate.sidecar.replay import _WorkerSetup
from quorumgate.sidecar.store import ExecutedHeight
from tests.consensus.helpers import (
    CHAIN,
    SIGNERS,
    chain_of,
    key_seed,
    make_block,
    membership,
    qc_for,
)
from tests.consensus.test_receipt_key import RECEIPT_KEYS, RECORDS, _qc1, receipt_tx
from tests.sidecar.test_replay_epochs import _failure, _outcomes

OLD_SEED = key_seed(1, "receipt")  # member 1's receipt key in the cluster file
NEW_SEED = key_seed(1, "new-receipt")  # the one the record gives it from epoch 1
KEYS_0 = tuple(s.public_key for s in SIGNERS[:4])


def _blocks() -> tuple[list[Block], StoredEpoch]:
    """Heights 1..3, the change block at 4 (member 1's receipt key), epoch 1's 5 and 6."""
    blocks = chain_of(range(1, 4))
    boundary = make_block(blocks[-1], 4, payload=(receipt_tx(),))
    suffix = make_block(boundary, 5)
    end = StoredEpoch(1, KEYS_0, boundary, (suffix,), qc_for(suffix))
    first = make_block(boundary, 5, start_qc(CHAIN, boundary))
    second = make_block(first, 6, _qc1(first))
    return [*blocks[1:], boundary, first, second], end


def _setup(end: StoredEpoch, rotated: tuple[bytes, ...]) -> _WorkerSetup:
    config = EngineConfig(chain_id=CHAIN, owner_public_key=bytes(32))
    return _WorkerSetup(
        config, OLD_SEED, 1, membership(), None, 1_000, 0, None, RECORDS, (end,), rotated
    )


@pytest.mark.parametrize("workers", [0, 1])
def test_replay_signs_each_height_with_the_key_of_its_epoch(workers: int) -> None:
    blocks, end = _blocks()
    got = _outcomes(blocks, _setup(end, (NEW_SEED,)), workers)
    assert _failure(got) is None
    new_key = bytes(SigningKey(NEW_SEED).verify_key)
    for height, outcome in got:
        executed = outcome[0]  # type: ignore[index]
        assert isinstance(executed, ExecutedHeight)
        signed = executed.signed
        epoch, key = (0, RECEIPT_KEYS[1]) if height <= 4 else (1, new_key)
        assert signed.epoch == epoch, height
        assert signed.signed_by(CHAIN, key), height


@pytest.mark.parametrize("workers", [0, 1])
def test_replay_without_the_rotated_key_stops_at_the_epoch_that_needs_it(workers: int) -> None:
    blocks, end = _blocks()
    failure = _failure(_outcomes(blocks, _setup(end, ()), workers))
    assert failure is not None and failure[0] == 5 and "no_receipt_key" in failure[1]


def _spec_like(tmp_path: Path) -> object:
    return SimpleNamespace(
        runs_epochs=True,
        membership=membership,
        record_reader=lambda: RECORDS,
        member=lambda i: SimpleNamespace(receipt_public_key=RECEIPT_KEYS[i]),
        joined=None,  # (a cluster file's member, no new machine)
    )


def test_the_sidecars_tracker_moves_on_at_the_change_block(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    blocks, end = _blocks()
    keys = ReceiptKeys(_spec_like(tmp_path), 1, tmp_path, SigningKey(OLD_SEED))  # type: ignore[arg-type]
    assert keys.epoch == 0 and keys.public_key == RECEIPT_KEYS[1]
    assert keys.key().verify_key == SigningKey(OLD_SEED).verify_key
    moved = [keys.after(b) for b in blocks]
    assert moved == [False, False, False, True, False, False]  # heights 1 to 6
    new_key = bytes(SigningKey(NEW_SEED).verify_key)
    assert keys.epoch == 1 and keys.public_key == new_key
    # What the self-audit checks each stored statement with: the key of its epoch, at
    # heights of that epoch only.
    assert keys.key_at(0, 4) == RECEIPT_KEYS[1] and keys.key_at(0, 5) is None
    assert keys.key_at(1, 5) == new_key and keys.key_at(1, 4) is None
    assert keys.key_at(2, 9) is None
    with pytest.raises(ClusterFileError, match="holds no receipt key"):
        keys.key()
    write_seed(tmp_path / rotated_receipt_key_file(new_key), NEW_SEED)
    assert bytes(keys.key().verify_key) == new_key
    # After a restart: started from the stored change blocks at the executed height.
    again = ReceiptKeys(_spec_like(tmp_path), 1, tmp_path, SigningKey(OLD_SEED))  # type: ignore[arg-type]
    again.start_at([end.boundary], 3)
    assert again.epoch == 0
    again.start_at([end.boundary], 4)
    assert again.epoch == 1 and again.public_key == new_key
    with pytest.raises(ValueError, match="changes nothing"):
        ReceiptKeys(_spec_like(tmp_path), 1, tmp_path).start_at([blocks[0]], 4)  # type: ignore[arg-type]
