"""The errors a QuorumGate client raises.

Every one derives from `QuorumGateError`, whose `str()` is a fixed sentence per class: what
an operator needs (`reason`, `code`, `proposal_id`) sits on attributes and never in the text,
so an exception shown to an agent tells it nothing a policy meant to keep from it (reason
codes are for operators: docs/engine.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quorumgate.sdk.values import Decision

__all__ = [
    "CertificateTimeout",
    "ClusterUnavailable",
    "EpochsUnverified",
    "InvalidCertificate",
    "Overloaded",
    "QuorumGateError",
    "ReadNotAuthorized",
    "Refused",
    "Replayed",
    "TransactionRejected",
]


class QuorumGateError(Exception):
    """Base of every client error. `str()` is a fixed sentence per class; what an operator
    needs (`reason`, `code`, `proposal_id`) is on attributes, never in the text."""

    message = "QuorumGate client error."

    def __init__(self, reason: str = "", *, proposal_id: bytes | None = None) -> None:
        super().__init__(self.message)
        self.reason = reason
        self.proposal_id = proposal_id

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class Refused(QuorumGateError):
    """A replica refused the transaction outright (`reason` is the `qg-reason` trailer,
    `code` the gRPC status name): malformed, unknown signer or tool, wrong chain..."""

    message = "The cluster refused the transaction."

    def __init__(self, reason: str, code: str = "", *, proposal_id: bytes | None = None) -> None:
        super().__init__(reason, proposal_id=proposal_id)
        self.code = code


class Replayed(Refused):
    """The nonce was already used (ALREADY_EXISTS), and fresh ones were too."""

    message = "The transaction's nonce was already used."


class Overloaded(Refused):
    """Every replica kept answering RESOURCE_EXHAUSTED through the bounded back-off."""

    message = "The cluster is overloaded; try again later."


class ReadNotAuthorized(Refused):
    """f+1 sidecars refused this key the read (gRPC PERMISSION_DENIED, or UNAUTHENTICATED
    for a read statement they could not verify: a clock far off): it is not the owner's, a
    member's or an auditor's, and what it asked is not its own
    (docs/security/reads-and-certificates.md). `code` is the status name."""

    message = "The cluster refused this key the read (PERMISSION_DENIED)."

    def __str__(self) -> str:
        return (
            self.message
            if self.code != "UNAUTHENTICATED"
            else ("The cluster could not verify this key's read statement (UNAUTHENTICATED).")
        )


class ClusterUnavailable(QuorumGateError):
    """Not enough replicas or sidecars answered in time."""

    message = "The cluster could not be reached."


class EpochsUnverified(QuorumGateError):
    """No replica's chain of epochs checked from the cluster file (`reason`: `none_checked`),
    or two answers that each checked disagree on an epoch (`fork`: more than f faulty
    members in it). `refused` names each replica whose answer did not check, with why
    (replica/epochchain.py `EpochChainError`: the epoch and a sentence, never a key)."""

    message = "No replica's chain of epochs checks."

    def __init__(self, reason: str, refused: dict[int, str]) -> None:
        super().__init__(reason)
        self.refused = refused


class CertificateTimeout(QuorumGateError):
    """No f+1 agreeing receipts before the deadline. `receipts` is how many distinct
    sidecars had answered with a usable receipt."""

    message = "No verdict certificate before the deadline."

    def __init__(self, proposal_id: bytes, receipts: int, needed: int) -> None:
        super().__init__("certificate_timeout", proposal_id=proposal_id)
        self.receipts = receipts
        self.needed = needed


class InvalidCertificate(QuorumGateError):
    """A certificate that does not prove what it claims (`reason` from
    `quorumgate.sidecar.receipts.CertificateError`: too_few_receipts, non_member,
    bad_signature...)."""

    message = "The verdict certificate is not valid."


class TransactionRejected(QuorumGateError):
    """The engine executed the transaction and did not apply it (an admin operation, a
    delegation, an envelope...). `decision` holds the certified verdict."""

    message = "The transaction was not applied."

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.reason, proposal_id=decision.proposal_id)
        self.decision = decision
