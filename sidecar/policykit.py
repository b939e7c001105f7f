"""The operator's policy test kit: prove that every rule you write can fire (issue 4, item 7).

    quorumgate policy test FILE [--json]

A policy file is TOML: sinks, tools, agents with their mandates, optional envelopes and
delegations, and a list of calls, each with the verdict it must get. The kit runs the
calls through the real governance engine (no cluster, no network, no clock), compares, and
warns about every mandate entry that no call ever makes fire - a rule without a test that
proves it can fire is a rule nobody knows works.

Operators write names, never keys: every key is derived from the name (a fixed seed per
name), so a file means the same thing on every machine. Exit codes: 0 when every
expectation holds, 1 when any fails, 2 when the file is malformed (the message names the
line, or the field, that is wrong).

File shape (see sidecar/examples/policy.toml for a complete example)::

    [settings]                      # optional: chain_id and any EngineConfig limit
    latch_halt_threshold = 3

    [sinks]
    payments = {}

    [tools."payments.refund"]
    mode = "user_confirm"           # read | direct | user_confirm | owner_confirm
    sink = "payments"
    schemes = ["https"]             # target schemes; [] for a tool without a target
    min_tier = "master"             # delegate | master; a confirm-gated tool must say
    args = { amount = "amount", memo = "text" }   # optional: the plain arguments by role
                                    # (identity | recipient | amount | credential | text)
    direct_override = false         # a direct tool taking recipient/amount/credential
    status = false                  # a status tool binds to the caller, takes nothing
    target_optional = false         # true: a call may leave the main target out
    roles = { grantee = { schemes = ["mailto"], max = 4 } }   # further targets by role
    envelopes = { card = { kind = "card", verified = true } }

    [principals]                    # the people agents act for (authority version 2):
    dana = {}                       # only they answer their agents' cards; on a live
                                    # cluster (policy plan/apply) each new sink, principal
                                    # and agent gives `public_key = "<hex>"`; principals
                                    # may name `deputies = ["..."]`

    [agents.support]
    principal = "dana"              # optional: without one, the owner answers its cards
    allowed_tools = ["kb.search"]   # a list, [] for nothing, or "unrestricted" (null)
    enforcement = "enforce"         # enforce | observe
    suspended = false
    delegation_policy = "attenuated"
    max_delegation_depth = 1

    [agents.support.rules."kb.search"]   # optional; with rules, every allowed tool has
    targets = [                          # an entry (["any"]: any target, explicitly)
        { host_suffix = "kb.example" },  # exact | prefix | host | host_suffix | set
        { set = "extra_sites", mode = "user_confirm" },  # mode: what a match runs as
        { any = true, role = "grantee" },  # role: judges further targets in that role
    ]                                    # ({ any = true, mode = "..." } for any target)
    args = { limit = { max = 50 }, lang = { one_of = ["de", "en"] }, q = { max_chars = 200 } }

    [sets.support]                  # named sets of an agent, read by `set` rules
    extra_sites = [{ host = "wiki.example.org" }, { prefix = "https://x.example/pub" }]

    [envelopes.support-card]        # sealed to its sinks with a placeholder value
    owner = "support"
    kind = "card"
    sinks = ["payments"]
    verified = false                # true: sealed by the owner, as a verified contact

    [delegations.support-helper]
    parent = "support"
    child = "helper"
    run = "run-1"
    tools = ["kb.search"]           # optional: the parent's whole scope when absent
    expires_in_ms = 600000
    parent_grant = "another-delegation"   # optional
    rules = { "kb.search" = { targets = [{ host = "kb.example" }] } }  # optional, narrows
    expect = "applied"              # optional: applied (default) | rejected
    reason = "ok"                   # optional

    [[calls]]
    name = "support searches the knowledge base"
    agent = "support"
    tool = "kb.search"
    target = "https://kb.example/refunds"
    also = { grantee = ["mailto:ann@kb.example"] }   # further targets, by role
    run = "run-1"                   # default run-1
    args = { query = "refund policy" }
    handles = { card = "support-card" }
    via = "support-helper"          # act under this delegation
    advance_ms = 1000               # block time before this call
    expect = "allow"                # allow | flag | deny | pending
    reason = "ok"                   # optional
    confirm = { by = "owner", expect = "allow" }  # optional, for a pending call;
                                    # by: "principal" (whom the card names), "owner",
                                    # or an agent's or a principal's name;
                                    # digest = "wrong" sends a wrong card digest;
                                    # reject = true declines the card
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from nacl.public import PrivateKey, SealedBox
from nacl.signing import SigningKey

from quorumgate.proto import names, tx
from quorumgate.proto.chainversions import split_authority
from quorumgate.proto.model import (
    SETTING_NAMES,
    Admin,
    ArgCheck,
    ArgRole,
    ArgSpec,
    Argument,
    ArgumentRule,
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
    RoleTarget,
    RuleKind,
    SealedValue,
    SealEnvelope,
    SetEntries,
    SetMandate,
    SetSettings,
    TargetRule,
    TargetSlot,
    Tier,
    ToolMode,
    ToolRules,
    ToolSpec,
    TxPayload,
)
from quorumgate.proto.runs import RunLabels
from quorumgate.sidecar.engine.core import Engine, EngineConfig
from quorumgate.sidecar.engine.rules import rule_matches
from quorumgate.sidecar.engine.statements import OWNER_PRINCIPAL, PRINCIPAL_PREFIX, Verdict
from quorumgate.sidecar.engine.targets import UNCHECKED_TARGET, split_call

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_MALFORMED = 2

SEED = b"quorumgate/policykit/v1/"
START_MS = 1_700_000_000_000
STEP_MS = 1_000
DEFAULT_RUN = "run-1"
UNRESTRICTED = "unrestricted"
CALL_OUTCOMES = ("allow", "flag", "deny", "pending")
SETUP_OUTCOMES = ("applied", "rejected")
# Reasons a call can only get after its scope check passed: the mandate entry fired.
_AFTER_SCOPE = frozenset(
    {
        Reason.OK, Reason.CONFIRMATION_REQUIRED, Reason.TIER_INSUFFICIENT,
        Reason.MALFORMED_TARGET, Reason.TARGET_SCHEME_NOT_ALLOWED,
        Reason.CROSS_PRINCIPAL_TARGET, Reason.MALFORMED_ARGUMENT,
        Reason.AMBIENT_IDENTITY_ARGUMENT, Reason.ENVELOPE_REQUIRED, Reason.HANDLE_VIOLATION,
        Reason.HANDLE_KIND_MISMATCH, Reason.STATUS_TOOL_ARGUMENT, Reason.PENDING_LIMIT,
    }
)  # fmt: skip
_OUT_OF_SCOPE = frozenset({Reason.OUT_OF_SCOPE, Reason.OUT_OF_SCOPE_OBSERVED, Reason.REPEAT_DENIED})
_CONFIG_FIELDS = frozenset(
    f.name
    for f in dataclasses.fields(EngineConfig)
    if f.name not in ("chain_id", "owner_public_key")
)
TOP_FIELDS = (
    "settings", "sinks", "tools", "principals", "agents", "sets", "envelopes", "delegations",
    "calls",
)  # fmt: skip
TOOL_FIELDS = (
    "mode", "sink", "schemes", "min_tier", "status", "envelopes", "args", "direct_override",
    "roles", "target_optional",
)  # fmt: skip
AGENT_FIELDS = (
    "allowed_tools", "enforcement", "suspended", "delegation_policy", "max_delegation_depth",
    "rules", "principal", "public_key",
)  # fmt: skip
RULES_FIELDS = ("targets", "args")
TARGET_RULE_KINDS = tuple(k.value for k in RuleKind if k is not RuleKind.ANY)
ARG_RULE_CHECKS = tuple(c.value for c in ArgCheck)
ENVELOPE_FIELDS = ("owner", "kind", "sinks", "verified")
DELEGATION_FIELDS = (
    "parent", "child", "run", "tools", "expires_in_ms", "parent_grant", "expect", "reason",
    "rules",
)  # fmt: skip
CALL_FIELDS = (
    "name", "agent", "tool", "target", "run", "args", "handles", "via", "advance_ms", "expect",
    "reason", "confirm", "also",
)  # fmt: skip
CONFIRM_FIELDS = ("by", "expect", "reason", "digest", "after_ms", "reject")


class PolicyFileError(ValueError):
    """The file cannot be read as a policy: the message names the line or the field."""


def _key(kind: str, name: str) -> bytes:
    return hashlib.sha256(SEED + kind.encode() + b"/" + name.encode()).digest()


def agent_key(name: str) -> SigningKey:
    return SigningKey(_key("agent", name))


def principal_key(name: str) -> SigningKey:
    return SigningKey(_key("principal", name))


def owner_key() -> SigningKey:
    return SigningKey(_key("owner", "owner"))


def sink_key(name: str) -> PrivateKey:
    return PrivateKey(_key("sink", name))


# ------------------------------------------------------------------------ the file


class _Table:
    """Typed, strict access to one TOML table; unknown keys are errors (they are typos)."""

    def __init__(self, data: object, where: str, fields: tuple[str, ...] | None) -> None:
        if not isinstance(data, dict):
            raise PolicyFileError(f"{where}: must be a table")
        self.data: dict[str, Any] = data
        self.where = where
        if fields is not None:
            unknown = sorted(set(data) - set(fields))
            if unknown:
                raise PolicyFileError(f"{where}: unknown field {unknown[0]!r}")

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def _fail(self, key: str, message: str) -> PolicyFileError:
        return PolicyFileError(f"{self.where}.{key}: {message}")

    def text(self, key: str, default: str | None = None) -> str:
        value = self.get(key)
        if value is None:
            if default is None:
                raise self._fail(key, "is required")
            return default
        if not isinstance(value, str):
            raise self._fail(key, f"must be a string, not {type(value).__name__}")
        return value

    def optional_text(self, key: str) -> str | None:
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self._fail(key, f"must be a string, not {type(value).__name__}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: str | None = None) -> str:
        value = self.text(key, default)
        if value not in options:
            raise self._fail(key, f"must be one of {', '.join(options)}; got {value!r}")
        return value

    def boolean(self, key: str, default: bool = False) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, "must be true or false")
        return value

    def integer(self, key: str, default: int | None = None) -> int | None:
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "must be an integer")
        return value

    def texts(self, key: str, default: list[str] | None = None) -> list[str] | None:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(key, "must be a list of strings")
        return list(value)

    def table(self, key: str) -> dict[str, Any]:
        value = self.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._fail(key, "must be a table")
        return value


@dataclass
class _CallSpec:
    index: int
    name: str
    agent: str
    tool: str
    target: str
    also: list[tuple[str, str]]
    run: str
    args: dict[str, str]
    handles: dict[str, str]
    via: str | None
    advance_ms: int
    expect: str
    reason: str | None
    confirm: dict[str, Any] | None


@dataclass
class Policy:
    settings: dict[str, int]
    chain_id: str
    sinks: list[str]
    tools: dict[str, ToolSpec]
    agents: dict[str, Mandate]
    envelopes: dict[str, dict[str, Any]]
    delegations: dict[str, dict[str, Any]]
    calls: list[_CallSpec] = field(default_factory=list)
    sets: dict[tuple[str, str], tuple[TargetRule, ...]] = field(default_factory=dict)
    principals: list[str] = field(default_factory=list)
    agent_principal: dict[str, str] = field(default_factory=dict)
    # For `policy plan` on a live cluster (the test derives keys from names): the public
    # keys the file gives, by (sink | principal | agent, name); each principal's deputies.
    public_keys: dict[tuple[str, str], bytes] = field(default_factory=dict)
    deputies: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _tool_name(raw: str, where: str) -> str:
    name = names.canonical_tool_name(raw)
    if name is None:
        raise PolicyFileError(f"{where}: {raw!r} is not a valid tool name")
    return name


def _ident(raw: str, where: str) -> str:
    if not names.is_agent_id(raw):
        raise PolicyFileError(f"{where}: {raw!r} must match {names.AGENT_ID_RE.pattern}")
    return raw


def _public_key(table: _Table, size: int) -> bytes | None:
    """The optional `public_key` of a sink, principal or agent: hex of `size` bytes."""
    raw = table.optional_text("public_key")
    if raw is None:
        return None
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) != size:
        raise PolicyFileError(f"{table.where}.public_key: {size} bytes in hex")
    return key


def _reason(raw: str | None, where: str) -> str | None:
    if raw is not None and raw not in {r.value for r in Reason}:
        raise PolicyFileError(f"{where}.reason: unknown reason code {raw!r}")
    return raw


def parse_target_rule(raw: object, where: str) -> TargetRule:
    """`"any"`, or a table with one of exact / prefix / host / host_suffix / set and an
    optional `mode`."""
    if raw == RuleKind.ANY.value:
        return TargetRule(RuleKind.ANY)
    t = _Table(raw, where, (*TARGET_RULE_KINDS, RuleKind.ANY.value, "mode", "role"))
    kinds = [k for k in (*TARGET_RULE_KINDS, RuleKind.ANY.value) if k in t.data]
    if len(kinds) != 1:
        raise PolicyFileError(
            f'{where}: "any", or a table with one of any, {", ".join(TARGET_RULE_KINDS)}'
        )
    mode_text = t.optional_text("mode")
    modes = tuple(m.value for m in ToolMode)
    if mode_text is not None and mode_text not in modes:
        raise PolicyFileError(f"{where}.mode: must be one of {', '.join(modes)}")
    mode = None if mode_text is None else ToolMode(mode_text)
    role = t.text("role", "")
    try:
        if kinds[0] == RuleKind.ANY.value:
            if t.get("any") is not True:
                raise PolicyFileError(f"{where}.any: must be true")
            return TargetRule(RuleKind.ANY, mode=mode, role=role)
        return TargetRule(RuleKind(kinds[0]), t.text(kinds[0]), mode, role)
    except ValueError as exc:
        if isinstance(exc, PolicyFileError):
            raise
        raise PolicyFileError(f"{where}: {exc}") from None


def _parse_argument_rule(arg: str, raw: object, where: str) -> ArgumentRule:
    name = names.canonical_argument_name(arg)
    if name is None:
        raise PolicyFileError(f"{where}: {arg!r} is not an argument name")
    t = _Table(raw, where, ARG_RULE_CHECKS)
    if len(t.data) != 1:
        raise PolicyFileError(f"{where}: one of {', '.join(ARG_RULE_CHECKS)}")
    check = ArgCheck(next(iter(t.data)))
    try:
        if check is ArgCheck.MAX:
            value = t.get("max")
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise PolicyFileError(f'{where}.max: an integer, or a decimal as a string ("9.50")')
            return ArgumentRule(name, check, number=str(value))
        if check is ArgCheck.ONE_OF:
            values = t.texts("one_of") or []
            return ArgumentRule(name, check, values=tuple(sorted(set(values))))
        count = t.integer("max_chars")
        return ArgumentRule(name, check, count=count or 0)
    except ValueError as exc:
        if isinstance(exc, PolicyFileError):
            raise
        raise PolicyFileError(f"{where}: {exc}") from None


def parse_tool_rules(
    table: dict[str, Any], where: str, allowed: tuple[str, ...] | None
) -> tuple[ToolRules, ...]:
    """`rules."TOOL" = { targets = [...], args = { NAME = { max = 500 } } }` for each
    tool. With rules at all, every allowed tool needs an entry: `targets = ["any"]` says
    "any target" explicitly."""
    out: dict[str, ToolRules] = {}
    for raw_tool, body in table.items():
        here = f"{where}.rules.{raw_tool}"
        tool = _tool_name(raw_tool, here)
        if allowed is not None and tool not in allowed:
            raise PolicyFileError(f"{here}: {tool} is not in allowed_tools")
        r = _Table(body, here, RULES_FIELDS)
        raw_targets = r.get("targets")
        if not isinstance(raw_targets, list) or not raw_targets:
            raise PolicyFileError(f'{here}.targets: a non-empty list (["any"] for any target)')
        targets = tuple(
            parse_target_rule(item, f"{here}.targets[{k}]") for k, item in enumerate(raw_targets)
        )
        args = tuple(
            sorted(
                (
                    _parse_argument_rule(arg, spec, f"{here}.args.{arg}")
                    for arg, spec in r.table("args").items()
                ),
                key=lambda rule: rule.name,
            )
        )
        try:
            out[tool] = ToolRules(tool, targets, args)
        except ValueError as exc:
            raise PolicyFileError(f"{here}: {exc}") from None
    if out and allowed is not None:
        missing = sorted(set(allowed) - set(out))
        if missing:
            raise PolicyFileError(
                f'{where}.rules: no entry for {missing[0]}; write targets = ["any"] to allow '
                "any target explicitly"
            )
    return tuple(out[tool] for tool in sorted(out))


def parse_sets(table: dict[str, Any]) -> dict[tuple[str, str], tuple[TargetRule, ...]]:
    """`[sets.AGENT] NAME = [ { exact = "..." }, { host = "..." } ]`."""
    out: dict[tuple[str, str], tuple[TargetRule, ...]] = {}
    for agent, body in table.items():
        where = f"sets.{agent}"
        owner = _ident(agent, where)
        for name, entries in _Table(body, where, None).data.items():
            here = f"{where}.{name}"
            if not names.is_set_name(name):
                raise PolicyFileError(f"{here}: a set name matches {names.SET_NAME_RE.pattern}")
            if not isinstance(entries, list):
                raise PolicyFileError(f"{here}: a list of entries")
            rules = {
                (rule.kind.value, rule.value): rule
                for rule in (
                    parse_target_rule(item, f"{here}[{k}]") for k, item in enumerate(entries)
                )
            }
            try:
                out[(owner, name)] = SetEntries(
                    owner, name, tuple(rules[key] for key in sorted(rules))
                ).entries
            except ValueError as exc:
                raise PolicyFileError(f"{here}: {exc}") from None
    return out


def _parse_policy(data: dict[str, Any]) -> Policy:
    top = _Table(data, "file", TOP_FIELDS)
    settings_table = _Table(top.table("settings"), "settings", None)
    chain_id = settings_table.text("chain_id", "policy-test")
    settings: dict[str, int] = {}
    for key in sorted(settings_table.data):
        if key == "chain_id":
            continue
        if key not in _CONFIG_FIELDS and key not in SETTING_NAMES:
            raise PolicyFileError(f"settings.{key}: not an engine limit or setting")
        value = settings_table.integer(key)
        assert value is not None
        settings[key] = value

    public_keys: dict[tuple[str, str], bytes] = {}
    sinks = []
    for name, body in top.table("sinks").items():
        sinks.append(_ident(name, f"sinks.{name}"))
        key = _public_key(_Table(body, f"sinks.{name}", ("public_key",)), 32)
        if key is not None:
            public_keys[("sink", name)] = key

    tools: dict[str, ToolSpec] = {}
    for raw, body in top.table("tools").items():
        where = f"tools.{raw}"
        t = _Table(body, where, TOOL_FIELDS)
        envelope_args = []
        for arg, env in sorted(t.table("envelopes").items()):
            e = _Table(env, f"{where}.envelopes.{arg}", ("kind", "verified"))
            arg_name = names.canonical_argument_name(arg)
            if arg_name is None:
                raise PolicyFileError(f"{where}.envelopes: {arg!r} is not an argument name")
            envelope_args.append(EnvelopeArg(arg_name, e.text("kind"), e.boolean("verified")))
        declared = []
        for arg, role in sorted(t.table("args").items()):
            arg_name = names.canonical_argument_name(arg)
            roles = tuple(r.value for r in ArgRole)
            if arg_name is None or not isinstance(role, str) or role not in roles:
                raise PolicyFileError(f"{where}.args.{arg}: a role, one of {', '.join(roles)}")
            declared.append(ArgSpec(arg_name, ArgRole(role)))
        tier = t.optional_text("min_tier")
        if tier is not None and tier not in ("delegate", "master"):
            raise PolicyFileError(f"{where}.min_tier: delegate or master")
        slots = []
        for role, slot in sorted(t.table("roles").items()):
            r = _Table(slot, f"{where}.roles.{role}", ("schemes", "max"))
            try:
                slots.append(
                    TargetSlot(
                        role, tuple(sorted(set(r.texts("schemes") or []))), r.integer("max", 1) or 0
                    )
                )
            except ValueError as exc:
                raise PolicyFileError(f"{where}.roles.{role}: {exc}") from None
        try:
            spec = ToolSpec(
                name=_tool_name(raw, where),
                mode=ToolMode(t.choice("mode", tuple(m.value for m in ToolMode), "direct")),
                sink=t.optional_text("sink"),
                target_schemes=tuple(sorted(set(t.texts("schemes", ["https"]) or []))),
                envelope_args=tuple(sorted(envelope_args, key=lambda a: a.name)),
                min_tier=Tier(tier or "delegate"),
                binds_caller=t.boolean("status"),
                arguments=tuple(declared),
                direct_override=t.boolean("direct_override"),
                min_tier_declared=tier is not None,
                target_roles=tuple(slots),
                target_optional=t.boolean("target_optional"),
            )
        except ValueError as exc:
            if isinstance(exc, PolicyFileError):
                raise
            raise PolicyFileError(f"{where}: {exc}") from None
        tools[spec.name] = spec

    principals = []
    deputies: dict[str, tuple[str, ...]] = {}
    for name, body in top.table("principals").items():
        where = f"principals.{name}"
        principals.append(_ident(name, where))
        pt = _Table(body, where, ("public_key", "deputies"))
        key = _public_key(pt, 32)
        if key is not None:
            public_keys[("principal", name)] = key
        deputies[name] = tuple(sorted(set(pt.texts("deputies") or [])))
    for name, named in deputies.items():
        for deputy in named:
            if deputy not in principals or deputy == name:
                raise PolicyFileError(
                    f"principals.{name}.deputies: {deputy!r} is not another principal"
                )
    if principals and not split_authority(settings.get("authority_version", 2)):
        raise PolicyFileError("principals: a chain of authority_version 1 has none")
    agent_principal: dict[str, str] = {}
    agents: dict[str, Mandate] = {}
    for raw, body in top.table("agents").items():
        where = f"agents.{raw}"
        a = _Table(body, where, AGENT_FIELDS)
        key = _public_key(a, 32)
        if key is not None:
            public_keys[("agent", raw)] = key
        principal = a.optional_text("principal")
        if principal is not None:
            if principal not in principals:
                raise PolicyFileError(f"{where}.principal: unknown principal {principal!r}")
            agent_principal[raw] = principal
        if raw in principals:
            raise PolicyFileError(f"{where}: {raw!r} is also a principal's name")
        allowed_raw = a.get("allowed_tools")
        if allowed_raw is None:
            raise PolicyFileError(
                f'{where}.allowed_tools: is required (a list, [] for nothing, or "{UNRESTRICTED}")'
            )
        if allowed_raw == UNRESTRICTED:
            allowed: tuple[str, ...] | None = None
        elif isinstance(allowed_raw, list) and all(isinstance(x, str) for x in allowed_raw):
            allowed = tuple(sorted({_tool_name(x, f"{where}.allowed_tools") for x in allowed_raw}))
        else:
            raise PolicyFileError(
                f'{where}.allowed_tools: must be a list of tool names or "{UNRESTRICTED}"'
            )
        depth = a.integer("max_delegation_depth")
        if depth is not None and depth < 0:
            raise PolicyFileError(f"{where}.max_delegation_depth: must be 0 or more")
        agents[_ident(raw, where)] = Mandate(
            allowed_tools=allowed,
            enforcement=Enforcement(a.choice("enforcement", ("enforce", "observe"), "enforce")),
            suspended=a.boolean("suspended"),
            delegation_policy=DelegationPolicy(
                a.choice("delegation_policy", ("attenuated", "none"), "none")
            ),
            max_delegation_depth=depth,
            rules=parse_tool_rules(a.table("rules"), where, allowed),
        )
    sets = parse_sets(top.table("sets"))
    for owner, _ in sets:
        if owner not in agents:
            raise PolicyFileError(f"sets.{owner}: unknown agent")

    envelopes: dict[str, dict[str, Any]] = {}
    for name, body in top.table("envelopes").items():
        where = f"envelopes.{name}"
        e = _Table(body, where, ENVELOPE_FIELDS)
        owner = e.text("owner")
        if owner not in agents:
            raise PolicyFileError(f"{where}.owner: unknown agent {owner!r}")
        kind = e.text("kind")
        if not names.is_kind(kind):
            raise PolicyFileError(f"{where}.kind: must match {names.KIND_RE.pattern}")
        env_sinks = e.texts("sinks") or []
        for sink in env_sinks:
            if sink not in sinks:
                raise PolicyFileError(f"{where}.sinks: unknown sink {sink!r}")
        if not env_sinks:
            raise PolicyFileError(f"{where}.sinks: needs at least one sink")
        envelopes[name] = {
            "owner": owner, "kind": kind, "sinks": env_sinks, "verified": e.boolean("verified"),
        }  # fmt: skip

    delegations: dict[str, dict[str, Any]] = {}
    for name, body in top.table("delegations").items():
        where = f"delegations.{name}"
        d = _Table(body, where, DELEGATION_FIELDS)
        spec_d: dict[str, Any] = {
            "parent": d.text("parent"),
            "child": d.text("child"),
            "run": d.text("run", DEFAULT_RUN),
            "tools": d.texts("tools"),
            "expires_in_ms": d.integer("expires_in_ms", 600_000),
            "parent_grant": d.optional_text("parent_grant"),
            "expect": d.choice("expect", SETUP_OUTCOMES, "applied"),
            "reason": _reason(d.optional_text("reason"), where),
        }
        grant_tools = spec_d["tools"]
        spec_d["rules"] = parse_tool_rules(
            d.table("rules"),
            where,
            None
            if grant_tools is None
            else tuple(sorted({_tool_name(t, f"{where}.tools") for t in grant_tools})),
        )
        for role in ("parent", "child"):
            if spec_d[role] not in agents:
                raise PolicyFileError(f"{where}.{role}: unknown agent {spec_d[role]!r}")
        if spec_d["parent_grant"] is not None and spec_d["parent_grant"] not in delegations:
            raise PolicyFileError(f"{where}.parent_grant: must name an earlier delegation")
        if spec_d["tools"] is not None:
            spec_d["tools"] = sorted({_tool_name(t, f"{where}.tools") for t in spec_d["tools"]})
        delegations[name] = spec_d

    raw_calls = top.get("calls")
    if raw_calls is None:
        raw_calls = []
    if not isinstance(raw_calls, list):
        raise PolicyFileError("calls: must be an array of tables ([[calls]])")
    calls = []
    for index, body in enumerate(raw_calls):
        where = f"calls[{index}]"
        c = _Table(body, where, CALL_FIELDS)
        agent = c.text("agent")
        if agent not in agents:
            raise PolicyFileError(f"{where}.agent: unknown agent {agent!r}")
        args = c.table("args")
        handles = c.table("handles")
        also: list[tuple[str, str]] = []
        for role, values in sorted(c.table("also").items()):
            items = [values] if isinstance(values, str) else values
            if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
                raise PolicyFileError(f"{where}.also.{role}: a target, or a list of targets")
            also.extend((role, value) for value in items)
        for arg, value in args.items():
            if not isinstance(value, str):
                raise PolicyFileError(f"{where}.args.{arg}: values are strings")
        for arg, env in handles.items():
            if env not in envelopes:
                raise PolicyFileError(f"{where}.handles.{arg}: unknown envelope {env!r}")
        via = c.optional_text("via")
        if via is not None and via not in delegations:
            raise PolicyFileError(f"{where}.via: unknown delegation {via!r}")
        confirm = c.get("confirm")
        if confirm is not None:
            ct = _Table(confirm, f"{where}.confirm", CONFIRM_FIELDS)
            by = ct.text("by", "principal")
            if by not in ("principal", "owner") and by not in agents and by not in principals:
                raise PolicyFileError(
                    f"{where}.confirm.by: principal, owner, an agent's or a principal's name"
                )
            confirm = {
                "by": by,
                "reject": ct.boolean("reject"),
                "expect": ct.choice("expect", (*CALL_OUTCOMES, "rejected"), "allow"),
                "reason": _reason(ct.optional_text("reason"), f"{where}.confirm"),
                "digest": ct.choice("digest", ("card", "wrong"), "card"),
                "after_ms": ct.integer("after_ms", STEP_MS),
            }
        advance = c.integer("advance_ms", STEP_MS)
        assert advance is not None
        if advance < 0:
            raise PolicyFileError(f"{where}.advance_ms: block time never goes back")
        expect = c.choice("expect", CALL_OUTCOMES)
        if confirm is not None and expect != "pending":
            raise PolicyFileError(f"{where}.confirm: only a call expected pending is confirmed")
        calls.append(
            _CallSpec(
                index=index,
                name=c.text("name", f"call {index}"),
                agent=agent,
                tool=c.text("tool"),
                target=c.text("target", ""),
                also=also,
                run=c.text("run", DEFAULT_RUN),
                args={k: str(v) for k, v in args.items()},
                handles=dict(handles),
                via=via,
                advance_ms=advance,
                expect=expect,
                reason=_reason(c.optional_text("reason"), where),
                confirm=confirm,
            )
        )
    return Policy(
        settings, chain_id, sinks, tools, agents, envelopes, delegations, calls, sets,
        principals, agent_principal, public_keys, deputies,
    )  # fmt: skip


# ------------------------------------------------------------------------ running


@dataclass
class CallResult:
    name: str
    expect: str
    expect_reason: str | None
    outcome: str
    reason: str
    passed: bool
    confirm: dict[str, Any] | None = None


@dataclass
class Report:
    path: str
    results: list[CallResult]
    warnings: list[str]
    setup_failures: list[str]

    @property
    def ok(self) -> bool:
        return not self.setup_failures and all(r.passed for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.path,
            "ok": self.ok,
            "passed": sum(r.passed for r in self.results),
            "failed": sum(not r.passed for r in self.results) + len(self.setup_failures),
            "setup_failures": self.setup_failures,
            "results": [dataclasses.asdict(r) for r in self.results],
            "warnings": self.warnings,
        }


class _Runner:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.owner = owner_key()
        try:
            config = EngineConfig(
                chain_id=policy.chain_id,
                owner_public_key=bytes(self.owner.verify_key),
                **{k: v for k, v in policy.settings.items() if k in _CONFIG_FIELDS},
            )
        except ValueError as exc:
            raise PolicyFileError(f"settings: {exc}") from None
        self.engine = Engine(config)
        self.height = 0
        self.time_ms = START_MS
        self.nonces: dict[bytes, int] = {}
        self.keys = {name: agent_key(name) for name in policy.agents}
        self.handles: dict[str, str] = {}
        self.grants: dict[str, bytes] = {}
        self.fired: set[tuple[str, str]] = set()  # (agent, rule)
        self.run_labels: dict[bytes, RunLabels] = {}  # signer -> its labels' runs

    def _signed(self, key: SigningKey, payload: TxPayload) -> bytes:
        signer = bytes(key.verify_key)
        self.nonces[signer] = self.nonces.get(signer, 0) + 1
        nonce = self.nonces[signer]
        return tx.build(self.policy.chain_id, nonce, self._bind_run(signer, payload, nonce), key)

    def _bind_run(self, signer: bytes, payload: TxPayload, nonce: int) -> TxPayload:
        """Runs are named by label in the file; on chains of authority version 2 each label
        is the run its signer's first transaction in it opened (proto/runs.py), as an SDK
        client does; under a grant, the run owner's run of that label."""
        if not self.engine.config.split_authority:
            return payload
        if not isinstance(payload, Proposal | Delegate):
            return payload
        grant_id = payload.grant if isinstance(payload, Proposal) else payload.parent_grant
        if grant_id is None:
            run = self.run_labels.setdefault(signer, RunLabels()).bind(payload.run_id, nonce)
        else:
            grant = self.engine.state.grants.get(grant_id)
            owner = bytes(self.keys[grant.run_owner].verify_key) if grant is not None else b""
            labels = self.run_labels.get(owner)
            run = (labels.get(payload.run_id) if labels is not None else None) or payload.run_id
        return dataclasses.replace(payload, run_id=run)

    def block(self, txs: list[bytes], advance_ms: int = STEP_MS) -> list[Verdict]:
        self.height += 1
        self.time_ms += advance_ms
        return list(self.engine.execute_block(self.height, self.time_ms, txs).verdicts)

    def setup(self) -> list[str]:
        p = self.policy
        admin: list[tuple[str, TxPayload]] = []
        # settings only the log holds (the quotas): set there, as `policy apply` would
        logged = tuple((k, v) for k, v in sorted(p.settings.items()) if k not in _CONFIG_FIELDS)
        if logged:
            admin.append(("settings", Admin(SetSettings(values=logged))))
        for sink in p.sinks:
            public = bytes(sink_key(sink).public_key)
            admin.append((f"sinks.{sink}", Admin(RegisterSink(sink, public))))
        for name, spec in p.tools.items():
            admin.append((f"tools.{name}", Admin(RegisterTool(spec))))
        for name in p.principals:
            public = bytes(principal_key(name).verify_key)
            admin.append((f"principals.{name}", Admin(RegisterPrincipal(name, public))))
        for name, mandate in p.agents.items():
            key = bytes(self.keys[name].verify_key)
            principal = p.agent_principal.get(name, "")
            admin.append((f"agents.{name}", Admin(RegisterAgent(name, key, principal))))
            admin.append((f"agents.{name}", Admin(SetMandate(name, mandate))))
        for (owner, name), entries in sorted(p.sets.items()):
            admin.append((f"sets.{owner}.{name}", Admin(SetEntries(owner, name, entries))))
        verdicts = self.block([self._signed(self.owner, payload) for _, payload in admin])
        for (where, _), verdict in zip(admin, verdicts, strict=True):
            if verdict.outcome is not Outcome.APPLIED:
                raise PolicyFileError(f"{where}: the engine refuses it ({verdict.reason.value})")

        for name, env in p.envelopes.items():
            placeholder = f"policykit placeholder for {name}".encode()
            sealed = tuple(
                SealedValue(sink, SealedBox(sink_key(sink).public_key).encrypt(placeholder))
                for sink in env["sinks"]
            )
            payload: TxPayload
            if env["verified"]:
                payload = SealEnvelope(env["kind"], sealed, owner_principal=env["owner"])
                signer = self.owner
            else:
                payload = SealEnvelope(env["kind"], sealed)
                signer = self.keys[env["owner"]]
            verdict = self.block([self._signed(signer, payload)])[0]
            if verdict.outcome is not Outcome.APPLIED:
                raise PolicyFileError(
                    f"envelopes.{name}: the engine refuses it ({verdict.reason.value})"
                )
            self.handles[name] = verdict.subject

        failures = []
        for name, d in p.delegations.items():
            parent_grant = self.grants.get(d["parent_grant"]) if d["parent_grant"] else None
            payload = Delegate(
                child=bytes(self.keys[d["child"]].verify_key),
                run_id=d["run"],
                tools=None if d["tools"] is None else tuple(d["tools"]),
                expires_at_ms=max(1, self.time_ms + STEP_MS + d["expires_in_ms"]),
                parent_grant=parent_grant,
                rules=d["rules"],
            )
            verdict = self.block([self._signed(self.keys[d["parent"]], payload)])[0]
            if verdict.outcome is Outcome.APPLIED:
                self.grants[name] = verdict.tx_id
            got = verdict.outcome.value
            if got != d["expect"] or (d["reason"] and d["reason"] != verdict.reason.value):
                failures.append(
                    f"delegations.{name}: expected {d['expect']}"
                    + (f" ({d['reason']})" if d["reason"] else "")
                    + f", got {got} ({verdict.reason.value})"
                )
        return failures

    def _chain(self, via: str | None) -> list[str]:
        agents = []
        while via is not None:
            d = self.policy.delegations[via]
            agents.append(d["parent"])
            via = d["parent_grant"]
        return agents

    def run_call(self, call: _CallSpec) -> CallResult:
        arguments = [Argument(name=k, text=v) for k, v in sorted(call.args.items())]
        arguments += [
            Argument(name=k, handle=self.handles[v]) for k, v in sorted(call.handles.items())
        ]
        grant = None
        if call.via is not None:
            # an expected-refused delegation has no grant id: a random-looking stand-in
            grant = self.grants.get(call.via, hashlib.sha256(call.via.encode()).digest())
        try:
            further = tuple(RoleTarget(role, value) for role, value in call.also)
            payload = Proposal(call.run, call.tool, call.target, tuple(arguments), grant, further)
        except ValueError as exc:
            raise PolicyFileError(f"calls[{call.index}]: {exc}") from None
        verdict = self.block([self._signed(self.keys[call.agent], payload)], call.advance_ms)[0]
        self._record_firing(call, verdict)
        passed = verdict.outcome.value == call.expect and (
            call.reason is None or call.reason == verdict.reason.value
        )
        result = CallResult(
            call.name, call.expect, call.reason, verdict.outcome.value, verdict.reason.value, passed
        )
        if call.confirm is not None and verdict.outcome is Outcome.PENDING:
            result.confirm = self._confirm(call, verdict)
            result.passed = result.passed and result.confirm["passed"]
        return result

    def _confirm(self, call: _CallSpec, pending: Verdict) -> dict[str, Any]:
        spec = call.confirm
        assert spec is not None
        by = spec["by"]
        signer = self._confirmer(call, pending, by)
        digest = pending.card_digest if spec["digest"] == "card" else hashlib.sha256(b"x").digest()
        payload = Confirm(pending.proposal_id, digest, reject=spec["reject"])
        verdict = self.block([self._signed(signer, payload)], spec["after_ms"])[0]
        passed = verdict.outcome.value == spec["expect"] and (
            spec["reason"] is None or spec["reason"] == verdict.reason.value
        )
        return {
            "by": by, "expect": spec["expect"], "expect_reason": spec["reason"],
            "outcome": verdict.outcome.value, "reason": verdict.reason.value, "passed": passed,
        }  # fmt: skip

    def _confirmer(self, call: _CallSpec, pending: Verdict, by: str) -> SigningKey:
        """`by`: "owner", an agent's or a principal's name, or "principal": the one the
        card names (authority version 2), or the proposing agent (version 1)."""
        if by == "principal":
            confirmer = pending.card.confirmer if pending.card is not None else ""
            if not confirmer:
                return self.keys[call.agent]
            if confirmer == OWNER_PRINCIPAL:
                return self.owner
            return principal_key(confirmer.removeprefix(PRINCIPAL_PREFIX))
        if by == "owner":
            return self.owner
        if by in self.policy.principals:
            return principal_key(by)
        return self.keys[by]

    def _record_firing(self, call: _CallSpec, verdict: Verdict) -> None:
        tool = names.canonical_tool_name(call.tool) or call.tool
        involved = [call.agent, *self._chain(call.via)]
        if verdict.reason in _AFTER_SCOPE:
            for agent in involved:
                self.fired.add((agent, f"tool:{tool}"))
        if verdict.reason in _OUT_OF_SCOPE:
            for agent in involved:
                self.fired.add((agent, "out_of_scope"))
        if verdict.reason is Reason.SUSPENDED:
            for agent in involved:
                self.fired.add((agent, "suspended"))
        self.fired.add(("", f"called:{tool}"))
        if call.via is not None:
            self.fired.add(("", f"via:{call.via}"))
        self._record_target_rule(call.agent, tool, verdict)

    def _record_target_rule(self, agent: str, tool: str, verdict: Verdict) -> None:
        """Which of the agent's own target rules for `tool` decided the call: the first
        that matches its canonical target (as the engine reads them), when the call got
        as far as the rules (in scope by tool, the target canonical)."""
        mandate = self.policy.agents.get(agent)
        entry = None if mandate is None else mandate.rules_for(tool)
        reached = verdict.reason in _AFTER_SCOPE or verdict.reason in _OUT_OF_SCOPE
        prefix = tool + " "
        if entry is None or not reached or not verdict.canonical_target.startswith(prefix):
            return
        target, extras = split_call(tool, verdict.canonical_target)
        if target == UNCHECKED_TARGET:
            return
        sets = self.engine.state.sets_of(agent)
        for role, each in (("", target), *extras):  # each target: the first rule of its role
            for index, rule in enumerate(entry.targets):
                if rule.role == role and rule_matches(rule, each, agent, sets):
                    self.fired.add((agent, f"target:{tool}:{index}"))
                    break

    def warnings(self) -> list[str]:
        p = self.policy
        out = []
        for agent, mandate in p.agents.items():
            if mandate.allowed_tools is None:
                if not any(a == agent and r.startswith("tool:") for a, r in self.fired):
                    out.append(f"agents.{agent}.allowed_tools: unrestricted, and no call tests it")
            else:
                for tool in mandate.allowed_tools:
                    if (agent, f"tool:{tool}") not in self.fired:
                        out.append(
                            f'agents.{agent}.allowed_tools["{tool}"]: no call makes this rule fire'
                        )
                if (agent, "out_of_scope") not in self.fired and not mandate.suspended:
                    out.append(
                        f"agents.{agent}.enforcement ({mandate.enforcement.value}): no call "
                        "tries a tool outside the mandate"
                    )
            if mandate.suspended and (agent, "suspended") not in self.fired:
                out.append(f"agents.{agent}.suspended: no call shows the suspension denies")
            for entry in mandate.rules:
                for index, _ in enumerate(entry.targets):
                    if (agent, f"target:{entry.tool}:{index}") not in self.fired:
                        out.append(
                            f'agents.{agent}.rules."{entry.tool}".targets[{index}]: no call '
                            "makes this rule fire"
                        )
        for tool in p.tools:
            if ("", f"called:{tool}") not in self.fired:
                out.append(f"tools.{tool}: no call uses this tool")
        for name in p.delegations:
            if ("", f"via:{name}") not in self.fired and name in self.grants:
                out.append(f"delegations.{name}: no call acts under this delegation")
        return out


def load_policy(path: str) -> Policy:
    """Read and parse a policy file; PolicyFileError when it is malformed."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise PolicyFileError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyFileError(f"{path}: TOML syntax error: {exc}") from None
    return _parse_policy(data)


def check_policy(path: str) -> Report:
    """Run a policy file; PolicyFileError when it is malformed."""
    policy = load_policy(path)
    runner = _Runner(policy)
    setup_failures = runner.setup()
    results = [runner.run_call(call) for call in policy.calls]
    return Report(path, results, runner.warnings(), setup_failures)


def _print_text(report: Report, out: TextIO) -> None:
    write: Callable[[str], object] = out.write
    write(f"policy test: {report.path}\n")
    for failure in report.setup_failures:
        write(f"  FAIL  {failure}\n")
    for r in report.results:
        want = r.expect + (f" ({r.expect_reason})" if r.expect_reason else "")
        got = f"{r.outcome} ({r.reason})"
        line = f"  {'PASS' if r.passed else 'FAIL'}  {r.name}: "
        line += got if r.passed else f"expected {want}, got {got}"
        if r.confirm is not None:
            c = r.confirm
            cwant = c["expect"] + (f" ({c['expect_reason']})" if c["expect_reason"] else "")
            line += f"; confirmed by {c['by']}: {c['outcome']} ({c['reason']})"
            if not c["passed"]:
                line += f", expected {cwant}"
        write(line + "\n")
    if report.warnings:
        write("warnings:\n")
        for warning in report.warnings:
            write(f"  WARN  {warning}\n")
    passed = sum(r.passed for r in report.results)
    failed = len(report.results) - passed + len(report.setup_failures)
    write(
        f"{len(report.results)} calls, {passed} passed, {failed} failed, "
        f"{len(report.warnings)} warnings\n"
    )


def run_policy_test(path: str, *, json_output: bool = False, out: TextIO = sys.stdout) -> int:
    """`quorumgate policy test FILE [--json]`: 0 all hold, 1 some fail, 2 malformed file."""
    try:
        report = check_policy(path)
    except PolicyFileError as exc:
        if json_output:
            out.write(json.dumps({"file": path, "ok": False, "error": str(exc)}, indent=2) + "\n")
        else:
            out.write(f"policy test: malformed policy file\n  {exc}\n")
        return EXIT_MALFORMED
    if json_output:
        out.write(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        _print_text(report, out)
    return EXIT_OK if report.ok else EXIT_FAILED
