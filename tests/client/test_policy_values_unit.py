"""Policies from the SDK without a cluster (docs/sdk.md): every owner operation and rule
type is a top-level name, `tool_rules` writes rules as the policy file does, and a grant
made with `delegate(rules=...)` narrows what the child may call, as the engine judges it."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from nacl.signing import SigningKey

import quorumgate
from quorumgate.proto.clusterfile import init_cluster
from quorumgate.proto.model import Delegate, Outcome, Proposal, Reason, TxPayload
from quorumgate.sdk.client import Client
from quorumgate.sidecar.policyfile import parse_policy
from quorumgate.sidecar.policykit import _Runner, agent_key

OWNER_NAMES = (
    "Admin", "RegisterTool", "RegisterAgent", "RegisterPrincipal", "RegisterSink",
    "SetMandate", "Suspend", "Resume", "SetEntries", "SetSettings",
)  # fmt: skip
RULE_NAMES = (
    "Mandate", "ToolSpec", "ToolMode", "TargetRule", "RuleKind", "ToolRules", "ArgumentRule",
    "ArgCheck", "Grant", "tool_rules",
)  # fmt: skip

POLICY = {
    "tools": {"http.get": {"mode": "read", "schemes": ["https"]}},
    "agents": {
        "lead": {"allowed_tools": ["http.get"], "delegation_policy": "attenuated"},
        "helper": {"allowed_tools": "unrestricted"},
    },
}


def test_every_owner_operation_and_rule_type_is_a_top_level_name() -> None:
    from quorumgate.proto import model

    for name in OWNER_NAMES + RULE_NAMES:
        assert name in quorumgate.__all__, name
        value = getattr(quorumgate, name)
        if name not in ("Grant", "tool_rules"):
            assert value is getattr(model, name)


def test_tool_rules_reads_rules_as_the_policy_file_does() -> None:
    rules = quorumgate.tool_rules(
        "Payments.Send", [{"set": "payees", "mode": "direct"}, "any"], {"amount": {"max": 500}}
    )
    assert rules == quorumgate.ToolRules(
        "payments.send",
        (
            quorumgate.TargetRule(quorumgate.RuleKind.SET, "payees", quorumgate.ToolMode.DIRECT),
            quorumgate.TargetRule(quorumgate.RuleKind.ANY),
        ),
        (quorumgate.ArgumentRule("amount", quorumgate.ArgCheck.MAX, number="500"),),
    )
    with pytest.raises(ValueError, match="targets"):
        quorumgate.tool_rules("http.get", [])
    with pytest.raises(ValueError, match="unknown field 'exakt'"):
        quorumgate.tool_rules("http.get", [{"exakt": "https://a.example/"}])


def _delegate_payload(tmp_path: Path, **kwargs: object) -> Delegate:
    """The Delegate a client would submit, captured instead of sent."""
    client = Client(init_cluster(tmp_path / "c", 4), SigningKey.generate())
    sent: list[TxPayload] = []

    async def applied(payload: TxPayload, deadline_s: float | None) -> object:
        sent.append(payload)
        return SimpleNamespace(proposal_id=b"\x01" * 32)

    client._applied = applied  # type: ignore[method-assign]
    child = bytes(agent_key("helper").verify_key)
    asyncio.run(client.delegate(child, "run-1", ["http.get"], ttl_s=600, **kwargs))  # type: ignore[arg-type]
    (payload,) = sent
    assert isinstance(payload, Delegate)
    return payload


def test_a_grant_with_rules_narrows_the_childs_targets(tmp_path: Path) -> None:
    """The lead may read anything over https; its grant, made with the SDK's `rules=`,
    lets the helper read only docs.example. The engine refuses the helper elsewhere."""
    narrowed = quorumgate.tool_rules("http.get", [{"host_suffix": "docs.example"}])
    payload = _delegate_payload(tmp_path, rules=[narrowed])
    assert payload.rules == (narrowed,)
    runner = _Runner(parse_policy(POLICY))
    runner.setup()
    # the kit's engine runs on its own clock: the grant expires by that clock
    payload = dataclasses.replace(payload, expires_at_ms=runner.time_ms + 600_000)
    (granted,) = runner.block([runner._signed(runner.keys["lead"], payload)])
    assert granted.outcome is Outcome.APPLIED, granted.reason

    def helper_reads(target: str) -> tuple[Outcome, Reason]:
        call = Proposal("run-1", "http.get", target, (), granted.tx_id)
        (verdict,) = runner.block([runner._signed(runner.keys["helper"], call)])
        return verdict.outcome, verdict.reason

    assert helper_reads("https://api.docs.example/v1") == (Outcome.ALLOW, Reason.OK)
    assert helper_reads("https://evil.example/exfil") == (Outcome.DENY, Reason.OUT_OF_SCOPE)
    # without rules the same grant passes the lead's whole scope on
    assert _delegate_payload(tmp_path / "2").rules == ()


def test_a_grant_rule_for_a_tool_outside_the_grant_is_refused_before_sending(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        _delegate_payload(tmp_path, rules=[quorumgate.tool_rules("mail.send", ["any"])])
