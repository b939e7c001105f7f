"""The policy file: the one TOML format `quorumgate policy test` runs (sidecar/policykit.py)
and `policy plan` / `policy apply` make a live cluster match (cluster/ops/policyplan.py).

This module reads and checks the file, and nothing more: `load_policy` gives a `Policy`,
or a `PolicyFileError` whose message names the line, or the field, that is wrong. Unknown
fields are errors (they are typos), and names are checked as the engine checks them, so
that a file either means one thing on every machine or is refused whole.

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
    untrusted = false               # true: its results carry untrusted content (web pages,
                                    # outside mail...): a run that calls it is exposed
                                    # (docs/provenance.md; authority version 4)
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
        { any = true, when_exposed = "user_confirm" },  # the mode once the run is exposed
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
                                    # reject = true declines the card"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from typing import Any

from quorumgate.proto import names
from quorumgate.proto.chainversions import split_authority
from quorumgate.proto.model import (
    SETTING_NAMES,
    ArgCheck,
    ArgRole,
    ArgSpec,
    ArgumentRule,
    DelegationPolicy,
    Enforcement,
    EnvelopeArg,
    Mandate,
    Reason,
    RuleKind,
    SetEntries,
    TargetRule,
    TargetSlot,
    Tier,
    ToolMode,
    ToolRules,
    ToolSpec,
)
from quorumgate.sidecar.engine.core import EngineConfig

STEP_MS = 1_000  # block time before a call, and after a card, unless the file says
DEFAULT_RUN = "run-1"
UNRESTRICTED = "unrestricted"
CALL_OUTCOMES = ("allow", "flag", "deny", "pending")
SETUP_OUTCOMES = ("applied", "rejected")
# The engine limits a file's [settings] may name; the rest of [settings] must be settings
# of the log (SETTING_NAMES).
CONFIG_FIELDS = frozenset(
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
    "roles", "target_optional", "untrusted",
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
class CallSpec:
    """One `[[calls]]` entry: the call the test kit makes and the verdict it must get."""

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
    calls: list[CallSpec] = field(default_factory=list)
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
    t = _Table(
        raw, where, (*TARGET_RULE_KINDS, RuleKind.ANY.value, "mode", "role", "when_exposed")
    )
    kinds = [k for k in (*TARGET_RULE_KINDS, RuleKind.ANY.value) if k in t.data]
    if len(kinds) != 1:
        raise PolicyFileError(
            f'{where}: "any", or a table with one of any, {", ".join(TARGET_RULE_KINDS)}'
        )
    mode = _rule_mode(t, "mode", where)
    exposed = _rule_mode(t, "when_exposed", where)
    role = t.text("role", "")
    try:
        if kinds[0] == RuleKind.ANY.value:
            if t.get("any") is not True:
                raise PolicyFileError(f"{where}.any: must be true")
            return TargetRule(RuleKind.ANY, mode=mode, role=role, when_exposed=exposed)
        return TargetRule(RuleKind(kinds[0]), t.text(kinds[0]), mode, role, exposed)
    except ValueError as exc:
        if isinstance(exc, PolicyFileError):
            raise
        raise PolicyFileError(f"{where}: {exc}") from None


def _rule_mode(t: _Table, key: str, where: str) -> ToolMode | None:
    """A rule's `mode` or `when_exposed` (docs/provenance.md): a tool mode, or absent."""
    text = t.optional_text(key)
    modes = tuple(m.value for m in ToolMode)
    if text is not None and text not in modes:
        raise PolicyFileError(f"{where}.{key}: must be one of {', '.join(modes)}")
    return None if text is None else ToolMode(text)


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


# ------------------------------------------------------------------------ sections
# One function per section of the file, called in the file's order of dependence: each
# later section checks its names against the sections before it.


def _parse_settings(top: _Table) -> tuple[str, dict[str, int]]:
    """`[settings]`: the test chain's id, and engine limits and settings of the log."""
    settings_table = _Table(top.table("settings"), "settings", None)
    chain_id = settings_table.text("chain_id", "policy-test")
    settings: dict[str, int] = {}
    for key in sorted(settings_table.data):
        if key == "chain_id":
            continue
        if key not in CONFIG_FIELDS and key not in SETTING_NAMES:
            raise PolicyFileError(f"settings.{key}: not an engine limit or setting")
        value = settings_table.integer(key)
        assert value is not None
        settings[key] = value
    return chain_id, settings


def _parse_sinks(top: _Table, public_keys: dict[tuple[str, str], bytes]) -> list[str]:
    """`[sinks]`: their names, and into `public_keys` the keys the file gives."""
    sinks = []
    for name, body in top.table("sinks").items():
        sinks.append(_ident(name, f"sinks.{name}"))
        key = _public_key(_Table(body, f"sinks.{name}", ("public_key",)), 32)
        if key is not None:
            public_keys[("sink", name)] = key
    return sinks


def _envelope_args(t: _Table, where: str) -> list[EnvelopeArg]:
    """A tool's `envelopes = { ARG = { kind = "...", verified = ... } }`."""
    envelope_args = []
    for arg, env in sorted(t.table("envelopes").items()):
        e = _Table(env, f"{where}.envelopes.{arg}", ("kind", "verified"))
        arg_name = names.canonical_argument_name(arg)
        if arg_name is None:
            raise PolicyFileError(f"{where}.envelopes: {arg!r} is not an argument name")
        envelope_args.append(EnvelopeArg(arg_name, e.text("kind"), e.boolean("verified")))
    return envelope_args


def _declared_args(t: _Table, where: str) -> list[ArgSpec]:
    """A tool's `args = { NAME = "role" }`: its plain arguments, by role."""
    declared = []
    for arg, role in sorted(t.table("args").items()):
        arg_name = names.canonical_argument_name(arg)
        roles = tuple(r.value for r in ArgRole)
        if arg_name is None or not isinstance(role, str) or role not in roles:
            raise PolicyFileError(f"{where}.args.{arg}: a role, one of {', '.join(roles)}")
        declared.append(ArgSpec(arg_name, ArgRole(role)))
    return declared


def _target_slots(t: _Table, where: str) -> list[TargetSlot]:
    """A tool's `roles = { ROLE = { schemes = [...], max = N } }`: its further targets."""
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
    return slots


def _parse_tool(raw: str, body: object) -> ToolSpec:
    """One `[tools."NAME"]` table."""
    where = f"tools.{raw}"
    t = _Table(body, where, TOOL_FIELDS)
    envelope_args = _envelope_args(t, where)
    declared = _declared_args(t, where)
    tier = t.optional_text("min_tier")
    if tier is not None and tier not in ("delegate", "master"):
        raise PolicyFileError(f"{where}.min_tier: delegate or master")
    slots = _target_slots(t, where)
    try:
        return ToolSpec(
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
            untrusted_results=t.boolean("untrusted"),
        )
    except ValueError as exc:
        if isinstance(exc, PolicyFileError):
            raise
        raise PolicyFileError(f"{where}: {exc}") from None


def _parse_tools(top: _Table) -> dict[str, ToolSpec]:
    tools: dict[str, ToolSpec] = {}
    for raw, body in top.table("tools").items():
        spec = _parse_tool(raw, body)
        tools[spec.name] = spec
    return tools


def _parse_principals(
    top: _Table, settings: dict[str, int], public_keys: dict[tuple[str, str], bytes]
) -> tuple[list[str], dict[str, tuple[str, ...]]]:
    """`[principals]`: their names and deputies, and into `public_keys` their keys."""
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
    return principals, deputies


def _allowed_tools(a: _Table, where: str) -> tuple[str, ...] | None:
    """An agent's `allowed_tools`: a list of tool names, or "unrestricted" (None)."""
    allowed_raw = a.get("allowed_tools")
    if allowed_raw is None:
        raise PolicyFileError(
            f'{where}.allowed_tools: is required (a list, [] for nothing, or "{UNRESTRICTED}")'
        )
    if allowed_raw == UNRESTRICTED:
        return None
    if isinstance(allowed_raw, list) and all(isinstance(x, str) for x in allowed_raw):
        return tuple(sorted({_tool_name(x, f"{where}.allowed_tools") for x in allowed_raw}))
    raise PolicyFileError(
        f'{where}.allowed_tools: must be a list of tool names or "{UNRESTRICTED}"'
    )


def _parse_mandate(a: _Table, where: str) -> Mandate:
    """An agent's mandate: the tools it may call, how, and with which rules."""
    allowed = _allowed_tools(a, where)
    depth = a.integer("max_delegation_depth")
    if depth is not None and depth < 0:
        raise PolicyFileError(f"{where}.max_delegation_depth: must be 0 or more")
    return Mandate(
        allowed_tools=allowed,
        enforcement=Enforcement(a.choice("enforcement", ("enforce", "observe"), "enforce")),
        suspended=a.boolean("suspended"),
        delegation_policy=DelegationPolicy(
            a.choice("delegation_policy", ("attenuated", "none"), "none")
        ),
        max_delegation_depth=depth,
        rules=parse_tool_rules(a.table("rules"), where, allowed),
    )


def _parse_agents(
    top: _Table, principals: list[str], public_keys: dict[tuple[str, str], bytes]
) -> tuple[dict[str, Mandate], dict[str, str]]:
    """`[agents.NAME]`: each agent's mandate, and the principal it acts for; into
    `public_keys` their keys."""
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
        mandate = _parse_mandate(a, where)
        agents[_ident(raw, where)] = mandate
    return agents, agent_principal


def _parse_agent_sets(
    top: _Table, agents: dict[str, Mandate]
) -> dict[tuple[str, str], tuple[TargetRule, ...]]:
    """`[sets.AGENT]`, each of a known agent."""
    sets = parse_sets(top.table("sets"))
    for owner, _ in sets:
        if owner not in agents:
            raise PolicyFileError(f"sets.{owner}: unknown agent")
    return sets


def _parse_envelopes(
    top: _Table, sinks: list[str], agents: dict[str, Mandate]
) -> dict[str, dict[str, Any]]:
    """`[envelopes.NAME]`: test fixtures, sealed to known sinks for a known agent."""
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
    return envelopes


def _parse_delegation(
    name: str, body: object, agents: dict[str, Mandate], earlier: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """One `[delegations.NAME]`: a test fixture, between known agents; its `parent_grant`
    one of the `earlier` delegations."""
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
    if spec_d["parent_grant"] is not None and spec_d["parent_grant"] not in earlier:
        raise PolicyFileError(f"{where}.parent_grant: must name an earlier delegation")
    if spec_d["tools"] is not None:
        spec_d["tools"] = sorted({_tool_name(t, f"{where}.tools") for t in spec_d["tools"]})
    return spec_d


def _parse_delegations(top: _Table, agents: dict[str, Mandate]) -> dict[str, dict[str, Any]]:
    delegations: dict[str, dict[str, Any]] = {}
    for name, body in top.table("delegations").items():
        delegations[name] = _parse_delegation(name, body, agents, delegations)
    return delegations


def _parse_confirm(
    confirm: object, where: str, agents: dict[str, Mandate], principals: list[str]
) -> dict[str, Any]:
    """A pending call's `confirm = { by = ..., expect = ... }`: who answers its card."""
    ct = _Table(confirm, f"{where}.confirm", CONFIRM_FIELDS)
    by = ct.text("by", "principal")
    if by not in ("principal", "owner") and by not in agents and by not in principals:
        raise PolicyFileError(
            f"{where}.confirm.by: principal, owner, an agent's or a principal's name"
        )
    return {
        "by": by,
        "reject": ct.boolean("reject"),
        "expect": ct.choice("expect", (*CALL_OUTCOMES, "rejected"), "allow"),
        "reason": _reason(ct.optional_text("reason"), f"{where}.confirm"),
        "digest": ct.choice("digest", ("card", "wrong"), "card"),
        "after_ms": ct.integer("after_ms", STEP_MS),
    }


def _further_targets(c: _Table, where: str) -> list[tuple[str, str]]:
    """A call's `also = { ROLE = target | [targets] }`, as (role, target) pairs."""
    also: list[tuple[str, str]] = []
    for role, values in sorted(c.table("also").items()):
        items = [values] if isinstance(values, str) else values
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise PolicyFileError(f"{where}.also.{role}: a target, or a list of targets")
        also.extend((role, value) for value in items)
    return also


def _parse_call(
    index: int,
    body: object,
    agents: dict[str, Mandate],
    principals: list[str],
    envelopes: dict[str, dict[str, Any]],
    delegations: dict[str, dict[str, Any]],
) -> CallSpec:
    """One `[[calls]]` entry, naming known agents, envelopes and delegations."""
    where = f"calls[{index}]"
    c = _Table(body, where, CALL_FIELDS)
    agent = c.text("agent")
    if agent not in agents:
        raise PolicyFileError(f"{where}.agent: unknown agent {agent!r}")
    args = c.table("args")
    handles = c.table("handles")
    also = _further_targets(c, where)
    for arg, value in args.items():
        if not isinstance(value, str):
            raise PolicyFileError(f"{where}.args.{arg}: values are strings")
    for arg, env in handles.items():
        if env not in envelopes:
            raise PolicyFileError(f"{where}.handles.{arg}: unknown envelope {env!r}")
    via = c.optional_text("via")
    if via is not None and via not in delegations:
        raise PolicyFileError(f"{where}.via: unknown delegation {via!r}")
    raw_confirm = c.get("confirm")
    confirm = (
        None if raw_confirm is None else _parse_confirm(raw_confirm, where, agents, principals)
    )
    advance = c.integer("advance_ms", STEP_MS)
    assert advance is not None
    if advance < 0:
        raise PolicyFileError(f"{where}.advance_ms: block time never goes back")
    expect = c.choice("expect", CALL_OUTCOMES)
    if confirm is not None and expect != "pending":
        raise PolicyFileError(f"{where}.confirm: only a call expected pending is confirmed")
    return CallSpec(
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


def _parse_calls(
    top: _Table,
    agents: dict[str, Mandate],
    principals: list[str],
    envelopes: dict[str, dict[str, Any]],
    delegations: dict[str, dict[str, Any]],
) -> list[CallSpec]:
    raw_calls = top.get("calls")
    if raw_calls is None:
        raw_calls = []
    if not isinstance(raw_calls, list):
        raise PolicyFileError("calls: must be an array of tables ([[calls]])")
    return [
        _parse_call(index, body, agents, principals, envelopes, delegations)
        for index, body in enumerate(raw_calls)
    ]


def parse_policy(data: dict[str, Any]) -> Policy:
    """A policy from a parsed TOML document; PolicyFileError when it is malformed."""
    top = _Table(data, "file", TOP_FIELDS)
    chain_id, settings = _parse_settings(top)
    public_keys: dict[tuple[str, str], bytes] = {}
    sinks = _parse_sinks(top, public_keys)
    tools = _parse_tools(top)
    principals, deputies = _parse_principals(top, settings, public_keys)
    agents, agent_principal = _parse_agents(top, principals, public_keys)
    sets = _parse_agent_sets(top, agents)
    envelopes = _parse_envelopes(top, sinks, agents)
    delegations = _parse_delegations(top, agents)
    calls = _parse_calls(top, agents, principals, envelopes, delegations)
    return Policy(
        settings, chain_id, sinks, tools, agents, envelopes, delegations, calls, sets,
        principals, agent_principal, public_keys, deputies,
    )  # fmt: skip


def load_policy(path: str) -> Policy:
    """Read and parse a policy file; PolicyFileError when it is malformed."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise PolicyFileError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyFileError(f"{path}: TOML syntax error: {exc}") from None
    return parse_policy(data)
