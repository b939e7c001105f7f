"""Who may change the member set of a live chain (docs/consensus/epochs.md, "Who may change
the member set"): only a reconfiguration record the owner signed, for the epoch it ends,
of a kind the live replica carries out. A block carrying an unsigned record is refused by
every voter, and a record signed for one epoch changes nothing in a later one."""

from __future__ import annotations

from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.proto.membership import OwnerRecords, Reconfiguration, sign_record
from quorumgate.replica.core import Core, NoPayload, PayloadSource
from quorumgate.replica.mempool import Mempool
from quorumgate.replica.types import Block, Proposal, Vote, genesis_block
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
NEW_KEY = Ed25519Signer(key_seed(2, "rotated")).public_key
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
