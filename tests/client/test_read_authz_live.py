"""Reads of committed data are authorized (docs/security/reads-and-certificates.md):
`CommittedBlocks` holds every argument value of every call (and `EpochEnds` the change
blocks, with theirs), a sidecar's `Receipts` every verdict. They answer the owner, the
members and auditors; an agent reads its own verdicts; an unregistered key gets nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import client_pb2_grpc as cpb_grpc
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto import sidecar_pb2_grpc as spb_grpc
from quorumgate.proto.clusterfile import ClusterSpec, add_auditor
from quorumgate.runtime.channels import Reader, sync_channel
from quorumgate.sdk.polling import poll_for
from quorumgate.sdk.sync import SyncClient
from tests.support.cluster import new_agent, new_principal

URL = "https://example.com/authz"
READS = ("CommittedBlocks", "EpochEnds", "Receipts", "GetReceipt", "Registry")
RPC_S = 5.0


def _calls(spec: ClusterSpec, proposal_id: bytes) -> dict[str, Callable[[Any], object]]:
    """Each read, as a function of (replica channel, sidecar channel)."""
    return {
        "CommittedBlocks": lambda ch: next(
            iter(
                cpb_grpc.ReplicaStub(ch[0]).CommittedBlocks(
                    cpb.BlocksRequest(from_height=1), timeout=RPC_S
                )
            )
        ),
        "EpochEnds": lambda ch: cpb_grpc.ReplicaStub(ch[0]).EpochEnds(
            cpb.EpochEndsRequest(), timeout=RPC_S
        ),
        "Receipts": lambda ch: next(
            iter(
                spb_grpc.SidecarStub(ch[1]).Receipts(
                    spb.ReceiptsRequest(from_height=1), timeout=RPC_S
                )
            )
        ),
        "GetReceipt": lambda ch: spb_grpc.SidecarStub(ch[1]).GetReceipt(
            spb.ReceiptRequest(proposal_id=proposal_id), timeout=RPC_S
        ),
        "Registry": lambda ch: spb_grpc.SidecarStub(ch[1]).Registry(
            spb.RegistryRequest(), timeout=RPC_S
        ),
    }


def _answers(spec: ClusterSpec, reader: Reader | None, proposal_id: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    with (
        sync_channel(spec, 0, reader=reader) as replica,
        sync_channel(spec, 0, "sidecar", reader=reader) as sidecar,
    ):
        for name, call in _calls(spec, proposal_id).items():
            try:
                call((replica, sidecar))
                out[name] = "OK"
            except grpc.RpcError as err:
                out[name] = err.code().name
    return out


def test_an_unregistered_key_gets_nothing_and_an_anonymous_caller_less(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as agent:
        decision = agent.propose("web.get", URL, run_id="run-authz")
    stranger = Reader.of(SigningKey.generate())
    assert _answers(cluster, stranger, decision.proposal_id) == {
        name: "PERMISSION_DENIED" for name in READS
    }
    assert _answers(cluster, None, decision.proposal_id) == {
        name: "UNAUTHENTICATED" for name in READS
    }
    owner_reader = Reader.of(owner.aio.key)
    assert set(_answers(cluster, owner_reader, decision.proposal_id).values()) == {"OK"}


def test_an_auditor_the_owner_adds_reads_at_once(cluster: ClusterSpec, owner: SyncClient) -> None:
    auditor = SigningKey.generate()
    reader = Reader.of(auditor)
    assert _answers(cluster, reader, b"\x00" * 32)["CommittedBlocks"] == "PERMISSION_DENIED"
    add_auditor(
        cluster.directory,
        f"auditor-{bytes(auditor.verify_key).hex()[:8]}",
        bytes(auditor.verify_key),
    )
    # The running replica and sidecar each read the cluster file again, on their own
    # (within about a second): wait until both let the auditor in, for every read.
    seen: list[dict[str, str]] = []

    def every_read_allowed() -> bool | None:
        seen.append(_answers(cluster, reader, b"\x00" * 32))
        return set(seen[-1].values()) == {"OK"} or None

    allowed = poll_for(every_read_allowed, timeout_s=10, every_s=0.2)
    assert allowed, f"the auditor was not let in everywhere: {seen[-1]}"
    assert set(_answers(cluster, reader, b"\x00" * 32).values()) == {"OK"}


def test_an_agent_reads_its_own_verdicts_and_no_one_elses(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    _, alice_key = new_agent(owner, ["web.get"])
    _, bob_key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, alice_key) as alice, SyncClient(cluster, bob_key) as bob:
        mine = alice.propose("web.get", URL, run_id="run-alice")  # proved with its nonce
        assert mine.allowed
        theirs = bob.propose("web.get", URL, run_id="run-bob")
        from quorumgate.sdk.client import Refused

        with pytest.raises(Refused) as refused:
            alice.await_certificate(theirs.proposal_id, deadline_s=5)
        assert refused.value.reason == "read_not_authorized"
    # Alice's view of the Receipts stream: her verdicts only
    with sync_channel(cluster, 1, "sidecar", reader=Reader.of(alice_key)) as channel:
        stream = spb_grpc.SidecarStub(channel).Receipts(
            spb.ReceiptsRequest(from_height=1), timeout=RPC_S
        )
        seen: set[bytes] = set()
        try:
            for batch in stream:
                seen |= {r.leaf.proposal_id for r in batch.receipts}
                if mine.proposal_id in seen:
                    break
        finally:
            stream.cancel()
    assert mine.proposal_id in seen and theirs.proposal_id not in seen


def test_the_sdk_reads_each_key_its_own_registry_and_names_a_refusal(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """An agent reads its own entry and the tools, a principal its own agents; a stranger's
    refused read used to end, after the whole deadline, as "the cluster could not be
    reached" (`ClusterUnavailable`): now f+1 sidecars refusing it is `ReadNotAuthorized`,
    naming PERMISSION_DENIED, as soon as they have answered."""
    from quorumgate.sdk.client import ClusterUnavailable, ReadNotAuthorized

    person, person_key = new_principal(owner)
    mine, mine_key = new_agent(owner, ["web.get"], principal=person)
    other, _ = new_agent(owner, ["web.post"])
    with SyncClient(cluster, mine_key) as agent:
        seen = agent.registry()
        assert [a.agent_id for a in seen.agents] == [mine] and seen.scope == f"agent:{mine}"
        assert seen.tool("web.get") is not None and not seen.principals
    with SyncClient(cluster, person_key) as principal:
        seen = principal.registry()
        assert [a.agent_id for a in seen.agents] == [mine]
        assert [p.principal_id for p in seen.principals] == [person]
    assert owner.registry().agent(other) is not None
    with SyncClient(cluster, SigningKey.generate()) as stranger:
        try:
            stranger.registry(deadline_s=20)
        except ClusterUnavailable as err:
            raise AssertionError(f"a refusal reported as unavailable ({err.reason})") from err
        except ReadNotAuthorized as err:
            assert err.code == "PERMISSION_DENIED" and "PERMISSION_DENIED" in str(err)
        else:
            raise AssertionError("a stranger read the registry")


def test_a_refused_nonce_or_cards_read_is_named_not_taken_for_an_outage(
    cluster: ClusterSpec, owner: SyncClient
) -> None:
    """The registry's neighbours: `Account` (where a client starts its nonces) and
    `Pending` (a principal's open cards) refuse a read statement they cannot verify, here
    one signed ten minutes ago (a client whose clock is that far off). Every sidecar said
    UNAUTHENTICATED, and the client reported "the cluster could not be reached"; now it
    says the cluster could not verify its read statement."""
    import time

    from quorumgate.runtime.readauth import read_auth_metadata
    from quorumgate.sdk.client import Client, ClusterUnavailable, ReadNotAuthorized

    class SlowClock(Client):
        def _read_auth(self, method: str) -> tuple[tuple[str, str], ...]:
            then = int(time.time() * 1000) - 600_000
            sign = lambda m: bytes(self.key.sign(m).signature)  # noqa: E731
            return read_auth_metadata(self.spec.chain_id, method, self.public_key, sign, then)

    _, key = new_agent(owner, ["web.get"])
    with SyncClient(cluster, key) as plain:
        slow = SlowClock(cluster, key)
        for name, read in (("Account", slow.sync_nonce), ("Pending", slow.pending)):
            try:
                plain.run(read())
            except ClusterUnavailable as err:
                raise AssertionError(f"{name}: reported as unavailable ({err.reason})") from err
            except ReadNotAuthorized as err:
                assert err.code == "UNAUTHENTICATED" and "UNAUTHENTICATED" in str(err)
            else:
                raise AssertionError(f"{name} answered a statement ten minutes old")
        plain.run(slow.close())
