"""Serving catch-up requests: which committed blocks to send, and the proof that they are.

The core verifies and applies responses (`Core._on_sync_response`); answering needs the
committed log, which lives in the shell's storage (or the simulator's disk), so this pure
function takes a read-only view of it.

A response ends its committed part at a height for which the server kept a commit proof
(the 2-chain that committed it), so the asker can check the whole range against one QC.
Every `Commit` action yields a proof for its last block; in a healthy cluster that is every
block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core
from quorumgate.replica.types import Block, CommitProof, SyncRequest, SyncResponse

# How far past `max_blocks` a response may reach to end on a height that has a proof.
SYNC_PROOF_REACH_BLOCKS_MAX = 256


class CommittedStore(Protocol):
    """A synchronous read view of the committed log (the simulator's disk)."""

    def committed_height(self) -> int: ...

    def committed_range(self, start: int, end: int) -> list[Block]:
        """Committed blocks with heights start..end inclusive, in height order."""
        ...

    def proof_at_or_after(self, height: int, limit: int) -> CommitProof | None:
        """The proof with the smallest committed height in [height, limit], if any."""
        ...

    def proof_at_or_before(self, height: int, floor: int) -> CommitProof | None:
        """The proof with the largest committed height in [floor, height], if any."""
        ...


@dataclass(slots=True)
class SyncRepeats:
    """Which catch-up requests are answered again. An honest member has one request out
    at a time and, without an answer, asks again only after `Limits.sync_retry_ticks`
    (replica/core.py), and then the next peer: the same request from the same peer
    sooner than `repeat_ms_min` is a replay, and is dropped rather than read from the
    store and answered twice. One entry per member (members only reach a server)."""

    repeat_ms_min: int
    _last: dict[int, tuple[SyncRequest, int]] = field(default_factory=dict)

    def admit(self, peer: int, request: SyncRequest, now_ms: int) -> bool:
        """True if `request` from `peer` at `now_ms` is to be answered (and is noted)."""
        last = self._last.get(peer)
        if last is not None and last[0] == request and now_ms - last[1] < self.repeat_ms_min:
            return False
        self._last[peer] = (request, now_ms)
        return True


def proof_height(proof: CommitProof) -> int:
    return proof.b1.height - 1


@dataclass(frozen=True, slots=True)
class SyncWindow:
    """Which committed heights to send: start..want_end, or up to reach_end at most if no
    proof lies in start..want_end."""

    start: int
    want_end: int
    reach_end: int


def sync_window(request: SyncRequest, committed_height: int, limits: Limits) -> SyncWindow | None:
    start = max(request.from_height, 1)
    if start > committed_height:
        return None
    max_blocks = max(1, min(request.max_blocks, limits.sync_blocks_max))
    want_end = min(start + max_blocks - 1, committed_height)
    reach_end = min(committed_height, want_end + SYNC_PROOF_REACH_BLOCKS_MAX)
    return SyncWindow(start, want_end, reach_end)


def blocks_within(blocks: Sequence[Block], budget: int) -> int:
    """How many of `blocks`, from the first, fit in `budget` payload bytes. At least one:
    a block alone is bounded by `Limits.batch_bytes_max`, well under any budget."""
    total = 0
    for count, block in enumerate(blocks):
        total += block.payload_bytes
        if total > budget and count > 0:
            return count
    return len(blocks)


def assemble_sync_response(
    request: SyncRequest,
    committed: Sequence[Block],
    proof: CommitProof | None,
    committed_height: int,
    core: Core | None,
    limits: Limits,
    history_from: int = 0,
) -> SyncResponse:
    """The response for committed blocks read under a `SyncWindow`, plus pending blocks
    from the core when the committed part reaches the server's head; `history_from` is
    the lowest committed height the server holds (0: all), said in every answer."""
    if proof is None or not committed:
        committed, proof = (), None
    else:
        assert committed[-1].height == proof_height(proof), "proof does not match the range"
    pending: list[Block] = []
    end = committed[-1].height if committed else max(request.from_height, 1) - 1
    if core is not None and request.target_hash and end >= committed_height:
        budget = limits.sync_bytes_max - sum(b.payload_bytes for b in committed)
        for block in core.pending_chain(request.target_hash, limits.sync_blocks_max):
            budget -= block.payload_bytes
            if budget < 0:
                break
            pending.append(block)
    return SyncResponse(
        committed=tuple(committed),
        proof=_proof_blocks(proof),
        proof_qc=proof.qc if proof is not None else None,
        pending=tuple(pending),
        committed_height=committed_height,
        history_from=history_from,
    )


def _proof_blocks(proof: CommitProof | None) -> tuple[Block, ...]:
    return () if proof is None else proof.blocks


def build_sync_response(
    request: SyncRequest, store: CommittedStore, core: Core | None, limits: Limits
) -> SyncResponse:
    """Answer from a synchronous store (the async shell reads the same window itself)."""
    top = store.committed_height()
    window = sync_window(request, top, limits)
    committed: list[Block] = []
    proof: CommitProof | None = None
    if window is not None:
        proof = store.proof_at_or_before(window.want_end, window.start)
        if proof is None:
            proof = store.proof_at_or_after(window.want_end, window.reach_end)
        if proof is not None:
            committed = store.committed_range(window.start, proof_height(proof))
            # Bounded in bytes too (by blocks alone, 256 blocks of 160 KiB made a 40 MiB envelope,
            # over the gRPC limit, and the asker asked for the same again, for ever): end
            # at the last proof within `sync_bytes_max`; with none, send no committed part.
            fit = blocks_within(committed, limits.sync_bytes_max)
            if fit < len(committed):
                proof = store.proof_at_or_before(window.start + fit - 1, window.start)
                committed = committed[: proof_height(proof) - window.start + 1] if proof else []
    return assemble_sync_response(request, committed, proof, top, core, limits)
