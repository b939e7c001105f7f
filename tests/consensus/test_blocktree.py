"""The block tree: the 2-chain commit rule, pruning, and bounded memory.

Commit rule (Jolteon, FC'22, §3; DiemBFT v4 §4): a QC for B1 whose parent B0 is of the view
just before commits B0 and its uncommitted ancestors.
"""

from __future__ import annotations

from collections import Counter

from quorumgate.replica.blocktree import BlockTree
from quorumgate.replica.sim import SIM_LIMITS, SimOptions, Simulation
from quorumgate.replica.types import Block, CommitProof, QuorumCert, genesis_block
from tests.consensus.helpers import CHAIN, make_block

PENDING_MAX = 64


def cert(block: Block) -> QuorumCert:
    """An (unsigned) certificate naming `block`: the tree trusts the core to verify QCs."""
    return QuorumCert(block.view, block.height, block.hash)


def child(parent: Block, view: int, salt: int = 0) -> Block:
    justify = cert(parent) if parent.height else QuorumCert(0, 0, parent.hash)
    return make_block(parent, view, justify, timestamp_ms=1_000 * view + salt)


def tree_with(*blocks: Block) -> BlockTree:
    tree = BlockTree(genesis_block(CHAIN), PENDING_MAX)
    for block in blocks:
        assert tree.insert(block)
    return tree


def test_two_chain_in_consecutive_views_commits_b0_and_its_uncommitted_ancestors() -> None:
    """B0 <- B1 with views v, v+1 and QC(B1) commit B0 (and what B0 extends)."""
    g = genesis_block(CHAIN)
    a = child(g, 1)
    b0 = child(a, 3)  # a gap between a and b0: a commits only as b0's ancestor
    b1 = child(b0, 4)
    tree = tree_with(a, b0, b1)
    result = tree.two_chain(cert(b1))
    assert result is not None
    blocks, proof = result
    assert blocks == [a, b0]
    assert proof == CommitProof(b1, b1, cert(b1)) and proof.blocks == (b1,)


def test_views_that_are_not_consecutive_commit_nothing() -> None:
    g = genesis_block(CHAIN)
    for views in ((1, 3), (2, 4), (1, 7)):
        b0 = child(g, views[0])
        b1 = child(b0, views[1])
        tree = tree_with(b0, b1)
        assert tree.two_chain(cert(b1)) is None, views
        assert tree.committed_height == 0


def test_a_one_chain_or_an_unknown_block_commits_nothing() -> None:
    g = genesis_block(CHAIN)
    b1 = child(g, 1)
    tree = tree_with(b1)
    assert tree.two_chain(cert(b1)) is None  # B0 would be genesis, already the root
    stranger = child(b1, 2)
    assert tree.two_chain(cert(stranger)) is None  # not in the tree


def test_a_committed_block_is_not_committed_twice() -> None:
    g = genesis_block(CHAIN)
    b1 = child(g, 1)
    b2 = child(b1, 2)
    tree = tree_with(b1, b2)
    result = tree.two_chain(cert(b2))
    assert result is not None and result[0] == [b1]
    tree.commit(b1)
    assert tree.two_chain(cert(b2)) is None
    b3 = child(b2, 3)
    tree.insert(b3)
    again = tree.two_chain(cert(b3))
    assert again is not None and again[0] == [b2]  # only the next one


def test_commit_prunes_ancestors_and_forks_and_keeps_descendants() -> None:
    g = genesis_block(CHAIN)
    b1 = child(g, 1)
    b2 = child(b1, 2)
    b3 = child(b2, 3)
    fork_of_genesis = child(g, 2, salt=1)
    fork_of_b1 = child(b1, 3, salt=1)
    deep_fork = child(fork_of_b1, 4, salt=1)
    fork_of_b2 = child(b2, 4, salt=2)  # descends from b2: stays
    tree = tree_with(b1, b2, b3, fork_of_genesis, fork_of_b1, deep_fork, fork_of_b2)
    assert len(tree) == 8
    tree.commit(b2)
    assert tree.root == b2 and tree.committed_height == 2
    assert len(tree) == 3
    for gone in (g, b1, fork_of_genesis, fork_of_b1, deep_fork):
        assert gone.hash not in tree and tree.get(gone.hash) is None
    for kept in (b2, b3, fork_of_b2):
        assert kept.hash in tree
    assert tree.extends(b3.hash, b2.hash) and tree.extends(fork_of_b2.hash, b2.hash)
    assert tree.uncommitted_chain(b3.hash) == [b3]
    # children bookkeeping was pruned too: a later commit keeps only b3's subtree
    b4 = child(b3, 5)
    tree.insert(b4)
    tree.commit(b3)
    assert len(tree) == 2 and fork_of_b2.hash not in tree


def test_extends_and_uncommitted_chain_follow_parents_up_to_the_root() -> None:
    g = genesis_block(CHAIN)
    b1 = child(g, 1)
    b2 = child(b1, 2)
    fork = child(b1, 3, salt=5)
    tree = tree_with(b1, b2, fork)
    assert tree.uncommitted_chain(b2.hash) == [b1, b2]
    assert tree.extends(b2.hash, b1.hash) and tree.extends(b2.hash, g.hash)
    assert not tree.extends(b2.hash, fork.hash) and not tree.extends(fork.hash, b2.hash)
    assert not tree.insert(b2)  # already there
    assert len(tree) == 4


def test_the_tree_reports_full_above_pending_blocks_max() -> None:
    g = genesis_block(CHAIN)
    tree = BlockTree(g, 3)
    parent = g
    for view in range(1, 4):
        assert not tree.full
        parent = child(parent, view)
        tree.insert(parent)
    assert len(tree) == 4 and tree.full


# --------------------------------------------------------------------------- bounded memory


class SampledSimulation(Simulation):
    """Records, after every tick, the peak size of every honest core's maps (the cores
    current at that tick, so restarted ones are sampled too)."""

    def __init__(self, options: SimOptions) -> None:
        super().__init__(options)
        self.peak: Counter[str] = Counter()

    def _one_tick(self) -> None:
        super()._one_tick()
        peak = self.peak
        for index in self.honest:
            for node in self.nodes[index]:
                core = node.core
                sizes = {
                    "tree": len(core.tree),
                    "vote_views": len(core._votes),
                    "votes": sum(map(len, core._votes.values())),
                    "timeout_views": len(core._timeouts),
                    "timeouts": sum(map(len, core._timeouts.values())),
                    "proposals_seen": len(core._proposal_seen),
                    "verified_cache": len(core.verifier._cache),
                }
                for name, size in sizes.items():
                    peak[name] = max(peak[name], size)
        peak["ticks"] += 1


def test_memory_stays_bounded_over_a_long_happy_run() -> None:
    """Pruning keeps the tree at the uncommitted suffix, however long the cluster runs."""
    sim = SampledSimulation(SimOptions(seed=1, ticks=15_000))
    result = sim.run()
    peak = sim.peak
    assert min(result.committed_heights.values()) > 3_000
    assert peak["ticks"] >= 15_000
    assert peak["tree"] <= 10  # root plus a few uncommitted blocks
    assert peak["vote_views"] <= 3 and peak["votes"] <= 2 * sim.membership.n
    assert peak["timeout_views"] <= 1 and peak["proposals_seen"] <= 1
    # the certificate cache fills to its named bound and stays there
    assert peak["verified_cache"] == SIM_LIMITS.verified_cache_max


def test_memory_stays_within_the_named_limits_under_faults() -> None:
    opts = SimOptions(
        seed=2,
        n=7,
        byzantine=("silent_leader", "forge_certs"),
        ticks=3_000,
        loss_permille=100,
        partition_ticks=40,
        crash_permille=2,
    )
    sim = SampledSimulation(opts)
    result = sim.run()
    peak = sim.peak
    limits = SIM_LIMITS
    n = opts.n
    assert peak["ticks"] >= opts.ticks and min(result.committed_heights.values()) > 0
    assert peak["tree"] <= limits.pending_blocks_max + 1
    assert peak["vote_views"] <= 2 * limits.vote_views_max + 1
    assert peak["votes"] <= (2 * limits.vote_views_max + 1) * n
    assert peak["timeout_views"] <= limits.vote_views_max + 1
    assert peak["timeouts"] <= (limits.vote_views_max + 1) * n
    assert peak["verified_cache"] <= limits.verified_cache_max
