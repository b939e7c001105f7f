"""The Byzantine behaviours: what a Byzantine member sends instead of what its honest core
asked for (as relab/hotstuff's twins and Byzantine wrappers do, each overrides one thing).

`Adversary.rewrite` turns one `Send` of an honest core into what the member's behaviour
sends instead; `malformed` does so for `malform` members, whose messages also lie about
their sender; `fork_watch` and `double_vote_extra` act on what such members receive. The
behaviours are listed in `quorumgate.replica.sim.options.BEHAVIOURS`.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from quorumgate.proto.membership import Membership
from quorumgate.replica.actions import Send
from quorumgate.replica.sim.node import SimNode
from quorumgate.replica.sim.options import FAR_AHEAD_VIEWS, MALFORM_COPIES
from quorumgate.replica.sim.world import World
from quorumgate.replica.types import (
    HELLO_NONCE_BYTES,
    Block,
    Envelope,
    Hello,
    HelloReply,
    Message,
    Proposal,
    QuorumCert,
    RemoteError,
    SyncRequest,
    SyncResponse,
    Timeout,
    TimeoutCert,
    Vote,
    proposal_bytes,
    timeout_bytes,
    vote_bytes,
)


class Adversary:
    """The Byzantine members of one simulation, acting on its network and with its keys.
    It draws from the simulation's one random generator, so a seed replays it exactly.
    (It sends through `Simulation._deliver_from`, looked up on each call, so that a test
    which records what the network carries sees what Byzantine members send too.)"""

    def __init__(self, sim: World) -> None:
        self.sim = sim
        self.forge_seq = 0
        self.fork_pending: dict[int, Proposal] = {}
        self.forks_made = 0
        self.retired_voted: set[tuple[int, bytes]] = set()  # (epoch, block) voted for
        # (epoch, view) -> the one member shown the first block of a split
        # (`_split_with_retired_keys`), and the retired keys' votes to send it once the
        # split's proposals are out: (claimed voter, to, vote)
        self.split_views: dict[tuple[int, int], int] = {}
        self.after_send: list[tuple[int, int, Message]] = []
        # (epoch, view) -> the honest timeouts seen for it, by voter
        self.fork_timeouts: dict[tuple[int, int], dict[int, Timeout]] = {}
        # The victim leads three views after a fork_leader, so the two views between can
        # extend a fork while the victim's word is delayed.
        self.fork_leaders = [i for i, b in sim.byzantine.items() if b == "fork_leader"]
        self.fork_victim = (self.fork_leaders[0] + 3) % sim.options.n if self.fork_leaders else -1

    def delays_victim(self, src: int, msg: Message) -> bool:
        """The network adversary's target: the victim's votes and timeouts around a view
        that a fork_leader leads (from two views before it to three after) arrive late."""
        if src != self.fork_victim or not self.fork_leaders:
            return False
        if not isinstance(msg, Vote | Timeout):
            return False
        view = msg.view
        n = self.sim.options.n
        return any((view - lead) % n in (n - 2, n - 1, 0, 1, 2, 3) for lead in self.fork_leaders)

    def _sign(self, index: int, message: bytes) -> bytes:
        return self.sim.signers[index].sign(message)

    @staticmethod
    def _signed(node: SimNode, message: bytes) -> bytes:
        """Signed with the key `node` holds in the epoch it runs (the first epoch's key
        until the member set changes: docs/consensus/epochs.md)."""
        return node.signer.sign(message)

    @staticmethod
    def _members(node: SimNode) -> Membership:
        """The member set of the epoch `node` runs: whose leader order, keys and quorum
        the boundary behaviours (`BOUNDARY_BEHAVIOURS`) follow."""
        return node.core.membership

    def rewrite(
        self, node: SimNode, behaviour: str, send: Send
    ) -> list[tuple[int | None, Message]]:
        msg = send.message
        if behaviour == "silent_leader" and isinstance(msg, Proposal):
            return []
        if behaviour == "bad_signatures":
            bad = bytes(64)
            if isinstance(msg, Vote):
                return [(send.to, replace(msg, signature=bad))]
            if isinstance(msg, Timeout):
                return [(send.to, replace(msg, signature=bad))]
            if isinstance(msg, Proposal):
                return [(send.to, replace(msg, signature=bad))]
        if behaviour == "equivocate" and isinstance(msg, Proposal):
            return self._equivocate(node, msg)
        if behaviour == "equivocate" and isinstance(msg, Vote) and self.split_views:
            target = self.split_views.get((self._members(node).epoch, msg.view))
            if target is not None:  # its vote for the first block goes where that did
                return [(target, msg)]
        if behaviour == "double_vote" and isinstance(msg, Vote):
            return [(send.to, msg)]
        if behaviour == "fork_leader":
            return self._fork_leader(node, send)
        if behaviour == "twins" and node.instance and node.signer.public_key != node.first_key:
            return self._old_key_twin(node, send)
        if behaviour == "forge_certs":
            return [(send.to, msg), *self._forgeries(node)]
        return [(send.to, msg)]

    def _equivocate(self, node: SimNode, msg: Proposal) -> list[tuple[int | None, Message]]:
        """Two blocks for one view, each to half the others (one member shown both), and a
        vote for the second one to everyone; in an epoch where the adversary holds an
        honest member's retired key, the split that key makes count
        (`_split_with_retired_keys`)."""
        members = self._members(node)
        chain, sid = members.chain_id, members.signing_id
        me = node.index
        block = msg.block
        alt = Block.create(
            chain,
            block.parent_hash,
            block.view,
            block.height,
            block.justify,
            block.timestamp_ms + 1,
            block.proposer,
            tuple(reversed(block.payload))[:-1] if block.payload else (),
            block.state_root_height,
            block.state_root,
        )
        alt_prop = Proposal(alt, self._signed(node, proposal_bytes(sid, alt.view, alt.hash)))
        others = [i for i in range(members.n) if i != me]
        self.sim.rng.shuffle(others)
        alt_vote = Vote(
            alt.view,
            alt.height,
            alt.hash,
            me,
            self._signed(node, vote_bytes(sid, alt.view, alt.height, alt.hash)),
        )
        split = self._split_with_retired_keys(node, msg, alt_prop, others)
        if split:
            return [*split, *((i, alt_vote) for i in others if i != split[0][0])]
        half = len(others) // 2
        out: list[tuple[int | None, Message]] = [(i, msg) for i in others[:half]]
        out += [(i, alt_prop) for i in others[half:]]
        # One member of the first half sees both: a replica must vote for one only.
        out += [(others[0], alt_prop)] if half else []
        # and vote for the alternative too
        out += [(None, alt_vote)]
        return out

    def _split_with_retired_keys(
        self, node: SimNode, msg: Proposal, alt: Proposal, others: list[int]
    ) -> list[tuple[int | None, Message]]:
        """With the retired key of an honest member (`retired_key_votes`), equivocate
        where it tells: the first block to one honest member that holds no retired key,
        with this member's vote and the retired keys' votes for it (to that member only),
        and the second to everyone else, with this member's vote for it. Counting a
        retired key then certifies both blocks of one view; counting only the epoch's
        keys, the first gathers too few votes. Empty: no such key in this epoch."""
        members = self._members(node)
        byzantine = self.sim.byzantine
        retired = [(i, k) for i, k in retired_keys(node, members) if i not in byzantine]
        holders = {i for i, _ in retired}
        targets = [i for i in others if i not in holders and i not in byzantine]
        if not retired or not targets:
            return []
        target, block = targets[0], msg.block
        self.split_views[(members.epoch, block.view)] = target
        self.retired_voted.update({(members.epoch, block.hash), (members.epoch, alt.block.hash)})
        statement = vote_bytes(members.signing_id, block.view, block.height, block.hash)
        for index, key in retired:
            sig = self.sim.key_signers[key].sign(statement)
            vote = Vote(block.view, block.height, block.hash, index, sig)
            self.after_send.append((index, target, vote))
        return [(target, msg), *((i, alt) for i in others if i != target)]

    def _fork_leader(self, node: SimNode, send: Send) -> list[tuple[int | None, Message]]:
        """Lead a fork in the views the team forks, and keep the victim alone able to
        certify the block just before one."""
        msg = send.message
        me = node.index
        members = self._members(node)
        if isinstance(msg, Proposal) and not self._forks_in(members, msg.block.view):
            return [(send.to, msg)]  # a teammate forked the view before: extend it
        if isinstance(msg, Proposal):
            fork = self._fork_block(node, msg)
            if fork is None:
                return [(send.to, msg)]
            self.fork_pending[me] = fork  # sent once a TC for the view before admits it
            return []
        if isinstance(msg, Timeout | TimeoutCert):
            return []  # its certificates would tell the others what the victim knows
        if isinstance(msg, Vote) and self._forks_in(members, msg.view):
            return []  # its vote goes to the fork, not to the block it replaced
        # Withhold the vote for the block just before a view the team forks from all but
        # the victim: only the victim can then certify it (and commit). Every member of the
        # team does, or the others' votes certify it anyway.
        if isinstance(msg, Vote) and self._forks_in(members, msg.view + 1):
            return [(self.fork_victim, msg)]
        return [(send.to, msg)]

    def _old_key_twin(self, node: SimNode, send: Send) -> list[tuple[int | None, Message]]:
        """Twins across a boundary: instance 0 of a rotated or replaced member takes its
        new key, instance 1 (its old machine) keeps the key it first held and signs what
        its core asks for with that one. What it cannot sign without the new key (hellos,
        and certificates that carry its own signature) it does not send."""
        msg = send.message
        sid = self._members(node).signing_id
        old = self.sim.key_signers[node.first_key or node.signer.public_key]
        if isinstance(msg, Vote):
            statement = vote_bytes(sid, msg.view, msg.height, msg.block_hash)
            return [(send.to, replace(msg, signature=old.sign(statement)))]
        if isinstance(msg, Timeout):
            statement = timeout_bytes(sid, msg.view, msg.high_qc.view)
            return [(send.to, replace(msg, signature=old.sign(statement)))]
        if isinstance(msg, Proposal):
            statement = proposal_bytes(sid, msg.block.view, msg.block.hash)
            return [(send.to, replace(msg, signature=old.sign(statement)))]
        if isinstance(msg, Hello | HelloReply | TimeoutCert):
            return []
        return [(send.to, msg)]

    def malformed(self, node: SimNode, send: Send) -> list[tuple[int, int | None, Message]]:
        """What a `malform` member sends for one message: the message itself half the
        time, `MALFORM_COPIES` mutations of it, each in its own name or another's, and now
        and then a catch-up answer or a hello reply nobody asked for."""
        rng, n, me = self.sim.rng, self.sim.options.n, node.index
        out: list[tuple[int, int | None, Message]] = []
        if rng.randrange(2):
            out.append((me, send.to, send.message))
        for _ in range(MALFORM_COPIES):
            try:
                mutated = self._mutate(node, send.message)
            except (RemoteError, ValueError, OverflowError):
                continue  # a shape the wire codec could not even carry
            claimed = me if rng.randrange(3) else rng.choice((*range(n), n, n + 7))
            out.append((claimed, send.to if rng.randrange(2) else None, mutated))
        core = node.core
        if rng.randrange(8) == 0:
            poison = SyncResponse((), (), core.high_qc, (), 10**12)
            out.append((me, rng.randrange(n), poison))
        if rng.randrange(8) == 0:
            asker = rng.randrange(n)
            nonce = bytes(rng.getrandbits(8) for _ in range(HELLO_NONCE_BYTES))
            reply = HelloReply(0, core.view, core.high_qc, None, asker, nonce, bytes(64))
            out.append((rng.choice((me, asker, (asker + 1) % n)), asker, reply))
        return out

    def _mutate(self, node: SimNode, msg: Message) -> Message:
        rng = self.sim.rng
        chain, me = self.sim.membership.chain_id, node.index
        garbage = bytes(rng.getrandbits(8) for _ in range(64))
        pick = rng.randrange(6)
        if isinstance(msg, Vote):
            if pick < 2:
                return replace(msg, view=msg.view + FAR_AHEAD_VIEWS * pick, signature=garbage)
            if pick == 2:
                return replace(msg, block_hash=garbage[:32])
            if pick == 3:  # stale, and genuinely signed
                view = max(1, msg.view - 5)
                return replace(
                    msg,
                    view=view,
                    signature=self._sign(me, vote_bytes(chain, view, msg.height, msg.block_hash)),
                )
            return replace(msg, height=2**62)
        if isinstance(msg, Timeout):
            if pick < 3:
                return replace(msg, high_qc=_mutated_qc(msg.high_qc, pick, garbage))
            return replace(msg, view=msg.view + FAR_AHEAD_VIEWS, signature=garbage)
        if isinstance(msg, TimeoutCert):
            if pick < 3:
                return replace(msg, signatures=msg.signatures[:1])
            return replace(msg, high_qc=_mutated_qc(msg.high_qc, pick, garbage))
        if isinstance(msg, Proposal):
            return self._mutated_proposal(node, msg, pick, garbage)
        if isinstance(msg, SyncRequest):
            return replace(msg, from_height=2**62, max_blocks=rng.choice((0, 2**31)))
        if isinstance(msg, SyncResponse):
            return replace(msg, proof=(), committed=msg.committed[:1])
        if isinstance(msg, Hello):
            return replace(msg, signature=garbage)
        if isinstance(msg, HelloReply):
            return replace(msg, last_signed_view=0, signature=garbage)
        return msg

    def _mutated_proposal(
        self, node: SimNode, msg: Proposal, pick: int, garbage: bytes
    ) -> Proposal:
        """Mutation `pick` of a proposal; `garbage`: 64 random bytes."""
        chain, me = self.sim.membership.chain_id, node.index
        block = msg.block

        def rebuilt(**changes: Any) -> Block:
            fields: dict[str, Any] = {
                "parent_hash": block.parent_hash,
                "view": block.view,
                "height": block.height,
                "justify": block.justify,
                "timestamp_ms": block.timestamp_ms,
                "proposer": block.proposer,
                "payload": block.payload,
                "state_root_height": block.state_root_height,
                "state_root": block.state_root,
            }
            fields.update(changes)
            return Block.create(chain, **fields)

        def signed(b: Block) -> Proposal:
            return Proposal(b, self._sign(me, proposal_bytes(chain, b.view, b.hash)))

        if pick == 0:
            return replace(msg, signature=garbage)
        if pick == 1:  # the payload changed under the signature
            return replace(msg, block=rebuilt(payload=(*block.payload, garbage)))
        if pick == 2:  # genuinely signed, on a broken certificate
            return signed(rebuilt(justify=_mutated_qc(block.justify, pick, garbage)))
        if pick == 3:  # far ahead, genuinely signed, on a parent nobody holds
            return signed(rebuilt(parent_hash=garbage[:32], view=block.view + FAR_AHEAD_VIEWS))
        if pick == 4:
            return signed(rebuilt(timestamp_ms=2**62))
        return signed(rebuilt(state_root_height=block.height + 50, state_root=garbage[:32]))

    def _forgeries(self, node: SimNode) -> list[tuple[int | None, Message]]:
        """Certificates no honest member signed, pointing far ahead and at fake blocks."""
        self.forge_seq += 1
        if self.forge_seq % 7:
            return []
        chain = self.sim.membership.chain_id
        me = node.index
        core = node.core
        fake_hash = hashlib.sha256(b"fake" + self.forge_seq.to_bytes(8, "big")).digest()
        view = core.view + 1 + self.sim.rng.randrange(5)
        my_sig = self._sign(me, vote_bytes(chain, view, core.committed_height + 5, fake_hash))
        forged: list[QuorumCert] = []
        q = self.sim.membership.quorum
        # under-signed: only my signature
        forged.append(QuorumCert(view, core.committed_height + 5, fake_hash, ((me, my_sig),)))
        # enough signers, but only mine is real
        sigs = tuple(sorted((i, my_sig if i == me else bytes(64)) for i in range(q)))
        forged.append(QuorumCert(view, core.committed_height + 5, fake_hash, sigs))
        # a non-member signer
        sigs2 = tuple(sorted([(me, my_sig), *((self.sim.options.n + k, my_sig) for k in range(q))]))
        forged.append(QuorumCert(view, core.committed_height + 5, fake_hash, sigs2))
        out: list[tuple[int | None, Message]] = []
        for qc in forged:
            t_sig = self._sign(me, timeout_bytes(chain, view + 1, qc.view))
            out.append((None, Timeout(view + 1, qc, me, t_sig)))
        tc_sigs = tuple(
            sorted(
                (
                    i,
                    core.high_qc.view,
                    bytes(64)
                    if i != me
                    else self._sign(me, timeout_bytes(chain, view, core.high_qc.view)),
                )
                for i in range(q)
            )
        )
        out.append((None, TimeoutCert(view, core.high_qc, tc_sigs)))
        # a proposal from a fake parent, justified by a forged QC (sent if we lead that view)
        if self.sim.membership.leader(view + 1) == me:
            fake_parent_qc = forged[1]
            block = Block.create(
                chain,
                fake_hash,
                view + 1,
                fake_parent_qc.height + 1,
                fake_parent_qc,
                self.sim.now_ms(me),
                me,
                (),
                0,
                b"",
            )
            sig = self._sign(me, proposal_bytes(chain, block.view, block.hash))
            out.append((None, Proposal(block, sig)))
        return out

    def _forks_in(self, members: Membership, view: int) -> bool:
        """The `fork_leader` members act as one team: a view one of them leads is forked
        unless a teammate led the view before it (then it extends that fork, which needs a
        child in the next view to commit). `members`: the epoch's, whose leader order
        counts."""
        leader = members.leader
        return leader(view) in self.fork_leaders and leader(view - 1) not in self.fork_leaders

    def _fork_block(self, node: SimNode, honest: Proposal) -> Proposal | None:
        """The same view, but extending the QC three (or, every other time, two) blocks
        below the highest: a sibling of the block the victim alone has seen committed (or
        would have, under a 2-chain commit rule)."""
        members = self._members(node)
        chain = members.chain_id
        tree = node.core.tree
        qc = honest.block.justify
        disk = node.disk

        def find(block_hash: bytes, height: int) -> Block | None:
            found = tree.get(block_hash) or disk.blocks.get(block_hash)
            if found is None and height < len(disk.committed):
                found = disk.committed[height]
            return found if found is not None and found.hash == block_hash else None

        self.forks_made += 1
        for _ in range(3 if self.forks_made % 2 else 2):
            block = find(qc.block_hash, qc.height)
            if block is None or block.height == 0:
                return None
            qc = block.justify
        parent = find(qc.block_hash, qc.height)
        if parent is None:
            return None
        me = node.index
        view = honest.block.view
        block = Block.create(
            chain,
            parent.hash,
            view,
            parent.height + 1,
            qc,
            max(self.sim.now_ms(me), parent.timestamp_ms + 1),
            me,
            (),
            parent.state_root_height,
            parent.state_root,
        )
        sig = self._signed(node, proposal_bytes(members.signing_id, view, block.hash))
        return Proposal(block, sig, honest.high_tc)

    def fork_watch(self, node: SimNode, envelope: Envelope) -> None:
        """Vote for every block, and once honest members give up on the view before a
        pending fork, sign a timeout too and send the fork with the TC that admits it."""
        msg = envelope.message
        me = node.index
        if not node.active:
            return  # the message ended its epoch, and it is no member of the next
        members = self._members(node)
        chain = members.signing_id
        if isinstance(msg, Proposal):
            block = msg.block
            sig = self._signed(node, vote_bytes(chain, block.view, block.height, block.hash))
            vote = Vote(block.view, block.height, block.hash, me, sig)
            to = self.fork_victim if self._forks_in(members, block.view + 1) else None
            self.sim._deliver_from(me, to, vote, node.instance)
            return
        fork = self.fork_pending.get(me)
        if not isinstance(msg, Timeout) or fork is None or msg.view != fork.block.view - 1:
            return
        statement = timeout_bytes(chain, msg.view, msg.high_qc.view)
        if not members.is_member(msg.voter):
            return
        if not self.sim.verify_fn(members.key(msg.voter), statement, msg.signature):
            return  # another Byzantine member's forgery: a TC built on it would be forged too
        seen = self.fork_timeouts.setdefault((members.epoch, msg.view), {})
        seen[msg.voter] = msg
        if len(seen) + 1 < members.quorum:
            return
        timeouts = list(seen.values())[: members.quorum - 1]
        high = max((t.high_qc for t in timeouts), key=lambda q: q.view)
        mine = Timeout(
            msg.view, high, me, self._signed(node, timeout_bytes(chain, msg.view, high.view))
        )
        signers = sorted([*timeouts, mine], key=lambda t: t.voter)
        tc = TimeoutCert(
            msg.view, high, tuple((t.voter, t.high_qc.view, t.signature) for t in signers)
        )
        block = fork.block
        if block.justify.view >= tc.view:
            return
        del self.fork_pending[me]
        self.sim._deliver_from(me, None, Proposal(block, fork.signature, tc), node.instance)
        # and vote for it, to everyone
        sig = self._signed(node, vote_bytes(chain, block.view, block.height, block.hash))
        self.sim._deliver_from(me, None, Vote(block.view, block.height, block.hash, me, sig))

    def retired_key_votes(self, node: SimNode, proposal: Proposal, epoch: int) -> None:
        """The keys honest members were rotated or replaced away from are the
        adversary's (the reason to rotate a key is that it may have leaked): for every
        block of a later epoch that a Byzantine member proposes or receives, a vote signed
        with each of them in the name of the member that held it, in that epoch, once.
        Only the keys of the epoch a signature names count (docs/consensus/epochs.md,
        "Signatures name their epoch"), so honest members drop these; a core that still
        counted a retired key would take them as the votes of one more faulty member
        than f."""
        block = proposal.block
        if not node.active or epoch != node.core.epoch or epoch == 0:
            return
        if (epoch, block.hash) in self.retired_voted:
            return
        self.retired_voted.add((epoch, block.hash))
        members = self._members(node)
        statement = vote_bytes(members.signing_id, block.view, block.height, block.hash)
        for index, key in retired_keys(node, members):
            if index in self.sim.byzantine:
                continue  # a Byzantine member's votes are its own already
            sig = self.sim.key_signers[key].sign(statement)
            vote = Vote(block.view, block.height, block.hash, index, sig)
            for to in range(members.n):
                if to not in (index, node.index):  # its holder would see its own name
                    self.sim._deliver_from(node.index, to, vote, node.instance, claimed=index)

    def double_vote_extra(self, node: SimNode, envelope: Envelope) -> None:
        """A `double_vote` member also signs every proposal it receives, rules or not."""
        msg = envelope.message
        if not isinstance(msg, Proposal):
            return
        chain = self.sim.membership.chain_id
        block = msg.block
        sig = self._sign(node.index, vote_bytes(chain, block.view, block.height, block.hash))
        vote = Vote(block.view, block.height, block.hash, node.index, sig)
        self.sim._deliver_from(node.index, None, vote, node.instance)


def retired_keys(node: SimNode, members: Membership) -> list[tuple[int, bytes]]:
    """(member, key) for each key a member of `members` held in an epoch before it, by
    the member sets `node` made durable, oldest first."""
    out: list[tuple[int, bytes]] = []
    for earlier, _ in node.disk.starts:
        if earlier.epoch >= members.epoch:
            break
        for member in earlier.members:
            index, key = member.index, member.public_key
            retired = members.is_member(index) and members.key(index) != key
            if retired and (index, key) not in out:
                out.append((index, key))
    return out


def _mutated_qc(qc: QuorumCert, pick: int, garbage: bytes) -> QuorumCert:
    """Mutation `pick` of a certificate: under-signed, one signature garbled, or far ahead."""
    if pick == 0:
        return replace(qc, signatures=qc.signatures[:1])  # under-signed
    if pick == 1 and qc.signatures:
        signer, _ = qc.signatures[0]
        return replace(qc, signatures=((signer, garbage), *qc.signatures[1:]))
    return replace(qc, view=qc.view + FAR_AHEAD_VIEWS)
