"""The aimed restores: the victim restored from a backup right after it proposed, voted
or timed out, with what it signed still in flight (safety Rule 6; docs/consensus/fencing.md
says what a restore may and may not do)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from quorumgate.replica.actions import Action, Send
from quorumgate.replica.safety import SafetyState
from quorumgate.replica.sim.node import Disk, SimNode
from quorumgate.replica.sim.options import SENT_PROPOSAL_VIEWS_MAX
from quorumgate.replica.sim.world import World
from quorumgate.replica.types import Envelope, Proposal, Timeout, TimeoutCert, Vote

# Extra ticks a vote or timeout is held in flight across a boundary: the restored victim's
# request for the proof that its backup's epoch ended waits for a message of the later
# epoch, which an idle leader sends every few ticks.
ACROSS_BOUNDARY_EXTRA_TICKS = 20


class RestoreDrill:
    """When to restore the victim, from which backup, and what the network hands it after.
    The victim is the last honest member; `SimOptions.restores_when_*` say how often."""

    def __init__(self, sim: World) -> None:
        self.sim = sim
        self.aimed: Counter[str] = Counter()  # aimed restores done, by kind
        # view -> block hash -> a proposal of that view as sent (the newest views only)
        self.sent_proposals: dict[int, dict[bytes, Envelope]] = {}
        # an aimed restore's victim -> (view, block hash it voted for): the proposals of
        # that view to hand it once its fencing ends
        self.redeliveries: dict[int, tuple[int, bytes]] = {}
        self.holding: int | None = None  # whose votes and timeouts are held in flight
        # Across a boundary: (epoch, view, tick) — every vote, timeout and TC of that view
        # of that epoch is held until that tick, so the cluster is still in the view the
        # victim signed in and forgot when the victim ends its fencing (only a fence at or
        # above that view keeps it from signing there again).
        self.stalled: tuple[int, int, int] | None = None

    @property
    def in_flight_ticks(self) -> int:
        """How long an aimed restore's last vote or timeout is delayed: past the restart,
        the hello and its answers, and the proposals handed to the victim after them.
        Across a boundary the restored victim must first learn that its backup's epoch
        ended (a message of the later epoch, its request, the proof): twice as long."""
        ticks = 4 * self.sim.options.delay_ticks_max + 12
        return 2 * ticks + ACROSS_BOUNDARY_EXTRA_TICKS if self.across else ticks

    @property
    def across(self) -> bool:
        return self.sim.options.restore_across_boundary

    def held_ticks(self, src: int, envelope: Envelope) -> int:
        """The extra delay the drill puts on a message as it leaves `src`."""
        msg = envelope.message
        if src == self.holding and isinstance(msg, Vote | Timeout):
            return self.in_flight_ticks
        if self.stalled is None or not isinstance(msg, Vote | Timeout | TimeoutCert):
            return 0
        epoch, view, until = self.stalled
        if envelope.epoch != epoch or msg.view != view or self.sim.tick >= until:
            return 0
        return until - self.sim.tick

    def keep_proposal(self, envelope: Envelope, proposal: Proposal) -> None:
        """The network remembers what it carried, to hand a restored victim again."""
        view = proposal.block.view
        self.sent_proposals.setdefault(view, {}).setdefault(proposal.block.hash, envelope)
        if len(self.sent_proposals) > SENT_PROPOSAL_VIEWS_MAX:
            del self.sent_proposals[min(self.sent_proposals)]

    def victim_state(self, node: SimNode) -> SafetyState | None:
        """For the aimed restores: the victim's safety state before this step, to restore
        it from if the step signs what the restore aims at."""
        if (
            self.sim.options.aimed_restores <= sum(self.aimed.values())
            or self.sim.healed
            or node.index != self.sim.honest[-1]
            or node.instance != 0
        ):
            return None
        return node.disk.safety

    def _aim(self, actions: list[Action]) -> tuple[str, int, bytes] | None:
        """What in this step an aimed restore fires on, if anything: (kind, view, the
        block voted for or b"")."""
        opts, done = self.sim.options, self.aimed
        sent = [a.message for a in actions if isinstance(a, Send)]
        for msg in sent:
            if isinstance(msg, Proposal) and done["leading"] < opts.restores_when_leading:
                return "leading", msg.block.view, b""
        for msg in sent:
            if isinstance(msg, Vote) and done["voting"] < opts.restores_when_voting:
                leader = self.sim.membership.leader(msg.view)
                if leader in self.sim.byzantine or not self.sim.byzantine:
                    return "voting", msg.view, msg.block_hash
            if isinstance(msg, Timeout) and done["timing_out"] < opts.restores_when_timing_out:
                return "timing_out", msg.view, b""
        return None

    def restore(self, node: SimNode, prior: SafetyState, actions: list[Action]) -> bool:
        aim = self._aim(actions)
        if aim is None:
            return False
        kind, view, voted = aim
        earlier = node.backup_of_earlier_epoch() if self.across else None
        if self.across and earlier is None:
            return False  # no boundary behind it yet
        epoch = node.core.epoch
        # What it signs leaves: a proposal (and its vote) at once, a vote or a timeout
        # held in flight until the restored victim has asked its peers and been answered.
        self.holding = None if kind == "leading" else node.index
        self.sim._apply(node, actions)
        self.holding = None
        if earlier is not None:
            backup = earlier
            self._stall(node, epoch, view)
        else:
            backup = self._backup(node, prior, actions, kind, view)
        node.snapshots = [backup]
        node.force_stale = True
        self.aimed[kind] += 1
        if kind == "leading":
            # Down for longer than a message takes, as a restore from backup is: what it
            # sent before has reached its peers when it asks them (Rule 6 at start).
            node.crash(self.sim.tick + self.sim.options.delay_ticks_max + 2)
        else:
            node.crash(self.sim.tick + 1)
            self.redeliveries[node.index] = (view, voted)
        return True

    def _backup(
        self, node: SimNode, prior: SafetyState, actions: list[Action], kind: str, view: int
    ) -> Disk:
        """The backup an aimed restore in one epoch puts back."""
        backup = node.backup_before(view, self.sim.options.restore_backup_views)
        if self.sim.options.restore_backup_views and backup is not None:
            return backup
        # The copy kept holds the certificates that let it enter the view, but not what
        # it signed in it, nor its own block.
        backup = node.disk.copy()
        backup.safety = replace(
            backup.safety,
            last_voted_view=prior.last_voted_view,
            last_proposed_view=prior.last_proposed_view,
            last_vote=prior.last_vote,
            last_timeout=prior.last_timeout,
            locked_qc=prior.locked_qc,
        )
        if kind == "leading":
            for msg in (a.message for a in actions if isinstance(a, Send)):
                if isinstance(msg, Proposal):
                    backup.blocks.pop(msg.block.hash, None)
        return backup

    def _stall(self, node: SimNode, epoch: int, view: int) -> None:
        """Across a boundary: hold the view's votes, timeouts and TCs in flight as long as
        the victim's own (`stalled`), and hand the victim, once it is back up, a copy of a
        proposal of that view: a message of the later epoch, from which it learns that its
        backup's epoch ended (the stalled cluster sends it little else meanwhile)."""
        self.stalled = (epoch, view, self.sim.tick + self.in_flight_ticks)
        for envelope in self.sent_proposals.get(view, {}).values():
            if envelope.epoch == epoch:
                self.sim.network.push(self.sim.tick + 2, node.index, 0, envelope)
                break

    def redeliver(self, node: SimNode) -> None:
        """Once a victim restored after voting or timing out has ended its fencing, the
        network hands it the proposals of that view it has not voted for: the Byzantine
        leader's other block, or the block it timed out waiting for, delivered late."""
        if node.core.fencing:
            return
        view, voted = self.redeliveries.pop(node.index)
        if node.core.view != view:
            return
        for block_hash, envelope in self.sent_proposals.get(view, {}).items():
            if block_hash != voted and envelope.sender != node.index:  # (not its own)
                self.sim.network.push(self.sim.tick + 1, node.index, 0, envelope)
