"""TLS material for a cluster: one key and one self-signed certificate per member.

`quorumgate init` makes them (with the `cryptography` package, never hand-rolled ASN.1):
the private key goes to `DIR/node-I/tls.key` (mode 0600) and the certificate, public, into
the cluster file. The member's replica and its sidecar serve TLS with that pair; every
client pins it: a channel to member I trusts exactly member I's certificate from the
cluster file (it is its own root) and checks the name `qg-node-I` in it, so no other
certificate — from a public CA or another member — is accepted for that member.

ECDSA P-256: every TLS stack gRPC builds on speaks it.
"""

from __future__ import annotations

import datetime
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CERT_VALIDITY_DAYS = 3650
CERT_BACKDATE = datetime.timedelta(days=1)  # tolerate a member whose clock is a little behind
PEM_CERT_BYTES_MAX = 8192


def tls_name(index: int) -> str:
    """The name member `index`'s certificate carries and its clients check."""
    return f"qg-node-{index}"


def make_node_certificate(index: int, host: str) -> tuple[bytes, bytes]:
    """A new (private key PEM, self-signed certificate PEM) for member `index` at `host`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, tls_name(index))])
    alt_names: list[x509.GeneralName] = [x509.DNSName(tls_name(index))]
    try:
        alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        alt_names.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CERT_BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=CERT_VALIDITY_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def check_certificate(pem: bytes, index: int) -> None:
    """Raise ValueError unless `pem` is one certificate naming member `index`."""
    if len(pem) > PEM_CERT_BYTES_MAX:
        raise ValueError("the TLS certificate is too large")
    cert = x509.load_pem_x509_certificate(pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound as err:
        raise ValueError("the TLS certificate names no host (no subjectAltName)") from err
    if tls_name(index) not in names.value.get_values_for_type(x509.DNSName):
        raise ValueError(f"the TLS certificate does not name {tls_name(index)}")


def certificate_fingerprint(pem: bytes) -> str:
    """SHA-256 of the certificate's DER, hex: what `status` shows to compare by eye."""
    cert = x509.load_pem_x509_certificate(pem)
    return cert.fingerprint(hashes.SHA256()).hex()


def certificate_problem(pem: bytes, index: int) -> str | None:
    """What is wrong with `pem` as member `index`'s certificate (`check_certificate`), or
    None. A member entry's certificate is checked this way at the doors, the mempool and
    the commands; the consensus core checks its PEM shape only (proto/membership.py
    `_check_pem_shape`)."""
    try:
        check_certificate(pem, index)
    except (ValueError, TypeError) as err:
        return str(err) or "not a certificate"
    return None


def certificate_public_key(pem: bytes) -> bytes:
    """The certificate's public key (SubjectPublicKeyInfo, DER): what tells whether two
    certificates share a TLS key. `ValueError` if `pem` is no certificate."""
    cert = x509.load_pem_x509_certificate(pem)
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def tls_key_problem(pem: bytes, index: int, certificates: tuple[bytes, ...]) -> str | None:
    """What is wrong with `pem` as member `index`'s new certificate (`certificate_problem`)
    in a cluster whose members' certificates are `certificates` (the epoch's, member
    order), or None. Its key must be in use by no member, member `index` included: a
    certificate whose key another member holds would let that member serve as member
    `index`, and one that keeps member `index`'s key rotates nothing."""
    problem = certificate_problem(pem, index)
    if problem is not None:
        return problem
    key = certificate_public_key(pem)
    for held, cert in enumerate(certificates):
        try:
            in_use = certificate_public_key(cert)
        except ValueError:
            continue
        if in_use == key:
            whose = "its own certificate's" if held == index else f"member {held}'s"
            return f"the TLS certificate's key is {whose} key (in use)"
    return None
