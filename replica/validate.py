"""Every message a peer sends is checked here, whole, before the core acts on any of it
(docs/consensus/protocol.md, "Byzantine peers": every field validated in one place, so that
no malformed message reaches the core's state).

This is the structural part: shapes, counts, sizes and ranges that need no state. What
needs the core's state (signatures against the membership, views against the current
one, chains against the tree) stays in the core, which raises `RemoteError` for it too.
Together they make the core's promise: whatever a peer sends, `Core.on_message` either
acts on a well-formed message or counts and drops it; it never raises anything else.
The fuzzer (tests/consensus/test_fuzz.py) holds it to that.
"""

from __future__ import annotations

from quorumgate.proto.membership import Membership
from quorumgate.replica.config import Limits
from quorumgate.replica.types import (
    HELLO_NONCE_BYTES,
    Block,
    Envelope,
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

# A proof of commit is the block that extends the committed one (2-chain), or two blocks
# in a proof kept from the 3-chain rule (replica/types.py CommitProof).
PROOF_BLOCKS_MAX = 2
HASH_BYTES = 32
SIGNATURE_BYTES = 64
HEIGHT_MAX = 2**63 - 1  # heights and views are u64 on the wire; we never need the top bit


def _require(condition: bool, reason: str, detail: str) -> None:
    if not condition:
        raise RemoteError(reason, detail)


def _member(index: int, membership: Membership, what: str) -> None:
    _require(membership.is_member(index), "non_member", f"{what} {index}")


def _number(value: int, what: str) -> None:
    _require(0 <= value <= HEIGHT_MAX, "malformed", f"{what} out of range")


def check_qc(qc: QuorumCert, membership: Membership) -> None:
    _number(qc.view, "qc view")
    _number(qc.height, "qc height")
    _require(len(qc.block_hash) == HASH_BYTES, "malformed", "qc block hash")
    _require(len(qc.signatures) <= membership.n, "malformed", "qc with more signers than members")
    for signer, signature in qc.signatures:
        _member(signer, membership, "qc signer")
        _require(len(signature) == SIGNATURE_BYTES, "malformed", "qc signature length")


def check_tc(tc: TimeoutCert, membership: Membership) -> None:
    _number(tc.view, "tc view")
    check_qc(tc.high_qc, membership)
    _require(len(tc.signatures) <= membership.n, "malformed", "tc with more signers than members")
    for signer, high_qc_view, signature in tc.signatures:
        _member(signer, membership, "tc signer")
        _number(high_qc_view, "tc high qc view")
        _require(len(signature) == SIGNATURE_BYTES, "malformed", "tc signature length")


def check_block(block: Block, membership: Membership, limits: Limits) -> None:
    _number(block.view, "block view")
    _number(block.height, "block height")
    _number(block.timestamp_ms, "block timestamp")
    _number(block.state_root_height, "state root height")
    _require(block.chain_id == membership.chain_id, "wrong_chain", "block of another chain")
    _require(block.height >= 1, "malformed", "a block above genesis has height >= 1")
    _require(len(block.parent_hash) == HASH_BYTES, "malformed", "parent hash")
    _require(len(block.state_root) in (0, HASH_BYTES), "malformed", "state root")
    _member(block.proposer, membership, "proposer")
    _require(
        len(block.payload) <= limits.batch_txs_max
        and block.payload_bytes <= limits.batch_bytes_max,
        "oversized_batch",
        f"{len(block.payload)} transactions",
    )
    _require(
        all(len(tx) <= limits.tx_bytes_max for tx in block.payload),
        "oversized_batch",
        "transaction over tx_bytes_max",
    )
    check_qc(block.justify, membership)


def _check_blocks(blocks: tuple[Block, ...], membership: Membership, limits: Limits) -> None:
    for block in blocks:
        check_block(block, membership, limits)


def check_sync_response(response: SyncResponse, membership: Membership, limits: Limits) -> None:
    """A committed part comes with its proof (one or two blocks and the QC of the last);
    a proof never comes alone; and the whole is bounded in blocks and bytes."""
    _number(response.committed_height, "committed height")
    _require(
        len(response.committed) <= limits.sync_blocks_max
        and len(response.pending) <= limits.sync_blocks_max
        and len(response.proof) <= PROOF_BLOCKS_MAX,
        "oversized_sync",
        f"{len(response.committed)}+{len(response.proof)}+{len(response.pending)} blocks",
    )
    for part in (response.committed, response.proof, response.pending):
        _check_blocks(part, membership, limits)
    # the proof's one or two blocks come on top, each bounded by batch_bytes_max
    total = sum(b.payload_bytes for part in (response.committed, response.pending) for b in part)
    _require(total <= limits.sync_bytes_max, "oversized_sync", f"{total} payload bytes")
    if response.committed or response.proof or response.proof_qc is not None:
        _require(
            len(response.proof) >= 1 and response.proof_qc is not None,
            "bad_sync_proof",
            "committed blocks or a proof without the other",
        )
    if response.proof_qc is not None:
        check_qc(response.proof_qc, membership)


def check_message(message: Message, membership: Membership, limits: Limits) -> None:
    """Raise `RemoteError` unless `message` is structurally well formed."""
    if isinstance(message, Proposal):
        check_block(message.block, membership, limits)
        _require(len(message.signature) == SIGNATURE_BYTES, "malformed", "proposal signature")
        if message.high_tc is not None:
            check_tc(message.high_tc, membership)
    elif isinstance(message, Vote):
        _number(message.view, "vote view")
        _number(message.height, "vote height")
        _member(message.voter, membership, "voter")
        _require(len(message.block_hash) == HASH_BYTES, "malformed", "vote block hash")
        _require(len(message.signature) == SIGNATURE_BYTES, "malformed", "vote signature")
    elif isinstance(message, Timeout):
        _number(message.view, "timeout view")
        _member(message.voter, membership, "timeout voter")
        _require(len(message.signature) == SIGNATURE_BYTES, "malformed", "timeout signature")
        check_qc(message.high_qc, membership)
        if message.high_tc is not None:
            check_tc(message.high_tc, membership)
    elif isinstance(message, TimeoutCert):
        check_tc(message, membership)
    elif isinstance(message, SyncRequest):
        _number(message.from_height, "sync from height")
        _number(message.max_blocks, "sync max blocks")
        _require(len(message.target_hash) in (0, HASH_BYTES), "malformed", "sync target hash")
    elif isinstance(message, SyncResponse):
        check_sync_response(message, membership, limits)
    elif isinstance(message, Hello | HelloReply):
        check_hello(message, membership)
    else:
        raise RemoteError("malformed", "unknown message type")


def check_hello(message: Hello | HelloReply, membership: Membership) -> None:
    _require(len(message.nonce) == HELLO_NONCE_BYTES, "malformed", "hello nonce length")
    _require(len(message.signature) == SIGNATURE_BYTES, "malformed", "hello signature length")
    if isinstance(message, HelloReply):
        _member(message.asker, membership, "hello asker")
        _number(message.last_signed_view, "last signed view")
        _number(message.view, "view")
        check_qc(message.high_qc, membership)
        if message.high_tc is not None:
            check_tc(message.high_tc, membership)


def check_envelope(envelope: Envelope, membership: Membership, limits: Limits) -> None:
    _require(envelope.chain_id == membership.chain_id, "wrong_chain", "envelope for another chain")
    check_message(envelope.message, membership, limits)
