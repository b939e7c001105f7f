"""`quorumgate audit open`: an auditor checks a claimed argument value against the copy
(docs/audit.md, "Argument commitments").

The auditor's key opens the salt the sidecars sealed to it in the verdict's record; the
salt and the claimed value give the commitment, which must be the one the record holds.
Before that the row must be what was certified: its hash recomputed from its columns (the
commitments included) and its certificate verified against cluster.json and matching the
row. Whether the row also sits in an unbroken chain is `audit verify`'s question.

Nothing printed names the value or the salt.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import psycopg
from nacl.signing import SigningKey

from quorumgate.audit.records import leaf_matches
from quorumgate.audit.store import certificate_of, entry_of, read_row
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.commitments import KIND_HANDLE, KIND_TEXT, SaltError, confirms, open_salt
from quorumgate.sdk.certificates import certified_leaf
from quorumgate.sidecar.receipts import CertificateError, ReceiptEpochs


class Opened(IntEnum):
    """The command's exit status."""

    CONFIRMED = 0  # the claimed value is the one certified
    REFUSED = 1  # it is not
    CANNOT_TELL = 2  # no such row or argument, not sealed to this key, or a bad row


@dataclass(frozen=True, slots=True)
class Claim:
    height: int
    index: int
    argument: str
    value: str
    handle: bool = False  # the argument was an envelope: `value` is its handle


@dataclass(frozen=True, slots=True)
class Answer:
    status: Opened
    text: str


def _cannot(text: str) -> Answer:
    return Answer(Opened.CANNOT_TELL, text)


def open_claim(
    conn: psycopg.Connection[Any],
    spec: ClusterSpec,
    seed: bytes,
    claim: Claim,
    epochs: ReceiptEpochs | None = None,
) -> Answer:
    """Whether `claim.value` is the certified value of `claim.argument` in the verdict at
    (`claim.height`, `claim.index`), as the auditor whose seed is `seed` can tell; the
    certificate checked against `epochs` when given (`audit open --epochs FILE`)."""
    where = f"height {claim.height} index {claim.index}"
    row = read_row(conn, spec.chain_id, claim.height, claim.index)
    if row is None:
        return _cannot(f"the copy holds no verdict at {where}")
    try:
        entry = entry_of(row)
    except (ValueError, TypeError) as err:
        return _cannot(f"the row at {where} is not a ledger entry ({err})")
    if entry.computed_hash(spec.chain_id) != entry.hash:
        return _cannot(f"the row at {where} was edited (its columns do not hash to its hash)")
    try:
        if not leaf_matches(entry, certified_leaf(spec, certificate_of(row), None, epochs)):
            return _cannot(f"the certificate at {where} certifies another verdict")
    except CertificateError as err:
        return _cannot(f"the certificate at {where} does not verify ({err.reason})")
    committed = [c for c in entry.commitments if c.name == claim.argument]
    if not committed:
        return _cannot(f"the verdict at {where} commits to no argument {claim.argument!r}")
    public = bytes(SigningKey(seed).verify_key)
    sealed = [s for s in entry.sealed_salts if s.auditor_key == public]
    if not sealed:
        return _cannot(f"the verdict at {where} has no salt sealed to this key")
    try:
        salt = open_salt(sealed[0].sealed, seed)
    except SaltError as err:
        return _cannot(f"the salt at {where}: {err}")
    kind = KIND_HANDLE if claim.handle else KIND_TEXT
    # An argument named twice commits twice: the claim holds when it is either value.
    if any(confirms(salt, c, kind, claim.value) for c in committed):
        return Answer(
            Opened.CONFIRMED, f"confirmed: the value given is {claim.argument!r} at {where}"
        )
    return Answer(Opened.REFUSED, f"refused: the value given is NOT {claim.argument!r} at {where}")
