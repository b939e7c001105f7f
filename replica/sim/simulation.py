"""The simulation: N cores on a simulated network, stepped tick by tick, with every
outcome drawn from one seed (the module docstring of `quorumgate.replica.sim` says what it
checks). The parts it is made of: `Network` (what is in flight), `SafetyChecks`,
`Adversary` (the Byzantine members) and `RestoreDrill` (the aimed restores)."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from quorumgate.proto.crypto import Ed25519Signer, Signer, VerifyFn, ed25519_verify
from quorumgate.proto.membership import Member, Membership
from quorumgate.replica.actions import (
    Action,
    Commit,
    PersistSafety,
    Send,
    StoreBlock,
    check_send_allowed,
)
from quorumgate.replica.core import Core
from quorumgate.replica.sim.byzantine import Adversary
from quorumgate.replica.sim.checks import SafetyChecks
from quorumgate.replica.sim.crypto import FastKeys
from quorumgate.replica.sim.epochs import (
    Reconfigurer,
    enter_epoch,
    first_records,
    follow_page,
    page_for,
    proof_for,
    take_proof,
)
from quorumgate.replica.sim.network import EpochDelivery, InFlight, Instance, Network
from quorumgate.replica.sim.node import SimNode, SimPool
from quorumgate.replica.sim.options import (
    SIM_LIMITS,
    SIM_TICK_MS,
    TX_BYTES,
    SimOptions,
    SimulationFailure,
)
from quorumgate.replica.sim.restores import RestoreDrill
from quorumgate.replica.sync import build_sync_response
from quorumgate.replica.types import (
    Block,
    Envelope,
    Message,
    Proposal,
    SyncRequest,
    Vote,
    genesis_block,
)


@dataclass
class SimResult:
    options: SimOptions
    ticks: int
    committed_heights: dict[int, int]
    views: dict[int, int]
    dropped: Counter[str]
    messages: int
    liveness_views: int
    # Liveness and quiescence were not owed (`Simulation.faults_beyond_f`): the run ended
    # with f Byzantine members and a restored member still short of its fence.
    liveness_excused: bool = False


class Simulation:
    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        n = options.n
        chain = f"sim-{options.seed}"
        fast = FastKeys()
        self.verify_fn: VerifyFn = fast.verify if options.fast_crypto else ed25519_verify
        make_signer = fast.signer if options.fast_crypto else Ed25519Signer
        signers: list[Signer] = []
        for i in range(options.slots):
            signers.append(make_signer(hashlib.sha256(f"{chain}/{i}".encode()).digest()))
        self.key_signers: dict[bytes, Signer] = {s.public_key: s for s in signers}
        self.membership = Membership(
            chain, tuple(Member(i, signers[i].public_key) for i in range(n))
        )
        members = list(range(n))
        self.rng.shuffle(members)
        if options.byzantine_members:
            members = list(options.byzantine_members)
        self.byzantine: dict[int, str] = dict(zip(members, options.byzantine, strict=False))
        # Every honest node slot, members of the first epoch or not (`_members` are those
        # of the newest epoch).
        self.honest = [i for i in range(options.slots) if i not in self.byzantine]
        self.clock_skew_ms = {i: self.rng.randint(-200, 200) for i in range(n)}
        self.clock_skew_ms.update({i: 0 for i in range(n, options.slots)})
        self.tick = 0
        self.pool = SimPool()
        self.first_records = first_records(options, chain)
        self.reconfigurer: Reconfigurer | None = None
        self.nodes: dict[int, list[SimNode]] = {}
        for i in range(options.slots):
            self.nodes[i] = [SimNode(self, i, signers[i])]
            if self.byzantine.get(i) == "twins":
                self.nodes[i].append(SimNode(self, i, signers[i], instance=1))
        self.signers = signers
        self.network = Network()
        self.messages = 0
        self.checks = SafetyChecks(genesis_block(chain), self.fail)
        self.adversary = Adversary(self)
        self.restores = RestoreDrill(self)
        self.healed = False
        self.quiet = False  # no more transactions (the run's last phase)
        self.stale_restores = 0
        self.restores_resumed = 0  # restarts of a restored member not yet past its fence
        self.amnesiac: set[int] = set()
        self.reconfigurer = Reconfigurer(self, make_signer) if options.reconfigure else None
        self.epoch_pages = 0  # pages of an ended epoch handed to a core far behind

    @property
    def partition(self) -> dict[Instance, int] | None:
        """Which side of the current partition each node instance is on (None: whole)."""
        return self.network.partition

    @property
    def aimed(self) -> Counter[str]:
        """The aimed restores done, by kind."""
        return self.restores.aimed

    @property
    def honest_votes(self) -> dict[tuple[int, int], bytes]:
        """(honest member, view) -> the block it voted for, as its core signed it."""
        return self.checks.honest_votes

    # ------------------------------------------------------------------ helpers

    def fail(self, message: str) -> SimulationFailure:
        return SimulationFailure(
            f"{message}\n  at tick {self.tick}; reproduce with: "
            f"Simulation({self.options.reproduce()}).run()"
        )

    def now_ms(self, index: int) -> int:
        return 1_000_000 + self.tick * SIM_TICK_MS + self.clock_skew_ms[index]

    def _enqueue(
        self, src: int, src_instance: int, to: int, envelope: Envelope | EpochDelivery
    ) -> None:
        opts = self.options
        for instance, _node in enumerate(self.nodes[to]):
            if not self.network.connected(src, src_instance, to, instance):
                continue
            copies = 1
            if not self.healed:
                if self.rng.randrange(1000) < opts.loss_permille:
                    continue
                if self.rng.randrange(1000) < opts.dup_permille:
                    copies = 2
            for _ in range(copies):
                delay = self.rng.randint(0, opts.delay_ticks_max) if not self.healed else 1
                if isinstance(envelope, Envelope):
                    delay += self._held_ticks(src, envelope)
                self.network.push(self.tick + 1 + delay, to, instance, envelope)

    def _held_ticks(self, src: int, envelope: Envelope) -> int:
        """The checks on what reaches peers, and the extra delay the adversary or the
        restore drill puts on it."""
        msg = envelope.message
        if src not in self.byzantine:
            restored = src in self.amnesiac
            self.checks.reaching_peers(src, msg, restored=restored, epoch=envelope.epoch)
        delay = 0
        if not self.healed and self.adversary.delays_victim(src, envelope.message):
            delay += self.options.victim_delay_ticks
        return delay + self.restores.held_ticks(src, envelope)

    # ------------------------------------------------------------------ actions

    def _apply(self, node: SimNode, actions: list[Action], crash_cut: int | None = None) -> None:
        """Carry out a node's actions in order, as a shell must; a crash may cut them."""
        for i, action in enumerate(actions):
            if crash_cut is not None and i >= crash_cut:
                return
            if isinstance(action, PersistSafety):
                node.disk.safety = action.state
                node.durable_epoch = action.state.epoch
            elif isinstance(action, StoreBlock):
                node.disk.blocks[action.block.hash] = action.block
            elif isinstance(action, Send):
                try:
                    check_send_allowed(action, node.durable_epoch)
                except AssertionError as err:
                    raise self.fail(f"node {node.index}: {err}") from err
                self._send(node, action)
            elif isinstance(action, Commit):
                self._commit(node, action)
        node.settle_restore()
        if node.left_epoch():
            self._apply(node, node.next_epoch())  # the change block committed

    def _send(self, node: SimNode, send: Send) -> None:
        behaviour = self.byzantine.get(node.index)
        msg = send.message
        if behaviour is None and isinstance(msg, Vote) and node.index not in self.amnesiac:
            self.checks.vote_sent(node.index, msg, node.core.epoch)
        if behaviour == "malform":
            for claimed, to, out in self.adversary.malformed(node, send):
                self._deliver_from(node.index, to, out, node.instance, claimed)
            return
        if behaviour is not None:
            for to, out in self.adversary.rewrite(node, behaviour, send):
                self._deliver_from(node.index, to, out, node.instance)
            while self.adversary.after_send:
                claimed, to, out = self.adversary.after_send.pop(0)
                self._deliver_from(node.index, to, out, node.instance, claimed)
            return
        self._deliver_from(node.index, send.to, msg)

    def _epoch_of(self, src: int, instance: int) -> int:
        """The epoch a node's messages name: its core's (the disk's may already be the
        next one while the actions of the step that ended the epoch go out)."""
        node = self.nodes[src][instance]
        return node.core.epoch if node.active else node.epoch

    def _deliver_from(
        self,
        src: int,
        to: int | None,
        msg: Message,
        src_instance: int = 0,
        claimed: int | None = None,
    ) -> None:
        """`claimed`: the sender the envelope names, when a Byzantine member lies about it
        (on the wire the authenticated stream would give it away; the core must not
        depend on that)."""
        sender = src if claimed is None else claimed
        epoch = self._epoch_of(src, src_instance)
        envelope = Envelope(self.membership.chain_id, sender, msg, epoch)
        if isinstance(msg, Proposal) and claimed is None:
            self._keep_proposal(envelope, msg)
        self._fan_out(src, src_instance, to, envelope)
        byzantine = src in self.byzantine and self.reconfigurer is not None
        if isinstance(msg, Proposal) and claimed is None and byzantine:
            self.adversary.retired_key_votes(self.nodes[src][src_instance], msg, epoch)

    def _fan_out(
        self, src: int, src_instance: int, to: int | None, parcel: Envelope | EpochDelivery
    ) -> None:
        """To `to`, or to every other node slot (members of the sender's epoch or not:
        one that is behind learns from them that an epoch ended)."""
        targets = [to] if to is not None else [i for i in range(self.options.slots) if i != src]
        for dst in targets:
            self.messages += 1
            self._enqueue(src, src_instance, dst, parcel)

    def _keep_proposal(self, envelope: Envelope, proposal: Proposal) -> None:
        """The network remembers what it carried: for the certified-block check, and to
        hand a restored victim again."""
        self.checks.blocks_by_hash.setdefault(proposal.block.hash, proposal.block)
        self.restores.keep_proposal(envelope, proposal)

    def _commit(self, node: SimNode, commit: Commit) -> None:
        epoch = node.core.epoch
        self._commit_blocks(node, commit.blocks, epoch)
        end = node.core.ended
        if end is not None and commit.blocks[-1].hash == end.boundary.hash:
            enter_epoch(node, end)  # durable with the commit (its proof proves a later block)
            self._entered(node)
        else:
            node.disk.proofs[commit.blocks[-1].height] = commit.proof

    def _commit_blocks(self, node: SimNode, blocks: Sequence[Block], epoch: int) -> None:
        disk = node.disk
        for block in blocks:
            if block.height != len(disk.committed):
                raise self.fail(
                    f"node {node.index} committed height {block.height} "
                    f"after {len(disk.committed) - 1}"
                )
            if block.parent_hash != disk.committed[-1].hash:
                raise self.fail(f"SAFETY: node {node.index} committed a block off its own chain")
            if node.index not in self.byzantine:
                self.checks.honest_commit(node.index, block, epoch)
            disk.committed.append(block)
            node.committed_txs.update(block.payload)
            disk.blocks.pop(block.hash, None)
        for h in [h for h, b in disk.blocks.items() if b.height <= len(disk.committed) - 1]:
            del disk.blocks[h]

    # ------------------------------------------------------------------ running

    def _maybe_crash(self, node: SimNode) -> int | None:
        opts = self.options
        if self.healed or opts.crash_permille == 0 or node.index in self.byzantine:
            return None
        # (Other members crash in stale-restore scenarios too: a restore's fence rests on
        # the certificates its peers persisted, not on what they remember in memory.)
        if self.rng.randrange(1000) >= opts.crash_permille:
            return None
        return 1 + self.rng.randrange(opts.crash_ticks_max)

    def _step_node(self, node: SimNode, actions_fn: str, envelope: Envelope | None) -> None:
        before = self.restores.victim_state(node)
        if envelope is not None:
            actions = node.core.on_message(envelope)
        elif actions_fn == "tick":
            actions = node.core.on_tick(self.now_ms(node.index))
        else:
            actions = node.core.on_transactions()
        if before is not None and self.restores.restore(node, before, actions):
            return
        down = self._maybe_crash(node)
        if down is not None:
            cut = self.rng.randrange(len(actions) + 1)
            self._apply(node, actions, crash_cut=cut)
            node.crash(self.tick + down)
            return
        self._apply(node, actions)
        if node.index not in self.byzantine and node.active:
            self.checks.certified(node.core.high_qc, node.core.epoch)
        if before is not None:
            node.keep_backup()
        if node.index in self.restores.redeliveries and node.instance == 0:
            self.restores.redeliver(node)

    def _deliver(self, item: InFlight) -> None:
        parcel = item.envelope
        for instance, node in enumerate(self.nodes[item.to]):
            if item.instance is not None and instance != item.instance:
                continue
            if not node.up:
                continue
            if isinstance(parcel, EpochDelivery):
                self._take_proof(node, parcel)
                continue
            envelope = parcel
            if envelope.epoch > node.epoch:
                self._ask_for_proof(node, envelope.sender)
                continue
            msg = envelope.message
            if isinstance(msg, SyncRequest):
                self._serve_sync(node, envelope, msg)
                continue
            if not node.active:
                continue
            self._step_node(node, "msg", envelope)
            if self.byzantine.get(node.index) == "double_vote":
                self.adversary.double_vote_extra(node, envelope)
            if self.byzantine.get(node.index) == "fork_leader":
                self.adversary.fork_watch(node, envelope)
            byzantine = self.reconfigurer is not None and node.index in self.byzantine
            if byzantine and isinstance(msg, Proposal):
                self.adversary.retired_key_votes(node, msg, envelope.epoch)

    def _serve_sync(self, node: SimNode, envelope: Envelope, msg: SyncRequest) -> None:
        """As the replica's shell does: members only, never ourselves. (On the wire the
        sender is the stream's authenticated one; here, as with `init --insecure`, it is
        whatever the envelope says.) An asker still in an epoch we left gets the proof
        that it ended instead (docs/consensus/epochs.md, "Catching up")."""
        asker = envelope.sender
        if not 0 <= asker < self.options.slots or asker == node.index:
            return
        if envelope.epoch < node.epoch:
            page = page_for(node, envelope.epoch, msg.from_height)
            if page is not None:
                delivery = EpochDelivery(node.index, None, page)
                self._fan_out(node.index, node.instance, asker, delivery)
                return
            proof = proof_for(node, envelope.epoch, msg.from_height)
            if proof is not None:
                self._fan_out(node.index, node.instance, asker, EpochDelivery(node.index, proof))
            return
        if node.active:
            response = build_sync_response(msg, node.disk, node.core, self.options.limits)
            self._deliver_from(node.index, asker, response, node.instance)

    def _ask_for_proof(self, node: SimNode, peer: int) -> None:
        """A message of a later epoch: ask its sender how ours ended (at most once per
        `sync_retry_ticks`), naming the first height we lack."""
        if node.asked_tick >= 0 and self.tick - node.asked_tick < SIM_LIMITS.sync_retry_ticks:
            return
        node.asked_tick = self.tick
        request = SyncRequest(len(node.disk.committed), self.options.limits.sync_blocks_max)
        self._deliver_from(node.index, peer, request, node.instance)

    def _take_proof(self, node: SimNode, delivery: EpochDelivery) -> None:
        """An epoch proof: if it holds, commit what it commits and enter the next epoch.
        A page of the old epoch's chain goes to the node's core, if it runs that epoch."""
        if delivery.proof is None:
            if delivery.page is not None and node.active and node.core.ended is None:
                self.epoch_pages += 1
                self._apply(node, node.core.catch_up_from(delivery.sender, delivery.page))
            elif delivery.page is not None and not node.active:
                followed = follow_page(node, delivery.page)
                if followed:
                    self.epoch_pages += 1
                    self._commit_blocks(node, followed, node.epoch)
                    node.asked_tick = -1  # ask for the next page (or the proof) at once
                    self._ask_for_proof(node, delivery.sender)
            return
        taken = take_proof(node, delivery.proof)
        if taken is None:
            return
        blocks, end = taken
        self._commit_blocks(node, blocks, node.epoch)
        enter_epoch(node, end)
        self._entered(node)
        node.settle_restore()
        self._apply(node, node.next_epoch())

    def _entered(self, node: SimNode) -> None:
        """A node entered the next epoch: where records are signed, its member set must
        be the one the owner's records give (`Reconfigurer.check_epoch`)."""
        if self.reconfigurer is not None and self.options.signed_records:
            self.reconfigurer.check_epoch(node.index, node.disk.membership)

    def core_started(self, node: SimNode, core: Core) -> None:
        """A core of an epoch after 0 started: it reads that epoch's records with the
        record key in force, not with a key an owner record retired."""
        if self.reconfigurer is not None:
            self.reconfigurer.check_core(core)

    def _all_nodes(self) -> list[SimNode]:
        return [node for i in range(self.options.slots) for node in self.nodes[i]]

    def add_transaction(self, tx: bytes) -> None:
        """A client's (or the owner's) transaction reaches every member's mempool."""
        self.pool.add(tx)
        for node in self._all_nodes():
            if node.up and node.active:
                self._apply(node, node.core.on_transactions())

    def _one_tick(self) -> None:
        self.tick += 1
        opts = self.options
        if self.reconfigurer is not None:
            self.reconfigurer.on_tick()
        if opts.held_member >= 0 and self.tick == opts.held_from_tick:
            # Held down until the heal restarts it, far behind (`far_behind_scenario`).
            held = self.nodes[opts.held_member][0]
            if held.up:
                held.crash(opts.ticks + 1)
        if not self.quiet and self.rng.randrange(1000) < opts.tx_per_tick_permille:
            seq = len(self.pool.txs)
            self.add_transaction(f"tx-{opts.seed}-{seq}".encode().ljust(TX_BYTES, b"."))
        due = self.network.take_due(self.tick)
        if due:
            self.rng.shuffle(due)  # reordering among messages due in the same tick
            for item in due:
                self._deliver(item)
        for node in self._all_nodes():
            if not node.up:
                if self.tick >= node.down_until:
                    # Amnesia is survivable only while enough peers remember: at most one
                    # member (the drill's stale-restore victim) ever restarts from old data.
                    stale = node.force_stale or (
                        node.index == self.honest[-1]
                        and self.rng.randrange(1000) < self.options.stale_restore_permille
                    )
                    node.force_stale = False
                    self._apply(node, node.restart(stale))
                continue
            if node.active:
                self._step_node(node, "tick", None)

    def _repartition(self) -> None:
        instances = [(node.index, node.instance) for node in self._all_nodes()]
        self.network.repartition(self.tick, instances, self.options, self.rng)

    def heal(self) -> None:
        self.healed = True
        self.network.partition = None
        for node in self._all_nodes():
            if not node.up:
                self._apply(node, node.restart())

    def run(self) -> SimResult:
        opts = self.options
        for node in self._all_nodes():
            self._apply(node, node.start())
        while self.tick < opts.ticks:
            self._repartition()
            self._one_tick()
        self.heal()
        # Liveness: every honest replica commits a block proposed after the heal.
        heal_view = max(self._view(i) for i in self._members())
        done: dict[int, int] = {}
        deadline = self.tick + opts.liveness_ticks_max
        while not set(self._members()) <= set(done) and self.tick < deadline:
            self._one_tick()
            for i in self._members():
                if i in done:
                    continue
                disk = self.nodes[i][0].disk
                if disk.committed[-1].view > heal_view:
                    done[i] = self._view(i)
        done = {i: view for i, view in done.items() if i in self._members()}
        if len(done) < len(self._members()):
            if self.faults_beyond_f():
                return self._result(0, excused=True)
            stuck = [i for i in self._members() if i not in done]
            views = {i: self._view(i) for i in self._members()}
            raise self.fail(
                f"LIVENESS: nodes {stuck} committed nothing new after the heal; views {views}"
            )
        liveness_views = max(done.values()) - heal_view
        if liveness_views > opts.liveness_views_max:
            raise self.fail(
                f"LIVENESS: {liveness_views} views after the heal before every honest node "
                f"committed (bound {opts.liveness_views_max})"
            )
        excused = not self._settle_quietly()
        if not excused and self.options.signed_records:
            newest = self._newest().epoch
            if newest != len(opts.reconfigure):
                raise self.fail(
                    f"LIVENESS: the cluster settled in epoch {newest}, but the owner signed "
                    f"{len(opts.reconfigure)} changes"
                )
        return self._result(liveness_views, excused=excused)

    def _result(self, liveness_views: int, *, excused: bool) -> SimResult:
        dropped: Counter[str] = Counter()
        for i in self._members():
            dropped.update(self.nodes[i][0].dropped)
        members = self._members()
        return SimResult(
            options=self.options,
            ticks=self.tick,
            committed_heights={i: len(self.nodes[i][0].disk.committed) - 1 for i in members},
            views={i: self._view(i) for i in members},
            dropped=dropped,
            messages=self.messages,
            liveness_views=liveness_views,
            liveness_excused=excused,
        )

    def faults_beyond_f(self) -> bool:
        """More faults than liveness tolerates: f Byzantine members, and an honest member
        restored from a backup that is still short of its fence (docs/consensus/fencing.md,
        "What it costs": it signs nothing there, and its hello needs 2f+1 answers, so it
        counts as one more fault until it is past). Safety is owed regardless, and checked
        at every step; a restore that is past its fence is held to liveness like anyone."""
        restoring = sum(
            any(node.core.restoring for node in self.nodes[i] if node.up and node.active)
            for i in self.honest
        )
        newest = self._newest()
        byzantine = sum(newest.is_member(i) for i in self.byzantine)
        return byzantine + restoring > newest.f

    def _honest_core(self, index: int) -> Core:
        return self.nodes[index][0].core

    def _members(self) -> list[int]:
        """The honest members of the newest epoch an honest node reached (without
        reconfiguration: every honest member)."""
        newest = self._newest()
        return [i for i in self.honest if newest.is_member(i)]

    def _newest(self) -> Membership:
        """The member set of the newest epoch an honest node reached."""
        return max((self.nodes[i][0].disk.membership for i in self.honest), key=_epoch)

    def _height(self, index: int) -> int:
        """A member's committed height as its core knows it (-1 while it has none)."""
        node = self.nodes[index][0]
        return node.core.committed_height if node.active else -1

    def _view(self, index: int) -> int:
        """A member's current view (0 while it has not caught up with its epoch)."""
        node = self.nodes[index][0]
        return node.core.view if node.active else 0

    def _settle_quietly(self) -> bool:
        """After liveness, no more transactions: every honest member must end quiescent
        (needing no ticks) at one committed height. One left behind, by a lost message, a
        restart or a view the others ended without it, has to catch up with nothing else
        happening, as a real cluster's last replica must when the load stops
        (tests/consensus/test_quiescence.py has the cases one by one)."""
        self.quiet = True
        deadline = self.tick + self.options.liveness_ticks_max
        while True:
            members = self._members()
            nodes = [self.nodes[i][0] for i in members]
            heights = {i: self._height(i) for i in members}
            idle = all(node.active and not node.core.needs_ticks() for node in nodes)
            if len(set(heights.values())) == 1 and idle:
                return True
            if self.tick >= deadline:
                if self.faults_beyond_f():
                    return False
                busy = [i for i in members if not self.nodes[i][0].active]
                busy += [i for i in members if i not in busy and self._honest_core(i).needs_ticks()]
                raise self.fail(
                    f"QUIET: no transactions for {self.options.liveness_ticks_max} ticks, and "
                    f"the honest members did not settle: committed heights {heights}, "
                    f"still needing ticks {busy}"
                )
            self._one_tick()


def _epoch(membership: Membership) -> int:
    return membership.epoch
