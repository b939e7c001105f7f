"""The values a QuorumGate client hands back: what was submitted, what was certified.

`Submitted` (a transaction a replica admitted), `Decision` (a certified verdict), `OpenCard`
(a confirmation card waiting for this key's answer), `Grant` (a delegation, with the run it
is for) and `Handle` (a sealed envelope's name). None of them ever prints an argument value
or a reason code: what an agent may be shown is in docs/engine.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quorumgate.proto.model import Outcome, TxKind
from quorumgate.sidecar.engine.statements import ConfirmationCard
from quorumgate.sidecar.receipts import Certificate
from quorumgate.sidecar.wire import encode_certificate

__all__ = ["Decision", "Grant", "Handle", "OpenCard", "Submitted", "grant_id"]


class Handle(str):
    """An envelope handle (`h_<kind>_<16 hex>`): passed as a handle argument, not as text."""

    __slots__ = ()


@dataclass(frozen=True, repr=False)
class Submitted:
    """A transaction the cluster admitted. `tx` (the signed bytes) may hold argument
    values, so it is never printed."""

    proposal_id: bytes
    nonce: int
    kind: TxKind
    signer: bytes
    tx: bytes = field(repr=False)

    def __repr__(self) -> str:
        return (
            f"Submitted(proposal={self.proposal_id.hex()[:16]}, nonce={self.nonce}, "
            f"kind={self.kind.value})"
        )

    __str__ = __repr__


@dataclass(frozen=True, repr=False)
class Grant:
    """A delegation grant as `Client.delegate` returns it: the grant id (the Delegate's
    transaction id, 32 bytes) and the run the grant is for. Pass it as `grant=` (or
    `parent_grant=`) and the client acts in that run, whatever run label it is given. A
    plain 32-byte id works there too, with the grant's run id as `run_id`. `grant_id` (or
    `bytes(grant)`) is the id where bytes are wanted."""

    grant_id: bytes
    run_id: str

    def __bytes__(self) -> bytes:
        return self.grant_id

    def __repr__(self) -> str:
        return f"Grant({self.grant_id.hex()[:16]}.., run={self.run_id!r})"


def grant_id(grant: Grant | bytes) -> bytes:
    """The grant id a transaction carries, from a `Grant` or a plain id."""
    return grant.grant_id if isinstance(grant, Grant) else bytes(grant)


@dataclass(frozen=True, repr=False)
class OpenCard:
    """An open confirmation card the caller alone may answer (`Client.pending`): the card
    f+1 sidecars returned byte for byte, and every argument's value read from the signed
    proposal the card binds (`card_values`). `render()` is what a person should see."""

    card: ConfirmationCard
    values: tuple[tuple[str, str], ...]
    sidecars: tuple[int, ...]

    @property
    def proposal_id(self) -> bytes:
        return self.card.proposal_id

    def render(self) -> str:
        return self.card.render(self.values)

    def __repr__(self) -> str:
        return f"OpenCard(tool={self.card.tool!r}, proposal={self.proposal_id.hex()[:16]})"


@dataclass(frozen=True)
class Decision:
    """A certified verdict: f+1 sidecars signed it, and `verify_certificate` checked it
    against the cluster file. `card` is the confirmation card of a pending call (checked
    against the certified card digest). `reason` is for operators only: it is in neither
    `str()` nor `repr()`."""

    proposal_id: bytes
    certificate: Certificate
    card: ConfirmationCard | None = None

    @property
    def outcome(self) -> Outcome:
        return Outcome(self.certificate.leaf.outcome)

    @property
    def reason(self) -> str:
        """Operator-only reason code (docs/engine.md); never show it to an agent."""
        return self.certificate.leaf.reason

    @property
    def allowed(self) -> bool:
        """The call may run: allow, or flag (an allow recorded as a finding)."""
        return self.certificate.leaf.allows

    @property
    def pending(self) -> bool:
        return self.outcome is Outcome.PENDING

    @property
    def kind(self) -> str:
        return self.certificate.leaf.kind

    @property
    def tx_id(self) -> bytes:
        """The transaction the verdict came from: a Confirm's, once a pending call is settled."""
        return self.certificate.leaf.tx_id

    @property
    def height(self) -> int:
        return self.certificate.leaf.height

    @property
    def signers(self) -> tuple[int, ...]:
        return self.certificate.signers

    @property
    def target_digest(self) -> bytes:
        return self.certificate.leaf.target_digest

    @property
    def mandate_version(self) -> int:
        return self.certificate.leaf.mandate_version

    @property
    def valid_until_ms(self) -> int | None:
        """The end of the window, in block time, after which executors refuse this
        certificate (None on a chain whose receipts do not expire):
        docs/security/reads-and-certificates.md."""
        validity = self.certificate.validity
        return None if validity is None else validity.valid_until_ms

    def certificate_bytes(self) -> bytes:
        """The certificate as a `qgpb.Certificate`, for an executor to verify offline."""
        return encode_certificate(self.certificate)

    def __repr__(self) -> str:
        return (
            f"Decision(proposal={self.proposal_id.hex()[:16]}, outcome={self.outcome.value}, "
            f"height={self.height}, signers={self.signers})"
        )

    __str__ = __repr__
