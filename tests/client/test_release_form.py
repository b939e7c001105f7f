"""The form a certified target is released in (`quorumgate.sdk.targets.release_form`):
the canonical form the sidecars judged, spelled as the kind of target the caller wrote,
so that the tool reads the target that was judged and no other."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumgate.sdk.targets import release_form
from quorumgate.sidecar.engine.targets import (
    CANONICAL_VERSIONS,
    TargetRefused,
    canonicalize_target,
)

SCHEMES = ("file", "https", "mailto", "principal")


def canonical(raw: str, version: int) -> str:
    return canonicalize_target(raw, principal="alice", schemes=SCHEMES, version=version)


@pytest.mark.parametrize(
    ("raw", "released"),
    [
        ("https://faß.example/a/./b/../c", "https://xn--fa-hia.example/a/c"),
        ("https://Bücher.EXAMPLE:443/x?q=1#frag", "https://xn--bcher-kva.example/x?q=1"),
        ("mailto:bob@Bücher.example", "mailto:bob@xn--bcher-kva.example"),
        ("/notes/./drafts/../a.txt", "/notes/a.txt"),
        ("/notes/%2e%2e/secret.txt", "/secret.txt"),
        ("/notes/50%25 off.txt", "/notes/50% off.txt"),
        ("/home/CURRENT_USER/a", "/home/alice/a"),
        ("file:///notes/50%25%20off.txt", "file:///notes/50%25%20off.txt"),
        ("FILE://localhost/a/../b%C3%BC", "file:///b%C3%BC"),
        ("CURRENT_USER", "principal:alice"),
    ],
)
def test_each_kind_of_target_is_released_in_its_canonical_spelling(raw: str, released: str) -> None:
    assert release_form(canonical(raw, 3), raw, version=3) == released


def test_a_version_1_path_is_taken_literally_and_released_as_it_is() -> None:
    assert canonical("/notes/%2e%2e/x", 1) == "/notes/%2e%2e/x"
    assert release_form("/notes/%2e%2e/x", "/notes/%2e%2e/x", version=1) == "/notes/%2e%2e/x"


SEGMENT = st.one_of(
    st.sampled_from([".", "..", "%2e%2e", "%25", "a%20b", "CURRENT_USER"]),
    st.text(alphabet=st.sampled_from([*"abcXYZ09-._~%! ", "ß", "ü", "é"]), max_size=6),
)
HOST = st.sampled_from(["example.com", "Bücher.example", "faß.example", "XN--BCHER-KVA.example"])


@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(CANONICAL_VERSIONS),
    segments=st.lists(SEGMENT, max_size=5),
    kind=st.sampled_from(["path", "file", "https"]),
    host=HOST,
)
def test_what_is_released_names_the_target_judged(
    version: int, segments: list[str], kind: str, host: str
) -> None:
    path = "/" + "/".join(segments)
    raw = {"path": path, "file": "file://" + path, "https": f"https://{host}{path}"}[kind]
    try:
        judged = canonical(raw, version)
    except TargetRefused:
        return  # nothing is released for a target that has no canonical form
    released = release_form(judged, raw, version=version)
    if kind == "path":
        # a path is handed over as the path it names: written back as the canonical form
        # writes it, it is the canonical form
        again = released.replace("%", "%25") if version >= 2 else released
        assert again == judged
    else:
        # a URI is ASCII (no resolver can read another host) and canonicalizes to itself
        assert released.isascii()
        assert canonical(released, version) == judged
