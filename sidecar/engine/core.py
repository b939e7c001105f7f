"""The governance engine: a pure, deterministic function from committed blocks to verdicts.

    engine = Engine(EngineConfig(chain_id=..., owner_public_key=...))
    result = engine.execute_block(height, block_time_ms, txs)
    result.verdicts, result.artifacts, result.state_root

No socket, database, clock, randomness or asyncio (STYLE.md rules 1-2): block time is the
only time, and every input is in the block or in the state. Remote garbage becomes a
`deny` or `rejected` verdict with a reason, never an exception; a broken internal
invariant is an assertion, which stops the sidecar (STYLE.md rule 6).

Who is asking is never read from a field (DESIGN §1): the principal is the registered
agent whose key verified the signature; the tier is `master` when it acts on its own
mandate and `delegate` when it acts under a grant; `delegate_of` and the run's owner come
from the grant chain recorded in the log.

A proposal is judged in this order (each step cites its rule):

1. quota (§4.7): over the sliding window -> `quota_exceeded`; the latch is not touched;
   then (authority version 2) a run no transaction of the agent opened -> `run_not_opened`;
2. a halted run (§4.3) -> `run_halted`, whatever the tool;
3. unknown tool (§4.1) -> `unknown_tool`; no mandate -> `no_mandate`;
4. suspension (§4.2), the agent's or any delegator's -> `suspended`; never latched;
5. the delegation chain (§4.4): unknown, mismatched, revoked, expired, refused by policy
   or too deep -> `delegation_*`;
6. the latch (§4.3): a tool already refused in this run -> `repeat_denied`, and the attempt
   that reaches the threshold -> `run_halted`;
7. scope (§4.2, §4.4): outside the effective scope -> `out_of_scope` (latched) under
   enforce, or a `flag` under observe (any enforce up the chain enforces);
8. tier (§4.5): a direct tool that requires `master` refuses a delegate;
9. the canonical target (§4.1) and the arguments (§4.1, §4.6): malformed, cross-principal,
   ambient identity, raw values where envelopes are required, handle violations;
10. mode (§4.5): `user_confirm` / `owner_confirm` -> `pending` with a card; otherwise
    `allow` (or `flag`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from quorumgate.proto import limits, names
from quorumgate.proto.canonical import Encoder, sha256
from quorumgate.proto.chainversions import (
    AUTHORITY_VERSION_NEW,
    AUTHORITY_VERSIONS,
    CANONICAL_VERSIONS,
    RECEIPT_VERSION_NEW,
    RECEIPT_VERSIONS,
    STATE_VERSION_NEW,
    STATE_VERSIONS,
    receipts_expire,
)
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import (
    Admin,
    AdminOp,
    ArgRole,
    Argument,
    Confirm,
    Delegate,
    DelegationPolicy,
    Enforcement,
    EnvelopeArg,
    Mandate,
    Outcome,
    Proposal,
    Reason,
    RegisterAgent,
    RegisterPrincipal,
    RegisterSink,
    RegisterTool,
    Resume,
    Revoke,
    SealEnvelope,
    SetEntries,
    SetMandate,
    SetSettings,
    Suspend,
    Tier,
    ToolMode,
    ToolRules,
    ToolSpec,
    TxKind,
    rules_for,
)
from quorumgate.proto.nonces import NonceWindow
from quorumgate.proto.runs import names_opened_run
from quorumgate.proto.tx import ParsedTx, TxRejected, parse
from quorumgate.sidecar.engine.rules import (
    judge_layer,
    rules_are_canonical,
    stricter,
    value_is_canonical,
)
from quorumgate.sidecar.engine.secrets import (
    name_is_credential,
    proposal_carries_secret,
    secret_in_target,
    secret_shape,
)
from quorumgate.sidecar.engine.state import (
    AgentRecord,
    EngineState,
    Grant,
    Handle,
    LatchBucket,
    LatchRun,
    PendingCall,
    PrincipalRecord,
    QuotaCounter,
    QuotaKey,
    RunKey,
    StateDelta,
)
from quorumgate.sidecar.engine.statements import (
    OWNER_PRINCIPAL,
    PRINCIPAL_PREFIX,
    AdmissionResult,
    BlockResult,
    ConfirmationCard,
    Verdict,
    build_artifacts,
    handle_for,
    target_digest,
)
from quorumgate.sidecar.engine.targets import (
    CANONICAL_VERSION_LATEST,
    NO_TARGET,
    UNCHECKED_TARGET,
    TargetRefused,
    canonical_call,
    canonicalize_target,
    split_call,
)
from quorumgate.sidecar.engine.unicode_assigned import UNICODE_VERSION

TAG_CONFIG = b"qg/engine-config/v1"
AUTHORITY_VERSION_LATEST = AUTHORITY_VERSION_NEW
# An argument name with no canonical form is recorded as this; never a valid name.
INVALID_ARGUMENT_NAME = "!"

Scope = tuple[str, ...] | None  # None: unrestricted; (): nothing
# One say on a call's target and arguments (§4.2, §4.4): the agent whose sets its `set`
# rules read, its rules, and whether they are a grant's (else a mandate's). Every layer
# must permit a call.
RuleLayer = tuple[str, tuple[ToolRules, ...], bool]


def intersect(a: Scope, b: Scope) -> Scope:
    """DESIGN §4.4: null ∩ X = X, X ∩ [] = []. Branches on `is None`, never on truthiness."""
    if a is None:
        return b
    if b is None:
        return a
    return tuple(sorted(set(a) & set(b)))


def permits(scope: Scope, tool: str) -> bool:
    return scope is None or tool in scope


@dataclass(frozen=True)
class EngineConfig:
    """Deployment constants every honest sidecar of one chain shares.

    Part of the state root (through `fingerprint`), so two sidecars configured differently
    disagree at once instead of drifting apart later.
    """

    chain_id: str
    owner_public_key: bytes
    nonce_window: int = limits.NONCE_WINDOW
    latch_halt_threshold: int = limits.LATCH_HALT_THRESHOLD_DEFAULT
    latch_runs_max: int = limits.LATCH_RUNS_MAX_DEFAULT
    latch_buckets_per_run_max: int = limits.LATCH_BUCKETS_PER_RUN_MAX_DEFAULT
    quota_window_ms: int = limits.QUOTA_WINDOW_MS_DEFAULT
    quota_proposals_max: int = limits.QUOTA_PROPOSALS_MAX_DEFAULT
    confirmation_ttl_ms: int = limits.CONFIRMATION_TTL_MS_DEFAULT
    pending_max: int = limits.PENDING_MAX_DEFAULT
    pending_per_principal_max: int = limits.PENDING_PER_PRINCIPAL_MAX_DEFAULT
    grant_ttl_ms_max: int = limits.GRANT_TTL_MS_MAX_DEFAULT
    grants_max: int = limits.GRANTS_MAX_DEFAULT
    grants_per_agent_max: int = limits.GRANTS_PER_AGENT_MAX_DEFAULT
    delegation_depth_max: int = limits.DELEGATION_DEPTH_MAX_DEFAULT
    handles_max: int = limits.HANDLES_MAX_DEFAULT
    handles_per_principal_max: int = limits.HANDLES_PER_PRINCIPAL_MAX_DEFAULT
    tools_max: int = limits.TOOLS_MAX_DEFAULT
    agents_max: int = limits.AGENTS_MAX_DEFAULT
    sinks_max: int = limits.SINKS_MAX_DEFAULT
    expired_retention_ms: int = limits.EXPIRED_RETENTION_MS_DEFAULT
    # The canonical-target forms of the chain (targets.CANONICAL_VERSIONS): fixed at
    # `init` and kept in cluster.json, so a replay decides old calls as they were decided.
    canonical_version: int = CANONICAL_VERSION_LATEST
    # Who answers confirmation cards (AUTHORITY_VERSIONS), fixed at `init` likewise:
    # 1, the proposing agent (or its master, or the owner), as chains from before issue 16
    # did; 2, only the principal the run acts for (`user_confirm`) or the owner
    # (`owner_confirm`), never an agent key.
    authority_version: int = AUTHORITY_VERSION_LATEST
    # Authority version 2: an (agent, tool) pair refused in this many runs is refused in
    # every run (a new run id does not reset the latch); in the fingerprint from version 2.
    latch_cross_run_threshold: int = limits.LATCH_CROSS_RUN_THRESHOLD_DEFAULT
    # How the state root is computed (STATE_VERSIONS), fixed at `init` likewise: 1, SHA-256
    # of the whole state bytes; 2, the hash tree over per-entry hashes (issue 19).
    state_version: int = STATE_VERSION_NEW
    # What the sidecars' receipts sign (RECEIPT_VERSIONS), fixed at `init` likewise; on a
    # chain whose receipts expire, how long after its block's time a certificate may be
    # used (an owner setting in the log changes it; in the fingerprint from version 2).
    receipt_version: int = RECEIPT_VERSION_NEW
    certificate_ttl_ms: int = limits.CERTIFICATE_TTL_MS_DEFAULT

    def __post_init__(self) -> None:
        if self.canonical_version not in CANONICAL_VERSIONS:
            raise ValueError(f"canonical_version must be one of {CANONICAL_VERSIONS}")
        if self.authority_version not in AUTHORITY_VERSIONS:
            raise ValueError(f"authority_version must be one of {AUTHORITY_VERSIONS}")
        if self.state_version not in STATE_VERSIONS:
            raise ValueError(f"state_version must be one of {STATE_VERSIONS}")
        if self.receipt_version not in RECEIPT_VERSIONS:
            raise ValueError(f"receipt_version must be one of {RECEIPT_VERSIONS}")
        low, high = limits.CERTIFICATE_TTL_MS_MIN, limits.CERTIFICATE_TTL_MS_MAX
        if not low <= self.certificate_ttl_ms <= high:
            raise ValueError(f"certificate_ttl_ms must be in {low}..{high}")
        if not 1 <= self.latch_cross_run_threshold < 2**32:
            raise ValueError("latch_cross_run_threshold must be in 1..2**32-1")
        if not 0 < len(self.chain_id) <= limits.ID_CHARS_MAX:
            raise ValueError("chain_id must be 1..64 characters")
        if len(self.owner_public_key) != 32:
            raise ValueError("owner_public_key must be a 32-byte Ed25519 public key")
        for name, value in self._limits():
            floor = 0 if name == "delegation_depth_max" else 1
            if not floor <= value < 2**32 and name not in _MS_FIELDS:
                raise ValueError(f"{name} must be in {floor}..2**32-1")
            if name in _MS_FIELDS and not 0 < value < 2**62:
                raise ValueError(f"{name} must be a positive number of milliseconds")

    def _limits(self) -> list[tuple[str, int]]:
        return [(name, getattr(self, name)) for name in _LIMIT_FIELDS]

    @property
    def fingerprint(self) -> bytes:
        enc = Encoder(TAG_CONFIG).text(self.chain_id).raw(self.owner_public_key)
        for name, value in self._limits():
            enc.text(name).u64(value)
        if self.canonical_version != 1:  # version 1 chains keep the fingerprint they had
            enc.text("canonical_version").u64(self.canonical_version)
            enc.text("unicode").text(UNICODE_VERSION)
        if self.authority_version != 1:  # likewise for chains from before principals
            enc.text("authority_version").u64(self.authority_version)
            enc.text("latch_cross_run_threshold").u64(self.latch_cross_run_threshold)
        if self.state_version != 1:  # likewise for chains from before the hash tree
            enc.text("state_version").u64(self.state_version)
        if self.receipts_expire:  # likewise for chains whose certificates never expire
            enc.text("receipt_version").u64(self.receipt_version)
            enc.text("certificate_ttl_ms").u64(self.certificate_ttl_ms)
        return enc.digest()

    @property
    def split_authority(self) -> bool:
        return self.authority_version >= 2

    @property
    def receipts_expire(self) -> bool:
        """Certificates carry a signed validity window (proto/clusterfile.py)."""
        return receipts_expire(self.receipt_version)


def config_for_cluster(spec: ClusterSpec) -> EngineConfig:
    """The engine configuration of a cluster's sidecars: cluster.json's chain, owner,
    versions and capacities; every other limit at its default (settings in the log change
    some while it runs)."""
    return EngineConfig(
        chain_id=spec.chain_id,
        owner_public_key=spec.owner_public_key,
        canonical_version=spec.canonical_version,
        authority_version=spec.authority_version,
        state_version=spec.state_version,
        receipt_version=spec.receipt_version,
        **dict(spec.capacities),
    )


TAG_SETTINGS = b"qg/engine-settings/v1"
CERTIFICATE_TTL_SETTING = "certificate_ttl_ms"
# The quota periods of block time (issue 15, item 5): fixed windows, so a counter is O(1).
QUOTA_PERIODS = (("minute", 60_000), ("hour", 3_600_000))


def effective_fingerprint(config: EngineConfig, settings: Mapping[str, int]) -> bytes:
    """The fingerprint of the configuration in effect: cluster.json's (`config.fingerprint`)
    while the log sets nothing, else that and every setting the log made (issue 15, item 5).
    The state carries it, so its root commits to both."""
    if not settings:
        return config.fingerprint
    enc = Encoder(TAG_SETTINGS).raw(config.fingerprint)
    for name in sorted(settings):
        enc.text(name).u64(settings[name])
    return enc.digest()


_LIMIT_FIELDS = (
    "nonce_window", "latch_halt_threshold", "latch_runs_max", "latch_buckets_per_run_max",
    "quota_window_ms", "quota_proposals_max", "confirmation_ttl_ms", "pending_max",
    "pending_per_principal_max", "grant_ttl_ms_max", "grants_max", "grants_per_agent_max",
    "delegation_depth_max", "handles_max", "handles_per_principal_max", "tools_max",
    "agents_max", "sinks_max", "expired_retention_ms",
)  # fmt: skip
_MS_FIELDS = frozenset(
    {"quota_window_ms", "confirmation_ttl_ms", "grant_ttl_ms_max", "expired_retention_ms"}
)


class StateCacheError(RuntimeError):
    """The engine's cached state bytes differ from a fresh encoding (an engine bug)."""


class _Refusal(Exception):
    """Control flow inside one transaction: stop judging, answer with this reason."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason.value)
        self.reason = reason


@dataclass(frozen=True)
class _Context:
    """DESIGN §1 / BRAH Γ: derived from the verified key and the log, never from fields."""

    principal: str
    tier: Tier
    delegate_of: str
    run_owner: str
    run_id: str

    @property
    def run_key(self) -> RunKey:
        return (self.run_owner, self.run_id)


@dataclass(frozen=True)
class _ChainView:
    """What a grant chain contributes to a delegate's authority, read at use time."""

    scope: Scope
    enforce: bool
    grantors: tuple[str, ...]  # nearest first; the last is the run's owner (the master)
    depth_limit: int
    layers: tuple[RuleLayer, ...] = ()  # every grant's and grantor mandate's rules


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
        """The state root of the chain's `state_version`: 1, SHA-256 of the state bytes
        (chains from before issue 19); 2, the hash tree over the entries."""
        if self._state_root is None:
            if self.config.state_version >= 2:
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
    ) -> BlockResult:
        """Execute one committed block. `verify_signatures=False` only for blocks whose
        transactions the replicas already verified (a certified block)."""
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
        self._prune_expired()
        verdicts = [self._execute_tx(data, verify_signatures) for data in txs]
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
        )

    def verify_state_cache(self) -> None:
        """Raise `StateCacheError` if the state bytes or the state root built from the
        per-entry caches differ from a fresh encoding: an entry changed unmarked, an engine
        bug that would otherwise report a state root that is not the state's. Costs a
        whole encoding; `execute_block` checks `STATE_CHECK_ENTRIES_PER_BLOCK` entries of
        a rotation over the state instead (`EngineState.check_entries`)."""
        if self.state_bytes() != self.state.fresh_bytes() or (
            self.config.state_version >= 2 and self.state_root() != self.state.fresh_tree_root()
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

        def refuse(reason: Reason) -> AdmissionResult:
            return AdmissionResult(False, reason, parsed.tx_id, parsed.kind)

        if parsed.body.chain_id != self.config.chain_id:
            return refuse(Reason.WRONG_CHAIN)
        window = self._nonce_window(parsed.signer)
        if window is None:
            return refuse(Reason.UNKNOWN_SIGNER)
        if not window.is_fresh(parsed.nonce, self.config.nonce_window):
            return refuse(Reason.REPLAYED)
        payload = parsed.body.payload
        is_owner = parsed.signer == self.config.owner_public_key
        is_principal = parsed.signer in self.state.principal_by_key
        if is_principal:
            # a principal answers cards, keeps its agents' named sets and names its
            # deputies, nothing else
            if not isinstance(payload, Confirm) and not _principal_op(payload):
                return refuse(Reason.NOT_AN_AGENT)
        elif isinstance(payload, Admin) and not is_owner:
            return refuse(Reason.NOT_OWNER)
        if isinstance(payload, Proposal | Delegate) and is_owner:
            return refuse(Reason.NOT_AN_AGENT)
        if isinstance(payload, Proposal):
            tool = names.canonical_tool_name(payload.tool)
            # version 2 orders a call to an invented tool, so that it is recorded and
            # counts toward the latch (and admission tells no one which tools exist)
            unknown = tool is None or tool not in self.state.tools
            if unknown and self.config.canonical_version < 2:
                return refuse(Reason.UNKNOWN_TOOL)
            if self.config.canonical_version >= 2:
                # a raw secret is refused before ordering, so it never enters a block
                spec = None if tool is None else self.state.tools.get(tool)
                secret = proposal_carries_secret(
                    payload, () if spec is None else tuple(a.name for a in spec.envelope_args)
                )
                if secret is not None:
                    return refuse(secret)
        return AdmissionResult(True, Reason.OK, parsed.tx_id, parsed.kind)

    def certificate_ttl_ms(self) -> int | None:
        """How long after the last executed block's time its certificates may be used (the
        log's setting, else cluster.json's), or None on a chain whose receipts do not
        expire. What the sidecar signs into the block's receipts (sidecar/execution.py)."""
        if not self.config.receipts_expire:
            return None
        return self._setting(CERTIFICATE_TTL_SETTING)

    def pending_card(self, proposal_id: bytes) -> ConfirmationCard | None:
        pending = self.state.pending.get(proposal_id)
        return None if pending is None else pending.card

    def cards_for(self, public_key: bytes) -> tuple[ConfirmationCard, ...]:
        """The open cards that `public_key` alone may answer (authority version 2): a
        principal's, or the owner's; in proposal-id order. Nothing for any other key."""
        if public_key == self.config.owner_public_key:
            who = OWNER_PRINCIPAL
        else:
            principal_id = self.state.principal_by_key.get(public_key)
            if principal_id is None:
                return ()
            who = PRINCIPAL_PREFIX + principal_id
        pending = self.state.pending
        return tuple(
            pending[pid].card
            for pid in sorted(pending)
            if self._may_answer(who, pending[pid].card.confirmer)
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

    # ------------------------------------------------------------------ dispatch

    def next_nonce(self, signer: bytes) -> int | None:
        """The smallest nonce above every one this signer has executed (what a client
        that lost count should use next), or None for an unknown signer."""
        window = self._nonce_window(signer)
        if window is None:
            return None
        return max(window.low_water, *window.executed, 0) + 1

    def _nonce_window(self, signer: bytes) -> NonceWindow | None:
        if signer == self.config.owner_public_key:
            return self.state.owner_nonces
        agent_id = self.state.agent_by_key.get(signer)
        if agent_id is not None:
            return self.state.agents[agent_id].nonces
        principal_id = self.state.principal_by_key.get(signer)
        return None if principal_id is None else self.state.principals[principal_id].nonces

    def _execute_tx(self, data: bytes, verify: bool) -> Verdict:
        try:
            parsed = parse(data, verify=verify)
        except TxRejected as exc:
            return Verdict(
                tx_id=exc.tx_id, kind=exc.kind, outcome=Outcome.REJECTED, reason=exc.reason
            )
        verdict = self._execute_parsed(parsed)
        # The receipt binds the exact signed body (arguments included), not only the id.
        return replace(verdict, body_digest=sha256(parsed.signed.body))

    def _execute_parsed(self, parsed: ParsedTx) -> Verdict:
        kind = parsed.kind
        if parsed.body.chain_id != self.config.chain_id:
            return _rejected(parsed, Reason.WRONG_CHAIN)
        is_owner = parsed.signer == self.config.owner_public_key
        window = self._nonce_window(parsed.signer)
        if window is None:  # unknown signers hold no state
            return _rejected(parsed, Reason.UNKNOWN_SIGNER)
        if not window.is_fresh(parsed.nonce, self.config.nonce_window):
            return _rejected(parsed, Reason.REPLAYED)
        window.record(parsed.nonce, self.config.nonce_window)
        payload = parsed.body.payload
        principal_id = self.state.principal_by_key.get(parsed.signer)
        if principal_id is not None:
            # a principal answers cards and keeps its agents' named sets, nothing else
            if isinstance(payload, Confirm):
                return self._confirm(parsed, payload, None, principal_id)
            who = PRINCIPAL_PREFIX + principal_id
            if isinstance(payload, Admin) and isinstance(payload.op, SetEntries):
                op = payload.op
                if self.state.agent_principal.get(op.principal) != principal_id:
                    return _rejected(parsed, Reason.NOT_OWNER, principal=who, subject=op.principal)
                reason = self._set_entries(op)
                if reason is not None:
                    return _rejected(parsed, reason, principal=who, subject=op.principal)
                return _applied(parsed, principal=who, subject=op.principal)
            if isinstance(payload, Admin) and isinstance(payload.op, RegisterPrincipal):
                # a principal names its own deputies (same id, same key); nothing else
                person = payload.op
                mine = self.state.principals[principal_id]
                if person.principal_id != principal_id or person.public_key != mine.public_key:
                    subject = person.principal_id
                    return _rejected(parsed, Reason.NOT_OWNER, principal=who, subject=subject)
                reason = self._register_principal(person)
                if reason is not None:
                    return _rejected(parsed, reason, principal=who, subject=principal_id)
                return _applied(parsed, principal=who, subject=principal_id)
            return _rejected(parsed, Reason.NOT_AN_AGENT, principal=who)
        record = None if is_owner else self.state.agents[self.state.agent_by_key[parsed.signer]]
        if record is not None:
            # its nonces changed; its quota window may too: a signer's record is the only
            # one a non-admin transaction writes
            self.state.agent_changed(record.agent_id)
        if isinstance(payload, Admin):
            if not is_owner:
                return _rejected(parsed, Reason.NOT_OWNER, principal=_principal(record))
            return self._admin(parsed, payload.op)
        if isinstance(payload, Confirm):
            return self._confirm(parsed, payload, record)
        if isinstance(payload, Revoke):
            return self._revoke(parsed, payload, record)
        if isinstance(payload, SealEnvelope):
            return self._seal(parsed, payload, record)
        if record is None:  # the owner is not an agent: it neither proposes nor delegates
            return _rejected(parsed, Reason.NOT_AN_AGENT, principal=OWNER_PRINCIPAL)
        if isinstance(payload, Delegate):
            return self._delegate(parsed, payload, record)
        assert kind is TxKind.PROPOSAL and isinstance(payload, Proposal), kind
        return self._propose(parsed, payload, record)

    # ------------------------------------------------------------------ proposals

    def _context(self, record: AgentRecord, proposal: Proposal) -> _Context:
        if proposal.grant is None:
            return _Context(record.agent_id, Tier.MASTER, "", record.agent_id, proposal.run_id)
        grant = self.state.grants.get(proposal.grant)
        if grant is None or grant.child != record.agent_id or grant.run_id != proposal.run_id:
            # an unusable grant: the call is refused below and touches only its own run,
            # never a run of someone else's namespace
            return _Context(record.agent_id, Tier.DELEGATE, "", record.agent_id, proposal.run_id)
        return _Context(
            record.agent_id, Tier.DELEGATE, grant.grantor, grant.run_owner, proposal.run_id
        )

    def _propose(self, parsed: ParsedTx, proposal: Proposal, record: AgentRecord) -> Verdict:
        ctx = self._context(record, proposal)
        v2 = self.config.canonical_version >= 2
        tool = names.canonical_tool_name(proposal.tool)
        spec = self.state.tools.get(tool) if tool is not None else None
        target = UNCHECKED_TARGET
        extras: tuple[tuple[str, str], ...] = ()
        target_refusal: Reason | None = None
        if spec is not None:
            try:
                target = canonicalize_target(
                    proposal.target,
                    principal=record.agent_id,
                    schemes=spec.target_schemes,
                    binds_caller=spec.binds_caller,
                    version=self.config.canonical_version,
                    optional=spec.target_optional,
                )
                extras = self._further_targets(proposal, spec, record.agent_id)
            except TargetRefused as exc:
                target_refusal = exc.reason
            if (
                target_refusal is None
                and v2
                and any(secret_in_target(each) for each in (target, *(t for _, t in extras)))
            ):
                # refused, and recorded without the secret: no verdict, artifact or card
                # keeps a target that carries one
                target_refusal = Reason.SECRET_IN_PLAINTEXT
            if target_refusal is not None:
                target, extras = UNCHECKED_TARGET, ()
        canonical = canonical_call(tool if tool is not None else UNCHECKED_TARGET, target, extras)
        argument_names = tuple(
            names.canonical_argument_name(arg.name) or INVALID_ARGUMENT_NAME
            for arg in proposal.arguments
        )

        def verdict(
            outcome: Outcome, reason: Reason, card: ConfirmationCard | None = None
        ) -> Verdict:
            return Verdict(
                tx_id=parsed.tx_id,
                kind=TxKind.PROPOSAL,
                outcome=outcome,
                reason=reason,
                mandate_version=record.mandate_version,
                principal=record.agent_id,
                tier=ctx.tier,
                delegate_of=ctx.delegate_of,
                canonical_target=canonical,
                target_digest=target_digest(canonical),
                argument_names=argument_names,
                proposal_id=parsed.tx_id,
                card=card,
                card_digest=b"" if card is None else card.digest,
            )

        # issue 16: on its own mandate an agent acts in a run one of its transactions opened
        # (`n<k>`, proto/runs.py), never in one it names
        run_opened = (
            not self.config.split_authority
            or proposal.grant is not None
            or names_opened_run(proposal.run_id, parsed.nonce)
        )
        try:
            flagged, mode = self._judge(
                ctx, record, proposal, tool, spec, target, target_refusal, run_opened, extras
            )
        except _Refusal as refusal:
            return verdict(Outcome.DENY, refusal.reason)
        assert spec is not None and tool is not None
        if mode.needs_confirmation:
            try:
                card = self._hold_for_confirmation(
                    parsed, ctx, proposal, spec, mode, canonical, flagged
                )
            except _Refusal as refusal:
                return verdict(Outcome.DENY, refusal.reason)
            return verdict(Outcome.PENDING, Reason.CONFIRMATION_REQUIRED, card)
        if flagged:
            return verdict(Outcome.FLAG, Reason.OUT_OF_SCOPE_OBSERVED)
        return verdict(Outcome.ALLOW, Reason.OK)

    def _further_targets(
        self, proposal: Proposal, spec: ToolSpec, principal: str
    ) -> tuple[tuple[str, str], ...]:
        """The canonical (role, target) pairs of a call's further targets, sorted: each in
        a role the tool declares, under that role's schemes, at most its `max`, none twice.
        Raises TargetRefused."""
        if not proposal.targets:
            return ()
        if self.config.canonical_version < 3:
            raise TargetRefused(Reason.MALFORMED_TARGET, "this chain takes one target per call")
        out: set[tuple[str, str]] = set()
        counts: dict[str, int] = {}
        for extra in proposal.targets:
            slot = spec.slot(extra.role)
            if slot is None:
                raise TargetRefused(Reason.TARGET_SCHEME_NOT_ALLOWED, "a role the tool lacks")
            counts[extra.role] = counts.get(extra.role, 0) + 1
            if counts[extra.role] > slot.max:
                raise TargetRefused(Reason.MALFORMED_TARGET, "more targets than the role takes")
            canonical = canonicalize_target(
                extra.target,
                principal=principal,
                schemes=slot.schemes,
                version=self.config.canonical_version,
            )
            if canonical == NO_TARGET or (extra.role, canonical) in out:
                raise TargetRefused(Reason.MALFORMED_TARGET, "an empty or repeated target")
            out.add((extra.role, canonical))
        return tuple(sorted(out))

    def _judge(
        self,
        ctx: _Context,
        record: AgentRecord,
        proposal: Proposal,
        tool: str | None,
        spec: ToolSpec | None,
        target: str,
        target_refusal: Reason | None,
        run_opened: bool = True,
        extras: tuple[tuple[str, str], ...] = (),
    ) -> tuple[bool, ToolMode]:
        """Steps 1-9 of the module docstring. Returns whether the call is flagged, and the
        mode it runs in (the tool's, or the one its rules name)."""
        if not self._quota_admits(record, tool, ctx.run_key):
            raise _Refusal(Reason.QUOTA_EXCEEDED)
        if not run_opened:
            raise _Refusal(Reason.RUN_NOT_OPENED)  # not latched: there is no run to latch
        run = self._latch_touch(ctx.run_key)
        if run is not None and run.halt_chain is not None:
            raise _Refusal(Reason.RUN_HALTED)
        probes_latch = self.config.canonical_version >= 2
        if spec is None or tool is None:
            if probes_latch:
                # an invented tool is a probe: recorded, and counted toward the latch
                self._probe_denial(ctx, record, tool or UNCHECKED_TARGET, Reason.UNKNOWN_TOOL)
            raise _Refusal(Reason.UNKNOWN_TOOL)
        if spec.definition_digest is not None and proposal.definition != spec.definition_digest:
            # issue 18: the tool changed under its name (a poisoned description arrives this
            # way) or the call does not say on what it was made; not a scope decision, so
            # not latched: the owner pins the new definition, or the upstream puts it back
            raise _Refusal(Reason.TOOL_DEFINITION_CHANGED)
        mandate = record.mandate
        if mandate is None:
            raise _Refusal(Reason.NO_MANDATE)
        if record.suspended:
            raise _Refusal(Reason.SUSPENDED)
        scope, enforce, chain, layers = self._effective_scope(
            record, mandate, proposal.grant, ctx.run_id
        )
        bucket = None if run is None else run.buckets.get((record.agent_id, tool))
        if bucket is not None:
            if self._latch_repeat(ctx.run_key, bucket, chain):
                raise _Refusal(Reason.RUN_HALTED)
            raise _Refusal(Reason.REPEAT_DENIED)
        if self._latched_across_runs(record.agent_id, tool):
            # refused in enough runs: refused in this one too, which it counts toward
            if self._latch_first_denial(ctx.run_key, record.agent_id, tool, chain):
                raise _Refusal(Reason.RUN_HALTED)
            raise _Refusal(Reason.REPEAT_DENIED)
        flagged = False
        if not permits(scope, tool):
            if enforce:
                self._scope_denial(ctx, record, tool, chain)
            flagged = True
        if target_refusal is not None:
            if probes_latch and target_refusal is Reason.CROSS_PRINCIPAL_TARGET:
                self._probe_denial(ctx, record, tool, target_refusal, chain)
            raise _Refusal(target_refusal)
        # §4.2: the target and argument rules of every layer, on the canonical target
        permitted, mode = self._judge_rules(
            layers, spec, target, proposal.arguments, record.agent_id, extras
        )
        if not permitted:
            if enforce:
                self._scope_denial(ctx, record, tool, chain)
            flagged = True
        # §4.5, after the rules: a rule that runs a master-only tool directly does not let
        # a delegate through (its confirmation would have checked the tier)
        delegate = ctx.tier is Tier.DELEGATE
        if spec.min_tier is Tier.MASTER and delegate and not mode.needs_confirmation:
            raise _Refusal(Reason.TIER_INSUFFICIENT)
        try:
            self._check_arguments(record.agent_id, spec, proposal.arguments)
        except _Refusal as refusal:
            if probes_latch and refusal.reason is Reason.HANDLE_VIOLATION:
                self._probe_denial(ctx, record, tool, refusal.reason, chain)
            raise
        return flagged, mode

    def _probe_denial(
        self,
        ctx: _Context,
        record: AgentRecord,
        tool: str,
        reason: Reason,
        chain: tuple[str, ...] | None = None,
    ) -> None:
        """Canonical version 2: a call that probes what it may not know (an invented tool,
        another principal's target, a handle not its own) counts toward the latch like a
        scope denial, so a run that keeps probing is halted. Raises unless it is the first
        such denial of this tool in the run (the caller then raises `reason`); a later
        one is `repeat_denied`."""
        members = chain if chain is not None else (record.agent_id,)
        run = self.state.latch_runs.get(ctx.run_key)
        bucket = None if run is None else run.buckets.get((record.agent_id, tool))
        if bucket is not None:
            if self._latch_repeat(ctx.run_key, bucket, members):
                raise _Refusal(Reason.RUN_HALTED)
            raise _Refusal(Reason.REPEAT_DENIED)
        if self._latch_first_denial(ctx.run_key, record.agent_id, tool, members):
            raise _Refusal(Reason.RUN_HALTED)

    def _scope_denial(
        self, ctx: _Context, record: AgentRecord, tool: str, chain: tuple[str, ...]
    ) -> None:
        """A scope denial under enforce (§4.3): latched; always raises."""
        if self._latch_first_denial(ctx.run_key, record.agent_id, tool, chain):
            raise _Refusal(Reason.RUN_HALTED)
        raise _Refusal(Reason.OUT_OF_SCOPE)

    def _effective_scope(
        self, record: AgentRecord, mandate: Mandate, grant: bytes | None, run_id: str
    ) -> tuple[Scope, bool, tuple[str, ...], tuple[RuleLayer, ...]]:
        """§4.4: own mandate ∩ pinned grant scopes ∩ every delegator's current mandate;
        and the rule layers of each (§4.2)."""
        enforce = mandate.enforcement is Enforcement.ENFORCE
        own: RuleLayer = (record.agent_id, mandate.rules, False)
        if grant is None:
            return mandate.allowed_tools, enforce, (record.agent_id,), (own,)
        view = self._resolve_chain(grant, record.agent_id, run_id)
        return (
            intersect(mandate.allowed_tools, view.scope),
            enforce or view.enforce,
            (record.agent_id, *view.grantors),
            (own, *view.layers),
        )

    def _judge_rules(
        self,
        layers: tuple[RuleLayer, ...],
        spec: ToolSpec,
        target: str,
        arguments: tuple[Argument, ...] | None,
        principal: str,
        extras: tuple[tuple[str, str], ...] = (),
    ) -> tuple[bool, ToolMode]:
        """Every layer's target and argument rules (§4.2): whether all permit the call, and
        the mode it runs in. Each mandate on the chain says the mode its matching rule
        names, or the tool's; a grant only ever makes it stricter. The strictest wins, so
        a mandate can relax the tool's mode for its own agent (a known payee: direct), but
        no delegate runs more directly than its delegator would."""
        mode: ToolMode | None = None
        for owner, rules, is_grant in layers:
            entry = rules_for(rules, spec.name)
            permitted, chosen = judge_layer(
                entry,
                target,
                arguments,
                principal,
                self.state.sets_of(owner),
                extras,
                default=None if is_grant else spec.mode,
            )
            if not permitted:
                return False, spec.mode
            if chosen is None and not is_grant:
                chosen = spec.mode
            mode = stricter(mode, chosen)
        return True, spec.mode if mode is None else mode

    def _resolve_chain(self, grant_id: bytes, child: str, run_id: str) -> _ChainView:
        """Walk a grant chain up to its root, checking every link against the current state
        (a photograph of the parent cannot notice a revocation: mandate guide)."""
        scope: Scope = None
        enforce = False
        grantors: list[str] = []
        layers: list[RuleLayer] = []
        depth_limit = self._setting("delegation_depth_max")
        expected_child = child
        current: bytes | None = grant_id
        while current is not None:
            assert len(grantors) <= self.config.delegation_depth_max, "grant chain too deep"
            grant = self.state.grants.get(current)
            if grant is None:
                raise _Refusal(Reason.DELEGATION_UNKNOWN)
            if grant.child != expected_child or grant.run_id != run_id:
                raise _Refusal(Reason.DELEGATION_MISMATCH)
            if grant.revoked:
                raise _Refusal(Reason.DELEGATION_REVOKED)
            if self._now_ms >= grant.expires_at_ms:
                raise _Refusal(Reason.DELEGATION_EXPIRED)
            grantor = self.state.agents[grant.grantor]
            mandate = grantor.mandate
            if mandate is None or mandate.delegation_policy is not DelegationPolicy.ATTENUATED:
                raise _Refusal(Reason.DELEGATION_REFUSED)
            if grantor.suspended:
                raise _Refusal(Reason.SUSPENDED)
            if mandate.max_delegation_depth is not None:
                depth_limit = min(depth_limit, mandate.max_delegation_depth)
            scope = intersect(intersect(scope, grant.scope), mandate.allowed_tools)
            enforce = enforce or mandate.enforcement is Enforcement.ENFORCE
            layers += [(grant.grantor, grant.rules, True), (grant.grantor, mandate.rules, False)]
            grantors.append(grant.grantor)
            expected_child = grant.grantor
            current = grant.parent_grant
        if len(grantors) > depth_limit:
            raise _Refusal(Reason.DELEGATION_DEPTH_EXCEEDED)
        return _ChainView(scope, enforce, tuple(grantors), depth_limit, tuple(layers))

    def _check_arguments(
        self, principal: str, spec: ToolSpec, arguments: tuple[Argument, ...]
    ) -> None:
        """§4.1 ambient identity, §4.6 envelopes and the dereference rule."""
        if spec.binds_caller and arguments:
            raise _Refusal(Reason.STATUS_TOOL_ARGUMENT)  # BRAH §7.3: no existence oracle
        seen: set[str] = set()
        by_declaration = self.config.split_authority and bool(spec.arguments)
        for arg in arguments:
            name = names.canonical_argument_name(arg.name)
            if name is None or name in seen:
                raise _Refusal(Reason.MALFORMED_ARGUMENT)
            seen.add(name)
            envelope = spec.envelope_arg(name)
            if by_declaration:
                self._check_declared(principal, spec, name, envelope, arg)
                continue
            # BRAH AST-01: declared envelope carriers are exempt from the identity ban;
            # a handle can only be the caller's own (the dereference rule below).
            if envelope is None and names.is_ambient_identity_name(name):
                raise _Refusal(Reason.AMBIENT_IDENTITY_ARGUMENT)
            if arg.handle is None:
                v2 = self.config.canonical_version >= 2
                if envelope is not None or names.is_raw_secret_name(name):
                    raise _Refusal(Reason.ENVELOPE_REQUIRED)
                if v2 and name_is_credential(name):
                    raise _Refusal(Reason.ENVELOPE_REQUIRED)
                if v2 and secret_shape(arg.text or ""):
                    raise _Refusal(Reason.SECRET_IN_PLAINTEXT)
                continue
            self._check_handle(principal, spec, envelope, arg.handle)

    def _check_declared(
        self,
        principal: str,
        spec: ToolSpec,
        name: str,
        envelope: EnvelopeArg | None,
        arg: Argument,
    ) -> None:
        """Issue 15, item 4: a tool that declares its arguments is judged by declaration,
        not by argument names: an undeclared argument is refused; an identity is never sent
        (the tool takes the caller from the signed transaction); a credential only as a
        handle; values shaped like secrets are refused as everywhere."""
        declared = spec.declared_arg(name)
        if declared is None and envelope is None:
            raise _Refusal(Reason.UNDECLARED_ARGUMENT)
        if declared is not None and declared.role is ArgRole.IDENTITY:
            raise _Refusal(Reason.AMBIENT_IDENTITY_ARGUMENT)
        if arg.handle is None:
            if envelope is not None or (declared and declared.role is ArgRole.CREDENTIAL):
                raise _Refusal(Reason.ENVELOPE_REQUIRED)
            if secret_shape(arg.text or ""):
                raise _Refusal(Reason.SECRET_IN_PLAINTEXT)
        else:
            self._check_handle(principal, spec, envelope, arg.handle)

    def _check_handle(
        self, principal: str, spec: ToolSpec, envelope: EnvelopeArg | None, handle: str
    ) -> None:
        """BRAH eq. (5): h is usable only by its owner, only toward a sink it was sealed to.
        An unknown handle and another principal's handle get the same answer, so a refusal
        says nothing about whether the handle exists (C-1, C-4)."""
        record = self.state.handles.get(handle)
        if (
            record is None
            or record.owner != principal
            or spec.sink is None
            or spec.sink not in record.sinks
        ):
            raise _Refusal(Reason.HANDLE_VIOLATION)
        if envelope is not None and (
            record.kind != envelope.kind or (envelope.require_verified and not record.verified)
        ):
            raise _Refusal(Reason.HANDLE_KIND_MISMATCH)

    def _hold_for_confirmation(
        self,
        parsed: ParsedTx,
        ctx: _Context,
        proposal: Proposal,
        spec: ToolSpec,
        mode: ToolMode,
        canonical: str,
        flagged: bool,
    ) -> ConfirmationCard:
        pending = self.state.pending
        if parsed.tx_id in pending:  # impossible: tx ids are unique per (signer, nonce)
            raise AssertionError("pending proposal id reused")
        mine = self.state.count("pending", ctx.principal)
        if len(pending) >= self.config.pending_max or mine >= self.config.pending_per_principal_max:
            raise _Refusal(Reason.PENDING_LIMIT)
        handles = tuple(
            sorted(
                (names.canonical_argument_name(arg.name) or INVALID_ARGUMENT_NAME, arg.handle)
                for arg in proposal.arguments
                if arg.handle is not None
            )
        )
        expires = self._now_ms + self._setting("confirmation_ttl_ms")
        # issue 16: the card names who alone answers it
        confirmer = self._confirmer_of(ctx.run_owner, mode) if self.config.split_authority else ""
        card = ConfirmationCard(
            chain_id=self.config.chain_id,
            proposal_id=parsed.tx_id,
            principal=ctx.principal,
            tier=ctx.tier,
            delegate_of=ctx.delegate_of,
            tool=spec.name,
            mode=mode,
            min_tier=spec.min_tier,
            canonical_target=canonical,
            argument_names=tuple(
                names.canonical_argument_name(arg.name) or INVALID_ARGUMENT_NAME
                for arg in proposal.arguments
            ),
            handles=handles,
            body_digest=sha256(parsed.signed.body),
            created_height=self._height,
            expires_at_ms=expires,
            confirmer=confirmer,
        )
        pending[parsed.tx_id] = PendingCall(
            proposal_id=parsed.tx_id,
            principal=ctx.principal,
            run_owner=ctx.run_owner,
            run_id=ctx.run_id,
            tier=ctx.tier,
            grant=proposal.grant,
            tool=spec.name,
            canonical_target=canonical,
            handles=handles,
            flagged=flagged,
            card=card,
            expires_at_ms=expires,
        )
        return card

    # ------------------------------------------------------------------ confirmations

    def _confirm(
        self,
        parsed: ParsedTx,
        confirm: Confirm,
        record: AgentRecord | None,
        principal_id: str | None = None,
    ) -> Verdict:
        """§4.5: a Confirm naming the card digest settles a pending call - after the call
        is judged again against the state as it is now, so a suspension or narrowing in
        between still stops it. Who may answer: under authority version 2 only the card's
        confirmer (a principal or the owner, never an agent), who may also reject it;
        under version 1 the proposer, its master or the owner (`_confirmer_tier`)."""
        pending = self.state.pending.get(confirm.proposal_id)
        if principal_id is not None:
            confirmer = PRINCIPAL_PREFIX + principal_id
        else:
            confirmer = _principal(record)
        if confirm.reject and not self.config.split_authority:
            return _rejected(parsed, Reason.INVALID_SPEC, principal=confirmer)
        if pending is None:
            return _rejected(parsed, Reason.UNKNOWN_PROPOSAL, principal=confirmer)
        principal_record = self.state.agents[pending.principal]

        def verdict(outcome: Outcome, reason: Reason) -> Verdict:
            return Verdict(
                tx_id=parsed.tx_id,
                kind=TxKind.CONFIRM,
                outcome=outcome,
                reason=reason,
                mandate_version=principal_record.mandate_version,
                principal=pending.principal,
                tier=pending.tier,
                delegate_of=pending.card.delegate_of,
                canonical_target=pending.canonical_target,
                target_digest=target_digest(pending.canonical_target),
                argument_names=pending.argument_names,
                proposal_id=pending.proposal_id,
                card_digest=pending.card.digest,
                subject=confirmer,
            )

        if self._now_ms >= pending.expires_at_ms:
            self._drop_pending(pending.proposal_id)
            return verdict(Outcome.REJECTED, Reason.CONFIRMATION_EXPIRED)
        if self.config.split_authority:
            return self._answer(pending, confirm, confirmer, verdict)
        confirmer_tier = self._confirmer_tier(pending, record)
        if confirmer_tier is None:
            return verdict(Outcome.REJECTED, Reason.CONFIRMER_NOT_AUTHORIZED)
        if confirm.card_digest != pending.card.digest:
            return verdict(Outcome.REJECTED, Reason.CARD_DIGEST_MISMATCH)
        spec = self.state.tools.get(pending.tool)
        min_tier = pending.card.min_tier
        if spec is not None and spec.min_tier.rank > min_tier.rank:
            min_tier = spec.min_tier
        if confirmer_tier.rank < min_tier.rank:
            return verdict(Outcome.REJECTED, Reason.TIER_INSUFFICIENT)
        del self.state.pending[pending.proposal_id]
        try:
            flagged = self._recheck(pending, principal_record, spec)
        except _Refusal as refusal:
            return verdict(Outcome.DENY, refusal.reason)
        if flagged:
            return verdict(Outcome.FLAG, Reason.OUT_OF_SCOPE_OBSERVED)
        return verdict(Outcome.ALLOW, Reason.OK)

    def _answer(
        self,
        pending: PendingCall,
        confirm: Confirm,
        confirmer: str,
        verdict: Callable[[Outcome, Reason], Verdict],
    ) -> Verdict:
        """Authority version 2 (issue 16): only the card's confirmer answers; its answers
        naming a wrong digest lock the proposal at the CARD_WRONG_DIGESTS_MAX-th (others'
        answers count for nothing, so no one else can lock a call out); a reject or a lock
        takes the card out of the state at once."""
        proposal_id = pending.proposal_id
        if not self._may_answer(confirmer, pending.card.confirmer):
            return verdict(Outcome.REJECTED, Reason.CONFIRMER_NOT_AUTHORIZED)
        if confirm.card_digest != pending.card.digest:
            wrong = self.state.wrong_digests.get(proposal_id, 0) + 1
            if wrong >= limits.CARD_WRONG_DIGESTS_MAX:
                self._drop_pending(proposal_id)
                return verdict(Outcome.DENY, Reason.CARD_LOCKED)
            self.state.wrong_digests[proposal_id] = wrong
            return verdict(Outcome.REJECTED, Reason.CARD_DIGEST_MISMATCH)
        self._drop_pending(proposal_id)
        if confirm.reject:
            return verdict(Outcome.DENY, Reason.CONFIRMATION_REJECTED)
        principal_record = self.state.agents[pending.principal]
        try:
            flagged = self._recheck(pending, principal_record, self.state.tools.get(pending.tool))
        except _Refusal as refusal:
            return verdict(Outcome.DENY, refusal.reason)
        if flagged:
            return verdict(Outcome.FLAG, Reason.OUT_OF_SCOPE_OBSERVED)
        return verdict(Outcome.ALLOW, Reason.OK)

    def _may_answer(self, who: str, card_confirmer: str) -> bool:
        """The card's confirmer, or a principal the card's principal names as its deputy
        (as the state is now: a deputy named or removed later counts from then)."""
        if who == card_confirmer:
            return True
        if not (who.startswith(PRINCIPAL_PREFIX) and card_confirmer.startswith(PRINCIPAL_PREFIX)):
            return False
        named = self.state.principals.get(card_confirmer.removeprefix(PRINCIPAL_PREFIX))
        return named is not None and who.removeprefix(PRINCIPAL_PREFIX) in named.deputies

    def _drop_pending(self, proposal_id: bytes) -> None:
        del self.state.pending[proposal_id]
        self.state.wrong_digests.pop(proposal_id, None)

    def _confirmer_tier(self, pending: PendingCall, record: AgentRecord | None) -> Tier | None:
        if record is None:
            return Tier.OWNER
        if pending.card.mode is ToolMode.OWNER_CONFIRM:
            return None
        if record.agent_id == pending.principal:
            return pending.tier
        if pending.tier is Tier.DELEGATE and record.agent_id == pending.run_owner:
            return Tier.MASTER  # the master the delegate acts for (BRAH §6.8)
        return None

    def _recheck(self, pending: PendingCall, record: AgentRecord, spec: ToolSpec | None) -> bool:
        """Judge a pending call again at confirmation time (no quota, no latch writes)."""
        run = self.state.latch_runs.get((pending.run_owner, pending.run_id))
        if run is not None and run.halt_chain is not None:
            raise _Refusal(Reason.RUN_HALTED)
        if spec is None:
            raise _Refusal(Reason.UNKNOWN_TOOL)
        mandate = record.mandate
        if mandate is None:
            raise _Refusal(Reason.NO_MANDATE)
        if record.suspended:
            raise _Refusal(Reason.SUSPENDED)
        scope, enforce, _, layers = self._effective_scope(
            record, mandate, pending.grant, pending.run_id
        )
        flagged = pending.flagged
        target, extras = split_call(pending.tool, pending.canonical_target)
        permitted, _ = self._judge_rules(layers, spec, target, None, record.agent_id, extras)
        if not (permits(scope, pending.tool) and permitted):
            if enforce:
                raise _Refusal(Reason.OUT_OF_SCOPE)
            flagged = True
        for name, handle in pending.handles:
            self._check_handle(record.agent_id, spec, spec.envelope_arg(name), handle)
        return flagged

    # ------------------------------------------------------------------ delegation

    def _delegate(self, parsed: ParsedTx, delegate: Delegate, record: AgentRecord) -> Verdict:
        child = self.state.agent_by_key.get(delegate.child)
        subject = child or ""

        def rejected(reason: Reason) -> Verdict:
            return _rejected(
                parsed,
                reason,
                principal=record.agent_id,
                subject=subject,
                version=record.mandate_version,
            )

        if child is None:
            return rejected(Reason.UNKNOWN_AGENT)
        if child == record.agent_id:
            return rejected(Reason.INVALID_SPEC)
        mandate = record.mandate
        if mandate is None or mandate.delegation_policy is not DelegationPolicy.ATTENUATED:
            return rejected(Reason.DELEGATION_REFUSED)
        if record.suspended:
            return rejected(Reason.SUSPENDED)
        scope = mandate.allowed_tools
        depth_limit = self._setting("delegation_depth_max")
        if mandate.max_delegation_depth is not None:
            depth_limit = min(depth_limit, mandate.max_delegation_depth)
        depth = 1
        run_owner = record.agent_id
        parent_expires = None
        if (
            self.config.split_authority
            and delegate.parent_grant is None
            and not names_opened_run(delegate.run_id, parsed.nonce)
        ):
            return rejected(Reason.RUN_NOT_OPENED)  # a chain starts in a run of its root's
        if delegate.parent_grant is not None:
            try:
                view = self._resolve_chain(delegate.parent_grant, record.agent_id, delegate.run_id)
            except _Refusal as refusal:
                return rejected(refusal.reason)
            scope = intersect(scope, view.scope)
            depth = len(view.grantors) + 1
            depth_limit = min(depth_limit, view.depth_limit)
            run_owner = view.grantors[-1]
            parent_expires = self.state.grants[delegate.parent_grant].expires_at_ms
        if depth > depth_limit:
            return rejected(Reason.DELEGATION_DEPTH_EXCEEDED)
        if not rules_are_canonical(delegate.rules, self.config.canonical_version):
            return rejected(Reason.INVALID_SPEC)
        ttl_max = self._setting("grant_ttl_ms_max")
        if not self._now_ms < delegate.expires_at_ms <= self._now_ms + ttl_max:
            return rejected(Reason.DELEGATION_EXPIRY_INVALID)
        if (
            delegate.tools is not None
            and scope is not None
            and not set(delegate.tools) <= set(scope)
        ):
            return rejected(Reason.DELEGATION_WIDENING)  # scope never widens (§4.4)
        grants = self.state.grants
        mine = self.state.count("grants", record.agent_id)
        if len(grants) >= self.config.grants_max or mine >= self._setting("grants_per_agent_max"):
            return rejected(Reason.CAPACITY_EXCEEDED)
        assert parsed.tx_id not in grants, "grant id reused"
        grants[parsed.tx_id] = Grant(
            grant_id=parsed.tx_id,
            grantor=record.agent_id,
            child=child,
            run_owner=run_owner,
            run_id=delegate.run_id,
            scope=intersect(scope, delegate.tools),
            grantor_mandate_version=record.mandate_version,
            depth=depth,
            parent_grant=delegate.parent_grant,
            # a grant never outlives the grant it hangs from
            expires_at_ms=min(delegate.expires_at_ms, parent_expires or delegate.expires_at_ms),
            created_height=self._height,
            # applied on top of every rule above it at each use: it can only narrow
            rules=delegate.rules,
        )
        return _applied(
            parsed, principal=record.agent_id, subject=child, version=record.mandate_version
        )

    def _revoke(self, parsed: ParsedTx, revoke: Revoke, record: AgentRecord | None) -> Verdict:
        principal = _principal(record)
        grant = self.state.grants.get(revoke.grant)
        if grant is None:
            return _rejected(parsed, Reason.UNKNOWN_GRANT, principal=principal)
        if record is not None and record.agent_id not in self._grantors_above(grant):
            return _rejected(parsed, Reason.NOT_GRANTOR, principal=principal)
        self.state.grants[grant.grant_id] = replace(grant, revoked=True)
        return _applied(parsed, principal=principal, subject=grant.child)

    def _grantors_above(self, grant: Grant) -> set[str]:
        """The grantor and every delegator above it: any of them may revoke the grant."""
        out = {grant.grantor}
        parent = grant.parent_grant
        while parent is not None and parent in self.state.grants:
            above = self.state.grants[parent]
            out.add(above.grantor)
            parent = above.parent_grant
        return out

    # ------------------------------------------------------------------ envelopes

    def _seal(self, parsed: ParsedTx, seal: SealEnvelope, record: AgentRecord | None) -> Verdict:
        """§4.6: register a handle. Agents seal for themselves (kind unverified); only the
        owner seals for a principal, and only those envelopes count as verified."""
        principal = _principal(record)
        if record is not None:
            if seal.owner_principal is not None:
                return _rejected(parsed, Reason.OWNER_ONLY_FIELD, principal=principal)
            owner, verified = record.agent_id, False
        else:
            if seal.owner_principal is None:
                return _rejected(parsed, Reason.INVALID_SPEC, principal=principal)
            if seal.owner_principal not in self.state.agents:
                return _rejected(parsed, Reason.UNKNOWN_AGENT, principal=principal)
            owner, verified = seal.owner_principal, True
        if any(value.sink not in self.state.sinks for value in seal.sealed):
            return _rejected(parsed, Reason.UNKNOWN_SINK, principal=principal)
        handle = handle_for(parsed.tx_id, seal.kind)
        if handle in self.state.handles:
            return _rejected(parsed, Reason.HANDLE_EXISTS, principal=principal)
        owned = self.state.handles_by_owner.get(owner, 0)
        if (
            len(self.state.handles) >= self.config.handles_max
            or owned >= self.config.handles_per_principal_max
        ):
            return _rejected(parsed, Reason.CAPACITY_EXCEEDED, principal=principal)
        self.state.handles[handle] = Handle(
            handle=handle,
            kind=seal.kind,
            owner=owner,
            verified=verified,
            sealed=tuple(sorted(seal.sealed, key=lambda value: value.sink)),
            created_height=self._height,
        )
        self.state.handles_by_owner[owner] = owned + 1
        return _applied(parsed, principal=owner, subject=handle)

    # ------------------------------------------------------------------ administration

    def _admin(self, parsed: ParsedTx, op: AdminOp) -> Verdict:
        state, config = self.state, self.config

        def done(subject: str, reason: Reason | None = None, version: int = 0) -> Verdict:
            if reason is not None:
                return _rejected(parsed, reason, principal=OWNER_PRINCIPAL, subject=subject)
            return _applied(parsed, principal=OWNER_PRINCIPAL, subject=subject, version=version)

        if isinstance(op, RegisterTool):
            spec = op.spec
            if spec.sink is not None and spec.sink not in state.sinks:
                return done(spec.name, Reason.UNKNOWN_SINK)
            if spec.envelope_args and spec.sink is None:
                return done(spec.name, Reason.INVALID_SPEC)  # envelopes need a sink to open
            if spec.binds_caller and (
                spec.envelope_args or spec.target_schemes or spec.target_roles
            ):
                return done(spec.name, Reason.INVALID_SPEC)  # status tools take nothing
            newer = spec.target_roles or spec.target_optional or spec.definition_digest
            if newer and config.canonical_version < 3:
                return done(spec.name, Reason.INVALID_SPEC)  # this chain has no roles, no pins
            if spec.name not in state.tools and len(state.tools) >= config.tools_max:
                return done(spec.name, Reason.CAPACITY_EXCEEDED)
            refusal = self._registration_check(spec)
            if refusal is not None:
                return done(spec.name, refusal)
            state.tools[spec.name] = spec
            if config.split_authority and spec.mode is ToolMode.DIRECT and spec.takes_sensitive:
                # the override is applied, and the ledger says so (issue 15, item 6)
                return replace(done(spec.name), reason=Reason.DIRECT_OVERRIDE)
            return done(spec.name)
        if isinstance(op, RegisterPrincipal):
            return done(op.principal_id, self._register_principal(op))
        if isinstance(op, RegisterAgent):
            existing = state.agent_by_key.get(op.public_key)
            if op.public_key == config.owner_public_key or existing not in (None, op.agent_id):
                return done(op.agent_id, Reason.KEY_IN_USE)
            if op.public_key in state.principal_by_key:
                return done(op.agent_id, Reason.KEY_IN_USE)  # a principal is never an agent
            if op.principal and not config.split_authority:
                return done(op.agent_id, Reason.INVALID_SPEC)  # no principals on this chain
            if op.principal and op.principal not in state.principals:
                return done(op.agent_id, Reason.UNKNOWN_PRINCIPAL)
            current = state.agents.get(op.agent_id)
            if current is not None:
                # no key rotation: a retired key's nonce memory would have to be kept
                # forever to refuse replays; a new key is a new agent id.
                if current.public_key != op.public_key:
                    return done(op.agent_id, Reason.KEY_IN_USE)
                self._set_agent_principal(op.agent_id, op.principal)
                return done(op.agent_id)
            if len(state.agents) >= config.agents_max:
                return done(op.agent_id, Reason.CAPACITY_EXCEEDED)
            state.agents[op.agent_id] = AgentRecord(agent_id=op.agent_id, public_key=op.public_key)
            state.agent_changed(op.agent_id)
            state.agent_by_key[op.public_key] = op.agent_id
            self._set_agent_principal(op.agent_id, op.principal)
            return done(op.agent_id)
        if isinstance(op, RegisterSink):
            if op.sink_id not in state.sinks and len(state.sinks) >= config.sinks_max:
                return done(op.sink_id, Reason.CAPACITY_EXCEEDED)
            state.sinks[op.sink_id] = op.public_key
            return done(op.sink_id)
        if isinstance(op, SetEntries):
            return done(op.principal, self._set_entries(op))
        if isinstance(op, SetSettings):
            return done("settings", self._set_settings(op))
        record = state.agents.get(op.agent_id)
        if record is None:
            return done(op.agent_id, Reason.UNKNOWN_AGENT)
        state.agent_changed(op.agent_id)  # every op below writes this record
        if isinstance(op, SetMandate):
            if not rules_are_canonical(op.mandate.rules, config.canonical_version):
                return done(op.agent_id, Reason.INVALID_SPEC)  # rules compare canonical forms
            record.mandate = op.mandate
            record.mandate_version += 1
            record.suspended = op.mandate.suspended
            # §4.3: a new version clears that agent's latch buckets, its halt included
            self._latch_clear_agent(record.agent_id)
            return done(op.agent_id, version=record.mandate_version)
        if isinstance(op, Suspend):
            record.suspended = True  # temporary: no new version, nothing latched or cleared
            return done(op.agent_id, version=record.mandate_version)
        assert isinstance(op, Resume), type(op)
        record.suspended = False
        return done(op.agent_id, version=record.mandate_version)

    def _registration_check(self, spec: ToolSpec) -> Reason | None:
        """Issue 15, item 6 (BRAH's static gates), on authority version 2: a confirm-gated
        tool states the tier that may confirm-run it; a `direct` tool that takes a
        recipient, an amount or a credential needs an explicit override. Declarations are
        refused on chains of version 1 (whose engines would ignore them)."""
        if not self.config.split_authority:
            declared = spec.arguments or spec.direct_override
            return Reason.INVALID_SPEC if declared else None
        if spec.mode.needs_confirmation and not spec.min_tier_declared:
            return Reason.TIER_UNDECLARED
        if spec.mode is ToolMode.DIRECT and spec.takes_sensitive and not spec.direct_override:
            return Reason.DIRECT_NEEDS_OVERRIDE
        if spec.binds_caller and spec.arguments:
            return Reason.INVALID_SPEC  # a status tool takes nothing
        return None

    def _register_principal(self, op: RegisterPrincipal) -> Reason | None:
        """Issue 16: a principal's key is of its own class (never the owner's, an agent's
        or another principal's), and is not rotated (a new key is a new principal id)."""
        state = self.state
        if not self.config.split_authority:
            return Reason.INVALID_SPEC  # a chain of authority version 1 has no principals
        key = op.public_key
        if key == self.config.owner_public_key or key in state.agent_by_key:
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

    def _set_agent_principal(self, agent_id: str, principal: str) -> None:
        if principal:
            self.state.agent_principal[agent_id] = principal
        else:
            self.state.agent_principal.pop(agent_id, None)

    def _confirmer_of(self, run_owner: str, mode: ToolMode) -> str:
        """Authority version 2: who alone answers a card. `owner_confirm`: the owner;
        `user_confirm`: the principal of the run's owner (the agent at the root of the
        delegation chain: the person the whole run acts for), or the owner for an agent
        registered without one."""
        if mode is ToolMode.OWNER_CONFIRM:
            return OWNER_PRINCIPAL
        principal = self.state.agent_principal.get(run_owner)
        return OWNER_PRINCIPAL if principal is None else PRINCIPAL_PREFIX + principal

    def _set_entries(self, op: SetEntries) -> Reason | None:
        """Replace (or, with no entries, delete) a principal's named set (§4.2)."""
        sets = self.state.sets
        if op.principal not in self.state.agents:
            return Reason.UNKNOWN_AGENT
        version = self.config.canonical_version
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

    # ------------------------------------------------------------------ settings

    def _setting(self, name: str) -> int:
        """A setting's value: the log's (issue 15, item 5), else cluster.json's."""
        value = self.state.settings.get(name)
        return int(getattr(self.config, name)) if value is None else value

    def _set_settings(self, op: SetSettings) -> Reason | None:
        """Owner-signed settings (chains of canonical version 3): every value within its
        range, capacities never above cluster.json's (which sizes memory); then the state
        names the configuration in effect (`effective_fingerprint`)."""
        if self.config.canonical_version < 3:
            return Reason.INVALID_SPEC  # this chain's engines know no settings in the log
        named = [name for name, _ in op.values] + list(op.clear)
        if CERTIFICATE_TTL_SETTING in named and not self.config.receipts_expire:
            return Reason.INVALID_SPEC  # this chain's certificates carry no window
        for name, value in op.values:
            low, high = self._setting_range(name)
            if not low <= value <= high:
                return Reason.INVALID_SPEC
        settings = self.state.settings
        for name, value in op.values:
            settings[name] = value
        for name in op.clear:
            settings.pop(name, None)
        if not any(name.startswith("quota_") for name in settings):
            self.state.quota_counters.clear()
        self.state.config_fingerprint = effective_fingerprint(self.config, settings)
        return None

    def _setting_range(self, name: str) -> tuple[int, int]:
        config = self.config
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

    # ------------------------------------------------------------------ quotas

    def _quota_admits(self, record: AgentRecord, tool: str | None, run_key: RunKey) -> bool:
        """§4.7 / BRAH §5.4, and the quotas in the log (issue 15, item 5): each quota
        setting that is not 0 counts the proposals of its agent, (agent, tool) pair or run
        in the current fixed minute or hour of block time; any at its limit refuses. Until
        `quota_agent_per_minute` is set in the log, cluster.json's `quota_proposals_max`
        per sliding `quota_window_ms` applies per agent. A refused proposal counts nowhere."""
        counted = self._quota_counters(record.agent_id, tool, run_key)
        if any(counter.count >= limit for counter, limit in counted):
            return False
        if "quota_agent_per_minute" not in self.state.settings and not self._sliding_quota(record):
            return False
        for counter, _ in counted:
            counter.count += 1
        return True

    def _quota_counters(
        self, agent: str, tool: str | None, run_key: RunKey
    ) -> list[tuple[QuotaCounter, int]]:
        """The counters of every quota set in the log (not 0) that this call falls under,
        each with its limit; a counter of a past window starts again at 0."""
        settings = self.state.settings
        if not settings:
            return []
        subjects: dict[str, tuple[str, ...]] = {
            "agent": (agent,),
            "tool": (agent, tool or UNCHECKED_TARGET),
            "run": run_key,
        }
        out = []
        for scope, subject in subjects.items():
            for period, length in QUOTA_PERIODS:
                limit = settings.get(f"quota_{scope}_per_{period}", 0)
                if limit == 0:
                    continue
                window = self._now_ms // length
                key = (scope, period, *subject)
                counter = self.state.quota_counters.get(key)
                if counter is None or counter.window != window:
                    counter = self._new_quota_counter(key, window)
                out.append((counter, limit))
        return out

    def _new_quota_counter(self, key: QuotaKey, window: int) -> QuotaCounter:
        """A counter for `key` from 0. The table is bounded (QUOTA_COUNTERS_MAX): when full,
        counters of past windows go first, then the (agent, tool) and run counters with
        the fewest calls (an agent's own counters, at most two per registered agent, are
        kept: they bound everything an agent does)."""
        counters = self.state.quota_counters
        if key not in counters and len(counters) >= limits.QUOTA_COUNTERS_MAX:
            for stale in [k for k, c in counters.items() if c.window != self._window_of(k)]:
                del counters[stale]
            if len(counters) >= limits.QUOTA_COUNTERS_MAX:
                victims = [k for k in counters if k[0] != "agent"]
                if victims:
                    del counters[min(victims, key=lambda k: (counters[k].count, k))]
        counter = QuotaCounter(window=window, count=0)
        counters[key] = counter
        return counter

    def _window_of(self, key: QuotaKey) -> int:
        return self._now_ms // dict(QUOTA_PERIODS)[key[1]]

    def _sliding_quota(self, record: AgentRecord) -> bool:
        """cluster.json's per-agent quota: `quota_proposals_max` in any sliding
        `quota_window_ms` of block time (until the log sets `quota_agent_per_minute`)."""
        since = self._now_ms - self.config.quota_window_ms
        recent = [t for t in record.recent_proposals_ms if t > since]
        if len(recent) >= self.config.quota_proposals_max:
            record.recent_proposals_ms = recent
            return False
        recent.append(self._now_ms)
        record.recent_proposals_ms = recent
        return True

    # ------------------------------------------------------------------ latch (§4.3)

    def _latch_touch(self, run_key: RunKey) -> LatchRun | None:
        run = self.state.latch_runs.get(run_key)
        if run is not None:
            self.state.latch_activity_seq += 1
            run.last_active = self.state.latch_activity_seq
        return run

    def _latch_run(self, run_key: RunKey) -> LatchRun:
        runs = self.state.latch_runs
        run = runs.get(run_key)
        if run is not None:
            return run
        if len(runs) >= self.config.latch_runs_max:
            # least recently active first; sequence numbers are unique, so no ties
            oldest = min(runs, key=lambda key: runs[key].last_active)
            del runs[oldest]
        self.state.latch_activity_seq += 1
        run = LatchRun(last_active=self.state.latch_activity_seq)
        runs[run_key] = run
        return run

    def _latch_first_denial(
        self, run_key: RunKey, agent: str, tool: str, chain: tuple[str, ...]
    ) -> bool:
        """Remember a scope denial. Returns True when it halts the run."""
        run = self._latch_run(run_key)
        members = tuple(sorted(set(chain)))
        if len(run.buckets) >= self.config.latch_buckets_per_run_max:
            run.halt_chain = members  # a run probing this many refused tools is halted
            return True
        bucket = LatchBucket(count=1, chain=members)
        run.buckets[(agent, tool)] = bucket
        if self.config.split_authority and tool in self.state.tools:
            self._cross_run_count(agent, tool, members)
        if bucket.count >= self._setting("latch_halt_threshold"):
            run.halt_chain = members
            return True
        return False

    def _latched_across_runs(self, agent: str, tool: str) -> bool:
        pair = self.state.cross_run.get((agent, tool))
        return pair is not None and pair.count >= self._setting("latch_cross_run_threshold")

    def _cross_run_count(self, agent: str, tool: str, members: tuple[str, ...]) -> None:
        """Issue 16: one more run in which (agent, tool) was refused. The table is bounded
        (CROSS_RUN_PAIRS_MAX): when full, the pair refused in the fewest runs goes first
        (then the smallest key), so a flood of one-off refusals cannot evict the pairs
        that are about to latch. Invented tools never reach it (only registered ones)."""
        table = self.state.cross_run
        pair = table.get((agent, tool))
        if pair is not None:
            pair.count += 1
            pair.chain = tuple(sorted(set(pair.chain) | set(members)))
            return
        if len(table) >= limits.CROSS_RUN_PAIRS_MAX:
            del table[min(table, key=lambda key: (table[key].count, key))]
        table[(agent, tool)] = LatchBucket(count=1, chain=members)

    def _latch_repeat(self, run_key: RunKey, bucket: LatchBucket, chain: tuple[str, ...]) -> bool:
        """A later attempt at a latched tool. Returns True when it halts the run."""
        bucket.count += 1
        bucket.chain = tuple(sorted(set(bucket.chain) | set(chain)))
        if bucket.count >= self._setting("latch_halt_threshold"):
            self.state.latch_runs[run_key].halt_chain = bucket.chain
            return True
        return False

    def _latch_clear_agent(self, agent: str) -> None:
        """Drop every bucket whose scope this agent's mandate shaped, and its halts."""
        runs = self.state.latch_runs
        for run_key in sorted(runs):
            run = runs[run_key]
            for bucket_key in sorted(run.buckets):
                if agent in run.buckets[bucket_key].chain:
                    del run.buckets[bucket_key]
            if run.halt_chain is not None and agent in run.halt_chain:
                run.halt_chain = None
            if not run.buckets and run.halt_chain is None:
                del runs[run_key]
        cross_run = self.state.cross_run
        for pair in sorted(cross_run):
            if agent in cross_run[pair].chain:
                del cross_run[pair]

    # ------------------------------------------------------------------ housekeeping

    def _prune_expired(self) -> None:
        """Expired pending calls and grants are kept `expired_retention_ms`, then dropped:
        this is what bounds both tables over time (the per-principal caps bound them at
        any one moment)."""
        horizon = self._now_ms - self.config.expired_retention_ms
        # issue 16: an expired card leaves at once; a late answer gets `unknown_proposal`
        card_horizon = self._now_ms if self.config.split_authority else horizon
        # Found by the state's expiry heaps, dropped in key order (issue 19: sorting, then
        # scanning, both tables in every block grew with them).
        for proposal_id in self.state.expired("pending", card_horizon):
            self._drop_pending(proposal_id)
        grants = self.state.grants
        for grant_id in self.state.expired("grants", horizon):
            del grants[grant_id]


def _principal_op(payload: object) -> bool:
    """What a principal may sign besides answers: its agents' sets, its deputies."""
    return isinstance(payload, Admin) and isinstance(payload.op, SetEntries | RegisterPrincipal)


def _principal(record: AgentRecord | None) -> str:
    return OWNER_PRINCIPAL if record is None else record.agent_id


def _rejected(
    parsed: ParsedTx,
    reason: Reason,
    *,
    principal: str = "",
    subject: str = "",
    version: int = 0,
) -> Verdict:
    return Verdict(
        tx_id=parsed.tx_id,
        kind=parsed.kind,
        outcome=Outcome.REJECTED,
        reason=reason,
        mandate_version=version,
        principal=principal,
        subject=subject,
    )


def _applied(parsed: ParsedTx, *, principal: str, subject: str = "", version: int = 0) -> Verdict:
    return Verdict(
        tx_id=parsed.tx_id,
        kind=parsed.kind,
        outcome=Outcome.APPLIED,
        reason=Reason.OK,
        mandate_version=version,
        principal=principal,
        subject=subject,
    )
