"""Capability envelopes (the BRAH paper, §7.2-§7.3) and quotas."""

from __future__ import annotations

from nacl.public import SealedBox

from quorumgate.proto import names
from quorumgate.proto.model import (
    Admin,
    Argument,
    EnvelopeArg,
    Outcome,
    Reason,
    RegisterTool,
    ToolMode,
    ToolSpec,
)
from tests.engine.harness import World


def _world(**overrides: int) -> World:
    world = World(overrides=dict(overrides))
    world.add_sink("payments")
    world.add_sink("crm")
    world.add_tool(
        "payments.charge",
        sink="payments",
        envelope_args=(EnvelopeArg(name="card", kind="card", require_verified=False),),
    )
    world.add_tool(
        "crm.register",
        sink="crm",
        envelope_args=(EnvelopeArg(name="phone", kind="phone", require_verified=True),),
    )
    world.add_tool("crm.my_status", schemes=(), sink="crm", binds_caller=True)
    world.add_tool("kb.search")
    world.add_agent("alice", None)
    world.add_agent("mallory", None)
    return world


def _handle(world: World, signer: str, kind: str, secret: bytes, sinks: list[str]) -> str:
    verdict = world.seal(world.keys[signer], kind, secret, sinks)
    assert verdict.outcome is Outcome.APPLIED, verdict
    return verdict.subject


def test_sealing_registers_a_handle_of_the_documented_shape_owned_by_the_signer() -> None:
    world = _world()
    handle = _handle(world, "alice", "card", b"4111 1111 1111 1111", ["payments"])
    assert names.handle_kind(handle) == "card"
    record = world.engine.state.handles[handle]
    assert (record.owner, record.verified, record.sinks) == ("alice", False, ("payments",))


def test_engine_stores_only_ciphertext_that_the_sink_can_open() -> None:
    world = _world()
    secret = b"4111 1111 1111 1111"
    handle = _handle(world, "alice", "card", secret, ["payments", "crm"])
    for sink in ("payments", "crm"):
        ciphertext = world.engine.sealed_value(handle, sink)
        assert ciphertext is not None and secret not in ciphertext
        assert SealedBox(world.sinks[sink]).decrypt(ciphertext) == secret
    assert secret not in world.engine.state_bytes()


def test_owner_handle_in_an_allowed_sink_is_allowed() -> None:
    world = _world()
    handle = _handle(world, "alice", "card", b"4111", ["payments"])
    verdict = world.propose("alice", "payments.charge", args=[Argument(name="card", handle=handle)])
    assert verdict.outcome is Outcome.ALLOW


def test_a_handle_for_a_sink_it_was_not_sealed_to_is_a_handle_violation() -> None:
    world = _world()
    world.add_tool("crm.note", sink="crm", envelope_args=(EnvelopeArg(name="card", kind="card"),))
    handle = _handle(world, "alice", "card", b"4111", ["payments"])
    verdict = world.propose("alice", "crm.note", args=[Argument(name="card", handle=handle)])
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.HANDLE_VIOLATION)


def test_raw_values_where_an_envelope_is_declared_are_refused() -> None:
    world = _world()
    verdict = world.propose(
        "alice", "payments.charge", args=[Argument(name="card", text="4111 1111 1111 1111")]
    )
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.ENVELOPE_REQUIRED)


def test_raw_secret_named_arguments_are_refused_even_where_no_envelope_is_declared() -> None:
    world = _world()
    for name in ("password", "api_key", "Phone", "token"):
        verdict = world.propose("alice", "kb.search", args=[Argument(name=name, text="x")])
        assert verdict.reason is Reason.ENVELOPE_REQUIRED


def test_a_tool_needing_a_verified_kind_refuses_an_unverified_handle() -> None:
    world = _world()
    typed = _handle(world, "alice", "phone", b"+1 555 0100", ["crm"])
    verdict = world.propose("alice", "crm.register", args=[Argument(name="phone", handle=typed)])
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.HANDLE_KIND_MISMATCH)
    verified = world.seal(world.owner, "phone", b"+1 555 0100", ["crm"], owner_principal="alice")
    assert verified.outcome is Outcome.APPLIED and verified.principal == "alice"
    ok = world.propose(
        "alice", "crm.register", args=[Argument(name="phone", handle=verified.subject)]
    )
    assert ok.outcome is Outcome.ALLOW


def test_a_handle_of_another_kind_is_refused() -> None:
    world = _world()
    phone = _handle(world, "alice", "phone", b"+1 555 0100", ["payments"])
    verdict = world.propose("alice", "payments.charge", args=[Argument(name="card", handle=phone)])
    assert verdict.reason is Reason.HANDLE_KIND_MISMATCH


def test_only_the_owner_may_seal_for_another_principal() -> None:
    world = _world()
    verdict = world.seal(world.keys["mallory"], "phone", b"x", ["crm"], owner_principal="alice")
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.OWNER_ONLY_FIELD)


def test_sealing_to_an_unregistered_sink_is_rejected() -> None:
    world = _world()
    world.sinks["ghost"] = world.sinks["crm"]
    verdict = world.seal(world.keys["alice"], "card", b"x", ["ghost"])
    assert verdict.reason is Reason.UNKNOWN_SINK


def test_handles_are_bounded_per_principal() -> None:
    world = _world(handles_per_principal_max=2)
    _handle(world, "alice", "card", b"1", ["payments"])
    _handle(world, "alice", "card", b"2", ["payments"])
    verdict = world.seal(world.keys["alice"], "card", b"3", ["payments"])
    assert verdict.reason is Reason.CAPACITY_EXCEEDED
    assert world.seal(world.keys["mallory"], "card", b"4", ["payments"]).outcome is (
        Outcome.APPLIED
    )


def test_status_tools_bind_to_the_caller_and_take_no_arguments() -> None:
    world = _world()
    mine = world.propose("alice", "crm.my_status", "")
    assert (mine.outcome, mine.canonical_target) == (Outcome.ALLOW, "crm.my_status principal:alice")
    assert world.propose("alice", "crm.my_status", "CURRENT_USER").outcome is Outcome.ALLOW
    probe = world.propose(
        "alice", "crm.my_status", "", args=[Argument(name="lookup", text="+1 555 0100")]
    )
    assert (probe.outcome, probe.reason) == (Outcome.DENY, Reason.STATUS_TOOL_ARGUMENT)
    other = world.propose("alice", "crm.my_status", "principal:mallory")
    assert other.reason is Reason.CROSS_PRINCIPAL_TARGET


def test_a_status_tool_that_declares_arguments_or_targets_cannot_be_registered() -> None:
    world = _world()
    spec = ToolSpec(
        name="crm.lookup",
        mode=ToolMode.READ,
        sink="crm",
        envelope_args=(EnvelopeArg(name="phone", kind="phone"),),
        binds_caller=True,
    )
    verdict = world.one(world.owner, Admin(op=RegisterTool(spec=spec)))
    assert (verdict.outcome, verdict.reason) == (Outcome.REJECTED, Reason.INVALID_SPEC)


def test_quota_bounds_proposals_per_principal_in_a_sliding_window_of_block_time() -> None:
    world = _world(quota_proposals_max=3, quota_window_ms=10_000)
    reasons = [world.propose("alice", "kb.search", advance_ms=1_000).reason for _ in range(4)]
    assert reasons == [Reason.OK, Reason.OK, Reason.OK, Reason.QUOTA_EXCEEDED]
    # another principal has its own window
    assert world.propose("mallory", "kb.search").outcome is Outcome.ALLOW
    world.advance(8_000)  # the first proposals slide out of the window
    assert world.propose("alice", "kb.search").outcome is Outcome.ALLOW


def test_quota_refusals_do_not_count_and_do_not_touch_the_latch() -> None:
    world = _world(quota_proposals_max=1, quota_window_ms=10_000)
    world.set_mandate("alice", [])
    assert world.propose("alice", "kb.search").reason is Reason.OUT_OF_SCOPE
    for _ in range(5):
        assert world.propose("alice", "kb.search", advance_ms=100).reason is Reason.QUOTA_EXCEEDED
    run = world.engine.state.latch_runs[("alice", world.run_of("alice", "run-1"))]
    assert run.buckets[("alice", "kb.search")].count == 1  # the quota refusals left it alone
    assert len(world.engine.state.agents["alice"].recent_proposals_ms) == 1
