"""Malformed, oversized, replayed and forged inputs to every RPC of a live replica."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from quorumgate.ops.live import RPC_TIMEOUT_S, Metrics
from quorumgate.ops.loadgen import LoadAgent
from quorumgate.proto import client_pb2 as cpb
from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import CONSENSUS_KEY_FILE, read_seed
from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.tx import parse
from quorumgate.replica.types import timeout_bytes
from quorumgate.replica.wire import SUBMIT_BATCH_TXS_MAX
from quorumgate.runtime.channels import peer_auth_metadata
from quorumgate.runtime.links import GRPC_MESSAGE_BYTES_MAX
from tests.support.live import (
    DROPPED,
    LiveCluster,
    wait_until,
)

N = 4
TARGET = 0  # the replica every bad input goes to
TX_BYTES_MAX = 64 * 1024  # a transaction over 64 KiB is refused (proto/limits.py)
# How long a CommittedBlocks stream from an unreachable height is left open before the
# client cancels it: it must have sent nothing by then.
FAR_STREAM_S = 1.0

StatusCode = grpc.StatusCode


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveCluster]:
    """One 4-replica cluster for this module's tests (each checks it survived its inputs)."""
    live = LiveCluster.create(tmp_path_factory.mktemp("bad-inputs") / "cluster", N)
    try:
        live.start()
        yield live
    finally:
        live.close()


def refusal(err: grpc.RpcError) -> tuple[grpc.StatusCode, str | None]:
    reason = dict(err.trailing_metadata() or ()).get("qg-reason")
    return err.code(), None if reason is None else str(reason)


def flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


def test_bad_inputs_get_exact_grpc_statuses_and_reasons_and_the_replica_stays_up(
    cluster: LiveCluster,
) -> None:
    """Against node 0, unary `Submit` then one `SubmitStream`, with a valid proposal in the
    middle of the stream (it must be accepted: one refusal does not end the stream):

    | input                                   | status              | qg-reason       |
    | garbage bytes                           | INVALID_ARGUMENT    | malformed       |
    | empty transaction                       | INVALID_ARGUMENT    | malformed       |
    | 64 KiB + 1 bytes                        | INVALID_ARGUMENT    | too_large       |
    | a signed proposal with one byte of its  | INVALID_ARGUMENT    | bad_signature   |
    |   signature flipped                     |                     |                 |
    | signed for another chain id             | FAILED_PRECONDITION | wrong_chain     |
    | the bytes of a committed proposal       | ALREADY_EXISTS      | replayed        |
    | another body under a committed nonce    | ALREADY_EXISTS      | replayed        |

    (RESOURCE_EXHAUSTED for a full mempool is out of reach here: an agent's nonce window,
    1024, is far below the per-agent and total mempool bounds.) The stream answers each
    with `accepted` False, the same reason, and `code` the unary status's number, echoing
    each request id; the refusals are counted in `qg_replica_submissions_total` by reason.
    A `Submit` over the server's gRPC message limit gets RESOURCE_EXHAUSTED.

    `Peer.Stream` fed garbage consensus messages: each is dropped and counted under
    `qg_replica_messages_dropped_total` by exactly its reason — wrong chain id, a
    non-member sender, an empty body, a vote hash of the wrong length, a vote and a
    proposal with bad signatures, a proposal from a member that does not lead its view, a
    timeout validly signed by member 1 but carrying a forged QC, a TC with forged
    signatures — and the stream's ack counts every message. A forged state-root report is
    refused PERMISSION_DENIED and counted. `CommittedBlocks` from height 2^64 - 1 sends
    nothing before the client cancels it.

    After all of that node 0 still answers Status and commits a new proposal with the
    others, and no process exited.
    """
    agent = cluster.agent("bad-inputs")
    committed_tx, committed_id = agent.proposal()
    assert cluster.submit(TARGET, committed_tx).accepted
    cluster.wait_committed([committed_id], TARGET)

    good_tx, _ = agent.proposal()
    signed = cluster.agent("flip").proposal()[0]
    foreign_tx, _ = _foreign_agent(cluster).proposal()
    conflicting = _same_nonce_other_body(cluster, "bad-inputs", nonce=1)
    cases = [
        ("garbage bytes", b"\x00garbage\xff" * 8, StatusCode.INVALID_ARGUMENT, "malformed"),
        ("empty transaction", b"", StatusCode.INVALID_ARGUMENT, "malformed"),
        ("oversized", os.urandom(TX_BYTES_MAX + 1), StatusCode.INVALID_ARGUMENT, "too_large"),
        (
            "flipped signature byte",
            _flip_signature(signed),
            StatusCode.INVALID_ARGUMENT,
            "bad_signature",
        ),
        ("wrong chain id", foreign_tx, StatusCode.FAILED_PRECONDITION, "wrong_chain"),
        ("replay of a committed tx", committed_tx, StatusCode.ALREADY_EXISTS, "replayed"),
        ("committed nonce, other body", conflicting, StatusCode.ALREADY_EXISTS, "replayed"),
    ]
    _assert_refused_unary_and_streamed(cluster, cases, good_tx)
    _assert_oversized_refused(cluster, agent)

    _garbage_to_peer_stream(cluster)
    _forged_state_roots(cluster)
    _far_committed_blocks(cluster)

    assert cluster.alive() == list(range(N)), "a replica exited"
    assert cluster.status(TARGET).node == TARGET
    fresh_tx, fresh_id = agent.proposal()
    assert cluster.submit(TARGET, fresh_tx).accepted
    height = cluster.wait_committed([fresh_id], TARGET)[fresh_id]
    cluster.wait_height(height, range(N))
    cluster.assert_same_chain(list(range(N)), height)
    cluster.assert_no_equivocation_seen()


Case = tuple[str, bytes, StatusCode, str]  # what, transaction bytes, status, qg-reason


def _assert_refused_unary_and_streamed(
    cluster: LiveCluster, cases: list[Case], good_tx: bytes
) -> None:
    """Each case refused on `Submit` and on one `SubmitStream` with `good_tx` accepted in
    its middle, and every refusal counted by reason."""
    before = cluster.metrics(TARGET)

    for what, tx, code, reason in cases:
        with pytest.raises(grpc.RpcError) as refused:
            cluster.submit(TARGET, tx)
        assert refusal(refused.value) == (code, reason), f"unary Submit of {what}"
        assert refused.value.details().startswith(f"{reason}: "), refused.value.details()

    streamed = [tx for _, tx, _, _ in cases]
    middle = len(streamed) // 2
    streamed.insert(middle, good_tx)
    replies = cluster.submit_stream(TARGET, streamed, batch=3)
    good = replies.pop(middle)
    assert good.accepted and good.code == StatusCode.OK.value[0], good
    for (what, _, code, reason), reply in zip(cases, replies, strict=True):
        assert (reply.accepted, reply.reason, reply.code) == (False, reason, code.value[0]), (
            f"SubmitStream of {what}: {reply}"
        )
        assert reply.detail, f"SubmitStream of {what}: no detail"

    after = cluster.metrics(TARGET)
    for reason in {r for _, _, _, r in cases}:
        expected = 2 * sum(1 for _, _, _, r in cases if r == reason)
        counted = after.value(
            "qg_replica_submissions_total", result="refused", reason=reason
        ) - before.value("qg_replica_submissions_total", result="refused", reason=reason)
        assert counted == expected, f"refusals counted for {reason}: {counted}, not {expected}"


def _assert_oversized_refused(cluster: LiveCluster, agent: LoadAgent) -> None:
    """A `Submit` over the gRPC message limit, and a `SubmitStream` batch over its own."""
    with pytest.raises(grpc.RpcError) as too_big:
        cluster.submit(TARGET, b"\x00" * (GRPC_MESSAGE_BYTES_MAX + 1))
    assert too_big.value.code() == StatusCode.RESOURCE_EXHAUSTED

    # A SubmitStream batch over its limit ends the stream with a sentence naming the limit,
    # after the batch before it has been admitted and answered.
    before_tx, before_id = agent.proposal()
    fine = cpb.SubmitBatch(requests=[cpb.SubmitRequest(tx=before_tx, request_id=1)])
    over = cpb.SubmitBatch(
        requests=[cpb.SubmitRequest(tx=b"", request_id=k) for k in range(SUBMIT_BATCH_TXS_MAX + 1)]
    )
    answered: list[cpb.SubmitBatchReply] = []
    with pytest.raises(grpc.RpcError) as too_many:
        for reply_batch in cluster.replica(TARGET).SubmitStream(
            iter([fine, over]), timeout=RPC_TIMEOUT_S
        ):
            answered.append(reply_batch)
    assert too_many.value.code() == StatusCode.INVALID_ARGUMENT
    assert f"at most {SUBMIT_BATCH_TXS_MAX} requests" in too_many.value.details()
    assert [[r.accepted for r in b.replies] for b in answered] == [[True]], answered
    cluster.wait_committed([before_id], TARGET)


def test_undecodable_request_frames_on_every_rpc_get_invalid_argument_and_the_replica_stays_up(
    cluster: LiveCluster,
) -> None:
    """Bytes that are not the RPC's protobuf request at all (a length-delimited field cut
    short), sent to every method of both services, must be refused INVALID_ARGUMENT — the
    status the client API promises for malformed input — and leave the replica serving."""
    frame = b"\x0a\xff\xff\xff\xff"
    channel = cluster.channel(TARGET)
    key = Ed25519Signer(read_seed(cluster.spec.node_dir(1) / CONSENSUS_KEY_FILE))
    now_ms = int(time.time() * 1000)
    member_1 = peer_auth_metadata(cluster.chain_id, 1, TARGET, now_ms, key)
    calls: dict[str, Callable[[str], object]] = {
        "/qgpb.Replica/Submit": lambda p: channel.unary_unary(p)(frame, timeout=RPC_TIMEOUT_S),
        "/qgpb.Replica/Status": lambda p: channel.unary_unary(p)(frame, timeout=RPC_TIMEOUT_S),
        "/qgpb.Replica/CommittedBlocks": lambda p: list(
            channel.unary_stream(p)(frame, timeout=RPC_TIMEOUT_S)
        ),
        "/qgpb.Replica/SubmitStream": lambda p: list(
            channel.stream_stream(p)(iter([frame]), timeout=RPC_TIMEOUT_S)
        ),
        "/qgpb.Replica/ReportStateRoots": lambda p: channel.stream_unary(p)(
            iter([frame]), timeout=RPC_TIMEOUT_S
        ),
        # a peer stream is read only once it is authenticated: as member 1, with its key
        "/qgpb.Peer/Stream": lambda p: channel.stream_unary(p)(
            iter([frame]), timeout=RPC_TIMEOUT_S, metadata=member_1
        ),
    }
    answers = {}
    for path, call in calls.items():
        try:
            call(path)
        except grpc.RpcError as err:
            answers[path] = err.code()
        else:
            answers[path] = StatusCode.OK
    assert cluster.alive() == list(range(N)), "a replica exited"
    assert cluster.status(TARGET).node == TARGET
    wrong = {
        path: code.name for path, code in answers.items() if code != StatusCode.INVALID_ARGUMENT
    }
    assert not wrong, f"undecodable requests not refused INVALID_ARGUMENT: {wrong}"


def test_accepted_submit_replies_carry_an_empty_reason_as_client_proto_documents(
    cluster: LiveCluster,
) -> None:
    """client.proto, SubmitReply.reason: "machine-readable refusal reason ("" when
    accepted)". Unary and streamed acceptances must say nothing there, so a client can test
    `reason` alone; and `detail` must be empty too, or a sentence, never a reason code."""
    agent = cluster.agent("accepted-reason")
    unary = cluster.submit(TARGET, agent.proposal()[0])
    [streamed] = cluster.submit_stream(TARGET, [agent.proposal()[0]])
    for how, reply in (("Submit", unary), ("SubmitStream", streamed)):
        assert reply.accepted and reply.code == StatusCode.OK.value[0], f"{how}: {reply}"
        assert reply.reason == "", f"{how} accepted with reason {reply.reason!r}, not ''"


# ============================================================================ helpers


def _foreign_agent(cluster: LiveCluster) -> LoadAgent:
    return LoadAgent.from_seed(cluster.chain_id + "-other", "foreign")


def _same_nonce_other_body(cluster: LiveCluster, name: str, nonce: int) -> bytes:
    """A proposal by agent `name` under `nonce` whose body differs from the first one's."""
    agent = cluster.agent(name)
    agent.next_nonce = nonce
    tx, _ = agent.proposal(seq=10_000 + nonce)
    return tx


def _flip_signature(tx: bytes) -> bytes:
    """`tx` with one byte of its Ed25519 signature flipped (found in the serialized bytes,
    so nothing else changes)."""
    signature = parse(tx).signed.signature
    at = tx.index(signature)
    flipped = flip(tx, at + 7)
    assert flipped != tx and len(flipped) == len(tx)
    return flipped


def _wait_drops(cluster: LiveCluster, before: Metrics, expected: dict[str, int]) -> None:
    """Wait until node 0 counted exactly `expected` more drops per reason than `before`."""

    def deltas() -> dict[str, int]:
        now = cluster.metrics(TARGET).by_label(DROPPED, "reason")
        then = before.by_label(DROPPED, "reason")
        return {r: int(v - then.get(r, 0)) for r, v in now.items() if v - then.get(r, 0)}

    wait_until(
        f"node 0 to count drops {expected}",
        lambda: all(deltas().get(r, 0) >= n for r, n in expected.items()),
        timeout_s=15,
        describe=lambda: f"drops counted: {deltas()}",
    )
    assert deltas() == expected, "dropped messages counted under other reasons"


@dataclass(frozen=True)
class _Forger:
    """Consensus messages member 1 could send on its own stream, forged in `view`."""

    chain: str
    view: int
    member1: Ed25519Signer

    def message(self, sender: int = 1, chain_id: str | None = None) -> pb.ConsensusMessage:
        return pb.ConsensusMessage(chain_id=chain_id or self.chain, sender=sender)

    def vote(
        self, msg: pb.ConsensusMessage, block_hash: bytes | None = None
    ) -> pb.ConsensusMessage:
        msg.vote.view = self.view
        msg.vote.height = 3
        msg.vote.block_hash = os.urandom(32) if block_hash is None else block_hash
        msg.vote.voter = msg.sender if msg.sender < N else 1
        msg.vote.signature = os.urandom(64)
        return msg

    def batch(self, *inner: pb.ConsensusMessage, sender: int = 1) -> pb.ConsensusMessage:
        """`inner` in one batch (replica/transport.py), under `sender`."""
        msg = self.message(sender=sender)
        msg.batch.messages.extend(inner)
        return msg

    @staticmethod
    def forged_qc(qc: pb.QuorumCert, qc_view: int) -> None:
        qc.view = qc_view
        qc.height = 3
        qc.block_hash = os.urandom(32)
        for signer in range(3):
            qc.signatures.add(signer=signer, signature=os.urandom(64))

    def proposal(self, proposal_view: int) -> pb.ConsensusMessage:
        leader = proposal_view % N
        msg = self.message(sender=leader)
        block = msg.proposal.block
        self.forged_qc(block.justify, proposal_view - 4)
        block.parent_hash = block.justify.block_hash
        block.view = proposal_view
        block.height = 4
        block.timestamp_ms = 1
        block.proposer = leader
        msg.proposal.signature = os.urandom(64)
        return msg

    def timeout(self) -> pb.ConsensusMessage:
        """A timeout validly signed by member 1, carrying a forged QC."""
        view = self.view
        msg = self.message(sender=1)
        msg.timeout.view = view
        msg.timeout.voter = 1
        self.forged_qc(msg.timeout.high_qc, view - 4)
        msg.timeout.signature = self.member1.sign(timeout_bytes(self.chain, view, view - 4))
        return msg

    def timeout_cert(self) -> pb.ConsensusMessage:
        """A TC with forged signatures."""
        view = self.view
        msg = self.message(sender=1)
        msg.timeout_cert.view = view
        self.forged_qc(msg.timeout_cert.high_qc, view - 4)
        for signer in range(3):
            msg.timeout_cert.signatures.add(
                signer=signer, high_qc_view=view - 4, signature=os.urandom(64)
            )
        return msg

    def garbage(self) -> dict[str, list[pb.ConsensusMessage]]:
        """Messages by the reason they must be dropped for."""
        view = self.view
        # A view whose leader is neither node 0 nor 1, and one that member 1 leads.
        lead_view = next(v for v in range(view, view + N) if v % N not in (TARGET, 1))
        not_leader = self.proposal(lead_view)
        not_leader.sender = not_leader.proposal.block.proposer = 1
        bad_sig_proposal = self.proposal(next(v for v in range(view, view + N) if v % N == 1))
        spoofed = self.vote(self.message(sender=2))  # member 1's stream, naming member 2
        # Each batch holds one message, whose drop it must cause exactly as if alone: a
        # batch is no way around a check. One naming another sender; one inside another;
        # what the batch's own fields say is not read (a batch naming member 2 around
        # member 1's forged vote is the vote's bad signature, nothing else).
        batched = {
            "spoofed_sender": [self.batch(self.vote(self.message(sender=2)))],
            "nested_batch": [self.batch(self.batch(self.vote(self.message())))],
            "bad_signature": [
                self.batch(self.vote(self.message())),
                self.batch(self.vote(self.message()), sender=2),
            ],
            "wrong_chain": [self.batch(self.vote(self.message(chain_id=self.chain + "-other")))],
        }
        alone = {
            "wrong_chain": [self.vote(self.message(chain_id=self.chain + "-other"))],
            "spoofed_sender": [self.vote(self.message(sender=N + 95)), spoofed],
            "malformed": [self.message(), self.vote(self.message(), block_hash=b"\x01" * 31)],
            "bad_signature": [self.vote(self.message()), bad_sig_proposal],
            "not_leader": [not_leader],
            "bad_certificate": [self.timeout(), self.timeout_cert()],
        }
        return {r: alone.get(r, []) + batched.get(r, []) for r in {*alone, *batched}}


def _garbage_to_peer_stream(cluster: LiveCluster) -> None:
    chain = cluster.chain_id
    view = cluster.status(TARGET).view + 8  # ahead, but within the core's vote window (16)
    member1 = Ed25519Signer(read_seed(cluster.spec.node_dir(1) / CONSENSUS_KEY_FILE))
    forger = _Forger(chain, view, member1)
    sent = forger.garbage()
    messages = [m for batch in sent.values() for m in batch]
    before = cluster.metrics(TARGET)
    # A Byzantine member 1: it authenticates as itself, then sends garbage, and messages
    # that claim to come from someone else.
    as_member_1 = peer_auth_metadata(chain, 1, TARGET, int(time.time() * 1000), member1)
    ack = cluster.peer(TARGET).Stream(iter(messages), timeout=RPC_TIMEOUT_S, metadata=as_member_1)
    assert ack.received == len(messages)
    _wait_drops(cluster, before, {reason: len(batch) for reason, batch in sent.items()})

    # Anyone else: a stream without the signed statement, or with one signed by the wrong
    # key, or one meant for another member, is refused before a message is read.
    before = cluster.metrics(TARGET)
    outsider = Ed25519Signer(os.urandom(32))
    for metadata in (
        (),
        peer_auth_metadata(chain, 1, TARGET, int(time.time() * 1000), outsider),
        peer_auth_metadata(chain, 1, 2, int(time.time() * 1000), member1),
        peer_auth_metadata(chain, 1, TARGET, int(time.time() * 1000) - 10**7, member1),
    ):
        with pytest.raises(grpc.RpcError) as anonymous:
            cluster.peer(TARGET).Stream(
                iter([forger.vote(forger.message())]), timeout=RPC_TIMEOUT_S, metadata=metadata
            )
        assert anonymous.value.code() == StatusCode.UNAUTHENTICATED
    _wait_drops(cluster, before, {"unauthenticated_peer": 4})

    with pytest.raises(grpc.RpcError) as too_big:
        cluster.peer(TARGET).Stream(
            iter([pb.ConsensusMessage(chain_id="x" * (GRPC_MESSAGE_BYTES_MAX + 1))]),
            timeout=RPC_TIMEOUT_S * 4,
            metadata=as_member_1,
        )
    assert too_big.value.code() == StatusCode.RESOURCE_EXHAUSTED


def _forged_state_roots(cluster: LiveCluster) -> None:
    before = cluster.metrics(TARGET)
    report = spb.StateRootReport(height=1, state_root=os.urandom(32), signature=os.urandom(64))
    with pytest.raises(grpc.RpcError) as refused:
        cluster.replica(TARGET).ReportStateRoots(iter([report]), timeout=RPC_TIMEOUT_S)
    assert refused.value.code() == StatusCode.PERMISSION_DENIED
    _wait_drops(cluster, before, {"bad_root_report": 1})


def _far_committed_blocks(cluster: LiveCluster) -> None:
    call = cluster.replica(TARGET).CommittedBlocks(
        cpb.BlocksRequest(from_height=2**64 - 1), timeout=FAR_STREAM_S * 10
    )
    timer = threading.Timer(FAR_STREAM_S, call.cancel)
    timer.start()
    received = []
    try:
        with pytest.raises(grpc.RpcError) as ended:
            received.extend(call)
    finally:
        timer.cancel()
    assert ended.value.code() == StatusCode.CANCELLED, ended.value.code()
    assert received == [], f"CommittedBlocks from 2^64 - 1 sent {len(received)} blocks"
