"""Certificates name their epoch (docs/consensus/epochs.md, "Receipt keys"): a statement
of epoch e counts only if f+1 of epoch e's receipt keys signed it and its height lies in
epoch e. The attack: after member 1's receipt key was rotated at the end of epoch 0, its
old key (perhaps leaked) signs a statement for a height past the boundary and claims
epoch 0; a verifier that holds the chain of epochs must refuse it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
import pytest
from nacl.signing import SigningKey

from quorumgate.proto.canonical import Encoder
from quorumgate.proto.clusterfile import RECEIPT_KEY_FILE, rotated_receipt_key_file, write_seed
from quorumgate.replica.epochchain import EpochChain, extend_epoch_chain
from quorumgate.sdk.epochs import receipt_epochs_from_json, receipt_epochs_of
from quorumgate.sidecar.receiptkeys import ReadKeys
from quorumgate.sidecar.receipts import (
    TAG_BLOCK,
    TAG_BLOCK_WITH_VALIDITY,
    CertificateError,
    Receipt,
    ReceiptEpochs,
    ReceiptLeaf,
    Validity,
    assemble_certificate,
    block_statement,
    sign_block,
    verify_certificate,
)
from quorumgate.sidecar.wire import decode_certificate, encode_certificate
from tests.consensus.helpers import CHAIN, key_seed, membership
from tests.consensus.test_receipt_key import RECEIPT_KEYS, RECORDS, follower_ends

OLD = tuple(SigningKey(key_seed(i, "receipt")) for i in range(4))  # the cluster file's
NEW_1 = SigningKey(key_seed(1, "new-receipt"))  # member 1's from epoch 1
assert tuple(bytes(k.verify_key) for k in OLD) == RECEIPT_KEYS


def _chain() -> EpochChain:
    ends, _ = follower_ends()
    return extend_epoch_chain(EpochChain.genesis(membership()), ends, RECORDS)


def _epochs() -> ReceiptEpochs:
    return receipt_epochs_of(_chain(), RECEIPT_KEYS)


def _certificate(height: int, epoch: int, keys: dict[int, SigningKey]) -> object:
    leaf = ReceiptLeaf(height, 0, b"t" * 32, b"p" * 32, "proposal", "allow", "ok", b"", b"", 1)
    root = leaf.hash(CHAIN)
    receipts = [
        Receipt(leaf, (), sign_block(key, signer, CHAIN, height, root, b"s" * 32, 1, None, epoch))
        for signer, key in keys.items()
    ]
    return assemble_certificate(CHAIN, receipts)


def _verify(cert: object, epochs: ReceiptEpochs | None) -> None:
    verify_certificate(cert, CHAIN, RECEIPT_KEYS, receipts_expire=False, epochs=epochs)  # type: ignore[arg-type]


def test_the_epochs_heights_and_keys_follow_the_chain() -> None:
    epochs = _epochs()
    assert [(e.epoch, e.first_height, e.last_height) for e in epochs.epochs] == [
        (0, 1, 4),
        (1, 5, 6),
        (2, 7, None),
    ]
    assert epochs.epochs[0].keys == RECEIPT_KEYS
    assert epochs.epochs[1].keys[1] == bytes(NEW_1.verify_key)


def test_an_old_key_claiming_epoch_0_past_the_boundary_is_refused() -> None:
    """The attack. Height 5 is in epoch 1; member 1's rotated-out key and member 0's key
    sign epoch 0's statement for it. Checked with the cluster file's keys alone, as every
    verifier did before, it passes; checked against the chain of epochs it is refused."""
    forged = _certificate(5, 0, {0: OLD[0], 1: OLD[1]})
    with pytest.raises(CertificateError) as raised:
        _verify(forged, _epochs())
    assert raised.value.reason == "wrong_epoch"


def test_epoch_1s_statement_with_the_old_key_does_not_count() -> None:
    stale = _certificate(5, 1, {0: OLD[0], 1: OLD[1]})
    with pytest.raises(CertificateError) as raised:
        _verify(stale, _epochs())
    assert raised.value.reason == "bad_signature"


def test_a_certificate_of_the_new_key_verifies_in_its_epoch_only() -> None:
    good = _certificate(5, 1, {0: OLD[0], 1: NEW_1})
    _verify(good, _epochs())
    assert decode_certificate(encode_certificate(good)).epoch == 1  # type: ignore[arg-type]
    _verify(decode_certificate(encode_certificate(good)), _epochs())  # type: ignore[arg-type]
    for height in (4, 7):  # the change block is epoch 0's; 7 is epoch 2's
        with pytest.raises(CertificateError) as raised:
            _verify(_certificate(height, 1, {0: OLD[0], 1: NEW_1}), _epochs())
        assert raised.value.reason == "wrong_epoch"
    # A verifier that follows the chain but knows epoch 0 only cannot check it.
    with pytest.raises(CertificateError) as raised:
        _verify(good, receipt_epochs_of(EpochChain.genesis(membership()), RECEIPT_KEYS))
    assert raised.value.reason == "unknown_epoch"
    with pytest.raises(CertificateError) as raised:
        _verify(_certificate(5, 3, {0: OLD[0], 1: NEW_1}), _epochs())
    assert raised.value.reason == "unknown_epoch"


def test_epoch_0_below_the_boundary_still_verifies() -> None:
    _verify(_certificate(4, 0, {0: OLD[0], 1: OLD[1]}), _epochs())
    _verify(_certificate(4, 0, {0: OLD[0], 1: OLD[1]}), None)


def test_without_the_chain_a_verifier_has_the_cluster_files_guarantee_only() -> None:
    """The limit, pinned: a verifier that holds cluster.json alone (an agent's client,
    which may not read the epoch ends) counts f+1 of the cluster file's receipt keys in
    any epoch, as every verifier did before; the rotated key's signature does not count
    there, the other members' do."""
    _verify(_certificate(5, 0, {0: OLD[0], 1: OLD[1]}), None)  # the forgery: accepted
    _verify(_certificate(5, 1, {0: OLD[0], 2: OLD[2]}), None)
    with pytest.raises(CertificateError) as raised:
        _verify(_certificate(5, 1, {0: OLD[0], 1: NEW_1}), None)
    assert raised.value.reason == "bad_signature"


def test_epoch_0s_statement_keeps_its_bytes_and_later_ones_name_their_epoch() -> None:
    root, state = b"r" * 32, b"s" * 32
    legacy = bytes(Encoder(TAG_BLOCK).text(CHAIN).u64(9).raw(root).blob(state).u32(3))
    assert block_statement(CHAIN, 9, root, state, 3) == legacy
    window = Validity(10, 20)
    legacy_v2 = Encoder(TAG_BLOCK_WITH_VALIDITY).text(CHAIN).u64(9).raw(root).blob(state)
    legacy_v2.u32(3).u64(10).u64(20)
    assert block_statement(CHAIN, 9, root, state, 3, window, 0) == bytes(legacy_v2)
    statements = {
        block_statement(CHAIN, 9, root, state, 3, v, e) for v in (None, window) for e in (0, 1, 2)
    }
    assert len(statements) == 6


def test_an_epochs_file_gives_the_same_epochs() -> None:
    from quorumgate.sdk.epochs import EpochFollower

    ends, _ = follower_ends()
    follower = EpochFollower(membership(), RECORDS)
    found = follower.take({0: ends, 1: ends})
    assert found.receipt_epochs == _epochs()
    assert receipt_epochs_from_json(found.as_dict(), RECEIPT_KEYS) == _epochs()
    with pytest.raises(ValueError):
        receipt_epochs_from_json({"epochs": [{"epoch": 1}]}, RECEIPT_KEYS)


def test_a_chain_without_epochs_gives_epoch_0_with_the_cluster_files_keys() -> None:
    """A follower of a chain that runs no epochs (no record reader) still knows epoch 0's
    receipt keys: the cluster file's, given on their own."""
    from quorumgate.sdk.epochs import EpochFollower

    found = EpochFollower(membership(), None, receipt_keys=RECEIPT_KEYS).take({0: [], 1: []})
    assert found.receipt_epochs.epochs[0].keys == RECEIPT_KEYS
    _verify(_certificate(9, 0, {0: OLD[0], 1: OLD[1]}), found.receipt_epochs)


def test_an_epoch_without_keys_cannot_be_made() -> None:
    """With no keys f+1 would be 0, and a certificate without signatures would count."""
    from quorumgate.sidecar.receipts import ReceiptEpoch

    with pytest.raises(ValueError):
        ReceiptEpoch(0, 1, None, ())
    bare = dataclasses.replace(
        _certificate(4, 0, {0: OLD[0]}),  # type: ignore[type-var]
        signatures=(),
    )
    with pytest.raises(CertificateError) as raised:
        verify_certificate(bare, CHAIN, (), receipts_expire=False)
    assert raised.value.reason == "no_keys"


def _refusal(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "refused")


def test_reads_move_on_to_the_next_held_receipt_key_when_one_is_refused(tmp_path: Path) -> None:
    """A server reads a member's sidecar under the member's receipt key of the epoch it
    runs (docs/consensus/epochs.md, "Receipt keys"), which may be a key a rotation wrote
    into the node directory after the process started: a refused key gives way to the
    next one held, read again from the directory; any other failure keeps the key."""
    old = SigningKey(bytes([1]) * 32)
    write_seed(tmp_path / RECEIPT_KEY_FILE, bytes(old))
    keys = ReadKeys(tmp_path, old)
    assert keys.key == old and len(keys.keys) == 1
    new = SigningKey(bytes([2]) * 32)
    write_seed(tmp_path / rotated_receipt_key_file(bytes(new.verify_key)), bytes(new))
    assert not keys.refused(_refusal(grpc.StatusCode.UNAVAILABLE))
    assert keys.key == old
    assert keys.refused(_refusal(grpc.StatusCode.PERMISSION_DENIED))
    assert keys.key == new and keys.reader.public_key == bytes(new.verify_key)
    assert keys.refused(_refusal(grpc.StatusCode.UNAUTHENTICATED))
    assert keys.key == old  # round the list: a server behind the boundary takes the old
    keys.prefer(bytes(new.verify_key))
    assert keys.key == new
