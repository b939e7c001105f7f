"""Canonical names: tool names, identifiers, argument names, handles (docs/engine.md).

Standard library only, so that the transaction codec can use it without pulling in the
URI machinery. Every function here is total: it returns the canonical form or `None`,
and never raises on remote input.
"""

from __future__ import annotations

import re
import unicodedata

from quorumgate.proto import limits

_ID_TAIL = limits.ID_CHARS_MAX - 1
_TOOL_TAIL = limits.TOOL_NAME_CHARS_MAX - 1
_KIND_TAIL = limits.KIND_CHARS_MAX - 1
_ARG_TAIL = limits.ARGUMENT_NAME_CHARS_MAX - 1

AGENT_ID_RE = re.compile(rf"[a-z0-9][a-z0-9._-]{{0,{_ID_TAIL}}}")
RUN_ID_RE = re.compile(rf"[A-Za-z0-9._:-]{{1,{limits.RUN_ID_CHARS_MAX}}}")
TOOL_NAME_RE = re.compile(rf"[a-z0-9][a-z0-9._:/-]{{0,{_TOOL_TAIL}}}")
SCHEME_RE = re.compile(r"[a-z][a-z0-9+.-]{0,31}")
KIND_RE = re.compile(rf"[a-z][a-z0-9_]{{0,{_KIND_TAIL}}}")
ARGUMENT_NAME_RE = re.compile(rf"[a-z0-9_][a-z0-9_.-]{{0,{_ARG_TAIL}}}")
HANDLE_RE = re.compile(rf"h_([a-z][a-z0-9_]{{0,{_KIND_TAIL}}})_([0-9a-f]{{16}})")
SET_NAME_RE = re.compile(rf"[a-z][a-z0-9_]{{0,{limits.SET_NAME_CHARS_MAX - 1}}}")
# The role of a further target (recipient, grantee, member...); "target" is the main one.
ROLE_RE = re.compile(rf"[a-z][a-z0-9_]{{0,{limits.ROLE_CHARS_MAX - 1}}}")
MAIN_TARGET_ROLE = "target"
# A plain decimal number in ASCII digits: what an argument ceiling compares (no sign, no
# exponent, no grouping; "0500" is 500).
DECIMAL_RE = re.compile(r"([0-9]+)(?:\.([0-9]+))?")

# The BRAH paper, §6.2 (rule AST-01): arguments that designate a recipient or a principal
# are refused, never rewritten, since an agent that names whom it acts on can act on anyone.
# Names are compared after NFKC case folding with the separators `_`, `-` and `.` removed,
# so `chatId`, `chat-id` and `CHAT_ID` are one name.
AMBIENT_IDENTITY_EXACT = frozenset(
    {
        "to", "cc", "bcc", "recipient", "recipients", "peer", "user", "customer", "chat",
        "channel", "principal", "sender",
    }
)  # fmt: skip
AMBIENT_IDENTITY_STEMS = (
    "chatid", "peerid", "userid", "customerid", "channelid", "accountid", "principalid",
    "memberid", "recipient", "username", "useremail", "userphone",
)  # fmt: skip
# The BRAH paper's rule AST-07: raw values of these kinds must travel as envelope handles,
# since a value in a block stays in every replica's log for good (docs/engine.md).
RAW_SECRET_NAMES = frozenset(
    {
        "phone", "phonenumber", "token", "accesstoken", "apikey", "password", "passphrase",
        "secret", "privatekey", "iban", "card", "cardnumber", "ssn", "nationalid",
    }
)  # fmt: skip

CURRENT_USER = "CURRENT_USER"


def ascii_digits(text: str) -> str:
    """Map every Unicode decimal digit (any Nd block: Arabic-Indic, Devanagari, ...) to ASCII."""
    if text.isascii():
        return text
    out: list[str] = []
    for ch in text:
        if unicodedata.category(ch) == "Nd":
            out.append(str(unicodedata.decimal(ch)))
        else:
            out.append(ch)
    return "".join(out)


def fold(text: str) -> str:
    """NFKC case folding with Unicode digits mapped to ASCII and surrounding space removed."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return ascii_digits(folded).strip()


def canonical_tool_name(raw: str) -> str | None:
    """NFKC, case-folded, trimmed; then it must be a plain ASCII name.

    Requiring ASCII after folding turns homoglyph spellings (a Cyrillic letter for its Latin twin)
    into an unknown tool instead of a second name for a registered one.
    """
    if len(raw) > 4 * limits.TOOL_NAME_CHARS_MAX:
        return None
    name = fold(raw)
    if TOOL_NAME_RE.fullmatch(name) is None:
        return None
    return name


def canonical_argument_name(raw: str) -> str | None:
    if len(raw) > 4 * limits.ARGUMENT_NAME_CHARS_MAX:
        return None
    name = fold(raw)
    if ARGUMENT_NAME_RE.fullmatch(name) is None:
        return None
    return name


def _squash(name: str) -> str:
    return name.replace("_", "").replace("-", "").replace(".", "")


def is_ambient_identity_name(canonical_name: str) -> bool:
    """True when an argument (or query key) names a principal or a recipient."""
    squashed = _squash(canonical_name)
    if squashed in AMBIENT_IDENTITY_EXACT:
        return True
    return any(stem in squashed for stem in AMBIENT_IDENTITY_STEMS)


def is_raw_secret_name(canonical_name: str) -> bool:
    return _squash(canonical_name) in RAW_SECRET_NAMES


def is_agent_id(text: str) -> bool:
    return AGENT_ID_RE.fullmatch(text) is not None


def is_run_id(text: str) -> bool:
    return RUN_ID_RE.fullmatch(text) is not None


def is_kind(text: str) -> bool:
    return KIND_RE.fullmatch(text) is not None


def is_set_name(text: str) -> bool:
    return SET_NAME_RE.fullmatch(text) is not None


def is_role(text: str) -> bool:
    """A further target's role: lower-case, and never the main target's own name."""
    return ROLE_RE.fullmatch(text) is not None and text != MAIN_TARGET_ROLE


def is_decimal(text: str) -> bool:
    return DECIMAL_RE.fullmatch(text) is not None and len(text) <= limits.RULE_NUMBER_DIGITS_MAX + 1


def decimal_at_most(value: str, ceiling: str) -> bool:
    """`value <= ceiling` for two `is_decimal` strings, exactly (integers, no floats)."""
    a, b = DECIMAL_RE.fullmatch(value), DECIMAL_RE.fullmatch(ceiling)
    assert a is not None and b is not None, "decimal_at_most takes is_decimal strings"
    a_frac, b_frac = a.group(2) or "", b.group(2) or ""
    width = max(len(a_frac), len(b_frac))
    left = int(a.group(1) + a_frac.ljust(width, "0"))
    right = int(b.group(1) + b_frac.ljust(width, "0"))
    return left <= right


def is_scheme(text: str) -> bool:
    return SCHEME_RE.fullmatch(text) is not None


def handle_kind(handle: str) -> str | None:
    """The kind encoded in a well-formed handle `h_<kind>_<16 hex>`, else None."""
    match = HANDLE_RE.fullmatch(handle)
    return None if match is None else match.group(1)
