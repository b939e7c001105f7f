"""Fixtures of the notifier's tests (docs/notifications.md): a live 4-node cluster
(`tests.support.cluster`), a webhook receiver and a real SMTP server (aiosmtpd), each on a
free loopback port and stopped when the test ends."""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from quorumgate.proto.clusterfile import free_loopback_ports
from tests.support.cluster import cluster, live, owner, sink_key  # noqa: F401 (fixtures)

SECRET_BYTES = 32


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.live)


@dataclass
class Receiver:
    """A webhook receiver: every POST's headers and body; the first `fail_first` answered 500."""

    url: str = ""
    fail_first: int = 0
    posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(body) for _, body in self.posts]

    def count(self) -> int:
        with self.lock:
            return len(self.posts)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with state.lock:
                state.posts.append(({k.lower(): v for k, v in self.headers.items()}, body))
                failing = len(state.posts) <= state.fail_first
            self.send_response(500 if failing else 204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    port = free_loopback_ports(1)[0]
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@dataclass
class Mailbox:
    port: int
    messages: list[tuple[str, list[str], bytes]] = field(default_factory=list)

    async def handle_DATA(self, server: object, session: object, envelope: Any) -> str:
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
        return "250 OK"


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    box = Mailbox(free_loopback_ports(1)[0])
    controller = Controller(box, hostname="127.0.0.1", port=box.port)
    controller.start()
    try:
        yield box
    finally:
        controller.stop()


def private_file(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


def new_secret(path: Path) -> bytes:
    """A webhook secret file (`whsec_<base64>`, mode 0600); returns the HMAC key."""
    key = os.urandom(SECRET_BYTES)
    private_file(path, "whsec_" + base64.b64encode(key).decode() + "\n")
    return key


@dataclass
class TlsMailbox(Mailbox):
    """A mail server that takes mail only after STARTTLS and a login with `user`/`password`."""

    ca_file: Path = Path()
    user: str = "notifier"
    password: str = ""
    logins: list[str] = field(default_factory=list)

    def authenticate(self, server: object, session: object, envelope: object, mechanism: str,
                     auth_data: Any) -> Any:  # fmt: skip
        from aiosmtpd.smtp import AuthResult

        ok = auth_data.login.decode() == self.user and auth_data.password.decode() == self.password
        if ok:
            self.logins.append(auth_data.login.decode())
        return AuthResult(success=ok)


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "notify test smtp")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "smtp.crt", folder / "smtp.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    private_file(key_file, "")
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture
def tls_mailbox(tmp_path: Path) -> Iterator[TlsMailbox]:
    import ssl

    cert_file, key_file = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    box = TlsMailbox(free_loopback_ports(1)[0], ca_file=cert_file, password=os.urandom(9).hex())
    controller = Controller(
        box, hostname="127.0.0.1", port=box.port, tls_context=context, require_starttls=True,
        authenticator=box.authenticate, auth_require_tls=True,
    )  # fmt: skip
    controller.start()
    try:
        yield box
    finally:
        controller.stop()
