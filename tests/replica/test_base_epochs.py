"""A committed base of a later epoch than the replica's own (replica/base.py
`ChainedBases`; docs/pruning.md, "A wiped replica behind pruned peers"): the replica
checks the chain of epochs its peers send, link by link from its cluster file, and checks
the base with the member set of the epoch the base lies in. Keys an epoch retired sign
nothing that counts above the change block that retired them, a link that does not check
teaches nothing, and a peer that withholds newer epochs cannot make an older epoch's keys
count. Real Ed25519 signatures over the chain of tests/consensus/test_epoch_chain.py
(member 2's key rotated at height 4)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from quorumgate.proto.crypto import Verifier
from quorumgate.replica.actions import Commit, PersistSafety
from quorumgate.replica.base import ChainedBases, check_base
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.epochchain import EpochChainError, PlainEpochEnd
from quorumgate.replica.epochs import EpochEnd, epoch_safety_state, start_qc
from quorumgate.replica.pruning import PrunedError
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.storage import ReplicaStore, decode_epoch_row
from quorumgate.replica.types import Block, CommitProof, QuorumCert, RemoteError, SyncResponse
from quorumgate.replica.wire import encode_epoch_end
from tests.consensus.helpers import CHAIN, OUTSIDER, chain_of, make_block, membership, qc_for
from tests.consensus.test_epoch_chain import (
    KEYS_1,
    RECORDS,
    SIGNERS_1,
    _build,
    _qc,
)
from tests.replica.test_storage import commit_of, synthetic_chain

BOUNDARY = 4  # epoch 0's change block (member 2's key rotated)


def _epoch_1_blocks(boundary: Block) -> list[Block]:
    """Epoch 1's blocks from the change block on: heights 5..9, each certified by epoch
    1's members (member 2 with its new key) under epoch 1's signing name."""
    blocks = [make_block(boundary, 5, start_qc(CHAIN, boundary))]
    for view in range(6, 10):
        parent = blocks[-1]
        blocks.append(make_block(parent, view, _qc(parent, 1, SIGNERS_1)))
    return blocks


def _answer(blocks: list[Block], qc_epoch: int = 1) -> SyncResponse:
    """A peer's answer from height 5: blocks 5..8 and the 2-chain proof of 8 (block 9 and
    its QC), with the chain of epochs it holds."""
    b9 = blocks[-1]
    qc = _qc(b9, 1, SIGNERS_1) if qc_epoch == 1 else qc_for(b9)
    return SyncResponse(tuple(blocks[:-1]), (b9,), qc, (), committed_height=9, history_from=5)


def _forged_by_retired_keys() -> list[Block]:
    """Heights 5..9 signed by epoch 0's members after member 2's key was rotated out: a
    fork of the chain from height 3, no change block in it, every certificate a quorum of
    epoch 0's keys (the old member 2's among them) under epoch 0's name."""
    blocks = chain_of(range(1, 4))
    fork = [make_block(blocks[-1], 4)]
    for view in range(5, 10):
        fork.append(make_block(fork[-1], view))
    return fork[1:]


def _bases(*answers: list[PlainEpochEnd]) -> ChainedBases:
    bases = ChainedBases(membership(), RECORDS)
    for ends in answers:
        bases.learn(ends)
    return bases


def test_a_base_of_a_later_epoch_is_checked_with_that_epochs_members() -> None:
    built = _build()
    bases = _bases([built.end_1])
    assert bases.base_from(2) == BOUNDARY + 1  # asked above the newest change block known
    assert bases.base_from(7) == 7
    base, epoch = bases.check(_answer(_epoch_1_blocks(built.boundary_1)), 5)
    assert (epoch.epoch, base.height, base.top) == (1, 5, 8)
    assert epoch.keys == KEYS_1


def test_a_base_signed_by_retired_keys_above_their_epochs_end_is_refused() -> None:
    """The long-range attack a pruned cluster opens: the epoch-0 quorum (member 2's key
    since rotated out, perhaps stolen) signs a chain above the change block that ended
    their epoch. A replica in epoch 0 checking with its own members took it; checked in
    the epoch the heights lie in, it is refused."""
    built = _build()
    forged = _answer(_forged_by_retired_keys(), qc_epoch=0)
    # What a replica of epoch 0 checked a base with: epoch 0's keys. They take it.
    genesis = CertificateChecker(membership(), Verifier(64))
    assert check_base(genesis, forged, 5).top == 8
    with pytest.raises(RemoteError):
        _bases([built.end_1]).check(forged, 5)
    # The same, however the answers came: one peer withholding newer epochs does not
    # take the chain back to epoch 0.
    with pytest.raises(RemoteError):
        _bases([built.end_1], []).check(forged, 5)
    with pytest.raises(RemoteError):
        _bases([], [built.end_1]).check(forged, 5)


def test_a_forged_link_is_refused_and_teaches_nothing() -> None:
    built = _build()
    bases = _bases()
    # The change block's commit certified by two of four: under epoch 0's quorum.
    boundary, suffix = built.boundary_1, make_block(built.boundary_1, 5)
    thin = qc_for(suffix, voters=(0, 1))
    weak = PlainEpochEnd(1, b"".join(KEYS_1), encode_epoch_end(boundary, (suffix,), thin))
    # The record's keys swapped for an outsider's: the keys claimed are not the record's.
    keys = (*KEYS_1[:3], OUTSIDER.public_key)
    swapped = replace(built.end_1, keys=b"".join(keys))
    for forged, reason in ((weak, "not_certified"), (swapped, "keys_differ")):
        with pytest.raises(EpochChainError) as refused:
            bases.learn([forged])
        assert refused.value.reason == reason
        assert len(bases.chain) == 1  # still epoch 0 alone
    # A base certified by the keys a forged link named counts for nothing: the heights
    # still lie in the only epoch that checked.
    with pytest.raises(RemoteError):
        bases.check(_answer(_epoch_1_blocks(built.boundary_1)), 5)
    # The genuine link after the forged ones is taken.
    assert bases.learn([built.end_1]) and bases.chain.current.epoch == 1


def test_a_link_that_contradicts_a_checked_epoch_is_refused() -> None:
    built = _build()
    bases = _bases([built.end_1])
    other = _build(qc_1=qc_for(make_block(built.boundary_1, 5), voters=(1, 2, 3)))
    assert bases.learn([other.end_1]) is False  # the same change block: nothing new
    moved = _build(keys_2=KEYS_1)
    with pytest.raises(EpochChainError):
        bases.learn([built.end_1, moved.end_2])
    assert len(bases.chain) == 2


def test_a_base_that_crosses_the_next_change_block_is_refused() -> None:
    built = _build()  # epoch 1 ends at height 6 with member 1's key rotated
    bases = _bases([built.end_1])
    first = make_block(built.boundary_1, 5, start_qc(CHAIN, built.boundary_1))
    suffix = make_block(built.boundary_2, 7, _qc(built.boundary_2, 1, SIGNERS_1))
    qc = _qc(suffix, 1, SIGNERS_1)
    answer = SyncResponse((first, built.boundary_2), (suffix,), qc, (), 7, history_from=5)
    with pytest.raises(RemoteError, match="crosses a change"):
        bases.check(answer, 5)


async def test_a_base_of_a_later_epoch_is_installed_with_its_epochs(tmp_path: Path) -> None:
    built = _build()
    bases = _bases([built.end_1])
    base, epoch = bases.check(_answer(_epoch_1_blocks(built.boundary_1)), 5)
    rows = tuple(
        decode_epoch_row("peer", CHAIN, int(e.epoch), e.keys, e.ended) for e in bases.links(0)
    )
    store = await ReplicaStore.open(tmp_path / "replica.db", CHAIN)
    try:
        safety = epoch_safety_state(rows[-1].boundary, SafetyState.initial(CHAIN))
        await store.install_base(base.blocks, base.proof, rows, safety)
        assert store.epoch is not None and store.epoch.epoch == epoch.epoch == 1
        assert (store.history_from, store.committed_height) == (5, 8)
    finally:
        await store.close()
    reopened = await ReplicaStore.open(tmp_path / "replica.db", CHAIN)
    try:
        recovered = await reopened.load()
        assert recovered.boundary == built.boundary_1
        assert recovered.safety == safety and recovered.committed.height == 8
        assert reopened.started(1) == rows[0]
    finally:
        await reopened.close()


async def test_a_store_past_an_epoch_boundary_prunes_below_its_change_block(
    tmp_path: Path,
) -> None:
    """Pruning above a change block keeps the change block (its epoch row names it) and
    the row; before, the prune's transaction broke the row's reference and the replica
    fail-stopped at its first pruning past a boundary."""
    chain_id = "prune-epochs"
    chain = synthetic_chain(chain_id, 104)
    store = await ReplicaStore.open(tmp_path / "replica.db", chain_id)
    try:
        await store.apply([commit_of(chain[0:49], chain[49], chain[50])])  # heights 1..49
        boundary, suffix = chain[49], chain[50]  # height 50 ends epoch 0
        qc = QuorumCert(suffix.view, suffix.height, suffix.hash)
        nxt = replace(membership(chain=chain_id), epoch=1)
        start = epoch_safety_state(boundary, SafetyState.initial(chain_id))
        commit = Commit((boundary,), CommitProof.two_chain(suffix, qc))
        await store.apply([commit, PersistSafety(start)], EpochEnd(boundary, nxt, (suffix,), qc))
        await store.apply([commit_of(chain[50:99], chain[99], chain[100])])  # 51..99
        dropped, _, _ = await store.prune_below(80)
        assert dropped == 78  # heights 1..79 but the change block
        assert store.history_from == 80 and store.started(1) is not None
        with pytest.raises(PrunedError):
            await store.committed_range(40, 60)
    finally:
        await store.close()
    reopened = await ReplicaStore.open(tmp_path / "replica.db", chain_id)
    try:
        assert (await reopened.load()).boundary == boundary
        assert reopened.history_from == 80 and reopened.committed_height == 99
    finally:
        await reopened.close()
