"""What a call may do: the effective scope and the rule layers along its grant chain.

An agent on its own mandate has that mandate's scope and rules. A delegate has its own
mandate ∩ every grant's pinned scope ∩ every delegator's mandate as it is now, and every
one of those layers' rules must permit the call (docs/engine.md; docs/policies.md for
the rules). The chain is walked at each use, against the current state: a photograph of
the parent taken at delegation time could not notice a revocation or a narrowing.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorumgate.proto.chainversions import delegates_defer_to_delegators
from quorumgate.proto.model import (
    Argument,
    DelegationPolicy,
    Enforcement,
    Mandate,
    Reason,
    ToolMode,
    ToolRules,
    ToolSpec,
    rules_for,
)
from quorumgate.sidecar.engine.env import Env, Refusal
from quorumgate.sidecar.engine.rules import judge_layer, stricter
from quorumgate.sidecar.engine.state import AgentRecord
from quorumgate.sidecar.engine.trace import LayerStep, TargetStep, Trace

Scope = tuple[str, ...] | None  # None: unrestricted; (): nothing
# One say on a call's target and arguments: the agent whose sets its `set` rules read,
# its rules, and whether they are a grant's (else a mandate's). Every layer must permit
# a call.
RuleLayer = tuple[str, tuple[ToolRules, ...], bool]


def intersect(a: Scope, b: Scope) -> Scope:
    """null ∩ X = X, X ∩ [] = []. Branches on `is None`, never on truthiness."""
    if a is None:
        return b
    if b is None:
        return a
    return tuple(sorted(set(a) & set(b)))


def permits(scope: Scope, tool: str) -> bool:
    return scope is None or tool in scope


@dataclass(frozen=True)
class ChainView:
    """What a grant chain contributes to a delegate's authority, read at use time."""

    scope: Scope
    enforce: bool
    grantors: tuple[str, ...]  # nearest first; the last is the run's owner (the master)
    depth_limit: int
    layers: tuple[RuleLayer, ...] = ()  # every grant's and grantor mandate's rules


def effective_scope(
    env: Env, record: AgentRecord, mandate: Mandate, grant: bytes | None, run_id: str
) -> tuple[Scope, bool, tuple[str, ...], tuple[RuleLayer, ...]]:
    """Own mandate ∩ pinned grant scopes ∩ every delegator's current mandate; whether any
    of them enforces; the agents of the chain; and the rule layers of each."""
    enforce = mandate.enforcement is Enforcement.ENFORCE
    own: RuleLayer = (record.agent_id, mandate.rules, False)
    if grant is None:
        return mandate.allowed_tools, enforce, (record.agent_id,), (own,)
    view = resolve_chain(env, grant, record.agent_id, run_id)
    return (
        intersect(mandate.allowed_tools, view.scope),
        enforce or view.enforce,
        (record.agent_id, *view.grantors),
        (own, *view.layers),
    )


def resolve_chain(env: Env, grant_id: bytes, child: str, run_id: str) -> ChainView:
    """Walk a grant chain up to its root, checking every link against the current state.
    Raises Refusal with the first link's problem."""
    state = env.state
    scope: Scope = None
    enforce = False
    grantors: list[str] = []
    layers: list[RuleLayer] = []
    depth_limit = env.setting("delegation_depth_max")
    expected_child = child
    current: bytes | None = grant_id
    while current is not None:
        assert len(grantors) <= env.config.delegation_depth_max, "grant chain too deep"
        grant = state.grants.get(current)
        if grant is None:
            raise Refusal(Reason.DELEGATION_UNKNOWN)
        if grant.child != expected_child or grant.run_id != run_id:
            raise Refusal(Reason.DELEGATION_MISMATCH)
        if grant.revoked:
            raise Refusal(Reason.DELEGATION_REVOKED)
        if env.now_ms >= grant.expires_at_ms:
            raise Refusal(Reason.DELEGATION_EXPIRED)
        grantor = state.agents[grant.grantor]
        mandate = grantor.mandate
        if mandate is None or mandate.delegation_policy is not DelegationPolicy.ATTENUATED:
            raise Refusal(Reason.DELEGATION_REFUSED)
        if grantor.suspended:
            raise Refusal(Reason.SUSPENDED)
        if mandate.max_delegation_depth is not None:
            depth_limit = min(depth_limit, mandate.max_delegation_depth)
        scope = intersect(intersect(scope, grant.scope), mandate.allowed_tools)
        enforce = enforce or mandate.enforcement is Enforcement.ENFORCE
        layers += [(grant.grantor, grant.rules, True), (grant.grantor, mandate.rules, False)]
        grantors.append(grant.grantor)
        expected_child = grant.grantor
        current = grant.parent_grant
    if len(grantors) > depth_limit:
        raise Refusal(Reason.DELEGATION_DEPTH_EXCEEDED)
    return ChainView(scope, enforce, tuple(grantors), depth_limit, tuple(layers))


def judge_rules(
    env: Env,
    layers: tuple[RuleLayer, ...],
    spec: ToolSpec,
    target: str,
    arguments: tuple[Argument, ...] | None,
    principal: str,
    further_targets: tuple[tuple[str, str], ...] = (),
    links: tuple[str, ...] = (),
    trace: Trace | None = None,
    exposed: bool = False,
    run_targets: frozenset[str] = frozenset(),
) -> tuple[bool, ToolMode]:
    """Every layer's target and argument rules: whether all permit the call, and the mode
    it runs in. Each mandate on the chain says the mode its matching rule names, or the
    tool's; a grant only ever makes it stricter. The strictest wins, so a mandate can
    relax the tool's mode for its own agent (a known payee: direct), but no delegate runs
    more directly than its delegator would. On chains where delegates defer
    (proto/chainversions.py), a delegate's mandate without rules for the tool names no
    mode, and the delegators' rules decide it. `trace`, when given, records each layer's
    say (sidecar/engine/trace.py). `exposed` and `run_targets` are the run's provenance
    (sidecar/engine/provenance.py), which every layer's `when_exposed` modes read."""
    mode: ToolMode | None = None
    defer = delegates_defer_to_delegators(env.config.authority_version)
    root = len(layers) - 1  # the run owner's mandate: the last layer of every chain
    for index, (owner, rules, is_grant) in enumerate(layers):
        entry = rules_for(rules, spec.name)
        # on such chains a delegate's mandate without rules for the tool names no mode:
        # its delegators' rules decide it (docs/policies.md)
        names_mode = not is_grant and not (defer and entry is None and index != root)
        steps: list[TargetStep] | None = None if trace is None else []
        failed: list[str] | None = None if trace is None else []
        permitted, chosen = judge_layer(
            entry,
            target,
            arguments,
            principal,
            env.state.sets_of(owner),
            further_targets,
            default=None if is_grant else spec.mode,
            links=links,
            steps=steps,
            failed=failed,
            exposed=exposed,
            run_targets=run_targets,
        )
        if permitted and chosen is None and names_mode:
            chosen = spec.mode
        if trace is not None and steps is not None and failed is not None:
            trace.layers.append(
                LayerStep(
                    owner, is_grant, entry is not None, tuple(steps), tuple(failed), permitted,
                    chosen if permitted else None,
                )
            )  # fmt: skip
        if not permitted:
            return False, spec.mode
        mode = stricter(mode, chosen)
    return True, spec.mode if mode is None else mode
