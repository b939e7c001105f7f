"""Argument commitments in the ledger (docs/audit.md, "Argument commitments"): a version-2
entry binds each argument value so that an auditor holding its key confirms a claimed value
and refuses another, while the entry, its JSON line and its hash reveal nothing of the
value; version-1 entries keep their bytes."""

from __future__ import annotations

import dataclasses
import json

import pytest
from nacl.public import SealedBox
from nacl.signing import SigningKey

from quorumgate.proto import codec, tx_pb2
from quorumgate.proto.chainversions import RECEIPT_VERSION_NEW, commits_arguments
from quorumgate.proto.commitments import (
    KIND_HANDLE,
    KIND_TEXT,
    SaltError,
    call_salt,
    confirms,
    open_salt,
    seal_salt,
)
from quorumgate.proto.model import Argument, Outcome, Proposal, Reason, TxBody, TxKind
from quorumgate.sidecar.engine.statements import Verdict
from quorumgate.sidecar.ledger import (
    GENESIS_PREV_HASH,
    NO_EXTRA,
    VERSION_COMMITTED,
    ChainVerifier,
    LedgerEntry,
    extra_for,
)

CHAIN = "chain-x"
AUDITOR = SigningKey(bytes([1]) * 32)
OTHER = SigningKey(bytes([2]) * 32)
SALT_A = bytes(range(32))
SALT_B = bytes(range(1, 33))
AMOUNT = "12"
# The hash of a version-1 entry as the ledger computed it before commitments existed.
V1_HASH = "2a6544ce0fd814321807a058447634dde1a72979eaa1b34e23b0a5d4232fdb72"


def verdict() -> Verdict:
    return Verdict(
        tx_id=b"\x07" * 32,
        kind=TxKind.PROPOSAL,
        outcome=Outcome.DENY,
        reason=Reason.OK,
        principal="alice",
        canonical_target="https://example.com/",
        target_digest=b"\x01" * 32,
        argument_names=("amount",),
    )


def call(salt: bytes, amount: str = AMOUNT) -> Proposal:
    return Proposal(
        run_id="run-1",
        tool="pay",
        target="https://example.com/",
        arguments=(Argument("amount", text=amount), Argument("card", handle="h_card_00ff")),
        commit_salt=salt,
        seal_to=(bytes(AUDITOR.verify_key),),
    )


def committed_entry(salt: bytes = SALT_A, amount: str = AMOUNT) -> LedgerEntry:
    [entry] = LedgerEntry.chain(
        CHAIN, 3, [verdict()], GENESIS_PREV_HASH, [extra_for(call(salt, amount))]
    )
    return entry


def test_the_newest_receipt_version_commits_arguments() -> None:
    assert commits_arguments(RECEIPT_VERSION_NEW)
    assert not commits_arguments(2)


def test_the_record_binds_each_argument_value_for_its_auditor() -> None:
    entry = committed_entry()
    assert entry.version == VERSION_COMMITTED
    [sealed] = entry.sealed_salts
    assert sealed.auditor_key == bytes(AUDITOR.verify_key)
    salt = open_salt(sealed.sealed, bytes(AUDITOR))
    amount, card = entry.commitments
    assert confirms(salt, amount, KIND_TEXT, AMOUNT)
    assert not confirms(salt, amount, KIND_TEXT, "13")
    assert not confirms(salt, amount, KIND_TEXT, AMOUNT + " ")
    # an envelope stays a handle: the commitment is to the handle, never a secret
    assert confirms(salt, card, KIND_HANDLE, "h_card_00ff")


def test_the_seal_is_a_standard_sealed_box_only_the_auditor_opens() -> None:
    sealed = seal_salt(SALT_A, bytes(AUDITOR.verify_key))
    box = SealedBox(AUDITOR.to_curve25519_private_key())
    assert bytes(box.decrypt(sealed)) == SALT_A
    with pytest.raises(SaltError):
        open_salt(sealed, bytes(OTHER))


def test_equal_values_in_two_proposals_commit_differently() -> None:
    first, second = committed_entry(SALT_A), committed_entry(SALT_B)
    assert first.commitments[0].commitment != second.commitments[0].commitment
    assert first.sealed_salts[0].sealed != second.sealed_salts[0].sealed


def test_the_json_line_holds_no_value_and_round_trips() -> None:
    entry = committed_entry(amount="value-bytes-42")
    line = entry.to_json()
    assert "value-bytes-42" not in line
    assert b"value-bytes-42".hex() not in line
    assert SALT_A.hex() not in line
    again = LedgerEntry.from_json(line)
    assert again == entry
    assert again.computed_hash(CHAIN) == entry.hash


def test_an_edited_commitment_breaks_the_chain() -> None:
    entry = committed_entry()
    obj = json.loads(entry.to_json())
    obj["commitments"][0][1] = committed_entry(SALT_B).commitments[0].commitment.hex()
    edited = LedgerEntry.from_json(json.dumps(obj))
    verifier = ChainVerifier(CHAIN)
    problem = verifier.feed(edited)
    assert problem is not None and problem.kind.value == "hash_mismatch"


def test_version_one_entries_keep_their_bytes() -> None:
    [entry] = LedgerEntry.chain(CHAIN, 3, [verdict()], GENESIS_PREV_HASH)
    assert entry.hash.hex() == V1_HASH
    assert "version" not in json.loads(entry.to_json())
    assert LedgerEntry.from_json(entry.to_json()) == entry


def test_a_call_without_a_salt_commits_nothing() -> None:
    bare = Proposal(run_id="run-1", tool="pay", target="", arguments=(Argument("a", text="1"),))
    extra = extra_for(bare)
    assert extra.commitments == () and extra.sealed_salts == ()


def test_the_salt_and_auditor_keys_travel_in_the_signed_body() -> None:
    body = TxBody(chain_id=CHAIN, nonce=1, payload=call(SALT_A))
    decoded = codec.decode_body(codec.encode_body(body))
    assert isinstance(decoded.payload, Proposal)
    assert decoded.payload.commit_salt == SALT_A
    assert decoded.payload.seal_to == (bytes(AUDITOR.verify_key),)


@pytest.mark.parametrize(
    "key", [bytes(32), b"\xff" * 32, bytes([1]) + bytes(31), b"short"], ids=str
)
def test_a_key_that_is_no_auditor_key_gets_no_seal_and_stops_no_sidecar(key: bytes) -> None:
    """An agent names a key that is not an Ed25519 point: every sidecar must still write
    the same record (no exception out of execution), with no seal for that key."""
    good = bytes(AUDITOR.verify_key)
    proposal = dataclasses.replace(call(SALT_A), seal_to=(key, good))
    extra = extra_for(proposal)
    assert [s.auditor_key for s in extra.sealed_salts] == [good]
    assert len(extra.commitments) == 2


@pytest.mark.parametrize("salt", [b"", b"\x01" * 5, b"\x01" * 33])
def test_a_salt_of_the_wrong_size_decodes_and_commits_nothing(salt: bytes) -> None:
    """The new fields never make a transaction undecodable: a chain from before, whose
    build ignored them, must decide it exactly as before."""
    pb = codec.encode_body(TxBody(chain_id=CHAIN, nonce=1, payload=call(SALT_A)))
    body = tx_pb2.TxBody.FromString(pb)
    body.proposal.commit_salt = salt
    body.proposal.seal_to.append(b"\x02" * 40)
    decoded = codec.decode_body(body.SerializeToString())
    assert isinstance(decoded.payload, Proposal)
    assert extra_for(decoded.payload) == NO_EXTRA


def test_a_calls_salt_is_the_proposers_secret_and_the_nonces_own() -> None:
    """The SDK's salt: the same for the same key and nonce (a confirmed call re-signed),
    another for another nonce, and nothing anyone without the key can compute."""
    seed, other = bytes(AUDITOR), bytes(OTHER)
    assert call_salt(seed, CHAIN, 7) == call_salt(seed, CHAIN, 7)
    salts = {call_salt(seed, CHAIN, 7), call_salt(seed, CHAIN, 8), call_salt(other, CHAIN, 7)}
    assert len(salts) == 3 and all(len(s) == 32 for s in salts)
    assert call_salt(seed, "another-chain", 7) not in salts
