"""The link a notification carries opens the approvals console on that card
(docs/console.md, "Deep links"), in a real headless Chromium: the notifier, run as the
command, posts the card; the browser follows the posted `console_url`, the person
unlocks, and the card the link names is the one outlined. The link answers nothing: the
card is still open afterwards."""

from __future__ import annotations

import json
from pathlib import Path

from playwright.sync_api import sync_playwright

from quorumgate.proto.clusterfile import ClusterSpec, free_loopback_ports
from quorumgate.sdk.sync import SyncClient
from tests.console.conftest import IBAN, Setup, setup  # noqa: F401 (fixture)
from tests.console.test_console_live import _browser, _unlock
from tests.notify.conftest import Receiver
from tests.notify.test_notify_live import (  # noqa: F401 (fixture)
    POLL_S,
    WAIT_S,
    notify_process,
    reader_file,
    write_config,
)
from tests.polling import wait_until

WAIT_MS = 30_000


def test_the_posted_link_opens_the_console_on_that_card(
    cluster: ClusterSpec, setup: Setup, reader_file: Path, receiver: Receiver,  # noqa: F811
    tmp_path: Path,
) -> None:  # fmt: skip
    path, _ = write_config(tmp_path, "console-dana", receiver, None, reader_file)
    path.write_text(path.read_text().replace("http://127.0.0.1:8788/", setup.url + "/"))
    with SyncClient(cluster, setup.agent) as agent:
        other = agent.propose("pay.send", IBAN, {"amount": "1"}, run_id="deeplink")
        with notify_process(cluster, path, free_loopback_ports(1)[0]):
            linked = agent.propose("pay.send", IBAN, {"amount": "2"}, run_id="deeplink")
            wait_until(
                "the linked card's POST",
                lambda: (
                    any(
                        json.loads(body)["proposal"] == linked.proposal_id.hex()
                        for _, body in list(receiver.posts)
                    )
                    or None
                ),
                WAIT_S,
                POLL_S,
            )
        [link] = [
            json.loads(body)["console_url"]
            for _, body in receiver.posts
            if json.loads(body)["proposal"] == linked.proposal_id.hex()
        ]
        assert link == f"{setup.url}/#card-{linked.proposal_id.hex()}"
        with sync_playwright() as pw:
            browser = _browser(pw)
            try:
                page = browser.new_page()
                page.goto(link)
                _unlock(page)
                card = page.wait_for_selector(
                    f"#card-{linked.proposal_id.hex()}.linked", timeout=WAIT_MS
                )
                assert card is not None and '"2"' in card.inner_text()
                page.wait_for_selector(f"#card-{other.proposal_id.hex()}", timeout=WAIT_MS)
                assert not page.is_visible(f"#card-{other.proposal_id.hex()}.linked")
                page.click("#lock")
            finally:
                browser.close()
        # the link answered nothing: the call still waits for the person
        assert agent.await_certificate(linked.proposal_id).pending
