"""`quorumgate.card_matches` (docs/policies.md, "Checking a card against what you meant"):
a card the engine built is compared with the call a person meant in the engine's one
spelling; a look-alike target never matches."""

from __future__ import annotations

import pytest

import quorumgate
from quorumgate.proto.model import Outcome
from quorumgate.sidecar.engine.statements import ConfirmationCard
from quorumgate.sidecar.policyfile import DEFAULT_RUN, STEP_MS, CallSpec, parse_policy
from quorumgate.sidecar.policykit import _Runner

POLICY = {
    "tools": {
        "pay": {
            "mode": "user_confirm", "min_tier": "delegate",
            "schemes": ["https", "iban", "mailto", "file"],
            "roles": {"cc": {"schemes": ["mailto"], "max": 4}},
        },
    },
    "agents": {"billing": {"allowed_tools": ["pay"]}},
}  # fmt: skip


def _card(target: str, also: list[tuple[str, str]] | None = None) -> ConfirmationCard:
    """The card the engine builds for billing's call of `pay` on `target`."""
    runner = _Runner(parse_policy(POLICY))
    runner.setup()
    call = CallSpec(
        index=0, name="c", agent="billing", tool="pay", target=target, also=also or [],
        run=DEFAULT_RUN, args={"amount": "120"}, handles={}, via=None, advance_ms=STEP_MS,
        expect="pending", reason=None, confirm=None,
    )  # fmt: skip
    verdict = runner.propose(call)
    assert verdict.outcome is Outcome.PENDING and verdict.card is not None, verdict.reason
    return verdict.card


@pytest.mark.parametrize(
    ("shown", "meant"),
    [
        ("iban:GB82WEST12345698765432", "iban:gb82 west 1234 5698 7654 32"),
        ("https://pay.example.com/acct/77", "https://PAY.Example.COM/acct/77"),
        ("mailto:bob@example.com", "mailto:bob@EXAMPLE.com"),
        ("/docs/a.txt", "/docs/./a.txt"),
    ],
)
def test_the_same_target_in_another_spelling_matches(shown: str, meant: str) -> None:
    card = _card(shown)
    assert quorumgate.card_matches(card, tool="pay", target=meant) == ()
    assert quorumgate.card_matches(card, tool="PAY", target=meant, arguments={"amount": "x"}) == ()


@pytest.mark.parametrize(
    ("shown", "meant"),
    [
        # homoglyphs: a Cyrillic a, a Greek omicron, a digit one for an l
        ("https://p\u0430y.example.com/acct/77", "https://pay.example.com/acct/77"),
        ("https://g\u03bfogle.example/", "https://google.example/"),
        ("https://paypa1.example/", "https://paypal.example/"),
        ("mailto:bob@ex\u0430mple.com", "mailto:bob@example.com"),
        # trailing dots: a longer name, a path, a host the person wrote with a final dot
        ("https://pay.example.com.evil.example/acct/77", "https://pay.example.com/acct/77"),
        ("/docs/a.txt.", "/docs/a.txt"),
        ("https://pay.example.com/acct/77", "https://pay.example.com./acct/77"),
        ("mailto:bob@example.com", "mailto:bob@example.com."),
        # case where case is meaning: a path, a mailbox's local part
        ("/docs/A.txt", "/docs/a.txt"),
        ("https://pay.example.com/ACCT/77", "https://pay.example.com/acct/77"),
        ("mailto:Bob@example.com", "mailto:bob@example.com"),
        # one character apart, another account
        ("iban:GB82WEST12345698765432", "iban:GB82WEST12345698765433"),
    ],
)
def test_a_look_alike_target_never_matches(shown: str, meant: str) -> None:
    differences = quorumgate.card_matches(_card(shown), tool="pay", target=meant)
    assert len(differences) == 1 and differences[0].startswith("target:"), differences


def test_another_tool_or_further_target_differs() -> None:
    card = _card("mailto:ann@example.com", [("cc", "mailto:bob@example.com")])
    assert quorumgate.card_matches(card, tool="mail.send", target="mailto:ann@example.com")
    assert quorumgate.card_matches(
        card, tool="pay", target="mailto:ann@example.com",
        further_targets=[("cc", "mailto:BOB@Example.com")],
    ) == ("further targets: the card's are cc mailto:bob@example.com",)  # fmt: skip
    assert quorumgate.card_matches(
        card, tool="pay", target="mailto:ann@example.com",
        further_targets=[("cc", "mailto:bob@example.com")],
    ) == ()  # fmt: skip
    assert quorumgate.card_matches(card, tool="pay", target="mailto:ann@example.com")


def test_argument_values_are_compared_on_an_open_card_and_never_printed() -> None:
    card = _card("iban:GB82WEST12345698765432")
    open_card = quorumgate.OpenCard(card, (("amount", "120"),), (0,))
    target = "iban:GB82WEST12345698765432"
    assert quorumgate.card_matches(open_card, tool="pay", target=target,
                                   arguments={"amount": "120"}) == ()  # fmt: skip
    differs = quorumgate.card_matches(open_card, tool="pay", target=target,
                                      arguments={"amount": "1200"})  # fmt: skip
    assert differs == ("argument amount: the card's value is not the one meant",)
    assert "1200" not in str(differs) and "120" not in str(differs)
    lacking = quorumgate.card_matches(card, tool="pay", target=target,
                                      arguments={"amount": "1", "memo": "m"})  # fmt: skip
    assert lacking == ("arguments: the card has none besides, lacks memo",)


def test_confirm_refuses_a_card_that_is_not_the_call_expected() -> None:
    """`quorumgate confirm --expect-tool --expect-target` checks the card with
    `card_matches` before asking: a look-alike is refused, the call meant goes on."""
    from quorumgate.cli import build_parser
    from quorumgate.ops.clientcli import card_differs
    from quorumgate.sidecar.engine.targets import CANONICAL_VERSION_LATEST

    card = _card("https://pay.example.com.evil.example/acct/77")

    def differs(*extra: str) -> str | None:
        args = build_parser().parse_args(["confirm", "--dir", "d", "ab" * 32, *extra])
        return card_differs(args, card, CANONICAL_VERSION_LATEST)

    assert differs() is None  # nothing expected: the person reads the card
    meant = ["--expect-tool", "pay", "--expect-target", "https://pay.example.com/acct/77"]
    assert (differs(*meant) or "").startswith("target:")
    shown = ["--expect-tool", "pay", "--expect-target", "HTTPS://pay.example.com.evil.example/acct/77"]
    assert differs(*shown) is None
    assert "NAME=VALUE" in (differs(*shown, "--expect-also", "cc") or "")
