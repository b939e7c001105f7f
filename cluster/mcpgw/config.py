"""The gateway's config file (TOML): the agent's key, the upstream MCP servers, how each
upstream tool becomes a proposal, and which upstreams' resources are read under which
registered tool (`docs/mcp-gateway.md`)::

    key_file = "agent.key"                 # the agent's key (relative to this file)
    [upstreams.files]
    command = ["python3", "files_server.py"]   # stdio; or url = "http://host:port/mcp"
    [tools.read_file]                      # an upstream tool, by its name
    tool = "files.read"                    # the registered QuorumGate tool
    target = "path"                        # (scheme, targets, exclude: as the proxy's file)
    [resources.files]                      # resources/read from this upstream ...
    tool = "files.resources"               # ... is judged as a call of this read tool
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

from quorumgate.proto import names
from quorumgate.proxy.config import ProxyConfigError, ToolMapping, parse_mapping

UPSTREAMS_MAX = 32
TOOLS_MAX = 256  # mapped tools; also bounds the gateway's metric labels
# MCP tool names (specification 2025-11-25, "Tool names"): 1 to 128 characters of ASCII
# letters, digits, `_`, `-` and `.`, case-sensitive. A name outside the rule, or two names
# that differ only by case, could read as one tool to a person or a model.
MCP_TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class GatewayConfigError(ValueError):
    """The gateway's config is wrong: the message names the field."""


@dataclasses.dataclass(frozen=True)
class Upstream:
    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    key_file: Path
    upstreams: tuple[Upstream, ...]
    tools: dict[str, ToolMapping]
    resources: dict[str, str] = dataclasses.field(default_factory=dict)  # upstream -> tool


def tool_name_key(name: str) -> str:
    """Names that differ only by case are one name here."""
    return name.lower()


def load_gateway_config(path: str | Path) -> GatewayConfig:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise GatewayConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as err:
        raise GatewayConfigError(f"{path}: TOML syntax error: {err}") from None
    unknown = sorted(set(data) - {"key_file", "upstreams", "tools", "resources"})
    if unknown:
        raise GatewayConfigError(f"file: unknown field {unknown[0]!r}")
    key_file = data.get("key_file")
    if not isinstance(key_file, str) or not key_file:
        raise GatewayConfigError("key_file: the agent's key file is required")
    upstreams = _upstreams(data.get("upstreams"))
    tools = _tools(data.get("tools", {}))
    resources = _resources(data.get("resources", {}), {u.name for u in upstreams})
    for upstream, tool in sorted(resources.items()):
        # a read carries no tool definition, so its tool must be one no pin is made on
        mapped = sorted(name for name, mapping in tools.items() if mapping.tool == tool)
        if mapped:
            raise GatewayConfigError(
                f"resources.{upstream}.tool: {tool} is tools.{mapped[0]}'s, whose pin a "
                "read cannot carry; register a read tool for the resources"
            )
    return GatewayConfig((path.parent / key_file).resolve(), upstreams, tools, resources)


def _upstreams(raw: object) -> tuple[Upstream, ...]:
    if not isinstance(raw, dict) or not raw:
        raise GatewayConfigError("upstreams: at least one upstream MCP server")
    if len(raw) > UPSTREAMS_MAX:
        raise GatewayConfigError(f"upstreams: at most {UPSTREAMS_MAX}")
    upstreams = []
    for name, body in sorted(raw.items()):
        where = f"upstreams.{name}"
        if not isinstance(body, dict) or set(body) - {"command", "url", "env"}:
            raise GatewayConfigError(f"{where}: a table of command or url (and env)")
        command, url, env = body.get("command"), body.get("url"), body.get("env", {})
        if (command is None) == (url is None):
            raise GatewayConfigError(f"{where}: command (stdio) or url (Streamable HTTP)")
        if command is not None and (
            not isinstance(command, list)
            or not command
            or not all(isinstance(c, str) for c in command)
        ):
            raise GatewayConfigError(f"{where}.command: a list of strings")
        if url is not None and not (
            isinstance(url, str) and url.startswith(("http://", "https://"))
        ):
            raise GatewayConfigError(f"{where}.url: an http(s) URL")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise GatewayConfigError(f"{where}.env: a table of strings")
        upstreams.append(Upstream(name, tuple(command or ()), url, dict(env)))
    return tuple(upstreams)


def _tools(raw: object) -> dict[str, ToolMapping]:
    if not isinstance(raw, dict):
        raise GatewayConfigError("tools: a table of tool mappings")
    if len(raw) > TOOLS_MAX:
        raise GatewayConfigError(f"tools: at most {TOOLS_MAX}")
    seen: dict[str, str] = {}
    for name in sorted(raw):
        if MCP_TOOL_NAME_RE.fullmatch(name) is None:
            raise GatewayConfigError(
                f"tools.{name}: not an MCP tool name (1-128 of A-Z a-z 0-9 _ - .)"
            )
        other = seen.setdefault(tool_name_key(name), name)
        if other != name:
            raise GatewayConfigError(f"tools.{name}: differs from tools.{other} only by case")
    try:
        tools = {name: parse_mapping(name, body, f"tools.{name}") for name, body in raw.items()}
    except ProxyConfigError as err:
        raise GatewayConfigError(str(err)) from None
    owners: dict[str, str] = {}
    for name, mapping in sorted(tools.items()):
        # a registered tool holds one pin, so it can stand for one upstream tool only
        other = owners.setdefault(mapping.tool, name)
        if other != name:
            raise GatewayConfigError(f"tools.{name}: {mapping.tool} is tools.{other}'s already")
    return tools


def _resources(raw: object, upstreams: set[str]) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise GatewayConfigError("resources: a table of upstreams whose resources are read")
    out: dict[str, str] = {}
    for upstream, body in sorted(raw.items()):
        where = f"resources.{upstream}"
        if upstream not in upstreams:
            raise GatewayConfigError(f"{where}: no upstream of that name")
        if not isinstance(body, dict) or set(body) != {"tool"}:
            raise GatewayConfigError(f"{where}: a table with the registered read tool, tool")
        tool = names.canonical_tool_name(body["tool"]) if isinstance(body["tool"], str) else None
        if tool is None:
            raise GatewayConfigError(f"{where}.tool: not a QuorumGate tool name")
        out[upstream] = tool
    return out
