"""The governance engine: a pure, deterministic function from committed blocks to verdicts.

    engine = Engine(EngineConfig(chain_id=..., owner_public_key=...))
    result = engine.execute_block(height, block_time_ms, txs)
    result.verdicts, result.artifacts, result.state_root

No socket, database, clock, randomness or asyncio: every honest sidecar must reach the
same bytes from the same log (docs/architecture/0006-sans-io-core-and-simulator.md), so
block time is the only time, and every input is in the block or in the state. Remote
garbage becomes a `deny` or `rejected` verdict with a reason, never an exception; a broken
internal invariant is an assertion, which stops the sidecar rather than let it sign a
state no other sidecar has.

`Engine` applies one committed transaction at a time: it checks the chain, the signer and
the nonce, and routes by kind to the module that decides it (`judge` for proposals,
`confirm` for answers to cards, `delegation`, `envelopes`, `admin`); it owns the state,
the configuration and the caches of the state's bytes and root. Who is asking is never
read from a field: the signer is the registered agent, principal or owner whose key
verified the signature.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from quorumgate.proto import limits, names
from quorumgate.proto.canonical import sha256
from quorumgate.proto.chainversions import (
    expired_cards_leave_at_once,
    probes_latch,
    refuses_plaintext_secrets,
    rotates_keys,
    runs_carry_provenance,
    state_hash_tree,
)
from quorumgate.proto.model import (
    Admin,
    Confirm,
    Delegate,
    KeyHolder,
    Mandate,
    Outcome,
    Proposal,
    Reason,
    Revoke,
    RotateKey,
    SealEnvelope,
    TxKind,
)
from quorumgate.proto.nonces import NonceWindow
from quorumgate.proto.tx import ParsedTx, TxRejected, parse
from quorumgate.sidecar.engine import admin, confirm, delegation, envelopes, judge, keys
from quorumgate.sidecar.engine.config import (
    CERTIFICATE_TTL_SETTING,
    EngineConfig,
    config_for_cluster,
    effective_fingerprint,
)
from quorumgate.sidecar.engine.env import Env, principal_name, rejected
from quorumgate.sidecar.engine.provenance import uses_provenance
from quorumgate.sidecar.engine.secrets import proposal_carries_secret
from quorumgate.sidecar.engine.state import EngineState, StateDelta
from quorumgate.sidecar.engine.statements import (
    NO_LATCH_FACT,
    OWNER_PRINCIPAL,
    PRINCIPAL_PREFIX,
    AdmissionResult,
    BlockResult,
    ConfirmationCard,
    LatchFact,
    Verdict,
    build_artifacts,
)
from quorumgate.sidecar.engine.trace import Trace

# The configuration is part of this module's API (docs/engine.md); it lives in `config`.
__all__ = [
    "Engine",
    "EngineConfig",
    "StateCacheError",
    "config_for_cluster",
    "effective_fingerprint",
]


class StateCacheError(RuntimeError):
    """The engine's cached state bytes differ from a fresh encoding (an engine bug)."""


class Engine:
    """See the module docstring. Not thread-safe; one instance per sidecar."""

    def __init__(self, config: EngineConfig, state: EngineState | None = None) -> None:
        self.config = config
        if state is None:
            state = EngineState(config_fingerprint=config.fingerprint)
        if state.config_fingerprint != effective_fingerprint(config, state.settings):
            raise ValueError("engine state was produced under a different EngineConfig")
        self.state = state
        self._height = 0
        self._now_ms = 0
        self._state_bytes: bytes | None = None
        self._state_delta: StateDelta | None = None
        self._state_root: bytes | None = None

    # ------------------------------------------------------------------ public API

    @classmethod
    def from_state_bytes(cls, config: EngineConfig, data: bytes) -> Engine:
        return cls(config, EngineState.from_bytes(data))

    def state_bytes(self) -> bytes:
        """The canonical state bytes after the last executed block (the snapshot form).
        Built when asked: a sidecar records `state_delta` per height instead."""
        if self._state_bytes is None:
            self._state_bytes = self.state.to_bytes()
        return self._state_bytes

    def state_delta(self) -> StateDelta:
        """What the last executed block changed in the state (`StateDelta`; everything
        for the first block this engine executes): taken once per block, so whoever
        records a block's delta must record every block's."""
        if self._state_delta is None:
            self._state_delta = self.state.take_delta()
        return self._state_delta

    def state_root(self) -> bytes:
        """The state root of the chain's `state_version`: the hash tree over the entries
        where the chain has `state_hash_tree`, else SHA-256 of the state bytes."""
        if self._state_root is None:
            if state_hash_tree(self.config.state_version):
                self._state_root = self.state.tree_root()
            else:
                self._state_root = sha256(self.state_bytes())
        return self._state_root

    @property
    def last_height(self) -> int | None:
        return self.state.last_height

    def execute_block(
        self,
        height: int,
        block_time_ms: int,
        txs: Sequence[bytes],
        verify_signatures: bool = True,
        trace: Trace | None = None,
    ) -> BlockResult:
        """Execute one committed block. `verify_signatures=False` only for blocks whose
        transactions the replicas already verified (a certified block). `trace`, when
        given, records how the block's proposals were judged (sidecar/engine/trace.py:
        `quorumgate policy explain` asks for it on a one-proposal block; a sidecar never
        does), and changes nothing else."""
        last = self.state.last_height
        if last is not None and height != last + 1:
            raise ValueError(f"height {height} does not follow executed height {last}")
        if not 0 <= height < 2**64:
            raise ValueError("height out of range")
        if not self.state.last_block_time_ms <= block_time_ms < 2**63:
            raise ValueError("block time went backwards")
        self._state_bytes = None
        self._state_root = None
        self._state_delta = None  # an untaken delta stays queued in the state
        self._height = height
        self._now_ms = block_time_ms
        env = self._env()
        self._prune_expired(env)
        verdicts: list[Verdict] = []
        facts: list[LatchFact] = []
        calls: list[tuple[bytes, Proposal]] = []
        for data in txs:
            env.notes.fact = None
            verdict, parsed = self._execute_tx(env, data, verify_signatures, trace)
            verdicts.append(verdict)
            facts.append(NO_LATCH_FACT if env.notes.fact is None else env.notes.fact)
            if parsed is not None and isinstance(parsed.body.payload, Proposal):
                calls.append((parsed.tx_id, parsed.body.payload))
        self.state.last_height = height
        self.state.last_block_time_ms = block_time_ms
        artifacts = build_artifacts(self.config.chain_id, height, verdicts)
        root = self.state_root()
        stale = self.state.check_entries(limits.STATE_CHECK_ENTRIES_PER_BLOCK)
        if stale is not None:
            raise StateCacheError(
                f"engine state cache is stale at height {height}: an entry of {stale} changed "
                "unmarked; execution stops (engine bug)"
            )
        return BlockResult(
            height=height,
            block_time_ms=block_time_ms,
            verdicts=tuple(verdicts),
            artifacts=tuple(artifacts),
            state_root=root,
            latch_facts=tuple(facts),
            calls=tuple(calls),
        )

    def verify_state_cache(self) -> None:
        """Raise `StateCacheError` if the state bytes or the state root built from the
        per-entry caches differ from a fresh encoding: an entry changed unmarked, an engine
        bug that would otherwise report a state root that is not the state's. Costs a
        whole encoding; `execute_block` checks `STATE_CHECK_ENTRIES_PER_BLOCK` entries of
        a rotation over the state instead (`EngineState.check_entries`)."""
        if self.state_bytes() != self.state.fresh_bytes() or (
            state_hash_tree(self.config.state_version)
            and self.state_root() != self.state.fresh_tree_root()
        ):
            raise StateCacheError(
                f"engine state cache is stale at height {self.state.last_height}: "
                "an entry changed unmarked; execution stops (engine bug)"
            )

    def admission_check(self, tx_bytes: bytes, verify_signature: bool = True) -> AdmissionResult:
        """Cheap early refusal for the mempool; reads state, never changes it. The caller
        may skip the signature check when it has verified it already (the answer is
        advisory: the verdict at execution decides)."""
        try:
            parsed = parse(tx_bytes, verify=verify_signature)
        except TxRejected as exc:
            return AdmissionResult(False, exc.reason, exc.tx_id, exc.kind)
        if self._unknown_here(parsed):
            return AdmissionResult(False, Reason.MALFORMED, parsed.tx_id, parsed.kind)
        reason = self._admission_refusal(parsed)
        if reason is not None:
            return AdmissionResult(False, reason, parsed.tx_id, parsed.kind)
        return AdmissionResult(True, Reason.OK, parsed.tx_id, parsed.kind)

    def _admission_refusal(self, parsed: ParsedTx) -> Reason | None:
        if parsed.body.chain_id != self.config.chain_id:
            return Reason.WRONG_CHAIN
        window = self._nonce_window(parsed.signer)
        if window is None:
            return self._unknown_signer(parsed.signer)
        if not window.is_fresh(parsed.nonce, self.config.nonce_window):
            return Reason.REPLAYED
        payload = parsed.body.payload
        is_owner = parsed.signer == self.owner_key()
        if _is_rotation(payload):
            return None  # any holder may rotate; who may rotate whose key is execution's
        if parsed.signer in self.state.principal_by_key:
            # a principal answers cards, keeps its agents' named sets and names its
            # deputies, nothing else
            if not isinstance(payload, Confirm) and not admin.is_principal_op(payload):
                return Reason.NOT_AN_AGENT
        elif isinstance(payload, Admin) and not is_owner:
            return Reason.NOT_OWNER
        if isinstance(payload, Proposal | Delegate) and is_owner:
            return Reason.NOT_AN_AGENT
        if isinstance(payload, Proposal):
            return self._proposal_admission(payload)
        return None

    def _proposal_admission(self, proposal: Proposal) -> Reason | None:
        version = self.config.canonical_version
        tool = names.canonical_tool_name(proposal.tool)
        # where calls probe the latch, a call to an invented tool is ordered, so that it
        # is recorded and counts toward the latch (and admission tells no one which tools
        # exist)
        unknown = tool is None or tool not in self.state.tools
        if unknown and not probes_latch(version):
            return Reason.UNKNOWN_TOOL
        if refuses_plaintext_secrets(version):
            # a raw secret is refused before ordering, so it never enters a block
            spec = None if tool is None else self.state.tools.get(tool)
            envelope_names = () if spec is None else tuple(a.name for a in spec.envelope_args)
            return proposal_carries_secret(proposal, envelope_names)
        return None

    def certificate_ttl_ms(self) -> int | None:
        """How long after the last executed block's time its certificates may be used (the
        log's setting, else cluster.json's), or None on a chain whose receipts do not
        expire. What the sidecar signs into the block's receipts (sidecar/execution.py)."""
        if not self.config.receipts_expire:
            return None
        return self._env().setting(CERTIFICATE_TTL_SETTING)

    def pending_card(self, proposal_id: bytes) -> ConfirmationCard | None:
        pending = self.state.pending.get(proposal_id)
        return None if pending is None else pending.card

    def cards_for(self, public_key: bytes) -> tuple[ConfirmationCard, ...]:
        """The open cards that `public_key` alone may answer (on chains where
        `only_principals_answer_cards`): a principal's, or the owner's; in proposal-id
        order. Nothing for any other key."""
        if public_key == self.owner_key():
            who = OWNER_PRINCIPAL
        else:
            principal_id = self.state.principal_by_key.get(public_key)
            if principal_id is None:
                return ()
            who = PRINCIPAL_PREFIX + principal_id
        env = self._env()
        pending = self.state.pending
        return tuple(
            pending[pid].card
            for pid in sorted(pending)
            if confirm.may_answer(env, who, pending[pid].card.confirmer)
            and pending[pid].expires_at_ms > self._now_ms
        )

    def principal_of(self, agent_id: str) -> str | None:
        """The principal an agent acts for; None for the owner (or an unknown agent)."""
        return self.state.agent_principal.get(agent_id)

    def sealed_value(self, handle: str, sink: str) -> bytes | None:
        """The ciphertext an executor at `sink` opens; the engine never holds plaintext."""
        record = self.state.handles.get(handle)
        if record is None:
            return None
        for value in record.sealed:
            if value.sink == sink:
                return value.ciphertext
        return None

    def mandate_of(self, agent_id: str) -> tuple[Mandate | None, int]:
        record = self.state.agents.get(agent_id)
        if record is None:
            return (None, 0)
        return (record.mandate, record.mandate_version)

    def next_nonce(self, signer: bytes) -> int | None:
        """The smallest nonce above every one this signer has executed (what a client
        that lost count should use next), or None for an unknown signer."""
        window = self._nonce_window(signer)
        if window is None:
            return None
        return max(window.low_water, *window.executed, 0) + 1

    # ------------------------------------------------------------------ dispatch

    def _env(self) -> Env:
        return Env(self.config, self.state, self._height, self._now_ms)

    def _unknown_here(self, parsed: ParsedTx) -> bool:
        """A transaction that uses fields this chain's version does not have: provenance
        (docs/provenance.md) on a chain without `runs_carry_provenance`, a key rotation
        (docs/engine.md, "Rotating keys") on a chain without `rotates_keys`."""
        authority = self.config.authority_version
        payload = parsed.body.payload
        return (not runs_carry_provenance(authority) and uses_provenance(payload)) or (
            not rotates_keys(authority) and _is_rotation(payload)
        )

    def owner_key(self) -> bytes:
        """The owner's key now: the state's once the owner rotated it (docs/engine.md,
        "Rotating keys"), else cluster.json's."""
        return keys.owner_key(self.state, self.config.owner_public_key)

    def _unknown_signer(self, signer: bytes) -> Reason:
        """Why a key that holds no nonce window is refused: a retired key says so (a
        rotation retired it); any other is unknown. Neither changes any state."""
        return Reason.KEY_ROTATED if signer in self.state.retired_keys else Reason.UNKNOWN_SIGNER

    def _signer(self, signer: bytes) -> keys.Signer:
        """Who a verified key is, as a rotation asks."""
        if signer == self.owner_key():
            return (KeyHolder.OWNER, "")
        principal_id = self.state.principal_by_key.get(signer)
        if principal_id is not None:
            return (KeyHolder.PRINCIPAL, principal_id)
        return (KeyHolder.AGENT, self.state.agent_by_key[signer])

    def _nonce_window(self, signer: bytes) -> NonceWindow | None:
        if signer == self.owner_key():
            return self.state.owner_nonces
        agent_id = self.state.agent_by_key.get(signer)
        if agent_id is not None:
            return self.state.agents[agent_id].nonces
        principal_id = self.state.principal_by_key.get(signer)
        return None if principal_id is None else self.state.principals[principal_id].nonces

    def _execute_tx(
        self, env: Env, data: bytes, verify: bool, trace: Trace | None = None
    ) -> tuple[Verdict, ParsedTx | None]:
        """The transaction's verdict, and what it parsed to (None if it did not parse),
        which the block hands out as a side output so no caller parses it again."""
        try:
            parsed = parse(data, verify=verify)
        except TxRejected as exc:
            return Verdict(
                tx_id=exc.tx_id, kind=exc.kind, outcome=Outcome.REJECTED, reason=exc.reason
            ), None
        if self._unknown_here(parsed):
            # what the decoder of a chain without these fields made of the body: a field
            # it did not know, so not the canonical encoding (proto/codec.py)
            return Verdict(
                tx_id=parsed.tx_id, kind=parsed.kind, outcome=Outcome.REJECTED,
                reason=Reason.MALFORMED,
            ), parsed  # fmt: skip
        verdict = self._execute_parsed(env, parsed, trace)
        # The receipt binds the exact signed body (arguments included), not only the id.
        return replace(verdict, body_digest=sha256(parsed.signed.body)), parsed

    def _execute_parsed(self, env: Env, parsed: ParsedTx, trace: Trace | None = None) -> Verdict:
        """Check the chain, the signer and its nonce (recording it), then route by kind."""
        if parsed.body.chain_id != self.config.chain_id:
            return rejected(parsed, Reason.WRONG_CHAIN)
        is_owner = parsed.signer == self.owner_key()
        window = self._nonce_window(parsed.signer)
        if window is None:  # unknown and retired signers hold no state
            return rejected(parsed, self._unknown_signer(parsed.signer))
        if not window.is_fresh(parsed.nonce, self.config.nonce_window):
            return rejected(parsed, Reason.REPLAYED)
        window.record(parsed.nonce, self.config.nonce_window)
        payload = parsed.body.payload
        if isinstance(payload, Admin) and isinstance(payload.op, RotateKey):
            signer = self._signer(parsed.signer)
            if signer[0] is KeyHolder.AGENT:
                self.state.agent_changed(signer[1])  # its nonces changed
            return keys.rotate(env, parsed, payload.op, signer)
        principal_id = self.state.principal_by_key.get(parsed.signer)
        if principal_id is not None:
            # a principal answers cards, keeps its agents' named sets and names its
            # deputies, nothing else
            if isinstance(payload, Confirm):
                return confirm.confirm(env, parsed, payload, None, principal_id)
            return admin.principal_admin(env, parsed, payload, principal_id)
        record = None if is_owner else self.state.agents[self.state.agent_by_key[parsed.signer]]
        if record is not None:
            # its nonces changed; its quota window may too: a signer's record is the only
            # one a non-admin transaction writes
            self.state.agent_changed(record.agent_id)
        if isinstance(payload, Admin):
            if not is_owner:
                return rejected(parsed, Reason.NOT_OWNER, principal=principal_name(record))
            return admin.admin(env, parsed, payload.op)
        if isinstance(payload, Confirm):
            return confirm.confirm(env, parsed, payload, record)
        if isinstance(payload, Revoke):
            return delegation.revoke(env, parsed, payload, record)
        if isinstance(payload, SealEnvelope):
            return envelopes.seal(env, parsed, payload, record)
        if record is None:  # the owner is not an agent: it neither proposes nor delegates
            return rejected(parsed, Reason.NOT_AN_AGENT, principal=OWNER_PRINCIPAL)
        if isinstance(payload, Delegate):
            return delegation.delegate(env, parsed, payload, record)
        assert parsed.kind is TxKind.PROPOSAL and isinstance(payload, Proposal), parsed.kind
        return judge.propose(env, parsed, payload, record, trace)

    # ------------------------------------------------------------------ housekeeping

    def _prune_expired(self, env: Env) -> None:
        """Expired pending calls and grants are kept `expired_retention_ms`, then dropped:
        this is what bounds both tables over time (the per-principal caps bound them at
        any one moment). On chains where expired cards leave at once, a late answer gets
        `unknown_proposal`."""
        horizon = self._now_ms - self.config.expired_retention_ms
        at_once = expired_cards_leave_at_once(self.config.authority_version)
        card_horizon = self._now_ms if at_once else horizon
        # Found by the state's expiry heaps and dropped in key order: sorting, then
        # scanning, both tables in every block would cost what they hold.
        for proposal_id in self.state.expired("pending", card_horizon):
            confirm.drop_pending(env, proposal_id)
        grants = self.state.grants
        for grant_id in self.state.expired("grants", horizon):
            del grants[grant_id]


def _is_rotation(payload: object) -> bool:
    """A key rotation (docs/engine.md, "Rotating keys"), whoever signed it."""
    return isinstance(payload, Admin) and isinstance(payload.op, RotateKey)
