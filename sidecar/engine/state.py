"""The engine's whole replicated state, its bounds, and its canonical serialization.

Everything that decides a later verdict lives here and nowhere else, so that
`state_bytes()` is the state: two engines with equal bytes decide every future block the
same way (DESIGN §4, "a pure function of the committed log"), and a sidecar rebuilt from
the bytes continues exactly where it stopped. Maps are plain dicts for speed, but no
decision ever depends on their iteration order: serialization sorts every map by key, and
eviction picks by explicit sequence numbers (STYLE.md rule 7).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from quorumgate.proto.canonical import Encoder, sha256
from quorumgate.proto.model import (
    ArgCheck,
    ArgRole,
    ArgSpec,
    ArgumentRule,
    DelegationPolicy,
    Enforcement,
    EnvelopeArg,
    Mandate,
    RuleKind,
    SealedValue,
    TargetRule,
    TargetSlot,
    Tier,
    ToolMode,
    ToolRules,
    ToolSpec,
)
from quorumgate.proto.nonces import NonceWindow
from quorumgate.sidecar.engine.statements import TAG_CARD, ConfirmationCard

TAG_STATE = b"qg/engine-state/v1"

RunKey = tuple[str, str]  # (run owner: the root agent of the delegation chain, run id)
BucketKey = tuple[str, str]  # (agent, canonical tool)


@dataclass
class AgentRecord:
    agent_id: str
    public_key: bytes
    mandate: Mandate | None = None
    mandate_version: int = 0  # 0: no mandate set yet (every call is denied)
    suspended: bool = False
    nonces: NonceWindow = field(default_factory=NonceWindow)
    recent_proposals_ms: list[int] = field(default_factory=list)  # quota window, ascending


@dataclass
class PrincipalRecord:
    """A principal (DESIGN §4.5, issue 16): the human agents act for. It signs only the
    answers to cards (Confirm, with or without `reject`) and the named sets of the agents
    acting for it (SetEntries), with nonces of its own."""

    principal_id: str
    public_key: bytes
    nonces: NonceWindow = field(default_factory=NonceWindow)
    deputies: tuple[str, ...] = ()  # principals who may answer its cards too


@dataclass(frozen=True)
class Grant:
    """A Delegate that was applied (DESIGN §4.4). `scope` is pinned at delegation time.
    Frozen: a change is a new object (`replace`), which is how the state's encoding cache
    knows an entry changed (`_encode_state`)."""

    grant_id: bytes
    grantor: str
    child: str
    run_owner: str
    run_id: str
    scope: tuple[str, ...] | None
    grantor_mandate_version: int
    depth: int
    parent_grant: bytes | None
    expires_at_ms: int
    created_height: int
    revoked: bool = False
    rules: tuple[ToolRules, ...] = ()  # the Delegate's own rules (DESIGN §4.2, §4.4)


@dataclass
class Handle:
    """A capability envelope (DESIGN §4.6): only ciphertexts sealed to sinks are kept."""

    handle: str
    kind: str
    owner: str
    verified: bool
    sealed: tuple[SealedValue, ...]  # sorted by sink
    created_height: int

    @property
    def sinks(self) -> tuple[str, ...]:
        return tuple(value.sink for value in self.sealed)


@dataclass(frozen=True)
class PendingCall:
    """A confirmation-gated call waiting for its Confirm (DESIGN §4.5). Frozen, as `Grant`."""

    proposal_id: bytes
    principal: str
    run_owner: str
    run_id: str
    tier: Tier
    grant: bytes | None
    tool: str
    canonical_target: str
    handles: tuple[tuple[str, str], ...]
    flagged: bool
    card: ConfirmationCard
    expires_at_ms: int

    @property
    def argument_names(self) -> tuple[str, ...]:
        return self.card.argument_names


@dataclass
class LatchBucket:
    count: int
    chain: tuple[str, ...]  # agents whose mandates shaped the refused scope


@dataclass
class LatchRun:
    last_active: int  # activity sequence number: least recently active is evicted first
    buckets: dict[BucketKey, LatchBucket] = field(default_factory=dict)
    halt_chain: tuple[str, ...] | None = None  # set when the run is halted


@dataclass(frozen=True)
class StateParts:
    """The canonical state bytes cut around the agents section, for a store that rewrites
    only the agents a height changed (sidecar/store.py):

        state bytes == assemble(prefix, agents, suffix)
                    == prefix + u32(len(agents)) + b"".join(agents) + suffix

    `agents` are the encoded agent records in agent-id order (code-point order, which is
    the byte order of their UTF-8); `changed` are the (agent id, encoding) pairs of every
    agent encoded afresh since the previous `EngineState.take_parts` (every agent the first
    time), in agent-id order."""

    prefix: bytes
    agents: tuple[bytes, ...]
    suffix: bytes
    changed: tuple[tuple[str, bytes], ...]

    def to_bytes(self) -> bytes:
        return assemble(self.prefix, self.agents, self.suffix)


# A quota counter's key: (scope, period, subject...) — ("agent", "minute", agent),
# ("tool", "hour", agent, tool), ("run", "minute", run owner, run id).
QuotaKey = tuple[str, ...]


@dataclass
class QuotaCounter:
    window: int  # block time // the period's length: the window counted
    count: int


def assemble(prefix: bytes, agents: Sequence[bytes], suffix: bytes) -> bytes:
    """The state bytes from their parts (see `StateParts`)."""
    return b"".join((prefix, struct.pack(">I", len(agents)), *agents, suffix))


@dataclass
class EngineState:
    config_fingerprint: bytes
    last_height: int | None = None
    last_block_time_ms: int = 0
    owner_nonces: NonceWindow = field(default_factory=NonceWindow)
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    sinks: dict[str, bytes] = field(default_factory=dict)
    agents: dict[str, AgentRecord] = field(default_factory=dict)
    grants: dict[bytes, Grant] = field(default_factory=dict)
    pending: dict[bytes, PendingCall] = field(default_factory=dict)
    handles: dict[str, Handle] = field(default_factory=dict)
    latch_runs: dict[RunKey, LatchRun] = field(default_factory=dict)
    latch_activity_seq: int = 0
    # Named sets of target rules, by (agent, set name) (DESIGN §4.2, `SetEntries`).
    sets: dict[tuple[str, str], tuple[TargetRule, ...]] = field(default_factory=dict)
    # Split authority (issue 16): the principals, the principal each agent acts for (an
    # agent absent here acts for the owner), and each pending call's wrong card digests.
    principals: dict[str, PrincipalRecord] = field(default_factory=dict)
    agent_principal: dict[str, str] = field(default_factory=dict)
    wrong_digests: dict[bytes, int] = field(default_factory=dict)
    # The cross-run latch (issue 16): per (agent, canonical tool), the runs in which the
    # pair was refused (`count`) and the agents whose mandates shaped those refusals.
    cross_run: dict[BucketKey, LatchBucket] = field(default_factory=dict)
    # Settings in the log (issue 15, item 5): name -> value, over cluster.json's; and the
    # quota counters of the fixed minute and hour windows, by QuotaKey.
    settings: dict[str, int] = field(default_factory=dict)
    quota_counters: dict[QuotaKey, QuotaCounter] = field(default_factory=dict)
    # derived indexes, rebuilt on load; not serialized
    agent_by_key: dict[bytes, str] = field(default_factory=dict)
    principal_by_key: dict[bytes, str] = field(default_factory=dict)
    handles_by_owner: dict[str, int] = field(default_factory=dict)
    # Each agent's encoded record, kept between serializations: a block changes a few
    # agents, and re-encoding every one of them per block was the sidecar's largest cost.
    # Whoever changes an `AgentRecord` calls `agent_changed` (the engine does it for a
    # transaction's signer and an admin op's subject); tests check the cache against a
    # fresh encoding after every block. Not serialized, not compared.
    agent_bytes: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)
    # The agents encoded afresh since the last `take_parts`: what a store has not yet got.
    agents_unsaved: set[str] = field(default_factory=set, repr=False, compare=False)
    # Each grant's and pending call's encoded bytes, with the (frozen) object they encode:
    # an entry is re-encoded only when the map holds another object for its id (issue 19,
    # item 3: re-encoding 10,000 grants and 5,000 cards was most of a block's cost). Not
    # serialized, not compared.
    grant_bytes: dict[bytes, tuple[Grant, bytes]] = field(
        default_factory=dict, repr=False, compare=False
    )
    pending_bytes: dict[bytes, tuple[PendingCall, bytes]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def agent_changed(self, agent_id: str) -> None:
        self.agent_bytes.pop(agent_id, None)

    def sets_of(self, agent_id: str) -> dict[str, tuple[TargetRule, ...]]:
        return {name: rules for (owner, name), rules in self.sets.items() if owner == agent_id}

    def fresh_bytes(self) -> bytes:
        """The canonical bytes encoded from scratch, with no cache: what `to_bytes` must
        equal (a test oracle, and the check `Engine.verify_state_cache` runs)."""
        return _encode_state(self, None, None, cached=False).to_bytes()

    def take_parts(self) -> StateParts:
        """The canonical bytes in parts, with `changed` the agents encoded afresh since the
        previous call (all of them the first time), which it then forgets: the caller
        records every result it takes (the engine takes one per height)."""
        parts = _encode_state(self, self.agent_bytes, self.agents_unsaved)
        changed = tuple((a, self.agent_bytes[a]) for a in sorted(self.agents_unsaved))
        self.agents_unsaved.clear()
        return StateParts(parts.prefix, parts.agents, parts.suffix, changed)

    def to_bytes(self) -> bytes:
        return _encode_state(self, self.agent_bytes, self.agents_unsaved).to_bytes()

    def root(self) -> bytes:
        """The state root: SHA-256 of the canonical state bytes (which carry their own tag)."""
        return sha256(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> EngineState:
        reader = _Reader(data)
        state = _decode_state(reader)
        reader.finish()
        return state


# ------------------------------------------------------------------------ encoding


def _enc_optional_text(enc: Encoder, text: str | None) -> None:
    enc.optional_blob(None if text is None else text.encode("utf-8"))


def _enc_nonces(enc: Encoder, window: NonceWindow) -> None:
    enc.u64(window.low_water).u64s(sorted(window.executed))


# A tool list that carries rules after it is flagged 2 (null) or 3 (a list), where one
# without rules is flagged 0 or 1 as before: a state without any rule encodes exactly as
# it did before rules existed, so its root does not change.
RULES_FOLLOW = 2
# Likewise a tool's status-tool flag is 2 or 3 when issue 15's declarations follow it,
# and has 4 added when its further target roles follow those.
TOOL_DECLARATIONS_FOLLOW = 2
TOOL_TARGET_ROLES_FOLLOW = 4
TOOL_DEFINITION_FOLLOWS = 8  # a pinned definition digest (issue 18) follows the roles
# A tool's rule count has this bit set when every rule is followed by its target role.
RULE_ROLES_FOLLOW = 1 << 31


def _enc_tools_and_rules(
    enc: Encoder, tools: tuple[str, ...] | None, rules: tuple[ToolRules, ...]
) -> None:
    flag = (0 if tools is None else 1) + (RULES_FOLLOW if rules else 0)
    enc.u8(flag)
    if tools is not None:
        enc.texts(tools)


def _enc_target_rule(enc: Encoder, rule: TargetRule) -> None:
    enc.text(rule.kind.value).text(rule.value).text("" if rule.mode is None else rule.mode.value)


def _enc_rules(enc: Encoder, rules: tuple[ToolRules, ...]) -> None:
    enc.u32(len(rules))
    for entry in rules:
        roles = any(rule.role for rule in entry.targets)
        enc.text(entry.tool).u32(len(entry.targets) | (RULE_ROLES_FOLLOW if roles else 0))
        for rule in entry.targets:
            _enc_target_rule(enc, rule)
            if roles:
                enc.text(rule.role)
        enc.u32(len(entry.arguments))
        for arg in entry.arguments:
            enc.text(arg.name).text(arg.check.value).text(arg.number).texts(arg.values)
            enc.u32(arg.count)


def _enc_mandate(enc: Encoder, mandate: Mandate) -> None:
    _enc_tools_and_rules(enc, mandate.allowed_tools, mandate.rules)
    enc.text(mandate.enforcement.value).boolean(mandate.suspended)
    enc.text(mandate.delegation_policy.value)
    depth = mandate.max_delegation_depth
    enc.optional_blob(None if depth is None else struct.pack(">I", depth))
    if mandate.rules:
        _enc_rules(enc, mandate.rules)


def _enc_tool(enc: Encoder, spec: ToolSpec) -> None:
    enc.text(spec.name).text(spec.mode.value).optional_blob(
        None if spec.sink is None else spec.sink.encode()
    )
    enc.texts(spec.target_schemes).u32(len(spec.envelope_args))
    for arg in spec.envelope_args:
        enc.text(arg.name).text(arg.kind).boolean(arg.require_verified)
    enc.text(spec.min_tier.value)
    pinned = spec.definition_digest is not None
    roles = bool(spec.target_roles) or spec.target_optional or pinned
    declared = bool(spec.arguments) or spec.direct_override or not spec.min_tier_declared or roles
    # issue 15's declarations follow the flag only when present (older states keep bytes)
    enc.u8(
        int(spec.binds_caller)
        + (TOOL_DECLARATIONS_FOLLOW if declared else 0)
        + (TOOL_TARGET_ROLES_FOLLOW if roles else 0)
        + (TOOL_DEFINITION_FOLLOWS if pinned else 0)
    )
    if declared:
        enc.u32(len(spec.arguments))
        for declared_arg in spec.arguments:
            enc.text(declared_arg.name).text(declared_arg.role.value)
        enc.boolean(spec.direct_override).boolean(spec.min_tier_declared)
    if roles:
        enc.u32(len(spec.target_roles))
        for slot in spec.target_roles:
            enc.text(slot.role).texts(slot.schemes).u32(slot.max)
        enc.boolean(spec.target_optional)
    if pinned:
        enc.blob(spec.definition_digest or b"")


def _enc_card(enc: Encoder, card: ConfirmationCard) -> None:
    enc.blob(card.to_bytes())


def _encode_agent(rec: AgentRecord) -> bytes:
    enc = Encoder()
    enc.text(rec.agent_id).raw(rec.public_key).u64(rec.mandate_version)
    enc.boolean(rec.suspended).boolean(rec.mandate is not None)
    if rec.mandate is not None:
        _enc_mandate(enc, rec.mandate)
    _enc_nonces(enc, rec.nonces)
    enc.u64s(rec.recent_proposals_ms)
    return bytes(enc)


def _encode_grant(g: Grant) -> bytes:
    enc = Encoder()
    enc.raw(g.grant_id).text(g.grantor).text(g.child).text(g.run_owner).text(g.run_id)
    _enc_tools_and_rules(enc, g.scope, g.rules)
    enc.u64(g.grantor_mandate_version).u32(g.depth).optional_blob(g.parent_grant)
    enc.u64(g.expires_at_ms).u64(g.created_height).boolean(g.revoked)
    if g.rules:
        _enc_rules(enc, g.rules)
    return bytes(enc)


def _encode_pending(p: PendingCall) -> bytes:
    enc = Encoder()
    enc.raw(p.proposal_id).text(p.principal).text(p.run_owner).text(p.run_id)
    enc.text(p.tier.value).optional_blob(p.grant).text(p.tool).text(p.canonical_target)
    enc.u32(len(p.handles))
    for name, handle in p.handles:
        enc.text(name).text(handle)
    enc.boolean(p.flagged).u64(p.expires_at_ms)
    _enc_card(enc, p.card)
    return bytes(enc)


E = TypeVar("E")


def _encoded_entries(
    entries: dict[bytes, E],
    cache: dict[bytes, tuple[E, bytes]],
    encode: Callable[[E], bytes],
    cached: bool,
) -> list[bytes]:
    """Each entry's bytes in key order, from `cache` where it holds the very same object;
    the cache keeps exactly the present entries."""
    if not cached:
        return [encode(entries[key]) for key in sorted(entries)]
    out = []
    for key in sorted(entries):
        entry = entries[key]
        hit = cache.get(key)
        if hit is None or hit[0] is not entry:
            hit = (entry, encode(entry))
            cache[key] = hit
        out.append(hit[1])
    if len(cache) > len(entries):
        for gone in [key for key in cache if key not in entries]:
            del cache[gone]
    return out


def _encode_state(
    state: EngineState,
    agent_cache: dict[str, bytes] | None,
    encoded: set[str] | None,
    *,
    cached: bool = True,
) -> StateParts:
    """The state in parts; agents come from `agent_cache` where it holds them, and the ids
    of those encoded afresh are added to `encoded`; grants and pending calls from the
    state's own caches unless `cached` is False. `changed` is left empty here."""
    enc = Encoder(TAG_STATE).raw(state.config_fingerprint)
    enc.optional_blob(None if state.last_height is None else struct.pack(">Q", state.last_height))
    enc.u64(state.last_block_time_ms)
    _enc_nonces(enc, state.owner_nonces)

    enc.u32(len(state.tools))
    for name in sorted(state.tools):
        _enc_tool(enc, state.tools[name])

    enc.u32(len(state.sinks))
    for sink in sorted(state.sinks):
        enc.text(sink).raw(state.sinks[sink])

    prefix = bytes(enc)
    agents: list[bytes] = []
    for agent_id in sorted(state.agents):
        data = None if agent_cache is None else agent_cache.get(agent_id)
        if data is None:
            data = _encode_agent(state.agents[agent_id])
            if agent_cache is not None:
                agent_cache[agent_id] = data
            if encoded is not None:
                encoded.add(agent_id)
        agents.append(data)

    enc = Encoder()
    enc.u32(len(state.grants))
    for data in _encoded_entries(state.grants, state.grant_bytes, _encode_grant, cached):
        enc.raw(data)

    enc.u32(len(state.pending))
    for data in _encoded_entries(state.pending, state.pending_bytes, _encode_pending, cached):
        enc.raw(data)

    enc.u32(len(state.handles))
    for handle_name in sorted(state.handles):
        h = state.handles[handle_name]
        enc.text(h.handle).text(h.kind).text(h.owner).boolean(h.verified)
        enc.u32(len(h.sealed))
        for value in h.sealed:
            enc.text(value.sink).blob(value.ciphertext)
        enc.u64(h.created_height)

    enc.u64(state.latch_activity_seq).u32(len(state.latch_runs))
    for run_key in sorted(state.latch_runs):
        run = state.latch_runs[run_key]
        enc.text(run_key[0]).text(run_key[1]).u64(run.last_active)
        enc.optional_blob(
            None if run.halt_chain is None else bytes(Encoder().texts(run.halt_chain))
        )
        enc.u32(len(run.buckets))
        for bucket_key in sorted(run.buckets):
            bucket = run.buckets[bucket_key]
            enc.text(bucket_key[0]).text(bucket_key[1]).u32(bucket.count).texts(bucket.chain)
    settings = bool(state.settings or state.quota_counters)
    authority = settings or bool(
        state.principals or state.agent_principal or state.wrong_digests or state.cross_run
    )
    if state.sets or authority:
        # Present only once a set exists (so older states keep their bytes): the reader
        # finds it by there being bytes left.
        enc.u32(len(state.sets))
        for owner, name in sorted(state.sets):
            enc.text(owner).text(name).u32(len(state.sets[(owner, name)]))
            for rule in state.sets[(owner, name)]:
                _enc_target_rule(enc, rule)
    if authority:
        # Likewise present only once a principal exists (split authority, issue 16).
        enc.u32(len(state.principals))
        for principal_id in sorted(state.principals):
            principal = state.principals[principal_id]
            enc.text(principal.principal_id).raw(principal.public_key)
            _enc_nonces(enc, principal.nonces)
            enc.texts(principal.deputies)
        enc.u32(len(state.agent_principal))
        for agent_id in sorted(state.agent_principal):
            enc.text(agent_id).text(state.agent_principal[agent_id])
        enc.u32(len(state.wrong_digests))
        for proposal_id in sorted(state.wrong_digests):
            enc.raw(proposal_id).u32(state.wrong_digests[proposal_id])
        enc.u32(len(state.cross_run))
        for pair in sorted(state.cross_run):
            bucket = state.cross_run[pair]
            enc.text(pair[0]).text(pair[1]).u32(bucket.count).texts(bucket.chain)
    if settings:
        # Likewise present only once a setting is made in the log (issue 15, item 5).
        enc.u32(len(state.settings))
        for name in sorted(state.settings):
            enc.text(name).u64(state.settings[name])
        enc.u32(len(state.quota_counters))
        for key in sorted(state.quota_counters):
            counter = state.quota_counters[key]
            enc.texts(key).u64(counter.window).u32(counter.count)
    return StateParts(prefix, tuple(agents), bytes(enc), ())


# ------------------------------------------------------------------------ decoding


class StateDecodeError(ValueError):
    pass


class _Reader:
    """Reads what `Encoder` wrote. Only for our own state bytes; any surprise is an error."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def take(self, size: int) -> bytes:
        end = self._pos + size
        if size < 0 or end > len(self._data):
            raise StateDecodeError("state bytes truncated")
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def boolean(self) -> bool:
        value = self.u8()
        if value > 1:
            raise StateDecodeError("bad boolean")
        return value == 1

    def blob(self) -> bytes:
        return self.take(self.u32())

    def text(self) -> str:
        try:
            return self.blob().decode("utf-8")
        except UnicodeDecodeError:
            raise StateDecodeError("bad text") from None

    def texts(self) -> tuple[str, ...]:
        return tuple(self.text() for _ in range(self.u32()))

    def optional_blob(self) -> bytes | None:
        return self.blob() if self.boolean() else None

    def optional_text(self) -> str | None:
        data = self.optional_blob()
        return None if data is None else data.decode("utf-8")

    def remaining(self) -> int:
        return len(self._data) - self._pos

    def finish(self) -> None:
        if self._pos != len(self._data):
            raise StateDecodeError("trailing bytes after state")


def _dec_nonces(r: _Reader) -> NonceWindow:
    low = r.u64()
    return NonceWindow(low_water=low, executed={r.u64() for _ in range(r.u32())})


def _dec_tools_and_rules_flag(r: _Reader) -> tuple[tuple[str, ...] | None, bool]:
    flag = r.u8()
    if flag > 1 + RULES_FOLLOW:
        raise StateDecodeError("bad tool list flag")
    tools = r.texts() if flag & 1 else None
    return tools, flag >= RULES_FOLLOW


def _dec_target_rule(r: _Reader) -> TargetRule:
    kind, value, mode = RuleKind(r.text()), r.text(), r.text()
    return TargetRule(kind, value, ToolMode(mode) if mode else None)


def _dec_rules(r: _Reader) -> tuple[ToolRules, ...]:
    out = []
    for _ in range(r.u32()):
        tool = r.text()
        count = r.u32()
        if count & RULE_ROLES_FOLLOW:
            targets = tuple(
                replace(_dec_target_rule(r), role=r.text())
                for _ in range(count & ~RULE_ROLES_FOLLOW)
            )
        else:
            targets = tuple(_dec_target_rule(r) for _ in range(count))
        arguments = tuple(
            ArgumentRule(r.text(), ArgCheck(r.text()), r.text(), r.texts(), r.u32())
            for _ in range(r.u32())
        )
        out.append(ToolRules(tool, targets, arguments))
    return tuple(out)


def _dec_mandate(r: _Reader) -> Mandate:
    tools, has_rules = _dec_tools_and_rules_flag(r)
    enforcement = Enforcement(r.text())
    suspended = r.boolean()
    policy = DelegationPolicy(r.text())
    depth_bytes = r.optional_blob()
    depth = None if depth_bytes is None else int(struct.unpack(">I", depth_bytes)[0])
    rules = _dec_rules(r) if has_rules else ()
    return Mandate(tools, enforcement, suspended, policy, depth, rules)


def _dec_tool(r: _Reader) -> ToolSpec:
    name = r.text()
    mode = ToolMode(r.text())
    sink = r.optional_text()
    schemes = r.texts()
    args = tuple(EnvelopeArg(r.text(), r.text(), r.boolean()) for _ in range(r.u32()))
    tier, flag = Tier(r.text()), r.u8()
    most = 1 + TOOL_DECLARATIONS_FOLLOW + TOOL_TARGET_ROLES_FOLLOW + TOOL_DEFINITION_FOLLOWS
    if (
        flag > most
        or (flag & TOOL_TARGET_ROLES_FOLLOW and not flag & TOOL_DECLARATIONS_FOLLOW)
        or (flag & TOOL_DEFINITION_FOLLOWS and not flag & TOOL_TARGET_ROLES_FOLLOW)
    ):
        raise StateDecodeError("bad tool flag")
    if not flag & TOOL_DECLARATIONS_FOLLOW:
        return ToolSpec(name, mode, sink, schemes, args, tier, bool(flag & 1))
    declared = tuple(ArgSpec(r.text(), ArgRole(r.text())) for _ in range(r.u32()))
    override, tier_declared = r.boolean(), r.boolean()
    slots: tuple[TargetSlot, ...] = ()
    optional = False
    if flag & TOOL_TARGET_ROLES_FOLLOW:
        slots = tuple(TargetSlot(r.text(), r.texts(), r.u32()) for _ in range(r.u32()))
        optional = r.boolean()
    pinned = r.blob() if flag & TOOL_DEFINITION_FOLLOWS else None
    return ToolSpec(
        name,
        mode,
        sink,
        schemes,
        args,
        tier,
        bool(flag & 1),
        declared,
        override,
        tier_declared,
        slots,
        optional,
        pinned,
    )


def _dec_card(r: _Reader) -> ConfirmationCard:
    c = _Reader(r.blob())
    if c.take(len(TAG_CARD)) != TAG_CARD:
        raise StateDecodeError("bad card tag")
    chain_id, proposal_id, principal = c.text(), c.take(32), c.text()
    tier, delegate_of, tool = Tier(c.text()), c.text(), c.text()
    mode, min_tier, target = ToolMode(c.text()), Tier(c.text()), c.text()
    argument_names = c.texts()
    handles = tuple((c.text(), c.text()) for _ in range(c.u32()))
    body_digest, created_height, expires_at_ms = c.take(32), c.u64(), c.u64()
    confirmer = c.text() if c.remaining() else ""  # authority version 2 cards name one
    c.finish()
    return ConfirmationCard(
        chain_id, proposal_id, principal, tier, delegate_of, tool, mode, min_tier, target,
        argument_names, handles, body_digest, created_height, expires_at_ms, confirmer,
    )  # fmt: skip


def _decode_state(r: _Reader) -> EngineState:
    if r.take(len(TAG_STATE)) != TAG_STATE:
        raise StateDecodeError("not engine state bytes")
    state = EngineState(config_fingerprint=r.take(32))
    height = r.optional_blob()
    state.last_height = None if height is None else int(struct.unpack(">Q", height)[0])
    state.last_block_time_ms = r.u64()
    state.owner_nonces = _dec_nonces(r)

    for _ in range(r.u32()):
        spec = _dec_tool(r)
        state.tools[spec.name] = spec
    for _ in range(r.u32()):
        sink = r.text()
        state.sinks[sink] = r.take(32)
    for _ in range(r.u32()):
        agent_id, key, version = r.text(), r.take(32), r.u64()
        suspended, has_mandate = r.boolean(), r.boolean()
        mandate = _dec_mandate(r) if has_mandate else None
        nonces = _dec_nonces(r)
        recent = [r.u64() for _ in range(r.u32())]
        state.agents[agent_id] = AgentRecord(
            agent_id, key, mandate, version, suspended, nonces, recent
        )
        state.agent_by_key[key] = agent_id
    for _ in range(r.u32()):
        grant_id, grantor, child, run_owner, run_id = (
            r.take(32), r.text(), r.text(), r.text(), r.text(),
        )  # fmt: skip
        scope, has_rules = _dec_tools_and_rules_flag(r)
        version, depth, parent = r.u64(), r.u32(), r.optional_blob()
        expires, created, revoked = r.u64(), r.u64(), r.boolean()
        rules = _dec_rules(r) if has_rules else ()
        state.grants[grant_id] = Grant(
            grant_id, grantor, child, run_owner, run_id, scope, version, depth, parent,
            expires, created, revoked, rules,
        )  # fmt: skip
    for _ in range(r.u32()):
        proposal_id, principal, run_owner, run_id = r.take(32), r.text(), r.text(), r.text()
        tier, grant, tool, target = Tier(r.text()), r.optional_blob(), r.text(), r.text()
        handles = tuple((r.text(), r.text()) for _ in range(r.u32()))
        flagged, expires = r.boolean(), r.u64()
        card = _dec_card(r)
        state.pending[proposal_id] = PendingCall(
            proposal_id, principal, run_owner, run_id, tier, grant, tool, target, handles,
            flagged, card, expires,
        )  # fmt: skip
    for _ in range(r.u32()):
        name, kind, owner, verified = r.text(), r.text(), r.text(), r.boolean()
        sealed = tuple(SealedValue(r.text(), r.blob()) for _ in range(r.u32()))
        state.handles[name] = Handle(name, kind, owner, verified, sealed, r.u64())
        state.handles_by_owner[owner] = state.handles_by_owner.get(owner, 0) + 1
    state.latch_activity_seq = r.u64()
    for _ in range(r.u32()):
        run_key = (r.text(), r.text())
        last_active = r.u64()
        halt_bytes = r.optional_blob()
        halt_chain = None
        if halt_bytes is not None:
            inner = _Reader(halt_bytes)
            halt_chain = inner.texts()
            inner.finish()
        run = LatchRun(last_active=last_active, halt_chain=halt_chain)
        for _ in range(r.u32()):
            bucket_key = (r.text(), r.text())
            count = r.u32()
            run.buckets[bucket_key] = LatchBucket(count=count, chain=r.texts())
        state.latch_runs[run_key] = run
    if r.remaining():
        for _ in range(r.u32()):
            owner, name = r.text(), r.text()
            state.sets[(owner, name)] = tuple(_dec_target_rule(r) for _ in range(r.u32()))
    if r.remaining():
        for _ in range(r.u32()):
            principal_id, key = r.text(), r.take(32)
            nonces = _dec_nonces(r)
            state.principals[principal_id] = PrincipalRecord(principal_id, key, nonces, r.texts())
            state.principal_by_key[key] = principal_id
        for _ in range(r.u32()):
            agent_id = r.text()
            state.agent_principal[agent_id] = r.text()
        for _ in range(r.u32()):
            proposal_id = r.take(32)
            state.wrong_digests[proposal_id] = r.u32()
        for _ in range(r.u32()):
            pair = (r.text(), r.text())
            count = r.u32()
            state.cross_run[pair] = LatchBucket(count=count, chain=r.texts())
    if r.remaining():
        for _ in range(r.u32()):
            name = r.text()
            state.settings[name] = r.u64()
        for _ in range(r.u32()):
            quota_key = r.texts()
            state.quota_counters[quota_key] = QuotaCounter(window=r.u64(), count=r.u32())
    return state
