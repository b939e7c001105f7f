"""The MCP gateway (issue 18, item 1): an MCP server in front of upstream MCP servers, for
one agent, on the official `mcp` SDK on both sides.

    quorumgate mcp-gateway --dir D --agent ID --config FILE [--http HOST:PORT]
                           [--wait-for-approval S]
    quorumgate mcp-pin --dir D --config FILE [--check]

- `tools/list` returns the upstream tools the agent's mandate allows (as f+1 sidecars
  report it), under their upstream names, with their upstream definitions; others are
  hidden.
- `tools/call` becomes a proposal (the config maps each tool's target argument and scheme,
  as the proxy's agents file does; an unmapped tool is refused) carrying the digest of the
  tool's definition as the upstream lists it at that moment, and is forwarded upstream only
  with a verified f+1 certificate that allows it. A denial is a tool result with
  `isError: true` and the fixed sentence; a pending call the same sentence and "Awaiting
  approval." — or, with `--wait-for-approval S`, the gateway waits up to S seconds for the
  principal's answer and runs the call if it is confirmed.
- **Pinned definitions**: `mcp-pin` (the owner) records, for each mapped tool, the digest of its
  name, description and input schema in the log (the registered tool's `definition_digest`).
  When an upstream later changes a definition — how a poisoned tool arrives — the calls
  carry another digest and the cluster refuses them (`tool_definition_changed`) until the
  owner pins the new one (`mcp-pin` again, after reading the change).

The config (TOML)::

    key_file = "agent.key"                 # the agent's key (relative to this file)
    [upstreams.files]
    command = ["python3", "files_server.py"]   # stdio; or url = "http://host:port/mcp"
    [tools.read_file]                      # an upstream tool, by its name
    tool = "files.read"                    # the registered QuorumGate tool
    target = "path"                        # (scheme, targets, exclude: as the proxy's file)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import rfc8785
from nacl.signing import SigningKey

from quorumgate.proto.clusterfile import ClusterSpec, read_seed
from quorumgate.proto.model import DENIAL_TEXT, Outcome
from quorumgate.proxy.config import ProxyConfigError, ToolMapping, parse_mapping
from quorumgate.proxy.enforce import MappingError, ToolCall, build_proposal
from quorumgate.sdk.client import (
    CertificateTimeout,
    Client,
    ClusterUnavailable,
    Overloaded,
    QuorumGateError,
)

log = logging.getLogger("quorumgate.mcpgw")

AWAITING_APPROVAL = f"{DENIAL_TEXT} Awaiting approval."
REGISTRY_TTL_S = 2.0  # how long a mandate read from the registry is used for tools/list
CERTIFICATE_DEADLINE_S = 10.0
UPSTREAMS_MAX = 32


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


def load_gateway_config(path: str | Path) -> GatewayConfig:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise GatewayConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as err:
        raise GatewayConfigError(f"{path}: TOML syntax error: {err}") from None
    unknown = sorted(set(data) - {"key_file", "upstreams", "tools"})
    if unknown:
        raise GatewayConfigError(f"file: unknown field {unknown[0]!r}")
    key_file = data.get("key_file")
    if not isinstance(key_file, str) or not key_file:
        raise GatewayConfigError("key_file: the agent's key file is required")
    raw_upstreams = data.get("upstreams")
    if not isinstance(raw_upstreams, dict) or not raw_upstreams:
        raise GatewayConfigError("upstreams: at least one upstream MCP server")
    if len(raw_upstreams) > UPSTREAMS_MAX:
        raise GatewayConfigError(f"upstreams: at most {UPSTREAMS_MAX}")
    upstreams = []
    for name, body in sorted(raw_upstreams.items()):
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
    raw_tools = data.get("tools", {})
    if not isinstance(raw_tools, dict):
        raise GatewayConfigError("tools: a table of tool mappings")
    try:
        tools = {
            name: parse_mapping(name, body, f"tools.{name}") for name, body in raw_tools.items()
        }
    except ProxyConfigError as err:
        raise GatewayConfigError(str(err)) from None
    return GatewayConfig((path.parent / key_file).resolve(), tuple(upstreams), tools)


def definition_digest(tool: types.Tool) -> bytes:
    """SHA-256 of the tool's name, description and input schema, as the upstream lists them
    (RFC 8785 JSON: one spelling for one definition)."""
    wire = tool.model_dump(by_alias=True, exclude_none=True, mode="json")
    pinned = {key: wire.get(key) for key in ("name", "description", "inputSchema")}
    return hashlib.sha256(b"qg/mcp-tool/v1" + rfc8785.dumps(pinned)).digest()


def denial(text: str = DENIAL_TEXT) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class Gateway:
    """The gateway's state: one QuorumGate client (the agent's key), one MCP client per
    upstream, the run of this gateway's session."""

    def __init__(
        self,
        config: GatewayConfig,
        spec: ClusterSpec,
        agent_id: str,
        *,
        wait_for_approval_s: float = 0.0,
    ) -> None:
        self.config = config
        self.spec = spec
        self.agent_id = agent_id
        self.wait_for_approval_s = wait_for_approval_s
        self.run_label = f"mcp-{time.time_ns()}"  # one session, one run: the latch bucket
        self.qg: Client | None = None
        self.upstreams: dict[str, Any] = {}  # name -> mcp.Client
        self._mandate: tuple[float, frozenset[str] | None, dict[str, bytes]] | None = None

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[Gateway]:
        async with contextlib.AsyncExitStack() as stack:
            key = SigningKey(read_seed(self.config.key_file))
            self.qg = await stack.enter_async_context(Client(self.spec, key))
            await self.connect_upstreams(stack)
            yield self

    async def connect_upstreams(self, stack: contextlib.AsyncExitStack) -> None:
        """An MCP client session per upstream (stdio command or Streamable HTTP URL), with
        no response cache: every listing is the server's definition at that moment."""
        import mcp

        for upstream in self.config.upstreams:
            server: Any = upstream.url or mcp.StdioServerParameters(
                command=upstream.command[0],
                args=list(upstream.command[1:]),
                env=upstream.env or None,
            )
            self.upstreams[upstream.name] = await stack.enter_async_context(
                mcp.Client(server, cache=None)
            )

    async def upstream_tools(self) -> dict[str, tuple[str, types.Tool]]:
        """Every upstream tool by name, fresh from its server (never a cached listing):
        (upstream name, definition). A name two upstreams share is served by neither."""
        found: dict[str, tuple[str, types.Tool]] = {}
        clashes: set[str] = set()
        for name, client in self.upstreams.items():
            cursor = None
            while True:
                listing = await client.list_tools(cursor=cursor)
                for tool in listing.tools:
                    if tool.name in found:
                        clashes.add(tool.name)
                    found[tool.name] = (name, tool)
                cursor = listing.next_cursor
                if not cursor:
                    break
        for name in clashes:
            log.warning("event=tool_name_clash tool=%s: served by neither upstream", name)
            found.pop(name, None)
        return found

    async def _allowed(self) -> tuple[frozenset[str] | None, dict[str, bytes]]:
        """The agent's allowed tools (None: unrestricted) and each pinned definition, as
        f+1 sidecars report them."""
        now = time.monotonic()
        if self._mandate is not None and now - self._mandate[0] < REGISTRY_TTL_S:
            return self._mandate[1], self._mandate[2]
        assert self.qg is not None
        registry = await self.qg.registry()
        entry = registry.agent(self.agent_id)
        allowed: frozenset[str] | None = frozenset()
        if entry is not None and entry.mandate is not None and not entry.suspended:
            tools = entry.mandate.allowed_tools
            allowed = None if tools is None else frozenset(tools)
        pins = {t.name: t.definition_digest for t in registry.tools if t.definition_digest}
        self._mandate = (now, allowed, pins)
        return allowed, pins

    async def list_tools(self) -> list[types.Tool]:
        """The upstream tools this agent may call, as the upstream defines them; a tool
        whose definition is not the one the owner pinned is hidden too: its description
        never reaches the model (a poisoned description is an injection of its own)."""
        allowed, pins = await self._allowed()
        listed = []
        for name, (_, tool) in sorted((await self.upstream_tools()).items()):
            mapping = self.config.tools.get(name)
            if mapping is None:
                continue  # unmapped: the gateway could not govern it, so nobody sees it
            if allowed is not None and mapping.tool not in allowed:
                continue
            pinned = pins.get(mapping.tool)
            if pinned is not None and pinned != definition_digest(tool):
                log.warning("event=definition_changed tool=%s: hidden until pinned", name)
                continue
            listed.append(tool)
        return listed

    async def call_tool(self, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        mapping = self.config.tools.get(name)
        current = (await self.upstream_tools()).get(name)
        if mapping is None or current is None:
            log.warning("event=unmapped_tool agent=%s tool=%s", self.agent_id, name)
            return denial()
        upstream, tool = current
        try:
            proposal = build_proposal(mapping, ToolCall("", name, arguments or {}), self.run_label)
        except MappingError as err:
            log.warning("event=unmappable agent=%s tool=%s: %s", self.agent_id, name, err)
            return denial()
        proposal = dataclasses.replace(proposal, definition=definition_digest(tool))
        assert self.qg is not None
        try:
            decision = await self.qg.decide(proposal, CERTIFICATE_DEADLINE_S)
            if decision.outcome is Outcome.PENDING and self.wait_for_approval_s > 0:
                decision = await self.qg.await_certificate(
                    decision.proposal_id, self.wait_for_approval_s, settled=True
                )
        except (ClusterUnavailable, CertificateTimeout, Overloaded, TimeoutError):
            log.warning("event=no_certificate agent=%s tool=%s", self.agent_id, mapping.tool)
            return denial(AWAITING_APPROVAL) if self.wait_for_approval_s > 0 else denial()
        except QuorumGateError as err:
            log.info("event=refused agent=%s tool=%s reason=%s", self.agent_id, mapping.tool,
                     err.reason)  # fmt: skip
            return denial()
        log.info(
            "event=decided agent=%s tool=%s proposal=%s outcome=%s reason=%s",
            self.agent_id,
            mapping.tool,
            decision.proposal_id.hex()[:16],
            decision.outcome.value,
            decision.reason,
        )
        if decision.outcome is Outcome.PENDING:
            return denial(AWAITING_APPROVAL)
        if not decision.allowed:
            return denial()
        result: types.CallToolResult = await self.upstreams[upstream].call_tool(name, arguments)
        return result

    def server(self) -> Any:
        from mcp.server.lowlevel import Server

        async def on_list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=await self.list_tools())

        async def on_call_tool(
            _ctx: Any, params: types.CallToolRequestParams
        ) -> types.CallToolResult:
            return await self.call_tool(params.name, params.arguments)

        return Server("quorumgate-mcp-gateway", on_list_tools=on_list_tools,
                      on_call_tool=on_call_tool)  # fmt: skip


async def serve_stdio(gateway: Gateway) -> None:
    from mcp.server.stdio import stdio_server

    async with gateway.connected():
        server = gateway.server()
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


async def serve_http(gateway: Gateway, host: str, port: int) -> None:
    import uvicorn

    async with gateway.connected():
        app = gateway.server().streamable_http_app(host=host)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        await uvicorn.Server(config).serve()


async def pin(config: GatewayConfig, spec: ClusterSpec, *, check: bool) -> list[str]:
    """The owner pins each mapped upstream tool's current definition on its registered
    QuorumGate tool (`check`: only report). Returns one line per tool."""
    lines: list[str] = []
    gateway = Gateway(config, spec, agent_id="-")
    async with contextlib.AsyncExitStack() as stack:
        await gateway.connect_upstreams(stack)
        owner = await stack.enter_async_context(Client.as_owner(spec.directory))
        registry = await owner.registry()
        found = await gateway.upstream_tools()
        for name, mapping in sorted(config.tools.items()):
            if name not in found:
                lines.append(f"{name}: not offered by any upstream")
                continue
            digest = definition_digest(found[name][1])
            registered = registry.tool(mapping.tool)
            if registered is None:
                lines.append(f"{name}: {mapping.tool} is not registered (register it first)")
                continue
            if registered.definition_digest == digest:
                lines.append(f"{name}: {mapping.tool} pinned {digest.hex()[:16]} (unchanged)")
                continue
            state = "changed" if registered.definition_digest else "not pinned"
            if check:
                lines.append(f"{name}: {mapping.tool} {state}; upstream now {digest.hex()[:16]}")
                continue
            await owner.register_tool(dataclasses.replace(registered, definition_digest=digest))
            lines.append(f"{name}: {mapping.tool} pinned {digest.hex()[:16]} (was {state})")
    return lines


def run_until_cancelled(coro: Any) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(coro)
