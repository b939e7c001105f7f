"""The principal's approvals console (issue 18, item 2): a web page on loopback.

    quorumgate console --dir D --principal KEYFILE [--listen 127.0.0.1:PORT]

- cluster status (each node alive, its height, view and leader), refreshed every second;
- the certified verdict stream (agent, tool, canonical target, verdict, height, the
  sidecars that signed), filterable by agent and outcome;
- the principal's open confirmation cards, rendered from the card bytes exactly as
  `quorumgate pending` prints them, each with Approve and Reject. A click signs the Confirm
  with the principal key this process holds (the page never sees it); a card disappears
  once its answer is certified.

Requests that change anything must carry the page's token (`X-QG-Token`, a random value
per process, compared in constant time) and come from the console's own origin: a page on
another site can neither read the token nor send the header (no CORS is ever allowed), so
it cannot make the principal's browser approve a call. The Host header must be the
console's own (DNS rebinding). Starlette serves it; the page uses no external resource.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import json
import logging
import secrets
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import Proposal
from quorumgate.proto.tx import TxRejected, parse
from quorumgate.sdk.client import Client, Decision, OpenCard, QuorumGateError
from quorumgate.sdk.targets import certified_call
from quorumgate.sidecar.engine.statements import escape_for_card

log = logging.getLogger("quorumgate.console")

VERDICTS_KEPT = 500  # the newest certified verdicts the page can show
BLOCKS_CACHED = 256
STATUS_REFRESH_S = 1.0
CARDS_REFRESH_S = 1.0
REGISTRY_REFRESH_S = 5.0
TOKEN_HEADER = "x-qg-token"


@dataclass
class VerdictRow:
    height: int
    index: int
    kind: str
    outcome: str
    reason: str
    agent: str
    tool: str
    target: str
    signers: tuple[int, ...]
    proposal: str
    signer: bytes = b""  # the transaction's key: named from the registry when shown

    def as_dict(self, names: dict[bytes, str]) -> dict[str, Any]:
        doc = {**self.__dict__, "signers": list(self.signers)}
        doc["agent"] = names.get(self.signer, self.agent)
        doc.pop("signer")
        return doc


class Console:
    """The console's state: one client with the principal's key, what it last read."""

    def __init__(self, spec: ClusterSpec, principal_key: SigningKey, listen: tuple[str, int]):
        self.spec = spec
        self.key = principal_key
        self.host, self.port = listen
        self.token = secrets.token_urlsafe(32)
        self.client: Client | None = None
        self.reader: Client | None = None
        self.verdicts: deque[VerdictRow] = deque(maxlen=VERDICTS_KEPT)
        self.cards: list[OpenCard] = []
        self.status: list[dict[str, Any]] = []
        self.agents_by_key: dict[bytes, str] = {}
        self._blocks: OrderedDict[int, list[bytes]] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ background

    @contextlib.asynccontextmanager
    async def lifespan(self, _: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(Client(self.spec, self.key))
            self.client = client
            # The verdict stream is read with the owner's key when this is the operator's
            # console (the cluster directory holds it); else with the principal's.
            try:
                reader = await stack.enter_async_context(Client.as_owner(self.spec.directory))
            except Exception:
                reader = client
            self.reader = reader
            self._tasks = [
                asyncio.create_task(self._follow_status()),
                asyncio.create_task(self._follow_cards()),
                asyncio.create_task(self._follow_verdicts()),
                asyncio.create_task(self._follow_registry()),
            ]
            try:
                yield
            finally:
                for task in self._tasks:
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _follow_status(self) -> None:
        from quorumgate.ops.nodes import query_status

        while True:
            rows = await asyncio.gather(
                *(asyncio.to_thread(query_status, self.spec, i) for i in range(self.spec.n))
            )
            self.status = [
                {"node": s.index, "alive": s.alive, "height": s.height, "view": s.view,
                 "leader": s.leader}
                for s in rows
            ]  # fmt: skip
            await asyncio.sleep(STATUS_REFRESH_S)

    async def _follow_cards(self) -> None:
        assert self.client is not None
        while True:
            with contextlib.suppress(QuorumGateError):
                self.cards = await self.client.pending()
            await asyncio.sleep(CARDS_REFRESH_S)

    async def _follow_registry(self) -> None:
        reader = self.reader
        assert reader is not None
        while True:
            try:
                registry = await reader.registry()
                names = {a.public_key: a.agent_id for a in registry.agents}
                names.update(
                    {p.public_key: f"principal {p.principal_id}" for p in registry.principals}
                )
                names[self.spec.owner_public_key] = "owner"
                self.agents_by_key = names
            except Exception:  # not readable with this key, or unreachable: keys shown as hex
                log.info("event=registry_unavailable")
            await asyncio.sleep(REGISTRY_REFRESH_S)

    async def _follow_verdicts(self) -> None:
        reader = self.reader
        assert reader is not None
        start = 0
        while True:
            try:
                if not start:
                    statuses = await reader.sidecar_status()
                    top = max((s.executed_height for s in statuses.values()), default=1)
                    start = max(1, top - 100)
                async for decision in reader.certified_verdicts(start):
                    self.verdicts.append(await self._row(decision))
                    start = decision.height
            except QuorumGateError as err:
                log.info("event=verdicts_unavailable reason=%s", err.reason)
            except Exception:  # the stream broke: start again where it was
                log.exception("event=verdicts_stream_failed")
            await asyncio.sleep(STATUS_REFRESH_S)

    async def _row(self, decision: Decision) -> VerdictRow:
        leaf = decision.certificate.leaf
        agent, tool, target, signer = "-", "-", "-", b""
        tx = await self._transaction(leaf.height, leaf.index)
        if tx is not None:
            try:
                parsed = parse(tx, verify=False)
            except TxRejected:
                parsed = None
            if parsed is not None:
                signer = parsed.signer
                agent = self.agents_by_key.get(signer, signer.hex()[:12])
                payload = parsed.body.payload
                if isinstance(payload, Proposal):
                    tool, target = payload.tool, self._canonical(payload, agent, leaf.target_digest)
                else:
                    tool = f"({leaf.kind})"
        return VerdictRow(
            leaf.height, leaf.index, leaf.kind, leaf.outcome, leaf.reason, agent, tool, target,
            tuple(decision.signers), decision.proposal_id.hex()[:16], signer,
        )  # fmt: skip

    def _canonical(self, proposal: Proposal, agent: str, digest: bytes) -> str:
        """The canonical target the certificate names (checked against its digest)."""
        further = tuple((t.role, t.target) for t in proposal.targets)
        found = certified_call(
            proposal.tool, proposal.target, digest, version=self.spec.canonical_version,
            principal=agent, targets=further,
        )  # fmt: skip
        if found is None:
            return "(refused before canonical)"
        main, extras = found
        lines = [
            main or "-",
            *(f"{role} {t}" for (role, _), t in zip(further, extras, strict=True)),
        ]
        # shown as a card shows agent text: no character draws over or hides another
        return "\n".join(escape_for_card(line) for line in lines)

    async def _transaction(self, height: int, index: int) -> bytes | None:
        block = self._blocks.get(height)
        if block is None:
            block = await asyncio.to_thread(self._read_block, height)
            if block is None:
                return None
            self._blocks[height] = block
            while len(self._blocks) > BLOCKS_CACHED:
                self._blocks.popitem(last=False)
        return block[index] if 0 <= index < len(block) else None

    def _read_block(self, height: int) -> list[bytes] | None:
        """The committed block at `height` (read as the owner, whose key is in the
        cluster directory: the operator's console); None if no replica answers."""
        import grpc

        from quorumgate.proto import client_pb2 as cpb
        from quorumgate.proto import client_pb2_grpc as cpb_grpc
        from quorumgate.replica.channels import sync_channel
        from quorumgate.replica.wire import decode_block
        from quorumgate.sdk.owner import owner_reader

        try:
            reader = owner_reader(self.spec)
        except Exception:  # no owner key here: the page shows no details
            return None
        for member in self.spec.members:
            with sync_channel(self.spec, member.index, reader=reader) as channel:
                call = cpb_grpc.ReplicaStub(channel).CommittedBlocks(
                    cpb.BlocksRequest(from_height=height), timeout=5
                )
                try:
                    for reply in call:
                        block = decode_block(self.spec.chain_id, reply.block.SerializeToString())
                        if block.height == height and block.hash == reply.hash:
                            return list(block.payload)
                        break
                except grpc.RpcError:
                    continue
                finally:
                    call.cancel()
        return None

    # ------------------------------------------------------------------ HTTP

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/", self.page, methods=["GET"]),
                Route("/api/state", self.state, methods=["GET"]),
                Route("/api/cards/{proposal}/{answer}", self.answer, methods=["POST"]),
            ],
            lifespan=self.lifespan,
        )

    def _own_host(self, request: Request) -> bool:
        host = request.headers.get("host", "")
        return host in (f"{self.host}:{self.port}", f"localhost:{self.port}")

    async def page(self, request: Request) -> Response:
        if not self._own_host(request):
            return Response("wrong host", status_code=403)
        body = PAGE.replace("__TOKEN__", html.escape(self.token)).replace(
            "__CHAIN__", html.escape(self.spec.chain_id)
        )
        return HTMLResponse(body, headers=SECURITY_HEADERS)

    async def state(self, request: Request) -> Response:
        if not self._own_host(request):
            return Response("wrong host", status_code=403)
        cards = [
            {
                "proposal": c.card.proposal_id.hex(),
                "digest": c.card.digest.hex(),
                "tool": c.card.tool,
                "text": c.render(),
            }
            for c in self.cards
        ]
        doc = {
            "status": self.status,
            "verdicts": [v.as_dict(self.agents_by_key) for v in reversed(self.verdicts)],
            "cards": cards,
        }
        return JSONResponse(doc, headers=SECURITY_HEADERS)

    async def answer(self, request: Request) -> Response:
        """Approve or reject one open card: same origin, the page's token, a card this key
        holds with that digest."""
        token = request.headers.get(TOKEN_HEADER, "")
        origin = request.headers.get("origin")
        own = {f"http://{self.host}:{self.port}", f"http://localhost:{self.port}"}
        if (
            not self._own_host(request)
            or (origin is not None and origin not in own)
            or not hmac.compare_digest(token.encode(), self.token.encode())
        ):
            return JSONResponse({"error": "forbidden"}, status_code=403)
        answer = request.path_params["answer"]
        if answer not in ("approve", "reject"):
            return JSONResponse({"error": "approve or reject"}, status_code=400)
        try:
            proposal = bytes.fromhex(request.path_params["proposal"])
            body = json.loads(await request.body() or b"{}")
            digest = bytes.fromhex(str(body.get("digest", "")))
        except ValueError:
            return JSONResponse({"error": "a proposal id and a card digest in hex"}, 400)
        card = next((c for c in self.cards if c.card.proposal_id == proposal), None)
        if card is None or card.card.digest != digest:
            return JSONResponse({"error": "no such open card"}, status_code=404)
        assert self.client is not None
        try:
            if answer == "approve":
                decision = await self.client.confirm(proposal, digest)
            else:
                decision = await self.client.reject(proposal, digest)
        except QuorumGateError as err:
            return JSONResponse({"error": err.reason or "refused"}, status_code=409)
        self.cards = [c for c in self.cards if c.card.proposal_id != proposal]
        log.info("event=answered proposal=%s answer=%s", proposal.hex()[:16], answer)
        return JSONResponse({"outcome": decision.outcome.value, "height": decision.height})


SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

# The page: static HTML and script (no external resource), its token and chain filled in.
PAGE = (Path(__file__).parent / "page.html").read_text()
