"""The approvals console in a real headless browser (issue 18, item 2): Chromium from
Debian's packages driven by Playwright, against a live 4-node cluster. The page shows a
pending payment's card; a click on Approve signs the Confirm with the principal key the
console holds, and the payment's certificate reaches the agent waiting for it."""

from __future__ import annotations

import os
import shutil
import threading
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from nacl.signing import SigningKey
from playwright.sync_api import sync_playwright

from quorumgate.console.app import Console
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proxy.fake import ServerThread, free_port
from quorumgate.sdk.client import Decision, SyncClient, mandate, tool_spec

IBAN = "iban:GB82 WEST 1234 5698 7654 32"
CANONICAL = "iban:GB82WEST12345698765432"
SCREENSHOT_ENV = "QG_CONSOLE_SCREENSHOT"  # where to keep the screenshot (the README's)


@dataclass
class Setup:
    console: Console
    url: str
    agent: SigningKey


@pytest.fixture(scope="module")
def setup(cluster: ClusterSpec, owner: SyncClient) -> Iterator[Setup]:
    owner.register_tool(
        tool_spec("pay.send", "user_confirm", schemes=["iban"], min_tier="delegate",
                  arguments={"amount": "amount"})
    )  # fmt: skip
    person, agent = SigningKey.generate(), SigningKey.generate()
    owner.register_principal("console-dana", bytes(person.verify_key))
    owner.register_agent("billing-bot", bytes(agent.verify_key), principal="console-dana")
    owner.set_mandate("billing-bot", mandate(["pay.send"]))
    port = free_port()
    console = Console(cluster, person, ("127.0.0.1", port))
    with ServerThread(console.app(), port=port) as server:
        yield Setup(console, server.url, agent)


def chromium() -> str | None:
    """Debian's Chromium (.ci/run and `dev.py test` install it); None: Playwright's own
    build (`dev.py test` installs that where there is no apt)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


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
            browser = pw.chromium.launch(executable_path=chromium(), headless=True,
                                         args=["--no-sandbox"])  # fmt: skip
            try:
                page = browser.new_page(viewport={"width": 1100, "height": 900})
                page.goto(setup.url + "/")
                card = page.wait_for_selector(f"#card-{pid}", timeout=30_000)
                assert card is not None
                text = card.inner_text()
                assert "pay.send" in text and CANONICAL in text and '"120"' in text
                assert "principal console-dana" in text
                page.wait_for_selector("#status tr:nth-child(2)", timeout=30_000)
                page.wait_for_selector(f"#verdicts td.target >> text={CANONICAL}", timeout=30_000)
                shot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "console.png")
                page.screenshot(path=str(shot), full_page=True)
                page.click(f"#card-{pid} button.approve")
                page.wait_for_selector(f"#card-{pid}", state="detached", timeout=30_000)
                waiter.join(120)
                assert settled and settled[0].allowed  # the certificate reached the agent
                # the verdict stream shows the confirmed payment, canonical target and all
                page.wait_for_selector(f"#verdicts td.target >> text={CANONICAL}", timeout=30_000)
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
        browser = pw.chromium.launch(executable_path=chromium(), headless=True,
                                     args=["--no-sandbox"])  # fmt: skip
        try:
            page = browser.new_page()
            page.goto(setup.url + "/")
            card = page.wait_for_selector(f"#card-{pending.proposal_id.hex()}", timeout=30_000)
            assert card is not None
            text = card.inner_text()
            assert 'amount = "1\\u{336}200\\u{20dd}"' in text
            other = page.wait_for_selector(f"#card-{signing.proposal_id.hex()}", timeout=30_000)
            assert other is not None
            text += other.inner_text()
            assert 'Target: "/docs/1\\u{336}.txt"' in text
            escaped = "/docs/1\\u{336}.txt"
            page.wait_for_function(
                "t => [...document.querySelectorAll('#verdicts td.target')]"
                ".some(td => td.textContent === t)",
                arg=escaped, timeout=30_000,
            )  # fmt: skip
            text += page.inner_text("#verdicts")
            assert not [ch for ch in text if unicodedata.category(ch).startswith("M")]
        finally:
            browser.close()


def test_a_cross_site_request_cannot_answer_a_card(cluster: ClusterSpec, setup: Setup) -> None:
    with SyncClient(cluster, setup.agent) as agent:
        pending = agent.propose("pay.send", IBAN, {"amount": "999"}, run_id="invoice-8")
    pid = pending.proposal_id.hex()
    card = pending.card
    assert card is not None

    def post(headers: dict[str, str], url: str | None = None) -> int:
        body = {"digest": card.digest.hex()}
        target = (url or setup.url) + f"/api/cards/{pid}/approve"
        return httpx.post(target, json=body, headers=headers, timeout=30).status_code

    token = setup.console.token
    assert post({}) == 403  # no token: what a form on another site would send
    assert post({"x-qg-token": "guess"}) == 403
    assert post({"x-qg-token": token, "origin": "https://evil.example"}) == 403
    # DNS rebinding: the right token through another host name
    assert post({"x-qg-token": token, "host": "evil.example"}) == 403
    # still open: nothing above answered it
    with SyncClient(cluster, setup.agent) as agent:
        still: Any = agent.await_certificate(pending.proposal_id, 10)
    assert still.outcome.value == "pending"
