"""A local process against the approvals console: everything it can reach and read, and
it still cannot get a card approved (docs/security/approvals.md).

The attacker here is a process on the principal's machine (the agent itself, say): it
can connect to the console's port, send any header it likes (Host, Origin), read
whatever the console serves to it, and replay what it saw. It does not know the
principal's passphrase. Meanwhile the person has the console unlocked in a browser
(`ConsolePage`), so the console holds the key and the card: the strongest moment to
attack it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from quorumgate.console.app import PAGE, Console
from quorumgate.console.auth import PASSPHRASE_FAILURES_MAX, PASSPHRASE_WINDOW_S, SESSION_S_MAX
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.sdk.sync import SyncClient
from tests.console.conftest import IBAN, PASSPHRASE, Clock, ConsolePage, Setup, serving
from tests.support.cluster import wait_until

TOKENISH = re.compile(r"[A-Za-z0-9_\-]{20,}")


def _pending(cluster: ClusterSpec, setup: Setup, amount: str) -> Any:
    with SyncClient(cluster, setup.agent) as agent:
        pending = agent.propose("pay.send", IBAN, {"amount": amount}, run_id=f"inv-{amount}")
    assert pending.outcome.value == "pending" and pending.card is not None
    return pending


def _held_by(console: Console, proposal_id: bytes) -> None:
    """Wait until the console holds the card (it reads open cards every second), so that
    a refusal below is the console's, not a card it has not seen yet."""

    def held() -> bool:
        unlocked = console.unlocked
        return unlocked is not None and any(
            c.proposal_id == proposal_id for c in unlocked.feeds.cards
        )

    wait_until("the console to hold the card", held)


def _outcome(
    cluster: ClusterSpec, setup: Setup, proposal_id: bytes, *, settled: bool = False
) -> str:
    """The proposal's certified outcome now (`settled`: once a confirmation settled it)."""
    with SyncClient(cluster, setup.agent) as agent:
        return str(agent.await_certificate(proposal_id, 30, settled=settled).outcome.value)


@pytest.fixture
def person(setup: Setup) -> Iterator[ConsolePage]:
    """The person, with the console unlocked (and locked again after the test)."""
    with ConsolePage(setup.url) as page:
        assert page.unlock().status_code == 200
        yield page
        page.post("/api/lock", {})


@pytest.fixture
def clocked(setup: Setup) -> Iterator[tuple[Console, str, Clock]]:
    """A console of its own whose clock the test moves (sessions, the attempt window)."""
    clock = Clock()
    console = setup.new_console(clock)
    with serving(console) as url:
        yield console, url, clock


def test_a_local_process_that_reads_the_console_cannot_approve_a_card(
    cluster: ClusterSpec, setup: Setup, person: ConsolePage
) -> None:
    pending = _pending(cluster, setup, "450")
    pid, digest = pending.proposal_id.hex(), pending.card.digest.hex()
    _held_by(setup.console, pending.proposal_id)
    own = setup.url
    with httpx.Client(base_url=own, timeout=30) as local:
        served = local.get("/").text + local.get("/api/state").text
        served += local.get("/api/nonce").text  # a nonce for the unlock form: no secret
        stolen = set(TOKENISH.findall(served)) - {pid, digest}
        tries: list[dict[str, str]] = [{}, {"origin": own}]
        for token in stolen:  # anything in the page or the state that looks like a secret
            tries += [{"x-qg-token": token}, {"x-qg-token": token, "origin": own}]
            tries.append({"x-qg-nonce": token, "x-qg-session": token, "origin": own})
            cookie = f"{setup.console.cookie_name}={token}"
            tries.append({"x-qg-nonce": token, "cookie": cookie, "origin": own})
        answers = [
            local.post(f"/api/cards/{pid}/approve", json={"digest": digest}, headers=h)
            for h in tries
        ]
        # with a fresh nonce, the right origin and the body the page sends: no passphrase
        for guess in ("", "dana", "password"):
            nonce = local.get("/api/nonce").json()["nonce"]
            answers.append(
                local.post(
                    f"/api/cards/{pid}/approve",
                    json={"digest": digest, "passphrase": guess},
                    headers={"origin": own, "x-qg-nonce": nonce},
                )
            )
    assert [a.status_code for a in answers if a.status_code < 400] == []
    assert {a.status_code for a in answers} <= {401, 403}
    assert _outcome(cluster, setup, pending.proposal_id) == "pending"


def test_nothing_is_served_without_authentication(
    cluster: ClusterSpec, setup: Setup, person: ConsolePage
) -> None:
    pending = _pending(cluster, setup, "451")
    _held_by(setup.console, pending.proposal_id)
    cookie = f"{setup.console.cookie_name}={person.http.cookies[setup.console.cookie_name]}"
    with httpx.Client(base_url=setup.url, timeout=30) as local:
        state = local.get("/api/state")
        page = local.get("/")
        nonce = local.get("/api/nonce")
        # half a session is no session: the cookie without the header value, and back
        with_cookie = local.get("/api/state", headers={"cookie": cookie})
        with_header = local.get("/api/state", headers={"x-qg-session": person.session})
    assert state.status_code == with_cookie.status_code == with_header.status_code == 401
    for reply in (state, with_cookie, with_header, nonce):
        assert pending.proposal_id.hex() not in reply.text and IBAN not in reply.text
        assert cluster.chain_id not in reply.text
    # the page is the unlock form and the script, the same bytes for everyone
    assert page.status_code == 200 and page.text == PAGE
    assert cluster.chain_id not in page.text and pending.proposal_id.hex() not in page.text
    assert set(nonce.json()) == {"nonce"}
    # the person's session sees it all
    assert pending.proposal_id.hex() in person.state().text


def test_a_forged_or_missing_origin_is_refused_even_within_the_session(
    cluster: ClusterSpec, setup: Setup, person: ConsolePage
) -> None:
    """Origin stops another site's page in the person's browser; a local process could
    forge it, which is why it is not the only check. Each request below has the session,
    a fresh nonce and the passphrase, and one thing wrong."""
    pending = _pending(cluster, setup, "452")
    _held_by(setup.console, pending.proposal_id)
    path = f"/api/cards/{pending.proposal_id.hex()}/approve"
    body = {"digest": pending.card.digest.hex(), "passphrase": PASSPHRASE}

    def send(drop: str = "", **headers: str) -> int:
        sent = person.headers(x_qg_nonce=person.nonce(), **headers)
        sent.pop(drop, None)
        return person.http.post(path, json=body, headers=sent).status_code

    assert send(origin="https://evil.example") == 403
    assert send(origin="http://127.0.0.1:1") == 403  # another port: another origin
    assert send(drop="origin") == 403
    assert send(sec_fetch_site="cross-site") == 403
    assert send(sec_fetch_site="same-site") == 403
    assert send(host="evil.example") == 403  # DNS rebinding
    form = person.headers(x_qg_nonce=person.nonce(), content_type="text/plain")
    assert person.http.post(path, content=b"{}", headers=form).status_code == 415
    assert _outcome(cluster, setup, pending.proposal_id) == "pending"
    assert send() == 200  # the same request, nothing wrong with it: the refusals were real
    assert _outcome(cluster, setup, pending.proposal_id, settled=True) == "allow"


def test_a_replayed_post_is_refused(cluster: ClusterSpec, setup: Setup) -> None:
    """A POST, seen once, cannot be sent again: each carries a nonce used up by the
    first, so a recorded unlock opens no session and a recorded answer signs nothing."""
    with ConsolePage(setup.url) as page:
        unlock = page.http.build_request(
            "POST", "/api/unlock", json={"passphrase": PASSPHRASE},
            headers=page.headers(x_qg_nonce=page.nonce()),
        )  # fmt: skip
        first = page.http.send(unlock)
        assert first.status_code == 200
        page.session = first.json()["session"]
        with httpx.Client(base_url=setup.url, timeout=30) as local:
            replayed = local.send(unlock)
            assert replayed.status_code == 403 and "nonce" in replayed.json()["error"]
            assert local.cookies.get(setup.console.cookie_name) is None
        first_card = _pending(cluster, setup, "453")
        second_card = _pending(cluster, setup, "454")
        _held_by(setup.console, second_card.proposal_id)
        answer = page.http.build_request(
            "POST", f"/api/cards/{first_card.proposal_id.hex()}/reject",
            json={"digest": first_card.card.digest.hex(), "passphrase": PASSPHRASE},
            headers=page.headers(x_qg_nonce=page.nonce()),
        )  # fmt: skip
        assert page.http.send(answer).status_code == 200
        again = page.http.send(answer)
        assert again.status_code == 403 and "nonce" in again.json()["error"]
        # the recorded request, retargeted at the other card: the nonce is still spent
        answer.url = answer.url.copy_with(path=f"/api/cards/{second_card.proposal_id.hex()}/reject")
        assert page.http.send(answer).status_code == 403
        assert _outcome(cluster, setup, second_card.proposal_id) == "pending"
        page.post("/api/lock", {})


def test_another_sessions_cookie_or_nonce_is_refused(cluster: ClusterSpec, setup: Setup) -> None:
    name = setup.console.cookie_name
    with ConsolePage(setup.url) as first, ConsolePage(setup.url) as second:
        assert first.unlock().status_code == second.unlock().status_code == 200
        mixed = {"x-qg-session": second.session, "cookie": f"{name}={first.http.cookies[name]}"}
        with httpx.Client(base_url=setup.url, timeout=30) as local:
            assert local.get("/api/state", headers=mixed).status_code == 401
        pending = _pending(cluster, setup, "455")
        _held_by(setup.console, pending.proposal_id)
        path = f"/api/cards/{pending.proposal_id.hex()}/approve"
        body = {"digest": pending.card.digest.hex(), "passphrase": PASSPHRASE}
        headers = second.headers(x_qg_nonce=first.nonce())
        refused = second.http.post(path, json=body, headers=headers)
        assert refused.status_code == 403
        # a session that was locked is over, for the cookie and header it had
        saved = (first.http.cookies[name], first.session)
        assert first.post("/api/lock", {}).status_code == 200
        stale = {"x-qg-session": saved[1], "cookie": f"{name}={saved[0]}"}
        with httpx.Client(base_url=setup.url, timeout=30) as local:
            assert local.get("/api/state", headers=stale).status_code == 401
        assert second.state().status_code == 200  # the other session goes on
        assert _outcome(cluster, setup, pending.proposal_id) == "pending"
        assert second.answer(pending, "reject").status_code == 200
        second.post("/api/lock", {})


def test_wrong_passphrases_answer_nothing_and_attempts_are_bounded(
    cluster: ClusterSpec, setup: Setup, clocked: tuple[Console, str, Clock]
) -> None:
    """PASSPHRASE_FAILURES_MAX wrong passphrases (unlocking or answering, counted
    together) in PASSPHRASE_WINDOW_S; then every attempt is refused, the right one too,
    until the window has moved on."""
    console, url, clock = clocked
    pending = _pending(cluster, setup, "456")
    with ConsolePage(url) as page, ConsolePage(url) as other:
        assert page.unlock("not the passphrase").status_code == 401
        assert page.state().status_code == 401
        assert page.unlock().status_code == 200
        _held_by(console, pending.proposal_id)
        guesses = [f"guess {k}" for k in range(PASSPHRASE_FAILURES_MAX - 2)] + [""]
        wrong = [page.answer(pending, "approve", guess) for guess in guesses]
        # the wrong unlock and these make PASSPHRASE_FAILURES_MAX (an empty one counts)
        assert [r.status_code for r in wrong] == [401] * (PASSPHRASE_FAILURES_MAX - 1)
        limited = page.answer(pending, "approve")  # the right passphrase, too late
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) > 0
        assert other.unlock().status_code == 429  # unlocking shares the bound
        assert _outcome(cluster, setup, pending.proposal_id) == "pending"
        clock.advance(PASSPHRASE_WINDOW_S - 1)
        assert page.answer(pending, "approve").status_code == 429
        clock.advance(1)
        assert page.answer(pending, "approve").status_code == 200
    assert _outcome(cluster, setup, pending.proposal_id, settled=True) == "allow"


def test_a_session_ends_on_time_or_on_lock_and_the_key_goes_with_it(
    setup: Setup, clocked: tuple[Console, str, Clock]
) -> None:
    console, url, clock = clocked
    assert console.unlocked is None  # a console starts locked: no key, nothing read
    with ConsolePage(url) as page:
        assert page.unlock().status_code == 200 and console.unlocked is not None
        assert page.state().status_code == 200
        clock.advance(SESSION_S_MAX - 1)
        assert page.state().status_code == 200
        clock.advance(1)
        assert page.state().status_code == 401
        wait_until("the console to drop the key", lambda: console.unlocked is None)
        assert page.unlock().status_code == 200 and console.unlocked is not None
        assert page.post("/api/lock", {}).status_code == 200
        assert console.unlocked is None  # at once: the last session was locked
        assert page.state().status_code == 401
