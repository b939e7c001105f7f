"""The safety checks the simulator makes after every step, on what honest members commit,
certify and sign (docs/consensus/simulator.md lists them; replica/safety.py argues why
they hold)."""

from __future__ import annotations

from collections.abc import Callable

from quorumgate.replica.sim.options import SimulationFailure
from quorumgate.replica.types import Block, Message, QuorumCert, Timeout, Vote


class SafetyChecks:
    """What honest members committed, certified and signed so far, and the checks on it.
    Each check raises the failure `fail` makes of its message (which names the scenario)."""

    def __init__(self, genesis: Block, fail: Callable[[str], SimulationFailure]) -> None:
        self._fail = fail
        self.committed_by_height: dict[int, bytes] = {0: genesis.hash}
        self.committed_tip = genesis  # the highest block an honest node committed
        # The same, per epoch (docs/consensus/epochs.md): the lemma holds within one.
        self.epoch_tips: dict[int, Block] = {0: genesis}
        self.blocks_by_hash: dict[bytes, Block] = {genesis.hash: genesis}
        # (epoch, view) -> the block an honest replica's QC of that view certifies
        self.certified_in_view: dict[tuple[int, int], bytes] = {}
        self.honest_votes: dict[tuple[int, int], bytes] = {}
        self.delivered_votes: dict[tuple[int, int], bytes] = {}
        self.delivered_timeouts: set[tuple[int, int]] = set()  # (honest member, view)
        # The same three for each epoch after 0, whose views may repeat an earlier one's.
        self._later: dict[int, tuple[dict[tuple[int, int], bytes], ...]] = {}
        self._later_timeouts: dict[int, set[tuple[int, int]]] = {}

    def _votes(self, epoch: int) -> tuple[dict[tuple[int, int], bytes], ...]:
        """(signed votes, delivered votes) of one epoch, by (honest member, view)."""
        if epoch == 0:
            return self.honest_votes, self.delivered_votes
        return self._later.setdefault(epoch, ({}, {}))

    def _timeouts(self, epoch: int) -> set[tuple[int, int]]:
        if epoch == 0:
            return self.delivered_timeouts
        return self._later_timeouts.setdefault(epoch, set())

    def vote_sent(self, src: int, vote: Vote, epoch: int = 0) -> None:
        """An honest member that never lost its memory signs one vote per view."""
        key = (src, vote.view)
        prior = self._votes(epoch)[0].setdefault(key, vote.block_hash)
        if prior != vote.block_hash:
            raise self._fail(f"SAFETY: honest node {src} voted twice in view {vote.view}")

    def reaching_peers(self, src: int, msg: Message, restored: bool, epoch: int = 0) -> None:
        """An honest member's votes and timeouts as they reach the network, before and
        after any restore. A restored node may re-sign what it forgot only if the first
        copy reached nobody, so judge what reaches peers, not what leaves: one vote per
        view, and no vote in a view after a timeout for it (Rule 1: a TC of that view
        could then hide the QC the vote helps form)."""
        who = "restored node" if restored else "honest node"
        timeouts, delivered = self._timeouts(epoch), self._votes(epoch)[1]
        if isinstance(msg, Timeout):
            timeouts.add((src, msg.view))
            return
        if not isinstance(msg, Vote):
            return
        key = (src, msg.view)
        if key in timeouts and key not in delivered:
            raise self._fail(
                f"SAFETY: {who} {src} voted in view {msg.view} after its timeout for that "
                "view reached peers"
            )
        prior = delivered.setdefault(key, msg.block_hash)
        if prior != msg.block_hash:
            raise self._fail(
                f"SAFETY: {who} {src} equivocated: two votes for view {msg.view} reached peers"
            )

    def certified(self, qc: QuorumCert, epoch: int = 0) -> None:
        """The lemma the safety argument rests on (replica/safety.py): once B0 of view r
        commits, every block certified in a view above r extends it. Checked on each
        honest replica's highest QC against the highest block an honest replica
        committed (the last block of a commit is the B0 of its 2-chain), so a conflicting
        certificate fails the run before any fork commits, or stalls everyone instead.
        And before it, quorum intersection: two signed QCs of one view of one epoch
        certify one block, since any two quorums share an honest member, who votes once
        per view (a signature that counts for someone it is not fails here first)."""
        if qc.signatures:
            known = self.certified_in_view.setdefault((epoch, qc.view), qc.block_hash)
            if known != qc.block_hash:
                raise self._fail(
                    f"SAFETY: two blocks certified in view {qc.view} of epoch {epoch} "
                    f"({known[:4].hex()} and {qc.block_hash[:4].hex()})"
                )
        tip = self.epoch_tips[max(e for e in self.epoch_tips if e <= epoch)]
        if qc.view <= tip.view:
            return
        block = self.blocks_by_hash.get(qc.block_hash)
        while block is not None and block.height > tip.height:
            block = self.blocks_by_hash.get(block.parent_hash)
        if block is not None and block.hash != tip.hash:
            raise self._fail(
                f"SAFETY: a block certified in view {qc.view} does not extend the block "
                f"committed at height {tip.height} (view {tip.view})"
            )

    def honest_commit(self, index: int, block: Block, epoch: int = 0) -> None:
        """No two honest members commit different blocks at one height."""
        known = self.committed_by_height.setdefault(block.height, block.hash)
        if known != block.hash:
            raise self._fail(
                f"SAFETY: two blocks committed at height {block.height} "
                f"({known[:4].hex()} and {block.hash[:4].hex()}, node {index})"
            )
        if block.height > self.committed_tip.height:
            self.committed_tip = block
        tip = self.epoch_tips.get(epoch)
        if tip is None or block.height > tip.height:
            self.epoch_tips[epoch] = block
