"""Replay across an epoch change (docs/drills.md, "Replay across epochs"): the executing
process moves to the next member set at a change block, exactly as the replica core does
(replica/epochs.py `change_in`), once the replica's stored epoch end proves the change
block's commit; the blocks after it are checked with the next members' keys, so a log
whose blocks past the boundary carry certificates of the OLD member set is refused, as is
a change block whose commit nothing proves — in the second process as in this one."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from quorumgate.proto.membership import sign_record
from quorumgate.replica.epochs import start_qc
from quorumgate.replica.storage import StoredEpoch
from quorumgate.replica.types import Block, QuorumCert, vote_bytes
from quorumgate.sidecar.engine.core import EngineConfig
from quorumgate.sidecar.replay import (
    ReplayError,
    ReplayReport,
    _crossed,
    _epochs_at,
    _executed,
    _WorkerSetup,
)
from tests.consensus.helpers import CHAIN, SIGNERS, chain_of, make_block, membership, qc_for
from tests.consensus.test_owner_records import NEW_KEY, OWNER, RECORDS, ROTATE, ROTATED

RECEIPT_SEED = bytes(range(32))
EPOCH_1 = f"{CHAIN}#epoch=1"  # what epoch 1's signatures name (Membership.signing_id)
KEYS_1 = tuple(NEW_KEY if i == 2 else SIGNERS[i].public_key for i in range(4))


@dataclasses.dataclass(frozen=True)
class Epoch1Chain:
    before: list[Block]  # heights 1..3, epoch 0
    boundary: Block  # height 4: the change block (member 2's key rotated)
    end: StoredEpoch  # what the replica stores: the suffix and the QC that commit it
    first: Block  # height 5: epoch 1's first block, justified by the start certificate


def _epoch_1_chain() -> Epoch1Chain:
    blocks = chain_of(range(1, 4))
    record = sign_record(ROTATE, CHAIN, 0, OWNER.sign)
    boundary = make_block(blocks[-1], 4, payload=(record,))
    suffix = make_block(boundary, 5)  # the old epoch's empty block the 2-chain needs
    end = StoredEpoch(1, KEYS_1, boundary, (suffix,), qc_for(suffix))
    first = make_block(boundary, 5, start_qc(CHAIN, boundary))
    return Epoch1Chain(blocks[1:], boundary, end, first)


def _qc_1(block: Block, voters: tuple[int, ...] = (0, 2, 3)) -> QuorumCert:
    """A QC of epoch 1 for `block`: member 2 signs with its rotated key."""
    statement = vote_bytes(EPOCH_1, block.view, block.height, block.hash)
    signers = {i: ROTATED if i == 2 else SIGNERS[i] for i in range(4)}
    return QuorumCert(
        block.view, block.height, block.hash, tuple((v, signers[v].sign(statement)) for v in voters)
    )


def _setup(ends: tuple[StoredEpoch, ...]) -> _WorkerSetup:
    config = EngineConfig(chain_id=CHAIN, owner_public_key=bytes(32))
    return _WorkerSetup(
        config, RECEIPT_SEED, 1, membership(), None, 1_000, 0, None, RECORDS, ends
    )


async def _stream(blocks: list[Block]) -> AsyncIterator[Block]:
    for block in blocks:
        yield block


def _outcomes(blocks: list[Block], setup: _WorkerSetup, workers: int) -> list[tuple[int, object]]:
    async def run() -> list[tuple[int, object]]:
        return [
            (block.height, outcome)
            async for block, outcome in _executed(_stream(blocks), setup, workers)
        ]

    return asyncio.run(run())


def _failure(got: list[tuple[int, object]]) -> tuple[int, str] | None:
    bad = [(height, outcome) for height, outcome in got if isinstance(outcome, str)]
    assert len(bad) <= 1 and (not bad or got[-1] == bad[0]), got
    return bad[0] if bad else None  # type: ignore[return-value]


@pytest.mark.parametrize("workers", [0, 1])
def test_replay_moves_to_the_next_member_set_at_the_change_block(workers: int) -> None:
    """The blocks after the boundary, certified by epoch 1's members (member 2 with its
    new key), all check: today's replay, which keeps the genesis set, stops at height 5."""
    chain = _epoch_1_chain()
    second = make_block(chain.first, 6, _qc_1(chain.first))
    third = make_block(second, 7, _qc_1(second, (0, 1, 2)))
    blocks = [*chain.before, chain.boundary, chain.first, second, third]
    got = _outcomes(blocks, _setup((chain.end,)), workers)
    assert _failure(got) is None
    assert [height for height, _ in got] == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("old", ["old statement", "old key of member 2"])
def test_blocks_past_the_boundary_signed_by_the_old_member_set_are_refused(
    workers: int, old: str
) -> None:
    """The forged boundary: past the change block, a certificate signed by epoch 0's
    members — over epoch 0's statement, or over epoch 1's with member 2's retired key —
    does not count."""
    chain = _epoch_1_chain()
    if old == "old statement":
        forged = qc_for(chain.first)  # members 0, 1, 2 with their epoch-0 keys and statement
    else:
        statement = vote_bytes(EPOCH_1, chain.first.view, chain.first.height, chain.first.hash)
        forged = QuorumCert(
            chain.first.view,
            chain.first.height,
            chain.first.hash,
            tuple((v, SIGNERS[v].sign(statement)) for v in (0, 1, 2)),
        )
    second = make_block(chain.first, 6, forged)
    blocks = [*chain.before, chain.boundary, chain.first, second]
    got = _outcomes(blocks, _setup((chain.end,)), workers)
    failed = _failure(got)
    assert failed is not None and failed[0] == 6 and "bad signature" in failed[1], got


@pytest.mark.parametrize("workers", [0, 1])
def test_a_change_block_whose_commit_nothing_proves_stops_the_replay(workers: int) -> None:
    """Without the stored epoch end, or with one whose certificate is not the old
    members', the change block is not taken as committed: replay stops at it."""
    chain = _epoch_1_chain()
    blocks = [*chain.before, chain.boundary, chain.first]
    missing = _failure(_outcomes(blocks, _setup(()), workers))
    assert missing is not None and missing[0] == 4 and "no stored end of epoch 0" in missing[1]
    suffix = chain.end.suffix[0]
    outsider = qc_for(suffix, (0, 1, 2), chain="qg-another")
    bad_end = dataclasses.replace(chain.end, qc=outsider)
    forged = _failure(_outcomes(blocks, _setup((bad_end,)), workers))
    assert forged is not None and forged[0] == 4 and "bad signature" in forged[1], forged


def test_a_stored_end_at_a_block_that_changes_nothing_stops_the_replay() -> None:
    """The replica's store and the blocks must agree on where the epoch ended."""
    chain = _epoch_1_chain()
    plain = chain.before[-1]
    wrong = dataclasses.replace(chain.end, boundary=plain, suffix=(chain.before[-1],))
    failed = _failure(_outcomes(chain.before, _setup((wrong,)), 0))
    assert failed is not None and failed[0] == 3 and "changes nothing" in failed[1], failed


def test_a_replay_starting_past_the_boundary_starts_in_the_next_epoch() -> None:
    """From a checkpoint or a snapshot above the change block, replay starts with the
    member set the stored epoch ends prove from genesis, and the epoch's start
    certificate; a stored end that does not prove itself is refused by name."""
    chain = _epoch_1_chain()
    spec: Any = _SpecLike()
    report = ReplayReport(node=1, from_height=1)
    members, start = _epochs_at(spec, (chain.end,), 6, report)
    assert members.epoch == 1 and report.start_epoch == 1
    assert tuple(m.public_key for m in members.members) == KEYS_1
    assert start == start_qc(CHAIN, chain.boundary)
    still, none = _epochs_at(spec, (chain.end,), 3, ReplayReport(node=1, from_height=1))
    assert still.epoch == 0 and none is None
    bad = dataclasses.replace(chain.end, qc=qc_for(chain.end.suffix[0], chain="qg-another"))
    with pytest.raises(ReplayError, match="does not prove itself"):
        _epochs_at(spec, (bad,), 6, ReplayReport(node=1, from_height=1))
    # an end numbered for a later epoch than the one it ends: not the chain from genesis
    skipped = dataclasses.replace(chain.end, epoch=2)
    with pytest.raises(ReplayError, match=r"does not prove itself: .*no stored end of epoch 0"):
        _epochs_at(spec, (skipped,), 6, ReplayReport(node=1, from_height=1))


def test_the_report_names_each_epoch_crossed() -> None:
    chain = _epoch_1_chain()
    report = ReplayReport(node=1, from_height=1)
    for block in [*chain.before, chain.boundary, chain.first]:
        _crossed((chain.end,), block, report, membership())
    assert report.epochs == [{"epoch": 1, "boundary_height": 4, "from_height": 5, "rotated": [2]}]


class _SpecLike:
    """What `_epochs_at` reads of a cluster spec."""

    chain_id = CHAIN
    owner_public_key = OWNER.public_key
    runs_epochs = True

    def membership(self) -> object:
        return membership()

    def record_reader(self) -> object:
        return RECORDS


def test_nothing_to_read_above_the_top_is_not_waited_for() -> None:
    """A snapshot at the replica's top leaves no block to replay: the stream of committed
    blocks would wait for the next commit, which an idle cluster does not make, so replay
    asks for none (the live test met it when the newest snapshot was at the top)."""
    from quorumgate.sidecar.replay import _blocks_from_replica

    async def read() -> list[Block]:
        spec: Any = _SpecLike()  # never asked: no channel is opened
        return [block async for block in _blocks_from_replica(spec, 1, 41, 40)]

    assert asyncio.run(asyncio.wait_for(read(), timeout=5.0)) == []


@pytest.mark.parametrize("workers", [0, 1])
def test_a_stored_end_whose_keys_are_not_the_records_stops_the_replay(workers: int) -> None:
    """Replay takes a stored epoch end only as a follower takes a link of the chain of
    epochs (replica/epochchain.py `check_link`): keys for the next epoch other than the
    ones the change block's record gives (here member 2 keeps its old key, the record
    rotated it) are refused by name, and nothing past the change block is executed."""
    chain = _epoch_1_chain()
    blocks = [*chain.before, chain.boundary, chain.first]
    stale = dataclasses.replace(chain.end, keys=tuple(s.public_key for s in SIGNERS[:4]))
    failed = _failure(_outcomes(blocks, _setup((stale,)), workers))
    assert failed is not None and failed[0] == 4 and "keys_differ" in failed[1], failed
