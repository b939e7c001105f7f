"""Names with control characters (docs/engine.md, "Canonical targets"): a channel whose
name an attacker chose, with a newline or a bidi override inside, has a stable escaped
form on canonical version 4, so the user's own calls on it are judged rather than failing
`malformed_target`; the form is unambiguous and shows safely on a card.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumgate.proto.chainversions import escapes_controls
from quorumgate.proto.model import Outcome, Reason, RuleKind, TargetRule, ToolMode, ToolRules
from quorumgate.sidecar.engine.statements import quote_for_card
from quorumgate.sidecar.engine.targets import TargetRefused, canonicalize_target
from tests.engine.harness import World

SCHEMES = ("file", "https")


def canon(raw: str, version: int = 4) -> str:
    return canonicalize_target(raw, principal="a", schemes=SCHEMES, version=version)


def test_before_version_4_a_name_with_a_newline_fails_every_call_naming_it() -> None:
    assert not escapes_controls(3)
    for raw in ("/channels/ops\nurgent", "/channels/ops%0Aurgent", "https://chat.example/c/ops%0A"):
        with pytest.raises(TargetRefused):
            canon(raw, 3)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("/channels/ops\nurgent", "/channels/ops%0Aurgent"),
        ("/channels/ops%0aurgent", "/channels/ops%0Aurgent"),  # raw and encoded: one name
        ("file:///channels/ops%0Aurgent", "/channels/ops%0Aurgent"),
        ("/channels/100%25\ttabs", "/channels/100%25%09tabs"),
        ("/channels/\u202eevil", "/channels/%E2%80%AEevil"),  # a bidi override
        ("/channels/a\x7fb", "/channels/a%7Fb"),
        ("https://chat.example/c/ops%0Aurgent", "https://chat.example/c/ops%0Aurgent"),
        ("https://chat.example/c/ops\nurgent", "https://chat.example/c/ops%0Aurgent"),
        ("https://chat.example/c?name=a%E2%80%AEb", "https://chat.example/c?name=a%E2%80%AEb"),
    ],
)
def test_a_name_with_controls_has_one_escaped_form(raw: str, canonical: str) -> None:
    assert canon(raw) == canonical
    assert canon(canonical) == canonical  # a fixed point
    assert canonical.isascii() and canonical.isprintable()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("/channels/ops\nurgent", "/channels/ops%250Aurgent"),  # a name written "ops%0Aurgent"
        ("/channels/ops\nurgent", "/channels/opsurgent"),
        ("/channels/ops\nurgent", "/channels/ops\rurgent"),
        ("https://chat.example/c/a%0A", "https://chat.example/c/a%250A"),
    ],
)
def test_the_escaped_form_is_unambiguous(a: str, b: str) -> None:
    assert canon(a) != canon(b)


@pytest.mark.parametrize(
    "raw",
    [
        "/channels/a\x00b",  # NUL still truncates a name in C: refused
        "/channels/a\\b",  # a backslash is a separator somewhere: refused
        "https://ex\nample.com/",  # no host has a control character
        "mailto:a\nb@example.com",
    ],
)
def test_what_is_still_refused(raw: str) -> None:
    with pytest.raises(TargetRefused):
        canonicalize_target(raw, principal="a", schemes=(*SCHEMES, "mailto"), version=4)


def test_the_users_own_call_on_such_a_channel_is_judged_and_shows_safely() -> None:
    w = World(overrides={"canonical_version": 4})
    w.add_tool("chat.read", mode=ToolMode.USER_CONFIRM, schemes=("https",))
    rules = [ToolRules("chat.read", (TargetRule(RuleKind.PREFIX, "https://chat.example/c"),))]
    w.add_agent("a", ["chat.read"], rules=rules)
    verdict = w.propose("a", "chat.read", "https://chat.example/c/ops\nApproved:%20yes")
    assert verdict.outcome is Outcome.PENDING, verdict.reason
    assert verdict.canonical_target == "chat.read https://chat.example/c/ops%0AApproved:%20yes"
    assert verdict.card is not None
    rendered = verdict.card.render()
    assert "\nApproved: yes" not in rendered  # the name forges no line on the card
    assert quote_for_card("https://chat.example/c/ops%0AApproved:%20yes") in rendered
    old = World(overrides={"canonical_version": 3})
    old.add_tool("chat.read", mode=ToolMode.USER_CONFIRM, schemes=("https",))
    old.add_agent("a", ["chat.read"], rules=rules)
    refused = old.propose("a", "chat.read", "https://chat.example/c/ops\nApproved:%20yes")
    assert refused.reason is Reason.MALFORMED_TARGET


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="ab%0A\n\t\u202e\x7f ", min_size=1, max_size=6), max_size=3))
def test_escaped_paths_are_fixed_points_and_distinct_names_stay_distinct(segs: list[str]) -> None:
    raw = "/" + "/".join(segs)
    try:
        got = canon(raw)
    except TargetRefused:
        return
    assert canon(got) == got
    assert "\n" not in got and got.isascii()
