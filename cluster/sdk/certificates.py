"""Checking what the sidecars sign, offline: certificates, receipts and confirmation cards.

A verdict is believed only when f+1 distinct sidecars signed the same statement (at least
one of them honest): `verify` checks a certificate against the cluster file's receipt keys,
`receipt_signature_ok` drops on arrival a receipt signed for another member or badly, and
`certify` groups receipts by the statement they sign and assembles a certificate from the
first group large enough. A confirmation card is accepted only when f+1 sidecars return it
byte for byte and it binds the signed proposal its values are read from
(docs/security/reads-and-certificates.md, docs/security/approvals.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from quorumgate.proto import codec
from quorumgate.proto import sidecar_pb2 as spb
from quorumgate.proto.clusterfile import ClusterSpec
from quorumgate.proto.membership import RECONFIG_SIZES
from quorumgate.proto.model import Proposal, TxBody
from quorumgate.sdk.errors import InvalidCertificate
from quorumgate.sdk.values import Decision, OpenCard
from quorumgate.sidecar.engine.statements import CardMismatch, ConfirmationCard, card_values
from quorumgate.sidecar.receipts import (
    Certificate,
    CertificateError,
    Receipt,
    ReceiptEpochs,
    ReceiptLeaf,
    assemble_certificate,
    receipt_keys_at,
    verify_certificate,
)
from quorumgate.sidecar.wire import decode_certificate, receipt_from_pb

__all__ = [
    "agreed_cards",
    "certify",
    "decode_card",
    "load_certificate",
    "proposal_body_digest",
    "receipt_or_none",
    "receipt_signature_ok",
    "statement_key",
    "verify",
]


def decode_card(data: bytes) -> ConfirmationCard:
    """Confirmation card bytes (`ConfirmationCard.to_bytes()`) back to a card.

    Uses the engine state codec's card reader (the only decoder of these bytes today) and
    insists that re-encoding gives the same bytes, so the certified digest covers exactly
    what is returned."""
    from quorumgate.proto.canonical import Encoder
    from quorumgate.sidecar.engine.state import StateDecodeError, _dec_card, _Reader

    try:
        card = _dec_card(_Reader(bytes(Encoder().blob(data))))
    except (StateDecodeError, ValueError) as err:
        raise InvalidCertificate("bad_card") from err
    if card.to_bytes() != data:
        raise InvalidCertificate("bad_card")
    return card


def agreed_cards(answers: Mapping[int, spb.PendingReply], needed: int) -> list[OpenCard]:
    """The cards `needed` sidecars returned byte for byte, with values from a transaction
    one of them returned that the card binds (a sidecar cannot show one call and have
    another confirmed: the card digest binds the body's digest)."""
    seen: dict[bytes, list[int]] = {}
    bodies: dict[bytes, list[bytes]] = {}
    for member, reply in sorted(answers.items()):
        for entry in reply.cards:
            seen.setdefault(entry.card, []).append(member)
            bodies.setdefault(entry.card, []).append(entry.transaction)
    out = []
    for data, members in seen.items():
        if len(set(members)) < needed:
            continue
        try:
            card = decode_card(data)
        except InvalidCertificate:
            continue
        for transaction in bodies[data]:
            try:
                values = card_values(card, transaction)
            except CardMismatch:
                continue
            out.append(OpenCard(card, values, tuple(sorted(set(members)))))
            break
    return sorted(out, key=lambda c: c.proposal_id)


def load_certificate(data: bytes) -> Certificate:
    """Certificate bytes (`Decision.certificate_bytes()`) back to a `Certificate`."""
    try:
        return decode_certificate(data)
    except CertificateError as err:
        raise InvalidCertificate(err.reason) from err


def certified_leaf(
    spec: ClusterSpec,
    certificate: Certificate,
    proposal_id: bytes | None = None,
    epochs: ReceiptEpochs | None = None,
) -> ReceiptLeaf:
    """The leaf `certificate` certifies, checked against the cluster file: f+1 distinct
    members' receipt keys of the epoch it names, its height in that epoch (`epochs`, from
    the chain of epochs; without it epoch 0 with the cluster file's keys), chain id,
    Merkle path, and the signed validity window's shape where the chain's receipts
    expire. Raises `CertificateError`."""
    return verify_certificate(
        certificate,
        spec.chain_id,
        spec.receipt_keys,
        receipts_expire=spec.receipts_expire,
        proposal_id=proposal_id,
        epochs=epochs,
    )


def verify(
    spec: ClusterSpec,
    certificate: Certificate,
    *,
    proposal_id: bytes | None = None,
    epochs: ReceiptEpochs | None = None,
) -> Decision:
    """Check a certificate offline against the cluster file and, after epoch 0, the
    chain of epochs (`epochs`: f+1 distinct members' receipt keys of the epoch the
    certificate names, its height in that epoch, chain id, Merkle path) and return it as
    a `Decision`."""
    try:
        leaf = certified_leaf(spec, certificate, proposal_id, epochs)
    except CertificateError as err:
        raise InvalidCertificate(err.reason, proposal_id=proposal_id) from err
    return Decision(leaf.proposal_id, certificate)


def receipt_or_none(message: spb.Receipt) -> Receipt | None:
    """A receipt off the wire, or None for one that cannot be (a validity window that ends
    before it starts): dropped on arrival, as a badly signed one is."""
    try:
        return receipt_from_pb(message)
    except CertificateError:
        return None


def receipt_signature_ok(
    spec: ClusterSpec, receipt: Receipt, asked: int, epochs: ReceiptEpochs | None = None
) -> bool:
    """Drop a receipt on arrival unless sidecar `asked` signed it for itself with its
    receipt key of the epoch the receipt names, at a height of that epoch (`epochs`;
    without it epoch 0 and the cluster file's key), with a validity window exactly when
    the chain's receipts expire: a Byzantine sidecar can neither speak for another member
    nor poison an honest group."""
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    block = receipt.block
    if block.signer != asked or receipt.leaf.height != block.height:
        return False
    if (block.validity is not None) != spec.receipts_expire:
        return False
    try:
        keys = receipt_keys_at(
            epochs or ReceiptEpochs.genesis(spec.receipt_keys), block.epoch, block.height
        )
    except CertificateError:
        return False
    if not 0 <= asked < len(keys):
        return False
    message = block.statement(spec.chain_id)
    try:
        VerifyKey(keys[asked]).verify(message, block.signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True


def statement_key(receipt: Receipt) -> tuple[object, ...]:
    """What a receipt signs, as one key: receipts certify together only when these agree."""
    b = receipt.block
    return (
        receipt.leaf, receipt.path, b.height, b.verdict_root, b.state_root, b.leaf_count,
        b.validity, b.epoch,
    )  # fmt: skip


def _f_of(spec: ClusterSpec, receipt: Receipt, epochs: ReceiptEpochs | None) -> int | None:
    """f of the epoch `receipt`'s statement names (its receipt keys' count: 4 -> f 1,
    7 -> f 2), so that a certificate of an epoch of 4 needs 2 signers even once the
    cluster has grown to 7; the client's cluster's f without a chain of epochs; None for
    an epoch the client does not know (its f is unknown: no certificate yet)."""
    if epochs is None:
        return spec.f
    if not epochs.chained and receipt.block.epoch > 0:
        # A client that may not read the chain of epochs (an agent's key) does not know
        # how many members a later epoch has: it counts f of the largest cluster, so that
        # what it certifies holds for a verifier that knows the epoch (f+1 of 7 is 3).
        return (max(RECONFIG_SIZES) - 1) // 3
    try:
        keys = receipt_keys_at(epochs, receipt.block.epoch, receipt.block.height)
    except CertificateError:
        return None
    return (len(keys) - 1) // 3


def certify(
    spec: ClusterSpec,
    proposal_id: bytes,
    receipts: Sequence[Receipt],
    cards: Mapping[bytes, bytes],
    epochs: ReceiptEpochs | None = None,
) -> Decision | None:
    """The newest verdict among `receipts` that f+1 distinct sidecars signed, verified, with
    its confirmation card when `cards` (by digest) holds the one it certifies; None when no
    statement has enough signers yet."""
    groups: dict[tuple[object, ...], list[Receipt]] = {}
    for receipt in receipts:
        groups.setdefault(statement_key(receipt), []).append(receipt)
    # The newest certifiable verdict first (a confirmed call's, over its pending one).
    ordered = sorted(groups.values(), key=lambda g: (g[0].leaf.height, g[0].leaf.index))
    for group in reversed(ordered):
        f = _f_of(spec, group[0], epochs)
        if f is None or len({r.block.signer for r in group}) < f + 1:
            continue
        certificate = assemble_certificate(spec.chain_id, group)
        verify(spec, certificate, proposal_id=proposal_id, epochs=epochs)
        card = None
        digest = certificate.leaf.card_digest
        if digest:
            data = cards.get(digest)
            if data is not None:
                card = decode_card(data)
        return Decision(proposal_id, certificate, card)
    return None


def proposal_body_digest(chain_id: str, nonce: int, payload: Proposal) -> bytes:
    """SHA-256 of the TxBody a proposal signed at `nonce` carries: what a confirmation
    card's `body_digest` binds (arguments included, values unseen)."""
    body = codec.encode_body(TxBody(chain_id=chain_id, nonce=nonce, payload=payload))
    return hashlib.sha256(body).digest()
