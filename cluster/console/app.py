"""The principal's approvals console: a web page on loopback.

    quorumgate console --dir D --principal SEALED_KEYFILE [--listen 127.0.0.1:PORT]

The console starts locked: it holds the principal's key file sealed (proto/sealedkey.py)
and serves nothing but a static page with an unlock form. The person types the
passphrase; it opens the key, and a session begins (`console/auth.py`): for at most
SESSION_S_MAX the page shows the cluster's status, the certified verdict stream and the
principal's open confirmation cards, rendered from the card bytes exactly as `quorumgate
pending` prints them. Each card has Approve and Reject, and **each answer asks for the
passphrase again**: the console signs it only when that passphrase opens the sealed key
once more, so a click alone — a script in the session's page, keystrokes injected into
the browser, a stolen session — answers nothing. When the last session ends (Lock, or its
time) the console drops the key and everything it read.

Every request is checked in this order, and refused at the first check it fails:
- the Host header is the console's own (DNS rebinding);
- an API read carries the session's cookie and its header value;
- a POST also comes from the console's own origin (an `Origin` header is required, and a
  `Sec-Fetch-Site`, when the browser sends one, must be `same-origin`), is JSON (an HTML
  form cannot send it), and carries a nonce this console issued for that session (or for
  the unlock form), unused and fresh: a replayed request is refused;
- an unlock or an answer carries a passphrase, tried only within the bound on failed
  attempts (PASSPHRASE_FAILURES_MAX per PASSPHRASE_WINDOW_S) and one Argon2id
  derivation at a time.

docs/security/approvals.md says what this stops (another site's page, another OS user,
a process of the same user that can reach the port) and what it cannot (a process that
reads the person's keystrokes or this process's memory). Starlette serves it; the page
uses no external resource and its one script is pinned by hash in the CSP.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from nacl.signing import SigningKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from quorumgate.console.auth import SESSION_S_MAX, Gate, Session
from quorumgate.console.feeds import Feeds
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.sealedkey import SealedKey, SealedKeyError, WrongPassphrase
from quorumgate.sdk.client import Client, QuorumGateError

log = logging.getLogger("quorumgate.console")

SESSION_HEADER = "x-qg-session"
NONCE_HEADER = "x-qg-nonce"
BODY_BYTES_MAX = 4096  # an unlock or an answer: a digest and a passphrase
KDF_WAITING_MAX = 4  # requests waiting for their Argon2id turn; more are told to retry
SESSION_CHECK_S = 1.0  # how often ended sessions are looked for (and the key dropped)
TOKEN_BYTES = 32
ANSWERS = ("approve", "reject")


def _error(status: int, error: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": error}, status_code=status, headers=SECURITY_HEADERS | headers)


@dataclass
class Unlocked:
    """What the console holds between an unlock and the lock after it."""

    key: SigningKey
    stack: contextlib.AsyncExitStack
    client: Client
    feeds: Feeds


class Console:
    """The console: the sealed key, the sessions, and (while unlocked) the key and feeds."""

    def __init__(
        self,
        spec: ClusterSpec,
        sealed: SealedKey,
        listen: tuple[str, int],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.sealed = sealed
        self.host, self.port = listen
        self.gate = Gate(clock, lambda: secrets.token_urlsafe(TOKEN_BYTES))
        # Cookies are shared by every port of a host (RFC 6265 §8.5): one name per
        # console, so that two consoles on one machine do not end each other's sessions.
        self.cookie_name = f"qg_console_{self.port}"
        self.unlocked: Unlocked | None = None
        self._kdf_turn: asyncio.Lock | None = None
        self._transition: asyncio.Lock | None = None  # unlocking and locking, one at a time
        self._kdf_waiting = 0
        self._reaper: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lock and unlock

    @contextlib.asynccontextmanager
    async def lifespan(self, _: Starlette) -> AsyncIterator[None]:
        self._kdf_turn = asyncio.Lock()
        self._transition = asyncio.Lock()
        self._reaper = asyncio.create_task(self._reap())
        try:
            yield
        finally:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            await self._lock("stopped", force=True)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(SESSION_CHECK_S)
            if self.unlocked is not None:
                await self._lock("sessions_ended")

    async def _open_session(self, key: SigningKey) -> Session:
        """A new session, the key and the feeds in place first if this is the first."""
        assert self._transition is not None
        async with self._transition:
            if self.unlocked is None:
                self.unlocked = await self._unlocked(key)
                log.info("event=unlocked")
            return self.gate.open_session()

    async def _unlocked(self, key: SigningKey) -> Unlocked:
        stack = contextlib.AsyncExitStack()
        try:
            client = await stack.enter_async_context(Client(self.spec, key))
            # The verdict stream is read with the owner's key when this is the operator's
            # console (the cluster directory holds it); else with the principal's.
            try:
                reader = await stack.enter_async_context(Client.as_owner(self.spec.directory))
            except Exception:
                reader = client
        except BaseException:
            await stack.aclose()
            raise
        feeds = Feeds(self.spec, client, reader)
        feeds.start()
        return Unlocked(key, stack, client, feeds)

    async def _lock(self, reason: str, *, force: bool = False) -> None:
        """Drop the key and the feeds once no session is open (`force`: at once)."""
        assert self._transition is not None
        async with self._transition:
            if self.unlocked is None or (self.gate.expire() and not force):
                return
            unlocked, self.unlocked = self.unlocked, None
        await unlocked.feeds.stop()
        await unlocked.stack.aclose()
        log.info("event=locked reason=%s", reason)

    async def _open_key(self, passphrase: str) -> SigningKey | Response:
        """The principal's key if `passphrase` opens the sealed file, within the bound on
        failed attempts and one derivation at a time; else the refusal to send."""
        assert self._kdf_turn is not None
        if self._kdf_waiting >= KDF_WAITING_MAX:
            return _error(429, "busy: try again", **{"Retry-After": "1"})
        self._kdf_waiting += 1
        try:
            async with self._kdf_turn:
                if not self.gate.attempt_allowed():
                    wait = str(int(self.gate.retry_after_s()) + 1)
                    return _error(429, "too many wrong passphrases", **{"Retry-After": wait})
                try:
                    seed = await asyncio.to_thread(self.sealed.open, passphrase)
                except WrongPassphrase:
                    self.gate.failed()
                    log.warning("event=wrong_passphrase")
                    return _error(401, "wrong passphrase")
                except SealedKeyError as err:  # too long: refused before any derivation
                    return _error(400, str(err))
        finally:
            self._kdf_waiting -= 1
        return SigningKey(seed)

    # ------------------------------------------------------------------ checks

    def _own_hosts(self) -> set[str]:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return {f"{host}:{self.port}", f"localhost:{self.port}"}

    def _own_host(self, request: Request) -> bool:
        return request.headers.get("host", "") in self._own_hosts()

    def _same_origin(self, request: Request) -> bool:
        """A browser names the page a POST comes from; a POST that names none is not the
        page's (every browser this console supports sends Origin on a POST)."""
        origin = request.headers.get("origin")
        fetch_site = request.headers.get("sec-fetch-site", "same-origin")
        own = {f"http://{h}" for h in self._own_hosts()}
        return origin in own and fetch_site == "same-origin"

    def _session(self, request: Request) -> Session | None:
        cookie = request.cookies.get(self.cookie_name, "")
        return self.gate.session(cookie, request.headers.get(SESSION_HEADER, ""))

    async def _guard(
        self, request: Request, *, session_needed: bool, fields: tuple[str, ...]
    ) -> tuple[Session | None, dict[str, str]] | Response:
        """The checks every POST passes (the module's docstring), then its JSON body:
        an object of exactly `fields`, each a string."""
        if not self._own_host(request):
            return _error(403, "wrong host")
        if not self._same_origin(request):
            return _error(403, "not from the console's own page")
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            return _error(415, "a JSON body")
        session = self._session(request)
        if session_needed and session is None:
            return _error(401, "not unlocked")
        scope = session if session_needed else None
        if not self.gate.take_nonce(scope, request.headers.get(NONCE_HEADER, "")):
            return _error(403, "stale or unknown nonce: fetch a new one")
        body = await _read_json(request, fields)
        if body is None:
            return _error(400, f"a JSON object of strings: {', '.join(fields) or 'none'}")
        return session, body

    # ------------------------------------------------------------------ HTTP

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/", self.page, methods=["GET"]),
                Route("/api/nonce", self.nonce, methods=["GET"]),
                Route("/api/unlock", self.unlock, methods=["POST"]),
                Route("/api/lock", self.lock, methods=["POST"]),
                Route("/api/state", self.state, methods=["GET"]),
                Route("/api/cards/{proposal}/{answer}", self.answer, methods=["POST"]),
            ],
            lifespan=self.lifespan,
        )

    async def page(self, request: Request) -> Response:
        """The same bytes for everyone: the unlock form and the script, no data."""
        if not self._own_host(request):
            return _error(403, "wrong host")
        return HTMLResponse(PAGE, headers=SECURITY_HEADERS | {"Content-Security-Policy": CSP})

    async def nonce(self, request: Request) -> Response:
        """A nonce for the next POST: the session's when the request names one, else one
        for the unlock form. It tells nothing; it only makes each POST single-use."""
        if not self._own_host(request):
            return _error(403, "wrong host")
        return JSONResponse(
            {"nonce": self.gate.issue_nonce(self._session(request))}, headers=SECURITY_HEADERS
        )

    async def unlock(self, request: Request) -> Response:
        guarded = await self._guard(request, session_needed=False, fields=("passphrase",))
        if isinstance(guarded, Response):
            return guarded
        key = await self._open_key(guarded[1]["passphrase"])
        if isinstance(key, Response):
            return key
        session = await self._open_session(key)
        reply = JSONResponse(
            {"session": session.header, "expires_in_s": SESSION_S_MAX}, headers=SECURITY_HEADERS
        )
        # No Max-Age: a browser keeps the cookie in memory, not in its cookie store on
        # disk; the console ends the session after SESSION_S_MAX whatever the browser does.
        reply.set_cookie(
            self.cookie_name, session.cookie, httponly=True, samesite="strict", path="/"
        )
        return reply

    async def lock(self, request: Request) -> Response:
        guarded = await self._guard(request, session_needed=True, fields=())
        if isinstance(guarded, Response):
            return guarded
        session = guarded[0]
        assert session is not None
        self.gate.end(session)
        await self._lock("locked_by_person")
        reply = JSONResponse({"locked": True}, headers=SECURITY_HEADERS)
        reply.delete_cookie(self.cookie_name, path="/", httponly=True, samesite="strict")
        return reply

    async def state(self, request: Request) -> Response:
        if not self._own_host(request):
            return _error(403, "wrong host")
        if request.headers.get("sec-fetch-site", "same-origin") != "same-origin":
            return _error(403, "not from the console's own page")
        session = self._session(request)
        if session is None or self.unlocked is None:
            return _error(401, "not unlocked")
        doc = {
            "chain": self.spec.chain_id,
            "principal_key": self.sealed.public_key.hex(),
            "expires_in_s": round(self.gate.expires_in_s(session)),
            **self.unlocked.feeds.state(),
        }
        return JSONResponse(doc, headers=SECURITY_HEADERS)

    async def answer(self, request: Request) -> Response:
        """Approve or reject one open card: a session, a fresh nonce, the card this key
        holds with that digest, and the passphrase typed for this answer."""
        guarded = await self._guard(request, session_needed=True, fields=("digest", "passphrase"))
        if isinstance(guarded, Response):
            return guarded
        body = guarded[1]
        answer = request.path_params["answer"]
        if answer not in ANSWERS:
            return _error(400, "approve or reject")
        try:
            proposal = bytes.fromhex(request.path_params["proposal"])
            digest = bytes.fromhex(body["digest"])
        except ValueError:
            return _error(400, "a proposal id and a card digest in hex")
        unlocked = self.unlocked
        cards = unlocked.feeds.cards if unlocked is not None else []
        card = next((c for c in cards if c.card.proposal_id == proposal), None)
        if unlocked is None or card is None or card.card.digest != digest:
            return _error(404, "no such open card")
        key = await self._open_key(body["passphrase"])
        if isinstance(key, Response):
            return key
        if key.verify_key != unlocked.key.verify_key or self.unlocked is not unlocked:
            return _error(409, "the console was locked meanwhile")
        try:
            decision = await unlocked.client.confirm(proposal, digest, reject=answer == "reject")
        except QuorumGateError as err:
            return _error(409, err.reason or "refused")
        unlocked.feeds.cards = [c for c in unlocked.feeds.cards if c.card.proposal_id != proposal]
        log.info("event=answered proposal=%s answer=%s", proposal.hex()[:16], answer)
        return JSONResponse(
            {"outcome": decision.outcome.value, "height": decision.height},
            headers=SECURITY_HEADERS,
        )


async def _read_json(request: Request, fields: tuple[str, ...]) -> dict[str, str] | None:
    """The body as a JSON object of exactly `fields`, each a string, read to at most
    BODY_BYTES_MAX bytes; None for anything else."""
    data = b""
    async for chunk in request.stream():
        data += chunk
        if len(data) > BODY_BYTES_MAX:
            return None
    try:
        doc = json.loads(data or b"{}")
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or set(doc) != set(fields):
        return None
    if not all(isinstance(v, str) for v in doc.values()):
        return None
    return doc


# The page: static HTML and one inline script, pinned by its hash (no other script can
# run in it, whatever a card or a verdict might hold), and no external resource.
PAGE = (Path(__file__).parent / "page.html").read_text()
_SCRIPT = re.search(r"<script>(.*?)</script>", PAGE, re.S)
assert _SCRIPT is not None, "page.html has its one inline script"
SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.group(1).encode()).digest()).decode()
CSP = (
    f"default-src 'none'; script-src 'sha256-{SCRIPT_HASH}'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self'; form-action 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
