"""Values shaped like secrets (docs/engine.md, "Secrets only in envelopes").

A secret that reaches a block stays in every replica's log forever, readable by everyone
who may read the log. So a value that looks like one — in a target or a plain argument —
is refused (`secret_in_plaintext`); secrets travel as envelope handles (`SealEnvelope`). The shapes:

- payment card numbers: 13 to 19 digits standing on their own (spaces or dashes between
  groups allowed; not inside a longer token such as a hex id) with a card brand's leading
  digits and a valid Luhn check digit;
- API keys and tokens of well-known formats (Stripe `sk_live_`/`rk_live_`, GitHub
  `ghp_`/`gho_`/`ghs_`/`github_pat_`, Slack `xox?-`, AWS `AKIA`/`ASIA` key ids, Google
  `AIza`, OpenAI and Anthropic `sk-`/`sk-ant-`, JSON Web Tokens, PEM private keys);
- in a target, a query parameter named like a credential (`password`, `token`, `secret`,
  `api_key`, ... — `quorumgate.proto.names.RAW_SECRET_NAMES`).

Pure and deterministic: regular expressions over ASCII and integer arithmetic. It cannot
know every secret; it stops the ones with a shape, and says which shape, never the value.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from quorumgate.proto import names
from quorumgate.proto.model import Proposal, Reason

# Card brands by leading digits (ISO/IEC 7812 issuer ranges of the networks that matter):
# Visa 4; Mastercard 51-55, 2221-2720; Amex 34, 37; Discover 6011, 644-649, 65;
# Diners 36, 300-305, 38, 39; JCB 3528-3589; UnionPay 62; Maestro 50, 56-58, 6.
_CARD_PREFIX_RE = re.compile(
    r"4|5[1-5]|2(?:22[1-9]|2[3-9]\d|[3-6]\d\d|7[01]\d|720)|3[47]|6011|64[4-9]|65|3(?:0[0-5]|[689])"
    r"|35(?:2[89]|[3-8]\d)|62|5[06-8]|6"
)
# A number standing on its own: not part of a longer token (a hex id or base64 text holds
# long digit runs that a Luhn check would pass one time in ten).
_DIGIT_RUN_RE = re.compile(r"(?<![0-9A-Za-z])[0-9](?:[ -]?[0-9]){12,18}(?![0-9A-Za-z])")
CARD_DIGITS_MIN = 13
CARD_DIGITS_MAX = 19

_TOKEN_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("stripe_key", re.compile(r"\b[sr]k_(?:live|test)_[0-9A-Za-z]{16,}")),
    ("github_token", re.compile(r"\b(?:gh[pousr]_[0-9A-Za-z]{30,}|github_pat_[0-9A-Za-z_]{40,})")),
    ("slack_token", re.compile(r"\bxox[abposr]-[0-9A-Za-z-]{10,}")),
    ("aws_key_id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    # `sk-` keys are long and hold digits; a URL slug such as `sk-products-and-services`
    # must not pass for one
    ("model_api_key", re.compile(r"\bsk-(?:ant-|proj-)?(?=[0-9A-Za-z_-]*[0-9])[0-9A-Za-z_-]{32,}")),
    ("jwt", re.compile(r"\beyJ[0-9A-Za-z_-]{8,}\.eyJ[0-9A-Za-z_-]{8,}\.[0-9A-Za-z_-]{8,}")),
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")),
)


def luhn_valid(digits: str) -> bool:
    total = 0
    for k, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if k % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _card_number(text: str) -> bool:
    for match in _DIGIT_RUN_RE.finditer(text):
        digits = match.group(0).replace(" ", "").replace("-", "")
        if not CARD_DIGITS_MIN <= len(digits) <= CARD_DIGITS_MAX:
            continue
        if _CARD_PREFIX_RE.match(digits) and luhn_valid(digits):
            return True
    return False


def secret_shape(text: str) -> str | None:
    """The name of the secret shape `text` contains, or None."""
    if _card_number(text):
        return "card_number"
    for name, pattern in _TOKEN_SHAPES:
        if pattern.search(text):
            return name
    return None


# Argument and query names that carry a credential where `refuses_plaintext_secrets`, beside
# `names.RAW_SECRET_NAMES` (compared squashed: `credit_card`, `Credit-Card`, `creditCard`).
CREDENTIAL_NAMES = frozenset(
    {"creditcard", "cardnum", "cvv", "cvv2", "cvc", "securitycode", "pin", "otp", "clientsecret"}
)


def name_is_credential(canonical_name: str) -> bool:
    squashed = canonical_name.replace("_", "").replace("-", "").replace(".", "")
    return names.is_raw_secret_name(canonical_name) or squashed in CREDENTIAL_NAMES


def _query_names_a_credential(target: str) -> bool:
    _, question, query = target.partition("?")
    if not question:
        return False
    for pair in re.split(r"[&;]", query):
        key = names.canonical_argument_name(unquote(pair.split("=", 1)[0]))
        if key is not None and name_is_credential(key):
            return True
    return False


def secret_in_target(target: str) -> bool:
    """A canonical target carrying a secret: a credential-named query parameter, or a
    secret shape anywhere in it (decoded)."""
    return _query_names_a_credential(target) or secret_shape(unquote(target)) is not None


def proposal_carries_secret(proposal: Proposal, envelope_args: tuple[str, ...]) -> Reason | None:
    """The checks admission makes on a proposal as submitted (its raw target and plain
    arguments), so that a raw secret is refused before it is ordered: a plain value for
    an argument the tool declares as an envelope, or named like a credential, is
    `envelope_required`; a value or target shaped like a secret `secret_in_plaintext`.
    Execution checks the canonical target and every argument again."""
    if secret_in_target(proposal.target) or any(
        secret_in_target(further.target) for further in proposal.targets
    ):
        return Reason.SECRET_IN_PLAINTEXT
    for arg in proposal.arguments:
        if arg.text is None:
            continue
        name = names.canonical_argument_name(arg.name)
        if name is not None and (name in envelope_args or name_is_credential(name)):
            return Reason.ENVELOPE_REQUIRED
        if secret_shape(arg.text):
            return Reason.SECRET_IN_PLAINTEXT
    return None
