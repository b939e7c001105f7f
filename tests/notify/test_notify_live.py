"""`quorumgate notify` against a live 4-node cluster (docs/notifications.md): a gated call
opens a card and its principal's webhook receives exactly one signed POST with the card
digest as id, a mailbox one mail; a receiver that fails twice gets the same message on the
third try; a restart does not send a delivered card again; a lying sidecar alone cannot
make the notifier announce a card that f+1 sidecars do not certify."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import email
import hashlib
import hmac
import json
import signal
import stat
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from quorumgate.notify.config import NotifyConfig, load_config
from quorumgate.notify.notifier import Notifier
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import (
    RECEIPT_KEY_FILE,
    TLS_KEY_FILE,
    ClusterSpec,
    add_auditor,
    free_loopback_ports,
    read_private,
    read_seed,
)
from quorumgate.runtime.channels import aio_channel
from quorumgate.sdk.client import Client
from quorumgate.sdk.owner import owner_reader
from quorumgate.sdk.sync import SyncClient
from quorumgate.sidecar.receipts import Receipt, root_from_path, sign_block
from quorumgate.sidecar.wire import receipt_from_pb, receipt_to_pb
from tests.notify.conftest import Mailbox, Receiver, TlsMailbox, new_secret, private_file
from tests.polling import until, wait_until
from tests.support.cluster import new_agent, new_principal

CONSOLE = "http://127.0.0.1:8788/"
PAYEE = "https://bank.example/acct/7"
WAIT_S = 60.0
POLL_S = 0.05
PROCESS_STOP_S = 15.0
BODY_FIELDS = {
    "type", "chain", "card_digest", "proposal", "principal", "tool", "target",
    "requested_by", "arguments", "expires_at_ms", "text", "console_url",
}  # fmt: skip


@pytest.fixture(scope="module")
def reader_file(cluster: ClusterSpec, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An auditor's key (it reads every verdict and answers no card), in a 0600 file."""
    key = SigningKey.generate()
    add_auditor(cluster.directory, "notifier", bytes(key.verify_key))
    path = tmp_path_factory.mktemp("reader") / "notifier.key"
    return private_file(path, bytes(key).hex() + "\n")


def write_config(tmp: Path, principal: str, receiver: Receiver | None, mailbox: Mailbox | None,
                 reader: Path) -> tuple[Path, bytes]:  # fmt: skip
    key = new_secret(tmp / "hook.secret")
    lines = [
        f'console_url = "{CONSOLE}"',
        f'reader_key = "{reader}"',
        f'state_file = "{tmp / "state.json"}"',
    ]
    if mailbox is not None:
        lines += ["[smtp]", 'host = "127.0.0.1"', f"port = {mailbox.port}", "starttls = false",
                  'sender = "quorumgate@example.test"']  # fmt: skip
    lines.append(f'[principals."{principal}"]')
    if receiver is not None:
        lines += [f'webhook = "{receiver.url}"', 'webhook_secret_file = "hook.secret"']
    if mailbox is not None:
        lines.append(f'email = "{principal}@example.test"')
    path = tmp / "notify.toml"
    path.write_text("\n".join(lines) + "\n")
    return path, key


@contextlib.asynccontextmanager
async def running(spec: ClusterSpec, config: NotifyConfig) -> AsyncIterator[Notifier]:
    """A notifier in this event loop, reading with the configured key, stopped on exit."""
    client = Client(spec, SigningKey(read_seed(config.reader_key)))
    notifier = Notifier(spec, client, config)
    stop = asyncio.Event()
    task = asyncio.create_task(notifier.run(stop))
    try:
        yield notifier
    finally:
        stop.set()
        await task
        await client.close()


async def gated_call(spec: ClusterSpec, agent_key: SigningKey, amount: str) -> Any:
    async with Client(spec, agent_key) as agent:
        decision = await agent.propose("pay", PAYEE, {"amount": amount}, run_id="notify")
    assert decision.pending and decision.card is not None
    return decision


def signature_ok(key: bytes, headers: dict[str, str], body: bytes) -> bool:
    """The receiver's check (docs/notifications.md, "Checking the signature")."""
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        hmac.compare_digest(f"v1,{expected}", part) for part in headers["webhook-signature"].split()
    )


def delivered(notifier: Notifier, channel: str) -> float:
    value = notifier.metrics.registry.get_sample_value(
        "qg_notify_delivered_total", {"channel": channel}
    )
    return value or 0.0


async def test_a_gated_call_reaches_the_principal_once_by_webhook_and_by_mail(
    cluster: ClusterSpec, owner: SyncClient, reader_file: Path, receiver: Receiver,
    mailbox: Mailbox, tmp_path: Path,
) -> None:  # fmt: skip
    person_id, person_key = new_principal(owner)
    _, agent_key = new_agent(owner, ["pay"], principal=person_id)
    path, key = write_config(tmp_path, person_id, receiver, mailbox, reader_file)
    config = load_config(path, cluster.directory)
    async with running(cluster, config) as notifier:
        decision = await gated_call(cluster, agent_key, "120.00")
        digest = decision.card.digest.hex()
        await until("the webhook and the mail", lambda: receiver.count() >= 1 and
                    len(mailbox.messages) >= 1, WAIT_S)  # fmt: skip
        async with Client(cluster, person_key) as person:
            # the notification answered nothing: the card is still open for the person,
            # and only the person's own signature closes it
            assert decision.proposal_id in {c.proposal_id for c in await person.pending()}
            answer = await person.confirm(decision.proposal_id)
        assert answer.outcome.value == "allow"
        await until("the notifier read past the answer",
                    lambda: notifier._seen_height >= answer.height, WAIT_S)  # fmt: skip
    [(headers, body)] = receiver.posts  # exactly one POST
    assert headers["webhook-id"] == digest
    assert signature_ok(key, headers, body)
    assert not signature_ok(b"another secret of 32 bytes......", headers, body)
    doc = json.loads(body)
    assert set(doc) == BODY_FIELDS  # no key, signature, nonce, token or transaction
    assert (doc["tool"], doc["target"], doc["card_digest"]) == ("pay", f'"{PAYEE}"', digest)
    assert doc["arguments"] == [{"name": "amount", "value": '"120.00"'}]
    assert doc["console_url"] == f"{CONSOLE}#card-{decision.proposal_id.hex()}"
    assert doc["principal"] == person_id
    [(sender, rcpt, raw)] = mailbox.messages  # exactly one mail
    mail = email.message_from_bytes(raw)
    text = mail.get_payload(decode=True).decode()
    assert rcpt == [f"{person_id}@example.test"] and sender == "quorumgate@example.test"
    assert "pay" in mail["Subject"] and PAYEE in mail["Subject"]
    assert doc["console_url"] in text and f'Target: "{PAYEE}"' in text
    assert delivered(notifier, "webhook") == delivered(notifier, "email") == 1


async def test_a_receiver_that_fails_twice_gets_the_same_message_on_the_third_try(
    cluster: ClusterSpec, owner: SyncClient, reader_file: Path, receiver: Receiver,
    tmp_path: Path,
) -> None:  # fmt: skip
    person_id, _ = new_principal(owner)
    _, agent_key = new_agent(owner, ["pay"], principal=person_id)
    receiver.fail_first = 2
    path, key = write_config(tmp_path, person_id, receiver, None, reader_file)
    async with running(cluster, load_config(path, cluster.directory)) as notifier:
        decision = await gated_call(cluster, agent_key, "5")
        await until("the third try", lambda: delivered(notifier, "webhook") == 1, WAIT_S)
        retries = notifier.metrics.registry.get_sample_value(
            "qg_notify_retries_total", {"channel": "webhook"}
        )
    assert receiver.count() == 3 and retries == 2
    ids = {headers["webhook-id"] for headers, _ in receiver.posts}
    assert ids == {decision.card.digest.hex()}
    assert len({body for _, body in receiver.posts}) == 1  # the same message each time
    assert all(signature_ok(key, headers, body) for headers, body in receiver.posts)


async def test_a_restart_does_not_send_a_delivered_card_again(
    cluster: ClusterSpec, owner: SyncClient, reader_file: Path, receiver: Receiver,
    tmp_path: Path,
) -> None:  # fmt: skip
    person_id, _ = new_principal(owner)
    _, agent_key = new_agent(owner, ["pay"], principal=person_id)
    path, _ = write_config(tmp_path, person_id, receiver, None, reader_file)
    config = load_config(path, cluster.directory)
    async with running(cluster, config) as notifier:
        first = await gated_call(cluster, agent_key, "1")
        await until("the first card", lambda: delivered(notifier, "webhook") == 1, WAIT_S)
    # as if the process had stopped before its resume point moved past the first card:
    # it reads that card again, and the state file says it was delivered
    state = json.loads(config.state_file.read_text())
    state["next_height"] = first.height
    config.state_file.write_text(json.dumps(state))
    async with running(cluster, config) as again:
        second = await gated_call(cluster, agent_key, "2")
        await until("the second card", lambda: delivered(again, "webhook") == 1, WAIT_S)
        assert again._seen_height >= second.height > first.height
    ids = [headers["webhook-id"] for headers, _ in receiver.posts]
    assert ids == [first.card.digest.hex(), second.card.digest.hex()]


# ---------------------------------------------------------------------------- a liar


class LyingSidecar(spb_grpc.SidecarServicer):  # type: ignore[misc]
    """Sidecar 3 compromised: it forwards to the real one, and turns every verdict its
    `Receipts` stream sends into a `pending` one for a card it made up for `principal`,
    signed with its real receipt key; `GetReceipt` serves that card."""

    def __init__(self, spec: ClusterSpec, template: Any) -> None:
        self.spec = spec
        self.template = template  # a real card, whose principal the forgeries name
        self.forged: list[bytes] = []  # digests of the cards it made up
        self.cards: dict[bytes, bytes] = {}
        self.real = spb_grpc.SidecarStub(aio_channel(spec, 3, "sidecar", reader=owner_reader(spec)))
        self.key = SigningKey(read_seed(spec.node_dir(3) / RECEIPT_KEY_FILE))

    def _forge(self, honest: Receipt) -> Receipt:
        card = dataclasses.replace(  # another payee: the card the liar wants shown
            self.template,
            proposal_id=honest.leaf.proposal_id,
            canonical_target=self.template.canonical_target + "666",
        )
        self.cards[honest.leaf.proposal_id] = card.to_bytes()
        self.forged.append(card.digest)
        leaf = dataclasses.replace(
            honest.leaf, outcome="pending", reason="confirmation_required", card_digest=card.digest
        )
        count = honest.block.leaf_count
        root = root_from_path(leaf.hash(self.spec.chain_id), leaf.index, count, honest.path)
        block = sign_block(self.key, 3, self.spec.chain_id, leaf.height, root,
                           honest.block.state_root, count, honest.block.validity)  # fmt: skip
        return Receipt(leaf, honest.path, block)

    async def Receipts(self, request: spb.ReceiptsRequest, context: Any) -> AsyncIterator[Any]:
        async for batch in self.real.Receipts(request):
            out = spb.ReceiptBatch(height=batch.height)
            for message in batch.receipts:
                honest = receipt_from_pb(message)
                out.receipts.append(receipt_to_pb(self._forge(honest)))
            yield out

    async def GetReceipt(self, request: spb.ReceiptRequest, context: Any) -> Any:
        reply = await self.real.GetReceipt(request)
        if reply.found and request.proposal_id in self.cards:
            forged = self._forge(receipt_from_pb(reply.receipt))
            reply.receipt.CopyFrom(receipt_to_pb(forged))
            reply.card = self.cards[request.proposal_id]
        return reply

    async def Status(self, request: spb.SidecarStatusRequest, context: Any) -> Any:
        return await self.real.Status(request)


async def _serve_as_sidecar_3(servicer: object, spec: ClusterSpec) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    spb_grpc.add_SidecarServicer_to_server(servicer, server)
    if spec.insecure:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        key = read_private(spec.node_dir(3) / TLS_KEY_FILE)
        credentials = grpc.ssl_server_credentials([(key, spec.member(3).tls_cert)])
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, port


async def test_a_lying_sidecar_alone_cannot_make_it_announce_a_card(
    cluster: ClusterSpec, owner: SyncClient, reader_file: Path, receiver: Receiver,
    tmp_path: Path,
) -> None:  # fmt: skip
    person_id, _ = new_principal(owner)
    _, agent_key = new_agent(owner, ["pay", "web.get"], principal=person_id)
    real = await gated_call(cluster, agent_key, "3")  # its card: the forgeries' model
    liar = LyingSidecar(cluster, real.card)
    server, port = await _serve_as_sidecar_3(liar, cluster)
    members = tuple(
        dataclasses.replace(m, sidecar_port=port) if m.index == 3 else m for m in cluster.members
    )
    spec = dataclasses.replace(cluster, members=members)
    path, _ = write_config(tmp_path, person_id, receiver, None, reader_file)
    try:
        async with running(spec, load_config(path, cluster.directory)) as notifier:
            async with Client(cluster, agent_key) as agent:
                allowed = await agent.propose("web.get", "https://example.com/n", run_id="n")
            assert allowed.allowed
            await until("the liar's forgery of the allowed call",
                        lambda: allowed.proposal_id in liar.cards, WAIT_S)  # fmt: skip
            later = await gated_call(cluster, agent_key, "4")
            await until("the real card", lambda: delivered(notifier, "webhook") >= 2, WAIT_S)
            await until("the notifier read past the allowed call",
                        lambda: notifier._seen_height >= later.height, WAIT_S)  # fmt: skip
    finally:
        await server.stop(0)
    ids = sorted(headers["webhook-id"] for headers, _ in receiver.posts)
    assert ids == sorted([real.card.digest.hex(), later.card.digest.hex()])
    assert not {d.hex() for d in liar.forged} & set(ids)


async def test_mail_goes_over_starttls_with_the_credentials_file(
    cluster: ClusterSpec, owner: SyncClient, reader_file: Path, tls_mailbox: TlsMailbox,
    tmp_path: Path,
) -> None:  # fmt: skip
    person_id, _ = new_principal(owner)
    _, agent_key = new_agent(owner, ["pay"], principal=person_id)
    path, _ = write_config(tmp_path, person_id, None, tls_mailbox, reader_file)
    private_file(tmp_path / "smtp.cred", f"{tls_mailbox.user}\n{tls_mailbox.password}\n")
    text = path.read_text().replace(
        "starttls = false",
        f'starttls = true\nca_file = "{tls_mailbox.ca_file}"\ncredentials_file = "smtp.cred"',
    )
    path.write_text(text)
    async with running(cluster, load_config(path, cluster.directory)) as notifier:
        decision = await gated_call(cluster, agent_key, "9")
        await until("the mail", lambda: delivered(notifier, "email") == 1, WAIT_S)
    assert tls_mailbox.logins == [tls_mailbox.user]
    [(_, _, raw)] = tls_mailbox.messages
    mail = email.message_from_bytes(raw)
    assert mail["Message-ID"] == f"<{decision.card.digest.hex()}@quorumgate.card>"


# ---------------------------------------------------------------------------- the command


@contextlib.contextmanager
def notify_process(spec: ClusterSpec, config: Path, metrics_port: int) -> Iterator[Any]:
    """`quorumgate notify` as a supervisor runs it; stopped with SIGTERM, killed if it hangs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "quorumgate", "notify", "--dir", str(spec.directory),
         "--config", str(config), "--metrics-port", str(metrics_port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=PROCESS_STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()


def metric(port: int, line_start: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_command_restarted_does_not_send_a_delivered_card_again(
    cluster: ClusterSpec, owner: SyncClient, reader_file: Path, receiver: Receiver,
    tmp_path: Path,
) -> None:  # fmt: skip
    person_id, _ = new_principal(owner)
    _, agent_key = new_agent(owner, ["pay"], principal=person_id)
    path, _ = write_config(tmp_path, person_id, receiver, None, reader_file)
    port = free_loopback_ports(1)[0]
    delivered_line = 'qg_notify_delivered_total{channel="webhook"}'
    with SyncClient(cluster, agent_key) as agent:
        with notify_process(cluster, path, port) as first:
            one = agent.propose("pay", PAYEE, {"amount": "11"}, run_id="notify-cli")
            wait_until("the first card's POST", lambda: receiver.count() == 1 or None,
                       WAIT_S, POLL_S)  # fmt: skip
            wait_until("the delivery counted", lambda: metric(port, delivered_line) == 1.0 or None,
                       WAIT_S, POLL_S)  # fmt: skip
            first.send_signal(signal.SIGTERM)
            assert first.wait(timeout=PROCESS_STOP_S) == 0
        assert stat.S_IMODE((tmp_path / "state.json").stat().st_mode) == 0o600
        with notify_process(cluster, path, port):
            two = agent.propose("pay", PAYEE, {"amount": "12"}, run_id="notify-cli")
            wait_until("the second card's POST", lambda: receiver.count() >= 2 or None,
                       WAIT_S, POLL_S)  # fmt: skip
            wait_until(
                "the second delivery counted",
                lambda: metric(port, delivered_line) == 1.0 or None,
                WAIT_S,
                POLL_S,
            )
    ids = [headers["webhook-id"] for headers, _ in receiver.posts]
    assert ids == [one.card.digest.hex(), two.card.digest.hex()]


async def test_a_failing_receiver_does_not_hold_up_the_answer(
    cluster: ClusterSpec, owner: SyncClient, reader_file: Path, receiver: Receiver,
    tmp_path: Path,
) -> None:  # fmt: skip
    """The notifier is outside the judge: while its message is still being retried, the
    person answers and the agent gets its certified verdict."""
    person_id, person_key = new_principal(owner)
    _, agent_key = new_agent(owner, ["pay"], principal=person_id)
    receiver.fail_first = 1_000  # every try fails
    path, _ = write_config(tmp_path, person_id, receiver, None, reader_file)
    async with running(cluster, load_config(path, cluster.directory)) as notifier:
        decision = await gated_call(cluster, agent_key, "8")
        await until("a failed try", lambda: receiver.count() >= 1, WAIT_S)
        async with Client(cluster, person_key) as person:
            answer = await person.confirm(decision.proposal_id)
        assert answer.outcome.value == "allow"
        queue = notifier.metrics.registry.get_sample_value("qg_notify_queue_size")
        assert queue == 1 and delivered(notifier, "webhook") == 0


async def test_a_card_under_way_when_the_notifier_stops_is_sent_again_with_the_same_id(
    cluster: ClusterSpec, owner: SyncClient, reader_file: Path, receiver: Receiver,
    tmp_path: Path,
) -> None:  # fmt: skip
    person_id, _ = new_principal(owner)
    _, agent_key = new_agent(owner, ["pay"], principal=person_id)
    receiver.fail_first = 1_000  # every try fails while the first notifier runs
    path, key = write_config(tmp_path, person_id, receiver, None, reader_file)
    config = load_config(path, cluster.directory)
    async with running(cluster, config) as notifier:
        decision = await gated_call(cluster, agent_key, "13")
        await until("a failed try", lambda: receiver.count() >= 1, WAIT_S)
    assert delivered(notifier, "webhook") == 0
    assert json.loads(config.state_file.read_text())["next_height"] <= decision.height
    receiver.fail_first = receiver.count()  # the receiver is back
    async with running(cluster, config) as again:
        await until("the card sent again", lambda: delivered(again, "webhook") == 1, WAIT_S)
    ids = {headers["webhook-id"] for headers, _ in receiver.posts}
    assert ids == {decision.card.digest.hex()}  # one id: the receiver sees one card
    headers, body = receiver.posts[-1]
    assert signature_ok(key, headers, body)
