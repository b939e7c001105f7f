"""Owner operations, and the few a principal may sign (docs/engine.md, "Transactions").

The owner registers tools, principals, agents and sinks, sets mandates, suspends and
resumes agents, keeps named sets and changes settings in the log (docs/engine.md,
"Settings in the log"). A principal keeps the named sets of the agents acting for it,
names its own deputies and (docs/provenance.md) the own targets of their runs, nothing
else.
"""

from __future__ import annotations

from dataclasses import replace

from quorumgate.proto import limits
from quorumgate.proto.chainversions import (
    arguments_by_declaration,
    pins_tool_definitions,
    registration_gates,
    settings_in_log,
    split_authority,
    targets_by_role,
)
from quorumgate.proto.model import (
    Admin,
    AdminOp,
    Reason,
    RegisterAgent,
    RegisterPrincipal,
    RegisterSink,
    RegisterTool,
    Resume,
    RotateKey,
    SetEntries,
    SetMandate,
    SetRunTargets,
    SetSettings,
    Suspend,
    ToolMode,
    ToolSpec,
)
from quorumgate.proto.tx import ParsedTx
from quorumgate.sidecar.engine import keys, latch, provenance
from quorumgate.sidecar.engine.config import CERTIFICATE_TTL_SETTING, effective_fingerprint
from quorumgate.sidecar.engine.env import Env, applied, rejected
from quorumgate.sidecar.engine.rules import rules_are_canonical, value_is_canonical
from quorumgate.sidecar.engine.state import AgentRecord, PrincipalRecord
from quorumgate.sidecar.engine.statements import OWNER_PRINCIPAL, PRINCIPAL_PREFIX, Verdict


def is_principal_op(payload: object) -> bool:
    """What a principal may sign besides answers: its agents' sets, its deputies."""
    return isinstance(payload, Admin) and isinstance(
        payload.op, SetEntries | RegisterPrincipal | SetRunTargets
    )


def principal_admin(env: Env, parsed: ParsedTx, payload: object, principal_id: str) -> Verdict:
    """An operation signed by a principal: the named sets of an agent acting for it, or
    its own deputies (same id, same key); anything else is `not_an_agent`."""
    who = PRINCIPAL_PREFIX + principal_id
    if isinstance(payload, Admin) and isinstance(payload.op, SetEntries):
        op = payload.op
        if env.state.agent_principal.get(op.principal) != principal_id:
            return rejected(parsed, Reason.NOT_OWNER, principal=who, subject=op.principal)
        reason = set_entries(env, op)
        if reason is not None:
            return rejected(parsed, reason, principal=who, subject=op.principal)
        return applied(parsed, principal=who, subject=op.principal)
    if isinstance(payload, Admin) and isinstance(payload.op, RegisterPrincipal):
        person = payload.op
        mine = env.state.principals[principal_id]
        if person.principal_id != principal_id or person.public_key != mine.public_key:
            subject = person.principal_id
            return rejected(parsed, Reason.NOT_OWNER, principal=who, subject=subject)
        reason = register_principal(env, person)
        if reason is not None:
            return rejected(parsed, reason, principal=who, subject=principal_id)
        return applied(parsed, principal=who, subject=principal_id)
    if isinstance(payload, Admin) and isinstance(payload.op, SetRunTargets):
        # a run's own targets (docs/provenance.md): its owner's principal or a deputy
        agent_id = payload.op.agent_id
        reason = provenance.apply_run_targets(env, payload.op, principal_id)
        if reason is not None:
            return rejected(parsed, reason, principal=who, subject=agent_id)
        return applied(parsed, principal=who, subject=agent_id)
    return rejected(parsed, Reason.NOT_AN_AGENT, principal=who)


def admin(env: Env, parsed: ParsedTx, op: AdminOp) -> Verdict:
    """An owner operation."""

    def done(subject: str, reason: Reason | None = None, version: int = 0) -> Verdict:
        if reason is not None:
            return rejected(parsed, reason, principal=OWNER_PRINCIPAL, subject=subject)
        return applied(parsed, principal=OWNER_PRINCIPAL, subject=subject, version=version)

    if isinstance(op, RegisterTool):
        reason = register_tool(env, op.spec)
        verdict = done(op.spec.name, reason)
        if reason is None and _overridden(env, op.spec):
            # the override is applied, and the ledger says so
            return replace(verdict, reason=Reason.DIRECT_OVERRIDE)
        return verdict
    if isinstance(op, RegisterPrincipal):
        return done(op.principal_id, register_principal(env, op))
    if isinstance(op, RegisterAgent):
        return done(op.agent_id, register_agent(env, op))
    if isinstance(op, RegisterSink):
        state = env.state
        if op.sink_id not in state.sinks and len(state.sinks) >= env.config.sinks_max:
            return done(op.sink_id, Reason.CAPACITY_EXCEEDED)
        state.sinks[op.sink_id] = op.public_key
        return done(op.sink_id)
    if isinstance(op, SetEntries):
        return done(op.principal, set_entries(env, op))
    if isinstance(op, SetSettings):
        return done("settings", set_settings(env, op))
    if isinstance(op, SetRunTargets):
        return done(op.agent_id, provenance.apply_run_targets(env, op, None))
    # a rotation never reaches here: the engine routes it to keys.rotate whoever signed
    assert not isinstance(op, RotateKey), "RotateKey is routed by the engine"
    record = env.state.agents.get(op.agent_id)
    if record is None:
        return done(op.agent_id, Reason.UNKNOWN_AGENT)
    env.state.agent_changed(op.agent_id)  # every op below writes this record
    reason = _agent_op(env, record, op)
    return done(op.agent_id, reason, version=record.mandate_version)


def _agent_op(env: Env, record: AgentRecord, op: AdminOp) -> Reason | None:
    """Set a mandate, suspend or resume: the operations on one agent's record."""
    if isinstance(op, SetMandate):
        if not rules_are_canonical(op.mandate.rules, env.config.canonical_version):
            return Reason.INVALID_SPEC  # rules compare canonical forms
        record.mandate = op.mandate
        record.mandate_version += 1
        record.suspended = op.mandate.suspended
        # a new version clears that agent's latch buckets, its halt included
        latch.clear_agent(env, record.agent_id)
        return None
    if isinstance(op, Suspend):
        record.suspended = True  # temporary: no new version, nothing latched or cleared
        return None
    assert isinstance(op, Resume), type(op)
    record.suspended = False
    return None


def register_tool(env: Env, spec: ToolSpec) -> Reason | None:
    """Register (or replace) a tool, or say why not."""
    state, config = env.state, env.config
    if spec.sink is not None and spec.sink not in state.sinks:
        return Reason.UNKNOWN_SINK
    if spec.envelope_args and spec.sink is None:
        return Reason.INVALID_SPEC  # envelopes need a sink to open
    if spec.binds_caller and (spec.envelope_args or spec.target_roles or spec.target_schemes):
        return Reason.INVALID_SPEC  # status tools take nothing
    version = config.canonical_version
    by_role = spec.target_roles or spec.target_optional
    if (by_role and not targets_by_role(version)) or (
        spec.definition_digest and not pins_tool_definitions(version)
    ):
        return Reason.INVALID_SPEC  # this chain has no roles, no pins
    if spec.name not in state.tools and len(state.tools) >= config.tools_max:
        return Reason.CAPACITY_EXCEEDED
    refusal = _registration_check(env, spec)
    if refusal is not None:
        return refusal
    state.tools[spec.name] = spec
    return None


def _overridden(env: Env, spec: ToolSpec) -> bool:
    """A `direct` tool registered with an override of the gate it would fail."""
    gates = registration_gates(env.config.authority_version)
    return gates and spec.mode is ToolMode.DIRECT and spec.takes_sensitive


def _registration_check(env: Env, spec: ToolSpec) -> Reason | None:
    """The BRAH paper's static gates: a confirm-gated tool states the tier that may
    confirm-run it; a `direct` tool that takes a recipient, an amount or a credential
    needs an explicit override. Declarations are refused on chains without them (whose
    engines would ignore them)."""
    authority = env.config.authority_version
    if not arguments_by_declaration(authority):
        declared = spec.arguments or spec.direct_override
        return Reason.INVALID_SPEC if declared else None
    if registration_gates(authority):
        if spec.mode.needs_confirmation and not spec.min_tier_declared:
            return Reason.TIER_UNDECLARED
        if spec.mode is ToolMode.DIRECT and spec.takes_sensitive and not spec.direct_override:
            return Reason.DIRECT_NEEDS_OVERRIDE
    if spec.binds_caller and spec.arguments:
        return Reason.INVALID_SPEC  # a status tool takes nothing
    return None


def register_agent(env: Env, op: RegisterAgent) -> Reason | None:
    """Register an agent (or change the principal it acts for). Its key changes only by
    a `RotateKey` (docs/engine.md, "Rotating keys"), which keeps its nonce window; a
    retired key is never registered again."""
    state, config = env.state, env.config
    existing = state.agent_by_key.get(op.public_key)
    owner = keys.owner_key(state, config.owner_public_key)
    if op.public_key == owner or existing not in (None, op.agent_id):
        return Reason.KEY_IN_USE
    if op.public_key in state.retired_keys:
        return Reason.KEY_IN_USE
    if op.public_key in state.principal_by_key:
        return Reason.KEY_IN_USE  # a principal is never an agent
    if op.principal and not split_authority(config.authority_version):
        return Reason.INVALID_SPEC  # no principals on this chain
    if op.principal and op.principal not in state.principals:
        return Reason.UNKNOWN_PRINCIPAL
    current = state.agents.get(op.agent_id)
    if current is not None:
        if current.public_key != op.public_key:
            return Reason.KEY_IN_USE
        _set_agent_principal(env, op.agent_id, op.principal)
        return None
    if len(state.agents) >= config.agents_max:
        return Reason.CAPACITY_EXCEEDED
    state.agents[op.agent_id] = AgentRecord(agent_id=op.agent_id, public_key=op.public_key)
    state.agent_changed(op.agent_id)
    state.agent_by_key[op.public_key] = op.agent_id
    _set_agent_principal(env, op.agent_id, op.principal)
    return None


def _set_agent_principal(env: Env, agent_id: str, principal: str) -> None:
    if principal:
        env.state.agent_principal[agent_id] = principal
    else:
        env.state.agent_principal.pop(agent_id, None)


def register_principal(env: Env, op: RegisterPrincipal) -> Reason | None:
    """A principal's key is of its own class (never the owner's, an agent's, another
    principal's or a retired one); it changes only by a `RotateKey` (docs/engine.md,
    "Rotating keys")."""
    state = env.state
    if not split_authority(env.config.authority_version):
        return Reason.INVALID_SPEC  # this chain has no principals
    key = op.public_key
    owner = keys.owner_key(state, env.config.owner_public_key)
    if key == owner or key in state.agent_by_key or key in state.retired_keys:
        return Reason.KEY_IN_USE
    if state.principal_by_key.get(key, op.principal_id) != op.principal_id:
        return Reason.KEY_IN_USE
    if any(deputy not in state.principals for deputy in op.deputies):
        return Reason.UNKNOWN_PRINCIPAL
    current = state.principals.get(op.principal_id)
    if current is not None:
        if current.public_key != key:
            return Reason.KEY_IN_USE
        current.deputies = op.deputies  # the list is replaced
        return None
    if len(state.principals) >= limits.PRINCIPALS_MAX:
        return Reason.CAPACITY_EXCEEDED
    state.principals[op.principal_id] = PrincipalRecord(op.principal_id, key)
    state.principals[op.principal_id].deputies = op.deputies
    state.principal_by_key[key] = op.principal_id
    return None


def set_entries(env: Env, op: SetEntries) -> Reason | None:
    """Replace (or, with no entries, delete) an agent's named set (docs/policies.md)."""
    sets = env.state.sets
    if op.principal not in env.state.agents:
        return Reason.UNKNOWN_AGENT
    version = env.config.canonical_version
    if not all(value_is_canonical(entry, version) for entry in op.entries):
        return Reason.INVALID_SPEC
    key = (op.principal, op.name)
    if not op.entries:
        sets.pop(key, None)
        return None
    owned = sum(1 for owner, _ in sets if owner == op.principal)
    if key not in sets and owned >= limits.SETS_PER_PRINCIPAL_MAX:
        return Reason.CAPACITY_EXCEEDED
    sets[key] = op.entries
    return None


def set_settings(env: Env, op: SetSettings) -> Reason | None:
    """Owner-signed settings: every value within its range, capacities never above
    cluster.json's (which sizes memory); then the state names the configuration in
    effect (`effective_fingerprint`)."""
    config = env.config
    if not settings_in_log(config.canonical_version):
        return Reason.INVALID_SPEC  # this chain's engines know no settings in the log
    named = [name for name, _ in op.values] + list(op.clear)
    if CERTIFICATE_TTL_SETTING in named and not config.receipts_expire:
        return Reason.INVALID_SPEC  # this chain's certificates carry no window
    for name, value in op.values:
        low, high = _setting_range(env, name)
        if not low <= value <= high:
            return Reason.INVALID_SPEC
    settings = env.state.settings
    for name, value in op.values:
        settings[name] = value
    for name in op.clear:
        settings.pop(name, None)
    if not any(name.startswith("quota_") for name in settings):
        env.state.quota_counters.clear()
    env.state.config_fingerprint = effective_fingerprint(config, settings)
    return None


def _setting_range(env: Env, name: str) -> tuple[int, int]:
    config = env.config
    if name.startswith("quota_"):
        return 0, 2**32 - 1  # 0: no limit
    if name == CERTIFICATE_TTL_SETTING:
        return limits.CERTIFICATE_TTL_MS_MIN, limits.CERTIFICATE_TTL_MS_MAX
    if name.endswith("_ms") or name.endswith("_ms_max"):
        return 1, 2**62 - 1
    if name == "delegation_depth_max":
        return 0, config.delegation_depth_max
    if name == "grants_per_agent_max":
        return 1, config.grants_per_agent_max
    return 1, 2**32 - 1  # the latch thresholds
