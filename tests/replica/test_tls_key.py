"""A member's TLS key rotated in place (docs/consensus/epochs.md, "TLS keys"): a `replace`
record for the same index whose entry keeps the member's address, consensus and receipt
keys and carries a new certificate. The record applies as any `replace` does; the doors
(the mempool, the command) refuse a certificate that does not name the member or whose key
a member of the epoch holds; the member's replica and sidecar serve the certificate of
their epoch from its key beside the old one, switching at a new handshake."""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.clusterfile import (
    TLS_KEY_FILE,
    ClusterSpec,
    held_tls_certificates,
    init_cluster,
    rotated_tls_key_file,
    tls_key_for,
    write_rotated_tls,
)
from quorumgate.proto.membership import MemberEntry, Reconfiguration, sign_record
from quorumgate.proto.tls import make_node_certificate, tls_key_problem, tls_name
from quorumgate.replica.epochs import change_in, entries_after, owner_after
from quorumgate.replica.mempool import Mempool
from quorumgate.replica.types import genesis_block
from quorumgate.runtime.channels import ServedCertificate, add_server_port, aio_channel
from quorumgate.sidecar.receiptkeys import ReceiptKeys
from tests.consensus.helpers import CHAIN, make_block
from tests.consensus.test_member_entries import OWNER

MEMBER = 2


def cluster(tmp_path: Path) -> ClusterSpec:
    spec = init_cluster(tmp_path / "c", 4)
    assert not spec.insecure and spec.runs_epochs
    # the helpers' chain and owner key, which their blocks and records use
    return replace(spec, chain_id=CHAIN, owner_public_key=OWNER.public_key)


def certificate_with_key(index: int, key_pem: bytes) -> bytes:
    """A certificate naming member `index` over an existing private key (a TLS key in use
    elsewhere, re-certified)."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, tls_name(index))])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(tls_name(index))]), False)
        .sign(key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def tls_record(spec: ClusterSpec, cert: bytes, **changes: object) -> bytes:
    """The owner-signed `replace` that gives member 2 `cert` and keeps the rest."""
    entry = replace(spec.member(MEMBER), tls_cert=cert, **changes)  # type: ignore[arg-type]
    record = Reconfiguration("replace", (MEMBER,), (entry.public_key,), entries=(entry.encode(),))
    return sign_record(record, spec.chain_id, 0, OWNER.sign)


def mempool(spec: ClusterSpec) -> Mempool:
    pool = Mempool(spec.chain_id, owner_records=spec.record_reader())
    pool.certificates = tuple(m.tls_cert for m in spec.members)
    return pool


def test_a_tls_rotation_keeps_the_member_and_its_keys(tmp_path: Path) -> None:
    """It parses exactly, ends the epoch with the same consensus and receipt keys, and the
    next epoch's cluster has member 2 at the same address with the new certificate."""
    spec = cluster(tmp_path)
    cert = make_node_certificate(MEMBER, spec.member(MEMBER).host)[1]
    tx = tls_record(spec, cert)
    reader, members = spec.record_reader(), spec.membership()
    read = reader.read(tx)
    assert read is not None and Reconfiguration.parse(read[0].encode()) == read[0]
    block = make_block(genesis_block(spec.chain_id), 1, payload=(tx,))
    nxt = change_in(block, members, reader)
    assert nxt is not None and nxt.epoch == 1
    assert [m.public_key for m in nxt.members] == [m.public_key for m in members.members]
    assert owner_after(block, members, reader).receipt_keys == spec.receipt_keys
    after = spec.with_entries(entries_after(block, members, reader))
    assert after.member(MEMBER) == replace(spec.member(MEMBER), tls_cert=cert)
    assert [m for m in after.members if m.index != MEMBER] == [
        m for m in spec.members if m.index != MEMBER
    ]
    assert mempool(spec).admit(tx).accepted


def test_a_certificate_not_naming_the_member_is_refused_at_the_door(tmp_path: Path) -> None:
    spec = cluster(tmp_path)
    cert = make_node_certificate(1, spec.member(MEMBER).host)[1]  # qg-node-1's
    refused = mempool(spec).admit(tls_record(spec, cert))
    assert not refused.accepted and refused.reason == "bad_member_entry"
    assert tls_key_problem(cert, MEMBER, ()) == f"the TLS certificate does not name {tls_name(2)}"


@pytest.mark.parametrize("holder", [0, MEMBER])
def test_a_tls_key_in_use_is_refused_at_the_door(tmp_path: Path, holder: int) -> None:
    """Member 0's TLS key certified as member 2 would let member 0 serve as member 2; member
    2's own key re-certified rotates nothing. Both are refused by the mempool and named
    by the command's check; a fresh key is taken."""
    spec = cluster(tmp_path)
    reused = certificate_with_key(MEMBER, (spec.node_dir(holder) / TLS_KEY_FILE).read_bytes())
    refused = mempool(spec).admit(tls_record(spec, reused))
    assert not refused.accepted and refused.reason == "bad_member_entry"
    problem = tls_key_problem(reused, MEMBER, tuple(m.tls_cert for m in spec.members))
    whose = "its own certificate's" if holder == MEMBER else "member 0's"
    assert problem == f"the TLS certificate's key is {whose} key (in use)"


def test_a_receipt_key_in_use_elsewhere_changes_nothing(tmp_path: Path) -> None:
    """The consensus core's own check, as for any `replace`: an entry that gives member 2
    member 1's receipt key is committed and changes nothing."""
    spec = cluster(tmp_path)
    cert = make_node_certificate(MEMBER, spec.member(MEMBER).host)[1]
    tx = tls_record(spec, cert, receipt_public_key=spec.member(1).receipt_public_key)
    block = make_block(genesis_block(spec.chain_id), 1, payload=(tx,))
    assert change_in(block, spec.membership(), spec.record_reader()) is None


def test_the_rotated_key_files_are_found_by_the_certificate(tmp_path: Path) -> None:
    spec = cluster(tmp_path)
    node_dir, own = spec.node_dir(MEMBER), spec.member(MEMBER).tls_cert
    key_pem, cert = make_node_certificate(MEMBER, "127.0.0.1")
    key_path, cert_path = write_rotated_tls(node_dir, key_pem, cert)
    assert key_path.name == rotated_tls_key_file(cert) and key_path.stat().st_mode & 0o077 == 0
    assert cert_path.read_bytes() == cert
    assert tls_key_for(node_dir, cert, own) == key_pem
    assert tls_key_for(node_dir, own, own) == (node_dir / TLS_KEY_FILE).read_bytes()
    assert tls_key_for(node_dir, make_node_certificate(MEMBER, "x")[1], own) is None
    assert held_tls_certificates(node_dir, own) == own + cert
    key_path.unlink()  # (a certificate whose key is gone is trusted no more)
    assert held_tls_certificates(node_dir, own) == own


def test_the_sidecar_follows_its_certificate_at_the_change_block(tmp_path: Path) -> None:
    spec = cluster(tmp_path)
    key_pem, cert = make_node_certificate(MEMBER, "127.0.0.1")
    write_rotated_tls(spec.node_dir(MEMBER), key_pem, cert)
    block = make_block(genesis_block(spec.chain_id), 1, payload=(tls_record(spec, cert),))
    mine = ReceiptKeys(spec, MEMBER, spec.node_dir(MEMBER), None, spec.member(MEMBER).tls_cert)
    other = ReceiptKeys(spec, 1, spec.node_dir(1), None, spec.member(1).tls_cert)
    assert mine.tls_cert == spec.member(MEMBER).tls_cert
    assert mine.after(block) and other.after(block)
    assert mine.tls_cert == cert and other.tls_cert == spec.member(1).tls_cert


def test_the_server_serves_the_certificate_of_its_epoch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real gRPC server with `ServedCertificate`: the old certificate until the epoch
    names the new one, then the new one at the next handshake (no restart), a client
    pinning the old one refused; a certificate whose key the directory lacks is not
    served (the last one goes on) and says so in the log."""
    spec = cluster(tmp_path)
    node_dir, own = spec.node_dir(MEMBER), spec.member(MEMBER).tls_cert
    key_pem, cert = make_node_certificate(MEMBER, "127.0.0.1")
    write_rotated_tls(node_dir, key_pem, cert)
    epoch_cert = [own]
    served = ServedCertificate(node_dir, own, lambda: epoch_cert[0])
    rotated = spec.with_entries((replace(spec.member(MEMBER), tls_cert=cert),))

    class Replica(cpb_grpc.ReplicaServicer):  # type: ignore[misc]
        async def Status(self, request: object, context: object) -> cpb.StatusReply:
            return cpb.StatusReply(node=MEMBER)

    async def code(pinned: ClusterSpec) -> grpc.StatusCode:
        async with aio_channel(pinned, MEMBER) as channel:
            try:
                await cpb_grpc.ReplicaStub(channel).Status(cpb.StatusRequest(), timeout=2)
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    async def main() -> None:
        server = grpc.aio.server()
        cpb_grpc.add_ReplicaServicer_to_server(Replica(), server)
        add_server_port(server, spec, MEMBER, "replica", served)
        await server.start()
        try:
            assert await code(spec) == grpc.StatusCode.OK
            assert await code(rotated) == grpc.StatusCode.UNAVAILABLE
            epoch_cert[0] = cert
            assert await code(rotated) == grpc.StatusCode.OK
            assert await code(spec) == grpc.StatusCode.UNAVAILABLE
            epoch_cert[0] = make_node_certificate(MEMBER, "127.0.0.1")[1]  # (no key here)
            with caplog.at_level(logging.ERROR, "quorumgate.channels"):
                assert await code(rotated) == grpc.StatusCode.OK
            assert "event=tls_certificate_not_served" in caplog.text
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_a_member_entry_of_the_same_machine_is_its_entry(tmp_path: Path) -> None:
    """(What the command builds: the epoch's entry of the member with the certificate
    swapped, so the record moves nothing else.)"""
    spec = cluster(tmp_path)
    cert = make_node_certificate(MEMBER, "127.0.0.1")[1]
    entry = MemberEntry.parse(replace(spec.member(MEMBER), tls_cert=cert).encode())
    assert entry == replace(spec.member(MEMBER), tls_cert=cert)
