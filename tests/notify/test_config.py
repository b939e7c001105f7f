"""The notifier's configuration (docs/notifications.md, "Configuration"): a good file is
read; a bad one is refused with one line that names the field, by the command too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from quorumgate.notify.config import NotifyConfigError, load_config
from quorumgate.notify.send import sign_webhook
from tests.notify.conftest import new_secret, private_file

DANA = "principals.dana"
GOOD = """
console_url = "http://127.0.0.1:8788"
[smtp]
host = "mail.example.test"
port = 587
sender = "quorumgate@example.test"
credentials_file = "smtp.cred"
[principals.dana]
webhook = "https://hooks.example.test/dana"
webhook_secret_file = "dana.secret"
email = "dana@example.test"
"""


def _files(tmp_path: Path, text: str) -> Path:
    new_secret(tmp_path / "dana.secret")
    private_file(tmp_path / "smtp.cred", "mailer\ns3cret-pass\n")
    path = tmp_path / "notify.toml"
    path.write_text(text)
    return path


def test_a_good_file_is_read(tmp_path: Path) -> None:
    config = load_config(_files(tmp_path, GOOD), tmp_path / "cluster")
    assert config.console_url == "http://127.0.0.1:8788/"
    assert config.reader_key == tmp_path / "cluster" / "owner.key"
    [route] = config.routes
    assert (route.principal, route.email, len(route.webhook_key)) == (
        "dana",
        "dana@example.test",
        32,
    )
    assert config.smtp is not None and config.smtp.starttls  # STARTTLS unless turned off
    assert "s3cret" not in repr(config) and "s3cret" not in repr(config.smtp)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("console_url = \"http://127.0.0.1:8788\"", ""), "console_url"),
        (("console_url = \"http://127.0.0.1:8788\"", 'console_url = "ftp://x/"'), "console_url"),
        (("https://hooks.example.test/dana", "http://hooks.example.test/dana"), f"{DANA}.webhook"),
        (('_file = "dana.secret"', '_file = "nope"'), f"{DANA}.webhook_secret_file"),
        (("port = 587", "port = 70000"), "smtp.port"),
        (("port = 587", "port = 587\ntls = true"), "smtp.tls"),
        (('email = "dana@example.test"', 'email = "a@b, c@d"'), f"{DANA}.email"),
        (('sender = "quorumgate@example.test"', ""), "smtp.sender"),
    ],
)  # fmt: skip
def test_a_bad_field_is_named(tmp_path: Path, edit: tuple[str, str], field: str) -> None:
    path = _files(tmp_path, GOOD.replace(*edit))
    with pytest.raises(NotifyConfigError) as refused:
        load_config(path, tmp_path)
    assert refused.value.field == field
    assert "\n" not in str(refused.value) and str(refused.value).startswith(
        f"notify config: {field}:"
    )


def test_a_secret_others_can_read_is_refused(tmp_path: Path) -> None:
    path = _files(tmp_path, GOOD)
    (tmp_path / "dana.secret").chmod(0o644)
    with pytest.raises(NotifyConfigError) as refused:
        load_config(path, tmp_path)
    assert refused.value.field == "principals.dana.webhook_secret_file"
    assert "chmod 600" in str(refused.value)


def test_the_command_refuses_a_bad_file_in_one_line(tmp_path: Path) -> None:
    path = _files(tmp_path, GOOD.replace("port = 587", "port = 0"))
    done = subprocess.run(
        [sys.executable, "-m", "quorumgate", "notify", "--dir", str(tmp_path),
         "--config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: notify config: smtp.port: a port number 1..65535 is required"
    ]


def test_the_signature_is_the_standard_webhooks_one() -> None:
    """The Standard Webhooks specification's own example: secret, id, timestamp, body."""
    import base64

    key = base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    body = b'{"test": 2432232314}'
    signature = sign_webhook(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_the_receiver_snippet_of_the_docs_verifies_a_signed_message() -> None:
    """docs/notifications.md's `verify` accepts what the notifier signs, and nothing else."""
    import base64
    import os
    import re
    import time

    from quorumgate.notify.send import webhook_headers

    page = (Path(__file__).resolve().parents[2] / "docs" / "notifications.md").read_text()
    [snippet] = re.findall(r"```python\n(.*?)```", page, re.S)
    space: dict[str, object] = {}
    exec(compile(snippet, "docs/notifications.md", "exec"), space)
    verify = space["verify"]
    key = os.urandom(32)
    secret = "whsec_" + base64.b64encode(key).decode()
    body = b'{"card_digest": "ab"}'
    headers = webhook_headers(key, "ab" * 32, int(time.time()), body)
    assert verify(secret, headers, body)  # type: ignore[operator]
    assert not verify(secret, headers, body + b" ")  # type: ignore[operator]
    stale = webhook_headers(key, "ab" * 32, int(time.time()) - 3600, body)
    assert not verify(secret, stale, body)  # type: ignore[operator]


def test_a_password_is_not_sent_without_starttls(tmp_path: Path) -> None:
    path = _files(tmp_path, GOOD.replace("port = 587", "port = 587\nstarttls = false"))
    with pytest.raises(NotifyConfigError) as refused:
        load_config(path, tmp_path)
    assert refused.value.field == "smtp.starttls"
