"""Canonical targets (docs/engine.md): one spelling per target, so aliases cannot dodge a rule.

Every proposal's target is canonicalized before any rule runs; the canonical target of a
call is the string `"<tool> <target>"` (plus one line `"<role> <target>"` per further
target the tool takes by role, `canonical_call`). Forms, after NFKC and Unicode-digit folding:

- ``""`` for a tool that takes no target: ``-``;
- ``CURRENT_USER`` or ``principal:<id>``: ``principal:<caller>``; any other principal is
  refused with `cross_principal_target` (BRAH I-4);
- an absolute path ``/a/./b/../c``: ``.``/``..`` resolved lexically (never above ``/``),
  empty segments dropped, NUL and control characters refused;
- ``file:`` URIs become the path they name (host empty or ``localhost``);
- ``mailto:`` one address, ``mailto:local@domain``, the domain as a canonical host (IDNA,
  lower case), the local part as written; header fields and address lists are refused;
- ``iban:`` an IBAN without spaces, upper case, its check digits verified (`iban_and_tel_forms`);
- ``tel:`` a global number in E.164, ``tel:+<digits>``, separators removed (`iban_and_tel_forms`);
- ``account:<issuer>/<number>`` an account number that is not an IBAN, only letter case
  folded (`account_form`);
- any other URI (RFC 3986 §6.2): scheme and host lower-cased, IDNA host (UTS 46, A-labels),
  IPv4/IPv6 literals in their one standard spelling, default port dropped, percent-encoding
  normalized (unreserved decoded, the rest upper-case hex, non-ASCII encoded as UTF-8),
  dot segments removed, empty path ``/`` when there is an authority, empty query and
  fragment dropped. User information is refused (it carries credentials and is the
  classic ``https://bank.example@evil.example`` disguise), as are raw characters RFC 3986
  does not allow and query keys that name a principal or recipient.

On chains with `escapes_controls` a control, format or line-separator character in a path
or a URI's path or query is written as its ``%XX`` escape instead of refused.

A path segment ``CURRENT_USER`` binds to the caller as well. Anything else that cannot be
canonicalized is refused with `malformed_target`. The library parsers (`rfc3986` for the
RFC 3986 appendix-B split and its dot-segment removal and validation, `idna` for UTS 46 and
A-labels) do the standard parts; the strictness around them is ours, because both
libraries are lenient in ways that would let two spellings of one target survive.
Both are imported where they are first needed, not with this module: the commonest target
takes a fast path that needs neither (`_already_canonical_web_uri`), and their import cost
every sidecar process about 40 ms of CPU at start (docs/development.md, the test job's time).
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import re
import unicodedata
from typing import Any

from quorumgate.proto import limits, names
from quorumgate.proto.chainversions import (
    CANONICAL_VERSION_NEW,
    CANONICAL_VERSIONS,  # noqa: F401 (importers read the versions `version` takes here)
    account_form,
    escapes_controls,
    iban_and_tel_forms,
    strict_forms,
)
from quorumgate.proto.model import Reason
from quorumgate.sidecar.engine.unicode_assigned import ASSIGNED_RANGES, UNICODE_VERSION

# The chain's canonical forms (EngineConfig.canonical_version, fixed at `init`): what each
# version turns on is proto/chainversions.py's table; here, `strict_forms` (one order of
# operations, refusals rather than merges, only characters assigned in UNICODE_VERSION)
# and `iban_and_tel_forms` (a chain without them reads `iban:`/`tel:` as generic URIs).
CANONICAL_VERSION_LATEST = CANONICAL_VERSION_NEW
_ASSIGNED_FIRSTS = [first for first, _ in ASSIGNED_RANGES]

NO_TARGET = "-"
# Stands in for the target of a call that was refused before its target could be
# canonicalized (an unknown tool, a malformed target): no canonical target starts with "!".
UNCHECKED_TARGET = "!"
PRINCIPAL_SCHEME = "principal"
FILE_SCHEME = "file"
MAILTO_SCHEME = "mailto"
IBAN_SCHEME = "iban"
TEL_SCHEME = "tel"
ACCOUNT_SCHEME = "account"
# `account:<issuer>/<number>` (canonical version 4): the issuer a lower-case name of ASCII
# letters, digits, `.` and `-` (a bank code, a BIC, a domain: as the issuer writes it),
# the number ASCII letters and digits, upper-cased, with single `-` inside. Separators
# are not removed: an opaque number's structure is unknown, so `123-4567` and
# `1234-567` may be two accounts and stay two targets; a space is refused.
ACCOUNT_ISSUER_RE = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,62}[a-z0-9])?")
ACCOUNT_NUMBER_RE = re.compile(r"[A-Z0-9]+(?:-[A-Z0-9]+)*")
ACCOUNT_NUMBER_CHARS_MAX = 34  # the longest IBAN: no account number we know is longer
# ISO 13616: country code, two check digits, a BBAN of 11 to 30 letters and digits (the
# shortest IBAN in use has 15 characters, the longest allowed 34). The per-country
# lengths are not checked: that table changes, and verdicts must not depend on its edition.
IBAN_RE = re.compile(r"[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}")
# E.164: `+`, a country code that does not start with 0, at most 15 digits in all; fewer
# than 7 is no subscriber number anywhere. Which numbers are assigned is not checked.
E164_RE = re.compile(r"\+[1-9][0-9]{6,14}")
TEL_VISUAL_SEPARATORS = "-.() "  # RFC 3966 §5.1.1, and the spaces people write
# RFC 5322 dot-atom characters of a local part (quoted local parts are refused).
LOCAL_PART_RE = re.compile(r"[A-Za-z0-9!#$&'*+/=^_`{|}~-]+(?:\.[A-Za-z0-9!#$&'*+/=^_`{|}~-]+)*")
LOCAL_PART_CHARS_MAX = 64

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}
AUTHORITY_REQUIRED = frozenset(DEFAULT_PORTS)
HOST_CHARS_MAX = 253
LABEL_RE = re.compile(r"[a-z0-9_-]{1,63}")
SCHEME_PREFIX_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
HEX = "0123456789ABCDEFabcdef"
UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
SUB_DELIMS = frozenset("!$&'()*+,;=")
PATH_CHARS = UNRESERVED | SUB_DELIMS | frozenset(":@/")
QUERY_CHARS = PATH_CHARS | frozenset("?")
# Control, format (zero-width and bidi overrides), surrogate, private-use, unassigned,
# line and paragraph separators: none of them has a place in a target.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
# Canonical version 4 (`escapes_controls`): in a name (a path, a URI's path or query) these
# are written as `%XX` of their UTF-8 octets instead of refusing the target, so a channel
# an attacker named with a newline can still be worked on; the rest stay refused.
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


@functools.cache
def _validator() -> Any:
    from rfc3986.validators import Validator  # type: ignore[import-untyped]

    return (
        Validator()
        .require_presence_of("scheme")
        .check_validity_of("scheme", "userinfo", "host", "port", "path", "query", "fragment")
    )


class TargetRefused(Exception):
    """A target that has no canonical form for this caller and tool."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _malformed(detail: str) -> TargetRefused:
    return TargetRefused(Reason.MALFORMED_TARGET, detail)


def canonical_call(
    tool: str, target: str, further_targets: tuple[tuple[str, str], ...] = ()
) -> str:
    """The canonical target of a call is `"<tool> <target>"`, then one line `"<role>
    <target>"` per further target, sorted (no canonical target holds a line break, so the
    lines cannot be confused)."""
    head = f"{tool} {target}"
    if not further_targets:
        return head
    return head + "".join(f"\n{role} {each}" for role, each in sorted(further_targets))


def split_call(tool: str, canonical: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The main target and the further (role, target) pairs of a canonical call of `tool`."""
    head, *lines = canonical.split("\n")
    further = tuple((role, each) for role, _, each in (line.partition(" ") for line in lines))
    return head[len(tool) + 1 :], further


def canonicalize_target(
    raw: str,
    *,
    principal: str,
    schemes: tuple[str, ...],
    binds_caller: bool = False,
    version: int = CANONICAL_VERSION_LATEST,
    optional: bool = False,
) -> str:
    """The canonical target for `principal` calling a tool that accepts `schemes`, in the
    chain's canonical `version`; `optional`: an empty target is no target (`-`).

    Raises TargetRefused with the reason code; never any other exception on any input.
    """
    strict = strict_forms(version)
    escape = escapes_controls(version)
    text = _prepare_strict(raw, escape) if strict else _prepare(raw)
    if binds_caller:
        # A status tool takes no identity; it is bound to the caller (the BRAH paper, §7.3).
        if text == "":
            return f"{PRINCIPAL_SCHEME}:{principal}"
        if _is_principal_ref(text):
            return _principal_ref(text, principal)
        raise _malformed("a status tool takes no target")
    if text == "":
        if schemes and not optional:
            raise _malformed("this tool needs a target")
        return NO_TARGET
    if not schemes:
        raise TargetRefused(Reason.TARGET_SCHEME_NOT_ALLOWED, "this tool takes no target")
    if _is_principal_ref(text):
        _require_scheme(PRINCIPAL_SCHEME, schemes)
        return _principal_ref(text, principal)
    if text.startswith("/"):
        if text.startswith("//"):
            # RFC 3986 §4.2 reads this as a scheme-relative reference to a host
            raise _malformed("ambiguous: a network-path reference, not a path")
        _require_scheme(FILE_SCHEME, schemes)
        if strict:
            return _strict_path(text, principal, escape)
        return _path(text, principal)
    fast = _already_canonical_web_uri(text, schemes)
    if fast is not None:
        return fast
    match = SCHEME_PREFIX_RE.match(text)
    if match is None:
        raise _malformed("not an absolute URI, path or principal reference")
    scheme = match.group(1).lower()
    _require_scheme(scheme, schemes)
    if scheme == FILE_SCHEME:
        return _file_uri(text, principal, strict, escape)
    if scheme == MAILTO_SCHEME and strict:
        return _mailto(text[len(match.group(0)) :])
    if scheme == IBAN_SCHEME and iban_and_tel_forms(version):
        return _iban(text[len(match.group(0)) :])
    if scheme == TEL_SCHEME and iban_and_tel_forms(version):
        return _tel(text[len(match.group(0)) :])
    if scheme == ACCOUNT_SCHEME and account_form(version):
        return _account(text[len(match.group(0)) :])
    return _uri(text, scheme, principal, strict, escape)


# The commonest target, an http(s) URI already in canonical form: lower-case ASCII host of
# letter-digit-hyphen labels (no A-labels, not numeric), no port, no user information,
# query, fragment or percent-encoding, and a path of plain segments (no empty, `.`, `..`
# or CURRENT_USER segment). For such a string the general path below returns it unchanged
# (plus `/` for an empty path); this skips the parsers. tests/engine/test_targets.py checks
# that both agree on generated URIs.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
FAST_WEB_URI_RE = re.compile(
    rf"(https?)://((?:{_LABEL}\.)*{_LABEL})((?:/[A-Za-z0-9\-_~!$&'()*+,;=:@]+)*)/?"
)


def _already_canonical_web_uri(text: str, schemes: tuple[str, ...]) -> str | None:
    match = FAST_WEB_URI_RE.fullmatch(text)
    if match is None:
        return None
    scheme, host, path = match.groups()
    if scheme not in schemes:
        return None
    labels = host.split(".")
    if any(label.startswith("xn--") for label in labels) or len(host) > HOST_CHARS_MAX:
        return None
    last = labels[-1]
    if not any("a" <= ch <= "z" for ch in last) or last.startswith("0x"):
        return None  # numeric hosts have IPv4 rules of their own
    segments = path.split("/")[1:]
    current_user = names.CURRENT_USER.casefold()
    if any(seg in (".", "..") or seg.casefold() == current_user for seg in segments):
        return None
    return text if text.endswith("/") or path else text + "/"


def _require_scheme(scheme: str, schemes: tuple[str, ...]) -> None:
    if scheme not in schemes:
        raise TargetRefused(Reason.TARGET_SCHEME_NOT_ALLOWED, "scheme not allowed for tool")


def _prepare(raw: str) -> str:
    if len(raw) > 4 * limits.TARGET_CHARS_MAX:
        raise _malformed("too long")
    text = names.ascii_digits(unicodedata.normalize("NFKC", raw))
    _refuse_controls(text)  # before trimming: str.strip() would eat \x1c-\x1f and \x85
    text = text.strip(" ")
    if len(text) > limits.TARGET_CHARS_MAX:
        raise _malformed("too long")
    return text


def _prepare_strict(raw: str, escape: bool = False) -> str:
    """Strict forms: nothing is folded before decoding; what is here is checked and put in
    NFC (canonical equivalents are one character), and anything compatibility
    normalization would change is refused (`_check_value`)."""
    if len(raw) > 4 * limits.TARGET_CHARS_MAX:
        raise _malformed("too long")
    text = _check_value(raw, escape)
    text = text.strip(" ")
    if len(text) > limits.TARGET_CHARS_MAX:
        raise _malformed("too long")
    return text


def _check_value(text: str, escape: bool = False) -> str:
    """The strict forms' character rules for any decoded part of a target, returning its NFC:
    no control, invisible or unassigned (in the pinned Unicode version) character, no
    backslash or NUL, no compatibility character that NFKC would change (fullwidth forms,
    ligatures, superscripts, ...) and no digit but ASCII's. With `escape`, controls, format
    characters and line separators pass (`_escape_controls` writes them later)."""
    if "\\" in text or "\x00" in text:
        raise _malformed("backslash or NUL")
    if escape:
        _refuse_unescapable(text)
    else:
        _refuse_controls(text)
    if text.isascii():
        return text
    for ch in text:
        if not ch.isascii() and not _assigned(ord(ch)):
            raise _malformed(f"a character not assigned in Unicode {UNICODE_VERSION}")
        if unicodedata.category(ch) == "Nd" and not ch.isascii():
            raise _malformed("a digit other than 0-9")
    nfc = unicodedata.normalize("NFC", text)
    if unicodedata.normalize("NFKC", nfc) != nfc:
        raise _malformed("a compatibility character (fullwidth, ligature, ...)")
    return nfc


def _assigned(code_point: int) -> bool:
    k = bisect.bisect_right(_ASSIGNED_FIRSTS, code_point) - 1
    return k >= 0 and code_point <= ASSIGNED_RANGES[k][1]


def _strict_path(text: str, principal: str, escape: bool = False) -> str:
    """Strict forms: a path decoded and checked, resolved, and its `%` written `%25`, so
    that the canonical form is itself a target that canonicalizes to itself. A segment
    that begins or ends with a space is refused (`report.pdf ` is not `report.pdf`, and
    one would be taken for the other)."""
    decoded = _check_value(_percent_decode(text), escape)
    if any(seg != seg.strip(" ") for seg in decoded.split("/")):
        raise _malformed("a path segment beginning or ending with a space")
    out = _path(decoded, principal).replace("%", "%25")
    if not escape:
        return out
    out = _escape_controls(out)  # after `%` became `%25`: every other `%` is an escape
    if len(out) > limits.TARGET_CHARS_MAX:
        raise _malformed("too long")
    return out


def _escape_controls(text: str) -> str:
    """Every character of ESCAPED_CATEGORIES as `%XX` of its UTF-8 octets, upper-case."""
    if text.isprintable() and text.isascii():
        return text
    out: list[str] = []
    for ch in text:
        if unicodedata.category(ch) in ESCAPED_CATEGORIES:
            out.append("".join(f"%{byte:02X}" for byte in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)


def _refuse_unescapable(text: str) -> None:
    """What no escape makes a name: surrogates, private use, unassigned code points."""
    if text.isascii():
        return
    for ch in text:
        if unicodedata.category(ch) in REFUSED_CATEGORIES - ESCAPED_CATEGORIES:
            raise _malformed("a surrogate, private-use or unassigned character")


def _refuse_controls(text: str) -> None:
    if text.isascii():
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
            raise _malformed("control character")
        return
    for ch in text:
        if unicodedata.category(ch) in REFUSED_CATEGORIES:
            raise _malformed("control or invisible character")


# ----------------------------------------------------------------------- principals


def _is_principal_ref(text: str) -> bool:
    folded = text.casefold()
    return folded == names.CURRENT_USER.casefold() or folded.startswith(PRINCIPAL_SCHEME + ":")


def _principal_ref(text: str, principal: str) -> str:
    """CURRENT_USER binds to the authenticated principal; no other principal is reachable."""
    folded = names.fold(text)
    if folded != names.CURRENT_USER.casefold():
        named = folded[len(PRINCIPAL_SCHEME) + 1 :]
        if named != names.CURRENT_USER.casefold() and named != principal:
            if not names.is_agent_id(named):
                raise _malformed("not a principal id")
            raise TargetRefused(Reason.CROSS_PRINCIPAL_TARGET, "names another principal")
    return f"{PRINCIPAL_SCHEME}:{principal}"


def _bind_segment(segment: str, principal: str) -> str:
    return principal if segment.casefold() == names.CURRENT_USER.casefold() else segment


# ----------------------------------------------------------------------- paths


def _path(text: str, principal: str) -> str:
    """An absolute path with `.` and `..` resolved lexically; `..` never climbs above `/`."""
    if "\x00" in text:
        raise _malformed("NUL in path")
    segments: list[str] = []
    for segment in text.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(_bind_segment(segment, principal))
    out = "/" + "/".join(segments)
    if len(out) > limits.TARGET_CHARS_MAX:
        raise _malformed("too long")
    return out


def _file_uri(text: str, principal: str, strict: bool = False, escape: bool = False) -> str:
    from rfc3986 import misc  # type: ignore[import-untyped]

    parts = misc.URI_MATCHER.match(text)
    assert parts is not None  # the RFC 3986 appendix-B expression matches every string
    authority = parts.group("authority")
    if authority is not None and authority.casefold() not in ("", "localhost"):
        raise _malformed("file URI with a remote host")
    if parts.group("query") is not None:
        raise _malformed("file URI with a query")
    if strict:
        raw_path = parts.group("path") or ""
        if not raw_path.startswith("/"):
            raise _malformed("file URI without an absolute path")
        return _strict_path(raw_path, principal, escape)
    else:
        path = _percent_decode(parts.group("path") or "")
        path = names.ascii_digits(unicodedata.normalize("NFKC", path))
        _refuse_controls(path)
    if not path.startswith("/"):
        raise _malformed("file URI without an absolute path")
    return _path(path, principal)


def _percent_decode(text: str) -> str:
    raw = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "%":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in HEX for c in pair):
                raise _malformed("bad percent-encoding")
            raw.append(int(pair, 16))
            i += 3
        else:
            raw.extend(ch.encode("utf-8"))
            i += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed("percent-encoding is not UTF-8") from None


# ----------------------------------------------------------------------- mailto


def _mailto(rest: str) -> str:
    """One address: `mailto:local@domain`, the domain in its canonical host spelling
    (IDNA, lower case), the local part as written (RFC 5321: it is the receiving host's to
    interpret). Header fields (`?cc=...`, `?to=...`, `?bcc=...`) and several addresses
    are refused: each recipient is a target of its own, judged by the rules."""
    if "?" in rest or "," in rest or "#" in rest:
        raise _malformed("mailto: one address, no header fields")
    address = _percent_decode(rest)
    local, at, domain = address.rpartition("@")
    if not at or LOCAL_PART_RE.fullmatch(local) is None or len(local) > LOCAL_PART_CHARS_MAX:
        raise _malformed("mailto: not an address")
    return f"{MAILTO_SCHEME}:{local}@{_host(domain, strict=True)}"


# ----------------------------------------------------------------------- iban, tel


def _iban(rest: str) -> str:
    """`iban:` and an IBAN (ISO 13616), spaces removed and letters upper-cased; the check
    digits must hold (ISO 7064 MOD 97-10), so a typo names no account at all."""
    if not rest.isascii():
        raise _malformed("iban: letters A-Z and digits only")
    compact = rest.replace(" ", "").upper()
    if IBAN_RE.fullmatch(compact) is None:
        raise _malformed("iban: not an IBAN (country, check digits, 11-30 letters/digits)")
    rearranged = compact[4:] + compact[:4]
    if int("".join(str(int(ch, 36)) for ch in rearranged)) % 97 != 1:
        raise _malformed("iban: the check digits do not match")
    return f"{IBAN_SCHEME}:{compact}"


def _tel(rest: str) -> str:
    """`tel:` and a global number in E.164 (`tel:+4930123456`): visual separators removed;
    local numbers, parameters (`;ext=`, `;phone-context=`) and anything else are refused."""
    number = rest
    for separator in TEL_VISUAL_SEPARATORS:
        number = number.replace(separator, "")
    if not number.isascii() or E164_RE.fullmatch(number) is None:
        raise _malformed("tel: a global number, + and 7 to 15 digits, no parameters")
    return f"{TEL_SCHEME}:{number}"


def _account(rest: str) -> str:
    """`account:<issuer>/<number>`: the issuer lower-cased, the number upper-cased, both
    ASCII (ACCOUNT_ISSUER_RE, ACCOUNT_NUMBER_RE); nothing else is folded or removed, so
    two spellings merge only when they differ in letter case."""
    issuer, slash, number = rest.partition("/")
    if not slash or not rest.isascii():
        raise _malformed("account: an issuer, `/`, a number (ASCII letters and digits)")
    issuer, number = issuer.lower(), number.upper()
    if ACCOUNT_ISSUER_RE.fullmatch(issuer) is None or ".." in issuer:
        raise _malformed("account: the issuer is letters, digits, `.` and `-`")
    if len(number) > ACCOUNT_NUMBER_CHARS_MAX or ACCOUNT_NUMBER_RE.fullmatch(number) is None:
        raise _malformed("account: the number is letters and digits, single `-` inside")
    return f"{ACCOUNT_SCHEME}:{issuer}/{number}"


# ----------------------------------------------------------------------- URIs


def _uri(text: str, scheme: str, principal: str, strict: bool = False, escape: bool = False) -> str:
    from rfc3986 import exceptions, misc, normalizers, uri_reference  # mypy: once, above

    parts = misc.URI_MATCHER.match(text)
    assert parts is not None  # the RFC 3986 appendix-B expression matches every string
    authority = parts.group("authority")
    if strict:
        path = _normalize_percent_strict(parts.group("path") or "", PATH_CHARS, escape)
        query = _normalize_percent_strict(parts.group("query") or "", QUERY_CHARS, escape)
    else:
        path = _normalize_percent(parts.group("path") or "", PATH_CHARS)
        query = _normalize_percent(parts.group("query") or "", QUERY_CHARS)
    # the fragment never reaches the server: dropped (RFC 3986 §6.2.3)
    out = scheme + ":"
    if authority is not None:
        out += "//" + _authority(authority, scheme, strict)
        path = normalizers.remove_dot_segments(path) or "/"
    else:
        if scheme in AUTHORITY_REQUIRED:
            raise _malformed("URI without a host")
        if path.startswith("/"):
            path = normalizers.remove_dot_segments(path)
        if path.startswith("//"):
            raise _malformed("path would read as an authority")
    if path.startswith("/"):
        path = "/".join(_bind_segment(segment, principal) for segment in path.split("/"))
    out += path
    if query:
        _refuse_ambient_query_keys(query)
        out += "?" + query
    if len(out) > limits.TARGET_CHARS_MAX:
        raise _malformed("too long")
    # Belt and braces: what we produce must be a valid absolute URI for rfc3986 as well.
    try:
        _validator().validate(uri_reference(out))
    except exceptions.ValidationError:
        raise _malformed("not a valid URI") from None
    return out


def _normalize_percent(component: str, allowed: frozenset[str]) -> str:
    """RFC 3986 §6.2.2.2 and RFC 3987 §3.1: decode unreserved, upper-case the rest,
    encode non-ASCII as UTF-8; any other character that RFC 3986 does not allow is refused."""
    out: list[str] = []
    i = 0
    while i < len(component):
        ch = component[i]
        if ch == "%":
            pair = component[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in HEX for c in pair):
                raise _malformed("bad percent-encoding")
            decoded = chr(int(pair, 16))
            out.append(decoded if decoded in UNRESERVED else "%" + pair.upper())
            i += 3
            continue
        if not ch.isascii():
            out.extend(f"%{byte:02X}" for byte in ch.encode("utf-8"))
        elif ch in allowed:
            out.append(ch)
        else:
            raise _malformed("character not allowed in a URI")
        i += 1
    return "".join(out)


def _normalize_percent_strict(component: str, allowed: frozenset[str], escape: bool = False) -> str:
    """Strict forms, one order of operations: decode what percent-encodes unreserved ASCII
    or UTF-8 text, put the text in NFC and check it (`_check_value`), then encode it again
    the one way — unreserved characters as they are, every other octet upper-case `%XX`.
    Encoded reserved ASCII (`%2F`, `%3F`, ...) stays encoded: it means something else
    than the character itself (RFC 3986 §2.2). With `escape` (canonical version 4) a
    control character, raw or encoded, is kept as its `%XX` escape instead of refused, and
    a format or separator character is encoded like any non-ASCII one."""
    pieces: list[str] = []  # text, with kept escapes as "%XX" (ASCII, so NFC leaves them)
    i = 0
    while i < len(component):
        ch = component[i]
        if ch != "%":
            if ch.isascii() and ch not in allowed:
                if not (escape and _is_ascii_control(ch)):
                    raise _malformed("character not allowed in a URI")
                ch = f"%{ord(ch):02X}"
            pieces.append(ch)
            i += 1
            continue
        octets = bytearray()
        while i < len(component) and component[i] == "%":
            pair = component[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in HEX for c in pair):
                raise _malformed("bad percent-encoding")
            octets.append(int(pair, 16))
            i += 3
        try:
            decoded = octets.decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed("percent-encoding is not UTF-8") from None
        for dch in decoded:
            if dch.isascii() and dch not in UNRESERVED:
                if dch in "\x00\\" or (_is_ascii_control(dch) and not escape):
                    raise _malformed("an encoded control character, NUL or backslash")
                pieces.append(f"%{ord(dch):02X}")
            else:
                pieces.append(dch)
    text = _check_value("".join(pieces), escape)
    out: list[str] = []
    for ch in text:
        out.append(ch if ch.isascii() else "".join(f"%{b:02X}" for b in ch.encode("utf-8")))
    return "".join(out)


def _is_ascii_control(ch: str) -> bool:
    return ch != "\x00" and (ord(ch) < 0x20 or ch == "\x7f")


def _refuse_ambient_query_keys(query: str) -> None:
    """Query parameters are arguments too: one naming a principal is refused (§4.1)."""
    for pair in re.split(r"[&;]", query):
        key = _percent_decode(pair.split("=", 1)[0])
        canonical = names.canonical_argument_name(key)
        if canonical is not None and names.is_ambient_identity_name(canonical):
            raise TargetRefused(Reason.AMBIENT_IDENTITY_ARGUMENT, "query names a principal")


def _authority(authority: str, scheme: str, strict: bool = False) -> str:
    if "@" in authority:
        raise _malformed("user information in URI")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise _malformed("unterminated IP literal")
        host = _ipv6_literal(authority[1:end])
        rest = authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise _malformed("junk after IP literal")
        port_text = rest[1:] if rest else ""
    else:
        host_text, _, port_text = authority.partition(":")
        host = _host(host_text, strict)
    if not host and scheme in AUTHORITY_REQUIRED:
        raise _malformed("empty host")
    return host + _port(port_text, scheme)


def _port(text: str, scheme: str) -> str:
    if text == "":
        return ""
    if not text.isascii() or not text.isdigit() or len(text) > 5:
        raise _malformed("bad port")
    port = int(text)
    if port > 65535:
        raise _malformed("bad port")
    if DEFAULT_PORTS.get(scheme) == port:
        return ""
    return f":{port}"


def _ipv6_literal(inner: str) -> str:
    if inner[:1] in ("v", "V") or "%" in inner:
        raise _malformed("IPvFuture and zone identifiers are not accepted")
    try:
        address = ipaddress.IPv6Address(inner)
    except ValueError:
        raise _malformed("bad IPv6 literal") from None
    return f"[{address.compressed}]"


def canonical_host(raw: str) -> str | None:
    """The canonical spelling of a host name or address, None if it has none."""
    try:
        return _host(raw) if raw else None
    except TargetRefused:
        return None


def _host(raw: str, strict: bool = False) -> str:
    import idna

    if raw == "":
        return ""
    decoded = _percent_decode(raw)
    if strict:
        decoded = _check_value(decoded)
    _refuse_controls(decoded)
    try:
        host = idna.uts46_remap(decoded, std3_rules=False, transitional=False)
    except (idna.IDNAError, UnicodeError, ValueError):
        raise _malformed("host has no IDNA mapping") from None
    if host.endswith("."):
        host = host[:-1]  # the root label: `example.com.` is `example.com`
    labels = host.split(".")
    if len(host) > HOST_CHARS_MAX or any(label == "" for label in labels):
        raise _malformed("bad host")
    last = labels[-1]
    if last.isdigit() or last.startswith("0x") or host.replace(".", "").isdigit():
        # WHATWG reads hosts ending in a number as IPv4 (octal, hex, short forms): only
        # the dotted-quad spelling is accepted, so there is one spelling per address.
        try:
            return str(ipaddress.IPv4Address(host))
        except ValueError:
            raise _malformed("ambiguous numeric host") from None
    return ".".join(_label(label) for label in labels)


def _label(label: str) -> str:
    import idna

    try:
        if label.isascii():
            if label.startswith("xn--"):
                # an A-label must be the canonical encoding of a valid U-label
                if idna.alabel(idna.ulabel(label)).decode("ascii") != label:
                    raise _malformed("non-canonical A-label")
                return label
            if LABEL_RE.fullmatch(label) is None:
                raise _malformed("bad host label")
            return label
        return str(idna.alabel(label).decode("ascii"))
    except (idna.IDNAError, UnicodeError, ValueError):
        raise _malformed("bad internationalized host label") from None
