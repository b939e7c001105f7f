"""Confirmation on chains of authority version 1 (the BRAH paper, §6.3-§6.4, §6.8): the
proposer, its master or the owner answers a card. New chains use version 2 (principals,
tests/engine/test_split_authority.py); these rules stay so that a replay of an old chain's
log decides every old confirmation as it was decided."""

from __future__ import annotations

import hashlib

from quorumgate.proto.model import (
    Argument,
    DelegationPolicy,
    Outcome,
    Reason,
    Suspend,
    Tier,
    ToolMode,
    TxKind,
)
from quorumgate.proto.tx import parse
from quorumgate.sidecar.engine.statements import CARD_HEADER
from tests.engine.harness import World


def _world(**overrides: int) -> World:
    world = World(overrides={"authority_version": 1, **overrides})
    world.add_tool("kb.search", mode=ToolMode.READ)
    world.add_tool("tickets.open", mode=ToolMode.DIRECT)
    world.add_tool("order.cancel", mode=ToolMode.USER_CONFIRM, schemes=("principal",))
    world.add_tool("payments.refund", mode=ToolMode.USER_CONFIRM, min_tier=Tier.MASTER)
    world.add_tool("channel.publish", mode=ToolMode.OWNER_CONFIRM)
    world.add_tool("vault.rotate", mode=ToolMode.DIRECT, min_tier=Tier.MASTER)
    world.add_agent("alice", None, policy=DelegationPolicy.ATTENUATED)
    world.add_agent("assistant", None)
    world.add_agent("bob", None)
    return world


def test_read_and_direct_tools_are_allowed_directly() -> None:
    world = _world()
    assert world.propose("alice", "kb.search").outcome is Outcome.ALLOW
    assert world.propose("alice", "tickets.open").outcome is Outcome.ALLOW


def test_confirm_tools_are_never_allowed_directly_they_become_pending_with_a_card() -> None:
    world = _world()
    for tool in ("payments.refund", "channel.publish"):
        verdict = world.propose("alice", tool)
        assert (verdict.outcome, verdict.reason) == (Outcome.PENDING, Reason.CONFIRMATION_REQUIRED)
        assert verdict.card is not None and verdict.card_digest == verdict.card.digest
        assert world.engine.pending_card(verdict.proposal_id) == verdict.card


def test_card_is_built_from_canonical_bound_parameters_not_agent_text() -> None:
    world = _world()
    lure = "Click confirm to receive a FREE gift"
    verdict = world.propose(
        "alice", "order.cancel", "CURRENT_USER", args=[Argument(name="Note", text=lure)]
    )
    card = verdict.card
    assert card is not None
    assert card.canonical_target == "order.cancel principal:alice"
    assert card.principal == "alice" and card.tier is Tier.MASTER
    assert card.argument_names == ("note",)
    rendered = card.render()
    assert rendered.startswith(CARD_HEADER)
    assert lure not in rendered and lure.encode() not in card.to_bytes()
    # the card binds the exact signed body (values included) by digest, not by copy
    body = world.log[-1][2][0]
    assert card.body_digest == hashlib.sha256(parse(body).signed.body).digest()


def test_confirm_by_the_principal_with_the_card_digest_allows_the_call() -> None:
    world = _world()
    pending = world.propose("alice", "order.cancel", "CURRENT_USER")
    verdict = world.confirm(world.keys["alice"], pending.proposal_id, pending.card_digest)
    assert (verdict.kind, verdict.outcome, verdict.reason) == (
        TxKind.CONFIRM, Outcome.ALLOW, Reason.OK,
    )  # fmt: skip
    assert verdict.proposal_id == pending.proposal_id
    assert verdict.canonical_target == pending.canonical_target
    assert world.engine.pending_card(pending.proposal_id) is None
    again = world.confirm(world.keys["alice"], pending.proposal_id, pending.card_digest)
    assert again.reason is Reason.UNKNOWN_PROPOSAL  # settled once


def test_confirmation_with_a_wrong_card_digest_is_refused_and_the_call_stays_pending() -> None:
    world = _world()
    pending = world.propose("alice", "order.cancel", "CURRENT_USER")
    other = world.propose("alice", "payments.refund")
    wrong = world.confirm(world.keys["alice"], pending.proposal_id, other.card_digest)
    assert (wrong.outcome, wrong.reason) == (Outcome.REJECTED, Reason.CARD_DIGEST_MISMATCH)
    right = world.confirm(world.keys["alice"], pending.proposal_id, pending.card_digest)
    assert right.outcome is Outcome.ALLOW


def test_confirmation_after_expiry_in_block_time_is_refused() -> None:
    world = _world(confirmation_ttl_ms=30_000)
    pending = world.propose("alice", "order.cancel", "CURRENT_USER")
    world.advance(40_000)
    late = world.confirm(world.keys["alice"], pending.proposal_id, pending.card_digest)
    assert (late.outcome, late.reason) == (Outcome.REJECTED, Reason.CONFIRMATION_EXPIRED)
    assert world.engine.pending_card(pending.proposal_id) is None


def test_expired_pending_calls_are_pruned_after_the_retention_window() -> None:
    world = _world(confirmation_ttl_ms=1_000, expired_retention_ms=5_000)
    pending = world.propose("alice", "order.cancel", "CURRENT_USER")
    world.advance(2_000)
    assert pending.proposal_id in world.engine.state.pending  # expired, still answerable
    world.advance(10_000)
    assert world.engine.state.pending == {}


def test_only_the_principal_or_the_owner_may_confirm_a_user_confirm_call() -> None:
    world = _world()
    pending = world.propose("alice", "order.cancel", "CURRENT_USER")
    stranger = world.confirm(world.keys["bob"], pending.proposal_id, pending.card_digest)
    assert (stranger.outcome, stranger.reason) == (
        Outcome.REJECTED, Reason.CONFIRMER_NOT_AUTHORIZED,
    )  # fmt: skip
    owner = world.confirm(world.owner, pending.proposal_id, pending.card_digest)
    assert owner.outcome is Outcome.ALLOW


def test_owner_confirm_calls_need_the_owner() -> None:
    world = _world()
    pending = world.propose("alice", "channel.publish")
    own = world.confirm(world.keys["alice"], pending.proposal_id, pending.card_digest)
    assert own.reason is Reason.CONFIRMER_NOT_AUTHORIZED
    assert world.confirm(world.owner, pending.proposal_id, pending.card_digest).outcome is (
        Outcome.ALLOW
    )


def test_delegate_tier_confirmation_of_a_master_tier_tool_is_refused() -> None:
    world = _world()
    grant = world.delegate("alice", "assistant").tx_id
    pending = world.propose("assistant", "payments.refund", grant=grant)
    assert pending.outcome is Outcome.PENDING and pending.card is not None
    assert pending.card.tier is Tier.DELEGATE
    by_delegate = world.confirm(world.keys["assistant"], pending.proposal_id, pending.card_digest)
    assert (by_delegate.outcome, by_delegate.reason) == (
        Outcome.REJECTED, Reason.TIER_INSUFFICIENT,
    )  # fmt: skip
    by_master = world.confirm(world.keys["alice"], pending.proposal_id, pending.card_digest)
    assert by_master.outcome is Outcome.ALLOW


def test_a_delegate_may_confirm_a_delegate_tier_tool() -> None:
    world = _world()
    grant = world.delegate("alice", "assistant").tx_id
    pending = world.propose("assistant", "order.cancel", "CURRENT_USER", grant=grant)
    verdict = world.confirm(world.keys["assistant"], pending.proposal_id, pending.card_digest)
    assert verdict.outcome is Outcome.ALLOW


def test_a_direct_master_tier_tool_refuses_a_delegate() -> None:
    world = _world()
    grant = world.delegate("alice", "assistant").tx_id
    assert world.propose("assistant", "vault.rotate", grant=grant).reason is (
        Reason.TIER_INSUFFICIENT
    )
    assert world.propose("alice", "vault.rotate").outcome is Outcome.ALLOW


def test_a_confirmation_is_judged_again_against_the_current_state() -> None:
    world = _world()
    pending = world.propose("alice", "order.cancel", "CURRENT_USER")
    world.admin(Suspend(agent_id="alice"))
    verdict = world.confirm(world.owner, pending.proposal_id, pending.card_digest)
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.SUSPENDED)
    # a denial at confirmation writes an artifact for the call like any other denial
    artifact = world.results[-1].artifacts[0]
    assert artifact.canonical_target == pending.canonical_target
    assert artifact.denials[0].proposal_id == pending.proposal_id


def test_a_narrowed_mandate_between_proposal_and_confirmation_denies() -> None:
    world = _world()
    pending = world.propose("alice", "payments.refund")
    world.set_mandate("alice", ["kb.search"])
    verdict = world.confirm(world.keys["alice"], pending.proposal_id, pending.card_digest)
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.OUT_OF_SCOPE)


def test_pending_calls_are_bounded_per_principal() -> None:
    world = _world(pending_per_principal_max=2)
    assert world.propose("alice", "payments.refund").outcome is Outcome.PENDING
    assert world.propose("alice", "payments.refund").outcome is Outcome.PENDING
    third = world.propose("alice", "payments.refund")
    assert (third.outcome, third.reason) == (Outcome.DENY, Reason.PENDING_LIMIT)
    assert world.propose("bob", "payments.refund").outcome is Outcome.PENDING
