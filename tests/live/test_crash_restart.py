"""Replicas SIGKILLed and restarted under load: they catch up and never equivocate."""

from __future__ import annotations

import os
import random
import signal
from collections import defaultdict
from collections.abc import Callable

import grpc
import pytest

from quorumgate.replica.types import Block
from tests.support.live import LiveCluster, Load, StoreAudit, assert_each_committed_once

N = 4
# Override to replay another schedule: QG_LIVE_SEED=... pytest tests/live/test_crash_restart.py
SEED = int(os.environ.get("QG_LIVE_SEED", "20260611"))
KILLS = 8
# Committed heights to wait, drawn per kill: before killing, and while the victim is down.
HEIGHTS_BEFORE_KILL = (1, 6)
HEIGHTS_WHILE_DOWN = (1, 4)


def test_replica_sigkilled_at_random_moments_under_load_catches_up_and_never_equivocates(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    """Eight times, a seeded RNG picks a member and a moment — a number of heights the
    cluster must commit first, so the moment follows observed progress — and the member is
    SIGKILLed, the others commit a few more heights without it, and it is restarted from its
    database. Each time it must reach the height the others had at its restart, with the
    same block hashes. Proposals stream in throughout (to every member but the next victim,
    whose submissions are drained before the kill, so no acknowledged proposal is lost with
    an unsent gossip batch).

    The cluster never sees an equivocation: before every kill and at the end, every live
    replica's dropped-message counters for equivocating votes, timeouts and proposals are 0
    (read before the kill, since a restart resets them). At the end every acknowledged
    proposal has committed exactly once and all replicas agree at every height.

    Then every process is stopped and each replica's database is audited (a replica
    that crashes and restarts can never equivocate: it records what it signs before it
    sends it, docs/consensus/fencing.md):

    - across all replicas, every view has votes for at most one block hash;
    - a vote at the view of a committed block is for that block;
    - every signer of every QC in the committed chain has that vote in its `signed_votes`
      audit table — the vote reached disk before it left the process, across every
      SIGKILL (persist before send);
    - each replica's stored committed log holds the whole chain served over gRPC (a replica
      reports only durable commits) and agrees with it.
    """
    rng = random.Random(SEED)
    where = f"(seed {SEED})"
    cluster = live_cluster(N)
    load = Load(cluster, "crash-loop", agents=4, per_agent=1000, batch=20, rate_per_s=20).start()
    load.wait_acked(100)

    for k in range(KILLS):
        victim = rng.randrange(N)
        before = rng.randint(*HEIGHTS_BEFORE_KILL)
        while_down = rng.randint(*HEIGHTS_WHILE_DOWN)
        others = [i for i in range(N) if i != victim]
        load.avoid([victim])
        load.drain(victim)
        cluster.wait_progress(before)
        cluster.assert_no_equivocation_seen()
        cluster.kill(victim)
        cluster.wait_progress(while_down, others)
        cluster.restart(victim)
        goal = max(cluster.heights(others).values())
        cluster.wait_height(goal, [victim])
        cluster.assert_same_chain([victim, *others], goal)
        load.avoid([])
        print(f"kill {k + 1} {where}: node {victim} after {before} heights, caught up to {goal}")

    load.stop()
    load.assert_clean()
    committed_at = cluster.wait_committed(load.acked, 0)
    top = cluster.wait_height(max(committed_at.values()), range(N))
    chain = cluster.assert_same_chain(list(range(N)), min(top.values()))
    assert_each_committed_once(load.acked, chain)
    cluster.assert_no_equivocation_seen()

    cluster.stop_all()
    audits = {i: cluster.read_store(i) for i in range(N)}
    audit_votes(audits, chain, where)


def audit_votes(audits: dict[int, StoreAudit], served: list[Block], where: str) -> None:
    """The checks on stopped replicas' stores listed in the test's docstring."""
    for i, audit in audits.items():
        # Every replica had reported at least len(served) heights committed, and a replica
        # reports only what is durable.
        assert len(audit.committed) >= len(served), (
            f"node {i} stored {len(audit.committed)} committed blocks, fewer than the "
            f"{len(served)} it had served {where}"
        )
        stored = [b.hash for b in audit.committed[: len(served)]]
        assert stored == [b.hash for b in served], (
            f"node {i}'s stored committed log differs from the chain served {where}"
        )
    longest = max((a.committed for a in audits.values()), key=len)
    certified = {block.view: block.hash for block in longest}

    voted: dict[int, set[bytes]] = defaultdict(set)
    for i, audit in audits.items():
        assert audit.signed_votes, f"node {i} recorded no vote {where}"
        for view, block_hash in audit.signed_votes.items():
            voted[view].add(block_hash)
            if view in certified:
                assert block_hash == certified[view], (
                    f"node {i} voted {block_hash.hex()[:16]} at view {view}, where "
                    f"{certified[view].hex()[:16]} was certified and committed {where}"
                )
        for view, high_qc_view in audit.signed_timeouts.items():
            assert high_qc_view < view, f"node {i}: timeout at view {view} {where}"
    split = {view: len(hashes) for view, hashes in voted.items() if len(hashes) > 1}
    assert not split, f"views with votes for different blocks (view -> blocks) {where}: {split}"

    for block in longest:
        qc = block.justify
        for signer, _ in qc.signatures:
            recorded = audits[signer].signed_votes.get(qc.view)
            assert recorded == qc.block_hash, (
                f"node {signer} signed the vote for view {qc.view} in the QC of height "
                f"{block.height} - 1, but its audit table holds "
                f"{recorded.hex()[:16] if recorded else 'nothing'} for that view {where}"
            )


def test_restarted_replica_refuses_a_replay_of_a_proposal_committed_before_its_restart(
    live_cluster: Callable[..., LiveCluster],
) -> None:
    """A replay of a committed proposal is refused forever (duplicates by agent key and
    nonce are `replayed`, docs/engine.md) — also by a replica restarted
    after the commit, whose database holds the block that committed it.

    A proposal is committed by all four replicas; node 1 is stopped and restarted from its
    database; the same bytes are submitted to node 1, unary and streamed. Both must be
    refused ALREADY_EXISTS / `replayed`, as the replicas that never restarted refuse them,
    and the chain must hold the proposal once after node 1 has led views again.
    """
    cluster = live_cluster(N)
    tx, tx_id = cluster.agent("replayer").proposal()
    assert cluster.submit(0, tx).accepted
    height = cluster.wait_committed([tx_id], 0)[tx_id]
    cluster.wait_height(height, range(N))
    with pytest.raises(grpc.RpcError) as live_refusal:
        cluster.submit(2, tx)
    assert live_refusal.value.code() == grpc.StatusCode.ALREADY_EXISTS

    cluster.kill(1, signal.SIGTERM)
    cluster.restart(1)
    outcomes = []
    try:
        reply = cluster.submit(1, tx)
        outcomes.append(f"unary Submit accepted (reason {reply.reason!r})")
    except grpc.RpcError as err:
        reason = dict(err.trailing_metadata() or ()).get("qg-reason")
        if (err.code(), reason) != (grpc.StatusCode.ALREADY_EXISTS, "replayed"):
            outcomes.append(f"unary Submit refused {err.code().name} / {reason}")
    [streamed] = cluster.submit_stream(1, [tx])
    if streamed.accepted or streamed.reason != "replayed":
        outcomes.append(f"SubmitStream answered accepted={streamed.accepted} {streamed.reason!r}")

    # Node 1 leads one view in four: let it propose a few times.
    cluster.wait_progress(3 * N)
    top = min(cluster.heights().values())
    chain = cluster.assert_same_chain(list(range(N)), top)
    heights = [b.height for b in chain for t in b.payload if t == tx]
    if len(heights) != 1:
        outcomes.append(f"the proposal is committed at heights {heights}")
    assert not outcomes, (
        "replay of a proposal committed before node 1's restart, sent to node 1: "
        + "; ".join(outcomes)
    )
