"""One canonical form (docs/engine.md), canonical version 2 (strict forms).

Each case first as version 1 decides it (what chains made before keep, so
that their logs replay to the same verdicts), then as version 2 must: one order of
operations (percent-decode, then NFC), compatibility characters and non-ASCII digits
refused rather than merged, paths and `file:` URIs alike, backslash and NUL refused
everywhere, `mailto:` domains canonical, and only characters assigned in the pinned
Unicode version accepted, whatever Python runs.
"""

from __future__ import annotations

import posixpath
import unicodedata
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumgate.proto.model import Outcome, Reason
from quorumgate.sidecar.engine.config import EngineConfig
from quorumgate.sidecar.engine.targets import TargetRefused, canonicalize_target
from quorumgate.sidecar.engine.unicode_assigned import UNICODE_VERSION
from tests.engine.harness import World

SCHEMES = ("file", "https", "mailto")
# Written with escapes: the characters are the point, and a reader must see which they are.
FULLWIDTH_P = "\uff50"  # FULLWIDTH LATIN SMALL LETTER P
FULLWIDTH_PASSWD = "".join(chr(ord(c) + 0xFEE0) for c in "passwd")
LIGATURE_FI = "\ufb01"  # LATIN SMALL LIGATURE FI
ARABIC_500 = "\u0665\u0660\u0660"
A_RING_NFC = "\u00c5"  # Å, one code point
A_RING_NFD = "A\u030a"  # A + combining ring above
WIRELESS = "\U0001f6dc"  # assigned in Unicode 15, after the pinned 14


def v1(raw: str) -> str:
    return canonicalize_target(raw, principal="alice", schemes=SCHEMES, version=1)


def v2(raw: str) -> str:
    return canonicalize_target(raw, principal="alice", schemes=SCHEMES, version=2)


def refused_v2(raw: str) -> Reason:
    with pytest.raises(TargetRefused) as exc:
        v2(raw)
    return exc.value.reason


# ------------------------------------------------------------------ the cases


def test_percent_encoded_and_raw_compatibility_characters_get_one_answer() -> None:
    # version 1: a raw fullwidth p became p, its percent-encoding stayed as it was
    assert v1(f"/{FULLWIDTH_P}") == "/p"
    assert v1("https://x.example/%EF%BD%90") == "https://x.example/%EF%BD%90"
    # version 2: both are refused, in paths, file: URIs and web URIs alike
    for raw in (
        f"/{FULLWIDTH_P}",
        "/%EF%BD%90",
        "file:///%EF%BD%90",
        f"https://x.example/{FULLWIDTH_P}",
        "https://x.example/%EF%BD%90",
    ):
        assert refused_v2(raw) is Reason.MALFORMED_TARGET, raw


def test_canonically_equivalent_spellings_are_one_target() -> None:
    # version 1: raw NFD became %C3%85 but its percent-encoding stayed A%CC%8A
    assert v1(f"https://x.example/{A_RING_NFD}") == "https://x.example/%C3%85"
    assert v1("https://x.example/A%CC%8A") == "https://x.example/A%CC%8A"
    # version 2: decoded first, then NFC: all four spellings are one
    for raw in (A_RING_NFC, A_RING_NFD, "%C3%85", "A%CC%8A"):
        assert v2(f"https://x.example/{raw}") == "https://x.example/%C3%85", raw
    for raw in (A_RING_NFC, A_RING_NFD, "%C3%85", "A%CC%8A"):
        assert v2(f"/data/{raw}") == f"/data/{A_RING_NFC}", raw


def test_different_resources_are_no_longer_merged() -> None:
    assert v1(f"/etc/{FULLWIDTH_PASSWD}") == "/etc/passwd"
    assert v1(f"/data/{LIGATURE_FI}le") == "/data/file"
    assert v1(f"https://x.example/pay?amount={ARABIC_500}") == "https://x.example/pay?amount=500"
    for raw in (
        f"/etc/{FULLWIDTH_PASSWD}",
        f"/data/{LIGATURE_FI}le",
        f"https://x.example/pay?amount={ARABIC_500}",
        "https://x.example/pay?amount=%D9%A5%D9%A0%D9%A0",
    ):
        assert refused_v2(raw) is Reason.MALFORMED_TARGET, raw


def test_paths_and_file_uris_agree() -> None:
    assert v1("/a/%2e%2e/b") == "/a/%2e%2e/b"  # version 1: taken literally
    assert v1("file:///a/%2e%2e/b") == "/b"
    for raw in ("/a/%2e%2e/b", "file:///a/%2e%2e/b", "/a/../b", "file:///a/../b"):
        assert v2(raw) == "/b", raw
    # a decoded % is written %25 again, so the canonical form canonicalizes to itself
    assert v2("/data/100%25") == v2("file:///data/100%25") == "/data/100%25"
    assert refused_v2("/data/50%") is Reason.MALFORMED_TARGET  # a bare % encodes nothing


def test_backslashes_and_nul_are_refused_everywhere() -> None:
    for raw in (
        "/data\\secret",
        "/data/%5Csecret",
        "file:///data/%5Csecret",
        "https://x.example/a%5Cb",
        "https://x.example/a%00b",
        "/data/%00",
        "https://x.example/a%0D%0ASet-Cookie:x",
    ):
        assert refused_v2(raw) is Reason.MALFORMED_TARGET, raw


def test_mailto_domains_are_canonical_in_version_2_only() -> None:
    assert v1("mailto:bob@EXAMPLE.COM") == "mailto:bob@EXAMPLE.COM"
    assert v2("mailto:bob@EXAMPLE.COM") == "mailto:bob@example.com"


def test_only_characters_of_the_pinned_unicode_version_are_accepted() -> None:
    """Python 3.11 knows Unicode 14 and 3.12 knows 15: a character added in 15 must get
    the same answer from both, or two sidecars would decide one call two ways."""
    assert UNICODE_VERSION == "14.0.0"
    assert refused_v2(f"/data/{WIRELESS}") is Reason.MALFORMED_TARGET
    assert v2("/data/\u00e9t\u00e9") == "/data/\u00e9t\u00e9"  # été: assigned long before
    if unicodedata.unidata_version == UNICODE_VERSION:
        assert unicodedata.category(WIRELESS) == "Cn"  # the table is this Python's


def test_the_unicode_table_is_current() -> None:
    """The committed table is what scripts/gen_unicode_table.py makes on a Python with the
    pinned Unicode version (this one, when it is 3.11)."""
    if unicodedata.unidata_version != UNICODE_VERSION:
        pytest.skip(f"this Python's Unicode is {unicodedata.unidata_version}")
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gen_unicode_table.py"
    done = subprocess.run([sys.executable, str(script), "--check"], check=False)
    assert done.returncode == 0, "run python scripts/gen_unicode_table.py and commit it"


# ------------------------------------------------------------------ properties


NAME_CHARS = st.sampled_from(
    [*"abcXYZ019-_~.", " ", "%25", "%2e", "%2E", "%41", "..", A_RING_NFC, A_RING_NFD, "%C3%85",
     "A%CC%8A", "\u00df", "\u4f8b", FULLWIDTH_P, LIGATURE_FI, "\u0665", "%EF%BD%90"]
)  # fmt: skip
paths = st.lists(st.lists(NAME_CHARS, min_size=1, max_size=5).map("".join), max_size=5).map(
    lambda segs: "/" + "/".join(segs)
)


def reference_path(raw: str) -> str:
    """The published rules for a path (README, "Canonical targets"), written independently:
    percent-decode, NFC, resolve `.` and `..` lexically, drop empty segments."""
    text = unicodedata.normalize("NFC", unquote(raw, errors="strict"))
    resolved = posixpath.normpath(text)
    while resolved.startswith("//"):
        resolved = resolved[1:]
    return resolved


@given(paths)
@settings(max_examples=400, deadline=None)
def test_a_path_canonicalizes_to_what_the_published_rules_say_or_is_refused(raw: str) -> None:
    """Two paths are one target only if the rules table says they name one file."""
    try:
        canonical = v2(raw)
    except TargetRefused:
        decoded = unquote(raw)
        nfc = unicodedata.normalize("NFC", decoded)
        assert (
            unicodedata.normalize("NFKC", nfc) != nfc
            or any(unicodedata.category(c) == "Nd" and not c.isascii() for c in decoded)
            or any(seg != seg.strip(" ") for seg in decoded.strip(" ").split("/"))
        ), raw
        return
    expected = reference_path(raw.strip(" ")).replace("%", "%25")
    assert canonical == expected, raw
    assert v2(canonical) == canonical


@given(st.text(max_size=60))
@settings(max_examples=400, deadline=None)
def test_version_2_is_idempotent_on_any_text(raw: str) -> None:
    try:
        once = v2(raw)
    except TargetRefused:
        return
    assert v2(once) == once


# ------------------------------------------------------------------ the engine


def test_a_chain_keeps_the_version_it_was_made_with() -> None:
    old = World(overrides={"canonical_version": 1})
    new = World()
    for w in (old, new):
        w.add_tool("files.read", schemes=("file",))
        w.add_agent("a", ["files.read"])
    assert old.propose("a", "files.read", f"/etc/{FULLWIDTH_PASSWD}").outcome is Outcome.ALLOW
    denied = new.propose("a", "files.read", f"/etc/{FULLWIDTH_PASSWD}")
    assert (denied.outcome, denied.reason) == (Outcome.DENY, Reason.MALFORMED_TARGET)


def test_version_1_keeps_its_fingerprint_and_version_2_names_its_unicode() -> None:
    key = bytes(32)
    old = EngineConfig(
        chain_id="c", owner_public_key=key, canonical_version=1, authority_version=1,
        state_version=1, receipt_version=1,
    )  # fmt: skip
    new = EngineConfig(
        chain_id="c", owner_public_key=key, canonical_version=2, authority_version=1,
        state_version=1, receipt_version=1,
    )  # fmt: skip
    assert old.fingerprint != new.fingerprint
    from quorumgate.proto.canonical import Encoder
    from quorumgate.sidecar.engine.config import _LIMIT_FIELDS, TAG_CONFIG

    enc = Encoder(TAG_CONFIG).text("c").raw(key)
    for name in _LIMIT_FIELDS:
        enc.text(name).u64(getattr(old, name))
    assert old.fingerprint == enc.digest()  # exactly as before versions existed
    assert new.fingerprint == _with_limits(new, TAG_CONFIG, _LIMIT_FIELDS)
    # split authority (authority version 2) is named in the fingerprint; version 1 adds nothing
    split = EngineConfig(
        chain_id="c", owner_public_key=key, canonical_version=2, authority_version=2,
        state_version=1, receipt_version=1,
    )  # fmt: skip
    assert split.authority_version == 2
    expected = Encoder(TAG_CONFIG).text("c").raw(key)
    for name in _LIMIT_FIELDS:
        expected.text(name).u64(getattr(split, name))
    expected.text("canonical_version").u64(2).text("unicode").text(UNICODE_VERSION)
    expected.text("authority_version").u64(2).text("latch_cross_run_threshold").u64(3)
    assert split.fingerprint == expected.digest() != new.fingerprint
    # the hash tree (state version 2) is named last; version 1 adds nothing
    tree = EngineConfig(
        chain_id="c", owner_public_key=key, canonical_version=2, authority_version=2,
        receipt_version=1,
    )  # fmt: skip
    assert tree.state_version == 2
    expected.text("state_version").u64(2)
    assert tree.fingerprint == expected.digest() != split.fingerprint
    # receipt version 2 (certificates that expire) is named last, with the certificate TTL
    expiring = EngineConfig(
        chain_id="c", owner_public_key=key, canonical_version=2, authority_version=2,
        receipt_version=2,
    )  # fmt: skip
    assert expiring.receipt_version == 2 and expiring.receipts_expire
    expected.text("receipt_version").u64(2).text("certificate_ttl_ms").u64(300_000)
    assert expiring.fingerprint == expected.digest() != tree.fingerprint
    # authority version 3 (delegates defer) is named as such, in the place version 2 was
    deferring = EngineConfig(
        chain_id="c", owner_public_key=key, canonical_version=2, authority_version=3,
        receipt_version=2,
    )  # fmt: skip
    assert deferring.authority_version == 3
    assert deferring.fingerprint != expiring.fingerprint
    # receipt version 3 (argument commitments) is named as such, in the place version 2 was
    committing = EngineConfig(
        chain_id="c", owner_public_key=key, canonical_version=2, authority_version=3,
        receipt_version=3,
    )  # fmt: skip
    assert committing.receipt_version == 3
    assert committing.fingerprint != deferring.fingerprint


def _with_limits(config: EngineConfig, tag: bytes, fields: tuple[str, ...]) -> bytes:
    from quorumgate.proto.canonical import Encoder

    enc = Encoder(tag).text(config.chain_id).raw(config.owner_public_key)
    for name in fields:
        enc.text(name).u64(getattr(config, name))
    enc.text("canonical_version").u64(2).text("unicode").text(UNICODE_VERSION)
    return enc.digest()
