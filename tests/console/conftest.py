"""Live fixtures for the console tests: the client suite's module-scoped 4-node cluster,
a confirmation-gated payment tool, a principal (its key sealed with PASSPHRASE) and its
agent, and consoles serving that principal on free loopback ports.

`ConsolePage` does over httpx what the console's page does in a browser (fetch a nonce,
POST with the session's header and cookie): the person's side of the tests that need no
browser, and the material an attacker's process would replay or mix.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from nacl.signing import SigningKey

from quorumgate.console.app import Console
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.sealedkey import KDF_INTERACTIVE, read_sealed
from quorumgate.proxy.fake import ServerThread, free_port
from quorumgate.sdk.builders import mandate, tool_spec
from quorumgate.sdk.keys import generate_principal_key
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import cluster, live, owner, sink_key  # noqa: F401 (fixtures)

IBAN = "iban:GB82 WEST 1234 5698 7654 32"
CANONICAL = "iban:GB82WEST12345698765432"
PASSPHRASE = "correct horse battery staple"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "live: starts real replica processes (minutes)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.live)


class Clock:
    """A clock the test moves: sessions and the passphrase window read it."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass
class Setup:
    console: Console
    url: str
    agent: SigningKey
    key_file: Path
    new_console: Callable[[Callable[[], float]], Console]  # another, same principal


@contextmanager
def serving(console: Console) -> Iterator[str]:
    with ServerThread(console.app(), port=console.port) as server:
        yield server.url


@pytest.fixture(scope="module")
def setup(
    cluster: ClusterSpec,  # noqa: F811
    owner: SyncClient,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Setup]:
    owner.register_tool(
        tool_spec("pay.send", "user_confirm", schemes=["iban"], min_tier="delegate",
                  arguments={"amount": "amount"})
    )  # fmt: skip
    key_file = tmp_path_factory.mktemp("principal") / "dana.key"
    # `interactive`: fast enough for a test's many unlocks; the cost level is not under test
    person = generate_principal_key(key_file, PASSPHRASE, cost=KDF_INTERACTIVE)
    agent = SigningKey.generate()
    owner.register_principal("console-dana", bytes(person.verify_key))
    owner.register_agent("billing-bot", bytes(agent.verify_key), principal="console-dana")
    owner.set_mandate("billing-bot", mandate(["pay.send"]))

    def console(clock: Callable[[], float]) -> Console:
        return Console(cluster, read_sealed(key_file), ("127.0.0.1", free_port()), clock=clock)

    main = console(Clock())
    with serving(main) as url:
        yield Setup(main, url, agent, key_file, console)


class ConsolePage:
    """The page's requests, made with httpx: a cookie jar, the session's header value
    (kept in memory, as the page keeps it), a fresh nonce for every POST."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30)
        self.session = ""

    def __enter__(self) -> ConsolePage:
        return self

    def __exit__(self, *_: object) -> None:
        self.http.close()

    def headers(self, **extra: str) -> dict[str, str]:
        doc = {"origin": self.url, **({"x-qg-session": self.session} if self.session else {})}
        return {**doc, **{k.replace("_", "-"): v for k, v in extra.items()}}

    def nonce(self) -> str:
        reply = self.http.get("/api/nonce", headers=self.headers())
        assert reply.status_code == 200, reply.text
        return str(reply.json()["nonce"])

    def post(self, path: str, body: dict[str, str], **headers: str) -> httpx.Response:
        sent = self.headers(x_qg_nonce=self.nonce(), **headers)
        return self.http.post(path, json=body, headers=sent)

    def unlock(self, passphrase: str = PASSPHRASE) -> httpx.Response:
        reply = self.post("/api/unlock", {"passphrase": passphrase})
        if reply.status_code == 200:
            self.session = str(reply.json()["session"])
        return reply

    def state(self) -> httpx.Response:
        return self.http.get("/api/state", headers=self.headers())

    def answer(self, pending: Any, what: str, passphrase: str = PASSPHRASE) -> httpx.Response:
        path = f"/api/cards/{pending.proposal_id.hex()}/{what}"
        return self.post(path, {"digest": pending.card.digest.hex(), "passphrase": passphrase})


def chromium() -> str | None:
    """Debian's Chromium (.ci/run and `dev.py test` install it); None: Playwright's own
    build (`dev.py test` installs that where there is no apt)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")
