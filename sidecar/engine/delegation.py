"""Delegation: grants that attenuate an agent's authority for one run, and revocation.

A grant gives a child key at most its grantor's effective scope, for one run, until a
block time no later than the grant it hangs from; its own rules apply on top of every
rule above it at each use, so a grant can only narrow (docs/engine.md, "Transactions").
Any delegator on the chain above a grant, or the owner, may revoke it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from quorumgate.proto.chainversions import runs_opened_by_the_chain
from quorumgate.proto.model import Delegate, DelegationPolicy, Reason, Revoke
from quorumgate.proto.runs import names_opened_run
from quorumgate.proto.tx import ParsedTx
from quorumgate.sidecar.engine.env import Env, Refusal, applied, principal_name, rejected
from quorumgate.sidecar.engine.rules import rules_are_canonical
from quorumgate.sidecar.engine.scope import Scope, intersect, resolve_chain
from quorumgate.sidecar.engine.state import AgentRecord, Grant
from quorumgate.sidecar.engine.statements import Verdict


@dataclass(frozen=True)
class _Parent:
    """What a new grant inherits: the scope it may not exceed, its depth and the depth
    allowed, the run's owner, and when the grant it hangs from expires (None: a root)."""

    scope: Scope
    depth: int
    depth_limit: int
    run_owner: str
    expires_at_ms: int | None


def delegate(env: Env, parsed: ParsedTx, delegate: Delegate, record: AgentRecord) -> Verdict:
    """Apply a Delegate signed by `record`'s agent, or say why not."""
    child = env.state.agent_by_key.get(delegate.child)

    def refused(reason: Reason) -> Verdict:
        return rejected(
            parsed,
            reason,
            principal=record.agent_id,
            subject=child or "",
            version=record.mandate_version,
        )

    if child is None:
        return refused(Reason.UNKNOWN_AGENT)
    if child == record.agent_id:
        return refused(Reason.INVALID_SPEC)
    try:
        parent = _parent(env, parsed, delegate, record)
    except Refusal as refusal:
        return refused(refusal.reason)
    reason = _refusal(env, parsed, delegate, record, parent)
    if reason is not None:
        return refused(reason)
    env.state.grants[parsed.tx_id] = Grant(
        grant_id=parsed.tx_id,
        grantor=record.agent_id,
        child=child,
        run_owner=parent.run_owner,
        run_id=delegate.run_id,
        scope=intersect(parent.scope, delegate.tools),
        grantor_mandate_version=record.mandate_version,
        depth=parent.depth,
        parent_grant=delegate.parent_grant,
        # a grant never outlives the grant it hangs from
        expires_at_ms=min(
            delegate.expires_at_ms, parent.expires_at_ms or delegate.expires_at_ms
        ),
        created_height=env.height,
        # applied on top of every rule above it at each use: it can only narrow
        rules=delegate.rules,
    )
    return applied(
        parsed, principal=record.agent_id, subject=child, version=record.mandate_version
    )


def _parent(env: Env, parsed: ParsedTx, delegate: Delegate, record: AgentRecord) -> _Parent:
    """What the grant would inherit, from the grantor's mandate and the chain above it;
    raises Refusal when the grantor may not delegate here."""
    mandate = record.mandate
    if mandate is None or mandate.delegation_policy is not DelegationPolicy.ATTENUATED:
        raise Refusal(Reason.DELEGATION_REFUSED)
    if record.suspended:
        raise Refusal(Reason.SUSPENDED)
    depth_limit = env.setting("delegation_depth_max")
    if mandate.max_delegation_depth is not None:
        depth_limit = min(depth_limit, mandate.max_delegation_depth)
    if delegate.parent_grant is None:
        if runs_opened_by_the_chain(env.config.authority_version) and not names_opened_run(
            delegate.run_id, parsed.nonce
        ):
            raise Refusal(Reason.RUN_NOT_OPENED)  # a chain starts in a run of its root's
        return _Parent(mandate.allowed_tools, 1, depth_limit, record.agent_id, None)
    view = resolve_chain(env, delegate.parent_grant, record.agent_id, delegate.run_id)
    return _Parent(
        intersect(mandate.allowed_tools, view.scope),
        len(view.grantors) + 1,
        min(depth_limit, view.depth_limit),
        view.grantors[-1],
        env.state.grants[delegate.parent_grant].expires_at_ms,
    )


def _refusal(
    env: Env, parsed: ParsedTx, delegate: Delegate, record: AgentRecord, parent: _Parent
) -> Reason | None:
    """Why the grant may not be made: too deep, rules not canonical, an expiry out of
    range, a wider scope than its grantor's, or no room."""
    if parent.depth > parent.depth_limit:
        return Reason.DELEGATION_DEPTH_EXCEEDED
    if not rules_are_canonical(delegate.rules, env.config.canonical_version):
        return Reason.INVALID_SPEC
    ttl_max = env.setting("grant_ttl_ms_max")
    if not env.now_ms < delegate.expires_at_ms <= env.now_ms + ttl_max:
        return Reason.DELEGATION_EXPIRY_INVALID
    if (
        delegate.tools is not None
        and parent.scope is not None
        and not set(delegate.tools) <= set(parent.scope)
    ):
        return Reason.DELEGATION_WIDENING  # scope never widens
    grants = env.state.grants
    mine = env.state.count("grants", record.agent_id)
    if len(grants) >= env.config.grants_max or mine >= env.setting("grants_per_agent_max"):
        return Reason.CAPACITY_EXCEEDED
    assert parsed.tx_id not in grants, "grant id reused"
    return None


def revoke(env: Env, parsed: ParsedTx, revoke: Revoke, record: AgentRecord | None) -> Verdict:
    """Revoke a grant: its grantor, any delegator above it, or the owner (`record` None)."""
    principal = principal_name(record)
    grant = env.state.grants.get(revoke.grant)
    if grant is None:
        return rejected(parsed, Reason.UNKNOWN_GRANT, principal=principal)
    if record is not None and record.agent_id not in _grantors_above(env, grant):
        return rejected(parsed, Reason.NOT_GRANTOR, principal=principal)
    env.state.grants[grant.grant_id] = replace(grant, revoked=True)
    return applied(parsed, principal=principal, subject=grant.child)


def _grantors_above(env: Env, grant: Grant) -> set[str]:
    """The grantor and every delegator above it: any of them may revoke the grant."""
    out = {grant.grantor}
    parent = grant.parent_grant
    while parent is not None and parent in env.state.grants:
        above = env.state.grants[parent]
        out.add(above.grantor)
        parent = above.parent_grant
    return out
