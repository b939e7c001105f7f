"""Every gRPC endpoint of a cluster, opened one way: TLS with the member's pinned
certificate, or plaintext when the cluster file says `"transport": "insecure"`.

- A client of member I (an agent's SDK, an operator command, a sidecar, another replica)
  trusts exactly member I's certificate from the cluster file and checks the name
  `qg-node-I` in it (proto/tls.py): nothing else can stand in for that member.
- A member's replica and sidecar serve TLS with `DIR/node-I/tls.key` and that certificate,
  or, after the member's TLS key was rotated in place, with the certificate the epoch they
  run names and its key beside it (`ServedCertificate`: gRPC asks for it at each new
  handshake, so the switch needs no restart; docs/consensus/epochs.md, "TLS keys").
- Replicas authenticate to each other per stream: the first thing a peer stream carries
  is a statement signed with the sender's consensus key — sender, receiver, time — in the
  call's metadata (`peer_auth_metadata`, checked by `check_peer_auth`); on a chain that
  runs epochs, the key of the epoch the receiver runs (docs/consensus/epochs.md). Inside TLS only
  the receiver sees it, and it names the receiver, so it cannot be replayed elsewhere.
  From then on every message on that stream must name that sender: were the sender whatever
  the envelope said, one member could speak for another (docs/consensus/messages.md, "Sender
  binding").

Why this and not mutual TLS: gRPC's Python server asks for client certificates on all of a
port or none of it, and clients reach the same port without one; the signed stream
statement gives the same guarantee — the peer is the member whose key signed — with the
keys the cluster already pins, on one port.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from nacl.signing import SigningKey

from quorumgate.proto import domains
from quorumgate.proto.canonical import Encoder
from quorumgate.proto.clusterfile import (
    TLS_KEY_FILE,
    ClusterFileError,
    ClusterSpec,
    MemberSpec,
    certificate_name,
    read_private,
    tls_key_for,
)
from quorumgate.proto.crypto import Signer, ed25519_verify
from quorumgate.proto.tls import tls_name
from quorumgate.runtime.links import CHANNEL_OPTIONS
from quorumgate.runtime.readauth import Sign, SyncReadAuthInterceptor, read_auth_interceptors

TAG_PEER_STREAM = domains.PEER_STREAM
PEER_AUTH_METADATA = "qg-peer-auth"
PEER_AUTH_SKEW_MS_MAX = 300_000  # a stream statement older or newer than this is refused
# Signatures a stream statement may carry: one per consensus key its sender holds (the
# current one and keys rotated in or out around an epoch boundary).
PEER_AUTH_SIGNATURES_MAX = 4
SIGNATURE_BYTES = 64

log = logging.getLogger("quorumgate.channels")


def _address(member: MemberSpec, kind: str) -> str:
    if kind == "replica":
        return member.replica_address
    if kind == "sidecar":
        return member.sidecar_address
    raise ValueError(f"unknown endpoint kind {kind!r}")


def _tls_options(member: MemberSpec) -> tuple[tuple[str, object], ...]:
    return (*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", tls_name(member.index)))


def _credentials(member: MemberSpec, roots: bytes | None = None) -> grpc.ChannelCredentials:
    trusted = member.tls_cert if roots is None else roots
    return grpc.ssl_channel_credentials(root_certificates=trusted)


@dataclass(frozen=True, slots=True)
class Reader:
    """A key that signs its read calls (runtime/readauth.py): the owner, a member, an
    auditor. Channels opened with one sign every call."""

    public_key: bytes
    sign: Sign

    @staticmethod
    def of(key: SigningKey) -> Reader:
        return Reader(bytes(key.verify_key), lambda message: bytes(key.sign(message).signature))

    @staticmethod
    def of_signer(signer: Signer) -> Reader:
        return Reader(signer.public_key, signer.sign)


def _now_ms() -> int:
    return int(time.time() * 1000)


def aio_channel(
    spec: ClusterSpec,
    index: int,
    kind: str = "replica",
    *,
    options: tuple[tuple[str, object], ...] = (),
    reader: Reader | None = None,
    roots: bytes | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to member `index`'s replica or sidecar; with `reader`, every
    call is signed as that key. `roots`: the certificates trusted for the member in place
    of its one in `spec` (a member's replica and sidecar on their links to each other:
    proto/clusterfile.py `held_tls_certificates`)."""
    member = spec.member(index)
    address = _address(member, kind)
    interceptors = (
        read_auth_interceptors(spec.chain_id, reader.public_key, reader.sign, _now_ms)
        if reader is not None
        else None
    )
    if spec.insecure:
        return grpc.aio.insecure_channel(
            address, options=(*CHANNEL_OPTIONS, *options), interceptors=interceptors
        )
    return grpc.aio.secure_channel(
        address,
        _credentials(member, roots),
        options=(*_tls_options(member), *options),
        interceptors=interceptors,
    )


def sync_channel(
    spec: ClusterSpec, index: int, kind: str = "replica", *, reader: Reader | None = None
) -> grpc.Channel:
    """A blocking channel to member `index`'s replica or sidecar (operator commands)."""
    member = spec.member(index)
    address = _address(member, kind)
    if spec.insecure:
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    else:
        channel = grpc.secure_channel(address, _credentials(member), options=_tls_options(member))
    if reader is None:
        return channel
    interceptor = SyncReadAuthInterceptor(spec.chain_id, reader.public_key, reader.sign, _now_ms)
    return grpc.intercept_channel(channel, interceptor)


class ServedCertificate:
    """The certificate a member's server presents: the one the epoch it runs names
    (`current`), with its key from the node directory (proto/clusterfile.py
    `tls_key_for`). gRPC calls `fetch` at each new TLS handshake
    (`grpc.dynamic_ssl_server_credentials`), so a certificate committed by a TLS rotation
    is served from the boundary on without a restart; connections made before keep the
    certificate they were made with. A certificate whose key the directory lacks (the
    operator did not run `--prepare` on this machine) is not served: the last one goes on,
    and the reason is logged once per certificate."""

    def __init__(self, node_dir: Path, own_cert: bytes, current: Callable[[], bytes]) -> None:
        self.node_dir = node_dir
        self.own_cert = own_cert  # tls.key's: cluster.json's, or join.json's on a new machine
        self.current = current
        self._lock = threading.Lock()  # (gRPC may call from its own threads)
        self.serving = own_cert
        self._missing: set[bytes] = set()

    def initial(self) -> grpc.ServerCertificateConfiguration:
        cert = self.current()
        key = self._key(cert)
        if key is None:
            cert, key = self.own_cert, read_private(self.node_dir / TLS_KEY_FILE)
        self.serving = cert
        return grpc.ssl_server_certificate_configuration([(key, cert)])

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The configuration to serve from now on, or None to keep the one served."""
        with self._lock:
            cert = self.current()
            if cert == self.serving:
                return None
            key = self._key(cert)
            if key is None:
                return None
            self.serving = cert
            log.info("event=tls_certificate_served certificate=%s", certificate_name(cert))
            return grpc.ssl_server_certificate_configuration([(key, cert)])

    def _key(self, cert: bytes) -> bytes | None:
        try:
            key = tls_key_for(self.node_dir, cert, self.own_cert)
        except ClusterFileError as err:
            key, reason = None, str(err)
        else:
            reason = "no key file for it in the node directory"
        if key is None and cert not in self._missing:
            self._missing.add(cert)
            log.error(
                "event=tls_certificate_not_served certificate=%s reason=%s hint=run `admin "
                "rotate-key --tls I --prepare` on this machine before the boundary",
                certificate_name(cert), reason,
            )  # fmt: skip
        return key


def add_server_port(
    server: grpc.aio.Server,
    spec: ClusterSpec,
    index: int,
    kind: str,
    served: ServedCertificate | None = None,
) -> str:
    """Listen on member `index`'s address for `kind`, with its TLS key (or plaintext);
    with `served`, the certificate of the epoch the process runs (`ServedCertificate`)."""
    member = spec.member(index)
    address = _address(member, kind)
    try:
        if spec.insecure:
            server.add_insecure_port(address)
        elif served is not None:
            credentials = grpc.dynamic_ssl_server_credentials(served.initial(), served.fetch)
            server.add_secure_port(address, credentials)
        else:
            key = read_private(spec.node_dir(index) / TLS_KEY_FILE)
            server.add_secure_port(address, grpc.ssl_server_credentials([(key, member.tls_cert)]))
    except RuntimeError as err:
        raise OSError(f"cannot listen on {address} (port in use?)") from err
    return address


# ---------------------------------------------------------------------------- peer streams


def peer_stream_statement(chain_id: str, sender: int, receiver: int, time_ms: int) -> bytes:
    return bytes(Encoder(TAG_PEER_STREAM).text(chain_id).u32(sender).u32(receiver).u64(time_ms))


def peer_auth_metadata(
    chain_id: str, sender: int, receiver: int, time_ms: int, *signers: Signer
) -> tuple[tuple[str, str], ...]:
    """The metadata a replica opens a peer stream with: who it is, signed by each of the
    consensus keys it holds (`PEER_AUTH_SIGNATURES_MAX` at most), its current one first.
    A member whose key was rotated may not know yet whether the receiver has reached the
    epoch of its new key: one of its signatures is under the key the receiver expects."""
    assert 1 <= len(signers) <= PEER_AUTH_SIGNATURES_MAX, "one to a few stream signatures"
    statement = peer_stream_statement(chain_id, sender, receiver, time_ms)
    signatures = ",".join(signer.sign(statement).hex() for signer in signers)
    return ((PEER_AUTH_METADATA, f"{sender}:{time_ms}:{signatures}"),)


def check_peer_auth(
    spec: ClusterSpec,
    me: int,
    metadata: tuple[tuple[str, str | bytes], ...] | None,
    now_ms: int,
    key_of: Callable[[int], bytes] | None = None,
) -> int | None:
    """The member a peer stream comes from, or None when its statement is missing, stale,
    not for us, or signed by no key that member holds now. `key_of`: a member's consensus
    key in the receiver's current epoch (docs/consensus/epochs.md, "The live replica"),
    so a key rotated out opens no stream; without it, the cluster file's."""
    value = next((v for k, v in metadata or () if k == PEER_AUTH_METADATA), None)
    if not isinstance(value, str):
        return None
    parts = value.split(":")
    if len(parts) != 3:
        return None
    try:
        sender, time_ms = int(parts[0]), int(parts[1])
        signatures = [bytes.fromhex(part) for part in parts[2].split(",")]
    except ValueError:
        return None
    if not 0 <= sender < spec.n or sender == me:
        return None
    if not 1 <= len(signatures) <= PEER_AUTH_SIGNATURES_MAX:
        return None
    if any(len(signature) != SIGNATURE_BYTES for signature in signatures):
        return None
    if abs(now_ms - time_ms) > PEER_AUTH_SKEW_MS_MAX:
        return None
    key = spec.member(sender).public_key if key_of is None else key_of(sender)
    statement = peer_stream_statement(spec.chain_id, sender, me, time_ms)
    if not any(ed25519_verify(key, statement, signature) for signature in signatures):
        return None
    return sender
