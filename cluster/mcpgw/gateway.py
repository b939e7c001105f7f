"""The MCP gateway: an MCP server in front of upstream MCP servers, for one agent, on the
official `mcp` SDK on both sides (`docs/mcp-gateway.md`).

    quorumgate mcp-gateway --dir D --agent ID --config FILE [--http HOST:PORT]
                           [--wait-for-approval S] [--metrics HOST:PORT]
    quorumgate mcp-pin --dir D --config FILE [--check]

- `tools/list` returns the mapped upstream tools the agent's mandate allows (as f+1
  sidecars report it), each exactly as its upstream defines it, unless its definition is
  not the one the owner pinned (`pins.py`: the pin covers the whole tool object).
- `tools/call` becomes a proposal carrying the digest of the tool's definition as the
  upstream lists it at that moment; it is forwarded only with a verified f+1 certificate
  that allows it, with its targets in the canonical form the certificate names
  (`quorumgate.sdk.targets`), and its result reaches the client only if it can be
  accounted for (`results.py`). A denial is `isError` with the fixed sentence.
- `resources/list` and `resources/read` serve the upstreams the config maps to a
  registered read tool; a read is judged as a call of that tool on the resource's URI.
- Nothing else passes (prompts, completions, logging, subscriptions; the upstreams'
  sampling, elicitation and roots requests, logs and notifications): the table in
  `docs/mcp-gateway.md` gives the reason for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from nacl.signing import SigningKey
from prometheus_client import CollectorRegistry, Counter

from quorumgate.mcpgw.config import (
    MCP_TOOL_NAME_RE,
    GatewayConfig,
    GatewayConfigError,
    load_gateway_config,
    tool_name_key,
)
from quorumgate.mcpgw.pins import (
    PinState,
    UnpinnableTool,
    definition_digest,
    is_listable,
    pin_state,
)
from quorumgate.mcpgw.results import (
    RESULT_WITHHELD,
    contents_problem,
    result_problem,
    withheld,
)
from quorumgate.proto.clusterfile import ClusterSpec, read_seed
from quorumgate.proto.model import DENIAL_TEXT, Outcome, Proposal, ToolMode
from quorumgate.proxy.config import ToolMapping
from quorumgate.proxy.enforce import MappingError, ToolCall, build_proposal
from quorumgate.sdk.client import (
    CertificateTimeout,
    Client,
    ClusterUnavailable,
    Decision,
    Overloaded,
    QuorumGateError,
)
from quorumgate.sdk.targets import certified_call, release_form
from quorumgate.sidecar.engine.targets import TargetRefused, canonicalize_target

__all__ = [
    "AWAITING_APPROVAL",
    "RESULT_WITHHELD",
    "Gateway",
    "GatewayConfig",
    "GatewayConfigError",
    "load_gateway_config",
    "pin",
]

log = logging.getLogger("quorumgate.mcpgw")

AWAITING_APPROVAL = f"{DENIAL_TEXT} Awaiting approval."
REGISTRY_TTL_S = 2.0  # how long a mandate read from the registry is used for tools/list
CERTIFICATE_DEADLINE_S = 10.0
LIST_PAGES_MAX = 64  # pages of one upstream's tools/list or resources/list per listing
LISTED_PER_UPSTREAM_MAX = 4096  # tools or resources one upstream's listing may hold


HIDDEN_WHY = {
    PinState.CHANGED.value: "not the definition the owner pinned; hidden and refused until "
    "the owner reads it and pins it again (quorumgate mcp-pin)",
    PinState.OLD_FORMAT.value: "pinned in an older format that covered only its name, "
    "description and input schema; hidden and refused until the owner re-pins it "
    "(quorumgate mcp-pin)",
    PinState.UNPINNABLE.value: "its definition has no canonical JSON, so no pin can cover it",
    "name_clash": "its name is listed twice, or differs from another's only by case",
}


class UpstreamListingError(Exception):
    """An upstream's listing broke a bound: that upstream offers nothing this time."""


def denial(text: str = DENIAL_TEXT) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class GatewayMetrics:
    """What the gateway hid, refused and withheld, by the mapped tool (the config bounds
    the labels: TOOLS_MAX)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tools_hidden = Counter(
            "qg_mcpgw_tools_hidden",
            "Listings that hid a mapped tool, by tool and why (definition_changed, ...)",
            ["tool", "reason"],
            registry=self.registry,
        )
        self.calls = Counter(
            "qg_mcpgw_calls",
            "tools/call and resources/read requests, by what the gateway did",
            ["outcome"],
            registry=self.registry,
        )
        self.results_withheld = Counter(
            "qg_mcpgw_results_withheld",
            "Results of certified calls not released to the client, by tool",
            ["tool"],
            registry=self.registry,
        )
        self.upstream_messages = Counter(
            "qg_mcpgw_upstream_messages",
            "Notifications and log messages from upstreams, dropped, by kind",
            ["kind"],
            registry=self.registry,
        )


@dataclasses.dataclass(frozen=True)
class _Mandate:
    """The agent's standing in the registry f+1 sidecars agree on."""

    read_at: float
    allowed: frozenset[str] | None  # None: unrestricted
    pins: dict[str, bytes]
    read_tools: frozenset[str]  # the registered tools of mode read

    def allows(self, tool: str) -> bool:
        return self.allowed is None or tool in self.allowed


@dataclasses.dataclass(frozen=True)
class _Listed:
    upstream: str
    tool: types.Tool


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
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.config = config
        self.spec = spec
        self.agent_id = agent_id
        self.wait_for_approval_s = wait_for_approval_s
        self.metrics = metrics or GatewayMetrics()
        self.run_label = f"mcp-{time.time_ns()}"  # one session, one run: the latch bucket
        self.qg: Client | None = None
        self.upstreams: dict[str, Any] = {}  # name -> mcp.Client
        self._mandate: _Mandate | None = None

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[Gateway]:
        async with contextlib.AsyncExitStack() as stack:
            key = SigningKey(read_seed(self.config.key_file))
            self.qg = await stack.enter_async_context(Client(self.spec, key))
            await self.connect_upstreams(stack)
            yield self

    async def connect_upstreams(self, stack: contextlib.AsyncExitStack) -> None:
        """An MCP client session per upstream (stdio command or Streamable HTTP URL), with
        no response cache: every listing is the server's definition at that moment. The
        session keeps the SDK's answers to sampling, elicitation and roots requests (an
        error; none of the three is advertised), and drops logs and notifications."""
        import mcp

        for upstream in self.config.upstreams:
            server: Any = upstream.url or mcp.StdioServerParameters(
                command=upstream.command[0],
                args=list(upstream.command[1:]),
                env=upstream.env or None,
            )
            self.upstreams[upstream.name] = await stack.enter_async_context(
                mcp.Client(
                    server,
                    cache=None,
                    logging_callback=self._upstream_log(upstream.name),
                    message_handler=self._upstream_message(upstream.name),
                )
            )

    def _upstream_log(self, upstream: str) -> Any:
        async def dropped(params: types.LoggingMessageNotificationParams) -> None:
            # never forwarded: a log line is text the client would show unjudged, and its
            # data is the server's, not ours to write into this log either
            self.metrics.upstream_messages.labels("log").inc()
            log.debug("event=upstream_log upstream=%s level=%s", upstream, params.level)

        return dropped

    def _upstream_message(self, upstream: str) -> Any:
        async def dropped(message: Any) -> None:
            if isinstance(message, Exception):
                log.warning("event=upstream_fault upstream=%s error=%s", upstream,
                            type(message).__name__)  # fmt: skip
                return
            # every listing and call reads the upstream afresh: a list_changed notice
            # changes nothing here, and the client is never told what was not judged
            self.metrics.upstream_messages.labels("notification").inc()
            method = getattr(message, "method", type(message).__name__)
            log.debug("event=upstream_notification upstream=%s method=%s", upstream, method)

        return dropped

    # ------------------------------------------------------------------ listings

    async def _pages(self, upstream: str, kind: str) -> list[Any]:
        """Every item of one upstream's paginated listing of `kind` ("tools", "resources"),
        within LIST_PAGES_MAX pages and LISTED_PER_UPSTREAM_MAX items (a server whose
        cursor never ends offers nothing)."""
        fetch = getattr(self.upstreams[upstream], f"list_{kind}")
        found: list[Any] = []
        cursor: str | None = None
        for _ in range(LIST_PAGES_MAX):
            page = await fetch(cursor=cursor)
            found.extend(getattr(page, kind))
            if len(found) > LISTED_PER_UPSTREAM_MAX:
                break
            cursor = page.next_cursor
            if not cursor:
                return found
        log.warning("event=listing_unbounded upstream=%s kind=%s: offers nothing", upstream, kind)
        raise UpstreamListingError(upstream)

    async def _listing(self, upstream: str, kind: str) -> list[Any]:
        """One upstream's listing, or nothing when it breaks a bound or fails (the others
        are served all the same)."""
        try:
            return await self._pages(upstream, kind)
        except UpstreamListingError:
            return []
        except Exception as err:  # the upstream failed, or listed what the SDK refused
            log.warning("event=upstream_unavailable upstream=%s kind=%s error=%s", upstream,
                        kind, type(err).__name__)  # fmt: skip
            return []

    async def upstream_tools(self) -> dict[str, _Listed]:
        """Every upstream tool by name, fresh from its server (never a cached listing). A
        name listed twice, by one upstream or two, or two names that differ only by case,
        or a name outside MCP's rule, is served by nobody (and said so of a mapped tool
        only: an upstream's other names are its own text, kept out of the log)."""
        found: dict[str, list[_Listed]] = {}
        for name in self.upstreams:
            for tool in await self._listing(name, "tools"):
                found.setdefault(tool_name_key(tool.name), []).append(_Listed(name, tool))
        served: dict[str, _Listed] = {}
        for entries in found.values():
            if len(entries) == 1 and MCP_TOOL_NAME_RE.fullmatch(entries[0].tool.name):
                served[entries[0].tool.name] = entries[0]
                continue
            for entry in entries:
                if entry.tool.name in self.config.tools:
                    self._hidden(entry.tool.name, "name_clash")
        return served

    def _hidden(self, name: str, reason: str) -> None:
        self.metrics.tools_hidden.labels(name, reason).inc()
        log.warning("event=tool_hidden tool=%s reason=%s: %s", name, reason, HIDDEN_WHY[reason])

    async def _registry(self) -> _Mandate:
        """The agent's allowed tools, the pinned definitions and the read tools, as f+1
        sidecars report them (read again after REGISTRY_TTL_S)."""
        now = time.monotonic()
        if self._mandate is not None and now - self._mandate.read_at < REGISTRY_TTL_S:
            return self._mandate
        assert self.qg is not None
        registry = await self.qg.registry()
        entry = registry.agent(self.agent_id)
        allowed: frozenset[str] | None = frozenset()
        if entry is not None and entry.mandate is not None and not entry.suspended:
            tools = entry.mandate.allowed_tools
            allowed = None if tools is None else frozenset(tools)
        pins = {t.name: t.definition_digest for t in registry.tools if t.definition_digest}
        reads = frozenset(t.name for t in registry.tools if t.mode is ToolMode.READ)
        self._mandate = _Mandate(now, allowed, pins, reads)
        return self._mandate

    async def list_tools(self) -> list[types.Tool]:
        """The upstream tools this agent may call, as the upstream defines them; a tool
        whose definition is not the one the owner pinned is hidden too: nothing of it
        reaches the model or the client (a poisoned description is an injection of its
        own, a changed `readOnlyHint` a lie to the client's approval logic)."""
        mandate = await self._registry()
        listed = []
        for name, entry in sorted((await self.upstream_tools()).items()):
            mapping = self.config.tools.get(name)
            if mapping is None or not mandate.allows(mapping.tool):
                continue  # unmapped: the gateway could not govern it, so nobody sees it
            state = pin_state(mandate.pins.get(mapping.tool), entry.tool)
            if not is_listable(state):
                self._hidden(name, state.value)
                continue
            listed.append(entry.tool)
        return listed

    # ------------------------------------------------------------------ calls

    async def _judge(self, proposal: Proposal, what: str) -> Decision | str:
        """The certified decision that allows `proposal`, or the text of the denial the
        client gets instead."""
        assert self.qg is not None
        try:
            decision = await self.qg.decide(proposal, CERTIFICATE_DEADLINE_S)
            if decision.outcome is Outcome.PENDING and self.wait_for_approval_s > 0:
                decision = await self.qg.await_certificate(
                    decision.proposal_id, self.wait_for_approval_s, settled=True
                )
        except (ClusterUnavailable, CertificateTimeout, Overloaded, TimeoutError):
            log.warning("event=no_certificate agent=%s tool=%s", self.agent_id, what)
            self._count("no_certificate")
            return AWAITING_APPROVAL if self.wait_for_approval_s > 0 else DENIAL_TEXT
        except QuorumGateError as err:
            log.info("event=refused agent=%s tool=%s reason=%s", self.agent_id, what, err.reason)
            self._count("refused")
            return DENIAL_TEXT
        log.info(
            "event=decided agent=%s tool=%s proposal=%s outcome=%s reason=%s",
            self.agent_id,
            what,
            decision.proposal_id.hex()[:16],
            decision.outcome.value,
            decision.reason,
        )
        if decision.outcome is Outcome.PENDING:
            self._count("pending")
            return AWAITING_APPROVAL
        if not decision.allowed:
            self._count("denied")
            return DENIAL_TEXT
        return decision

    def _count(self, outcome: str) -> None:
        self.metrics.calls.labels(outcome).inc()

    async def call_tool(self, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        mapping = self.config.tools.get(name)
        current = (await self.upstream_tools()).get(name)
        if mapping is None or current is None:
            log.warning("event=unmapped_tool agent=%s tool=%s", self.agent_id, _shown(name))
            self._count("unmapped")
            return denial()
        try:
            proposal = build_proposal(mapping, ToolCall("", name, arguments or {}), self.run_label)
            proposal = dataclasses.replace(proposal, definition=definition_digest(current.tool))
        except (MappingError, UnpinnableTool) as err:
            log.warning("event=unmappable agent=%s tool=%s: %s", self.agent_id, name, err)
            self._count("unmappable")
            return denial()
        decision = await self._judge(proposal, mapping.tool)
        if isinstance(decision, str):
            return denial(decision)
        released = self._released_arguments(mapping, arguments or {}, proposal, decision)
        if released is None:
            log.warning("event=target_not_certified agent=%s tool=%s", self.agent_id, name)
            self._count("target_not_certified")
            return denial()
        return await self._forward(name, current, released)

    async def _forward(
        self, name: str, current: _Listed, arguments: dict[str, Any]
    ) -> types.CallToolResult:
        """The certified call, sent upstream; its result released only if accounted for."""
        try:
            result: types.CallToolResult = await self.upstreams[current.upstream].call_tool(
                name, arguments
            )
            problem = result_problem(current.tool, result)
        except Exception as err:  # the upstream's failure, or its answer the SDK refused
            problem = f"the upstream's answer failed: {_cause(err)}"
        if problem is not None:
            self._withheld(name, current.upstream, problem)
            return withheld()
        self._count("released")
        return result

    def _withheld(self, tool: str, upstream: str, problem: str) -> None:
        self.metrics.results_withheld.labels(tool).inc()
        self._count("result_withheld")
        log.warning("event=result_refused tool=%s upstream=%s: %s", tool, upstream, problem)

    def _released_arguments(
        self,
        mapping: ToolMapping,
        arguments: dict[str, Any],
        proposal: Proposal,
        decision: Decision,
    ) -> dict[str, Any] | None:
        """The arguments the upstream gets: those judged, each target replaced by the
        canonical form the certificate names (`release_form`); None when the certificate
        names other targets than this call's. Arguments that are null were not judged and
        are not sent."""
        version = self.spec.canonical_version
        found = certified_call(
            proposal.tool,
            proposal.target,
            decision.certificate.leaf.target_digest,
            version=version,
            principal=self.agent_id,
            targets=[(t.role, t.target) for t in proposal.targets],
        )
        if found is None:
            return None
        main, further = found
        out = {key: value for key, value in arguments.items() if value is not None}
        try:
            if mapping.target is not None and mapping.target in out:
                out[mapping.target] = _release(out[mapping.target], proposal.target, main, version)
            forms = iter(zip(proposal.targets, further, strict=True))  # in the mapping's order
            for _, argument in mapping.roles:
                value = out.get(argument)
                if value is None:
                    continue
                items = [value] if isinstance(value, str) else list(value)
                pairs = zip(items, forms, strict=False)  # forms: this argument's are next
                spelled = [_release(i, t.target, c, version) for i, (t, c) in pairs]
                out[argument] = spelled[0] if isinstance(value, str) else spelled
        except ValueError:
            return None
        return out

    # ------------------------------------------------------------------ resources

    async def _resource_upstreams(self) -> dict[str, str]:
        """The upstreams whose resources this agent may read: name -> the read tool."""
        mandate = await self._registry()
        return {
            upstream: tool
            for upstream, tool in self.config.resources.items()
            if mandate.allows(tool) and tool in mandate.read_tools
        }

    async def upstream_resources(self) -> dict[str, tuple[str, types.Resource]]:
        """Every resource of the mapped upstreams by URI, fresh; a URI two list is nobody's."""
        found: dict[str, list[tuple[str, types.Resource]]] = {}
        for upstream in sorted(await self._resource_upstreams()):
            for resource in await self._listing(upstream, "resources"):
                found.setdefault(resource.uri, []).append((upstream, resource))
        return {uri: entries[0] for uri, entries in found.items() if len(entries) == 1}

    async def list_resources(self) -> list[types.Resource]:
        return [resource for _, (_, resource) in sorted((await self.upstream_resources()).items())]

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        """A read judged as a call of the upstream's read tool on the URI, sent with the
        URI in its canonical form; raises ResourceRefused (the client sees an error)."""
        listed = (await self.upstream_resources()).get(uri)
        if listed is None:
            log.warning("event=unmapped_resource agent=%s", self.agent_id)
            raise ResourceRefused(DENIAL_TEXT)
        upstream = listed[0]
        tool = self.config.resources[upstream]
        try:
            proposal = Proposal(run_id=self.run_label, tool=tool, target=uri)
        except ValueError:
            raise ResourceRefused(DENIAL_TEXT) from None
        decision = await self._judge(proposal, tool)
        if isinstance(decision, str):
            raise ResourceRefused(decision)
        version = self.spec.canonical_version
        found = certified_call(tool, uri, decision.certificate.leaf.target_digest,
                               version=version, principal=self.agent_id)  # fmt: skip
        if found is None or not found[0]:
            log.warning("event=target_not_certified agent=%s tool=%s", self.agent_id, tool)
            self._count("target_not_certified")
            raise ResourceRefused(DENIAL_TEXT)
        released = release_form(found[0], uri, version=version)
        return await self._read(upstream, tool, found[0], released)

    async def _read(
        self, upstream: str, tool: str, canonical: str, released: str
    ) -> types.ReadResourceResult:
        def same_resource(content_uri: str) -> bool:
            return _canonical_or_none(content_uri, self.agent_id, self.spec) == canonical

        try:
            result: types.ReadResourceResult = await self.upstreams[upstream].read_resource(
                released
            )
            problem = contents_problem(result, same_resource)
        except Exception as err:
            problem = f"the upstream's answer failed: {_cause(err)}"
        if problem is not None:
            self._withheld(tool, upstream, problem)
            raise ResourceRefused(RESULT_WITHHELD)
        self._count("released")
        return result

    # ------------------------------------------------------------------ the server

    def server(self) -> Any:
        """The gateway's MCP server: tools and resources only. Every other method is
        unknown to it (the SDK answers "method not found"), so nothing unjudged passes."""
        from mcp.server.lowlevel import Server
        from mcp.shared.exceptions import MCPError

        async def on_list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=await self.list_tools())

        async def on_call_tool(
            _ctx: Any, params: types.CallToolRequestParams
        ) -> types.CallToolResult:
            return await self.call_tool(params.name, params.arguments)

        async def on_list_resources(_ctx: Any, _params: Any) -> types.ListResourcesResult:
            return types.ListResourcesResult(resources=await self.list_resources())

        async def on_list_templates(_ctx: Any, _params: Any) -> types.ListResourceTemplatesResult:
            # a template lets the client name any URI; reads go only to listed resources
            return types.ListResourceTemplatesResult(resource_templates=[])

        async def on_read_resource(
            _ctx: Any, params: types.ReadResourceRequestParams
        ) -> types.ReadResourceResult:
            try:
                return await self.read_resource(params.uri)
            except ResourceRefused as refused:
                raise MCPError(code=types.INVALID_REQUEST, message=str(refused)) from None

        return Server(
            "quorumgate-mcp-gateway",
            on_list_tools=on_list_tools,
            on_call_tool=on_call_tool,
            on_list_resources=on_list_resources,
            on_list_resource_templates=on_list_templates,
            on_read_resource=on_read_resource,
        )


class ResourceRefused(Exception):
    """A resource read the client gets as an error, with this fixed text."""


def _release(written: object, proposed: str, canonical: str, version: int) -> str:
    """The form of one target argument the upstream gets: `release_form`, without the
    scheme the mapping prefixed when the value was written without one."""
    if not isinstance(written, str):
        raise ValueError("a target must be text")
    form = release_form(canonical, proposed, version=version)
    if proposed == written:
        return form
    prefix = proposed[: len(proposed) - len(written)].lower()  # "mailto:"
    if not form.startswith(prefix):
        raise ValueError("the canonical form is not of the mapping's scheme")
    return form[len(prefix) :]


def _shown(name: str) -> str:
    """A name the client chose, fit for one log line: a mapped name as it is (the config
    checked it), any other quoted, escaped and cut to 64 characters."""
    return name if MCP_TOOL_NAME_RE.fullmatch(name) else ascii(name[:64])


def _canonical_or_none(uri: str, agent_id: str, spec: ClusterSpec) -> str | None:
    head = uri.split(":", 1)[0].lower() if ":" in uri else ""
    try:
        return canonicalize_target(
            uri, principal=agent_id, schemes=(head,), version=spec.canonical_version
        )
    except TargetRefused:
        return None


def _cause(err: BaseException) -> str:
    """What went wrong, for the operator: the exception's kind, and for a result the SDK
    refused against the output schema, the schema keyword and where (never a value)."""
    cause = err.__cause__
    validator, path = getattr(cause, "validator", None), getattr(cause, "json_path", None)
    if validator is not None and path is not None:
        return f"{type(err).__name__}: breaks the output schema: {validator} at {path}"
    return type(err).__name__


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


PIN_SAID = {
    PinState.NOT_PINNED: "not pinned",
    PinState.CHANGED: "changed",
    PinState.OLD_FORMAT: "pinned in an older format",
}


def _pin_line(name: str, tool: str, state: PinState, digest: bytes, check: bool) -> str:
    now = digest.hex()[:16]
    if state is PinState.PINNED:
        return f"{name}: {tool} pinned {now} (unchanged)"
    if not check:
        return f"{name}: {tool} pinned {now} (was {PIN_SAID[state]})"
    said = PIN_SAID[state]
    if state is PinState.OLD_FORMAT:
        said += " (name, description and input schema only): read the whole definition and re-pin"
    return f"{name}: {tool} {said}; upstream now {now}"


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
                lines.append(f"{name}: not offered by any upstream (or not by one alone)")
                continue
            registered = registry.tool(mapping.tool)
            if registered is None:
                lines.append(f"{name}: {mapping.tool} is not registered (register it first)")
                continue
            tool = found[name].tool
            state = pin_state(registered.definition_digest, tool)
            if state is PinState.UNPINNABLE:
                lines.append(f"{name}: {mapping.tool} has no canonical JSON: cannot be pinned")
                continue
            digest = definition_digest(tool)
            lines.append(_pin_line(name, mapping.tool, state, digest, check))
            if state is not PinState.PINNED and not check:
                await owner.register_tool(dataclasses.replace(registered, definition_digest=digest))
    return lines


def run_until_cancelled(coro: Any) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(coro)
