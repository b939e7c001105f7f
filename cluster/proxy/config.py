"""The proxy's agents file (docs/proxy.md, "The agents file"): which agents it governs, with
what key, posture and session rule, and how each of the model's tools becomes a proposal.

    [proxy]
    agent_header = "x-quorumgate-agent"   # selects among the agents below; not a credential
    posture = "fail_closed"               # for a request whose agent cannot be resolved
    passthrough = ["GET /v1/files/*"]     # further paths to forward unjudged (docs/proxy.md):
                                          # only paths whose answers carry no tool call

    [agents.support]
    key_file = "keys/support.key"         # relative to this file; hex seed, mode 0600
    posture = "fail_closed"               # no certificate in time: withhold (fail_open:
                                          # release, and say so in the log)
    session = "first_message"             # | "header:NAME" | "metadata"

    [agents.support.tools.web_fetch]      # a tool as the model names it
    tool = "http.get"                     # the registered QuorumGate tool
    target = "url"                        # the argument that is the main target (none: no target)
    scheme = "https"                      # prefixed to a target written without it
    targets = { recipient = "cc" }        # further targets by role: text or a list of texts
    exclude = ["reason"]                  # arguments not sent to the cluster

A tool the file does not map is decided by the agent's posture (withheld under
`fail_closed`). Sessions (the latch bucket, a QuorumGate run): `first_message` is a digest
of the conversation up to and including its first user message, which every later turn of
the same conversation repeats; `header:NAME` is that request header (a run id `n<k>` the
agent's own SDK client opened passes as it is, so both seams count one run), falling back
to `first_message`; `metadata` is Anthropic's `metadata.user_id` or OpenAI's `user`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from quorumgate.proto import names
from quorumgate.proxy.door import PassthroughError, PathRule, parse_passthrough

DEFAULT_AGENT_HEADER = "x-quorumgate-agent"
TOOLS_PER_AGENT_MAX = 256
AGENTS_MAX = 256


class ProxyConfigError(ValueError):
    """The agents file is wrong: the message names the field."""


class Posture(StrEnum):
    FAIL_CLOSED = "fail_closed"
    FAIL_OPEN = "fail_open"


@dataclass(frozen=True)
class ToolMapping:
    """How one of the model's tools becomes a proposal."""

    model_name: str
    tool: str  # the registered QuorumGate tool
    target: str | None = None  # the argument holding the main target
    scheme: str | None = None  # prefixed to a target value written without it
    roles: tuple[tuple[str, str], ...] = ()  # (role, argument) for further targets
    exclude: frozenset[str] = frozenset()


@dataclass(frozen=True)
class AgentConfig:
    agent_id: str
    key_file: Path
    posture: Posture = Posture.FAIL_CLOSED
    session: str = "first_message"
    tools: dict[str, ToolMapping] = field(default_factory=dict)


@dataclass(frozen=True)
class ProxyConfig:
    agents: dict[str, AgentConfig]
    agent_header: str = DEFAULT_AGENT_HEADER
    posture: Posture = Posture.FAIL_CLOSED  # for an unresolved agent
    passthrough: tuple[PathRule, ...] = ()

    def resolve(self, selector: str | None) -> AgentConfig | None:
        """The agent a request's selector header names; with one agent configured and no
        header, that agent. None: unresolved (an unknown id, or no id among several)."""
        if selector is None:
            if len(self.agents) == 1:
                return next(iter(self.agents.values()))
            return None
        return self.agents.get(selector)


def _table(value: object, where: str, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProxyConfigError(f"{where}: must be a table")
    if allowed is not None:
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ProxyConfigError(f"{where}: unknown field {unknown[0]!r}")
    return value


def _text(table: dict[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    value = table.get(key, default)
    if value is not None and not isinstance(value, str):
        raise ProxyConfigError(f"{where}.{key}: must be a string")
    return value


def _posture(table: dict[str, Any], where: str) -> Posture:
    raw = _text(table, "posture", where, Posture.FAIL_CLOSED.value)
    try:
        return Posture(raw)
    except ValueError:
        raise ProxyConfigError(f"{where}.posture: fail_closed or fail_open") from None


def _session(raw: str | None, where: str) -> str:
    value = raw or "first_message"
    if value in ("first_message", "metadata"):
        return value
    if value.startswith("header:") and len(value) > len("header:"):
        return "header:" + value[len("header:") :].lower()
    raise ProxyConfigError(f'{where}.session: "first_message", "metadata" or "header:NAME"')


def parse_mapping(model_name: str, body: object, where: str) -> ToolMapping:
    t = _table(body, where, ("tool", "target", "scheme", "targets", "exclude"))
    tool_raw = _text(t, "tool", where, model_name) or model_name
    tool = names.canonical_tool_name(tool_raw)
    if tool is None:
        raise ProxyConfigError(f"{where}.tool: {tool_raw!r} is not a QuorumGate tool name")
    scheme = _text(t, "scheme", where)
    if scheme is not None and not names.is_scheme(scheme):
        raise ProxyConfigError(f"{where}.scheme: {scheme!r} is not a URI scheme")
    roles_raw = _table(t.get("targets", {}), f"{where}.targets")
    roles = []
    for role, argument in sorted(roles_raw.items()):
        if not names.is_role(role) or not isinstance(argument, str):
            raise ProxyConfigError(f"{where}.targets.{role}: a role, mapped to an argument name")
        roles.append((role, argument))
    exclude = t.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
        raise ProxyConfigError(f"{where}.exclude: a list of argument names")
    return ToolMapping(
        model_name=model_name,
        tool=tool,
        target=_text(t, "target", where),
        scheme=scheme,
        roles=tuple(roles),
        exclude=frozenset(exclude),
    )


def parse_config(data: dict[str, Any], base: Path) -> ProxyConfig:
    top = _table(data, "file", ("proxy", "agents"))
    proxy = _table(top.get("proxy", {}), "proxy", ("agent_header", "posture", "passthrough"))
    try:
        passthrough = parse_passthrough(proxy.get("passthrough", []))
    except PassthroughError as err:
        raise ProxyConfigError(f"proxy.passthrough: {err}") from None
    header = (_text(proxy, "agent_header", "proxy", DEFAULT_AGENT_HEADER) or "").lower()
    if not header:
        raise ProxyConfigError("proxy.agent_header: a header name")
    agents_raw = _table(top.get("agents", {}), "agents")
    if not agents_raw:
        raise ProxyConfigError("agents: at least one agent")
    if len(agents_raw) > AGENTS_MAX:
        raise ProxyConfigError(f"agents: at most {AGENTS_MAX}")
    agents: dict[str, AgentConfig] = {}
    for agent_id, body in sorted(agents_raw.items()):
        where = f"agents.{agent_id}"
        if not names.is_agent_id(agent_id):
            raise ProxyConfigError(f"{where}: {agent_id!r} is not an agent id")
        a = _table(body, where, ("key_file", "posture", "session", "tools"))
        key_file = _text(a, "key_file", where)
        if not key_file:
            raise ProxyConfigError(f"{where}.key_file: is required")
        tools_raw = _table(a.get("tools", {}), f"{where}.tools")
        if len(tools_raw) > TOOLS_PER_AGENT_MAX:
            raise ProxyConfigError(f"{where}.tools: at most {TOOLS_PER_AGENT_MAX}")
        tools = {
            name: parse_mapping(name, mapping, f"{where}.tools.{name}")
            for name, mapping in sorted(tools_raw.items())
        }
        agents[agent_id] = AgentConfig(
            agent_id=agent_id,
            key_file=(base / key_file).resolve(),
            posture=_posture(a, where),
            session=_session(_text(a, "session", where), where),
            tools=tools,
        )
    return ProxyConfig(
        agents=agents,
        agent_header=header,
        posture=_posture(proxy, "proxy"),
        passthrough=passthrough,
    )


def load_config(path: str | Path) -> ProxyConfig:
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ProxyConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as err:
        raise ProxyConfigError(f"{path}: TOML syntax error: {err}") from None
    return parse_config(data, path.parent)
