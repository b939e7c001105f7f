"""A `replace` record names the new member's description (docs/consensus/epochs.md, "The
record"): where it listens, its receipt key and its TLS certificate, signed by the owner
with the record, one length-prefixed canonical-JSON entry per new key. A record whose
entry does not parse exactly, or names another key or index, changes nothing; the
simulator's bare records encode and apply as before."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import (
    MEMBER_ENTRY_BYTES_MAX,
    MemberEntry,
    MemberEntryError,
    OwnerRecords,
    Reconfiguration,
    record_entries,
    sign_record,
)
from quorumgate.proto.tls import make_node_certificate
from tests.consensus.helpers import CHAIN, key_seed, membership

OWNER = Ed25519Signer(key_seed(0, "owner"))
STRANGER = Ed25519Signer(key_seed(1, "stranger"))
NEW = Ed25519Signer(key_seed(3, "new-member"))
OTHER = Ed25519Signer(key_seed(4, "another"))
RECEIPT = Ed25519Signer(key_seed(3, "new-receipt"))
CERT = make_node_certificate(3, "10.0.0.9")[1]
# Every replica's reader carries `replace` out once the shell follows it; the tests of the
# record itself do not depend on which kinds the default reader has.
RECORDS = OwnerRecords(CHAIN, OWNER.public_key, kinds=("replace", "rotate", "owner"))


def entry(**changes: object) -> MemberEntry:
    base = MemberEntry(3, "10.0.0.9", 7400, 7401, 7402, 7403, NEW.public_key, RECEIPT.public_key)
    return replace(replace(base, tls_cert=CERT), **changes)  # type: ignore[arg-type]


def replace_record(raw: bytes | None = None, key: bytes = NEW.public_key) -> Reconfiguration:
    return Reconfiguration(
        "replace", (3,), (key,), entries=(entry().encode() if raw is None else raw,)
    )


def signed(record: Reconfiguration, signer: Ed25519Signer = OWNER, epoch: int = 0) -> bytes:
    return sign_record(record, CHAIN, epoch, signer.sign)


def test_an_entry_round_trips_through_the_record() -> None:
    record = replace_record()
    parsed = Reconfiguration.parse(record.encode())
    assert parsed == record
    assert record_entries(parsed) == (entry(),)
    nxt = RECORDS.change(signed(record), membership())
    assert nxt is not None and nxt.key(3) == NEW.public_key and nxt.epoch == 1


def test_a_bare_record_encodes_as_before() -> None:
    """The simulator's records carry no entry: their bytes and their effect are unchanged."""
    bare = Reconfiguration("replace", (3,), (NEW.public_key,))
    encoded = bare.encode()
    assert encoded.endswith(NEW.public_key)  # nothing after the key
    assert Reconfiguration.parse(encoded) == bare
    assert bare.apply(membership()) is not None


def test_a_live_replace_without_an_entry_changes_nothing() -> None:
    bare = Reconfiguration("replace", (3,), (NEW.public_key,))
    assert RECORDS.read(signed(bare)) is not None  # the owner signed it
    assert RECORDS.change(signed(bare), membership()) is None


def test_an_entry_naming_another_key_changes_nothing() -> None:
    """The attack: the owner's record gives member 3 the key NEW, but the description in it
    names OTHER's key, so that peers would take another key's streams at that address."""
    raw = entry(public_key=OTHER.public_key).encode()
    record = replace_record(raw)
    with pytest.raises(MemberEntryError, match="not the record's key"):
        record_entries(record)
    assert RECORDS.change(signed(record), membership()) is None


def test_an_entry_naming_another_index_changes_nothing() -> None:
    raw = entry(index=2, tls_cert=make_node_certificate(2, "10.0.0.9")[1]).encode()
    with pytest.raises(MemberEntryError, match="index"):
        record_entries(replace_record(raw))
    assert RECORDS.change(signed(replace_record(raw)), membership()) is None


def test_a_description_signed_by_a_non_owner_changes_nothing() -> None:
    assert RECORDS.read(signed(replace_record(), STRANGER)) is None
    assert RECORDS.change(signed(replace_record(), STRANGER), membership()) is None
    # nor can anyone swap the description under the owner's signature
    tx = bytearray(signed(replace_record()))
    at = tx.index(b"10.0.0.9")
    tx[at : at + 8] = b"10.6.6.6"
    assert RECORDS.read(bytes(tx)) is None


def test_an_oversize_entry_does_not_parse() -> None:
    big = b"x" * (MEMBER_ENTRY_BYTES_MAX + 1)
    encoded = replace_record(big).encode()
    assert Reconfiguration.parse(encoded) is None
    with pytest.raises(MemberEntryError, match="at most"):
        MemberEntry.parse(big)


def test_a_tls_certificate_that_is_no_pem_certificate_is_refused() -> None:
    """The core checks a certificate's PEM shape (RFC 7468), not its X.509 content: a
    record whose entry carries anything else changes nothing."""
    for pem in (
        b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        CERT + CERT,  # two certificates
        CERT.replace(b"\n", b"\r\n"),
    ):
        raw = entry(tls_cert=pem).encode()
        with pytest.raises(MemberEntryError, match="tls_cert"):
            MemberEntry.parse(raw)
        assert RECORDS.change(signed(replace_record(raw)), membership()) is None


def test_a_certificate_that_does_not_name_the_member_is_refused_at_the_door() -> None:
    """Whether a certificate is one and names the new member is the doors' check (the
    mempool's and the commands'), so that whether a committed record applies never
    depends on an X.509 library: the mempool refuses such a record (`bad_member_entry`),
    as it refuses a certificate of another member, and the command refuses the entry."""
    from quorumgate.proto.clusterfile import ClusterFileError, parse_member_entry
    from quorumgate.replica.mempool import Mempool

    for pem in (
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        make_node_certificate(1, "10.0.0.9")[1],
    ):
        raw = entry(tls_cert=pem).encode()
        refused = Mempool(CHAIN, owner_records=RECORDS).admit(signed(replace_record(raw)))
        assert not refused.accepted and refused.reason == "bad_member_entry"
        spec = _tls_spec()
        with pytest.raises(ClusterFileError, match="tls_cert"):
            parse_member_entry(MemberEntry.parse(raw).document(), spec, "entry.json")


def _tls_spec() -> object:
    from types import SimpleNamespace

    return SimpleNamespace(insecure=False, owner_public_key=OWNER.public_key, members=())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("host"),
        lambda d: d.update(extra=1),
        lambda d: d.update(replica_port=0),
        lambda d: d.update(sidecar_port="7402"),
        lambda d: d.update(metrics_port=True),
        lambda d: d.update(host="a b"),
        lambda d: d.update(receipt_public_key="00" * 31),
        lambda d: d.update(public_key=NEW.public_key.hex().upper()),
    ],
)
def test_an_entry_that_does_not_parse_is_refused(mutate: object) -> None:
    doc = entry().document()
    mutate(doc)  # type: ignore[operator]
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(MemberEntryError):
        MemberEntry.parse(raw)
    assert RECORDS.change(signed(replace_record(raw)), membership()) is None


def test_only_the_canonical_encoding_parses() -> None:
    spaced = json.dumps(entry().document(), sort_keys=True).encode()
    with pytest.raises(MemberEntryError, match="canonical"):
        MemberEntry.parse(spaced)
    with pytest.raises(MemberEntryError, match="canonical"):
        MemberEntry.parse(b"\xff")


def test_entries_are_read_exactly() -> None:
    """A length prefix that runs past the record, a second entry for one key, trailing
    bytes, or an entry on a kind that carries none: the record does not parse."""
    good = replace_record().encode()
    assert Reconfiguration.parse(good + b"\x00") is None
    assert Reconfiguration.parse(good[:-1]) is None
    two = Reconfiguration("replace", (3,), (NEW.public_key,), entries=(b"{}", b"{}")).encode()
    assert Reconfiguration.parse(two) is None
    rotate = Reconfiguration("rotate", (3,), (NEW.public_key,), entries=(entry().encode(),))
    assert Reconfiguration.parse(rotate.encode()) is None


def test_a_plaintext_entry_has_no_certificate() -> None:
    plain = entry(tls_cert=b"")
    assert "tls_cert" not in plain.document()
    assert MemberEntry.parse(plain.encode()) == plain


def test_the_mempool_refuses_a_replace_whose_entry_does_not_check() -> None:
    """Refused clearly at the door (`bad_member_entry`), not committed for nothing: a
    replace signed by the owner whose entry names another key; the good one is taken."""
    from quorumgate.replica.mempool import Mempool

    mempool = Mempool(CHAIN, owner_records=RECORDS)
    wrong = signed(replace_record(entry(public_key=OTHER.public_key).encode()))
    refused = mempool.admit(wrong)
    assert not refused.accepted and refused.reason == "bad_member_entry"
    assert refused.status == "INVALID_ARGUMENT"
    assert mempool.admit(signed(replace_record())).accepted


def test_a_replace_hands_the_next_epoch_the_new_machines_receipt_key() -> None:
    """Certificates of the epoch a `replace` starts are checked with the new machine's
    receipt key, as after a `receipt` record: the reader of the next epoch carries it
    (docs/consensus/epochs.md, "Receipt keys"). A receipt key another member, or the
    record key, already uses is no change: two members signing with one key would let
    one machine count twice towards f+1."""
    receipts = tuple(Ed25519Signer(key_seed(i, "receipt")).public_key for i in range(4))
    reader = OwnerRecords(CHAIN, OWNER.public_key, receipts)
    step = reader.step(signed(replace_record()), membership())
    assert step is not None
    assert step[1].receipt_keys == (*receipts[:3], RECEIPT.public_key)
    assert step[1].owner_key == OWNER.public_key
    for taken in (receipts[0], OWNER.public_key, membership().key(1)):
        stolen = replace_record(entry(receipt_public_key=taken).encode())
        assert reader.step(signed(stolen), membership()) is None, taken.hex()[:8]
