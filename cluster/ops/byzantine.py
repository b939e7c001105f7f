"""A Byzantine replica, for drills and tests only (docs/drills.md, the `byzantine` drill).

    QUORUMGATE_BYZANTINE=forged-hello,silent python -m quorumgate.ops.byzantine --dir D --node I

It is a real replica of member I — its own keys, its own store, an honest core inside — whose
process attacks the other members with what only a member can send: messages on peer
streams it opened with its own valid signed statement, inside the pinned TLS. Nothing in a
production path imports this module, and `quorumgate up` never starts it; the drill
`quorumgate drill byzantine` does.

The attacks, named in `QUORUMGATE_BYZANTINE` (comma-separated):

- `poison-sync`: every catch-up request it is asked is answered with the response that
  used to kill an honest core (no committed blocks, no proof, a real QC, a committed height
  far ahead), and every `ATTACK_PERIOD_S` each peer gets such answers unasked, in
  variants (a proof without its QC, blocks that do not chain).
- `forged-hello`: replies to hellos nobody sent, for every peer as the asker: ones naming
  another member as their sender (safety Rule 6 counts repliers), its own with a forged
  signature, and its own properly signed but for a nonce that was never asked; plus hellos
  with forged signatures.
- `oversized-sync`: catch-up answers larger than the transport takes (over
  `GRPC_MESSAGE_BYTES_MAX`, sent on a stream that lets them out) and ones just inside it
  full of blocks that do not decode, every `OVERSIZED_PERIOD_S`.
- `spoofed`: votes and timeouts naming other members as sender or signer, its own with
  forged signatures, proposals for views far ahead, messages of another chain.
- `silent`: it sends none of its own proposals, votes, timeouts or hello replies, so the
  others must make progress with the 2f+1 honest members alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from collections import Counter

from quorumgate.proto import consensus_pb2 as pb
from quorumgate.proto.clusterfile import ClusterFileError, ClusterSpec, read_seed
from quorumgate.proto.crypto import Ed25519Signer
from quorumgate.replica.actions import Send
from quorumgate.replica.node import CONSENSUS_KEY_FILE, ReplicaNode
from quorumgate.replica.transport import PeerLink
from quorumgate.replica.types import (
    HELLO_NONCE_BYTES,
    Envelope,
    HelloReply,
    Proposal,
    SyncResponse,
    Timeout,
    TimeoutCert,
    Vote,
)
from quorumgate.replica.wire import envelope_to_pb
from quorumgate.runtime.channels import aio_channel
from quorumgate.runtime.links import GRPC_MESSAGE_BYTES_MAX
from quorumgate.runtime.process import process_main

ATTACK_ENV = "QUORUMGATE_BYZANTINE"
ATTACKS = ("poison-sync", "forged-hello", "oversized-sync", "spoofed", "silent")
ATTACK_PERIOD_S = 0.25
OVERSIZED_PERIOD_S = 2.0  # one over-the-limit answer per peer: each costs ~33 MB of TLS
OVERSIZED_BYTES = GRPC_MESSAGE_BYTES_MAX + 1024 * 1024
JUNK_SYNC_BYTES = 4 * 1024 * 1024  # inside the limit, blocks that do not decode
JUNK_BLOCK_BYTES = 64 * 1024
FAR_AHEAD_VIEWS = 1_000_000
FORGED = bytes(64)

log = logging.getLogger("quorumgate.byzantine")


def attacks_from_env() -> tuple[str, ...]:
    wanted = tuple(a for a in os.environ.get(ATTACK_ENV, "").split(",") if a)
    unknown = [a for a in wanted if a not in ATTACKS]
    if unknown:
        raise ClusterFileError(f"{ATTACK_ENV}: unknown attack {unknown[0]!r}; one of {ATTACKS}")
    return wanted


class ByzantineReplica(ReplicaNode):
    def __init__(
        self, spec: ClusterSpec, index: int, signer: Ed25519Signer, attacks: tuple[str, ...]
    ) -> None:
        super().__init__(spec, index, signer)
        self.attacks = attacks
        self.sent: Counter[str] = Counter()  # attack messages handed to a link, by kind
        self._big_links: dict[int, PeerLink] = {}

    async def start(self) -> None:
        await super().start()
        if "oversized-sync" in self.attacks:
            raised = (
                ("grpc.max_send_message_length", OVERSIZED_BYTES * 2),
                ("grpc.max_receive_message_length", OVERSIZED_BYTES * 2),
            )
            for m in self.spec.members:
                if m.index == self.index:
                    continue
                link = PeerLink(
                    m.index,
                    functools.partial(aio_channel, self.spec, m.index, "replica", options=raised),
                    lambda: None,
                    functools.partial(self.peers._stream_metadata, m.index),
                )
                link.start()
                self._big_links[m.index] = link
        self.failstop.spawn(self._attack_loop(), "attack")
        log.info("event=byzantine_start node=%d attacks=%s", self.index, ",".join(self.attacks))

    async def stop(self) -> None:
        for link in self._big_links.values():
            await link.stop()
        await super().stop()

    # ------------------------------------------------------------------ what it withholds

    def _send(self, send: Send) -> None:
        if "silent" in self.attacks and isinstance(
            send.message, Proposal | Vote | Timeout | TimeoutCert | HelloReply
        ):
            self.sent["withheld"] += 1
            return
        super()._send(send)

    async def _answer_sync(self, envelope: Envelope) -> None:
        if "poison-sync" not in self.attacks:
            await super()._answer_sync(envelope)
            return
        self._emit(envelope.sender, self._poison(), "poison_sync_answer")

    # ------------------------------------------------------------------ what it sends

    async def _attack_loop(self) -> None:
        tick = 0
        every_oversized = max(1, round(OVERSIZED_PERIOD_S / ATTACK_PERIOD_S))
        while True:
            await asyncio.sleep(ATTACK_PERIOD_S)
            tick += 1
            peers = [m.index for m in self.spec.members if m.index != self.index]
            for peer in peers:
                if "poison-sync" in self.attacks:
                    self._poison_round(peer)
                if "forged-hello" in self.attacks:
                    self._hello_round(peer)
                if "spoofed" in self.attacks:
                    self._spoof_round(peer)
                if "oversized-sync" in self.attacks and tick % every_oversized == 1:
                    self._oversized_round(peer)
            if tick % 40 == 0:
                counts = " ".join(f"{k}={v}" for k, v in sorted(self.sent.items()))
                log.info("event=byzantine_sent %s", counts)

    def _emit(self, peer: int, message: pb.ConsensusMessage, kind: str) -> None:
        self.peers.send(peer, message)
        self.sent[kind] += 1

    def _envelope(self, message: object, sender: int | None = None) -> pb.ConsensusMessage:
        sender = self.index if sender is None else sender
        return envelope_to_pb(Envelope(self.spec.chain_id, sender, message))  # type: ignore[arg-type]

    def _poison(self) -> pb.ConsensusMessage:
        core = self.core
        assert core is not None
        return self._envelope(SyncResponse((), (), core.high_qc, (), 10**12))

    def _poison_round(self, peer: int) -> None:
        core = self.core
        assert core is not None
        self._emit(peer, self._poison(), "poison_sync")
        # A proof without the QC that certifies it.
        message = self._poison()
        message.sync_response.ClearField("proof_qc")
        message.sync_response.proof.add().view = core.view
        self._emit(peer, message, "poison_sync")
        # Committed blocks that do not chain onto anything.
        message = self._poison()
        block = message.sync_response.committed.add()
        block.parent_hash = os.urandom(32)
        block.height = 10**9
        block.view = 10**9
        self._emit(peer, message, "poison_sync")

    def _hello_round(self, peer: int) -> None:
        core = self.core
        assert core is not None
        nonce = os.urandom(HELLO_NONCE_BYTES)
        reply = HelloReply(0, core.view, core.high_qc, None, peer, nonce, FORGED)
        for other in self.spec.members:
            if other.index not in (self.index, peer):
                # Another member's name on our stream: dropped as spoofed.
                self._emit(peer, self._envelope(reply, sender=other.index), "hello_spoofed")
        self._emit(peer, self._envelope(reply), "hello_forged_signature")
        # Our own, properly signed, for a start the peer never made.
        signed = core.safety.sign_hello_reply(peer, nonce, 0, core.view, core.high_qc, None)
        self._emit(peer, self._envelope(signed), "hello_unasked")
        hello = pb.ConsensusMessage(chain_id=self.spec.chain_id, sender=self.index)
        hello.hello.nonce = nonce
        hello.hello.signature = FORGED
        self._emit(peer, hello, "hello_forged")

    def _spoof_round(self, peer: int) -> None:
        core = self.core
        assert core is not None
        target = core.high_qc
        for other in self.spec.members:
            if other.index in (self.index, peer):
                continue
            vote = Vote(core.view, target.height + 1, os.urandom(32), other.index, FORGED)
            self._emit(peer, self._envelope(vote, sender=other.index), "vote_spoofed_sender")
            self._emit(peer, self._envelope(vote), "vote_spoofed_voter")
        own = Vote(core.view + FAR_AHEAD_VIEWS, 1, os.urandom(32), self.index, FORGED)
        self._emit(peer, self._envelope(own), "vote_forged_far_ahead")
        timeout = Timeout(core.view, target, self.index, FORGED)
        self._emit(peer, self._envelope(timeout), "timeout_forged")
        other_chain = self._envelope(own)
        other_chain.chain_id = "qg-another-chain"
        self._emit(peer, other_chain, "wrong_chain")
        proposal = pb.ConsensusMessage(chain_id=self.spec.chain_id, sender=self.index)
        proposal.proposal.block.view = core.view + FAR_AHEAD_VIEWS
        proposal.proposal.block.proposer = self.index
        proposal.proposal.block.parent_hash = os.urandom(32)
        proposal.proposal.signature = FORGED
        self._emit(peer, proposal, "proposal_far_ahead")

    def _oversized_round(self, peer: int) -> None:
        junk = pb.ConsensusMessage(chain_id=self.spec.chain_id, sender=self.index)
        for _ in range(JUNK_SYNC_BYTES // JUNK_BLOCK_BYTES):
            junk.sync_response.committed.add().payload.append(os.urandom(JUNK_BLOCK_BYTES))
        self._emit(peer, junk, "sync_junk")
        big = pb.ConsensusMessage(chain_id=self.spec.chain_id, sender=self.index)
        chunk = bytes(JUNK_BLOCK_BYTES * 16)
        for _ in range(OVERSIZED_BYTES // len(chunk) + 1):
            big.sync_response.committed.add().payload.append(chunk)
        link = self._big_links.get(peer)
        if link is not None:
            link.send(big)
            self.sent["sync_oversized"] += 1


async def make_byzantine(spec: ClusterSpec, index: int) -> ReplicaNode:
    seed = read_seed(spec.node_dir(index) / CONSENSUS_KEY_FILE)
    return ByzantineReplica(spec, index, Ed25519Signer(seed), attacks_from_env())


def main(argv: list[str] | None = None) -> int:
    return process_main(
        argv,
        kind="replica",
        description="Run a Byzantine replica (drills and tests only).",
        make=make_byzantine,
    )


if __name__ == "__main__":
    sys.exit(main())
