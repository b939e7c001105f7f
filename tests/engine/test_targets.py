"""Canonical targets (docs/engine.md): properties over generated aliases, plus the edge cases."""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from quorumgate.proto import limits, names
from quorumgate.proto.model import Argument, Outcome, Reason
from quorumgate.sidecar.engine.targets import TargetRefused, canonicalize_target
from tests.engine.harness import World

SCHEMES = ("file", "http", "https", "mailto", "principal")
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# one digit zero from several Unicode decimal blocks (category Nd)
DIGIT_ZEROS = [0x30, 0x660, 0x6F0, 0x966, 0x9E6, 0xE50, 0xFF10, 0x1D7CE]


def fullwidth(text: str) -> str:
    """The fullwidth spelling of printable ASCII (what NFKC folds back)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def canon(raw: str, principal: str = "alice") -> str:
    return canonicalize_target(raw, principal=principal, schemes=SCHEMES)


def canon_v1(raw: str, principal: str = "alice") -> str:
    """Version 1, the forms of chains made before the strict forms (NFKC first, digits
    folded)."""
    return canonicalize_target(raw, principal=principal, schemes=SCHEMES, version=1)


def refusal(raw: str, principal: str = "alice") -> Reason:
    with pytest.raises(TargetRefused) as exc:
        canon(raw, principal)
    return exc.value.reason


labels = st.text(alphabet=string.ascii_lowercase + string.digits, min_size=1, max_size=8).filter(
    lambda s: not s.isdigit()
)
segments = st.text(alphabet=string.ascii_letters + string.digits + "-_~", min_size=1, max_size=8)
unicode_labels = st.sampled_from(["bücher", "münchen", "пример", "例え", "δοκιμή", "café"])


@st.composite
def base_uris(draw: st.DrawFn) -> tuple[str, list[str], list[str]]:
    scheme = draw(st.sampled_from(["http", "https"]))
    host = [*draw(st.lists(labels, min_size=1, max_size=3)), draw(st.sampled_from(["com", "org"]))]
    path = draw(st.lists(segments, min_size=0, max_size=4))
    return scheme, host, path


def _spell(scheme: str, host: list[str], path: list[str], draw: Callable[[Any], Any]) -> str:
    """Draw one alias spelling of the URI made of these parts."""
    out_scheme = "".join(c.upper() if draw(st.booleans()) else c for c in scheme)
    out_host = ".".join(
        "".join(c.upper() if draw(st.booleans()) else c for c in lab) for lab in host
    )
    if draw(st.booleans()):
        out_host += "."  # the root label
    port = ""
    if draw(st.booleans()):
        port = ":" + ("443" if scheme == "https" else "80")
    out_path: list[str] = []
    for seg in path:
        if draw(st.booleans()):
            out_path.append(".")
        if draw(st.booleans()):
            out_path.extend(["zz", ".."])
        spelled = "".join(
            f"%{ord(c):02{'x' if draw(st.booleans()) else 'X'}}" if draw(st.booleans()) else c
            for c in seg
        )
        out_path.append(spelled)
    raw_path = "/" + "/".join(out_path) if bool(out_path) or draw(st.booleans()) else ""
    fragment = "#" + draw(segments) if draw(st.booleans()) else ""
    return f"{out_scheme}://{out_host}{port}{raw_path}{fragment}"


@given(st.data(), base_uris())
@PROPERTY
def test_uri_aliases_map_to_one_canonical_target(
    data: st.DataObject, parts: tuple[str, list[str], list[str]]
) -> None:
    scheme, host, path = parts
    first = canon(_spell(scheme, host, path, data.draw))
    second = canon(_spell(scheme, host, path, data.draw))
    assert first == second
    assert first == f"{scheme}://{'.'.join(host)}/{'/'.join(path)}"


@given(st.data(), unicode_labels, st.lists(segments, max_size=3))
@PROPERTY
def test_idna_and_nfkc_host_spellings_map_to_one_a_label(
    data: st.DataObject, label: str, path: list[str]
) -> None:
    tail = "/" + "/".join(path)
    plain = canon(f"https://{label}.example{tail}")
    upper = canon(f"https://{label.upper()}.EXAMPLE{tail}")
    alabel = canon(f"https://{plain.split('//')[1].split('/')[0]}{tail}")
    assert plain == upper == alabel
    assert plain.isascii() and "xn--" in plain
    # A fullwidth spelling: merged by version 1, refused by version 2 (strict forms).
    wide = f"https://{label}.example{tail}".replace("example", fullwidth("example"))
    assert canon_v1(wide) == canon_v1(f"https://{label}.example{tail}") == plain
    assert refusal(wide) is Reason.MALFORMED_TARGET


@given(
    st.integers(min_value=0, max_value=10**12), st.lists(st.sampled_from(DIGIT_ZEROS), min_size=1)
)
@PROPERTY
def test_unicode_digits_in_every_decimal_block_normalize_to_ascii_in_version_1_only(
    number: int, zeros: list[int]
) -> None:
    ascii_form = str(number)
    mixed = "".join(chr(zeros[i % len(zeros)] + int(d)) for i, d in enumerate(ascii_form))
    assert all(unicodedata.category(c) == "Nd" for c in mixed)
    assert (
        canon_v1(f"https://example.com/orders/{mixed}")
        == f"https://example.com/orders/{ascii_form}"
    )
    assert canon_v1(f"/srv/{mixed}") == f"/srv/{ascii_form}"
    assert names.ascii_digits(mixed) == ascii_form
    # Version 2 merges no digits: Arabic-Indic 500 and ASCII 500 name different files.
    if not mixed.isascii():
        assert refusal(f"https://example.com/orders/{mixed}") is Reason.MALFORMED_TARGET
        assert refusal(f"/srv/{mixed}") is Reason.MALFORMED_TARGET


@given(st.text(max_size=80))
@PROPERTY
def test_canonicalization_is_total_and_idempotent_on_any_text(raw: str) -> None:
    try:
        once = canon(raw)
    except TargetRefused:
        return  # refusing is an answer; any other exception fails the test
    assert canon(once) == once


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "CURRENT_USER", "x y"]), max_size=8))
@PROPERTY
def test_paths_resolve_dot_segments_lexically_and_never_climb_above_root(parts: list[str]) -> None:
    raw = "/srv/" + "/".join(parts)
    out = canon(raw)
    assert out.startswith("/")
    assert "/./" not in out + "/" and "/../" not in out + "/" and "//" not in out
    assert canon(out) == out
    # the same path spelt as a file URI canonicalizes to the same target
    assert canon("file://" + raw.replace(" ", "%20")) == out


CONTROLS = ["\x00", "\x01", "\x1f", "\x7f", "\u200b", "\u202e", "\u2028", "\ufeff"]


@given(
    st.text(alphabet=string.ascii_letters + "/.:%", max_size=20),
    st.integers(0, 20),
    st.sampled_from(CONTROLS),
)
@PROPERTY
def test_nul_and_control_characters_are_refused_anywhere(body: str, at: int, bad: str) -> None:
    """Refused on canonical version 3; version 4 writes them in a name as `%XX` escapes
    (docs/engine.md, escaped names; tests/engine/test_escaped_names.py), so there a
    control is refused or escaped, and never reaches a canonical target as itself."""
    for raw in (f"https://example.com/{body}", f"/srv/{body}", f"file:///{body}"):
        position = min(at, len(raw))
        planted = raw[:position] + bad + raw[position:]
        with pytest.raises(TargetRefused) as exc:
            canonicalize_target(planted, principal="alice", schemes=SCHEMES, version=3)
        assert exc.value.reason is Reason.MALFORMED_TARGET
        try:
            got = canon(planted)
        except TargetRefused as refused:
            assert refused.reason is Reason.MALFORMED_TARGET
        else:
            assert bad != "\x00" and bad not in got and got.isascii() and got.isprintable()


@pytest.mark.parametrize(
    "raw",
    [
        "https://user:pw@example.com/",  # user information
        "https://example.com@evil.example/",  # the classic disguise
        "https://example.com/a b",  # raw space
        "https:\\\\evil.example",  # backslashes are not RFC 3986
        "https://example.com/%zz",  # bad percent-encoding
        "https://example.com:99999/",  # port out of range
        "https:///nohost",  # empty host
        "http://0x7f.1/",  # numeric host spellings other than the dotted quad
        "http://127.000.000.001/",
        "http://2130706433/",
        "https://[fe80::1%25eth0]/",  # zone identifiers
        "relative/path",  # not absolute
        "//example.com/x",  # scheme-relative
        "file://remote.example/etc/passwd",  # a file URI naming another host
        "https://xn--zz.example/",  # an A-label that is not valid punycode for a label
        "https://" + "a" * 64 + ".example/",  # a DNS label over 63 octets
    ],
)
def test_malformed_targets_are_refused(raw: str) -> None:
    assert refusal(raw) is Reason.MALFORMED_TARGET


def test_over_long_targets_are_refused_before_and_after_canonicalization() -> None:
    assert (
        refusal("https://example.com/" + "a" * limits.TARGET_CHARS_MAX) is Reason.MALFORMED_TARGET
    )
    # short enough raw, but percent-encoding triples it past the limit
    assert refusal("https://example.com/" + "é" * 700) is Reason.MALFORMED_TARGET


def test_scheme_must_be_one_the_tool_allows() -> None:
    with pytest.raises(TargetRefused) as exc:
        canonicalize_target("ftp://example.com/", principal="alice", schemes=("https",))
    assert exc.value.reason is Reason.TARGET_SCHEME_NOT_ALLOWED
    with pytest.raises(TargetRefused) as no_target_tool:
        canonicalize_target("https://example.com/", principal="alice", schemes=())
    assert no_target_tool.value.reason is Reason.TARGET_SCHEME_NOT_ALLOWED
    assert canonicalize_target("", principal="alice", schemes=()) == "-"


principal_ids = st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True)


@given(
    principal_ids,
    st.sampled_from(["CURRENT_USER", "current_user", "Current_User"]),
)
@PROPERTY
def test_current_user_binds_to_the_authenticated_principal(principal: str, spelling: str) -> None:
    assert canon_v1(fullwidth("CURRENT_USER"), principal) == f"principal:{principal}"
    assert canon(spelling, principal) == f"principal:{principal}"
    assert canon(f"principal:{spelling}", principal) == f"principal:{principal}"
    assert canon(f"principal:{principal.upper()}", principal) == f"principal:{principal}"
    assert canon(f"/home/{spelling}/notes", principal) == f"/home/{principal}/notes"
    assert canon(f"https://api.example/users/{spelling}", principal).endswith(f"/users/{principal}")


@given(principal_ids, principal_ids)
@PROPERTY
def test_a_target_naming_another_principal_is_refused(me: str, other: str) -> None:
    assume(me != other)
    assert refusal(f"principal:{other}", me) is Reason.CROSS_PRINCIPAL_TARGET


ambient = st.sampled_from(
    [*sorted(names.AMBIENT_IDENTITY_EXACT), "chat_id", "user_id", "customer_id", "peer_id"]
)


@given(ambient, st.sampled_from(["", "_", "-", "."]), st.booleans())
@PROPERTY
def test_ambient_identity_names_are_recognized_in_any_spelling(
    name: str, separator: str, shout: bool
) -> None:
    spelled = name.replace("_", separator)
    spelled = spelled.upper() if shout else spelled
    canonical = names.canonical_argument_name(spelled)
    assert canonical is not None and names.is_ambient_identity_name(canonical)
    assert refusal(f"https://api.example/x?{spelled}=42") is Reason.AMBIENT_IDENTITY_ARGUMENT


def test_ambient_identity_arguments_are_refused_by_the_engine_not_rewritten() -> None:
    world = World()
    world.add_tool("tickets.open")
    world.add_agent("alice", None)
    for name in ("chat_id", "userId", "RECIPIENT", "customer-id", "to"):
        verdict = world.propose("alice", "tickets.open", args=[Argument(name=name, text="998877")])
        assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.AMBIENT_IDENTITY_ARGUMENT)
    ok = world.propose("alice", "tickets.open", args=[Argument(name="subject", text="hello")])
    assert ok.outcome is Outcome.ALLOW


@given(
    st.sampled_from(
        ["kb.search", "KB.Search", " kb.search ", fullwidth("kb.search"), "\u212aB.search"]
    )
)
@PROPERTY
def test_tool_name_aliases_fold_to_one_registered_tool(spelling: str) -> None:
    assert names.canonical_tool_name(spelling) == "kb.search"


def test_homoglyph_tool_names_are_unknown_not_aliases() -> None:
    homoglyph = "kb.s\u0435arch"  # CYRILLIC SMALL LETTER IE for the Latin e
    assert names.canonical_tool_name(homoglyph) is None
    world = World()
    world.add_tool("kb.search")
    world.add_agent("alice", None)
    verdict = world.propose("alice", homoglyph)
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.UNKNOWN_TOOL)
    assert verdict.canonical_target == "! !"


uri_alphabet = (
    string.ascii_letters + string.digits + "/.:@%?#&=+-_~!$'()*,;[]" + "éü\u0663\uff58\u3002"
)


@given(
    st.sampled_from(["https://", "http://", "file://", "/", "mailto:", "principal:", "HTTPS://"]),
    st.text(alphabet=uri_alphabet, max_size=60),
)
@settings(max_examples=400, deadline=None)
def test_canonicalization_is_idempotent_on_uri_shaped_text(prefix: str, rest: str) -> None:
    try:
        once = canon(prefix + rest)
    except TargetRefused:
        return
    assert canon(once) == once
    assert len(once) <= limits.TARGET_CHARS_MAX


# ---------------------------------------------------------------------------- fast path

_FAST_LABELS = st.sampled_from(
    ["a", "example", "x-y", "xn--bcher-kva", "0x10", "123", "A", "b2", "-a", "a-", "_a", "ex ample"]
)
_FAST_SEGMENTS = st.sampled_from(
    ["", ".", "..", "x", "a.b", "CURRENT_USER", "current_user", "%41", "%2e", "~u", "p:q@r"]
)


_PLAIN_LABELS = st.sampled_from(["a", "example", "x-y", "b2", "pay", "com"])
_PLAIN_SEGMENTS = st.sampled_from(["x", "a.b", "CURRENT_USER", "Current_User", "~u", "p:q@r"])


@st.composite
def _web_uris(draw: st.DrawFn) -> str:
    """Mostly URIs the fast path takes (so its answers are checked), with every kind of
    near miss mixed in."""
    plain = draw(st.booleans())
    scheme = "https" if plain else draw(st.sampled_from(["https", "http", "HTTPS", "ftp", "wss"]))
    labels = _PLAIN_LABELS if plain else st.one_of(_PLAIN_LABELS, _FAST_LABELS)
    segments = _PLAIN_SEGMENTS if plain else st.one_of(_PLAIN_SEGMENTS, _FAST_SEGMENTS)
    host = ".".join(draw(st.lists(labels, min_size=1, max_size=4)))
    port = "" if plain else draw(st.sampled_from(["", "", ":443", ":80", ":8443"]))
    path = "".join("/" + seg for seg in draw(st.lists(segments, max_size=4)))
    tail = draw(st.sampled_from(["", "/"] if plain else ["", "", "/", "?q=1", "#frag"]))
    return f"{scheme}://{host}{port}{path}{tail}"


def _slow(raw: str, schemes: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> str | Reason:
    from quorumgate.sidecar.engine import targets

    with monkeypatch.context() as patch:
        patch.setattr(targets, "_already_canonical_web_uri", lambda text, schemes: None)
        try:
            return canonicalize_target(raw, principal="alice", schemes=schemes)
        except TargetRefused as refused:
            return refused.reason


@PROPERTY
@given(raw=_web_uris())
def test_the_fast_path_for_canonical_web_uris_agrees_with_the_general_one(raw: str) -> None:
    """The shortcut for an already-canonical http(s) URI returns exactly what the full
    canonicalization returns, and never answers for anything it would change or refuse."""
    from quorumgate.sidecar.engine.targets import _already_canonical_web_uri

    schemes = ("http", "https")
    with pytest.MonkeyPatch.context() as monkeypatch:
        slow = _slow(raw, schemes, monkeypatch)
    fast = _already_canonical_web_uri(raw, schemes)
    if fast is not None:
        assert fast == slow
    try:
        direct: str | Reason = canonicalize_target(raw, principal="alice", schemes=schemes)
    except TargetRefused as refused:
        direct = refused.reason
    assert direct == slow


def test_the_fast_path_takes_the_common_case() -> None:
    from quorumgate.sidecar.engine.targets import _already_canonical_web_uri

    assert _already_canonical_web_uri("https://pay.acme.example/invoices/1042", ("https",)) == (
        "https://pay.acme.example/invoices/1042"
    )
    assert _already_canonical_web_uri("https://a.example", ("https",)) == "https://a.example/"
    others = ("https://A.example/x", "https://a.example:443/x", "https://a.example/./x")
    others += ("https://10.0.0.1/x", "https://a.example/x?y=1", "http://a.example/x")
    for other in others:
        assert _already_canonical_web_uri(other, ("https",)) is None
