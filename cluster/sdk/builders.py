"""Builders: the model's values from loose inputs, sorted and checked as the chain wants them.

`tool_spec` and `mandate` are what an owner registers (docs/policies.md); `call_arguments`
turns a name -> value mapping into a proposal's arguments, a `Handle` becoming a handle
argument rather than text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from quorumgate.proto.model import (
    Argument,
    EnvelopeArg,
    Mandate,
    ToolMode,
    ToolRules,
    ToolSpec,
    canonical_tool_list,
)
from quorumgate.sdk.values import Handle

__all__ = ["call_arguments", "mandate", "tool_rules", "tool_spec"]


def call_arguments(
    arguments: Sequence[Argument] | Mapping[str, str | Handle],
) -> tuple[Argument, ...]:
    """A proposal's arguments: a mapping's values as text, or as handles where they are a
    `Handle`; a sequence of `Argument`s as it is."""
    if isinstance(arguments, Mapping):
        out = []
        for name, value in arguments.items():
            if isinstance(value, Handle):
                out.append(Argument(name, handle=str(value)))
            else:
                out.append(Argument(name, text=value))
        return tuple(out)
    return tuple(arguments)


def tool_spec(
    name: str,
    mode: ToolMode | str = ToolMode.DIRECT,
    *,
    sink: str | None = None,
    schemes: Sequence[str] = (),
    envelopes: Sequence[EnvelopeArg] = (),
    min_tier: str | None = None,
    binds_caller: bool = False,
    arguments: Mapping[str, str] | None = None,
    direct_override: bool = False,
    roles: Mapping[str, tuple[Sequence[str], int]] | None = None,
    target_optional: bool = False,
    untrusted_results: bool = False,
) -> ToolSpec:
    """A `ToolSpec` from loose inputs: schemes and envelope arguments sorted for you.

    `min_tier` ("delegate" or "master") is what a confirm-gated tool must state (chains of
    authority version 2 refuse one without it, `tier_undeclared`); left out, it is
    `delegate`, undeclared. `arguments` declares the plain arguments by role (`{"to":
    "recipient", "amount": "amount", "note": "text"}`; roles identity, recipient, amount,
    credential, text): the engine then refuses any other argument and any identity sent;
    a `direct` tool with a recipient, amount or credential needs `direct_override=True`,
    which the ledger records. `roles` declares further targets by role, each with its
    schemes and how many one call may carry (`{"recipient": (["mailto"], 10)}`);
    `target_optional` lets a call leave the main target out. `untrusted_results`: its
    results carry content nobody vouches for (web pages, outside mail), so a run that
    calls it is exposed and rules' `when_exposed` modes apply (docs/provenance.md)."""
    from quorumgate.proto.model import ArgRole, ArgSpec, TargetSlot, Tier

    declared = tuple(ArgSpec(arg, ArgRole(role)) for arg, role in sorted((arguments or {}).items()))
    return ToolSpec(
        name=name,
        mode=ToolMode(mode),
        sink=sink,
        target_schemes=tuple(sorted(set(schemes))),
        envelope_args=tuple(sorted(envelopes, key=lambda e: e.name)),
        min_tier=Tier(min_tier or Tier.DELEGATE.value),
        binds_caller=binds_caller,
        arguments=declared,
        direct_override=direct_override,
        min_tier_declared=min_tier is not None,
        target_roles=tuple(
            TargetSlot(role, tuple(sorted(set(slot_schemes))), most)
            for role, (slot_schemes, most) in sorted((roles or {}).items())
        ),
        target_optional=target_optional,
        untrusted_results=untrusted_results,
    )


def mandate(
    tools: Sequence[str] | None,
    *,
    enforcement: str = "enforce",
    suspended: bool = False,
    delegation_policy: str = "none",
    max_delegation_depth: int | None = None,
    rules: Sequence[ToolRules] = (),
) -> Mandate:
    """A `Mandate` from loose inputs. `tools=None` is unrestricted and `[]` is nothing (an
    absent list and an empty one mean opposite things, so the code branches on absence,
    never on truthiness); `rules`, the target and argument rules per allowed tool, in any
    order."""
    from quorumgate.proto.model import DelegationPolicy, Enforcement

    return Mandate(
        allowed_tools=None if tools is None else canonical_tool_list(list(tools)),
        enforcement=Enforcement(enforcement),
        suspended=suspended,
        delegation_policy=DelegationPolicy(delegation_policy),
        max_delegation_depth=max_delegation_depth,
        rules=tuple(sorted(rules, key=lambda entry: entry.tool)),
    )


def tool_rules(
    tool: str,
    targets: Sequence[str | Mapping[str, object]],
    args: Mapping[str, Mapping[str, object]] | None = None,
) -> ToolRules:
    """One tool's target and argument rules, written as a policy file writes them
    (docs/policies.md): `tool_rules("payments.send", [{"set": "payees", "mode": "direct"},
    "any"], {"amount": {"max": 500}})`; a rule may name `when_exposed`
    (docs/provenance.md), for `mandate(rules=...)` and `delegate(rules=...)`.
    Read by the policy file's own reader, so the two cannot disagree; a malformed rule
    raises ValueError naming it."""
    from quorumgate.sidecar.policyfile import parse_tool_rules

    body: dict[str, object] = {"targets": list(targets)}
    if args:
        body["args"] = {name: dict(check) for name, check in args.items()}
    (entry,) = parse_tool_rules({tool: body}, "tool_rules", None)
    return entry
