"""The approvals console in a real headless browser: Chromium from Debian's packages
driven by Playwright, against a live 4-node cluster. The person unlocks the page with the
principal key's passphrase, sees a pending payment's card, types the passphrase again for
that answer and clicks Approve; the console signs the Confirm and the payment's
certificate reaches the agent waiting for it. A page on another origin, open in the same
browser while the session lasts, answers nothing."""

from __future__ import annotations

import os
import threading
import unicodedata
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, Page, sync_playwright
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proxy.fake import ServerThread
from quorumgate.sdk.builders import mandate, tool_spec
from quorumgate.sdk.client import Decision
from quorumgate.sdk.sync import SyncClient
from tests.console.conftest import CANONICAL, IBAN, PASSPHRASE, Setup, chromium

SCREENSHOT_ENV = "QG_CONSOLE_SCREENSHOT"  # where to keep the screenshot (the README's)
WAIT_MS = 30_000


def _browser(pw: Any) -> Browser:
    browser: Browser = pw.chromium.launch(
        executable_path=chromium(), headless=True, args=["--no-sandbox"]
    )
    return browser


def _unlock(page: Page, passphrase: str = PASSPHRASE) -> None:
    page.fill("#unlock-passphrase", passphrase)
    page.click("#unlock")


def test_approving_a_payment_in_the_browser_releases_its_certificate(
    cluster: ClusterSpec, setup: Setup, tmp_path: Path
) -> None:
    with SyncClient(cluster, setup.agent) as agent:
        pending = agent.propose("pay.send", IBAN, {"amount": "120"}, run_id="invoice-7")
        assert pending.outcome.value == "pending"
        pid = pending.proposal_id.hex()
        settled: list[Decision] = []
        waiter = threading.Thread(
            target=lambda: settled.append(
                agent.await_certificate(pending.proposal_id, 120, settled=True)
            ),
            daemon=True,
        )
        waiter.start()
        with sync_playwright() as pw:
            browser = _browser(pw)
            try:
                page = browser.new_page(viewport={"width": 1100, "height": 900})
                page.goto(setup.url + "/")
                assert page.is_visible("#locked") and not page.is_visible("#cards")
                _unlock(page, "not my passphrase")
                page.wait_for_selector("#unlock-result >> text=wrong passphrase", timeout=WAIT_MS)
                assert not page.is_visible("#cards")
                _unlock(page)
                card = page.wait_for_selector(f"#card-{pid}", timeout=WAIT_MS)
                assert card is not None
                text = card.inner_text()
                assert "pay.send" in text and CANONICAL in text and '"120"' in text
                assert "principal console-dana" in text
                page.wait_for_selector("#status tr:nth-child(2)", timeout=WAIT_MS)
                page.wait_for_selector(f"#verdicts td.target >> text={CANONICAL}", timeout=WAIT_MS)
                shot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "console.png")
                page.screenshot(path=str(shot), full_page=True)
                # a click alone answers nothing: the answer needs the passphrase again
                page.click(f"#card-{pid} button.approve")
                page.wait_for_selector(
                    f"#card-{pid} .result >> text=refused: wrong passphrase", timeout=WAIT_MS
                )
                assert not settled
                page.fill(f"#card-{pid} input.passphrase", PASSPHRASE)
                page.click(f"#card-{pid} button.approve")
                page.wait_for_selector(f"#card-{pid}", state="detached", timeout=WAIT_MS)
                waiter.join(120)
                assert settled and settled[0].allowed  # the certificate reached the agent
                # the verdict stream shows the confirmed payment, canonical target and all
                page.wait_for_selector(f"#verdicts td.target >> text={CANONICAL}", timeout=WAIT_MS)
                rows = page.inner_text("#verdicts")
                assert "billing-bot" in rows and "pay.send" in rows
                # the filters: another agent shows nothing; this agent's pending rows only
                page.fill("#agent", "nobody")
                page.wait_for_selector("#verdicts tr:nth-child(2)", state="detached")
                page.fill("#agent", "billing-bot")
                page.select_option("#outcome", "pending")
                page.wait_for_selector(f"#verdicts td.target >> text={CANONICAL}")
                shown = page.inner_text("#verdicts")
                assert "applied" not in shown and "owner" not in shown
                # Lock: the page forgets the session and the console drops the key
                page.click("#lock")
                page.wait_for_selector("#locked", state="visible", timeout=WAIT_MS)
                assert setup.console.unlocked is None
            finally:
                browser.close()


def test_combining_marks_on_a_card_are_escaped_in_the_browser(
    cluster: ClusterSpec, owner: SyncClient, setup: Setup
) -> None:
    """A combining mark draws over the character before it: in the browser as on the
    terminal, `1\u0336200` would show a struck-through 1. The page shows the escape, on
    the card (values and target) and in the verdict stream's canonical target."""
    owner.register_tool(
        tool_spec("docs.sign", "user_confirm", schemes=["file"], min_tier="delegate")
    )
    owner.set_mandate("billing-bot", mandate(["pay.send", "docs.sign"]))
    with SyncClient(cluster, setup.agent) as agent:
        pending = agent.propose("pay.send", IBAN, {"amount": "1\u0336200\u20dd"}, run_id="inv-9")
        signing = agent.propose("docs.sign", "/docs/1\u0336.txt", {}, run_id="inv-9")
    assert signing.outcome.value == "pending"
    with sync_playwright() as pw:
        browser = _browser(pw)
        try:
            page = browser.new_page()
            page.goto(setup.url + "/")
            _unlock(page)
            card = page.wait_for_selector(f"#card-{pending.proposal_id.hex()}", timeout=WAIT_MS)
            assert card is not None
            text = card.inner_text()
            assert 'amount = "1\\u{336}200\\u{20dd}"' in text
            other = page.wait_for_selector(f"#card-{signing.proposal_id.hex()}", timeout=WAIT_MS)
            assert other is not None
            text += other.inner_text()
            assert 'Target: "/docs/1\\u{336}.txt"' in text
            escaped = "/docs/1\\u{336}.txt"
            page.wait_for_function(
                "t => [...document.querySelectorAll('#verdicts td.target')]"
                ".some(td => td.textContent === t)",
                arg=escaped, timeout=WAIT_MS,
            )  # fmt: skip
            text += page.inner_text("#verdicts")
            assert not [ch for ch in text if unicodedata.category(ch).startswith("M")]
            page.click("#lock")
            page.wait_for_selector("#locked", state="visible", timeout=WAIT_MS)
        finally:
            browser.close()


# Another origin's page (another port on this host: the same *site* to a browser, so
# SameSite cookies travel to the console) tries every request it can make, with the
# passphrase itself, as if it had learned it, and reports what it could read.
EVIL_PAGE = """<!doctype html><html><body><pre id="log"></pre>
<form id="form" method="POST" enctype="text/plain" action="CONSOLE/api/cards/PID/approve">
<input name='{"digest":"DIGEST","passphrase":"PASSPHRASE","x":"' value='"}'></form>
<script>
const log = t => { document.getElementById('log').textContent += t + '\\n'; };
const body = JSON.stringify({digest: 'DIGEST', passphrase: 'PASSPHRASE'});
const url = 'CONSOLE/api/cards/PID/approve';
(async () => {
  try { const r = await fetch('CONSOLE/api/state', {credentials: 'include'});
        log('state read: ' + (await r.text())); } catch (e) { log('state: blocked'); }
  try { const r = await fetch('CONSOLE/api/nonce', {credentials: 'include'});
        log('nonce read: ' + (await r.text())); } catch (e) { log('nonce: blocked'); }
  try { await fetch(url, {method: 'POST', credentials: 'include', mode: 'no-cors',
        headers: {'Content-Type': 'text/plain'}, body}); log('no-cors sent'); }
  catch (e) { log('no-cors: ' + e); }
  try { await fetch(url, {method: 'POST', credentials: 'include',
        headers: {'Content-Type': 'application/json', 'X-QG-Nonce': 'x'}, body});
        log('cors sent'); } catch (e) { log('cors: blocked'); }
  log('done');
})();
</script></body></html>"""


def test_a_page_on_another_origin_cannot_answer_a_card_in_the_persons_browser(
    cluster: ClusterSpec, setup: Setup
) -> None:
    with SyncClient(cluster, setup.agent) as agent:
        pending = agent.propose("pay.send", IBAN, {"amount": "999"}, run_id="invoice-8")
    pid = pending.proposal_id.hex()
    evil_html = (
        EVIL_PAGE.replace("CONSOLE", setup.url)
        .replace("PID", pid)
        .replace("DIGEST", pending.card.digest.hex())
        .replace("PASSPHRASE", PASSPHRASE)
    )
    evil = Starlette(routes=[Route("/", lambda _: HTMLResponse(evil_html))])
    with ServerThread(evil) as other, sync_playwright() as pw:
        browser = _browser(pw)
        try:
            context = browser.new_context()
            console = context.new_page()
            console.goto(setup.url + "/")
            _unlock(console)
            console.wait_for_selector(f"#card-{pid}", timeout=WAIT_MS)
            attacker = context.new_page()
            attacker.goto(other.url + "/")
            attacker.wait_for_selector("#log >> text=done", timeout=WAIT_MS)
            seen = attacker.inner_text("#log")
            assert "state: blocked" in seen and "nonce: blocked" in seen, seen
            assert pid not in seen and IBAN not in seen
            with attacker.expect_navigation(timeout=WAIT_MS):
                attacker.evaluate("document.getElementById('form').submit()")
            form_reply = attacker.content()
            assert "not from the console" in form_reply or "JSON" in form_reply, form_reply
            # the person's page still shows the card open; the cluster agrees
            assert console.query_selector(f"#card-{pid}") is not None
            with SyncClient(cluster, setup.agent) as agent:
                still = agent.await_certificate(pending.proposal_id, 10)
            assert still.outcome.value == "pending"
            console.click("#lock")
        finally:
            browser.close()
