"""Signing, verifying, identifying and parsing transactions (docs/engine.md, "Transactions").

Importable by the replica's mempool and by the client SDK: it depends only on PyNaCl,
protobuf (through `codec`), `quorumgate.proto.canonical`, and the engine's standard-library
modules - never on the URI machinery or the engine itself.

- The signature is Ed25519 over `b"qg/tx/v1" || body`, where body is exactly the
  serialized TxBody carried in SignedTx.body: we verify the carried bytes and never
  re-encode them.
- The transaction id (the proposal id, for a Proposal) is
  `sha256(b"qg/txid/v1" || signer || nonce as u64 big-endian)`: independent of the body,
  so resubmitting one (signer, nonce) is the same transaction, whatever its body says.
- A transaction too broken to have a signer and a nonce gets a stand-in id,
  `sha256(b"qg/txid/raw/v1" || length-prefixed bytes)`, so that every transaction in a
  block still has a verdict with an id.
"""

from __future__ import annotations

from dataclasses import dataclass

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from quorumgate.proto import codec, domains, limits
from quorumgate.proto.canonical import Encoder
from quorumgate.proto.model import (
    KeyHolder,
    Reason,
    RotateKey,
    SignedTx,
    TxBody,
    TxKind,
    TxPayload,
)

TAG_TX = domains.TX
TAG_TXID = domains.TXID
TAG_TXID_RAW = domains.TXID_RAW


def tx_id(signer: bytes, nonce: int) -> bytes:
    """The id of the transaction `(signer, nonce)`; for a Proposal, its proposal id."""
    assert len(signer) == 32, len(signer)
    return Encoder(TAG_TXID).raw(signer).u64(nonce).digest()


def raw_tx_id(data: bytes) -> bytes:
    return Encoder(TAG_TXID_RAW).blob(data).digest()


def signing_message(body: bytes) -> bytes:
    """The bytes an Ed25519 transaction signature covers."""
    return bytes(Encoder(TAG_TX).raw(body))


def sign_body(body: bytes, key: SigningKey) -> SignedTx:
    """Sign serialized TxBody bytes as they will be carried."""
    signature = key.sign(signing_message(body)).signature
    return SignedTx(body=body, signer=bytes(key.verify_key), signature=signature)


def verify_signature(tx: SignedTx) -> bool:
    try:
        VerifyKey(tx.signer).verify(signing_message(tx.body), tx.signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True


def rotation_statement(
    chain_id: str, holder: KeyHolder, subject_id: str, old_key: bytes, new_key: bytes
) -> bytes:
    """What a new key signs to prove it is held by whoever rotates to it (docs/engine.md,
    "Rotating keys"): the chain, whose key, and both keys. Binding the old key makes the
    proof good for this one rotation: the old key is retired by it and never held again."""
    enc = Encoder(domains.KEY_ROTATION).text(chain_id).text(holder.value).text(subject_id)
    return bytes(enc.raw(old_key).raw(new_key))


def rotate_key_op(
    chain_id: str, holder: KeyHolder, subject_id: str, old_key: bytes, new_key: SigningKey
) -> RotateKey:
    """A `RotateKey` to `new_key`, with the new key's proof of possession over it."""
    new_public = bytes(new_key.verify_key)
    statement = rotation_statement(chain_id, holder, subject_id, old_key, new_public)
    proof = new_key.sign(statement).signature
    return RotateKey(holder=holder, subject_id=subject_id, new_public_key=new_public, proof=proof)


def encode_body(body: TxBody) -> bytes:
    return codec.encode_body(body)


def encode_signed(tx: SignedTx) -> bytes:
    return codec.encode_signed(tx)


def build(chain_id: str, nonce: int, payload: TxPayload, key: SigningKey) -> bytes:
    """Encode, sign and serialize one transaction: what a client submits."""
    body = codec.encode_body(TxBody(chain_id=chain_id, nonce=nonce, payload=payload))
    return codec.encode_signed(sign_body(body, key))


@dataclass(frozen=True)
class ParsedTx:
    """A transaction whose bytes decoded and (unless skipped) whose signature verified."""

    signed: SignedTx
    body: TxBody
    tx_id: bytes

    @property
    def signer(self) -> bytes:
        return self.signed.signer

    @property
    def kind(self) -> TxKind:
        return self.body.kind

    @property
    def nonce(self) -> int:
        return self.body.nonce


class TxRejected(Exception):
    """A transaction that cannot be executed at all; carries what could be learnt."""

    def __init__(
        self,
        reason: Reason,
        detail: str,
        *,
        tx_id: bytes,
        kind: TxKind = TxKind.MALFORMED,
        signer: bytes | None = None,
    ) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.tx_id = tx_id
        self.kind = kind
        self.signer = signer


def parse(data: bytes, *, verify: bool = True) -> ParsedTx:
    """Bytes of a SignedTx to a ParsedTx, or TxRejected (malformed / bad_signature).

    The order is fixed: size, envelope, signature (over the carried bytes), then the body,
    so that nothing of an unauthenticated body is ever interpreted.
    """
    if len(data) > limits.TX_BYTES_MAX + 256:
        raise TxRejected(Reason.MALFORMED, "transaction too large", tx_id=raw_tx_id(data))
    try:
        signed = codec.decode_signed(data)
    except codec.CodecError as exc:
        raise TxRejected(Reason.MALFORMED, str(exc), tx_id=raw_tx_id(data)) from None
    if verify and not verify_signature(signed):
        raise TxRejected(
            Reason.BAD_SIGNATURE, "signature", tx_id=raw_tx_id(data), signer=signed.signer
        )
    try:
        body = codec.decode_body(signed.body)
    except codec.CodecError as exc:
        ident = tx_id(signed.signer, exc.nonce) if exc.nonce > 0 else raw_tx_id(data)
        raise TxRejected(
            Reason.MALFORMED, str(exc), tx_id=ident, kind=exc.kind, signer=signed.signer
        ) from None
    return ParsedTx(signed=signed, body=body, tx_id=tx_id(signed.signer, body.nonce))
