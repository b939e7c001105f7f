"""The `account:` scheme for account numbers that are not IBANs (docs/engine.md,
"Canonical targets"): `account:<issuer>/<number>`, one spelling per account, and aliases
that could name two accounts are kept apart or refused, never merged.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumgate.proto.chainversions import account_form
from quorumgate.proto.model import Outcome, RuleKind, SetEntries, TargetRule, ToolMode, ToolRules
from quorumgate.sidecar.engine.targets import TargetRefused, canonicalize_target
from tests.engine.harness import World

SCHEMES = ("account", "iban")


def canon(raw: str, version: int = 4) -> str:
    return canonicalize_target(raw, principal="a", schemes=SCHEMES, version=version)


def test_before_version_4_an_account_number_is_a_generic_uri_and_aliases_split() -> None:
    assert not account_form(3)
    # a generic URI keeps the case of its path: one account, two targets, a rule dodged
    assert canon("account:chase/AB12", 3) != canon("account:chase/ab12", 3)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("account:chase/000123456789", "account:chase/000123456789"),
        ("ACCOUNT:Chase/000123456789", "account:chase/000123456789"),
        ("account:chase/ab-12", "account:chase/AB-12"),
        ("account:bank.example/42", "account:bank.example/42"),
        (" account:chase/42 ", "account:chase/42"),
    ],
)
def test_aliases_that_name_one_account_merge(raw: str, canonical: str) -> None:
    assert canon(raw) == canonical
    assert canon(canonical) == canonical


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("account:chase/0123", "account:chase/123"),  # leading zeros are digits
        ("account:chase/123-4567", "account:chase/1234-567"),  # separators may be structure
        ("account:chase/1234567", "account:chase/123-4567"),
        ("account:chase/123", "account:chase-us/123"),  # another issuer
    ],
)
def test_aliases_that_may_name_two_accounts_stay_apart(a: str, b: str) -> None:
    assert canon(a) != canon(b)


@pytest.mark.parametrize(
    "raw",
    [
        "account:chase",  # no number
        "account:/123",  # no issuer
        "account:chase/",
        "account:chase/12 34",  # a space: grouping or two fields, we cannot tell
        "account:chase/12/34",
        "account:chase/-12",
        "account:chase/12--34",
        "account:chase/12%2034",
        "account:chase/\uff11\uff12",  # fullwidth digits
        "account:chase/\u0661\u0662",  # Arabic-Indic digits
        "account:ch\u0430se/12",  # a Cyrillic a in the issuer
        "account:-chase/12",
        "account:chase/12?x=1",
        "account:chase/12#x",
        "account:chase/" + "1" * 35,
    ],
)
def test_what_is_no_account(raw: str) -> None:
    with pytest.raises(TargetRefused):
        canon(raw)


def test_a_known_account_runs_directly_a_new_one_needs_confirmation() -> None:
    w = World(overrides={"canonical_version": 4})
    w.add_tool("payments.send", mode=ToolMode.USER_CONFIRM, schemes=("account",))
    rules = [
        ToolRules(
            "payments.send",
            (TargetRule(RuleKind.SET, "payees", ToolMode.DIRECT), TargetRule(RuleKind.ANY)),
        )
    ]
    w.add_agent("billing", ["payments.send"], rules=rules)
    w.admin(SetEntries("billing", "payees", (TargetRule(RuleKind.EXACT, "account:chase/AB12"),)))
    known = w.propose("billing", "payments.send", "ACCOUNT:Chase/ab12")
    assert known.outcome is Outcome.ALLOW, known.reason
    assert known.canonical_target == "payments.send account:chase/AB12"
    other = w.propose("billing", "payments.send", "account:chase/AB-12")
    assert other.outcome is Outcome.PENDING


@settings(max_examples=200, deadline=None)
@given(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.-]{0,10}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9]{1,5}(-[A-Za-z0-9]{1,5}){0,3}", fullmatch=True),
)
def test_every_canonical_account_is_a_fixed_point(issuer: str, number: str) -> None:
    try:
        got = canon(f"account:{issuer}/{number}")
    except TargetRefused:
        return
    assert canon(got) == got
