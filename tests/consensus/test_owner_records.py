"""Who may change the member set of a live chain (docs/consensus/epochs.md, "Who may change
the member set"): only a reconfiguration record the owner signed, for the epoch it ends,
of a kind the live replica carries out. A block carrying an unsigned record is refused by
every voter, and a record signed for one epoch changes nothing in a later one."""

from __future__ import annotations

from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import OwnerRecords, Reconfiguration, sign_record
from quorumgate.replica.core import Core, NoPayload, PayloadSource, Recovered
from quorumgate.replica.epochs import epoch_safety_state, start_qc
from quorumgate.replica.mempool import Mempool
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.types import (
    Block,
    Envelope,
    Proposal,
    Timeout,
    Vote,
    genesis_block,
    proposal_bytes,
    timeout_bytes,
    vote_bytes,
)
from tests.consensus.helpers import (
    CHAIN,
    SIGNERS,
    START_MS,
    TEST_LIMITS,
    envelope,
    key_seed,
    make_block,
    membership,
    qc_for,
    sent_of,
    signed_proposal,
)

OWNER = Ed25519Signer(key_seed(0, "owner"))
STRANGER = Ed25519Signer(key_seed(1, "stranger"))
RECORDS = OwnerRecords(CHAIN, OWNER.public_key)
ROTATED = Ed25519Signer(key_seed(2, "rotated"))
NEW_KEY = ROTATED.public_key
ROTATE = Reconfiguration("rotate", (2,), (NEW_KEY,))


class AnyPayload(NoPayload):
    """A payload source that takes any transaction: what the core itself refuses."""

    def check(self, block: Block) -> str | None:
        return None


def voter(me: int = 0, payload: PayloadSource | None = None) -> Core:
    """A member of a chain that runs epochs with owner-signed records."""
    return Core(
        membership(),
        me,
        SIGNERS[me],
        limits=TEST_LIMITS,
        now_ms=START_MS,
        fence_on_start=False,
        epochs=True,
        owner_records=RECORDS,
        payload=payload or AnyPayload(),
    )


def propose(core: Core, block: Block) -> list[Vote]:
    proposal: Proposal = signed_proposal(block)
    return sent_of(core.on_message(envelope(block.proposer, proposal)), Vote)


def test_a_block_carrying_an_unsigned_record_gets_no_vote() -> None:
    """The attack: a faulty leader puts a record nobody signed in its block. Were it
    committed, it would hand member 2's seat to a key of the leader's choosing."""
    core = voter()
    core.start()
    block = make_block(genesis_block(CHAIN), 1, payload=(ROTATE.encode(),))
    assert propose(core, block) == []
    assert core.dropped["unsigned_change"] == 1


def test_the_mempool_refuses_a_block_with_an_unsigned_record_too() -> None:
    """The replica's payload source checks a record's signature before the core does."""
    core = voter(payload=Mempool(CHAIN, owner_records=RECORDS))
    core.start()
    block = make_block(genesis_block(CHAIN), 1, payload=(ROTATE.encode(),))
    assert propose(core, block) == []
    assert core.dropped["invalid_payload"] == 1


def test_a_record_signed_by_another_key_gets_no_vote() -> None:
    core = voter()
    core.start()
    forged = sign_record(ROTATE, CHAIN, 0, STRANGER.sign)
    assert propose(core, make_block(genesis_block(CHAIN), 1, payload=(forged,))) == []
    assert core.dropped["unsigned_change"] == 1


def test_an_owner_signed_record_ends_the_epoch_once_committed() -> None:
    core = voter()
    core.start()
    signed = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    change = make_block(genesis_block(CHAIN), 1, payload=(signed,))
    assert len(propose(core, change)) == 1
    suffix = make_block(change, 2, qc_for(change))
    assert len(propose(core, suffix)) == 1
    assert core.ended is None  # certified, not yet committed
    after = make_block(suffix, 3, qc_for(suffix))
    propose(core, after)
    assert core.ended is not None
    assert core.ended.boundary == change
    assert core.ended.membership.epoch == 1
    assert core.ended.membership.key(2) == NEW_KEY


def test_a_record_counts_only_in_the_epoch_it_names() -> None:
    """A record committed once cannot be committed again later to undo what came after."""
    signed = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    epoch_0 = membership()
    epoch_1 = RECORDS.change(signed, epoch_0)
    assert epoch_1 is not None and epoch_1.epoch == 1
    assert RECORDS.change(signed, epoch_1) is None


def test_kinds_the_live_replica_does_not_carry_out_change_nothing() -> None:
    keys = tuple(Ed25519Signer(key_seed(i, "added")).public_key for i in range(3))
    for record in (Reconfiguration("add", (), keys), Reconfiguration("replace", (1,), keys[:1])):
        signed = sign_record(record, CHAIN, 0, OWNER.sign)
        assert RECORDS.read(signed) is not None
        assert RECORDS.change(signed, membership()) is None


def test_a_record_is_read_only_whole() -> None:
    signed = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    assert RECORDS.read(signed) == (ROTATE, 0)
    assert RECORDS.read(signed[:-1]) is None
    assert RECORDS.read(signed + b"\x00") is None
    other_chain = OwnerRecords("qg-other", OWNER.public_key)
    assert other_chain.read(signed) is None


# --------------------------------------------------------------------------- after the boundary


def epoch_1_core(me: int = 0) -> tuple[Core, Block]:
    """Member `me`'s core of epoch 1, started as the shell starts it after the rotation of
    member 2's key committed at a change block."""
    signed = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    change = make_block(genesis_block(CHAIN), 1, payload=(signed,))
    nxt = RECORDS.change(signed, membership())
    assert nxt is not None
    safety = epoch_safety_state(change, SafetyState.initial(CHAIN))
    recovered = Recovered(safety, change, boundary=change)
    core = Core(
        nxt,
        me,
        SIGNERS[me],
        limits=TEST_LIMITS,
        now_ms=START_MS,
        recovered=recovered,
        fence_on_start=False,
        epochs=True,
        owner_records=RECORDS,
        payload=AnyPayload(),
    )
    core.start()
    return core, change


def timeout_of(signer: Ed25519Signer, signing_id: str, view: int, change: Block) -> Timeout:
    high_qc = start_qc(CHAIN, change)
    return Timeout(view, high_qc, 2, signer.sign(timeout_bytes(signing_id, view, high_qc.view)))


def test_a_timeout_signed_with_the_rotated_out_key_is_refused() -> None:
    """The attack: whoever holds member 2's old key after the boundary (a stolen disk, the
    reason for the rotation) signs timeouts as member 2 in the new epoch."""
    core, change = epoch_1_core()
    view = core.view
    old_key, epoch_1 = SIGNERS[2], core.membership.signing_id
    core.on_message(Envelope(CHAIN, 2, timeout_of(old_key, epoch_1, view, change), 1))
    assert core.dropped["bad_signature"] == 1
    # Signed as of epoch 0, where that key was member 2's: a stale epoch, not even read.
    core.on_message(Envelope(CHAIN, 2, timeout_of(old_key, CHAIN, view, change), 0))
    assert core.dropped["stale_epoch"] == 1
    # The new key's timeout counts.
    rotated = Ed25519Signer(key_seed(2, "rotated"))
    core.on_message(Envelope(CHAIN, 2, timeout_of(rotated, epoch_1, view, change), 1))
    assert sum(core.dropped.values()) == 2


def test_a_vote_signed_with_the_rotated_out_key_is_refused() -> None:
    core, change = epoch_1_core(me=collector())
    block = make_block(change, change.view + 1, start_qc(CHAIN, change))
    epoch_1 = core.membership.signing_id
    sig = SIGNERS[2].sign(vote_bytes(epoch_1, block.view, block.height, block.hash))
    core.on_message(Envelope(CHAIN, 2, Vote(block.view, block.height, block.hash, 2, sig), 1))
    assert core.dropped["bad_signature"] == 1


def collector() -> int:
    """Who collects the votes for epoch 1's first block (of view 2, the one after the
    change block's): the leader of view 3."""
    return membership().leader(3)


# --------------------------------------------------------------------------- a record offered twice


def test_a_record_of_an_ended_epoch_is_refused_at_admission() -> None:
    """The attack (seen live): a client whose acknowledgement was lost offers the owner's
    record to the next replica after it committed. A record carries no nonce, so without
    its epoch nothing would stop the second copy from being committed too."""
    mempool = Mempool(CHAIN, owner_records=RECORDS)
    signed = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    assert mempool.admit(signed).accepted
    mempool.on_commit([make_block(genesis_block(CHAIN), 1, payload=(signed,))])
    mempool.enter_epoch(1)
    again = mempool.admit(signed)
    assert not again.accepted
    assert again.reason == "replayed" and again.status == "ALREADY_EXISTS"
    assert mempool.size == 0


def test_a_pending_record_leaves_when_its_epoch_ends() -> None:
    """A copy admitted before the boundary, on a replica that did not propose it, is
    dropped when the replica enters the next epoch, not proposed there."""
    mempool = Mempool(CHAIN, owner_records=RECORDS)
    signed = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    assert mempool.admit(signed).accepted
    mempool.enter_epoch(1)
    assert mempool.size == 0
    assert mempool.take((), 10, 1 << 20) == ()


def test_a_record_for_a_later_epoch_waits_for_it() -> None:
    mempool = Mempool(CHAIN, owner_records=RECORDS)
    later = sign_record(ROTATE, CHAIN, 1, OWNER.sign)
    assert mempool.admit(later).accepted
    assert mempool.take((), 10, 1 << 20) == ()
    mempool.enter_epoch(1)
    assert mempool.take((), 10, 1 << 20) == (later,)


def test_a_block_carrying_a_record_of_another_epoch_gets_no_vote() -> None:
    """A faulty leader of epoch 1 re-proposes the record that ended epoch 0: it would
    change nothing, but a block carries records of its own epoch only."""
    core, change = epoch_1_core()
    stale = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    view = change.view + 1
    leader = core.membership.leader(view)
    block = make_block(change, view, start_qc(CHAIN, change), payload=(stale,), proposer=leader)
    sent = core.on_message(Envelope(CHAIN, leader, epoch_1_proposal(core, block), 1))
    assert sent_of(sent, Vote) == []
    assert core.dropped["stale_change"] == 1
    # The same block without the stale record gets this member's vote.
    clean = make_block(change, view, start_qc(CHAIN, change), proposer=leader)
    fresh, _ = epoch_1_core()
    sent = fresh.on_message(Envelope(CHAIN, leader, epoch_1_proposal(fresh, clean), 1))
    assert len(sent_of(sent, Vote)) == 1


def epoch_1_proposal(core: Core, block: Block) -> Proposal:
    """`block` signed by its proposer's key of epoch 1 (member 2's is the rotated one)."""
    signer = ROTATED if block.proposer == 2 else SIGNERS[block.proposer]
    statement = proposal_bytes(core.membership.signing_id, block.view, block.hash)
    return Proposal(block, signer.sign(statement))
