"""Structure-aware fuzzing of the consensus core (docs/consensus/protocol.md, "Fuzzing").

`Core.on_message` promises that whatever a peer sends, it either acts on a well-formed
message or counts it in `dropped`; nothing escapes it. This module holds it to that: for
each message kind it generates messages from a seed — valid ones, then mutated: fields
malformed, truncated, oversized, stale, far in the future, with forged or duplicated
signatures, from a spoofed or non-member sender, for another chain, or copies of earlier
ones — and feeds them to cores in the states where each kind matters (a core waiting for
a sync answer, a core fencing after a restart, a core in the middle of a view). A message
the wire codec itself could not build (a `RemoteError` from a type's own checks) counts
as refused on arrival.

    python scripts/fuzz_core.py --per-kind 100000      # prints any failing seed

Everything is derived from the seed: a failure names the kind and the seed that
reproduces it.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from quorumgate.proto.crypto import Signer, Verifier
from quorumgate.proto.membership import Member, Membership
from quorumgate.replica.config import Limits
from quorumgate.replica.core import Core
from quorumgate.replica.sim.crypto import FastKeys
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
    genesis_block,
    genesis_qc,
    hello_bytes,
    hello_reply_bytes,
    proposal_bytes,
    timeout_bytes,
    vote_bytes,
)

KINDS = (
    "proposal",
    "vote",
    "timeout",
    "timeout_cert",
    "sync_request",
    "sync_response",
    "hello",
    "hello_reply",
)
N = 4
CHAIN = "fuzz-chain"
START_MS = 1_000_000
FUZZ_LIMITS = Limits(
    view_timeout_ticks_base=10,
    view_timeout_ticks_max=40,
    idle_propose_ticks=2,
    sync_blocks_max=8,
    sync_bytes_max=64 * 1024,
    sync_retry_ticks=4,
    pending_blocks_max=16,
    batch_txs_max=8,
    batch_bytes_max=4096,
    tx_bytes_max=1024,
)
CORES_PER_KIND = 8  # fresh cores per kind, so that state reached by one run is not all
# One message in REPLAY_ONE_IN is a copy of one of the last REPLAY_WINDOW of its kind,
# from its sender or another (the copies a core must recognise before checking them).
REPLAY_ONE_IN = 8
REPLAY_WINDOW = 16


class FuzzFailure(AssertionError):
    pass


@dataclass
class FuzzReport:
    kind: str
    seed: int
    messages: int = 0
    refused_on_arrival: int = 0  # the codec could not have built it
    replayed: int = 0  # copies of earlier messages
    dropped: Counter[str] = field(default_factory=Counter)
    acted_on: int = 0


class World:
    """Keys, a chain of genuinely certified blocks, and builders for every message."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        keys = FastKeys()
        self.verify = keys.verify
        self.signers: list[Signer] = [
            keys.signer(hashlib.sha256(f"fuzz/{i}".encode()).digest()) for i in range(N)
        ]
        self.outsider = keys.signer(b"fuzz/outsider")
        self.membership = Membership(
            CHAIN, tuple(Member(i, self.signers[i].public_key) for i in range(N))
        )
        self.blocks = [genesis_block(CHAIN)]
        for view in range(1, 9):
            self.blocks.append(self.block(self.blocks[-1], view))

    # ------------------------------------------------------------------ honest pieces

    def sign(self, who: int, message: bytes) -> bytes:
        return (self.outsider if who < 0 else self.signers[who]).sign(message)

    def qc(self, block: Block, voters: tuple[int, ...] = (0, 1, 2)) -> QuorumCert:
        if block.height == 0:
            return genesis_qc(CHAIN)
        sigs = tuple(
            (v, self.sign(v, vote_bytes(CHAIN, block.view, block.height, block.hash)))
            for v in voters
        )
        return QuorumCert(block.view, block.height, block.hash, sigs)

    def block(
        self, parent: Block, view: int, payload: tuple[bytes, ...] = (), ts: int | None = None
    ) -> Block:
        return Block.create(
            CHAIN,
            parent.hash,
            view,
            parent.height + 1,
            self.qc(parent),
            START_MS + view if ts is None else ts,
            view % N,
            payload,
            parent.state_root_height,
            parent.state_root,
        )

    def proposal(self, block: Block, signer: int | None = None) -> Proposal:
        who = block.proposer if signer is None else signer
        return Proposal(block, self.sign(who, proposal_bytes(CHAIN, block.view, block.hash)))

    def vote(self, voter: int, block: Block) -> Vote:
        sig = self.sign(voter, vote_bytes(CHAIN, block.view, block.height, block.hash))
        return Vote(block.view, block.height, block.hash, voter, sig)

    def timeout(self, voter: int, view: int, high_qc: QuorumCert) -> Timeout:
        return Timeout(
            view, high_qc, voter, self.sign(voter, timeout_bytes(CHAIN, view, high_qc.view))
        )

    def tc(
        self, view: int, high_qc: QuorumCert, voters: tuple[int, ...] = (0, 1, 2)
    ) -> TimeoutCert:
        sigs = tuple(
            (v, high_qc.view, self.sign(v, timeout_bytes(CHAIN, view, high_qc.view)))
            for v in voters
        )
        return TimeoutCert(view, high_qc, sigs)

    def hello(self, sender: int, nonce: bytes) -> Hello:
        return Hello(nonce, self.sign(sender, hello_bytes(CHAIN, sender, nonce)))

    def hello_reply(
        self, replier: int, asker: int, nonce: bytes, last: int, view: int, qc: QuorumCert
    ) -> HelloReply:
        statement = hello_reply_bytes(CHAIN, replier, asker, nonce, last, view)
        return HelloReply(last, view, qc, None, asker, nonce, self.sign(replier, statement))

    # ------------------------------------------------------------------ mutations

    def some_bytes(self, length: int | None = None) -> bytes:
        rng = self.rng
        size = length if length is not None else rng.choice((0, 1, 31, 32, 33, 63, 64, 65))
        return bytes(rng.getrandbits(8) for _ in range(size))

    def some_int(self) -> int:
        """Mostly small values near where a cluster is; sometimes the edges of u32/u64."""
        rng = self.rng
        if rng.randrange(10) < 7:
            return rng.randrange(20)
        return rng.choice((255, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1)) + rng.choice(
            (0, 0, 0, -1, 1)
        )

    def sender(self, natural: int) -> int:
        """The member such a message comes from, mostly; else anyone, a non-member, or the
        receiver itself (a spoofed envelope)."""
        rng = self.rng
        if rng.randrange(10) < 6:
            return natural
        senders: tuple[int, ...] = (*range(N), N, N + 5, -1, 2**31)
        return rng.choice(senders)

    def any_block(self) -> Block:
        return self.rng.choice(self.blocks[1:])

    def mutate_qc(self, qc: QuorumCert) -> QuorumCert:
        rng = self.rng
        choice = rng.randrange(7)
        if choice == 0:  # forged signatures
            return replace(qc, signatures=tuple((s, self.some_bytes(64)) for s, _ in qc.signatures))
        if choice == 1:  # a signer repeated (the type refuses it: refused on arrival)
            first = qc.signatures[0] if qc.signatures else (0, self.some_bytes(64))
            return replace(qc, signatures=(first, first, *qc.signatures[1:]))
        if choice == 2:  # under-signed
            return replace(qc, signatures=qc.signatures[:1])
        if choice == 3:  # a non-member signer
            return replace(qc, signatures=((*qc.signatures[:2], (N + 3, self.some_bytes(64)))))
        if choice == 4:  # wrong view or height for its block
            return replace(qc, view=self.some_int(), height=self.some_int())
        if choice == 5:  # a hash of no block
            return replace(qc, block_hash=self.some_bytes(32))
        return qc


Generator = Callable[[World, Core], Message]


def _gen_proposal(w: World, core: Core) -> Message:
    rng = w.rng
    parent = rng.choice(w.blocks[: max(1, len(w.blocks) - 1)])
    above = max(parent.view + 1, core.view)
    view = rng.choice((above, above, above, above + 1, parent.view + 1, 0, w.some_int()))
    payload: tuple[bytes, ...] = ()
    shape = rng.randrange(10)  # 6..9: no mutation of the block itself
    if shape == 0:
        payload = tuple(w.some_bytes(rng.choice((1, 100, 2000))) for _ in range(rng.randrange(12)))
    block = Block.create(
        CHAIN if shape != 1 else "other-chain",
        parent.hash if shape != 2 else w.some_bytes(32),
        view,
        parent.height + 1 if shape != 3 else w.some_int(),
        w.qc(parent) if shape != 4 else w.mutate_qc(w.qc(parent)),
        rng.choice((START_MS + view, 0, 2**62, START_MS - 10**7)),
        view % N if shape != 5 else rng.randrange(N),
        payload,
        rng.choice((0, 0, 1, w.some_int())),
        rng.choice((b"", w.some_bytes(32))),
    )
    signer = rng.choice(
        (block.proposer, block.proposer, block.proposer, -1, (block.proposer + 1) % N)
    )
    proposal = w.proposal(block, signer)
    if rng.randrange(4) == 0:
        proposal = replace(proposal, signature=w.some_bytes())
    if rng.randrange(5) == 0:
        proposal = replace(proposal, high_tc=w.tc(view - 1, w.qc(parent)))
    return proposal


def _gen_vote(w: World, core: Core) -> Message:
    rng = w.rng
    block = w.any_block()
    voter = rng.choice((*range(N), N, -1))
    vote = w.vote(voter if voter >= 0 else 0, block) if voter < N else w.vote(0, block)
    shape = rng.randrange(6)
    if shape == 0:
        vote = replace(vote, signature=w.some_bytes())
    elif shape == 1:
        vote = replace(vote, view=rng.choice((core.view, core.view + 100, w.some_int())))
    elif shape == 2:
        vote = replace(vote, block_hash=w.some_bytes())
    elif shape == 3:
        vote = replace(vote, voter=w.some_int())
    elif shape == 4:
        vote = replace(vote, height=w.some_int())
    return vote


def _gen_timeout(w: World, core: Core) -> Message:
    rng = w.rng
    block = w.any_block()
    view = rng.choice((core.view, core.view + 1, block.view + 1, 0, w.some_int()))
    voter = rng.randrange(N)
    qc = w.qc(block) if rng.randrange(3) else w.mutate_qc(w.qc(block))
    timeout = Timeout(view, qc, voter, w.sign(voter, timeout_bytes(CHAIN, view, qc.view)))
    shape = rng.randrange(5)
    if shape == 0:
        timeout = replace(timeout, signature=w.some_bytes())
    elif shape == 1:
        timeout = replace(timeout, voter=w.some_int())
    elif shape == 2:
        timeout = replace(timeout, high_tc=w.tc(view - 1, qc))
    return timeout


def _gen_tc(w: World, core: Core) -> Message:
    rng = w.rng
    block = w.any_block()
    view = rng.choice((core.view, core.view + 1, block.view + 1, w.some_int()))
    voters = rng.choice(((0, 1, 2), (0, 1), (0, 1, 2, 3), (1, 2, 3)))
    qc = w.qc(block) if rng.randrange(3) else w.mutate_qc(w.qc(block))
    tc = w.tc(view, qc, voters)
    shape = rng.randrange(5)
    if shape == 0:
        tc = replace(tc, signatures=tuple((s, v, w.some_bytes(64)) for s, v, _ in tc.signatures))
    elif shape == 1:
        tc = replace(tc, signatures=tuple((s, w.some_int(), sig) for s, _, sig in tc.signatures))
    elif shape == 2:
        tc = replace(tc, signatures=tc.signatures + tc.signatures[:1])
    return tc


def _gen_sync_request(w: World, core: Core) -> Message:
    rng = w.rng
    return SyncRequest(
        w.some_int(), w.some_int(), rng.choice((b"", w.some_bytes(32), w.any_block().hash))
    )


def _gen_sync_response(w: World, core: Core) -> Message:
    rng = w.rng
    blocks = w.blocks[1:]
    cut = rng.randrange(len(blocks) - 1)
    committed = tuple(blocks[:cut])
    proof = tuple(blocks[cut : cut + rng.choice((0, 1, 2, 2, 2, 3))])
    pending = tuple(rng.sample(blocks, rng.randrange(3))) if rng.randrange(3) == 0 else ()
    qc_target = proof[-1] if proof and rng.randrange(2) else rng.choice(blocks)
    proof_qc = rng.choice((None, w.qc(qc_target), w.qc(qc_target), w.mutate_qc(w.qc(qc_target))))
    shape = rng.randrange(8)
    if shape == 0:  # oversized
        committed = tuple(blocks) * rng.choice((1, 4))
    elif shape == 1:  # out of order
        committed = tuple(reversed(committed))
    elif shape == 2:  # fat blocks
        parent = w.blocks[0]
        fat = [w.block(parent, 1, payload=(b"x" * 1000,) * 8)]
        committed = tuple(fat)
    return SyncResponse(committed, proof, proof_qc, pending, w.some_int())


def _gen_hello(w: World, core: Core) -> Message:
    rng = w.rng
    sender = rng.randrange(N)
    hello = w.hello(sender, w.some_bytes(HELLO_NONCE_BYTES))
    if rng.randrange(3) == 0:
        hello = replace(hello, nonce=w.some_bytes())
    if rng.randrange(3) == 0:
        hello = replace(hello, signature=w.some_bytes())
    return hello


def _gen_hello_reply(w: World, core: Core) -> Message:
    rng = w.rng
    replier = rng.randrange(N)
    nonce = rng.choice((core.hello_nonce, w.some_bytes(HELLO_NONCE_BYTES), w.some_bytes()))
    asker = rng.choice((core.me, core.me, rng.randrange(N), w.some_int()))
    block = w.any_block()
    qc = w.qc(block) if rng.randrange(3) else w.mutate_qc(w.qc(block))
    reply = w.hello_reply(replier, core.me, nonce, w.some_int(), w.some_int(), qc)
    if rng.randrange(3) == 0:
        reply = replace(reply, asker=asker)
    if rng.randrange(3) == 0:
        reply = replace(reply, signature=w.some_bytes())
    return reply


GENERATORS: dict[str, Generator] = {
    "proposal": _gen_proposal,
    "vote": _gen_vote,
    "timeout": _gen_timeout,
    "timeout_cert": _gen_tc,
    "sync_request": _gen_sync_request,
    "sync_response": _gen_sync_response,
    "hello": _gen_hello,
    "hello_reply": _gen_hello_reply,
}


def _natural_sender(message: Message, core: Core) -> int:
    """Who would send this message: the proposer, the voter, the peer asked for a sync..."""
    if isinstance(message, Proposal):
        return message.block.proposer
    if isinstance(message, Vote | Timeout):
        return message.voter
    if isinstance(message, SyncResponse):
        return core.view % N
    return (core.me + 1) % N


def _core(w: World, me: int, fencing: bool, restored: bool = False) -> Core:
    core = Core(
        w.membership,
        me,
        w.signers[me],
        limits=FUZZ_LIMITS,
        verifier=Verifier(FUZZ_LIMITS.verified_cache_max, w.verify),
        now_ms=START_MS + 5,
        fence_on_start=fencing,
        restored=restored,
    )
    core.start()
    return core


def _await_sync(w: World, core: Core) -> None:
    """Put `core` in the state where a sync response is read: a timeout certificate takes
    it to a view another member leads, whose valid proposal names a parent the core does
    not hold, so it asks that leader for blocks."""
    view = core.view + 3
    if view % N == core.me:
        view += 1
    helper = (core.me + 1) % N
    core.on_message(Envelope(CHAIN, helper, w.tc(view - 1, genesis_qc(CHAIN))))
    unknown_parent = w.block(w.blocks[2], view - 1)
    block = w.block(unknown_parent, view)
    core.on_message(Envelope(CHAIN, view % N, w.proposal(block)))


def fuzz_kind(kind: str, seed: int, messages: int) -> FuzzReport:
    """Feed `messages` generated messages of `kind` to a few cores; raise `FuzzFailure`
    (naming the seed) for anything escaping `Core.on_message`."""
    rng = random.Random(f"{kind}/{seed}")
    w = World(rng)
    report = FuzzReport(kind, seed)
    generate = GENERATORS[kind]
    per_core = max(1, messages // CORES_PER_KIND)
    for c in range(CORES_PER_KIND):
        me = c % N
        fencing = kind == "hello_reply" or c % 3 == 0
        core = _core(w, me, fencing, restored=fencing and c % 2 == 1)  # (a declared restore)
        recent: deque[Message] = deque(maxlen=REPLAY_WINDOW)
        for k in range(per_core):
            if k % 50 == 0:
                core.on_tick(START_MS + 10 * k)
                if kind == "sync_response":
                    _await_sync(w, core)
            if recent and rng.randrange(REPLAY_ONE_IN) == 0:
                message = rng.choice(recent)
                report.replayed += 1
            else:
                try:
                    message = generate(w, core)
                except (RemoteError, OverflowError, struct.error):
                    # Values the wire cannot carry (a u64 out of range, a type's own
                    # checks): the codec could not have built it, so no core sees it.
                    report.refused_on_arrival += 1
                    continue
                recent.append(message)
            sender = w.sender(_natural_sender(message, core))
            chain = CHAIN if rng.randrange(10) else "other-chain"
            before = sum(core.dropped.values())
            try:
                core.on_message(Envelope(chain, sender, message))
            except Exception as err:
                raise FuzzFailure(
                    f"{kind} message #{report.messages} escaped Core.on_message: "
                    f"{type(err).__name__}: {err}; reproduce with fuzz_kind({kind!r}, "
                    f"seed={seed}, messages={messages})"
                ) from err
            report.messages += 1
            if sum(core.dropped.values()) == before:
                report.acted_on += 1
        report.dropped.update(core.dropped)
        core.on_tick(START_MS + 10 * per_core + 10)  # and the core still ticks
    return report
