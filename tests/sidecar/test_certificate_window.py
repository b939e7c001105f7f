"""A certificate's validity window (sidecar/receipts.py `Validity`, `check_validity`): what
the block statement signs on a chain whose receipts expire, what it still signs on a chain
from before, and how an executor's clock is held against the window. Pure: no clock but
the numbers given."""

from __future__ import annotations

import dataclasses

import pytest
from nacl.signing import SigningKey

from quorumgate.proto import tx
from quorumgate.proto.canonical import Encoder
from quorumgate.proto.clusterfile import RECEIPT_VERSION_NEW
from quorumgate.proto.model import Admin, SetSettings
from quorumgate.replica.types import genesis_block
from quorumgate.sidecar.engine.core import Engine, EngineConfig
from quorumgate.sidecar.execution import execute_block
from quorumgate.sidecar.receipts import (
    TAG_BLOCK,
    Certificate,
    CertificateError,
    Receipt,
    ReceiptLeaf,
    SignedBlock,
    Validity,
    assemble_certificate,
    block_statement,
    check_validity,
    sign_block,
    verify_certificate,
)
from quorumgate.sidecar.wire import decode_certificate, encode_certificate
from tests.consensus.helpers import CHAIN as HELPER_CHAIN
from tests.consensus.helpers import make_block

CHAIN = "qg-window"
KEYS = [SigningKey(bytes([i + 7]) * 32) for i in range(4)]
PUBLIC = [bytes(k.verify_key) for k in KEYS]
ROOT, STATE = b"\x0a" * 32, b"\x0b" * 32
BLOCK_MS = 1_700_000_000_000
TTL_MS = 300_000
SKEW_MS = 30_000
WINDOW = Validity(BLOCK_MS, BLOCK_MS + TTL_MS)


def leaf(height: int = 9) -> ReceiptLeaf:
    return ReceiptLeaf(
        height=height, index=0, tx_id=b"\x01" * 32, proposal_id=b"\x01" * 32,
        kind="proposal", outcome="allow", reason="ok", target_digest=b"\x02" * 32,
        card_digest=b"", mandate_version=1, body_digest=b"\x03" * 32,
    )  # fmt: skip


def certificate(validity: Validity | None, signers: tuple[int, ...] = (0, 1)) -> Certificate:
    """f+1 sidecars' receipts for a one-leaf block whose root is the leaf's hash."""
    one = leaf()
    root = one.hash(CHAIN)
    receipts = [
        Receipt(one, (), sign_block(KEYS[s], s, CHAIN, one.height, root, STATE, 1, validity))
        for s in signers
    ]
    return assemble_certificate(CHAIN, receipts)


def test_a_statement_without_a_window_is_the_bytes_chains_from_before_signed() -> None:
    """Chains of receipt version 1 go on verifying (and replaying) as they did: the same
    tag and fields, nothing added."""
    before = Encoder(TAG_BLOCK).text(CHAIN).u64(9).raw(ROOT).blob(STATE).u32(3)
    assert block_statement(CHAIN, 9, ROOT, STATE, 3) == bytes(before)
    assert block_statement(CHAIN, 9, ROOT, STATE, 3, None) == bytes(before)


def test_the_window_is_signed_under_its_own_tag() -> None:
    with_window = block_statement(CHAIN, 9, ROOT, STATE, 3, WINDOW)
    assert with_window.startswith(b"qg/receipt/v2")
    later = Validity(BLOCK_MS, BLOCK_MS + TTL_MS + 1)
    assert with_window != block_statement(CHAIN, 9, ROOT, STATE, 3, later)
    assert with_window != block_statement(CHAIN, 9, ROOT, STATE, 3)


def test_a_certificate_verifies_with_its_window_and_keeps_it_on_the_wire() -> None:
    cert = certificate(WINDOW)
    assert verify_certificate(cert, CHAIN, PUBLIC, receipts_expire=True) == cert.leaf
    decoded = decode_certificate(encode_certificate(cert))
    assert decoded == cert and decoded.validity == WINDOW
    plain = decode_certificate(encode_certificate(certificate(None)))
    assert plain.validity is None


def test_a_window_moved_or_dropped_does_not_verify() -> None:
    """A holder that lengthens the window, or strips it to look like a certificate of a
    chain whose receipts never expire, holds no certificate."""
    cert = certificate(WINDOW)
    longer = dataclasses.replace(cert, validity=Validity(BLOCK_MS, BLOCK_MS + 10 * TTL_MS))
    with pytest.raises(CertificateError) as moved:
        verify_certificate(longer, CHAIN, PUBLIC, receipts_expire=True)
    assert moved.value.reason == "bad_signature"
    stripped = dataclasses.replace(cert, validity=None)
    with pytest.raises(CertificateError) as dropped:
        verify_certificate(stripped, CHAIN, PUBLIC, receipts_expire=True)
    assert dropped.value.reason == "no_validity"
    with pytest.raises(CertificateError) as unexpected:
        verify_certificate(cert, CHAIN, PUBLIC, receipts_expire=False)
    assert unexpected.value.reason == "unexpected_validity"


def test_receipts_that_disagree_on_the_window_do_not_combine() -> None:
    one = leaf()
    root = one.hash(CHAIN)
    other = Validity(BLOCK_MS, BLOCK_MS + 1)
    receipts = [
        Receipt(one, (), sign_block(KEYS[0], 0, CHAIN, one.height, root, STATE, 1, WINDOW)),
        Receipt(one, (), sign_block(KEYS[1], 1, CHAIN, one.height, root, STATE, 1, other)),
    ]
    cert = assemble_certificate(CHAIN, receipts)
    assert cert.signers == (0,)
    with pytest.raises(CertificateError) as few:
        verify_certificate(cert, CHAIN, PUBLIC, receipts_expire=True)
    assert few.value.reason == "too_few_receipts"


@pytest.mark.parametrize(
    ("now_ms", "reason"),
    [
        (BLOCK_MS - SKEW_MS - 1, "not_yet_valid"),
        (BLOCK_MS - SKEW_MS, None),
        (BLOCK_MS, None),
        (BLOCK_MS + TTL_MS + SKEW_MS, None),
        (BLOCK_MS + TTL_MS + SKEW_MS + 1, "expired"),
        (BLOCK_MS + 10 * 86_400_000, "expired"),
    ],
)
def test_the_window_against_a_clock_with_its_skew(now_ms: int, reason: str | None) -> None:
    if reason is None:
        check_validity(WINDOW, now_ms, SKEW_MS)
        return
    with pytest.raises(CertificateError) as refused:
        check_validity(WINDOW, now_ms, SKEW_MS)
    assert refused.value.reason == reason


def test_an_executor_may_shorten_the_window_never_lengthen_it() -> None:
    minute = 60_000
    check_validity(WINDOW, BLOCK_MS + minute + SKEW_MS, SKEW_MS, age_ms_max=minute)
    with pytest.raises(CertificateError, match="expired"):
        check_validity(WINDOW, BLOCK_MS + minute + SKEW_MS + 1, SKEW_MS, age_ms_max=minute)
    with pytest.raises(CertificateError, match="expired"):
        check_validity(WINDOW, BLOCK_MS + TTL_MS + SKEW_MS + 1, SKEW_MS, age_ms_max=10 * TTL_MS)


def test_a_window_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(CertificateError, match="bad_validity"):
        Validity(BLOCK_MS, BLOCK_MS - 1)


def _executed_statements(receipt_version: int, ttl_ms: int | None = None) -> list[SignedBlock]:
    """What a sidecar (sidecar/execution.py, the code replay runs too) signs for three
    blocks of a chain of `receipt_version`, with the owner setting `ttl_ms` first."""
    owner = SigningKey(b"\x05" * 32)
    config = EngineConfig(
        chain_id=HELPER_CHAIN,
        owner_public_key=bytes(owner.verify_key),
        receipt_version=receipt_version,
    )
    engine = Engine(config)
    payloads: list[tuple[bytes, ...]] = [(), (), ()]
    if ttl_ms is not None:
        op = SetSettings(values=(("certificate_ttl_ms", ttl_ms),))
        payloads[1] = (tx.build(HELPER_CHAIN, 1, Admin(op=op), owner),)
    blocks = [genesis_block(HELPER_CHAIN)]
    for view, payload in enumerate(payloads, start=1):
        stamp = BLOCK_MS + view * 1_000
        blocks.append(make_block(blocks[-1], view, timestamp_ms=stamp, payload=payload))
    key = SigningKey(b"\x06" * 32)
    return [execute_block(engine, key, 0, HELPER_CHAIN, b).signed for b in blocks[1:]]


def test_a_sidecar_signs_the_window_from_block_time_and_the_setting_in_effect() -> None:
    """The window starts at the committed block's timestamp (which every sidecar reads from
    the same block, never its own clock) and ends the TTL in effect after the block later:
    the default, then from the block that sets it on, the owner's setting."""
    signed = _executed_statements(RECEIPT_VERSION_NEW, ttl_ms=20_000)
    assert [s.validity for s in signed] == [
        Validity(BLOCK_MS + 1_000, BLOCK_MS + 1_000 + 300_000),
        Validity(BLOCK_MS + 2_000, BLOCK_MS + 2_000 + 20_000),
        Validity(BLOCK_MS + 3_000, BLOCK_MS + 3_000 + 20_000),
    ]


def test_a_chain_from_before_signs_what_it_always_signed() -> None:
    """Receipt version 1: no window, the statement's bytes those of before (so `quorumgate
    replay` of such a chain compares equal to what its sidecars recorded), and the owner's
    TTL setting refused, its block signing what any block does."""
    signed = _executed_statements(1, ttl_ms=20_000)
    key = bytes(SigningKey(b"\x06" * 32).verify_key)
    for s in signed:
        before = Encoder(TAG_BLOCK).text(HELPER_CHAIN).u64(s.height).raw(s.verdict_root)
        before.blob(s.state_root).u32(s.leaf_count)
        assert s.validity is None and s.statement(HELPER_CHAIN) == bytes(before)
        assert s.signed_by(HELPER_CHAIN, key)
