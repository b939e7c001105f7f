"""The bench's certifier checks each block statement against its epoch (docs/consensus/
epochs.md, "Receipt keys"; docs/benchmarks.md): the chain of epochs' receipt keys and
heights, with the verifier the SDK and `audit verify --epochs` use. The chain is that of
tests/consensus/test_receipt_key.py: member 1's receipt key rotated at the end of epoch 0
(height 4), member 2's at the end of epoch 1 (height 6)."""

from __future__ import annotations

from nacl.signing import SigningKey

from quorumgate.bench.certifier import BlockCertifier
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.sidecar.receipts import Receipt, ReceiptLeaf, sign_block
from quorumgate.sidecar.wire import receipt_to_pb
from tests.audit.test_ship_epochs import NEW_1, OLD, chain_epochs
from tests.consensus.helpers import CHAIN
from tests.consensus.test_receipt_key import RECEIPT_KEYS


def receipt(height: int, signer: int, key: SigningKey, epoch: int) -> spb.Receipt:
    """The one receipt of a block of one verdict."""
    leaf = ReceiptLeaf(height, 0, b"t" * 32, b"p" * 32, "proposal", "allow", "ok", b"", b"", 1)
    block = sign_block(key, signer, CHAIN, height, leaf.hash(CHAIN), b"s" * 32, 1, None, epoch)
    return receipt_to_pb(Receipt(leaf, (), block))


def certifier() -> BlockCertifier:
    return BlockCertifier(CHAIN, RECEIPT_KEYS, receipts_expire=False, epochs=chain_epochs())


def test_an_old_receipt_keys_statement_past_the_rotation_is_not_certified() -> None:
    """Height 5 is epoch 1's: member 0 and member 1's rotated-out key sign epoch 0's
    statement for it. Checked with the cluster file's keys it made a certificate."""
    bench = certifier()
    assert bench.add(0, receipt(5, 0, OLD[0], 0)) is None
    assert bench.add(1, receipt(5, 1, OLD[1], 0)) is None
    assert bench.counts.certified_blocks == 0


def test_a_statement_of_epoch_1_with_the_new_receipt_key_is_certified() -> None:
    bench = certifier()
    assert bench.add(0, receipt(5, 0, OLD[0], 1)) is None
    certified = bench.add(1, receipt(5, 1, NEW_1, 1))
    assert certified == [(b"t" * 32, "allow/ok")]
    assert bench.counts.certified_blocks == 1 and bench.counts.failures == 0


def test_epoch_0_below_the_boundary_still_certifies() -> None:
    bench = certifier()
    assert bench.add(0, receipt(4, 0, OLD[0], 0)) is None
    assert bench.add(1, receipt(4, 1, OLD[1], 0)) is not None
