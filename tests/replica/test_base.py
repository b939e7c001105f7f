"""A committed base for a replica below every peer's pruned history (replica/base.py,
docs/pruning.md): taken only with a proof that its last block is committed, certified by
a quorum of the members' valid signatures; installed as a pruned store's log, from which
the replica syncs forward and which it serves on as any pruned member does."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from quorumgate.proto.clusterfile import CONSENSUS_KEY_FILE, init_cluster, read_seed
from quorumgate.proto.crypto import Ed25519Signer, Verifier
from quorumgate.proto.membership import Member, Membership
from quorumgate.replica.actions import Commit, PersistSafety, Send
from quorumgate.replica.base import Base, BaseAsks, check_base
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.config import Limits
from quorumgate.replica.node import ReplicaNode
from quorumgate.replica.pruning import PrunedError
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.storage import ReplicaStore
from quorumgate.replica.types import (
    Block,
    CommitProof,
    Envelope,
    QuorumCert,
    RemoteError,
    SyncRequest,
    SyncResponse,
    genesis_block,
    genesis_qc,
    vote_bytes,
)
from quorumgate.replica.wire import envelope_to_pb
from tests.consensus.helpers import (
    CHAIN,
    OUTSIDER,
    SIGNERS,
    chain_of,
    make_block,
    membership,
    qc_for,
)
from tests.polling import until

BLOCKS = chain_of(range(1, 16))  # genesis, B1..B15 in views 1..15
START, TOP = 6, 10  # a peer pruned below 6; its answer from there ends at 10, proven by B11
VERIFIER_CACHE_MAX = 1024


def checker(members: Membership | None = None) -> CertificateChecker:
    return CertificateChecker(members or membership(), Verifier(VERIFIER_CACHE_MAX))


def answer(
    start: int = START, top: int = TOP, proof_qc: QuorumCert | None = None
) -> SyncResponse:
    """What a peer holding heights `start`.. answers a request from `start`: the blocks to
    `top` and the 2-chain proof of `top` (its child, in the next view, and that child's QC)."""
    b1 = BLOCKS[top + 1]
    qc = proof_qc if proof_qc is not None else qc_for(b1)
    return SyncResponse(
        tuple(BLOCKS[start : top + 1]), (b1,), qc, (), committed_height=14, history_from=start
    )


# ============================================================================ the check


def test_a_genuine_base_is_taken() -> None:
    base = check_base(checker(), answer(), START)
    assert [b.height for b in base.blocks] == list(range(START, TOP + 1))
    assert (base.height, base.top) == (START, TOP)
    assert base.proof.b1 == BLOCKS[TOP + 1] and base.proof.b1.parent_hash == BLOCKS[TOP].hash


def test_a_base_with_the_three_chain_proof_an_earlier_release_kept_is_taken() -> None:
    b1, b2 = BLOCKS[TOP + 1], BLOCKS[TOP + 2]
    response = replace(answer(), proof=(b1, b2), proof_qc=qc_for(b2))
    assert check_base(checker(), response, START).proof == CommitProof(b1, b2, qc_for(b2))


def _forged() -> dict[str, SyncResponse]:
    b11 = BLOCKS[TOP + 1]
    genuine = qc_for(b11)
    # A fork of B10: certified by a real quorum, but its parent is B9, not B10.
    fork = make_block(BLOCKS[TOP - 1], BLOCKS[TOP].view + 1)
    # A child of B10 two views later: certified, but not a 2-chain (the views are not consecutive).
    late = make_block(BLOCKS[TOP], BLOCKS[TOP].view + 2)
    outsider_sig = OUTSIDER.sign(b"not a vote")
    # (A certificate naming one signer twice is refused when it is built or decoded,
    # replica/types.py, before any base is checked.)
    return {
        "two signatures of four (under the quorum of three)": answer(
            proof_qc=qc_for(b11, voters=(0, 1))
        ),
        "a signature over another block": answer(
            proof_qc=replace(
                genuine,
                signatures=(*genuine.signatures[:2], qc_for(BLOCKS[3]).signatures[2]),
            )
        ),
        "a non-member's signature": answer(
            proof_qc=replace(genuine, signatures=(*genuine.signatures[:2], (7, outsider_sig)))
        ),
        "no signatures": answer(proof_qc=QuorumCert(b11.view, b11.height, b11.hash)),
        "a proof of another block": replace(answer(), proof=(fork,), proof_qc=qc_for(fork)),
        "a certificate of another block": answer(proof_qc=qc_for(BLOCKS[TOP + 2])),
        "a proof that is not a 2-chain": replace(answer(), proof=(late,), proof_qc=qc_for(late)),
        "a gap in the blocks": replace(
            answer(), committed=(*BLOCKS[START:8], *BLOCKS[9 : TOP + 1])
        ),
        "another start than asked": answer(start=START + 1),
        "no proof": replace(answer(), proof=(), proof_qc=None),
    }


@pytest.mark.parametrize("name", sorted(_forged()))
def test_a_forged_base_is_refused(name: str) -> None:
    with pytest.raises(RemoteError):
        check_base(checker(), _forged()[name], START)


def test_a_base_certified_by_other_members_is_refused() -> None:
    """Certificates of another member set (a later epoch's keys) prove nothing here."""
    others = Membership(
        CHAIN, tuple(Member(i, SIGNERS[i + 3].public_key) for i in range(4))
    )
    with pytest.raises(RemoteError):
        check_base(checker(others), answer(), START)


# ============================================================================ asking for it


def test_a_base_is_asked_of_f_plus_one_reporters_lowest_first_once_per_wait() -> None:
    asks = BaseAsks(wait_ms=400, blocks_max=64, reports_needed=2)  # f+1 of a 4-member cluster
    assert asks.ask(1, history_from=1, committed_height=0, now_ms=0) is None  # sync reaches it
    # One peer's word is not enough: a faulty one could make a lagging replica drop its log.
    assert asks.ask(1, history_from=8, committed_height=0, now_ms=0) is None
    # f+1 said so: the one with the lowest start is asked, from its start.
    assert asks.ask(2, history_from=6, committed_height=0, now_ms=0) == (2, SyncRequest(6, 64))
    assert asks.ask(3, history_from=7, committed_height=0, now_ms=100) is None  # one at a time
    # Only the asked peer's answer from the asked height is one.
    assert asks.answered(1, answer(), committed_height=0) is None
    assert asks.answered(2, answer(start=7), committed_height=0) is None
    assert asks.answered(2, answer(), committed_height=0) == START
    assert asks.answered(2, answer(), committed_height=0) is None  # taken once
    # Refused (or never answered): the next lowest reporter not asked yet, once per wait.
    assert asks.ask(3, history_from=7, committed_height=0, now_ms=400) == (3, SyncRequest(7, 64))
    assert asks.ask(1, history_from=8, committed_height=0, now_ms=800) == (1, SyncRequest(8, 64))
    # Every reporter asked: the next round starts again from the lowest.
    assert asks.ask(1, history_from=8, committed_height=0, now_ms=1200) == (2, SyncRequest(6, 64))
    # Caught up past what they said: nothing more to ask.
    assert asks.ask(1, history_from=8, committed_height=20, now_ms=1600) is None


# ============================================================================ installing it


async def _installed(path: Path) -> ReplicaStore:
    store = await ReplicaStore.open(path, CHAIN)
    base = check_base(checker(), answer(), START)
    await store.install_base(base.blocks, base.proof)
    return store


async def test_an_installed_base_is_a_pruned_log_that_syncs_forward_and_is_served_on(
    tmp_path: Path,
) -> None:
    store = await _installed(tmp_path / "replica.db")
    try:
        assert (store.history_from, store.committed_height) == (START, TOP)
        with pytest.raises(PrunedError, match=f"starts at height {START}"):
            await store.committed_range(1, 5)
        # The next commits extend it, as any commit extends the head.
        b11, b12 = BLOCKS[TOP + 1], BLOCKS[TOP + 2]
        await store.apply([Commit((b11,), CommitProof.two_chain(b12, qc_for(b12)))])
        assert store.committed_height == TOP + 1
        # Served on: another empty replica takes it as its base in turn.
        served = await store.sync_response(SyncRequest(START, 64), None, Limits())
        assert served.history_from == START
        again = check_base(checker(), served, START)
        assert (again.height, again.top) == (START, TOP + 1)
    finally:
        await store.close()
    store = await ReplicaStore.open(tmp_path / "replica.db", CHAIN)  # durable
    try:
        assert (store.history_from, store.committed_height) == (START, TOP + 1)
        assert (await store.load()).committed == BLOCKS[TOP + 1]
    finally:
        await store.close()


async def test_a_base_keeps_the_safety_record_of_a_wiped_store(tmp_path: Path) -> None:
    path = tmp_path / "replica.db"
    store = await ReplicaStore.open(path, CHAIN)
    try:
        state = replace(SafetyState.initial(CHAIN), epoch=3, last_voted_view=40)
        await store.apply([PersistSafety(state)])
        await store.close()
        store = await _installed(path)
        assert (await store.load()).safety == state
    finally:
        await store.close()


async def test_a_base_is_refused_over_a_log_that_reaches_it(tmp_path: Path) -> None:
    store = await ReplicaStore.open(tmp_path / "replica.db", CHAIN)
    try:
        b = BLOCKS
        for height in range(1, START):  # a log up to the base's parent: sync goes on from it
            proof = CommitProof.two_chain(b[height + 1], qc_for(b[height + 1]))
            await store.apply([Commit((b[height],), proof)])
        base: Base = check_base(checker(), answer(), START)
        with pytest.raises(AssertionError, match="over a log that reaches"):
            await store.install_base(base.blocks, base.proof)
        assert (store.history_from, store.committed_height) == (1, START - 1)
    finally:
        await store.close()


# ============================================================================ the live shell


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[ReplicaNode]:
    """Member 0 of a fresh 4-member cluster, started with an empty store (no peer runs),
    stopped after."""
    spec = init_cluster(tmp_path / "c", 4)
    seed = read_seed(spec.node_dir(0) / CONSENSUS_KEY_FILE)
    started = ReplicaNode(spec, 0, Ed25519Signer(seed))
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


def _cluster_chain(node: ReplicaNode, count: int) -> tuple[list[Block], Callable[..., QuorumCert]]:
    """Genesis and `count` blocks in consecutive views of `node`'s chain, each justified by
    a QC its members 1, 2 and 3 signed with their consensus keys; and that QC maker."""
    spec = node.spec
    keys = {i: Ed25519Signer(read_seed(spec.node_dir(i) / CONSENSUS_KEY_FILE)) for i in range(4)}
    signing_id = node.membership.signing_id

    def qc(block: Block, voters: Sequence[int] = (1, 2, 3)) -> QuorumCert:
        statement = vote_bytes(signing_id, block.view, block.height, block.hash)
        signatures = tuple((v, keys[v].sign(statement)) for v in voters)
        return QuorumCert(block.view, block.height, block.hash, signatures)

    blocks = [genesis_block(spec.chain_id)]
    for view in range(1, count + 1):
        parent = blocks[-1]
        justify = genesis_qc(spec.chain_id) if parent.height == 0 else qc(parent)
        block = Block.create(
            spec.chain_id, parent.hash, view, parent.height + 1, justify,
            parent.timestamp_ms + 1, view % 4, (),
        )  # fmt: skip
        blocks.append(block)
    return blocks, qc


async def test_a_replica_refuses_a_forged_base_and_takes_the_next_peers(
    node: ReplicaNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every peer pruned below what the empty replica lacks. The first it asks for a base
    answers with a proof whose certificate carries a signature over another block: the
    replica keeps its empty log and asks the next peer that said it pruned, whose genuine
    base it installs (its log then starts there) and syncs forward from."""
    sent: list[Send] = []
    monkeypatch.setattr(node, "_send", lambda send, epoch=None: sent.append(send))
    node._base_asks.wait_ms = 0  # (the shell's wait between two asks is tested above)
    blocks, qc = _cluster_chain(node, 14)
    chain = node.spec.chain_id

    def deliver(sender: int, response: SyncResponse) -> None:
        node.on_peer_message(envelope_to_pb(Envelope(chain, sender, response)))

    def base_asks() -> list[tuple[int | None, int]]:
        return [
            (s.to, s.message.from_height)
            for s in sent
            if isinstance(s.message, SyncRequest) and s.message.from_height > 1
        ]

    pruned = SyncResponse((), (), None, (), committed_height=14, history_from=START)
    deliver(1, pruned)
    assert base_asks() == [], "asked on one peer's word"
    deliver(2, pruned)  # f+1 = 2 peers said they pruned: the first of them is asked
    assert base_asks() == [(1, START)]
    genuine = qc(blocks[TOP + 1])
    other = qc(blocks[3]).signatures[2]
    forged = SyncResponse(
        tuple(blocks[START : TOP + 1]), (blocks[TOP + 1],),
        replace(genuine, signatures=(*genuine.signatures[:2], other)), (), 14, START,
    )  # fmt: skip
    dropped = node.metrics.dropped.labels("bad_certificate")
    deliver(1, forged)
    await until("the forged base is refused", lambda: dropped._value.get() == 1)
    assert node.store is not None and node.store.committed_height == 0

    deliver(3, pruned)  # the next report: the next reporter, not the refused one
    assert base_asks() == [(1, START), (2, START)]
    deliver(2, replace(forged, proof_qc=genuine))
    store = node.store
    # The store takes the base first, then the core is started again from it (on the core
    # loop, after the store's read): wait for both.
    await until(
        "the genuine base is installed",
        lambda: store.committed_height == TOP
        and node.core is not None
        and node.core.tree.committed_height == TOP,
    )
    assert store.history_from == START
    assert (await store.committed_range(START, TOP)) == list(blocks[START : TOP + 1])
