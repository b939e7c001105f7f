"""Why a call gets its verdict: every rule that applied, from which mandate or grant.

    quorumgate policy explain FILE --agent A --tool T [--target X] [--also ROLE=X]...
        [--arg NAME=VALUE]... [--via DELEGATION] [--run RUN] [--after TOOL=TARGET]...
        [--json]

The file is set up as `quorumgate policy test` sets it up (sidecar/policykit.py: its
tools, agents, sets, envelopes and delegations; its `[[calls]]` are not made), then the
one call is submitted to the real engine with a trace (sidecar/engine/trace.py): the
judge records what it consulted while it decides, so the explanation and the verdict
come from one execution and cannot disagree. Argument values are used to judge the
argument rules and never printed: the explanation names arguments only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from quorumgate.proto import names
from quorumgate.proto.model import Outcome, RuleKind, TargetRule, ToolMode
from quorumgate.sidecar.engine.links import LINK_ROLE
from quorumgate.sidecar.engine.rules import MODE_STRICTNESS
from quorumgate.sidecar.engine.trace import LayerStep, Trace
from quorumgate.sidecar.policyfile import DEFAULT_RUN, STEP_MS, CallSpec, Policy, PolicyFileError
from quorumgate.sidecar.policyfile import load_policy as load_policy_file
from quorumgate.sidecar.policykit import EXIT_MALFORMED, EXIT_OK, _Runner


@dataclass(frozen=True)
class LayerExplanation:
    """One layer the rules were judged in: where it is written (`agents.X.rules."t"`,
    `delegations.D.rules."t"`), what it is, how each target met it, and its mode."""

    where: str
    what: str  # "own mandate" | "grant by X" | "delegator's mandate"
    step: LayerStep


@dataclass(frozen=True)
class Explanation:
    """A call's verdict and what decided it. `mode` is the mode the rules gave (None when
    the call was refused before the rules); `decided_by` names the deciding rule."""

    agent: str
    tool: str
    via: str | None
    argument_names: tuple[str, ...]
    outcome: str
    reason: str
    registered_mode: str | None
    mode: str | None
    in_scope: bool | None
    enforce: bool | None
    layers: tuple[LayerExplanation, ...]
    decided_by: str
    notes: tuple[str, ...] = ()
    # the run's provenance when judged (docs/provenance.md): the call that exposed it,
    # (height, tool), or None for a clean run; and its own targets
    exposed_by: tuple[int, str] | None = None
    run_targets: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "tool": self.tool,
            "via": self.via,
            "arguments": list(self.argument_names),
            "outcome": self.outcome,
            "reason": self.reason,
            "registered_mode": self.registered_mode,
            "mode": self.mode,
            "in_scope": self.in_scope,
            "enforce": self.enforce,
            "layers": [_layer_json(layer) for layer in self.layers],
            "decided_by": self.decided_by,
            "notes": list(self.notes),
            "exposed_by": None
            if self.exposed_by is None
            else {"height": self.exposed_by[0], "tool": self.exposed_by[1]},
            "run_targets": list(self.run_targets),
        }

    def text(self) -> str:
        args = ", ".join(self.argument_names) or "none"
        via = f" under {self.via}" if self.via else ""
        lines = [f"{self.agent} calls {self.tool}{via} (arguments: {args})"]
        lines.append(f"  verdict: {self.outcome} ({self.reason})")
        if self.registered_mode is not None:
            lines.append(f"  tools.{self.tool}.mode: {self.registered_mode}")
        if self.in_scope is not None:
            scope = "in" if self.in_scope else "outside"
            lines.append(
                f"  scope: the tool is {scope} the effective scope"
                f" ({'enforce' if self.enforce else 'observe'})"
            )
        if self.exposed_by is not None:
            height, by = self.exposed_by
            lines.append(
                f"  run: exposed since height {height}, by a call of {by} "
                "(its results are untrusted; docs/provenance.md)"
            )
        if self.run_targets:
            own = ", ".join(self.run_targets)
            lines.append(f"  run targets (judged as in a clean run): {own}")
        if self.layers:
            lines.append("  rules, in the order judged:")
        for number, layer in enumerate(self.layers, 1):
            lines += _layer_lines(number, layer)
        if self.mode is not None and self.outcome != Outcome.DENY.value:
            lines.append(f"  mode: {self.mode} (the strictest any layer names)")
        lines.append(f"  decided by: {self.decided_by}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def rule_text(rule: TargetRule) -> str:
    """A target rule as the policy file writes it."""
    parts = ["any = true"] if rule.kind is RuleKind.ANY else [f'{rule.kind.value} = "{rule.value}"']
    if rule.mode is not None:
        parts.append(f'mode = "{rule.mode.value}"')
    if rule.role:
        parts.append(f'role = "{rule.role}"')
    if rule.when_exposed is not None:
        parts.append(f'when_exposed = "{rule.when_exposed.value}"')
    return "{ " + ", ".join(parts) + " }"


def _layer_lines(number: int, layer: LayerExplanation) -> list[str]:
    step = layer.step
    head = f"    {number}. {layer.where} ({layer.what})"
    if not step.has_rules:
        if step.is_grant:
            return [head + ": no rules for the tool, narrows nothing"]
        if step.mode is None:
            return [head + ": no rules for the tool, names no mode: its delegators decide"]
        return [head + f": no rules for the tool -> the tool's mode, {_mode(step.mode)}"]
    lines = [head + ":"]
    for target in step.targets:
        role = f" ({target.role})" if target.role else ""
        if target.rule is None and target.role == LINK_ROLE:
            lines.append(
                f"       {target.target}{role}: no link rule matches -> user_confirm "
                "(the card lists it)"
            )
        elif target.rule is None:
            lines.append(f"       {target.target}{role}: no rule matches -> out of scope")
        else:
            exposed = ""
            if target.by_exposure:
                exposed = " (its when_exposed applies: the run is exposed)"
            lines.append(
                f"       {target.target}{role}: targets[{target.index}] "
                f"{rule_text(target.rule)} matches{exposed}"
            )
    for name in step.failed_arguments:
        lines.append(f"       args.{name} does not hold -> out of scope")
    if step.permitted:
        lines.append(f"       -> {_mode(step.mode)}")
    return lines


def _mode(mode: ToolMode | None) -> str:
    return "no mode of its own (a grant only narrows)" if mode is None else mode.value


def _layer_json(layer: LayerExplanation) -> dict[str, Any]:
    step = layer.step
    return {
        "where": layer.where,
        "what": layer.what,
        "has_rules": step.has_rules,
        "permitted": step.permitted,
        "mode": None if step.mode is None else step.mode.value,
        "targets": [
            {
                "role": t.role,
                "target": t.target,
                "rule": None if t.index is None else f"targets[{t.index}]",
                "rule_text": None if t.rule is None else rule_text(t.rule),
                "by_exposure": t.by_exposure,
            }
            for t in step.targets
        ],
        "failed_arguments": list(step.failed_arguments),
    }


def _label_layers(
    policy: Policy, agent: str, via: str | None, tool: str, steps: Sequence[LayerStep]
) -> tuple[LayerExplanation, ...]:
    """Name each layer as the file writes it: the agent's own mandate, then per grant up
    the chain the delegation and its grantor's mandate (sidecar/engine/scope.py)."""
    places = [(f'agents.{agent}.rules."{tool}"', "own mandate")]
    while via is not None:
        d = policy.delegations[via]
        places.append((f'delegations.{via}.rules."{tool}"', f"grant by {d['parent']}"))
        places.append((f'agents.{d["parent"]}.rules."{tool}"', "delegator's mandate"))
        via = d["parent_grant"]
    return tuple(
        LayerExplanation(where, what, step)
        for (where, what), step in zip(places, steps, strict=False)
    )


def _decided_by(
    tool: str, outcome: Outcome, reason: str, trace: Trace, layers: Sequence[LayerExplanation]
) -> str:
    """The rule that decided: the first layer that refused the call, else the layer and
    rule that named the resulting mode, else the step of the judging order that refused
    (docs/engine.md)."""
    if trace.scope and not trace.scope[0][2]:
        return f"the effective scope: {tool} is not in it ({reason})"
    for layer in layers:
        step = layer.step
        if step.permitted:
            continue
        for target in step.targets:
            if target.rule is None and target.role != LINK_ROLE:  # a link never refuses
                return f"{layer.where}.targets: no rule matches {target.target} ({reason})"
        if step.failed_arguments:
            return f"{layer.where}.args.{step.failed_arguments[0]} ({reason})"
    if not trace.modes or outcome is Outcome.DENY:
        return f"the judging order's step for {reason} (docs/engine.md)"
    return _mode_source(tool, trace.modes[1], layers)


def _mode_source(tool: str, mode: ToolMode, layers: Sequence[LayerExplanation]) -> str:
    for layer in layers:
        step = layer.step
        if step.mode is not mode:
            continue
        for target in step.targets:
            rule = target.rule
            if target.by_exposure and rule is not None and rule.when_exposed is mode:
                return (
                    f"{layer.where}.targets[{target.index}] (when_exposed = {mode.value}: "
                    "the run is exposed)"
                )
        for target in step.targets:
            if target.rule is not None and target.rule.mode is mode:
                return f"{layer.where}.targets[{target.index}] (mode = {mode.value})"
        for target in step.targets:
            if target.rule is None and target.role == LINK_ROLE:
                return (
                    f"{layer.where}: no link rule matches {target.target}, so the principal's "
                    f"card ({mode.value})"
                )
        if step.has_rules:
            matched = next(t for t in step.targets if t.rule is not None)
            return (
                f"{layer.where}.targets[{matched.index}], which names no mode: "
                f"tools.{tool}.mode ({mode.value})"
            )
        return f"{layer.where}: no rules for the tool, so tools.{tool}.mode ({mode.value})"
    return f"tools.{tool}.mode ({mode.value})"


def _notes(tool: str, layers: Sequence[LayerExplanation]) -> tuple[str, ...]:
    """What an operator would otherwise learn only from the engine's code: a mandate
    without rules for the tool pins the call at the tool's mode, so a delegator's rule
    naming a looser mode cannot take effect for its delegate (docs/policies.md)."""
    if len(layers) < 2 or layers[0].step.has_rules or not layers[0].step.permitted:
        return ()
    own = layers[0].step.mode
    looser = [
        layer.where
        for layer in layers[1:]
        if layer.step.permitted and layer.step.mode is not None and own is not None
        and MODE_STRICTNESS[layer.step.mode] < MODE_STRICTNESS[own]
    ]  # fmt: skip
    if not looser or own is None:
        return ()
    return (
        f"{layers[0].where} has no rules, so the call runs at least {own.value} "
        f"(tools.{tool}.mode) whatever {looser[0]} names; a rule of its own naming a "
        "mode (e.g. { any = true, mode = \"direct\" }) lets the stricter of the two decide",
    )


def explain_call(
    policy: Policy | str,
    *,
    agent: str,
    tool: str,
    target: str = "",
    also: Sequence[tuple[str, str]] = (),
    arguments: Mapping[str, str] | None = None,
    via: str | None = None,
    run: str = DEFAULT_RUN,
    after: Sequence[tuple[str, str]] = (),
) -> Explanation:
    """Set up `policy` (a Policy, or a policy file's path), make one call, and explain its
    verdict; `after` (tool, target) calls are made first, by the same agent in the same run,
    so that a call can be explained in a run that has read untrusted content
    (docs/provenance.md). PolicyFileError when the file is malformed or the call names an
    unknown agent or delegation."""
    if isinstance(policy, str):
        policy = load_policy_file(policy)
    if agent not in policy.agents:
        raise PolicyFileError(f"--agent: no agent {agent!r} in the file")
    if via is not None and via not in policy.delegations:
        raise PolicyFileError(f"--via: no delegation {via!r} in the file")
    runner = _Runner(policy)
    runner.setup()
    for before_tool, before_target in after:
        runner.propose(_call_spec(agent, before_tool, before_target, (), None, via, run))
    return explain_with(runner, _call_spec(agent, tool, target, also, arguments, via, run))


def explain_with(runner: _Runner, call: CallSpec) -> Explanation:
    """Make `call` on a set-up runner with a trace, and explain the verdict it got."""
    trace = Trace()
    verdict = runner.propose(call, trace)
    canonical_tool = names.canonical_tool_name(call.tool) or call.tool
    layers = _label_layers(runner.policy, call.agent, call.via, canonical_tool, trace.layers)
    registered = runner.engine.state.tools.get(canonical_tool)
    return Explanation(
        agent=call.agent,
        tool=canonical_tool,
        via=call.via,
        argument_names=tuple(sorted({*call.args, *call.handles})),
        outcome=verdict.outcome.value,
        reason=verdict.reason.value,
        registered_mode=None if registered is None else registered.mode.value,
        mode=trace.modes[1].value if trace.modes else None,
        in_scope=trace.scope[0][2] if trace.scope else None,
        enforce=trace.scope[0][1] if trace.scope else None,
        layers=layers,
        decided_by=_decided_by(
            canonical_tool, verdict.outcome, verdict.reason.value, trace, layers
        ),
        notes=_notes(canonical_tool, layers),
        exposed_by=trace.exposure[0] if trace.exposure else None,
        run_targets=tuple(trace.run_targets),
    )


def _call_spec(
    agent: str,
    tool: str,
    target: str,
    also: Sequence[tuple[str, str]],
    arguments: Mapping[str, str] | None,
    via: str | None,
    run: str,
) -> CallSpec:
    return CallSpec(
        index=0, name="explain", agent=agent, tool=tool, target=target, also=list(also),
        run=run, args=dict(arguments or {}), handles={}, via=via, advance_ms=STEP_MS,
        expect="allow", reason=None, confirm=None,
    )  # fmt: skip


def _pairs(raw: Sequence[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in raw:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise PolicyFileError(f"{flag}: expected NAME=VALUE, got a value without '='")
        out.append((key, value))
    return out


def run_policy_explain(
    path: str,
    *,
    agent: str,
    tool: str,
    target: str = "",
    also: Sequence[str] = (),
    arguments: Sequence[str] = (),
    via: str | None = None,
    run: str = DEFAULT_RUN,
    json_output: bool = False,
    out: TextIO | None = None,
    after: Sequence[str] = (),
) -> int:
    """`quorumgate policy explain`: 0 explained (whatever the verdict), 2 malformed."""
    out = sys.stdout if out is None else out
    try:
        explanation = explain_call(
            path, agent=agent, tool=tool, target=target, also=_pairs(also, "--also"),
            arguments=dict(_pairs(arguments, "--arg")), via=via, run=run,
            after=_pairs(after, "--after"),
        )  # fmt: skip
    except PolicyFileError as exc:
        if json_output:
            out.write(json.dumps({"file": path, "ok": False, "error": str(exc)}, indent=2) + "\n")
        else:
            out.write(f"policy explain: malformed policy file or call\n  {exc}\n")
        return EXIT_MALFORMED
    if json_output:
        out.write(json.dumps(explanation.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        out.write(explanation.text())
    return EXIT_OK
