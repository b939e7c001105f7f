"""The notifier's configuration file (TOML, docs/notifications.md "Configuration"): the
console's address, the reading key, the state file, the SMTP server and, per principal,
where its cards go. A bad file is refused with one line that names the field."""

from __future__ import annotations

import base64
import ipaddress
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from quorumgate.proto.clusterfile import OWNER_KEY_FILE

STATE_FILE_DEFAULT = "notify-state.json"  # in the cluster directory unless `state_file`
WEBHOOK_SECRET_PREFIX = "whsec_"  # Standard Webhooks' spelling of a signing secret
WEBHOOK_SECRET_BYTES_MIN = 24  # the Standard Webhooks specification's lower bound
WEBHOOK_SECRET_BYTES_MAX = 64
SMTP_PORT_DEFAULT = 587
PRINCIPALS_MAX = 1000
LOOPBACK_NAMES = ("localhost",)

_TOP_FIELDS = {"console_url", "reader_key", "state_file", "smtp", "principals"}
_SMTP_FIELDS = {"host", "port", "starttls", "ca_file", "sender", "credentials_file"}
_PRINCIPAL_FIELDS = {"webhook", "webhook_secret_file", "email"}


class NotifyConfigError(ValueError):
    """A configuration the notifier refuses: `str()` is one line naming the field."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"notify config: {field}: {why}")
        self.field = field


@dataclass(frozen=True)
class SmtpConfig:
    host: str
    port: int
    starttls: bool
    sender: str
    username: str = ""
    password: str = ""
    ca_file: Path | None = None  # the CA that signed the server's certificate; None: the system's

    def __repr__(self) -> str:  # the password never prints
        return f"SmtpConfig(host={self.host!r}, port={self.port}, starttls={self.starttls})"


@dataclass(frozen=True)
class Route:
    """Where one principal's cards go: a webhook (with its signing key), an address, or both."""

    principal: str
    webhook: str = ""
    webhook_key: bytes = b""
    email: str = ""

    def __repr__(self) -> str:  # the signing key never prints
        return (
            f"Route(principal={self.principal!r}, webhook={self.webhook!r}, email={self.email!r})"
        )


@dataclass(frozen=True)
class NotifyConfig:
    console_url: str
    reader_key: Path
    state_file: Path
    smtp: SmtpConfig | None
    routes: tuple[Route, ...]

    def route(self, principal: str) -> Route | None:
        return next((r for r in self.routes if r.principal == principal), None)


def load_config(path: Path, cluster_dir: Path) -> NotifyConfig:
    """Read and check the file at `path`; relative paths in it are relative to its folder."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as err:
        raise NotifyConfigError(str(path), f"cannot read it ({err.strerror})") from err
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise NotifyConfigError(str(path), f"not TOML ({err})") from err
    return parse_config(doc, path.parent, cluster_dir)


def parse_config(doc: dict[str, Any], base: Path, cluster_dir: Path) -> NotifyConfig:
    _no_unknown(doc, _TOP_FIELDS, "")
    console_url = _console_url(doc.get("console_url"))
    reader_key = _path(doc, "reader_key", base, cluster_dir / OWNER_KEY_FILE)
    state_file = _path(doc, "state_file", base, cluster_dir / STATE_FILE_DEFAULT)
    smtp = _smtp(doc["smtp"], base) if "smtp" in doc else None
    principals = doc.get("principals")
    if not isinstance(principals, dict) or not principals:
        raise NotifyConfigError("principals", "a table with at least one principal is required")
    if len(principals) > PRINCIPALS_MAX:
        raise NotifyConfigError("principals", f"at most {PRINCIPALS_MAX} principals")
    routes = tuple(_route(pid, entry, base, smtp) for pid, entry in sorted(principals.items()))
    return NotifyConfig(console_url, reader_key, state_file, smtp, routes)


def _no_unknown(table: dict[str, Any], known: set[str], prefix: str) -> None:
    for key in sorted(table):
        if key not in known:
            raise NotifyConfigError(
                prefix + key, f"unknown field (known: {', '.join(sorted(known))})"
            )


def _text(table: dict[str, Any], key: str, field: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise NotifyConfigError(field, "a non-empty string is required")
    return value.strip()


def _path(doc: dict[str, Any], key: str, base: Path, default: Path) -> Path:
    if key not in doc:
        return default
    return base / _text(doc, key, key)


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _console_url(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise NotifyConfigError("console_url", "required: the console's address, http://HOST:PORT/")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotifyConfigError("console_url", "an http or https URL is required")
    if parts.query or parts.fragment:
        raise NotifyConfigError("console_url", "no query or fragment: the card's link adds one")
    return value if value.endswith("/") else value + "/"


def _webhook_url(value: str, field: str) -> str:
    parts = urlsplit(value)
    if parts.scheme == "https" and parts.hostname:
        return value
    if parts.scheme == "http" and parts.hostname and _is_loopback(parts.hostname):
        return value
    raise NotifyConfigError(field, "an https URL is required (plain http only to loopback)")


def read_private_text(path: Path, field: str) -> str:
    """A secret file's text; refused unless only its owner may read it (mode 0600)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        text = path.read_text()
    except OSError as err:
        raise NotifyConfigError(field, f"cannot read {path} ({err.strerror})") from err
    if mode & 0o077:
        raise NotifyConfigError(field, f"{path} is readable by others (mode {mode:o}); chmod 600")
    return text


def webhook_key(text: str, field: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret (Standard Webhooks' format)."""
    text = text.strip()
    if not text.startswith(WEBHOOK_SECRET_PREFIX):
        raise NotifyConfigError(field, f"the secret must be {WEBHOOK_SECRET_PREFIX}<base64>")
    try:
        key = base64.b64decode(text.removeprefix(WEBHOOK_SECRET_PREFIX), validate=True)
    except ValueError as err:
        raise NotifyConfigError(field, "the secret's base64 does not decode") from err
    if not WEBHOOK_SECRET_BYTES_MIN <= len(key) <= WEBHOOK_SECRET_BYTES_MAX:
        raise NotifyConfigError(
            field, f"the secret is {WEBHOOK_SECRET_BYTES_MIN}..{WEBHOOK_SECRET_BYTES_MAX} bytes"
        )
    return key


def _smtp(table: object, base: Path) -> SmtpConfig:
    if not isinstance(table, dict):
        raise NotifyConfigError("smtp", "a table is required")
    _no_unknown(table, _SMTP_FIELDS, "smtp.")
    host = _text(table, "host", "smtp.host")
    port = table.get("port", SMTP_PORT_DEFAULT)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise NotifyConfigError("smtp.port", "a port number 1..65535 is required")
    starttls = table.get("starttls", True)
    if not isinstance(starttls, bool):
        raise NotifyConfigError("smtp.starttls", "true or false")
    ca_file = None
    if "ca_file" in table:
        ca_file = base / _text(table, "ca_file", "smtp.ca_file")
        if not starttls:
            raise NotifyConfigError("smtp.ca_file", "only with starttls = true")
        if not ca_file.is_file():
            raise NotifyConfigError("smtp.ca_file", f"{ca_file} is not a file")
    sender = _text(table, "sender", "smtp.sender")
    if "@" not in sender:
        raise NotifyConfigError("smtp.sender", "an e-mail address is required")
    username = password = ""
    if "credentials_file" in table:
        field = "smtp.credentials_file"
        lines = read_private_text(base / _text(table, "credentials_file", field), field)
        username, _, password = lines.strip("\n").partition("\n")
        if not username or not password:
            raise NotifyConfigError(field, "two lines are required: the user, then the password")
    if username and not starttls and not _is_loopback(host):
        raise NotifyConfigError("smtp.starttls", "a password is sent only over STARTTLS")
    password = password.strip("\r\n")
    return SmtpConfig(host, port, starttls, sender, username.strip(), password, ca_file)


def _route(principal: str, entry: object, base: Path, smtp: SmtpConfig | None) -> Route:
    prefix = f"principals.{principal}"
    if not isinstance(entry, dict):
        raise NotifyConfigError(prefix, "a table is required")
    _no_unknown(entry, _PRINCIPAL_FIELDS, prefix + ".")
    webhook, key, email = "", b"", ""
    if "webhook" in entry:
        webhook = _webhook_url(_text(entry, "webhook", prefix + ".webhook"), prefix + ".webhook")
        field = prefix + ".webhook_secret_file"
        if "webhook_secret_file" not in entry:
            raise NotifyConfigError(field, "required with a webhook: its signing secret")
        key = webhook_key(
            read_private_text(base / _text(entry, "webhook_secret_file", field), field), field
        )
    elif "webhook_secret_file" in entry:
        raise NotifyConfigError(prefix + ".webhook", "a secret without a webhook")
    if "email" in entry:
        email = _text(entry, "email", prefix + ".email")
        if "@" not in email or any(c in email for c in "\r\n,;<> "):
            raise NotifyConfigError(prefix + ".email", "one e-mail address is required")
        if smtp is None:
            raise NotifyConfigError("smtp", f"required: {prefix}.email sends mail")
    if not webhook and not email:
        raise NotifyConfigError(prefix, "a webhook, an email, or both are required")
    return Route(principal, webhook, key, email)
