"""A committed base for a replica whose log is below every peer's pruned history
(docs/pruning.md, "A wiped replica behind pruned peers").

A replica catches up by blocks from its committed head (replica/core.py). Once its peers
pruned below their snapshots, a replica with an empty (wiped or new) store, or one further
behind than their retention, asks for heights nobody keeps: each peer answers with no
blocks and the height its log starts at (`SyncResponse.history_from`). Once f+1 peers
said so (`BaseAsks`), the shell asks one of them for its log from that height, an
ordinary catch-up request with `from_height` at the peer's start, and the peer answers as
for any request: committed blocks from there with the commit proof of the last one
(replica/sync.py).

`check_base` decides whether that answer proves what it claims: its blocks form one chain
from the height asked, and the last of them is committed under the commit rule
(replica/blocktree.py): its child is in the next view and certified (by the proof's QC,
or, in a proof kept from the 3-chain rule, by the justify of the grandchild the QC
certifies), each certificate carrying a quorum (2f+1) of valid signatures of the members
the replica knows. Committed blocks need nothing else: a
committed block's ancestors are committed, and the chain's hashes bind them to it. Each
block's own justify is checked too, as sync checks it, so a block kept here and served on
is one any member would take.

On a chain past epoch 0 the certificates above a change block are the next member set's,
so a base is checked with the member set of the epoch it lies in, never with the one the
replica runs (`ChainedBases`): the asking replica first checks the chain of epochs its
peers send with their answers, link by link from its cluster file, exactly as a follower
does (replica/epochchain.py `extend_epoch_chain`: each change block's commit certified by a
quorum of the epoch it ends), keeps the longest chain that checks, asks for a base in the
newest epoch that chain knows, and checks that base with that epoch's keys. Keys rotated
out (an old epoch's quorum, perhaps stolen) sign nothing that counts above the change
block that retired them.

Pure and deterministic like the core: the shell hands in the answer and the core's
certificate checker, and installs what comes back (replica/storage.py `install_base`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from quorumgate.proto.crypto import Verifier
from quorumgate.proto.membership import Membership, OwnerRecords
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.epochchain import (
    ChainedEpoch,
    EpochChain,
    RawEpochEnd,
    extend_epoch_chain,
    reader_of,
)
from quorumgate.replica.epochs import boundary_index, start_qc
from quorumgate.replica.types import (
    Block,
    CommitProof,
    RemoteError,
    SyncRequest,
    SyncResponse,
)


@dataclass(frozen=True, slots=True)
class Base:
    """Committed blocks from `blocks[0].height` on, the last one proven by `proof`."""

    blocks: tuple[Block, ...]
    proof: CommitProof

    @property
    def height(self) -> int:
        return self.blocks[0].height

    @property
    def top(self) -> int:
        return self.blocks[-1].height


def _refuse(why: str) -> RemoteError:
    return RemoteError("bad_base", why)


def check_base(
    checker: CertificateChecker,
    response: SyncResponse,
    from_height: int,
    *,
    epochs: bool = False,
    owner: OwnerRecords | None = None,
) -> Base:
    """The base `response` proves, starting at `from_height`. Raises `RemoteError`
    (reason `bad_base`) unless its committed blocks chain from that height and the last
    is committed by a 2-chain whose certificates carry a quorum of valid signatures of
    `checker`'s members. On a chain that runs epochs (`epochs`, with its `owner`'s
    records), one that crosses a change of the member set is refused: the certificates
    above it are another member set's (docs/pruning.md, Limits)."""
    blocks, proof_blocks, qc = response.committed, response.proof, response.proof_qc
    if not blocks or not proof_blocks or qc is None:
        raise _refuse("no committed blocks with a proof")
    if blocks[0].height != from_height:
        raise _refuse(f"starts at height {blocks[0].height}, not at {from_height}")
    chain_id = checker.membership.chain_id
    if any(b.chain_id != chain_id for b in (*blocks, *proof_blocks)):
        raise _refuse("a block of another chain")
    chain = (*blocks, *proof_blocks)
    for prev, block in itertools.pairwise(chain):
        if block.parent_hash != prev.hash or block.height != prev.height + 1:
            raise _refuse(f"block at height {block.height} does not chain")
        if block.justify.block_hash != prev.hash or block.justify.view != prev.view:
            raise _refuse(f"the justify of height {block.height} does not certify its parent")
    b0, b1 = blocks[-1], proof_blocks[0]
    if b1.view != b0.view + 1:
        raise _refuse("the proof's first block is not in the view after the last committed")
    if epochs and boundary_index(chain, checker.membership, owner) is not None:
        raise _refuse("the chain crosses a change of the member set")
    for block in chain:
        checker.check_qc(block.justify)
    checker.check_block_certified(chain[-1], qc)
    proof = CommitProof(b1, proof_blocks[-1], qc)
    return Base(tuple(blocks), proof)


class BaseAsks:
    """The shell's one base request at a time: whom it asked, from which height, and
    when.

    A base is asked for only once `reports_needed` (f+1) distinct peers said they pruned
    above our next height (`history_from`): one of them at least is honest, so the
    heights we lack really are gone from an honest member, and faulty peers' claims alone
    cannot make a replica that merely lags drop its log. Of those peers, the one that
    said the lowest start is asked first, from its start (the lowest base leaves the
    fewest heights our sidecar cannot read); one that was asked is skipped until every
    other reporter was asked in turn, so a faulty peer whose answer is refused, or never
    comes, costs one `wait_ms` per round. The core's own catch-up goes on asking each
    peer in turn meanwhile, and brings in the reports."""

    __slots__ = ("_asked", "_asked_ms", "_from", "_peer", "_reports", "blocks_max",
                 "reports_needed", "wait_ms")  # fmt: skip

    def __init__(self, wait_ms: int, blocks_max: int, reports_needed: int) -> None:
        self.wait_ms = wait_ms
        self.blocks_max = blocks_max
        self.reports_needed = reports_needed
        self._reports: dict[int, int] = {}  # peer -> the start of its log it said last
        self._asked: set[int] = set()  # reporters asked in this round
        self._peer: int | None = None
        self._from = 0
        self._asked_ms = -1

    def ask(
        self, peer: int, history_from: int, committed_height: int, now_ms: int
    ) -> tuple[int, SyncRequest] | None:
        """Note that `peer` said its log starts at `history_from`; return whom to ask for
        a base and the request, or None: ordinary catch-up reaches the heights, too few
        peers said they pruned them, or a request went out less than `wait_ms` ago."""
        self._reports[peer] = history_from
        above = sorted(
            (start, p) for p, start in self._reports.items() if start > committed_height + 1
        )
        if len(above) < self.reports_needed:
            return None
        if self._asked_ms >= 0 and now_ms - self._asked_ms < self.wait_ms:
            return None
        fresh = [(start, p) for start, p in above if p not in self._asked]
        if not fresh:
            self._asked.clear()
            fresh = above
        start, chosen = fresh[0]
        self._asked.add(chosen)
        self._peer, self._from, self._asked_ms = chosen, start, now_ms
        return chosen, SyncRequest(start, self.blocks_max)

    def answered(self, peer: int, response: SyncResponse, committed_height: int) -> int | None:
        """The height asked if `response` from `peer` answers the request out (its
        committed part starts there, above our next height: no answer to the core's own
        requests does); None otherwise. An answer is taken once."""
        if peer != self._peer or not response.committed:
            return None
        start = response.committed[0].height
        if start != self._from or start <= committed_height + 1:
            return None
        self._peer = None
        return start


# Signatures found valid, remembered per base checker (one per epoch a base is checked in).
_BASE_VERIFIED_CACHE_MAX = 4096


class ChainedBases:
    """What a replica that takes a base knows of the chain of epochs: checked link by link
    from its cluster file (`extend_epoch_chain`), starting from the epoch ends its own
    store holds, then extended by the links its peers send (`SyncResponse.epoch_ends`).

    The longest chain that checks is kept: a peer that withholds newer epochs cannot hold
    the replica back, since f+1 peers said they pruned before any base is asked for and
    one of them is honest and sent its whole chain; a link that does not check is refused
    with its reason (`EpochChainError`) and changes nothing, and one that contradicts an
    epoch already checked is refused as a `conflict` (two certified ends of one epoch need
    more than f faulty members in it). The base is then asked for in the newest epoch the
    chain knows (`base_from`) and checked with that epoch's member set (`check`)."""

    __slots__ = ("_links", "chain", "owner")

    def __init__(self, genesis: Membership, owner: OwnerRecords | None) -> None:
        self.chain = EpochChain.genesis(genesis)
        self.owner = owner
        self._links: dict[int, RawEpochEnd] = {}  # epoch -> the checked link that started it

    def learn(self, ends: Sequence[RawEpochEnd]) -> bool:
        """Extend the chain by one answer's epoch ends (every epoch after 0 its sender
        started, oldest first); True if it grew. Raises `EpochChainError` for an answer
        that does not check (nothing of it is kept)."""
        if not ends:
            return False
        before = len(self.chain)
        self.chain = extend_epoch_chain(self.chain, ends, self.owner)
        for end in ends[before - 1 : len(self.chain) - 1]:
            self._links[int(end.epoch)] = end
        return len(self.chain) > before

    def links(self, after: int) -> tuple[RawEpochEnd, ...]:
        """The checked links that start the epochs after `after`, oldest first."""
        return tuple(self._links[e] for e in range(after + 1, len(self.chain)))

    def base_from(self, reported: int) -> int:
        """Where to ask a base from, a peer having said its log starts at `reported`: there,
        or above the newest change block the chain knows, whichever is higher, so that the
        base lies in one epoch, the newest known (the peer serves it from its log)."""
        return max(reported, self.chain.current.boundary_height + 1)

    def epoch_of(self, height: int) -> ChainedEpoch:
        """The epoch the block at `height` was certified in, as far as the chain knows: the
        newest whose change block lies below it."""
        for epoch in reversed(self.chain.epochs):
            if epoch.boundary_height < height:
                return epoch
        return self.chain.epochs[0]

    def check(self, response: SyncResponse, from_height: int) -> tuple[Base, ChainedEpoch]:
        """The base `response` proves from `from_height`, checked with the member set and
        record reader of the epoch that height lies in (`check_base`), and that epoch.
        Raises `RemoteError` (`bad_base`)."""
        epoch = self.epoch_of(from_height)
        membership = epoch.membership
        checker = CertificateChecker(
            membership,
            Verifier(_BASE_VERIFIED_CACHE_MAX),
            start_qc(membership.chain_id, epoch.boundary),
        )
        owner = reader_of(epoch, self.owner)
        base = check_base(checker, response, from_height, epochs=owner is not None, owner=owner)
        return base, epoch
