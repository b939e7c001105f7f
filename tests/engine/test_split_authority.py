"""Split authority (the BRAH paper, §6.3-§6.4): the model proposes, and only the
human principal the run acts for (or the owner, for `owner_confirm`) answers the card.

Each attack of the issue is a test here; on a chain of authority version 1 (the rules of
tests/engine/test_confirmations.py) the first ones succeed."""

from __future__ import annotations

import hashlib

import pytest

from quorumgate.proto.model import Admin as AdminTx
from quorumgate.proto.model import (
    Argument,
    Confirm,
    DelegationPolicy,
    Outcome,
    Proposal,
    Reason,
    RegisterAgent,
    RegisterPrincipal,
    RuleKind,
    SealedValue,
    SealEnvelope,
    SetEntries,
    TargetRule,
    Tier,
    ToolMode,
    ToolRules,
)
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.statements import CardMismatch, card_values
from tests.engine.harness import World, replay, signing_key

WRONG = hashlib.sha256(b"not the card").digest()


def _world(**overrides: int) -> World:
    world = World(overrides=dict(overrides))
    world.add_sink("payments")
    world.add_tool("payments.send", mode=ToolMode.USER_CONFIRM)
    world.add_tool("payments.big", mode=ToolMode.USER_CONFIRM, min_tier=Tier.MASTER)
    world.add_tool("channel.publish", mode=ToolMode.OWNER_CONFIRM)
    world.add_tool("kb.search", mode=ToolMode.READ)
    world.add_principal("pat")
    world.add_principal("quinn")
    world.add_agent("planner", None, policy=DelegationPolicy.ATTENUATED, principal="pat")
    world.add_agent("helper", None, principal="pat")
    world.add_agent("other", None, principal="quinn")
    world.add_agent("orphan", None)  # no principal: acts for the owner
    return world


def _answer(world: World, who: str, verdict: object, **kw: bool) -> tuple[Outcome, Reason]:
    key = world.owner if who == "owner" else world.keys[who]
    pid, digest = verdict.proposal_id, verdict.card_digest  # type: ignore[attr-defined]
    answered = world.confirm(key, pid, digest, **kw)
    return answered.outcome, answered.reason


# ------------------------------------------------------------------ who may confirm


@pytest.mark.parametrize("tool", ["payments.send", "payments.big"])
def test_the_proposer_cannot_confirm_its_own_call(tool: str) -> None:
    """The attack: the proposer of a user_confirm payment confirmed it itself (with the
    default min_tier, and with min_tier master on its own mandate)."""
    world = _world()
    pending = world.propose("planner", tool)
    assert pending.outcome is Outcome.PENDING
    refused = (Outcome.REJECTED, Reason.CONFIRMER_NOT_AUTHORIZED)
    assert _answer(world, "planner", pending) == refused
    assert pending.proposal_id in world.engine.state.pending
    assert _answer(world, "principal:pat", pending) == (Outcome.ALLOW, Reason.OK)


def test_no_agent_key_confirms_not_even_the_master_of_a_delegate() -> None:
    world = _world()
    grant = world.delegate("planner", "helper", tools=["payments.send"]).tx_id
    pending = world.propose("helper", "payments.send", grant=grant)
    assert pending.outcome is Outcome.PENDING and pending.card is not None
    assert pending.card.confirmer == "principal:pat"  # the person the run acts for
    for agent in ("helper", "planner", "other", "orphan"):
        assert _answer(world, agent, pending) == (
            Outcome.REJECTED, Reason.CONFIRMER_NOT_AUTHORIZED,
        )  # fmt: skip
    assert _answer(world, "principal:pat", pending) == (Outcome.ALLOW, Reason.OK)


def test_only_the_runs_principal_answers_not_another_principal_nor_the_owner() -> None:
    world = _world()
    pending = world.propose("other", "payments.send")
    refused = (Outcome.REJECTED, Reason.CONFIRMER_NOT_AUTHORIZED)
    assert _answer(world, "principal:pat", pending) == refused
    assert _answer(world, "owner", pending) == refused
    assert _answer(world, "principal:quinn", pending) == (Outcome.ALLOW, Reason.OK)


def test_owner_confirm_is_answered_by_the_owner_alone() -> None:
    world = _world()
    pending = world.propose("planner", "channel.publish")
    assert pending.card is not None and pending.card.confirmer == "@owner"
    refused = (Outcome.REJECTED, Reason.CONFIRMER_NOT_AUTHORIZED)
    assert _answer(world, "principal:pat", pending) == refused
    assert _answer(world, "planner", pending) == refused
    assert _answer(world, "owner", pending) == (Outcome.ALLOW, Reason.OK)


def test_an_agent_without_a_principal_has_its_cards_answered_by_the_owner() -> None:
    world = _world()
    pending = world.propose("orphan", "payments.send")
    assert pending.card is not None and pending.card.confirmer == "@owner"
    assert _answer(world, "orphan", pending)[1] is Reason.CONFIRMER_NOT_AUTHORIZED
    assert _answer(world, "owner", pending) == (Outcome.ALLOW, Reason.OK)


# ------------------------------------------------------------------ cards a human can judge


def test_the_card_names_its_confirmer_and_the_signed_body_gives_every_value() -> None:
    world = _world()
    world.add_tool(
        "payments.card",
        mode=ToolMode.USER_CONFIRM,
        sink="payments",
        envelope_args=(),
    )
    handle = world.seal(world.keys["planner"], "card", b"SEALED-not-shown", ["payments"]).subject
    pending = world.propose(
        "planner", "payments.card", "https://bank.example/pay",
        args=[Argument(name="amount", text="120.00"), Argument(name="card", handle=handle),
              Argument(name="memo", text="rent\nMarch")],
    )  # fmt: skip
    card = pending.card
    assert card is not None
    signed = world.log[-1][2][0]
    values = card_values(card, signed)
    assert values == (("amount", "120.00"), ("card", f"handle:{handle}"), ("memo", "rent\nMarch"))
    text = card.render(values)
    assert "To be confirmed or rejected by: principal pat only" in text
    assert '  amount = "120.00"' in text and f"  card = handle:{handle}" in text
    assert '  memo = "rent\\u{a}March"' in text
    assert "SEALED" not in text and b"120.00" not in card.to_bytes()
    # another body under the same nonce is not the card's: refused, not shown
    forged = world.tx(
        world.keys["planner"],
        Proposal(run_id="run-1", tool="payments.card", target="https://evil.example/pay"),
        nonce=world.nonces[bytes(world.keys["planner"].verify_key)],
    )
    with pytest.raises(CardMismatch):
        card_values(card, forged)


# ------------------------------------------------------------------ reject, lock, expiry


def test_the_principal_rejects_and_the_card_leaves_the_state_at_once() -> None:
    world = _world()
    pending = world.propose("planner", "payments.send")
    assert _answer(world, "principal:pat", pending, reject=True) == (
        Outcome.DENY, Reason.CONFIRMATION_REJECTED,
    )  # fmt: skip
    assert pending.proposal_id not in world.engine.state.pending
    late = world.confirm(world.keys["principal:pat"], pending.proposal_id, pending.card_digest)
    assert (late.outcome, late.reason) == (Outcome.REJECTED, Reason.UNKNOWN_PROPOSAL)


def test_a_reject_from_anyone_else_changes_nothing() -> None:
    world = _world()
    pending = world.propose("planner", "payments.send")
    for who in ("planner", "owner", "principal:quinn"):
        assert _answer(world, who, pending, reject=True)[1] is Reason.CONFIRMER_NOT_AUTHORIZED
    assert pending.proposal_id in world.engine.state.pending


def test_three_wrong_digests_from_the_confirmer_lock_the_proposal() -> None:
    world = _world()
    pending = world.propose("planner", "payments.send")
    pat = world.keys["principal:pat"]
    for _ in range(2):
        wrong = world.confirm(pat, pending.proposal_id, WRONG)
        assert (wrong.outcome, wrong.reason) == (Outcome.REJECTED, Reason.CARD_DIGEST_MISMATCH)
    locked = world.confirm(pat, pending.proposal_id, WRONG)
    assert (locked.outcome, locked.reason) == (Outcome.DENY, Reason.CARD_LOCKED)
    assert pending.proposal_id not in world.engine.state.pending
    assert pending.proposal_id not in world.engine.state.wrong_digests
    right = world.confirm(pat, pending.proposal_id, pending.card_digest)
    assert right.reason is Reason.UNKNOWN_PROPOSAL


def test_wrong_digests_from_others_cannot_lock_a_call_out() -> None:
    world = _world()
    pending = world.propose("planner", "payments.send")
    for who in ("planner", "owner", "principal:quinn", "planner", "owner"):
        key = world.owner if who == "owner" else world.keys[who]
        assert world.confirm(key, pending.proposal_id, WRONG).outcome is Outcome.REJECTED
    assert pending.proposal_id not in world.engine.state.wrong_digests
    assert _answer(world, "principal:pat", pending) == (Outcome.ALLOW, Reason.OK)


def test_an_expired_card_leaves_the_state_at_once() -> None:
    world = _world(confirmation_ttl_ms=10_000)
    pending = world.propose("planner", "payments.send")
    pat = bytes(world.keys["principal:pat"].verify_key)
    assert [c.proposal_id for c in world.engine.cards_for(pat)] == [pending.proposal_id]
    world.advance(10_000)
    assert pending.proposal_id not in world.engine.state.pending
    assert world.engine.cards_for(pat) == ()
    late = world.confirm(world.keys["principal:pat"], pending.proposal_id, pending.card_digest)
    assert late.reason is Reason.UNKNOWN_PROPOSAL


def test_cards_for_lists_exactly_the_cards_a_key_may_answer() -> None:
    world = _world()
    mine = world.propose("planner", "payments.send")
    theirs = world.propose("other", "payments.send")
    owners = world.propose("planner", "channel.publish")
    orphan = world.propose("orphan", "payments.send")
    engine = world.engine

    def ids(key: bytes) -> set[bytes]:
        return {card.proposal_id for card in engine.cards_for(key)}

    assert ids(bytes(world.keys["principal:pat"].verify_key)) == {mine.proposal_id}
    assert ids(bytes(world.keys["principal:quinn"].verify_key)) == {theirs.proposal_id}
    assert ids(bytes(world.owner.verify_key)) == {owners.proposal_id, orphan.proposal_id}
    assert ids(bytes(world.keys["planner"].verify_key)) == set()


# ------------------------------------------------------------------ key classes


def test_a_principal_only_answers_cards() -> None:
    world = _world()
    pat = world.keys["principal:pat"]
    call = world.one(pat, Proposal(run_id="r", tool="kb.search", target="https://x.example/"))
    assert (call.outcome, call.reason) == (Outcome.REJECTED, Reason.NOT_AN_AGENT)
    sealed = (SealedValue(sink="payments", ciphertext=b"x" * 48),)
    seal = world.one(pat, SealEnvelope(kind="card", sealed=sealed))
    assert seal.reason is Reason.NOT_AN_AGENT
    data = world.tx(pat, Proposal(run_id="r", tool="kb.search", target="https://x.example/"))
    assert world.engine.admission_check(data).reason is Reason.NOT_AN_AGENT


def test_key_classes_do_not_mix() -> None:
    world = _world()
    agent_key = bytes(world.keys["planner"].verify_key)
    principal_key = bytes(world.keys["principal:pat"].verify_key)
    owner_key = bytes(world.owner.verify_key)
    for key in (agent_key, owner_key):
        v = world.one(world.owner, AdminTx(op=RegisterPrincipal(principal_id="x", public_key=key)))
        assert (v.outcome, v.reason) == (Outcome.REJECTED, Reason.KEY_IN_USE)
    v = world.one(world.owner, AdminTx(op=RegisterAgent(agent_id="x", public_key=principal_key)))
    assert (v.outcome, v.reason) == (Outcome.REJECTED, Reason.KEY_IN_USE)
    fresh = bytes(signing_key("fresh").verify_key)
    v = world.one(
        world.owner,
        AdminTx(op=RegisterAgent(agent_id="x", public_key=fresh, principal="nobody")),
    )
    assert (v.outcome, v.reason) == (Outcome.REJECTED, Reason.UNKNOWN_PRINCIPAL)
    other_key = bytes(signing_key("another").verify_key)
    rotate = world.one(
        world.owner, AdminTx(op=RegisterPrincipal(principal_id="pat", public_key=other_key))
    )
    assert rotate.reason is Reason.KEY_IN_USE  # a new key is a new principal id


def test_an_agent_may_be_moved_to_another_principal_by_the_owner() -> None:
    world = _world()
    key = bytes(world.keys["helper"].verify_key)
    world.admin(RegisterAgent(agent_id="helper", public_key=key, principal="quinn"))
    pending = world.propose("helper", "payments.send")
    assert pending.card is not None and pending.card.confirmer == "principal:quinn"
    world.admin(RegisterAgent(agent_id="helper", public_key=key))
    assert world.propose("helper", "payments.send").card.confirmer == "@owner"  # type: ignore[union-attr]


def test_a_principals_answer_cannot_be_replayed() -> None:
    world = _world()
    pending = world.propose("planner", "payments.send")
    pat = world.keys["principal:pat"]
    data = world.tx(pat, Confirm(pending.proposal_id, pending.card_digest))
    assert world.block([data]).verdicts[0].outcome is Outcome.ALLOW
    again = world.block([data]).verdicts[0]
    assert (again.outcome, again.reason) == (Outcome.REJECTED, Reason.REPLAYED)


def test_a_chain_of_authority_version_1_has_no_principals_and_no_reject() -> None:
    world = World(overrides={"authority_version": 1})
    world.add_tool("payments.send", mode=ToolMode.USER_CONFIRM)
    world.add_agent("planner", None)
    key = bytes(signing_key("p").verify_key)
    v = world.one(world.owner, AdminTx(op=RegisterPrincipal(principal_id="p", public_key=key)))
    assert (v.outcome, v.reason) == (Outcome.REJECTED, Reason.INVALID_SPEC)
    pending = world.propose("planner", "payments.send")
    assert pending.card is not None and pending.card.confirmer == ""
    rejected = _answer(world, "planner", pending, reject=True)
    assert rejected == (Outcome.REJECTED, Reason.INVALID_SPEC)
    assert _answer(world, "planner", pending) == (Outcome.ALLOW, Reason.OK)  # version 1 rules


# ------------------------------------------------------------------ state


def test_principals_and_wrong_digests_survive_the_state_bytes_and_a_replay() -> None:
    world = _world()
    pending = world.propose("planner", "payments.send")
    world.confirm(world.keys["principal:pat"], pending.proposal_id, WRONG)
    state = world.engine.state
    assert state.wrong_digests == {pending.proposal_id: 1}
    copy = Engine.from_state_bytes(world.config, world.engine.state_bytes())
    assert copy.state_bytes() == world.engine.state_bytes()
    assert copy.state.principal_by_key == state.principal_by_key
    assert copy.state.agent_principal == {"planner": "pat", "helper": "pat", "other": "quinn"}
    engine, results = replay(world)
    assert engine.state_root() == world.engine.state_root()
    assert [r.verdicts for r in results] == [r.verdicts for r in world.results]


# ------------------------------------------------------------------ the principal's sets


def test_the_principal_confirms_a_new_payee_then_keeps_it_in_its_agents_payees() -> None:
    """Confirmations fall on what is new: the principal confirms a payment to a new payee,
    then adds the payee to the agent's `payees` set itself (a principal keeps the named
    sets of the agents acting for it); the next payment runs directly. No agent, and no
    other principal, can edit that set."""
    world = _world()
    rules = (
        ToolRules(
            "payments.send",
            (TargetRule(RuleKind.SET, "payees", ToolMode.DIRECT), TargetRule(RuleKind.ANY)),
        ),
    )
    world.set_mandate("planner", ["payments.send"], rules=rules)
    payee = "https://pay.example.com/acct/77"
    first = world.propose("planner", "payments.send", payee)
    assert first.outcome is Outcome.PENDING
    assert _answer(world, "principal:pat", first) == (Outcome.ALLOW, Reason.OK)
    entries = SetEntries("planner", "payees", (TargetRule(RuleKind.EXACT, payee),))
    for who, reason in (("planner", Reason.NOT_OWNER), ("principal:quinn", Reason.NOT_OWNER)):
        refused = world.one(world.keys[who], AdminTx(op=entries))
        assert (refused.outcome, refused.reason) == (Outcome.REJECTED, reason), who
    data = world.tx(world.keys["principal:pat"], AdminTx(op=entries))
    assert world.engine.admission_check(data).accepted
    applied = world.block([data]).verdicts[0]
    assert (applied.outcome, applied.principal) == (Outcome.APPLIED, "principal:pat")
    assert world.propose("planner", "payments.send", payee).outcome is Outcome.ALLOW
    other = world.propose("planner", "payments.send", "https://pay.example.com/acct/99")
    assert other.outcome is Outcome.PENDING  # a new payee: the person is asked again
    # a principal keeps sets only: every other owner operation stays the owner's
    widen = AdminTx(op=RegisterAgent(agent_id="x", public_key=bytes(signing_key("x").verify_key)))
    assert world.one(world.keys["principal:pat"], widen).reason is Reason.NOT_AN_AGENT


# ------------------------------------------------------------------ deputies


def test_a_principal_names_deputies_who_may_answer_its_cards_too() -> None:
    """A card is confirmed only by its principal (or a principal it names as deputy)."""
    world = _world()
    pat, quinn = world.keys["principal:pat"], world.keys["principal:quinn"]
    pending = world.propose("planner", "payments.send")
    assert _answer(world, "principal:quinn", pending)[1] is Reason.CONFIRMER_NOT_AUTHORIZED
    name = RegisterPrincipal(
        principal_id="pat", public_key=bytes(pat.verify_key), deputies=("quinn",)
    )
    # quinn cannot make itself pat's deputy; pat can
    assert world.one(quinn, AdminTx(op=name)).reason is Reason.NOT_OWNER
    assert world.one(pat, AdminTx(op=name)).outcome is Outcome.APPLIED
    quinn_key = bytes(quinn.verify_key)
    assert [c.proposal_id for c in world.engine.cards_for(quinn_key)] == [pending.proposal_id]
    assert pending.card is not None
    assert "(or a deputy it names)" in pending.card.render()
    assert _answer(world, "principal:quinn", pending) == (Outcome.ALLOW, Reason.OK)
    # pat takes the deputy back: from then on quinn answers nothing of pat's
    later = world.propose("planner", "payments.send")
    unname = RegisterPrincipal(principal_id="pat", public_key=bytes(pat.verify_key))
    assert world.one(pat, AdminTx(op=unname)).outcome is Outcome.APPLIED
    assert world.engine.cards_for(quinn_key) == ()
    assert _answer(world, "principal:quinn", later)[1] is Reason.CONFIRMER_NOT_AUTHORIZED


def test_deputies_are_registered_principals_and_a_principal_changes_nothing_else() -> None:
    world = _world()
    pat = world.keys["principal:pat"]
    pat_key = bytes(pat.verify_key)
    unknown = RegisterPrincipal(principal_id="pat", public_key=pat_key, deputies=("nobody",))
    assert world.one(pat, AdminTx(op=unknown)).reason is Reason.UNKNOWN_PRINCIPAL
    other_key = bytes(signing_key("another").verify_key)
    rekey = RegisterPrincipal(principal_id="pat", public_key=other_key)
    assert world.one(pat, AdminTx(op=rekey)).reason is Reason.NOT_OWNER  # no key change
    quinn_key = bytes(world.keys["principal:quinn"].verify_key)
    for_quinn = RegisterPrincipal(principal_id="quinn", public_key=quinn_key, deputies=("pat",))
    assert world.one(pat, AdminTx(op=for_quinn)).reason is Reason.NOT_OWNER
    # the owner may name them too, and they survive the state bytes
    world.admin(RegisterPrincipal(principal_id="quinn", public_key=quinn_key, deputies=("pat",)))
    copy = Engine.from_state_bytes(world.config, world.engine.state_bytes())
    assert copy.state.principals["quinn"].deputies == ("pat",)
    assert copy.state_bytes() == world.engine.state_bytes()
