"""`governed_tool` against a live 4-node cluster: sync and async bodies run only with an
allow certificate; denials are one fixed sentence; confirmations resume; two agents in one
process never share a context; no argument value in any exception, repr or log line; and
both postures with the cluster stopped, the fail-open record reaching the log afterwards."""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
import uuid
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto.clusterfile import ClusterSpec, init_cluster
from quorumgate.proto.model import DENIAL_TEXT, Proposal, RuleKind, TargetRule, ToolRules
from quorumgate.proto.tx import parse
from quorumgate.runtime.channels import sync_channel
from quorumgate.sdk import delivery
from quorumgate.sdk.builders import tool_spec
from quorumgate.sdk.certificates import load_certificate, verify
from quorumgate.sdk.client import Client
from quorumgate.sdk.governed import (
    FAIL_OPEN_MARKER,
    ActionDenied,
    CertificateUnavailable,
    ConfirmationRequired,
    Gate,
    NoAgentContext,
    RunHalted,
    agent_context,
    agent_context_async,
    current_binding,
    current_call,
    fail_open_queue,
    flush_fail_open_sync,
    governed_tool,
    resume_confirmed,
)
from quorumgate.sdk.owner import owner_reader
from quorumgate.sdk.sync import SyncClient
from tests.client.test_client_live import Exhausted, _overloaded_cluster
from tests.support.cluster import LiveCluster, new_agent, new_principal, wait_until

URL = "https://example.com/page"
SECRET = f"SECRET-{uuid.uuid4().hex}"  # never known to any code path but the caller's

RAN: list[str] = []
BARRIER: list[asyncio.Barrier] = []
THREAD_BARRIER: list[threading.Barrier] = []


def _seen() -> dict[str, Any]:
    call, binding = current_call(), current_binding()
    assert binding is not None
    return {"call": call, "binding": binding}


@governed_tool(name="web.get", target="url")
def fetch(url: str, query: str, limit: int = 10) -> dict[str, Any]:
    """Fetch a page."""
    RAN.append("fetch")
    if THREAD_BARRIER:
        THREAD_BARRIER[0].wait(timeout=30)
    return _seen()


@governed_tool(name="web.get", target="url")
async def afetch(url: str, query: str) -> dict[str, Any]:
    """Fetch a page, asynchronously."""
    RAN.append("afetch")
    if BARRIER:
        await asyncio.wait_for(BARRIER[0].wait(), 30)
    await asyncio.sleep(0)
    return _seen()


@governed_tool(name="web.post", target="url")
def post(url: str, body: str) -> str:
    RAN.append("post")
    return "posted"


@governed_tool(name="web.post", target="url")
async def apost(url: str, body: str) -> str:
    RAN.append("apost")
    return "posted"


@governed_tool(name="pay", target="url")
def pay(url: str, amount: int, memo: str = "") -> str:
    RAN.append("pay")
    return f"paid {amount}"


@governed_tool(name="vault.store", target="url", envelopes=("secret",))
def store(url: str, secret: str) -> str:
    RAN.append("store")
    return "stored"


@governed_tool(name="web.get", target="url")
def fetch_exactly(url: str) -> str:
    RAN.append("fetch_exactly")
    return url


@governed_tool(name="web.get", target="url")
async def afetch_exactly(url: str) -> str:
    RAN.append("afetch_exactly")
    return url


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()
    BARRIER.clear()
    THREAD_BARRIER.clear()


# ---------------------------------------------------------------------------- runs


def test_sync_tool_runs_only_with_an_allow_certificate(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as qg, agent_context(qg, run_id="run-s"):
        seen = fetch(URL, "weather", limit=3)
    call = seen["call"]
    assert RAN == ["fetch"] and not call.fail_open
    assert call.decision.allowed and call.decision.outcome.value == "allow"
    # the body holds a certificate anyone can check offline, for exactly this call
    cert = load_certificate(call.decision.certificate_bytes())
    assert verify(cluster, cert, proposal_id=call.proposal_id).allowed
    tx = parse(call.tx)
    assert tx.signer == bytes(key.verify_key) and tx.tx_id == call.proposal_id
    proposal = tx.body.payload
    assert isinstance(proposal, Proposal)
    # the label opened a run named after the nonce of its first call (docs/engine.md)
    run = qg.run_of("run-s")
    assert (proposal.tool, proposal.target, proposal.run_id) == ("web.get", URL, run)
    assert [(a.name, a.text) for a in proposal.arguments] == [("query", "weather"), ("limit", "3")]


async def test_async_tool_with_an_async_client_and_with_a_sync_client(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key = new_agent(owner, ["web.get"])
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-a"):
        seen = await afetch(URL, "news")
    assert seen["call"].decision.allowed and RAN == ["afetch"]
    _, other = new_agent(owner, ["web.get"])
    with SyncClient(cluster, other) as sync_qg:
        async with agent_context_async(sync_qg, run_id="run-b"):
            seen = await afetch(URL, "news")  # bridged to the SyncClient's own loop
    assert parse(seen["call"].tx).signer == bytes(other.verify_key)


def test_denial_is_one_fixed_sentence_and_the_latch_halts_the_run(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key = new_agent(owner, ["web.get"])
    errors: list[ActionDenied] = []
    with SyncClient(cluster, key) as qg, agent_context(qg, run_id="run-latch"):
        for _ in range(3):
            with pytest.raises(ActionDenied) as denied:
                post(URL, "hello")
            errors.append(denied.value)
        with pytest.raises(RunHalted) as halted:
            fetch(URL, "in scope, but the run is over")
    assert RAN == []  # no body ran
    assert [e.reason for e in errors] == ["out_of_scope", "repeat_denied", "run_halted"]
    assert isinstance(errors[2], RunHalted) and errors[2].halted and halted.value.halted
    for err in [*errors, halted.value]:
        assert str(err) == DENIAL_TEXT and repr(err) == DENIAL_TEXT
        assert err.args == (DENIAL_TEXT,)
        assert err.decision is not None and err.decision.outcome.value == "deny"


def test_pending_call_resumes_only_after_confirmation_with_the_same_arguments(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    person, person_key = new_principal(owner)
    _, key = new_agent(owner, ["pay"], principal=person)
    with (
        SyncClient(cluster, person_key) as principal,
        SyncClient(cluster, key) as qg,
        agent_context(qg, run_id="run-pay", deadline_s=1.5),
    ):
        with pytest.raises(ConfirmationRequired) as pending:
            pay("https://bank.example/acct", 250, memo="rent")
        exc = pending.value
        assert exc.card.tool == "pay" and exc.card.argument_names == ("amount", "memo")
        assert exc.card.digest == exc.decision.certificate.leaf.card_digest
        with resume_confirmed(exc), pytest.raises(ConfirmationRequired):
            pay("https://bank.example/acct", 250, memo="rent")  # not confirmed yet
        confirmed = principal.confirm(exc.proposal_id, exc.card.digest)  # the principal signs
        assert confirmed.outcome.value == "allow"
        with resume_confirmed(exc), pytest.raises(ActionDenied) as changed:
            pay("https://bank.example/acct", 9999, memo="rent")
        assert changed.value.reason == "confirmation_mismatch"
        with resume_confirmed(exc):
            result = pay("https://bank.example/acct", 250, memo="rent")
            assert current_binding() is not None
    assert result == "paid 250" and RAN == ["pay"]


def test_without_an_agent_context_nothing_runs(cluster: ClusterSpec) -> None:
    with pytest.raises(NoAgentContext):
        fetch(URL, "q")
    with pytest.raises(NoAgentContext):
        asyncio.run(afetch(URL, "q"))
    assert RAN == []


# ---------------------------------------------------------------------------- isolation


async def test_two_agents_under_gather_never_share_a_context(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key_a = new_agent(owner, ["web.get", "web.post"], prefix="alpha")
    _, key_b = new_agent(owner, ["web.get"], prefix="beta")
    BARRIER.append(asyncio.Barrier(2))  # both bodies are inside at the same time

    async def agent(key: SigningKey, run_id: str) -> dict[str, Any]:
        async with Client(cluster, key) as qg, agent_context_async(qg, run_id=run_id):
            seen = await afetch(URL, run_id)
            try:
                posted = await apost(URL, "hello")
            except ActionDenied as err:
                posted = err.reason
            return {"seen": seen, "posted": posted, "client": qg}

    a, b = await asyncio.gather(agent(key_a, "run-alpha"), agent(key_b, "run-beta"))
    for result, key, run_id in ((a, key_a, "run-alpha"), (b, key_b, "run-beta")):
        seen = result["seen"]
        assert seen["binding"].client is result["client"]
        assert seen["binding"].run_id == run_id
        tx = parse(seen["call"].tx)
        assert tx.signer == bytes(key.verify_key)
        assert tx.body.payload.run_id == result["client"].run_of(run_id)  # type: ignore[union-attr]
    # each judged under its own mandate: alpha may post, beta may not
    assert (a["posted"], b["posted"]) == ("posted", "out_of_scope")


def test_two_agents_in_threads_never_share_a_context(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key_a = new_agent(owner, ["web.get", "web.post"], prefix="alpha")
    _, key_b = new_agent(owner, ["web.get"], prefix="beta")
    THREAD_BARRIER.append(threading.Barrier(2))
    results: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def agent(name: str, key: SigningKey) -> None:
        try:
            with SyncClient(cluster, key) as qg, agent_context(qg, run_id=f"run-{name}"):
                seen = fetch(URL, name)
                try:
                    posted: str = post(URL, "hello")
                except ActionDenied as err:
                    posted = err.reason
                results[name] = {"seen": seen, "posted": posted, "client": qg}
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [
        threading.Thread(target=agent, args=("alpha", key_a)),
        threading.Thread(target=agent, args=("beta", key_b)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for name, key in (("alpha", key_a), ("beta", key_b)):
        seen = results[name]["seen"]
        assert seen["binding"].client is results[name]["client"]
        assert parse(seen["call"].tx).signer == bytes(key.verify_key)
    assert (results["alpha"]["posted"], results["beta"]["posted"]) == ("posted", "out_of_scope")
    assert current_binding() is None  # nothing leaked into the main thread


# ---------------------------------------------------------------------------- leaks


def test_no_argument_value_in_any_exception_repr_or_log_line(
    cluster: ClusterSpec, owner: SyncClient, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    _, key = new_agent(owner, ["web.get", "pay", "vault.store"])
    shown: list[object] = []
    errors: list[BaseException] = []

    def attempt(fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            shown.append(fn(*args, **kwargs))
        except BaseException as err:
            errors.append(err)

    with SyncClient(cluster, key) as qg, agent_context(qg, run_id="run-leak"):
        attempt(fetch, URL, SECRET)  # allowed
        attempt(post, URL, SECRET)  # denied
        attempt(pay, "https://bank.example/x", 5, memo=SECRET)  # pending
        attempt(store, URL, secret=SECRET)  # a raw value for an envelope parameter
        attempt(fetch, URL, SECRET.encode())  # a value with no text form
        attempt(fetch, URL, SECRET * 2000)  # too large
        attempt(fetch, URL)  # does not match the signature
        shown.append(current_binding())
    dead = init_cluster(tmp_path / "dead", 4)
    with SyncClient.as_owner(dead.directory) as gone:
        for posture in ("fail_closed", "fail_open"):
            with agent_context(gone, run_id="run-gone", posture=posture, deadline_s=1.0):
                attempt(fetch, URL, SECRET)
        shown.append(list(fail_open_queue(gone)._records))
    assert {type(e).__name__ for e in errors} >= {
        "ActionDenied",
        "ConfirmationRequired",
        "ArgumentMappingError",
        "CertificateUnavailable",
    }
    texts = [caplog.text, *(r.getMessage() for r in caplog.records)]
    for err in errors:
        texts += [str(err), repr(err), *map(str, err.args)]
        texts += traceback.format_exception(err)
        for attr in ("decision", "card", "cause"):
            if getattr(err, attr, None) is not None:
                texts += [str(getattr(err, attr)), repr(getattr(err, attr))]
    for item in shown:
        texts.append(repr(item))
        if isinstance(item, dict):
            texts += [repr(v) for v in item.values()]
    leaks = [t for t in texts if SECRET in t]
    assert not leaks, leaks[:3]
    # nor in anything the cluster's processes logged
    for path in Path(cluster.directory).rglob("*"):
        if path.suffix in (".log", ".out"):
            assert SECRET not in path.read_text(errors="replace"), path


# ---------------------------------------------------------------------------- postures


def test_postures_with_the_cluster_stopped(live: LiveCluster, owner: SyncClient) -> None:
    cluster = live.spec
    _, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as qg:
        with agent_context(qg, run_id="run-posture"):
            fetch(URL, "warm-up")  # nonces known; the cluster is then stopped
        queue = fail_open_queue(qg)
        queue.limit = 2
        live.stop()
        try:
            with agent_context(qg, run_id="run-posture", deadline_s=2.0):
                with pytest.raises(CertificateUnavailable) as closed:
                    fetch(URL, "closed")
                assert str(closed.value) == DENIAL_TEXT == repr(closed.value)
                assert isinstance(closed.value, ActionDenied)
            with agent_context(qg, run_id="run-posture", posture="fail_open", deadline_s=2.0):
                opened = [fetch(URL, f"open-{k}")["call"] for k in range(2)]
                with pytest.raises(CertificateUnavailable):
                    fetch(URL, "queue full: fails closed")
            assert RAN == ["fetch", "fetch", "fetch"]  # warm-up and the two fail-open runs
            assert all(c.fail_open and c.decision is None for c in opened)
            assert len(queue) == 2
        finally:
            live.start()
        recorded = wait_until(
            "the fail-open records to reach the restarted cluster",
            lambda: flush_fail_open_sync(qg) >= 0 and len(queue) == 0,
        )
        assert recorded and len(queue.flushed) == 2
        markers = [qg.await_certificate(pid) for pid in queue.flushed]
    for decision, call in zip(markers, opened, strict=True):
        assert decision.allowed  # web.get was in scope: the operator sees an in-scope run
        proposal = _committed_proposal(cluster, decision.height, decision.certificate.leaf.index)
        marker = dict((a.name, a.text) for a in proposal.arguments)[FAIL_OPEN_MARKER]
        assert marker is not None and marker.startswith("cause=")
        assert f"original={call.proposal_id.hex() if call.proposal_id else '-'}" in marker
        assert proposal.run_id == qg.run_of("run-posture") and proposal.tool == "web.get"


async def test_an_overloaded_cluster_is_no_certificate_not_a_denial(
    cluster: ClusterSpec, owner: SyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESOURCE_EXHAUSTED past the bounded back-off: the posture decides, as for an
    unreachable cluster."""
    monkeypatch.setattr(delivery, "BACKOFF_S_MIN", 0.001)
    monkeypatch.setattr(delivery, "BACKOFF_S_MAX", 0.002)
    _, key = new_agent(owner, ["web.get"])
    full = Exhausted(cluster, refusals=1_000_000)
    spec, servers = await _overloaded_cluster(cluster, full)
    try:
        async with Client(spec, key) as qg:
            async with agent_context_async(qg, run_id="run-full"):
                with pytest.raises(CertificateUnavailable) as closed:
                    await afetch(URL, "q")
            assert closed.value.reason == "no_certificate:mempool_full"
            async with agent_context_async(qg, run_id="run-full", posture="fail_open"):
                seen = await afetch(URL, "q")
            assert seen["call"].fail_open and len(fail_open_queue(qg)) == 1
    finally:
        for server in servers:
            await server.stop(0)
    assert RAN == ["afetch"]


def _committed_proposal(spec: ClusterSpec, height: int, index: int) -> Proposal:
    with sync_channel(spec, 0, reader=owner_reader(spec)) as channel:
        stream = cpb_grpc.ReplicaStub(channel).CommittedBlocks(
            cpb.BlocksRequest(from_height=height), timeout=10
        )
        block = next(iter(stream))
        stream.cancel()
    assert block.height == height
    payload = parse(block.block.payload[index]).body.payload
    assert isinstance(payload, Proposal)
    return payload


# ---------------------------------------------------------------------------- by name


def _gate() -> Gate:
    gate = Gate()

    def web_post(url: str, body: str, tool: str = "") -> str:
        RAN.append(f"post:{tool}")
        return "posted"

    async def web_get(url: str, query: str = "") -> str:
        RAN.append("get")
        return f"got {current_call().proposal_id.hex()[:8]}"

    gate.tool("web.post", web_post, target="url")
    gate.tool("web.get", web_get, target="url")
    return gate


def test_a_framework_calls_tools_by_name_with_an_argument_dict(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """No Python signature of ours in the way: `body` and `tool` are the tool's own
    arguments; the body runs only with an allow certificate; a denial is the sentence."""
    _, key = new_agent(owner, ["web.post"])
    gate = _gate()
    with SyncClient(cluster, key) as qg, agent_context(qg, run_id="run-byname"):
        assert gate.call("web.post", {"url": URL, "body": "hello", "tool": "x"}) == "posted"
        call = gate.authorize("web.post", {"url": URL, "body": "again"})
        with pytest.raises(ActionDenied) as denied:
            gate.call("web.get", {"url": URL})  # not in the mandate
    assert RAN == ["post:x"] and call.decision is not None and call.decision.allowed
    assert str(denied.value) == DENIAL_TEXT and denied.value.reason == "out_of_scope"
    proposal = parse(call.tx).body.payload  # type: ignore[arg-type]
    assert isinstance(proposal, Proposal)
    assert [(a.name, a.text) for a in proposal.arguments] == [("body", "again")]


async def test_call_many_is_one_stream_and_one_result_per_call_in_order(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key = new_agent(owner, ["web.get"])
    gate = _gate()
    calls: list[tuple[str, dict[str, Any] | None]] = [
        ("web.get", {"url": f"{URL}/{k}", "query": "q"}) for k in range(6)
    ]
    calls.insert(2, ("web.post", {"url": URL, "body": "b"}))  # out of scope: denied
    calls.append(("no.such", {}))  # never registered: refused here
    async with Client(cluster, key) as qg, agent_context_async(qg, run_id="run-many"):
        sent_before = await qg.sync_nonce()
        results = await gate.call_many(calls)
        sent_after = await qg.sync_nonce()
    assert len(results) == len(calls)
    assert isinstance(results[2], ActionDenied) and str(results[2]) == DENIAL_TEXT
    assert isinstance(results[-1], Exception) and "not registered" in str(results[-1])
    got = [r for i, r in enumerate(results) if i not in (2, len(calls) - 1)]
    assert all(isinstance(r, str) and r.startswith("got ") for r in got), results
    assert len(set(got)) == 6 and RAN == ["get"] * 6
    assert sent_after - sent_before == 7  # six gets and the denied post were proposed


def test_clients_of_many_keys_share_one_channel_pool(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    keys = [new_agent(owner, ["web.get"])[1] for _ in range(3)]
    with SyncClient(cluster, keys[0]) as first:
        others = [first.with_key(k) for k in keys[1:]]
        decisions = [c.propose("web.get", URL, run_id="run-pool") for c in [first, *others]]
        pools = {id(c.aio.pool) for c in [first, *others]}
        proposal_ids = {d.certificate.leaf.proposal_id for d in decisions}
        for other in others:
            other.close()
        assert first.propose("web.get", URL, run_id="run-pool").allowed  # still open
    assert pools == {id(first.aio.pool)} and len(proposal_ids) == 3
    assert all(d.allowed for d in decisions)
    with pytest.raises(RuntimeError, match="closed"):
        others[0].propose("web.get", URL, run_id="run-pool")


def test_the_body_runs_on_the_certified_canonical_target_not_the_raw_one(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """The target a tool body gets is the canonical one the certificate
    names (checked against its digest), never the spelling the planner wrote."""
    _, key = new_agent(owner, ["web.get"])
    raw = "HTTPS://Example.COM:443/docs/./guide/../page?q=a%7e#section"
    with SyncClient(cluster, key) as qg, agent_context(qg, run_id="run-canon"):
        got = fetch_exactly(raw)
        seen = asyncio.run(_async_canonical(qg, raw))
    assert got == seen == "https://example.com/docs/page?q=a~"
    assert RAN == ["fetch_exactly", "afetch_exactly"]


async def _async_canonical(qg: SyncClient, raw: str) -> str:
    async with agent_context_async(qg, run_id="run-canon-async"):
        return await afetch_exactly(raw)


@governed_tool(name="mail.multi", target="to", targets={"recipient": "cc"})
def send_to_many(to: str, cc: list[str], body: str) -> tuple[str, list[str]]:
    RAN.append("send_to_many")
    return to, cc


def test_further_targets_are_judged_and_the_body_gets_them_canonical(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """`targets={"recipient": "cc"}` sends each cc address as a target
    in the role the tool declares (not as an argument the rules cannot see): an attacker's
    address among them is refused, and the body receives every target canonical."""
    owner.register_tool(
        tool_spec("mail.multi", "direct", schemes=["mailto"], roles={"recipient": (["mailto"], 4)})
    )
    rules = (
        ToolRules(
            "mail.multi",
            (
                TargetRule(RuleKind.HOST_SUFFIX, "example.com"),
                TargetRule(RuleKind.HOST_SUFFIX, "example.com", role="recipient"),
            ),
        ),
    )
    _, key = new_agent(owner, ["mail.multi"], rules=rules)
    gate = Gate()
    gate.tool(
        "mail.multi", lambda **kw: (kw["to"], kw["cc"]), target="to", targets={"recipient": "cc"}
    )
    with SyncClient(cluster, key) as qg:
        with agent_context(qg, run_id="run-many"):
            to, cc = send_to_many("mailto:ann@EXAMPLE.com", ["mailto:bo@A.example.com"], "hi")
            assert (to, cc) == ("mailto:ann@example.com", ["mailto:bo@a.example.com"])
            by_name = gate.call(
                "mail.multi", {"to": "mailto:ann@example.com", "cc": "mailto:Cy@Example.com"}
            )
            assert by_name == ("mailto:ann@example.com", "mailto:Cy@example.com")
        with agent_context(qg, run_id="run-many-evil"), pytest.raises(ActionDenied) as denied:
            send_to_many("mailto:ann@example.com", ["mailto:x@evil.example"], "hi")
        assert str(denied.value) == DENIAL_TEXT and denied.value.reason == "out_of_scope"
    assert RAN == ["send_to_many"]
