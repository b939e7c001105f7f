"""The proxy's HTTP shell (issue 17): Starlette for the routes, httpx for the upstream,
uvicorn to serve. `POST /v1/messages` (Anthropic) and `POST /v1/chat/completions` (OpenAI)
go through the enforcer (`enforce.py`); any other request is forwarded as it is. Request
bodies and headers (API keys included) go upstream unchanged, except the agent selector
header, and are never logged; responses other than a 200 pass back unchanged.

Each tool call becomes a proposal signed with the agent's key (one `Client` per agent,
opened at startup) in the run of its session, and is released only when the certificate
(verified by the client: f+1 sidecar receipts) allows it. Metrics: `GET /-/metrics`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from nacl.signing import SigningKey
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from quorumgate.proto.clusterfile import ClusterSpec, read_seed
from quorumgate.proxy.config import AgentConfig, Posture, ProxyConfig
from quorumgate.proxy.enforce import (
    AnthropicStream,
    DenialBlock,
    MappingError,
    OpenAIStream,
    SseSplitter,
    ToolCall,
    build_proposal,
    enforce_anthropic,
    enforce_openai,
    session_label,
)
from quorumgate.sdk.client import (
    CertificateTimeout,
    Client,
    ClusterUnavailable,
    Overloaded,
    QuorumGateError,
)

log = logging.getLogger("quorumgate.proxy")

CERTIFICATE_DEADLINE_S = 10.0  # a call the cluster has not certified by then: the posture
UPSTREAM_CONNECT_S = 10.0
UPSTREAM_READ_S = 600.0  # a long generation streams for minutes
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailers", "transfer-encoding", "upgrade", "host", "content-length",
        "accept-encoding", "content-encoding",
    }
)  # fmt: skip
APIS = {"/v1/messages": "anthropic", "/v1/chat/completions": "openai"}


UNREADABLE = "The model's response could not be checked, so it was not delivered."


def _unreadable(api: str) -> Response:
    """A 502 in the API's own error shape, so the SDK raises its usual error."""
    if api == "anthropic":
        body: dict[str, Any] = {
            "type": "error",
            "error": {"type": "api_error", "message": UNREADABLE},
        }
    else:
        body = {"error": {"message": UNREADABLE, "type": "api_error", "code": None}}
    return Response(json.dumps(body), status_code=502, media_type="application/json")


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "qg_proxy_requests",
            "Model API requests through the proxy, by API and whether streamed",
            ["api", "stream"],
            registry=self.registry,
        )
        self.tool_calls = Counter(
            "qg_proxy_tool_calls",
            "Tool calls a model asked for, by what the proxy did and why",
            ["outcome", "reason"],
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "qg_proxy_decision_seconds",
            "From a complete tool call to its certified decision",
            registry=self.registry,
        )


@dataclass
class _Decider:
    """Decides one request's tool calls: resolves nothing itself (agent and session are
    given), proposes each mapped call and releases it only on an allowing certificate."""

    proxy: Proxy
    agent: AgentConfig | None
    label: str

    async def __call__(self, call: ToolCall) -> bool:
        metrics = self.proxy.metrics
        agent = self.agent
        if agent is None:
            released = self.proxy.config.posture is Posture.FAIL_OPEN
            log.warning("event=agent_unresolved tool=%s released=%s", call.name, released)
            return self._count(released, "agent_unresolved")
        mapping = agent.tools.get(call.name)
        if mapping is None:
            released = agent.posture is Posture.FAIL_OPEN
            log.warning(
                "event=unmapped_tool agent=%s tool=%s released=%s",
                agent.agent_id,
                call.name,
                released,
            )
            return self._count(released, "unmapped_tool")
        try:
            proposal = build_proposal(mapping, call, self.label)
        except MappingError as err:
            log.warning("event=unmappable agent=%s tool=%s: %s", agent.agent_id, call.name, err)
            return self._count(False, "malformed_tool_input")
        client = self.proxy.clients[agent.agent_id]
        with metrics.decision_seconds.time():
            try:
                decision = await client.decide(proposal, CERTIFICATE_DEADLINE_S)
            except (ClusterUnavailable, CertificateTimeout, Overloaded, TimeoutError) as err:
                released = agent.posture is Posture.FAIL_OPEN
                cause = err.reason if isinstance(err, QuorumGateError) else "deadline"
                log.warning(
                    "event=no_certificate agent=%s tool=%s cause=%s released=%s",
                    agent.agent_id,
                    mapping.tool,
                    cause,
                    released,
                )
                return self._count(released, "no_certificate")
            except QuorumGateError as err:  # refused at submission (admission, secrets...)
                log.info("event=refused agent=%s tool=%s", agent.agent_id, mapping.tool)
                return self._count(False, err.reason or "refused")
        log.info(
            "event=decided agent=%s tool=%s proposal=%s outcome=%s",
            agent.agent_id,
            mapping.tool,
            decision.proposal_id.hex()[:16],
            decision.outcome.value,
        )
        return self._count(decision.allowed, decision.reason)

    def _count(self, released: bool, reason: str) -> bool:
        outcome = "released" if released else "withheld"
        self.proxy.metrics.tool_calls.labels(outcome, reason).inc()
        return released


class Proxy:
    """The proxy's state: its configuration, one client per agent, the upstream."""

    def __init__(
        self,
        config: ProxyConfig,
        spec: ClusterSpec,
        upstream: str,
        denial: DenialBlock = DenialBlock.TOOL_RESULT,
    ) -> None:
        self.config = config
        self.spec = spec
        self.upstream = upstream.rstrip("/")
        self.denial = denial
        self.metrics = ProxyMetrics()
        self.clients: dict[str, Client] = {}
        self.http: httpx.AsyncClient | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, _: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for agent in self.config.agents.values():
                key = SigningKey(read_seed(agent.key_file))
                self.clients[agent.agent_id] = await stack.enter_async_context(
                    Client(self.spec, key)
                )
            timeout = httpx.Timeout(UPSTREAM_READ_S, connect=UPSTREAM_CONNECT_S)
            self.http = await stack.enter_async_context(
                httpx.AsyncClient(timeout=timeout, follow_redirects=False)
            )
            yield

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/-/metrics", self.metrics_endpoint, methods=["GET"]),
                Route("/{path:path}", self.forward, methods=["GET", "POST", "PUT", "DELETE"]),
            ],
            lifespan=self.lifespan,
        )

    async def metrics_endpoint(self, _: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type="text/plain")

    def _headers_up(self, request: Request) -> dict[str, str]:
        selector = self.config.agent_header
        out = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        out.pop(selector, None)
        out["accept-encoding"] = "identity"  # the enforcer reads the bytes
        return out

    async def forward(self, request: Request) -> Response:
        assert self.http is not None
        raw = await request.body()
        path = request.url.path
        api = APIS.get(path) if request.method == "POST" else None
        body: dict[str, Any] | None = None
        if api is not None:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            body = parsed if isinstance(parsed, dict) else None
        url = self.upstream + path + (f"?{request.url.query}" if request.url.query else "")
        upstream = self.http.build_request(
            request.method, url, headers=self._headers_up(request), content=raw
        )
        response = await self.http.send(upstream, stream=True)
        headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP}
        if api is None or body is None or response.status_code != 200:
            data = await response.aread()
            await response.aclose()
            return Response(data, status_code=response.status_code, headers=headers)
        agent = self.config.resolve(request.headers.get(self.config.agent_header))
        label = session_label(agent, body, request.headers) if agent is not None else ""
        decide = _Decider(self, agent, label)
        # a stream whatever the upstream calls its content type: the SDK asked for one
        streamed = (
            "text/event-stream" in response.headers.get("content-type", "")
            or body.get("stream") is True
        )
        self.metrics.requests.labels(api, "yes" if streamed else "no").inc()
        if streamed:
            return StreamingResponse(
                self._stream(response, api, decide),
                status_code=200,
                headers=headers,
            )
        data = await response.aread()
        await response.aclose()
        try:
            document = json.loads(data)
        except ValueError:
            document = None
        if not isinstance(document, dict):
            # a 200 the enforcer cannot read could carry any tool call: never passed on
            log.warning("event=unreadable_response api=%s", api)
            return _unreadable(api)
        if api == "anthropic":
            withheld = await enforce_anthropic(document, decide, self.denial)
        else:
            withheld = await enforce_openai(document, decide)
        if not withheld:
            return Response(data, status_code=200, headers=headers)  # unchanged, byte for byte
        return Response(json.dumps(document).encode(), status_code=200, headers=headers)

    async def _stream(
        self, response: httpx.Response, api: str, decide: _Decider
    ) -> AsyncIterator[bytes]:
        splitter = SseSplitter()
        enforcer: AnthropicStream | OpenAIStream = (
            AnthropicStream(decide, self.denial) if api == "anthropic" else OpenAIStream(decide)
        )
        try:
            async for chunk in response.aiter_bytes():
                for frame in splitter.feed(chunk):
                    for out in await enforcer.feed(frame):
                        yield out
        except httpx.HTTPError:
            log.warning("event=upstream_stream_cut api=%s", api)
        finally:
            enforcer.close()  # a call still held was never complete: dropped
            await response.aclose()
