"""Epochs (docs/consensus/epochs.md): the reconfiguration record, signatures bound to their
epoch, the epoch on the wire, the proof that an epoch ended, and the simulator's
reconfiguration scenarios with the honest core and with a core that starts the next epoch
on a block that is certified but not committed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from quorumgate.proto.membership import Membership, Reconfiguration
from quorumgate.replica.certs import CertificateChecker
from quorumgate.replica.epochs import (
    EpochProof,
    check_epoch_proof,
    epoch_proof,
    one_record_at_most,
    start_qc,
)
from quorumgate.replica.sim import (
    SimOptions,
    Simulation,
    SimulationFailure,
    reconfiguration_scenario,
)
from quorumgate.replica.types import Envelope, RemoteError, Vote, vote_bytes
from quorumgate.replica.wire import decode_envelope, envelope_to_pb
from tests.consensus.helpers import (
    CHAIN,
    SIGNERS,
    chain_of,
    envelope,
    membership,
    new_core,
    signed_vote,
)
from tests.consensus.variants import EPOCH_VARIANTS

NEW_KEY = b"\x07" * 32
HONEST_SEEDS = range(6)
VARIANT_SEEDS = range(10)


# --------------------------------------------------------------------------- the record


@pytest.mark.parametrize(
    "record",
    [
        Reconfiguration("replace", (1,), (NEW_KEY,)),
        Reconfiguration("rotate", (3,), (NEW_KEY,)),
        Reconfiguration("add", (), (b"\x07" * 32, b"\x08" * 32, b"\x09" * 32)),
        Reconfiguration("remove", (4, 5, 6)),
    ],
)
def test_a_record_parses_back_to_itself(record: Reconfiguration) -> None:
    assert Reconfiguration.parse(record.encode()) == record


def test_a_record_changes_the_member_set_of_the_next_epoch() -> None:
    four = membership(4)
    rotated = Reconfiguration("rotate", (2,), (NEW_KEY,)).apply(four)
    assert rotated is not None and rotated.epoch == 1 and rotated.key(2) == NEW_KEY
    assert [rotated.key(i) for i in (0, 1, 3)] == [four.key(i) for i in (0, 1, 3)]
    keys = (b"\x07" * 32, b"\x08" * 32, b"\x09" * 32)
    seven = Reconfiguration("add", (), keys).apply(four)
    assert seven is not None and (seven.n, seven.quorum, seven.epoch) == (7, 5, 1)
    back = Reconfiguration("remove", (0, 5, 6)).apply(seven)
    assert back is not None and back.n == 4 and back.epoch == 2
    assert [back.key(i) for i in range(4)] == [four.key(i) for i in (1, 2, 3)] + [keys[0]]


@pytest.mark.parametrize(
    "record",
    [
        Reconfiguration("remove", (1, 2, 3)),  # 4 -> 1
        Reconfiguration("add", (), (b"\x07" * 32,)),  # 4 -> 5: not 3f+1
        Reconfiguration("replace", (4,), (NEW_KEY,)),  # no member 4
        Reconfiguration("rotate", (1,), (membership(4).key(0),)),  # two members, one key
        Reconfiguration("remove", (1, 1, 2)),
    ],
)
def test_a_record_that_does_not_fit_changes_nothing(record: Reconfiguration) -> None:
    assert record.apply(membership(4)) is None


@pytest.mark.parametrize(
    "tx",
    [
        b"",
        b"an ordinary transaction",
        Reconfiguration("rotate", (1,), (NEW_KEY,)).encode()[:-1],
        Reconfiguration("rotate", (1,), (NEW_KEY,)).encode() + b"\x00",
        b"qg/reconfig/v1\x00\x09\x00\x00",  # unknown kind
    ],
)
def test_what_is_not_exactly_a_record_is_none(tx: bytes) -> None:
    assert Reconfiguration.parse(tx) is None


def test_a_batch_carries_one_record_at_most() -> None:
    first = Reconfiguration("rotate", (1,), (NEW_KEY,)).encode()
    second = Reconfiguration("rotate", (2,), (b"\x08" * 32,)).encode()
    assert one_record_at_most((b"a", first, b"b", second, b"c")) == (b"a", first, b"b")
    assert one_record_at_most((b"a", first, b"b")) == (b"a", first, b"b")


# --------------------------------------------------------------------------- signatures


def test_epoch_0_signs_the_bytes_a_chain_always_signed() -> None:
    assert membership(4).signing_id == CHAIN


def test_a_vote_of_one_epoch_counts_in_no_other_with_the_same_keys() -> None:
    epoch0 = membership(4)
    epoch1 = replace(epoch0, epoch=1)
    block = chain_of([1])[0]
    vote = signed_vote(1, block)
    CertificateChecker(epoch0, new_core(0).verifier).check_vote(vote)
    with pytest.raises(RemoteError) as refused:
        CertificateChecker(epoch1, new_core(0).verifier).check_vote(vote)
    assert refused.value.reason == "bad_signature"
    again = SIGNERS[1].sign(vote_bytes(epoch1.signing_id, block.view, block.height, block.hash))
    CertificateChecker(epoch1, new_core(0).verifier).check_vote(
        Vote(block.view, block.height, block.hash, 1, again)
    )


@pytest.mark.parametrize(("epoch", "reason"), [(1, "future_epoch")])
def test_a_message_of_another_epoch_is_dropped_before_any_check(epoch: int, reason: str) -> None:
    core = new_core(0)
    core.start()
    block = chain_of([1])[0]
    stamped = replace(envelope(1, signed_vote(1, block)), epoch=epoch)
    core.on_message(stamped)
    assert core.dropped[reason] == 1


def test_the_wire_carries_the_epoch_and_epoch_0_adds_no_byte() -> None:
    vote = signed_vote(1, chain_of([1])[0])
    plain = envelope_to_pb(Envelope(CHAIN, 1, vote)).SerializeToString()
    stamped = envelope_to_pb(Envelope(CHAIN, 1, vote, 5)).SerializeToString()
    assert decode_envelope(plain).epoch == 0
    assert decode_envelope(stamped).epoch == 5
    assert len(stamped) == len(plain) + 2  # field 12, one byte of value
    assert stamped.startswith(plain)


# --------------------------------------------------------------------------- epoch proofs


def _ended_run() -> Simulation:
    """A clean run in which member 1's key is rotated: its nodes hold how epoch 0 ended."""
    sim = Simulation(SimOptions(seed=3, n=4, ticks=300, reconfigure=("rotate",)))
    sim.run()
    assert all(sim.nodes[i][0].epoch == 1 for i in range(4))
    return sim


@pytest.fixture(scope="module")
def ended() -> Simulation:
    return _ended_run()


def _checker(sim: Simulation) -> CertificateChecker:
    node = sim.nodes[0][0]
    first: Membership = node.disk.starts[0][0]
    return CertificateChecker(first, node.core.verifier, start_qc(first.chain_id, None))


def test_an_epoch_proof_commits_up_to_the_change_block(ended: Simulation) -> None:
    disk = ended.nodes[0][0].disk
    end = disk.ends[0]
    height = end.boundary.height - 3
    proof = epoch_proof(0, disk.committed, end, height + 1)
    blocks, nxt = check_epoch_proof(_checker(ended), disk.committed[height], proof)
    assert blocks[-1] == end.boundary and blocks[0].height == height + 1
    assert nxt == end.membership


def test_an_epoch_proof_that_proves_no_commit_is_refused(ended: Simulation) -> None:
    disk = ended.nodes[0][0].disk
    end = disk.ends[0]
    tip = disk.committed[end.boundary.height - 1]
    proof = epoch_proof(0, disk.committed, end, tip.height + 1)
    cut = EpochProof(0, proof.blocks[:-1], proof.qc)  # the QC no longer certifies the last
    tampered = [
        cut,
        EpochProof(0, proof.blocks[1:], proof.qc),  # does not chain from the tip
        EpochProof(1, proof.blocks, proof.qc),  # for another epoch
        EpochProof(0, proof.blocks, replace(proof.qc, signatures=proof.qc.signatures[:2])),
    ]
    for bad in tampered:
        with pytest.raises(RemoteError):
            check_epoch_proof(_checker(ended), tip, bad)


# --------------------------------------------------------------------------- the simulator


def _run(options: SimOptions) -> str | None:
    try:
        sim = Simulation(options)
        sim.run()
    except SimulationFailure as failure:
        return str(failure)
    newest = max(sim.nodes[i][0].epoch for i in sim.honest)
    return None if newest >= 1 else "no epoch change was committed"


@pytest.mark.parametrize("n", [4, 7])
def test_the_honest_core_passes_the_reconfiguration_scenarios(n: int) -> None:
    failures = [f for s in HONEST_SEEDS if (f := _run(reconfiguration_scenario(s, n)))]
    assert not failures, failures[0]


@pytest.mark.parametrize(
    ("kinds", "n"),
    [(("replace",), 4), (("rotate",), 7), (("add",), 4), (("remove",), 7), (("add", "remove"), 4)],
)
def test_every_kind_of_change_takes_effect(kinds: tuple[str, ...], n: int) -> None:
    sim = Simulation(SimOptions(seed=11, n=n, ticks=400, reconfigure=kinds, loss_permille=50))
    sim.run()
    members = [i for i in sim.honest if sim.nodes[i][0].active]
    assert {sim.nodes[i][0].epoch for i in members} == {len(kinds)}
    size = {"add": 7, "remove": 4}.get(kinds[-1], n)
    assert len(members) == size


def test_a_core_that_starts_the_epoch_on_a_certified_block_is_caught() -> None:
    variant = EPOCH_VARIANTS["epoch_on_certified"]
    caught = [
        f
        for s in VARIANT_SEEDS
        if (f := _run(replace(reconfiguration_scenario(s, 4), unsafe=variant)))
    ]
    assert caught, "the simulator let a core start an epoch on an uncommitted block"
    assert "EpochOnCertifiedCore" in caught[0]  # the failure names what reproduces it
    honest = [f for s in VARIANT_SEEDS if (f := _run(reconfiguration_scenario(s, 4)))]
    assert not honest, honest[0]
