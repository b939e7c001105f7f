"""Quiescence (docs/consensus/protocol.md; replica/core.py): an idle cluster stops proposing once
nothing is left to order — no transaction waits, no uncommitted block carries any, and a committed
block carries the state root of the last height that did — and wakes on the next transaction without
waiting for a timeout. A leader that died meanwhile is still timed out.

Cores run on helpers.Net with the simulator's mempool and instant execution, so blocks
carry real state roots.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from quorumgate.replica.actions import Send
from quorumgate.replica.core import Core, Recovered
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.sim import (
    Disk,
    SimExecution,
    SimMempool,
    SimOptions,
    SimPool,
    Simulation,
)
from quorumgate.replica.types import Proposal, Timeout, TimeoutCert, Vote, genesis_block
from tests.consensus.helpers import CHAIN, SIGNERS, TEST_LIMITS, Net, membership

QUIET = replace(TEST_LIMITS, quiesce=True, state_root_lag_blocks=2)
BASE = QUIET.view_timeout_ticks_base
SETTLE_TICKS = 20 * BASE  # far more than the heartbeats that carry the last root need


@dataclass
class QuietNet(Net):
    limits: object = QUIET
    pool: SimPool = field(default_factory=SimPool)

    def __post_init__(self) -> None:
        for i in range(self.n):
            disk = Disk(SafetyState.initial(CHAIN), [genesis_block(CHAIN)])
            self.disks.append(disk)
            self.durable.append(0)
            self.cores.append(
                Core(
                    membership(self.n),
                    i,
                    SIGNERS[i],
                    limits=QUIET,
                    now_ms=self.now_ms,
                    payload=SimMempool(self.pool, set()),
                    execution=SimExecution(disk),
                    fence_on_start=False,
                )
            )

    def restart(self, i: int) -> None:
        """Member `i` comes back from what its disk holds, fenced as a real start is."""
        disk = self.disks[i]
        committed = disk.committed[-1]
        pending = tuple(b for b in disk.blocks.values() if b.height > committed.height)
        self.durable[i] = disk.safety.epoch
        self.cores[i] = Core(
            membership(self.n),
            i,
            SIGNERS[i],
            limits=QUIET,
            now_ms=self.now_ms,
            payload=SimMempool(self.pool, {tx for b in disk.committed for tx in b.payload}),
            execution=SimExecution(disk),
            recovered=Recovered(
                disk.safety, committed, pending, payload_height=disk.payload_height()
            ),
        )
        self.down.discard(i)
        self.apply(i, self.cores[i].start())
        self.deliver_all()

    def submit(self, tx: bytes) -> list[Send]:
        """Every up member's mempool gets `tx` (gossip); returns what that made them send
        before any tick."""
        self.pool.add(tx)
        mark = len(self.log)
        for i, core in enumerate(self.cores):
            if i not in self.down:
                self.apply(i, core.on_transactions())
        sent = [a for _, actions in self.log[mark:] for a in actions if isinstance(a, Send)]
        self.deliver_all()
        return sent

    def sends_during(self, ticks: int) -> list[Send]:
        mark = len(self.log)
        self.tick(ticks)
        return [a for _, actions in self.log[mark:] for a in actions if isinstance(a, Send)]

    def committed(self, tx: bytes, members: range | list[int]) -> bool:
        return all(any(tx in b.payload for b in self.disks[i].committed) for i in members)

    def tick_until_committed(self, tx: bytes, members: range | list[int]) -> int:
        for ticks in range(1, SETTLE_TICKS + 1):
            self.tick()
            if self.committed(tx, members):
                return ticks
        raise AssertionError(f"{tx!r} not committed within {SETTLE_TICKS} ticks")


def settled(net: QuietNet) -> None:
    """Tick until every member is quiescent (bounded), then check that it stays silent."""
    for _ in range(SETTLE_TICKS):
        if all(core.quiescent() for core in net.cores):
            break
        net.tick()
    assert all(core.quiescent() for core in net.cores)


def quiet_after_one_transaction() -> QuietNet:
    net = QuietNet()
    net.start()
    net.submit(b"tx-1")
    net.tick_until_committed(b"tx-1", range(net.n))
    settled(net)
    return net


def test_a_fresh_cluster_with_nothing_to_order_sends_nothing() -> None:
    net = QuietNet()
    net.start()
    assert net.sends_during(10 * BASE) == []
    assert all(core.view == 1 for core in net.cores)


def test_after_its_last_transaction_the_cluster_carries_the_root_and_goes_quiet() -> None:
    net = QuietNet()
    net.start()
    net.submit(b"tx-1")
    net.tick_until_committed(b"tx-1", range(net.n))
    tx_height = next(b.height for b in net.disks[0].committed if b"tx-1" in b.payload)
    settled(net)
    # Heartbeats ran exactly until a committed block carried the root after the transaction.
    for core, disk in zip(net.cores, net.disks, strict=True):
        assert core.tree.root.state_root_height >= tx_height
        assert disk.committed[-1].state_root_height >= tx_height
    height = net.disks[0].committed[-1].height
    assert net.sends_during(10 * BASE) == []  # ten view timeouts: no block, no timeout
    assert net.disks[0].committed[-1].height == height
    assert all(core.stats.timeouts_sent == 0 for core in net.cores)


def test_the_next_transaction_is_proposed_at_once_and_commits_without_a_timeout() -> None:
    net = quiet_after_one_transaction()
    net.tick(10 * BASE)
    sent = net.submit(b"tx-2")
    # The leader proposed on arrival, before any tick: no heartbeat wait, no timeout.
    proposals = [s.message for s in sent if isinstance(s.message, Proposal)]
    assert len(proposals) == 1 and proposals[0].block.payload == (b"tx-2",)
    ticks = net.tick_until_committed(b"tx-2", range(net.n))
    assert ticks < QUIET.idle_propose_ticks + BASE
    assert all(core.stats.timeouts_sent == 0 for core in net.cores)


def test_a_leader_that_died_while_quiet_is_timed_out_once_a_transaction_arrives() -> None:
    net = quiet_after_one_transaction()
    dead = net.cores[0].leader
    net.down = {dead}
    net.tick(10 * BASE)  # quiet: nobody notices yet, and nobody needs to
    assert all(core.stats.timeouts_sent == 0 for core in net.cores)
    alive = [i for i in range(net.n) if i != dead]
    sent = net.submit(b"tx-2")
    assert not [s for s in sent if isinstance(s.message, Proposal)]
    net.tick_until_committed(b"tx-2", alive)
    assert all(net.cores[i].stats.timeouts_sent >= 1 for i in alive)
    assert any(
        isinstance(a, Send) and isinstance(a.message, TimeoutCert | Timeout)
        for i, actions in net.log
        if i in alive
        for a in actions
    )


def test_a_quiet_core_needs_no_ticks_until_a_transaction_arrives() -> None:
    """What lets the shell stop its 100-a-second ticker (replica/node.py): ticks would
    change nothing while quiet, and the first transaction makes them count again."""
    net = quiet_after_one_transaction()
    assert not any(core.needs_ticks() for core in net.cores)
    net.pool.add(b"tx-2")  # in every mempool, before any core heard of it
    assert all(core.needs_ticks() for core in net.cores)


def test_a_transaction_after_a_long_quiet_spell_is_stamped_with_the_shells_clock() -> None:
    net = QuietNet()
    net.start()
    settled(net)
    leader = net.cores[net.cores[0].leader]
    later = net.now_ms + 60_000  # a minute without ticks
    net.pool.add(b"tx-1")
    actions = leader.on_transactions(later)
    proposals = [a.message for a in actions if isinstance(a, Send)]
    blocks = [p.block for p in proposals if isinstance(p, Proposal)]
    assert len(blocks) == 1 and blocks[0].timestamp_ms == later


class HeldExecution(SimExecution):
    """A sidecar that can be stopped: while `held_at` is set, no root above it exists."""

    def __init__(self, disk: Disk) -> None:
        super().__init__(disk)
        self.held_at: int | None = None

    def latest_root(self) -> tuple[int, bytes]:
        height, root = super().latest_root()
        if self.held_at is not None and height > self.held_at:
            return self.held_at, super().root_at(self.held_at) or b""
        return height, root

    def root_at(self, height: int) -> bytes | None:
        if self.held_at is not None and height > self.held_at:
            return None
        return super().root_at(height)


def tick_as_shells_do(net: QuietNet, ticks: int) -> None:
    """Like net.tick, but a core is ticked only while it says ticks matter (needs_ticks),
    as replica/node.py does: an idle shell stops its ticker until the next event."""
    for _ in range(ticks):
        net.now_ms += 10
        for i, core in enumerate(net.cores):
            if i not in net.down and core.needs_ticks():
                net.apply(i, core.on_tick(net.now_ms))
        net.deliver_all()


# Which member is left behind depends on who leads the last views before the cluster goes
# quiet (a leader fetches the block its QC names before it proposes): in this run member 2
# is the one, and the test was checked to fail without the fix.
@pytest.mark.parametrize("behind", [2])
def test_a_replica_whose_sidecar_lagged_through_the_last_heartbeats_catches_up_while_quiet(
    behind: int,
) -> None:
    """Found in CI: replica `behind`'s sidecar was stopped while the heartbeats that carry
    the last root were proposed, so replica `behind` could not judge them; the view moved on, the
    cluster went quiet, and nothing more arrived that would make replica `behind` fetch what it
    lacked. It holds the QC that names the last block: that is enough to ask for it."""
    net = QuietNet()
    held = HeldExecution(net.disks[behind])
    net.cores[behind].execution = held
    net.start()
    held.held_at = 0  # its sidecar stops before it executes the transaction's height
    net.submit(b"tx-1")
    net.tick_until_committed(b"tx-1", range(net.n))
    others = [i for i in range(net.n) if i != behind]
    for _ in range(SETTLE_TICKS):
        if all(net.cores[i].quiescent() for i in others):
            break
        net.tick()
    assert all(net.cores[i].quiescent() for i in others)
    top = net.committed_heights()[0]
    # It could not judge the last block proposed, so it did not vote for it.
    last = next(b for b in net.disks[0].blocks.values() if b.height == top + 1)
    assert net.votes.get((behind, last.view)) is None
    held.held_at = None  # the sidecar is back and reports its root
    net.apply(behind, net.cores[behind].on_state_root())
    net.deliver_all()
    tick_as_shells_do(net, SETTLE_TICKS)
    assert net.committed_heights() == [top] * net.n
    net.assert_committed_prefixes()
    assert not any(core.needs_ticks() for core in net.cores)


def quiet_after_one_transaction_without(behind: int, height: int | None) -> QuietNet:
    """One transaction, then quiet; the proposal at `height` never reaches `behind`."""
    net = QuietNet()
    net.drop = lambda src, dst, msg: (
        dst == behind and isinstance(msg, Proposal) and msg.block.height == height
    )
    net.start()
    net.submit(b"tx-1")
    others = [i for i in range(net.n) if i != behind]
    net.tick_until_committed(b"tx-1", others)
    for _ in range(SETTLE_TICKS):
        if all(net.cores[i].quiescent() for i in others):
            break
        net.tick()
    assert all(net.cores[i].quiescent() for i in others)
    return net


@pytest.mark.parametrize("behind", [2, 3])  # (both fail without the fix)
def test_a_replica_that_missed_the_last_proposal_fetches_it_while_quiet(behind: int) -> None:
    """The neighbour: the last heartbeat's proposal never reached replica `behind` (a lost
    message, or a leader that sent it to the others only); the votes for it did, so it holds
    the QC that would commit the height below, without the block that QC certifies."""
    top = quiet_after_one_transaction_without(behind, None).committed_heights()[0]
    net = quiet_after_one_transaction_without(behind, top + 1)  # the last block proposed
    assert net.committed_heights()[0] == top
    net.drop = None
    tick_as_shells_do(net, SETTLE_TICKS)
    assert net.committed_heights() == [top] * net.n
    net.assert_committed_prefixes()
    assert not any(core.needs_ticks() for core in net.cores)


@pytest.mark.parametrize("behind", range(4))
def test_a_replica_that_missed_the_last_votes_catches_up_while_quiet(behind: int) -> None:
    """The other neighbour: the last block reached replica `behind`, but the votes that
    certify it did not, so it cannot commit the block below and nobody sends it a QC; its
    view times out while the others, quiet, time out nothing. Its stuck timeout must lead
    it to what they committed, not to re-broadcasting timeouts for ever."""
    top = quiet_after_one_transaction_without(behind, None).committed_heights()[0]
    net = QuietNet()
    net.start()
    net.submit(b"tx-1")
    net.tick_until_committed(b"tx-1", range(net.n))
    last_view: list[int] = []

    def lose_last_votes(src: int, dst: int, msg: object) -> bool:
        if isinstance(msg, Proposal) and msg.block.height == top + 1:
            last_view.append(msg.block.view)
        return dst == behind and isinstance(msg, Vote) and msg.view in last_view

    net.drop = lose_last_votes
    others = [i for i in range(net.n) if i != behind]
    for _ in range(SETTLE_TICKS):
        if all(net.cores[i].quiescent() for i in others):
            break
        net.tick()
    assert last_view and all(net.cores[i].quiescent() for i in others)
    net.drop = None
    tick_as_shells_do(net, SETTLE_TICKS)
    top = max(net.committed_heights())  # (member 0 led a view more here, as it timed out)
    assert net.committed_heights() == [top] * net.n
    net.assert_committed_prefixes()
    assert not any(core.needs_ticks() for core in net.cores)


@pytest.mark.parametrize("down", range(4))
def test_a_replica_restarted_into_a_quiet_cluster_catches_up(down: int) -> None:
    """A recovery drill on an idle cluster: a member is down while the others order and go
    quiet, then restarts. What its peers tell it at start (their highest QC, in the hello
    replies) names blocks it lacks, and it fetches them with nothing else happening."""
    net = QuietNet()
    net.start()
    net.submit(b"tx-1")
    net.tick_until_committed(b"tx-1", range(net.n))
    net.down = {down}
    for k in range(2, 6):
        net.submit(f"tx-{k}".encode())
        net.tick_until_committed(f"tx-{k}".encode(), [i for i in range(net.n) if i != down])
    settled_others = [i for i in range(net.n) if i != down]
    for _ in range(SETTLE_TICKS):
        if all(net.cores[i].quiescent() for i in settled_others):
            break
        net.tick()
    top = net.committed_heights()[settled_others[0]]
    assert net.committed_heights()[down] < top
    net.restart(down)
    tick_as_shells_do(net, SETTLE_TICKS)
    assert net.committed_heights() == [top] * net.n
    net.assert_committed_prefixes()
    assert not any(core.needs_ticks() for core in net.cores)


@pytest.mark.parametrize("member", range(4))
def test_a_replica_restarted_in_a_quiet_cluster_stays_quiet(member: int) -> None:
    """A member of a quiet cluster restarts from its disk, missing nothing. Its peers are
    quiescent and propose nothing more, so it must find itself quiescent from what is
    durable: the committed chain already carries the root of the last height with
    transactions. Taking its committed height for that height, it waited for a root
    nobody would propose (seed 702926 below)."""
    net = quiet_after_one_transaction()
    top = net.committed_heights()
    net.restart(member)
    assert net.cores[member].quiescent()
    tick_as_shells_do(net, SETTLE_TICKS)
    assert net.committed_heights() == top
    assert not any(core.needs_ticks() for core in net.cores)


def test_seed_702926_a_restart_into_a_quiet_cluster_settles() -> None:
    """Found by the seeded scenarios: with twins, duplication and crashes, a member
    restarted while the others were quiet kept needing ticks (QUIET)."""
    opts = SimOptions(
        seed=702926,
        byzantine=("twins",),
        ticks=300,
        dup_permille=50,
        crash_permille=3,
        crash_ticks_max=150,
        tx_per_tick_permille=100,
    )
    Simulation(opts).run()


def test_members_that_missed_a_commit_catch_up_while_heartbeats_never_commit() -> None:
    """Found by the Twins enumeration at n = 7 (twins of two members, restores of a third):
    block 46 committed at three members by a QC of view 54 that two others never saw.
    Those two, still owed the state root of height 38, kept proposing heartbeats when they
    led; the quiet members led the views between and proposed nothing, so every block was
    certified two views after its parent and none ever committed (QUIET: heights 46 and 45,
    two members needing ticks). A member whose highest QC runs COMMIT_LAG_VIEWS_MAX views
    past its last commit now asks a signer for what it committed."""
    opts = SimOptions(
        seed=12933469,
        n=7,
        byzantine=("twins", "twins"),
        ticks=500,
        delay_ticks_max=2,
        byzantine_members=(5, 6),
        partition_schedule=(
            (0, 1, 0, 1, 1, 1, 1, 1, 0),
            (0, 0, 1, 1, 0, 0, 1, 1, 1),
            (0, 1, 1, 1, 0, 0, 0, 1, 1),
        ),
        schedule_phase_ticks=100,
        restores_when_leading=3,
        restores_when_voting=3,
        restores_when_timing_out=3,
    )
    result = Simulation(opts).run()
    assert len(set(result.committed_heights.values())) == 1
