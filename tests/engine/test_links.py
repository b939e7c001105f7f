"""Links inside text are targets (docs/engine.md, "Links inside text";
sidecar/engine/links.py): a message to a known colleague carrying a link to a domain no
rule names goes to the principal's card, which lists the link. Each attack first runs on
canonical version 3, where the link inside the text is no target at all.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumgate.proto import limits
from quorumgate.proto.canonical import Encoder
from quorumgate.proto.chainversions import links_in_text
from quorumgate.proto.model import (
    ArgRole,
    ArgSpec,
    Argument,
    Outcome,
    Reason,
    RegisterTool,
    RuleKind,
    SetEntries,
    TargetRule,
    ToolMode,
    ToolRules,
    ToolSpec,
)
from quorumgate.sidecar.engine.links import TooManyLinks, find_links
from quorumgate.sidecar.engine.state import EngineState, _dec_card, _Reader
from tests.engine.harness import World, replay

PHISH = "Hi Ann, the Q3 numbers are here: https://login.evil.example/sso please check."
CHAT = ToolSpec(
    "chat.send",
    ToolMode.DIRECT,
    target_schemes=("mailto",),
    arguments=(ArgSpec("body", ArgRole.TEXT), ArgSpec("note", ArgRole.AMOUNT)),
    direct_override=True,
)
MEMBERS = (TargetRule(RuleKind.HOST_SUFFIX, "corp.example"),)
RULES = [
    ToolRules(
        "chat.send",
        (
            TargetRule(RuleKind.SET, "members", ToolMode.DIRECT),
            TargetRule(RuleKind.HOST_SUFFIX, "corp.example", role="link"),
            TargetRule(RuleKind.EXACT, "tel:+4930123456", role="link"),
        ),
    )
]


def world(version: int) -> World:
    w = World(overrides={"canonical_version": version, "latch_cross_run_threshold": 1_000})
    w.admin(RegisterTool(CHAT))
    w.add_agent("a", ["chat.send"], rules=RULES)
    w.admin(SetEntries("a", "members", MEMBERS))
    return w


def send(w: World, body: str, to: str = "mailto:ann@corp.example", name: str = "body"):  # type: ignore[no-untyped-def]
    return w.propose("a", "chat.send", to, args=[Argument(name, text=body)])


# ------------------------------------------------------------------ the attack


def test_a_phishing_link_to_a_known_member_ran_directly_before_links_were_targets() -> None:
    assert not links_in_text(3)
    assert send(world(3), PHISH).outcome is Outcome.ALLOW  # the link was never judged


def test_a_phishing_link_to_a_known_member_goes_to_the_principals_card() -> None:
    w = world(4)
    verdict = send(w, PHISH)
    assert verdict.outcome is Outcome.PENDING, verdict.reason
    assert verdict.reason is Reason.CONFIRMATION_REQUIRED
    assert verdict.card is not None
    assert verdict.card.links == ("https://login.evil.example/sso",)
    rendered = verdict.card.render()
    assert 'Link in the text: "https://login.evil.example/sso"' in rendered
    # the canonical call (what certificates bind) is unchanged: the body fixes the links
    assert verdict.canonical_target == "chat.send mailto:ann@corp.example"
    # the card survives the state's bytes, and the log replays to the same roots
    restored = EngineState.from_bytes(w.engine.state_bytes())
    assert restored.pending[verdict.proposal_id].card == verdict.card
    _, results = replay(w)
    assert [r.state_root for r in results] == [r.state_root for r in w.results]


def test_links_a_rule_names_and_text_without_links_run_directly() -> None:
    w = world(4)
    assert send(w, "no link here, see you at 3.30").outcome is Outcome.ALLOW
    ok = send(w, "wiki: HTTPS://Wiki.CORP.example/page, or call +49 30 123456.")
    assert ok.outcome is Outcome.ALLOW, ok.reason


def test_only_arguments_declared_as_text_are_scanned() -> None:
    w = world(4)
    # `note` is declared, but not as text: its value is no message a reader follows
    assert send(w, "https://evil.example/", name="note").outcome is Outcome.ALLOW


@pytest.mark.parametrize(
    ("body", "link"),
    [
        ("HTTPS://EVIL.EXAMPLE/Login", "https://evil.example/Login"),
        ("go https://good.corp.example@evil.example/x now", "https://evil.example/x"),
        ("see (https://evil.example/a).", "https://evil.example/a"),
        ("https://%65vil.example/", "https://evil.example/"),
        (
            "https://\u0440\u0430\u0443\u0440\u0430l.com/",
            "https://xn--l-7sba6dbr.com/",
        ),  # not paypal
        ("evil.example/login", "https://evil.example/login"),
        ("write to boss@evil.example!", "mailto:boss@evil.example"),
        ("call +1 (555) 010-9999", "tel:+15550109999"),
    ],
)
def test_obfuscated_links_are_found_and_judged_in_canonical_form(body: str, link: str) -> None:
    verdict = send(world(4), body)
    assert verdict.outcome is Outcome.PENDING, verdict.reason
    assert verdict.card is not None and verdict.card.links == (link,)


@pytest.mark.parametrize(
    "body",
    [
        "hxxp://evil.example/login",  # defanged: no client follows it
        "evil[.]example",
        "report.pdf and e.g. this",  # a bare name without a path
        "xhttps://evil.example/",  # the scheme glued to a word
        "call 030 123456",  # no country: not a global number
    ],
)
def test_what_is_not_a_link(body: str) -> None:
    assert find_links(body) == ()
    assert send(world(4), body).outcome is Outcome.ALLOW


def test_too_many_links_refuse_the_call_rather_than_truncate() -> None:
    w = world(4)
    many = " ".join(f"https://h{i}.corp.example/" for i in range(limits.LINKS_PER_ARGUMENT_MAX + 1))
    refused = send(w, many)
    assert (refused.outcome, refused.reason) == (Outcome.DENY, Reason.TOO_MANY_LINKS)
    just = " ".join(f"https://h{i}.corp.example/" for i in range(limits.LINKS_PER_ARGUMENT_MAX))
    assert send(w, just).outcome is Outcome.ALLOW


def test_a_link_without_a_canonical_form_is_refused_like_any_target() -> None:
    verdict = send(world(4), "https://evil.example:99999/")
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.MALFORMED_TARGET)


def test_a_link_rule_that_names_a_mode_decides_it() -> None:
    w = World(overrides={"canonical_version": 4})
    w.admin(RegisterTool(CHAT))
    rules = [
        ToolRules(
            "chat.send",
            (
                TargetRule(RuleKind.ANY),
                TargetRule(RuleKind.HOST, "docs.example", ToolMode.OWNER_CONFIRM, role="link"),
            ),
        )
    ]
    w.add_agent("a", ["chat.send"], rules=rules)
    verdict = send(w, "https://docs.example/x")
    assert verdict.outcome is Outcome.PENDING
    assert verdict.card is not None and verdict.card.mode is ToolMode.OWNER_CONFIRM


def test_the_scanner_is_linear_on_hostile_text() -> None:
    size = limits.ARGUMENT_TEXT_BYTES_MAX
    hostile = [
        "a" * size,
        "a@" * (size // 2),
        "+1" * (size // 2),
        "http://a" + ")" * size,
        "a." * (size // 2) + "/",
        ("x" * 10 + "@") * (size // 11),
        "http://" * (size // 7),
    ]
    for text in hostile:
        start = time.perf_counter()
        with contextlib.suppress(TooManyLinks):
            find_links(text)
        assert time.perf_counter() - start < 0.5


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ht:/p.s@+1-ae() xH%", max_size=80))
def test_the_scanner_is_total_and_deterministic(text: str) -> None:
    try:
        first = find_links(text)
    except TooManyLinks:
        return
    assert find_links(text) == first


def test_a_card_decodes_its_links_with_or_without_a_confirmer() -> None:
    verdict = send(world(4), PHISH)
    assert verdict.card is not None
    for card in (verdict.card, replace(verdict.card, confirmer="")):
        decoded = _dec_card(_Reader(bytes(Encoder().blob(card.to_bytes()))))
        assert decoded == card
    without = replace(verdict.card, links=())
    assert b"login.evil.example" not in without.to_bytes()
    assert _dec_card(_Reader(bytes(Encoder().blob(without.to_bytes())))) == without
