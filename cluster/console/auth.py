"""Who may use the approvals console: sessions, single-use nonces, and the bound on
passphrase attempts (docs/security/approvals.md).

Pure: the clock and the source of random tokens are passed in, so a test moves time past
a session's end or a window of failed attempts without waiting. The HTTP shell
(`console/app.py`) asks this module three questions of every request — which session it
belongs to, whether its nonce is fresh, whether a passphrase may be tried now — and
holds the answers' effects (the key, the clients) itself.

A session is two secrets, both needed on every request: a cookie (HttpOnly, so no
script reads it; SameSite=Strict, so no other site's page sends it) and a value the page
keeps in memory and sends in a header. Cookies are not separated by port (RFC 6265
§8.5), so any other server on this host that the browser visits receives the cookie; it
does not receive the header value, which is never stored.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

SESSION_S_MAX = 900.0  # a session ends this long after the unlock that opened it
SESSIONS_MAX = 4  # open at once (a reload opens a new one); a fifth ends the oldest
NONCE_S_MAX = 120.0  # a nonce answers one request within this long of being issued
NONCES_PER_SESSION_MAX = 8  # unused nonces a session holds; a ninth drops the oldest
UNLOCK_NONCES_MAX = 16  # unused nonces for the unlock form, for everyone together
# Wrong passphrases (unlocking or answering) allowed in any PASSPHRASE_WINDOW_S; after
# that every attempt, right or wrong, is refused until the oldest failure leaves the
# window. Each attempt also costs one Argon2id derivation.
PASSPHRASE_FAILURES_MAX = 5
PASSPHRASE_WINDOW_S = 300.0


def _digest(secret: str) -> bytes:
    """Sessions are found by a hash of their cookie, so that the lookup's timing says
    nothing about how much of a guessed cookie matched."""
    return hashlib.sha256(secret.encode()).digest()


@dataclass
class Session:
    cookie: str  # set HttpOnly, SameSite=Strict
    header: str  # given to the page once, in the unlock answer; sent as X-QG-Session
    started_s: float
    nonces: OrderedDict[str, float] = field(default_factory=OrderedDict)


class Gate:
    """The console's sessions, nonces and passphrase-attempt window."""

    def __init__(self, clock: Callable[[], float], token: Callable[[], str]) -> None:
        self.clock = clock
        self.token = token
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()
        self._unlock_nonces: OrderedDict[str, float] = OrderedDict()
        self._failures: deque[float] = deque(maxlen=PASSPHRASE_FAILURES_MAX)

    # ------------------------------------------------------------------ sessions

    def open_session(self) -> Session:
        while len(self._sessions) >= SESSIONS_MAX:
            self._sessions.popitem(last=False)
        session = Session(self.token(), self.token(), self.clock())
        self._sessions[_digest(session.cookie)] = session
        return session

    def session(self, cookie: str, header: str) -> Session | None:
        """The live session both secrets name, or None."""
        found = self._sessions.get(_digest(cookie)) if cookie else None
        if found is None or not hmac.compare_digest(found.header.encode(), header.encode()):
            return None
        if self.clock() - found.started_s >= SESSION_S_MAX:
            self.end(found)
            return None
        return found

    def end(self, session: Session) -> None:
        self._sessions.pop(_digest(session.cookie), None)

    def expire(self) -> bool:
        """End every session past SESSION_S_MAX; whether any session is still open."""
        now = self.clock()
        for key, session in list(self._sessions.items()):
            if now - session.started_s >= SESSION_S_MAX:
                del self._sessions[key]
        return bool(self._sessions)

    def expires_in_s(self, session: Session) -> float:
        return max(0.0, SESSION_S_MAX - (self.clock() - session.started_s))

    # ------------------------------------------------------------------ nonces

    def issue_nonce(self, session: Session | None) -> str:
        """A nonce for one request of `session` (None: the unlock form)."""
        pool, most = (
            (self._unlock_nonces, UNLOCK_NONCES_MAX)
            if session is None
            else (session.nonces, NONCES_PER_SESSION_MAX)
        )
        while len(pool) >= most:
            pool.popitem(last=False)
        nonce = self.token()
        pool[nonce] = self.clock()
        return nonce

    def take_nonce(self, session: Session | None, nonce: str) -> bool:
        """Whether `nonce` was issued for `session` (None: the unlock form), is unused and
        fresh; a nonce of that scope is used up whether it was fresh or not."""
        pool = self._unlock_nonces if session is None else session.nonces
        issued = pool.pop(nonce, None) if nonce else None
        return issued is not None and self.clock() - issued < NONCE_S_MAX

    # ------------------------------------------------------------------ passphrases

    def attempt_allowed(self) -> bool:
        """Whether a passphrase may be tried now (PASSPHRASE_FAILURES_MAX)."""
        if len(self._failures) < PASSPHRASE_FAILURES_MAX:
            return True
        return self.clock() - self._failures[0] >= PASSPHRASE_WINDOW_S

    def failed(self) -> None:
        self._failures.append(self.clock())

    def retry_after_s(self) -> float:
        if self.attempt_allowed():
            return 0.0
        return PASSPHRASE_WINDOW_S - (self.clock() - self._failures[0])
