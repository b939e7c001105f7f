"""The tool-executor side (issue 6, item 3): run a call only with a certificate for it, and
open only the envelopes that call carries and that are sealed to this sink.

    executor = Executor(spec, "payments", sink_private_key, CertifiedLogSource(spec, auditor_key))
    call = executor.verify(certificate, proposal_id=pid, tool="pay",
                           target="https://bank.example/transfer", transaction=tx)
    card_number = executor.open_envelope(call, "card")

`verify` checks, offline and in this order: the certificate itself
(`quorumgate.sidecar.receipts.verify_certificate`: chain, Merkle path, f+1 distinct members' receipt
keys, the proposal id); that it certifies a tool call (a proposal, or the Confirm that
settled one); that the outcome is allow or flag; that the certified target digest is the
digest of `"<tool> <target>"` the executor is about to act on; that a confirmation card,
when the verdict names one, is that card (digest) and binds the transaction's body; and
that the transaction, when given, is signed, has the certified proposal id and names the
same tool. Anything else is refused with a typed `ExecutorRefused`.

Which envelopes a call may open comes from the card (bound by the certificate) or from the
signed transaction, whose body must hash to the digest the certificate binds: the card's
`body_digest` for a confirmed call, the receipt leaf's `body_digest` for a direct one. So an
agent cannot sign a second body under the same nonce naming other handles: the certificate
names the one body that was committed and judged. `require_bound_arguments=True` refuses
to open envelopes for a call whose arguments no certificate binds.

The sealed values come from the SealEnvelope transactions in the committed log. No sidecar
RPC serves them yet, so a `SealedValueSource` is pluggable:

- `CertifiedLogSource` replays the committed log locally (`quorumgate.sdk.client.CommittedLog`) up
  to the certificate's height and accepts the local state only if its state root equals
  the certified one: the ciphertext it returns is the one f+1 sidecars signed (handles are
  never changed once registered);
- `EngineSource` reads an `Engine` the caller runs (tests, in-process executors).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, SealedBox
from nacl.signing import SigningKey

from quorumgate.proto import names
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.model import Outcome, Proposal
from quorumgate.proto.tx import TxRejected, parse
from quorumgate.sdk.client import ClusterUnavailable, CommittedLog, decode_card, load_certificate
from quorumgate.sidecar.engine.core import Engine
from quorumgate.sidecar.engine.statements import ConfirmationCard, target_digest
from quorumgate.sidecar.engine.targets import canonical_call
from quorumgate.sidecar.receipts import (
    Certificate,
    CertificateError,
    ReceiptLeaf,
    verify_certificate,
)

__all__ = [
    "AuthorizedCall",
    "CertificateRejected",
    "CertifiedLogSource",
    "EngineSource",
    "EnvelopeUnopenable",
    "Executor",
    "ExecutorRefused",
    "HandleRefused",
    "NotAllowed",
    "SealedValueSource",
    "WrongCall",
]

CALL_KINDS = ("proposal", "confirm")


class ExecutorRefused(Exception):
    """The executor will not run the call or open the envelope; `reason` says why. The
    text names the rule only, never an argument value or a plaintext."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"executor refused: {reason}")
        self.reason = reason


class CertificateRejected(ExecutorRefused):
    """The certificate does not verify against the cluster file."""


class NotAllowed(ExecutorRefused):
    """A valid certificate whose verdict is not allow or flag (deny, pending...)."""


class WrongCall(ExecutorRefused):
    """A valid certificate for something else: another proposal, tool, target or body."""


class HandleRefused(ExecutorRefused):
    """A handle the certified call does not carry, or not sealed to this sink."""


class EnvelopeUnopenable(ExecutorRefused):
    """The sealed value does not open with this sink's key."""


class SealedValueSource(Protocol):
    def sealed_value(self, handle: str, sink: str, certificate: Certificate) -> bytes | None:
        """The ciphertext of `handle` sealed to `sink`, as of the certified state."""
        ...


@dataclass(frozen=True, repr=False)
class AuthorizedCall:
    """A call the executor verified. `handles` maps argument name to handle."""

    proposal_id: bytes
    tool: str
    target: str
    outcome: Outcome
    certificate: Certificate
    handles: tuple[tuple[str, str], ...] = field(default=())
    bound_by: str = "none"  # "card", "leaf", "transaction" or "none": what binds `handles`

    @property
    def flagged(self) -> bool:
        return self.outcome is Outcome.FLAG

    def __repr__(self) -> str:
        return (
            f"AuthorizedCall(tool={self.tool!r}, proposal={self.proposal_id.hex()[:16]}, "
            f"outcome={self.outcome.value}, envelopes={len(self.handles)})"
        )


class Executor:
    """One sink's executor: its id, its X25519 private key, and where sealed values come
    from. Holds no secret but the key; returns plaintexts to the caller only."""

    def __init__(
        self,
        spec: ClusterSpec,
        sink_id: str,
        private_key: PrivateKey,
        source: SealedValueSource,
        *,
        require_bound_arguments: bool = False,
    ) -> None:
        if not names.is_agent_id(sink_id):
            raise ValueError("sink id must match " + names.AGENT_ID_RE.pattern)
        self.spec = spec
        self.sink_id = sink_id
        self._box = SealedBox(private_key)
        self.public_key = bytes(private_key.public_key)
        self.source = source
        self.require_bound_arguments = require_bound_arguments

    def __repr__(self) -> str:
        return f"Executor(sink={self.sink_id!r})"

    def verify(
        self,
        certificate: Certificate | bytes,
        *,
        proposal_id: bytes,
        tool: str,
        target: str,
        transaction: bytes | None = None,
        card: ConfirmationCard | bytes | None = None,
    ) -> AuthorizedCall:
        """The module docstring's checks; `target` is the canonical target the executor
        acts on (`"-"` for a tool that takes none)."""
        if isinstance(certificate, bytes):
            try:
                certificate = load_certificate(certificate)
            except Exception as err:
                raise CertificateRejected("malformed") from err
        leaf = self._leaf(certificate, proposal_id)
        if leaf.kind not in CALL_KINDS:
            raise WrongCall("not_a_tool_call")
        if not leaf.allows:
            raise NotAllowed(leaf.outcome)
        if leaf.target_digest != target_digest(canonical_call(tool, target)):
            raise WrongCall("target_mismatch")
        bound_card = self._card(leaf, card, tool)
        handles: tuple[tuple[str, str], ...] = ()
        bound_by = "none"
        if transaction is not None:
            handles, leaf_bound = self._transaction_handles(
                transaction, proposal_id, tool, bound_card, leaf
            )
            bound_by = "leaf" if leaf_bound else "transaction"
        if bound_card is not None:
            handles = bound_card.handles
            bound_by = "card"
        return AuthorizedCall(
            proposal_id=proposal_id,
            tool=tool,
            target=target,
            outcome=Outcome(leaf.outcome),
            certificate=certificate,
            handles=handles,
            bound_by=bound_by,
        )

    def _leaf(self, certificate: Certificate, proposal_id: bytes) -> ReceiptLeaf:
        try:
            return verify_certificate(
                certificate, self.spec.chain_id, self.spec.receipt_keys, proposal_id=proposal_id
            )
        except CertificateError as err:
            raise CertificateRejected(err.reason) from err

    def _card(
        self, leaf: ReceiptLeaf, card: ConfirmationCard | bytes | None, tool: str
    ) -> ConfirmationCard | None:
        if not leaf.card_digest:
            if card is not None:
                raise WrongCall("card_not_certified")
            return None
        if card is None:
            return None
        if isinstance(card, bytes):
            try:
                card = decode_card(card)
            except Exception as err:
                raise WrongCall("card_mismatch") from err
        if card.digest != leaf.card_digest or card.tool != tool:
            raise WrongCall("card_mismatch")
        if card.proposal_id != leaf.proposal_id or card.chain_id != self.spec.chain_id:
            raise WrongCall("card_mismatch")
        return card

    def _transaction_handles(
        self,
        transaction: bytes,
        proposal_id: bytes,
        tool: str,
        card: ConfirmationCard | None,
        leaf: ReceiptLeaf,
    ) -> tuple[tuple[tuple[str, str], ...], bool]:
        try:
            parsed = parse(transaction, verify=True)
        except TxRejected as err:
            raise WrongCall("transaction_invalid") from err
        if parsed.tx_id != proposal_id or parsed.body.chain_id != self.spec.chain_id:
            raise WrongCall("transaction_mismatch")
        payload = parsed.body.payload
        if not isinstance(payload, Proposal) or names.canonical_tool_name(payload.tool) != tool:
            raise WrongCall("transaction_mismatch")
        digest = hashlib.sha256(parsed.signed.body).digest()
        if card is not None and digest != card.body_digest:
            raise WrongCall("transaction_mismatch")
        leaf_bound = leaf.tx_id == proposal_id and bool(leaf.body_digest)
        if leaf_bound and digest != leaf.body_digest:
            raise WrongCall("transaction_mismatch")
        out = []
        for arg in payload.arguments:
            name = names.canonical_argument_name(arg.name)
            if arg.handle is not None and name is not None:
                out.append((name, arg.handle))
        return tuple(sorted(out)), leaf_bound

    def open_envelope(self, call: AuthorizedCall, argument: str) -> bytes:
        """The plaintext of the handle the certified call passes as `argument`."""
        name = names.canonical_argument_name(argument)
        handle = next((h for n, h in call.handles if n == name), None)
        if handle is None:
            raise HandleRefused("not_in_call")
        return self.open_handle(call, handle)

    def open_handle(self, call: AuthorizedCall, handle: str) -> bytes:
        """The plaintext of `handle`, if the certified call carries it and it is sealed to
        this sink."""
        if handle not in {h for _, h in call.handles}:
            raise HandleRefused("not_in_call")
        if self.require_bound_arguments and call.bound_by not in ("card", "leaf"):
            raise HandleRefused("arguments_not_bound")
        ciphertext = self.source.sealed_value(handle, self.sink_id, call.certificate)
        if ciphertext is None:
            raise HandleRefused("not_sealed_to_sink")
        try:
            return bytes(self._box.decrypt(ciphertext))
        except CryptoError:
            raise EnvelopeUnopenable("does_not_open") from None

    def open_all(self, call: AuthorizedCall) -> dict[str, bytes]:
        """Every envelope of the call, by argument name."""
        return {name: self.open_handle(call, handle) for name, handle in call.handles}


class EngineSource:
    """Sealed values from an engine the caller runs and trusts."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def sealed_value(self, handle: str, sink: str, certificate: Certificate) -> bytes | None:
        return self.engine.sealed_value(handle, sink)


class CertifiedLogSource:
    """Sealed values from a local replay of the committed log, accepted only when the
    replayed state root at the certificate's height equals the certified state root."""

    def __init__(
        self,
        spec: ClusterSpec,
        reader: SigningKey | None = None,
        log: CommittedLog | None = None,
    ) -> None:
        """`reader`: a key allowed to read the committed log — an auditor's, whom the
        owner lists with `quorumgate admin add-auditor` (or pass a `log` built with one)."""
        if log is None:
            if reader is None:
                raise ValueError("a CertifiedLogSource needs a reader key (an auditor's) or a log")
            log = CommittedLog(spec, reader)
        self.log = log

    def sealed_value(self, handle: str, sink: str, certificate: Certificate) -> bytes | None:
        height = certificate.leaf.height
        if self.log.height < height:
            try:
                self.log.advance(to_height=height)
            except ClusterUnavailable as err:
                raise HandleRefused("log_unavailable") from err
        root = self.log.state_root_at(height)
        if root is None:
            raise HandleRefused("state_not_retained")
        if root != certificate.state_root:
            raise HandleRefused("state_root_mismatch")
        return self.log.engine.sealed_value(handle, sink)
