"""A signature is verified once per replica (replica/certs.py): votes arrive one
by one, then again inside the next proposal's QC. What the cache may skip is exactly a
(signer, statement, signature) already found valid; everything else is still checked."""

from __future__ import annotations

from dataclasses import replace

import pytest

from quorumgate.proto.crypto import Verifier
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.types import Block, QuorumCert, RemoteError, vote_bytes
from tests.consensus.helpers import CHAIN, SIGNERS, chain_of, membership, qc_for, signed_vote


@pytest.fixture
def blocks() -> list[Block]:
    return chain_of([1, 2])


def fresh_checker() -> CertificateChecker:
    return CertificateChecker(membership(), Verifier(64))


def test_a_qc_made_of_votes_already_checked_costs_no_signature_check(
    blocks: list[Block],
) -> None:
    checker = fresh_checker()
    b1 = blocks[1]
    for voter in (0, 1, 2):
        checker.check_vote(signed_vote(voter, b1))
    assert checker.verifier.checks == 3
    checker.check_qc(qc_for(b1, (0, 1, 2)))
    assert checker.verifier.checks == 3  # every signature was one of those votes
    checker.check_qc(qc_for(b1, (1, 2, 3)))  # another quorum: only voter 3 is new
    assert checker.verifier.checks == 4
    checker.check_vote(signed_vote(3, b1))  # and voter 3's vote, arriving late, is known
    checker.check_vote(signed_vote(0, b1))  # so is a vote re-sent
    assert checker.verifier.checks == 4


def test_a_forged_signature_beside_cached_ones_is_refused(blocks: list[Block]) -> None:
    checker = fresh_checker()
    b1 = blocks[1]
    for voter in (0, 1):
        checker.check_vote(signed_vote(voter, b1))
    genuine = qc_for(b1, (0, 1, 2))
    forged = replace(
        genuine, signatures=(*genuine.signatures[:2], (2, bytes(64)))
    )  # voter 2's signature replaced by zeros
    with pytest.raises(RemoteError, match="bad signature"):
        checker.check_qc(forged)


def test_a_cached_signature_claimed_by_another_signer_is_refused(blocks: list[Block]) -> None:
    """The cache binds who signed: voter 0's valid signature presented as voter 3's."""
    checker = fresh_checker()
    b1 = blocks[1]
    for voter in (0, 1, 2):
        checker.check_vote(signed_vote(voter, b1))
    sig0 = dict(qc_for(b1, (0, 1, 2)).signatures)[0]
    stolen = QuorumCert(
        b1.view, b1.height, b1.hash, ((1, dict(qc_for(b1, (1,)).signatures)[1]),
                                       (2, dict(qc_for(b1, (2,)).signatures)[2]),
                                       (3, sig0))
    )  # fmt: skip
    with pytest.raises(RemoteError, match="bad signature"):
        checker.check_qc(stolen)
    vote = replace(signed_vote(0, b1), voter=3)
    with pytest.raises(RemoteError, match="vote for view 1 by 3"):
        checker.check_vote(vote)


def test_a_cached_signature_over_another_statement_is_refused(blocks: list[Block]) -> None:
    """The cache binds what was signed: a valid vote for block 1 reused for block 2."""
    checker = fresh_checker()
    b1, b2 = blocks[1], blocks[2]
    checker.check_vote(signed_vote(0, b1))
    reused = replace(signed_vote(0, b1), view=b2.view, height=b2.height, block_hash=b2.hash)
    with pytest.raises(RemoteError):
        checker.check_vote(reused)
    sig = SIGNERS[0].sign(vote_bytes(CHAIN, b1.view, b1.height, b1.hash))
    others = qc_for(b2, (1, 2)).signatures
    with pytest.raises(RemoteError, match="bad signature"):
        checker.check_qc(QuorumCert(b2.view, b2.height, b2.hash, ((0, sig), *others)))


def test_a_qc_remembers_its_own_digest_only(blocks: list[Block]) -> None:
    """A QC keeps its digest once computed; a QC derived from a checked one
    (other signatures, other view) computes its own, so the checker's cache of known QC
    digests cannot be reached by editing a QC that passed."""
    checker = fresh_checker()
    b1 = blocks[1]
    genuine = qc_for(b1, (0, 1, 2))
    checker.check_qc(genuine)
    assert genuine.digest() == qc_for(b1, (0, 1, 2)).digest()  # cached == recomputed
    assert genuine == qc_for(b1, (0, 1, 2))  # the cached digest plays no part in equality
    forged = replace(genuine, signatures=(*genuine.signatures[:2], (2, bytes(64))))
    assert forged.digest() != genuine.digest()
    with pytest.raises(RemoteError, match="bad signature"):
        checker.check_qc(forged)
    relabelled = replace(genuine, view=genuine.view + 1)
    assert relabelled.digest() != genuine.digest()
    with pytest.raises(RemoteError, match="bad signature"):
        checker.check_qc(relabelled)
