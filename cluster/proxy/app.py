"""The proxy's HTTP shell: Starlette for the routes, httpx for the upstream, uvicorn to
serve. `door.py` says which requests go upstream and which answers are judged; the API
modules (`messages.py`, `chat.py`, `responses.py`) judge them. Request bodies and headers
(API keys included) go upstream unchanged, except the agent selector header, and are
never logged; what a judged answer carries back is the proxy's own canonical writing of
what it judged (docs/proxy.md).

Each tool call becomes a proposal signed with the agent's key (one `Client` per agent,
opened at startup) in the run of its session, and is released only when the certificate
(verified by the client: f+1 sidecar receipts) allows it, with its targets in the
canonical form the certificate names. Metrics: `GET /-/metrics`.
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

from quorumgate.proto import names
from quorumgate.proto.clusterfile import ClusterSpec, read_seed
from quorumgate.proxy import chat, messages, responses
from quorumgate.proxy.config import AgentConfig, Posture, ProxyConfig
from quorumgate.proxy.door import METHODS, Answer, answer, readable_encoding, route
from quorumgate.proxy.door import Route as DoorRoute
from quorumgate.proxy.enforce import (
    DenialBlock,
    MappingError,
    Released,
    ResponseSessions,
    ToolCall,
    Unreadable,
    build_call,
    load_json,
    released_arguments,
    session_label,
)
from quorumgate.proxy.sse import SseDecoder, dumps
from quorumgate.sdk.client import (
    CertificateTimeout,
    Client,
    ClusterUnavailable,
    Overloaded,
    QuorumGateError,
)
from quorumgate.sdk.targets import binds_caller, certified_call, release_form

log = logging.getLogger("quorumgate.proxy")

CERTIFICATE_DEADLINE_S = 10.0  # a call the cluster has not certified by then: the posture
UPSTREAM_CONNECT_S = 10.0
UPSTREAM_READ_S = 600.0  # a long generation streams for minutes
RESPONSE_BYTES_MAX = 32 * 1024 * 1024  # a whole (not streamed) answer the proxy reads
DRAIN_BYTES_MAX = 64 * 1024  # read after a stream's end, to keep the upstream connection
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailers", "transfer-encoding", "upgrade", "host", "content-length",
        "accept-encoding", "content-encoding",
    }
)  # fmt: skip
# an answer the proxy judged is its own writing: these describe the upstream's bytes
REWRITTEN = frozenset({"content-type", "content-md5", "digest", "etag", "content-range"})

UNREADABLE = "The model's response could not be checked, so it was not delivered."
NOT_FORWARDED = (
    "The proxy does not forward this request: it is not a model API path the proxy "
    "judges, nor one its passthrough list names."
)
BAD_REQUEST = "The proxy could not read this request as the model API's JSON."


def error_body(api: str | None, message: str, kind: str = "api_error") -> bytes:
    """An error in the API's own shape, so the SDK raises its usual error; one that both
    SDKs read when the API is not known."""
    if api == "anthropic":
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    elif api in ("openai", "responses"):
        body = {"error": {"message": message, "type": kind, "code": None}}
    else:
        body = {"type": "error", "error": {"type": kind, "message": message}}
    return dumps(body).encode()


def _error(api: str | None, status: int, message: str, kind: str = "api_error") -> Response:
    return Response(error_body(api, message, kind), status, media_type="application/json")


STREAM_ERRORS = {
    "anthropic": messages.stream_error_frame,
    "openai": chat.stream_error_frame,
    "responses": responses.stream_error_frame,
}


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
        self.refused = Counter(
            "qg_proxy_refused",
            "Requests and answers the proxy refused, by why",
            ["why"],
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
    given), proposes each mapped call and releases it only on an allowing certificate,
    with its targets in the canonical form the certificate names (the form the SDK's
    governed tools run on: `quorumgate.sdk.targets`)."""

    proxy: Proxy
    agent: AgentConfig | None
    label: str

    async def __call__(self, call: ToolCall) -> Released:
        agent = self.agent
        if agent is None:
            released = self.proxy.config.posture is Posture.FAIL_OPEN
            log.warning("event=agent_unresolved tool=%s released=%s", call.name, released)
            return self._count(call.arguments if released else None, "agent_unresolved")
        mapping = agent.tools.get(call.name)
        if mapping is None:
            released = agent.posture is Posture.FAIL_OPEN
            log.warning(
                "event=unmapped_tool agent=%s tool=%s released=%s",
                agent.agent_id,
                call.name,
                released,
            )
            return self._count(call.arguments if released else None, "unmapped_tool")
        try:
            built = build_call(mapping, call, self.label)
        except MappingError as err:
            log.warning("event=unmappable agent=%s tool=%s: %s", agent.agent_id, call.name, err)
            return self._count(None, "malformed_tool_input")
        proposal = built.proposal
        client = self.proxy.clients[agent.agent_id]
        with self.proxy.metrics.decision_seconds.time():
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
                return self._count(call.arguments if released else None, "no_certificate")
            except QuorumGateError as err:  # refused at submission (admission, secrets...)
                log.info("event=refused agent=%s tool=%s", agent.agent_id, mapping.tool)
                return self._count(None, err.reason or "refused")
        log.info(
            "event=decided agent=%s tool=%s proposal=%s outcome=%s",
            agent.agent_id,
            mapping.tool,
            decision.proposal_id.hex()[:16],
            decision.outcome.value,
        )
        if not decision.allowed:
            return self._count(None, decision.reason)
        return self._count(self._canonical(call, built, decision), decision.reason)

    def _canonical(self, call: ToolCall, built: Any, decision: Any) -> Released:
        """The call's arguments with its targets as the certificate names them; None when
        they are not the certified ones (then the call does not run)."""
        assert self.agent is not None
        proposal = built.proposal
        further = tuple((t.role, t.target) for t in proposal.targets)
        principal = (
            self.agent.agent_id if binds_caller(proposal.target, further) else names.CURRENT_USER
        )
        found = certified_call(
            proposal.tool,
            proposal.target,
            decision.certificate.leaf.target_digest,
            version=self.proxy.spec.canonical_version,
            principal=principal,
            targets=further,
        )
        if found is None:
            log.warning(
                "event=target_not_certified agent=%s tool=%s", self.agent.agent_id, proposal.tool
            )
            return None
        main, others = found
        added = built.main.scheme_added if built.main is not None else None
        version = self.proxy.spec.canonical_version
        return released_arguments(
            call,
            built,
            release_form(main, proposal.target, version=version, scheme_added=added),
            [
                release_form(o, written.target, version=version)
                for o, written in zip(others, proposal.targets, strict=True)
            ],
        )

    def _count(self, released: Released, reason: str) -> Released:
        outcome = "released" if released is not None else "withheld"
        if released is None and reason == "ok":
            reason = "target_not_certified"
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
        self.sessions = ResponseSessions()

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
                Route("/{path:path}", self.forward, methods=list(METHODS)),
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

    def _refuse(self, api: str | None, status: int, message: str, why: str) -> Response:
        self.metrics.refused.labels(why).inc()
        log.warning("event=refused_%s api=%s", why, api or "-")
        return _error(api, status, message, "permission_error" if status == 403 else "api_error")

    async def forward(self, request: Request) -> Response:
        assert self.http is not None
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        path = raw_path.decode("latin-1")
        kind, api = route(request.method, path, self.config.passthrough)
        if kind is DoorRoute.REFUSED:
            return self._refuse(None, 403, NOT_FORWARDED, "path")
        raw = await request.body()
        body: dict[str, Any] | None = None
        if api is not None:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            stream_flag = parsed.get("stream") if isinstance(parsed, dict) else None
            if not isinstance(parsed, dict) or stream_flag not in (None, True, False):
                # the SDK's way of reading the answer (streamed or not) is in this body
                return self._refuse(api, 400, BAD_REQUEST, "request")
            body = parsed
        query = request.scope.get("query_string") or b""
        url = self.upstream + path + (f"?{query.decode('latin-1')}" if query else "")
        upstream = self.http.build_request(
            request.method, url, headers=self._headers_up(request), content=raw
        )
        response = await self.http.send(upstream, stream=True)
        what = answer(response.status_code, api is not None)
        if what is not Answer.JUDGE:
            return await self._passed(response, api, what)
        assert api is not None and body is not None
        if not readable_encoding(response.headers.get("content-encoding")):
            await response.aclose()
            return self._refuse(api, 502, UNREADABLE, "encoding")
        return await self._judged(request, response, api, body)

    async def _passed(self, response: httpx.Response, api: str | None, what: Answer) -> Response:
        if what is Answer.REFUSE:
            # a redirect would take the SDK around the proxy; another status, no SDK reads
            await response.aclose()
            return self._refuse(api, 502, UNREADABLE, "status")
        headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            data = await _read_bounded(response)
        except (httpx.HTTPError, Unreadable):
            return self._refuse(api, 502, UNREADABLE, "body")
        return Response(data, status_code=response.status_code, headers=headers)

    async def _judged(
        self, request: Request, response: httpx.Response, api: str, body: dict[str, Any]
    ) -> Response:
        agent = self.config.resolve(request.headers.get(self.config.agent_header))
        label = ""
        if agent is not None:
            label = (api == "responses" and self.sessions.label_of(body)) or session_label(
                agent, body, request.headers
            )
        decide = _Decider(self, agent, label)
        headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in HOP_BY_HOP and k.lower() not in REWRITTEN
        }
        # the SDK reads a stream when it asked for one, whatever the upstream calls it
        streamed = body.get("stream") is True
        self.metrics.requests.labels(api, "yes" if streamed else "no").inc()
        if streamed:
            return StreamingResponse(
                self._stream(response, api, decide),
                status_code=200,
                headers=headers,
                media_type="text/event-stream",
            )
        try:
            document = await self._enforce(api, load_json(await _read_bounded(response)), decide)
        except httpx.HTTPError:
            log.warning("event=upstream_cut api=%s", api)
            self.metrics.refused.labels("response").inc()
            return _error(api, 502, UNREADABLE)
        except Exception as err:  # Unreadable, or our own bug: refused either way
            log.warning(
                "event=unreadable_response api=%s why=%s",
                api,
                err if isinstance(err, Unreadable) else type(err).__name__,
            )
            self.metrics.refused.labels("response").inc()
            return _error(api, 502, UNREADABLE)
        return Response(dumps(document).encode(), 200, headers, media_type="application/json")

    async def _enforce(self, api: str, document: Any, decide: _Decider) -> Any:
        if api == "anthropic":
            await messages.enforce_message(document, decide, self.denial)
        elif api == "openai":
            await chat.enforce_completion(document, decide)
        else:
            await responses.enforce_response(document, decide)
            if isinstance(document, dict):
                self.sessions.remember(document.get("id"), decide.label)
        return document

    async def _stream(
        self, response: httpx.Response, api: str, decide: _Decider
    ) -> AsyncIterator[bytes]:
        decoder = SseDecoder()
        enforcer: messages.MessageStream | chat.CompletionStream | responses.ResponseStream
        if api == "anthropic":
            enforcer = messages.MessageStream(decide, self.denial)
        elif api == "openai":
            enforcer = chat.CompletionStream(decide)
        else:
            enforcer = responses.ResponseStream(decide)
        chunks = response.aiter_bytes()
        try:
            async for chunk in chunks:
                for event in decoder.feed(chunk):
                    for out in await enforcer.feed(event):
                        yield out
                    if enforcer.finished:
                        break
                if enforcer.finished:
                    await _drain(chunks)  # what follows is never read: the SDK stopped
                    break
        except Unreadable as err:
            log.warning("event=unreadable_stream api=%s why=%s", api, err)
            self.metrics.refused.labels("stream").inc()
            yield STREAM_ERRORS[api](UNREADABLE)
        except httpx.HTTPError:
            log.warning("event=upstream_stream_cut api=%s", api)
        except Exception as err:  # our own bug: the stream still ends closed, and says so
            log.error("event=enforcer_failed api=%s error=%s", api, type(err).__name__)
            self.metrics.refused.labels("enforcer").inc()
            yield STREAM_ERRORS[api](UNREADABLE)
        finally:
            enforcer.close()  # a call still held was never complete: dropped
            if isinstance(enforcer, responses.ResponseStream):
                self.sessions.remember(enforcer.response_id, decide.label)
            await response.aclose()


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Reads (and drops) what an upstream sends after the end of a stream, up to
    DRAIN_BYTES_MAX, so that its connection can serve the next request."""
    size = 0
    with contextlib.suppress(httpx.HTTPError):
        async for part in chunks:
            size += len(part)
            if size > DRAIN_BYTES_MAX:
                return


async def _read_bounded(response: httpx.Response) -> bytes:
    """A whole answer, at most RESPONSE_BYTES_MAX bytes (then Unreadable), and closed."""
    parts: list[bytes] = []
    size = 0
    try:
        async for part in response.aiter_bytes():
            size += len(part)
            if size > RESPONSE_BYTES_MAX:
                raise Unreadable(f"an answer larger than {RESPONSE_BYTES_MAX} bytes")
            parts.append(part)
    finally:
        await response.aclose()
    return b"".join(parts)
