"""Sending one notice: a signed webhook POST (the Standard Webhooks scheme) or one e-mail
over SMTP (RFC 5321, STARTTLS per RFC 3207). Each send is one try; the notifier
(notify/notifier.py) retries with back-off. Both run in a thread: stdlib clients block."""

from __future__ import annotations

import base64
import hashlib
import hmac
import smtplib
import ssl
import urllib.error
import urllib.request
from email.message import EmailMessage

from quorumgate.notify.cards import Notice
from quorumgate.notify.config import Route, SmtpConfig

WEBHOOK_TIMEOUT_S = 10.0  # one POST, connect to last byte
SMTP_TIMEOUT_S = 20.0  # one SMTP conversation
SIGNATURE_VERSION = "v1"  # Standard Webhooks: HMAC-SHA256, base64
USER_AGENT = "quorumgate-notify"


class SendFailed(Exception):
    """One try that did not deliver; `str()` names the cause, never a value of the card."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer that is not 2xx: the card goes to the configured URL only."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects())


def sign_webhook(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header: `v1,` and the base64 HMAC-SHA256 of
    `id.timestamp.body` (Standard Webhooks, "Signature scheme")."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def webhook_headers(key: bytes, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign_webhook(key, message_id, timestamp, body),
    }


def post_webhook(route: Route, notice: Notice, body: bytes, timestamp: int) -> None:
    """One POST of `body`; `SendFailed` unless the receiver answers 2xx. The id is the card
    digest on every try, so a receiver that saw it drops the repeat."""
    headers = webhook_headers(route.webhook_key, notice.digest, timestamp, body)
    request = urllib.request.Request(route.webhook, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as answer:
            status = answer.status
    except urllib.error.HTTPError as err:
        raise SendFailed(f"http_{err.code}") from None
    except (urllib.error.URLError, OSError) as err:
        raise SendFailed(type(err).__name__) from None
    if not 200 <= status < 300:
        raise SendFailed(f"http_{status}")


def mail_message(smtp: SmtpConfig, route: Route, notice: Notice, console_url: str) -> EmailMessage:
    """The e-mail of one notice: the card's text and the console's link."""
    card = notice.card
    message = EmailMessage()
    message["From"] = smtp.sender
    message["To"] = route.email
    message["Subject"] = f"Confirmation needed: {card.tool} {notice.target()}"
    message["Message-ID"] = f"<{notice.digest}@quorumgate.card>"  # the same on every try
    message.set_content(
        "An agent's call waits for your confirmation.\n\n"
        f"{card.render(notice.values)}\n\n"
        f"Open it in your console: {notice.link(console_url)}\n\n"
        "This message cannot approve anything: the console asks for your key's passphrase,\n"
        "and only your key's signature answers the card.\n"
    )
    return message


def send_mail(smtp: SmtpConfig, message: EmailMessage) -> None:
    """One SMTP conversation; `SendFailed` on any refusal or network error."""
    try:
        with smtplib.SMTP(smtp.host, smtp.port, timeout=SMTP_TIMEOUT_S) as client:
            if smtp.starttls:
                cafile = None if smtp.ca_file is None else str(smtp.ca_file)
                client.starttls(context=ssl.create_default_context(cafile=cafile))
            if smtp.username:
                client.login(smtp.username, smtp.password)
            client.send_message(message)
    except smtplib.SMTPResponseException as err:
        raise SendFailed(f"smtp_{err.smtp_code}") from None
    except (smtplib.SMTPException, ssl.SSLError, OSError) as err:
        raise SendFailed(type(err).__name__) from None
