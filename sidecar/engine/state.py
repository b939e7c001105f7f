"""The engine's whole replicated state, its bounds, and its canonical serialization.

Everything that decides a later verdict lives here and nowhere else, so that
`state_bytes()` is the state: two engines with equal bytes decide every future block the
same way (the engine is a pure function of the committed log), and a sidecar rebuilt from
the bytes continues exactly where it stopped. Maps are dicts for speed, but no decision
ever depends on their iteration order: serialization sorts every map by key, and eviction
picks by explicit sequence numbers, so every sidecar evicts the same entry.

The state is a header and keyed sections (`SECTIONS`), each map a `TrackedDict` that
remembers which entries a block touched (sidecar/engine/statetree.py), so a block
re-encodes, rehashes and hands to the store only those (`take_delta`). On chains whose
state root is a hash tree (`state_hash_tree`, proto/chainversions.py) the root
(`tree_root`) is computed over the entries; on older chains it is SHA-256 over the whole
canonical bytes, as they always signed it.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from quorumgate.proto import domains
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
from quorumgate.sidecar.engine.statetree import (
    SectionTree,
    TrackedDict,
    iter_sorted,
    key_bytes,
    leaf_hash,
    section_root,
)

TAG_STATE = domains.ENGINE_STATE

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
    """A principal (docs/engine.md, "Principals and confirmation"): the human agents act
    for. It signs only the answers to cards (Confirm, with or without `reject`), the named
    sets of the agents acting for it (SetEntries) and its deputies, with nonces of its
    own."""

    principal_id: str
    public_key: bytes
    nonces: NonceWindow = field(default_factory=NonceWindow)
    deputies: tuple[str, ...] = ()  # principals who may answer its cards too


@dataclass(frozen=True)
class Grant:
    """A Delegate that was applied. `scope` is pinned at delegation time.
    Frozen: a change is a new object (`replace`) written into the map, which is how the
    state's incremental form learns of it (grants are not marked when read)."""

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
    rules: tuple[ToolRules, ...] = ()  # the Delegate's own rules: they only narrow


@dataclass
class Handle:
    """A capability envelope: only ciphertexts sealed to sinks are kept."""

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
    """A confirmation-gated call waiting for its Confirm. Frozen, as `Grant`."""

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
class RunRecord:
    """What a run has taken in and what its principal said it is about (docs/provenance.md):
    the height, tool and proposal of the first allowed call whose results are untrusted
    (`exposed_height` None: clean), and the run's own targets (`SetRunTargets`).
    `touched_height` is the height it was last written at: when the table is full the
    least recently written goes first (sidecar/engine/provenance.py). Frozen, as `Grant`."""

    exposed_height: int | None = None
    exposed_tool: str = ""
    exposed_proposal: bytes = b""
    targets: tuple[str, ...] = ()
    touched_height: int = 0


@dataclass(frozen=True)
class RetiredKey:
    """A key its holder rotated away from (docs/engine.md, "Rotating keys"): whose it was
    (`holder`, a `KeyHolder` value, and the agent or principal id, empty for the owner)
    and the height of the rotation. Kept for the chain's life: a retired key signs
    nothing again and is never registered again, so no transaction it signed can replay
    under another identity's fresh nonces."""

    holder: str
    subject_id: str
    height: int


@dataclass(frozen=True)
class StateDelta:
    """What one height changed in the state, for a store that writes only that
    (sidecar/store.py): the state's `header` (`EngineState.header_bytes`) and, per entry
    changed since the previous `EngineState.take_delta`, (section index, key form, the
    entry's bytes or None when it was removed), in section and key order. `full` is True
    for the first delta an `EngineState` gives, which then holds every entry: the store
    replaces what it held (a state loaded from bytes, or one it never saw)."""

    header: bytes
    changes: tuple[tuple[int, bytes, bytes | None], ...]
    full: bool


# A quota counter's key: (scope, period, subject...) — ("agent", "minute", agent),
# ("tool", "hour", agent, tool), ("run", "minute", run owner, run id).
QuotaKey = tuple[str, ...]


@dataclass
class QuotaCounter:
    window: int  # block time // the period's length: the window counted
    count: int


# The sections of the state, in the order of the state bytes and of the root; changing
# this order or an encoder changes every root.
SECTIONS: tuple[str, ...] = (
    "tools", "sinks", "agents", "grants", "pending", "handles", "latch_runs", "sets",
    "principals", "agent_principal", "wrong_digests", "cross_run", "settings",
    "quota_counters", "runs", "run_floors", "retired_keys",
)  # fmt: skip
# The sections provenance added (docs/provenance.md): absent from the bytes and the root
# while both are empty, so a chain that never used them keeps its bytes and roots.
PROVENANCE_SECTIONS = ("runs", "run_floors")
# The section key rotation added (docs/engine.md, "Rotating keys"), likewise absent while
# empty; the owner's key in the state is in the header, and only once rotated.
KEY_SECTIONS = ("retired_keys",)
# Sections whose values are records changed in place: a read marks the entry (TrackedDict).
MUTABLE_SECTIONS = frozenset(
    {"agents", "handles", "latch_runs", "principals", "cross_run", "quota_counters"}
)
_SECTION_NAMES = frozenset(SECTIONS)
EXPIRING_SECTIONS = ("grants", "pending")  # entries with `expires_at_ms`, dropped after it
COUNTED_FIELDS = {"grants": "grantor", "pending": "principal"}  # see EngineState.count


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
    # Named sets of target rules, by (agent, set name) (`SetEntries`).
    sets: dict[tuple[str, str], tuple[TargetRule, ...]] = field(default_factory=dict)
    # Split authority: the principals, the principal each agent acts for (an
    # agent absent here acts for the owner), and each pending call's wrong card digests.
    principals: dict[str, PrincipalRecord] = field(default_factory=dict)
    agent_principal: dict[str, str] = field(default_factory=dict)
    wrong_digests: dict[bytes, int] = field(default_factory=dict)
    # The cross-run latch: per (agent, canonical tool), the runs in which the
    # pair was refused (`count`) and the agents whose mandates shaped those refusals.
    cross_run: dict[BucketKey, LatchBucket] = field(default_factory=dict)
    # Settings in the log: name -> value, over cluster.json's; and the
    # quota counters of the fixed minute and hour windows, by QuotaKey.
    settings: dict[str, int] = field(default_factory=dict)
    quota_counters: dict[QuotaKey, QuotaCounter] = field(default_factory=dict)
    # Provenance (docs/provenance.md): per run, its exposure and its own targets; per
    # run owner, the highest opening nonce of a run whose record was evicted (every run
    # of that owner opened at or below it counts as exposed).
    runs: dict[RunKey, RunRecord] = field(default_factory=dict)
    run_floors: dict[str, int] = field(default_factory=dict)
    # Key rotation (docs/engine.md, "Rotating keys"): every retired key, and the owner's
    # key once rotated (None: cluster.json's, `EngineConfig.owner_public_key`).
    retired_keys: dict[bytes, RetiredKey] = field(default_factory=dict)
    owner_key: bytes | None = None
    # derived indexes, rebuilt on load; not serialized
    agent_by_key: dict[bytes, str] = field(default_factory=dict)
    principal_by_key: dict[bytes, str] = field(default_factory=dict)
    handles_by_owner: dict[str, int] = field(default_factory=dict)
    # The incremental form (sidecar/engine/statetree.py): per section,
    # each entry's encoded bytes by key form, and the section's hash tree. `_flush` brings
    # both up to date with the maps' dirty keys and queues what changed for the store
    # (`_unsaved`, drained by `take_delta`). Not serialized, not compared.
    _entries: list[dict[bytes, bytes]] = field(
        default_factory=lambda: [{} for _ in SECTIONS], repr=False, compare=False
    )
    _trees: list[SectionTree] = field(
        default_factory=lambda: [SectionTree() for _ in SECTIONS], repr=False, compare=False
    )
    _unsaved: dict[tuple[int, bytes], bytes | None] = field(
        default_factory=dict, repr=False, compare=False
    )
    _delta_taken: bool = field(default=False, repr=False, compare=False)
    # Min-heaps of (expiry, key) of the grants and pending calls written, so the expired
    # are found without scanning either table each block (`expired`); an item whose entry
    # is gone or now expires at another time is skipped when it surfaces.
    _expiry: dict[str, list[tuple[int, bytes]]] = field(
        default_factory=lambda: {name: [] for name in EXPIRING_SECTIONS},
        repr=False,
        compare=False,
    )
    _check_queue: list[tuple[int, Any]] = field(default_factory=list, repr=False, compare=False)
    # Per counted section (COUNTED_FIELDS), how many entries hold each value of its field,
    # and the value each entry was counted under: what the per-grantor and per-principal
    # caps read, without scanning the table per transaction.
    _counts: dict[str, dict[str, int]] = field(
        default_factory=lambda: {name: {} for name in COUNTED_FIELDS},
        repr=False,
        compare=False,
    )
    _counted: dict[str, dict[Any, str]] = field(
        default_factory=lambda: {name: {} for name in COUNTED_FIELDS},
        repr=False,
        compare=False,
    )

    def __setattr__(self, name: str, value: Any) -> None:
        # A section is always a TrackedDict; one assigned whole marks every key it had
        # and has, so the caches follow.
        if name in _SECTION_NAMES:
            table: TrackedDict[Any, Any] = TrackedDict(value, reads_mark=name in MUTABLE_SECTIONS)
            old = self.__dict__.get(name)
            if old is not None:
                table.dirty.update(dict.keys(old))
            value = table
        object.__setattr__(self, name, value)

    def agent_changed(self, agent_id: str) -> None:
        """Mark an agent record changed in place (reading it through the map marks it
        too; this is for code that holds the record from elsewhere)."""
        _tracked(self.agents).dirty.add(agent_id)

    def sets_of(self, agent_id: str) -> dict[str, tuple[TargetRule, ...]]:
        return {name: rules for (owner, name), rules in self.sets.items() if owner == agent_id}

    def header_bytes(self) -> bytes:
        """The part of the state outside the sections: configuration fingerprint, last
        height and block time, the owner's nonces and the latch's activity counter."""
        enc = Encoder(TAG_STATE_HEADER).raw(self.config_fingerprint)
        height = self.last_height
        enc.optional_blob(None if height is None else struct.pack(">Q", height))
        enc.u64(self.last_block_time_ms)
        _enc_nonces(enc, self.owner_nonces)
        enc.u64(self.latch_activity_seq)
        if self.owner_key is not None:
            enc.raw(self.owner_key)  # only once rotated: older headers keep their bytes
        return bytes(enc)

    def _flush(self) -> None:
        """Re-encode every entry marked since the last flush; an entry whose bytes did not
        change (it was only read) is left as it was."""
        for index, name in enumerate(SECTIONS):
            table = _tracked(getattr(self, name))
            if not table.dirty:
                continue
            encode = ENCODERS[name]
            entries, tree, unsaved = self._entries[index], self._trees[index], self._unsaved
            counted_field = COUNTED_FIELDS.get(name)
            for key in table.take_dirty():
                form = key_bytes(key)
                if counted_field is not None:
                    self._recount(name, counted_field, table, key)
                if dict.__contains__(table, key):
                    data = encode(key, dict.__getitem__(table, key))
                    if entries.get(form) == data:
                        continue
                    entries[form] = data
                    tree.put(form, leaf_hash(index, form, data))
                    unsaved[(index, form)] = data
                    if name in EXPIRING_SECTIONS:
                        expires = dict.__getitem__(table, key).expires_at_ms
                        heapq.heappush(self._expiry[name], (expires, key))
                elif entries.pop(form, None) is not None:
                    tree.remove(form)
                    unsaved[(index, form)] = None

    def _recount(self, name: str, counted_field: str, table: dict[Any, Any], key: Any) -> None:
        counts, counted = self._counts[name], self._counted[name]
        old = counted.pop(key, None)
        if old is not None:
            counts[old] -= 1
            if not counts[old]:
                del counts[old]
        entry = dict.get(table, key)
        if entry is not None:
            value = getattr(entry, counted_field)
            counted[key] = value
            counts[value] = counts.get(value, 0) + 1

    def count(self, name: str, value: str) -> int:
        """How many entries of section `name` (a key of COUNTED_FIELDS) hold `value` in
        its counted field: a grantor's grants, a principal's pending calls. Recounts the
        entries written since the last flush but does not flush: a flush in the middle of
        a transaction would forget the marks of records read before it and changed after."""
        table = getattr(self, name)
        for key in _tracked(table).dirty:
            self._recount(name, COUNTED_FIELDS[name], table, key)
        return self._counts[name].get(value, 0)

    def expired(self, name: str, horizon_ms: int) -> list[bytes]:
        """The keys of the grants or pending calls (`name`) expiring at or before
        `horizon_ms`, in key order; the caller removes them all. Does not flush (see
        `count`): the entries written since are pushed here, and again at the flush (an
        entry found twice is dropped once)."""
        heap, table = self._expiry[name], getattr(self, name)
        for key in _tracked(table).dirty:
            entry = dict.get(table, key)
            if entry is not None:
                heapq.heappush(heap, (entry.expires_at_ms, key))
        found: set[bytes] = set()
        while heap and heap[0][0] <= horizon_ms:
            expires, key = heapq.heappop(heap)
            entry = dict.get(table, key)
            if entry is not None and entry.expires_at_ms == expires:
                found.add(key)
        return sorted(found)

    def check_entries(self, count: int) -> str | None:
        """Re-encode the next `count` entries of a rotation over the whole state and
        compare each with its cached bytes: the section of the first that differs (an
        entry changed in place without a mark), or None. Constant work per call; every
        entry is checked once per (entries / count) calls."""
        self._flush()
        for _ in range(count):
            if not self._check_queue:
                self._check_queue = [
                    (index, key)
                    for index, name in enumerate(SECTIONS)
                    for key in dict.keys(getattr(self, name))
                ]
                self._check_queue.reverse()
                if not self._check_queue:
                    return None
            index, key = self._check_queue.pop()
            name = SECTIONS[index]
            table = getattr(self, name)
            if not dict.__contains__(table, key):
                continue  # removed since the rotation began
            data = ENCODERS[name](key, dict.__getitem__(table, key))
            if self._entries[index].get(key_bytes(key)) != data:
                return name
        return None

    def restart_delta(self) -> None:
        """Make the next `take_delta` full: for a store that will start recording from
        the next height but holds the state some other way (whole, or not at all)."""
        self._delta_taken = False

    def take_delta(self) -> StateDelta:
        """What changed since the previous call (everything, the first time), which it
        then forgets: the caller records every delta it takes (the engine takes one per
        height)."""
        self._flush()
        full = not self._delta_taken
        changes: tuple[tuple[int, bytes, bytes | None], ...]
        if full:
            changes = tuple(
                (index, form, entries[form])
                for index, entries in enumerate(self._entries)
                for form in sorted(entries)
            )
        else:
            changes = tuple((i, f, self._unsaved[(i, f)]) for i, f in sorted(self._unsaved))
        self._unsaved.clear()
        self._delta_taken = True
        return StateDelta(self.header_bytes(), changes, full)

    def to_bytes(self) -> bytes:
        """The canonical state bytes (the snapshot form, `from_bytes` reads them)."""
        self._flush()
        return assemble_state(
            self.header_bytes(), [list(iter_sorted(entries)) for entries in self._entries]
        )

    def fresh_bytes(self) -> bytes:
        """The canonical bytes encoded from scratch, with no cache: what `to_bytes` must
        equal (a test oracle, and the check `Engine.verify_state_cache` runs)."""
        return assemble_state(self.header_bytes(), [
            [data for _, data in sorted(_fresh_entries(self, name))] for name in SECTIONS
        ])  # fmt: skip

    def root(self) -> bytes:
        """The state root of chains without `state_hash_tree`: SHA-256 of the canonical state
        bytes."""
        return sha256(self.to_bytes())

    def tree_root(self) -> bytes:
        """The hash-tree state root (`state_hash_tree`): over the header and each section's count
        and hash-tree root, so a block rehashes only the entries it touched."""
        self._flush()
        sections = zip(self._entries, self._trees, strict=True)
        return _tree_root(self.header_bytes(), _rooted([(len(e), t.root()) for e, t in sections]))

    def fresh_tree_root(self) -> bytes:
        """`tree_root` computed from scratch (its oracle)."""
        sections = []
        for index, name in enumerate(SECTIONS):
            entries = _fresh_entries(self, name)
            sections.append((len(entries), section_root(index, entries)))
        return _tree_root(self.header_bytes(), _rooted(sections))

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
# Likewise a tool's status-tool flag is 2 or 3 when argument declarations follow it,
# and has 4 added when its further target roles follow those.
TOOL_DECLARATIONS_FOLLOW = 2
TOOL_TARGET_ROLES_FOLLOW = 4
TOOL_DEFINITION_FOLLOWS = 8  # a pinned definition digest follows the roles
TOOL_UNTRUSTED_RESULTS = 16  # its results carry untrusted content (docs/provenance.md)
# A tool's rule count has this bit set when every rule is followed by its `when_exposed`
# mode (after its role, when roles follow).
RULE_EXPOSURE_FOLLOWS = 1 << 30
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
        exposure = any(rule.when_exposed is not None for rule in entry.targets)
        count = len(entry.targets) | (RULE_ROLES_FOLLOW if roles else 0)
        enc.text(entry.tool).u32(count | (RULE_EXPOSURE_FOLLOWS if exposure else 0))
        for rule in entry.targets:
            _enc_target_rule(enc, rule)
            if roles:
                enc.text(rule.role)
            if exposure:
                enc.text("" if rule.when_exposed is None else rule.when_exposed.value)
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
    # argument declarations follow the flag only when present (older states keep bytes)
    enc.u8(
        int(spec.binds_caller)
        + (TOOL_DECLARATIONS_FOLLOW if declared else 0)
        + (TOOL_TARGET_ROLES_FOLLOW if roles else 0)
        + (TOOL_DEFINITION_FOLLOWS if pinned else 0)
        + (TOOL_UNTRUSTED_RESULTS if spec.untrusted_results else 0)
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


def _encode_tool(spec: ToolSpec) -> bytes:
    enc = Encoder()
    _enc_tool(enc, spec)
    return bytes(enc)


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


def _encode_sink(sink: str, key: bytes) -> bytes:
    return bytes(Encoder().text(sink).raw(key))


def _encode_handle(_: str, h: Handle) -> bytes:
    enc = Encoder().text(h.handle).text(h.kind).text(h.owner).boolean(h.verified)
    enc.u32(len(h.sealed))
    for value in h.sealed:
        enc.text(value.sink).blob(value.ciphertext)
    return bytes(enc.u64(h.created_height))


def _encode_latch_run(run_key: RunKey, run: LatchRun) -> bytes:
    enc = Encoder().text(run_key[0]).text(run_key[1]).u64(run.last_active)
    enc.optional_blob(None if run.halt_chain is None else bytes(Encoder().texts(run.halt_chain)))
    enc.u32(len(run.buckets))
    for bucket_key in sorted(run.buckets):
        bucket = run.buckets[bucket_key]
        enc.text(bucket_key[0]).text(bucket_key[1]).u32(bucket.count).texts(bucket.chain)
    return bytes(enc)


def _encode_set(key: tuple[str, str], rules: tuple[TargetRule, ...]) -> bytes:
    enc = Encoder().text(key[0]).text(key[1]).u32(len(rules))
    for rule in rules:
        _enc_target_rule(enc, rule)
    return bytes(enc)


def _encode_principal(_: str, principal: PrincipalRecord) -> bytes:
    enc = Encoder().text(principal.principal_id).raw(principal.public_key)
    _enc_nonces(enc, principal.nonces)
    return bytes(enc.texts(principal.deputies))


def _encode_cross_run(pair: BucketKey, bucket: LatchBucket) -> bytes:
    return bytes(Encoder().text(pair[0]).text(pair[1]).u32(bucket.count).texts(bucket.chain))


def _encode_quota(key: QuotaKey, counter: QuotaCounter) -> bytes:
    return bytes(Encoder().texts(key).u64(counter.window).u32(counter.count))


def _encode_run(key: RunKey, run: RunRecord) -> bytes:
    height = run.exposed_height
    enc = Encoder().text(key[0]).text(key[1])
    enc.optional_blob(None if height is None else struct.pack(">Q", height))
    enc.text(run.exposed_tool).blob(run.exposed_proposal).texts(run.targets)
    return bytes(enc.u64(run.touched_height))


ENCODERS: dict[str, Callable[[Any, Any], bytes]] = {
    "tools": lambda _, spec: _encode_tool(spec),
    "sinks": _encode_sink,
    "agents": lambda _, rec: _encode_agent(rec),
    "grants": lambda _, g: _encode_grant(g),
    "pending": lambda _, p: _encode_pending(p),
    "handles": _encode_handle,
    "latch_runs": _encode_latch_run,
    "sets": _encode_set,
    "principals": _encode_principal,
    "agent_principal": lambda agent, principal: bytes(Encoder().text(agent).text(principal)),
    "wrong_digests": lambda pid, count: bytes(Encoder().raw(pid).u32(count)),
    "cross_run": _encode_cross_run,
    "settings": lambda name, value: bytes(Encoder().text(name).u64(value)),
    "quota_counters": _encode_quota,
    "runs": _encode_run,
    "run_floors": lambda owner, nonce: bytes(Encoder().text(owner).u64(nonce)),
    "retired_keys": lambda key, r: bytes(
        Encoder().raw(key).text(r.holder).text(r.subject_id).u64(r.height)
    ),
}
TAG_STATE_HEADER = domains.ENGINE_STATE_HEADER
TAG_STATE_ROOT = domains.ENGINE_STATE_ROOT


def _tracked(table: dict[Any, Any]) -> TrackedDict[Any, Any]:
    assert isinstance(table, TrackedDict), "a state section is always a TrackedDict"
    return table


def _fresh_entries(state: EngineState, name: str) -> list[tuple[bytes, bytes]]:
    """(key form, bytes) of every entry of a section, encoded now (reads bypass marking)."""
    encode = ENCODERS[name]
    table = getattr(state, name)
    return [(key_bytes(key), encode(key, value)) for key, value in dict.items(table)]


def _rooted(sections: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """The sections the root covers: the provenance sections only when one of them or a
    later one holds something, the key sections only when one holds something, so the
    roots of chains that never used them are what they were."""
    keys = len(KEY_SECTIONS)
    if any(count for count, _ in sections[-keys:]):
        return sections
    sections = sections[:-keys]
    tail = len(PROVENANCE_SECTIONS)
    if any(count for count, _ in sections[-tail:]):
        return sections
    return sections[:-tail]


def _tree_root(header: bytes, sections: Sequence[tuple[int, bytes]]) -> bytes:
    enc = Encoder(TAG_STATE_ROOT).blob(header)
    for count, root in sections:
        enc.u64(count).raw(root)
    return enc.digest()


def _section(enc: Encoder, entries: Sequence[bytes]) -> None:
    enc.u32(len(entries))
    for data in entries:
        enc.raw(data)


def assemble_state(header: bytes, sections: Sequence[Sequence[bytes]]) -> bytes:
    """The canonical state bytes from the header and each section's entries in key order
    (what a store holding the entries one by one hands back)."""
    if len(sections) != len(SECTIONS):
        raise StateDecodeError(f"{len(sections)} sections, the state has {len(SECTIONS)}")
    r = _Reader(header)
    if r.take(len(TAG_STATE_HEADER)) != TAG_STATE_HEADER:
        raise StateDecodeError("not an engine state header")
    fingerprint, height, time_ms = r.take(32), r.optional_blob(), r.u64()
    owner_nonces = _dec_nonces(r)
    latch_seq = r.u64()
    owner_key = r.take(32) if r.remaining() else None
    r.finish()
    by_name = dict(zip(SECTIONS, sections, strict=True))
    enc = Encoder(TAG_STATE).raw(fingerprint).optional_blob(height).u64(time_ms)
    _enc_nonces(enc, owner_nonces)
    for name in ("tools", "sinks", "agents", "grants", "pending", "handles"):
        _section(enc, by_name[name])
    enc.u64(latch_seq)
    _section(enc, by_name["latch_runs"])
    # Sections added later are present only once they hold something, so a state that
    # never used them keeps the bytes it had before they existed: the reader finds them by
    # there being bytes left.
    keys = owner_key is not None or any(by_name[name] for name in KEY_SECTIONS)
    provenance = keys or any(by_name[name] for name in PROVENANCE_SECTIONS)
    settings = provenance or bool(by_name["settings"] or by_name["quota_counters"])
    authority = settings or any(
        by_name[name] for name in ("principals", "agent_principal", "wrong_digests", "cross_run")
    )
    if by_name["sets"] or authority:
        _section(enc, by_name["sets"])
    if authority:
        for name in ("principals", "agent_principal", "wrong_digests", "cross_run"):
            _section(enc, by_name[name])
    if settings:
        _section(enc, by_name["settings"])
        _section(enc, by_name["quota_counters"])
    if provenance:
        for name in PROVENANCE_SECTIONS:
            _section(enc, by_name[name])
    if keys:
        for name in KEY_SECTIONS:
            _section(enc, by_name[name])
        enc.optional_blob(owner_key)
    return bytes(enc)


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


def _dec_rule_tail(r: _Reader, rule: TargetRule, roles: bool, exposure: bool) -> TargetRule:
    """A mandate's or grant's rule: its role and its `when_exposed` mode, when they follow."""
    if roles:
        rule = replace(rule, role=r.text())
    if exposure:
        mode = r.text()
        rule = replace(rule, when_exposed=ToolMode(mode) if mode else None)
    return rule


def _dec_rules(r: _Reader) -> tuple[ToolRules, ...]:
    out = []
    for _ in range(r.u32()):
        tool = r.text()
        count = r.u32()
        roles, exposure = bool(count & RULE_ROLES_FOLLOW), bool(count & RULE_EXPOSURE_FOLLOWS)
        targets = tuple(
            _dec_rule_tail(r, _dec_target_rule(r), roles, exposure)
            for _ in range(count & ~(RULE_ROLES_FOLLOW | RULE_EXPOSURE_FOLLOWS))
        )
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
    untrusted = bool(flag & TOOL_UNTRUSTED_RESULTS)
    flag &= ~TOOL_UNTRUSTED_RESULTS
    most = 1 + TOOL_DECLARATIONS_FOLLOW + TOOL_TARGET_ROLES_FOLLOW + TOOL_DEFINITION_FOLLOWS
    if (
        flag > most
        or (flag & TOOL_TARGET_ROLES_FOLLOW and not flag & TOOL_DECLARATIONS_FOLLOW)
        or (flag & TOOL_DEFINITION_FOLLOWS and not flag & TOOL_TARGET_ROLES_FOLLOW)
    ):
        raise StateDecodeError("bad tool flag")
    if not flag & TOOL_DECLARATIONS_FOLLOW:
        return ToolSpec(
            name, mode, sink, schemes, args, tier, bool(flag & 1), untrusted_results=untrusted
        )
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
        untrusted,
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
    confirmer = c.text() if c.remaining() else ""  # cards name one where only principals answer
    links = c.texts() if c.remaining() else ()  # cards of calls with links in their text
    exposed_by = (c.u64(), c.text()) if c.remaining() else None  # cards of exposed runs
    c.finish()
    return ConfirmationCard(
        chain_id, proposal_id, principal, tier, delegate_of, tool, mode, min_tier, target,
        argument_names, handles, body_digest, created_height, expires_at_ms, confirmer,
        tuple(links), exposed_by,
    )  # fmt: skip


def _decode_state(r: _Reader) -> EngineState:
    """The state from its bytes, section by section in the order `to_bytes` writes them.
    Sections added after the first form are present only when bytes remain, so the
    bytes of chains from before them decode unchanged."""
    if r.take(len(TAG_STATE)) != TAG_STATE:
        raise StateDecodeError("not engine state bytes")
    state = EngineState(config_fingerprint=r.take(32))
    height = r.optional_blob()
    state.last_height = None if height is None else int(struct.unpack(">Q", height)[0])
    state.last_block_time_ms = r.u64()
    state.owner_nonces = _dec_nonces(r)
    _dec_registry(r, state)
    _dec_grants(r, state)
    _dec_pending(r, state)
    _dec_handles(r, state)
    _dec_latch(r, state)
    if r.remaining():
        for _ in range(r.u32()):
            owner, name = r.text(), r.text()
            state.sets[(owner, name)] = tuple(_dec_target_rule(r) for _ in range(r.u32()))
    if r.remaining():
        _dec_principals(r, state)
    if r.remaining():
        for _ in range(r.u32()):
            name = r.text()
            state.settings[name] = r.u64()
        for _ in range(r.u32()):
            quota_key = r.texts()
            state.quota_counters[quota_key] = QuotaCounter(window=r.u64(), count=r.u32())
    if r.remaining():
        _dec_runs(r, state)
    if r.remaining():
        _dec_keys(r, state)
    return state


def _dec_keys(r: _Reader, state: EngineState) -> None:
    """The key rotation section and the owner's key (docs/engine.md, "Rotating keys")."""
    for _ in range(r.u32()):
        key = r.take(32)
        state.retired_keys[key] = RetiredKey(holder=r.text(), subject_id=r.text(), height=r.u64())
    owner_key = r.optional_blob()
    if owner_key is not None and len(owner_key) != 32:
        raise StateDecodeError("bad owner key")
    state.owner_key = owner_key


def _dec_runs(r: _Reader, state: EngineState) -> None:
    """The provenance sections (docs/provenance.md)."""
    for _ in range(r.u32()):
        key = (r.text(), r.text())
        height = r.optional_blob()
        state.runs[key] = RunRecord(
            exposed_height=None if height is None else int(struct.unpack(">Q", height)[0]),
            exposed_tool=r.text(),
            exposed_proposal=r.blob(),
            targets=r.texts(),
            touched_height=r.u64(),
        )
    for _ in range(r.u32()):
        owner = r.text()
        state.run_floors[owner] = r.u64()


def _dec_registry(r: _Reader, state: EngineState) -> None:
    """Tools, sinks and agents."""
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


def _dec_grants(r: _Reader, state: EngineState) -> None:
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


def _dec_pending(r: _Reader, state: EngineState) -> None:
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


def _dec_handles(r: _Reader, state: EngineState) -> None:
    for _ in range(r.u32()):
        name, kind, owner, verified = r.text(), r.text(), r.text(), r.boolean()
        sealed = tuple(SealedValue(r.text(), r.blob()) for _ in range(r.u32()))
        state.handles[name] = Handle(name, kind, owner, verified, sealed, r.u64())
        state.handles_by_owner[owner] = state.handles_by_owner.get(owner, 0) + 1


def _dec_latch(r: _Reader, state: EngineState) -> None:
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


def _dec_principals(r: _Reader, state: EngineState) -> None:
    """Principals, the principal each agent acts for, wrong-digest counts and the
    cross-run latch: the sections split authority added."""
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
