"""Delegation an operator can predict (docs/policies.md, "A delegate without rules
defers"): on chains of authority version 3, a delegate whose own mandate has no rules for
a tool defers to its delegators' rules for the mode, which can only be as strict as or
stricter than theirs; on older chains its mandate pins the call at the tool's mode, as
it always did."""

from __future__ import annotations

from quorumgate.proto.model import (
    ArgCheck,
    Argument,
    ArgumentRule,
    DelegationPolicy,
    Outcome,
    Reason,
    RuleKind,
    TargetRule,
    Tier,
    ToolMode,
    ToolRules,
)
from tests.engine.harness import World, replay

KNOWN = "https://pay.example.com/acct/77"
NEW = "https://pay.example.com/acct/99"
# the delegator's: a known payee runs directly, anyone else waits for its principal
BOSS_RULES = [
    ToolRules(
        "payments.send",
        (TargetRule(RuleKind.EXACT, KNOWN, ToolMode.DIRECT), TargetRule(RuleKind.ANY)),
        (ArgumentRule("amount", ArgCheck.MAX, number="500"),),
    )
]


def _world(authority_version: int | None = None, **helper: object) -> tuple[World, bytes]:
    overrides = {"latch_cross_run_threshold": 1_000}
    if authority_version is not None:
        overrides["authority_version"] = authority_version
    w = World(overrides=overrides)
    w.add_tool("payments.send", mode=ToolMode.USER_CONFIRM, min_tier=Tier.DELEGATE)
    w.add_agent("boss", ["payments.send"], policy=DelegationPolicy.ATTENUATED, rules=BOSS_RULES)
    w.add_agent("helper", None, **helper)  # type: ignore[arg-type]
    grant = w.delegate("boss", "helper")
    assert grant.outcome is Outcome.APPLIED, grant.reason
    return w, grant.tx_id


def _pay(w: World, grant: bytes, target: str, amount: str = "120", run: str = "run-1") -> tuple:
    verdict = w.propose(
        "helper", "payments.send", target, run=run, grant=grant,
        args=(Argument("amount", text=amount),),
    )  # fmt: skip
    return verdict.outcome, verdict.reason


def test_a_delegate_without_rules_takes_its_delegators_known_payee_rule() -> None:
    w, g = _world()
    assert _pay(w, g, KNOWN) == (Outcome.ALLOW, Reason.OK)
    assert _pay(w, g, NEW) == (Outcome.PENDING, Reason.CONFIRMATION_REQUIRED)
    # the delegator's argument rules still hold for it
    assert _pay(w, g, KNOWN, "500.01") == (Outcome.DENY, Reason.OUT_OF_SCOPE)


def test_deferring_never_widens() -> None:
    """Every other layer keeps its say: the delegate's own rules when it has them, the
    grant's, every delegator's; the mode is the strictest of those that name one."""
    strict = [ToolRules("payments.send", (TargetRule(RuleKind.ANY, mode=ToolMode.USER_CONFIRM),))]
    w, g = _world(rules=strict)  # its own rule names user_confirm
    assert _pay(w, g, KNOWN) == (Outcome.PENDING, Reason.CONFIRMATION_REQUIRED)
    w, _ = _world()
    narrowed = w.delegate("boss", "helper", rules=strict, run="run-3")  # the grant's does
    assert _pay(w, narrowed.tx_id, KNOWN, run="run-3") == (
        Outcome.PENDING, Reason.CONFIRMATION_REQUIRED,
    )  # fmt: skip
    only_new = [ToolRules("payments.send", (TargetRule(RuleKind.EXACT, NEW),))]
    w, g = _world(rules=only_new)  # its own target rules still narrow
    assert _pay(w, g, KNOWN) == (Outcome.DENY, Reason.OUT_OF_SCOPE)


def test_along_a_chain_every_delegate_without_rules_defers_to_the_run_owner() -> None:
    w, g = _world()
    w.set_mandate("helper", None, policy=DelegationPolicy.ATTENUATED)
    w.add_agent("intern", None)
    onward = w.delegate("helper", "intern", parent_grant=g)
    assert onward.outcome is Outcome.APPLIED, onward.reason
    verdict = w.propose("intern", "payments.send", KNOWN, grant=onward.tx_id,
                        args=(Argument("amount", text="12"),))  # fmt: skip
    assert (verdict.outcome, verdict.reason) == (Outcome.ALLOW, Reason.OK)
    verdict = w.propose("intern", "payments.send", NEW, grant=onward.tx_id,
                        args=(Argument("amount", text="12"),))  # fmt: skip
    assert verdict.outcome is Outcome.PENDING


def test_a_master_only_tool_run_directly_by_the_delegator_refuses_the_delegate() -> None:
    w = World(overrides={"latch_cross_run_threshold": 1_000})
    w.add_tool("order.finalize", mode=ToolMode.USER_CONFIRM, min_tier=Tier.MASTER)
    direct = [ToolRules("order.finalize", (TargetRule(RuleKind.ANY, mode=ToolMode.DIRECT),))]
    w.add_agent("boss", ["order.finalize"], policy=DelegationPolicy.ATTENUATED, rules=direct)
    w.add_agent("helper", None)
    g = w.delegate("boss", "helper").tx_id
    assert w.propose("helper", "order.finalize", grant=g).reason is Reason.TIER_INSUFFICIENT


def test_chains_of_authority_version_2_keep_the_tools_mode() -> None:
    w, g = _world(authority_version=2)
    assert _pay(w, g, KNOWN) == (Outcome.PENDING, Reason.CONFIRMATION_REQUIRED)


def test_a_replay_reaches_the_same_verdicts_and_state_on_either_version() -> None:
    for version in (2, 3):
        w, g = _world(authority_version=version)
        _pay(w, g, KNOWN)
        _pay(w, g, NEW)
        engine, results = replay(w)
        assert [r.verdicts for r in results] == [r.verdicts for r in w.results]
        assert engine.state_root() == w.engine.state_root()
