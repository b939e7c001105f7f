"""`quorumgate policy plan / apply`: the owner operations that make a
live cluster match a policy file, applied idempotently. The planner is a pure function
(tested on registries built here); `apply` runs against a live 4-node cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from quorumgate import cli
from quorumgate.ops.policyplan import plan
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import (
    Mandate,
    RegisterPrincipal,
    RuleKind,
    SetEntries,
    SetSettings,
    TargetRule,
    ToolMode,
    ToolRules,
    ToolSpec,
)
from quorumgate.sdk.registry import AgentEntry, Registry
from quorumgate.sdk.sync import SyncClient
from quorumgate.sidecar.engine.core import EngineConfig
from quorumgate.sidecar.policykit import load_policy

BILLING_KEY = SigningKey(b"b" * 32).verify_key.encode().hex()
DANA_KEY = SigningKey(b"d" * 32).verify_key.encode().hex()
VAULT_KEY = bytes(PrivateKey(b"v" * 32).public_key).hex()

POLICY = f"""
[settings]
latch_halt_threshold = 5
quota_agent_per_minute = 600

[sinks.plan-vault]
public_key = "{VAULT_KEY}"

[tools."plan.pay"]
mode = "user_confirm"
schemes = ["iban"]
min_tier = "delegate"
args = {{ amount = "amount" }}

[tools."plan.read"]
mode = "read"

[principals.plan-dana]
public_key = "{DANA_KEY}"

[agents.plan-billing]
principal = "plan-dana"
public_key = "{BILLING_KEY}"
allowed_tools = ["plan.pay", "plan.read"]

[agents.plan-billing.rules."plan.pay"]
targets = [{{ set = "payees", mode = "direct" }}, "any"]
args = {{ amount = {{ max = 500 }} }}

[agents.plan-billing.rules."plan.read"]
targets = [{{ host_suffix = "docs.example.com" }}]

[sets.plan-billing]
payees = [{{ exact = "iban:DE89370400440532013000" }}]
"""


def _policy(tmp_path: Path, text: str = POLICY) -> Any:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return load_policy(str(path))


def _config() -> EngineConfig:
    return EngineConfig(chain_id="c", owner_public_key=bytes(32))


def _empty() -> Registry:
    return Registry(height=1, state_root=b"", agents=(), tools=(), sinks=())


# ------------------------------------------------------------------ the planner (pure)


def test_an_empty_cluster_gets_every_operation_in_an_order_the_engine_accepts(
    tmp_path: Path,
) -> None:
    result = plan(_policy(tmp_path), _empty(), _config())
    assert result.errors == []
    assert [s.what for s in result.steps] == [
        "set-settings",
        "register-sink plan-vault",
        "register-tool plan.pay",
        "register-tool plan.read",
        "register-principal plan-dana",
        "register-agent plan-billing",
        "set-mandate plan-billing",
        "set-entries plan-billing.payees",
    ]
    settings = result.steps[0].op
    assert isinstance(settings, SetSettings)
    assert settings.values == (("latch_halt_threshold", 5), ("quota_agent_per_minute", 600))


def _matching(policy: Any) -> Registry:
    """The registry of a cluster that already matches `policy` (and has more)."""
    agent = AgentEntry(
        agent_id="plan-billing",
        public_key=bytes.fromhex(BILLING_KEY),
        mandate=policy.agents["plan-billing"],
        mandate_version=1,
        suspended=False,
        principal="plan-dana",
    )
    other = AgentEntry("someone", bytes(32), None, 0, False)
    return Registry(
        height=9,
        state_root=b"",
        agents=(agent, other),
        tools=(*policy.tools.values(), ToolSpec("elsewhere", ToolMode.READ)),
        sinks=(("plan-vault", bytes.fromhex(VAULT_KEY)),),
        principals=(RegisterPrincipal("plan-dana", bytes.fromhex(DANA_KEY)),),
        sets=(SetEntries("plan-billing", "payees", policy.sets[("plan-billing", "payees")]),),
        settings=(("latch_halt_threshold", 5), ("quota_agent_per_minute", 600)),
    )


def test_a_matching_cluster_needs_nothing_and_what_is_not_in_the_file_is_left_alone(
    tmp_path: Path,
) -> None:
    policy = _policy(tmp_path)
    result = plan(policy, _matching(policy), _config())
    assert (result.steps, result.errors) == ([], [])
    assert result.untouched == ["tool elsewhere", "agent someone"]


def test_only_what_differs_is_planned(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    registry = _matching(policy)
    changed = _policy(
        tmp_path,
        POLICY.replace("max = 500", "max = 250")
        .replace("quota_agent_per_minute = 600\n", "")
        .replace('payees = [{ exact = "iban:DE89370400440532013000" }]', ""),
    )
    result = plan(changed, registry, _config())
    assert [(s.what, s.why) for s in result.steps] == [
        ("set-settings", "quota_agent_per_minute"),  # cleared: back to cluster.json's
        ("set-mandate plan-billing", "differs: rules"),
        ("set-entries plan-billing.payees", "not in the file: deleted"),
    ]
    cleared = result.steps[0].op
    assert isinstance(cleared, SetSettings) and cleared.clear == ("quota_agent_per_minute",)


def test_what_the_log_cannot_change_is_an_error_not_a_step(tmp_path: Path) -> None:
    policy = _policy(
        tmp_path,
        POLICY.replace("[settings]\n", "[settings]\ntools_max = 5\n").replace(
            f'public_key = "{BILLING_KEY}"', f'public_key = "{"ab" * 32}"'
        ),
    )
    result = plan(policy, _matching(_policy(tmp_path)), _config())
    assert any(e.startswith("settings.tools_max: fixed in cluster.json") for e in result.errors)
    assert any(
        e.startswith("agents.plan-billing: registered with another key") for e in result.errors
    )
    no_key = _policy(tmp_path, POLICY.replace(f'public_key = "{DANA_KEY}"\n', ""))
    errors = plan(no_key, _empty(), _config()).errors
    assert errors == ["principals.plan-dana: not registered, and the file gives no public_key"]


# ------------------------------------------------------------------ apply, live


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_apply_makes_the_cluster_match_and_applying_twice_changes_nothing(
    cluster: ClusterSpec,
    owner: SyncClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    d = str(cluster.directory)
    code, doc = _cli(capsys, "policy", "plan", str(path), "--dir", d, "--json")
    assert code == 0 and doc["errors"] == [] and len(doc["steps"]) == 8
    code, doc = _cli(capsys, "policy", "apply", str(path), "--dir", d, "--json")
    assert code == 0, doc
    assert [r["outcome"] for r in doc["applied"]] == ["applied"] * 8
    registry = owner.registry()
    policy = load_policy(str(path))
    assert dict(registry.settings) == {"latch_halt_threshold": 5, "quota_agent_per_minute": 600}
    billing = registry.agent("plan-billing")
    assert billing is not None and billing.mandate == policy.agents["plan-billing"]
    assert billing.principal == "plan-dana" and billing.mandate_version == 1
    # twice: nothing to do, nothing submitted, the mandate version unchanged
    code, doc = _cli(capsys, "policy", "apply", str(path), "--dir", d, "--json")
    assert (code, doc["steps"], doc["applied"]) == (0, [], [])
    assert owner.registry().agent("plan-billing").mandate_version == 1  # type: ignore[union-attr]
    # one rule changed: one step
    path.write_text(POLICY.replace("max = 500", "max = 250"))
    code, doc = _cli(capsys, "policy", "plan", str(path), "--dir", d, "--json")
    assert [s["operation"] for s in doc["steps"]] == ["set-mandate plan-billing"]
    # a file asking what the log cannot change: nothing is applied, exit 2
    path.write_text(POLICY.replace("[settings]\n", "[settings]\npending_max = 3\n"))
    code, doc = _cli(capsys, "policy", "apply", str(path), "--dir", d, "--json")
    assert code == 2 and doc["errors"] and "applied" not in doc


def test_a_rejected_step_stops_apply_and_says_so(
    cluster: ClusterSpec,
    owner: SyncClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A tool whose sink the cluster does not know: the engine rejects its registration
    (unknown_sink), apply stops there and exits 1; nothing after it is submitted."""
    path = tmp_path / "bad.toml"
    text = """
[tools."plan.orphan"]
mode = "direct"
sink = "no-such-sink"
envelopes = { card = { kind = "card" } }

[agents.plan-orphan-user]
public_key = "KEY"
allowed_tools = ["plan.orphan"]
"""
    path.write_text(text.replace("KEY", SigningKey(b"o" * 32).verify_key.encode().hex()))
    code, doc = _cli(
        capsys, "policy", "apply", str(path), "--dir", str(cluster.directory), "--json"
    )
    assert code == 1
    # this file has no [settings]: any the log holds were cleared first (the file is
    # authoritative for them), then the tool was rejected, and nothing after it was sent
    applied = [(r["operation"], r["reason"]) for r in doc["applied"]]
    assert applied[-1] == ("register-tool plan.orphan", "unknown_sink")
    assert [op for op, _ in applied[:-1]] in ([], ["set-settings"])
    assert owner.registry().agent("plan-orphan-user") is None


def test_rules_and_roles_survive_the_registry_round_trip(owner: SyncClient) -> None:
    """What apply compares is what the registry returns: a mandate with rules (and roles)
    reads back equal, or every apply would plan it again."""
    rules = (ToolRules("web.get", (TargetRule(RuleKind.HOST_SUFFIX, "example.com"),)),)
    key = SigningKey.generate()
    owner.register_agent("plan-roundtrip", bytes(key.verify_key))
    mandate = Mandate(allowed_tools=("web.get",), rules=rules)
    owner.set_mandate("plan-roundtrip", mandate)
    entry = owner.registry().agent("plan-roundtrip")
    assert entry is not None and entry.mandate == mandate
