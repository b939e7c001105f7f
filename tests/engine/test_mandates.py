"""Mandates and verdicts (docs/engine.md, "Tools, mandates and verdicts")."""

from __future__ import annotations

import pytest

from quorumgate.proto.model import (
    DENIAL_TEXT,
    Argument,
    Enforcement,
    Mandate,
    Outcome,
    Proposal,
    Reason,
    RegisterAgent,
    Resume,
    Suspend,
)
from quorumgate.sidecar.engine.statements import Verdict
from tests.engine.harness import World, signing_key


def _world() -> World:
    world = World()
    for tool in ("kb.search", "tickets.open", "wire.transfer"):
        world.add_tool(tool)
    return world


def test_null_allowed_tools_is_unrestricted() -> None:
    world = _world()
    world.add_agent("alice", None)
    for tool in ("kb.search", "tickets.open", "wire.transfer"):
        assert world.propose("alice", tool).outcome is Outcome.ALLOW


def test_empty_allowed_tools_permits_nothing() -> None:
    world = _world()
    world.add_agent("alice", [])
    verdict = world.propose("alice", "kb.search")
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.OUT_OF_SCOPE)


def test_allowed_tools_list_permits_exactly_its_tools() -> None:
    world = _world()
    world.add_agent("alice", ["kb.search"])
    assert world.propose("alice", "kb.search").outcome is Outcome.ALLOW
    assert world.propose("alice", "tickets.open", run="r2").reason is Reason.OUT_OF_SCOPE


def test_mandate_tool_names_are_canonicalized_like_calls() -> None:
    world = _world()
    world.add_agent("alice", ["  KB.Search "])
    assert world.propose("alice", "kb.SEARCH").outcome is Outcome.ALLOW


def test_mandate_refuses_a_bare_string_for_allowed_tools() -> None:
    with pytest.raises(ValueError):
        Mandate(allowed_tools="kb.search")  # type: ignore[arg-type]


def test_observe_allows_out_of_scope_and_flags_it() -> None:
    world = _world()
    world.add_agent("alice", ["kb.search"], enforcement=Enforcement.OBSERVE)
    verdict = world.propose("alice", "wire.transfer")
    assert (verdict.outcome, verdict.reason) == (Outcome.FLAG, Reason.OUT_OF_SCOPE_OBSERVED)
    assert verdict.agent_message == ""
    # observe is not a latch: it never escalates
    for _ in range(4):
        assert world.propose("alice", "wire.transfer").outcome is Outcome.FLAG
    assert world.propose("alice", "kb.search").outcome is Outcome.ALLOW


def test_no_mandate_denies_everything() -> None:
    world = _world()
    key = signing_key("fresh")
    world.keys["fresh"] = key
    world.admin(RegisterAgent(agent_id="fresh", public_key=bytes(key.verify_key)))
    verdict = world.propose("fresh", "kb.search")
    assert (verdict.outcome, verdict.reason, verdict.mandate_version) == (
        Outcome.DENY, Reason.NO_MANDATE, 0,
    )  # fmt: skip


def test_suspended_mandate_denies_even_in_scope_tools() -> None:
    world = _world()
    world.add_agent("alice", None, suspended=True)
    verdict = world.propose("alice", "kb.search")
    assert (verdict.outcome, verdict.reason) == (Outcome.DENY, Reason.SUSPENDED)


def test_suspend_and_resume_toggle_without_a_new_version() -> None:
    world = _world()
    world.add_agent("alice", None)
    version = world.engine.mandate_of("alice")[1]
    world.admin(Suspend(agent_id="alice"))
    assert world.propose("alice", "kb.search").reason is Reason.SUSPENDED
    world.admin(Resume(agent_id="alice"))
    assert world.propose("alice", "kb.search").outcome is Outcome.ALLOW
    assert world.engine.mandate_of("alice")[1] == version


def test_every_verdict_carries_the_mandate_version() -> None:
    world = _world()
    world.add_agent("alice", ["kb.search"])
    assert world.propose("alice", "kb.search").mandate_version == 1
    world.set_mandate("alice", ["kb.search", "tickets.open"])
    assert world.propose("alice", "kb.search").mandate_version == 2
    assert world.propose("alice", "wire.transfer").mandate_version == 2


def test_every_denial_tells_the_agent_one_fixed_sentence() -> None:
    world = _world()
    world.add_agent("alice", ["kb.search"])
    world.add_agent("zed", None, suspended=True)
    denials: list[Verdict] = [
        world.propose("alice", "wire.transfer"),
        world.propose("alice", "wire.transfer"),
        world.propose("alice", "wire.transfer"),
        world.propose("alice", "nope.tool", run="r2"),
        world.propose("alice", "kb.search", "principal:zed", run="r3"),
        world.propose("zed", "kb.search"),
    ]
    reasons = {v.reason for v in denials}
    assert len(reasons) == 6  # six different reasons ...
    assert {v.agent_message for v in denials} == {DENIAL_TEXT}  # ... one sentence
    assert DENIAL_TEXT == "This action is not permitted."


def test_reprs_of_proposals_and_arguments_never_print_argument_values() -> None:
    secret = "ACC-1-SECRET-VALUE"
    arg = Argument(name="account", text=secret)
    proposal = Proposal(run_id="r", tool="wire.transfer", target="", arguments=(arg,))
    for rendered in (repr(arg), str(arg), repr(proposal), str(proposal), f"{proposal}",
                     repr((proposal,)), repr({"p": arg})):  # fmt: skip
        assert secret not in rendered
        assert "account" in rendered


def test_verdicts_and_errors_never_carry_argument_values() -> None:
    world = _world()
    world.add_agent("alice", ["kb.search"])
    secret = "VALUE-7f3c-DO-NOT-LEAK"
    verdicts = [
        world.propose("alice", "kb.search", args=[Argument(name="query", text=secret)]),
        world.propose("alice", "wire.transfer", args=[Argument(name="amount", text=secret)]),
        world.propose("alice", "kb.search", args=[Argument(name="user_id", text=secret)]),
    ]
    for verdict in verdicts:
        assert secret not in repr(verdict)
        assert secret.encode() not in verdict.statement("qg-test", 1)
    assert verdicts[0].argument_names == ("query",)
    with pytest.raises(ValueError) as exc:
        Argument(name="x", text=secret, handle="h_x_0123456789abcdef")
    assert secret not in str(exc.value)
