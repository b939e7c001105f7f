"""Transactions: signatures over carried bytes, ids, strict decoding, replay (contracts 1-2)."""

from __future__ import annotations

import hashlib
import struct

import pytest

from quorumgate.proto import codec, limits, tx, tx_pb2
from quorumgate.proto.model import (
    Admin,
    DelegationPolicy,
    Outcome,
    Proposal,
    Reason,
    RegisterAgent,
    SignedTx,
    Tier,
    ToolMode,
    TxBody,
    TxKind,
)
from tests.engine.harness import CHAIN, World, signing_key


def _proposal(run: str = "run-1") -> Proposal:
    return Proposal(run_id=run, tool="kb.search", target="https://example.com/")


def _world() -> World:
    world = World()
    world.add_tool("kb.search")
    world.add_agent("alice", None)
    return world


def test_tx_id_is_sha256_of_tag_signer_and_big_endian_nonce() -> None:
    signer = bytes(signing_key("alice").verify_key)
    expected = hashlib.sha256(b"qg/txid/v1" + signer + struct.pack(">Q", 7)).digest()
    assert tx.tx_id(signer, 7) == expected


def test_signature_covers_tag_and_exact_carried_body_bytes() -> None:
    key = signing_key("alice")
    body = tx.encode_body(TxBody(chain_id=CHAIN, nonce=1, payload=_proposal()))
    signed = tx.sign_body(body, key)
    key.verify_key.verify(b"qg/tx/v1" + body, signed.signature)  # raises if not
    assert tx.verify_signature(signed)
    flipped = SignedTx(body=body[:-1] + bytes([body[-1] ^ 1]), signer=signed.signer,
                       signature=signed.signature)  # fmt: skip
    assert not tx.verify_signature(flipped)


def test_same_signer_and_nonce_is_same_id_whatever_the_body() -> None:
    key = signing_key("alice")
    first = tx.parse(tx.build(CHAIN, 3, _proposal("run-a"), key))
    second = tx.parse(tx.build(CHAIN, 3, _proposal("run-b"), key))
    assert first.tx_id == second.tx_id
    assert first.body != second.body


def test_parse_refuses_bad_signature_garbage_and_oversize() -> None:
    key = signing_key("alice")
    data = bytearray(tx.build(CHAIN, 1, _proposal(), key))
    data[-1] ^= 1
    with pytest.raises(tx.TxRejected) as bad_sig:
        tx.parse(bytes(data))
    assert bad_sig.value.reason is Reason.BAD_SIGNATURE
    with pytest.raises(tx.TxRejected) as garbage:
        tx.parse(b"\xff\x00not a protobuf")
    assert garbage.value.reason is Reason.MALFORMED
    with pytest.raises(tx.TxRejected) as huge:
        tx.parse(b"\x0a" + b"\x00" * (limits.TX_BYTES_MAX + 1024))
    assert huge.value.reason is Reason.MALFORMED


def test_body_with_unknown_or_reordered_fields_is_malformed() -> None:
    key = signing_key("alice")
    body = tx.encode_body(TxBody(chain_id=CHAIN, nonce=1, payload=_proposal()))
    unknown_field = body + b"\xa0\x06\x01"  # field 100, varint
    for variant in (unknown_field,):
        data = tx.encode_signed(tx.sign_body(variant, key))
        with pytest.raises(tx.TxRejected) as exc:
            tx.parse(data)
        assert exc.value.reason is Reason.MALFORMED
        # the signer and nonce were readable, so the rejection still has the real id
        assert exc.value.tx_id == tx.tx_id(bytes(key.verify_key), 1)
    reordered = tx_pb2.TxBody(chain_id=CHAIN, nonce=1).SerializeToString()
    reordered = b"\x10\x01" + b"\x0a" + bytes([len(CHAIN)]) + CHAIN.encode()
    data = tx.encode_signed(tx.sign_body(reordered, key))
    with pytest.raises(tx.TxRejected) as exc2:
        tx.parse(data)
    assert exc2.value.reason is Reason.MALFORMED


def test_codec_round_trips_every_payload_kind_via_world_log() -> None:
    """A log that holds every kind of transaction: each body decodes and encodes back to
    the bytes that were signed, and no kind is missing from the log."""
    world = World()
    world.add_tool("kb.search")
    world.add_agent("alice", None, policy=DelegationPolicy.ATTENUATED, depth=1)
    world.add_agent("bob", None)
    world.add_sink("vault")
    world.add_tool("pay", mode=ToolMode.USER_CONFIRM, min_tier=Tier.DELEGATE)
    granted = world.delegate("alice", "bob", tools=["kb.search"])
    assert granted.outcome is Outcome.APPLIED
    assert world.revoke(world.keys["alice"], granted.tx_id).outcome is Outcome.APPLIED
    assert world.seal(world.keys["alice"], "card", b"4111", ["vault"]).outcome is Outcome.APPLIED
    pending = world.propose("alice", "pay")
    assert pending.outcome is Outcome.PENDING
    confirmed = world.confirm(world.owner, pending.proposal_id, pending.card_digest)
    assert confirmed.outcome is Outcome.ALLOW
    kinds = set()
    for _, _, txs in world.log:
        for data in txs:
            parsed = tx.parse(data)
            assert codec.encode_body(parsed.body) == parsed.signed.body
            kinds.add(parsed.kind)
    assert kinds == set(TxKind) - {TxKind.MALFORMED}


def test_replayed_transaction_is_refused_at_execution() -> None:
    world = _world()
    key = world.keys["alice"]
    data = world.tx(key, _proposal())
    first = world.block([data]).verdicts[0]
    again = world.block([data]).verdicts[0]
    assert first.outcome is Outcome.ALLOW
    assert (again.outcome, again.reason) == (Outcome.REJECTED, Reason.REPLAYED)
    assert again.tx_id == first.tx_id


def test_resubmitting_a_nonce_with_another_body_is_replayed_within_one_block() -> None:
    world = _world()
    key = world.keys["alice"]
    a = world.tx(key, _proposal("run-a"), nonce=5)
    b = world.tx(key, _proposal("run-b"), nonce=5)
    verdicts = world.block([a, b]).verdicts
    assert verdicts[0].outcome is Outcome.ALLOW
    assert verdicts[1].reason is Reason.REPLAYED


def test_nonce_window_refuses_at_or_below_low_water_and_beyond_window() -> None:
    world = World(overrides={"nonce_window": 4})
    world.add_tool("kb.search")
    key = world.add_agent("alice", None)
    verdict = world.block([world.tx(key, _proposal(), nonce=n) for n in (1, 2, 3)]).verdicts
    assert all(v.outcome is Outcome.ALLOW for v in verdict)
    # low-water is now 3: nonce 3 and below are refused, 4..7 are open, 8 is beyond
    results = world.block([world.tx(key, _proposal(), nonce=n) for n in (2, 8, 7, 5)]).verdicts
    assert [v.reason for v in results] == [
        Reason.REPLAYED, Reason.REPLAYED, Reason.OK, Reason.OK,
    ]  # fmt: skip
    window = world.engine.state.agents["alice"].nonces
    assert window.low_water == 3 and window.executed == {5, 7}
    results = world.block([world.tx(key, _proposal(), nonce=n) for n in (4, 6, 8)]).verdicts
    assert all(v.outcome is Outcome.ALLOW for v in results)
    assert window.low_water == 8 and window.executed == set()


def test_unknown_signer_is_rejected_and_holds_no_state() -> None:
    world = _world()
    before = world.engine.state_bytes()
    stranger = signing_key("stranger")
    verdict = world.block([world.tx(stranger, _proposal())]).verdicts[0]
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.UNKNOWN_SIGNER)
    after = world.engine.state_bytes()
    # only height and block time moved: nothing keyed by the stranger exists
    assert bytes(signing_key("stranger").verify_key) not in after
    assert len(after) == len(before)


def test_wrong_chain_is_rejected_without_consuming_the_nonce() -> None:
    world = _world()
    key = world.keys["alice"]
    other = tx.build("other-chain", 9, _proposal(), key)
    assert world.block([other]).verdicts[0].reason is Reason.WRONG_CHAIN
    assert world.block([world.tx(key, _proposal(), nonce=9)]).verdicts[0].outcome is Outcome.ALLOW


def test_admin_signed_by_an_agent_is_rejected_not_owner() -> None:
    world = _world()
    mallory = world.add_agent("mallory", [])
    op = RegisterAgent(agent_id="evil", public_key=bytes(signing_key("evil").verify_key))
    verdict = world.one(mallory, Admin(op=op))
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.NOT_OWNER)
    assert "evil" not in world.engine.state.agents


def test_admission_check_refuses_early_and_never_mutates_state() -> None:
    world = _world()
    key = world.keys["alice"]
    before = world.engine.state_bytes()
    good = world.tx(key, _proposal(), nonce=50)
    unknown_tool = tx.build(CHAIN, 51, Proposal(run_id="r", tool="nope", target=""), key)
    stranger = tx.build(CHAIN, 1, _proposal(), signing_key("stranger"))
    forged = bytearray(good)
    forged[-1] ^= 1
    assert world.engine.admission_check(good).accepted
    # version 2 orders calls to invented tools (recorded, latched, no existence oracle)
    assert world.engine.admission_check(unknown_tool).accepted
    old = World(overrides={"canonical_version": 1})
    old.add_agent("alice", ["kb.search"])
    unknown_old = tx.build(CHAIN, 51, Proposal(run_id="r", tool="nope", target=""), key)
    assert old.engine.admission_check(unknown_old).reason is Reason.UNKNOWN_TOOL
    assert world.engine.admission_check(stranger).reason is Reason.UNKNOWN_SIGNER
    assert world.engine.admission_check(bytes(forged)).reason is Reason.BAD_SIGNATURE
    assert world.engine.admission_check(b"junk").reason is Reason.MALFORMED
    owner_proposal = tx.build(CHAIN, 900, _proposal(), world.owner)
    assert world.engine.admission_check(owner_proposal).reason is Reason.NOT_AN_AGENT
    agent_admin = tx.build(
        CHAIN, 52, Admin(op=RegisterAgent(agent_id="x", public_key=b"k" * 32)), key
    )
    assert world.engine.admission_check(agent_admin).reason is Reason.NOT_OWNER
    assert world.engine.state_bytes() == before
    world.block([good])
    replayed = world.engine.admission_check(good)
    assert (replayed.accepted, replayed.reason) == (False, Reason.REPLAYED)
    assert replayed.agent_message == "This action is not permitted."


def test_unverified_mode_skips_only_the_signature_check() -> None:
    world = World(verify=False)
    world.add_tool("kb.search")
    key = world.add_agent("alice", None)
    good = bytearray(world.tx(key, _proposal()))
    good[-1] ^= 1  # a certified block's signatures were checked by the replicas
    assert world.block([bytes(good)]).verdicts[0].outcome is Outcome.ALLOW
    stranger = world.tx(signing_key("stranger"), _proposal())
    assert world.block([stranger]).verdicts[0].reason is Reason.UNKNOWN_SIGNER


def test_malformed_transactions_get_a_rejected_verdict_with_a_stand_in_id() -> None:
    world = _world()
    verdicts = world.block([b"", b"\x00\x01", b"\x0a\x05abc"]).verdicts
    assert [v.outcome for v in verdicts] == [Outcome.REJECTED] * 3
    assert all(v.kind is TxKind.MALFORMED and len(v.tx_id) == 32 for v in verdicts)
    assert len({v.tx_id for v in verdicts}) == 3
