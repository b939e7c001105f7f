"""Links inside text: the URIs, e-mail addresses and phone numbers a message carries.

A message's recipients are targets, but the link inside it is where a reader is sent: a
phishing link in a message to a known colleague is the attack, not the colleague. On
chains with `links_in_text` (docs/engine.md, "Links inside text") every argument a tool
declares as `text` is scanned with the one grammar below, and each link found is judged
as a further target in the `link` role.

The grammar, scanned left to right in one pass (each character is looked at a bounded
number of times, no regular expression, so no backtracking on any input):

- **web links** (RFC 3986 absolute URIs of the `http` and `https` schemes): `http://` or
  `https://` in any case, not preceded by a letter, digit, `+`, `-` or `.` (so `hxxp://`
  or `xhttp://` are not links), then every character up to white space, a control
  character or one of `<>"` and the backtick; non-ASCII letters are kept (RFC 3987 IRIs:
  an IDN host becomes its A-label when canonicalized). Trailing `.,;:!?'` and a closing
  `)` or `]` without its opening one inside the link are punctuation of the sentence,
  not part of the link. User information (`https://good.example@evil.example`) is
  dropped: the link goes to the host after the `@`, and that is the target judged.
- **bare web links**: `host/path` without a scheme, where the host is two or more
  labels of letters, digits and hyphens whose last label is letters only (`evil.example/
  login`): chat clients and mail readers make these clickable, so they count, read as
  `https://`. A bare name without a `/` (`report.pdf`, `e.g.`) does not.
- **e-mail addresses** (RFC 5322 `addr-spec`, dot-atom form only): a local part of
  dot-atom characters, `@`, a domain of two or more labels; read as `mailto:`.
- **phone numbers** (E.164): `+`, then digits and the visual separators ` -.()`, with
  7 to 15 digits; read as `tel:`. Numbers without `+` are not links (which country they
  dial is not in the text).

Defanged forms (`hxxp://`, `evil[.]example`) are not links: no client follows them, a
person would have to retype them. Pure functions, standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorumgate.proto import limits

WEB_PREFIXES = ("http://", "https://")
# The schemes a found link is canonicalized under, and the role it is judged in.
LINK_SCHEMES = ("http", "https", "mailto", "tel")
LINK_ROLE = "link"
# Before a scheme: a character that would make it part of a longer word or scheme.
SCHEME_GLUE = frozenset("+-.")
# What ends a web link: white space and controls are checked by code point below.
LINK_STOPS = frozenset('<>"`')
TRAILING_PUNCTUATION = ".,;:!?'"
CLOSERS = {")": "(", "]": "["}
LOCAL_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+/=?^_`{|}~-."
)
DOMAIN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-.")
PHONE_SEPARATORS = frozenset(" -.()")
PHONE_DIGITS_MIN = 7
PHONE_DIGITS_MAX = 15
# A link longer than a target may be is still scanned, then refused by the canonicalizer.
LINK_CHARS_MAX = 4 * limits.TARGET_CHARS_MAX


class TooManyLinks(Exception):
    """More links than LINKS_PER_ARGUMENT_MAX in one text: the call is refused whole."""


@dataclass(frozen=True)
class FoundLink:
    """One link as written in the text, with the scheme it is read in
    (`http`/`https` as written, `mailto`, `tel`) and the target text to canonicalize."""

    start: int
    end: int
    target: str


def _ends_link(ch: str) -> bool:
    return ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F or ch in LINK_STOPS


def _trim(text: str, start: int, end: int) -> int:
    """The end of a link once sentence punctuation after it is taken off (one pass: the
    brackets are counted once, then kept up to date)."""
    opened = {closer: text.count(opener, start, end) for closer, opener in CLOSERS.items()}
    closed = {closer: text.count(closer, start, end) for closer in CLOSERS}
    while end > start:
        last = text[end - 1]
        if last in CLOSERS and closed[last] <= opened[last]:
            break
        if last not in TRAILING_PUNCTUATION and last not in CLOSERS:
            break
        if last in CLOSERS:
            closed[last] -= 1
        end -= 1
    return end


def _web_at(text: str, i: int) -> int:
    """The end of a web link starting at `i` (its scheme), or -1 if none starts there."""
    if i > 0 and (text[i - 1].isalnum() or text[i - 1] in SCHEME_GLUE):
        return -1
    head = text[i : i + 8].lower()
    prefix = next((p for p in WEB_PREFIXES if head.startswith(p)), None)
    if prefix is None:
        return -1
    end = i + len(prefix)
    while end < len(text) and not _ends_link(text[end]):
        end += 1
    end = _trim(text, i, end)
    return end if end > i + len(prefix) else -1


def _drop_userinfo(link: str) -> str:
    """`https://user@host/...` -> `https://host/...`: the host after the last `@` of the
    authority is where the link goes (RFC 3986 §3.2.1)."""
    scheme, _, rest = link.partition("://")
    cut = len(rest)
    for stop in "/?#":
        found = rest.find(stop)
        if found >= 0:
            cut = min(cut, found)
    authority = rest[:cut]
    if "@" not in authority:
        return link
    return f"{scheme}://{authority.rpartition('@')[2]}{rest[cut:]}"


def _labels_ok(domain: str, tld_letters_only: bool) -> bool:
    labels = domain.split(".")
    if len(labels) < 2 or any(not label or label[0] == "-" or label[-1] == "-" for label in labels):
        return False
    last = labels[-1]
    if tld_letters_only:
        return len(last) >= 2 and last.isascii() and last.isalpha()
    return any(ch.isalpha() for ch in last)


def _bare_at(text: str, i: int) -> int:
    """The end of a bare `host/path` link starting at `i`, or -1."""
    if i > 0 and (text[i - 1].isalnum() or text[i - 1] in SCHEME_GLUE or text[i - 1] in "@/:"):
        return -1
    j = i
    while j < len(text) and text[j] in DOMAIN_CHARS:
        j += 1
    host = text[i:j].rstrip(".")
    if j >= len(text) or text[j] != "/" or len(host) != j - i or not _labels_ok(host, True):
        return -1
    end = j
    while end < len(text) and not _ends_link(text[end]):
        end += 1
    return _trim(text, i, end)


def _mail_around(text: str, at: int) -> tuple[int, int] | None:
    """The address around the `@` at `at`, as (start, end), or None."""
    start = at
    while start > 0 and text[start - 1] in LOCAL_CHARS:
        start -= 1
    while start < at and text[start] == ".":
        start += 1
    end = at + 1
    while end < len(text) and text[end] in DOMAIN_CHARS:
        end += 1
    end = _trim(text, at + 1, end)
    local, domain = text[start:at], text[at + 1 : end]
    if not local or local.endswith(".") or ".." in local or not _labels_ok(domain, False):
        return None
    return start, end


def _phone_at(text: str, i: int) -> int:
    """The end of a `+` phone number starting at `i`, or -1."""
    if i > 0 and (text[i - 1].isalnum() or text[i - 1] == "+"):
        return -1
    end, digits, last_digit = i + 1, 0, -1
    while end < len(text) and (text[end] in PHONE_SEPARATORS or "0" <= text[end] <= "9"):
        if "0" <= text[end] <= "9":
            digits += 1
            last_digit = end
        end += 1
    if last_digit < 0 or text[i + 1] == "0" or not PHONE_DIGITS_MIN <= digits <= PHONE_DIGITS_MAX:
        return -1
    after = last_digit + 1
    if after < len(text) and text[after].isalnum():
        return -1
    return after


def _one_at(text: str, i: int) -> FoundLink | None:
    """The link that starts at `i`, if any (web, bare web, phone; addresses are found
    from their `@`, since their start is only known from there)."""
    ch = text[i]
    if ch in "hH":
        end = _web_at(text, i)
        if end > 0:
            return FoundLink(i, end, _drop_userinfo(text[i:end]))
    if ch == "+":
        end = _phone_at(text, i)
        if end > 0:
            return FoundLink(i, end, "tel:" + text[i:end])
    if ch.isascii() and ch.isalnum():
        end = _bare_at(text, i)
        if end > 0:
            return FoundLink(i, end, "https://" + text[i:end])
    return None


def find_links(text: str, at_most: int = limits.LINKS_PER_ARGUMENT_MAX) -> tuple[str, ...]:
    """Every link in `text`, in order of appearance, as a target to canonicalize
    (`https://...`, `mailto:...`, `tel:+...`). Raises TooManyLinks past `at_most`."""
    found: list[str] = []
    taken = 0  # where the last link found ends: no link starts inside another
    i = 0
    while i < len(text):
        link = _one_at(text, i)
        if link is None and text[i] == "@":
            span = _mail_around(text, i)
            if span is not None and span[0] >= taken:
                link = FoundLink(span[0], span[1], "mailto:" + text[span[0] : span[1]])
        if link is None:
            i += 1
            continue
        found.append(link.target)
        if len(found) > at_most:
            raise TooManyLinks
        taken = link.end
        i = max(link.end, i + 1)
    return tuple(found)
