"""The client SDK against a live 4-node cluster: outcomes and offline verification, refused
certificates, a lying sidecar, retries with the same bytes, back-off, nonces, streams,
delegation, envelopes opened by the executor, and an unreachable cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from pathlib import Path

import grpc
import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import (
    OWNER_KEY_FILE,
    RECEIPT_KEY_FILE,
    TLS_KEY_FILE,
    ClusterSpec,
    init_cluster,
    read_private,
    read_seed,
)
from quorumgate.proto.limits import NONCE_WINDOW
from quorumgate.proto.model import Argument, Outcome, Proposal
from quorumgate.proto.tx import tx_id
from quorumgate.runtime.channels import Reader, aio_channel, sync_channel
from quorumgate.sdk import delivery
from quorumgate.sdk.certificates import load_certificate, verify
from quorumgate.sdk.client import (
    Client,
    ClusterUnavailable,
    Decision,
    Handle,
    InvalidCertificate,
    Overloaded,
    Refused,
    Submitted,
    TransactionRejected,
)
from quorumgate.sdk.executor import (
    CertificateExpired,
    CertificateRejected,
    CertificateReused,
    CertifiedLogSource,
    EnvelopeUnopenable,
    Executor,
    HandleRefused,
    MemoryUsedProposals,
    NotAllowed,
    WrongCall,
)
from quorumgate.sdk.log import CommittedLog
from quorumgate.sdk.owner import owner_reader
from quorumgate.sdk.sync import SyncClient
from quorumgate.sidecar.engine.statements import target_digest
from quorumgate.sidecar.receipts import (
    Certificate,
    Receipt,
    ReceiptLeaf,
    Validity,
    assemble_certificate,
    root_from_path,
    sign_block,
    verify_certificate,
)
from quorumgate.sidecar.wire import receipt_from_pb, receipt_to_pb
from tests.support.cluster import SINK, LiveCluster, new_agent, new_principal, wait_until

RUN = "run-1"
LIAR_POLLS_MAX = 150  # x 10 ms: well inside the client's per-call RPC timeout
URL = "https://example.com/a"


def agent_client(spec: ClusterSpec, key: SigningKey) -> Client:
    return Client(spec, key, certificate_deadline_s=15.0)


def receipt_key(spec: ClusterSpec, index: int) -> SigningKey:
    return SigningKey(read_seed(spec.node_dir(index) / RECEIPT_KEY_FILE))


# ---------------------------------------------------------------------------- outcomes


async def test_allow_deny_pending_are_certified_and_verify_offline(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key = new_agent(owner, ["web.get", "pay"])
    async with agent_client(cluster, key) as qg:
        allowed = await qg.propose("web.get", URL, {"q": "x"}, run_id=RUN)
        denied = await qg.propose("web.post", URL, run_id=RUN)
        pending = await qg.propose("pay", "https://bank.example/t", {"amount": "5"}, run_id=RUN)

    assert (allowed.outcome.value, allowed.reason, allowed.allowed) == ("allow", "ok", True)
    assert (denied.outcome.value, denied.reason, denied.allowed) == ("deny", "out_of_scope", False)
    assert (pending.outcome.value, pending.reason) == ("pending", "confirmation_required")
    for decision in (allowed, denied, pending):
        # offline, from bytes, with nothing but the cluster file
        cert = load_certificate(decision.certificate_bytes())
        leaf = verify_certificate(
            cert,
            cluster.chain_id,
            cluster.receipt_keys,
            receipts_expire=cluster.receipts_expire,
            proposal_id=decision.proposal_id,
        )
        assert leaf == decision.certificate.leaf
        assert len(set(cert.signers)) >= cluster.f + 1
        assert verify(cluster, cert, proposal_id=decision.proposal_id).outcome is decision.outcome
    # a fresh agent's first three nonces; ids come from (signer, nonce) alone
    signer = bytes(key.verify_key)
    assert [d.proposal_id for d in (allowed, denied, pending)] == [
        tx_id(signer, n) for n in (1, 2, 3)
    ]
    assert allowed.target_digest == target_digest("web.get https://example.com/a")
    # the pending call's card is the certified one, built by the engine
    card = pending.card
    assert card is not None and card.digest == pending.certificate.leaf.card_digest
    assert (card.tool, card.proposal_id, card.argument_names) == (
        "pay",
        pending.proposal_id,
        ("amount",),
    )
    # the operator-only reason is on an attribute, never in str() or repr()
    for decision in (allowed, denied, pending):
        assert decision.reason not in str(decision) and decision.reason not in repr(decision)


async def test_confirmation_settles_a_pending_call_and_a_wrong_card_is_rejected(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    person, person_key = new_principal(owner)
    _, key = new_agent(owner, ["pay"], principal=person)
    async with agent_client(cluster, key) as qg, agent_client(cluster, person_key) as principal:
        pending = await qg.propose("pay", "https://bank.example/c", {"amount": "7"}, run_id=RUN)
        assert pending.card is not None
        with pytest.raises(TransactionRejected) as wrong:
            await principal.confirm(pending.proposal_id, b"\x00" * 32)
        assert wrong.value.reason == "card_digest_mismatch"
        assert str(wrong.value) == "The transaction was not applied."
        confirmed = await principal.confirm(pending.proposal_id)  # reads its open card
        after = await qg.await_certificate(pending.proposal_id)
    assert (confirmed.outcome.value, confirmed.kind) == ("allow", "confirm")
    assert confirmed.certificate.leaf.card_digest == pending.card.digest
    # the proposal's newest verdict is now the confirmation's
    assert (after.outcome.value, after.tx_id) == ("allow", confirmed.tx_id)


async def test_owner_confirms_an_owner_confirm_tool_and_the_agent_cannot(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key = new_agent(owner, ["owner.pay"])
    async with agent_client(cluster, key) as qg:
        pending = await qg.propose("owner.pay", "https://bank.example/o", run_id=RUN)
        with pytest.raises(TransactionRejected) as refused:
            await qg.confirm(pending.proposal_id)
        assert refused.value.reason == "confirmer_not_authorized"
    decision = owner.confirm(pending.proposal_id)
    assert decision.outcome.value == "allow"


# ---------------------------------------------------------------------------- certificates


def _decision(owner: SyncClient, cluster: ClusterSpec, tools: list[str], tool: str) -> Decision:
    _, key = new_agent(owner, tools)
    with SyncClient(cluster, key) as qg:
        return qg.propose(tool, URL, run_id=RUN)


def test_certificate_with_too_few_receipts_is_refused(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    decision = _decision(owner, cluster, ["web.get"], "web.get")
    cert = decision.certificate
    short = dataclasses.replace(cert, signatures=cert.signatures[: cluster.f])
    with pytest.raises(InvalidCertificate) as err:
        verify(cluster, short, proposal_id=decision.proposal_id)
    assert err.value.reason == "too_few_receipts"
    # one signature twice is still one sidecar
    doubled = dataclasses.replace(cert, signatures=(cert.signatures[0], cert.signatures[0]))
    with pytest.raises(InvalidCertificate) as err:
        verify(cluster, doubled)
    assert err.value.reason == "duplicate_signer"


def test_certificate_with_receipts_from_non_members_is_refused(
    cluster: ClusterSpec, owner: SyncClient, tmp_path: Path
) -> None:
    decision = _decision(owner, cluster, ["web.get"], "web.get")
    cert = decision.certificate
    leaf = cert.leaf
    # a sidecar of another cluster signs the same statement: index beyond the members
    outsider = SigningKey.generate()
    forged = sign_block(
        outsider,
        cluster.n,
        cluster.chain_id,
        leaf.height,
        cert.verdict_root,
        cert.state_root,
        cert.leaf_count,
        cert.validity,
    )
    with_outsider = dataclasses.replace(
        cert, signatures=(cert.signatures[0], (forged.signer, forged.signature))
    )
    with pytest.raises(InvalidCertificate) as err:
        verify(cluster, with_outsider)
    assert err.value.reason == "non_member"
    # ... or claiming a member's index with a key that is not that member's
    as_member = sign_block(
        outsider,
        3,
        cluster.chain_id,
        leaf.height,
        cert.verdict_root,
        cert.state_root,
        cert.leaf_count,
        cert.validity,
    )
    others = tuple(s for s in cert.signatures if s[0] != 3)[: cluster.f]
    signatures = (*others, (3, as_member.signature))
    with pytest.raises(InvalidCertificate) as err:
        verify(cluster, dataclasses.replace(cert, signatures=signatures))
    assert err.value.reason == "bad_signature"
    # a certificate checked against another cluster's file is refused as a whole
    other = init_cluster(tmp_path / "other", 4)
    with pytest.raises(InvalidCertificate) as err:
        verify(other, cert)
    assert err.value.reason == "wrong_chain"


def test_certificate_assembled_from_disagreeing_receipts_is_refused(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """A faulty sidecar (its real key) signs `allow` for a call the others denied."""
    denied = _decision(owner, cluster, [], "web.get")
    assert denied.outcome.value == "deny"
    honest = _receipts(cluster, denied.proposal_id, [0, 1])
    liar = _forge_allow(cluster, honest[0], 3)
    # assembled in either order, the disagreeing receipts never make f+1 agreeing
    for receipts in ([honest[0], liar], [liar, honest[0]]):
        cert = assemble_certificate(cluster.chain_id, receipts)
        with pytest.raises(InvalidCertificate) as err:
            verify(cluster, cert, proposal_id=denied.proposal_id)
        assert err.value.reason == "too_few_receipts"
    # splicing the liar's signature onto the honest leaf fails its signature
    spliced = dataclasses.replace(
        assemble_certificate(cluster.chain_id, honest[:1]),
        signatures=((0, honest[0].block.signature), (3, liar.block.signature)),
    )
    with pytest.raises(InvalidCertificate) as err:
        verify(cluster, spliced)
    assert err.value.reason == "bad_signature"
    # and the honest pair still certifies the denial
    agreed = assemble_certificate(cluster.chain_id, honest)
    assert verify(cluster, agreed).outcome.value == "deny"


def _receipts(spec: ClusterSpec, proposal_id: bytes, members: list[int]) -> list[Receipt]:
    """Each member's receipt, once its sidecar has executed the height (the certificate
    came from the f+1 fastest: a chosen member may still be behind)."""
    out = []
    for i in members:

        def found(member: int = i) -> spb.ReceiptReply | None:
            with sync_channel(spec, member, "sidecar", reader=owner_reader(spec)) as channel:
                reply = spb_grpc.SidecarStub(channel).GetReceipt(
                    spb.ReceiptRequest(proposal_id=proposal_id), timeout=5
                )
            return reply if reply.found else None

        reply = wait_until(f"sidecar {i} to hold the receipt", found)
        out.append(receipt_from_pb(reply.receipt))
    return out


def _forge_allow(
    spec: ClusterSpec, honest: Receipt, signer: int, as_index: int | None = None
) -> Receipt:
    """What a compromised sidecar `signer` can produce: a validly signed block statement
    whose verdict root holds an `allow` leaf for the proposal."""
    leaf = dataclasses.replace(honest.leaf, outcome="allow", reason="ok")
    count = honest.block.leaf_count
    root = root_from_path(leaf.hash(spec.chain_id), leaf.index, count, honest.path)
    block = sign_block(
        receipt_key(spec, signer),
        signer if as_index is None else as_index,
        spec.chain_id,
        leaf.height,
        root,
        honest.block.state_root,
        count,
        honest.block.validity,
    )
    return Receipt(leaf, honest.path, block)


LIAR_ROUNDS_MAX = 50  # asks for the same certificate until the forgery was served
LIAR_CATCH_UP_S = 30.0  # for the real sidecar 3 to execute the call, however loaded the host


class LyingSidecar(spb_grpc.SidecarServicer):  # type: ignore[misc]
    """Sidecar 3 compromised: it forwards to the real one and rewrites every receipt to
    `allow`, signed with its real receipt key (optionally claiming another member's index)."""

    def __init__(self, spec: ClusterSpec, as_index: int | None, *, garble: bool = False) -> None:
        self.spec = spec
        self.as_index = as_index
        self.garble = garble  # keep the honest statement, break its signature
        self.forged = 0
        self.real = spb_grpc.SidecarStub(aio_channel(spec, 3, "sidecar", reader=owner_reader(spec)))

    async def GetReceipt(
        self, request: spb.ReceiptRequest, context: grpc.aio.ServicerContext
    ) -> spb.ReceiptReply:
        # answer only once the real sidecar has executed the call, so that every round of
        # the client's polling holds the forgery next to the honest receipts
        reply: spb.ReceiptReply = await self.real.GetReceipt(request)
        for _ in range(LIAR_POLLS_MAX):
            if reply.found:
                break
            await asyncio.sleep(0.01)
            reply = await self.real.GetReceipt(request)
        if reply.found:
            honest = receipt_from_pb(reply.receipt)
            self.forged += 1
            if self.garble:
                reply.receipt.signature = bytes(64)
            else:
                forged = _forge_allow(self.spec, honest, 3, self.as_index)
                reply.receipt.CopyFrom(receipt_to_pb(forged))
        return reply

    async def Account(
        self, request: spb.AccountRequest, context: grpc.aio.ServicerContext
    ) -> spb.AccountReply:
        return spb.AccountReply(known=True, next_nonce=1)  # a lie: too low, harmless

    async def Status(
        self, request: spb.SidecarStatusRequest, context: grpc.aio.ServicerContext
    ) -> spb.SidecarStatusReply:
        reply: spb.SidecarStatusReply = await self.real.Status(request)
        return reply


async def _serve(
    servicer: object, add: object, spec: ClusterSpec, posing_as: int
) -> tuple[grpc.aio.Server, int]:
    """A test double serving as member `posing_as` (a faulty member has its own TLS key)."""
    server = grpc.aio.server()
    add(servicer, server)  # type: ignore[operator]
    if spec.insecure:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        key = read_private(spec.node_dir(posing_as) / TLS_KEY_FILE)
        credentials = grpc.ssl_server_credentials([(key, spec.member(posing_as).tls_cert)])
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, port


async def _overloaded_cluster(
    cluster: ClusterSpec, servicer: object
) -> tuple[ClusterSpec, list[grpc.aio.Server]]:
    """Every replica is the overloaded double: one server posing as each member (each
    with that member's TLS key), all sharing one servicer."""
    spec, servers = cluster, []
    for i in range(cluster.n):
        server, port = await _serve(servicer, cpb_grpc.add_ReplicaServicer_to_server, cluster, i)
        servers.append(server)
        spec = _with_member(spec, i, replica_port=port)
    return spec, servers


def _with_member(
    spec: ClusterSpec, index: int, *, replica_port: int = 0, sidecar_port: int = 0
) -> ClusterSpec:
    """The cluster file with member `index` reached at other ports (a test double)."""
    members = tuple(
        dataclasses.replace(
            m,
            replica_port=replica_port or m.replica_port,
            sidecar_port=sidecar_port or m.sidecar_port,
        )
        if m.index == index
        else m
        for m in spec.members
    )
    return dataclasses.replace(spec, members=members)


@pytest.mark.parametrize(
    ("as_index", "garble"),
    [(None, False), (0, False), (None, True)],
    ids=["forged-allow", "forged-allow-as-sidecar-0", "honest-leaf-bad-signature"],
)
async def test_a_lying_sidecar_cannot_change_or_spoil_the_certified_answer(
    cluster: ClusterSpec, owner: SyncClient, as_index: int | None, garble: bool
) -> None:
    _, key = new_agent(owner, [])
    liar = LyingSidecar(cluster, as_index, garble=garble)
    server, port = await _serve(liar, spb_grpc.add_SidecarServicer_to_server, cluster, 3)
    try:
        spec = _with_member(cluster, 3, sidecar_port=port)
        async with agent_client(spec, key) as qg:
            decisions = [await qg.propose("web.get", URL, run_id=RUN)]
            # The client answers as soon as f+1 sidecars agree and drops the slower calls,
            # so the liar's forgery may come too late for the first answer. Under load the
            # real sidecar 3 may still be behind: wait until it has executed the call (so
            # the liar answers at once), then ask again until the forgery has been served,
            # checking every answer.
            height = decisions[0].height
            deadline = time.monotonic() + LIAR_CATCH_UP_S
            while (await liar.real.Status(spb.SidecarStatusRequest())).executed_height < height:
                assert time.monotonic() < deadline, "sidecar 3 never executed the call"
                await asyncio.sleep(0.02)
            for _ in range(LIAR_ROUNDS_MAX):
                if liar.forged >= 1:
                    break
                decisions.append(await qg.await_certificate(decisions[0].proposal_id))
    finally:
        await server.stop(0)
    assert liar.forged >= 1, "the lying sidecar was never asked"
    for decision in decisions:
        assert decision.outcome.value == "deny" and decision.reason == "out_of_scope"
        assert 3 not in decision.signers


# ---------------------------------------------------------------------------- delivery


class LandThenDrop(cpb_grpc.ReplicaServicer):  # type: ignore[misc]
    """Replica 0 behind a flaky link: the transaction reaches the real replica, the answer
    is lost (UNAVAILABLE after the fact)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.delivered = 0
        self.real = cpb_grpc.ReplicaStub(aio_channel(spec, 0))

    async def Submit(
        self, request: cpb.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> cpb.SubmitReply:
        await self.real.Submit(request)
        self.delivered += 1
        await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset by peer")


async def test_a_lost_answer_is_retried_on_another_replica_with_the_same_bytes(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key = new_agent(owner, ["web.get"])
    flaky = LandThenDrop(cluster)
    server, port = await _serve(flaky, cpb_grpc.add_ReplicaServicer_to_server, cluster, 0)
    try:
        spec = _with_member(cluster, 0, replica_port=port)
        async with agent_client(spec, key) as qg:
            submitted = await qg.submit(Proposal(run_id=RUN, tool="web.get", target=URL))
            decision = await qg.await_certificate(submitted.proposal_id)
    finally:
        await server.stop(0)
    assert flaky.delivered == 1
    assert decision.outcome.value == "allow"
    assert submitted.proposal_id == tx_id(bytes(key.verify_key), submitted.nonce)
    # the same bytes again, to every replica: never a second verdict for the id
    for member in cluster.members:
        with sync_channel(cluster, member.index) as channel:
            try:
                cpb_grpc.ReplicaStub(channel).Submit(cpb.SubmitRequest(tx=submitted.tx), timeout=5)
            except grpc.RpcError as err:
                assert err.code() is grpc.StatusCode.ALREADY_EXISTS
    with SyncClient(cluster, key) as again:
        assert again.await_certificate(submitted.proposal_id).height == decision.height


class Exhausted(cpb_grpc.ReplicaServicer):  # type: ignore[misc]
    """A full mempool for the first `refusals` submissions, then the real replica."""

    def __init__(self, spec: ClusterSpec, refusals: int) -> None:
        self.refusals = refusals
        self.calls = 0
        self.real = cpb_grpc.ReplicaStub(aio_channel(spec, 1))

    async def Submit(
        self, request: cpb.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> cpb.SubmitReply:
        self.calls += 1
        if self.calls <= self.refusals:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "mempool_full", (("qg-reason", "mempool_full"),)
            )
        reply: cpb.SubmitReply = await self.real.Submit(request)
        return reply


@pytest.mark.parametrize("refusals", [3, 10_000])
async def test_resource_exhausted_backs_off_within_a_bound(
    cluster: ClusterSpec, owner: SyncClient, monkeypatch: pytest.MonkeyPatch, refusals: int
) -> None:
    monkeypatch.setattr(delivery, "BACKOFF_S_MIN", 0.002)
    monkeypatch.setattr(delivery, "BACKOFF_S_MAX", 0.01)
    _, key = new_agent(owner, ["web.get"])
    full = Exhausted(cluster, refusals)
    spec, servers = await _overloaded_cluster(cluster, full)
    try:
        async with agent_client(spec, key) as qg:
            if refusals > delivery.OVERLOAD_RETRIES_MAX:
                with pytest.raises(Overloaded) as err:
                    await qg.submit(Proposal(run_id=RUN, tool="web.get", target=URL))
                assert err.value.reason == "mempool_full" and err.value.code == "RESOURCE_EXHAUSTED"
                assert full.calls == delivery.OVERLOAD_RETRIES_MAX + 1
            else:
                submitted = await qg.submit(Proposal(run_id=RUN, tool="web.get", target=URL))
                assert full.calls == refusals + 1
                assert (await qg.await_certificate(submitted.proposal_id)).allowed
    finally:
        for server in servers:
            await server.stop(0)


async def test_a_refusal_is_typed_and_says_nothing_of_the_reason(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """An unknown signer is refused before ordering; a registered agent's call to an
    invented tool is ordered and denied with a certificate (canonical version 2: it is
    recorded and counts toward the latch, and admission tells no one which tools
    exist). Neither says its reason to the agent."""
    _, key = new_agent(owner, None)
    stranger = SigningKey.generate()
    async with agent_client(cluster, key) as qg, agent_client(cluster, stranger) as anon:
        invented = await qg.propose("no.such.tool", URL, run_id=RUN)
        with pytest.raises(Refused) as unknown_signer:
            await anon.propose("web.get", URL, run_id=RUN)
    assert invented.outcome is Outcome.DENY and invented.reason == "unknown_tool"
    assert "unknown_tool" not in str(invented) and "unknown_tool" not in repr(invented)
    assert unknown_signer.value.reason == "unknown_signer"
    err = unknown_signer.value
    assert err.reason not in str(err) and err.reason not in repr(err)


async def test_nonces_resume_from_the_sidecars_and_a_collision_costs_a_fresh_nonce(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key = new_agent(owner, ["web.get"])
    async with agent_client(cluster, key) as first, agent_client(cluster, key) as second:
        assert await first.sync_nonce() == 1 and await second.sync_nonce() == 1
        done = [
            await first.decide(Proposal(run_id=RUN, tool="web.get", target=URL)) for _ in range(3)
        ]
        # every sidecar has executed them (so every replica's admission check knows)
        await _all_sidecars_past(cluster, key, 4)
        # `second` still believes in nonce 1: refused as replayed, it signs again afresh
        late = await second.submit(Proposal(run_id=RUN, tool="web.get", target=URL))
        assert late.nonce == 4
        assert (await second.await_certificate(late.proposal_id)).allowed
    async with agent_client(cluster, key) as third:
        assert await third.sync_nonce() == 5
    assert [d.outcome.value for d in done] == ["allow"] * 3


async def _all_sidecars_past(spec: ClusterSpec, key: SigningKey, next_nonce: int) -> None:
    request = spb.AccountRequest(signer=bytes(key.verify_key))
    deadline = asyncio.get_running_loop().time() + 30
    for member in spec.members:
        async with aio_channel(spec, member.index, "sidecar", reader=Reader.of(key)) as channel:
            stub = spb_grpc.SidecarStub(channel)
            while (await stub.Account(request, timeout=5)).next_nonce < next_nonce:
                assert asyncio.get_running_loop().time() < deadline, "sidecar never caught up"
                await asyncio.sleep(0.02)


async def test_submit_many_streams_and_every_one_is_certified(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key = new_agent(owner, ["web.get"])
    payloads = [
        Proposal(
            run_id=RUN, tool="web.get", target=f"{URL}/{k}", arguments=(Argument("q", text="v"),)
        )
        for k in range(40)
    ]
    async with agent_client(cluster, key) as qg:
        results = await qg.submit_many(payloads)
        assert all(isinstance(r, Submitted) for r in results), results
        submitted = [r for r in results if isinstance(r, Submitted)]
        assert [s.nonce for s in submitted] == list(range(1, 41))
        decisions = await asyncio.gather(*(qg.await_certificate(s.proposal_id) for s in submitted))
    assert all(d.allowed for d in decisions)
    digests = {d.target_digest for d in decisions}
    assert len(digests) == 40


async def test_submit_many_past_the_nonce_window_waits_and_the_client_stays_usable(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """A submit_many longer than the engine's nonce window must not sign its tail past the
    window (refused `replayed`) and leave the client's counter there, where every later
    call would be `Replayed` for good: it waits for the window to move, and a refused nonce
    is given back."""
    _, key = new_agent(owner, ["web.get"])
    count = 2 * NONCE_WINDOW + 100
    payloads = [Proposal(run_id=RUN, tool="web.get", target=f"{URL}/{k}") for k in range(count)]
    async with agent_client(cluster, key) as qg:
        results = await qg.submit_many(payloads)
        refused = [r for r in results if not isinstance(r, Submitted)]
        assert refused == [], refused[:3]
        nonces = [r.nonce for r in results if isinstance(r, Submitted)]
        assert nonces == list(range(1, count + 1))
        # the same client goes on: a later call is admitted and certified
        later = await qg.submit(Proposal(run_id=RUN, tool="web.get", target=URL))
        assert later.nonce == count + 1
        assert (await qg.await_certificate(later.proposal_id)).certificate is not None


async def test_a_nonce_refused_on_arrival_is_signed_again(
    cluster: ClusterSpec, owner: SyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction a replica refuses on arrival leaves its nonce unused; the next
    transaction takes it, so no gap stops the engine's window. (The refusal is injected:
    which early refusals a replica gives depends on how far its sidecar has executed.)"""
    _, key = new_agent(owner, ["web.get"])
    async with agent_client(cluster, key) as qg:
        first = await qg.submit(Proposal(run_id=RUN, tool="web.get", target=URL))
        deliver = qg._deliver

        async def refuse_once(data: bytes) -> None:
            monkeypatch.setattr(qg, "_deliver", deliver)
            raise Refused("unknown_tool", "NOT_FOUND")

        monkeypatch.setattr(qg, "_deliver", refuse_once)
        with pytest.raises(Refused):
            await qg.submit(Proposal(run_id=RUN, tool="web.get", target=URL))
        again = await qg.submit(Proposal(run_id=RUN, tool="web.get", target=URL))
        decision = await qg.await_certificate(again.proposal_id)
    assert (first.nonce, again.nonce) == (1, 2) and decision.allowed


def test_sync_client_from_many_threads(cluster: ClusterSpec, owner: SyncClient) -> None:
    _, key = new_agent(owner, ["web.get"])
    results: list[Decision] = []
    errors: list[BaseException] = []
    with SyncClient(cluster, key) as qg:

        def worker(k: int) -> None:
            try:
                results.append(qg.propose("web.get", f"{URL}/{k}", run_id=RUN))
            except BaseException as err:  # surfaced below
                errors.append(err)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert len({d.proposal_id for d in results}) == 8 and all(d.allowed for d in results)


# ---------------------------------------------------------------------------- delegation


async def test_delegation_attenuates_and_revocation_stops_the_child(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, parent_key = new_agent(owner, ["web.get", "web.post"], delegation_policy="attenuated")
    _, child_key = new_agent(owner, None)
    async with (
        agent_client(cluster, parent_key) as parent,
        agent_client(cluster, child_key) as child,
    ):
        grant = await parent.delegate(bytes(child_key.verify_key), "job-9", ["web.get"], ttl_s=600)
        inside = await child.propose("web.get", URL, run_id="job-9", grant=grant)
        outside = await child.propose("web.post", URL, run_id="job-9", grant=grant)
        await parent.revoke(grant)
        revoked = await child.propose("web.get", URL, run_id="job-9", grant=grant)
        with pytest.raises(TransactionRejected) as widen:
            await parent.delegate(bytes(child_key.verify_key), "job-9", ["pay"], ttl_s=600)
    assert inside.allowed
    assert (outside.outcome.value, outside.reason) == ("deny", "out_of_scope")
    assert (revoked.outcome.value, revoked.reason) == ("deny", "delegation_revoked")
    assert widen.value.reason == "delegation_widening"


async def test_a_grant_made_with_rules_narrows_the_childs_targets(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """docs/sdk.md: `delegate(rules=...)` lets the child call the tool on the targets the
    grant's rules name only, whatever the parent's mandate allows."""
    from quorumgate import tool_rules

    _, parent_key = new_agent(owner, ["web.get"], delegation_policy="attenuated")
    _, child_key = new_agent(owner, None)
    only = tool_rules("web.get", [{"prefix": "https://example.com/docs"}])
    async with (
        agent_client(cluster, parent_key) as parent,
        agent_client(cluster, child_key) as child,
    ):
        grant = await parent.delegate(
            bytes(child_key.verify_key), "job-10", ["web.get"], ttl_s=600, rules=[only]
        )
        inside = await child.propose(
            "web.get", "https://example.com/docs/a", run_id="job-10", grant=grant
        )
        outside = await child.propose(
            "web.get", "https://example.com/admin", run_id="job-10", grant=grant
        )
    assert inside.allowed, inside.reason
    assert (outside.outcome.value, outside.reason) == ("deny", "out_of_scope")


# ---------------------------------------------------------------------------- envelopes


async def test_envelope_sealed_by_the_client_opens_only_at_the_executor(
    cluster: ClusterSpec, owner: SyncClient, sink_key: PrivateKey
) -> None:
    secret = "4111-1111-1111-1111"
    agent_id, key = new_agent(owner, ["vault.store", "web.get"])
    async with agent_client(cluster, key) as qg:
        handle = await qg.seal_envelope("card", secret, {SINK: bytes(sink_key.public_key)})
        submitted = await qg.submit(
            Proposal(
                run_id=RUN,
                tool="vault.store",
                target=URL,
                arguments=(Argument("secret", handle=handle),),
            )
        )
        decision = await qg.await_certificate(submitted.proposal_id)
        # a raw value for a credential is refused before ordering (canonical version 2):
        # it never enters a block
        with pytest.raises(Refused) as raw:
            await qg.propose("vault.store", URL, {"secret": "4111"}, run_id=RUN)
        denied = await qg.propose(
            "vault.store", URL, {"secret": Handle("h_card_0123456789abcdef")}, run_id=RUN
        )
    assert decision.allowed, decision.reason
    assert (raw.value.reason, raw.value.code) == ("envelope_required", "INVALID_ARGUMENT")
    assert (denied.outcome.value, denied.reason) == ("deny", "handle_violation")

    log = CommittedLog(cluster, SigningKey(read_seed(cluster.directory / OWNER_KEY_FILE)))
    executor = Executor(
        cluster, SINK, sink_key, CertifiedLogSource(cluster, log=log), used=MemoryUsedProposals()
    )
    call = executor.verify(
        decision.certificate_bytes(),
        proposal_id=decision.proposal_id,
        tool="vault.store",
        target="https://example.com/a",
        transaction=submitted.tx,
    )
    assert call.handles == (("secret", handle),) and call.bound_by == "leaf"
    # the certificate runs its call once at this executor
    with pytest.raises(CertificateReused):
        executor.verify(
            decision.certificate_bytes(),
            proposal_id=decision.proposal_id,
            tool="vault.store",
            target="https://example.com/a",
            transaction=submitted.tx,
        )
    assert executor.open_envelope(call, "secret") == secret.encode()
    # the replayed state is the certified one at that height
    assert log.state_root_at(decision.height) == decision.certificate.state_root
    # refused: another sink's key, a handle the call does not carry, a target it does not
    # name, a denied call, a forged certificate
    stranger = Executor(
        cluster,
        SINK,
        PrivateKey.generate(),
        CertifiedLogSource(cluster, log=log),
        used=MemoryUsedProposals(),
    )
    with pytest.raises(EnvelopeUnopenable):
        stranger.open_envelope(call, "secret")
    with pytest.raises(HandleRefused):
        executor.open_envelope(call, "other")
    with pytest.raises(HandleRefused):
        executor.open_handle(call, "h_card_0123456789abcdef")
    with pytest.raises(WrongCall) as wrong:
        executor.verify(
            decision.certificate,
            proposal_id=decision.proposal_id,
            tool="vault.store",
            target="https://example.com/b",
        )
    assert wrong.value.reason == "target_mismatch"
    with pytest.raises(NotAllowed):
        executor.verify(
            denied.certificate,
            proposal_id=denied.proposal_id,
            tool="vault.store",
            target="https://example.com/a",
        )
    short = dataclasses.replace(
        decision.certificate, signatures=decision.certificate.signatures[:1]
    )
    with pytest.raises(CertificateRejected) as rejected:
        executor.verify(
            short,
            proposal_id=decision.proposal_id,
            tool="vault.store",
            target="https://example.com/a",
        )
    assert rejected.value.reason == "too_few_receipts"
    # a state that is not the certified one is never read
    tampered = dataclasses.replace(decision.certificate, state_root=b"\x00" * 32)
    forged_call = dataclasses.replace(call, certificate=tampered)
    with pytest.raises(HandleRefused) as err:
        executor.open_envelope(forged_call, "secret")
    assert err.value.reason == "state_root_mismatch"
    assert secret not in repr(call) and agent_id


# ---------------------------------------------------------------------------- unreachable


async def test_an_unreachable_cluster_is_a_typed_error(tmp_path: Path) -> None:
    dead = init_cluster(tmp_path / "dead", 4)  # never started
    async with Client.as_owner(dead.directory, certificate_deadline_s=0.5) as qg:
        with pytest.raises(ClusterUnavailable) as err:
            await qg.propose("web.get", URL, run_id=RUN)
        assert str(err.value) == "The cluster could not be reached."
        with pytest.raises(ClusterUnavailable):
            await qg.await_certificate(b"\x01" * 32, 0.3)


async def test_a_stopped_replica_is_skipped(live: LiveCluster, owner: SyncClient) -> None:
    cluster = live.spec
    _, key = new_agent(owner, ["web.get"])
    live.stop([0])
    try:
        async with agent_client(cluster, key) as qg:
            decisions = [await qg.propose("web.get", f"{URL}/{k}", run_id=RUN) for k in range(4)]
    finally:
        live.start([0])
    assert all(d.allowed and 0 not in d.signers for d in decisions)


def test_a_leaf_outside_the_signed_root_is_refused(cluster: ClusterSpec) -> None:
    leaf = ReceiptLeaf(1, 0, b"\x01" * 32, b"\x01" * 32, "proposal", "allow", "ok", b"", b"", 1)
    window = Validity(1, 2) if cluster.receipts_expire else None  # what the chain signs
    cert = Certificate(cluster.chain_id, leaf, (), 1, b"\x00" * 32, b"\x00" * 32, (), window)
    with pytest.raises(InvalidCertificate) as err:
        verify(cluster, cert)
    assert err.value.reason == "bad_path"


def test_a_certificate_holds_a_window_in_block_time_that_the_owner_sets(
    cluster: ClusterSpec, owner: SyncClient, sink_key: PrivateKey
) -> None:
    """Every certificate of a chain `init` made carries the window its f+1 sidecars signed:
    from the committed block's time (the leader's clock, checked by the voters: here, this
    host's) to that time plus the TTL, five minutes until the owner sets
    `certificate_ttl_ms` in the log. An executor whose used-certificate record is new
    refuses the certificate once its clock is past the window."""
    assert cluster.receipts_expire
    _, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as qg:
        first = qg.propose("web.get", URL, run_id=RUN)
        window = first.certificate.validity
        assert window is not None and first.valid_until_ms == window.valid_until_ms
        assert window.valid_until_ms - window.block_time_ms == 300_000
        assert abs(window.block_time_ms - time.time() * 1000) < 60_000  # block time, not 1970
        owner.set_settings({"certificate_ttl_ms": 20_000})
        try:
            second = qg.propose("web.get", URL, run_id=RUN)
        finally:
            owner.set_settings(clear=["certificate_ttl_ms"])
    later = second.certificate.validity
    assert later is not None and later.valid_until_ms - later.block_time_ms == 20_000

    def executor(now_ms: int) -> Executor:
        source = CertifiedLogSource(cluster, owner.aio.key)
        return Executor(
            cluster, SINK, sink_key, source, used=MemoryUsedProposals(), clock_ms=lambda: now_ms
        )

    ask = {"proposal_id": second.proposal_id, "tool": "web.get", "target": URL}
    executor(later.block_time_ms + 1_000).verify(second.certificate_bytes(), **ask)  # type: ignore[arg-type]
    past = later.valid_until_ms + 60_000
    with pytest.raises(CertificateExpired) as refused:
        executor(past).verify(second.certificate_bytes(), **ask)  # type: ignore[arg-type]
    assert refused.value.reason == "expired"
