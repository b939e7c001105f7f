"""Agreement on a live cluster: the same chain everywhere, each proposal exactly once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quorumgate.proto.tx import parse
from tests.support.live import LiveCluster, Load, assert_each_committed_once

# (members, sidecars, agents, proposals per agent): a few thousand on 4 replicas, lighter on
# 7, and 4 replicas with their execution sidecars, as `quorumgate up` runs them.
LOADS = [(4, False, 6, 600), (7, False, 3, 300), (4, True, 6, 400)]
IDS = ["4-replicas", "7-replicas", "4-replicas-with-sidecars"]


@pytest.mark.parametrize(("n", "sidecars", "agents", "per_agent"), LOADS, ids=IDS)
def test_every_replica_commits_the_same_hash_at_every_height_and_each_acknowledged_proposal_once(
    live_cluster: Callable[..., LiveCluster], n: int, sidecars: bool, agents: int, per_agent: int
) -> None:
    """Several agents submit signed proposals to every replica at once — streamed, with
    every fifth batch sent one unary `Submit` at a time — and every one is acknowledged.
    Then, over the whole committed range and for every replica:

    - the `CommittedBlocks` streams agree on the block hash at every height (each block
      decoded, its hash recomputed and its parent link checked), and on the hash `Status`
      reports for the replica's head;
    - every acknowledged proposal id (read from the payloads with `tx.parse(verify=False)`)
      is in the chain exactly once, and the chain holds nothing that was not submitted.

    With sidecars, the agents are first registered by the owner (the sidecars' admission
    check refuses unknown signers), and the owner's transactions are in the chain too.
    """
    cluster = live_cluster(n)
    # Batches of 50: at least two turns per replica even with 7 (18 batches), so that one
    # batch the load had to re-send elsewhere after a transport error (as it is built to)
    # does not leave a replica without acknowledgements.
    load = Load(cluster, f"agree-{n}", agents=agents, per_agent=per_agent, batch=50, unary_every=5)
    if sidecars:
        cluster.start_sidecars()
        cluster.register(load.agents)
    load.start().wait_done()
    load.assert_clean()
    assert len(load.acked) == agents * per_agent
    by = {ack.node for ack in load.acked.values()}
    assert by == set(range(n)), (
        f"load did not reach every replica: acknowledged by {sorted(by)}, "
        f"transport errors {load.transport_errors}"
    )

    committed_at = cluster.wait_committed(load.acked, index=0)
    top = cluster.wait_height(max(committed_at.values()), range(n))
    heads = cluster.statuses(range(n))
    chain = cluster.assert_same_chain(list(range(n)), min(top.values()))

    for i, head in heads.items():
        mine = cluster.chain(i, head.committed_height)[-1]
        assert head.committed_hash == mine.hash, (
            f"node {i}: Status says height {head.committed_height} is "
            f"{head.committed_hash.hex()[:16]}, CommittedBlocks says {mine.hash.hex()[:16]}"
        )
        assert head.chain_id == cluster.chain_id and head.members == n and head.f == (n - 1) // 3
    assert_each_committed_once(load.acked, chain)
    owner = cluster.spec.owner_public_key
    parsed = [parse(tx, verify=False) for block in chain for tx in block.payload]
    assert any(p.signer == owner for p in parsed) == sidecars, "owner transactions"
    foreign = {p.tx_id for p in parsed if p.signer != owner} - set(load.acked)
    assert not foreign, f"{len(foreign)} committed transactions were never submitted"
    cluster.assert_no_equivocation_seen()
    # What each replica sent, by kind (qg_replica_peer_messages_sent_total): every vote
    # and proposal is broadcast, one message per peer, and every committed block was
    # proposed to every peer at least once.
    sent = {
        i: cluster.metrics(i).by_label("qg_replica_peer_messages_sent_total", "kind")
        for i in range(n)
    }
    for i, kinds in sent.items():
        assert kinds.get("vote", 0) > 0 and kinds["vote"] % (n - 1) == 0, (i, kinds)
        assert kinds.get("proposal", 0) % (n - 1) == 0, (i, kinds)
    proposals = sum(kinds.get("proposal", 0) for kinds in sent.values())
    assert proposals >= (n - 1) * min(top.values()), (proposals, top)
