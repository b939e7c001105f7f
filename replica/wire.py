"""The codec between protobuf wire messages and the core's domain types.

Protobuf objects never cross this module (a thin shell, as hypercorn keeps its wire code apart from
what it serves). Decoding is strict: anything a peer sends that does not make a well-formed domain
value raises `RemoteError("malformed", ...)`, which the shell counts and drops like the core does.
Block hashes are recomputed here from the fields, never read from the wire.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from quorumgate.proto import consensus_pb2 as pb
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.types import (
    Block,
    CommitProof,
    Envelope,
    EpochLink,
    Hello,
    HelloReply,
    Message,
    Proposal,
    QuorumCert,
    RemoteError,
    SyncRequest,
    SyncResponse,
    Timeout,
    TimeoutCert,
    Vote,
)
from quorumgate.runtime.links import ENVELOPE_BYTES_MAX

# Requests in one SubmitStream message (client.proto SubmitBatch). Batches a replica merges
# stop once they reach it, so a merge stays under twice this: under the sidecar's
# ADMIT_BATCH_TXS_MAX.
SUBMIT_BATCH_TXS_MAX = 1_024


# ------------------------------------------------------------------ encoding


def _qc_to_pb(qc: QuorumCert, out: pb.QuorumCert) -> None:
    out.view = qc.view
    out.height = qc.height
    out.block_hash = qc.block_hash
    for signer, sig in qc.signatures:
        out.signatures.add(signer=signer, signature=sig)


def _tc_to_pb(tc: TimeoutCert, out: pb.TimeoutCert) -> None:
    out.view = tc.view
    _qc_to_pb(tc.high_qc, out.high_qc)
    for signer, hqc_view, sig in tc.signatures:
        out.signatures.add(signer=signer, high_qc_view=hqc_view, signature=sig)


def _block_to_pb(block: Block, out: pb.Block) -> None:
    out.parent_hash = block.parent_hash
    out.view = block.view
    out.height = block.height
    _qc_to_pb(block.justify, out.justify)
    out.timestamp_ms = block.timestamp_ms
    out.proposer = block.proposer
    out.payload.extend(block.payload)
    out.state_root_height = block.state_root_height
    out.state_root = block.state_root


def block_to_pb(block: Block, out: pb.Block) -> None:
    """Fill `out` (for client streams of committed blocks)."""
    _block_to_pb(block, out)


def envelope_to_pb(envelope: Envelope) -> pb.ConsensusMessage:
    out = pb.ConsensusMessage(
        chain_id=envelope.chain_id, sender=envelope.sender, epoch=envelope.epoch
    )
    msg = envelope.message
    if isinstance(msg, Proposal):
        _block_to_pb(msg.block, out.proposal.block)
        out.proposal.signature = msg.signature
        if msg.high_tc is not None:
            _tc_to_pb(msg.high_tc, out.proposal.high_tc)
    elif isinstance(msg, Vote):
        out.vote.view = msg.view
        out.vote.block_hash = msg.block_hash
        out.vote.height = msg.height
        out.vote.voter = msg.voter
        out.vote.signature = msg.signature
    elif isinstance(msg, Timeout):
        out.timeout.view = msg.view
        _qc_to_pb(msg.high_qc, out.timeout.high_qc)
        out.timeout.voter = msg.voter
        out.timeout.signature = msg.signature
        if msg.high_tc is not None:
            _tc_to_pb(msg.high_tc, out.timeout.high_tc)
    elif isinstance(msg, TimeoutCert):
        _tc_to_pb(msg, out.timeout_cert)
    elif isinstance(msg, SyncRequest):
        out.sync_request.from_height = msg.from_height
        out.sync_request.max_blocks = msg.max_blocks
        out.sync_request.target_hash = msg.target_hash
    elif isinstance(msg, Hello):
        out.hello.nonce = msg.nonce
        out.hello.signature = msg.signature
    elif isinstance(msg, HelloReply):
        out.hello_reply.last_signed_view = msg.last_signed_view
        out.hello_reply.view = msg.view
        out.hello_reply.asker = msg.asker
        out.hello_reply.nonce = msg.nonce
        out.hello_reply.signature = msg.signature
        _qc_to_pb(msg.high_qc, out.hello_reply.high_qc)
        if msg.high_tc is not None:
            _tc_to_pb(msg.high_tc, out.hello_reply.high_tc)
    elif isinstance(msg, SyncResponse):
        resp = out.sync_response
        for block in msg.committed:
            _block_to_pb(block, resp.committed.add())
        for block in msg.proof:
            _block_to_pb(block, resp.proof.add())
        if msg.proof_qc is not None:
            _qc_to_pb(msg.proof_qc, resp.proof_qc)
        for block in msg.pending:
            _block_to_pb(block, resp.pending.add())
        resp.committed_height = msg.committed_height
        resp.history_from = msg.history_from
        for link in msg.epoch_ends:
            resp.epoch_ends.add(epoch=link.epoch, keys=link.keys, ended=link.ended)
    else:  # pragma: no cover - the Message union is closed
        raise AssertionError(f"unknown message {type(msg).__name__}")
    return out


def encode_envelope(envelope: Envelope) -> bytes:
    return bytes(envelope_to_pb(envelope).SerializeToString())


# ------------------------------------------------------------------ decoding


def _qc_from_pb(qc: pb.QuorumCert) -> QuorumCert:
    return QuorumCert(
        qc.view, qc.height, qc.block_hash, tuple((s.signer, s.signature) for s in qc.signatures)
    )


def _tc_from_pb(tc: pb.TimeoutCert) -> TimeoutCert:
    return TimeoutCert(
        tc.view,
        _qc_from_pb(tc.high_qc),
        tuple((s.signer, s.high_qc_view, s.signature) for s in tc.signatures),
    )


def _block_from_pb(chain_id: str, block: pb.Block) -> Block:
    if not block.HasField("justify"):
        raise RemoteError("malformed", "block without justify")
    return Block.create(
        chain_id,
        block.parent_hash,
        block.view,
        block.height,
        _qc_from_pb(block.justify),
        block.timestamp_ms,
        block.proposer,
        tuple(block.payload),
        block.state_root_height,
        block.state_root,
    )


def message_from_pb(chain_id: str, msg: pb.ConsensusMessage) -> Message:
    kind = msg.WhichOneof("body")
    if kind == "proposal":
        p = msg.proposal
        high_tc = _tc_from_pb(p.high_tc) if p.HasField("high_tc") else None
        return Proposal(_block_from_pb(chain_id, p.block), p.signature, high_tc)
    if kind == "vote":
        v = msg.vote
        if len(v.block_hash) != 32:
            raise RemoteError("malformed", "vote block hash length")
        return Vote(v.view, v.height, v.block_hash, v.voter, v.signature)
    if kind == "timeout":
        t = msg.timeout
        high_tc = _tc_from_pb(t.high_tc) if t.HasField("high_tc") else None
        return Timeout(t.view, _qc_from_pb(t.high_qc), t.voter, t.signature, high_tc)
    if kind == "timeout_cert":
        return _tc_from_pb(msg.timeout_cert)
    if kind == "sync_request":
        r = msg.sync_request
        return SyncRequest(r.from_height, r.max_blocks, r.target_hash)
    if kind == "sync_response":
        s = msg.sync_response
        return SyncResponse(
            committed=tuple(_block_from_pb(chain_id, b) for b in s.committed),
            proof=tuple(_block_from_pb(chain_id, b) for b in s.proof),
            proof_qc=_qc_from_pb(s.proof_qc) if s.HasField("proof_qc") else None,
            pending=tuple(_block_from_pb(chain_id, b) for b in s.pending),
            committed_height=s.committed_height,
            history_from=s.history_from,
            epoch_ends=tuple(EpochLink(e.epoch, e.keys, e.ended) for e in s.epoch_ends),
        )
    if kind == "hello":
        return Hello(msg.hello.nonce, msg.hello.signature)
    if kind == "hello_reply":
        h = msg.hello_reply
        if not h.HasField("high_qc"):
            raise RemoteError("malformed", "hello reply without a qc")
        high_tc = _tc_from_pb(h.high_tc) if h.HasField("high_tc") else None
        return HelloReply(
            h.last_signed_view,
            h.view,
            _qc_from_pb(h.high_qc),
            high_tc,
            h.asker,
            h.nonce,
            h.signature,
        )
    raise RemoteError("malformed", "empty consensus message")


def envelope_from_pb(msg: pb.ConsensusMessage) -> Envelope:
    try:
        message = message_from_pb(msg.chain_id, msg)
        return Envelope(msg.chain_id, msg.sender, message, msg.epoch)
    except (ValueError, OverflowError) as err:
        raise RemoteError("malformed", type(err).__name__) from err


def decode_envelope(data: bytes) -> Envelope:
    if len(data) > ENVELOPE_BYTES_MAX:
        raise RemoteError("oversized", f"{len(data)} bytes")
    msg = pb.ConsensusMessage()
    try:
        msg.ParseFromString(data)
    except DecodeError as err:
        raise RemoteError("malformed", "undecodable consensus message") from err
    return envelope_from_pb(msg)


# ------------------------------------------------------------------ local storage records


def encode_block(block: Block) -> bytes:
    out = pb.Block()
    _block_to_pb(block, out)
    return bytes(out.SerializeToString())


def decode_block(chain_id: str, data: bytes) -> Block:
    msg = pb.Block()
    try:
        msg.ParseFromString(data)
    except DecodeError as err:
        raise RemoteError("malformed", "undecodable block") from err
    return _block_from_pb(chain_id, msg)


def encode_proof(proof: CommitProof) -> bytes:
    out = pb.StoredProof()
    _block_to_pb(proof.b1, out.b1)
    _block_to_pb(proof.b2, out.b2)
    _qc_to_pb(proof.qc, out.qc)
    return bytes(out.SerializeToString())


def decode_proof(chain_id: str, data: bytes) -> CommitProof:
    msg = pb.StoredProof()
    try:
        msg.ParseFromString(data)
    except DecodeError as err:
        raise RemoteError("malformed", "undecodable proof") from err
    return CommitProof(
        _block_from_pb(chain_id, msg.b1), _block_from_pb(chain_id, msg.b2), _qc_from_pb(msg.qc)
    )


def encode_epoch_end(boundary: Block, suffix: tuple[Block, ...], qc: QuorumCert) -> bytes:
    """How an epoch ended, for the store's `epochs` table: the change block, its suffix
    and the QC certifying the suffix's last block, in a SyncResponse's fields (a local
    record, never sent as such: docs/consensus/epochs.md, "The live replica")."""
    out = pb.SyncResponse(committed_height=boundary.height)
    _block_to_pb(boundary, out.committed.add())
    for block in suffix:
        _block_to_pb(block, out.proof.add())
    _qc_to_pb(qc, out.proof_qc)
    return bytes(out.SerializeToString())


def decode_epoch_end(chain_id: str, data: bytes) -> tuple[Block, tuple[Block, ...], QuorumCert]:
    msg = pb.SyncResponse()
    try:
        msg.ParseFromString(data)
    except DecodeError as err:
        raise RemoteError("malformed", "undecodable epoch end") from err
    if len(msg.committed) != 1 or not msg.proof or not msg.HasField("proof_qc"):
        raise RemoteError("malformed", "an epoch end is one change block, a suffix and a QC")
    boundary = _block_from_pb(chain_id, msg.committed[0])
    suffix = tuple(_block_from_pb(chain_id, b) for b in msg.proof)
    return boundary, suffix, _qc_from_pb(msg.proof_qc)


def encode_safety(state: SafetyState) -> bytes:
    out = pb.SafetyRecord(
        epoch=state.epoch,
        last_voted_view=state.last_voted_view,
        last_proposed_view=state.last_proposed_view,
    )
    _qc_to_pb(state.locked_qc, out.locked_qc)
    _qc_to_pb(state.high_qc, out.high_qc)
    if state.last_vote is not None:
        v = state.last_vote
        out.last_vote.view = v.view
        out.last_vote.height = v.height
        out.last_vote.block_hash = v.block_hash
        out.last_vote.voter = v.voter
    if state.last_timeout is not None:
        t = state.last_timeout
        out.last_timeout.view = t.view
        _qc_to_pb(t.high_qc, out.last_timeout.high_qc)
        out.last_timeout.voter = t.voter
        if t.high_tc is not None:
            _tc_to_pb(t.high_tc, out.last_timeout.high_tc)
    if state.high_tc is not None:
        _tc_to_pb(state.high_tc, out.high_tc)
    return bytes(out.SerializeToString())


def decode_safety(data: bytes) -> SafetyState:
    msg = pb.SafetyRecord()
    msg.ParseFromString(data)
    last_vote = None
    if msg.HasField("last_vote"):
        v = msg.last_vote
        last_vote = Vote(v.view, v.height, v.block_hash, v.voter, b"")
    last_timeout = None
    if msg.HasField("last_timeout"):
        t = msg.last_timeout
        tc = _tc_from_pb(t.high_tc) if t.HasField("high_tc") else None
        last_timeout = Timeout(t.view, _qc_from_pb(t.high_qc), t.voter, b"", tc)
    return SafetyState(
        epoch=msg.epoch,
        last_voted_view=msg.last_voted_view,
        locked_qc=_qc_from_pb(msg.locked_qc),
        high_qc=_qc_from_pb(msg.high_qc),
        last_proposed_view=msg.last_proposed_view,
        last_vote=last_vote,
        last_timeout=last_timeout,
        high_tc=_tc_from_pb(msg.high_tc) if msg.HasField("high_tc") else None,
    )
