"""A suite's policy, read by the policy file's own reader (docs/policies.md).

`SuitePolicy` holds the policy in the file's words; the mandate and the named sets the
harness sets on a live cluster are parsed from those words by `sidecar/policyfile.py`
(`tool_rules`, `parse_sets`), and `policy_toml` writes the same policy as a file that
`quorumgate policy test` and `policy apply` read, so the three cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quorumgate.bench.injection.model import Suite
from quorumgate.bench.injection.suites import TOOLS
from quorumgate.proto.model import Mandate, TargetRule
from quorumgate.sdk.builders import mandate, tool_rules
from quorumgate.sidecar.policyfile import parse_sets

AGENT = "agent"  # the agent's name in a suite's policy file
HELPER = "helper"
DELEGATION_DEPTH_MAX = 1  # the agent may delegate to its helper, the helper to no one


def suite_mandate(suite: Suite) -> Mandate:
    """The agent's mandate: the suite's tools with their rules; it may delegate to a
    helper, narrowing only (`attenuated`)."""
    rules = [
        tool_rules(tool, list(body["targets"]), body.get("args"))  # type: ignore[call-overload]
        for tool, body in suite.policy.rules.items()
    ]
    return mandate(
        list(suite.policy.tools),
        rules=rules,
        delegation_policy="attenuated",
        max_delegation_depth=DELEGATION_DEPTH_MAX,
    )


def helper_mandate(suite: Suite) -> Mandate:
    """The helper's mandate: the same tools and no rules, so that under a grant it names
    no mode and its delegator's rules decide (docs/policies.md, "A delegate without rules
    defers")."""
    return mandate(list(suite.policy.tools))


def suite_sets(suite: Suite) -> dict[str, tuple[TargetRule, ...]]:
    parsed = parse_sets({AGENT: {name: list(e) for name, e in suite.policy.sets.items()}})
    return {name: entries for (_, name), entries in parsed.items()}


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _key(name: str) -> str:
    return name if name.replace("_", "").replace("-", "").isalnum() else _toml(name)


def policy_toml(suite: Suite) -> str:
    """The suite's tools, principal, agent, helper and sets as a policy file."""
    lines = []
    for name in sorted({*suite.policy.tools}):
        spec: dict[str, Any] = dict(TOOLS[name])
        spec["args"] = spec.pop("arguments", None)
        spec["untrusted"] = spec.pop("untrusted_results", None)
        roles = spec.pop("roles", None)
        if roles:
            spec["roles"] = {r: {"schemes": s, "max": m} for r, (s, m) in roles.items()}
        lines.append(f"[tools.{_toml(name)}]")
        lines += [f"{k} = {_toml(v)}" for k, v in spec.items() if v is not None]
        lines.append("")
    lines += ["[principals]", f"{suite.principal} = {{}}", ""]
    tools = _toml(list(suite.policy.tools))
    lines += [
        f"[agents.{AGENT}]",
        f'principal = "{suite.principal}"',
        f"allowed_tools = {tools}",
        'delegation_policy = "attenuated"',
        f"max_delegation_depth = {DELEGATION_DEPTH_MAX}",
        "",
    ]
    for tool, body in suite.policy.rules.items():
        lines.append(f"[agents.{AGENT}.rules.{_toml(tool)}]")
        lines += [f"{k} = {_toml(v)}" for k, v in body.items()]
        lines.append("")
    lines += [
        f"[agents.{HELPER}]",
        f'principal = "{suite.principal}"',
        f"allowed_tools = {tools}",
        "",
    ]
    if suite.policy.sets:
        lines.append(f"[sets.{AGENT}]")
        lines += [f"{name} = {_toml(list(e))}" for name, e in suite.policy.sets.items()]
    return "\n".join(lines) + "\n"
