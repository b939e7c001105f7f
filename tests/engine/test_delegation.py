"""Delegation: a grant narrows its grantor's authority, it never widens it."""

from __future__ import annotations

from quorumgate.proto import codec, tx_pb2
from quorumgate.proto.model import (
    DelegationPolicy,
    Enforcement,
    Outcome,
    Reason,
    Resume,
    Suspend,
    Tier,
)
from tests.engine.harness import World, signing_key

ATT = DelegationPolicy.ATTENUATED
TOOLS = ("kb.search", "tickets.open", "wire.transfer", "db.drop")


def _world(
    parent_tools: list[str] | None,
    child_tools: list[str] | None = None,
    **parent: object,
) -> World:
    world = World()
    for tool in TOOLS:
        world.add_tool(tool)
    world.add_agent("parent", parent_tools, policy=ATT, **parent)  # type: ignore[arg-type]
    world.add_agent("child", child_tools, policy=ATT)
    world.add_agent("grandchild", None, policy=ATT)
    world.add_agent("bob", None)
    return world


def _grant(world: World, parent: str = "parent", child: str = "child", **kw: object) -> bytes:
    verdict = world.delegate(parent, child, **kw)  # type: ignore[arg-type]
    assert verdict.outcome is Outcome.APPLIED, verdict
    return verdict.tx_id


def test_child_scope_is_own_mandate_intersected_with_parent_scope() -> None:
    world = _world(["kb.search", "tickets.open"], ["tickets.open", "wire.transfer"])
    grant = _grant(world)
    assert world.propose("child", "tickets.open", grant=grant).outcome is Outcome.ALLOW
    assert (
        world.propose("child", "kb.search", grant=grant, run="run-1").reason is Reason.OUT_OF_SCOPE
    )
    # wire.transfer is in the child's own mandate but not the parent's: still refused
    verdict = world.propose("child", "wire.transfer", grant=grant)
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.OUT_OF_SCOPE)


def test_null_intersect_x_is_x_in_both_directions() -> None:
    world = _world(None, ["kb.search"])
    grant = _grant(world)
    assert world.propose("child", "kb.search", grant=grant).outcome is Outcome.ALLOW
    assert world.propose("child", "db.drop", grant=grant).reason is Reason.OUT_OF_SCOPE
    world2 = _world(["kb.search"], None)
    grant2 = _grant(world2)
    assert world2.propose("child", "kb.search", grant=grant2).outcome is Outcome.ALLOW
    assert world2.propose("child", "db.drop", grant=grant2).reason is Reason.OUT_OF_SCOPE


def test_an_empty_grant_survives_every_intersection() -> None:
    world = _world(None, None)
    grant = _grant(world, tools=[])
    for tool in TOOLS[:2]:
        assert world.propose("child", tool, grant=grant, run="run-1").outcome is Outcome.DENY


def test_requested_tools_narrow_the_grant() -> None:
    world = _world(["kb.search", "tickets.open"], None)
    grant = _grant(world, tools=["kb.search"])
    assert world.propose("child", "kb.search", grant=grant).outcome is Outcome.ALLOW
    assert world.propose("child", "tickets.open", grant=grant).reason is Reason.OUT_OF_SCOPE


def test_a_grant_wider_than_the_parent_is_refused() -> None:
    world = _world(["kb.search"], None)
    verdict = world.delegate("parent", "child", tools=["kb.search", "wire.transfer"])
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.DELEGATION_WIDENING)
    assert world.engine.state.grants == {}


def test_a_child_cannot_redelegate_more_than_it_was_granted() -> None:
    world = _world(None, None, depth=3)
    grant = _grant(world, tools=["kb.search"])
    wider = world.delegate("child", "grandchild", tools=["db.drop"], parent_grant=grant)
    assert wider.reason is Reason.DELEGATION_WIDENING
    # with no tool list, the grandchild gets at most what the child holds
    sub = _grant(world, "child", "grandchild", parent_grant=grant)
    assert world.propose("grandchild", "kb.search", grant=sub).outcome is Outcome.ALLOW
    assert world.propose("grandchild", "db.drop", grant=sub).reason is Reason.OUT_OF_SCOPE


def test_a_subgrant_never_outlives_its_parent_grant() -> None:
    world = _world(None, None, depth=3)
    grant = _grant(world, expires_in_ms=10_000)
    sub = _grant(world, "child", "grandchild", parent_grant=grant, expires_in_ms=60_000)
    assert world.engine.state.grants[sub].expires_at_ms == (
        world.engine.state.grants[grant].expires_at_ms
    )
    world.advance(20_000)
    assert world.propose("grandchild", "kb.search", grant=sub).reason is (Reason.DELEGATION_EXPIRED)


def test_widening_the_parent_later_does_not_widen_the_pinned_grant() -> None:
    world = _world(["kb.search"], None)
    grant = _grant(world)
    world.set_mandate("parent", ["kb.search", "db.drop"], policy=ATT)
    assert world.propose("child", "db.drop", grant=grant).reason is Reason.OUT_OF_SCOPE
    assert world.engine.state.grants[grant].grantor_mandate_version == 1


def test_narrowing_the_parent_stops_the_child_at_once() -> None:
    world = _world(["kb.search", "tickets.open"], None)
    grant = _grant(world)
    assert world.propose("child", "tickets.open", grant=grant).outcome is Outcome.ALLOW
    world.set_mandate("parent", ["kb.search"], policy=ATT)
    assert world.propose("child", "tickets.open", grant=grant).reason is Reason.OUT_OF_SCOPE


def test_parent_suspension_stops_the_child_and_resume_restores_it() -> None:
    world = _world(None, None)
    grant = _grant(world)
    assert world.propose("child", "kb.search", grant=grant).outcome is Outcome.ALLOW
    world.admin(Suspend(agent_id="parent"))
    verdict = world.propose("child", "kb.search", grant=grant)
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.SUSPENDED)
    world.admin(Resume(agent_id="parent"))
    assert world.propose("child", "kb.search", grant=grant).outcome is Outcome.ALLOW


def test_delegation_policy_other_than_attenuated_refuses() -> None:
    world = _world(None, None)
    world.set_mandate("parent", None, policy=DelegationPolicy.NONE)
    verdict = world.delegate("parent", "child")
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.DELEGATION_REFUSED)


def test_unknown_delegation_policy_on_the_wire_reads_as_none() -> None:
    msg = tx_pb2.TxBody(chain_id="c", nonce=1)
    msg.admin.set_mandate.agent_id = "a"
    msg.admin.set_mandate.delegation_policy = "ATTENUATED-ish"
    msg.admin.set_mandate.enforcement = "enforce-later"
    body = codec.decode_body(msg.SerializeToString())
    mandate = body.payload.op.mandate  # type: ignore[union-attr]
    assert mandate.delegation_policy is DelegationPolicy.NONE
    assert mandate.enforcement is Enforcement.ENFORCE  # unknown enforcement fails closed
    assert mandate.allowed_tools is None  # absent list: null, not []


def test_a_policy_change_after_delegation_stops_the_grant() -> None:
    world = _world(None, None)
    grant = _grant(world)
    world.set_mandate("parent", None, policy=DelegationPolicy.NONE)
    assert world.propose("child", "kb.search", grant=grant).reason is Reason.DELEGATION_REFUSED


def test_max_delegation_depth_zero_forbids_delegation() -> None:
    world = _world(None, None, depth=0)
    verdict = world.delegate("parent", "child")
    assert (verdict.outcome, verdict.reason) == (
        Outcome.REJECTED, Reason.DELEGATION_DEPTH_EXCEEDED,
    )  # fmt: skip


def test_depth_is_the_tightest_limit_on_the_chain() -> None:
    world = _world(None, None, depth=1)
    world.set_mandate(
        "child", None, policy=ATT, depth=5
    )  # the middle cannot raise the root's bound
    grant = _grant(world)
    verdict = world.delegate("child", "grandchild", parent_grant=grant)
    assert verdict.reason is Reason.DELEGATION_DEPTH_EXCEEDED


def test_a_chain_within_depth_works_and_tightening_later_stops_it() -> None:
    world = _world(None, None, depth=2)
    grant = _grant(world)
    sub = _grant(world, "child", "grandchild", parent_grant=grant)
    verdict = world.propose("grandchild", "kb.search", grant=sub)
    assert (verdict.outcome, verdict.tier, verdict.delegate_of) == (
        Outcome.ALLOW, Tier.DELEGATE, "child",
    )  # fmt: skip
    world.set_mandate("parent", None, policy=ATT, depth=1)
    assert world.propose("grandchild", "kb.search", grant=sub).reason is (
        Reason.DELEGATION_DEPTH_EXCEEDED
    )


def test_any_enforce_up_the_chain_enforces() -> None:
    world = _world(["kb.search"], None)  # parent enforces
    world.set_mandate("child", None, policy=ATT, enforcement=Enforcement.OBSERVE)
    grant = _grant(world)
    assert world.propose("child", "db.drop", grant=grant).reason is Reason.OUT_OF_SCOPE
    both_observe = _world(["kb.search"], None, enforcement=Enforcement.OBSERVE)
    both_observe.set_mandate("child", None, policy=ATT, enforcement=Enforcement.OBSERVE)
    grant2 = _grant(both_observe)
    assert both_observe.propose("child", "db.drop", grant=grant2).outcome is Outcome.FLAG


def test_grants_expire_in_block_time() -> None:
    world = _world(None, None)
    grant = _grant(world, expires_in_ms=5_000)
    assert world.propose("child", "kb.search", grant=grant).outcome is Outcome.ALLOW
    world.advance(10_000)
    verdict = world.propose("child", "kb.search", grant=grant)
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.DELEGATION_EXPIRED)


def test_grant_expiry_must_be_in_the_future_and_within_the_limit() -> None:
    world = _world(None, None)
    assert world.delegate("parent", "child", expires_in_ms=-5_000).reason is (
        Reason.DELEGATION_EXPIRY_INVALID
    )
    too_long = world.config.grant_ttl_ms_max + 10_000
    assert world.delegate("parent", "child", expires_in_ms=too_long).reason is (
        Reason.DELEGATION_EXPIRY_INVALID
    )


def test_revoked_grants_stop_the_child_and_every_subgrant() -> None:
    world = _world(None, None, depth=3)
    grant = _grant(world)
    sub = _grant(world, "child", "grandchild", parent_grant=grant)
    assert world.revoke(world.keys["parent"], grant).outcome is Outcome.APPLIED
    assert world.propose("child", "kb.search", grant=grant).reason is Reason.DELEGATION_REVOKED
    assert world.propose("grandchild", "kb.search", grant=sub).reason is Reason.DELEGATION_REVOKED


def test_only_a_delegator_on_the_chain_or_the_owner_may_revoke() -> None:
    world = _world(None, None, depth=3)
    grant = _grant(world)
    sub = _grant(world, "child", "grandchild", parent_grant=grant)
    assert world.revoke(world.keys["bob"], grant).reason is Reason.NOT_GRANTOR
    assert world.revoke(world.keys["grandchild"], sub).reason is Reason.NOT_GRANTOR
    assert world.revoke(world.keys["parent"], sub).outcome is Outcome.APPLIED  # from above
    assert world.revoke(world.owner, grant).outcome is Outcome.APPLIED


def test_a_grant_is_bound_to_its_child_key_and_run() -> None:
    world = _world(None, None)
    grant = _grant(world, run="run-7")
    stolen = world.propose("bob", "kb.search", grant=grant, run="run-7")
    assert (stolen.outcome, stolen.reason) == (Outcome.DENY, Reason.DELEGATION_MISMATCH)
    other_run = world.propose("child", "kb.search", grant=grant, run="run-8")
    assert other_run.reason is Reason.DELEGATION_MISMATCH
    unknown = world.propose("child", "kb.search", grant=b"\x01" * 32)
    assert unknown.reason is Reason.DELEGATION_UNKNOWN


def test_delegated_calls_run_in_the_parents_run_and_share_its_halt() -> None:
    world = _world(["kb.search", "tickets.open"], None)
    grant = _grant(world, tools=["kb.search"])
    # a child's denial latches the child's bucket, not the tool for the parent
    assert world.propose("child", "tickets.open", grant=grant).reason is Reason.OUT_OF_SCOPE
    assert world.propose("parent", "tickets.open").outcome is Outcome.ALLOW
    # ... but the halt is run-wide
    world.propose("child", "tickets.open", grant=grant)
    assert world.propose("child", "tickets.open", grant=grant).reason is Reason.RUN_HALTED
    assert world.propose("parent", "kb.search").reason is Reason.RUN_HALTED


def test_a_new_parent_mandate_clears_the_childs_buckets_it_shaped() -> None:
    world = _world(["kb.search"], None)
    grant = _grant(world)
    assert world.propose("child", "tickets.open", grant=grant).reason is Reason.OUT_OF_SCOPE
    world.set_mandate("parent", ["kb.search", "tickets.open"], policy=ATT)
    # the pinned grant still does not cover tickets.open, but the answer is re-derived
    # (out_of_scope again, not repeat_denied): the latch's licence lapsed with the version
    assert world.propose("child", "tickets.open", grant=grant).reason is Reason.OUT_OF_SCOPE


def test_self_delegation_and_unknown_children_are_refused() -> None:
    world = _world(None, None)
    assert world.delegate("parent", "parent").reason is Reason.INVALID_SPEC
    world.keys["ghost"] = signing_key("ghost")
    assert world.delegate("parent", "ghost").reason is Reason.UNKNOWN_AGENT


def test_the_owner_cannot_delegate_or_propose() -> None:
    world = _world(None, None)
    world.keys["owner"] = world.owner
    verdict = world.propose("owner", "kb.search")
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.NOT_AN_AGENT)
