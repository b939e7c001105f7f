"""Key rotation (docs/engine.md, "Rotating keys"; authority version 5).

An agent, a principal or the owner replaces its Ed25519 key while the chain runs. The
rotation is signed by the holder's current key (an agent's or a principal's may also be
signed by the owner; the owner's only by the owner's current key) and carries the new
key's signature over `rotation_statement`, so no one rotates to a key they do not hold.
The identity keeps everything keyed by its id (mandate, grants, cards, latch, runs,
handles) and its nonce window, so a transaction the old key signed stays executed or
refused as before; the old key is retired for the chain's life and signs nothing again.
"""

from __future__ import annotations

from quorumgate.proto import limits
from quorumgate.proto.crypto import ed25519_verify
from quorumgate.proto.model import KeyHolder, Reason, RotateKey
from quorumgate.proto.tx import ParsedTx, rotation_statement
from quorumgate.sidecar.engine.env import Env, applied, rejected
from quorumgate.sidecar.engine.state import EngineState, RetiredKey
from quorumgate.sidecar.engine.statements import OWNER_PRINCIPAL, PRINCIPAL_PREFIX, Verdict

# Who signed a transaction, as a rotation asks: the holder kind and its id ("" for the
# owner).
Signer = tuple[KeyHolder, str]


def owner_key(state: EngineState, genesis: bytes) -> bytes:
    """The owner's key now: the state's once rotated, else cluster.json's (`genesis`)."""
    return genesis if state.owner_key is None else state.owner_key


def key_in_use(state: EngineState, genesis: bytes, key: bytes) -> bool:
    """Whether `key` is, or was, some identity's: the owner's, an agent's, a principal's,
    or a retired one."""
    return (
        key == owner_key(state, genesis)
        or key in state.agent_by_key
        or key in state.principal_by_key
        or key in state.retired_keys
    )


def signer_name(signer: Signer) -> str:
    """The signer as verdicts name it: an agent's id, `principal:<id>`, or the owner."""
    holder, ident = signer
    if holder is KeyHolder.OWNER:
        return OWNER_PRINCIPAL
    return PRINCIPAL_PREFIX + ident if holder is KeyHolder.PRINCIPAL else ident


def rotate(env: Env, parsed: ParsedTx, op: RotateKey, signer: Signer) -> Verdict:
    """Apply one `RotateKey` signed by `signer`, or say why not."""
    who = signer_name(signer)
    subject = op.subject_id or OWNER_PRINCIPAL
    reason = _refusal(env, op, signer)
    if reason is not None:
        return rejected(parsed, reason, principal=who, subject=subject)
    _apply(env, op)
    return applied(parsed, principal=who, subject=subject)


def _current_key(env: Env, op: RotateKey) -> bytes | None:
    state = env.state
    if op.holder is KeyHolder.OWNER:
        return owner_key(state, env.config.owner_public_key)
    if op.holder is KeyHolder.AGENT:
        agent = state.agents.get(op.subject_id)
        return None if agent is None else agent.public_key
    principal = state.principals.get(op.subject_id)
    return None if principal is None else principal.public_key


def _refusal(env: Env, op: RotateKey, signer: Signer) -> Reason | None:
    """The checks, in this order: who signed, the subject, the proof, the new key, room."""
    by_owner = signer[0] is KeyHolder.OWNER
    by_holder = signer == (op.holder, op.subject_id)
    if not (by_holder or (by_owner and op.holder is not KeyHolder.OWNER)):
        return Reason.NOT_KEY_HOLDER  # a stranger, or anyone but the owner for the owner
    old = _current_key(env, op)
    if old is None:
        is_agent = op.holder is KeyHolder.AGENT
        return Reason.UNKNOWN_AGENT if is_agent else Reason.UNKNOWN_PRINCIPAL
    new = op.new_public_key
    chain = env.config.chain_id
    statement = rotation_statement(chain, op.holder, op.subject_id, old, new)
    if not ed25519_verify(new, statement, op.proof):
        return Reason.BAD_KEY_PROOF  # the new key did not sign this rotation
    if key_in_use(env.state, env.config.owner_public_key, new):
        return Reason.KEY_IN_USE  # the same key, another identity's, or a retired one
    if len(env.state.retired_keys) >= limits.RETIRED_KEYS_MAX:
        return Reason.CAPACITY_EXCEEDED
    return None


def _apply(env: Env, op: RotateKey) -> None:
    """Retire the old key and install the new one; nothing keyed by id changes."""
    state = env.state
    new = op.new_public_key
    if op.holder is KeyHolder.OWNER:
        old = owner_key(state, env.config.owner_public_key)
        state.owner_key = new
    elif op.holder is KeyHolder.AGENT:
        agent = state.agents[op.subject_id]
        old = agent.public_key
        agent.public_key = new
        state.agent_changed(op.subject_id)
        del state.agent_by_key[old]
        state.agent_by_key[new] = op.subject_id
    else:
        principal = state.principals[op.subject_id]  # a read marks the entry changed
        old = principal.public_key
        principal.public_key = new
        del state.principal_by_key[old]
        state.principal_by_key[new] = op.subject_id
    state.retired_keys[old] = RetiredKey(op.holder.value, op.subject_id, env.height)
