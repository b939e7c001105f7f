"""Domain types of the consensus core: frozen values, validated on construction.

Protobuf never crosses into the core (see replica/wire.py for the codec); these types are
what the core, the safety rules and the simulation exchange. Hashes and signed bytes come
from proto/canonical.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quorumgate.proto.canonical import (
    HASH_BYTES,
    TAG_BLOCK,
    TAG_HELLO,
    TAG_HELLO_REPLY,
    TAG_PROPOSAL,
    TAG_QC,
    TAG_TIMEOUT,
    TAG_VOTE,
    Encoder,
)

SIGNATURE_BYTES = 64
ZERO_HASH = bytes(HASH_BYTES)


class RemoteError(Exception):
    """A peer broke the rules: its message is dropped and counted under `reason`.

    Never raised out of the core (h11's split: our bugs are assertions, theirs are this).
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# --------------------------------------------------------------------------- signing bytes


def vote_bytes(chain_id: str, view: int, height: int, block_hash: bytes) -> bytes:
    """b"qg/vote/v2" || chain id || view || height || block hash.

    The height is signed so that a QC proves it (docs/consensus/messages.md): a QC formed
    from votes alone, before its block arrives, then has a trusted height, and so does
    every copy of it — in commit proofs, timeouts, TCs and hello replies."""
    return bytes(Encoder(TAG_VOTE).text(chain_id).u64(view).u64(height).raw(block_hash))


def timeout_bytes(chain_id: str, view: int, high_qc_view: int) -> bytes:
    """A timeout signs its view and the view of the signer's highest QC (DiemBFT v4 §4)."""
    return bytes(Encoder(TAG_TIMEOUT).text(chain_id).u64(view).u64(high_qc_view))


def proposal_bytes(chain_id: str, view: int, block_hash: bytes) -> bytes:
    return bytes(Encoder(TAG_PROPOSAL).text(chain_id).u64(view).raw(block_hash))


def hello_bytes(chain_id: str, sender: int, nonce: bytes) -> bytes:
    return bytes(Encoder(TAG_HELLO).text(chain_id).u32(sender).blob(nonce))


def hello_reply_bytes(
    chain_id: str, replier: int, asker: int, nonce: bytes, last_signed_view: int, view: int
) -> bytes:
    """What a Rule 6 answer signs: who answers whom, for which start (the asker's nonce),
    and the view it last saw the asker sign in. Its certificates prove themselves."""
    return bytes(
        Encoder(TAG_HELLO_REPLY)
        .text(chain_id)
        .u32(replier)
        .u32(asker)
        .blob(nonce)
        .u64(last_signed_view)
        .u64(view)
    )


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True, slots=True)
class QuorumCert:
    """2f+1 votes from distinct members for (view, height, block_hash).

    Every vote signs all three (`vote_bytes`), so a valid QC's height is the certified
    block's: at least f+1 of its signers are honest, and each signed the height of the
    block it held.
    """

    view: int
    height: int
    block_hash: bytes
    signatures: tuple[tuple[int, bytes], ...] = ()
    # `digest()` once computed: a QC is hashed into its block, looked up in the verifier's
    # cache and carried by later blocks and timeouts, so hashing it once saves much.
    _digest: bytes = field(default=b"", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.block_hash) != HASH_BYTES:
            raise RemoteError("malformed", "qc block hash length")
        if self.view < 0 or self.height < 0:
            raise RemoteError("malformed", "negative qc view or height")
        signers = [s for s, _ in self.signatures]
        if signers != sorted(set(signers)):
            raise RemoteError("bad_certificate", "qc signers repeated or unsorted")
        if any(len(sig) != SIGNATURE_BYTES for _, sig in self.signatures):
            raise RemoteError("malformed", "qc signature length")

    @property
    def is_genesis(self) -> bool:
        return self.view == 0 and not self.signatures

    def digest(self) -> bytes:
        if self._digest:
            return self._digest
        enc = Encoder(TAG_QC).u64(self.view).u64(self.height).raw(self.block_hash)
        enc.u32(len(self.signatures))
        for signer, sig in self.signatures:
            enc.u32(signer).raw(sig)
        digest = enc.digest()
        object.__setattr__(self, "_digest", digest)  # frozen: set once, never changed
        return digest

    def __repr__(self) -> str:
        short = self.block_hash[:4].hex()
        return f"QC(v={self.view}, h={self.height}, {short}, n={len(self.signatures)})"


@dataclass(frozen=True, slots=True)
class TimeoutCert:
    """2f+1 signed timeouts for one view, with the highest QC among the signers'."""

    view: int
    high_qc: QuorumCert
    signatures: tuple[tuple[int, int, bytes], ...]  # (signer, high_qc_view, signature)

    def __post_init__(self) -> None:
        signers = [s for s, _, _ in self.signatures]
        if signers != sorted(set(signers)):
            raise RemoteError("bad_certificate", "tc signers repeated or unsorted")
        if any(len(sig) != SIGNATURE_BYTES for _, _, sig in self.signatures):
            raise RemoteError("malformed", "tc signature length")
        if self.signatures and self.high_qc.view != max(v for _, v, _ in self.signatures):
            raise RemoteError("bad_certificate", "tc high qc is not the signers' highest")
        if self.high_qc.view >= self.view:
            raise RemoteError("bad_certificate", "tc high qc not below tc view")

    def __repr__(self) -> str:
        return f"TC(v={self.view}, hqc={self.high_qc.view}, n={len(self.signatures)})"


# --------------------------------------------------------------------------- blocks


@dataclass(frozen=True, slots=True)
class Block:
    """(parent hash, view, height, justify QC, timestamp, payload, previous state root).

    Build one with `Block.create`, which computes `hash`; the codec does the same for blocks
    from the wire, so a block's hash is never taken from a peer.
    """

    chain_id: str
    parent_hash: bytes
    view: int
    height: int
    justify: QuorumCert
    timestamp_ms: int
    proposer: int
    payload: tuple[bytes, ...]
    state_root_height: int
    state_root: bytes
    hash: bytes = field(default=b"", compare=False)
    payload_bytes: int = field(default=0, compare=False)

    @staticmethod
    def create(
        chain_id: str,
        parent_hash: bytes,
        view: int,
        height: int,
        justify: QuorumCert,
        timestamp_ms: int,
        proposer: int,
        payload: tuple[bytes, ...],
        state_root_height: int = 0,
        state_root: bytes = b"",
    ) -> Block:
        enc = Encoder(TAG_BLOCK).text(chain_id).raw(parent_hash).u64(view).u64(height)
        enc.raw(justify.digest()).u64(timestamp_ms).u32(proposer).blobs(payload)
        enc.u64(state_root_height).blob(state_root)
        return Block(
            chain_id,
            parent_hash,
            view,
            height,
            justify,
            timestamp_ms,
            proposer,
            payload,
            state_root_height,
            state_root,
            hash=enc.digest(),
            payload_bytes=sum(len(tx) for tx in payload),
        )

    def __post_init__(self) -> None:
        if len(self.parent_hash) != HASH_BYTES:
            raise RemoteError("malformed", "parent hash length")
        if len(self.hash) != HASH_BYTES:
            raise RemoteError("malformed", "block built without Block.create")
        if self.height > 0 and (
            self.justify.block_hash != self.parent_hash or self.justify.height + 1 != self.height
        ):
            raise RemoteError("malformed", "justify does not certify the parent")
        if self.height > 0 and self.view <= self.justify.view:
            raise RemoteError("malformed", "block view not above its justify view")
        if self.height > 0 and self.state_root_height >= self.height:
            raise RemoteError("malformed", "state root height not below block height")

    def __repr__(self) -> str:
        return (
            f"Block(v={self.view}, h={self.height}, {self.hash[:4].hex()}, "
            f"parent={self.parent_hash[:4].hex()}, txs={len(self.payload)})"
        )


def genesis_block(chain_id: str) -> Block:
    """Height 0, view 0: every chain starts here; its hash depends on the chain id."""
    return Block.create(chain_id, ZERO_HASH, 0, 0, QuorumCert(0, 0, ZERO_HASH), 0, 0, (), 0, b"")


def genesis_qc(chain_id: str) -> QuorumCert:
    """The unsigned certificate of the genesis block, valid by definition."""
    return QuorumCert(0, 0, genesis_block(chain_id).hash)


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Proposal:
    block: Block
    signature: bytes
    high_tc: TimeoutCert | None = None

    def __repr__(self) -> str:
        return f"Proposal({self.block!r}, tc={self.high_tc!r})"


@dataclass(frozen=True, slots=True)
class Vote:
    view: int
    height: int
    block_hash: bytes
    voter: int
    signature: bytes

    def __repr__(self) -> str:
        return f"Vote(v={self.view}, {self.block_hash[:4].hex()}, by={self.voter})"


@dataclass(frozen=True, slots=True)
class Timeout:
    view: int
    high_qc: QuorumCert
    voter: int
    signature: bytes
    high_tc: TimeoutCert | None = None

    def __repr__(self) -> str:
        return f"Timeout(v={self.view}, hqc={self.high_qc.view}, by={self.voter})"


@dataclass(frozen=True, slots=True)
class SyncRequest:
    from_height: int
    max_blocks: int
    target_hash: bytes = b""


@dataclass(frozen=True, slots=True)
class SyncResponse:
    """Committed blocks, a commit proof for the last of them, then pending blocks.

    `proof` holds the block that extends the last committed block in the view after its,
    and `proof_qc` certifies it: the 2-chain that commits it (replica/blocktree.py). A
    proof kept from the 3-chain rule has that block's child too, certified by `proof_qc`.
    """

    committed: tuple[Block, ...]
    proof: tuple[Block, ...]
    proof_qc: QuorumCert | None
    pending: tuple[Block, ...]
    committed_height: int
    # The lowest committed height the server holds (0: all of them); a request below it
    # gets no blocks: the server pruned them (docs/pruning.md).
    history_from: int = 0
    # Every epoch after 0 the server started, oldest first, sent only to a replica of an
    # older epoch that asked below the server's history or past its own epoch's end: the
    # links it checks from its cluster file before it takes a base of a later epoch
    # (replica/epochchain.py; docs/pruning.md, "A wiped replica behind pruned peers").
    epoch_ends: tuple[EpochLink, ...] = ()


@dataclass(frozen=True, slots=True)
class EpochLink:
    """One stored epoch end on the wire (replica/epochchain.py `RawEpochEnd`): the epoch
    it started, its members' keys (32 bytes each), how the epoch before ended (encoded
    by replica/wire.py `encode_epoch_end`). Unchecked until `extend_epoch_chain`."""

    epoch: int
    keys: bytes
    ended: bytes


HELLO_NONCE_BYTES = 16


@dataclass(frozen=True, slots=True)
class Hello:
    """Sent by a replica that (re)started: "what is the last view you saw me sign in?"
    (safety Rule 6: a replica restored from an old copy of its data has forgotten). The
    nonce is fresh at every start; answers must repeat it, and are signed (unsigned
    replies with a self-declared sender would end the fencing of a restored replica)."""

    nonce: bytes
    signature: bytes


@dataclass(frozen=True, slots=True)
class HelloReply:
    last_signed_view: int  # the highest view of a vote, timeout or proposal seen from the asker
    view: int  # the replier's current view
    high_qc: QuorumCert
    high_tc: TimeoutCert | None = None
    asker: int = 0
    nonce: bytes = b""  # the asker's Hello nonce
    signature: bytes = b""  # the replier's, over hello_reply_bytes


Message = Proposal | Vote | Timeout | TimeoutCert | SyncRequest | SyncResponse | Hello | HelloReply


@dataclass(frozen=True, slots=True)
class Envelope:
    """What travels between replicas: the chain id, the claimed sender, one message, and
    the consensus epoch the sender was in (docs/consensus/epochs.md; 0 on a chain that
    never reconfigured)."""

    chain_id: str
    sender: int
    message: Message
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class CommitProof:
    """Why a commit's last block B0 is committed: `qc` certifies `b2`, and `b1` is B0's
    child in the view just after B0's. Under the 2-chain rule (replica/blocktree.py) `b2`
    is `b1` itself; a proof stored by a release with the 3-chain rule has `b2` as `b1`'s
    child, whose justify certifies `b1` — it proves the same commit under either rule."""

    b1: Block
    b2: Block
    qc: QuorumCert

    @staticmethod
    def two_chain(b1: Block, qc: QuorumCert) -> CommitProof:
        return CommitProof(b1, b1, qc)

    @property
    def blocks(self) -> tuple[Block, ...]:
        """The proof's distinct blocks, oldest first (what a sync response carries)."""
        return (self.b1,) if self.b1.hash == self.b2.hash else (self.b1, self.b2)
