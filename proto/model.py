"""Domain types of the governance engine: transactions, mandates, tool specs, codes.

Frozen dataclasses that validate themselves in `__post_init__`, so a value is checked once,
where it is made: a value that exists is well formed; the codec turns a protobuf that
would build an ill-formed value into a `malformed` rejection. Standard library only.

Argument values are the one thing that must never leak (docs/engine.md, "Verdicts and
reasons"): `Argument` and `Proposal` print argument names and never values, whatever
formats them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from quorumgate.proto import limits, names

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
DIGEST_BYTES = 32

# What the agent is told on any denial, whatever the reason.
DENIAL_TEXT = "This action is not permitted."


class TxKind(StrEnum):
    PROPOSAL = "proposal"
    CONFIRM = "confirm"
    DELEGATE = "delegate"
    REVOKE = "revoke"
    SEAL_ENVELOPE = "seal_envelope"
    ADMIN = "admin"
    MALFORMED = "malformed"  # could not be parsed far enough to know


class Outcome(StrEnum):
    """Proposals (and the Confirm that settles one) get allow/flag/deny/pending;
    every other kind gets applied/rejected; an unattributable transaction is rejected."""

    ALLOW = "allow"
    FLAG = "flag"  # an allow recorded as a finding (observe mode)
    DENY = "deny"
    PENDING = "pending"  # confirmation required (§4.5)
    APPLIED = "applied"
    REJECTED = "rejected"


class Reason(StrEnum):
    """Reason codes: for operators only (ledger, metrics, CLI), never shown to an agent."""

    OK = "ok"
    # unattributable or structurally bad transactions (rejected, no state change)
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad_signature"
    WRONG_CHAIN = "wrong_chain"
    UNKNOWN_SIGNER = "unknown_signer"
    REPLAYED = "replayed"
    # proposals
    QUOTA_EXCEEDED = "quota_exceeded"
    RUN_NOT_OPENED = "run_not_opened"  # a run id no transaction of the run's owner opened
    RUN_HALTED = "run_halted"
    UNKNOWN_TOOL = "unknown_tool"
    NO_MANDATE = "no_mandate"
    SUSPENDED = "suspended"
    OUT_OF_SCOPE = "out_of_scope"
    OUT_OF_SCOPE_OBSERVED = "out_of_scope_observed"
    REPEAT_DENIED = "repeat_denied"
    TIER_INSUFFICIENT = "tier_insufficient"
    MALFORMED_TARGET = "malformed_target"
    TARGET_SCHEME_NOT_ALLOWED = "target_scheme_not_allowed"
    TOO_MANY_LINKS = "too_many_links"  # more links in text than LINKS_PER_*_MAX
    CROSS_PRINCIPAL_TARGET = "cross_principal_target"
    MALFORMED_ARGUMENT = "malformed_argument"
    AMBIENT_IDENTITY_ARGUMENT = "ambient_identity_argument"
    SECRET_IN_PLAINTEXT = "secret_in_plaintext"  # a value shaped like a secret, not a handle
    ENVELOPE_REQUIRED = "envelope_required"
    HANDLE_VIOLATION = "handle_violation"
    HANDLE_KIND_MISMATCH = "handle_kind_mismatch"
    STATUS_TOOL_ARGUMENT = "status_tool_argument"
    CONFIRMATION_REQUIRED = "confirmation_required"
    PENDING_LIMIT = "pending_limit"
    DELEGATION_UNKNOWN = "delegation_unknown"
    DELEGATION_EXPIRED = "delegation_expired"
    DELEGATION_REVOKED = "delegation_revoked"
    DELEGATION_REFUSED = "delegation_refused"
    DELEGATION_DEPTH_EXCEEDED = "delegation_depth_exceeded"
    DELEGATION_WIDENING = "delegation_widening"
    DELEGATION_MISMATCH = "delegation_mismatch"
    DELEGATION_EXPIRY_INVALID = "delegation_expiry_invalid"
    # confirmations
    UNKNOWN_PROPOSAL = "unknown_proposal"
    CARD_DIGEST_MISMATCH = "card_digest_mismatch"
    CONFIRMATION_EXPIRED = "confirmation_expired"
    CONFIRMER_NOT_AUTHORIZED = "confirmer_not_authorized"
    CONFIRMATION_REJECTED = "confirmation_rejected"  # the principal declined the card
    CARD_LOCKED = "card_locked"  # too many answers naming a wrong card digest
    # administration, envelopes, grants
    NOT_OWNER = "not_owner"
    NOT_AN_AGENT = "not_an_agent"
    OWNER_ONLY_FIELD = "owner_only_field"
    UNKNOWN_AGENT = "unknown_agent"
    UNKNOWN_PRINCIPAL = "unknown_principal"
    UNKNOWN_SINK = "unknown_sink"
    UNKNOWN_GRANT = "unknown_grant"
    NOT_GRANTOR = "not_grantor"
    KEY_IN_USE = "key_in_use"
    INVALID_SPEC = "invalid_spec"
    TIER_UNDECLARED = "tier_undeclared"  # a confirm-gated tool that does not state min_tier
    DIRECT_NEEDS_OVERRIDE = "direct_needs_override"  # direct, with a sensitive argument
    DIRECT_OVERRIDE = "direct_override"  # applied: direct with a sensitive argument, on purpose
    UNDECLARED_ARGUMENT = "undeclared_argument"  # an argument the tool does not declare
    # a call made on a tool definition other than the one the owner pinned
    TOOL_DEFINITION_CHANGED = "tool_definition_changed"
    HANDLE_EXISTS = "handle_exists"
    CAPACITY_EXCEEDED = "capacity_exceeded"
    # a run's own targets (docs/provenance.md): named by neither the run owner's
    # principal, its deputy nor the owner
    NOT_RUN_PRINCIPAL = "not_run_principal"
    # key rotation (docs/engine.md, "Rotating keys"): a signature by a key its holder
    # rotated away from; a rotation signed by neither the key's holder nor the owner; a
    # rotation whose new key did not sign it
    KEY_ROTATED = "key_rotated"
    NOT_KEY_HOLDER = "not_key_holder"
    BAD_KEY_PROOF = "bad_key_proof"


class ToolMode(StrEnum):
    """How a registered tool may run (the BRAH paper, §6.3)."""

    READ = "read"
    DIRECT = "direct"
    USER_CONFIRM = "user_confirm"
    OWNER_CONFIRM = "owner_confirm"

    @property
    def needs_confirmation(self) -> bool:
        return self in (ToolMode.USER_CONFIRM, ToolMode.OWNER_CONFIRM)


class Tier(StrEnum):
    """Assurance tiers (the BRAH paper, §6.8); the owner outranks both."""

    DELEGATE = "delegate"
    MASTER = "master"
    OWNER = "owner"

    @property
    def rank(self) -> int:
        return {Tier.DELEGATE: 0, Tier.MASTER: 1, Tier.OWNER: 2}[self]


class Enforcement(StrEnum):
    ENFORCE = "enforce"
    OBSERVE = "observe"


class DelegationPolicy(StrEnum):
    ATTENUATED = "attenuated"
    NONE = "none"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _require_digest(value: bytes, what: str) -> None:
    _require(len(value) == DIGEST_BYTES, f"{what} must be {DIGEST_BYTES} bytes")


def _require_key(value: bytes, what: str) -> None:
    _require(len(value) == PUBLIC_KEY_BYTES, f"{what} must be {PUBLIC_KEY_BYTES} bytes")


def _require_tool_list(tools: tuple[str, ...], what: str) -> None:
    _require(len(tools) <= limits.TOOLS_PER_LIST_MAX, f"{what}: too many tools")
    for tool in tools:
        _require(names.canonical_tool_name(tool) == tool, f"{what}: tool name not canonical")
    _require(list(tools) == sorted(set(tools)), f"{what}: tools must be sorted and unique")


def canonical_tool_list(raw: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Canonical, sorted, de-duplicated tool names; ValueError on a name that has none."""
    out: set[str] = set()
    for item in raw:
        if not isinstance(item, str):
            raise ValueError("a tool list holds names, not " + type(item).__name__)
        name = names.canonical_tool_name(item)
        if name is None:
            raise ValueError("tool name has no canonical form")
        out.add(name)
    return tuple(sorted(out))


# --------------------------------------------------------------------------- transactions


@dataclass(frozen=True, repr=False)
class Argument:
    """One call argument: a plain text value or a handle reference, never both."""

    name: str
    text: str | None = None
    handle: str | None = None

    def __post_init__(self) -> None:
        _require((self.text is None) != (self.handle is None), "argument: text xor handle")
        _require(0 < len(self.name) <= 4 * limits.ARGUMENT_NAME_CHARS_MAX, "argument name")
        if self.text is not None:
            size = len(self.text.encode("utf-8", "surrogatepass"))
            _require(size <= limits.ARGUMENT_TEXT_BYTES_MAX, "argument value too large")
        if self.handle is not None:
            _require(len(self.handle) <= 64, "handle too long")

    @property
    def is_handle(self) -> bool:
        return self.handle is not None

    def __repr__(self) -> str:
        return f"Argument(name={self.name!r}, {'handle' if self.is_handle else 'text'}=<redacted>)"

    __str__ = __repr__


@dataclass(frozen=True)
class RoleTarget:
    """A further target of a call, in a role its tool declares (`ToolSpec.target_roles`)."""

    role: str
    target: str

    def __post_init__(self) -> None:
        _require(names.is_role(self.role), "target role must match " + names.ROLE_RE.pattern)
        _require(len(self.target) <= 4 * limits.TARGET_CHARS_MAX, "target too long")


@dataclass(frozen=True, repr=False)
class Proposal:
    """An agent's tool call. Who is calling is not in here: it comes from the signer key.
    `target` is the main target ("" for none); `targets` the further ones, by role."""

    run_id: str
    tool: str
    target: str
    arguments: tuple[Argument, ...] = ()
    grant: bytes | None = None  # the Delegate tx id this call acts under
    targets: tuple[RoleTarget, ...] = ()
    definition: bytes | None = None  # the tool definition's digest where it was called
    # The key of the ledger's argument commitments and the auditors it is sealed to
    # (proto/commitments.py); the engine never reads either. Not checked here: a build
    # from before these fields decoded any value of them (it ignored them), so this one
    # must decode every one too; `sidecar/ledger.py` `extra_for` takes only sound ones.
    commit_salt: bytes | None = None
    seal_to: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        _require(names.is_run_id(self.run_id), "run_id must match " + names.RUN_ID_RE.pattern)
        _require(len(self.tool) <= 4 * limits.TOOL_NAME_CHARS_MAX, "tool name too long")
        _require(len(self.target) <= 4 * limits.TARGET_CHARS_MAX, "target too long")
        _require(len(self.arguments) <= limits.ARGUMENTS_MAX, "too many arguments")
        _require(len(self.targets) <= limits.TARGETS_PER_CALL_MAX, "too many targets")
        if self.grant is not None:
            _require_digest(self.grant, "grant")
        if self.definition is not None:
            _require_digest(self.definition, "definition")

    @property
    def argument_names(self) -> tuple[str, ...]:
        return tuple(arg.name for arg in self.arguments)

    def __repr__(self) -> str:
        return (
            f"Proposal(run_id={self.run_id!r}, tool={self.tool!r}, target={self.target!r}, "
            f"targets={len(self.targets)}, argument_names={self.argument_names!r}, "
            f"grant={'yes' if self.grant else 'no'})"
        )

    __str__ = __repr__


@dataclass(frozen=True)
class Confirm:
    """The answer to a pending call's card: approve it, or (`reject`) decline it."""

    proposal_id: bytes
    card_digest: bytes
    reject: bool = False

    def __post_init__(self) -> None:
        _require_digest(self.proposal_id, "proposal_id")
        _require_digest(self.card_digest, "card_digest")


@dataclass(frozen=True)
class Delegate:
    child: bytes
    run_id: str
    tools: tuple[str, ...] | None  # None: the delegator's whole effective scope
    expires_at_ms: int
    parent_grant: bytes | None = None
    rules: tuple[ToolRules, ...] = ()  # narrow the targets and arguments further

    def __post_init__(self) -> None:
        _require_key(self.child, "child")
        _require(names.is_run_id(self.run_id), "run_id must match " + names.RUN_ID_RE.pattern)
        if self.tools is not None:
            _require_tool_list(self.tools, "delegate.tools")
        _require_rules(self.rules, self.tools)
        _require(0 < self.expires_at_ms < 2**63, "expires_at_ms must be set")
        if self.parent_grant is not None:
            _require_digest(self.parent_grant, "parent_grant")


@dataclass(frozen=True)
class Revoke:
    grant: bytes

    def __post_init__(self) -> None:
        _require_digest(self.grant, "grant")


@dataclass(frozen=True, repr=False)
class SealedValue:
    sink: str
    ciphertext: bytes

    def __post_init__(self) -> None:
        _require(names.is_agent_id(self.sink), "sink id")
        size = len(self.ciphertext)
        _require(limits.SEALED_BYTES_MIN <= size <= limits.SEALED_BYTES_MAX, "ciphertext size")

    def __repr__(self) -> str:
        return f"SealedValue(sink={self.sink!r}, ciphertext=<{len(self.ciphertext)} bytes>)"


@dataclass(frozen=True)
class SealEnvelope:
    kind: str
    sealed: tuple[SealedValue, ...]
    owner_principal: str | None = None  # honoured only when the owner signs

    def __post_init__(self) -> None:
        _require(names.is_kind(self.kind), "kind must match " + names.KIND_RE.pattern)
        _require(0 < len(self.sealed) <= limits.SINKS_PER_HANDLE_MAX, "sealed: 1..max sinks")
        sinks = [value.sink for value in self.sealed]
        _require(len(set(sinks)) == len(sinks), "sealed: one value per sink")
        if self.owner_principal is not None:
            _require(names.is_agent_id(self.owner_principal), "owner_principal")

    @property
    def sinks(self) -> tuple[str, ...]:
        return tuple(sorted(value.sink for value in self.sealed))


@dataclass(frozen=True)
class EnvelopeArg:
    name: str
    kind: str
    require_verified: bool = False

    def __post_init__(self) -> None:
        _require(names.canonical_argument_name(self.name) == self.name, "envelope arg name")
        _require(names.is_kind(self.kind), "envelope arg kind")


class ArgRole(StrEnum):
    """What a declared plain argument is: the engine decides by declaration,
    not by the argument's name."""

    IDENTITY = "identity"  # who the call is for: never sent, the tool takes the caller
    RECIPIENT = "recipient"
    AMOUNT = "amount"
    CREDENTIAL = "credential"  # only ever as an envelope handle
    TEXT = "text"

    @property
    def sensitive(self) -> bool:
        """Roles a `direct` tool may take only with an explicit override (the BRAH paper,
        §6.3)."""
        return self in (ArgRole.RECIPIENT, ArgRole.AMOUNT, ArgRole.CREDENTIAL)


@dataclass(frozen=True)
class ArgSpec:
    name: str
    role: ArgRole

    def __post_init__(self) -> None:
        _require(names.canonical_argument_name(self.name) == self.name, "argument name")


@dataclass(frozen=True)
class TargetSlot:
    """A role in which a tool takes further targets: under which schemes, and
    at most how many in one call (none is always allowed)."""

    role: str
    schemes: tuple[str, ...]
    max: int = 1

    def __post_init__(self) -> None:
        _require(names.is_role(self.role), "target role must match " + names.ROLE_RE.pattern)
        _require(0 < len(self.schemes) <= limits.SCHEMES_PER_TOOL_MAX, "role schemes: 1..max")
        for scheme in self.schemes:
            _require(names.is_scheme(scheme), "scheme must match " + names.SCHEME_RE.pattern)
        _require(list(self.schemes) == sorted(set(self.schemes)), "role schemes sorted, unique")
        _require(0 < self.max <= limits.TARGETS_PER_ROLE_MAX, "role max: 1..max")


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool: what it needs before it may run (docs/engine.md, "Tools,
    mandates and verdicts")."""

    name: str
    mode: ToolMode
    sink: str | None = None
    target_schemes: tuple[str, ...] = ()  # empty: the tool takes no target
    envelope_args: tuple[EnvelopeArg, ...] = ()
    min_tier: Tier = Tier.DELEGATE
    binds_caller: bool = False  # a status tool: no arguments, target bound to the caller
    # The plain arguments it takes, by role (empty: undeclared, the older rules:
    # identity by name); `direct` although it takes a sensitive role, on purpose; and
    # whether `min_tier` was written down (a confirm-gated tool must say it).
    arguments: tuple[ArgSpec, ...] = ()
    direct_override: bool = False
    min_tier_declared: bool = True
    # Further targets by role (sorted by role), and whether the main one may be left out.
    target_roles: tuple[TargetSlot, ...] = ()
    target_optional: bool = False
    # The pinned digest of its definition (an MCP tool's name, description and
    # input schema); calls that do not carry it are refused until the owner pins a new one.
    definition_digest: bytes | None = None
    # Its results carry content nobody vouches for (web pages, outside mail, channel
    # messages, uploaded files): a run in which it is allowed becomes exposed
    # (docs/provenance.md; chains where `runs_carry_provenance`).
    untrusted_results: bool = False

    def __post_init__(self) -> None:
        _require(names.canonical_tool_name(self.name) == self.name, "tool name not canonical")
        if self.sink is not None:
            _require(names.is_agent_id(self.sink), "sink id")
        _require(len(self.target_schemes) <= limits.SCHEMES_PER_TOOL_MAX, "too many schemes")
        for scheme in self.target_schemes:
            _require(names.is_scheme(scheme), "scheme must match " + names.SCHEME_RE.pattern)
        _require(
            list(self.target_schemes) == sorted(set(self.target_schemes)),
            "schemes must be sorted and unique",
        )
        _require(len(self.envelope_args) <= limits.ENVELOPE_ARGS_PER_TOOL_MAX, "envelope args")
        arg_names = [arg.name for arg in self.envelope_args]
        _require(arg_names == sorted(set(arg_names)), "envelope args sorted and unique")
        _require(self.min_tier in (Tier.DELEGATE, Tier.MASTER), "min_tier: delegate|master")
        _require(len(self.arguments) <= limits.DECLARED_ARGS_PER_TOOL_MAX, "too many arguments")
        declared = [arg.name for arg in self.arguments]
        _require(declared == sorted(set(declared)), "arguments sorted and unique")
        _require(len(self.target_roles) <= limits.TARGET_ROLES_PER_TOOL_MAX, "too many roles")
        roles = [slot.role for slot in self.target_roles]
        _require(roles == sorted(set(roles)), "target roles sorted and unique")
        _require(
            not self.target_optional or bool(self.target_schemes),
            "an optional target needs schemes",
        )
        if self.definition_digest is not None:
            _require_digest(self.definition_digest, "definition_digest")

    def slot(self, role: str) -> TargetSlot | None:
        for slot in self.target_roles:
            if slot.role == role:
                return slot
        return None

    def declared_arg(self, name: str) -> ArgSpec | None:
        for arg in self.arguments:
            if arg.name == name:
                return arg
        return None

    @property
    def takes_sensitive(self) -> bool:
        return any(arg.role.sensitive for arg in self.arguments)

    def envelope_arg(self, name: str) -> EnvelopeArg | None:
        for arg in self.envelope_args:
            if arg.name == name:
                return arg
        return None


class RuleKind(StrEnum):
    """How a target rule matches a canonical target (docs/policies.md)."""

    ANY = "any"  # every target: the explicit form of "no rule"
    EXACT = "exact"  # the canonical target itself
    PREFIX = "prefix"  # a path-segment prefix of it ("/a/b" matches "/a/b/c", not "/a/bc")
    HOST = "host"  # the host of a URI, or the domain of a mailto address
    HOST_SUFFIX = "host_suffix"  # that host, or any host below it ("example.com", "a.example.com")
    SET = "set"  # any entry of the caller's principal's named set, kept in the log


SET_ENTRY_KINDS = (RuleKind.EXACT, RuleKind.PREFIX, RuleKind.HOST, RuleKind.HOST_SUFFIX)


@dataclass(frozen=True)
class TargetRule:
    """One rule over a tool's canonical targets; in `exact` and `prefix` values a path
    segment (or principal reference) `CURRENT_USER` stands for the caller. `mode`, when
    set, is what a call the rule matches does instead of the tool's registered mode."""

    kind: RuleKind
    value: str = ""
    mode: ToolMode | None = None
    role: str = ""  # "": the call's main target; else its further targets in that role
    # The mode a matching call takes instead once its run is exposed (never laxer than
    # `mode`: the stricter of the two applies; docs/provenance.md).
    when_exposed: ToolMode | None = None

    def __post_init__(self) -> None:
        _require(isinstance(self.kind, RuleKind), "rule kind")
        _require(self.role == "" or names.is_role(self.role), "rule role")
        if self.kind is RuleKind.ANY:
            _require(self.value == "", "an `any` rule has no value")
        elif self.kind is RuleKind.SET:
            _require(names.is_set_name(self.value), "set name: " + names.SET_NAME_RE.pattern)
        else:
            _require(0 < len(self.value) <= limits.TARGET_CHARS_MAX, "rule value")
            _require(self.value.isascii() and self.value.isprintable(), "rule value: ASCII")


class ArgCheck(StrEnum):
    MAX = "max"  # a decimal number no greater than `number`
    ONE_OF = "one_of"  # one of `values`, exactly
    MAX_CHARS = "max_chars"  # at most `count` characters


@dataclass(frozen=True)
class ArgumentRule:
    """A constraint on one plain argument of a call; the argument must be present."""

    name: str
    check: ArgCheck
    number: str = ""
    values: tuple[str, ...] = ()
    count: int = 0

    def __post_init__(self) -> None:
        _require(names.canonical_argument_name(self.name) == self.name, "argument rule name")
        if self.check is ArgCheck.MAX:
            _require(names.is_decimal(self.number), "ceiling: a decimal number")
            _require(not self.values and self.count == 0, "ceiling: number only")
        elif self.check is ArgCheck.ONE_OF:
            _require(0 < len(self.values) <= limits.RULE_VALUES_MAX, "one_of: 1..max values")
            _require(list(self.values) == sorted(set(self.values)), "one_of: sorted, unique")
            _require(all(len(v) <= limits.TARGET_CHARS_MAX for v in self.values), "one_of")
            _require(self.number == "" and self.count == 0, "one_of: values only")
        else:
            _require(self.check is ArgCheck.MAX_CHARS, "argument check")
            _require(0 < self.count <= limits.ARGUMENT_TEXT_BYTES_MAX, "max_chars: count")
            _require(self.number == "" and not self.values, "max_chars: count only")


@dataclass(frozen=True)
class ToolRules:
    """What one allowed tool may be called on: the first target rule that matches decides
    (none: out of scope), and every argument rule must hold."""

    tool: str
    targets: tuple[TargetRule, ...]
    arguments: tuple[ArgumentRule, ...] = ()

    def __post_init__(self) -> None:
        _require(names.canonical_tool_name(self.tool) == self.tool, "rules: tool name")
        _require(0 < len(self.targets) <= limits.TARGET_RULES_PER_TOOL_MAX, "target rules")
        _require(len(self.arguments) <= limits.ARGUMENT_RULES_PER_TOOL_MAX, "argument rules")
        arg_names = [rule.name for rule in self.arguments]
        _require(arg_names == sorted(set(arg_names)), "argument rules: sorted, one per name")


def _require_rules(rules: tuple[ToolRules, ...], tools: tuple[str, ...] | None) -> None:
    _require(len(rules) <= limits.TOOL_RULES_MAX, "too many tool rules")
    ruled = [r.tool for r in rules]
    _require(ruled == sorted(set(ruled)), "rules: sorted by tool, one entry per tool")
    if tools is not None:
        _require(set(ruled) <= set(tools), "rules for a tool that is not allowed")


@dataclass(frozen=True)
class Mandate:
    """What an agent may do (docs/policies.md). `allowed_tools` None is unrestricted and
    () is nothing: the engine branches on `is None`, never on truthiness, so an empty
    list can never be read as "no restriction"."""

    allowed_tools: tuple[str, ...] | None
    enforcement: Enforcement = Enforcement.ENFORCE
    suspended: bool = False
    delegation_policy: DelegationPolicy = DelegationPolicy.NONE
    max_delegation_depth: int | None = None  # None: only the policy gates delegation
    # Target and argument rules per allowed tool; a tool without an entry: any target.
    rules: tuple[ToolRules, ...] = ()

    def __post_init__(self) -> None:
        if self.allowed_tools is not None:
            _require(not isinstance(self.allowed_tools, str), "allowed_tools: a list, not a str")
            _require_tool_list(self.allowed_tools, "allowed_tools")
        if self.max_delegation_depth is not None:
            _require(0 <= self.max_delegation_depth < 2**32, "max_delegation_depth")
        _require_rules(self.rules, self.allowed_tools)

    def permits(self, tool: str) -> bool:
        return self.allowed_tools is None or tool in self.allowed_tools

    def rules_for(self, tool: str) -> ToolRules | None:
        return rules_for(self.rules, tool)


def rules_for(rules: tuple[ToolRules, ...], tool: str) -> ToolRules | None:
    for entry in rules:
        if entry.tool == tool:
            return entry
    return None


@dataclass(frozen=True)
class RegisterTool:
    spec: ToolSpec


@dataclass(frozen=True)
class RegisterAgent:
    agent_id: str
    public_key: bytes
    principal: str = ""  # the principal it acts for; "": the owner

    def __post_init__(self) -> None:
        _require(names.is_agent_id(self.agent_id), "agent id: " + names.AGENT_ID_RE.pattern)
        _require_key(self.public_key, "public_key")
        if self.principal:
            _require(names.is_agent_id(self.principal), "principal id")


@dataclass(frozen=True)
class RegisterPrincipal:
    """A principal: the human agents act for, who answers their confirmation cards. Its
    key is of its own class: never an agent's, a sink's or the owner's."""

    principal_id: str
    public_key: bytes
    deputies: tuple[str, ...] = ()  # principals who may answer its cards too

    def __post_init__(self) -> None:
        _require(names.is_agent_id(self.principal_id), "principal id")
        _require_key(self.public_key, "public_key")
        _require(len(self.deputies) <= limits.DEPUTIES_MAX, "too many deputies")
        for deputy in self.deputies:
            _require(names.is_agent_id(deputy), "deputy id")
        _require(list(self.deputies) == sorted(set(self.deputies)), "deputies sorted, unique")
        _require(self.principal_id not in self.deputies, "a principal is not its own deputy")


@dataclass(frozen=True)
class RegisterSink:
    sink_id: str
    public_key: bytes  # X25519

    def __post_init__(self) -> None:
        _require(names.is_agent_id(self.sink_id), "sink id: " + names.AGENT_ID_RE.pattern)
        _require_key(self.public_key, "public_key")


@dataclass(frozen=True)
class SetMandate:
    agent_id: str
    mandate: Mandate

    def __post_init__(self) -> None:
        _require(names.is_agent_id(self.agent_id), "agent id")


@dataclass(frozen=True)
class Suspend:
    agent_id: str

    def __post_init__(self) -> None:
        _require(names.is_agent_id(self.agent_id), "agent id")


@dataclass(frozen=True)
class Resume:
    agent_id: str

    def __post_init__(self) -> None:
        _require(names.is_agent_id(self.agent_id), "agent id")


@dataclass(frozen=True)
class SetEntries:
    """Replace one named set of a principal (`payees`, `contacts`, `allowed_domains`...):
    target rules of the kinds in SET_ENTRY_KINDS; no entries deletes the set."""

    principal: str
    name: str
    entries: tuple[TargetRule, ...]

    def __post_init__(self) -> None:
        _require(names.is_agent_id(self.principal), "principal id")
        _require(names.is_set_name(self.name), "set name: " + names.SET_NAME_RE.pattern)
        _require(len(self.entries) <= limits.SET_ENTRIES_MAX, "too many set entries")
        for entry in self.entries:
            _require(entry.kind in SET_ENTRY_KINDS and entry.mode is None, "set entry kind")
            _require(entry.when_exposed is None, "set entries take no mode")
            _require(entry.role == "", "set entries take no role (the rule naming the set does)")
        keys = [(e.kind.value, e.value) for e in self.entries]
        _require(keys == sorted(set(keys)), "set entries: sorted by (kind, value), unique")


# Settings the owner changes in the log (docs/engine.md), over cluster.json's values.
# Quotas are per fixed minute / hour of block time; 0 is no limit.
SETTING_NAMES = (
    "certificate_ttl_ms",
    "confirmation_ttl_ms",
    "delegation_depth_max",
    "grant_ttl_ms_max",
    "grants_per_agent_max",
    "latch_cross_run_threshold",
    "latch_halt_threshold",
    "quota_agent_per_hour",
    "quota_agent_per_minute",
    "quota_run_per_hour",
    "quota_run_per_minute",
    "quota_tool_per_hour",
    "quota_tool_per_minute",
)


@dataclass(frozen=True)
class SetSettings:
    """Set (`values`) or reset to cluster.json's value (`clear`) named settings."""

    values: tuple[tuple[str, int], ...] = ()
    clear: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        named = [name for name, _ in self.values]
        _require(named == sorted(set(named)), "settings: sorted by name, each once")
        _require(list(self.clear) == sorted(set(self.clear)), "clear: sorted, each once")
        _require(not set(named) & set(self.clear), "a setting both set and cleared")
        for name in (*named, *self.clear):
            _require(name in SETTING_NAMES, f"unknown setting (one of {', '.join(SETTING_NAMES)})")
        for _, value in self.values:
            _require(0 <= value < 2**63, "setting value: 0..2**63-1")


# How many targets one run may name as its own (`SetRunTargets`, docs/provenance.md):
# a task is about a few pages and people; a long list would be a standing set.
RUN_TARGETS_MAX = 32


@dataclass(frozen=True)
class SetRunTargets:
    """Name one run's own targets (docs/provenance.md): the pages, people and accounts the
    task is about, as canonical targets; an exposed run still calls them as a clean run
    would. Signed by the run owner's principal (or a deputy) or the owner, never an
    agent; it replaces what the run had, and no targets clears them."""

    agent_id: str  # the run's owner: the root agent of its delegation chain
    run_id: str
    targets: tuple[str, ...]

    def __post_init__(self) -> None:
        _require(names.is_agent_id(self.agent_id), "agent id")
        _require(names.is_run_id(self.run_id), "run_id must match " + names.RUN_ID_RE.pattern)
        _require(len(self.targets) <= RUN_TARGETS_MAX, "too many run targets")
        for target in self.targets:
            _require(0 < len(target) <= limits.TARGET_CHARS_MAX, "run target length")
            _require(target.isascii() and target.isprintable(), "run target: ASCII")
        _require(list(self.targets) == sorted(set(self.targets)), "run targets sorted, unique")


class KeyHolder(StrEnum):
    """Whose key a `RotateKey` replaces (docs/engine.md, "Rotating keys")."""

    AGENT = "agent"
    PRINCIPAL = "principal"
    OWNER = "owner"


@dataclass(frozen=True)
class RotateKey:
    """Replace the key of an agent, a principal or the owner (docs/engine.md, "Rotating
    keys"). `proof` is the new key's signature over `proto/tx.py` `rotation_statement`,
    so no one rotates to a key they do not hold. Signed by the holder's current key, or
    by the owner for an agent or a principal."""

    holder: KeyHolder
    subject_id: str  # the agent or principal id; empty for the owner
    new_public_key: bytes
    proof: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if self.holder is KeyHolder.OWNER:
            _require(self.subject_id == "", "the owner's rotation names no subject")
        else:
            _require(names.is_agent_id(self.subject_id), "subject id")
        _require_key(self.new_public_key, "new_public_key")
        _require(len(self.proof) == SIGNATURE_BYTES, "proof must be 64 bytes")


AdminOp = (
    RegisterTool
    | RegisterAgent
    | RegisterSink
    | SetMandate
    | Suspend
    | Resume
    | SetEntries
    | RegisterPrincipal
    | SetSettings
    | SetRunTargets
    | RotateKey
)


@dataclass(frozen=True)
class Admin:
    op: AdminOp


TxPayload = Proposal | Confirm | Delegate | Revoke | SealEnvelope | Admin

_KIND_OF: dict[type, TxKind] = {
    Proposal: TxKind.PROPOSAL,
    Confirm: TxKind.CONFIRM,
    Delegate: TxKind.DELEGATE,
    Revoke: TxKind.REVOKE,
    SealEnvelope: TxKind.SEAL_ENVELOPE,
    Admin: TxKind.ADMIN,
}


@dataclass(frozen=True)
class TxBody:
    chain_id: str
    nonce: int
    payload: TxPayload

    def __post_init__(self) -> None:
        _require(0 < len(self.chain_id) <= limits.ID_CHARS_MAX, "chain_id")
        _require(0 < self.nonce < 2**64, "nonce must be in 1..2**64-1")

    @property
    def kind(self) -> TxKind:
        return _KIND_OF[type(self.payload)]


@dataclass(frozen=True, repr=False)
class SignedTx:
    body: bytes = field(repr=False)
    signer: bytes
    signature: bytes

    def __post_init__(self) -> None:
        _require(len(self.body) <= limits.TX_BYTES_MAX, "body too large")
        _require_key(self.signer, "signer")
        _require(len(self.signature) == SIGNATURE_BYTES, "signature must be 64 bytes")

    def __repr__(self) -> str:
        return f"SignedTx(signer={self.signer.hex()[:16]}.., body=<{len(self.body)} bytes>)"
