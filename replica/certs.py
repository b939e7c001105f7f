"""Checks of every signed thing a peer can send: votes, timeouts, proposals, QCs and TCs.

A certificate is valid only with a quorum of valid signatures from distinct members over
the exact statement it claims (docs/consensus/messages.md). Whatever fails raises
`RemoteError` with a reason the core counts; valid certificates are remembered in the
verifier's bounded cache.
"""

from __future__ import annotations

from quorumgate.proto.canonical import Encoder
from quorumgate.proto.crypto import Verifier
from quorumgate.proto.domains import SIG_CACHE, TC_CACHE
from quorumgate.proto.membership import Membership
from quorumgate.replica.types import (
    Block,
    Hello,
    HelloReply,
    Proposal,
    QuorumCert,
    RemoteError,
    Timeout,
    TimeoutCert,
    Vote,
    genesis_qc,
    hello_bytes,
    hello_reply_bytes,
    proposal_bytes,
    timeout_bytes,
    vote_bytes,
)


class CertificateChecker:
    __slots__ = ("_genesis_qc", "membership", "verifier")

    def __init__(
        self, membership: Membership, verifier: Verifier, start: QuorumCert | None = None
    ) -> None:
        """`start`: the unsigned certificate this epoch starts from (replica/epochs.py
        `start_qc`); the genesis QC unless the chain reconfigured."""
        self.membership = membership
        self.verifier = verifier
        self._genesis_qc = start or genesis_qc(membership.chain_id)

    def _signer_key(self, signer: int) -> bytes:
        if not self.membership.is_member(signer):
            raise RemoteError("non_member", f"signer {signer} is not a member")
        return self.membership.key(signer)

    def check_qc(self, qc: QuorumCert) -> None:
        if not qc.signatures:
            if qc != self._genesis_qc:
                raise RemoteError("bad_certificate", "unsigned qc that is not the epoch's start")
            return
        if len(qc.signatures) < self.membership.quorum:
            raise RemoteError(
                "bad_certificate",
                f"qc for view {qc.view} has {len(qc.signatures)} signatures, "
                f"quorum is {self.membership.quorum}",
            )
        digest = qc.digest()
        if self.verifier.known(digest):
            return
        message = vote_bytes(self.membership.signing_id, qc.view, qc.height, qc.block_hash)
        for signer, sig in qc.signatures:
            key = self._signer_key(signer)
            # Votes are broadcast, so most of a QC's signatures were checked here already,
            # one by one as votes: a signature is verified once per replica.
            seen = _signature_digest(signer, message, sig)
            if self.verifier.known(seen):
                continue
            if not self.verifier.verify(key, message, sig):
                raise RemoteError("bad_certificate", f"qc view {qc.view}: bad signature")
            self.verifier.remember(seen)
        self.verifier.remember(digest)

    def check_tc(self, tc: TimeoutCert) -> None:
        if len(tc.signatures) < self.membership.quorum:
            raise RemoteError(
                "bad_certificate",
                f"tc for view {tc.view} has {len(tc.signatures)} signatures, "
                f"quorum is {self.membership.quorum}",
            )
        self.check_qc(tc.high_qc)
        enc = Encoder(TC_CACHE).u64(tc.view).raw(tc.high_qc.digest())
        for signer, hqc_view, sig in tc.signatures:
            enc.u32(signer).u64(hqc_view).raw(sig)
        digest = enc.digest()
        if self.verifier.known(digest):
            return
        chain = self.membership.signing_id
        for signer, hqc_view, sig in tc.signatures:
            key = self._signer_key(signer)
            # A TC is made of timeouts, which are broadcast: as with a QC's votes, most of
            # its signatures were checked here already, one by one.
            message = timeout_bytes(chain, tc.view, hqc_view)
            seen = _signature_digest(signer, message, sig)
            if self.verifier.known(seen):
                continue
            if not self.verifier.verify(key, message, sig):
                raise RemoteError("bad_certificate", f"tc view {tc.view}: bad signature")
            self.verifier.remember(seen)
        self.verifier.remember(digest)

    def check_hello(self, sender: int, hello: Hello) -> None:
        key = self._signer_key(sender)
        message = hello_bytes(self.membership.signing_id, sender, hello.nonce)
        if not self.verifier.verify(key, message, hello.signature):
            raise RemoteError("bad_signature", f"hello from {sender}")

    def check_hello_reply(self, sender: int, reply: HelloReply) -> None:
        key = self._signer_key(sender)
        message = hello_reply_bytes(
            self.membership.signing_id,
            sender,
            reply.asker,
            reply.nonce,
            reply.last_signed_view,
            reply.view,
        )
        if not self.verifier.verify(key, message, reply.signature):
            raise RemoteError("bad_signature", f"hello reply from {sender}")

    def check_vote(self, vote: Vote) -> None:
        key = self._signer_key(vote.voter)
        message = vote_bytes(self.membership.signing_id, vote.view, vote.height, vote.block_hash)
        seen = _signature_digest(vote.voter, message, vote.signature)
        if self.verifier.known(seen):
            return  # the same vote again (re-sent), or its signature seen in a QC
        if not self.verifier.verify(key, message, vote.signature):
            raise RemoteError("bad_signature", f"vote for view {vote.view} by {vote.voter}")
        self.verifier.remember(seen)

    def check_timeout(self, timeout: Timeout) -> None:
        key = self._signer_key(timeout.voter)
        if timeout.high_qc.view >= timeout.view:
            raise RemoteError("malformed", "timeout high qc not below its view")
        message = timeout_bytes(self.membership.signing_id, timeout.view, timeout.high_qc.view)
        seen = _signature_digest(timeout.voter, message, timeout.signature)
        if not self.verifier.known(seen):
            if not self.verifier.verify(key, message, timeout.signature):
                raise RemoteError(
                    "bad_signature", f"timeout for view {timeout.view} by {timeout.voter}"
                )
            self.verifier.remember(seen)
        self.check_qc(timeout.high_qc)
        if timeout.high_tc is not None:
            self.check_tc(timeout.high_tc)

    def check_proposal(self, proposal: Proposal) -> None:
        block = proposal.block
        if block.chain_id != self.membership.chain_id:
            raise RemoteError("wrong_chain", "block for another chain")
        if block.proposer != self.membership.leader(block.view):
            raise RemoteError(
                "not_leader", f"proposer {block.proposer} does not lead view {block.view}"
            )
        key = self._signer_key(block.proposer)
        message = proposal_bytes(self.membership.signing_id, block.view, block.hash)
        if not self.verifier.verify(key, message, proposal.signature):
            raise RemoteError("bad_signature", f"proposal for view {block.view}")
        self.check_qc(block.justify)
        if proposal.high_tc is not None:
            self.check_tc(proposal.high_tc)

    def check_block_certified(self, block: Block, qc: QuorumCert) -> None:
        """`qc` certifies `block`: it names the block's hash, view and height, and is valid."""
        if qc.block_hash != block.hash or qc.view != block.view or qc.height != block.height:
            raise RemoteError("bad_certificate", f"qc view {qc.view} does not certify {block!r}")
        self.check_qc(qc)


def _signature_digest(signer: int, message: bytes, signature: bytes) -> bytes:
    """The cache key of one signature found valid: who signed, exactly what, and the
    signature's bytes (a different signature over the same statement is checked anew)."""
    return Encoder(SIG_CACHE).u32(signer).blob(message).raw(signature).digest()
