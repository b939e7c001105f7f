"""Envelopes: registering a handle for values sealed to sinks (docs/engine.md,
"Transactions"). The engine keeps only ciphertexts, never plaintext. Agents seal for
themselves (kind unverified); only the owner seals for a principal, and only those
envelopes count as verified.
"""

from __future__ import annotations

from quorumgate.proto.model import Reason, SealEnvelope
from quorumgate.proto.tx import ParsedTx
from quorumgate.sidecar.engine.env import Env, applied, principal_name, rejected
from quorumgate.sidecar.engine.state import AgentRecord, Handle
from quorumgate.sidecar.engine.statements import Verdict, handle_for


def seal(env: Env, parsed: ParsedTx, seal: SealEnvelope, record: AgentRecord | None) -> Verdict:
    """Register the handle of a SealEnvelope signed by `record`'s agent (None: the owner)."""
    state, config = env.state, env.config
    principal = principal_name(record)
    if record is not None:
        if seal.owner_principal is not None:
            return rejected(parsed, Reason.OWNER_ONLY_FIELD, principal=principal)
        owner, verified = record.agent_id, False
    else:
        if seal.owner_principal is None:
            return rejected(parsed, Reason.INVALID_SPEC, principal=principal)
        if seal.owner_principal not in state.agents:
            return rejected(parsed, Reason.UNKNOWN_AGENT, principal=principal)
        owner, verified = seal.owner_principal, True
    if any(value.sink not in state.sinks for value in seal.sealed):
        return rejected(parsed, Reason.UNKNOWN_SINK, principal=principal)
    handle = handle_for(parsed.tx_id, seal.kind)
    if handle in state.handles:
        return rejected(parsed, Reason.HANDLE_EXISTS, principal=principal)
    owned = state.handles_by_owner.get(owner, 0)
    if len(state.handles) >= config.handles_max or owned >= config.handles_per_principal_max:
        return rejected(parsed, Reason.CAPACITY_EXCEEDED, principal=principal)
    state.handles[handle] = Handle(
        handle=handle,
        kind=seal.kind,
        owner=owner,
        verified=verified,
        sealed=tuple(sorted(seal.sealed, key=lambda value: value.sink)),
        created_height=env.height,
    )
    state.handles_by_owner[owner] = owned + 1
    return applied(parsed, principal=owner, subject=handle)
