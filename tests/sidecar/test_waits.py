"""The wait slots and the recent-height index on their own (runtime/readwaits.py,
sidecar/waits.py)."""

from __future__ import annotations

from quorumgate.runtime.readwaits import CallerKind, WaitSlots
from quorumgate.sidecar.receipts import ReceiptLeaf
from quorumgate.sidecar.waits import HeightIndex


def test_a_key_and_a_kind_each_hold_their_bound_and_no_other_kinds_share() -> None:
    slots = WaitSlots(per_key_max=3, kind_max={CallerKind.AGENT: 4, CallerKind.STRANGER: 2})
    agent_a, agent_b, stranger, owner = b"a" * 32, b"b" * 32, b"s" * 32, b"o" * 32
    assert [slots.take(agent_a, CallerKind.AGENT) for _ in range(4)] == [True] * 3 + [False]
    assert [slots.take(agent_b, CallerKind.AGENT) for _ in range(2)] == [True, False]  # 4 agents
    assert [slots.take(stranger, CallerKind.STRANGER) for _ in range(3)] == [True, True, False]
    # the owner is bounded per key only: the agents' and strangers' pools are full
    assert [slots.take(owner, CallerKind.ROLE) for _ in range(4)] == [True] * 3 + [False]
    assert (slots.held(CallerKind.AGENT), slots.held(CallerKind.STRANGER)) == (4, 2)
    slots.give_back(agent_a, CallerKind.AGENT)
    assert slots.take(agent_b, CallerKind.AGENT)  # a slot given back is anyone's again
    assert not slots.take(agent_b, CallerKind.AGENT)
    for _ in range(2):
        slots.give_back(stranger, CallerKind.STRANGER)
    assert slots.held(CallerKind.STRANGER) == 0
    assert slots.keys_holding() == 3  # a key holding nothing is forgotten


def leaf(index: int, tx: bytes, proposal: bytes) -> ReceiptLeaf:
    return ReceiptLeaf(7, index, tx, proposal, "proposal", "allow", "ok", b"", b"", 1)


def test_a_height_index_names_the_leaves_of_a_principal_and_of_own_transactions() -> None:
    leaves = [leaf(0, b"t0", b"p0"), leaf(1, b"t1", b"p0"), leaf(2, b"t2", b"t2")]
    index = HeightIndex.of(leaves, ["alice", "bob", "alice"])
    assert index.mine("alice", ()) == {0, 2}
    assert index.mine(None, {b"t1", b"nope"}) == {1}
    assert index.mine("carol", {b"t9"}) == set()
    assert index.proposal_ids == {b"p0", b"t2"}
